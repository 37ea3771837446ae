"""Communication contexts (OpenSHMEM 1.5 shmem_ctx_*): independent streams of
one-sided operations on one heap, each completed by its own quiet().

A Ctx issues the same one-sided operations as the heap (rma, strided,
atomics, signals: each written once, taking a context first; the heap is its
own default context), with two differences:

- its non-blocking operations are recorded in its own completion tracker
  (transport/completion.py), so ctx.quiet() completes them and nothing else:
  not the heap's default context, not another Ctx. On a device heap its nbi
  copies run on a stream of its own (which first waits for the current
  stream), so its quiet() waits for that stream alone;
- with a team, `pe` arguments are team-relative (team.world_pe(pe)).

Blocking calls (put, get, the blocking atomics, put_signal) are complete when
they return, whichever context issues them.

What the heap's quiet() does: it completes the default context only, as
shmem_quiet does (OpenSHMEM: "shmem_quiet ... on the default context"); so do
barrier_all() and clear_lock(). free(), realloc() and finalize() complete every
live context's operations first (Core.quiet_all), since nothing may still
be in flight into memory that is being released.

The options are OpenSHMEM's and are recorded on the context (`options`);
none of them changes what a context does here: every context may be used from
any thread (SERIALIZED and PRIVATE only promise less), and NOSTORE (the
context will issue no stores) has nothing to skip at quiet().
"""

from __future__ import annotations

from .. import _args
from ..core import trace
from ..core.state import Core, core_of
from ..errors import ShmemError
from ..transport.completion import CompletionTracker
from . import atomics, rma, signals, strided

#: shmem_ctx_create options (OpenSHMEM 1.5 values)
CTX_SERIALIZED = 1
CTX_PRIVATE = 2
CTX_NOSTORE = 4
_OPTIONS = {"CTX_SERIALIZED": CTX_SERIALIZED, "CTX_PRIVATE": CTX_PRIVATE,
            "CTX_NOSTORE": CTX_NOSTORE}

@trace.traced   # each operation a range in torch.profiler traces (core/trace.py)
class ContextOperations:
    """The one-sided operations a context issues, bound once for both kinds of
    context: SymmetricHeap (the default context) and Ctx. Each is written once
    (rma, strided, atomics, signals) and takes its context first."""

    put = rma.put
    get = rma.get
    put_nbi = rma.put_nbi
    get_nbi = rma.get_nbi
    iput = strided.iput
    iget = strided.iget
    atomic_fetch = atomics.atomic_fetch
    atomic_set = atomics.atomic_set
    atomic_add = atomics.atomic_add
    atomic_inc = atomics.atomic_inc
    atomic_fetch_add = atomics.atomic_fetch_add
    atomic_fetch_inc = atomics.atomic_fetch_inc
    atomic_swap = atomics.atomic_swap
    atomic_compare_swap = atomics.atomic_compare_swap
    atomic_fetch_and = atomics.atomic_fetch_and
    atomic_fetch_or = atomics.atomic_fetch_or
    atomic_fetch_xor = atomics.atomic_fetch_xor
    atomic_and = atomics.atomic_and
    atomic_or = atomics.atomic_or
    atomic_xor = atomics.atomic_xor
    atomic_fetch_nbi = atomics.atomic_fetch_nbi
    atomic_fetch_add_nbi = atomics.atomic_fetch_add_nbi
    atomic_fetch_inc_nbi = atomics.atomic_fetch_inc_nbi
    atomic_swap_nbi = atomics.atomic_swap_nbi
    atomic_compare_swap_nbi = atomics.atomic_compare_swap_nbi
    atomic_fetch_and_nbi = atomics.atomic_fetch_and_nbi
    atomic_fetch_or_nbi = atomics.atomic_fetch_or_nbi
    atomic_fetch_xor_nbi = atomics.atomic_fetch_xor_nbi
    put_signal = signals.put_signal
    put_signal_nbi = signals.put_signal_nbi


