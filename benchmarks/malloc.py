"""Collective malloc/free latency.

Cached size: malloc then free of a size whose memory the heap still holds
(a small block in a cached chunk, or a cached segment), against
`MPI.Barrier` on the same communicator in the same repeat.
Fresh segment: malloc, free and trim() every time, so each malloc creates,
exports, passes and maps a new segment on every PE; against the raw backend
calls for one fresh segment (create + map + set_access, and unmap + release)
on a private reservation, and against MPI.Barrier.
The engine's cached branch: malloc + free of a cached size on a heap whose
engine takes the branch in C (native/blocks.c), against the same on a heap
made without it (its Python path), interleaved.
"""

from __future__ import annotations

import time

from shmemvm import native
from shmemvm.heap import SymmetricHeap

from .common import Bench, KiB, MiB, format_size, loop_time
from .names import BARRIER, RAW_BACK, RAW_CYCLE, RAW_UNBACK


def run(bench: Bench) -> None:
    quick = bench.options.quick
    cached(bench, [1 * KiB, 1 * MiB], 200 if quick else 2000)
    agreement_transports(bench, 1 * KiB, 200 if quick else 2000)
    engine_branch(bench, 1 * KiB, 200 if quick else 2000)
    fresh(bench, [1 * MiB] if quick else [64 * KiB, 1 * MiB, 64 * MiB], 20 if quick else 200)


def barrier_time(bench: Bench, iterations: int) -> float:
    bench.comm.Barrier()
    return bench.max_over_pes(loop_time(bench.comm.Barrier, iterations))


def malloc_free_time(bench: Bench, size: int, iterations: int,
                     trim: bool = False, heap=None) -> tuple[float, float]:
    """Mean seconds per collective malloc and per free (+trim) of `size`, on the
    slowest PE, over `iterations` calls started together (on `heap`, default
    the benchmark's)."""
    heap, perf = heap or bench.heap, time.perf_counter
    bench.comm.Barrier()
    t_malloc = t_free = 0.0
    for _ in range(iterations):
        a = perf()
        x = heap.malloc(size)
        b = perf()
        heap.free(x)
        if trim:
            heap.trim()
        c = perf()
        t_malloc += b - a
        t_free += c - b
    return bench.max_over_pes(t_malloc / iterations), bench.max_over_pes(t_free / iterations)


def cached(bench: Bench, sizes: list[int], iterations: int) -> None:
    heap = bench.heap
    for size in sizes:
        bench.progress("malloc/free, cached %s (%d calls x %d)", format_size(size), iterations,
                       bench.options.repeat)
        heap.free(heap.malloc(size))  # now cached
        barrier, malloc, free = [], [], []
        for _ in range(bench.options.repeat):
            barrier.append(barrier_time(bench, iterations))
            m, f = malloc_free_time(bench, size, iterations)
            malloc.append(m)
            free.append(f)
        b_us = _us(barrier)
        params = {"bytes": size, "kind": "cached"}
        bench.record("malloc.latency", params, _us(malloc), "us", BARRIER, b_us, "lower")
        bench.record("free.latency", params, _us(free), "us", BARRIER, b_us, "lower")


def agreement_transports(bench: Bench, size: int, iterations: int) -> None:
    """A cached malloc, and sync_all (one agreement step), on a heap whose steps
    go through shared memory (board.py) against one whose steps are MPI
    allreduces, interleaved; where every PE is on one node."""
    heap = bench.heap
    if heap.n_pes < 2 or len(heap.node_pes) != heap.n_pes:
        return   # no board possible
    heaps = [SymmetricHeap(bench.comm, heap._core.local.heap_size, heap.backend.name,
                           timeout=heap.timeout, agreement=kind) for kind in ("board", "mpi")]
    try:
        bench.progress("malloc, cached %s: shared-memory agreement against MPI (%d calls x %d)",
                       format_size(size), iterations, bench.options.repeat)
        for h in heaps:
            h.free(h.malloc(size))  # now cached
        malloc = {h: [] for h in heaps}
        sync = {h: [] for h in heaps}
        for _ in range(bench.options.repeat):
            for h in heaps:
                malloc[h].append(malloc_free_time(bench, size, iterations, heap=h)[0])
                # sync_all: one agreement step and nothing else (host memory has no queue)
                bench.comm.Barrier()
                sync[h].append(bench.max_over_pes(loop_time(h.sync_all, iterations)))
        board, mpi = heaps
        bench.record("malloc.latency", {"bytes": size, "kind": "cached",
                                        "agreement": "board (shared memory)"},
                     _us(malloc[board]), "us", "the same, agreement=mpi", _us(malloc[mpi]),
                     "lower")
        bench.record("sync_all.latency", {"agreement": "board (shared memory)"},
                     _us(sync[board]), "us", "the same, agreement=mpi", _us(sync[mpi]), "lower")
    finally:
        for h in heaps:
            h.finalize()


