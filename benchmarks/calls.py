"""How many Python calls one operation makes (issue 30): the figure that
putting a collective's step in C reduces, counted rather than timed.

On a shared 2-core machine the times of small operations are noisy and often
bimodal; the number of function calls a call makes is not. For each
operation of the NumPy face (shmemvm.shmem) and the same operation of the
torch face (the SymmetricHeap's methods), PE 0 counts the calls one call of
it makes, call by call, as cProfile counts them (every Python function
entered and every builtin called: sys.setprofile's "call" and "c_call"
events, which cProfile's totals are made of; tests/unit/benchmarks/
test_calls.py holds the two equal). The operation's own call is counted, the
benchmark's wrapper around it is not.

Where a PE arrives at a collective step before the others, it polls, and
its count would depend on arrival order. The figure is the count of a call
where PE 0 did not wait:
  - every call made inside a polling function (POLLING: the deadline's and
    the agreement's wait_until, the board's ready()s, the MPI window's
    complete(), and whatever they call) is counted apart, as polled, and
    left out of the count;
  - of the counted calls, only those that polled least make the figure
    (no_wait_counts): on the board, the calls that polled not at all; over
    MPI, where every data wait enters wait_until once even when its request
    is done, those whose waits were each done at once. A call that waited
    also made the wait's setup and the step's slow outcome outside the
    polling (about 7 calls more at 2 PEs): the record says how many calls
    were left out so (waited);
  - PE 0 pauses before each counted call, so that the other PEs, which make
    the same calls uncounted, are usually in the step first.
The figure is then the same from run to run (tests/mpi/benchmarks/
test_bench_calls.py runs the family twice); its min and max show it. The
garbage collector is off while a figure is counted (a collection's
finalizers would run inside some calls). One-sided operations (put, get,
atomic_fetch_add) are made by PE 0 on PE 1 (itself when alone) while the
other PEs rest.

The torch face runs on the suite's heap; the NumPy face on its default heap,
made here on the run's PEs (host, NUMPY_HEAP) where there is none. Each
record says whether its heap used the compiled piece (params.native); the
run's settings.paths say which paths the suite's heap took.

Baseline: the calls of the face's plain local operation on the same bytes,
counted the same way in the same run: np.copyto (NumPy face) or
Tensor.copy_ (torch face) of the operation's bytes on this PE (0 bytes for
barrier_all and sync_all), and np.empty / torch.empty of the bytes for
malloc + free. Each is one call: the ratio is how many calls the operation
makes for each one a plain Python program makes to move the same bytes.
(mpi4py's collectives are not the baseline: cProfile does not see their
calls, Cython methods, so they count 0.)

Every operation's result is checked once after its counted calls (a broken
path that did nothing must not pass for a short one).

    mpirun -n 2 python -m benchmarks calls [--quick] [--json PATH]
"""

from __future__ import annotations

import functools
import gc
import importlib
import sys
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch
from mpi4py import MPI

from .common import Bench, KiB
from .schema import heap_paths, measurement

#: the functions whose calls depend on arrival order, as module:qualified name:
#: a PE that arrives first calls them until the others are in (module doc)
POLLING = ("shmemvm.agreement.deadline:wait_until",
           "shmemvm.agreement.agreement:Agreement.wait_until",
           "shmemvm.agreement.board:_Exchange.ready",
           "shmemvm.agreement.board:_Poll.ready",
           "shmemvm.transport.offnode:OffNodeWindow.complete")

#: PE 0's pause before each counted call of a collective (the others get in first)
PAUSE_S = 100e-6
MALLOC_BYTES = 1 * KiB
NUMPY_HEAP = "16M"        # the NumPy face's own heap, where the run makes it


def polling_codes(names=POLLING) -> frozenset:
    """The code objects of `names` (module:qualified name); ImportError or
    AttributeError where one is gone (POLLING must follow a rename)."""
    codes = set()
    for name in names:
        module, _, qualname = name.partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        codes.add(obj.__code__)
    return frozenset(codes)


class Count(NamedTuple):
    counted: int   # calls made, leaving out what the polling functions made
    polled: int    # calls to the polling functions and inside them


