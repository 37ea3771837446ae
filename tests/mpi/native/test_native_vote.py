"""The compiled piece is voted on at init (shmemvm/native): one PE without it
(SHMEMVM_NATIVE=0, or a missing build) leaves every PE on the Python paths, and
the heap works. The compiled piece itself, in one process: tests/unit/native/test_native.py.
"""

from __future__ import annotations

import pytest

from shmemvm import native
from shmemvm.core.state import parts_of

pytestmark = pytest.mark.skipif(native._native is None,
                                reason="the compiled piece is not built (pip install . builds it)")


@pytest.mark.mpi(min_size=2)
def test_a_pe_without_the_compiled_piece_leaves_every_pe_without_it():
    """The CPU atomic path and the board's C steps need every PE: one PE's
    SHMEMVM_NATIVE=0 (or a missing build) is a vote for the Python paths on
    every PE, and the heap works."""
    import torch
    from mpi4py import MPI

    from shmemvm import SymmetricHeap
    from shmemvm.transport.route import AtomicPath

    world = MPI.COMM_WORLD
    for setting, everywhere in (("auto", True), ("0" if world.rank == 1 else "auto", False)):
        heap = SymmetricHeap(world, "4M", backend="host", timeout=30, native=setting)
        try:
            assert heap._core.native is everywhere
            single_node = len(heap.node_pes) == heap.n_pes
            assert (parts_of(heap).routes.atomics is AtomicPath.CPU) == (everywhere and single_node)
            if parts_of(heap).agreement.board is not None:
                assert parts_of(heap).agreement.board.native is everywhere
            counter = heap.zeros(1, torch.int64)
            heap.atomic_add(counter[0], 1, 0)
            heap.barrier_all()
            assert heap.atomic_fetch(counter[0], 0) == heap.n_pes
            heap.free(counter)
        finally:
            heap.finalize()
    with pytest.raises(ValueError, match="SHMEMVM_NATIVE"):
        SymmetricHeap(world, "4M", backend="host", timeout=30, native="fast")