def engine_branch(bench: Bench, size: int, iterations: int) -> None:
    """The engine's cached branch in C against its Python path: a collective
    malloc + free of `size` (a size just freed: its block comes off the quick
    list and goes back) on two heaps, one whose engine has the compiled branch
    and one made without it, interleaved repeat by repeat; the slowest PE's
    mean. Nothing where the compiled piece is not used (native.CachedBlocks None)."""
    heap = bench.heap
    if native.CachedBlocks is None:
        bench.progress("the engine's cached branch: no compiled piece here, not measured")
        return
    made_with = native.CachedBlocks
    heaps = []
    try:
        for branch in (made_with, None):
            native.CachedBlocks = branch   # (how an engine is made without it: the module's choice)
            heaps.append(SymmetricHeap(bench.comm, heap._core.local.heap_size, heap.backend.name,
                                       timeout=heap.timeout))
    finally:
        native.CachedBlocks = made_with
    try:
        bench.progress("malloc + free %s, the engine's cached branch compiled against Python "
                       "(%d calls x %d)", format_size(size), iterations, bench.options.repeat)
        for h in heaps:
            h.free(h.malloc(size))  # now cached
        samples: dict = {h: [] for h in heaps}
        for _ in range(bench.options.repeat):
            for h in heaps:
                m, f = malloc_free_time(bench, size, iterations, heap=h)
                samples[h].append(m + f)
        compiled, python = heaps
        bench.record("malloc+free.latency",
                     {"bytes": size, "kind": "cached", "branch": "compiled (native/blocks.c)"},
                     _us(samples[compiled]), "us", "the same, the engine's Python branch",
                     _us(samples[python]), "lower")
    finally:
        for h in heaps:
            h.finalize()


def fresh(bench: Bench, sizes: list[int], iterations: int) -> None:
    heap, comm, backend = bench.heap, bench.comm, bench.heap.backend
    perf = time.perf_counter
    granularity = backend.granularity
    for size in sizes:
        bench.progress("malloc/free, fresh segment %s (%d calls x %d)", format_size(size),
                       iterations, bench.options.repeat)
        span = max(size, granularity)
        va = backend.reserve(span, granularity)
        try:
            barrier, malloc, free, back, unback = [], [], [], [], []
            heap.trim()
            for _ in range(bench.options.repeat):
                barrier.append(barrier_time(bench, iterations))
                m, f = malloc_free_time(bench, size, iterations, trim=True)
                malloc.append(m)
                free.append(f)
                comm.Barrier()
                t_back = t_unback = 0.0
                for _ in range(iterations):
                    a = perf()
                    handle = backend.create(span)
                    backend.map(va, span, handle)
                    backend.set_access(va, span)
                    b = perf()
                    backend.unmap(va, span)
                    backend.release(handle)
                    c = perf()
                    t_back += b - a
                    t_unback += c - b
                back.append(bench.max_over_pes(t_back / iterations))
                unback.append(bench.max_over_pes(t_unback / iterations))
        finally:
            backend.unreserve(va, span)
        params = {"bytes": size, "kind": "fresh segment"}
        m_us, f_us = _us(malloc), _us(free)
        bench.record("malloc.latency", params, m_us, "us", RAW_BACK, _us(back), "lower")
        bench.record("malloc.latency", params, m_us, "us", BARRIER, _us(barrier), "lower")
        bench.record("free+trim.latency", params, f_us, "us", RAW_UNBACK, _us(unback), "lower")
        bench.record("malloc+free+trim.latency", params,
                     _us([m + f for m, f in zip(malloc, free)]), "us", RAW_CYCLE,
                     _us([b + u for b, u in zip(back, unback)]), "lower")


def _us(seconds: list[float]) -> list[float]:
    return [s * 1e6 for s in seconds]