def _raw_count(fn: Callable[[], object], skip: frozenset) -> Count:
    counted = polled = depth = 0   # depth: frames inside a polling function

    def hook(frame, event, arg):
        nonlocal counted, polled, depth
        if event == "call":
            if depth:
                depth += 1
                polled += 1
            elif frame.f_code in skip:
                depth = 1
                polled += 1
            else:
                counted += 1
        elif event == "return":
            if depth:
                depth -= 1
        elif event == "c_call":
            if depth:
                polled += 1
            else:
                counted += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return Count(counted, polled)


def _nothing() -> None:
    """What count_calls subtracts: the wrapper's own call and the profiler's switch."""


@functools.lru_cache(maxsize=None)
def _overhead() -> int:
    return _raw_count(_nothing, frozenset()).counted


def count_calls(fn: Callable[[], object], skip: frozenset = frozenset()) -> Count:
    """The calls that one call of `fn` makes, as cProfile counts them (every
    Python function entered, every builtin called), `fn`'s own call left out;
    the calls to the functions whose code is in `skip`, and every call made
    inside them, counted apart (polled). It replaces any profiler of this
    thread while it counts (sys.setprofile) and leaves none."""
    raw = _raw_count(fn, skip)
    return Count(raw.counted - _overhead(), raw.polled)


@dataclass
class Op:
    """One operation to count: `call` (a call of it, wrapped), `baseline`, and
    `check` (True where its result is right on this PE; after the counted calls)."""
    face: str
    name: str
    nbytes: int
    call: Callable[[], object]
    baseline_name: str
    baseline: Callable[[], object]
    check: Callable[[int], bool]     # takes the number of calls PE 0 made since set-up
    collective: bool = True


def run(bench: Bench) -> None:
    quick = bench.options.quick
    calls, warmup = (40, 5) if quick else (300, 20)
    skip = polling_codes()
    numpy_heap, made = _numpy_face_heap(bench)
    try:
        for heap, ops in ((numpy_heap, _numpy_ops(bench)), (bench.heap, _torch_ops(bench))):
            native = heap_paths(heap)["native"]
            for op in ops:
                _count(bench, heap, op, calls, warmup, skip, native)
    finally:
        gc.collect()
        if made:
            from shmemvm import api
            api.finalize()


def _numpy_face_heap(bench: Bench):
    """The NumPy face's default heap on the run's PEs: the one there is, or a
    new host heap (made: True, finalized at the end)."""
    from shmemvm import api, rc

    if "shmemvm.shmem" not in sys.modules:   # its import would make a heap on COMM_WORLD
        before = rc.initialize, rc.finalize
        rc(initialize=False, finalize=False)
        try:
            import shmemvm.shmem  # noqa: F401
        finally:
            rc.initialize, rc.finalize = before
    heap = api.current_heap()
    if heap is not None:
        if MPI.Comm.Compare(heap.comm, bench.comm) not in (MPI.IDENT, MPI.CONGRUENT):
            raise RuntimeError("benchmarks calls: the NumPy face's heap (shmemvm.shmem) is on "
                               "other PEs than this run's; finalize it first")
        return heap, False
    return api.init(bench.comm, NUMPY_HEAP, "host", timeout=bench.heap.timeout), True


