"""A ring all-reduce built on ptr(): each PE reads its left neighbour's memory
directly (no MPI in the data path), first to reduce-scatter, then to gather.

    mpirun -n 4 python examples/ring_allreduce.py [--elements N]
"""

import argparse
import time

import torch
from mpi4py import MPI

import shmemvm


def ring_allreduce(heap: shmemvm.SymmetricHeap, buffer: torch.Tensor) -> None:
    """Sum `buffer` (symmetric, 1-D, length divisible by n_pes) over all PEs, in place."""
    me, n = heap.my_pe, heap.n_pes
    left = heap.ptr(buffer, (me - 1) % n)
    if left is None:
        raise RuntimeError("the left neighbour is on another node: ptr() cannot reach it")
    mine, theirs = buffer.chunk(n), left.chunk(n)
    heap.barrier_all()
    # Reduce-scatter: after step s, my chunk (me-s-1) holds the sum of s+2 PEs' chunks.
    for step in range(n - 1):
        c = (me - step - 1) % n
        mine[c].add_(theirs[c])
        heap.sync_all()  # the left PE must finish step s before I read its step-s chunk
    # All-gather: my chunk (me+1) is complete; pass complete chunks around the ring.
    for step in range(n - 1):
        c = (me - step) % n
        mine[c].copy_(theirs[c])
        heap.sync_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--elements", type=int, default=1 << 20)
    args = parser.parse_args()
    with shmemvm.init(heap_size=max(256 << 20, 2 * 4 * args.elements)) as heap:
        me, n = heap.my_pe, heap.n_pes
        count = args.elements - args.elements % n
        data = torch.randn(count, generator=torch.Generator().manual_seed(me)).to(heap.device)
        buffer = shmemvm.empty(count, torch.float32)
        buffer.copy_(data)
        start = time.perf_counter()
        ring_allreduce(heap, buffer)
        elapsed = time.perf_counter() - start

        expected = data.cpu().clone()  # host copy, summed by MPI for reference
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, expected, op=MPI.SUM)
        error = (buffer.cpu() - expected).abs().max().item()
        assert error < 1e-3 * n, f"PE {me}: max error {error}"
        if me == 0:
            print(f"ring all-reduce of {count} float32 over {n} PEs: {elapsed * 1e3:.2f} ms, "
                  f"max error vs MPI.Allreduce {error:.2e}")


if __name__ == "__main__":
    main()
