"""Argument checks, written once and used by every face (torch API, NumPy face,
routines): what an integer is, a PE number, a count, a shape, a timeout.

An integer is any object whose type has __index__ (int, NumPy integers, a
one-element integer tensor), but not bool: True as a PE number or a size is
always a mistake. Each check raises TypeError for the wrong kind of value and
ValueError for a value out of range, with a message naming the argument, what
was given and what is accepted.
"""

from __future__ import annotations

import math
import operator

import torch

from .backends import _dlpack
from .errors import plural


def integer(value, name: str) -> int:
    """`value` as an int, or TypeError naming `name`."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    try:
        return operator.index(value)
    except TypeError:  # e.g. a float tensor: its type has __index__, the value refuses it
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def count(value, name: str, minimum: int = 0) -> int:
    """An integer >= `minimum` (a number of elements, a stride, a size)."""
    number = integer(value, name)
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def pe(value, n_pes: int, name: str = "pe") -> int:
    """A PE number in 0..n_pes-1. Tensors are refused even when they hold one
    integer: a PE number is a host value, and reading a device tensor would
    synchronise the device."""
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    number = integer(value, name)
    if not 0 <= number < n_pes:
        raise ValueError(f"{name} {number} is out of range: there "
                         f"{'is' if n_pes == 1 else 'are'} {plural(n_pes, 'PE')} "
                         f"(0..{n_pes - 1})")
    return number


def nbytes(value, name: str = "nbytes") -> int:
    """A size in bytes, >= 0. Tensors are refused (as for pe())."""
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return count(value, name)


def shape(value) -> tuple[int, ...]:
    """A shape: an int or a sequence of ints >= 0."""
    if isinstance(value, torch.Size):
        return tuple(value)
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    out = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(type(d), "__index__"):
            raise TypeError(f"shape entries must be integers, got {type(d).__name__} {d!r}")
        d = operator.index(d)
        if d < 0:
            raise ValueError(f"shape entries must be >= 0, got {d} in {value!r}")
        out.append(d)
    return tuple(out)


def tensor_nbytes(value, dtype: torch.dtype) -> tuple[tuple[int, ...], int]:
    """(dims, bytes) of a symmetric tensor of shape `value` and `dtype`, or a
    clear error for a shape or a dtype symmetric memory cannot hold."""
    if type(dtype) is not torch.dtype or dtype not in _dlpack.SUPPORTED_DTYPES:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        _dlpack.check_dtype(dtype)
    # The common shapes, a plain int or a 1-tuple of one (malloc's), need no more checks
    kind = type(value)
    if kind is int:
        if value >= 0:
            return (value,), value * dtype.itemsize
    elif kind is tuple and len(value) == 1:
        first = value[0]
        if type(first) is int and first >= 0:
            return value, first * dtype.itemsize
    dims = shape(value)
    if len(dims) > _dlpack.MAX_NDIM:
        raise ValueError(f"at most {_dlpack.MAX_NDIM} dimensions are supported, got {len(dims)}")
    return dims, math.prod(dims) * dtype.itemsize


def elements_of(value, dtype: torch.dtype, name: str = "nbytes") -> int:
    """A size in bytes as a number of whole elements of `dtype` (realloc)."""
    size = integer(value, name)
    if size < 0 or size % dtype.itemsize:
        raise ValueError(f"{name} must be a non-negative multiple of the element size "
                         f"{dtype.itemsize} of {dtype}, got {size}")
    return size // dtype.itemsize


def flags(value, allowed: dict[str, int], name: str) -> int:
    """An OR of the named bits in `allowed` (or 0)."""
    number = integer(value, name)
    every = 0
    for bit in allowed.values():
        every |= bit
    if number < 0 or number & ~every:
        bits = [f"{key} ({bit})" for key, bit in allowed.items()]
        named = ", ".join(bits[:-1]) + " and " + bits[-1] if len(bits) > 1 else bits[0]
        raise ValueError(f"{name} must be 0 or an OR of {named}, got {number}")
    return number


def seconds(value, name: str = "timeout") -> float | None:
    """A wait's limit: None (no limit of its own) or a number of seconds >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and \
            not hasattr(type(value), "__float__"):
        raise TypeError(f"{name} must be a number of seconds or None, got "
                        f"{type(value).__name__} {value!r}")
    number = float(value)
    if not number >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0 or None, got {value!r}")
    return number


def signed64(word: int) -> int:
    """A 64-bit pattern (any int, taken modulo 2**64) as the int64 that holds
    it: how a uint64 value travels through int64 storage."""
    word &= (1 << 64) - 1
    return word - (1 << 64) if word >> 63 else word
