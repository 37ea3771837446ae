"""Collective allocation: malloc, empty, zeros (calloc), align, malloc_with_hints,
realloc, free, and the heap's memory in numbers (heap_info, trim).

Every PE runs the same deterministic allocator (memory/buddy.py), so the same
sequence of collective calls gives the same offsets everywhere: each call
only agrees that every PE made it with the same arguments (one small
allreduce, Core.calls.agree), then allocates locally; only segments a call
creates are shared with the node's PEs (core/sharing.py). A block is reused
only when it was freed on every PE and nothing on any PE views it any more
(memory/ownership.py).

allocate() and release() are the entry points both faces share: an
allocation whose request (size, alignment, hints, fill) the face works out
inside the call's agreement, so that a bad argument on one PE raises at that
call on every PE, and a free of whatever the face finds to free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import _args
from ..agreement.protocol import Call, Phase
from ..core.state import Core
from ..errors import ShmemError
from .info import HeapInfo

#: malloc_with_hints' hints (OpenSHMEM 1.5 values): checked and agreed on, no effect yet
MALLOC_ATOMICS_REMOTE = 1
MALLOC_SIGNAL_REMOTE = 2


@dataclass
class Request:
    """What an allocation asks for, as a face works it out (allocate())."""
    #: bytes (>= 0)
    nbytes: int
    #: None, or a power of two the address must be a multiple of
    alignment: int | None = None
    #: malloc_with_hints' hints, checked and agreed on (None: no hints given)
    hints: int | None = None
    #: fills this PE's copy (a uint8 tensor of `nbytes`) before any PE returns, or None
    fill: Callable[[torch.Tensor], None] | None = None
    #: more arguments every PE must pass alike (the face's shape, dtype, ...), compared
    key: tuple = ()
    #: _checked()'s answer, kept by allocate() where it asked nothing of the heap (no
    #: alignment): a face that gives the same Request again is not checked twice
    checked: tuple | None = None


def _checked(heap: Core, request: Request, what: str) -> tuple:
    """The agreed arguments of `request`, after checking its size, alignment and hints."""
    nbytes = _args.nbytes(request.nbytes, f"{what}: nbytes")
    alignment = request.alignment
    if alignment is not None:
        alignment = _args.integer(alignment, f"{what}: alignment")
        if alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"{what}: alignment must be a power of two, got {alignment}")
        if alignment > heap.identity.granularity:  # the same limit on every PE
            raise ValueError(f"{what}: alignment {alignment} exceeds the "
                             f"{heap.identity.backend_name} "
                             f"backend's granularity {heap.identity.granularity}, the "
                             f"alignment of the heap's base on every PE and so the largest "
                             f"this heap can give")
    hints = _args.flags(request.hints or 0, {"MALLOC_ATOMICS_REMOTE": MALLOC_ATOMICS_REMOTE,
                                        "MALLOC_SIGNAL_REMOTE": MALLOC_SIGNAL_REMOTE},
                        f"{what}: hints")
    return nbytes, alignment or 0, hints, request.fill is not None, request.key


def allocate(heap: Core, request: Callable[[], Request], text: str | tuple, *,
             phase: Phase = Phase.ALLOCATE, what: str = "alloc",
             memo: tuple | None = None) -> torch.Tensor:
    """Symmetric memory as a 1-D uint8 tensor, as `request()` asks for it
    (collective): both faces' one allocation with alignment, hints and a fill.

    `request()` runs inside the call's agreement: where it raises TypeError or
    ValueError (a bad argument of the face's), every PE raises at this call
    (that error where every PE has it, else SymmetryError naming it), and
    nothing is allocated. A fill runs on every PE before any PE returns.

    Args:
        request: makes the Request from the face's arguments, or raises.
        text: the call as messages name it (or (format, *values): made into text
            only where a message needs it).
        phase: the call's phase (the agreement compares it too).
        what: the routine's name, for messages.
        memo: None, or the face's arguments where they alone make request()
            and `text` (hashable, equal only where those are): a repeated call
            then takes the quick step kept under it (Memory.remembered_allocation),
            neither forming the call nor checking the request again.

    Returns:
        A uint8 tensor of request().nbytes bytes, at the same heap offset on
        every PE, freeing itself once dropped on every PE.

    Raises:
        As malloc; ValueError for an alignment that is not a power of two or
        exceeds the backend's granularity, or hints other than MALLOC_*.
    """
    if memo is not None:
        memo = (phase, memo)
        tensor = _repeated(heap, memo)
        if tensor is not None:
            return tensor
    call = Call(phase, text=text)
    made = None
    try:
        made = request()
        args = made.checked
        if args is None:
            args = _checked(heap, made, what)
            if made.alignment is None:
                made.checked = args
        call.args = args
    except (TypeError, ValueError) as exc:
        call.error = exc
    if call.error is not None:
        return heap.memory.allocate(call, 0, (0,), torch.uint8)   # (raises every PE's error)
    assert made is not None
    nbytes, alignment = call.args[:2]   # (hints: checked and agreed; no effect yet)
    return heap.memory.allocate(call, max(nbytes, alignment), (nbytes,), torch.uint8, made.fill,
                                memo)


def _repeated(heap: Core, memo: tuple) -> torch.Tensor | None:
    """The tensor of an allocation a face repeats, made by the quick step that
    allocate() kept under `memo` (the face's arguments, which make the same
    call every time); None where there is none, or where it did nothing (a
    release or an operation pending, another thread holding the lock): the
    face then forms its call, as it did the first time."""
    quick = heap.memory.remembered_allocation(memo)
    return quick() if quick is not None else None


def malloc(heap: Core, nbytes: int) -> torch.Tensor:
    """`nbytes` of symmetric memory as a uint8 tensor (collective).

    Args:
        nbytes: the size in bytes, an integer >= 0 (NumPy and other integer
            types too); the same on every PE.

    Returns:
        A 1-D uint8 CPU or device tensor of `nbytes` elements, at the same
        heap offset on every PE. It frees itself once dropped on every PE.

    Raises:
        SymmetryError: the PEs made different calls or passed different
            arguments (every PE raises it; nothing was done).
        HeapExhaustedError: the heap cannot hold the request (it names the
            request, the usage and SHMEMVM_HEAP_SIZE).
        PeerTimeoutError: a PE did not join within the heap's timeout
            (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
        ShmemError: the heap is finalized.
        TypeError, ValueError: `nbytes` is not an integer >= 0.
    """
    text = ("malloc({!r})", nbytes)   # made into text only if a message needs it
    if type(nbytes) is not int or nbytes < 0:
        return _empty(heap, (nbytes,), torch.uint8, text, Phase.MALLOC)  # checked (or rejected) there
    memo = ("malloc", nbytes)
    tensor = _repeated(heap, memo)
    if tensor is not None:
        return tensor
    # empty((nbytes,), torch.uint8) with tensor_nbytes' answer for a plain int, inline
    dims = (nbytes,)
    call = Call(Phase.MALLOC, (nbytes, torch.uint8, dims), text, None, True)
    return heap.memory.allocate(call, nbytes, dims, torch.uint8, None, memo)


def empty(heap: Core, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised symmetric tensor (collective).

    Args:
        shape: an int or a sequence of ints >= 0 (at most 64 dimensions).
        dtype: a torch.dtype (default float32).

    Returns:
        A contiguous tensor of that shape and dtype on the heap's device, at
        the same heap offset on every PE; its contents are undefined.

    Raises:
        SymmetryError: the PEs made different calls or passed different
            arguments (every PE raises it; nothing was done).
        HeapExhaustedError: the heap cannot hold the request (it names the
            request, the usage and SHMEMVM_HEAP_SIZE).
        PeerTimeoutError: a PE did not join within the heap's timeout
            (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
        ShmemError: the heap is finalized.
        TypeError, ValueError: a bad shape or a dtype symmetric memory
            does not support.
    """
    # a plain shape and dtype make the same call each time: its quick step is kept
    memo = ("empty", shape, dtype) if type(dtype) is torch.dtype and (
        type(shape) is int or type(shape) is tuple and all(type(d) is int for d in shape)) \
        else None
    if memo is not None:
        tensor = _repeated(heap, memo)
        if tensor is not None:
            return tensor
    # the call's text is made only if a message needs it (Call)
    return _empty(heap, shape, dtype, ("empty({!r}, {})", shape, dtype), Phase.MALLOC,
                  memo=memo)


def _empty(heap: Core, shape, dtype, text, phase: Phase,
           fill: Callable[[torch.Tensor], object] | None = None,
           memo: tuple | None = None) -> torch.Tensor:
    """empty() as the call `phase` with the message text `text` (malloc, zeros),
    filled by `fill` on every PE before any returns (Core.memory.allocate),
    its quick step kept under `memo` (_repeated())."""
    try:
        dims, nbytes = _args.tensor_nbytes(shape, dtype)
    except (TypeError, ValueError) as exc:
        return heap.memory.allocate(Call(phase, (), text, exc), 0, (0,), torch.uint8)  # (raises)
    call = Call(phase, (nbytes, dtype, dims), text, None, True)  # exact: ints, a dtype
    return heap.memory.allocate(call, nbytes, dims, dtype, fill, memo)


def zeros(heap: Core, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zero-filled symmetric tensor (collective, like shmem_calloc). It is
    zero on every PE before any PE returns, so peers may write at once.

    Args:
        shape: an int or a sequence of ints >= 0 (at most 64 dimensions).
        dtype: a torch.dtype (default float32).

    Returns:
        A contiguous zero-filled tensor of that shape and dtype, at the same
        heap offset on every PE.

    Raises:
        SymmetryError: the PEs made different calls or passed different
            arguments (every PE raises it; nothing was done).
        HeapExhaustedError: the heap cannot hold the request (it names the
            request, the usage and SHMEMVM_HEAP_SIZE).
        PeerTimeoutError: a PE did not join within the heap's timeout
            (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
        ShmemError: the heap is finalized.
        TypeError, ValueError: a bad shape or a dtype symmetric memory
            does not support.
    """
    # the text is made only if a message needs it (Call)
    return _empty(heap, shape, dtype, ("zeros({!r}, {})", shape, dtype), Phase.ZEROS, _zero)


def _zero(raw: torch.Tensor) -> None:
    """zeros()' fill (Core.memory.allocate: the tensor's bytes)."""
    raw.zero_()


def align(heap: Core, alignment: int, nbytes: int) -> torch.Tensor:
    """`nbytes` of symmetric memory whose address is a multiple of
    `alignment` on every PE (collective, shmem_align).

    Blocks of 2**k bytes lie at multiples of 2**k from the heap's base, so an
    alignment up to the block's size costs nothing; a larger one takes a
    block of `alignment` bytes (the rest of it is unused). The base is
    aligned to the backend's granularity (heap_info()'s backend; 2 MiB on
    CUDA) and no more on every PE, so that is the largest alignment.

    Args:
        alignment: a power of two (bytes), the same on every PE.
        nbytes: the size in bytes, an integer >= 0, the same on every PE.

    Returns:
        A 1-D uint8 tensor of `nbytes` elements at the same heap offset on
        every PE, with data_ptr() % alignment == 0. It frees itself once
        dropped on every PE, or with free().

    Raises:
        TypeError: `alignment` or `nbytes` is not an integer.
        ValueError: `alignment` is not a power of two or exceeds the
            backend's granularity, or `nbytes` < 0.
        SymmetryError: the PEs made different calls or passed different
            arguments (every PE raises it; nothing was done).
        HeapExhaustedError: the heap cannot hold the aligned block.
        PeerTimeoutError: a PE did not join within the heap's timeout.
        ShmemError: the heap is finalized.
    """
    return allocate(heap, lambda: Request(nbytes, alignment=alignment),
                    f"align({alignment!r}, {nbytes!r})", phase=Phase.ALIGN, what="align")


def malloc_with_hints(heap: Core, nbytes: int, hints: int = 0) -> torch.Tensor:
    """malloc() with OpenSHMEM 1.5's usage hints (collective,
    shmem_malloc_with_hints). The hints are checked, agreed on (part of what
    every PE must pass alike) and recorded with the block, but change nothing
    yet: every block already suits atomics and signals, which all go through
    the heap's MPI window.

    Args:
        nbytes: the size in bytes, an integer >= 0, the same on every PE.
        hints: 0, or an OR of shmemvm.MALLOC_ATOMICS_REMOTE (1) and
            MALLOC_SIGNAL_REMOTE (2); the same on every PE.

    Returns:
        A 1-D uint8 tensor of `nbytes` elements, as malloc() returns.

    Raises:
        TypeError: `nbytes` or `hints` is not an integer.
        ValueError: `nbytes` < 0 or `hints` has bits other than those two.
        SymmetryError: the PEs made different calls or passed different
            arguments (hints included; every PE raises it).
        HeapExhaustedError: the heap cannot hold the request.
        PeerTimeoutError: a PE did not join within the heap's timeout.
        ShmemError: the heap is finalized.
    """
    return allocate(heap, lambda: Request(nbytes, hints=hints),
                    f"malloc_with_hints({nbytes!r}, {hints!r})", phase=Phase.MALLOC_WITH_HINTS,
                    what="malloc_with_hints")


def free(heap: Core, tensor: torch.Tensor) -> None:
    """Free a symmetric tensor (collective). `tensor` itself becomes empty;
    views of it made before (slices, ptr() views, on any PE) keep the old
    memory and data, but are no longer symmetric tensors; the block is
    reused only once all of them are gone (heap_info()'s deferred count).

    This PE's outstanding put/get/nbi operations are completed first, on
    every context (the default one and every Ctx): nothing may still be in
    flight into memory that is released.

    Args:
        tensor: a tensor from this heap (malloc/empty/zeros/realloc), the
            same one on every PE.

    Returns:
        None.

    Raises:
        NotSymmetricError: `tensor` is not a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        TypeError: `tensor` is not a torch.Tensor.
        SymmetryError: the PEs freed different tensors (nothing was freed).
        PeerTimeoutError: a PE did not join within the heap's timeout.
    """
    if not heap.memory.free_tensor(tensor):   # (one call where nothing is unusual)
        release(heap, lambda: tensor, "free(tensor)")


def release(heap: Core, find: Callable[[], torch.Tensor], text: str, *,
            own: bool = False, memory: object = None, array_type: type | None = None) -> None:
    """free() of the tensor `find()` gives (collective): both faces' one free.
    find() runs inside the call's agreement: where it raises TypeError,
    ValueError or NotSymmetricError (not something this heap allocated, a slice
    that does not start an allocation, freed already: FreedTensorError), every
    PE raises at this call and nothing is freed. With `own`, find() gives the
    face's own tensor of a whole allocation, which it keeps while its arrays
    live (the NumPy face's): freed as it is, not emptied; `memory`, what find()
    looks at (a memoryview, or an array of the face's `array_type`), is first
    offered to the core's one-call free of it."""
    if own and memory is not None and heap.memory.free_memory(memory, array_type):
        return
    heap.memory.free(find, text, own)


def realloc(heap: Core, tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A symmetric tensor of `nbytes` holding `tensor`'s leading bytes, as a
    1-D tensor of its dtype; `tensor` is freed (collective).

    Args:
        tensor: a live tensor of this heap, the same one on every PE.
        nbytes: the new size in bytes, an integer (NumPy integers too) that
            is a multiple of the element size of tensor's dtype.

    Returns:
        A 1-D tensor of nbytes // element size elements of tensor's dtype;
        at the same place where it fits and nothing else views the old
        block on any PE. The old tensor becomes empty, as with free().

    Raises:
        SymmetryError: the PEs made different calls or passed different
            arguments (every PE raises it; nothing was done).
        HeapExhaustedError: the heap cannot hold the request (it names the
            request, the usage and SHMEMVM_HEAP_SIZE).
        PeerTimeoutError: a PE did not join within the heap's timeout
            (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
        ShmemError: the heap is finalized.
        NotSymmetricError: `tensor` is not a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        TypeError, ValueError: `nbytes` is not an integer, is negative or
            not a multiple of the element size.
    """
    return heap.memory.reallocate(tensor, nbytes)


def heap_info(heap: Core) -> HeapInfo:
    """This PE's heap in numbers (local, not collective).

    Returns:
        A HeapInfo (a TypedDict, openshmem/info.py): heap_size (the physical
        budget), chunk (allocations below it are carved from segments of that
        size: SHMEMVM_CHUNK_SIZE), used
        (bytes in blocks), requested (bytes asked for), mapped (physical
        bytes backing the heap), cached (mapped bytes of freed segments kept for reuse), free
        (bytes that can still be allocated), live_allocations, segments,
        anchor (bytes of this PE's anchor, outside the heap size:
        SHMEMVM_ANCHOR), and pe, n_pes, backend, device, node_pes (the
        PEs of this node).

    Raises:
        ShmemError: the heap is finalized (a heap broken by a timeout still
            reports).
    """
    if heap.calls.closed:  # stats of released memory would mislead; a broken heap still reports
        raise ShmemError("this symmetric heap is finalized; call init() again for a new one")
    return HeapInfo(**heap.memory.stats(), pe=heap.identity.my_pe, n_pes=heap.identity.n_pes,
                    backend=heap.identity.backend_name, device=str(heap.identity.device),
                    node_pes=list(heap.identity.node_pes),
                    anchor=heap.identity.anchor_size)


def trim(heap: Core) -> int:
    """Give back cached physical memory now (collective).

    Freed segments stay mapped as a cache for reuse; trim() releases them
    on every PE (peers drop their mappings of them too).

    Returns:
        The number of bytes released on this PE (the same on every PE).

    Raises:
        SymmetryError: some PE is in another collective call.
        PeerTimeoutError: a PE did not arrive within the heap's timeout.
        ShmemError: the heap is finalized, or unmapping failed on some PE
            (every PE raises it; the segments are released everywhere,
            and the heap stays usable).
    """
    return heap.memory.trim()



calloc = zeros
