"""Atomics on symmetric memory: fetch, set, add, inc, swap, compare-and-swap
and the bitwise ones, blocking and non-blocking (_nbi).

One path per heap (transport/route.py, AtomicPath), so that every atomic on a
word is atomic with respect to every other, from every PE:

- host heaps: every atomic goes through the heap's MPI dynamic window
  (transport/offnode.py), to PEs on this node as well as to PEs on other
  nodes: MPI_Fetch_and_op, MPI_Compare_and_swap and MPI_Accumulate are atomic
  only with respect to each other. Each call is blocking and complete at the
  target when it returns.
- device heaps (memory MPI is not given): atomics on PEs of this node run as
  one-program Triton kernels with system-scope atomics on the current stream
  (device/atomics.py), so they are atomic with respect to kernels' atomics of
  system scope; PEs on other nodes cannot be reached. Requires Triton.

No wait without a deadline: a target PE that died, is stopped or stays out of
MPI would make MPI_Win_flush wait for ever, so every atomic is issued in a
request-based form and its request is polled against the heap's deadline
(SHMEMVM_TIMEOUT, OffNodeWindow.complete), after which the heap is unusable
and PeerTimeoutError names the PE and the operation:

- every atomic but compare-and-swap is an MPI_Rget_accumulate (the
  non-fetching ones, atomic_set/add/inc/and/or/xor and put_signal's signal,
  throw the fetched value away): its request completes only once the target
  has answered, so waiting for it with the deadline finds a dead or stopped
  target. MPI_Raccumulate would not do: its request may complete as soon as
  the origin buffer can be reused, before the target has seen anything.
  Then MPI_Win_flush completes the operation at the target; the target has
  just answered, so it returns promptly (OffNodeWindow.finish). The flush is
  not optional: MPICH was seen to complete the request before the target had
  applied the update, as the MPI standard allows;
- compare-and-swap has no request-based form in MPI; see
  atomic_compare_swap.

Each function takes a context first (the heap itself, its default context,
or a Ctx: contexts.py), which maps `pe` (team-relative on a team's context)
and whose quiet() completes the non-blocking forms. The target of an atomic
is a one-element view of a symmetric tensor of dtype int32, int64 or uint64
(`counter[3]` or `counter[3:4]`); atomic_fetch/set/swap take float32 and
float64 too.
"""

from __future__ import annotations

import array
import operator

import torch
from mpi4py import MPI

from .. import _args, _docs
from ..core.state import Context, HeapCore
from ..errors import UnsupportedError
from ..transport.completion import CompletionTracker

#: dtypes atomics work on: torch dtype -> (MPI datatype, array typecode)
ATOMIC_DTYPES = {
    torch.int32: (MPI.INT32_T, "i"),
    torch.int64: (MPI.INT64_T, "q"),
    torch.uint64: (MPI.UINT64_T, "Q"),
}
#: dtypes that atomic_fetch, atomic_set and atomic_swap (and their nbi forms)
#: also take, as OpenSHMEM 1.5's "extended AMO types" allow; every other atomic
#: is for the integer dtypes above only
FLOAT_ATOMIC_DTYPES = {
    torch.float32: (MPI.FLOAT, "f"),
    torch.float64: (MPI.DOUBLE, "d"),
}
for _dtype, (_, _code) in {**ATOMIC_DTYPES, **FLOAT_ATOMIC_DTYPES}.items():
    assert array.array(_code).itemsize == _dtype.itemsize, (_dtype, _code)

#: the operations that take float32/float64 targets, for error messages
FLOAT_OPERATIONS = ("atomic_fetch", "atomic_set", "atomic_swap", "atomic_fetch_nbi",
                    "atomic_swap_nbi")


# -- checks -------------------------------------------------------------------
def _dtypes(floats: bool) -> dict:
    return {**ATOMIC_DTYPES, **FLOAT_ATOMIC_DTYPES} if floats else ATOMIC_DTYPES


