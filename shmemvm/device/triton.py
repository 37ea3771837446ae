"""Device-side access to the symmetric heap from Triton kernels.

A kernel reaches "the same object on PE k" through the table of heap bases
(SymmetricHeap.heap_bases(): where each PE's heap lies in this process): a
pointer into this PE's heap is moved to PE k's copy by

    remote = heap_bases[k] + (ptr - heap_bases[my_pe])

(translate). The functions here take Iris's signatures
(https://github.com/ROCm/iris), so a kernel written for Iris ports by changing
its import: ``from shmemvm import triton as iris``.

    import shmemvm
    from shmemvm import triton as sv

    @triton.jit
    def ring(x, n, me, n_pes, heap_bases, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        right = (me + 1) % n_pes
        sv.store(x + offs, offs.to(tl.float32), me, right, heap_bases, mask=mask)

    ring[(1,)](x, x.numel(), me, n_pes, heap.heap_bases(), BLOCK=1024)

Rank arguments follow Iris's code: `from_rank` is the PE whose address space
the pointer is in (this PE, always, for a pointer a kernel was given), `to_rank`
the PE it is translated to and accessed on. So store, put, get and the atomics
take (this PE, the other PE) in that order: get(from_ptr, to_ptr, me, peer, ...)
reads the peer. load() is the exception Iris makes, and so do we:
``load(pointer, to_rank, from_rank, ...)`` reads PE `from_rank`'s copy of a
pointer of PE `to_rank` (this PE), so it too takes (this PE, the other PE).
copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, ...) names all three: it
reads `from_rank`, writes `to_rank`, and both pointers are of `cur_rank` (this PE).
Parameters after heap_bases are Iris's current ones, in Iris's positions and
with Iris's defaults (docs/device.md has the table, function by function).

Memory model. Plain load/store/get/put are weak: order them with the signal
functions (release on the writer's side, acquire on the reader's) or with an
atomic of sem "release"/"acquire". Atomics default to Triton's defaults
(sem="acq_rel", scope="gpu"), as in Iris; between PEs pass ``scope="sys"``
(another GPU, or the host API's atomics on device heaps, which are of system
scope). The signal functions use scope "sys" themselves.

Signals (the OpenSHMEM signal model): signal_set/signal_add update a signal
on a PE with release semantics (every store this program made before is
visible to whoever sees the new signal value); signal_wait_until waits, with
acquire semantics, until this PE's signal compares true with CMP_EQ, CMP_NE,
CMP_GT, CMP_GE, CMP_LT or CMP_LE (tl.constexpr). A kernel cannot raise, so a
wait takes a deadline from the host: Deadline(seconds) gives its max_polls and
a status word the wait sets where it gave up, which the host reads and raises
PeerTimeoutError from.

Backends. Nothing here is NVIDIA-specific: no inline assembly or externs, only
tl.load/tl.store/tl.atomic_* and pointer arithmetic, which Triton's ROCm
backend compiles as well (one choice depends on the target: a volatile load's
cache modifier, _volatile_modifier). The tests run it in Triton's interpreter
(TRITON_INTERPRET=1) over the host heap, compile it for sm_90 (H100/H200) and
gfx942 (MI300), and run it on NVIDIA GPUs (tests/test_gpu_triton.py); on AMD
GPUs it is written for, and compiles with, Triton's ROCm backend, but has not
been run there.

TRITON_INTERPRET=1 must be set before this module is imported (Triton reads
it when these functions are decorated); the interpreter addresses raw
pointers, so the host heap's peer windows, mapped in this process, work.

Triton is an optional dependency: ``pip install triton`` (or the extra,
``pip install shmemvm[triton]``).
"""

from __future__ import annotations

import ctypes
import time

import torch

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - exercised where triton is absent
    raise ImportError(
        "shmemvm.triton needs Triton, which is not installed: pip install triton "
        "(or pip install shmemvm[triton])") from exc

from ..config import setting
from ..errors import PeerTimeoutError

