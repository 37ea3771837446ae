"""Communication contexts (OpenSHMEM 1.5 shmem_ctx_*): independent streams of
one-sided operations on one heap, each completed by its own quiet().

A Ctx issues the heap's own put/get/nbi/atomic calls (its methods are made
from the heap's, below, so each operation is written once, in heap.py,
atomics.py or strided.py), with two differences:

- its non-blocking operations are recorded in its own completion tracker
  (completion.py), so ctx.quiet() completes them and nothing else: not the
  heap's default context, not another Ctx. On a device heap its nbi copies run
  on a stream of its own (which first waits for the current stream), so its
  quiet() waits for that stream alone;
- with a team, `pe` arguments are team-relative (team.world_pe(pe)).

Blocking calls (put, get, the blocking atomics, put_signal) are complete when
they return, whichever context issues them.

What the heap's quiet() does: it completes the default context only, as
shmem_quiet does (OpenSHMEM: "shmem_quiet ... on the default context"); so do
barrier_all() and clear_lock(). free(), realloc() and finalize() complete every
live context's operations first, since nothing may still be in flight into
memory that is being released.

The options are OpenSHMEM's and are recorded on the context (`options`);
none of them changes what a context does here: every context may be used from
any thread (SERIALIZED and PRIVATE only promise less), and NOSTORE (the
context will issue no stores) has nothing to skip at quiet().
"""

from __future__ import annotations

import functools
import inspect
import operator

from ..transport.completion import CompletionTracker
from ..errors import ShmemError
from ..heap import SymmetricHeap

#: shmem_ctx_create options (OpenSHMEM 1.5 values)
CTX_SERIALIZED = 1
CTX_PRIVATE = 2
CTX_NOSTORE = 4
_ALL_OPTIONS = CTX_SERIALIZED | CTX_PRIVATE | CTX_NOSTORE

#: the heap's methods a context issues, each with a `pe` argument
OPERATIONS = (
    "put", "get", "put_nbi", "get_nbi", "iput", "iget",
    "atomic_fetch", "atomic_set", "atomic_add", "atomic_inc", "atomic_fetch_add",
    "atomic_fetch_inc", "atomic_swap", "atomic_compare_swap", "atomic_fetch_and",
    "atomic_fetch_or", "atomic_fetch_xor", "atomic_and", "atomic_or", "atomic_xor",
    "atomic_fetch_nbi", "atomic_fetch_add_nbi", "atomic_fetch_inc_nbi", "atomic_swap_nbi",
    "atomic_compare_swap_nbi", "atomic_fetch_and_nbi", "atomic_fetch_or_nbi",
    "atomic_fetch_xor_nbi",
    "put_signal", "put_signal_nbi",
)


