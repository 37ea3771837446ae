"""A one-shot all-reduce in one Triton kernel: every PE reads every PE's
source through shmemvm's heap bases and sums them in PE order, so every PE
gets the bit-identical result. Programs meet their counterparts on the other
PEs at a device-side barrier (signals with release/acquire) before reading and
again after, so no host-side barrier is needed around a call.

    mpirun -n 2 python examples/triton_allreduce.py                  # GPUs (CUDA heap)
    TRITON_INTERPRET=1 mpirun -n 2 python examples/triton_allreduce.py  # CPUs (host heap)

It checks its result against the sum computed on the host, and that every PE
holds the same bytes. This kernel shows the device-side API at its plainest;
shmemvm.DeviceAllReduce is the library's tuned all-reduce (the call number kept
on the device, CUDA graph replay, mismatch and timeout detection).
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
import triton
import triton.language as tl
from mpi4py import MPI

import shmemvm
from shmemvm import triton as sv


@triton.jit(do_not_specialize=["n", "epoch", "me"])  # one compiled kernel for every call
def one_shot_all_reduce(src, dst, pads, n, epoch, me, heap_bases,
                        N_PES: tl.constexpr, BLOCK: tl.constexpr):
    """dst = sum over PEs (in PE order) of src, elementwise. `pads`: a symmetric
    int64 tensor of num_programs * N_PES zeros at first; `epoch`: 1, 2, 3, ...
    one per call (the barrier values 2*epoch and 2*epoch+1 only ever grow)."""
    pid = tl.program_id(0)
    pad = pads + pid * N_PES
    # entry barrier: my source is ready; wait until every PE's is
    for pe in tl.static_range(N_PES):
        sv.signal_set(pad + me, 2 * epoch, me, pe, heap_bases)
    for pe in tl.static_range(N_PES):
        sv.signal_wait_until(pad + pe, sv.CMP_GE, 2 * epoch)
    start = pid * BLOCK
    step = tl.num_programs(0) * BLOCK
    while start < n:   # a while loop: Triton's interpreter cannot range() over run-time ints
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        acc = sv.load(src + offs, me, 0, heap_bases, mask=mask, hint=BLOCK)
        for pe in tl.static_range(1, N_PES):
            acc += sv.load(src + offs, me, pe, heap_bases, mask=mask, hint=BLOCK)
        tl.store(dst + offs, acc, mask=mask)
        start += step
    # exit barrier: nobody reads my source any more once this returns
    for pe in tl.static_range(N_PES):
        sv.signal_set(pad + me, 2 * epoch + 1, me, pe, heap_bases)
    for pe in tl.static_range(N_PES):
        sv.signal_wait_until(pad + pe, sv.CMP_GE, 2 * epoch + 1)


class OneShotAllReduce:
    """Sum symmetric 1-D tensors over every PE of `heap` (all on one node)."""

    def __init__(self, heap: shmemvm.SymmetricHeap, programs: int = 32, block: int = 2048,
                 num_warps: int = 8):
        if len(heap.node_pes) != heap.n_pes:
            raise shmemvm.UnsupportedError("the one-shot all-reduce reads every PE's memory: "
                                           "all PEs must be on one node")
        self.heap, self.programs, self.block, self.num_warps = heap, programs, block, num_warps
        self.pads = heap.zeros(programs * heap.n_pes, torch.int64)
        self.epoch = 0

    def __call__(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst <- sum of src over the PEs (both symmetric, same dtype and size).
        Queued on the current stream (device heaps); collective."""
        self.epoch += 1
        n = src.numel()
        grid = (max(1, min(self.programs, triton.cdiv(n, self.block))),)
        one_shot_all_reduce[grid](src, dst, self.pads, n, self.epoch, self.heap.my_pe,
                                  self.heap.heap_bases(), N_PES=self.heap.n_pes,
                                  BLOCK=self.block, num_warps=self.num_warps)


def compile_signatures():
    """(kernel, signature, constants) for tests/helpers/triton_compile.py."""
    for dtype in ("fp32", "bf16"):
        yield one_shot_all_reduce, {"src": f"*{dtype}", "dst": f"*{dtype}", "pads": "*i64",
                                    "n": "i32", "epoch": "i64", "me": "i32",
                                    "heap_bases": "*i64", "N_PES": "constexpr",
                                    "BLOCK": "constexpr"}, {"N_PES": 2, "BLOCK": 2048}


def _backend() -> str:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "host"
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run with TRITON_INTERPRET=1 for the host heap")
    return "cuda"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=None)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    backend = _backend()
    heap = shmemvm.init(heap_size="1G" if backend == "cuda" else "64M", backend=backend)
    me, n = heap.my_pe, heap.n_pes
    count = args.elements or ((1 << 22) + 17 if backend == "cuda" else 5000 + 17)
    block = 2048 if backend == "cuda" else 1024
    reduce = OneShotAllReduce(heap, programs=32 if backend == "cuda" else 3, block=block)
    src = heap.empty(count, torch.float32)
    dst = heap.empty(count, torch.float32)

    def data(pe: int, call: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 * call + pe)
        return torch.randn(count, generator=g)

    for call in range(args.calls):
        src.copy_(data(me, call))
        reduce(dst, src)          # no barrier needed: the kernel has its own
        expected = data(0, call)
        for pe in range(1, n):
            expected += data(pe, call)
        got = dst.cpu()
        assert torch.equal(got, expected), (call, (got - expected).abs().max())
        digest = hashlib.sha256(got.numpy().tobytes()).hexdigest()
        assert len(set(heap.comm.allgather(digest))) == 1, "PEs differ"
    if me == 0:
        print(f"one-shot all-reduce over {n} PEs ({backend} heap): {args.calls} calls of "
              f"{count} float32 checked, bit-identical on every PE")
    shmemvm.finalize()


if __name__ == "__main__":
    main()
