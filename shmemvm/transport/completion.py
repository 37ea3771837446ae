"""What one context (the heap's default one, or a Ctx) still has to complete.

A non-blocking operation leaves work behind in one of two places:

- a device copy (put_nbi/get_nbi on the node, CUDA/HIP heaps) still running on
  a stream: the tracker keeps the stream, and quiet() synchronizes it;
- an MPI operation (an nbi atomic, an off-node put_nbi/get_nbi) whose request
  has not completed: the tracker keeps the request(s), the target PE, the
  buffers that must stay alive, and what to do once it is complete (store the
  fetched value, copy staged data into place, free a derived datatype).
  Every kept request needs the target's answer to complete (an Rget, an
  Rget_accumulate, or the probe read that follows an Rput; see offnode.py), so
  quiet() waits for it with the heap's deadline and then MPI_Win_flush
  returns promptly.

Each context owns one tracker, so a context's quiet() completes its own
operations and no other's. MPI cannot flush one context's operations on a
window apart from another's: the flush after a context's requests completes
everything this PE has issued to those PEs at the MPI level, which OpenSHMEM
allows (completing more is never wrong). The other contexts' bookkeeping is
untouched: their fetched values are stored, and their requests counted done,
only at their own quiet().

The heap's default tracker (`current_stream=True`) also synchronizes the
current device stream at quiet(), as the heap always did: work queued there
(kernels writing symmetric memory, the default context's nbi copies) is part of
what this PE has issued. A Ctx's tracker issues its device copies on a stream of
its own (`issuing()`), so its quiet() waits for that stream alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends.base import waits


@dataclass
class _Deferred:
    """One MPI operation issued and not yet complete."""
    requests: Any                   # an MPI.Request or a list of them
    pe: int
    window: Any                     # the OffNodeWindow it went through (offnode.py)
    buffers: object = None          # kept alive until the operation is complete
    done: Callable[[], None] | None = field(default=None)  # called once it is complete


class CompletionTracker:
    """The outstanding non-blocking operations of one context of `backend`'s heap."""

    def __init__(self, backend, *, current_stream: bool):
        """`current_stream`: quiet() also synchronizes the current device stream
        (the heap's default context). Otherwise device copies issued within
        issuing() run on a stream of this tracker's own."""
        self.backend = backend
        self._current_stream = current_stream
        #: quiet() synchronizes the current stream: the default context's, on a
        #: backend that has one (a barrier's quiet would call a no-op each time)
        self._sync_current = current_stream and waits(backend)
        self._own_stream = None                    # made on first device copy (Ctx)
        self._lock = threading.Lock()              # several threads may issue (THREAD_MULTIPLE)
        self._streams: dict = {}                   # key -> stream with unfinished copies
        self._deferred: list[_Deferred] = []

    @property
    def idle_guards(self) -> tuple | None:
        """The (object, attribute) pairs that are all false while quiet() has
        nothing to do, which lets a quick barrier skip it (_collective.Quick);
        None where quiet() always has (it synchronizes the device's stream)."""
        return None if self._sync_current else ((self, "_streams"), (self, "_deferred"))

    @property
    def outstanding(self) -> int:
        """The number of MPI operations and device streams quiet() still has to complete."""
        with self._lock:
            return len(self._deferred) + len(self._streams)

    # -- recording ------------------------------------------------------------------
    @contextlib.contextmanager
    def issuing(self):
        """The stream this tracker's device copies run on, made current for the
        block. The default context: the current stream as it is. A Ctx on a device
        heap: its own stream, which first waits for the current one (so data that
        a kernel queued there is ready before the copy reads it)."""
        if self._current_stream or self.backend.device.type == "cpu":
            yield
            return
        device = self.backend.device
        if self._own_stream is None:
            self._own_stream = torch.cuda.Stream(device)  # torch.cuda also drives ROCm GPUs
        self._own_stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self._own_stream):
            yield

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst <- src without waiting (the backend's non-blocking copy, within
        issuing()); quiet() completes it."""
        with self.issuing():
            stream = self.backend.copy(dst, src, blocking=False)
        if stream is not None:
            key = (getattr(stream, "device_index", None), stream.stream_id)
            with self._lock:
                self._streams[key] = stream

    def defer(self, requests, pe: int, window, buffers=None, done=None) -> None:
        """Count an MPI operation on PE `pe` issued without completing it. Each of
        `requests` (one or a list) must need `pe`'s answer to complete (module
        doc); `buffers` stay alive until quiet(), which then calls done()."""
        with self._lock:
            self._deferred.append(_Deferred(requests, pe, window, buffers, done))

    # -- completing ----------------------------------------------------------------------
    def fence(self) -> None:
        """Order this context's operations to each PE: its MPI operations are
        completed (MPI does not order puts to one target otherwise). Device
        copies on one stream already complete in issue order."""
        self._complete_deferred()

    def quiet(self) -> None:
        """Complete every operation recorded here: device copies, then MPI
        operations (with the heap's deadline; PeerTimeoutError at it)."""
        if self._sync_current:
            self.backend.synchronize()
        if not self._streams and not self._deferred:
            return  # nothing recorded (what another thread records meanwhile is not ours to wait for)
        with self._lock:
            streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.synchronize()
        self._complete_deferred()

    def _complete_deferred(self) -> None:
        with self._lock:
            deferred, self._deferred = self._deferred, []
        if not deferred:
            return
        try:
            for op in deferred:  # each needs its target's answer: the deadline finds a dead one
                op.window.complete(op.requests, op.pe, "quiet")
            # The targets have answered, so each flush returns promptly.
            for window, pe in sorted({(id(op.window), op.pe): (op.window, op.pe)
                                      for op in deferred}.values(), key=lambda w: w[1]):
                window.win.Flush(pe)
        except BaseException:
            # Timed out (the heap is now broken) or interrupted: keep what is not
            # known to be complete, so that its buffers stay alive.
            with self._lock:
                self._deferred[:0] = deferred
            raise
        for op in deferred:
            if op.done is not None:
                op.done()