def _numpy_ops(bench: Bench) -> list[Op]:
    from shmemvm import api, shmem

    me, n = bench.rank, bench.n_pes
    peer = 1 % n
    one = np.zeros(1, np.int64)
    copy = {nbytes: (np.zeros(nbytes, np.uint8), np.ones(nbytes, np.uint8))
            for nbytes in (0, 8, 8 * n)}

    def copyto(nbytes):
        dst, src = copy[nbytes]
        return lambda: np.copyto(dst, src)

    bsrc, bdst = shmem.full(1, 42 + me, dtype=np.int64), shmem.zeros(1, dtype=np.int64)
    fsrc, fdst = shmem.full(1, 100 + me, dtype=np.int64), shmem.zeros(n, dtype=np.int64)
    asrc = shmem.array(np.arange(n, dtype=np.int64) + me * n)
    adst = shmem.zeros(n, dtype=np.int64)
    rsrc, rdst = shmem.full(1, me + 1.0, dtype=np.float64), shmem.zeros(1, dtype=np.float64)
    pdst = shmem.zeros(1, dtype=np.int64)
    psrc = np.full(1, 7, dtype=np.int64)
    gsrc = shmem.full(1, 1000 + me, dtype=np.int64)
    counter = shmem.zeros(1, dtype=np.int64)
    shmem.barrier_all()
    info = api.current_heap().heap_info
    live = info()["live_allocations"]   # malloc + free: as many after as before
    copy_name = "np.copyto of the same bytes (local)"
    return [
        Op("numpy", "barrier_all", 0, lambda: shmem.barrier_all(), copy_name, copyto(0),
           lambda _: True),
        Op("numpy", "sync_all", 0, lambda: shmem.sync_all(), copy_name, copyto(0),
           lambda _: True),
        Op("numpy", "broadcast", 8, lambda: shmem.broadcast(bdst, bsrc, 0), copy_name,
           copyto(8), lambda _: me == 0 or int(bdst[0]) == 42),
        Op("numpy", "fcollect", 8, lambda: shmem.fcollect(fdst, fsrc), copy_name, copyto(8),
           lambda _: fdst.tolist() == [100 + pe for pe in range(n)]),
        Op("numpy", "alltoall", 8, lambda: shmem.alltoall(adst, asrc), copy_name,
           copyto(8 * n), lambda _: adst.tolist() == [pe * n + me for pe in range(n)]),
        Op("numpy", "sum_reduce", 8, lambda: shmem.sum_reduce(rdst, rsrc), copy_name,
           copyto(8), lambda _: float(rdst[0]) == n * (n + 1) / 2),
        Op("numpy", "malloc+free", MALLOC_BYTES,
           lambda: shmem.free(shmem.alloc(MALLOC_BYTES, clear=False)),
           "np.empty of the same bytes (local)", lambda: np.empty(MALLOC_BYTES, np.uint8),
           lambda _: info()["live_allocations"] == live),
        Op("numpy", "put", 8, lambda: shmem.put(pdst, psrc, peer), copy_name, copyto(8),
           lambda _: me != peer or int(pdst[0]) == 7, collective=False),
        Op("numpy", "get", 8, lambda: shmem.get(one, gsrc, peer), copy_name, copyto(8),
           lambda _: me != 0 or int(one[0]) == 1000 + peer, collective=False),
        Op("numpy", "atomic_fetch_add", 8, lambda: shmem.atomic_fetch_add(counter, 1, peer),
           copy_name, copyto(8), lambda made: me != peer or int(counter[0]) == made,
           collective=False),
    ]


def _torch_ops(bench: Bench) -> list[Op]:
    heap = bench.heap
    me, n = bench.rank, bench.n_pes
    peer = 1 % n
    device = heap.device
    i64 = torch.int64

    def local(values, dtype=i64):
        return torch.tensor(values, dtype=dtype, device=device)

    copy = {nbytes: (torch.zeros(nbytes, dtype=torch.uint8, device=device),
                     torch.ones(nbytes, dtype=torch.uint8, device=device))
            for nbytes in (0, 8, 8 * n)}

    def copy_(nbytes):
        dst, src = copy[nbytes]
        return lambda: dst.copy_(src)

    def symmetric(values, dtype=i64):
        t = heap.zeros(len(values), dtype)
        t.copy_(local(values, dtype))
        return t

    bsrc, bdst = symmetric([42 + me]), heap.zeros(1, i64)
    fsrc, fdst = symmetric([100 + me]), heap.zeros(n, i64)
    asrc, adst = symmetric([me * n + pe for pe in range(n)]), heap.zeros(n, i64)
    rsrc, rdst = symmetric([me + 1.0], torch.float64), heap.zeros(1, torch.float64)
    pdst, psrc = heap.zeros(1, i64), local([7])
    gsrc, one = symmetric([1000 + me]), local([0])
    counter = heap.zeros(1, i64)
    heap.barrier_all()
    live = heap.heap_info()["live_allocations"]   # malloc + free: as many after as before
    copy_name = "Tensor.copy_ of the same bytes (local)"
    return [
        Op("torch", "barrier_all", 0, lambda: heap.barrier_all(), copy_name, copy_(0),
           lambda _: True),
        Op("torch", "sync_all", 0, lambda: heap.sync_all(), copy_name, copy_(0),
           lambda _: True),
        Op("torch", "broadcast", 8, lambda: heap.broadcast(bdst, bsrc, 0), copy_name,
           copy_(8), lambda _: me == 0 or int(bdst[0]) == 42),
        Op("torch", "fcollect", 8, lambda: heap.fcollect(fdst, fsrc), copy_name, copy_(8),
           lambda _: fdst.tolist() == [100 + pe for pe in range(n)]),
        Op("torch", "alltoall", 8, lambda: heap.alltoall(adst, asrc), copy_name, copy_(8 * n),
           lambda _: adst.tolist() == [pe * n + me for pe in range(n)]),
        Op("torch", "sum_reduce", 8, lambda: heap.reduce(rdst, rsrc, "sum"), copy_name,
           copy_(8), lambda _: float(rdst[0]) == n * (n + 1) / 2),
        Op("torch", "malloc+free", MALLOC_BYTES, lambda: heap.free(heap.malloc(MALLOC_BYTES)),
           "torch.empty of the same bytes (local)",
           lambda: torch.empty(MALLOC_BYTES, dtype=torch.uint8, device=device),
           lambda _: heap.heap_info()["live_allocations"] == live),
        Op("torch", "put", 8, lambda: heap.put(pdst, psrc, peer), copy_name, copy_(8),
           lambda _: me != peer or int(pdst[0]) == 7, collective=False),
        Op("torch", "get", 8, lambda: heap.get(one, gsrc, peer), copy_name, copy_(8),
           lambda _: me != 0 or int(one[0]) == 1000 + peer, collective=False),
        Op("torch", "atomic_fetch_add", 8, lambda: heap.atomic_fetch_add(counter, 1, peer),
           copy_name, copy_(8), lambda made: me != peer or int(counter[0]) == made,
           collective=False),
    ]


