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
combines the n contributions in team PE order 0, 1, ..., n-1, then every PE
gathers all chunks. Each PE moves about 2x the data (reduce-scatter +
allgather), on the node as over MPI.

Each collective is written once over bytes: its operands are Operands (the
bytes of a contiguous symmetric object as a uint8 tensor, its element size and
its dtype, whatever the face's dtype is), and reduce combines with a combiner
the face gives (torch ops for the torch functions here, so every dtype torch
can combine works, float16 and bfloat16 included; NumPy ufuncs for the NumPy
face, so every dtype NumPy has works, long double included). The *_bytes
functions are the entry points both faces call: the face passes a function
that makes its operands, or raises for a bad argument, which then runs inside
the call's agreement, so that a bad argument on one PE raises on every PE.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from mpi4py import MPI

from .. import _args, _docs, vocabulary
from ..agreement.protocol import Phase
from ..core.state import Core
from ..errors import ShmemError, plural
from ..transport import nodecoll
from . import group

class Operand(NamedTuple):
    """One operand of a collective, as every face gives it: `data`, the bytes of
    a contiguous symmetric object (a 1-D uint8 tensor over symmetric memory),
    `itemsize` bytes an element, and `dtype` (the face's: torch or NumPy), which
    every PE must pass alike and messages name."""
    data: torch.Tensor
    itemsize: int
    dtype: Any
    #: the number of elements (made once: a collective reads it several times)
    count: int   # type: ignore[assignment]  # (a field, not tuple.count)
    #: its heap offset, where the face already checked `data` to be live symmetric
    #: memory (the NumPy face: arrays.symmetric_span); None: the routine checks it
    offset: int | None = None

    @classmethod
    def of(cls, data: torch.Tensor, itemsize: int, dtype, offset: int | None = None) -> Operand:
        """The Operand of `data` (bytes), its elements of `itemsize` bytes."""
        return cls(data, itemsize, dtype, data.numel() // itemsize, offset)


#: a combiner: acc <- acc (op) other, elementwise, both uint8 tensors of whole elements
Combine = Callable[[torch.Tensor, torch.Tensor], None]


def tensor_operand(tensor, role: str, what: str) -> Operand:
    """A torch tensor as an Operand (the torch face), after checking it is a
    contiguous tensor; symmetric() is checked by the collective itself."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: {role} must be a symmetric torch.Tensor, got "
                        f"{type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: {role} has shape {tuple(tensor.shape)} and strides "
                         f"{tuple(tensor.stride())}, which is not contiguous; collectives "
                         f"work on contiguous symmetric tensors (a whole tensor or a slice "
                         f"of its first dimension)")
    if tensor.is_conj() or tensor.is_neg():   # (view(torch.uint8) would raise torch's error)
        kind = "conjugated (.conj())" if tensor.is_conj() else "negated"
        raise ValueError(f"{what}: {role} is a lazily {kind} view, whose memory holds other "
                         f"values than it shows, and collectives move and combine the memory; "
                         f"pass the tensor itself and conjugate or negate the result "
                         f"(dest.conj_physical_()), or make the values in a symmetric tensor "
                         f"first (x.copy_(y.conj()))")
    return Operand.of(tensor.reshape(-1).view(torch.uint8), tensor.element_size(), tensor.dtype)


def _tensors(dest, source, what: str):
    """The torch face's operands maker for dest and source."""
    return lambda: (tensor_operand(dest, "dest", what), tensor_operand(source, "source", what))


# -- replays (a repeated call: its Plan, nodecoll.replay), for both faces ------------------
def plan_key(kind: str, group_id: int | None, values: tuple, *facts) -> tuple | None:
    """The memo key (Core.where.recall) of a call of collective `kind` over the
    group `group_id` names (None: every PE) with arguments `values` (root,
    size, op) and `facts`, what the face's checks look at of its operands;
    None where a value is not a plain int, string or None (the general path
    checks it). A Plan holds its group, so the id names one team while the
    Plan lives."""
    for value in values:
        if value is not None and type(value) is not int and not isinstance(value, str):
            return None
    return (kind, group_id, *facts, *values)


def replayed(heap: Core, key: tuple | None, *tensors: torch.Tensor) -> bool:
    """Whether the call that `key` names ran again from its Plan, `tensors`
    (the torch face's: a key cannot hold a storage) over the storages of the
    call that made it (nodecoll.replay); False where there is none (not made
    yet, or forgotten: a block freed or released since), another storage, or
    the board cannot now."""
    if key is None:
        return False
    kept = heap.where.recall(key)
    if kept is None:
        return False
    plan, storages = kept
    for storage, tensor in zip(storages, tensors):
        if storage() is not tensor.untyped_storage():
            return False
    return nodecoll.replay(heap, plan)


def keep(heap: Core, key: tuple | None, plan: nodecoll.Plan | None,
         *tensors: torch.Tensor) -> None:
    """Remember the Plan that the general path returned, with weak references
    to the storages of `tensors` (a Plan keeps no block alive)."""
    if key is not None and plan is not None:
        heap.where.remember(key, (plan, tuple(weakref.ref(t.untyped_storage())
                                              for t in tensors)))


def _tensor_key(kind: str, team, dest, source, *values) -> tuple | None:
    """plan_key() of the torch face's call on contiguous tensors dest and
    source: what its checks look at of each CPU tensor (address, shape, dtype,
    conjugate and negative bits; contiguous, so the bytes are those of its
    address and size whatever the strides of its dimensions of 1). None where
    there can be no key (a subclass, another type, device memory, which is
    never fused, a tensor that is not contiguous: the general path). Each
    tensor method costs 60-120 ns, the key a third of a replayed call: a
    tensor of a real dtype has no conjugate bit to ask for (is_conj() is
    False there), and is_contiguous() is half of stride()."""
    if type(dest) is not torch.Tensor or type(source) is not torch.Tensor \
            or not (dest.is_cpu and source.is_cpu and dest.is_contiguous()
                    and source.is_contiguous()):
        return None
    if team is not None and not isinstance(team, group.Group):
        return None
    d, s = dest.dtype, source.dtype
    return plan_key("torch " + kind, None if team is None else id(team), values,
                    dest.data_ptr(), dest.shape, d, d.is_complex and dest.is_conj(),
                    dest.is_neg(), source.data_ptr(), source.shape, s,
                    s.is_complex and source.is_conj(), source.is_neg())


# -- checks (local; the agreement turns a local error into the same error everywhere)
def _offset(heap: Core, operand: Operand, role: str, what: str) -> int:
    """The heap offset of `operand`, checked to be live symmetric memory (by
    the face already, where it gives the offset)."""
    offset = operand.offset
    if offset is not None:
        return offset
    return heap.where.symmetric_contiguous(operand.data, role, what)


def _same_dtype(what: str, dest: Operand, source: Operand) -> None:
    if dest.dtype != source.dtype:
        raise TypeError(f"{what}: dest has dtype {dest.dtype} and source {source.dtype}; "
                        f"they must match")


def _disjoint(what: str, d: int, nd: int, s: int, ns: int, identical_ok: bool = False) -> None:
    """dest's heap bytes d..d+nd and source's s..s+ns must not overlap."""
    if nd and ns and d < s + ns and s < d + nd and not (identical_ok and d == s and nd == ns):
        allowed = "be the same tensor or " if identical_ok else ""
        raise ValueError(f"{what}: dest (heap bytes {d:#x}..{d + nd:#x}) and source "
                         f"({s:#x}..{s + ns:#x}) overlap; they must {allowed}not overlap")


def _pair(heap: Core, team: group.Group, what: str, dest: Operand, source: Operand,
          factor: int, *, identical_ok: bool):
    """Check dest (factor * source.count elements) and source; their heap offsets."""
    d = _offset(heap, dest, "dest", what)
    s = _offset(heap, source, "source", what)
    _same_dtype(what, dest, source)
    dest_count = factor * source.count
    if dest.count != dest_count:
        raise ValueError(f"{what}: dest must have {dest_count} elements for a source of "
                         f"{source.count} on {plural(len(team.pes), 'PE')}, got {dest.count}")
    _disjoint(what, d, dest.data.numel(), s, source.data.numel(), identical_ok)
    return d, s


# -- MPI path helpers -------------------------------------------------------------------
def _mapped(heap: Core, tensor: torch.Tensor, pe: int) -> torch.Tensor:
    """PE `pe`'s copy of `tensor` on a node path, where every member is mapped,
    for this call's own copies and combines: the peer mapping's cached view
    (Target.copy_view, as put and get copy through; never handed out), not a
    new tensor that holds the block, as ptr() makes for a user (15 a call for
    a large reduce over 16 PEs). ShmemError where PE `pe`'s copy is not mapped."""
    target = heap.where.locate(tensor, pe, "tensor")
    if target.address is None:
        raise ShmemError(f"a collective on the node: PE {pe}'s copy of the tensor at heap "
                         f"address {tensor.data_ptr():#x} is not mapped in this process, "
                         f"though the team's node path reads it there (a bug: please report "
                         f"it with SHMEMVM_DEBUG=1's log)")
    return target.copy_view(tensor)


def _copy_from_members(heap: Core, t, into: torch.Tensor, tensor: torch.Tensor,
                       parts: list[tuple[int, int, int, int]]) -> None:
    """A node path's gather: each (to, i, start, nbytes) of `parts` copies the
    `nbytes` at `start` of team PE i's copy of `tensor` (bytes of a live block)
    to `into[to:]`. In C at the members' addresses where the CPU copies
    (nodecoll.peer_addresses), else through torch views of their mappings."""
    addresses = nodecoll.peer_addresses(heap, t.pes, tensor)
    if addresses:
        nodecoll.copy_parts(into.data_ptr(), addresses, parts)
        return
    for to, i, start, nbytes in parts:
        into[to:to + nbytes].copy_(_mapped(heap, tensor, t.pes[i])[start:start + nbytes])


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
    """`tensor` (uint8) as an MPI vector buffer of byte counts and displacements."""
    return [MPI.memory.fromaddress(tensor.data_ptr(), tensor.numel()), list(counts),
            list(displs), MPI.BYTE]


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
        NotSymmetricError: a tensor is not a symmetric tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        ShmemError: the heap is finalized, or the team destroyed.
        TypeError: `team` is not a Team (a split returns None on PEs it
            leaves out: they are not members and must not call)."""


#: fills the Args/Raises parts every collective shares into its docstring
_documented = _docs.filled(team=_TEAM_ARG, raises=_RAISES)


# -- broadcast ------------------------------------------------------------------------------
@_documented
def broadcast(heap: Core, dest, source, root, *, team=None) -> None:
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
    key = _tensor_key("broadcast", team, dest, source, root)
    if not replayed(heap, key, dest, source):
        keep(heap, key,
             broadcast_bytes(heap, _tensors(dest, source, "broadcast"), root, team=team),
             dest, source)


def broadcast_bytes(heap: Core, operands: Callable[[], tuple[Operand, Operand]], root, *,
                    team=None) -> nodecoll.Plan | None:
    """broadcast() of the Operands that `operands()` makes (or raises for: then
    every member raises at this call): both faces' one implementation. Returns
    the call's Plan where its data went in the agreed step (nodecoll.replay()
    repeats it, while the face's key says the operands are the same), else None."""
    what = "broadcast"
    t = group.resolve(heap, team, what)
    made: list = []
    fused = nodecoll.fusion(t)   # the data in the agreed step, where it fits (issue 30)

    def check():
        r = t.check_pe(root, "root")
        dest, source = operands()
        d, s = _pair(heap, t, what, dest, source, 1, identical_ok=True)
        made[:] = dest, source
        fused.broadcast(dest, source, r, t.me)
        return fused.agreeing(Phase.BROADCAST, (d, s, source.dtype, source.count, r), (
            "{}broadcast(dest at heap offset {:#x}, source at {:#x}, {} x {}, root={})",
            t.label, d, s, source.count, source.dtype, r))   # (made only for a message)

    with t.lock, fused:   # the group's own: one heap-wide lock would hold other teams up
        heap.calls.synchronize()
        d, s, _, _, r = t.agree_checked(
            Phase.BROADCAST, f"{t.label}broadcast(dest, source, root={root!r})", check)
        dest, source = made
        if source.data.numel() == 0:
            return None
        if fused.deliver():
            return fused.plan(t)   # (the face may replay it: nodecoll.replay)
        me, text = t.me, f"{t.label}broadcast(root={r})"
        same = d == s
        if t.on_node:
            if me != r:
                dest.data.copy_(_mapped(heap, source.data, t.pes[r]))
            elif not same:
                dest.data.copy_(source.data)
            t.step(Phase.BROADCAST_COPIED, f"{text} (copied)")
            return None
        if me == r:
            buffer = _host(source.data)
            t.wait(t.comm.Ibcast(_bytes(buffer), r), text)
            if not same:
                dest.data.copy_(source.data)
        else:
            buffer = _receive_buffer(dest.data)
            t.wait(t.comm.Ibcast(_bytes(buffer), r), text)
            if buffer is not dest.data:
                dest.data.copy_(buffer)
    return None


# -- fcollect ---------------------------------------------------------------------------------
@_documented
def fcollect(heap: Core, dest, source, *, team=None) -> None:
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
    key = _tensor_key("fcollect", team, dest, source)
    if not replayed(heap, key, dest, source):
        keep(heap, key, fcollect_bytes(heap, _tensors(dest, source, "fcollect"), team=team),
             dest, source)


def fcollect_bytes(heap: Core, operands: Callable[[], tuple[Operand, Operand]], *,
                   team=None) -> nodecoll.Plan | None:
    """fcollect() of the Operands that `operands()` makes (see broadcast_bytes)."""
    what = "fcollect"
    t = group.resolve(heap, team, what)
    made: list = []
    fused = nodecoll.fusion(t)   # the data in the agreed step, where it fits (issue 30)

    def check():
        dest, source = operands()
        d, s = _pair(heap, t, what, dest, source, len(t.pes), identical_ok=False)
        made[:] = dest, source
        fused.fcollect(dest, source)
        return fused.agreeing(Phase.FCOLLECT, (d, s, source.dtype, source.count), (
            "{}fcollect(dest at heap offset {:#x}, source at {:#x}, {} x {} per PE)",
            t.label, d, s, source.count, source.dtype))   # (made only for a message)

    with t.lock, fused:   # the group's own: one heap-wide lock would hold other teams up
        heap.calls.synchronize()
        t.agree_checked(Phase.FCOLLECT, f"{t.label}fcollect(dest, source)", check)
        dest, source = made
        m = source.data.numel()
        if m == 0:
            return None
        if fused.deliver():
            return fused.plan(t)   # (the face may replay it: nodecoll.replay)
        flat = dest.data
        if t.on_node:
            _copy_from_members(heap, t, flat, source.data,
                               [(i * m, i, 0, m) for i in range(len(t.pes))])
            t.step(Phase.FCOLLECT_COPIED, f"{t.label}fcollect (copied)")
            return None
        send, receive = _host(source.data), _receive_buffer(flat)
        t.wait(t.comm.Iallgather(_bytes(send), _bytes(receive)), f"{t.label}fcollect")
        if receive is not flat:
            flat.copy_(receive)
    return None


# -- collect ----------------------------------------------------------------------------------
@_documented
def collect(heap: Core, dest, source, *, team=None) -> None:
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
    key = _tensor_key("collect", team, dest, source)
    if not replayed(heap, key, dest, source):
        keep(heap, key, collect_bytes(heap, _tensors(dest, source, "collect"), team=team),
             dest, source)


def _collect_fits(what: str, d: int, s: int, dest_count: int, size: int,
                  counts: list[int]) -> int:
    """The total of every PE's count of elements (of `size` bytes), where they
    fit dest (`dest_count` elements at heap offset d) without overlapping a
    source (at s); else ValueError. The same counts on every PE (agreed or
    gathered): every PE raises alike."""
    total = sum(counts)
    if total > dest_count:
        raise ValueError(f"{what}: dest has {dest_count} elements, but the team's PEs "
                         f"contribute {total} (team PE i: {counts[:16]}"
                         f"{' ...' if len(counts) > 16 else ''}); allocate dest with at "
                         f"least {total} elements")
    _disjoint(what, d, total * size, s, max(counts) * size)
    return total


def collect_bytes(heap: Core, operands: Callable[[], tuple[Operand, Operand]], *,
                  team=None) -> nodecoll.Plan | None:
    """collect() of the Operands that `operands()` makes (see broadcast_bytes).
    Returns the Plan of a call whose counts and data went in its agreed step
    (its replay checks every PE's count again: they are not agreed)."""
    what = "collect"
    t = group.resolve(heap, team, what)
    made: list = []
    fused = nodecoll.fusion(t)   # the sizes and data in the agreed step, where they fit

    def check():
        dest, source = operands()
        d = _offset(heap, dest, "dest", what)
        s = _offset(heap, source, "source", what)
        _same_dtype(what, dest, source)
        made[:] = dest, source
        fused.collect(dest, source)
        return fused.agreeing(Phase.COLLECT, (d, s, source.dtype, dest.count), (
            "{}collect(dest at heap offset {:#x} of {} x {}, source at {:#x})", t.label, d,
            dest.count, dest.dtype, s))

    with t.lock, fused:   # the group's own: one heap-wide lock would hold other teams up
        heap.calls.synchronize()
        d, s, _, dest_count = t.agree_checked(Phase.COLLECT, f"{t.label}collect(dest, source)",
                                              check)
        dest, source = made
        text = f"{t.label}collect"
        size = source.itemsize
        carried = fused.collected()   # every PE's byte count, where the step carried them
        if carried is not None:
            counts = [count // size for count in carried]
        else:
            counts = [int.from_bytes(data, "little") for data in t.allgather(
                Phase.COLLECT_SIZES, source.count.to_bytes(8, "little"), f"{text} (the sizes)")]
        total = _collect_fits(what, d, s, dest_count, size, counts)
        if total == 0:
            return None
        if carried is not None:
            fused.deliver_collected(carried, dest.data.data_ptr())
            return fused.plan(t, nodecoll.Collected(dest.data.data_ptr(), (d, s, dest_count, size),
                                                    functools.partial(_collect_settled, what)))
        counts = [c * size for c in counts]           # in bytes from here on
        displs = [sum(counts[:i]) for i in range(len(counts))]
        flat = dest.data
        if t.on_node:
            data = source.data
            # team PE i's source: counts[i] bytes from the same offset, in a block of
            # the same size on every PE: this PE's bytes from there to the largest
            # count stand for each member's (_collect_fits kept it off dest)
            widest = torch.as_strided(data, (max(counts),), (1,), data.storage_offset())
            _copy_from_members(heap, t, flat, widest, [
                (displs[i], i, 0, counts[i]) for i in range(len(t.pes)) if counts[i]])
            t.step(Phase.COLLECT_COPIED, f"{text} (copied)")
            return None
        target = flat[:sum(counts)]
        send, receive = _host(source.data), _receive_buffer(target)
        t.wait(t.comm.Iallgatherv(_bytes(send), _vector(receive, counts, displs)), text)
        if receive is not target:
            target.copy_(receive)
    return None


def _collect_settled(what: str, d: int, s: int, dest_count: int, size: int,
                     carried: list[int]) -> None:
    """A replayed collect's check of every PE's byte count (nodecoll.Collected)."""
    _collect_fits(what, d, s, dest_count, size, [count // size for count in carried])


# -- alltoall ---------------------------------------------------------------------------------
@_documented
def alltoall(heap: Core, dest, source, *, team=None) -> None:
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
    key = _tensor_key("alltoall", team, dest, source)
    if not replayed(heap, key, dest, source):
        keep(heap, key, alltoall_bytes(heap, _tensors(dest, source, "alltoall"), team=team),
             dest, source)


def alltoall_bytes(heap: Core, operands: Callable[[], tuple[Operand, Operand]], *,
                   team=None) -> nodecoll.Plan | None:
    """alltoall() of the Operands that `operands()` makes (see broadcast_bytes)."""
    what = "alltoall"
    t = group.resolve(heap, team, what)
    n = len(t.pes)
    made: list = []
    fused = nodecoll.fusion(t)   # the data in the agreed step, where it fits (issue 30)

    def check():
        dest, source = operands()
        if source.count % n:
            raise ValueError(f"alltoall: source has {source.count} elements, which do not "
                             f"split into {n} equal blocks (one per PE); use a multiple of {n}")
        d, s = _pair(heap, t, what, dest, source, 1, identical_ok=False)
        made[:] = dest, source
        fused.alltoall(dest, source, t.me)
        return fused.agreeing(Phase.ALLTOALL, (d, s, source.dtype, source.count), (
            "{}alltoall(dest at heap offset {:#x}, source at {:#x}, {} x {})",
            t.label, d, s, source.count, source.dtype))   # (made only for a message)

    with t.lock, fused:   # the group's own: one heap-wide lock would hold other teams up
        heap.calls.synchronize()
        t.agree_checked(Phase.ALLTOALL, f"{t.label}alltoall(dest, source)", check)
        dest, source = made
        b, me = source.data.numel() // n, t.me      # a block, in bytes
        if b == 0:
            return None
        if fused.deliver():
            return fused.plan(t)   # (the face may replay it: nodecoll.replay)
        flat = dest.data
        if t.on_node:
            _copy_from_members(heap, t, flat, source.data,
                               [(i * b, i, me * b, b) for i in range(n)])
            t.step(Phase.ALLTOALL_COPIED, f"{t.label}alltoall (copied)")
            return None
        send, receive = _host(source.data), _receive_buffer(flat)
        t.wait(t.comm.Ialltoall(_bytes(send), _bytes(receive)), f"{t.label}alltoall")
        if receive is not flat:
            flat.copy_(receive)
    return None


@_documented
def alltoalls(heap: Core, dest, source, dst: int, sst: int, nelems: int, *, team=None) -> None:
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
    alltoalls_bytes(heap, _tensors(dest, source, "alltoalls"), dst, sst, nelems, team=team)


def alltoalls_bytes(heap: Core, operands: Callable[[], tuple[Operand, Operand]], dst, sst,
                    nelems, *, team=None) -> None:
    """alltoalls() of the Operands that `operands()` makes (see broadcast_bytes);
    `nelems` may be a function of (dest, source) that gives it (the NumPy face's
    default, worked out inside the agreement)."""
    what = "alltoalls"
    t = group.resolve(heap, team, what)
    n = len(t.pes)
    made: list = []
    fused = nodecoll.fusion(t)   # the data in the agreed step, where it fits (issue 30)

    def check():
        dest, source = operands()
        ds, ss = _args.count(dst, "alltoalls: dst", 1), _args.count(sst, "alltoalls: sst", 1)
        count = _args.count(nelems(dest, source) if callable(nelems) else nelems,
                            "alltoalls: nelems", 0)
        d = _offset(heap, dest, "dest", what)
        s = _offset(heap, source, "source", what)
        _same_dtype(what, dest, source)
        spans = [(ds * (n * count - 1) + 1) if count else 0,
                 (ss * (n * count - 1) + 1) if count else 0]
        for role, operand, span, stride in (("dest", dest, spans[0], "dst"),
                                            ("source", source, spans[1], "sst")):
            if operand.count < span:
                raise ValueError(f"alltoalls: {role} has {operand.count} elements; "
                                 f"{plural(n, 'PE')} x "
                                 f"{count} elements with {stride}={ds if role == 'dest' else ss}"
                                 f" need at least {span}")
        size = dest.itemsize
        _disjoint(what, d, spans[0] * size, s, spans[1] * size)
        made[:] = dest, source
        fused.alltoalls(dest, source, ds, ss, count, size, t.me)
        return (d, s, source.dtype, count, (ds, ss)), (
            f"{t.label}alltoalls(dest at heap offset {d:#x}, source at {s:#x}, dst={ds}, "
            f"sst={ss}, nelems={count} x {source.dtype})")

    with t.lock, fused:   # the group's own: one heap-wide lock would hold other teams up
        heap.calls.synchronize()
        _, _, _, count, (ds, ss) = t.agree_checked(
            Phase.ALLTOALLS, f"{t.label}alltoalls(dest, source, dst={dst!r}, sst={sst!r}, "
            f"nelems={nelems!r})", check)
        dest, source = made
        if count == 0:
            return
        size = source.itemsize
        me, m = t.me, n * count
        # the elements dest receives, in order: rows of `size` bytes
        into = dest.data.view(-1, size)[::ds][:m]
        if fused.deliver_strided(into):
            return
        if t.on_node:
            for i, pe in enumerate(t.pes):
                theirs = _mapped(heap, source.data, pe).view(-1, size)[::ss][me * count:(me + 1) * count]
                into[i * count:(i + 1) * count].copy_(theirs)
            t.step(Phase.ALLTOALLS_COPIED, f"{t.label}alltoalls (copied)")
            return
        send = source.data.view(-1, size)[::ss][:m].to("cpu").contiguous()
        receive = torch.empty((m, size), dtype=torch.uint8)
        t.wait(t.comm.Ialltoall(_bytes(send), _bytes(receive)), f"{t.label}alltoalls")
        into.copy_(receive)


# -- reduce -------------------------------------------------------------------------------------
#: the operations of reduce()
REDUCE_NAMES = vocabulary.REDUCE_OPS
#: bytes up to which a reduce on the node reads all of every source on every PE
#: (one step after the agreement) instead of a reduce-scatter and gather (two)
SMALL_REDUCE = 16 << 10
#: the torch face's combiners: name -> torch function with out=
REDUCE_OPS: dict[str, Callable[..., Any]] = dict(zip(REDUCE_NAMES, (
    torch.add, torch.mul, torch.minimum, torch.maximum,
    torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor), strict=True))


@functools.lru_cache(maxsize=None)
def _reducible(op: str, dtype: torch.dtype, device: str) -> str | None:
    """None when torch can combine `dtype` with `op`, else why not."""
    try:
        a = torch.ones(2, dtype=dtype, device=device)
        REDUCE_OPS[op](a, a, out=a)
        return None
    except (RuntimeError, TypeError) as exc:
        return str(exc).splitlines()[0]


def torch_combiner(heap: Core, op: str, dtype: torch.dtype) -> Combine:
    """The torch face's combiner of `dtype` for `op` (torch ops on the heap's
    device), or TypeError where torch cannot combine them."""
    why = _reducible(op, dtype, str(heap.identity.device))
    if why:
        raise TypeError(f"reduce: op {op!r} does not apply to dtype {dtype} ({why}); "
                        f"use another op or reduce a copy in another dtype")
    function = REDUCE_OPS[op]

    def combine(acc: torch.Tensor, other: torch.Tensor) -> None:
        typed = acc.view(dtype)
        function(typed, other.view(dtype), out=typed)

    return combine


@_documented
def reduce(heap: Core, dest, source, op: str = "sum", *, team=None) -> None:
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
    key = _tensor_key("reduce", team, dest, source, op)
    if not replayed(heap, key, dest, source):
        keep(heap, key,
             reduce_bytes(heap, _tensors(dest, source, "reduce"), op,
                          lambda operand: torch_combiner(heap, op, operand.dtype), team=team),
             dest, source)


def _fold_members(heap: Core, t, source: Operand, op: str, combine: Combine, lo: int, hi: int,
                  into: torch.Tensor | None) -> torch.Tensor:
    """Bytes [lo, hi) of source combined over t's members (on this node), in team
    order, so bitwise the same on every PE: into `into` (contiguous CPU bytes that
    overlap no member's source but the first member's) where it is given and C
    folds, else into a new tensor, which is returned. In C at the members'
    addresses where the CPU copies (nodecoll.peer_addresses: a torch view and
    copy_ of a slice cost 3 to 6 us a PE), else in C through torch views of
    their mappings, else by the face's combiner: the same bytes every way."""
    if into is not None:
        sources = nodecoll.peer_addresses(heap, t.pes, source.data)
        if sources and nodecoll.combined_at(into.data_ptr(), hi - lo,
                                            [a + lo for a in sources], source.dtype, op):
            return into
    views = [_mapped(heap, source.data, pe)[lo:hi] for pe in t.pes]
    folded = nodecoll.combined(views, source.dtype, op, heap.identity.native, into)
    if folded is None:
        folded = views[0].clone()
        for view in views[1:]:
            combine(folded, view)
    return folded


def reduce_bytes(heap: Core, operands: Callable[[], tuple[Operand, Operand]], op: str,
                 combiner: Callable[[Operand], Combine], *, team=None) -> nodecoll.Plan | None:
    """reduce() of the Operands that `operands()` makes (see broadcast_bytes),
    combined by `combiner(source)`, the face's combiner of op for source's dtype
    (it raises TypeError where op does not apply: inside the agreement too)."""
    what = "reduce"
    t = group.resolve(heap, team, what)
    made: list = []
    fused = nodecoll.fusion(t)   # the data in the agreed step, where it fits (issue 30)

    def check():
        if op not in REDUCE_NAMES:
            raise ValueError(f"reduce: op must be one of {', '.join(REDUCE_NAMES)}, got {op!r}")
        dest, source = operands()
        d, s = _pair(heap, t, what, dest, source, 1, identical_ok=True)
        made[:] = dest, source, combiner(source)
        fused.reduce(dest, source, op)
        return fused.agreeing(Phase.REDUCE, (d, s, source.dtype, source.count, op), (
            "{}reduce(dest at heap offset {:#x}, source at {:#x}, {} x {}, op={!r})",
            t.label, d, s, source.count, source.dtype, op))   # (the text: only for a message)

    with t.lock, fused:   # the group's own: one heap-wide lock would hold other teams up
        heap.calls.synchronize()
        t.agree_checked(Phase.REDUCE, f"{t.label}reduce(dest, source, op={op!r})", check)
        dest, source, combine = made
        numel, n, me, size = source.count, len(t.pes), t.me, source.itemsize
        if numel == 0:
            return None
        if fused.deliver():
            return fused.plan(t)   # (the face may replay it: nodecoll.replay)
        counts, displs = _chunks(numel, n)
        counts, displs = [c * size for c in counts], [d * size for d in displs]   # bytes
        lo, hi = displs[me], displs[me] + counts[me]
        flat = dest.data
        text = f"{t.label}reduce(op={op!r})"
        if t.on_node and numel * size <= SMALL_REDUCE:
            # Small: every PE combines all of it from every member's source (in team
            # order, so bitwise as below), then one step says every PE has read every
            # source, after which dest (maybe source itself) may change: two steps
            # with the agreement, against three (issue 24: 8 bytes cost 3 round trips)
            acc = _fold_members(heap, t, source, op, combine, 0, numel * size,
                                torch.empty(numel * size, dtype=torch.uint8))
            t.step(Phase.REDUCE_COMBINED, f"{text} (combined)")
            flat.copy_(acc)
            return None
        if t.on_node:
            # 1) this PE combines its chunk from every member's source, in team order,
            # straight into dest's chunk, but where dest is source and this PE's chunk
            # is not the first folded (it would be overwritten)
            straight = me == 0 or flat.data_ptr() != source.data.data_ptr()
            if hi > lo:
                into = flat[lo:hi] if straight else None
                folded = _fold_members(heap, t, source, op, combine, lo, hi, into)
                if folded is not into:
                    flat[lo:hi].copy_(folded)
            t.step(Phase.REDUCE_COMBINED, f"{text} (chunks combined)")
            # 2) every PE gathers the other chunks from their owners' dest
            _copy_from_members(heap, t, flat, flat, [
                (displs[i], i, displs[i], counts[i]) for i in range(n) if i != me and counts[i]])
            t.step(Phase.REDUCE_GATHERED, f"{text} (gathered)")
            return None
        # 1) reduce-scatter: this PE receives its chunk of every member's source ...
        send = _host(source.data)
        pieces = torch.empty(n * counts[me], dtype=torch.uint8)
        t.wait(t.comm.Ialltoallv(_vector(send, counts, displs),
                                 _vector(pieces, [counts[me]] * n,
                                         [i * counts[me] for i in range(n)])),
               f"{text} (scatter)")
        # ... and combines them in team order, as the node path does
        pieces = pieces.view(n, counts[me])
        acc = pieces[0].clone()
        if counts[me]:
            for i in range(1, n):
                combine(acc, pieces[i])
        # 2) allgather of the combined chunks
        receive = _receive_buffer(flat)
        t.wait(t.comm.Iallgatherv(_bytes(acc), _vector(receive, counts, displs)),
               f"{text} (gather)")
        if receive is not flat:
            flat.copy_(receive)
    return None


def all_reduce(heap: Core, dest, source, op: str = "sum", *, team=None) -> None:
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
        NotSymmetricError: a tensor is not a tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        PeerTimeoutError: a PE did not join within the heap's timeout.
    """
    reduce(heap, dest, source, op, team=team)
