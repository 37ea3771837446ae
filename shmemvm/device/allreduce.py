"""An all-reduce of symmetric device tensors in one Triton kernel, with no host
step in a call: DeviceAllReduce.

    reduce = shmemvm.DeviceAllReduce(heap)     # collective (allocates its signal pads)
    reduce(dst, src)                           # dst <- sum of src over every PE

Every PE runs the same kernel; its programs meet their counterparts on the
other PEs at device-side barriers (shmemvm.triton's signals, release/acquire at
system scope), read the peers' memory through heap_bases(), and write dst.
Two algorithms, chosen by size unless asked for:

- one-shot: every PE reads every PE's whole `src` and reduces it in PE order;
- two-shot: PE k reduces the k-th slice (in PE order) and stores the result
  into every PE's `dst`: each PE reads and writes 2 (n_pes - 1)/n_pes of the
  data instead of reading (n_pes - 1) times all of it. At 2 PEs that is the
  same traffic on each link, and one-shot measured faster at every size on
  2 x H200 (benchmarks/bench_triton.py), so "auto" picks two-shot only from
  4 MiB on more than 2 PEs (not measured: we had 2 GPUs).

Both give bit-identical results on every PE (every element is reduced in PE
order, once or by one PE).

Why a call costs a few microseconds:
- the call number is kept on the device: each program derives it from the last
  value it set in its own signal slot, so a kernel's arguments are the same in
  every call on the same tensors;
- so on CUDA the first call on given tensors also records the launch in a CUDA
  graph, and later calls replay it (one graph launch instead of Triton's
  Python launcher, ~15 us). Inside a stream capture of the caller's, or with
  graphs=False, the kernel is launched directly (and can be captured).

What a wrong call does (the kernels cannot raise):
- every call carries a word naming its arguments (the tensors' heap offsets,
  size, dtype, op, algorithm, grid, block); programs compare the words they exchange, and
  where PEs called differently, nothing is reduced;
- every wait on a peer gives up after about `timeout` seconds (counted in
  polls: shmemvm.triton.max_polls_for);
- either is recorded in a status word in pinned host memory, which the next
  call (or check()) reads without synchronizing and raises SymmetryError or
  PeerTimeoutError from. The object is unusable after that: make a new one.
"""

from __future__ import annotations

import ctypes
import logging

import torch

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - exercised where triton is absent
    raise ImportError("DeviceAllReduce runs Triton kernels: pip install triton "
                      "(or pip install shmemvm[triton])") from exc

from ..agreement.deadline import parse_timeout
from ..errors import PeerTimeoutError, SymmetryError, UnsupportedError
from ..core.state import core_of
from ..heap import SymmetricHeap
from . import triton as sv
from .ccl.sync import meet   # the meeting of the collectives' programs, written once

#: reductions (tl.constexpr codes of the kernel)
OPS = {"sum": 0, "max": 1, "min": 2}
ALGORITHMS = ("auto", "one_shot", "two_shot")
#: status word values set by the kernel (constexprs: kernels read only those globals)
TIMED_OUT, MISMATCH = tl.constexpr(1), tl.constexpr(2)
_DTYPES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4,
           torch.int32: 5, torch.int64: 6}
#: graphs kept per object (the oldest recorded is dropped first)
MAX_GRAPHS = 64


def _capturing() -> bool:
    """Whether the current CUDA stream is being captured (only asked where a
    graph exists or would be recorded, so on CUDA)."""
    return torch._C._cuda_isCurrentStreamCapturing()


# CUDAGraph.replay without the Python frame of torch's subclass (a call is a few us);
# torch builds without CUDA have no such method, and never record a graph either
_replay = getattr(getattr(torch._C, "_CUDAGraph", None), "replay", None)

log = logging.getLogger("shmemvm")


@triton.jit
def _combine(acc, x, OP: tl.constexpr):
    if OP == 0:
        out = acc + x
    elif OP == 1:
        out = tl.maximum(acc, x)
    else:
        out = tl.minimum(acc, x)
    return out


