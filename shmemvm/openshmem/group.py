"""The PEs a collective runs over: all of the heap's, or a team's (teams.py).

A Group is a set of the heap's PEs, numbered 0..n-1 (group PE i is heap PE
pes[i]), with

  - an MPI communicator of its members only, ranked in group order (so the
    MPI path of a collective runs on it and rank = group PE number);
  - its own agreement (agreement/agreement.py) over that communicator: every
    collective on it starts with one small allreduce among the members only,
    with the heap's deadline; a mismatch raises the same SymmetryError on
    every member. A step that times out breaks the whole heap, as a heap
    collective's does (the late PE may be in any call). The world group's
    agreement is the heap's own (Core.calls.agree, which also releases the
    blocks every PE dropped).

Collectives (collectives.py) take a Group; a Team (teams.py) is a Group that
users make, split and destroy. A call with team=None runs over the heap's
world group (world()).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

from mpi4py import MPI

from .. import _args
from ..agreement.agreement import Agreement
from ..agreement.protocol import Call, Outcome, Phase
from ..core.state import Core, FeatureKey
from ..errors import ShmemError, plural


def pe_text(pes) -> str:
    """PE numbers for messages: '0, 2, 4' or '0..30 step 2' for long progressions."""
    pes = list(pes)
    if len(pes) > 4:
        step = pes[1] - pes[0]
        if all(b - a == step for a, b in zip(pes, pes[1:])):
            return f"{pes[0]}..{pes[-1]}" + (f" step {step}" if step != 1 else "")
    return ", ".join(map(str, pes))


class Group:
    """Some PEs of one heap with a communicator and an agreement of their own
    (see the module doc). `kind`: "world", "shared" or "split"."""

    def __init__(self, heap: Core, comm: MPI.Comm, pes, agreement: Agreement, *,
                 kind: str):
        #: the core of the heap whose PEs these are (the routines' argument)
        self.core = heap
        #: the members' communicator, rank i = group PE i
        self.comm = comm
        #: heap PE number of each group PE
        self.pes = tuple(pes)
        self.agreement = agreement
        self.kind = kind
        self.destroyed = False
        #: heap PE number -> group PE number, for the members
        self.index = {pe: i for i, pe in enumerate(self.pes)}
        #: this PE's group PE number
        self.me = self.index[heap.identity.my_pe]
        #: every member is mapped here: the same answer on every member (collectives.py)
        self.on_node = heap.where.all_mapped(self.pes)
        self.name = {"world": "the world team", "shared": f"the shared team (PEs "
                     f"{pe_text(self.pes)})"}.get(kind, f"the team of PEs {pe_text(self.pes)}")
        #: prefix of call texts in messages ("" for the world: its calls are the heap's)
        self.label = "" if kind == "world" else f"{self.name}: "
        #: held through each of this group's collective calls: the heap's own lock for
        #: the world (its calls allocate and free), a lock of its own for a team, so
        #: that threads in collectives of different teams do not wait for each other
        #: (THREAD_MULTIPLE) while each waits for its members
        self.lock = heap.lock if kind == "world" else threading.RLock()
        #: the splits made of this group so far (the same on every member): part of
        #: the key of each new team's agreement (agreement())
        self.splits = 0

    @property
    def heap(self):
        """The SymmetricHeap whose PEs these are."""
        return self.core.contexts.face

    # -- state ------------------------------------------------------------------------------
    def check_usable(self) -> None:
        """Raise ShmemError where the heap is finalized or broken, or the group destroyed."""
        self.core.calls.check_usable()
        if self.destroyed:
            raise ShmemError(f"{self.name} was destroyed (destroy() or the heap's finalize()); "
                             f"split a new team from a live one")

    def check_pe(self, pe, role: str = "pe") -> int:
        """A group PE number as an int in 0..n-1, or TypeError/ValueError."""
        number = _args.integer(pe, role)
        if not 0 <= number < len(self.pes):
            raise ValueError(f"{role} {number} is out of range: {self.name} has "
                             f"{plural(len(self.pes), 'PE')} (0..{len(self.pes) - 1}); PE "
                             f"numbers in team calls are "
                             f"team-relative")
        return number

    def world_pe(self, group_pe) -> int:
        """The heap PE number of group PE `group_pe` (checked)."""
        self.check_usable()
        return self.pes[self.check_pe(group_pe, "team_pe")]

    # -- agreed steps over the members ----------------------------------------------------
    def _guarded(self, step, *args, **kwargs):
        """Run an agreement step; a step that breaks the group's agreement (a
        timeout, PEs out of step) breaks the heap too."""
        try:
            return step(*args, **kwargs)
        finally:
            if self.agreement.broken and self.kind != "world":
                self.core.calls.mark_broken(f"{self.name}: {self.agreement.broken}")

    def agree(self, call: Call) -> Outcome:
        """One agreed step among the members (the heap's own agreement for the
        world, which also releases blocks dropped on every PE)."""
        world = self.kind == "world"
        if self.destroyed or not world:   # (the heap's agree() checks the heap itself)
            self.check_usable()
        if world:
            return self.core.calls.agree(call)
        return self._guarded(self.agreement.collective, call)

    def quick_step(self, call: Call, carry: tuple | None = None, deliver: tuple | None = None,
                   before: tuple | None = None) -> Callable[[], object] | None:
        """agree(call)'s step (a team's sync), or a fused collective's carrying
        `carry` (made by `before` first, where given) and then calling
        `deliver` (nodecoll.replay), whole in one native call while nothing is
        unusual (Core.calls.quick_step: None where there is none); it steps
        aside while the group is destroyed or the heap has anything agree()
        would deal with."""
        guards = ((self, "destroyed"),)
        if self.kind == "world":   # (the heap's agree(): its releases, its guards)
            return self.core.calls.make_quick(call, guards, carry, deliver, before)
        return self.core.calls.quick_step(self.agreement, call, self.lock, guards,
                                          self._guarded, carry, deliver, before)

    def agree_checked(self, phase: Phase, text: str, check):
        """Agree on the call `phase`: `check()` returns (args, text) or raises a
        local error, which then fails the call on every member (that error where
        every member has it, else SymmetryError). Returns the agreed args."""
        try:
            args, text = check()
            error = None
        except (TypeError, ValueError, ShmemError) as exc:
            args, error = (), exc
        self.agree(Call(phase, args, text, error))
        return args

    def step(self, phase: Phase, text: str) -> None:
        """An internal barrier step of a call, after this PE's device work."""
        self.core.calls.synchronize()
        self.agree(Call(phase, text=text))

    def wait(self, request: MPI.Request, what: str) -> None:
        """Complete a data step on the group's communicator with the heap's deadline."""
        self._guarded(self.agreement.wait, request,
                      f"{what} (in your collective call #{self.agreement.calls})")

    def allgather(self, phase: Phase, data: bytes, what: str) -> list[bytes]:
        """Every member's `data`, in group order, with the heap's deadline."""
        return self._guarded(self.agreement.allgather_bytes, phase, data, what, self.comm)


