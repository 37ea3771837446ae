"""Collectives on symmetric tensors: broadcast, collect, fcollect, reduce,
alltoall, alltoalls; over all PEs of the heap or over a team (teams.py).

Each call is collective over the team (team=None: every PE of the heap) and
starts with the team's agreement (one small allreduce, agreement.py): every
member must pass the same symmetric objects (same heap offsets), dtype,
number of elements, root and op, or every member raises the same
SymmetryError. That allreduce is also the barrier that makes every member's
source ready before anyone reads it; each later barrier is an agreed step
with a phase code of its own, and every MPI wait has the heap's deadline.
PE numbers (root) and the order of blocks are team-relative: block i is team
PE i's.

Two paths, chosen identically on every member:
  - node path (every member on this node): each PE reads its peers' memory
    directly through the peer mappings (heap.ptr) and writes only its own
    destination; a barrier after the copies keeps a source from being
    rewritten while a peer still reads it.
  - MPI path (some member on another node): mpi4py's nonblocking collectives
    on the team's communicator, on host buffers (the symmetric memory itself
    for host heaps; a staged copy for device heaps), completed with the
    heap's deadline.

reduce gives bitwise the same result on both paths and on every PE: the
elements are split into n chunks (n = the team's PEs), the owner of a chunk
combines the n contributions in team PE order 0, 1, ..., n-1 (torch ops, so
every dtype torch can combine works, float16 and bfloat16 included), then
every PE gathers all chunks. Each PE moves about 2x the data (reduce-scatter
+ allgather), on the node as over MPI.
"""

from __future__ import annotations

import functools

import torch
from mpi4py import MPI

from .. import _args, _docs
from ..agreement.protocol import Phase
from ..core.state import HeapCore
from . import group

#: reduction operators of reduce(): name -> torch function with out=
REDUCE_OPS = {
    "sum": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum,
    "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
}


# -- checks (local; the agreement turns a local error into the same error everywhere)
def _same_dtype(what: str, dest, source) -> None:
    if dest.dtype != source.dtype:
        raise TypeError(f"{what}: dest has dtype {dest.dtype} and source {source.dtype}; "
                        f"they must match")


def _disjoint(what: str, d: int, nd: int, s: int, ns: int, identical_ok: bool = False) -> None:
    """dest's heap bytes d..d+nd and source's s..s+ns must not overlap."""
    if nd and ns and d < s + ns and s < d + nd and not (identical_ok and d == s and nd == ns):
        allowed = "be the same tensor or " if identical_ok else ""
        raise ValueError(f"{what}: dest (heap bytes {d:#x}..{d + nd:#x}) and source "
                         f"({s:#x}..{s + ns:#x}) overlap; they must {allowed}not overlap")


def _pair(heap: HeapCore, team: group.Group, what: str, dest, source, factor: int, *, identical_ok: bool):
    """Check dest (factor * source.numel() elements) and source; their heap offsets."""
    d = heap.symmetric_contiguous(dest, "dest", what)
    s = heap.symmetric_contiguous(source, "source", what)
    _same_dtype(what, dest, source)
    dest_numel = factor * source.numel()
    if dest.numel() != dest_numel:
        raise ValueError(f"{what}: dest must have {dest_numel} elements for a source of "
                         f"{source.numel()} on {len(team.pes)} PEs, got {dest.numel()}")
    _disjoint(what, d, dest.numel() * dest.element_size(), s,
              source.numel() * source.element_size(), identical_ok)
    return d, s




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


