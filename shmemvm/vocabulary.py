"""The library's vocabularies, each named once, in one order (issue 29).

Every table of reduce operations, comparisons, atomic operations and word
kinds in the library is derived from these: the faces' combiners
(openshmem/collectives.py's torch functions, shmem/collectives.py's NumPy
ufuncs), the device collectives' op codes, the waits' comparisons and the
shmem4py face's CMP names, the atomics' MPI, kernel and native operations,
and the node collectives' element kinds. The compiled pieces number their own
(native/_native.c's WORDS and OPERATIONS, native/_collective.c's KINDS and
REDUCE_OPS, exported by each module) and native/__init__.py checks at import
that they are these, in this order. tests/unit/test_vocabulary.py checks
that every table is derived (the same names, in the same order).
"""

from __future__ import annotations

#: reduce's operations, in the order the compiled combine() numbers them
REDUCE_OPS = ("sum", "prod", "min", "max", "and", "or", "xor")

#: the comparisons of the waits (wait_until, test, signal_wait_until), in
#: OpenSHMEM's numbering (SHMEM_CMP_EQ = 0, SHMEM_CMP_NE = 1, ...)
COMPARISONS = ("eq", "ne", "gt", "le", "lt", "ge")
#: the same as Python writes them (both faces take either)
COMPARISON_SYMBOLS = {"==": "eq", "!=": "ne", ">": "gt", ">=": "ge", "<": "lt", "<=": "le"}

#: the atomic operations of the routines (apply()'s names)
ATOMIC_OPS = ("fetch", "set", "swap", "add", "and", "or", "xor", "cas")
#: the compiled piece's atomic operations, in its numbering (a swap is its set)
NATIVE_ATOMIC_OPS = ("fetch", "set", "add", "and", "or", "xor", "cas")

#: the word kinds the compiled pieces move and combine, in their numbering: the
#: array/struct typecode of their bits, and their dtype's name (NumPy's and torch's)
WORD_KINDS = (("b", "int8"), ("B", "uint8"), ("h", "int16"), ("H", "uint16"),
              ("i", "int32"), ("I", "uint32"), ("q", "int64"), ("Q", "uint64"),
              ("f", "float32"), ("d", "float64"))
#: their typecodes alone
WORD_CODES = tuple(code for code, _ in WORD_KINDS)


def numbering(names) -> dict[str, int]:
    """{name: its position}: a vocabulary as the compiled pieces number it."""
    return {name: i for i, name in enumerate(names)}
