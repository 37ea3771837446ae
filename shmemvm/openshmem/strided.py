"""Strided put/get with OpenSHMEM's element strides (shmem_iput, shmem_iget).

Both are torch views (``dest[::dst][:nelems]``) handed to put/get (rma.py),
which already write strided symmetric tensors in place, on the node (a copy
into the peer mapping) and off it (an MPI derived datatype). They take a
context first (the heap, or a Ctx), as put/get do. strided_bytes() is the
same over the bytes of any element type (the NumPy face's long double too):
each element a row of `itemsize` bytes.
"""

from __future__ import annotations

import torch

from .. import _args
from ..core.state import Context
from . import rma

#: the largest stride: OpenSHMEM's strides are ptrdiff_t
_MAX_STRIDE = (1 << 63) - 1


def _strided(tensor, stride, nelems: int, what: str, role: str, name: str,
             itemsize: int | None = None) -> torch.Tensor:
    """tensor[::stride][:nelems] (with `itemsize`: of the rows of a uint8 tensor,
    an element a row), or a clear error."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: {role} must be a torch.Tensor, got {type(tensor).__name__}")
    if itemsize is not None and tensor.dim() == 1:
        tensor = tensor.view(-1, itemsize)
    elif tensor.dim() != 1:
        raise ValueError(f"{what}: {role} must be 1-D (strides count its elements), got shape "
                         f"{tuple(tensor.shape)}; pass a flattened view such as t.view(-1)")
    stride = _args.integer(stride, f"{what}: {name}")
    if stride < 1:
        raise ValueError(f"{what}: {name} must be >= 1 (in elements; 1 is contiguous), got "
                         f"{stride}")
    if stride > _MAX_STRIDE:
        raise ValueError(f"{what}: {name} must be at most 2**63 - 1 (OpenSHMEM's ptrdiff_t), "
                         f"got {stride}")
    if nelems and (nelems - 1) * stride + 1 > len(tensor):
        raise ValueError(f"{what}: {nelems} elements at stride {stride} reach element "
                         f"{(nelems - 1) * stride} of {role}, which has {len(tensor)}")
    # One element (or none) is the first whatever the stride, which torch's slicing
    # does not take beyond 2**63 - 2 (it overflows to an empty view)
    return tensor[:nelems] if nelems <= 1 else tensor[::stride][:nelems]


def _count(nelems, what: str) -> int:
    return _args.count(nelems, f"{what}: nelems")


def iput(ctx: Context, dest: torch.Tensor, source: torch.Tensor, dst: int, sst: int, nelems: int,
         pe: int) -> None:
    """Copy `nelems` elements of `source`, every `sst`-th, into every `dst`-th
    element of symmetric `dest` on PE `pe` (shmem_iput):
    ``dest[i*dst] = source[i*sst]`` for i < nelems.

    Args:
        dest: a 1-D symmetric tensor of this heap (or a 1-D view of one).
        source: a 1-D tensor (any memory) of dest's dtype.
        dst: stride between elements written in dest, in elements (>= 1).
        sst: stride between elements read from source, in elements (>= 1).
        nelems: the number of elements to copy (>= 0).
        pe: the PE to write to.

    Returns:
        None, as put() returns (off the node: complete at PE `pe`).

    Raises:
        TypeError: a tensor is not a torch.Tensor, a stride, nelems or pe is
            not an int, or the dtypes differ.
        ValueError: a tensor is not 1-D, a stride is < 1 or above 2**63 - 1,
            nelems < 0, the strided elements run past the end of a tensor, or
            pe is out of range (also when nelems is 0).
        NotSymmetricError (FreedTensorError), UnsupportedError, PeerTimeoutError:
            as put().
    """
    nelems = _count(nelems, "iput")
    target = _strided(dest, dst, nelems, "iput", "dest", "dst")
    data = _strided(source, sst, nelems, "iput", "source", "sst")
    if nelems:
        rma.put(ctx, target, data, pe)
    else:
        ctx.world_pe(pe)   # nothing to copy, but pe is still checked (TypeError, ValueError)


def iget(ctx: Context, dest: torch.Tensor, source: torch.Tensor, dst: int, sst: int, nelems: int,
         pe: int) -> None:
    """Copy `nelems` elements of symmetric `source` on PE `pe`, every `sst`-th,
    into every `dst`-th element of `dest` (shmem_iget):
    ``dest[i*dst] = source[i*sst]`` for i < nelems.

    Args:
        dest: a 1-D tensor (any memory) of source's dtype.
        source: a 1-D symmetric tensor of this heap (or a 1-D view of one).
        dst: stride between elements written in dest, in elements (>= 1).
        sst: stride between elements read from source, in elements (>= 1).
        nelems: the number of elements to copy (>= 0).
        pe: the PE to read from.

    Returns:
        None, once the data is in `dest`.

    Raises:
        TypeError: a tensor is not a torch.Tensor, a stride, nelems or pe is
            not an int, or the dtypes differ.
        ValueError: a tensor is not 1-D, a stride is < 1 or above 2**63 - 1,
            nelems < 0, the strided elements run past the end of a tensor, or
            pe is out of range (also when nelems is 0).
        NotSymmetricError (FreedTensorError), UnsupportedError, PeerTimeoutError:
            as get().
    """
    nelems = _count(nelems, "iget")
    target = _strided(dest, dst, nelems, "iget", "dest", "dst")
    data = _strided(source, sst, nelems, "iget", "source", "sst")
    if nelems:
        rma.get(ctx, target, data, pe)
    else:
        ctx.world_pe(pe)   # nothing to copy, but pe is still checked (TypeError, ValueError)


def strided_bytes(ctx: Context, dest: torch.Tensor, source: torch.Tensor, itemsize: int,
                  dst: int, sst: int, nelems: int, pe: int, *, writing: bool,
                  names: tuple[str, str] = ("dst", "sst")) -> None:
    """iput (`writing`) or iget over the bytes of `dest` and `source` (1-D uint8
    tensors of whole elements of `itemsize` bytes): the NumPy face's, for every
    element type. `names`: what the caller calls the two strides, for errors."""
    what = "iput" if writing else "iget"
    nelems = _count(nelems, what)
    target = _strided(dest, dst, nelems, what, "dest", names[0], itemsize)
    data = _strided(source, sst, nelems, what, "source", names[1], itemsize)
    if nelems:
        (rma.put if writing else rma.get)(ctx, target, data, pe)
    else:
        ctx.world_pe(pe)   # nothing to copy, but pe is still checked (TypeError, ValueError)
