"""Collectives on symmetric tensors: broadcast, fcollect, reduce, alltoall.

Each call is collective over the heap's communicator and starts with the
heap's agreement (one small allreduce, agreement.py): every PE must pass the
same symmetric objects (same heap offsets), dtype, number of elements, root
and op, or every PE raises the same SymmetryError. That allreduce is also the
barrier that makes every PE's source ready before anyone reads it; each later
barrier is an agreed step with a phase code of its own, and every MPI wait
has the heap's deadline.

Two paths, chosen identically on every PE:
  - node path (every PE on this node): each PE reads its peers' memory
    directly through the peer mappings (heap.ptr) and writes only its own
    destination; a barrier after the copies keeps a source from being
    rewritten while a peer still reads it.
  - MPI path (some PE on another node): mpi4py's nonblocking collectives on
    host buffers (the symmetric memory itself for host heaps; a staged copy
    for device heaps), completed with the heap's deadline.

reduce gives bitwise the same result on both paths and on every PE: the
elements are split into n_pes chunks, the owner of a chunk combines the n_pes
contributions in PE order 0, 1, ..., n_pes-1 (torch ops, so every dtype torch
can combine works, float16 and bfloat16 included), then every PE gathers all
chunks. Each PE moves about 2x the data (reduce-scatter + allgather), on the
node as over MPI.
"""

from __future__ import annotations

import functools

import torch
from mpi4py import MPI

from .agreement import Call, Phase
from .errors import ShmemError

#: reduction operators of reduce(): name -> torch function with out=
REDUCE_OPS = {
    "sum": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum,
    "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
}


# -- checks (local; the agreement turns a local error into the same error everywhere)
def _symmetric_contiguous(heap, tensor, role: str, what: str) -> int:
    """`tensor`'s heap offset, after checking it is a contiguous symmetric tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: {role} must be a symmetric torch.Tensor, got "
                        f"{type(tensor).__name__}")
    heap._symmetric(tensor, f"{role} of {what}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: {role} has shape {tuple(tensor.shape)} and strides "
                         f"{tuple(tensor.stride())}, which is not contiguous; collectives "
                         f"work on contiguous symmetric tensors (a whole tensor or a slice "
                         f"of its first dimension)")
    return heap.local.offset_of(tensor)


def _pair(heap, what: str, dest, source, factor: int, *, identical_ok: bool):
    """Check dest (factor * source.numel() elements) and source; their heap offsets."""
    d = _symmetric_contiguous(heap, dest, "dest", what)
    s = _symmetric_contiguous(heap, source, "source", what)
    dest_numel = factor * source.numel()
    if dest.dtype != source.dtype:
        raise TypeError(f"{what}: dest has dtype {dest.dtype} and source {source.dtype}; "
                        f"they must match")
    if dest.numel() != dest_numel:
        raise ValueError(f"{what}: dest must have {dest_numel} elements for a source of "
                         f"{source.numel()} on {heap.n_pes} PEs, got {dest.numel()}")
    nd, ns = dest.numel() * dest.element_size(), source.numel() * source.element_size()
    if nd and ns and d < s + ns and s < d + nd and not (identical_ok and d == s and nd == ns):
        allowed = "be the same tensor or " if identical_ok else ""
        raise ValueError(f"{what}: dest (heap bytes {d:#x}..{d + nd:#x}) and source "
                         f"({s:#x}..{s + ns:#x}) overlap; they must {allowed}not overlap")
    return d, s


def _agree(heap, phase: Phase, text: str, check):
    """Run the heap's agreement for the call `phase`: `check()` returns (args,
    text) or raises a local error that then fails the call on every PE."""
    try:
        args, text = check()
        error = None
    except (TypeError, ValueError, ShmemError) as exc:
        args, error = (), exc
    heap.agree(Call(phase, args, text, error))


def _barrier(heap, phase: Phase, text: str) -> None:
    heap.backend.synchronize()
    heap.agree(Call(phase, text=text))


def _all_on_node(heap) -> bool:
    return len(heap.node_pes) == heap.n_pes


# -- MPI path helpers -------------------------------------------------------------------
def _host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with `tensor`'s data: itself where it already is one."""
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor
    return tensor.detach().to("cpu").contiguous()