def _check_dtype(tensor, what: str, role: str, floats: bool = False) -> None:
    """TypeError unless `tensor` is a tensor of a dtype the operation takes."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: the {role} must be a symmetric tensor, got "
                        f"{type(tensor).__name__}")
    if tensor.dtype in _dtypes(floats):
        return
    also = "" if floats else (f"; float32 and float64 only with "
                              f"{', '.join(FLOAT_OPERATIONS)}")
    kinds = "int32, int64, uint64, float32 and float64" if floats else "int32, int64 and uint64"
    raise TypeError(f"{what}: this operation works on {kinds} symmetric tensors{also}; the "
                    f"{role} has dtype {tensor.dtype}. Allocate the variable with one of "
                    f"those dtypes (e.g. heap.zeros(n, torch.int64))")


def check_target(heap: HeapCore, dest, pe, what: str, floats: bool = False) -> int:
    """`pe` as an int after checking `pe` and `dest` (type, dtype, one element),
    or a clear error. `floats`: the operation also takes float32/float64
    (FLOAT_OPERATIONS)."""
    pe = heap.check_pe(pe)
    if not isinstance(dest, torch.Tensor):
        raise TypeError(f"{what}: the target must be a one-element view of a symmetric "
                        f"tensor, got {type(dest).__name__}")
    _check_dtype(dest, what, "target", floats)
    if dest.numel() != 1:
        raise ValueError(f"{what}: the target must be one element (a view like counter[3] "
                         f"or counter[3:4]), got shape {tuple(dest.shape)} with "
                         f"{dest.numel()} elements; index the element to update")
    return pe


def _target(heap: HeapCore, dest, pe, what: str, floats: bool = False):
    """(pe, displacement in pe's window, MPI datatype, typecode, OffNodeWindow) for
    an atomic on `dest`, or a clear error. `floats`: the operation also takes
    float32/float64 (FLOAT_OPERATIONS)."""
    pe = check_target(heap, dest, pe, what, floats)
    displacement, window = locate(heap, dest, pe, what, "target")
    mpi_type, code = _dtypes(True)[dest.dtype]
    return pe, displacement, mpi_type, code, window


def locate(heap: HeapCore, tensor, pe: int, what: str, role: str):
    """(displacement of `tensor` in PE `pe`'s window, OffNodeWindow), after checking
    that `tensor` is symmetric, aligned and in memory MPI reaches."""
    heap.symmetric(tensor, f"{role} of {what} (a view of a tensor from this heap's "
                            f"malloc/empty/zeros)")
    check_aligned(tensor, what, role)
    if not heap.backend.mpi_accessible:
        raise UnsupportedError(
            f"{what}: this heap holds {heap.backend.name} backend memory on {heap.device}, "
            f"which shmemvm does not hand to MPI (no GPU-aware MPI is assumed), so PE {pe} "
            f"on another node cannot be reached by atomics; PEs on this node can (Triton "
            f"kernels), and a host-backend heap (backend='host') reaches every PE")
    window = heap.window_for(what)
    return window.displacement(tensor, pe), window


def check_aligned(tensor, what: str, role: str) -> None:
    if tensor.data_ptr() % tensor.element_size():
        raise ValueError(f"{what}: the {role} at {tensor.data_ptr():#x} is not aligned to "
                         f"its {tensor.element_size()}-byte element size; use an element of "
                         f"a tensor allocated with dtype {tensor.dtype}")


# -- device heaps: atomics on this node's PEs as Triton kernels (device_atomics.py) --------
#: MPI operation -> device_atomics operation
_DEVICE_OPS = {op.py2f(): name for op, name in (
    (MPI.NO_OP, "fetch"), (MPI.SUM, "add"), (MPI.REPLACE, "xchg"), (MPI.BAND, "and"),
    (MPI.BOR, "or"), (MPI.BXOR, "xor"))}   # keyed by handle: MPI.Op is not hashable


def by_kernel(heap: HeapCore, pe: int) -> bool:
    """Whether an atomic on PE `pe` runs as a kernel (transport/route.py): a
    device heap, and `pe` is this PE or a peer mapped here."""
    return heap.routes.atomic_by_kernel(pe)


def _device(heap: HeapCore, dest, pe: int, op: str, what: str, value=0, cond=0):
    """Run `op` on dest on PE `pe` as a kernel (transport/kernels.py), after the
    checks the MPI path makes; dest's old value."""
    block = heap.symmetric(dest, f"target of {what} (a view of a tensor from this heap's "
                                  f"malloc/empty/zeros)")
    check_aligned(dest, what, "target")
    if pe != heap.my_pe:
        heap.peers.check(pe, block.segment)
    try:   # Triton is optional: imported where a device heap's atomic needs it
        from ..transport import kernels
    except ImportError as exc:
        raise UnsupportedError(f"{what}: on a {heap.backend.name} heap atomics run as Triton "
                               f"kernels, and Triton is not installed: pip install triton") from exc
    return kernels.apply(heap.heap_bases(), heap.my_pe, dest, pe, op, value, cond)


def value_for(value, dtype: torch.dtype, what: str, name: str = "value") -> int | float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if dtype.is_floating_point:
        if isinstance(value, bool) or not isinstance(value, (int, float)) and \
                not hasattr(value, "__float__"):
            raise TypeError(f"{what}: {name} must be a real number, got "
                            f"{type(value).__name__} {value!r}")
        return float(value)
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what}: {name} must be an integer, got {type(value).__name__} "
                        f"{value!r}")
    value = operator.index(value)
    info = torch.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"{what}: {name} {value} does not fit the target's dtype {dtype} "
                         f"({info.min}..{info.max})")
    return value


