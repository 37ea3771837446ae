"""Collectives of the NumPy face: barrier_all, sync_all, sync, broadcast,
collect, fcollect, alltoall(s) and reduce with its <op>_reduce names.

Each is openshmem/collectives.py's *_bytes function, the one implementation
both faces share, given the arrays' bytes over their blocks (Operands,
arrays.py) by a function that also checks the arguments: it runs inside the
call's agreement, so that a bad argument on one PE raises at that call on
every PE. reduce combines with NumPy ufuncs (combiner), so every dtype NumPy
reduces works, long double and complex long double included; the result is
the same, bit for bit, on every PE (each element combined in team PE order
by one PE).

A call whose data went in its agreed step leaves a Plan (transport/
nodecoll.py), which the heap keeps under a key of exactly what the call's
checks looked at (_call_key, collectives.plan_key: the team, where each array
lies on the heap, its shape, strides, dtype, writability, and root, size, op)
while every block stays live (Core.where.recall): the same call again is then
that one agreed step, without checking its arrays a second time (issue 30;
collectives.replayed and keep, both faces' one mechanism). Anything else takes
the general path, whose checks and errors are the ones above.
"""

from __future__ import annotations

import functools

from typing import Optional

import numpy as np
import torch

from .. import _args, api, native
from ..core import trace
from ..vocabulary import REDUCE_OPS
from ..openshmem import barrier, collectives
from ..openshmem.collectives import Operand
from . import arrays
from .constants import OP, OP_SUM, op_name
from .handles import Team, of_collective, size_of


def barrier_all() -> None:
    """Complete this PE's puts, then wait for every PE (shmem_barrier_all).

    Returns:
        None.

    Raises:
        SymmetryError, PeerTimeoutError: as shmemvm.barrier_all.
    """
    quick = api.quick_steps[barrier.BARRIER_ALL]   # (the routine's own first try)
    if quick is None or trace.FLAG._is_profiler_enabled or quick() is None:
        barrier.barrier_all(api.default_core())


def sync_all() -> None:
    """Wait for every PE (shmem_sync_all).

    Returns:
        None.

    Raises:
        SymmetryError, PeerTimeoutError: as shmemvm.sync_all.
    """
    quick = api.quick_steps[barrier.SYNC_ALL]
    if quick is None or trace.FLAG._is_profiler_enabled or quick() is None:
        barrier.sync_all(api.default_core())


def sync(team: Optional[Team] = None) -> None:
    """Wait for every PE of `team` (shmem_team_sync; None: all PEs).

    Args:
        team: a Team or None.

    Returns:
        None.

    Raises:
        SymmetryError, PeerTimeoutError: as shmemvm.sync_all.
    """
    handle = of_collective(team)
    if handle is None:
        arrays.heap().sync_all()
    else:
        handle.sync()


def _operand(a: np.ndarray, role: str, count: int | None = None) -> Operand:
    """The Operand of symmetric array `a` (its first `count` elements), which
    _checked() passed: its heap offset with it, so that the routine does not
    look its block up again."""
    data, offset = arrays.symmetric_span(a, role, count)
    return Operand.of(data, a.itemsize, a.dtype, offset)


def _call_key(h, kind: str, team, target, source, *values) -> tuple | None:
    """collectives.plan_key() of a call on symmetric arrays target and source
    of the heap whose core is `h`: where each lies on the heap, its shape,
    strides and dtype, whether target is writable (whether their blocks are
    live: the memo itself). None where there can be no key: another type, an
    array that is not on the heap (the general path says what is wrong).
    Built in one native call where the heap has one (Where.call_key: the
    same key, tests/unit/shmem/test_shmem_call_key.py), in Python where it
    has not or that call steps aside."""
    if type(target) is not np.ndarray or type(source) is not np.ndarray:
        return None
    group = None if team is None else of_collective(team)   # (raises for a bad team, as
    make = h.where.call_key                                  # the general path first does)
    if make is not None and NATIVE_KEY:
        key = make(kind, None if group is None else id(group), values, target, source,
                   np.ndarray, arrays.HeapMemory)
        if key is not None:
            return key
    return python_key(kind, group, target, source, *values)


def python_key(kind: str, group, target: np.ndarray, source: np.ndarray,
               *values) -> tuple | None:
    """_call_key's key, in Python, over the team `group` (of_collective's)."""
    t, s = arrays.heap_address(target), arrays.heap_address(source)
    if t is None or s is None:
        return None
    return collectives.plan_key(kind, None if group is None else id(group), values, t,
                                target.shape, target.strides, target.dtype,
                                target.flags.writeable, s, source.shape, source.strides,
                                source.dtype)


