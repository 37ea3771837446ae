"""The agreement: one small allreduce per collective step.

Every PE runs the same deterministic allocator, so a collective only has to
*agree* that every PE makes the same call with the same arguments; the
allocation itself then needs no communication. This module owns that
agreement: the encoding of a call, the waits with a deadline
(SHMEMVM_TIMEOUT), the mismatch report (SymmetryError on every PE), the
agreement on blocks the garbage collector took, and the heap's broken state
(after a timeout nothing collective can be trusted any more).
"""

from __future__ import annotations

import array
import functools
import logging
import os
import time
import zlib
from dataclasses import dataclass, field

from mpi4py import MPI

from . import _dlpack
from .errors import PeerTimeoutError, SymmetryError

log = logging.getLogger("shmemvm")

_OPS = ("init", "malloc", "free", "realloc", "barrier", "sync", "finalize", "trim",
        "broadcast", "fcollect", "reduce", "alltoall")
_OP_CODE = {name: i + 1 for i, name in enumerate(_OPS)}
_INVALID = 99          # this PE could not even form the call (bad arguments)
_N_ARGS = 4
DTYPE_CODE = {dtype: i + 1 for i, dtype in enumerate(sorted(_dlpack.SUPPORTED_DTYPES, key=str))}


@dataclass
class Call:
    """One collective call as this PE sees it."""
    op: str
    args: tuple = ()
    text: str = ""
    error: BaseException | None = field(default=None, repr=False)

    def vector(self) -> list[int]:
        if self.error is not None:
            return [_INVALID] + [0] * _N_ARGS
        # Clamp, not mask: masking made 2**63 and 0 the same argument. Every value
        # clamped together exceeds any heap, so each PE fails the same way.
        args = [min(int(a), 0x7FFF_FFFF_FFFF_FFFF) for a in self.args]
        return [_OP_CODE[self.op]] + args + [0] * (_N_ARGS - len(args))


@functools.lru_cache(maxsize=1024)  # programs allocate few distinct shapes, often
def shape_code(dims: tuple[int, ...]) -> int:
    return zlib.crc32(repr(dims).encode())


class Agreement:
    """The agreement over `comm` for one heap. `release(offsets)` is called with
    the heap offsets that every PE has given up (see collective())."""

    def __init__(self, comm: MPI.Comm, timeout: float, my_pe: int, release=None):
        self.comm = comm
        self.timeout = timeout
        self.my_pe = my_pe
        self.release = release or (lambda offsets: None)
        self.seq = 0
        #: why the heap is unusable (a timed-out step), or None
        self.broken: str | None = None

    def check_usable(self) -> None:
        if self.broken:
            raise PeerTimeoutError(f"this symmetric heap is unusable since {self.broken}; "
                                   f"call finalize()")

    def collective(self, call: Call, *, dead: set[int] = frozenset(), flag: bool = True) -> bool:
        """Agree that every PE makes this same call, and release the offsets that
        are in `dead` on every PE. The same outcome on every PE. Returns whether
        `flag` (a per-PE fact, reduced but not compared) holds on every PE."""
        self.seq += 1
        vector = call.vector() + [self.seq, len(dead), int(flag)]
        send = array.array("q", vector + [-v for v in vector])
        recv = array.array("q", bytes(8 * len(send)))
        self.wait(self.comm.Iallreduce(send, recv, op=MPI.MAX), call)
        n = len(vector)
        highest, lowest = recv[:n - 2], [-v for v in recv[n:2 * n - 2]]
        if list(highest) != lowest:
            self._raise_mismatch(call)
        if -recv[2 * n - 2] > 0:  # every PE has something pending
            self._agree_on_dead(dead)
        if call.error is not None:
            raise call.error
        log.debug("PE %d: collective #%d %s", self.my_pe, self.seq, call.text)
        return -recv[2 * n - 1] > 0

    def wait(self, request: MPI.Request, call: Call) -> None:
        """Complete an MPI request or raise PeerTimeoutError at the deadline."""
        if request.Test():
            return
        deadline = time.monotonic() + self.timeout
        spins = 0
        while not request.Test():
            spins += 1
            if spins % 64 == 0:
                if time.monotonic() > deadline:
                    self.broken = (f"{call.text or call.op} (collective #{self.seq}) timed out "
                                   f"after {self.timeout:g} s")
                    raise PeerTimeoutError(
                        f"PE {self.my_pe}: not every PE joined {call.text or call.op} "
                        f"(collective #{self.seq}) within {self.timeout:g} s (SHMEMVM_TIMEOUT): "
                        f"a PE has died, hangs, or is in a different call. This heap cannot be "
                        f"used any more; finalize() releases it")
                # Yield the core, but do not sleep(0): on Linux that is a timed
                # sleep of about the timer slack (50-100 us), not a yield.
                if spins < 4096:
                    os.sched_yield()
                else:
                    time.sleep(0.0002)

    def all_ok(self, ok: bool, call: Call, what: str) -> bool:
        flags = array.array("q", [1 if ok else 0])
        result = array.array("q", [0])
        self.wait(self.comm.Iallreduce(flags, result, op=MPI.MIN),
                  Call(call.op, text=f"{call.text} ({what})"))
        return bool(result[0])

    def _raise_mismatch(self, call: Call) -> None:
        mine = call.text or call.op
        if call.error is not None:
            mine += f" [rejected here: {call.error}]"
        described = self.comm.allgather(f"{mine} (collective #{self.seq})")
        groups: dict[str, list[int]] = {}
        for pe, text in enumerate(described):
            groups.setdefault(text, []).append(pe)
        detail = "; ".join(f"PE {pe_list(pes)}: {text}" for text, pes in groups.items())
        raise SymmetryError(f"PEs made different collective calls: {detail}. Every PE must make "
                            f"the same collective calls with the same arguments in the same "
                            f"order; nothing was done") from call.error

    def _agree_on_dead(self, dead: set[int]) -> None:
        lists = self.comm.allgather(sorted(dead))
        agreed = set(lists[0]).intersection(*lists[1:])
        if agreed:
            self.release(agreed)


def pe_list(pes) -> str:
    return ", ".join(map(str, pes))
