"""Atomics on symmetric memory: fetch, set, add, inc, swap, compare-and-swap
and the bitwise ones, blocking and non-blocking (_nbi).

Every atomic, wait, signal and lock of both faces goes through one located
Target (the core's locate(), transport/target.py) and apply(): "apply this
operation to this word on PE pe", or apply()'s CPU path in two calls on the
same target's atomic_address (cpu_word(), at_address()). It is written over
words (words.py: int8..uint64, float32, float64), not over a face's dtypes:
the element is given as its bytes (a uint8 tensor over symmetric memory) and
its Word. The torch functions below map a tensor's dtype to its word
(words.of_torch); the NumPy face (shmem/) maps a NumPy dtype; both call
atomic(), atomic_nbi() or apply() itself. A new way to reach a word (CPU
atomics on node memory, a compiled fast path) is a change to the Target
(transport/target.py) and apply().

One path per heap (transport/route.py, AtomicPath), so that every atomic on a
word is atomic with respect to every other, from every PE:

- host heaps whose PEs all share one node, where every PE has the compiled
  piece (native/): the CPU's own atomic instruction (sequentially consistent)
  on the target PE's copy through its mapping; every PE applies them to the
  same physical memory, and no other path touches such a heap's words;
- other host heaps: every atomic goes through the heap's MPI dynamic window
  (transport/offnode.py), to PEs on this node as well as to PEs on other
  nodes, with the word's MPI datatype: MPI_Fetch_and_op, MPI_Compare_and_swap
  and MPI_Accumulate are atomic only with respect to each other. Each call is
  blocking and complete at the target when it returns.
- device heaps (memory MPI is not given): atomics on PEs of this node run as
  one-program Triton kernels with system-scope atomics on the current stream
  (transport/kernels.py), so they are atomic with respect to kernels' atomics
  of system scope; PEs on other nodes cannot be reached. Requires Triton, whose
  atomics are 32- and 64-bit: 8- and 16-bit words raise UnsupportedError there.

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
- compare-and-swap has no request-based form in MPI; see apply().

Each torch function takes a context first (the heap itself, its default
context, or a Ctx: contexts.py), which maps `pe` (team-relative on a team's
context) and whose quiet() completes the non-blocking forms. The target of an
atomic is a one-element view of a symmetric tensor of an integer dtype
(`counter[3]` or `counter[3:4]`); atomic_fetch/set/swap take float32 and
float64 too.
"""

from __future__ import annotations

import torch
from mpi4py import MPI

from .. import _docs, native, vocabulary
from ..core.state import Context, Core
from ..errors import UnsupportedError
from ..transport.completion import CompletionTracker
from ..transport.target import Target
from . import words
from .words import Word

#: the operations of apply(), with the MPI operation of each (compare-and-swap: its own call)
OPERATIONS = dict(zip(vocabulary.ATOMIC_OPS, (MPI.NO_OP, MPI.REPLACE, MPI.REPLACE, MPI.SUM,
                                               MPI.BAND, MPI.BOR, MPI.BXOR, None), strict=True))
#: the operations that also take float words (OpenSHMEM 1.5's extended AMO types)
EXTENDED = frozenset({"fetch", "set", "swap"})
#: the operations that take float32/float64 targets, for error messages
FLOAT_OPERATIONS = ("atomic_fetch", "atomic_set", "atomic_swap", "atomic_fetch_nbi",
                    "atomic_swap_nbi")
#: apply()'s operation -> the kernel's (transport/kernels.py)
_KERNEL_OPS = dict(zip(vocabulary.ATOMIC_OPS, ("fetch", "xchg", "xchg", "add", "and", "or",
                                                "xor", "cas"), strict=True))


# -- checks -------------------------------------------------------------------------------
def check_op(word: Word, op: str, what: str) -> None:
    """TypeError unless `op` applies to `word` (floats: fetch, set and swap only)."""
    if op not in OPERATIONS:
        raise ValueError(f"{what}: unknown atomic operation {op!r}; one of "
                         f"{', '.join(OPERATIONS)}")
    if not word.integer and op not in EXTENDED:
        raise TypeError(f"{what}: this operation works on {words.INTEGER_TEXT} targets; "
                        f"{words.FLOAT_TEXT} only with {', '.join(FLOAT_OPERATIONS)}; the "
                        f"target is {word.name}")


