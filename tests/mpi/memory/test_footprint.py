"""A heap's footprint in descriptors and mappings scales with heap size /
chunk, not with the number of allocations: thousands of small and medium
tensors alive at once keep this PE's open descriptors and shmemvm mappings
under a bound computed from heap_info()'s heap_size and chunk.

    mpirun -n 2 (and -n 4) python -m pytest -q --with-mpi -m mpi tests/mpi/memory/test_footprint.py

The figures behind it (descriptors, mappings and physical bytes per requested
byte, against one segment per allocation and a bump allocator) are measured by
benchmarks/footprint.py, from a checkout's root:

    mpirun -n 2 python -m benchmarks footprint --json PATH
"""

from __future__ import annotations

import gc
import os

import pytest
import torch
from mpi4py import MPI

from shmemvm import SymmetricHeap, SymmetryError
from util import open_fds, shmemvm_mappings

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD
K, M = 1 << 10, 1 << 20
SIZES = [64, 1 * K, 8 * K, 64 * K, 256 * K, 1 * M]      # small and medium, all below the chunk
COUNT = 3000


@pytest.mark.mpi(min_size=2)
def test_thousands_of_allocations_hold_few_descriptors_and_mappings():
    gc.collect()
    fds_start, maps_start = len(open_fds()), len(shmemvm_mappings())
    heap = SymmetricHeap(world, heap_size="1G", backend="host", timeout=30)
    try:
        info = heap.heap_info()
        budget, chunk, node_pes = info["heap_size"], info["chunk"], len(info["node_pes"])
        assert chunk == 16 * M          # auto: heap size / 64
        segments_bound = budget // chunk
        fds_bound = segments_bound + 8          # + the heap's socket and MPI's own
        maps_bound = node_pes * segments_bound  # own segments, and each peer's
        tensors = [heap.empty(SIZES[i % len(SIZES)], torch.uint8) for i in range(COUNT)]
        big = [heap.empty(s, torch.uint8) for s in (chunk, 2 * chunk)]   # segments of their own
        info = heap.heap_info()
        fds, maps = len(open_fds()) - fds_start, len(shmemvm_mappings()) - maps_start
        detail = (f"{COUNT + 2} allocations: {info['segments']} segments, {fds} fds, {maps} "
                  f"mappings; bounds {segments_bound}, {fds_bound}, {maps_bound}")
        assert info["live_allocations"] == COUNT + 2
        assert 1 < info["segments"] <= segments_bound, detail
        assert fds <= fds_bound, detail
        assert info["segments"] <= maps <= maps_bound, detail
        # One segment per allocation would have been COUNT descriptors.
        assert fds < COUNT // 10, detail
        # the carved blocks are real symmetric memory: a neighbour's put arrives
        me, n = heap.my_pe, heap.n_pes
        for i in range(0, COUNT, 97):
            heap.put(tensors[i], torch.full_like(tensors[i], (i + me) % 251), (me + 1) % n)
        heap.barrier_all()
        left = (me - 1) % n
        assert all(bool((tensors[i] == (i + left) % 251).all()) for i in range(0, COUNT, 97))
        for tensor in tensors + big:
            heap.free(tensor)
        del tensor
        heap.trim()
        assert heap.heap_info()["segments"] == 0
        assert len(shmemvm_mappings()) == maps_start
    finally:
        gc.collect()
        heap.finalize()
    assert len(open_fds()) == fds_start


@pytest.mark.mpi(min_size=2)
def test_a_chunk_is_given_back_only_when_all_of_it_is_free():
    heap = SymmetricHeap(world, heap_size="64M", backend="host", timeout=30)
    try:
        chunk = heap.heap_info()["chunk"]
        assert chunk == M               # 64 MiB / 64
        a = heap.empty(chunk // 4, torch.uint8)
        b = heap.empty(chunk // 4, torch.uint8)
        assert heap.heap_info()["segments"] == 1 and heap.heap_info()["mapped"] == chunk
        heap.free(a)
        assert heap.trim() == 0 and heap.heap_info()["mapped"] == chunk   # b lives in it
        heap.free(b)
        assert heap.trim() == chunk and heap.heap_info()["mapped"] == 0
    finally:
        heap.finalize()


def _with_chunk(value):
    """A heap made with SHMEMVM_CHUNK_SIZE=value on this PE (None: unset)."""
    saved = os.environ.pop("SHMEMVM_CHUNK_SIZE", None)
    if value is not None:
        os.environ["SHMEMVM_CHUNK_SIZE"] = value
    try:
        return SymmetricHeap(world, heap_size="64M", backend="host", timeout=30)
    finally:
        os.environ.pop("SHMEMVM_CHUNK_SIZE", None)
        if saved is not None:
            os.environ["SHMEMVM_CHUNK_SIZE"] = saved


@pytest.mark.mpi(min_size=2)
def test_the_chunk_size_setting_is_used_capped_and_agreed_on():
    heap = _with_chunk("256K")
    try:
        assert heap.heap_info()["chunk"] == 256 * K
        x = heap.empty(128 * K, torch.uint8)
        assert heap.heap_info()["mapped"] == 256 * K
        heap.free(x)
    finally:
        heap.finalize()
    heap = _with_chunk("1G")             # larger than the heap: the heap's largest power of two
    try:
        assert heap.heap_info()["chunk"] == 64 * M
    finally:
        heap.finalize()
    for bad in ("100K", "4K"):           # not a power of two; below the granularity
        with pytest.raises(ValueError, match="SHMEMVM_CHUNK_SIZE"):
            _with_chunk(bad)
    # PEs with different chunk sizes would carve different offsets: refused on every PE
    with pytest.raises(SymmetryError, match="chunk="):
        _with_chunk("128K" if world.Get_rank() == 0 else "256K")


@pytest.mark.mpi(min_size=2)
def test_releasing_thousands_of_blocks_leaves_the_steps_as_cheap_as_before():
    """Blocks dropped on every PE wait in a set until a step releases them, and
    every step reads that set (its digest, the release). A set keeps the table
    of its largest size when emptied, and reading it walks the whole table: after
    20000 blocks released at once, a NumPy alloc + free took 120 us instead of
    24 (2 PEs, the 2-core VM). The set must be as small as a new one again."""
    import sys
    from shmemvm.core.state import core_of
    heap = SymmetricHeap(world, heap_size="64M", backend="host", timeout=30)
    try:
        core = core_of(heap)
        empty = sys.getsizeof(set())
        tensors = [heap.malloc(64) for _ in range(5000)]
        del tensors
        gc.collect()
        heap.barrier_all()                     # the step that releases them all
        assert heap.heap_info()["live_allocations"] == 0
        assert sys.getsizeof(core._pending) == empty, sys.getsizeof(core._pending)
        kept = heap.malloc(64)                 # and a step with one dropped block
        del kept
        gc.collect()
        heap.barrier_all()
        assert sys.getsizeof(core._pending) == empty
    finally:
        heap.finalize()