# -- the MPI operations ------------------------------------------------------
def _issue(heap: HeapCore, dest, value, pe, op: MPI.Op, what: str, floats: bool = False):
    """Start `op` with `value` on dest on PE `pe` (MPI_Rget_accumulate, module doc):
    (request, pe, window, result array that holds the old value once complete)."""
    pe, displacement, mpi_type, code, window = _target(heap, dest, pe, what, floats)
    origin = array.array(code, [value_for(value, dest.dtype, what)])
    result = array.array(code, [0])
    request = window.win.Rget_accumulate([origin, 1, mpi_type], [result, 1, mpi_type], pe,
                                         [displacement, 1, mpi_type], op)
    return request, pe, window, (origin, result)


def fetch_op(heap: HeapCore, dest, value, pe, op: MPI.Op, what: str, floats: bool = False):
    """Apply `op` with `value` to dest on PE `pe`; the value it replaced. Complete at
    the target on return (module doc), or PeerTimeoutError at the deadline.
    Device heaps: a kernel for PEs of this node (by_kernel)."""
    if not heap.backend.mpi_accessible:
        pe = check_target(heap, dest, pe, what, floats)
        if by_kernel(heap, pe):
            value = value_for(value, dest.dtype, what)
            return _device(heap, dest, pe, _DEVICE_OPS[op.py2f()], what, value)
    request, pe, window, (_, result) = _issue(heap, dest, value, pe, op, what, floats)
    window.finish(request, pe, what)
    return result[0]


def read_local(heap: HeapCore, ivar, what: str) -> int:
    """ivar's value on this PE, read atomically through MPI."""
    return fetch_op(heap, ivar, 0, heap.my_pe, MPI.NO_OP, what)


# The errors every atomic can raise, for their docstrings.
_RAISES = """
    Raises:
        TypeError: `dest` is not a tensor of dtype int32, int64 or uint64, or
            `pe` or a value is not an integer.
        ValueError: `dest` is not one element, `pe` is out of range, or a
            value does not fit dest's dtype.
        FreedTensorError: `dest` is not a view of a live tensor of this heap.
        UnsupportedError: a device heap and `pe` on another node (device
            memory is not given to MPI), a device heap without Triton, or MPI
            could not make the heap's window.
        PeerTimeoutError: PE `pe` did not complete the operation within the
            heap's timeout (SHMEMVM_TIMEOUT): it died, is stopped or stayed out
            of MPI. The heap is unusable afterwards; every later call says so.
"""


_documented = _docs.appended(_RAISES)
_documented_float = _docs.appended("""
    Raises:
        TypeError: `dest` is not a tensor of dtype int32, int64, uint64, float32
            or float64, `pe` is not an integer, or a value is not an integer
            (a real number for float tensors).
        ValueError: `dest` is not one element, `pe` is out of range, or a
            value does not fit dest's dtype.
        FreedTensorError: `dest` is not a view of a live tensor of this heap.
        UnsupportedError: a device heap and `pe` on another node (device
            memory is not given to MPI), a device heap without Triton, or MPI
            could not make the heap's window.
        PeerTimeoutError: PE `pe` did not complete the operation within the
            heap's timeout (SHMEMVM_TIMEOUT): it died, is stopped or stayed out
            of MPI. The heap is unusable afterwards; every later call says so.
""")


# -- atomics ----------------------------------------------------------------------
@_documented_float
def atomic_fetch(ctx: Context, dest: torch.Tensor, pe: int) -> int | float:
    """Read `dest` on PE `pe` atomically.

    Args:
        dest: a one-element view (``counter[3]``) of an int32, int64, uint64,
            float32 or float64 symmetric tensor; its copy on PE `pe` is read.
        pe: the PE to read from (this PE too).

    Returns:
        The value of `dest` on PE `pe`, as a Python int (float for a float
        tensor).
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    return fetch_op(heap, dest, 0, pe, MPI.NO_OP, "atomic_fetch", floats=True)


@_documented_float
def atomic_set(ctx: Context, dest: torch.Tensor, value: int | float, pe: int) -> None:
    """Set `dest` on PE `pe` to `value` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64, uint64, float32 or float64
            symmetric tensor.
        value: the new value (an integer that fits dest's dtype; a number for a
            float tensor).
        pe: the PE whose copy of `dest` is set.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    fetch_op(heap, dest, value, pe, MPI.REPLACE, "atomic_set", floats=True)


