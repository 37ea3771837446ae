"""The anchor (anchor.py): each PE's piece of memory, exported once and mapped
by every other PE of the node, which makes the CUDA driver share fresh memory
about 8-12x faster (the stored runs: 7.6x at 64 MiB, 11.7x at 1 GiB). Its speed
is measured on the GPUs (benchmarks, docs/performance.md); here, on whatever
backend the tests run (SHMEMVM_TEST_BACKEND), that it is mapped where it should
be, agreed on, optional, and leaves nothing behind.
"""

from __future__ import annotations

import gc
import logging
import time

import pytest
import torch
from mpi4py import MPI

import shmemvm.core.setup
from conftest import TEST_BACKEND
from shmemvm import PeerTimeoutError, SymmetricHeap, SymmetryError
from shmemvm.node.anchor import Anchor
from shmemvm.core.state import parts_of
from util import open_fds, shmemvm_mappings

world = MPI.COMM_WORLD
OPTIONS = {"heap_size": "16M", "backend": TEST_BACKEND, "timeout": 20}
SIZE = 4 << 20      # a multiple of every backend's granularity (host 64 KiB, CUDA 2 MiB)


def assert_a_fresh_segment_is_shared(heap) -> None:
    """A new segment, written by each PE and read from its right neighbour."""
    x = heap.malloc(1 << 20)
    x.fill_(heap.my_pe + 1)
    heap.barrier_all()
    peer = (heap.my_pe + 1) % heap.n_pes
    got = torch.empty(8, dtype=torch.uint8, device=x.device)
    heap.get(got, x[:8], peer)
    assert got.tolist() == [peer + 1] * 8
    heap.free(x)


def read_slot(heap, va: int) -> torch.Tensor:
    return heap.backend.tensor(va, (4,), torch.int32).cpu()


@pytest.mark.mpi(min_size=2)
def test_every_pe_maps_the_anchor_of_every_other_pe_of_its_node():
    heap = SymmetricHeap(world, anchor=SIZE, **OPTIONS)
    try:
        assert heap.heap_info()["anchor"] == SIZE
        anchor = parts_of(heap).anchor
        assert sorted(anchor._slots) == sorted(set(heap.node_pes) - {heap.my_pe})
        heap.backend.tensor(anchor.va, (4,), torch.int32).fill_(100 + heap.my_pe)
        heap.backend.synchronize()
        heap.barrier_all()
        for pe, va in anchor._slots.items():  # the peer's memory itself, not a copy
            assert read_slot(heap, va).tolist() == [100 + pe] * 4
        heap.barrier_all()
        assert_a_fresh_segment_is_shared(heap)   # the heap goes on as ever
    finally:
        heap.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("options", [{"anchor": 0}, {"anchor": SIZE, "node_split": 1},
                                     {"anchor": "auto", "backend": "host"}])
def test_no_anchor_where_it_is_off_or_a_pe_is_alone_on_its_node(options):
    heap = SymmetricHeap(world, **dict(OPTIONS, **options))
    try:
        assert parts_of(heap).anchor is None and heap.heap_info()["anchor"] == 0
        heap.free(heap.malloc(1 << 20))
    finally:
        heap.finalize()


@pytest.mark.mpi(min_size=2)
def test_different_anchor_settings_are_an_init_error_on_every_pe():
    with pytest.raises(SymmetryError, match="SHMEMVM_ANCHOR"):
        SymmetricHeap(world, anchor=SIZE if world.rank == 0 else 0, **OPTIONS)
    world.Barrier()


class AnchorRefusedOnPe1(Anchor):
    def __init__(self, backend, size, peers):
        super().__init__(backend, size, peers)
        if world.rank == 1:
            self.close()
            raise OSError("no anchor on PE 1 (test)")


@pytest.mark.mpi(min_size=2)
def test_a_pe_without_its_anchor_leaves_every_pe_without_one_and_the_heap_works(
        monkeypatch, caplog):
    SymmetricHeap(world, anchor=SIZE, **OPTIONS).finalize()   # one-off state (MPI, torch)
    world.Barrier()
    fds, mappings = open_fds(), shmemvm_mappings()
    monkeypatch.setattr(shmemvm.core.setup, "Anchor", AnchorRefusedOnPe1)
    with caplog.at_level(logging.WARNING, logger="shmemvm"):
        heap = SymmetricHeap(world, anchor=SIZE, **OPTIONS)
    try:
        assert parts_of(heap).anchor is None and heap.heap_info()["anchor"] == 0
        assert "no anchor" in caplog.text
        assert_a_fresh_segment_is_shared(heap)
    finally:
        heap.finalize()
    world.Barrier()
    assert open_fds() == fds
    assert shmemvm_mappings() == mappings


class AnchorLateOnPe1(Anchor):
    def __init__(self, backend, size, peers):
        if world.rank == 1:
            time.sleep(2.5)   # past the others' deadline
        super().__init__(backend, size, peers)


@pytest.mark.mpi(min_size=2)
def test_a_pe_late_with_its_anchor_is_a_timeout_everywhere_that_leaves_nothing_behind(
        monkeypatch):
    SymmetricHeap(world, anchor=SIZE, **OPTIONS).finalize()
    world.Barrier()
    fds, mappings = open_fds(), shmemvm_mappings()
    monkeypatch.setattr(shmemvm.core.setup, "Anchor", AnchorLateOnPe1)
    with pytest.raises(PeerTimeoutError):
        SymmetricHeap(world, anchor=SIZE, **dict(OPTIONS, timeout=1))
    world.Barrier()
    gc.collect()
    assert open_fds() == fds
    assert shmemvm_mappings() == mappings


@pytest.mark.mpi(min_size=2)
def test_heaps_with_anchors_leave_no_descriptor_or_mapping():
    SymmetricHeap(world, anchor=SIZE, **OPTIONS).finalize()
    world.Barrier()
    fds, mappings = open_fds(), shmemvm_mappings()
    for _ in range(3):
        heap = SymmetricHeap(world, anchor=SIZE, **OPTIONS)
        heap.free(heap.malloc(1 << 20))
        heap.finalize()
    world.Barrier()
    assert open_fds() == fds
    assert shmemvm_mappings() == mappings