def prepare(heap: Core, word: Word, where: torch.Tensor, pe: int, op: str, what: str,
            count: int = 1, role: str = "target") -> Target:
    """Every check of apply() before anything moves: `op` applies to `word`,
    `where` is `count` words of live symmetric memory of this heap, aligned to
    the word's size, and PE `pe` (a checked PE number) is reachable by this
    heap's atomics. The located Target (transport/target.py); a clear error
    otherwise."""
    check_op(word, op, what)
    target = heap.where.locate(where, pe, f"{role} of {what} (a view of memory from this heap's "
                                    f"malloc/empty/zeros)")
    if where.numel() != word.size * count:
        raise ValueError(f"{what}: the {role} has {where.numel()} bytes, not {count} {word.name}")
    if where.data_ptr() % word.size:
        raise ValueError(f"{what}: the {role} at {where.data_ptr():#x} is not aligned to its "
                         f"{word.size}-byte element size; use an element of memory allocated "
                         f"with that element type")
    if target.atomic_address is None:
        if not target.by_kernel or target.address is None:
            heap.where.atomics_window(what, pe)
        elif word.size not in (4, 8):
            raise UnsupportedError(f"{what}: on a {heap.identity.backend_name} heap atomics run as "
                                   f"Triton kernels, whose atomics are 32- and 64-bit; the "
                                   f"target is {word.name}. Use a 32- or 64-bit type")
    return target


# -- the general path: apply() ----------------------------------------------------------------
def apply(heap: Core, word: Word, where: torch.Tensor, pe: int, op: str, value=0, cond=0,
          *, what: str, count: int = 1, into: torch.Tensor | None = None,
          tracker: CompletionTracker | None = None):
    """Apply `op` with `value` (and `cond`, for "cas") to the word `where` holds
    on PE `pe` (a checked heap PE number): the one way every atomic, wait,
    signal and lock reaches memory.

    Args:
        word: the element's Word.
        where: a uint8 tensor over the element's bytes on this PE (symmetric
            memory; the same offset is used on PE `pe`).
        op: "fetch", "set", "swap", "add", "and", "or", "xor" or "cas".
        value, cond: the operands, checked against the word here.
        count: words to read at once (op "fetch" only: waits on vectors).
        into, tracker: the non-blocking form: the operation is recorded in
            `tracker` (a context's), whose quiet() completes it and then stores
            the old value's bytes into `into` (a uint8 tensor of word.size
            bytes, any memory); None is returned. Device heaps complete at once.

    Returns:
        The value before the operation (Python int or float), a list of
        `count` values for a vector read, or None for the non-blocking form.

    Raises:
        As prepare(); TypeError/ValueError for a value that is not of the
        word's kind or does not fit it; PeerTimeoutError at the heap's deadline.
    """
    located = prepare(heap, word, where, pe, op, what, count)
    if count != 1 and op != "fetch":
        raise ValueError(f"{what}: only reads ('fetch') take several words at once, got {op!r} "
                         f"of {count}")
    value = word.value(value, what)
    if op == "cas":
        cond = word.value(cond, what, "cond")
    if located.atomic_address is not None:
        old = _by_cpu(located.atomic_address, word, op, value, cond, count)
        if into is not None:
            into.copy_(torch.frombuffer(word.buffer([old]), dtype=torch.uint8))
            return None
        return old
    if located.by_kernel and located.address is not None:
        old = _by_kernel(heap, word, where, pe, op, value, cond, count, what)
        if into is not None:
            into.copy_(torch.frombuffer(word.buffer([old]), dtype=torch.uint8))
            return None
        return old
    if not count:
        return []
    window = heap.where.atomics_window(what, pe)
    win, mpi = window.win, word.mpi
    target = [window.displacement(where, pe), count, mpi]
    origin = word.buffer([value] * count)
    result = word.buffer([0] * count)
    if op == "cas":
        # MPI_Compare_and_swap has no request-based form, and the MPI_Win_flush that
        # completes it waits without a deadline. So it is followed by an
        # MPI_Rget_accumulate(MPI_NO_OP) of the same element: under MPI's default
        # accumulate ordering (rar, raw, war, waw; the window does not relax it) one
        # origin's accumulate-class operations on one target location are applied in
        # issue order, so the target answers that read only after it has applied the
        # compare-and-swap. Its request is waited for with the deadline; once it has
        # completed, the target is known to have done the swap and to serve our
        # operations, and the flush that delivers the swap's result returns promptly.
        compare, after = word.buffer([cond]), word.buffer([0])
        displacement = target[0]
        assert isinstance(displacement, int)
        win.Compare_and_swap([origin, 1, mpi], [compare, 1, mpi], [result, 1, mpi], pe,
                             displacement)
        request = win.Rget_accumulate([origin, 1, mpi], [after, 1, mpi], pe, target, MPI.NO_OP)
        buffers: tuple = (origin, compare, after, result)
    else:
        request = win.Rget_accumulate([origin, count, mpi], [result, count, mpi], pe, target,
                                      OPERATIONS[op])   # type: ignore[arg-type]  # (not cas)
        buffers = (origin, result)
    if tracker is not None:
        def done():
            into.copy_(torch.frombuffer(result, dtype=torch.uint8))

        tracker.defer(request, pe, window, (into, buffers), done)
        return None
    window.finish(request, pe, what)
    return result[0] if count == 1 else result.tolist()


