"""The one typed door the routines see of a heap's core (Core) and its facets
(Calls, Where, Memory, Contexts, each a Protocol): what HeapCore (core/state.py)
offers them, and nothing else of it; with Identity, what a heap is, and
FeatureKey, a routine module's key for its per-heap state. Kept apart from
HeapCore so that the door reads as one page; core/state.py names it again,
which is where the routines import it from.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
from mpi4py import MPI

from ..agreement.agreement import Agreement
from ..agreement.liveness import Liveness
from ..agreement.protocol import Call, Outcome
from ..memory.buddy import Block
from ..memory.vmm import HeapStats
from ..transport.completion import CompletionTracker
from ..transport.offnode import OffNodeWindow
from ..transport.target import Target

Feature = TypeVar("Feature")


class FeatureKey(Generic[Feature]):
    """A routine module's key for its per-heap state (HeapCore.feature): one
    object per module, typed with the state's type, so that feature() returns
    that type (no string keys, no casts)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        #: for messages and logs
        self.name = name

    def __repr__(self) -> str:
        return f"FeatureKey({self.name!r})"


@dataclass(frozen=True, slots=True)
class Identity:
    """What a heap is, fixed at init: the read-only facts routines need for PE
    arithmetic, messages, teams and heap_info() (Core.identity)."""
    #: this PE and the PE count: every routine's PE arithmetic
    my_pe: int
    n_pes: int
    #: the node's PEs: team_shared() and the node paths of collectives
    node_pes: tuple[int, ...]
    #: the heap's and the node's communicators: what teams split and run MPI collectives on
    comm: MPI.Intracomm
    node: MPI.Comm
    #: the deadline of every wait (teams' agreements, waits)
    timeout: float
    #: where tensors the routines make go
    device: torch.device
    #: the backend's name ("host", "cuda", "hip"): messages and heap_info()
    backend_name: str
    #: the backend's granularity: align()'s limit, heap_info()
    granularity: int
    #: bytes of this PE's anchor (heap_info())
    anchor_size: int
    #: every PE has the compiled piece (the native collective paths)
    native: bool


class Calls(Protocol):
    """Core.calls: the state of the heap's calls and the agreement every
    collective starts with."""

    #: finalized: contexts and quiet() check it before touching the window
    closed: bool
    #: the world group's agreement and this PE's liveness record (teams make theirs alike,
    #: waits and locks watch the others through it)
    agreement: Agreement
    liveness: Liveness

    @property
    def broken(self) -> str | None: ...   # why the heap is unusable (a timed-out step)

    #: quick[call]: a fixed call's whole collective call in one native call, which
    #: returns None where it did nothing (the caller's general path then runs); None
    #: where there is none (Agreement.quick, HeapCore.make_quick); also the quick
    #: steps of allocations and frees, by their keys (quick_allocation, quick_free),
    #: and of allocations by the faces' arguments (remembered_allocation)
    quick: dict[Any, Callable[..., object] | None]

    def check_usable(self) -> None: ...
    def agree(self, call: Call, *, flag: bool = True) -> Outcome: ...
    def make_quick(self, call: Call, guards: tuple = (), carry: tuple | None = None,
                   deliver: tuple | None = None, before: tuple | None = None,
                   answer: bool = False,
                   releasing: bool = False) -> Callable[..., object] | None: ...
    def quick_step(self, agreement: Agreement, call: Call, lock, guards: tuple,
                   wrap=None, carry: tuple | None = None, deliver: tuple | None = None,
                   before: tuple | None = None, answer: bool = False,
                   dead: tuple[Callable[[], set[int]], tuple] | None = None
                   ) -> Callable[..., object] | None: ...
    def mark_broken(self, why: str) -> None: ...
    def synchronize(self) -> None: ...   # the device's work before a collective step
    def feature(self, key: FeatureKey[Feature], make: Callable[[], Feature]) -> Feature: ...
    def publish_lock(self, offset: int, ticket: int | None, how: str | None) -> None: ...


