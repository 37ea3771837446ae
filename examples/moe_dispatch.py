"""MoE token routing with all_to_all_v: every PE routes its tokens to experts
spread over the PEs (dispatch), the experts transform them, and the results go
back to the PEs the tokens came from (combine, the inverse), all on the device:
the split sizes are computed into a symmetric device tensor and read there by
the kernel, and the host never waits for them. At the end each PE checks every
token against the expected expert output.

    mpirun -n 2 python examples/moe_dispatch.py     # GPUs (CUDA heap), or the host heap in
                                                    # Triton's interpreter where there is none
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton makes the kernels

import shmemvm  # noqa: E402

TOKENS, HIDDEN, EXPERTS_PER_PE = 16, 8, 2


def main() -> None:
    heap = shmemvm.init(heap_size="64M", backend="cuda" if torch.cuda.is_available() else "host")
    me, world, device = heap.my_pe, heap.n_pes, heap.device
    ccl = shmemvm.ccl                       # the default heap's collectives (heap.ccl)
    experts = world * EXPERTS_PER_PE
    g = torch.Generator(device=device).manual_seed(1234 + me)

    # this PE's tokens and the expert each goes to (top-1 routing), made on the device
    tokens = torch.randn(TOKENS, HIDDEN, device=device, generator=g)
    expert = torch.randint(0, experts, (TOKENS,), device=device, generator=g)
    owner = expert // EXPERTS_PER_PE        # the PE that holds the expert

    # dispatch buffer: the tokens sorted by owner, the expert id as a last column;
    # the split sizes counted on the device (index_add_: no host synchronisation)
    order = torch.argsort(owner, stable=True)
    send = heap.zeros((TOKENS, HIDDEN + 1), torch.float32)
    send[:, :HIDDEN] = tokens[order]
    send[:, HIDDEN] = expert[order].to(torch.float32)
    in_splits = heap.zeros(world, torch.int64)
    in_splits.index_add_(0, owner, torch.ones(TOKENS, dtype=torch.int64, device=device))

    capacity = world * TOKENS               # the most rows a PE can receive
    received = heap.zeros((capacity, HIDDEN + 1), torch.float32)
    received_so = heap.zeros((2, world), torch.int64)   # counts and offsets, from each PE
    ccl.all_to_all_v(received, send, in_splits, received_so)

    # the experts: expert e scales its tokens by e + 1 (rows past the received ones are
    # zeros and stay zeros); the expert id goes back too
    outputs = heap.zeros((capacity, HIDDEN + 1), torch.float32)
    outputs[:, :HIDDEN] = received[:, :HIDDEN] * (received[:, HIDDEN:] + 1)
    outputs[:, HIDDEN] = received[:, HIDDEN]

    # combine: the inverse, the received counts as the split sizes
    back = heap.zeros((TOKENS, HIDDEN + 1), torch.float32)
    back_so = heap.zeros((2, world), torch.int64)
    ccl.all_to_all_v(back, outputs, received_so[0], back_so)
    result = torch.empty(TOKENS, HIDDEN, device=device)
    result[order] = back[:, :HIDDEN]        # unsort

    ccl.synchronize()                       # the host waits only here, to check
    expected = tokens * (expert[:, None].to(torch.float32) + 1)
    assert torch.equal(result, expected), (me, result, expected)
    assert torch.equal(back_so[0].cpu(), in_splits.cpu()), (back_so, in_splits)
    total = heap.comm.allreduce(int(received_so[0].sum()))
    if me == 0:
        print(f"moe_dispatch: {world} PEs, {experts} experts, {total} tokens routed to their "
              f"experts and back, every one as expected")
    shmemvm.finalize()


if __name__ == "__main__":
    main()
