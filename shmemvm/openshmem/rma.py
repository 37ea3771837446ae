"""One-sided access: put, get, their non-blocking forms, ptr, and their
completion (quiet, fence).

How a copy reaches PE `pe` is the heap's route to it (transport/route.py):
itself, a copy through a node peer's mapping (after checking that the memory
mapped there is the block's, generation included), or the MPI window
(transport/offnode.py). A non-blocking copy is recorded in the completion
tracker of the context that issued it (transport/completion.py), which its
quiet() completes; the module functions use the heap's default context, a
Ctx its own (contexts.py calls transfer() with its tracker).
"""

from __future__ import annotations

import torch

from .. import native
from ..core.state import Context, Core
from ..errors import NotSymmetricError
from ..transport.completion import CompletionTracker


def ptr(heap: Core, tensor: torch.Tensor, pe: int) -> torch.Tensor | None:
    """`tensor` as it lies on PE `pe`, directly addressable from here; None
    where `pe` is not reachable by loads and stores (another node).

    Args:
        tensor: a symmetric tensor of this heap, or a view of one.
        pe: the PE whose copy is wanted (this PE: `tensor` itself).

    Returns:
        A tensor with tensor's shape, strides and dtype over PE `pe`'s
        memory (loads and stores, kernels included), or None for a PE on
        another node.

    Raises:
        TypeError: `pe` is not an integer.
        ValueError: `pe` is out of range.
        NotSymmetricError: `tensor` is not a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
    """
    target = heap.where.locate(tensor, heap.where.check_pe(pe), "tensor")
    if target.own:
        return tensor
    if target.address is None:   # a PE only MPI reaches
        return None
    # A live block cannot be released by a collective in another thread
    # (nothing here is dead), and hold() checks it is still live.
    where = heap.where
    return where.hold(target.block, target.block_view(tensor, where.storage_offset(tensor)))


def put(ctx: Context, dest: torch.Tensor, source: torch.Tensor, pe: int) -> None:
    """Copy `source` (any tensor) into symmetric `dest` on PE `pe`.

    Args:
        dest: a symmetric tensor of this heap, or a view of one (any
            strides); its copy on PE `pe` is written.
        source: any tensor (any device) with dest's dtype and number of
            elements; it is read as dest's shape.
        pe: the PE to write to (this PE too).

    Returns:
        None, once `source` may be reused. On the node the copy is done
        (device heaps: on the current stream); off the node it is complete
        at PE `pe`. barrier_all() makes it visible to `pe`'s reads.

    Raises:
        TypeError: the dtypes differ.
        ValueError: the numbers of elements differ.
        TypeError: `pe` is not an integer, or a tensor is not a torch.Tensor.
        ValueError: `pe` is out of range.
        NotSymmetricError: the symmetric tensor is not a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        UnsupportedError: `pe` is on another node and the heap has no MPI
            window, or holds device memory that MPI is not given.
        PeerTimeoutError: `pe` is on another node and did not complete the
            transfer within the heap's timeout (SHMEMVM_TIMEOUT); the heap
            is unusable afterwards.
    """
    pe = ctx.world_pe(pe)
    if not _copied_by_cpu(ctx.core, dest, source, pe, True):
        transfer(ctx.core, dest, source, pe, writing=True, tracker=None)


def get(ctx: Context, dest: torch.Tensor, source: torch.Tensor, pe: int) -> None:
    """Copy symmetric `source` on PE `pe` into `dest` (any tensor).

    Args:
        dest: any tensor (any device) with source's dtype and number of
            elements; written as source's shape.
        source: a symmetric tensor of this heap, or a view of one; its copy
            on PE `pe` is read.
        pe: the PE to read from (this PE too).

    Returns:
        None, once the data is in `dest` (device heaps: the copy ran on the
        current stream and is complete).

    Raises:
        TypeError: the dtypes differ.
        ValueError: the numbers of elements differ.
        TypeError: `pe` is not an integer, or a tensor is not a torch.Tensor.
        ValueError: `pe` is out of range.
        NotSymmetricError: the symmetric tensor is not a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        UnsupportedError: `pe` is on another node and the heap has no MPI
            window, or holds device memory that MPI is not given.
        PeerTimeoutError: `pe` is on another node and did not complete the
            transfer within the heap's timeout (SHMEMVM_TIMEOUT); the heap
            is unusable afterwards.
    """
    pe = ctx.world_pe(pe)
    if not _copied_by_cpu(ctx.core, source, dest, pe, False):
        transfer(ctx.core, dest, source, pe, writing=False, tracker=None)


