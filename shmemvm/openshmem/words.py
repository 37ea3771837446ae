"""The words that atomics, waits, signals and locks act on, named once.

A word is one element of symmetric memory of a fixed size and kind: the
signed and unsigned integers of 8, 16, 32 and 64 bits, and the 32- and 64-bit
floats (OpenSHMEM's "extended" atomic types: fetch, set and swap only). Each
Word carries what every path of an atomic needs: its MPI datatype (the
window's accumulate operations), its array/struct code (the origin and result
buffers, and the bits a kernel moves), and its range (values are checked
against it before anything moves).

Atomics, waits, signals and locks are written once over words, not over a
face's dtypes: the torch face maps a torch dtype to its word (of_torch), the
NumPy face a NumPy dtype (shmem/atomics.py), and both then call the same
functions with the word and the bytes of the element (a uint8 tensor over
symmetric memory).
"""

from __future__ import annotations

import array
import operator
import struct

import torch
from mpi4py import MPI


class Word:
    """One kind of element: `size` bytes, `kind` "i" (signed integer), "u"
    (unsigned integer) or "f" (floating point), `code` its array/struct
    typecode, `mpi` its MPI datatype."""

    __slots__ = ("name", "size", "kind", "code", "mpi", "lo", "hi", "_bits_code")

    def __init__(self, name: str, size: int, kind: str, code: str, mpi: MPI.Datatype):
        assert array.array(code).itemsize == size, (name, code)
        self.name, self.size, self.kind, self.code, self.mpi = name, size, kind, code, mpi
        #: an integer word's range (None for floating point)
        self.lo: int | None
        self.hi: int | None
        if kind == "i":
            self.lo, self.hi = -(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1
        elif kind == "u":
            self.lo, self.hi = 0, (1 << (8 * size)) - 1
        else:
            self.lo = self.hi = None
        #: the signed integer code of the same size: how a kernel moves the bits
        self._bits_code = {1: "b", 2: "h", 4: "i", 8: "q"}[size]

    def __repr__(self) -> str:
        return f"<Word {self.name}>"

    @property
    def integer(self) -> bool:
        return self.kind != "f"

    def value(self, value, what: str, name: str = "value") -> int | float:
        """`value` as a Python number of this word, or TypeError (wrong kind) /
        ValueError (out of range). One-element tensors and NumPy scalars are taken."""
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not self.integer:
            if isinstance(value, bool) or not isinstance(value, (int, float)) and \
                    not hasattr(type(value), "__float__"):
                raise TypeError(f"{what}: {name} must be a real number, got "
                                f"{type(value).__name__} {value!r}")
            try:
                return float(value)   # (beyond float32's range: inf, as torch's cast)
            except OverflowError:     # an int beyond float64's: no float holds it
                raise ValueError(f"{what}: {name} ({_short(value)}) does not fit the target's "
                                 f"type {self.name}: it is beyond float64's range "
                                 f"(about 1.8e308)") from None
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{what}: {name} must be an integer, got {type(value).__name__} "
                            f"{value!r}")
        try:
            value = operator.index(value)
        except TypeError:   # e.g. a NumPy array of more than one element
            raise TypeError(f"{what}: {name} must be an integer, got {type(value).__name__} "
                            f"{value!r}") from None
        lo, hi = self.lo, self.hi
        if lo is None or hi is None or not lo <= value <= hi:
            raise ValueError(f"{what}: {name} {value} does not fit the target's type "
                             f"{self.name} ({self.lo}..{self.hi})")
        return value

    def buffer(self, values) -> array.array:
        """An origin or result buffer of these values (checked ones)."""
        return array.array(self.code, values)

    def unpack(self, data) -> list:
        """The values in `data` (bytes of whole words)."""
        return array.array(self.code, bytes(data)).tolist()

    def bits(self, value) -> int:
        """A checked value as the signed integer of its bits (what a kernel moves)."""
        return struct.unpack(self._bits_code, struct.pack(self.code, value))[0]

    def from_bits(self, bits: int) -> int | float:
        """The value whose bits() are `bits`."""
        return struct.unpack(self.code, struct.pack(self._bits_code, bits))[0]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:12]}...{text[-6:]}, {len(text)} digits"


INT8 = Word("int8", 1, "i", "b", MPI.INT8_T)
UINT8 = Word("uint8", 1, "u", "B", MPI.UINT8_T)
INT16 = Word("int16", 2, "i", "h", MPI.INT16_T)
UINT16 = Word("uint16", 2, "u", "H", MPI.UINT16_T)
INT32 = Word("int32", 4, "i", "i", MPI.INT32_T)
UINT32 = Word("uint32", 4, "u", "I", MPI.UINT32_T)
INT64 = Word("int64", 8, "i", "q", MPI.INT64_T)
UINT64 = Word("uint64", 8, "u", "Q", MPI.UINT64_T)
FLOAT32 = Word("float32", 4, "f", "f", MPI.FLOAT)
FLOAT64 = Word("float64", 8, "f", "d", MPI.DOUBLE)

#: every word, integers first
WORDS = (INT8, UINT8, INT16, UINT16, INT32, UINT32, INT64, UINT64, FLOAT32, FLOAT64)
#: the integer words (atomics' standard types, waits, signals)
INTEGERS = WORDS[:8]

#: for messages
INTEGER_TEXT = "an integer type (int8, int16, int32, int64, uint8, uint16, uint32, uint64)"
FLOAT_TEXT = "float32 and float64"

_BY_KIND = {(word.kind, word.size): word for word in WORDS}


def of(kind: str, size: int) -> Word | None:
    """The word of `kind` ("i", "u", "f") and `size` bytes, or None."""
    return _BY_KIND.get((kind, size))


#: the torch face's dtypes (those this torch has)
TORCH = {getattr(torch, word.name): word for word in WORDS if hasattr(torch, word.name)}


def of_torch(dtype: torch.dtype) -> Word | None:
    """The word of a torch dtype, or None (bool, float16, complex, ...)."""
    return TORCH.get(dtype)
