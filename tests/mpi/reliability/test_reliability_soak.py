"""Soak: 10 000 collective malloc/free cycles of random sizes leak nothing (host
backend; run under mpirun -n 1, 2 and 4).

After a warm-up, and again at the end, every temporary tensor is freed and
the cache trimmed; then this process's open descriptors, its shmemvm memfd
mappings (its own segments and its peers') and the heap's physical bytes must
be exactly what they were after the warm-up. A few tensors live through the
whole soak and must keep their contents, here and as seen by peers.

SHMEMVM_SOAK_CYCLES changes the number of cycles.
"""

from __future__ import annotations

import gc
import os
import random
import time

import pytest
import torch
from mpi4py import MPI

from shmemvm import HeapExhaustedError, SymmetricHeap
from util import open_fds, shmemvm_mappings

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD
CYCLES = int(os.environ.get("SHMEMVM_SOAK_CYCLES", "10000"))
WARMUP = 500
HEAP = 64 << 20


HEAP_OPTIONS = {"backend": "host", "heap_size": HEAP, "timeout": 60}  # the conftest heap fixture, pinned to host memory


def random_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.02:
        return 0
    if r < 0.70:
        return rng.randrange(1, 64 << 10)            # carved from small segments
    if r < 0.97:
        return rng.randrange(64 << 10, 1 << 20)      # segments of their own
    return rng.randrange(1 << 20, 12 << 20)          # large: evicts cached segments


def snapshot(heap: SymmetricHeap) -> dict:
    gc.collect()
    info = heap.heap_info()
    return {"fds": open_fds(), "mappings": sorted(shmemvm_mappings()),
            "live": info["live_allocations"], "mapped": info["mapped"], "cached": info["cached"]}


def check_persistent(heap: SymmetricHeap, keep: list[torch.Tensor]) -> None:
    heap.barrier_all()
    for i, t in enumerate(keep):
        for pe in range(heap.n_pes):
            assert bool((heap.ptr(t, pe) == (pe * 10 + i) % 251).all()), f"kept tensor {i} of PE {pe}"
    heap.barrier_all()


def test_malloc_free_soak_leaks_nothing(heap, record_property):
    rng = random.Random(world.bcast(2024))
    me, n = heap.my_pe, heap.n_pes
    keep = [heap.malloc(size) for size in (100, 70_000, 3 << 20)]   # live through the soak
    for i, t in enumerate(keep):
        t.fill_((me * 10 + i) % 251)
    live: list[torch.Tensor] = []
    stats = {"malloc": 0, "free": 0, "exhausted": 0, "checks": 0}

    def cycles(count: int) -> None:
        for i in range(count):
            try:
                t = heap.malloc(random_size(rng))
            except HeapExhaustedError:
                stats["exhausted"] += 1            # every PE, the same state: go on
            else:
                stats["malloc"] += 1
                if t.numel():
                    t[0] = t[-1] = me
                live.append(t)
            if live and (len(live) > 12 or rng.random() < 0.5):
                heap.free(live.pop(rng.randrange(len(live))))
                stats["free"] += 1
            if i % 1000 == 999 and live:           # data still goes where it should
                t = live[rng.randrange(len(live))]
                heap.barrier_all()
                if t.numel():
                    right = (me + 1) % n
                    assert int(heap.ptr(t, right)[0]) == right == int(heap.ptr(t, right)[-1])
                stats["checks"] += 1
                heap.barrier_all()

    def settle() -> tuple[int, dict]:
        while live:
            heap.free(live.pop())
        heap.barrier_all()
        before_trim = heap.heap_info()["mapped"]
        assert before_trim <= HEAP
        heap.trim()
        return before_trim, snapshot(heap)

    cycles(WARMUP)
    _, baseline = settle()
    check_persistent(heap, keep)
    start = time.perf_counter()
    cycles(CYCLES)
    elapsed = time.perf_counter() - start
    mapped_before_trim, final = settle()
    check_persistent(heap, keep)

    assert final["live"] == baseline["live"] == len(keep)
    # what the kept tensors hold: their own segment each from the chunk size up,
    # one chunk shared by the smaller ones (they fit in one)
    chunk = heap.heap_info()["chunk"]
    classes = [max(64, 1 << (t.numel() - 1).bit_length()) for t in keep]
    small = [c for c in classes if c < chunk]
    assert sum(small) <= chunk
    assert final["mapped"] == baseline["mapped"] == sum(
        c for c in classes if c >= chunk) + (chunk if small else 0)
    assert final["cached"] == baseline["cached"] == 0
    assert mapped_before_trim >= final["mapped"]
    assert final["mappings"] == baseline["mappings"]
    assert final["fds"] == baseline["fds"], (final["fds"] ^ baseline["fds"])
    assert stats["malloc"] + stats["exhausted"] == CYCLES + WARMUP
    assert stats["free"] > CYCLES // 3 and stats["checks"] >= CYCLES // 1000
    record_property("soak_seconds", elapsed)