def agreement(heap: Core, comm: MPI.Comm, *identity) -> Agreement:
    """A new group's agreement over `comm`, with the heap's timeout and liveness
    (whose register decides its steps that some PE gave up on, under a key made
    from `identity`: the same on every member, different from the heap's 0)."""
    digest = hashlib.blake2b(repr(identity).encode(), digest_size=8).digest()
    key = 1 + int.from_bytes(digest, "little") % ((1 << 62) - 1)
    made = Agreement(comm, heap.identity.timeout, heap.identity.my_pe, key=key,
                     liveness=heap.calls.liveness)
    made.initialized = True
    return made


#: this module's per-heap state: the world group (HeapCore.feature)
WORLD: FeatureKey[Group] = FeatureKey("group.world")


def world(heap: Core) -> Group:
    """The group of every PE of the heap: its communicator and agreement."""
    identity = heap.identity
    return heap.calls.feature(WORLD, lambda: Group(heap, identity.comm, range(identity.n_pes),
                                             heap.calls.agreement, kind="world"))


def resolve(heap: Core, team, what: str) -> Group:
    """The group a collective runs over: `team`, or the heap's world for None."""
    if team is None:
        return world(heap)
    same_heap(heap, team, f"{what}: team").check_usable()
    return team


def same_heap(heap: Core, team, role: str) -> Group:
    """`team` checked to be a team (a Group) of `heap`."""
    if not isinstance(team, Group):
        raise TypeError(f"{role} must be a shmemvm Team, got {type(team).__name__} {team!r}")
    if team.core is not heap:
        raise ValueError(f"{role} is {team.name} of another symmetric heap; teams are views of "
                         f"the heap they were made from")
    return team