class Where(Protocol):
    """Core.where: which PE, which block and which bytes an operation lands on
    (rma, atomics, waits, signals, locks, collectives), and how they are reached."""

    # -- the operands every routine checks ------------------------------------------------
    def check_pe(self, pe: Any) -> int: ...
    def symmetric(self, tensor: torch.Tensor, role: str) -> Block: ...
    def symmetric_contiguous(self, tensor: Any, role: str, what: str) -> int: ...
    def offset_of(self, tensor: torch.Tensor) -> int: ...
    def storage_offset(self, tensor: torch.Tensor) -> int: ...

    # -- the target, resolved once an operation (transport/target.py) --------------------
    def locate(self, tensor: torch.Tensor, pe: int, role: str) -> Target: ...
    def locate_in(self, allocation: torch.Tensor, address: int, pe: int) -> Target | None: ...
    def located(self, tensor: torch.Tensor, pe: int) -> Target | None: ...   # the torch one pass
    def array_address(self, array: Any) -> int | None: ...   # the NumPy face's one pass
    #: the NumPy face's collective memo key in one native call, or None (the Locator's)
    call_key: Callable[..., tuple | None] | None
    #: a memo of checked operands while their blocks live (the faces' fused collectives)
    def recall(self, key: tuple) -> Any: ...
    def remember(self, key: tuple, value: Any) -> None: ...
    def forget(self) -> None: ...
    def all_mapped(self, pes: Any) -> bool: ...   # a team's node path
    def heap_bases(self) -> torch.Tensor: ...

    # -- reaching it ----------------------------------------------------------------------
    def hold(self, block: Block, view: torch.Tensor) -> torch.Tensor: ...
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None: ...
    def window_for(self, what: str) -> OffNodeWindow: ...
    def atomics_window(self, what: str, pe: int) -> OffNodeWindow: ...


class Memory(Protocol):
    """Core.memory: the heap's memory calls (alloc.py, external.py), each
    routine one core call."""

    #: malloc, empty, zeros, align, ...: the agreement, the block and its tensor (filled)
    def allocate(self, call: Call, nbytes: int, dims: tuple[int, ...], dtype: torch.dtype,
                 fill: Callable[[torch.Tensor], object] | None = None,
                 memo: tuple | None = None) -> torch.Tensor: ...
    #: the quick step an earlier allocate() kept under a face's `memo`, or None
    def remembered_allocation(self, memo: tuple) -> Callable[[], torch.Tensor | None] | None: ...
    #: free (both faces): the agreed free of the tensor find() gives
    def free(self, find: Callable[[], torch.Tensor], text: str, own: bool = False) -> None: ...
    #: the NumPy face's free of alloc's memoryview, or of an array of `array_type` over
    #: one, in one call where nothing is unusual (True); None where it steps aside,
    #: nothing done: free() then does it or raises
    free_memory: Callable[[object, type | None], bool | None]
    #: the torch API's free of a tensor in one call, alike (True, or None: free() then)
    free_tensor: Callable[[torch.Tensor], bool | None]
    #: realloc
    def reallocate(self, tensor: torch.Tensor, nbytes: int) -> torch.Tensor: ...
    #: trim (collective): the bytes released here
    def trim(self) -> int: ...
    #: import_external_tensor
    def import_external(self, tensor: torch.Tensor) -> torch.Tensor: ...
    #: heap_info's figures
    def stats(self) -> HeapStats: ...


class Contexts(Protocol):
    """Core.contexts: what contexts and teams are made of (contexts.py, group.py);
    the default context's tracker is the core's own (Context.tracker)."""

    @property
    def face(self) -> Any: ...   # the SymmetricHeap users hold (Ctx.heap, Team.heap)

    def new_tracker(self) -> CompletionTracker: ...   # a Ctx's own (its own stream)
    def drop_tracker(self, tracker: CompletionTracker) -> None: ...


class Context(Protocol):
    """What one-sided operations (rma, atomics, signals, strided) are issued on:
    the heap itself (its default context) or a Ctx (openshmem/contexts.py).
    A context names the heap, maps a `pe` argument to the heap's PE number
    (team-relative on a team's context; raising for a bad one, or a destroyed
    context), and records its non-blocking operations in its own tracker,
    which its quiet() completes."""

    @property
    def core(self) -> Core: ...

    @property
    def tracker(self) -> CompletionTracker: ...

    def world_pe(self, pe) -> int: ...


class Core(Context, Protocol):
    """The one typed door the routines (openshmem/, and through them shmem/,
    api.py, device/) see of a heap's core: what the heap is, its lock, and
    four facets, each a small Protocol of its own; and, since the heap is its
    own default context, a Context's core, tracker and world_pe. Nothing else of HeapCore is
    theirs, and no routine reaches through a part of it (`heap.local.x`) or
    past a facet's members (kept by tests/unit/test_house.py).

    A facet is the core itself seen through its Protocol (HeapCore sets
    `self.where = self`, ...): `heap.where.locate(...)` is one attribute
    lookup more than `heap.locate(...)`, and no call more, on every hot path."""

    #: my_pe, n_pes, node_pes, comm, node, timeout, device, backend_name, granularity,
    #: anchor_size, native: what the heap is, read-only (messages, PE numbers, teams)
    identity: Identity
    #: the heap's lock: every collective call holds it
    lock: threading.RLock
    #: closed, broken, check_usable, agree, feature, ...: every collective call's
    calls: Calls
    #: check_pe, symmetric, locate, window_for, ...: every operation's operands and target
    where: Where
    #: allocate, free, reallocate, trim, import_external, stats
    memory: Memory
    #: face, new_tracker, drop_tracker: contexts and teams
    contexts: Contexts
