"""HeapCore: what one symmetric heap is, and the few things every routine needs.

The state: this PE's place (comm, my_pe, n_pes, the node's PEs), its memory
(`local`: the VMM heap with its allocator; `peers`: the node peers' heaps
mapped here; `window`: the MPI window for the other nodes), the agreement
that every collective starts with, the route to every PE (transport/route.py),
the default context's completion tracker, and the heap's lock.

The services: agree() (one agreed step of a collective, which also releases
the blocks that every PE has dropped), symmetric() (the live block a tensor
views), check_pe(), window_for() and quiet_all(); the memory calls of the
routines, each one core call: allocate() (here), free(), reallocate(),
trim() and import_external() (core/steps.py). What the heap is, the routines
read from `identity` (a frozen Identity).

The routines (openshmem/) are functions over a HeapCore; each keeps its own
per-heap state in a `feature` of the heap (locks held, teams made, hints), an
object the core keeps for it and closes at teardown, so that no feature's
state lives in this class. The core is built by setup.py; SymmetricHeap
(heap.py) is the public class that composes it with the routines.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from mpi4py import MPI

from .. import _args, native
from ..agreement.agreement import Agreement
from ..agreement.liveness import Liveness
from ..agreement.protocol import Call, Outcome, Phase
from ..backends.base import VMMBackend, waits
from ..errors import HeapExhaustedError, NotSymmetricError, ShmemError, UnsupportedError
from ..memory import ownership
from ..memory.buddy import Block, Segment
from ..memory.heapmem import HeapMemory
from ..memory.vmm import HeapStats
from ..node.anchor import Anchor
from ..node.exchange import Exchange
from ..node.fdpass import FdChannel
from ..node.peers import PeerTable
from ..transport.completion import CompletionTracker
from ..transport.offnode import OffNodeWindow
from ..transport.route import Routes
from ..transport.target import Locator, Target
from . import sharing, steps
# the typed door the routines see (core/door.py), named here too: where they import it from
from .door import (Calls, Context, Contexts, Core, Feature, FeatureKey,  # noqa: F401
                   Identity, Memory, Where)

log = logging.getLogger("shmemvm")

#: heap_bases()' warning where a host heap's table is made outside Triton's interpreter
HOST_BASES_HINT = (
    "heap_bases() of a host heap, with TRITON_INTERPRET unset: Triton kernels run on the CPU "
    "only in its interpreter, and a kernel launched without it fails with Triton's "
    "'0 active drivers' where there is no GPU. For kernels over a host heap, set "
    "TRITON_INTERPRET=1 before importing triton; to use the table without Triton, ignore this")


#: locate_in()'s and recall()'s memos hold at most this many entries each
_LOCATED_MAX = 4096
#: quick steps kept (Calls.quick: barriers', allocations' and frees'; HeapCore._kept_quick)
QUICK_KEPT = 1024
#: (no quick step made yet for a key; None is "none there")
_UNMADE = object()


def _triton_interprets() -> bool:
    """Whether TRITON_INTERPRET turns Triton's interpreter on (Triton's own reading)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes", "y")


#: the core of each SymmetricHeap (core_of()), for the faces above the routines
#: (shmem/, api.py, device/) and a Ctx made from a heap
_CORES: weakref.WeakKeyDictionary[Any, HeapCore] = weakref.WeakKeyDictionary()


def core_of(heap: Any) -> HeapCore:
    """The core of `heap`: a SymmetricHeap's (the one it holds), or `heap`
    itself where it is a core. TypeError for anything else."""
    if isinstance(heap, HeapCore):
        return heap
    try:
        return _CORES[heap]
    except (KeyError, TypeError):
        raise TypeError(f"expected a shmemvm SymmetricHeap, got {type(heap).__name__}") \
            from None


@dataclass(frozen=True, slots=True)
class Parts:
    """The parts a heap's core is built from (core/setup.py makes them; HeapCore
    takes them whole). No routine sees them (the door is Core); parts_of()
    gives them to tests and to debugging."""
    #: this PE's memory: the VMM heap with its allocator (memory/heapmem.py)
    local: HeapMemory
    #: the node peers' heaps mapped here (node/peers.py)
    peers: PeerTable
    #: this PE's mailbox and the fd exchange over it that maps new memory on the peers
    channel: FdChannel
    exchange: Exchange
    #: memory kept exported and mapped by the node's PEs (None: none; node/anchor.py)
    anchor: Anchor | None
    #: the MPI window for the other nodes (and a host heap's atomics), or None and why
    window: OffNodeWindow | None
    window_error: str | None
    #: the agreement every collective starts with, and this PE's liveness record
    agreement: Agreement
    liveness: Liveness
    #: the default context's completion tracker, the route to each PE and the resolution
    #: of an operation's target (transport/)
    completion: CompletionTracker
    routes: Routes
    locator: Locator
    #: the node peers' pids and mailboxes (node/exchange.py)
    peer_pids: dict[int, int]
    peer_paths: dict[int, str]


