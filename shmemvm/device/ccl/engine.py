"""What every collective call of a `Ccl` shares: the signal pads on the heap,
the status words in pinned host memory, the call words, the launch on the
current stream, CUDA-graph replay of repeated calls, and turning what a call
found on the device into an exception (sync.py's status words).

A mismatch (PEs called differently) leaves the pads in step (every program met
at entry and exit), so it is raised once and the object stays usable. A wait
that gave up leaves them out of step: the object is unusable from then on
(`Ccl.renew()` makes new pads, collectively)."""

from __future__ import annotations

import ctypes
import logging

import torch

from ...agreement.deadline import parse_timeout
from ...errors import PeerTimeoutError, ShmemError, SymmetryError, UnsupportedError
from ...core.state import core_of
from ...heap import SymmetricHeap
from .. import triton as sv
from . import kernels
from .sync import MISMATCH, OVERFLOW, STATUS_WORDS, TIMED_OUT

log = logging.getLogger("shmemvm")

#: graphs kept per object (the oldest recorded is dropped first)
MAX_GRAPHS = 64
#: the call word of a PE whose arguments were refused (never a real call's: bit 62 set)
REFUSED = (1 << 62) | 1

# CUDAGraph.replay without the Python frame of torch's subclass; torch builds
# without CUDA have no such method, and never record a graph either
_replay = getattr(getattr(torch._C, "_CUDAGraph", None), "replay", None)


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1)."""
    return type(kernels.move).__name__ == "InterpretedFunction"


def capturing() -> bool:
    """Whether the current CUDA stream is being captured."""
    return torch.cuda.is_available() and torch._C._cuda_isCurrentStreamCapturing()


def call_word(*parts) -> int:
    """A call's word: a hash of what names it (ints and strings hash alike on every PE
    with PYTHONHASHSEED unset only for ints: strings are turned into ints first)."""
    ints = tuple(sum(ord(ch) << (8 * (i % 7)) for i, ch in enumerate(p)) if isinstance(p, str)
                 else int(p) for p in parts)
    return (hash(ints) & ((1 << 61) - 1)) | (1 << 60)


class Engine:
    """The pads, status and launches of one Ccl (collective constructor:
    allocates on the heap)."""

    def __init__(self, heap: SymmetricHeap, *, programs: int | None, timeout: float | None,
                 graphs: bool | None):
        if len(heap.node_pes) != heap.n_pes:
            raise UnsupportedError("heap.ccl reads every PE's memory through the node's "
                                   "mappings: all PEs must be on one node")
        device = heap.device
        self.interpreted = interpreted()
        if device.type == "cpu" and not self.interpreted:
            raise UnsupportedError("heap.ccl on the host heap needs Triton's interpreter: set "
                                   "TRITON_INTERPRET=1 before shmemvm is imported")
        self.timeout = parse_timeout(timeout if timeout is not None else heap.timeout)
        if programs is None:
            programs = (2 if device.type == "cpu"
                        else torch.cuda.get_device_properties(device).multi_processor_count)
        self.heap, self.device, self.programs = heap, device, int(programs)
        self.n_pes, self.me = heap.n_pes, heap.my_pe
        self.graphs = (device.type == "cuda" and not self.interpreted) if graphs is None \
            else graphs
        self.bases = heap.heap_bases()
        self.pads = heap.zeros(self.programs * 2 * self.n_pes, torch.int64)
        self.p2p = heap.zeros(self.programs * 7 * self.n_pes, torch.int64)
        self.status = torch.zeros(STATUS_WORDS, dtype=torch.int32,
                                  pin_memory=device.type == "cuda")
        self.words = (ctypes.c_int32 * STATUS_WORDS).from_address(self.status.data_ptr())
        self.max_polls = sv.max_polls_for(self.timeout, device)
        self.graph_cache: dict = {}
        self.broken = False

    # -- status --------------------------------------------------------------------------
    def check(self, what: str = "a collective") -> None:
        """Raise what finished calls found on the device (and clear what is recoverable)."""
        if self.broken or self.words[TIMED_OUT.value]:
            self.broken = True
            raise PeerTimeoutError(
                f"heap.ccl: a PE did not join {what} (or an earlier call) within about "
                f"{self.timeout:g} s (SHMEMVM_TIMEOUT); that call's result is undefined and "
                f"this Ccl is unusable: call renew() on every PE, or make a new "
                f"shmemvm.device.ccl.Ccl(heap)")
        if self.words[MISMATCH.value]:
            self.words[MISMATCH.value] = 0
            raise SymmetryError(
                f"heap.ccl: the PEs made different calls in {what} or a call before it (other "
                f"collectives, tensors, sizes, dtypes, ops, roots or configs, or a PE whose "
                f"arguments were refused); nothing was moved in that call. Every PE must make "
                f"the same collective calls in the same order")
        if self.words[OVERFLOW.value]:
            self.words[OVERFLOW.value] = 0
            raise ValueError(
                f"heap.ccl.all_to_all_v: splits were negative, added up to more rows than "
                f"the input has, or sent more rows than the output holds ({what} or a call "
                f"before it); rows from such a PE were not moved, counts were written. Size "
                f"the output for the most rows a PE can receive")

    def synchronize(self, what: str = "a collective") -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.check(what)

    # -- launching -----------------------------------------------------------------------
    def run(self, key, launch, tensors) -> None:
        """Launch a prepared call (replaying its graph where one was recorded)."""
        graph = self.graph_cache.get(key) if key is not None else None
        if graph is not None and _replay is not None and not capturing():   # (recorded: CUDA)
            for t in tensors:   # still live symmetric tensors (their memory mapped)
                core_of(self.heap).where.symmetric(t, "operand of a replayed collective")
            _replay(graph)
            return
        launch()
        if self.graphs and key is not None and graph is None and not capturing():
            try:
                self.graph_cache[key] = self.record(launch)
            except Exception as exc:  # noqa: BLE001 - the call itself was made
                log.warning("heap.ccl: recording a CUDA graph failed (%r); launching every "
                            "call directly from now on", exc)
                self.graphs = False
            if len(self.graph_cache) > MAX_GRAPHS:
                del self.graph_cache[next(iter(self.graph_cache))]

    def record(self, launch):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            launch()
        return graph

    def sync_kernel(self, word: int) -> None:
        kernels.sync_only[(self.programs,)](self.pads, self.status, word, self.me, self.bases,
                                            self.max_polls, N_PES=self.n_pes)

    def refused(self) -> None:
        """This PE's arguments were refused: meet the peers with a word no real call
        has, so that they report a mismatch now instead of waiting for the timeout,
        and forget the mismatch here (the caller raises its own error)."""
        if self.broken:
            return
        had = self.words[MISMATCH.value]
        self.sync_kernel(REFUSED)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.words[MISMATCH.value] = had

    @property
    def grid(self) -> tuple[int]:
        """Every call of this object runs the same number of programs on every PE, so
        that programs always have their counterparts (a mismatch is then reported,
        not waited out)."""
        return (self.programs,)


def block_of(config) -> int:
    """Elements a program moves per step in the 1-D kernels: block_size_m *
    block_size_n rounded down to a power of two."""
    return 1 << max(4, (config.block_size_m * config.block_size_n).bit_length() - 1)


def error_types():
    """The exceptions a refused argument raises (the caller meets its peers first)."""
    return (TypeError, ValueError, ShmemError)