@triton.jit(do_not_specialize=["n", "word", "me", "max_polls"])
def _all_reduce(src, dst, pads, status, n, word, me, heap_bases, max_polls,
                N_PES: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
                TWO_SHOT: tl.constexpr, HINT: tl.constexpr):
    pid = tl.program_id(0)
    row = pads + pid * (2 * N_PES)   # N_PES barrier slots, then N_PES call words
    # This program's call number: its own slot holds 2 * (last call) + 1.
    epoch = tl.load(row + me, volatile=True) // 2 + 1
    for pe in tl.static_range(N_PES):
        sv.store(row + N_PES + me, word, me, pe, heap_bases)
    # released: the peers read my call word once they see my signal
    arrived = meet(row, 2 * epoch, me, heap_bases, max_polls, N_PES, True)
    same = True
    for pe in tl.static_range(N_PES):
        same = same & (tl.load(row + N_PES + pe, volatile=True) == word)
    if arrived & same:
        step = tl.num_programs(0) * BLOCK
        if TWO_SHOT:
            chunk = tl.cdiv(tl.cdiv(n, N_PES), BLOCK) * BLOCK
            end = tl.minimum(n, (me + 1) * chunk)
            start = me * chunk + pid * BLOCK
        else:
            end = n
            start = pid * BLOCK
        while start < end:   # a while loop: the interpreter cannot range() over run-time ints
            offs = start + tl.arange(0, BLOCK)
            mask = offs < end
            acc = sv.load(src + offs, me, 0, heap_bases, mask=mask, hint=HINT)
            for pe in tl.static_range(1, N_PES):
                acc = _combine(acc, sv.load(src + offs, me, pe, heap_bases, mask=mask, hint=HINT),
                               OP)
            if TWO_SHOT:
                for pe in tl.static_range(N_PES):
                    sv.store(dst + offs, acc, me, pe, heap_bases, mask=mask, hint=HINT)
            else:
                tl.store(dst + offs, acc, mask=mask)
            start += step
    else:
        tl.store(status, tl.where(arrived, MISMATCH, TIMED_OUT).to(tl.int32))
    if arrived:
        # Nobody reads my src (or writes my dst) any more once this is passed.
        # One-shot: this PE's reads of its peers have returned their values
        # (they were stored to dst before the thread barrier), so a relaxed
        # signal will do. Two-shot: the stores into the peers must be released.
        left = meet(row, 2 * epoch + 1, me, heap_bases, max_polls, N_PES, TWO_SHOT)
        if left == 0:
            tl.store(status, TIMED_OUT)


def _interpreted() -> bool:
    return type(_all_reduce).__name__ == "InterpretedFunction"


