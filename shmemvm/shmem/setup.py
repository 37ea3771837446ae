"""Setting up and ending the NumPy face's heap (init, init_thread, finalize,
global_exit, and what importing shmemvm.shmem does: rc), and the queries that
need no memory (my_pe, n_pes, pe_accessible, query_thread, info_get_version,
info_get_name, pcontrol).

Importing shmemvm.shmem creates the default heap (shmemvm.init(backend="host"))
as shmem4py initialises OpenSHMEM, following `shmemvm.rc` (shmem4py's `rc`:
initialize, threads, thread_level, finalize, and the SHMEM4PY_RC_* environment
variables), and finalizes it at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
from typing import NoReturn, Tuple

from .. import api, rc
from ..openshmem import info
from . import arrays
from .constants import THREAD, THREAD_MULTIPLE

log = logging.getLogger("shmemvm")


def info_get_version() -> Tuple[int, int]:
    """The OpenSHMEM specification version followed (shmem_info_get_version).

    Returns:
        (major, minor), e.g. (1, 5).

    Raises:
        Nothing.
    """
    return info.info_get_version()


def info_get_name() -> str:
    """The library's name (shmem_info_get_name).

    Returns:
        "shmemvm <version>".

    Raises:
        Nothing.
    """
    return info.info_get_name()


def init() -> None:
    """Create the default symmetric heap on the host (collective; shmem_init).
    Does nothing where one is already open (e.g. made at import).

    Returns:
        None.

    Raises:
        ShmemError and its subclasses: the heap could not be made (see
            shmemvm.init).
    """
    if api.current_heap() is not None:
        return
    api.init(backend="host")


def init_thread(requested: int = THREAD_MULTIPLE) -> THREAD:
    """Create the default heap at a thread level (collective; shmem_init_thread).

    Args:
        requested: a THREAD level (default THREAD_MULTIPLE).

    Returns:
        The THREAD level provided.

    Raises:
        ValueError: `requested` is not a THREAD level.
        UnsupportedError: MPI was initialised at a lower level.
    """
    if api.current_heap() is None:
        api.init(backend="host", thread_level=int(requested))
    return query_thread()


def query_thread() -> THREAD:
    """The thread level the heap provides (shmem_query_thread).

    Returns:
        A THREAD level.

    Raises:
        ShmemError: no heap (not initialised, or finalized).
    """
    return THREAD(arrays.heap().query_thread())


def finalize() -> None:
    """Release the default heap (collective; shmem_finalize). Arrays on it must
    not be used afterwards.

    Returns:
        None.

    Raises:
        SymmetryError: some PE is in another collective call.
    """
    api.finalize()


def global_exit(status: int = 0) -> NoReturn:
    """End every PE's process with `status` (shmem_global_exit).

    Args:
        status: the exit status.

    Returns:
        Never.

    Raises:
        SystemExit: where MPI returns from its abort.
    """
    info.global_exit(status)
    raise SystemExit(status)


def _finalize_at_exit() -> None:
    if api.current_heap() is not None:
        try:
            finalize()
        except Exception as exc:  # a PE that failed: the others must still exit
            log.error("shmemvm.shmem: finalize at exit failed: %s", exc)


def initialize() -> None:
    """What importing this module does, as shmem4py's import."""
    for name in ("initialize", "threads", "thread_level", "finalize"):
        value = os.environ.get(f"SHMEM4PY_RC_{name.upper()}")
        if value:
            lower = value.lower()
            setattr(rc, name, True if lower in ("true", "yes", "on", "y", "1") else
                    False if lower in ("false", "no", "off", "n", "0") else lower)
    if rc.initialize:
        if rc.threads:
            level = str(rc.thread_level).upper()
            if level not in THREAD.__members__:
                raise ValueError(f"rc.thread_level must be one of multiple, serialized, "
                                 f"funneled, single, got {rc.thread_level!r}")
            init_thread(THREAD[level])
        else:
            init()
        if rc.finalize is None:
            rc.finalize = True
    if rc.finalize:
        atexit.register(_finalize_at_exit)


def my_pe() -> int:
    """This PE's number (shmem_my_pe).

    Returns:
        0..n_pes()-1.

    Raises:
        ShmemError: no heap.
    """
    return arrays.heap().my_pe


def n_pes() -> int:
    """The number of PEs (shmem_n_pes).

    Returns:
        An int >= 1.

    Raises:
        ShmemError: no heap.
    """
    return arrays.heap().n_pes


def pe_accessible(pe: int) -> bool:
    """Whether PE `pe` can be reached by put/get/atomics (shmem_pe_accessible).

    Args:
        pe: a PE number.

    Returns:
        True for every PE of the heap, False for any other number.

    Raises:
        TypeError: `pe` is not an integer.
    """
    try:
        arrays.core().where.check_pe(pe)
    except ValueError:
        return False
    return True


def pcontrol(level: int = 1) -> None:
    """Profiling control (shmem_pcontrol): accepted, no effect.

    Args:
        level: an int.

    Returns:
        None.

    Raises:
        TypeError: `level` is not an int.
    """
    info.pcontrol(level)