__all__ = [
    "translate", "load", "store", "get", "put", "copy",
    "atomic_add", "atomic_sub", "atomic_cas", "atomic_xchg", "atomic_and", "atomic_or",
    "atomic_xor", "atomic_min", "atomic_max",
    "signal_set", "signal_add", "signal_wait_until", "signal_test",
    "CMP_EQ", "CMP_NE", "CMP_GT", "CMP_GE", "CMP_LT", "CMP_LE", "max_polls_for", "Deadline",
]

#: what a wait that gave up stores in its status word (Deadline.status)
_TIMED_OUT = tl.constexpr(1)

#: comparisons of signal_wait_until / signal_test (the OpenSHMEM SHMEM_CMP_* set)
CMP_EQ = tl.constexpr(0)
CMP_NE = tl.constexpr(1)
CMP_GT = tl.constexpr(2)
CMP_GE = tl.constexpr(3)
CMP_LT = tl.constexpr(4)
CMP_LE = tl.constexpr(5)


# -- addressing -----------------------------------------------------------------------
@triton.jit
def translate(ptr, from_rank, to_rank, heap_bases, hint: tl.constexpr = None):
    """`ptr` (a pointer or block of pointers into PE `from_rank`'s heap, as
    mapped in this process) as the same place in PE `to_rank`'s heap.

    Args:
        ptr: pointer(s) into the heap of `from_rank` (this PE for pointers the
            kernel was given).
        from_rank: the PE `ptr` belongs to.
        to_rank: the PE to translate to.
        heap_bases: SymmetricHeap.heap_bases() (int64, one entry per PE).
        hint: None, or a constexpr n (a tuple for an N-D block, as in Iris):
            the translated block is n contiguous elements starting at a
            multiple of n (tl.multiple_of and tl.max_contiguous), which the
            compiler cannot see through the integer arithmetic and needs for
            vector loads and stores. A false claim gives wrong accesses.

    Returns:
        Pointer(s) of ptr's type into PE `to_rank`'s heap.

    Raises:
        Nothing at run time: an entry of 0 (a PE on another node) gives a wild
        pointer; only PEs on this node can be addressed.
    """
    from_base = tl.load(heap_bases + from_rank)
    to_base = tl.load(heap_bases + to_rank)
    offset = tl.cast(ptr, tl.uint64) - from_base      # bytes into the heap
    moved = tl.cast(to_base, tl.pointer_type(tl.int8)) + offset
    moved = tl.cast(moved, ptr.dtype)
    if hint is not None:
        moved = tl.max_contiguous(tl.multiple_of(moved, hint), hint)
    return moved


# -- loads and stores -----------------------------------------------------------------
# Cache modifiers go to tl.load/tl.store as given (None and "" are the default).
# Loads: ".ca", ".cg", ".cv"; stores: ".wb", ".cg", ".cs", ".wt". Both backends
# compile each; what they do is the vendor's (on AMD: the CDNA scope and
# non-temporal bits Iris describes; on NVIDIA: PTX's ld/st cache operators). The
# interpreter ignores them. One exception: _volatile_modifier.
@triton.constexpr_function
def _volatile_modifier(cache_modifier, volatile):
    """The cache modifier a load with `volatile` carries. PTX has no
    ld.volatile.ca or .cg (ptxas rejects what Triton emits for the pair), and a
    volatile load is not cached on NVIDIA anyway, so the modifier is left out
    there (and wherever the target is unknown: the interpreter, a compile with
    no GPU). On AMD volatile changes nothing in the instruction and the
    modifier's bits are what make the load coherent, so it stays."""
    target = tl.target_info.current_target()
    if volatile and cache_modifier in (".ca", ".cg") and (target is None
                                                            or target.backend != "hip"):
        return ""
    return cache_modifier


