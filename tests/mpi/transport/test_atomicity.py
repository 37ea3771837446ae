"""Atomics are atomic with respect to each other whatever path they take,
because a heap's atomics all take ONE path (transport/route.py): CPU atomics
where every PE is on one node and has the compiled piece, the MPI window
otherwise (on the node too), kernels on device heaps. Every PE hammers the
same words at once, from this node and from the others, with adds and with
compare-and-swap increments, on every path a host heap can take; nothing may
be lost.

    mpirun -n 4 python -m pytest --with-mpi -m mpi tests/mpi/transport/test_atomicity.py
"""

from __future__ import annotations

import pytest
import torch
from mpi4py import MPI

from shmemvm import SymmetricHeap, native
from shmemvm.transport.route import AtomicPath
from shmemvm.core.state import parts_of

world = MPI.COMM_WORLD
ROUNDS = 300

PATHS = [
    # (node_split, SHMEMVM_NATIVE): one node with and without the compiled piece; every
    # PE on a node of its own; node peers and other nodes at once (from 3 PEs)
    (None, "auto"), (None, "0"), (1, "auto"), (2, "auto"),
]


def expected_path(heap, setting) -> AtomicPath:
    """The rule: CPU atomics only where every PE is on one node and has them."""
    one_node = len(heap.node_pes) == heap.n_pes
    if one_node and setting != "0" and native._native is not None:
        return AtomicPath.CPU
    return AtomicPath.WINDOW


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("node_split, setting", PATHS,
                         ids=["one-node", "one-node-python", "split-1", "split-2"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.uint64, torch.int16])
def test_contended_atomics_lose_nothing_on_every_path(node_split, setting, dtype):
    heap = SymmetricHeap(world, "4M", backend="host", timeout=30, node_split=node_split,
                         native=setting)
    try:
        assert parts_of(heap).routes.atomics is expected_path(heap, setting)
        n = heap.n_pes
        words = heap.zeros(2, dtype)
        heap.barrier_all()
        for _ in range(ROUNDS):   # every PE adds to PE 0's word, from near and far
            heap.atomic_add(words[0], 1, 0)
        for _ in range(ROUNDS // 10):   # and takes turns on PE n-1's word with CAS
            while True:
                old = heap.atomic_fetch(words[1], n - 1)
                if heap.atomic_compare_swap(words[1], old, old + 1, n - 1) == old:
                    break
        heap.barrier_all()
        assert heap.atomic_fetch(words[0], 0) == n * ROUNDS
        assert heap.atomic_fetch(words[1], n - 1) == n * (ROUNDS // 10)
        heap.barrier_all()   # every PE has read the totals before any adds again
        fetched = [heap.atomic_fetch_add(words[0], 1, 0) for _ in range(5)]
        assert fetched == sorted(fetched) and len(set(fetched)) == 5   # each saw its own
        heap.barrier_all()
        heap.free(words)
    finally:
        heap.finalize()
