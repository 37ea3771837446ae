"""Small collectives fused with their agreed step on the node's board (issue 30).

Where every PE of the heap is on this node and the agreement's steps run on
its shared-memory board in C (agreement/board.py, native/_collective.c), a
collective whose data fits a slot's payload area (board.PAYLOAD bytes per PE)
needs no step of its own for the data: each PE puts what the others need
into its slot in the same step as its call vector, and copies what it needs
of the others' payloads as it reads their slots. The collective is then one
agreed step, one native call per spin budget, instead of the agreement, the
copies through the peer mappings and a second step (collectives.py's node
path, which stays for larger data, teams and the pure Python paths).

collect carries each PE's byte count with its data (one step instead of a
step, an allgather of the sizes and a copy step), alltoalls each PE's strided
elements gathered once. A split team whose parent's steps run on a board in
C gets a board of its own (openshmem/teams.py), so its calls fuse the same way.

A collective makes a Fusion for its call (fusion()), stages its data from
inside its check (once the operands are checked: a live, contiguous block of
the heap's CPU memory, so the addresses passed to C are sound), and after
the agreement calls deliver(): the payload is used only where the step found
every PE's call vector equal (a mismatch raises SymmetryError before, and
dest is left as it was), and only where this step carried it. Whether a call
stages depends only on what the agreement compares (sizes, dtype, op, root)
and on what is the same on every PE (the board, the compiled piece, the
heap's device), so either every PE of an agreed call stages or none does.

A fused call (broadcast, fcollect, collect, alltoall, reduce; not alltoalls',
gathered with strides here) also leaves a Plan (Fusion.plan()): its group,
its agreed call and its payload's addresses. replay() runs it again for a
face that keyed it (shmem/collectives.py, openshmem/collectives.py): the same
lock, step and delivery, without the checks, while the heap vouches that the
blocks it names are still live (a free or a release forgets every Plan).
collect's payload (this PE's count, then its bytes) is a buffer of the Plan's
own, filled from the source before each step (Plan.refresh), and its counts,
which are not agreed, are checked at every step (Collected).

reduce combines in C for integer and float32/float64 dtypes, folded in team
PE order 0, 1, ..., n-1 as the Python combiners fold (bit-identical results
on every PE and to the general path); float min and max, and every other
dtype (float16, bool, complex, long double ...), take the general path.
Larger reduces on the node keep collectives.py's steps but combine in C from
the peers' mappings (combined()), where it applies. Where the CPU copies (host
memory, the compiled piece everywhere), the node paths of reduce, fcollect,
collect and alltoall fold and copy at the members' addresses in this process
(peer_addresses(), remembered while the blocks live; combined_at(),
copy_parts()): torch's located view and slice of each PE's copy cost 3 to 6 us
a PE, which a reduce over 16 PEs paid 31 times.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .. import native
from ..agreement.board import PAYLOAD, Board
from ..agreement.protocol import Call, Phase
from ..errors import ShmemError
from ..native import KINDS, REDUCE_OPS as REDUCE_CODES
from ..vocabulary import WORD_KINDS

try:   # where it is missing, no board fuses (Board.fuses) and nothing here runs
    from ..native import _collective  # type: ignore[attr-defined]  # built by meson; no stub
except ImportError:
    _collective = None

#: element kinds of _collective.c's combine() (vocabulary.WORD_KINDS, as native.KINDS
#: numbers them), by torch dtype
_TORCH_KINDS = {getattr(torch, name): KINDS[code] for code, name in WORD_KINDS}
#: the same by NumPy's (kind, itemsize), for native byte order
_NUMPY_KINDS = {("f" if code in "fd" else "u" if code.isupper() else "i", struct.calcsize(code)):
                KINDS[code] for code, _ in WORD_KINDS}
#: reduce's ops as combine() numbers them (vocabulary.REDUCE_OPS' order)
_OPS = REDUCE_CODES
_FLOAT_KINDS = (KINDS["f"], KINDS["d"])
#: the ops combine() applies to floats (min and max stay with the Python combiners)
_FLOAT_OPS = (_OPS["sum"], _OPS["prod"])


def combinable(dtype, op: str) -> tuple[int, int] | None:
    """combine()'s (kind, op) numbers for reducing `dtype` (torch or NumPy)
    with `op`, or None where C does not combine them (the Python combiners do)."""
    kind, code = element_kind(dtype), _OPS.get(op)
    if kind is None or code is None or (kind in _FLOAT_KINDS and code not in _FLOAT_OPS):
        return None
    return kind, code


@functools.lru_cache(maxsize=256)
def element_kind(dtype) -> int | None:
    """combine()'s kind of a face's dtype (torch or NumPy), or None where C
    does not combine it."""
    if isinstance(dtype, torch.dtype):
        return _TORCH_KINDS.get(dtype)
    kind, itemsize = getattr(dtype, "kind", ""), getattr(dtype, "itemsize", 0)
    if not getattr(dtype, "isnative", False) or getattr(dtype, "names", None) is not None:
        return None
    return _NUMPY_KINDS.get((str(kind), int(itemsize)))


class Collected(NamedTuple):
    """What a collect's step leaves to do (its `after`): every PE's byte count
    checked against `bounds` (dest's heap offset, source's, dest's elements,
    the element size), then the carried bytes written at address `dest`, in
    team order. It depends on the other PEs' counts: checked every call. C
    checks and writes them in one call (_collective.deliver_collected); where
    they do not fit, `settle(*bounds, counts)` raises collect's own error,
    alike on every PE."""
    dest: int
    bounds: tuple[int, int, int, int]
    settle: Any


class Plan(NamedTuple):
    """A fused call as its checks left it (Fusion.plan()): its group, the
    agreed call (encoded once: fixed), the payload board.stage() takes and
    what deliver() writes, all from checked operands (addresses inside live
    blocks of the heap's CPU memory). replay() runs it again without those
    checks, while the face's key (Core.where.recall) says the operands are the
    same and their blocks still live. A payload assembled here (collect's:
    the count, then the bytes) lives in `held`, which `refresh` (dst, src,
    nbytes) fills again from the source before each step. `quick`: the same
    step and delivery in one native call (the group's quick_step()), or None."""
    group: Any
    call: Call
    stage: tuple
    after: tuple
    refresh: tuple = ()
    held: Any = None
    quick: Any = None


class Fusion:
    """One collective call's fused data (see the module doc); a context
    manager that forgets a payload whose step never came (the call raised
    before it)."""

    __slots__ = ("board", "n", "staged", "after", "held", "stage_args", "call", "refresh")

    def __init__(self, board: Board | None, n: int):
        self.board, self.n = board, n
        self.staged: tuple | None = None
        self.after: tuple | None = None
        #: a payload assembled here (collect's, alltoalls'), alive as long as the
        #: call's Fusion (its step reads it; a Plan of collect keeps it: Plan.held)
        self.held: torch.Tensor | None = None
        #: board.stage()'s arguments, where they depend only on the checked operands
        #: (and on collect's buffer, which plan() keeps): what plan() keeps
        self.stage_args: tuple | None = None
        #: (phase, args, text) of the call that carries the payload (agreeing())
        self.call: tuple | None = None
        #: how a Plan fills `held` again (collect's: Plan.refresh)
        self.refresh: tuple = ()

    def __enter__(self) -> Fusion:
        return self

    def __exit__(self, *exc) -> None:
        board = self.board
        if self.staged is not None and board is not None and board.carried is not self.staged:
            board.unstage()

    def _usable(self, dest, source) -> bool:
        return self.board is not None and dest.data.device.type == "cpu" and \
            source.data.device.type == "cpu"

    def _stage(self, source, payload_len: int, part: int, src_offset: int, dst_stride: int,
               only: int, after: tuple) -> None:
        address = source.data.data_ptr() if payload_len else 0
        board = self.board
        assert board is not None   # (_usable() said so)
        self.stage_args = (address, payload_len, part, src_offset, dst_stride, only)
        self.staged = board.stage(*self.stage_args)
        self.after = after

    def agreeing(self, phase: Phase, args: tuple, text) -> tuple:
        """(args, text) of the call that carries what was staged, noted for
        plan(): what a collective's check returns."""
        self.call = (phase, args, text)
        return args, text

    def plan(self, group, after: tuple | None = None) -> Plan | None:
        """This call over `group` as a Plan, once deliver() wrote its result
        (`after`: what replay() does after the step, where not deliver()'s: a
        Collected); None where it staged nothing that a Plan can repeat (no
        payload, or alltoalls', gathered with strides here)."""
        after = self.after if after is None else after
        if self.stage_args is None or self.call is None or after is None:
            return None
        call = Call(*self.call).fixed()
        quick = None
        if self.board is not None:
            # collect's payload is filled again before each step (refresh), and its
            # counts checked after it (Collected: _deliver)
            deliver = (_deliver, (self.board, self.n, after)) if type(after) is Collected \
                else _delivery(self.board, self.n, after)
            quick = group.quick_step(call, self.board.staging(*self.stage_args), deliver,
                                     (native.copy, self.refresh) if self.refresh else None)
        return Plan(group, call, self.stage_args, after, self.refresh, self.held, quick)

    # -- staging, from inside a call's check (operands checked) ----------------------------
    def broadcast(self, dest, source, root: int, me: int) -> None:
        nbytes = source.data.numel()
        if 0 < nbytes <= PAYLOAD and self._usable(dest, source):
            self._stage(source, nbytes if me == root else 0, nbytes, 0, 0, root,
                        (dest.data.data_ptr(), nbytes))

    def fcollect(self, dest, source) -> None:
        m = source.data.numel()
        if 0 < m <= PAYLOAD and self._usable(dest, source):
            self._stage(source, m, m, 0, m, -1, (dest.data.data_ptr(), self.n * m))

    def alltoall(self, dest, source, me: int) -> None:
        total = source.data.numel()
        block = total // self.n
        if 0 < total <= PAYLOAD and self._usable(dest, source):
            self._stage(source, total, block, me * block, block, -1,
                        (dest.data.data_ptr(), total))

    def reduce(self, dest, source, op: str) -> None:
        nbytes = source.data.numel()
        numbers = combinable(source.dtype, op)
        if numbers is not None and 0 < nbytes <= PAYLOAD and self._usable(dest, source):
            self._stage(source, nbytes, nbytes, 0, nbytes, -1,
                        (dest.data.data_ptr(), nbytes, *numbers))

    def collect(self, dest, source) -> None:
        """collect's payload: this PE's byte count (8 bytes), then its bytes,
        where dest's bytes and the count fit a slot (dest's size is agreed:
        every PE alike). A source longer than dest sends its count alone:
        every PE then finds the total too large and raises."""
        room = dest.data.numel()
        if 0 < room <= PAYLOAD - 8 and self._usable(dest, source):
            m = source.data.numel()
            sent = m if m <= room else 0
            self.held = held = torch.empty(8 + sent, dtype=torch.uint8)
            held[:8].view(torch.int64)[0] = m
            held[8:].copy_(source.data[:sent])
            board = self.board
            assert board is not None   # (_usable() said so)
            self.stage_args = (held.data_ptr(), 8 + sent, 8 + room, 0, PAYLOAD, -1)
            self.staged = board.stage(*self.stage_args)
            if sent:   # (a Plan's step fills the count's bytes again from the source)
                self.refresh = (held.data_ptr() + 8, source.data.data_ptr(), sent)

    def alltoalls(self, dest, source, ds: int, ss: int, count: int, size: int, me: int) -> None:
        """alltoalls' payload: this PE's n * count elements of `size` bytes
        (every ss-th of source), gathered here; each PE copies its block of
        every PE's. Where they fit a slot (count, size and n are agreed)."""
        m = self.n * count
        if 0 < m * size <= PAYLOAD and self._usable(dest, source):
            self.held = held = source.data.view(-1, size)[::ss][:m].contiguous()
            block = count * size
            board = self.board
            assert board is not None   # (_usable() said so)
            self.staged = board.stage(held.data_ptr(), m * size, block, me * block, block, -1)
            self.after = (ds, size, m)

    def deliver_strided(self, into) -> bool:
        """Write alltoalls' carried blocks, in team order, into `into` (dest's
        rows of `size` bytes that receive, every ds-th); False where the step
        carried none."""
        staged, board, after = self.staged, self.board, self.after
        if staged is None or board is None or after is None or board.carried is not staged:
            return False
        board.carried = self.staged = None
        _, size, m = after
        into.copy_(torch.frombuffer(board.scratch, dtype=torch.uint8)[:m * size].view(m, size))
        return True

    # -- after the agreement ------------------------------------------------------------------
    def collected(self) -> list[int] | None:
        """collect's byte count of every PE, in team order, where the agreed
        step carried them (deliver_collected() then writes dest); else None."""
        staged, board = self.staged, self.board
        if staged is None or board is None or board.carried is not staged:
            return None
        return _carried_counts(board, self.n)

    def deliver_collected(self, counts: list[int], dest: int) -> None:
        """Write the carried bytes into dest (its address; counts: collected(),
        whose total the caller checked to fit dest), in team order."""
        board = self.board
        assert board is not None and board.carried is self.staged
        board.carried = self.staged = None
        _deliver_collected(board, counts, dest)

    def deliver(self) -> bool:
        """Write dest from the payloads the agreed step carried; False where it
        carried none (the general path then runs)."""
        staged, board, after = self.staged, self.board, self.after
        if staged is None or board is None or after is None or board.carried is not staged:
            return False
        board.carried = self.staged = None   # (nothing left for __exit__ to forget)
        _deliver(board, self.n, after)
        return True


def _carried_counts(board: Board, n: int) -> list[int]:
    """collect's byte count of each of the `n` PEs that the last step carried."""
    words, stride = board.scratch, PAYLOAD // 8
    return [words[pe * stride] for pe in range(n)]


def _deliver_collected(board: Board, counts: list[int], dest: int) -> None:
    offset = 0
    for pe, count in enumerate(counts):
        if count:
            _collective.deliver(dest + offset, board.scratch, pe * PAYLOAD + 8, count)
        offset += count


def _deliver(board: Board, n: int, after: tuple) -> None:
    """Write dest from the payloads of the `n` PEs that the last step carried
    into the board's scratch: `after` is (address, nbytes) for a copy,
    (address, nbytes, kind, op) for a reduction combined in C, or a Collected
    (collect's: the counts checked first)."""
    if type(after) is Collected:
        if _collective is not None and _collective.deliver_collected(
                after.dest, board.scratch, n, PAYLOAD, *after.bounds):
            return
        counts = _carried_counts(board, n)
        after.settle(*after.bounds, counts)   # (raises on every PE alike: nothing written)
        _deliver_collected(board, counts, after.dest)
    else:
        write, args = _delivery(board, n, after)
        write(*args)


def _delivery(board: Board, n: int, after: tuple) -> tuple:
    """_deliver()'s native call for a copy or a combined reduction, as
    (function, args): what a quick step calls after its step."""
    if len(after) == 2:
        return _collective.deliver, (after[0], board.scratch, 0, after[1])
    address, nbytes, kind, code = after
    return _collective.combine, (address, nbytes, board.scratch, n, kind, code)


def combined(views: list, dtype, op: str, native: bool,
             into: torch.Tensor | None = None) -> torch.Tensor | None:
    """views[0] op views[1] op ... (uint8 CPU tensors of one length over the
    PEs' copies through the node's mappings, in team PE order: live blocks the
    heap located) folded in C, as the Python combiners fold them, into `into`
    (a contiguous uint8 CPU tensor of that length, overlapping no view but
    views[0] itself) or else a new tensor, which is returned; None where C does
    not combine `dtype` with `op`, or where the heap does not use the compiled
    piece (`native`: its vote, SHMEMVM_NATIVE), or the memory is not the CPU's."""
    numbers = combinable(dtype, op) if native and views[0].device.type == "cpu" else None
    if _collective is None or numbers is None:
        return None
    nbytes = views[0].numel()
    if any(view.numel() != nbytes or view.device.type != "cpu" for view in views):
        return None
    if into is None:
        into = torch.empty(nbytes, dtype=torch.uint8)
    elif into.numel() != nbytes or into.device.type != "cpu" or not into.is_contiguous():
        return None
    _combine_from(into.data_ptr(), nbytes, [view.data_ptr() for view in views], numbers)
    return into


def combined_at(into: int, nbytes: int, addresses: Sequence[int], dtype, op: str) -> bool:
    """combined()'s fold in C at addresses (peer_addresses()'s, each offset to
    the same part): `nbytes` at each of `addresses`, in team PE order, folded
    into the `nbytes` at `into` (overlapping none but the first); False where C
    does not combine `dtype` with `op` (nothing done: the caller folds)."""
    numbers = combinable(dtype, op)
    if _collective is None or numbers is None:
        return False
    _combine_from(into, nbytes, addresses, numbers)
    return True


def _combine_from(into: int, nbytes: int, addresses: Sequence[int], numbers: tuple[int, int]):
    if nbytes:
        _collective.combine_from(into, nbytes, tuple(addresses), *numbers)


def peer_addresses(core, pes: tuple[int, ...], tensor: torch.Tensor) -> tuple[int, ...] | None:
    """Where the copies of `tensor` (contiguous bytes of a live block of this
    PE's) of PEs `pes` (a node path's: each mapped here) lie in this process,
    in that order, where the CPU copies them itself (Target.cpu_address: host
    memory, the compiled piece on every PE), for a node path's copies and
    folds in C; None where it does not (the caller's torch views). Remembered
    while the blocks live (Core.where.recall): a located view and a slice of
    it cost 3 us a PE (torch's indexing: half of it), a reduce over 16 PEs 31."""
    key = ("peer addresses", tensor.data_ptr(), tensor.nbytes, pes)
    kept = core.where.recall(key)
    if kept is None:
        addresses = tuple(core.where.locate(tensor, pe, "tensor").cpu_address for pe in pes)
        kept = False if None in addresses else addresses
        core.where.remember(key, kept)
    return kept or None


def copy_parts(into: int, addresses: tuple[int, ...],
               parts: list[tuple[int, int, int, int]]) -> None:
    """Each (to, i, start, nbytes) of `parts`: the `nbytes` at addresses[i] +
    start (peer_addresses()'s) copied to into + to, in C (torch's copy_ of a
    slice of a located view costs 4 to 6 us a part, this 0.3)."""
    for to, i, start, nbytes in parts:
        native.copy(into + to, addresses[i] + start, nbytes)


def replay(core, plan: Plan) -> bool:
    """Run `plan` again: the same steps as the call that made it, less its
    checks of the operands (the caller's key stands for them): the group's
    lock, the device's work, the payload staged, the agreed step with the same
    call (a mismatch or a dead, stopped or late PE raise as they would there;
    a destroyed team or an unusable heap as the general path's checks do: the
    group's agree() asks), and dest written. False where the board cannot
    carry it now (the caller takes the general path). All of it in one native
    call where nothing is unusual (plan.quick), else step by step (staged())."""
    quick = plan.quick
    if quick is not None and quick() is not None:   # (None: nothing done, unusual)
        return True
    return staged(core, plan)


def staged(core, plan: Plan) -> bool:
    """replay() step by step in Python: the path a Plan without a quick step
    takes, and one whose quick step stepped aside."""
    group = plan.group
    # (a Plan is made only where fusion() gave the group a board; its board and
    # members do not change while the group lives: no Fusion to make again)
    board = group.agreement.board
    if board is None or not board.can_carry:
        return False
    with group.lock:
        core.calls.synchronize()
        if plan.refresh:   # (collect's: this PE's bytes into its payload, after the count)
            native.copy(*plan.refresh)
        staged = board.stage(*plan.stage)
        try:
            group.agree(plan.call)
        finally:
            carried = board.carried is staged
            if not carried:
                board.unstage()   # (as Fusion's exit: the call raised before its step)
        if not carried:   # (can_carry: a step that ran carried it)
            raise ShmemError("a fused collective's agreed step did not carry its payload (a "
                             "bug: please report it with SHMEMVM_DEBUG=1's log)")
        board.carried = None
        _deliver(board, len(group.pes), plan.after)
    return True


def fusion(group) -> Fusion:
    """A Fusion for a collective call over `group` (a Group: its agreement,
    members and on_node, the same on every member); it stages nothing where
    the group's steps do not run on a board in C."""
    board = group.agreement.board
    if board is None or not board.fuses or not group.on_node:
        board = None
    return Fusion(board, len(group.pes))
