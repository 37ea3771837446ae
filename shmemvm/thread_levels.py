"""Thread levels, as OpenSHMEM declares them (the same values as MPI's).

shmemvm itself is safe at THREAD_MULTIPLE: collectives are serialised by the
heap's lock, the allocator's bookkeeping by its own, and put/get/ptr on a live
tensor need neither, because a block that anything views (the tensor passed
to them included) is never released, so no eviction in another thread can
unmap it. What limits the level is MPI: the off-node path and atomics call
MPI from whichever thread calls shmemvm, so the level provided is the lower of
what was requested and what MPI was initialised with.
"""

from __future__ import annotations

from mpi4py import MPI

from .errors import UnsupportedError

THREAD_SINGLE = 0
THREAD_FUNNELED = 1
THREAD_SERIALIZED = 2
THREAD_MULTIPLE = 3

NAMES = {THREAD_SINGLE: "THREAD_SINGLE", THREAD_FUNNELED: "THREAD_FUNNELED",
         THREAD_SERIALIZED: "THREAD_SERIALIZED", THREAD_MULTIPLE: "THREAD_MULTIPLE"}
_FROM_MPI = {MPI.THREAD_SINGLE: THREAD_SINGLE, MPI.THREAD_FUNNELED: THREAD_FUNNELED,
             MPI.THREAD_SERIALIZED: THREAD_SERIALIZED, MPI.THREAD_MULTIPLE: THREAD_MULTIPLE}


def mpi_level() -> int:
    """The thread level MPI provides in this process."""
    return _FROM_MPI[MPI.Query_thread()]


def provide(requested: int | None) -> int:
    """The level a heap provides for `requested` (None: the highest MPI allows).
    Raises when MPI cannot support the level asked for."""
    available = mpi_level()
    if requested is None:
        return available
    if isinstance(requested, bool) or requested not in NAMES:
        raise ValueError(f"thread_level must be one of shmemvm.{', shmemvm.'.join(NAMES.values())} "
                         f"(0..3), got {requested!r}")
    if requested > available:
        raise UnsupportedError(
            f"thread_level={NAMES[requested]} was requested, but MPI was initialised at "
            f"{NAMES[available]}; start MPI at a higher level (mpi4py: set "
            f"MPI4PY_RC_THREAD_LEVEL=multiple, or mpi4py.rc.thread_level before importing MPI)")
    return requested
