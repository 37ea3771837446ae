"""The host API's atomics on device heaps: one small Triton kernel per call
(the KERNEL atomic path of route.py).

Device memory is not handed to MPI (no GPU-aware MPI is assumed), so on a
device heap the atomics of openshmem/atomics.py reach the PEs of this node as
a kernel of one program, launched on the current stream, that applies a
system-scope atomic with acquire-release semantics to the target PE's copy,
addressed through the heap's table of bases (ptr - bases[me] + bases[pe], as
shmemvm.triton.translate does). A system-scope
atomic is atomic with respect to the device-side atomics of kernels on every
GPU of the node (shmemvm.triton's with scope="sys") and to other such calls,
and ordered after the work queued before it on the stream. The old value is
read back with .item(), which waits for the kernel: every call is complete
at the target when it returns, as the MPI path's calls are.

Only bit patterns move: the caller (openshmem/atomics.py) gives the element's
bytes and the operands as the signed integers of their bits, so the kernel
sees two integer types, int32 and int64 (Triton's atomics are 32- and 64-bit:
narrower words are refused there).

The same kernel runs in Triton's interpreter (TRITON_INTERPRET=1) over the
host heap, where the tests exercise it on every CI run.
"""

from __future__ import annotations

import torch

try:
    import triton  # type: ignore[import-untyped]
    import triton.language as tl  # type: ignore[import-untyped]
except ImportError as exc:  # atomics.py turns this into UnsupportedError
    raise ImportError("atomics on device heaps run as Triton kernels: pip install triton "
                      "(or pip install shmemvm[triton])") from exc

from ..errors import UnsupportedError


def _interpreted() -> bool:
    """Whether the kernels were made for Triton's interpreter (TRITON_INTERPRET=1
    when this module was imported), the only way they run on host memory."""
    return type(_atomic).__name__ == "InterpretedFunction"

#: operations of the kernel (tl.constexpr codes)
FETCH, ADD, XCHG, AND, OR, XOR, CAS = range(7)
OPERATIONS = {"fetch": FETCH, "add": ADD, "xchg": XCHG, "and": AND, "or": OR, "xor": XOR,
              "cas": CAS}

#: the integer dtype whose bits an element of each size is moved as
BITS = {4: torch.int32, 8: torch.int64}


@triton.jit
def _atomic(dest, args, out, me, pe, heap_bases, OP: tl.constexpr):
    # dest on PE `pe`: this PE's pointer moved by the difference of the bases
    from_base = tl.load(heap_bases + me)
    to_base = tl.load(heap_bases + pe)
    offset = tl.cast(dest, tl.uint64) - from_base      # bytes into the heap
    target = tl.cast(tl.cast(to_base, tl.pointer_type(tl.int8)) + offset, dest.dtype)
    value = tl.load(args)
    if OP == 0:    # FETCH: an add of 0 reads atomically
        old = tl.atomic_add(target, value * 0, sem="acq_rel", scope="sys")
    elif OP == 1:  # ADD
        old = tl.atomic_add(target, value, sem="acq_rel", scope="sys")
    elif OP == 2:  # XCHG
        old = tl.atomic_xchg(target, value, sem="acq_rel", scope="sys")
    elif OP == 3:  # AND
        old = tl.atomic_and(target, value, sem="acq_rel", scope="sys")
    elif OP == 4:  # OR
        old = tl.atomic_or(target, value, sem="acq_rel", scope="sys")
    elif OP == 5:  # XOR
        old = tl.atomic_xor(target, value, sem="acq_rel", scope="sys")
    else:          # CAS: args = (value, cond)
        cond = tl.load(args + 1)
        old = tl.atomic_cas(target, cond, value, sem="acq_rel", scope="sys")
    tl.store(out, old)


def apply(bases: torch.Tensor, me: int, where: torch.Tensor, pe: int, op: str, value: int = 0,
          cond: int = 0) -> int:
    """Apply `op` to the element whose bytes `where` views (a uint8 tensor of 4
    or 8 bytes of symmetric memory, checked and aligned) on PE `pe` (this PE or
    a peer on this node, already checked to be mapped; `bases`: the heap's table
    of bases, HeapCore.heap_bases, `me`: this PE), with `value` (and `cond` for
    "cas") as the signed integers of their bits. Complete at the target on return.

    Returns:
        The element's bits on PE `pe` before the operation, as a signed int.
    """
    if where.device.type == "cpu" and not _interpreted():
        raise UnsupportedError(
            "atomics as Triton kernels on host memory need Triton's interpreter: set "
            "TRITON_INTERPRET=1 before shmemvm is imported (or keep the memory MPI-reachable)")
    bits_dtype = BITS[where.numel()]
    target = where.view(bits_dtype)
    args = torch.tensor([value, cond], dtype=bits_dtype, device=where.device)
    out = torch.empty(1, dtype=bits_dtype, device=where.device)
    _atomic[(1,)](target, args, out, me, pe, bases, OP=OPERATIONS[op])
    return int(out.item())  # .item() waits for the kernel (the bits: an integer dtype)
