"""Waiting for the other PEs with a deadline: no MPI wait in the library is
without one (SHMEMVM_TIMEOUT). Also the MPI set-up steps that must not wait
for ever either (duplicating the communicator).
"""

from __future__ import annotations

import math
import os
import time

from mpi4py import MPI

from ..config import SETTINGS, setting
from ..errors import PeerTimeoutError


def parse_timeout(value=None) -> float:
    """SHMEMVM_TIMEOUT (or the timeout= argument) in seconds: finite and > 0."""
    raw = setting("SHMEMVM_TIMEOUT", value)
    try:
        if isinstance(raw, bool):
            raise TypeError
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"SHMEMVM_TIMEOUT (the timeout= argument) must be a finite number of "
                         f"seconds > 0, got {raw!r}: it bounds every collective wait for the "
                         f"other PEs "
                         f"(default {SETTINGS['SHMEMVM_TIMEOUT'][0]})")
    return seconds


DEFAULT_TIMEOUT = float(SETTINGS["SHMEMVM_TIMEOUT"][0])


#: what a timeout leaves, said at the end of its message
UNUSABLE = "This heap cannot be used any more; finalize() releases it"


#: how long a wait polls before it yields its core. Yielding at once cost a
#: whole time slice (about 3 ms) per step on the H200 machine when another
#: thread that polls was bound to the same core (NVSHMEM's proxy thread under
#: Open MPI's default binding); PEs in step arrive within microseconds.
_SPIN_S = 100e-6


def wait(request: MPI.Request, timeout: float, what, my_pe: int,
         after: str = UNUSABLE) -> None:
    """Complete an MPI request or raise PeerTimeoutError after `timeout` s.
    `what` names the step (a string, or a function making one, called only
    for the message); the message ends with `after`, what the timeout leaves."""
    wait_until(request.Test, timeout, what, my_pe, after)


#: how often a wait calls its `check` (a PE that left: agreement.py)
CHECK_S = 0.1


def wait_until(ready, timeout: float, what, my_pe: int, after: str = UNUSABLE,
               check=None) -> None:
    """Poll `ready()` until it is True, or raise PeerTimeoutError after
    `timeout` s (as wait()). `check()`, where given, is called every CHECK_S
    seconds (it raises where the wait cannot end)."""
    if ready():
        return
    now = time.monotonic()
    deadline, keep_core = now + timeout, now + _SPIN_S
    next_check = now + CHECK_S
    spins = 0
    while not ready():
        spins += 1
        if spins % 64 == 0:
            now = time.monotonic()
            if check is not None and now > next_check:
                next_check = now + CHECK_S
                check()
            if now > deadline:
                what = what() if callable(what) else what
                raise PeerTimeoutError(
                    f"PE {my_pe}: not every PE joined {what} within {timeout:g} s "
                    f"(SHMEMVM_TIMEOUT): a PE has died, hangs, or is in a different call. "
                    f"{after}")
            if now < keep_core:
                continue
            # Then yield the core, but do not sleep(0): on Linux that is a timed
            # sleep of about the timer slack (50-100 us), not a yield.
            if spins < 4096:
                os.sched_yield()
            else:
                time.sleep(0.0002)


def persistent_collectives() -> bool:
    """Whether this MPI has persistent collectives (MPI 4.0: MPI_Allreduce_init),
    which the agreement restarts every step. Without them each step is a new
    MPI_Iallreduce, and on one node the board (board.py) is faster: 3.8-4.9
    against 5.0-7.7 us a step with Open MPI 4.1 on the H200 host; with MPICH
    5's persistent allreduce the two are even (docs/performance.md)."""
    return MPI.Get_version() >= (4, 0)


def duplicate(comm: MPI.Intracomm, timeout: float) -> MPI.Intracomm:
    """A duplicate of `comm` (MPI_Comm_idup), or PeerTimeoutError when not every
    PE joins within `timeout`: a PE that starts late or never must not hold the
    others for ever."""
    new, request = comm.Idup()
    wait(request, timeout, "init (duplicating the communicator)", comm.Get_rank(),
         "No heap was made")
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new