@triton.jit
def load(pointer, to_rank, from_rank, heap_bases, mask=None, other=None, cache_modifier=None,
         volatile=False, hint: tl.constexpr = None):
    """Load PE `from_rank`'s copy of `pointer`. Iris's order, which puts this PE
    first here too: ``load(ptr, me, peer, ...)`` reads the peer.

    Args:
        pointer: pointer(s) into this PE's heap.
        to_rank: this PE (the PE `pointer` belongs to).
        from_rank: the PE to read from.
        heap_bases: SymmetricHeap.heap_bases().
        mask: where False, nothing is read.
        other: the value where masked (undefined without it).
        cache_modifier: tl.load's: None or "" (default), ".ca", ".cg", ".cv".
        volatile: tl.load's: the load is neither removed nor merged. On
            NVIDIA it takes no ".ca"/".cg" modifier (PTX has none for a
            volatile load: the modifier is left out).
        hint: as translate's.

    Returns:
        The loaded block.

    Raises:
        Nothing at run time; a cache modifier Triton does not know fails to compile.
    """
    return tl.load(translate(pointer, to_rank, from_rank, heap_bases, hint), mask=mask,
                   other=other, cache_modifier=_volatile_modifier(cache_modifier, volatile),
                   volatile=volatile)


@triton.jit
def store(pointer, value, from_rank, to_rank, heap_bases, mask=None, hint: tl.constexpr = None,
          cache_modifier=None):
    """Store `value` into PE `to_rank`'s copy of `pointer`.

    Args:
        pointer: pointer(s) into this PE's heap.
        value: the block to store.
        from_rank: this PE (the PE `pointer` belongs to).
        to_rank: the PE to write to.
        heap_bases: SymmetricHeap.heap_bases().
        mask: where False, nothing is written.
        hint: as translate's (before cache_modifier, as in Iris).
        cache_modifier: tl.store's: None or "" (default), ".wb", ".cg", ".cs", ".wt".

    Returns:
        None.

    Raises:
        Nothing at run time; a cache modifier Triton does not know fails to compile.
    """
    tl.store(translate(pointer, from_rank, to_rank, heap_bases, hint), value, mask=mask,
             cache_modifier=cache_modifier)