def _native_key_agrees() -> bool:
    """Whether native.call_key reads NumPy arrays as NumPy itself does (it reads
    the fields of NumPy's array struct): the same key as python_key on probe
    arrays of several layouts, and no key where python_key has none."""
    make = native.call_key
    if make is None:
        return False
    whole = arrays.over(torch.zeros(256, dtype=torch.uint8))   # (as the face makes arrays)
    probes = [whole, whole[8:40].view(np.float64), whole[3:19], whole[40:0:-1],
              whole.view(np.int32).reshape(8, 8)[1:5, ::3], whole[:0],
              whole.view(np.int16)[5:6].reshape(()), whole[::-2], np.zeros(4), whole[:8].copy()]
    probes[2].flags.writeable = False
    try:
        return all(make("k", None, values, target, source, np.ndarray, arrays.HeapMemory)
                   == python_key("k", None, target, source, *values)
                   for target in probes for source in (whole, probes[3])
                   for values in ((0, None), ("sum", 3)))
    except TypeError:    # (not NumPy's array type as it knows it)
        return False


#: whether _call_key may use native.call_key (probed once, at import)
NATIVE_KEY = _native_key_agrees()


def _checked(target, source) -> None:
    """target (written) and source (read) are contiguous arrays of one dtype."""
    arrays.same_dtype(arrays.check_array(target, "target", True),
                      arrays.check_array(source, "source", False))


def broadcast(target: np.ndarray, source: np.ndarray, root: int, size: Optional[int] = None,
              team: Optional[Team] = None) -> None:
    """target on every PE of `team` = source of PE `root` (shmem_broadcast).

    Args:
        target, source: contiguous symmetric arrays of one dtype.
        root: the PE (team-relative) whose source is copied.
        size: elements (default: the smaller array's size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        TypeError, ValueError: bad arrays or sizes.
        SymmetryError: the PEs made different calls.
    """
    h = arrays.core()
    key = _call_key(h, "broadcast", team, target, source, root, size)
    if collectives.replayed(h, key):
        return

    def operands():
        _checked(target, source)
        n = arrays.count(size, target.size, source.size)
        return _operand(target, "target", n), _operand(source, "source", n)

    collectives.keep(h, key, collectives.broadcast_bytes(h, operands, root,
                                                         team=of_collective(team)))


def collect(target: np.ndarray, source: np.ndarray, size: Optional[int] = None,
            team: Optional[Team] = None) -> None:
    """Concatenate every PE's source, whose size may differ by PE, into target
    on every PE (shmem_collect; MPI_Allgatherv).

    Args:
        target: a symmetric array large enough for all of them.
        source: a symmetric array.
        size: this PE's number of elements (default: source's size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        As broadcast.
    """
    h = arrays.core()
    key = _call_key(h, "collect", team, target, source, size)
    if collectives.replayed(h, key):
        return

    def operands():
        _checked(target, source)
        n = arrays.count(size, source.size)
        return _operand(target, "target"), _operand(source, "source", n)

    collectives.keep(h, key, collectives.collect_bytes(h, operands, team=of_collective(team)))