def put_nbi(ctx: Context, dest: torch.Tensor, source: torch.Tensor, pe: int) -> None:
    """put() that returns once the copy is issued; quiet() completes it (the
    default context's quiet(): a Ctx's put_nbi is completed by its own).

    Args:
        dest: a symmetric tensor of this heap (or a view of one).
        source: any tensor with dest's dtype and number of elements; it must
            not change until quiet() returns.
        pe: the PE to write to.

    Returns:
        None; the copy may still be running (device heaps on the node; MPI
        off the node, where `pe`'s answer is awaited at quiet()).

    Raises:
        As put(); a PE that does not answer raises PeerTimeoutError at quiet().
    """
    transfer(ctx.core, dest, source, ctx.world_pe(pe), writing=True, tracker=ctx.tracker)


def get_nbi(ctx: Context, dest: torch.Tensor, source: torch.Tensor, pe: int) -> None:
    """get() that returns once the copy is issued; quiet() completes it (the
    default context's quiet(): a Ctx's get_nbi is completed by its own).

    Args:
        dest: any tensor with source's dtype and number of elements; read it
            only after quiet().
        source: a symmetric tensor of this heap (or a view of one).
        pe: the PE to read from.

    Returns:
        None; the copy may still be running (device heaps on the node; MPI
        off the node).

    Raises:
        As get(); a PE that does not answer raises PeerTimeoutError at quiet().
    """
    transfer(ctx.core, dest, source, ctx.world_pe(pe), writing=False, tracker=ctx.tracker)


def quiet(heap: Core) -> None:
    """Complete every put/get/nbi atomic issued by this PE on the default
    context (the heap's own calls), as shmem_quiet does: operations issued
    through a Ctx are completed by that context's quiet() (or its destroy(),
    or free/realloc/finalize, which complete every context's).

    Returns:
        None, once they are all complete (nbi atomics' fetched values stored).

    Raises:
        ShmemError: the heap is finalized.
        PeerTimeoutError: a PE did not answer an nbi operation within the
            heap's timeout; the heap is unusable afterwards.
    """
    if heap.calls.closed:
        heap.calls.check_usable()  # raises: finalized (its MPI window is gone)
    heap.tracker.quiet()


def fence(heap: Core) -> None:
    """Order this PE's puts to each PE on the default context. Copies on the
    node already complete in issue order (one stream); off the node the
    outstanding nbi operations are completed.

    Returns:
        None.

    Raises:
        ShmemError: the heap is finalized.
        PeerTimeoutError: a PE did not answer within the heap's timeout.
    """
    if heap.calls.closed:
        heap.calls.check_usable()  # raises: finalized (its MPI window is gone)
    heap.tracker.fence()


def cpu_address(heap: Core, allocation: torch.Tensor, address: int, pe: int) -> int | None:
    """Where the byte at `address` of `allocation` (the tensor of a whole block,
    as the NumPy face keeps it; `address` is inside it) lies for PE `pe`, for
    a copy by the CPU itself: the located target's cpu_address (transport/
    target.py). None where the CPU cannot copy there, so that the caller takes
    transfer(): a device heap, a PE on another node, a heap without the
    compiled piece, or a block not live here (transfer() then raises, with its
    own words). `pe` is a checked PE number."""
    target = heap.where.locate_in(allocation, address, pe)
    return None if target is None else target.cpu_address