@trace.traced(skip=("world_pe",))   # quiet, fence, destroy: ranges in torch.profiler traces
class Ctx(ContextOperations):
    """A communication context of `heap` (shmem_ctx_create); see the module doc.

    Attributes:
        heap: the SymmetricHeap it issues operations on.
        options: the options it was created with (CTX_* bits).
        team: None, or the Team whose PE numbers its `pe` arguments are.
        completion: its CompletionTracker (what its quiet() still has to complete).
    """

    def __init__(self, heap: Core, options: int = 0, team=None):
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
        try:
            core = core_of(heap)
        except TypeError:
            raise TypeError(f"Ctx: heap must be a SymmetricHeap, got {type(heap).__name__}") \
                from None
        options = _args.flags(options, _OPTIONS, "ctx_create: options")
        if team is not None and getattr(team, "heap", core.contexts.face) is not core.contexts.face:
            raise ValueError("ctx_create: the team belongs to another heap")
        core.calls.check_usable()
        self._core = core
        self.options = options
        self.team = team
        self.completion = core.contexts.new_tracker()   # (counted in the heap's quiet_all())
        self._destroyed = False

    @property
    def heap(self):
        """The SymmetricHeap this context issues operations on."""
        return self._core.contexts.face

    def _usable(self, what: str) -> Core:
        if self._destroyed:
            raise ShmemError(f"ctx.{what}: this context was destroyed; create another with "
                             f"ctx_create()")
        return self._core

    # -- what makes it a context (core/state.py's Context) ------------------------------
    @property
    def core(self) -> Core:
        """The heap this context issues operations on."""
        return self._usable("operation")

    @property
    def tracker(self) -> CompletionTracker:
        """Where this context's non-blocking operations are recorded."""
        return self.completion

    def world_pe(self, pe) -> int:
        """`pe` as the heap's PE number (team-relative with a team), checked."""
        self._usable("operation")
        if self.team is None:
            return self._core.where.check_pe(pe)
        return self.team.world_pe(pe)

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
        self._usable("quiet").calls.check_usable()
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
        self._usable("fence").calls.check_usable()
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
            if not self._core.calls.closed:  # a finalized heap completed every context already
                self.completion.quiet()
        finally:
            self._destroyed = True
            self._core.contexts.drop_tracker(self.completion)
            # its Team forgets it (a team-like object of the caller's keeps no list)
            forget = getattr(self.team, "forget_ctx", None)
            if forget is not None:
                forget(self)

    def __enter__(self) -> Ctx:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else f"{self.completion.outstanding} outstanding"
        me = self._core.identity.my_pe
        return f"<Ctx options={self.options} team={self.team!r} on PE {me}: {state}>"


def ctx_create(heap: Core, options: int = 0) -> Ctx:
    """A communication context on this heap (shmem_ctx_create; not collective).

    Args:
        options: 0 or an OR of shmemvm.CTX_SERIALIZED (1), CTX_PRIVATE (2)
            and CTX_NOSTORE (4), recorded on the context (see contexts.Ctx).

    Returns:
        A Ctx: put/get/nbi/atomics whose quiet() completes only its own
        operations. Usable as a context manager (destroyed on exit).

    Raises:
        TypeError: `options` is not an integer.
        ValueError: `options` has other bits.
        ShmemError: the heap is finalized.
    """
    return Ctx(heap, options)


def ctx_destroy(heap: Core, ctx: Ctx) -> None:
    """Complete `ctx`'s operations and make it unusable (shmem_ctx_destroy).

    Args:
        ctx: a Ctx of this heap (destroying it twice is harmless).

    Returns:
        None.

    Raises:
        TypeError: `ctx` is not a context of this heap.
        PeerTimeoutError: a PE did not answer ctx's nbi operations in time.
    """
    if not isinstance(ctx, Ctx) or ctx.heap is not heap.contexts.face:
        raise TypeError(f"ctx_destroy: expected a context made by this heap's ctx_create, "
                        f"got {type(ctx).__name__}")
    ctx.destroy()