@triton.jit
def get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier=None, store_cache_modifier=None, hint: tl.constexpr = None):
    """Copy PE `to_rank`'s copy of `from_ptr` into local `to_ptr`, as Iris's code
    does: `from_ptr` is valid in PE `from_rank`'s address space (this PE) and is
    translated to `to_rank`, which is read. Every Iris program calls it as
    ``get(data, results, cur_rank, target_rank, heap_bases)`` to read
    target_rank's data. (Iris's docstring names the ranks the other way round;
    its code, which its programs rely on, reads `to_rank`.)

    Args:
        from_ptr: pointer(s) into this PE's heap; PE `to_rank`'s copy is read.
        to_ptr: local pointer(s) (any memory this kernel can write).
        from_rank: this PE (the PE `from_ptr` belongs to).
        to_rank: the PE to read from.
        heap_bases: SymmetricHeap.heap_bases().
        mask: where False, nothing is read or written.
        other: the value loaded where masked (never stored: the store has the
            same mask).
        load_cache_modifier: load's cache_modifier, for the read of `to_rank`.
        store_cache_modifier: store's cache_modifier, for the local write.
        hint: as translate's, for the translated pointer.

    Returns:
        None.

    Raises:
        Nothing at run time; a cache modifier Triton does not know fails to compile.

    bfloat16 in Triton's interpreter: get() copies the bits exactly, but Triton
    3.6's interpreter keeps bfloat16 as uint16 and does arithmetic on those
    integers, so a kernel that adds what it read in bfloat16 gets garbage
    there: Triton alone, ``v = tl.load(x); tl.store(out, v + v)`` of ones
    gives 0x3F80 + 0x3F80 = 0x7F00 = 1.7e38, not 2.0 (right when compiled).
    In the interpreter, compute in float32 (``.to(tl.float32)``, which it
    converts correctly). tests/mpi/device/test_triton.py shows both.
    """
    data = tl.load(translate(from_ptr, from_rank, to_rank, heap_bases, hint), mask=mask,
                   other=other, cache_modifier=load_cache_modifier)
    tl.store(to_ptr, data, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, other=None,
        load_cache_modifier=None, store_cache_modifier=None, hint: tl.constexpr = None):
    """Copy local `from_ptr` into PE `to_rank`'s copy of `to_ptr`.

    Args:
        from_ptr: local pointer(s) to read.
        to_ptr: pointer(s) into this PE's heap, written on PE `to_rank`.
        from_rank: this PE (the PE `to_ptr` belongs to).
        to_rank: the PE to write to.
        heap_bases: SymmetricHeap.heap_bases().
        mask: where False, nothing is read or written.
        other: the value loaded where masked (never stored).
        load_cache_modifier: load's cache_modifier, for the local read.
        store_cache_modifier: store's cache_modifier, for the write of `to_rank`.
        hint: as translate's, for the translated pointer.

    Returns:
        None.

    Raises:
        Nothing at run time; a cache modifier Triton does not know fails to compile.
    """
    data = tl.load(from_ptr, mask=mask, other=other, cache_modifier=load_cache_modifier)
    tl.store(translate(to_ptr, from_rank, to_rank, heap_bases, hint), data, mask=mask,
             cache_modifier=store_cache_modifier)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask=None, other=None,
         load_cache_modifier=None, store_cache_modifier=None, hint: tl.constexpr = None):
    """Copy PE `from_rank`'s copy of `src_ptr` into PE `to_rank`'s copy of
    `dst_ptr` (Iris's general copy): both pointers are valid in PE `cur_rank`'s
    address space (this PE), the load is from `from_rank` and the store to
    `to_rank`. Iris leaves a copy with neither rank the calling PE undefined;
    here every heap of the node is mapped in every process, so it works.

    Args:
        src_ptr: pointer(s) into this PE's heap; PE `from_rank`'s copy is read.
        dst_ptr: pointer(s) into this PE's heap; PE `to_rank`'s copy is written
            (as dst_ptr's element type).
        from_rank: the PE to read from.
        to_rank: the PE to write to.
        cur_rank: this PE (the PE both pointers belong to).
        heap_bases: SymmetricHeap.heap_bases().
        mask: where False, nothing is read or written.
        other: the value loaded where masked (never stored: the store has the
            same mask).
        load_cache_modifier: load's cache_modifier, for the read of `from_rank`.
        store_cache_modifier: store's cache_modifier, for the write of `to_rank`.
        hint: as translate's, applied to both translated pointers.

    Returns:
        None.

    Raises:
        Nothing at run time; a cache modifier Triton does not know fails to compile.
    """
    source = translate(src_ptr, cur_rank, from_rank, heap_bases, hint)
    data = tl.load(source, mask=mask, other=other, cache_modifier=load_cache_modifier)
    tl.store(translate(dst_ptr, cur_rank, to_rank, heap_bases, hint), data, mask=mask,
             cache_modifier=store_cache_modifier)