class DeviceAllReduce:
    """All-reduce of symmetric tensors of `heap` as one Triton kernel per call
    (module docstring). All PEs must be on one node; a device heap, or the host
    heap under Triton's interpreter (TRITON_INTERPRET=1, for tests).

    Args:
        heap: the SymmetricHeap (collective: every PE makes the object, in
            the same order as its other collective calls).
        programs: the most programs (thread blocks) a call runs; default the
            device's multiprocessor count (3 in the interpreter). The same on
            every PE, as `block` (calls of objects that differ raise).
        block: elements each program handles per step (a power of two).
        num_warps: warps per program.
        two_shot_from: bytes from which "auto" picks the two-shot algorithm
            (default: never at 2 PEs, 4 MiB on more).
        timeout: seconds a device-side wait lasts before the call gives up
            (approximate; a finite number > 0; default SHMEMVM_TIMEOUT).
        graphs: replay CUDA graphs of repeated calls (default: on CUDA,
            outside the interpreter).

    Raises:
        UnsupportedError: PEs on other nodes, or host memory without the
            interpreter.
        ValueError: `block` is not a power of two, or `timeout` is not a
            finite number of seconds > 0.
    """

    def __init__(self, heap: SymmetricHeap, *, programs: int | None = None, block: int = 2048,
                 num_warps: int = 8, two_shot_from: int | None = None,
                 timeout: float | None = None,
                 graphs: bool | None = None):
        if len(heap.node_pes) != heap.n_pes:
            raise UnsupportedError("DeviceAllReduce reads every PE's memory: all PEs must be "
                                   "on one node")
        device = heap.device
        interpreted = _interpreted()
        if device.type == "cpu" and not interpreted:
            raise UnsupportedError("DeviceAllReduce on the host heap needs Triton's interpreter: "
                                   "set TRITON_INTERPRET=1 before shmemvm is imported")
        if block < 1 or block & (block - 1):
            raise ValueError(f"block must be a power of two, got {block}")
        # checked before the collective zeros() below, as every argument: a bad one
        # raises on every PE that passes it, before any PE waits for the others
        timeout = parse_timeout(timeout)
        if programs is None:
            programs = (3 if device.type == "cpu"
                        else torch.cuda.get_device_properties(device).multi_processor_count)
        self.heap, self.programs, self.block, self.num_warps = heap, int(programs), block, num_warps
        self._core = core_of(heap)
        if two_shot_from is None:
            two_shot_from = float("inf") if heap.n_pes <= 2 else 4 << 20
        self.two_shot_from = two_shot_from
        self.graphs = (device.type == "cuda" and not interpreted) if graphs is None else graphs
        self._n_pes, self._me = heap.n_pes, heap.my_pe
        self._bases = heap.heap_bases()
        self._pads = heap.zeros(self.programs * 2 * heap.n_pes, torch.int64)
        pinned = device.type == "cuda"
        self._status = torch.zeros(1, dtype=torch.int32, pin_memory=pinned)
        self._status_word = ctypes.c_int32.from_address(self._status.data_ptr())
        self._graph_cache: dict = {}   # call key -> recorded graph, oldest first
        self.timeout = timeout
        self.max_polls = sv.max_polls_for(self.timeout, device)

    # -- calls --------------------------------------------------------------------------
    def __call__(self, dst: torch.Tensor, src: torch.Tensor, op: str = "sum",
                 algorithm: str = "auto") -> None:
        """dst <- src reduced over every PE with `op` ("sum", "max", "min"),
        bit-identical on every PE. Queued on the current stream; collective
        (every PE calls it with the same tensors and arguments).

        Args:
            dst, src: symmetric tensors of this heap, contiguous, of the same
                dtype and number of elements; not overlapping.
            op: "sum", "max" or "min".
            algorithm: "auto" (one-shot below two_shot_from bytes), "one_shot"
                or "two_shot".

        Raises:
            SymmetryError, PeerTimeoutError: an earlier call went wrong on the
                device (see the module docstring); this object is unusable.
            FreedTensorError, TypeError, ValueError: bad tensors or arguments.
        """
        if self._status_word.value:
            self.check()
        key = (dst.data_ptr(), src.data_ptr(), src.numel(), src.dtype, op, algorithm)
        graph = self._graph_cache.get(key)
        if (graph is not None and src.is_contiguous() and dst.is_contiguous()
                and not _capturing()):
            # the tensors must still be live symmetric tensors (their memory mapped)
            self._core.where.symmetric(src, "source")
            self._core.where.symmetric(dst, "destination")
            _replay(graph)
            return
        launch = self._prepare(dst, src, op, algorithm)
        if launch is None:
            return
        launch()
        if self.graphs and graph is None and not _capturing():
            try:
                self._graph_cache[key] = self._record(launch)
            except Exception as exc:  # noqa: BLE001 - the call itself was made: keep it working
                log.warning("DeviceAllReduce: recording a CUDA graph failed (%r); launching "
                            "every call directly from now on", exc)
                self.graphs = False
            if len(self._graph_cache) > MAX_GRAPHS:
                del self._graph_cache[next(iter(self._graph_cache))]   # the oldest

    def check(self) -> None:
        """Raise what a finished call found on the device (SymmetryError,
        PeerTimeoutError); call after synchronizing to see the last call's."""
        status = self._status_word.value
        if status == MISMATCH.value:
            raise SymmetryError("DeviceAllReduce: PEs made different calls (other tensors, "
                                "sizes, dtypes, ops or algorithms); nothing was reduced in that "
                                "call and this object is unusable: make a new one")
        if status:
            raise PeerTimeoutError(f"DeviceAllReduce: a PE did not join a call within about "
                                   f"{self.timeout:g} s (SHMEMVM_TIMEOUT); that call's result "
                                   f"is undefined and this object is unusable: make a new one")

    def synchronize(self) -> None:
        """Wait for this PE's calls queued so far, then check()."""
        if self._pads.device.type == "cuda":
            torch.cuda.current_stream(self._pads.device).synchronize()
        self.check()

    # -- launching ----------------------------------------------------------------------
    def _prepare(self, dst, src, op, algorithm):
        """The call's launch as a function of no arguments (None: nothing to do),
        after checking its arguments."""
        what = "DeviceAllReduce"
        src_offset = self._core.where.symmetric_contiguous(src, "source", what)
        dst_offset = self._core.where.symmetric_contiguous(dst, "destination", what)
        if src.dtype != dst.dtype or src.numel() != dst.numel():
            raise ValueError(f"{what}: dst ({dst.dtype}, {dst.numel()} elements) and src "
                             f"({src.dtype}, {src.numel()} elements) must have the same dtype "
                             f"and number of elements")
        if src.dtype not in _DTYPES:
            raise TypeError(f"{what}: dtype {src.dtype} is not supported; use one of "
                            f"{sorted(map(str, _DTYPES))}")
        if op not in OPS:
            raise ValueError(f"{what}: op must be one of {sorted(OPS)}, got {op!r}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{what}: algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        n, size = src.numel(), src.numel() * src.element_size()
        if (dst_offset < src_offset + size and src_offset < dst_offset + size) and n:
            raise ValueError(f"{what}: dst and src overlap; use separate tensors")
        if n == 0:
            return None
        two_shot = algorithm == "two_shot" or (algorithm == "auto" and size >= self.two_shot_from)
        grid = (max(1, min(self.programs, triton.cdiv(n, self.block))),)
        # Names the call: PEs whose words differ called differently (ints hash alike
        # everywhere). The grid and block too: PEs whose objects were made with other
        # `programs`/`block` would split the work differently.
        word = (hash((src_offset, dst_offset, n, _DTYPES[src.dtype], OPS[op], two_shot,
                      grid[0], self.block)) & ((1 << 61) - 1)) | (1 << 61)
        aligned = src.data_ptr() % 16 == 0 and dst.data_ptr() % 16 == 0
        kernel = _all_reduce[grid]
        args = (src, dst, self._pads, self._status, n, word, self._me, self._bases,
                self.max_polls)
        options = dict(N_PES=self._n_pes, BLOCK=self.block, OP=OPS[op], TWO_SHOT=two_shot,
                       HINT=self.block if aligned else None, num_warps=self.num_warps)
        return lambda: kernel(*args, **options)

    def _record(self, launch):
        """A CUDA graph of `launch` (recorded, not run)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            launch()
        return graph