def _receive_buffer(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor
    return torch.empty(tensor.shape, dtype=tensor.dtype)


def _bytes(tensor: torch.Tensor):
    return [MPI.memory.fromaddress(tensor.data_ptr(), tensor.numel() * tensor.element_size()),
            MPI.BYTE]


def _vector(tensor: torch.Tensor, counts, displs):
    size = tensor.element_size()
    return [MPI.memory.fromaddress(tensor.data_ptr(), tensor.numel() * size),
            [c * size for c in counts], [d * size for d in displs], MPI.BYTE]


def _wait(heap, request, text: str) -> None:
    """Complete a data step of the MPI path with the heap's deadline."""
    heap.agreement.wait(request, f"{text} (in your collective call #{heap.agreement.calls})")


def _chunks(numel: int, parts: int) -> tuple[list[int], list[int]]:
    counts = [numel // parts + (1 if i < numel % parts else 0) for i in range(parts)]
    displs = [sum(counts[:i]) for i in range(parts)]
    return counts, displs


# -- broadcast ------------------------------------------------------------------------------
def broadcast(heap, dest, source, root) -> None:
    """dest on every PE <- source on PE `root` (root's dest too; dest may be source)."""
    what = "broadcast"

    def check():
        r = heap._check_pe(root)
        d, s = _pair(heap, what, dest, source, 1, identical_ok=True)
        return (d, s, source.dtype, source.numel(), r), (
            f"broadcast(dest at heap offset {d:#x}, source at {s:#x}, {source.numel()} x "
            f"{source.dtype}, root={r})")

    with heap._lock:
        heap.backend.synchronize()
        _agree(heap, Phase.BROADCAST, f"broadcast(dest, source, root={root!r})", check)
        if source.numel() == 0:
            return
        me, text = heap.my_pe, f"broadcast(root={root})"
        same = heap.local.offset_of(dest) == heap.local.offset_of(source)
        if _all_on_node(heap):
            if me != root:
                dest.view(-1).copy_(heap.ptr(source, root).view(-1))
            elif not same:
                dest.view(-1).copy_(source.view(-1))
            _barrier(heap, Phase.BROADCAST_COPIED, f"{text} (copied)")
            return
        if me == root:
            buffer = _host(source)
            _wait(heap, heap.comm.Ibcast(_bytes(buffer), root), text)
            if not same:
                dest.view(-1).copy_(source.view(-1))
        else:
            buffer = _receive_buffer(dest)
            _wait(heap, heap.comm.Ibcast(_bytes(buffer), root), text)
            if buffer is not dest:
                dest.copy_(buffer)


# -- fcollect ---------------------------------------------------------------------------------
def fcollect(heap, dest, source) -> None:
    """dest[i*m:(i+1)*m] <- source of PE i on every PE (m = source.numel(); allgather)."""
    what = "fcollect"

    def check():
        d, s = _pair(heap, what, dest, source, heap.n_pes, identical_ok=False)
        return (d, s, source.dtype, source.numel()), (
            f"fcollect(dest at heap offset {d:#x}, source at {s:#x}, {source.numel()} x "
            f"{source.dtype} per PE)")

    with heap._lock:
        heap.backend.synchronize()
        _agree(heap, Phase.FCOLLECT, "fcollect(dest, source)", check)
        m = source.numel()
        if m == 0:
            return
        flat = dest.view(-1)
        if _all_on_node(heap):
            for pe in range(heap.n_pes):
                flat[pe * m:(pe + 1) * m].copy_(heap.ptr(source, pe).view(-1))
            _barrier(heap, Phase.FCOLLECT_COPIED, "fcollect (copied)")
            return
        send, receive = _host(source), _receive_buffer(dest)
        _wait(heap, heap.comm.Iallgather(_bytes(send), _bytes(receive)), "fcollect")
        if receive is not dest:
            dest.copy_(receive)


# -- alltoall ---------------------------------------------------------------------------------
def alltoall(heap, dest, source) -> None:
    """Block j of dest on PE i <- block i of source on PE j; a block is
    source.numel() // n_pes elements."""
    what = "alltoall"
    n = heap.n_pes

    def check():
        if isinstance(source, torch.Tensor) and source.numel() % n:
            raise ValueError(f"alltoall: source has {source.numel()} elements, which do not "
                             f"split into {n} equal blocks (one per PE); use a multiple of {n}")
        d, s = _pair(heap, what, dest, source, 1, identical_ok=False)
        return (d, s, source.dtype, source.numel()), (
            f"alltoall(dest at heap offset {d:#x}, source at {s:#x}, {source.numel()} x "
            f"{source.dtype})")

    with heap._lock:
        heap.backend.synchronize()
        _agree(heap, Phase.ALLTOALL, "alltoall(dest, source)", check)
        b, me = source.numel() // n, heap.my_pe
        if b == 0:
            return
        flat = dest.view(-1)
        if _all_on_node(heap):
            for pe in range(n):
                flat[pe * b:(pe + 1) * b].copy_(heap.ptr(source, pe).view(-1)[me * b:(me + 1) * b])
            _barrier(heap, Phase.ALLTOALL_COPIED, "alltoall (copied)")
            return
        send, receive = _host(source), _receive_buffer(dest)
        _wait(heap, heap.comm.Ialltoall(_bytes(send), _bytes(receive)), "alltoall")
        if receive is not dest:
            dest.copy_(receive)


# -- reduce -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _reducible(op: str, dtype: torch.dtype, device: str) -> str | None:
    """None when torch can combine `dtype` with `op`, else why not."""
    try:
        a = torch.ones(2, dtype=dtype, device=device)
        REDUCE_OPS[op](a, a, out=a)
        return None
    except (RuntimeError, TypeError) as exc:
        return str(exc).splitlines()[0]


def reduce(heap, dest, source, op: str = "sum") -> None:
    """dest on every PE <- source of PE 0 (op) source of PE 1 (op) ... elementwise
    (allreduce; dest may be source). op: sum, prod, min, max, and, or, xor."""
    what = "reduce"

    def check():
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
        d, s = _pair(heap, what, dest, source, 1, identical_ok=True)
        why = _reducible(op, source.dtype, str(heap.device))
        if why:
            raise TypeError(f"reduce: op {op!r} does not apply to dtype {source.dtype} ({why}); "
                            f"use another op or reduce a copy in another dtype")
        return (d, s, source.dtype, source.numel(), op), (
            f"reduce(dest at heap offset {d:#x}, source at {s:#x}, {source.numel()} x "
            f"{source.dtype}, op={op!r})")

    with heap._lock:
        heap.backend.synchronize()
        _agree(heap, Phase.REDUCE, f"reduce(dest, source, op={op!r})", check)
        numel, n, me = source.numel(), heap.n_pes, heap.my_pe
        if numel == 0:
            return
        combine = REDUCE_OPS[op]
        counts, displs = _chunks(numel, n)
        lo, hi = displs[me], displs[me] + counts[me]
        flat = dest.view(-1)
        text = f"reduce(op={op!r})"
        if _all_on_node(heap):
            # 1) this PE combines its chunk from every PE's source, in PE order
            if hi > lo:
                acc = heap.ptr(source, 0).view(-1)[lo:hi].clone()
                for pe in range(1, n):
                    combine(acc, heap.ptr(source, pe).view(-1)[lo:hi], out=acc)
                flat[lo:hi].copy_(acc)
            _barrier(heap, Phase.REDUCE_COMBINED, f"{text} (chunks combined)")
            # 2) every PE gathers the other chunks from their owners' dest
            for pe in range(n):
                if pe != me and counts[pe]:
                    start, stop = displs[pe], displs[pe] + counts[pe]
                    flat[start:stop].copy_(heap.ptr(dest, pe).view(-1)[start:stop])
            _barrier(heap, Phase.REDUCE_GATHERED, f"{text} (gathered)")
            return
        # 1) reduce-scatter: this PE receives its chunk of every PE's source ...
        send = _host(source).view(-1)
        pieces = torch.empty(n * counts[me], dtype=source.dtype)
        _wait(heap, heap.comm.Ialltoallv(_vector(send, counts, displs),
                                         _vector(pieces, [counts[me]] * n,
                                                 [pe * counts[me] for pe in range(n)])),
              f"{text} (scatter)")
        # ... and combines them in PE order, as the node path does
        pieces = pieces.view(n, counts[me])
        acc = pieces[0].clone()
        for pe in range(1, n):
            combine(acc, pieces[pe], out=acc)
        # 2) allgather of the combined chunks
        receive = _receive_buffer(dest)
        _wait(heap, heap.comm.Iallgatherv(_bytes(acc), _vector(receive.view(-1), counts, displs)),
              f"{text} (gather)")
        if receive is not dest:
            dest.copy_(receive)


def all_reduce(heap, dest, source, op: str = "sum") -> None:
    """dest on every PE <- source combined over every PE, elementwise (the
    torch.distributed name for reduce(), which already leaves the result on
    every PE; the same call, so all_reduce on some PEs matches reduce on the
    others).

    On a node the PEs read each other's source through the peer mappings
    (device heaps: torch kernels on the GPU, no MPI staging); every element is
    combined in PE order 0, 1, ..., n_pes-1 by the PE that owns its chunk, so
    the result is bit-identical on every PE, for floats too.

    Args:
        dest: a contiguous symmetric tensor with source's dtype and number of
            elements (it may be source itself).
        source: a contiguous symmetric tensor, the same one on every PE.
        op: "sum" (default), "prod", "min", "max", "and", "or" or "xor".

    Returns:
        None, once dest holds the result on this PE.

    Raises:
        SymmetryError: the PEs passed different tensors, sizes, dtypes or ops,
            or made another call (every PE raises it).
        TypeError: not symmetric tensors, different dtypes, or an op that does
            not apply to the dtype.
        ValueError: an unknown op, non-contiguous or overlapping tensors, or
            different numbers of elements.
        FreedTensorError: a tensor is not a live tensor of this heap.
        PeerTimeoutError: a PE did not join within the heap's timeout.
    """
    reduce(heap, dest, source, op)