class Ctx:
    """A communication context of `heap` (shmem_ctx_create); see the module doc.

    Attributes:
        heap: the SymmetricHeap it issues operations on.
        options: the options it was created with (CTX_* bits).
        team: None, or the Team whose PE numbers its `pe` arguments are.
        completion: its CompletionTracker (what its quiet() still has to complete).
    """

    def __init__(self, heap: SymmetricHeap, options: int = 0, team=None):
        """Make a context (not collective).

        Args:
            heap: the SymmetricHeap to issue operations on.
            options: 0 or an OR of CTX_SERIALIZED, CTX_PRIVATE, CTX_NOSTORE.
            team: None (PE numbers are the heap's) or a Team of `heap` (PE
                numbers are the team's, mapped with team.world_pe()).

        Raises:
            TypeError: `heap` is not a SymmetricHeap, or `options` is not an int.
            ValueError: `options` has other bits, or `team` is of another heap.
            ShmemError: the heap is finalized.
        """
        if not isinstance(heap, SymmetricHeap):
            raise TypeError(f"Ctx: heap must be a SymmetricHeap, got {type(heap).__name__}")
        if isinstance(options, bool) or not hasattr(type(options), "__index__"):
            raise TypeError(f"ctx_create: options must be an int (an OR of CTX_SERIALIZED, "
                            f"CTX_PRIVATE, CTX_NOSTORE), got {type(options).__name__} "
                            f"{options!r}")
        options = operator.index(options)
        if options < 0 or options & ~_ALL_OPTIONS:
            raise ValueError(f"ctx_create: options must be 0 or an OR of CTX_SERIALIZED (1), "
                             f"CTX_PRIVATE (2) and CTX_NOSTORE (4), got {options}")
        if team is not None and getattr(team, "heap", heap) is not heap:
            raise ValueError("ctx_create: the team belongs to another heap")
        heap._check_usable()
        self.heap = heap
        self.options = options
        self.team = team
        self.completion = CompletionTracker(heap.backend, current_stream=False)
        self._destroyed = False
        heap._contexts.add(self)

    def _usable(self, what: str) -> SymmetricHeap:
        if self._destroyed:
            raise ShmemError(f"ctx.{what}: this context was destroyed; create another with "
                             f"ctx_create()")
        return self.heap

    def _world_pe(self, pe):
        """`pe` as the heap's PE number (team-relative with a team)."""
        return pe if self.team is None else self.team.world_pe(pe)

    def quiet(self) -> None:
        """Complete this context's operations, and no other context's (shmem_ctx_quiet).

        Returns:
            None, once every put/get/nbi operation issued through this context
            is complete (nbi atomics' fetched values stored).

        Raises:
            ShmemError: the context was destroyed, or the heap is finalized.
            PeerTimeoutError: a PE did not answer within the heap's timeout; the
                heap is unusable afterwards.
        """
        self._usable("quiet")._check_usable()
        self.completion.quiet()

    def fence(self) -> None:
        """Order this context's puts to each PE (shmem_ctx_fence): its outstanding
        MPI operations are completed; device copies on its stream are in order.

        Returns:
            None.

        Raises:
            ShmemError: the context was destroyed, or the heap is finalized.
            PeerTimeoutError: a PE did not answer within the heap's timeout.
        """
        self._usable("fence")._check_usable()
        self.completion.fence()

    def destroy(self) -> None:
        """Complete this context's operations, then make it unusable
        (shmem_ctx_destroy). Destroying it again does nothing.

        Returns:
            None.

        Raises:
            PeerTimeoutError: a PE did not answer within the heap's timeout (the
                context is destroyed all the same).
        """
        if self._destroyed:
            return
        try:
            if not self.heap.closed:  # a finalized heap completed every context already
                self.completion.quiet()
        finally:
            self._destroyed = True
            self.heap._contexts.discard(self)

    def __enter__(self) -> Ctx:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else f"{self.completion.outstanding} outstanding"
        return f"<Ctx options={self.options} team={self.team!r} on PE {self.heap.my_pe}: {state}>"


def _on_context(name: str):
    """Ctx.<name>: the heap's method `name`, with `pe` mapped through the team and
    its non-blocking operations recorded in the context's tracker."""
    method = getattr(SymmetricHeap, name)
    signature = inspect.signature(method)
    names = list(signature.parameters)[1:]      # less self
    pe_at = names.index("pe")
    tracked = "_tracker" in signature.parameters

    @functools.wraps(method)
    def on_context(self, *args, **kwargs):
        heap = self._usable(name)
        if len(args) > pe_at:
            args = (*args[:pe_at], self._world_pe(args[pe_at]), *args[pe_at + 1:])
        elif "pe" in kwargs:
            kwargs["pe"] = self._world_pe(kwargs["pe"])
        if tracked:
            kwargs["_tracker"] = self.completion
        return method(heap, *args, **kwargs)

    on_context.__qualname__ = f"Ctx.{name}"
    on_context.__signature__ = signature.replace(parameters=[
        p for p in signature.parameters.values() if not p.name.startswith("_")])
    if method.__doc__:
        summary, _, rest = method.__doc__.partition("\n")
        on_context.__doc__ = (f"{summary}\n\n        On this context: `pe` is team-relative "
                              f"when it has a team, and its quiet()\n        completes what "
                              f"this call leaves outstanding.\n{rest}")
    return on_context


for _name in OPERATIONS:
    setattr(Ctx, _name, _on_context(_name))