def fcollect(target: np.ndarray, source: np.ndarray, size: Optional[int] = None,
             team: Optional[Team] = None) -> None:
    """Concatenate every PE's `size` elements of source into target on every PE
    (shmem_fcollect; MPI_Allgather).

    Args:
        target: a symmetric array of at least size * team size elements.
        source: a symmetric array.
        size: elements per PE, the same on every PE (default: source's size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        As broadcast.
    """
    h = arrays.core()
    key = _call_key(h, "fcollect", team, target, source, size)
    if collectives.replayed(h, key):
        return
    npes = size_of(team)

    def operands():
        _checked(target, source)
        n = arrays.count(size, source.size, target.size // npes)
        return (_operand(target, "target", n * npes),
                _operand(source, "source", n))

    collectives.keep(h, key, collectives.fcollect_bytes(h, operands, team=of_collective(team)))


def alltoall(target: np.ndarray, source: np.ndarray, size: Optional[int] = None,
             team: Optional[Team] = None) -> None:
    """Block j of source on PE i goes to block i of target on PE j
    (shmem_alltoall); a block is `size` elements.

    Args:
        target, source: symmetric arrays of at least size * team size elements.
        size: the block (default: the smaller array's size / team size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        As broadcast.
    """
    h = arrays.core()
    key = _call_key(h, "alltoall", team, target, source, size)
    if collectives.replayed(h, key):
        return
    npes = size_of(team)

    def operands():
        _checked(target, source)
        n = arrays.count(size, target.size // npes, source.size // npes)
        return (_operand(target, "target", n * npes),
                _operand(source, "source", n * npes))

    collectives.keep(h, key, collectives.alltoall_bytes(h, operands, team=of_collective(team)))


def alltoalls(target: np.ndarray, source: np.ndarray, tst: int = 1, sst: int = 1,
              size: Optional[int] = None, team: Optional[Team] = None) -> None:
    """alltoall with element strides (shmem_alltoalls).

    Args:
        target, source: symmetric arrays.
        tst, sst: strides in elements (>= 1).
        size: elements per PE (default: as many as the strides allow).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        As broadcast.
    """
    npes = size_of(team)

    def operands():
        _checked(target, source)
        return _operand(target, "target"), _operand(source, "source")

    def nelems(dest: Operand, src: Operand) -> int:
        ds, ss = _args.count(tst, "alltoalls: tst", 1), _args.count(sst, "alltoalls: sst", 1)
        return arrays.count(size, arrays.ceildiv(dest.count, ds) // npes,
                            arrays.ceildiv(src.count, ss) // npes)

    collectives.alltoalls_bytes(arrays.core(), operands, tst, sst, nelems,
                                team=of_collective(team))


#: reduce's operations as NumPy ufuncs
UFUNCS = dict(zip(REDUCE_OPS, (np.add, np.multiply, np.minimum, np.maximum,
                               np.bitwise_and, np.bitwise_or, np.bitwise_xor), strict=True))


@functools.lru_cache(maxsize=256)
def combiner(op: str, dtype: np.dtype):
    """The NumPy face's combiner of `dtype` for reduce's `op`: the op's ufunc
    over the bytes of two chunks viewed as `dtype` (acc <- acc op other), or
    TypeError where NumPy has no such loop (bitwise ops on floats ...). Made
    once per op and dtype (a reduce of 8 bytes is a few microseconds)."""
    ufunc = UFUNCS[op]
    try:
        probe = np.ones(2, dtype)
        ufunc(probe, probe, out=probe)
    except TypeError as exc:
        raise TypeError(f"reduce: op {op!r} does not apply to dtype {dtype} ({exc}); use "
                        f"another op or reduce a copy in another dtype") from None

    def combine(acc: torch.Tensor, other: torch.Tensor) -> None:
        mine = acc.numpy().view(dtype)
        ufunc(mine, other.numpy().view(dtype), out=mine)

    return combine


def reduce(target: np.ndarray, source: np.ndarray, op: OP = OP_SUM, size: Optional[int] = None,
           team: Optional[Team] = None) -> None:
    """target on every PE of `team` = source of each PE combined elementwise by `op`
    (shmem_<op>_reduce).

    Args:
        target, source: symmetric arrays of one dtype (they may be the same).
        op: an OP value ("sum", "prod", "min", "max", "and", "or", "xor").
        size: elements (default: the smaller array's size).
        team: a Team, or None for all PEs.

    Returns:
        None.

    Raises:
        ValueError: an unknown op; otherwise as broadcast.
    """
    h = arrays.core()
    key = _call_key(h, "reduce", team, target, source, op, size)
    if collectives.replayed(h, key):
        return

    def operands():
        _checked(target, source)
        n = arrays.count(size, target.size, source.size)
        return _operand(target, "target", n), _operand(source, "source", n)

    collectives.keep(h, key, collectives.reduce_bytes(
        h, operands, op_name(op), lambda source: combiner(op_name(op), source.dtype),
        team=of_collective(team)))


def _reducer(op: OP):
    def reducer(target: np.ndarray, source: np.ndarray, size: Optional[int] = None,
                team: Optional[Team] = None) -> None:
        reduce(target, source, op, size, team)

    reducer.__name__ = reducer.__qualname__ = f"{op.value}_reduce"
    reducer.__doc__ = f"""reduce with op {op.name} (shmem_{op.value}_reduce).

    Args:
        target, source, size, team: as reduce.

    Returns:
        None.

    Raises:
        As reduce.
    """
    return reducer


and_reduce = _reducer(OP.AND)
or_reduce = _reducer(OP.OR)
xor_reduce = _reducer(OP.XOR)
max_reduce = _reducer(OP.MAX)
min_reduce = _reducer(OP.MIN)
sum_reduce = _reducer(OP.SUM)
prod_reduce = _reducer(OP.PROD)