def _count(bench: Bench, heap, op: Op, calls: int, warmup: int, skip: frozenset,
           native: bool) -> None:
    """Count `calls` calls of `op` on PE 0 (module doc) and its baseline's, check
    its result on every PE, and record the figure."""
    gc.disable()   # a collection's finalizers would run inside some of the calls
    try:
        bench.comm.Barrier()
        counts = _counted_calls(bench, op, calls, warmup, skip)
        base = [count_calls(op.baseline).counted for _ in range(calls if counts else 0)]
    finally:
        gc.enable()
    _check(bench, heap, op, warmup + calls + 1)
    if bench.rank != 0:
        return
    samples, waited = no_wait_counts(counts)
    entry = measurement(f"calls.{op.name}", {"n_pes": bench.n_pes, "face": op.face,
                                              "bytes": op.nbytes, "native": native},
                        "calls", samples, op.baseline_name, base, "lower", waited=waited)
    bench.records.append(entry)
    bench.progress("calls %-6s %-17s %6.1f calls/op (baseline %g; %d of %d calls waited)",
                   op.face, op.name, entry["value"]["median"],
                   entry["baseline"]["value"]["median"], waited, calls)


def _counted_calls(bench: Bench, op: Op, calls: int, warmup: int,
                   skip: frozenset) -> list[Count]:
    """PE 0's counts of `calls` calls of `op` after `warmup` calls; a collective's
    calls are made by every PE (PE 0 pausing before each), a one-sided one's by
    PE 0 while the others rest. ([] on the other PEs.)"""
    me = bench.rank
    if not op.collective and me != 0:
        bench.rest()
        return []
    for _ in range(warmup):
        op.call()
    counts = []
    for _ in range(calls):
        if me == 0:
            if op.collective:
                time.sleep(PAUSE_S)
            counts.append(count_calls(op.call, skip))
        else:
            op.call()
    if not op.collective:
        bench.rested()
    return counts


def _check(bench: Bench, heap, op: Op, made: int) -> None:
    """One call more, then `op`'s check on every PE (`made`: PE 0's calls since
    set-up); RuntimeError on every PE where it fails on one."""
    if op.collective or bench.rank == 0:
        op.call()
    heap.quiet()
    bench.comm.Barrier()
    if not bench.comm.allreduce(bool(op.check(made)), op=MPI.LAND):
        raise RuntimeError(f"benchmarks calls: {op.face} {op.name} left a wrong result "
                           f"(its count would be no figure)")


def no_wait_counts(counts: list[Count]) -> tuple[list[int], int]:
    """The counts of the calls that polled least (where PE 0 did not wait), and
    how many calls were left out."""
    least = min(c.polled for c in counts)
    kept = [c.counted for c in counts if c.polled == least]
    return kept, len(counts) - len(kept)