#: apply()'s operation -> the compiled piece's (native/)
_NATIVE_OPS = {name: native.OPERATIONS["set" if name == "swap" else name]
               for name in vocabulary.ATOMIC_OPS}


def _by_cpu(address: int, word: Word, op: str, value, cond, count: int):
    """apply() on a host heap whose PEs all share this node (transport/route.py's
    CPU path): the CPU's atomic instruction at the target's atomic_address, the
    PE's copy mapped here (located by prepare()). A vector read (waits) reads
    word by word, each atomically. Complete at the target on return: it is
    this PE's own store."""
    if count != 1:
        return [native.load(address + i * word.size, word.code) for i in range(count)]
    return native.atomic(address, word.code, _NATIVE_OPS[op], value, cond)


def cpu_word(heap: Core, allocation: torch.Tensor, address: int, word: Word,
             pe: int) -> int | None:
    """Where the `word` at `address` of `allocation` (a whole block's tensor,
    as the NumPy face keeps it) lies for PE `pe` (a checked PE number), where
    this heap's atomics are the CPU's; None otherwise, and for a misaligned or
    dead word, so that the caller takes apply(), which names what is wrong. With
    at_address(), a face's atomic in two calls: 2 us against 6 through apply().
    The located target's atomic_address (transport/target.py): "fast" is a
    property of the target."""
    if address % word.size:
        return None
    target = heap.where.locate_in(allocation, address, pe)
    return None if target is None else target.atomic_address


def at_address(address: int, word: Word, op: str, value, cond=0, *, what: str):
    """apply()'s CPU path on an address from cpu_word(), after apply()'s checks
    of `op`, `value` and `cond`."""
    check_op(word, op, what)
    value = word.value(value, what)
    if op == "cas":
        cond = word.value(cond, what, "cond")
    return native.atomic(address, word.code, _NATIVE_OPS[op], value, cond)


def _by_kernel(heap: Core, word: Word, where: torch.Tensor, pe: int, op: str, value, cond,
               count: int, what: str):
    """apply() on a device heap's node (transport/kernels.py): one word as a kernel;
    a vector read (waits) as a copy to the host, after the current stream's work:
    aligned elements are copied whole, and peers' system-scope atomics and completed
    copies are visible to it."""
    if count != 1:
        return word.unpack(where.cpu().numpy().tobytes())
    try:   # Triton is optional: imported where a device heap's atomic needs it
        from ..transport import kernels
    except ImportError as exc:
        raise UnsupportedError(f"{what}: on a {heap.identity.backend_name} heap atomics run "
                               f"as Triton "
                               f"kernels, and Triton is not installed: pip install triton") from exc
    bits = kernels.apply(heap.where.heap_bases(), heap.identity.my_pe, where, pe, _KERNEL_OPS[op],
                         word.bits(value), word.bits(cond))
    return word.from_bits(bits)


