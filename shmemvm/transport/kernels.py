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

Only bit patterns move: uint64 targets are handled as int64 and float32 and
float64 ones (fetch, set, swap only) as int32/int64 of the same bits, so the
kernel sees two integer types.

The same kernel runs in Triton's interpreter (TRITON_INTERPRET=1) over the
host heap, where the tests exercise it on every CI run.
"""

from __future__ import annotations

import struct

import torch

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # atomics.py turns this into UnsupportedError
    raise ImportError("atomics on device heaps run as Triton kernels: pip install triton "
                      "(or pip install shmemvm[triton])") from exc

from .._args import signed64
from ..errors import UnsupportedError


def _interpreted() -> bool:
    """Whether the kernels were made for Triton's interpreter (TRITON_INTERPRET=1
    when this module was imported), the only way they run on host memory."""
    return type(_atomic).__name__ == "InterpretedFunction"

#: operations of the kernel (tl.constexpr codes)
FETCH, ADD, XCHG, AND, OR, XOR, CAS = range(7)
OPERATIONS = {"fetch": FETCH, "add": ADD, "xchg": XCHG, "and": AND, "or": OR, "xor": XOR,
              "cas": CAS}

#: the integer dtype whose bits a target's dtype is moved as, and struct codes
_BITS = {
    torch.int32: (torch.int32, None),
    torch.int64: (torch.int64, None),
    torch.uint64: (torch.int64, None),
    torch.float32: (torch.int32, ("f", "i")),
    torch.float64: (torch.int64, ("d", "q")),
}


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


def _to_bits(value, dtype: torch.dtype) -> int:
    """`value` (already checked to fit `dtype`) as the integer of its bits."""
    if dtype == torch.uint64:
        return signed64(value)
    codes = _BITS[dtype][1]
    if codes is None:
        return value
    return struct.unpack(codes[1], struct.pack(codes[0], value))[0]


def _from_bits(bits: int, dtype: torch.dtype):
    if dtype == torch.uint64:
        return bits & ((1 << 64) - 1)
    codes = _BITS[dtype][1]
    if codes is None:
        return bits
    return struct.unpack(codes[0], struct.pack(codes[1], bits))[0]


def apply(bases: torch.Tensor, me: int, dest: torch.Tensor, pe: int, op: str, value=0, cond=0):
    """Apply `op` to `dest` (a checked one-element view of a symmetric tensor of
    an atomic dtype) on PE `pe` (this PE or a peer on this node, already
    checked to be mapped; `bases`: the heap's table of bases, HeapCore.heap_bases,
    `me`: this PE), with `value` (and `cond` for "cas") already checked to fit
    dest's dtype. Complete at the target on return.

    Returns:
        dest's value on PE `pe` before the operation, as a Python int (float
        for float targets).
    """
    if dest.device.type == "cpu" and not _interpreted():
        raise UnsupportedError(
            "atomics as Triton kernels on host memory need Triton's interpreter: set "
            "TRITON_INTERPRET=1 before shmemvm is imported (or keep the memory MPI-reachable)")
    bits_dtype = _BITS[dest.dtype][0]
    target = dest.reshape(1).view(bits_dtype)
    args = torch.tensor([_to_bits(value, dest.dtype), _to_bits(cond, dest.dtype)],
                        dtype=bits_dtype, device=dest.device)
    out = torch.empty(1, dtype=bits_dtype, device=dest.device)
    _atomic[(1,)](target, args, out, me, pe, bases, OP=OPERATIONS[op])
    return _from_bits(out.item(), dest.dtype)  # .item() waits for the kernel