# -- atomics (each returns the values before the operation) ------------------------------
@triton.jit
def atomic_add(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None,
               hint: tl.constexpr = None):
    """Atomically add `val` to PE `to_rank`'s copy of `pointer`.

    Args:
        pointer: pointer(s) into this PE's heap.
        val: the value(s) to add.
        from_rank: this PE.
        to_rank: the PE whose memory is updated.
        heap_bases: SymmetricHeap.heap_bases().
        mask: where False, nothing is done.
        sem: "relaxed", "acquire", "release" or "acq_rel" (default).
        scope: "cta", "gpu" (default) or "sys" (use "sys" between PEs).
        hint: as translate's.

    Returns:
        The values before the addition.

    Raises:
        Nothing at run time.
    """
    return tl.atomic_add(translate(pointer, from_rank, to_rank, heap_bases, hint),
                         val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_sub(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None,
               hint: tl.constexpr = None):
    """Atomically subtract `val` from PE `to_rank`'s copy of `pointer`.

    Args:
        pointer, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as atomic_add.
        val: the value(s) to subtract.

    Returns:
        The values before the subtraction.

    Raises:
        Nothing at run time.
    """
    return tl.atomic_add(translate(pointer, from_rank, to_rank, heap_bases, hint),
                         -val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, sem=None, scope=None,
               hint: tl.constexpr = None):
    """Atomically set PE `to_rank`'s copy of `pointer` to `val` where it equals
    `cmp` (no mask, as tl.atomic_cas and Iris).

    Args:
        pointer: pointer(s) into this PE's heap.
        cmp: the value(s) expected.
        val: the new value(s).
        from_rank, to_rank, heap_bases, sem, scope, hint: as atomic_add.

    Returns:
        The values before the operation (equal to `cmp` where it swapped).

    Raises:
        Nothing at run time.
    """
    element = pointer.dtype.element_ty   # tl.atomic_cas wants cmp and val of that type
    return tl.atomic_cas(translate(pointer, from_rank, to_rank, heap_bases, hint),
                         tl.cast(cmp, element), tl.cast(val, element), sem=sem, scope=scope)


@triton.jit
def atomic_xchg(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None,
                hint: tl.constexpr = None):
    """Atomically replace PE `to_rank`'s copy of `pointer` with `val`.

    Args:
        pointer, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as atomic_add.
        val: the new value(s).

    Returns:
        The values before the exchange.

    Raises:
        Nothing at run time.
    """
    return tl.atomic_xchg(translate(pointer, from_rank, to_rank, heap_bases, hint),
                          val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_and(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None,
               hint: tl.constexpr = None):
    """Atomically ``&=`` `val` into PE `to_rank`'s copy of `pointer`.

    Args:
        pointer, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as atomic_add.
        val: the mask(s).

    Returns:
        The values before the operation.

    Raises:
        Nothing at run time.
    """
    return tl.atomic_and(translate(pointer, from_rank, to_rank, heap_bases, hint),
                         val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_or(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None,
              hint: tl.constexpr = None):
    """Atomically ``|=`` `val` into PE `to_rank`'s copy of `pointer`.

    Args:
        pointer, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as atomic_add.
        val: the bits to set.

    Returns:
        The values before the operation.

    Raises:
        Nothing at run time.
    """
    return tl.atomic_or(translate(pointer, from_rank, to_rank, heap_bases, hint),
                        val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_xor(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None,
               hint: tl.constexpr = None):
    """Atomically ``^=`` `val` into PE `to_rank`'s copy of `pointer`.

    Args:
        pointer, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as atomic_add.
        val: the bits to flip.

    Returns:
        The values before the operation.

    Raises:
        Nothing at run time.
    """
    return tl.atomic_xor(translate(pointer, from_rank, to_rank, heap_bases, hint),
                         val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_min(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None,
               hint: tl.constexpr = None):
    """Atomically lower PE `to_rank`'s copy of `pointer` to `val` where smaller.

    Args:
        pointer, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as atomic_add.
        val: the candidate value(s).

    Returns:
        The values before the operation.

    Raises:
        Nothing at run time.
    """
    return tl.atomic_min(translate(pointer, from_rank, to_rank, heap_bases, hint),
                         val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_max(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None,
               hint: tl.constexpr = None):
    """Atomically raise PE `to_rank`'s copy of `pointer` to `val` where larger.

    Args:
        pointer, from_rank, to_rank, heap_bases, mask, sem, scope, hint: as atomic_add.
        val: the candidate value(s).

    Returns:
        The values before the operation.

    Raises:
        Nothing at run time.
    """
    return tl.atomic_max(translate(pointer, from_rank, to_rank, heap_bases, hint),
                         val, mask=mask, sem=sem, scope=scope)


# -- signals ---------------------------------------------------------------------------
@triton.jit
def signal_set(sig_ptr, value, from_rank, to_rank, heap_bases):
    """Set the signal `sig_ptr` on PE `to_rank` to `value`, with release
    semantics at system scope: this program's earlier stores (to any PE) are
    visible to whoever observes the new value with acquire semantics.

    Args:
        sig_ptr: a pointer to an int32/int64/uint64 signal in this PE's heap.
        value: the new signal value.
        from_rank: this PE.
        to_rank: the PE whose signal is set.
        heap_bases: SymmetricHeap.heap_bases().

    Returns:
        The signal's value before.

    Raises:
        Nothing at run time.
    """
    target = translate(sig_ptr, from_rank, to_rank, heap_bases)
    return tl.atomic_xchg(target, value, sem="release", scope="sys")


@triton.jit
def signal_add(sig_ptr, value, from_rank, to_rank, heap_bases):
    """Add `value` to the signal `sig_ptr` on PE `to_rank`, with release
    semantics at system scope (as signal_set).

    Args:
        sig_ptr: a pointer to an int32/int64/uint64 signal in this PE's heap.
        value: the amount to add.
        from_rank: this PE.
        to_rank: the PE whose signal is updated.
        heap_bases: SymmetricHeap.heap_bases().

    Returns:
        The signal's value before.

    Raises:
        Nothing at run time.
    """
    target = translate(sig_ptr, from_rank, to_rank, heap_bases)
    return tl.atomic_add(target, value, sem="release", scope="sys")


@triton.jit
def _compare(current, value, cmp: tl.constexpr):
    if cmp == CMP_EQ:
        result = current == value
    elif cmp == CMP_NE:
        result = current != value
    elif cmp == CMP_GT:
        result = current > value
    elif cmp == CMP_GE:
        result = current >= value
    elif cmp == CMP_LT:
        result = current < value
    else:
        tl.static_assert(cmp == CMP_LE, "cmp must be one of CMP_EQ, CMP_NE, CMP_GT, CMP_GE, "
                                        "CMP_LT, CMP_LE")
        result = current <= value
    return result


@triton.jit
def signal_test(sig_ptr, cmp: tl.constexpr, value):
    """Whether this PE's signal compares `cmp` to `value` now, read with
    acquire semantics at system scope.

    Args:
        sig_ptr: a pointer to an int32/int64/uint64 signal in this PE's heap.
        cmp: CMP_EQ, CMP_NE, CMP_GT, CMP_GE, CMP_LT or CMP_LE (a tl.constexpr).
        value: the value to compare with.

    Returns:
        A boolean scalar.

    Raises:
        A compile-time error where `cmp` is not one of the CMP_* constants.
    """
    current = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
    return _compare(current, value, cmp)


@triton.jit
def signal_wait_until(sig_ptr, cmp: tl.constexpr, value, max_polls=0, status=None):
    """Wait until this PE's signal compares `cmp` to `value`, reading it with
    acquire semantics at system scope: the stores the signalling PE made before
    its release are visible once this returns.

    Args:
        sig_ptr: a pointer to an int32/int64/uint64 signal in this PE's heap.
        cmp: CMP_EQ, CMP_NE, CMP_GT, CMP_GE, CMP_LT or CMP_LE (a tl.constexpr).
        value: the value to compare with.
        max_polls: 0 (the default) waits for ever; otherwise at most this many
            reads, after which it returns although the comparison fails.
            Deadline(seconds).max_polls lasts about that long.
        status: None, or a pointer to an int32 status word (Deadline.status)
            that a wait which gave up sets to 1, for the host to raise from (a
            kernel cannot raise). Never cleared here.

    Returns:
        The last value read (satisfying the comparison unless `max_polls` ran out).

    Raises:
        A compile-time error where `cmp` is not one of the CMP_* constants.
    """
    current = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
    polls = tl.full((), 1, tl.int64)   # an int32 count would wrap before a long deadline's
    while (_compare(current, value, cmp) == 0) & ((max_polls == 0) | (polls < max_polls)):
        current = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
        polls += 1
    if status is not None:
        if _compare(current, value, cmp) == 0:
            tl.store(status, _TIMED_OUT)
    return current


# -- bounding a wait by time (host side) ------------------------------------------------
@triton.jit
def _poll_unset(sig_ptr, max_polls):
    signal_wait_until(sig_ptr, CMP_GE, 1, max_polls)


# device -> measured polls per second. Process state on purpose (issue 29 asked):
# the rate is the device's, as torch's device properties are, so every heap and
# Deadline on that device would measure the same number again, and measuring
# costs: 1.3 s under the interpreter (TRITON_INTERPRET=1, this 2-core machine;
# a second call: 12 us), tens of ms on a GPU. Per heap, that is 1.3 s more per
# heap for ccl, DeviceAllReduce and each Deadline in the interpreted tests.
_polls_per_second: dict = {}


def max_polls_for(seconds: float, device) -> int:
    """The `max_polls` that makes signal_wait_until give up after about
    `seconds` on `device` (a kernel has no clock that is the same on NVIDIA,
    AMD and the interpreter, so time is counted in polls). The polling rate
    is measured once per device: a wait on a signal that never comes, timed
    over at least 5 ms and at its fastest of three runs (a process sharing
    the GPU can hold it for a time slice during one run: measured so, on one
    H200 shared by two PEs, a 0.5 s deadline gave up after 0.02 s).

    Args:
        seconds: how long a wait may last, > 0.
        device: a torch device (or its name); "cpu" for the interpreter.

    Returns:
        An int >= 1 for signal_wait_until's max_polls.

    Raises:
        ValueError: seconds is not > 0.
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    rate = _polls_per_second.get(device)
    if rate is None:
        scratch = torch.zeros(1, dtype=torch.int64, device=device)
        polls = 200 if device.type == "cpu" else 20000

        def timed(count):
            start = time.perf_counter()
            _poll_unset[(1,)](scratch, count)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - start

        timed(1)   # compiles outside the timing
        elapsed = timed(polls)
        while elapsed < 0.005 and polls < 1 << 26:
            polls *= 4
            elapsed = timed(polls)
        elapsed = min(elapsed, timed(polls), timed(polls))
        rate = _polls_per_second[device] = polls / max(elapsed, 1e-6)
    return max(1, int(seconds * rate))


class Deadline:
    """How long device-side waits may last, and the word they report giving up in.

        deadline = sv.Deadline(5, heap.device)          # seconds; default SHMEMVM_TIMEOUT
        consumer[grid](..., deadline.max_polls, deadline.status)
        #   in the kernel: sv.signal_wait_until(sig, sv.CMP_EQ, v, max_polls, status)
        deadline.synchronize()                          # PeerTimeoutError where a wait gave up

    Time is counted in polls (max_polls_for: no clock is common to NVIDIA, AMD and
    the interpreter), from when a wait starts on the device, not from the launch.
    A wait lasts about the time asked for, longer where many programs poll at
    once (each poll is slower than a lone program's, which was measured). On
    CUDA the status word is in pinned host memory, so `timed_out` and check()
    read it without a device synchronisation (DeviceAllReduce does the same).

    Args:
        timeout: seconds a wait may last, > 0 (default SHMEMVM_TIMEOUT).
        device: where the kernels run: the heap's device ("cpu" for the
            interpreter). Default: "cpu" where these functions are interpreted
            (TRITON_INTERPRET=1), else the current CUDA device.

    Raises:
        ValueError: timeout is not > 0.
    """

    def __init__(self, timeout: float | None = None, device=None):
        self.timeout = float(setting("SHMEMVM_TIMEOUT", timeout))
        if not self.timeout > 0:
            raise ValueError(f"Deadline: timeout must be > 0 seconds, got {timeout!r} "
                             f"(SHMEMVM_TIMEOUT={setting('SHMEMVM_TIMEOUT')!r})")
        if device is None:
            device = "cpu" if type(signal_wait_until).__name__ == "InterpretedFunction" else "cuda"
        self.device = torch.device(device)
        self.max_polls = max_polls_for(self.timeout, self.device)
        #: the int32 word a wait that gave up sets to 1; pass it to the kernels
        self.status = torch.zeros(1, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        self._word = ctypes.c_int32.from_address(self.status.data_ptr())

    @property
    def timed_out(self) -> bool:
        """Whether a wait given this deadline gave up (as far as finished work shows)."""
        return bool(self._word.value)

    def check(self) -> None:
        """Raise PeerTimeoutError where a wait given this deadline gave up; call
        after its kernels finished (synchronize() waits for them first)."""
        if self._word.value:
            raise PeerTimeoutError(
                f"a device-side wait gave up after about {self.timeout:g} s: the PE it waited "
                f"for did not signal in time (a Deadline's timeout, default SHMEMVM_TIMEOUT); "
                f"the kernel went on past the wait. reset() the deadline to use it again")

    def synchronize(self) -> None:
        """Wait for the device's queued work, then check()."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.check()

    def reset(self) -> None:
        """Clear the status word (after a timeout was handled)."""
        self._word.value = 0