# -- the dtype-agnostic entry points of the faces -----------------------------------------------
def atomic(ctx: Context, word: Word, where: torch.Tensor, pe, op: str, value=0, cond=0, *,
           what: str):
    """A blocking atomic issued on context `ctx` (the heap, or a Ctx: `pe` is
    mapped by it): apply() on the heap's PE number."""
    return apply(ctx.core, word, where, ctx.world_pe(pe), op, value, cond, what=what)


def atomic_nbi(ctx: Context, word: Word, into: torch.Tensor, where: torch.Tensor, pe, op: str,
               value=0, cond=0, *, what: str) -> None:
    """A non-blocking fetching atomic issued on context `ctx`: the old value's
    bytes land in `into` (a uint8 tensor of word.size bytes) at ctx's quiet()."""
    apply(ctx.core, word, where, ctx.world_pe(pe), op, value, cond, what=what, into=into,
          tracker=ctx.tracker)


def read(heap: Core, word: Word, where: torch.Tensor, what: str, count: int | None = None):
    """This PE's value of the word at `where`, read atomically; with `count`, a
    list of the values of `count` words there."""
    values = apply(heap, word, where, heap.identity.my_pe, "fetch", what=what,
                   count=1 if count is None else count)
    return [values] if count == 1 else values


# -- the torch face: a tensor's word and bytes ------------------------------------------------
def tensor_word(tensor, what: str, role: str = "target") -> tuple[Word, torch.Tensor]:
    """(word, bytes) of a one-element tensor, or a clear error."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: the {role} must be a one-element view of a symmetric "
                        f"tensor, got {type(tensor).__name__}")
    word = words.of_torch(tensor.dtype)
    if word is None:
        raise TypeError(f"{what}: this operation works on symmetric tensors of "
                        f"{words.INTEGER_TEXT} ({words.FLOAT_TEXT} only with "
                        f"{', '.join(FLOAT_OPERATIONS)}); the {role} has dtype {tensor.dtype}. "
                        f"Allocate the variable with one of those (e.g. heap.zeros(n, "
                        f"torch.int64))")
    if tensor.numel() != 1:
        raise ValueError(f"{what}: the {role} must be one element (a view like counter[3] "
                         f"or counter[3:4]), got shape {tuple(tensor.shape)} with "
                         f"{tensor.numel()} elements; index the element to update")
    return word, element_bytes(tensor, what, role)


def element_bytes(tensor: torch.Tensor, what: str, role: str) -> torch.Tensor:
    """The bytes of one-element `tensor` (any strides: one element has no
    layout) as a uint8 tensor over its memory; ValueError for a negative view
    (x._neg_view(): its memory holds -x, which an atomic would act on)."""
    if tensor.is_neg() or tensor.is_conj():
        raise ValueError(f"{what}: the {role} is a lazily negated or conjugated view, whose "
                         f"memory holds other values than it shows; an atomic acts on the "
                         f"memory. Pass the tensor itself (and negate the values instead)")
    return tensor.as_strided((1,), (1,)).view(torch.uint8)


def _on_tensor(ctx: Context, dest, pe, op: str, value=0, cond=0, *, what: str):
    heap, pe = ctx.core, ctx.world_pe(pe)
    # the common case in two calls where the heap's atomics are the CPU's (2 us
    # against 4 through apply()); anything else, or wrong, takes apply()
    word = (words.of_torch(dest.dtype) if type(dest) is torch.Tensor and dest.numel() == 1
            and not dest.is_neg() else None)
    there = None if word is None else cpu_word(heap, dest, dest.data_ptr(), word, pe)
    if there is not None and word is not None:
        return at_address(there, word, op, value, cond, what=what)
    word, where = tensor_word(dest, what)
    return apply(heap, word, where, pe, op, value, cond, what=what)


# The errors every atomic can raise, for their docstrings.
_RAISES = """
    Raises:
        TypeError: `dest` is not a tensor of an integer dtype (int8..int64,
            uint8..uint64), or `pe` or a value is not an integer.
        ValueError: `dest` is not one element, `pe` is out of range, or a
            value does not fit dest's dtype.
        NotSymmetricError: `dest` is not a view of a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        UnsupportedError: a device heap and `pe` on another node (device
            memory is not given to MPI), a device heap without Triton or with
            an 8- or 16-bit dtype, or MPI could not make the heap's window.
        PeerTimeoutError: PE `pe` did not complete the operation within the
            heap's timeout (SHMEMVM_TIMEOUT): it died, is stopped or stayed out
            of MPI. The heap is unusable afterwards; every later call says so.
