"""Library information, profiling control and global exit (OpenSHMEM 1.5):
module functions, not heap methods, since none of them acts on a heap."""

from __future__ import annotations

import logging
import os
import sys

from mpi4py import MPI

from .. import _args
from .._version import __version__
from ..memory.vmm import HeapStats

#: the OpenSHMEM specification version whose routines these follow
SPEC_VERSION = (1, 5)



class HeapInfo(HeapStats):
    """heap_info(): HeapStats (memory/vmm.py) and where the heap runs."""
    pe: int
    n_pes: int
    backend: str           # "host", "cuda" or "hip"
    device: str            # torch's name of the heap's device, e.g. "cpu", "cuda:0"
    node_pes: list[int]    # the heap PE numbers of this node
    anchor: int            # bytes of this PE's anchor, outside the heap size (SHMEMVM_ANCHOR)


_pcontrol_level = 1   # OpenSHMEM's default: profiling enabled at the default level


def info_get_version() -> tuple[int, int]:
    """The OpenSHMEM specification version this API follows (shmem_info_get_version).

    Returns:
        (major, minor): (1, 5).

    Raises:
        Nothing.
    """
    return SPEC_VERSION


def info_get_name() -> str:
    """The library's name and version (shmem_info_get_name).

    Returns:
        "shmemvm <version>", e.g. "shmemvm 0.1.0".

    Raises:
        Nothing.
    """
    return f"shmemvm {__version__}"


def pcontrol(level: int) -> None:
    """Profiling control (shmem_pcontrol): the level is accepted and stored,
    and has no effect, since shmemvm has no profiling interface; 0 disables
    profiling, 1 is the default, 2 and above are profiler-defined.

    Args:
        level: an int.

    Returns:
        None.

    Raises:
        TypeError: `level` is not an int.
    """
    global _pcontrol_level
    _pcontrol_level = _args.integer(level, "pcontrol: level")


def pcontrol_level() -> int:
    """The level last given to pcontrol() (1 until then).

    Returns:
        That level.

    Raises:
        Nothing.
    """
    return _pcontrol_level


def global_exit(status: int) -> None:
    """End every PE of the job with exit status `status` (shmem_global_exit):
    flushes this process's log handlers, stdout and stderr, then calls
    MPI_Abort on MPI_COMM_WORLD, which the MPI launcher turns into the end of
    every process; should MPI_Abort return (MPICH's can, while the launcher
    ends the job), this process exits at once with `status`. It does not
    complete outstanding operations (a quiet could
    wait on a PE that is gone).

    Args:
        status: the exit status, any int: the job's exit code is status & 255,
            or 1 where that is 0 and status is not (exit_code()).

    Returns:
        Never.

    Raises:
        TypeError: `status` is not an int.
    """
    status = _args.integer(status, "global_exit: status")
    code = exit_code(status)
    loggers = [logging.getLogger(), logging.getLogger("shmemvm")]
    for logger in loggers:
        for handler in logger.handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001 -- exiting anyway
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        MPI.COMM_WORLD.Abort(code)
    finally:
        # MPICH was seen to return from MPI_Abort (the launcher ends the job a moment
        # later); this PE must not run on meanwhile, nor where MPI_Abort failed
        os._exit(code)


def exit_code(status: int) -> int:
    """The exit code global_exit(status) ends the job with: what a shell sees of
    a process's status (status & 255), except that a nonzero status whose low
    byte is 0 (256, 512, 2**40) gives 1 rather than success. Passed to
    MPI_Abort as it is, since MPI's errorcode is a C int and launchers take its
    low byte (MPICH's hydra made 256 an exit code of 0, and 2**40 overflowed)."""
    return status & 0xFF or (1 if status else 0)