def parts_of(heap: Any) -> Parts:
    """The parts of `heap`'s core (a SymmetricHeap or a core), for tests and
    debugging: `parts_of(heap).local.stats()`. Library code outside core/
    never uses it (tests/unit/test_house.py): the routines' door is Core."""
    return core_of(heap)._parts


def _not_freed(memory: object, array_type: type | None = None) -> None:
    """Memory.free_memory and free_tensor without the compiled piece: always
    step aside."""
    return None


class _QuickSteps(dict):
    """Calls.quick: `quick[call]` is a fixed call's quick step (make_quick()),
    made at its first use; None where the heap has none."""

    __slots__ = ("_core",)

    def __init__(self, core: HeapCore) -> None:
        super().__init__()
        self._core = core

    def __missing__(self, call: Call) -> Callable[[], object] | None:
        quick = self[call] = self._core.make_quick(call)
        return quick


class HeapCore:
    """One symmetric heap's state and services (see the module doc), made whole:
    setup.py builds every part, then hands them all to the constructor."""

    def __init__(self, face: Any, identity: Identity, parts: Parts, *, node_pes: list[int],
                 thread_level: int) -> None:
        """`face`: the SymmetricHeap that holds this core (what Ctx.heap and
        Team.heap name); None for a core of its own (a test's). `identity`,
        `parts`, `node_pes` (in PE order) and `thread_level`: what setup.py
        made, each ready."""
        #: the heap of this context: itself (the heap is its own default context)
        self.core = self
        self._face = weakref.ref(face) if face is not None else None
        if face is not None:
            _CORES[face] = self
        #: what the heap is, for the routines (Core.identity); its facts also as attributes
        #: here, read by the core's own services
        self.identity = identity
        self.comm: MPI.Intracomm = identity.comm
        self.node: MPI.Comm = identity.node
        self.my_pe: int = identity.my_pe
        self.n_pes: int = identity.n_pes
        self.timeout: float = identity.timeout
        #: every PE uses the compiled fast paths (native/; voted on at init)
        self.native: bool = identity.native
        self.node_pes = node_pes
        self.thread_level = thread_level
        #: the parts (Parts says what each is; parts_of() gives them to tests), also one
        #: attribute each, which the core's own services read
        self._parts = parts
        self.local = parts.local
        self.backend: VMMBackend = parts.local.backend
        self.peers = parts.peers
        self.channel = parts.channel
        self.exchange = parts.exchange
        self.anchor = parts.anchor
        self.window = parts.window
        self.window_error = parts.window_error
        self.agreement = agreement = parts.agreement
        self.liveness = parts.liveness
        self.completion = parts.completion
        self._device = waits(self.backend)   # (synchronize(): a stream to wait for)
        #: the default context's tracker (quiet() completes it): an attribute, not a
        #: property, as every put, get and barrier reads it
        self.tracker: CompletionTracker = parts.completion
        self.routes = parts.routes
        self.locator = parts.locator
        #: Where.call_key: the Locator's (an attribute: every replayed NumPy collective reads it)
        self.call_key = parts.locator.call_key
        self.peer_pids = parts.peer_pids
        self.peer_paths = parts.peer_paths
        #: serialises this heap's collective calls and their state (a thread that
        #: makes a collective call holds it for the whole call)
        self.lock = threading.RLock()
        self.closed = False
        #: blocks dropped (garbage-collected) here, not yet released on every PE
        self._pending: set[int] = set()
        #: the trackers of live contexts other than the default one (contexts.py)
        self._trackers: weakref.WeakSet = weakref.WeakSet()
        #: the facets of the door (Core): this core, seen through each one's Protocol
        self.calls: Calls = self
        self.where: Where = self
        self.memory: Memory = self
        self.contexts: Contexts = self
        #: per-heap state of the routines, by key, in the order made (feature())
        self._features: dict[FeatureKey[Any], Any] = {}
        self._bases: torch.Tensor | None = None   # heap_bases(), made once
        #: locate()'s and locate_in()'s memo (_target()), (address, pe) -> Target: what
        #: was resolved for a live block, kept until a block stops being live here
        #: (retire(), release_dead()), so that a repeated put or atomic resolves in one
        #: dict lookup
        self._located: dict[tuple[int, int], Target] = {}
        #: located()'s memo, alike: (address, pe) -> (a weak reference to the storage of
        #: the tensor located there, its Target)
        self._located_tensors: dict[tuple[int, int], tuple[weakref.ref, Target]] = {}
        #: recall()'s memo, alike: what a routine checked of its operands (a fused
        #: collective's Plan, transport/nodecoll.py), by a key of the face's, kept
        #: while every block stays live here (forget() clears both)
        self._recalled: dict[tuple, Any] = {}
        #: the releases of allocate()'s one step, held until its block is taken
        #: (release_dead()); None outside it
        self._held: set[int] | None = None
        # the dead blocks taken into _pending and released (the agreement releases
        # the blocks every PE dropped through this core), in one compiled call each
        # (native/dead.c) where the engine has its compiled branch, else these methods
        cached = parts.local.cached_blocks
        dead = native.DeadBlocks(self, cached) if native.DeadBlocks and cached else None
        self._take_dead = dead.take if dead is not None else self._dead_to_release
        agreement.release = dead.release if dead is not None else self.release_dead
        #: Calls.quick: each fixed call's whole step in one native call, or None
        self.quick = _QuickSteps(self)
        # the faces' frees (the NumPy face's memory, a torch tensor), each whole in one
        # compiled call where its quick step is kept (native/face_free.c): steps.free's
        # path for them, in order
        face_free = native.FaceFree(self, cached, torch.Tensor, ownership.use_count_of,
                                    ownership.HELD_ALONE) \
            if native.FaceFree and cached else None
        self.free_memory = face_free.free_memory if face_free is not None else _not_freed
        self.free_tensor = face_free.free_tensor if face_free is not None else _not_freed

    # -- what the heap is ---------------------------------------------------------------
    @property
    def face(self) -> Any:
        """The SymmetricHeap that holds this core (itself where none does):
        what users see as a Ctx's or a Team's `heap`."""
        face = self._face() if self._face is not None else None
        return face if face is not None else self

    @property
    def device(self) -> torch.device:
        """The device of the heap's memory (cpu for the host backend)."""
        return self.backend.device

    @property
    def backend_name(self) -> str:
        """The backend's name ("host", "cuda", "hip"), for messages and heap_info()."""
        return self.backend.name

    @property
    def granularity(self) -> int:
        """The backend's granularity: the largest alignment, the unit of segments."""
        return self.backend.granularity

    @property
    def heap_size(self) -> int:
        """The physical budget of this PE's heap, in bytes."""
        return self.local.heap_size

    def query_thread(self) -> int:
        """The thread level this heap provides.

        Returns:
            shmemvm.THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED or
            THREAD_MULTIPLE (0..3): what init(thread_level=...) asked for, or
            by default the highest level MPI was initialised at.

        Raises:
            Nothing; the level is fixed when the heap is made.
        """
        return self.thread_level

    @property
    def broken(self) -> str | None:
        """Why the heap is unusable (a timed-out step), or None."""
        return self.agreement.broken

    def check_usable(self) -> None:
        """ShmemError once finalized, PeerTimeoutError once broken."""
        if self.closed:
            raise ShmemError("this symmetric heap is finalized; call init() again for a new one")
        self.agreement.check_usable()

    def feature(self, key: FeatureKey[Feature], make: Callable[[], Feature]) -> Feature:
        """The per-heap state of a routine module, made by `make()` at its first
        use; an object with a close() method is closed at teardown, the last
        made first (teams before the communicators they were split from)."""
        state = self._features.get(key)
        if state is None:
            self.check_usable()
            state = self._features[key] = make()
        return state

    def close_features(self) -> None:
        """Close every feature's state (teardown), the last made first; forget
        the memos (their Plans name the world group, a feature)."""
        features, self._features = self._features, {}
        self.forget()
        for state in reversed(list(features.values())):
            close = getattr(state, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # keep closing the rest
                    log.exception("shmemvm: error while closing %s", type(state).__name__)

    # -- the agreement ---------------------------------------------------------------------
    def agree(self, call: Call, *, flag: bool = True) -> Outcome:
        """One agreed step of a collective: every PE makes this same `call` (else
        SymmetryError everywhere), and the blocks that nothing views on any PE
        any more are released first. The same outcome on every PE."""
        agreement = self.agreement
        if self.closed or agreement.broken:
            self.check_usable()
        # (positional: no keyword parsing)
        return agreement.collective(call, self._take_dead(), flag)

    def _dead_to_release(self) -> set[int]:
        """The blocks that nothing here views any more, which the next step
        carries (agree(), and an allocation's quick step): this PE's newly dead
        ones taken from the engine into those still pending."""
        dead = self.local.take_dead()
        if dead:
            self._pending.update(dead)
        return self._pending

    def make_quick(self, call: Call, guards: tuple = (), carry: tuple | None = None,
                   deliver: tuple | None = None, before: tuple | None = None,
                   answer: bool = False, releasing: bool = False) -> Callable[..., object] | None:
        """`call`'s quick step on the heap's own agreement (quick_step()), taken
        while nothing agree() and quiet() would deal with is there: blocks to
        release (unless `releasing`: the step then carries them, as agree()'s
        does), operations to complete, nor any of the caller's `guards`;
        carrying `carry` (made by `before`) and delivering `deliver` where
        given (a fused collective's; an allocation's, whose tensor it returns
        with `answer`). None where there is none (quiet() always synchronizes
        a stream)."""
        quiet = self.tracker.idle_guards
        if quiet is None:
            return None
        releases = ((self, "_pending"),) + self.local.idle_guards
        if releasing:
            return self.quick_step(self.agreement, call, self.lock, quiet + guards,
                                   carry=carry, deliver=deliver, before=before, answer=answer,
                                   dead=(self._take_dead, releases))
        return self.quick_step(self.agreement, call, self.lock, releases + quiet + guards,
                               carry=carry, deliver=deliver, before=before, answer=answer)

    def quick_step(self, agreement: Agreement, call: Call, lock, guards: tuple,
                   wrap=None, carry: tuple | None = None, deliver: tuple | None = None,
                   before: tuple | None = None, answer: bool = False,
                   dead: tuple[Callable[[], set[int]], tuple] | None = None
                   ) -> Callable[..., object] | None:
        """A quick step of `call` on `agreement` (the heap's, or a team's) under
        `lock` (Agreement.quick), while `guards` and the heap's own (broken; a
        finalized heap's boards are closed) are false; `wrap(settle)` runs a
        step that is not plain (a team's: a timeout breaks the heap too); a
        fused collective's step carries `carry` (made by `before`) and calls
        `deliver` (whose result it returns with `answer`: an allocation's); the
        step carries dead blocks as `dead` says (Agreement.quick). None where
        there is none: a finalized heap, a device backend (a collective waits
        for the stream first), no native board."""
        if self.closed or self._device:
            return None
        if agreement is not self.agreement:
            guards += ((self.agreement, "broken"),)
        return agreement.quick(call, lock, guards, wrap, carry, deliver, before, answer, dead)

    def release_dead(self, offsets: set[int]) -> None:
        """Release the blocks that nothing views on any PE any more (the
        agreement calls this inside a step, on every PE alike; during
        allocate()'s one step, right after its allocation instead)."""
        if self._held is not None:
            self._held |= offsets
            return
        self.forget()   # (their targets and Plans with them)
        for offset in sorted(offsets):
            # An unmap failure of imported memory (logged, returned) is not raised:
            # this runs inside whichever collective call came next, and raising on
            # one PE alone would put the PEs out of step. The mapping left behind
            # is replaced when the offset is mapped again.
            self.local.release(offset)
        # A new set, not `-=`: a set keeps the table of its largest size, and every
        # step reads this one (its digest, the release), walking the whole table;
        # after 20000 blocks released at once, a NumPy alloc + free took 5x longer
        self._pending = self._pending - offsets

    # -- arguments every routine checks --------------------------------------------------
    def check_pe(self, pe) -> int:
        """`pe` as an int in 0..n_pes-1 (NumPy and other integer types too), or
        TypeError/ValueError."""
        if type(pe) is int and 0 <= pe < self.n_pes:   # the common case, at once
            return pe
        return _args.pe(pe, self.n_pes)

    def symmetric(self, tensor: torch.Tensor, role: str) -> Block:
        """The live block `tensor` views; FreedTensorError (freed) or
        NotSymmetricError (never this heap's) naming its `role` otherwise,
        ShmemError/PeerTimeoutError where the heap is unusable."""
        if self.closed or self.broken:
            self.check_usable()
        try:
            return self.local.block_of(tensor)
        except NotSymmetricError as exc:   # the same kind, naming the role
            raise type(exc)(f"the {role} must be a live symmetric tensor: {exc}") from None

    #: the default context's PE numbers are the heap's own: checked, not mapped
    world_pe = check_pe

    def symmetric_contiguous(self, tensor, role: str, what: str) -> int:
        """The heap offset of `tensor`, after checking it is a contiguous symmetric
        tensor (the collectives' and the device all-reduce's operands)."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what}: {role} must be a symmetric torch.Tensor, got "
                            f"{type(tensor).__name__}")
        self.symmetric(tensor, f"{role} of {what}")
        if not tensor.is_contiguous():
            raise ValueError(f"{what}: {role} has shape {tuple(tensor.shape)} and strides "
                             f"{tuple(tensor.stride())}, which is not contiguous; collectives "
                             f"work on contiguous symmetric tensors (a whole tensor or a slice "
                             f"of its first dimension)")
        return self.local.offset_of(tensor)

    # -- where an operation lands (transport/target.py) -----------------------------------
    def locate(self, tensor: torch.Tensor, pe: int, role: str) -> Target:
        """Where symmetric `tensor`'s bytes lie on PE `pe` (a checked PE number),
        resolved once for the operation: the live block (else FreedTensorError
        or NotSymmetricError naming `role`; ShmemError where the heap is
        unusable), the route, the generation mapped here for a node peer, and
        the address, CPU address, window or kernel path (Target)."""
        block = self.symmetric(tensor, role)
        # = offset_of(tensor): symmetric() found its storage at storage_start
        offset = self.local.storage_start(block) + int(tensor.storage_offset()) * tensor.element_size()
        # (`tensor` views this live block, symmetric() said so: the memo holds)
        return self._target(block, self.local.base + offset, pe)

    def locate_in(self, allocation: torch.Tensor, address: int, pe: int) -> Target | None:
        """locate() for the byte at `address` inside `allocation` (a whole
        block's tensor, as the NumPy face keeps it); None where the heap is
        unusable or the block is not live here, so that the caller takes the
        general path, which names what is wrong. The Target is locate()'s own,
        remembered while its block stays live (a free or a release forgets
        every one): no second resolution, only a memo of the first."""
        agreement = self.agreement
        if self.closed or agreement.broken:
            return None
        try:
            return self._located[address, pe]
        except KeyError:
            pass
        return self._live_target(allocation, address, pe)

    def located(self, tensor: torch.Tensor, pe: int) -> Target | None:
        """locate() for the torch face's one-pass put and get (openshmem/rma.py):
        the Target of `tensor` (exactly a torch.Tensor) on PE `pe` (a checked
        PE number), remembered with a weak reference to tensor's storage while
        every block stays live (forget()): the same storage at the same address
        is then the same live block, found in one lookup. None where the heap
        is unusable or `tensor` views no live block here, so that the caller
        takes locate(), which names what is wrong."""
        if self.closed or self.agreement.broken:
            return None
        storage = tensor.untyped_storage()
        key = (tensor.data_ptr(), pe)
        kept = self._located_tensors.get(key)
        if kept is not None and kept[0]() is storage:
            return kept[1]
        target = self._live_target(tensor, key[0], pe)   # (data_ptr(): locate()'s address)
        if target is None:
            return None
        if len(self._located_tensors) >= _LOCATED_MAX:   # (many addresses: start again)
            self._located_tensors.clear()
        self._located_tensors[key] = (weakref.ref(storage), target)
        return target

    def _live_target(self, tensor: torch.Tensor, address: int, pe: int) -> Target | None:
        """_target() of the byte at `address` of the live block `tensor` views,
        or None where it views none here (locate_in() and located(): their
        caller's general path names why)."""
        try:
            block = self.local.block_of(tensor)
        except NotSymmetricError:
            return None
        return self._target(block, address, pe)

    def _target(self, block: Block, address: int, pe: int) -> Target:
        """The Target of the byte at `address` inside live `block` on PE `pe`,
        from the memo of locate() and locate_in() (kept while every block stays
        live: forget()), else resolved by the Locator and remembered."""
        key = (address, pe)
        target = self._located.get(key)
        if target is None:
            target = self.locator.locate(block, address - self.local.base, pe)
            if len(self._located) >= _LOCATED_MAX:   # (many addresses: start again)
                self._located.clear()
            self._located[key] = target
        return target

    def recall(self, key: tuple) -> Any:
        """What remember() kept under `key`, or None: every block live when it
        was kept is still live here (a free or a release forgets everything)."""
        return self._recalled.get(key)

    def remember(self, key: tuple, value: Any) -> None:
        """Keep `value` (what a routine checked of operands over live blocks,
        which `key` names exactly) for recall() while those blocks stay live."""
        if len(self._recalled) >= _LOCATED_MAX:   # (many keys: start again)
            self._recalled.clear()
        self._recalled[key] = value

    def forget(self) -> None:
        """Forget what locate_in() and remember() kept: a block stopped being
        live here (a free, a release), a team was destroyed (its Plans hold
        its group), or the heap is torn down."""
        self._located.clear()
        self._located_tensors.clear()
        self._recalled.clear()

    def array_address(self, array: Any) -> int | None:
        """Where C-contiguous NumPy `array`'s data starts, where the NumPy face's
        one-pass put, get and atomics apply on this heap, else None (the
        Locator decides: every branch on the compiled piece is in transport/)."""
        return self.locator.array_address(array)

    def storage_offset(self, tensor: torch.Tensor) -> int:
        """Heap offset where symmetric `tensor`'s storage starts (ptr()'s views)."""
        return tensor.untyped_storage().data_ptr() - self.local.base

    def hold(self, block: Block, view: torch.Tensor) -> torch.Tensor:
        """`view` (of `block`'s memory, here or on a peer) keeping the block
        from reuse while it lives (memory/ownership.py)."""
        return self.local.hold(block, view)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """A blocking copy between two tensors of this process (the backend's)."""
        self.locator.copy(dst, src)

    def atomics_window(self, what: str, pe: int) -> OffNodeWindow:
        """The MPI window an atomic on PE `pe` goes through, or UnsupportedError."""
        return self.locator.atomics_window(what, pe, self.window_error)

    def publish_lock(self, offset: int, ticket: int | None, how: str | None) -> None:
        """Tell the other PEs through this PE's liveness record what it does with
        the lock at `offset` (openshmem/locks.py)."""
        self.liveness.lock_state(offset, ticket, how)

    def all_mapped(self, pes) -> bool:
        """Every PE of `pes` is addressable from here (a team's node path)."""
        return self.routes.all_mapped(pes)

    def allgather_bytes(self, phase, data: bytes, text: str) -> list[bytes]:
        """Every PE's `data`, in PE order (the agreement's, on the heap's PEs)."""
        return self.agreement.allgather_bytes(phase, data, text)

    def mark_broken(self, why: str) -> None:
        """Mark the heap unusable (a timed-out step): every later call raises."""
        self.agreement.mark_broken(why)

    @property
    def anchor_size(self) -> int:
        """Bytes of this PE's anchor (node/anchor.py), 0 without one."""
        return self.anchor.size if self.anchor is not None else 0

    # -- the heap's engine (memory/vmm.py), for alloc.py ---------------------------------
    def retire(self, tensor: torch.Tensor, detach: bool = True):
        """Start freeing `tensor`'s block (undone unless finish_free() follows;
        a face's own tensor, `detach` false, is not emptied)."""
        self.forget()   # its block is live no more: nor its targets and Plans
        return self.local.retire(tensor, detach)

    def stats(self) -> HeapStats:
        """The engine's usage figures (heap_info())."""
        return self.local.stats()

    # -- collective steps of memory (core/sharing.py) ------------------------------------
    def allocate(self, call: Call, nbytes: int, dims: tuple[int, ...], dtype: torch.dtype,
                 fill: Callable[[torch.Tensor], object] | None = None,
                 memo: tuple | None = None) -> torch.Tensor:
        """One collective allocation: the agreement on `call` (SymmetryError on
        every PE where the PEs differ; call.error where every PE made it), a
        block of `nbytes` (HeapExhaustedError on every PE where none fits), and
        its tensor of `dims` and `dtype`, filled on every PE before any PE
        returns by `fill` (given the tensor's bytes as a uint8 tensor).

        One agreed step where the block is a cached one (a small block of its
        size released on every PE, the common case: the allocator is the same
        on every PE, so each PE fills the block it will take before the
        agreement). Otherwise (a new segment, a first block of its size) a
        second step, after the fill. A fill that raises before the agreement
        makes every PE raise at this call.

        Without a fill, a repeated allocation is first its quick step
        (quick_allocation()): this same step and allocation in one native
        call, where nothing agree() would deal with is there. That step is
        kept under `memo` too, where the face gives one: the face's own
        arguments, which make this same call every time (remembered_allocation():
        a face's repeated call takes it without forming the call again)."""
        if fill is None and call.error is None:
            quick = self.quick_allocation(call, nbytes, dims, dtype)
            if memo is not None:
                self._remember_allocation(memo, quick)
            if quick is not None:
                tensor = quick()
                if tensor is not None:
                    return tensor
        local = self.local
        size = math.prod(dims) * dtype.itemsize
        with self.lock:
            filled = None
            # A small block with a fill: the step's releases of dropped blocks wait
            # until the block is taken, so that a block released by the last such
            # step is the cached one the next takes, and is filled before its step
            # (it was released on every PE: nothing views it anywhere).
            holding = False
            if fill is not None and call.error is None and size > 0:
                filled = local.cached_block(nbytes)   # (None: not small; -1: none cached)
                holding = filled is not None
                if filled is not None and filled >= 0:
                    try:
                        fill(local.scratch(filled, size))
                        self.backend.synchronize()
                    except Exception as exc:  # noqa: BLE001 - agreed on: every PE raises
                        call.error = exc
            if holding:
                self._held = set()
            try:
                self.agree(call)
                try:
                    tensor = self._allocated(nbytes, dims, dtype, call)
                except HeapExhaustedError:
                    held, self._held = self._held, None
                    if not held:
                        raise
                    self.release_dead(held)   # (room, maybe: as on every PE)
                    tensor = self._allocated(nbytes, dims, dtype, call)
            finally:
                if holding:
                    held, self._held = self._held, None
                    if held:
                        self.release_dead(held)
        if fill is not None and size:
            offset = local.offset_of(tensor)
            if offset != filled:   # (the same on every PE; filled is None or -1 where
                # nothing was filled before the step)
                fill(local.scratch(offset, size))
                self.backend.synchronize()
                self.agree(call.step(Phase.FILLED, "filled"))
        return tensor

    def _allocated(self, nbytes: int, dims: tuple[int, ...], dtype: torch.dtype,
                   call: Call) -> torch.Tensor:
        """The tensor of the block that the agreed `call` allocates (its step
        done): allocate()'s work after its step, and its quick step's."""
        return self.local.tensor_for(sharing.allocate_collectively(self, nbytes, call), dims,
                                     dtype)

    def quick_allocation(self, call: Call, nbytes: int, dims: tuple[int, ...],
                         dtype: torch.dtype) -> Callable[[], torch.Tensor | None] | None:
        """allocate()'s quick step for `call` without a fill (make_quick(): the
        agreed step, carrying the pending releases, then _allocated() in the
        same native call, returning the tensor, or None where it did nothing);
        kept (_kept_quick()) by the call's phase, arguments and text."""
        key = ("allocate", call.phase, call.args, call.source, nbytes, dims, dtype)
        try:
            quick = self.quick.get(key, _UNMADE)   # type: ignore[call-overload]
        except TypeError:   # (an unhashable argument)
            return None
        if quick is not _UNMADE:
            return quick
        return self._kept_quick(key, call, lambda fixed: self.make_quick(
            fixed, deliver=self._delivery(nbytes, dims, dtype, fixed), answer=True,
            releasing=True))

    def _delivery(self, nbytes: int, dims: tuple[int, ...], dtype: torch.dtype,
                  call: Call) -> tuple:
        """A quick allocation's work after its step, as make_quick() takes it:
        _allocated(), through the engine's compiled cached branch where there is
        one (a block of a size freed lately, its tensor and record in one call;
        _allocated() itself for any other block)."""
        cached = self.local.cached_blocks
        if cached is None:
            return self._allocated, (nbytes, dims, dtype, call)
        return cached.take, (nbytes, dims, dtype, self._allocated, nbytes, dims, dtype, call)

    def remembered_allocation(self, memo: tuple) -> Callable[[], torch.Tensor | None] | None:
        """The quick step that allocate() kept under a face's `memo` (the face's
        arguments, which made the same call each time), or None: the face then
        forms the call and allocate() takes its general course. The step does
        what allocate() would, the block and tensor in one native call, and
        returns None where anything is unusual (nothing done: the same
        fallback)."""
        return self.quick.get(("remembered allocation", memo))   # type: ignore[call-overload]

    def _remember_allocation(self, memo: tuple, quick) -> None:
        """Keep `quick` (quick_allocation()'s, or None) under `memo` (allocate())."""
        try:
            self._keep_quick(("remembered allocation", memo), quick)
        except TypeError:   # (an unhashable argument: nothing kept)
            pass

    def quick_free(self, offset: int) -> Callable[[bool], Outcome | int | None] | None:
        """free()'s quick step for the block at heap `offset` (core/steps.py's
        free_call()), taken with its flag
        while nothing quiet_all() would deal with is there (no context's
        operations either: their trackers' set is empty), carrying the pending
        releases as agree()'s step would (the NumPy face's `x = empty(...);
        free(x)` frees with the previous array's block dead: it died when x was
        bound anew); kept (_kept_quick()) by the offset of the block freed."""
        key = ("free", offset)
        quick = self.quick.get(key, _UNMADE)   # type: ignore[call-overload]
        if quick is not _UNMADE:
            return quick
        return self._kept_quick(key, steps.free_call(offset), lambda fixed: self.make_quick(
            fixed, ((self._trackers, "data"),), releasing=True))

    def _kept_quick(self, key: tuple, call: Call, make: Callable[[Call], Any]) -> Any:
        """The quick step to keep under `key` (quick_allocation(), quick_free(),
        where none is kept yet), made by make() of a fixed copy of `call`. At
        most QUICK_KEPT are kept: a full memo forgets its older half (a
        program's sizes and offsets in use now are made again at their next
        call; refusing new keys instead would leave a program that once freed
        many blocks without quick steps for good)."""
        quick = make(Call(call.phase, call.args, call.source, None, call.exact).fixed())
        self._keep_quick(key, quick)
        return quick

    def _keep_quick(self, key: tuple, quick) -> None:
        """self.quick[key] = quick, where a full memo first forgets its older
        half (_kept_quick() says why); TypeError for an unhashable key."""
        if len(self.quick) >= QUICK_KEPT and key not in self.quick:
            for old in list(itertools.islice(self.quick, QUICK_KEPT // 2)):
                del self.quick[old]
        self.quick[key] = quick   # type: ignore[index]

    #: free(find, text, own=False): free the tensor find() gives, in one agreed step
    #: (core/steps.py; openshmem/alloc.py's release() says what find() may raise and
    #: `own`). The step itself, not a wrapper: a frame of every free saved.
    free = steps.free

    def reallocate(self, tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
        """realloc() as one core call (core/steps.py)."""
        return steps.reallocate(self, tensor, nbytes)

    def trim(self) -> int:
        """trim() (collective) as one core call: the bytes released here (core/steps.py)."""
        return steps.trim(self)

    def import_external(self, tensor: torch.Tensor) -> torch.Tensor:
        """import_external_tensor() as one core call (core/steps.py)."""
        return steps.import_external(self, tensor)

    def synchronize(self) -> None:
        """Wait for the device's work so far (the backend's; nothing on the host,
        where it is not called: a fused collective's every call asks)."""
        if self._device:
            self.backend.synchronize()

    def offset_of(self, tensor: torch.Tensor) -> int:
        """Heap offset of a symmetric tensor's first element (the same on every PE)."""
        return self.local.offset_of(tensor)

    def window_for(self, what: str) -> OffNodeWindow:
        """The MPI window, or UnsupportedError saying why `what` cannot use one."""
        if self.window is None:
            raise UnsupportedError(f"{what} needs the heap's MPI window, which is unavailable: "
                                   f"{self.window_error}")
        return self.window

    def map_new(self, created: list[Segment]) -> None:
        """This PE's own part of sharing new segments (core/sharing.py), run by
        the exchange once they are sent: map them here, and attach them to the
        MPI window."""
        self.local.map_created(created)
        if self.window is not None:
            for segment in created:
                self.window.attach(segment)

    def heap_bases(self) -> torch.Tensor:
        """Where each PE's heap lies in this process, for kernels that address
        peers themselves (shmemvm.triton's translate/load/store/atomics).

        Entry k is the address here of heap offset 0 of PE k: this PE's own
        heap base at my_pe, a peer's window on this node, 0 for PEs only MPI
        reaches. A symmetric tensor `t` lies on PE k at
        ``heap_bases[k] + (t.data_ptr() - heap_bases[my_pe])``. The windows are
        reserved once, at init, so the table stays valid across malloc/free
        until finalize(); memory is only mapped at a peer's window where a
        live segment is, so translate only pointers into live symmetric tensors.

        Returns:
            A 1-D int64 tensor of n_pes entries on the heap's device (the same
            tensor on every call: do not write to it).

        Warns:
            RuntimeWarning: once per heap, where the heap holds host memory and
                TRITON_INTERPRET is not set: Triton runs kernels on the CPU only
                in its interpreter, and a kernel launched without it fails with
                Triton's bare "0 active drivers" where there is no GPU. (A
                warning, not an error: code other than Triton may read the table.)

        Raises:
            ShmemError: the heap is finalized or unusable.
        """
        self.check_usable()
        if self._bases is None:   # the windows never move: made once
            if self.device.type == "cpu" and not _triton_interprets():
                warnings.warn(HOST_BASES_HINT, RuntimeWarning, stacklevel=2)
            table = [0] * self.n_pes
            table[self.my_pe] = self.local.base
            for pe, window in self.peers.windows.items():
                table[pe] = window
            self._bases = torch.tensor(table, dtype=torch.int64, device=self.device)
        return self._bases

    # -- completion of every context ---------------------------------------------------
    def new_tracker(self) -> CompletionTracker:
        """A tracker for a Ctx: its non-blocking copies on a stream of its own,
        counted in quiet_all() while it lives (or until drop_tracker())."""
        tracker = CompletionTracker(self.backend, current_stream=False)
        self._trackers.add(tracker)
        return tracker

    def drop_tracker(self, tracker: CompletionTracker) -> None:
        self._trackers.discard(tracker)

    def quiet_all(self) -> None:
        """Complete the default context's operations and every live context's:
        before memory is freed or the window goes, nothing may still be in
        flight into it."""
        if self.closed:
            self.check_usable()  # raises: finalized (its MPI window is gone)
        self.completion.quiet()
        if len(self._trackers):  # (most programs make no context: skip copying the set)
            for tracker in list(self._trackers):
                tracker.quiet()


def _door(core: HeapCore) -> Core:
    """(For type checkers: HeapCore is a Core, the door the routines see.)"""
    return core