"""


_documented = _docs.appended(_RAISES)
_documented_float = _docs.appended("""
    Raises:
        TypeError: `dest` is not a tensor of an integer dtype (int8..int64,
            uint8..uint64), float32 or float64, `pe` is not an integer, or a
            value is not an integer (a real number for float tensors).
        ValueError: `dest` is not one element, `pe` is out of range, or a
            value does not fit dest's dtype.
        NotSymmetricError: `dest` is not a view of a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        UnsupportedError: a device heap and `pe` on another node (device
            memory is not given to MPI), a device heap without Triton or with
            an 8- or 16-bit dtype, or MPI could not make the heap's window.
        PeerTimeoutError: PE `pe` did not complete the operation within the
            heap's timeout (SHMEMVM_TIMEOUT): it died, is stopped or stayed out
            of MPI. The heap is unusable afterwards; every later call says so.
""")


# -- atomics ----------------------------------------------------------------------
@_documented_float
def atomic_fetch(ctx: Context, dest: torch.Tensor, pe: int) -> int | float:
    """Read `dest` on PE `pe` atomically.

    Args:
        dest: a one-element view (``counter[3]``) of an integer, float32 or
            float64 symmetric tensor; its copy on PE `pe` is read.
        pe: the PE to read from (this PE too).

    Returns:
        The value of `dest` on PE `pe`, as a Python int (float for a float
        tensor).
    """
    return _on_tensor(ctx, dest, pe, "fetch", what="atomic_fetch")


@_documented_float
def atomic_set(ctx: Context, dest: torch.Tensor, value: int | float, pe: int) -> None:
    """Set `dest` on PE `pe` to `value` atomically; complete there on return.

    Args:
        dest: a one-element view of an integer, float32 or float64
            symmetric tensor.
        value: the new value (an integer that fits dest's dtype; a number for a
            float tensor).
        pe: the PE whose copy of `dest` is set.

    Returns:
        None.
    """
    _on_tensor(ctx, dest, pe, "set", value, what="atomic_set")


@_documented
def atomic_add(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> None:
    """Add `value` to `dest` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        value: the integer to add (it must fit dest's dtype; negative subtracts).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _on_tensor(ctx, dest, pe, "add", value, what="atomic_add")


@_documented
def atomic_inc(ctx: Context, dest: torch.Tensor, pe: int) -> None:
    """Add 1 to `dest` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        pe: the PE whose copy of `dest` is incremented.

    Returns:
        None.
    """
    _on_tensor(ctx, dest, pe, "add", 1, what="atomic_inc")


@_documented
def atomic_fetch_add(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> int:
    """Add `value` to `dest` on PE `pe` atomically and return the value before.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        value: the integer to add (it must fit dest's dtype; negative subtracts).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the addition, as a Python int.
    """
    return _on_tensor(ctx, dest, pe, "add", value, what="atomic_fetch_add")


@_documented
def atomic_fetch_inc(ctx: Context, dest: torch.Tensor, pe: int) -> int:
    """Add 1 to `dest` on PE `pe` atomically and return the value before.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        pe: the PE whose copy of `dest` is incremented.

    Returns:
        dest's value on PE `pe` just before the increment, as a Python int.
    """
    return _on_tensor(ctx, dest, pe, "add", 1, what="atomic_fetch_inc")


@_documented_float
def atomic_swap(ctx: Context, dest: torch.Tensor, value: int | float, pe: int) -> int | float:
    """Set `dest` on PE `pe` to `value` atomically and return the value before.

    Args:
        dest: a one-element view of an integer, float32 or float64
            symmetric tensor.
        value: the new value (an integer that fits dest's dtype; a number for a
            float tensor).
        pe: the PE whose copy of `dest` is swapped.

    Returns:
        dest's value on PE `pe` just before the swap, as a Python int (float
        for a float tensor).
    """
    return _on_tensor(ctx, dest, pe, "swap", value, what="atomic_swap")


@_documented
def atomic_compare_swap(ctx: Context, dest: torch.Tensor, cond: int, value: int, pe: int) -> int:
    """Set `dest` on PE `pe` to `value` if it equals `cond`, atomically.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        cond: the value `dest` must hold for the swap to happen.
        value: the new value (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is compared and maybe swapped.

    Returns:
        dest's value on PE `pe` before the call, as a Python int: equal to
        `cond` exactly when the swap happened.
    """
    return _on_tensor(ctx, dest, pe, "cas", value, cond, what="atomic_compare_swap")


@_documented
def atomic_fetch_and(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest &= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        value: the mask (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    return _on_tensor(ctx, dest, pe, "and", value, what="atomic_fetch_and")


@_documented
def atomic_fetch_or(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest |= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        value: the bits to set (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    return _on_tensor(ctx, dest, pe, "or", value, what="atomic_fetch_or")


@_documented
def atomic_fetch_xor(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> int:
    """``dest ^= value`` on PE `pe` atomically, returning the value before.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        value: the bits to flip (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        dest's value on PE `pe` just before the update, as a Python int.
    """
    return _on_tensor(ctx, dest, pe, "xor", value, what="atomic_fetch_xor")


@_documented
def atomic_and(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest &= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        value: the mask (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _on_tensor(ctx, dest, pe, "and", value, what="atomic_and")


@_documented
def atomic_or(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest |= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        value: the bits to set (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _on_tensor(ctx, dest, pe, "or", value, what="atomic_or")


@_documented
def atomic_xor(ctx: Context, dest: torch.Tensor, value: int, pe: int) -> None:
    """``dest ^= value`` on PE `pe` atomically; complete there on return.

    Args:
        dest: a one-element view of an integer symmetric tensor.
        value: the bits to flip (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _on_tensor(ctx, dest, pe, "xor", value, what="atomic_xor")


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
    if fetch.is_meta:   # it has no memory: the old value would be lost
        raise ValueError(f"{what}: fetch is on the meta device, which has no memory to "
                         f"receive the old value; pass a tensor in host or device memory")


def _nbi_on_tensor(ctx: Context, fetch, dest, pe, op: str, value=0, cond=0, *, what: str) -> None:
    _check_fetch(fetch, dest, what)
    heap, pe = ctx.core, ctx.world_pe(pe)
    word, where = tensor_word(dest, what)
    apply(heap, word, where, pe, op, value, cond, what=what,
          into=element_bytes(fetch, what, "fetch"), tracker=ctx.tracker)


_NBI_RAISES = """
    Raises:
        TypeError: `dest` is not a tensor of a dtype the operation takes (see
            Args), `fetch` is not a tensor of dest's dtype, `pe` is not an
            integer, or a value is not a number of dest's kind.
        ValueError: `dest` or `fetch` is not one element, `fetch` is on the
            meta device, `pe` is out of range, or a value does not fit
            dest's dtype.
        NotSymmetricError: `dest` is not a view of a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
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
        dest: a one-element view of an integer, float32 or float64 symmetric
            tensor.
        pe: the PE to read from.

    Returns:
        None.
    """
    _nbi_on_tensor(ctx, fetch, dest, pe, "fetch", what="atomic_fetch_nbi")


@_documented_nbi
def atomic_fetch_add_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int,
                         pe: int) -> None:
    """Non-blocking atomic_fetch_add: add `value` to `dest` on PE `pe`, the value
    before into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the addition, at quiet().
        dest: a one-element view of an integer symmetric tensor.
        value: the integer to add (it must fit dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _nbi_on_tensor(ctx, fetch, dest, pe, "add", value, what="atomic_fetch_add_nbi")


@_documented_nbi
def atomic_fetch_inc_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, pe: int) -> None:
    """Non-blocking atomic_fetch_inc: add 1 to `dest` on PE `pe`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the increment, at quiet().
        dest: a one-element view of an integer symmetric tensor.
        pe: the PE whose copy of `dest` is incremented.

    Returns:
        None.
    """
    _nbi_on_tensor(ctx, fetch, dest, pe, "add", 1, what="atomic_fetch_inc_nbi")


@_documented_nbi
def atomic_swap_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int | float,
                    pe: int) -> None:
    """Non-blocking atomic_swap: set `dest` on PE `pe` to `value`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the swap, at quiet().
        dest: a one-element view of an integer, float32 or float64 symmetric
            tensor.
        value: the new value (fitting dest's dtype).
        pe: the PE whose copy of `dest` is swapped.

    Returns:
        None.
    """
    _nbi_on_tensor(ctx, fetch, dest, pe, "swap", value, what="atomic_swap_nbi")


@_documented_nbi
def atomic_compare_swap_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, cond: int,
                            value: int, pe: int) -> None:
    """Non-blocking atomic_compare_swap: set `dest` on PE `pe` to `value` if it
    equals `cond`, the value before into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the call, at quiet() (equal to `cond` exactly
            when the swap happened).
        dest: a one-element view of an integer symmetric tensor.
        cond: the value `dest` must hold for the swap to happen.
        value: the new value (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is compared and maybe swapped.

    Returns:
        None.
    """
    _nbi_on_tensor(ctx, fetch, dest, pe, "cas", value, cond, what="atomic_compare_swap_nbi")


@_documented_nbi
def atomic_fetch_and_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int,
                         pe: int) -> None:
    """Non-blocking atomic_fetch_and: ``dest &= value`` on PE `pe`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the update, at quiet().
        dest: a one-element view of an integer symmetric tensor.
        value: the mask (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _nbi_on_tensor(ctx, fetch, dest, pe, "and", value, what="atomic_fetch_and_nbi")


@_documented_nbi
def atomic_fetch_or_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int,
                        pe: int) -> None:
    """Non-blocking atomic_fetch_or: ``dest |= value`` on PE `pe`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the update, at quiet().
        dest: a one-element view of an integer symmetric tensor.
        value: the bits to set (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _nbi_on_tensor(ctx, fetch, dest, pe, "or", value, what="atomic_fetch_or_nbi")


@_documented_nbi
def atomic_fetch_xor_nbi(ctx: Context, fetch: torch.Tensor, dest: torch.Tensor, value: int,
                         pe: int) -> None:
    """Non-blocking atomic_fetch_xor: ``dest ^= value`` on PE `pe`, the value before
    into `fetch`.

    Args:
        fetch: a one-element tensor of dest's dtype, in any memory: receives
            dest's value before the update, at quiet().
        dest: a one-element view of an integer symmetric tensor.
        value: the bits to flip (an integer that fits dest's dtype).
        pe: the PE whose copy of `dest` is updated.

    Returns:
        None.
    """
    _nbi_on_tensor(ctx, fetch, dest, pe, "xor", value, what="atomic_fetch_xor_nbi")


for _function in (atomic_fetch_nbi, atomic_fetch_add_nbi, atomic_fetch_inc_nbi,
                  atomic_swap_nbi, atomic_compare_swap_nbi, atomic_fetch_and_nbi,
                  atomic_fetch_or_nbi, atomic_fetch_xor_nbi):
    if _function.__doc__:
        _summary, _, _rest = _function.__doc__.partition("\n\n")
        _function.__doc__ = _summary + "\n" + _NBI_NOTE + "\n" + _rest