# -- the one copy path ------------------------------------------------------------------
def transfer(heap: Core, dest: torch.Tensor, source: torch.Tensor, pe: int, *,
             writing: bool, tracker: CompletionTracker | None) -> None:
    """put (`writing`: symmetric `dest` on PE `pe` <- any `source`) or get (any
    `dest` <- symmetric `source` on PE `pe`); `pe` is a checked PE number of the
    heap. Blocking, or left for `tracker`'s quiet() to complete where `tracker`
    is given (the nbi forms)."""
    if writing:
        target = heap.where.locate(dest, pe, "destination")
        source = _source_for(source, dest, "put")
        local, remote = source, dest
    else:
        target = heap.where.locate(source, pe, "source")
        _check_get_dest(dest, source)
        try:
            local = dest if dest.shape == source.shape else dest.view(source.shape)
        except RuntimeError:  # dest's strides cannot take source's shape: stage it
            staged = torch.empty(source.shape, dtype=dest.dtype, device=dest.device)
            transfer(heap, staged, source, pe, writing=False, tracker=None)
            dest.copy_(staged.view(dest.shape))
            return
        remote = source
    if target.address is None:   # a PE only MPI reaches: through the window
        window = heap.where.window_for(
            f"{'put to' if writing else 'get from'} PE {pe} on another node")
        if writing:
            window.put(remote, local, pe, target.block, tracker)
        else:
            window.get(local, remote, pe, target.block, tracker)
        return
    if tracker is None and target.cpu_address is not None and _cpu_copy(
            target, remote, local, writing, _cpu_copyable(remote, local)):
        return
    if target.mapping is not None:   # a node peer's: copied through its mapping
        remote = target.copy_view(remote)
    dst, src = (remote, local) if writing else (local, remote)
    if _overlap(dst, src):
        # memmove's meaning, as the one-memmove path gives it: the source as it was
        # before the copy. torch's copy_ refuses a partial overlap within one storage
        # (a put to self), and cannot see one between two storages over the same
        # memory (a node peer's copy and a ptr() view of it), where it copied forward
        src = src.clone()
    if tracker is None:
        heap.where.copy(dst, src)
    else:
        tracker.copy(dst, src)


def _copied_by_cpu(heap: Core, symmetric, local, pe: int, writing: bool) -> bool:
    """A blocking put or get in one pass, where it is one: exact torch.Tensors of
    one dtype and shape, a copy _cpu_copyable() takes, and the symmetric one on
    a target the CPU copies to, located in one lookup (Where.located): transfer()'s
    own copy (_cpu_copy), less its steps that these checks stand for (put 8 B:
    about 1 us of 3 on the 2-core machine). False (nothing done) for anything
    else, and for anything wrong, which transfer() then names. `pe` is a
    checked PE number."""
    if type(symmetric) is not torch.Tensor or type(local) is not torch.Tensor \
            or symmetric.dtype != local.dtype or symmetric.shape != local.shape:
        return False
    nbytes = _cpu_copyable(symmetric, local)
    if not nbytes:
        return False
    target = heap.where.located(symmetric, pe)
    return target is not None and _cpu_copy(target, symmetric, local, writing, nbytes)


def _cpu_copy(target, symmetric: torch.Tensor, local: torch.Tensor, writing: bool,
              nbytes: int) -> bool:
    """The `nbytes` that _cpu_copyable() gave for `symmetric` (on `target`) and
    `local` copied as one memmove between the PE's copy and `local` (overlap is
    fine), where the CPU copies to that target; False (nothing done) elsewhere,
    or for no bytes."""
    there = target.cpu_address
    if not nbytes or there is None:
        return False
    here = local.data_ptr()
    if writing:
        native.copy(there, here, nbytes)
    else:
        native.copy(here, there, nbytes)
    return True


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes [start, stop) that `tensor`'s elements lie in (torch's strides
    are never negative)."""
    start = tensor.data_ptr()
    if tensor.is_contiguous():
        return start, start + tensor.nbytes
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return start, start + (last + 1) * tensor.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of this process share a byte (not the same view: a
    copy onto itself is no copy at all). Interleaved views count as overlapping:
    a clone too many, never a wrong copy."""
    (a0, a1), (b0, b1) = _span(a), _span(b)
    if not (a0 < b1 and b0 < a1):
        return False
    return not (a0 == b0 and a.stride() == b.stride() and a.shape == b.shape)


