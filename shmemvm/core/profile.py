"""Opt-in timing of the steps of a collective allocation (SHMEMVM_PROFILE=1).

Where does a malloc's time go? With profiling on, the heap's step functions
are timed with perf_counter_ns and summed per step:

    agreement     Agreement.collective / all_ok (the allreduce and its Python)
    allocate      the local allocator (vmem allocate_unmapped), with
      create        creating our new segment's physical memory (backend create)
    exchange      the fd exchange (exchange.py), with
      export        our segment's fd (backend export_fd)
      fd_send       sending the datagram (SCM_RIGHTS)
      map_new       mapping our new segment here once it is sent, split into
        map, set_access   the backend calls, and
        window_attach     attaching it to the MPI window
      fd_receive    receiving the peers' datagrams (includes waiting for them)
      peer_map      importing and mapping a peer's segment, split into
        import_fd, map, set_access, release
    tensor        making the returned tensor (vmem tensor_for)
    retire / finish_free   free's local halves

A step nested in another is recorded under its path ("exchange/peer_map/map")
so the inclusive totals of the outer steps stay meaningful; what a caller's
own end-to-end time has beyond the top-level steps is the Python around them.

The steps are timed by wrapping the bound methods of one heap's objects
(instrument()), so a heap that is not instrumented runs exactly the code it
runs without this module: the cost of profiling off is nothing at all. With
it on, each timed call costs about a microsecond of wrapper. The sums are that
heap's (a Steps object its wrappers hold; of(heap) finds it), not the module's.

Beside it, core/trace.py: the public calls (put, waits, collectives, malloc,
...) one by one as ranges in a torch.profiler trace, while a torch profiler
records; this module sums the internal steps of allocations, with no profiler.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from typing import Any

from ..config import setting


class Steps:
    """One heap's step timings: what instrument(heap) sums, kept by the
    wrappers it puts on that heap's objects (no module state: two heaps are
    timed apart, and a heap's timings go with it)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}      # step path -> nanoseconds
        self.calls: dict[str, int] = {}   # step path -> calls
        self.stack: list[str] = []        # the steps being timed, outermost first
        self.recording = False            # only calls inside measuring() are summed (all,
                                          # for a heap started with SHMEMVM_PROFILE=1)

    def reset(self) -> None:
        """Forget every step's totals (the next measurement starts from zero)."""
        self.ns.clear()
        self.calls.clear()

    def totals(self) -> dict[str, dict[str, float]]:
        """{step path: {"us": total microseconds, "calls": n}}, in first-seen order."""
        return {path: {"us": ns / 1e3, "calls": self.calls[path]} for path, ns in self.ns.items()}

    @contextmanager
    def measuring(self):
        """Sum the steps of the calls made inside the block (the calls a caller
        times end to end; setup around them, like free() or trim(), stays out)."""
        before = self.recording
        self.recording = True
        try:
            yield self
        finally:
            self.recording = before

    def breakdown(self, total_ns: int, calls: int) -> dict[str, float]:
        """Microseconds per call of every step, plus "python": `total_ns` (the
        callers' own end-to-end time over `calls` calls) less the top-level steps."""
        steps = {path: ns / 1e3 / calls for path, ns in self.ns.items()}
        top = sum(ns for path, ns in self.ns.items() if "/" not in path)
        steps["python"] = (total_ns - top) / 1e3 / calls
        steps["total"] = total_ns / 1e3 / calls
        return steps


def enabled() -> bool:
    """SHMEMVM_PROFILE=1 (config.SETTINGS; ValueError for a value it refuses)."""
    return setting("SHMEMVM_PROFILE").strip() == "1"


def start(heap) -> Steps:
    """SHMEMVM_PROFILE=1 at a heap's init: time its steps and sum every call
    from now on, not only those inside measuring(); of(heap) reads them."""
    steps = instrument(heap)
    steps.recording = True
    return steps


def _timed(steps: Steps, name: str, fn):
    clock = time.perf_counter_ns

    @functools.wraps(fn)
    def step(*args, **kwargs):
        if not steps.recording:
            return fn(*args, **kwargs)
        stack = steps.stack
        path = f"{stack[-1]}/{name}" if stack else name
        stack.append(path)
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            steps.ns[path] = steps.ns.get(path, 0) + clock() - t0
            steps.calls[path] = steps.calls.get(path, 0) + 1
            stack.pop()
    marked: Any = step   # (functions take attributes; mypy's wrapper type does not say so)
    marked.__shmemvm_profiled__ = fn
    marked.__shmemvm_steps__ = steps
    return marked


def _targets(heap) -> list[tuple[object, str, str]]:
    """(object, method, step name) of every timed step of `heap`."""
    targets = [(heap.agreement, "collective", "agreement"), (heap.agreement, "all_ok", "agreement"),
               (heap.local, "allocate_unmapped", "allocate"),
               (heap, "map_new", "map_new"),
               (heap.local, "tensor_for", "tensor"), (heap.local, "retire", "retire"),
               (heap.local, "finish_free", "finish_free"), (heap.local, "export", "export"),
               (heap.backend, "create", "create"), (heap.backend, "map", "map"),
               (heap.backend, "set_access", "set_access"),
               (heap.backend, "export_fd", "export_fd"), (heap.backend, "import_fd", "import_fd"),
               (heap.backend, "release", "release")]
    if heap.window is not None:
        targets.append((heap.window, "attach", "window_attach"))
    if heap.exchange is not None:
        targets += [(heap.exchange, "run", "exchange"), (heap.peers, "map", "peer_map"),
                    (heap.channel, "try_send", "fd_send"), (heap.channel, "receive", "fd_receive")]
    return [(obj, method, name) for obj, method, name in targets if obj is not None]


def of(heap) -> Steps | None:
    """The Steps of an instrumented `heap` (SHMEMVM_PROFILE=1, instrument(),
    instrumented()); None where its steps are not timed."""
    return getattr(heap.agreement.collective, "__shmemvm_steps__", None)


def instrument(heap) -> Steps:
    """Make `heap`'s steps timed (idempotent: the same Steps again);
    SHMEMVM_PROFILE=1 does it at init and records every call (measuring() is
    then on for the whole run)."""
    steps = of(heap) or Steps()
    for obj, method, name in _targets(heap):
        current = getattr(obj, method)
        if not hasattr(current, "__shmemvm_profiled__"):
            setattr(obj, method, _timed(steps, name, current))
    heap.agreement.timed = True   # (quick steps step aside: every step is timed)
    return steps


def uninstrument(heap) -> None:
    """Stop timing `heap`'s steps: its objects run their own methods again."""
    for obj, method, _ in _targets(heap):
        if hasattr(getattr(obj, method), "__shmemvm_profiled__"):
            delattr(obj, method)   # the instance attribute; the class's method shows again
    heap.agreement.timed = False


@contextmanager
def instrumented(heap):
    """`with instrumented(heap) as steps:` makes `heap`'s steps timeable inside
    the block (only those inside steps.measuring() are summed), from zero."""
    was = of(heap) is not None
    steps = instrument(heap)
    steps.reset()
    try:
        yield steps
    finally:
        if not was:
            uninstrument(heap)
