"""shmem4py's constants: OpenSHMEM's values as enums (THREAD, CTX, MALLOC,
AMO, SIGNAL, OP, CMP) and their module-level names, and the version."""

from __future__ import annotations

import enum
import operator
import sys
from typing import Union

import numpy as np

from .. import vocabulary
from ..openshmem import info, waits

#: a value of shmem4py's calls
Number = Union[int, float, complex, np.number]

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # pragma: no cover
    class StrEnum(str, enum.Enum):
        """enum.StrEnum before Python 3.11."""
        __str__ = str.__str__


# -- version ---------------------------------------------------------------------------------
MAJOR_VERSION: int = info.SPEC_VERSION[0]
MINOR_VERSION: int = info.SPEC_VERSION[1]
VENDOR_STRING: str = info.info_get_name()


class THREAD(enum.IntEnum):
    """Thread support levels (OpenSHMEM's values, as shmemvm.THREAD_*)."""
    SINGLE = 0
    FUNNELED = 1
    SERIALIZED = 2
    MULTIPLE = 3


THREAD_SINGLE = THREAD.SINGLE
THREAD_FUNNELED = THREAD.FUNNELED
THREAD_SERIALIZED = THREAD.SERIALIZED
THREAD_MULTIPLE = THREAD.MULTIPLE


class CTX(enum.IntFlag):
    """Context options (OpenSHMEM's values, as shmemvm.CTX_*)."""
    SERIALIZED = 1
    PRIVATE = 2
    NOSTORE = 4


CTX_SERIALIZED = CTX.SERIALIZED
CTX_PRIVATE = CTX.PRIVATE
CTX_NOSTORE = CTX.NOSTORE


class MALLOC(enum.IntFlag):
    """Allocation hints (OpenSHMEM's values): accepted and recorded by the
    heap; they change nothing in how shmemvm places memory."""
    ATOMICS_REMOTE = 1
    SIGNAL_REMOTE = 2


MALLOC_ATOMICS_REMOTE = MALLOC.ATOMICS_REMOTE
MALLOC_SIGNAL_REMOTE = MALLOC.SIGNAL_REMOTE


class AMO(StrEnum):
    """Atomic operations of atomic_op / atomic_fetch_op / atomic_fetch_op_nbi."""
    SET = "set"
    INC = "inc"
    ADD = "add"
    AND = "and"
    OR = "or"
    XOR = "xor"


AMO_SET, AMO_INC, AMO_ADD = AMO.SET, AMO.INC, AMO.ADD
AMO_AND, AMO_OR, AMO_XOR = AMO.AND, AMO.OR, AMO.XOR


class SIGNAL(enum.IntEnum):
    """Signal update operations of put_signal (OpenSHMEM's values)."""
    SET = 0
    ADD = 1


SIGNAL_SET = SIGNAL.SET
SIGNAL_ADD = SIGNAL.ADD


class OP(StrEnum):
    """Reduction operations of reduce."""
    AND = "and"
    OR = "or"
    XOR = "xor"
    MAX = "max"
    MIN = "min"
    SUM = "sum"
    PROD = "prod"


OP_AND, OP_OR, OP_XOR, OP_MAX = OP.AND, OP.OR, OP.XOR, OP.MAX
OP_MIN, OP_SUM, OP_PROD = OP.MIN, OP.SUM, OP.PROD


class CMP(enum.IntEnum):
    """Comparisons of wait_until / test / signal_wait_until (OpenSHMEM's values)."""
    EQ = 0
    NE = 1
    GT = 2
    LE = 3
    LT = 4
    GE = 5


CMP_EQ, CMP_NE, CMP_GT, CMP_LE, CMP_LT, CMP_GE = CMP.EQ, CMP.NE, CMP.GT, CMP.LE, CMP.LT, CMP.GE

_CMP_NAMES = {CMP(code): name for code, name in enumerate(vocabulary.COMPARISONS)}
_CMP_SYMBOLS = waits.SYMBOLS


def cmp_name(cmp) -> str:
    """A CMP value, "==" and the like, or "eq" and the like, as shmemvm's name."""
    if isinstance(cmp, str):
        name = _CMP_SYMBOLS.get(cmp, cmp.lower())
        if name in _CMP_NAMES.values():
            return name
    elif not isinstance(cmp, bool) and hasattr(type(cmp), "__index__"):
        value = operator.index(cmp)
        if value in CMP._value2member_map_:
            return _CMP_NAMES[CMP(value)]
    raise ValueError(f"cmp must be a CMP value (CMP_EQ, ...), one of "
                     f"{', '.join(_CMP_SYMBOLS)} or a name like 'eq', got {cmp!r}")


def amo_name(op) -> str:
    """An AMO value (or its name) as a string, or ValueError."""
    name = str(op).lower()
    if name not in AMO._value2member_map_:
        raise ValueError(f"op must be an AMO value ({', '.join(AMO._value2member_map_)}), "
                         f"got {op!r}")
    return name


def op_name(op) -> str:
    """An OP value (or its name) as a string (reduce checks it)."""
    return str(op).lower()


def sigop_name(sigop) -> str:
    """SIGNAL_SET or SIGNAL_ADD as "set" or "add", or ValueError."""
    if isinstance(sigop, bool) or not hasattr(type(sigop), "__index__") or \
            operator.index(sigop) not in tuple(SIGNAL):
        raise ValueError(f"sigop must be SIGNAL_SET or SIGNAL_ADD, got {sigop!r}")
    return "set" if operator.index(sigop) == SIGNAL.SET else "add"
