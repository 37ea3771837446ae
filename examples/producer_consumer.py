"""A kernel on one PE signals a kernel on another: the producer (even PEs)
stores a block into its right neighbour's memory and then sets a signal there
with release semantics; the consumer (odd PEs) waits for the signal with
acquire semantics and then checks every element. Several rounds, each with a
new signal value, reuse the same buffers. The consumer's wait has a deadline
(shmemvm.triton.Deadline, SHMEMVM_TIMEOUT): a producer that never signals makes
the consumer's host raise PeerTimeoutError instead of hanging.

    mpirun -n 2 python examples/producer_consumer.py                  # GPUs (CUDA heap)
    TRITON_INTERPRET=1 mpirun -n 2 python examples/producer_consumer.py  # CPUs (host heap)
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

import shmemvm
from shmemvm import triton as sv


@triton.jit
def producer(data, sig, n, value, me, consumer, heap_bases, BLOCK: tl.constexpr):
    start = 0
    while start < n:
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        sv.store(data + offs, (offs + value).to(data.dtype.element_ty), me, consumer, heap_bases,
                 mask=mask, hint=BLOCK)
        start += BLOCK
    sv.signal_set(sig, value, me, consumer, heap_bases)   # release: the data before it


@triton.jit
def consumer(data, sig, errors, n, value, max_polls, status, BLOCK: tl.constexpr):
    # acquire: then the data is there; gives up (status set) after the deadline
    sv.signal_wait_until(sig, sv.CMP_EQ, value, max_polls, status)
    bad = tl.zeros((BLOCK,), tl.int32)
    start = 0
    while start < n:
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        got = tl.load(data + offs, mask=mask, other=0)
        bad += (mask & (got != (offs + value).to(got.dtype))).to(tl.int32)
        start += BLOCK
    tl.store(errors, tl.sum(bad, axis=0))


def compile_signatures():
    """(kernel, signature, constants) for tests/helpers/triton_compile.py."""
    yield producer, {"data": "*i32", "sig": "*i64", "n": "i32", "value": "i64", "me": "i32",
                     "consumer": "i32", "heap_bases": "*i64", "BLOCK": "constexpr"}, {"BLOCK": 1024}
    yield consumer, {"data": "*i32", "sig": "*i64", "errors": "*i32", "n": "i32",
                     "value": "i64", "max_polls": "i32", "status": "*i32",
                     "BLOCK": "constexpr"}, {"BLOCK": 1024}


def main() -> None:
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpret and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run with TRITON_INTERPRET=1 for the host heap")
    backend = "host" if interpret else "cuda"
    heap = shmemvm.init(heap_size="256M" if backend == "cuda" else "16M", backend=backend)
    me, n = heap.my_pe, heap.n_pes
    if n % 2:
        raise SystemExit("run on an even number of PEs (producer/consumer pairs)")
    count = (1 << 20) + 3 if backend == "cuda" else 3000
    data = heap.zeros(count, torch.int32)
    sig = heap.zeros(1, torch.int64)
    errors = torch.zeros(1, dtype=torch.int32, device=heap.device)
    deadline = sv.Deadline(device=heap.device)
    heap.barrier_all()
    for round_ in range(1, 6):
        value = 1000 * round_
        if me % 2 == 0:
            producer[(1,)](data, sig, count, value, me, me + 1, heap.heap_bases(), BLOCK=1024)
        else:
            consumer[(1,)](data, sig, errors, count, value, deadline.max_polls, deadline.status,
                           BLOCK=1024)
            deadline.synchronize()   # PeerTimeoutError where the producer never signalled
            assert errors.item() == 0, f"round {round_}: {errors.item()} elements arrived late"
        heap.sync_all()   # the consumer has checked before the producer overwrites
    if me == 1:
        print(f"producer/consumer over {n} PEs ({backend} heap): 5 rounds of {count} int32 "
              f"signalled and checked")
    shmemvm.finalize()


if __name__ == "__main__":
    main()
