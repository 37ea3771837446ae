"""Another allocator's memory made symmetric without a copy (import_external_tensor).

Where the backend can share memory it did not make (CUDA: torch's
expandable segments, whose pieces torch made exportable), each PE's tensor is
mapped into a block of the heap at the same offset on every PE, and its
pieces are shared with the node's PEs like memory the heap made. Each PE's
pieces are its own (where torch put them), so each PE maps its peers' pieces
one by one inside the block.
"""

from __future__ import annotations

import torch

from ..core.state import Core


def import_external_tensor(heap: Core, tensor: torch.Tensor) -> torch.Tensor:
    """Make another allocator's tensor symmetric without copying it
    (collective): its memory is mapped into the heap and shared with the
    PEs of the node like memory the heap made.

    Where the backend can share that memory: on cuda, memory torch
    allocated with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, when
    torch made its pieces exportable. Each PE passes its own tensor; its
    byte offset inside the backend's granularity (2 MiB on cuda) must be
    the same on every PE, which the same sequence of torch allocations
    gives.

    Args:
        tensor: a tensor on the heap's device, of the same shape, strides,
            storage offset, dtype and storage size on every PE.

    Returns:
        A tensor of tensor's shape, strides and dtype over the same physical
        memory (a write through either shows in the other), at the same heap
        offset on every PE: put/get/ptr()/heap_bases() reach it like any
        symmetric tensor. The heap holds `tensor` until the returned tensor
        and every view of it (ptr() views on other PEs too) are gone, so
        torch cannot reuse its memory while it is shared; free() releases it.

    Raises:
        UnsupportedError: the backend cannot share this memory (host memory,
            cudaMalloc memory, pieces made without POSIX fd export); the
            message says why and how to copy in instead
            (x = heap.empty(t.shape, t.dtype); x.copy_(t)). Every PE raises
            (SymmetryError on the PEs whose tensor could be imported).
        SymmetryError: the PEs passed different shapes/dtypes, or their
            tensors lie at different offsets inside the granularity.
        HeapExhaustedError: no free address range of the heap can hold it.
        TypeError: `tensor` is not a torch.Tensor.
        PeerTimeoutError: a PE did not join within the heap's timeout.
        ShmemError: the heap is finalized, or mapping/sharing failed on a PE
            (undone on every PE).
    """
    return heap.memory.import_external(tensor)