@_documented
def atomic_add(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> None:
    """Add `value` to `dest` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the integer to add (it must fit dest's dtype; negative subtracts).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    fetch_op(heap, dest, value, pe, MPI.SUM, "atomic_add")


@_documented
def atomic_inc(ctx: Context, dest: torch.Tensor, pe: int) -> None:
    """Add 1 to `dest` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        pe: the PE whose copy of `dest` is incremented.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    fetch_op(heap, dest, 1, pe, MPI.SUM, "atomic_inc")


@_documented
def atomic_fetch_add(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> int:
    """Add `value` to `dest` on PE `pe` atomically and return the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the integer to add (it must fit dest's dtype; negative subtracts).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the addition, as a Python int.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    return fetch_op(heap, dest, value, pe, MPI.SUM, "atomic_fetch_add")


@_documented
def atomic_fetch_inc(ctx: Context, dest: torch.Tensor, pe: int) -> int:
    """Add 1 to `dest` on PE `pe` atomically and return the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        pe: the PE whose copy of `dest` is incremented.

    Returns:
        dest's value on PE `pe` just before the increment, as a Python int.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    return fetch_op(heap, dest, 1, pe, MPI.SUM, "atomic_fetch_inc")


@_documented_float
def atomic_swap(ctx: Context, dest: torch.Tensor, value: int | float, pe: int) -> int | float:
    """Set `dest` on PE `pe` to `value` atomically and return the value before.

    Args:
        dest: a one-element view of an int32, int64, uint64, float32 or float64
            symmetric tensor.
        value: the new value (an integer that fits dest's dtype; a number for a
            float tensor).
        pe: the PE whose copy of `dest` is swapped.

    Returns:
        dest's value on PE `pe` just before the swap, as a Python int (float
        for a float tensor).
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    return fetch_op(heap, dest, value, pe, MPI.REPLACE, "atomic_swap", floats=True)


@_documented
def atomic_compare_swap(ctx: Context, dest: torch.Tensor, cond: int, value: int, pe: int) -> int:
    """Set `dest` on PE `pe` to `value` if it equals `cond`, atomically.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        cond: the value `dest` must hold for the swap to happen.
        value: the new value (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is compared and maybe swapped.

    Returns:
        dest's value on PE `pe` before the call, as a Python int: equal to
        `cond` exactly when the swap happened.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    what = "atomic_compare_swap"
    if not heap.backend.mpi_accessible:
        pe = check_target(heap, dest, pe, what)
        if by_kernel(heap, pe):
            return _device(heap, dest, pe, "cas", what, value_for(value, dest.dtype, what),
                           value_for(cond, dest.dtype, what, "cond"))
    read, pe, window, buffers = _issue_compare_swap(heap, dest, cond, value, pe, what)
    window.finish(read, pe, "atomic_compare_swap")
    return buffers[-1][0]


def _issue_compare_swap(heap: HeapCore, dest, cond, value, pe, what: str):
    """Start a compare-and-swap on dest on PE `pe`: (request, pe, window, buffers),
    buffers[-1] holding the old value once the request is complete and the window
    flushed."""
    pe, displacement, mpi_type, code, window = _target(heap, dest, pe, what)
    origin = array.array(code, [value_for(value, dest.dtype, what)])
    compare = array.array(code, [value_for(cond, dest.dtype, what, "cond")])
    result = array.array(code, [0])
    after = array.array(code, [0])
    # MPI_Compare_and_swap has no request-based form, and the MPI_Win_flush that
    # completes it waits without a deadline. So it is followed by an
    # MPI_Rget_accumulate(MPI_NO_OP) of the same element: under MPI's default
    # accumulate ordering (rar, raw, war, waw; the window does not relax it) one
    # origin's accumulate-class operations on one target location are applied in
    # issue order, so the target answers that read only after it has applied the
    # compare-and-swap. Its request is waited for with the deadline; once it has
    # completed, the target is known to have done the swap and to serve our
    # operations, and the flush that delivers the swap's result returns promptly.
    win = window.win
    win.Compare_and_swap([origin, 1, mpi_type], [compare, 1, mpi_type],
                         [result, 1, mpi_type], pe, displacement)
    read = win.Rget_accumulate([origin, 1, mpi_type], [after, 1, mpi_type], pe,
                               [displacement, 1, mpi_type], MPI.NO_OP)
    return read, pe, window, (origin, compare, after, result)


@_documented
def atomic_fetch_and(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest &= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the mask (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    return fetch_op(heap, dest, value, pe, MPI.BAND, "atomic_fetch_and")


@_documented
def atomic_fetch_or(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest |= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to set (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    return fetch_op(heap, dest, value, pe, MPI.BOR, "atomic_fetch_or")


@_documented
def atomic_fetch_xor(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest ^= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to flip (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    return fetch_op(heap, dest, value, pe, MPI.BXOR, "atomic_fetch_xor")


@_documented
def atomic_and(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest &= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the mask (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    fetch_op(heap, dest, value, pe, MPI.BAND, "atomic_and")


@_documented
def atomic_or(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest |= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to set (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    fetch_op(heap, dest, value, pe, MPI.BOR, "atomic_or")


@_documented
def atomic_xor(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest ^= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to flip (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    fetch_op(heap, dest, value, pe, MPI.BXOR, "atomic_xor")


# -- non-blocking fetching atomics ---------------------------------------------------
def _check_fetch(fetch, dest, what: str) -> None:
    if not isinstance(fetch, torch.Tensor):
        raise TypeError(f"{what}: fetch must be a one-element torch.Tensor that receives the "
                        f"old value, got {type(fetch).__name__}")
    if isinstance(dest, torch.Tensor) and fetch.dtype != dest.dtype:
        raise TypeError(f"{what}: fetch has dtype {fetch.dtype}, the target {dest.dtype}; "
                        f"fetch into a tensor of the target's dtype")
    if fetch.numel() != 1:
        raise ValueError(f"{what}: fetch must be one element (it receives the old value), "
                         f"got shape {tuple(fetch.shape)}")


def _defer(fetch, issued, tracker: CompletionTracker) -> None:
    """Hand an issued operation to the completion tracker of the context that
    issued it: its quiet() completes it and then stores the old value into
    `fetch`."""
    request, pe, window, buffers = issued
    result = buffers[-1]

    def done():
        fetch.copy_(torch.frombuffer(result, dtype=fetch.dtype).reshape(fetch.shape))

    tracker.defer(request, pe, window, (fetch, buffers), done)


def _fetch_nbi(heap: HeapCore, fetch, dest, value, pe: int, op: MPI.Op, what: str,
               floats: bool = False, *, tracker: CompletionTracker) -> None:
    _check_fetch(fetch, dest, what)
    if not heap.backend.mpi_accessible:  # device heaps: complete at once (allowed for nbi)
        _fill(fetch, fetch_op(heap, dest, value, pe, op, what, floats))
        return
    _defer(fetch, _issue(heap, dest, value, pe, op, what, floats), tracker)


def _fill(fetch: torch.Tensor, old) -> None:
    """fetch <- old (a Python number of fetch's dtype; uint64 through its bits)."""
    if fetch.dtype == torch.uint64:
        fetch.copy_(torch.tensor([_args.signed64(old)])
                    .view(torch.uint64).reshape(fetch.shape))
    else:
        fetch.fill_(old)


_NBI_RAISES = """
    Raises:
        TypeError: `dest` is not a tensor of a dtype the operation takes (see
            Args), `fetch` is not a tensor of dest's dtype, `pe` is not an
            integer, or a value is not a number of dest's kind.
        ValueError: `dest` or `fetch` is not one element, `pe` is out of
            range, or a value does not fit dest's dtype.
        FreedTensorError: `dest` is not a view of a live tensor of this heap.
        UnsupportedError: a device heap and `pe` on another node (device
            memory is not given to MPI), a device heap without Triton, or MPI
            could not make the heap's window.
        PeerTimeoutError: raised by quiet() (not by this call): PE `pe` did not
            complete the operation within the heap's timeout (SHMEMVM_TIMEOUT).
            The heap is unusable afterwards; every later call says so.
"""
_documented_nbi = _docs.appended(_NBI_RAISES)

#: what every nbi atomic's docstring says about completion
_NBI_NOTE = """
    Returns once the operation is issued; `fetch` holds the old value only
    after quiet() (or fence(), barrier_all()) returns, and must stay alive and
    untouched until then. The update is atomic with respect to every other
    atomic, as the blocking form's.
"""


@_documented_nbi
def atomic_fetch_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, pe: int) -> None:
    """Non-blocking atomic_fetch: read `dest` on PE `pe` into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory (not
            necessarily symmetric): receives dest's value at quiet().
        dest: a one-element view of an int32, int64, uint64, float32 or
            float64 symmetric tensor.
        pe: the PE to read from.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    _fetch_nbi(heap, fetch, dest, 0, pe, MPI.NO_OP, "atomic_fetch_nbi", floats=True,
               tracker=ctx.tracker)


@_documented_nbi
def atomic_fetch_add_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int,
                         pe: int) -> None:
    """Non-blocking atomic_fetch_add: add `value` to `dest` on PE `pe`, the value
    before into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the addition, at quiet().
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the integer to add (it must fit dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    _fetch_nbi(heap, fetch, dest, value, pe, MPI.SUM, "atomic_fetch_add_nbi", tracker=ctx.tracker)


@_documented_nbi
def atomic_fetch_inc_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, pe: int) -> None:
    """Non-blocking atomic_fetch_inc: add 1 to `dest` on PE `pe`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the increment, at quiet().
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        pe: the PE whose copy of `dest` is incremented.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    _fetch_nbi(heap, fetch, dest, 1, pe, MPI.SUM, "atomic_fetch_inc_nbi", tracker=ctx.tracker)


@_documented_nbi
def atomic_swap_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int | float,
                    pe: int) -> None:
    """Non-blocking atomic_swap: set `dest` on PE `pe` to `value`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the swap, at quiet().
        dest: a one-element view of an int32, int64, uint64, float32 or
            float64 symmetric tensor.
        value: the new value (fitting dest's dtype).
        pe: the PE whose copy of `dest` is swapped.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    _fetch_nbi(heap, fetch, dest, value, pe, MPI.REPLACE, "atomic_swap_nbi", floats=True,
               tracker=ctx.tracker)


@_documented_nbi
def atomic_compare_swap_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, cond: int,
                            value: int, pe: int) -> None:
    """Non-blocking atomic_compare_swap: set `dest` on PE `pe` to `value` if it
    equals `cond`, the value before into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the call, at quiet() (equal to `cond` exactly
            when the swap happened).
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        cond: the value `dest` must hold for the swap to happen.
        value: the new value (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is compared and maybe swapped.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    what = "atomic_compare_swap_nbi"
    _check_fetch(fetch, dest, what)
    if not heap.backend.mpi_accessible:  # device heaps: complete at once (allowed for nbi)
        _fill(fetch, atomic_compare_swap(heap, dest, cond, value, pe))
        return
    _defer(fetch, _issue_compare_swap(heap, dest, cond, value, pe, what), ctx.tracker)


@_documented_nbi
def atomic_fetch_and_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int,
                         pe: int) -> None:
    """Non-blocking atomic_fetch_and: ``dest &= value`` on PE `pe`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the update, at quiet().
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the mask (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    _fetch_nbi(heap, fetch, dest, value, pe, MPI.BAND, "atomic_fetch_and_nbi", tracker=ctx.tracker)


@_documented_nbi
def atomic_fetch_or_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int,
                        pe: int) -> None:
    """Non-blocking atomic_fetch_or: ``dest |= value`` on PE `pe`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the update, at quiet().
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to set (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    _fetch_nbi(heap, fetch, dest, value, pe, MPI.BOR, "atomic_fetch_or_nbi", tracker=ctx.tracker)


@_documented_nbi
def atomic_fetch_xor_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int,
                         pe: int) -> None:
    """Non-blocking atomic_fetch_xor: ``dest ^= value`` on PE `pe`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the update, at quiet().
        dest: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the bits to flip (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    _fetch_nbi(heap, fetch, dest, value, pe, MPI.BXOR, "atomic_fetch_xor_nbi", tracker=ctx.tracker)


for _function in (atomic_fetch_nbi, atomic_fetch_add_nbi, atomic_fetch_inc_nbi,
                  atomic_swap_nbi, atomic_compare_swap_nbi, atomic_fetch_and_nbi,
                  atomic_fetch_or_nbi, atomic_fetch_xor_nbi):
    if _function.__doc__:
        _summary, _, _rest = _function.__doc__.partition("\n\n")
        _function.__doc__ = _summary + "\n" + _NBI_NOTE + "\n" + _rest