#: copies below this many bytes on the host are one native copy: torch's copy_ costs
#: more up to a few MiB (0.78-0.90 of OSHMEM's bandwidth at 64 KiB-1 MiB against
#: 0.91-1.02), and above it splits a copy over its threads, which may then win
#: where it has many. With two threads or fewer it does not: on the 2-core machine,
#: a put to a node peer of 4 MiB took 36-42 GB/s through copy_ against 50 as one
#: copy, of 16 MiB 17-28 against 36-38 (docs/performance.md), so there is no cap there
CPU_COPY_MAX = 4 << 20 if torch.get_num_threads() > 2 else 1 << 62


def _cpu_copyable(symmetric: torch.Tensor, local: torch.Tensor) -> int:
    """The bytes a blocking copy between `symmetric` (on a target the CPU reaches:
    its cpu_address, host memory with the compiled piece) and `local` (transfer()
    made them of one dtype and shape) moves as one memmove: whole contiguous
    CPU tensors (not bool), neither a lazy conjugate nor a negative view, where
    that pays (CPU_COPY_MAX); 0 otherwise. What it copies, the general path
    (torch's copy_) copies alike, byte for byte
    (tests/mpi/reliability/test_differential.py)."""
    nbytes = symmetric.nbytes
    # (is_cpu, not device.type: a torch.device made per call costs 0.4 us, the rest 0.05)
    if not (0 < nbytes < CPU_COPY_MAX and local.is_cpu and symmetric.is_contiguous()
            and local.is_contiguous()):
        return 0
    # lazy views: a memmove moves the bits, while copy_ reads or writes them conjugated
    # or negated (x.conj(), x._neg_view()); copy_ gets them right. And bool: copy_
    # stores any nonzero byte as 1, a memmove as it is
    # (transfer() made them of one dtype; a real dtype has no conjugate bit to ask for)
    dtype = local.dtype
    if (local.is_neg() or symmetric.is_neg() or dtype is torch.bool
            or dtype.is_complex and (local.is_conj() or symmetric.is_conj())):
        return 0
    return nbytes


def _source_for(source: torch.Tensor, dest: torch.Tensor, op: str) -> torch.Tensor:
    """put's `source` as dest's shape, or a clear error."""
    if not isinstance(source, torch.Tensor):
        raise TypeError(f"{op}: source must be a torch.Tensor, got {type(source).__name__}")
    if source.dtype != dest.dtype:
        raise TypeError(f"{op}: source dtype {source.dtype} differs from destination dtype "
                        f"{dest.dtype}; convert with .to({dest.dtype}) first")
    shape = dest.shape
    if source.shape == shape:  # the common case; the same shape has the same numel
        return source
    if source.numel() != dest.numel():
        raise ValueError(f"{op}: source has {source.numel()} elements, destination "
                         f"{dest.numel()}; slice them to the same length")
    return source.reshape(shape)


def _check_get_dest(dest: torch.Tensor, source: torch.Tensor) -> None:
    """get's checks, named the way round they are: `dest` (any tensor) receives
    symmetric `source`."""
    if not isinstance(dest, torch.Tensor):
        raise TypeError(f"get: dest must be a torch.Tensor, got {type(dest).__name__}")
    if dest.dtype != source.dtype:
        raise TypeError(f"get: destination dtype {dest.dtype} differs from source dtype "
                        f"{source.dtype}; get into a {source.dtype} tensor and convert "
                        f"it afterwards")
    if dest.numel() != source.numel():
        raise ValueError(f"get: source has {source.numel()} elements, destination "
                         f"{dest.numel()}; slice them to the same length")