def _chunks(numel: int, parts: int) -> tuple[list[int], list[int]]:
    counts = [numel // parts + (1 if i < numel % parts else 0) for i in range(parts)]
    displs = [sum(counts[:i]) for i in range(parts)]
    return counts, displs


_TEAM_ARG = """team: a Team of this heap that this PE is a member of (teams.py),
            or None (the default) for every PE of the heap."""
_RAISES = """SymmetryError: the members made different calls or passed different
            arguments (every member raises it; nothing was done).
        PeerTimeoutError: a member did not join within the heap's timeout
            (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
        FreedTensorError: a tensor is not a live symmetric tensor of this heap.
        ShmemError: the heap is finalized, or the team destroyed.
        TypeError: `team` is not a Team (a split returns None on PEs it
            leaves out: they are not members and must not call)."""


#: fills the Args/Raises parts every collective shares into its docstring
_documented = _docs.filled(team=_TEAM_ARG, raises=_RAISES)


# -- broadcast ------------------------------------------------------------------------------
@_documented
def broadcast(heap: HeapCore, dest, source, root, *, team=None) -> None:
    """Copy `source` of PE `root` into `dest` on every PE of the team, root's
    own dest included (collective; OpenSHMEM's shmem_broadcast).

    Args:
        dest: a contiguous symmetric tensor with source's dtype and number of
            elements; it may be `source` itself.
        source: a contiguous symmetric tensor; only root's copy is read.
        root: the PE whose source is copied, a team PE number.
        {team}

    Returns:
        None, once this PE's dest holds root's source.

    Raises:
        ValueError: `root` out of range, the numbers of elements differ, a
            tensor is not contiguous, or dest and source overlap without being
            the same tensor.
        TypeError: the dtypes differ, or `root` is not an integer.
        {raises}
    """
    what = "broadcast"
    t = group.resolve(heap, team, what)

    def check():
        r = t.check_pe(root, "root")
        d, s = _pair(heap, t, what, dest, source, 1, identical_ok=True)
        return (d, s, source.dtype, source.numel(), r), (
            f"{t.label}broadcast(dest at heap offset {d:#x}, source at {s:#x}, "
            f"{source.numel()} x {source.dtype}, root={r})")

    with heap.lock:
        heap.backend.synchronize()
        r = t.agree_checked(Phase.BROADCAST, f"{t.label}broadcast(dest, source, root={root!r})",
                            check)[-1]
        if source.numel() == 0:
            return
        me, text = t.me, f"{t.label}broadcast(root={r})"
        same = heap.offset_of(dest) == heap.offset_of(source)
        if t.on_node:
            if me != r:
                dest.view(-1).copy_(heap.ptr(source, t.pes[r]).view(-1))
            elif not same:
                dest.view(-1).copy_(source.view(-1))
            t.step(Phase.BROADCAST_COPIED, f"{text} (copied)")
            return
        if me == r:
            buffer = _host(source)
            t.wait(t.comm.Ibcast(_bytes(buffer), r), text)
            if not same:
                dest.view(-1).copy_(source.view(-1))
        else:
            buffer = _receive_buffer(dest)
            t.wait(t.comm.Ibcast(_bytes(buffer), r), text)
            if buffer is not dest:
                dest.copy_(buffer)


# -- fcollect ---------------------------------------------------------------------------------
@_documented
def fcollect(heap: HeapCore, dest, source, *, team=None) -> None:
    """Concatenate every PE's `source` into `dest` on every PE of the team, in
    team PE order: dest[i*m:(i+1)*m] <- source of team PE i, m =
    source.numel() (collective; OpenSHMEM's shmem_fcollect, an allgather).

    Args:
        dest: a contiguous symmetric tensor of n * m elements (n: the team's
            PEs) with source's dtype, not overlapping source.
        source: a contiguous symmetric tensor, m elements on every PE.
        {team}

    Returns:
        None, once this PE's dest holds every member's source.

    Raises:
        ValueError: dest does not have n * m elements, a tensor is not
            contiguous, or dest and source overlap.
        TypeError: the dtypes differ.
        {raises}
    """
    what = "fcollect"
    t = group.resolve(heap, team, what)

    def check():
        d, s = _pair(heap, t, what, dest, source, len(t.pes), identical_ok=False)
        return (d, s, source.dtype, source.numel()), (
            f"{t.label}fcollect(dest at heap offset {d:#x}, source at {s:#x}, "
            f"{source.numel()} x {source.dtype} per PE)")

    with heap.lock:
        heap.backend.synchronize()
        t.agree_checked(Phase.FCOLLECT, f"{t.label}fcollect(dest, source)", check)
        m = source.numel()
        if m == 0:
            return
        flat = dest.view(-1)
        if t.on_node:
            for i, pe in enumerate(t.pes):
                flat[i * m:(i + 1) * m].copy_(heap.ptr(source, pe).view(-1))
            t.step(Phase.FCOLLECT_COPIED, f"{t.label}fcollect (copied)")
            return
        send, receive = _host(source), _receive_buffer(dest)
        t.wait(t.comm.Iallgather(_bytes(send), _bytes(receive)), f"{t.label}fcollect")
        if receive is not dest:
            dest.copy_(receive)


# -- collect ----------------------------------------------------------------------------------
@_documented
def collect(heap: HeapCore, dest, source, *, team=None) -> None:
    """Concatenate every PE's `source`, which may have a different number of
    elements on each PE, into `dest` on every PE of the team, in team PE order
    (collective; OpenSHMEM's shmem_collect). Team PE i's elements land at
    dest[c_0 + ... + c_(i-1):][:c_i] (c_k: team PE k's source.numel());
    elements of dest past the total are left as they are.

    Args:
        dest: a contiguous symmetric tensor with source's dtype, the same on
            every PE, of at least c_0 + ... + c_(n-1) elements, not overlapping
            any PE's source.
        source: a contiguous symmetric tensor (typically a leading slice of
            one, of this PE's length), at the same heap offset on every PE.
        {team}

    Returns:
        None, once this PE's dest holds every member's source.

    Raises:
        ValueError: dest is smaller than the total (raised on every PE, with
            each PE's count), a tensor is not contiguous, or dest overlaps a
            source.
        TypeError: the dtypes differ.
        {raises}
    """
    what = "collect"
    t = group.resolve(heap, team, what)

    def check():
        d = heap.symmetric_contiguous(dest, "dest", what)
        s = heap.symmetric_contiguous(source, "source", what)
        _same_dtype(what, dest, source)
        return (d, s, source.dtype, dest.numel()), (
            f"{t.label}collect(dest at heap offset {d:#x} of {dest.numel()} x {dest.dtype}, "
            f"source at {s:#x})")

    with heap.lock:
        heap.backend.synchronize()
        d, s, _, dest_numel = t.agree_checked(Phase.COLLECT, f"{t.label}collect(dest, source)",
                                              check)
        text = f"{t.label}collect"
        counts = [int.from_bytes(data, "little") for data in t.allgather(
            Phase.COLLECT_SIZES, source.numel().to_bytes(8, "little"), f"{text} (the sizes)")]
        displs = [sum(counts[:i]) for i in range(len(counts))]
        total, size = sum(counts), source.element_size()
        # The same inputs on every PE (agreed or gathered): every PE raises alike.
        if total > dest_numel:
            raise ValueError(f"{what}: dest has {dest_numel} elements, but the team's PEs "
                             f"contribute {total} (team PE i: {counts[:16]}"
                             f"{' ...' if len(counts) > 16 else ''}); allocate dest with at "
                             f"least {total} elements")
        _disjoint(what, d, total * size, s, max(counts) * size)
        if total == 0:
            return
        flat = dest.view(-1)
        if t.on_node:
            for i, pe in enumerate(t.pes):
                if counts[i]:
                    # team PE i's source: counts[i] elements from the same offset, in
                    # a block of the same size on every PE
                    theirs = torch.as_strided(source, (counts[i],), (1,), source.storage_offset())
                    flat[displs[i]:displs[i] + counts[i]].copy_(heap.ptr(theirs, pe))
            t.step(Phase.COLLECT_COPIED, f"{text} (copied)")
            return
        target = flat[:total]
        send, receive = _host(source).view(-1), _receive_buffer(target)
        t.wait(t.comm.Iallgatherv(_bytes(send), _vector(receive, counts, displs)), text)
        if receive is not target:
            target.copy_(receive)


# -- alltoall ---------------------------------------------------------------------------------
@_documented
def alltoall(heap: HeapCore, dest, source, *, team=None) -> None:
    """Exchange blocks between every pair of PEs of the team: block j of dest
    on team PE i <- block i of source on team PE j; a block is source.numel()
    // n elements, n the team's PEs (collective; OpenSHMEM's shmem_alltoall).

    Args:
        dest: a contiguous symmetric tensor with source's dtype and number of
            elements, not overlapping source.
        source: a contiguous symmetric tensor whose number of elements is a
            multiple of n.
        {team}

    Returns:
        None, once this PE's dest holds its block of every member's source.

    Raises:
        ValueError: source does not split into n equal blocks, the numbers
            of elements differ, a tensor is not contiguous, or they overlap.
        TypeError: the dtypes differ.
        {raises}
    """
    what = "alltoall"
    t = group.resolve(heap, team, what)
    n = len(t.pes)

    def check():
        if isinstance(source, torch.Tensor) and source.numel() % n:
            raise ValueError(f"alltoall: source has {source.numel()} elements, which do not "
                             f"split into {n} equal blocks (one per PE); use a multiple of {n}")
        d, s = _pair(heap, t, what, dest, source, 1, identical_ok=False)
        return (d, s, source.dtype, source.numel()), (
            f"{t.label}alltoall(dest at heap offset {d:#x}, source at {s:#x}, "
            f"{source.numel()} x {source.dtype})")

    with heap.lock:
        heap.backend.synchronize()
        t.agree_checked(Phase.ALLTOALL, f"{t.label}alltoall(dest, source)", check)
        b, me = source.numel() // n, t.me
        if b == 0:
            return
        flat = dest.view(-1)
        if t.on_node:
            for i, pe in enumerate(t.pes):
                flat[i * b:(i + 1) * b].copy_(heap.ptr(source, pe).view(-1)[me * b:(me + 1) * b])
            t.step(Phase.ALLTOALL_COPIED, f"{t.label}alltoall (copied)")
            return
        send, receive = _host(source), _receive_buffer(dest)
        t.wait(t.comm.Ialltoall(_bytes(send), _bytes(receive)), f"{t.label}alltoall")
        if receive is not dest:
            dest.copy_(receive)


@_documented
def alltoalls(heap: HeapCore, dest, source, dst: int, sst: int, nelems: int, *, team=None) -> None:
    """alltoall with strides (collective; OpenSHMEM's shmem_alltoalls): for
    every pair of team PEs i, k and j in 0..nelems-1,
    dest[dst * (i*nelems + j)] on PE k <- source[sst * (k*nelems + j)] on PE i.
    Elements of dest between the strided ones are left as they are.

    Args:
        dest: a contiguous symmetric tensor (read as 1-D) with source's dtype,
            of at least dst * (n*nelems - 1) + 1 elements (n: the team's PEs).
        source: a contiguous symmetric tensor (read as 1-D) of at least
            sst * (n*nelems - 1) + 1 elements; the spans of dest and source
            that are used must not overlap.
        dst: the stride between the elements written in dest, >= 1.
        sst: the stride between the elements read from source, >= 1.
        nelems: the number of elements exchanged between each pair, >= 0.
        {team}

    Returns:
        None, once this PE's dest holds its elements of every member's source.

    Raises:
        ValueError: a stride < 1 or nelems < 0, a tensor too small for the
            strided span, not contiguous, or the spans overlap.
        TypeError: the dtypes differ, or a stride or nelems is not an integer.
        {raises}
    """
    what = "alltoalls"
    t = group.resolve(heap, team, what)
    n = len(t.pes)

    def check():
        ds, ss = _args.count(dst, "alltoalls: dst", 1), _args.count(sst, "alltoalls: sst", 1)
        count = _args.count(nelems, "alltoalls: nelems", 0)
        d = heap.symmetric_contiguous(dest, "dest", what)
        s = heap.symmetric_contiguous(source, "source", what)
        _same_dtype(what, dest, source)
        spans = [(ds * (n * count - 1) + 1) if count else 0,
                 (ss * (n * count - 1) + 1) if count else 0]
        for role, tensor, span, stride in (("dest", dest, spans[0], "dst"),
                                           ("source", source, spans[1], "sst")):
            if tensor.numel() < span:
                raise ValueError(f"alltoalls: {role} has {tensor.numel()} elements; {n} PEs x "
                                 f"{count} elements with {stride}={ds if role == 'dest' else ss}"
                                 f" need at least {span}")
        size = dest.element_size()
        _disjoint(what, d, spans[0] * size, s, spans[1] * size)
        return (d, s, source.dtype, count, (ds, ss)), (
            f"{t.label}alltoalls(dest at heap offset {d:#x}, source at {s:#x}, dst={ds}, "
            f"sst={ss}, nelems={count} x {source.dtype})")

    with heap.lock:
        heap.backend.synchronize()
        _, _, _, count, (ds, ss) = t.agree_checked(
            Phase.ALLTOALLS, f"{t.label}alltoalls(dest, source, dst={dst!r}, sst={sst!r}, "
            f"nelems={nelems!r})", check)
        if count == 0:
            return
        me, m = t.me, n * count
        into = dest.view(-1)[::ds][:m]      # the elements dest receives, in order
        if t.on_node:
            for i, pe in enumerate(t.pes):
                theirs = heap.ptr(source, pe).view(-1)[::ss][me * count:(me + 1) * count]
                into[i * count:(i + 1) * count].copy_(theirs)
            t.step(Phase.ALLTOALLS_COPIED, f"{t.label}alltoalls (copied)")
            return
        send = source.view(-1)[::ss][:m].to("cpu").contiguous()
        receive = torch.empty(m, dtype=dest.dtype)
        t.wait(t.comm.Ialltoall(_bytes(send), _bytes(receive)), f"{t.label}alltoalls")
        into.copy_(receive)


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


@_documented
def reduce(heap: HeapCore, dest, source, op: str = "sum", *, team=None) -> None:
    """Combine every PE's `source` elementwise with `op` into `dest` on every
    PE of the team (collective; OpenSHMEM's reductions, as an allreduce):
    dest = source of team PE 0 (op) source of team PE 1 (op) ..., combined
    in that order, so the result is bitwise the same on every PE and on the
    node as over MPI.

    Args:
        dest: a contiguous symmetric tensor with source's dtype and number of
            elements; it may be `source` itself.
        source: a contiguous symmetric tensor.
        op: "sum", "prod", "min", "max", "and", "or" or "xor" (the bitwise
            ones for integer and bool dtypes).
        {team}

    Returns:
        None, once this PE's dest holds the result.

    Raises:
        ValueError: an unknown op, the numbers of elements differ, a tensor is
            not contiguous, or dest and source overlap without being the same.
        TypeError: the dtypes differ, or torch cannot combine the dtype with op.
        {raises}
    """
    what = "reduce"
    t = group.resolve(heap, team, what)

    def check():
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
        d, s = _pair(heap, t, what, dest, source, 1, identical_ok=True)
        why = _reducible(op, source.dtype, str(heap.device))
        if why:
            raise TypeError(f"reduce: op {op!r} does not apply to dtype {source.dtype} ({why}); "
                            f"use another op or reduce a copy in another dtype")
        return (d, s, source.dtype, source.numel(), op), (
            f"{t.label}reduce(dest at heap offset {d:#x}, source at {s:#x}, "
            f"{source.numel()} x {source.dtype}, op={op!r})")

    with heap.lock:
        heap.backend.synchronize()
        t.agree_checked(Phase.REDUCE, f"{t.label}reduce(dest, source, op={op!r})", check)
        numel, n, me = source.numel(), len(t.pes), t.me
        if numel == 0:
            return
        combine = REDUCE_OPS[op]
        counts, displs = _chunks(numel, n)
        lo, hi = displs[me], displs[me] + counts[me]
        flat = dest.view(-1)
        text = f"{t.label}reduce(op={op!r})"
        if t.on_node:
            # 1) this PE combines its chunk from every member's source, in team order
            if hi > lo:
                acc = heap.ptr(source, t.pes[0]).view(-1)[lo:hi].clone()
                for pe in t.pes[1:]:
                    combine(acc, heap.ptr(source, pe).view(-1)[lo:hi], out=acc)
                flat[lo:hi].copy_(acc)
            t.step(Phase.REDUCE_COMBINED, f"{text} (chunks combined)")
            # 2) every PE gathers the other chunks from their owners' dest
            for i, pe in enumerate(t.pes):
                if i != me and counts[i]:
                    start, stop = displs[i], displs[i] + counts[i]
                    flat[start:stop].copy_(heap.ptr(dest, pe).view(-1)[start:stop])
            t.step(Phase.REDUCE_GATHERED, f"{text} (gathered)")
            return
        # 1) reduce-scatter: this PE receives its chunk of every member's source ...
        send = _host(source).view(-1)
        pieces = torch.empty(n * counts[me], dtype=source.dtype)
        t.wait(t.comm.Ialltoallv(_vector(send, counts, displs),
                                 _vector(pieces, [counts[me]] * n,
                                         [i * counts[me] for i in range(n)])),
               f"{text} (scatter)")
        # ... and combines them in team order, as the node path does
        pieces = pieces.view(n, counts[me])
        acc = pieces[0].clone()
        for i in range(1, n):
            combine(acc, pieces[i], out=acc)
        # 2) allgather of the combined chunks
        receive = _receive_buffer(dest)
        t.wait(t.comm.Iallgatherv(_bytes(acc), _vector(receive.view(-1), counts, displs)),
               f"{text} (gather)")
        if receive is not dest:
            dest.copy_(receive)


def all_reduce(heap: HeapCore, dest, source, op: str = "sum", *, team=None) -> None:
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
        team: a Team of this heap (None: all PEs); its members make the call.

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
    reduce(heap, dest, source, op, team=team)
