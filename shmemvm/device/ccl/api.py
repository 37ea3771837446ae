"""`Ccl`: Iris's host collectives (`shmem.ccl.<op>`) on a SymmetricHeap, as
Triton kernels over the heap's mappings (kernels.py), plus all_to_all_v, the
MoE dispatch with its split sizes on the device.

    ccl = heap.ccl                                  # or shmemvm.ccl, the default heap's
    ccl.all_gather(out, inp)                        # out: (n_pes*M, N), PE r's rows r*M...
    ccl.all_reduce(out, inp, op="max", config=Config(all_reduce_variant="one_shot"))
    ccl.all_to_all_v(out, inp, in_splits, out_splits_offsets)   # no host synchronisation

Stream semantics: every call queues one kernel on the current stream (CUDA) of
every PE; the kernel meets the other PEs' kernels of the same call at its
start, so a PE's inputs are read only after every PE's earlier work on its
stream is done, and at its end, so a PE's call returns on the device only
when no peer reads its input any more (and pushed data is visible).
`async_op=False` (the default, as Iris) then waits for the stream on the host
and raises what the call found; `async_op=True` returns at once, and what the
call found is raised by the next call of this Ccl, or by `synchronize()`.
all_to_all_v defaults to `async_op=True`: its counts stay on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import UnsupportedError
from ...core.state import core_of
from ...heap import SymmetricHeap
from . import kernels
from .config import REDUCE_OPS, Config, reduce_op_name
from .engine import Engine, block_of, call_word, error_types

#: integers of each width: copies move bits
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: dtypes the reductions take, and how they are computed
REDUCE_DTYPES = {torch.float16: kernels.HALF, torch.bfloat16: kernels.BF16,
                 torch.float32: kernels.NATIVE, torch.float64: kernels.NATIVE,
                 torch.int8: kernels.NATIVE, torch.int16: kernels.NATIVE,
                 torch.int32: kernels.NATIVE, torch.int64: kernels.NATIVE,
                 torch.uint8: kernels.NATIVE}


@dataclass(frozen=True)
class Workspace:
    """What all_reduce_preamble prepared (Iris returns buffers and locks; here the
    pads are the Ccl's own, so this only records the call it was made for)."""

    shape: tuple
    dtype: torch.dtype
    variant: str


class Ccl:
    """Iris's collectives on `heap` (heap.ccl). Making one is local; its first
    call allocates its signal pads on the heap (collective, as every call).

    Args:
        heap: the SymmetricHeap; all its PEs on one node; a device heap, or the
            host heap under Triton's interpreter (TRITON_INTERPRET=1).
        programs: programs (thread blocks) of every call, the same on every PE
            (default: the device's multiprocessors; 2 in the interpreter).
        timeout: seconds a device-side wait lasts before the call gives up
            (default: the heap's timeout).
        graphs: replay CUDA graphs of repeated calls (default: on CUDA).

    Attributes:
        last_algorithm: the algorithm each op took in its last call (by op name).
        push_below: bytes per PE below which "auto" pushes (all_gather, all_to_all) on
            more than 2 PEs (at 2 PEs it always pulls).
        two_shot_from: bytes from which "auto" all_reduce is two-shot (more than 2 PEs).
    """

    Config = Config

    def __init__(self, heap: SymmetricHeap, *, programs: int | None = None,
                 timeout: float | None = None, graphs: bool | None = None):
        self.heap = heap
        self._engine_options = (programs, timeout, graphs)   # for the engine, made at first use
        self.engine: Engine | None = None
        self.last_algorithm: dict[str, str] = {}
        self.push_below = 64 << 10
        self.two_shot_from = 1 << 20

    # -- the engine, status ------------------------------------------------------------
    def get_engine(self) -> Engine:
        """The pads and status (made at the first call: collective)."""
        if self.engine is None:
            programs, timeout, graphs = self._engine_options
            self.engine = Engine(self.heap, programs=programs, timeout=timeout, graphs=graphs)
        return self.engine

    def synchronize(self) -> None:
        """Wait for this PE's queued calls, and raise what they found on the device."""
        if self.engine is not None:
            self.engine.synchronize()

    def check(self) -> None:
        """Raise what finished calls found (no wait)."""
        if self.engine is not None:
            self.engine.check()

    def renew(self) -> None:
        """New pads after a call timed out (collective: every PE calls it)."""
        self.engine = None
        self.get_engine()

    @property
    def rank(self) -> int:
        return self.heap.my_pe

    @property
    def world_size(self) -> int:
        return self.heap.n_pes

    # -- the common path ---------------------------------------------------------------
    def _call(self, what: str, prepare, async_op: bool, group=None, config=None):
        """Check, prepare (refused arguments meet the peers first, then raise),
        launch, and wait unless async_op."""
        engine = self.get_engine()
        engine.check(what)
        try:
            if group is not None:
                raise UnsupportedError(f"heap.ccl.{what}: group= selects a subset of the PEs, "
                                       f"which is not supported yet; pass group=None (every "
                                       f"PE of the heap), or use a heap made over the "
                                       f"sub-communicator")
            if config is not None:
                if not isinstance(config, Config):
                    raise TypeError(f"heap.ccl.{what}: config must be a Config, got "
                                    f"{type(config).__name__}")
                config.validate()
                if config.use_gluon:
                    raise ValueError(f"heap.ccl.{what}: use_gluon=True: shmemvm has no Gluon "
                                     f"kernels (Triton's only); leave use_gluon False")
            key, launch, tensors = prepare(engine)
        except error_types():
            engine.refused()
            raise
        if launch is None:   # nothing to move: still meet, so that a PE that has work
            word = call_word(what, "empty")   # somewhere else reports a mismatch, not a hang
            key, launch = (what, "empty"), (lambda: engine.sync_kernel(word))
        engine.run(key, launch, tensors)
        if not async_op:
            engine.synchronize(what)

    def _operand(self, tensor, role: str, what: str) -> int:
        return core_of(self.heap).where.symmetric_contiguous(tensor, role, f"heap.ccl.{what}")

    @staticmethod
    def _bits(tensor: torch.Tensor, what: str) -> torch.Tensor:
        size = tensor.element_size()
        if size not in _BITS:
            raise TypeError(f"heap.ccl.{what}: dtype {tensor.dtype} ({size} bytes an element) "
                            f"is not supported; elements of 1, 2, 4 or 8 bytes are")
        return tensor.view(_BITS[size]) if tensor.dtype != _BITS[size] else tensor

    @staticmethod
    def _no_overlap(a_off, a, b_off, b, what):
        a_end, b_end = a_off + a.numel() * a.element_size(), b_off + b.numel() * b.element_size()
        if a.numel() and b.numel() and a_off < b_end and b_off < a_end:
            raise ValueError(f"heap.ccl.{what}: the output and the input overlap; use "
                             f"separate symmetric tensors")

    def _root(self, value, name: str, what: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or \
                not 0 <= value < self.heap.n_pes:
            raise ValueError(f"heap.ccl.{what}: {name} must be in [0, {self.heap.n_pes}): "
                             f"{name} rank {value!r} is out of range for world_size "
                             f"{self.heap.n_pes}")
        return value

    def _move(self, engine, what, src, dst, *, rows, inner, src_ld, dst_ld, src_stride,
              dst_stride, only_pe=-1, active=True, push=False, config=None, extra=()):
        """A prepared call of the copy kernel (see kernels.move)."""
        config = config or Config()
        src_bits, dst_bits = self._bits(src, what), self._bits(dst, what)
        block = block_of(config)
        where = core_of(self.heap).where
        word = call_word(what, where.offset_of(src), where.offset_of(dst), rows, inner,
                         src_ld, dst_ld, src_stride, dst_stride, only_pe, push,
                         src.element_size(), block, *extra)
        args = (src_bits, dst_bits, engine.pads, engine.status, word, engine.me, engine.bases,
                engine.max_polls, rows, inner, src_ld, dst_ld, src_stride, dst_stride, only_pe,
                int(active))
        options = dict(N_PES=engine.n_pes, BLOCK=block, PUSH=push, CONTIG=rows == 1,
                       num_warps=config.num_warps)
        kernel = kernels.move[engine.grid]
        key = (what, word, src.data_ptr(), dst.data_ptr(), int(active))
        return key, lambda: kernel(*args, **options), (src, dst)

    def _reduce_dtype(self, tensor, what):
        if tensor.dtype not in REDUCE_DTYPES:
            raise TypeError(f"heap.ccl.{what}: dtype {tensor.dtype} is not supported for "
                            f"reductions; use one of {sorted(map(str, REDUCE_DTYPES))}")
        kind = REDUCE_DTYPES[tensor.dtype]
        return kind, (tensor.view(torch.int16) if kind == kernels.BF16 else tensor)

    # -- all_reduce ----------------------------------------------------------------------
    def all_reduce_preamble(self, output_tensor, input_tensor, config=None, workspace=None):
        """Iris's workspace preparation: nothing to prepare here (the pads are the
        Ccl's); returns a Workspace naming the call. Local."""
        config = config or Config()
        return Workspace(tuple(input_tensor.shape), input_tensor.dtype,
                         config.all_reduce_variant)

    def all_reduce(self, output_tensor, input_tensor, op=None, group=None, async_op=False,
                   config=None, workspace=None):
        """output <- input reduced over every PE (sum, prod, min, max), in PE
        order, bit-identical on every PE. Iris's variants: "one_shot" (every PE
        reads everything), "two_shot" (PE k reduces slice k and stores it into
        every PE); "ring", "atomic" and "spinlock" run as two-shot; config=None:
        one-shot at 2 PEs or below two_shot_from bytes, else two-shot.

        Returns:
            The workspace (a Workspace; pass it back, or not).
        """
        what = "all_reduce"

        def prepare(engine):
            name = reduce_op_name(op)
            src_off = self._operand(input_tensor, "input", what)
            dst_off = self._operand(output_tensor, "output", what)
            if input_tensor.dtype != output_tensor.dtype or \
                    input_tensor.numel() != output_tensor.numel():
                raise ValueError(f"heap.ccl.{what}: output ({output_tensor.dtype}, "
                                 f"{tuple(output_tensor.shape)}) and input "
                                 f"({input_tensor.dtype}, {tuple(input_tensor.shape)}) must have "
                                 f"the same dtype and number of elements")
            self._no_overlap(dst_off, output_tensor, src_off, input_tensor, what)
            kind, src = self._reduce_dtype(input_tensor, what)
            dst = output_tensor.view(src.dtype)
            n = input_tensor.numel()
            size = n * input_tensor.element_size()
            variant = (config.all_reduce_variant if config is not None else "auto")
            if variant == "auto":
                variant = ("one_shot" if engine.n_pes <= 2 or size < self.two_shot_from
                           else "two_shot")
            algorithm = "one_shot" if variant == "one_shot" else "two_shot"
            self.last_algorithm[what] = algorithm
            if n == 0:
                return None, None, ()
            mode = kernels.ONE_SHOT if algorithm == "one_shot" else kernels.TWO_SHOT
            return self._reduce_call(engine, what, src, dst, src_off, dst_off, n, name, kind,
                                     mode, 0, config)

        self._call(what, prepare, async_op, group, config)
        return workspace if workspace is not None else Workspace(
            tuple(input_tensor.shape), input_tensor.dtype,
            self.last_algorithm.get(what, "one_shot"))

    def _reduce_call(self, engine, what, src, dst, src_off, dst_off, n, name, kind, mode, root,
                     config):
        config = config or Config()
        block = block_of(config)
        word = call_word(what, src_off, dst_off, n, str(src.dtype), REDUCE_OPS[name], kind,
                         mode, root, block)
        args = (src, dst, engine.pads, engine.status, word, engine.me, engine.bases,
                engine.max_polls, n, root)
        options = dict(N_PES=engine.n_pes, BLOCK=block, OP=REDUCE_OPS[name], KIND=kind,
                       MODE=mode, num_warps=config.num_warps)
        kernel = kernels.reduce[engine.grid]
        key = (what, word, src.data_ptr(), dst.data_ptr())
        return key, lambda: kernel(*args, **options), (src, dst)

    # -- reduce (to a root) --------------------------------------------------------------
    def reduce(self, output_tensor, input_tensor, dst=0, op=None, group=None, async_op=False,
               config=None):
        """On PE `dst`: output <- input reduced over every PE in PE order; the other
        PEs' outputs are left as they were (Iris: unspecified)."""
        what = "reduce"

        def prepare(engine):
            root = self._root(dst, "dst", what)
            name = reduce_op_name(op)
            src_off = self._operand(input_tensor, "input", what)
            dst_off = self._operand(output_tensor, "output", what)
            if input_tensor.dtype != output_tensor.dtype or \
                    input_tensor.numel() != output_tensor.numel():
                raise ValueError(f"heap.ccl.{what}: output and input must have the same dtype "
                                 f"and number of elements, got {output_tensor.dtype} "
                                 f"{tuple(output_tensor.shape)} and {input_tensor.dtype} "
                                 f"{tuple(input_tensor.shape)}")
            self._no_overlap(dst_off, output_tensor, src_off, input_tensor, what)
            kind, src = self._reduce_dtype(input_tensor, what)
            self.last_algorithm[what] = "pull_to_root"
            n = input_tensor.numel()
            if n == 0:
                return None, None, ()
            return self._reduce_call(engine, what, src, output_tensor.view(src.dtype), src_off,
                                     dst_off, n, name, kind, kernels.TO_ROOT, root, config)

        self._call(what, prepare, async_op, group, config)

    # -- reduce_scatter (Iris's tiled layout) ----------------------------------------------
    def reduce_scatter(self, output_tensor, input_tensor, op=None, group=None, async_op=False,
                       config=None):
        """Iris's reduce_scatter: input and output (M, N); the plane in
        block_size_m x block_size_n tiles in grouped order (swizzle_size); this
        PE's tiles (all_reduce_distribution 0: striding, 1: block) of its output
        get the reduction over every PE; its other tiles are left as they were."""
        what = "reduce_scatter"

        def prepare(engine):
            cfg = config or Config()
            name = reduce_op_name(op)
            src_off = self._operand(input_tensor, "input", what)
            dst_off = self._operand(output_tensor, "output", what)
            if input_tensor.shape != output_tensor.shape or \
                    input_tensor.dtype != output_tensor.dtype or input_tensor.dim() != 2:
                raise ValueError(f"heap.ccl.{what}: input and output must be 2-D (M, N) of the "
                                 f"same shape and dtype (Iris's layout), got "
                                 f"{tuple(input_tensor.shape)} {input_tensor.dtype} and "
                                 f"{tuple(output_tensor.shape)} {output_tensor.dtype}")
            for field in ("block_size_m", "block_size_n"):
                value = getattr(cfg, field)
                if value & (value - 1):
                    raise ValueError(f"heap.ccl.{what}: Config.{field} must be a power of two "
                                     f"here (a tile is a Triton block), got {value}")
            self._no_overlap(dst_off, output_tensor, src_off, input_tensor, what)
            kind, src = self._reduce_dtype(input_tensor, what)
            dst = output_tensor.view(src.dtype)
            m, n = input_tensor.shape
            self.last_algorithm[what] = f"tiles_{cfg.reduce_scatter_variant}"
            if m * n == 0:
                return None, None, ()
            word = call_word(what, src_off, dst_off, m, n, str(src.dtype), REDUCE_OPS[name],
                             cfg.block_size_m, cfg.block_size_n, cfg.swizzle_size,
                             cfg.all_reduce_distribution)
            args = (src, dst, engine.pads, engine.status, word, engine.me, engine.bases,
                    engine.max_polls, m, n, n)
            options = dict(N_PES=engine.n_pes, BM=cfg.block_size_m, BN=cfg.block_size_n,
                           GROUP=cfg.swizzle_size, DISTRIBUTION=cfg.all_reduce_distribution,
                           OP=REDUCE_OPS[name], KIND=kind, num_warps=cfg.num_warps)
            kernel = kernels.reduce_tiles[engine.grid]
            key = (what, word, src.data_ptr(), dst.data_ptr())
            return key, lambda: kernel(*args, **options), (src, dst)

        self._call(what, prepare, async_op, group, config)

    # -- all_gather, all_to_all -------------------------------------------------------------
    def _variant(self, config, per_pe_bytes) -> str:
        variant = config.all_gather_variant if config is not None else "auto"
        if variant == "auto":   # remote loads cost less than remote stores at 2 PEs (docs)
            return ("push" if self.heap.n_pes > 2 and per_pe_bytes < self.push_below
                    else "pull")
        return "push" if variant == "persistent" else "pull"

    def all_gather(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """output (n_pes*M, ...) <- every PE's input (M, ...): PE r's in rows
        [r*M, (r+1)*M) (torch.distributed.all_gather_into_tensor). Variants:
        "persistent" pushes (stores into every PE), "partitioned" pulls
        (reads every PE); config=None: pull at 2 PEs, push below push_below bytes a
        PE on more."""
        what = "all_gather"

        def prepare(engine):
            src_off = self._operand(input_tensor, "input", what)
            dst_off = self._operand(output_tensor, "output", what)
            world = engine.n_pes
            shape = input_tensor.shape
            expected = (world * shape[0], *shape[1:]) if len(shape) else (world,)
            if tuple(output_tensor.shape) != tuple(expected) or \
                    output_tensor.dtype != input_tensor.dtype:
                raise ValueError(f"heap.ccl.{what}: Output tensor shape "
                                 f"{tuple(output_tensor.shape)} ({output_tensor.dtype}) does not "
                                 f"match expected shape {tuple(expected)} ({input_tensor.dtype})")
            self._no_overlap(dst_off, output_tensor, src_off, input_tensor, what)
            n = input_tensor.numel()
            algorithm = self._variant(config, n * input_tensor.element_size())
            self.last_algorithm[what] = algorithm
            if n == 0:
                return None, None, ()
            return self._move(engine, what, input_tensor, output_tensor, rows=1, inner=n,
                              src_ld=0, dst_ld=0, src_stride=0, dst_stride=n,
                              push=algorithm == "push", config=config)

        self._call(what, prepare, async_op, group, config)

    def all_to_all(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """input and output (M, N*n_pes): column chunk j of PE r's input lands in
        column chunk r of PE j's output (Iris's layout). Push or pull as
        all_gather chooses (config.all_gather_variant)."""
        what = "all_to_all"

        def prepare(engine):
            src_off = self._operand(input_tensor, "input", what)
            dst_off = self._operand(output_tensor, "output", what)
            world = engine.n_pes
            shape = tuple(input_tensor.shape)
            if shape != tuple(output_tensor.shape) or input_tensor.dim() not in (1, 2) or \
                    output_tensor.dtype != input_tensor.dtype or shape[-1] % world:
                raise ValueError(f"heap.ccl.{what}: input and output must be (M, N*{world}) "
                                 f"(or 1-D of N*{world}) of the same shape and dtype, got "
                                 f"{shape} {input_tensor.dtype} and "
                                 f"{tuple(output_tensor.shape)} {output_tensor.dtype}")
            self._no_overlap(dst_off, output_tensor, src_off, input_tensor, what)
            rows = shape[0] if len(shape) == 2 else 1
            cols = shape[-1]
            inner = cols // world
            algorithm = self._variant(config, rows * inner * input_tensor.element_size())
            self.last_algorithm[what] = algorithm
            if rows * inner == 0:
                return None, None, ()
            return self._move(engine, what, input_tensor, output_tensor, rows=rows,
                              inner=inner, src_ld=cols, dst_ld=cols, src_stride=inner,
                              dst_stride=inner, push=algorithm == "push", config=config)

        self._call(what, prepare, async_op, group, config)

    # -- rooted copies -----------------------------------------------------------------------
    def broadcast(self, tensor, src=0, group=None, async_op=False, config=None):
        """In place: every PE's `tensor` <- PE src's (any shape; every PE reads src's)."""
        what = "broadcast"

        def prepare(engine):
            root = self._root(src, "src", what)
            self._operand(tensor, "tensor", what)
            self.last_algorithm[what] = "pull_from_root"
            n = tensor.numel()
            if n == 0:
                return None, None, ()
            return self._move(engine, what, tensor, tensor, rows=1, inner=n, src_ld=0,
                              dst_ld=0, src_stride=0, dst_stride=0, only_pe=root,
                              active=engine.me != root, config=config, extra=(root,))

        self._call(what, prepare, async_op, group, config)

    def gather(self, output_tensor, input_tensor, dst=0, group=None, async_op=False,
               config=None):
        """On PE dst: output (n_pes*M, ...) rows [r*M, (r+1)*M) <- PE r's input
        (M, ...); the other PEs' outputs are left as they were."""
        what = "gather"

        def prepare(engine):
            root = self._root(dst, "dst", what)
            src_off = self._operand(input_tensor, "input", what)
            dst_off = self._operand(output_tensor, "output", what)
            shape = input_tensor.shape
            expected = (engine.n_pes * shape[0], *shape[1:]) if len(shape) else (engine.n_pes,)
            if tuple(output_tensor.shape) != tuple(expected) or \
                    output_tensor.dtype != input_tensor.dtype:
                raise ValueError(f"heap.ccl.{what}: Output tensor shape "
                                 f"{tuple(output_tensor.shape)} does not match expected shape "
                                 f"{tuple(expected)} (and dtype {input_tensor.dtype})")
            self._no_overlap(dst_off, output_tensor, src_off, input_tensor, what)
            self.last_algorithm[what] = "pull_to_root"
            n = input_tensor.numel()
            if n == 0:
                return None, None, ()
            return self._move(engine, what, input_tensor, output_tensor, rows=1, inner=n,
                              src_ld=0, dst_ld=0, src_stride=0, dst_stride=n,
                              active=engine.me == root, config=config, extra=(root,))

        self._call(what, prepare, async_op, group, config)

    def scatter(self, output_tensor, input_tensor, src=0, group=None, async_op=False,
                config=None):
        """output (M, ...) of PE r <- rows [r*M, (r+1)*M) of PE src's input
        (n_pes*M, ...) (only src's input is read)."""
        what = "scatter"

        def prepare(engine):
            root = self._root(src, "src", what)
            src_off = self._operand(input_tensor, "input", what)
            dst_off = self._operand(output_tensor, "output", what)
            shape = output_tensor.shape
            expected = (engine.n_pes * shape[0], *shape[1:]) if len(shape) else (engine.n_pes,)
            if tuple(input_tensor.shape) != tuple(expected) or \
                    output_tensor.dtype != input_tensor.dtype:
                raise ValueError(f"heap.ccl.{what}: input tensor shape "
                                 f"{tuple(input_tensor.shape)} does not match expected shape "
                                 f"{tuple(expected)} for output {tuple(shape)} (and dtype "
                                 f"{output_tensor.dtype})")
            self._no_overlap(dst_off, output_tensor, src_off, input_tensor, what)
            self.last_algorithm[what] = "pull_from_root"
            n = output_tensor.numel()
            if n == 0:
                return None, None, ()
            return self._move(engine, what, input_tensor, output_tensor, rows=1, inner=n,
                              src_ld=0, dst_ld=0, src_stride=n, dst_stride=0, only_pe=root,
                              config=config, extra=(root,))

        self._call(what, prepare, async_op, group, config)

    # -- barrier, send / recv ----------------------------------------------------------------
    def barrier(self, group=None) -> None:
        """A device-side barrier of every PE (one kernel on the current stream that
        meets every PE's), waited for on the host. Collective."""
        what = "barrier"

        def prepare(engine):
            word = call_word(what)
            return (what,), lambda: engine.sync_kernel(word), ()

        self._call(what, prepare, False, group)

    def send(self, tensor, dst, group=None, async_op=False, config=None) -> None:
        """Point-to-point: PE dst's matching recv(t, src=this PE) reads `tensor`
        (torch.distributed's send). The kernel ends when the receiver has read
        it; both PEs' tensors have the same dtype and number of elements."""
        self._p2p("send", tensor, dst, group, async_op, config)

    def recv(self, tensor, src, group=None, async_op=False, config=None) -> None:
        """Point-to-point: `tensor` <- PE src's tensor of its matching send."""
        self._p2p("recv", tensor, src, group, async_op, config)

    def _p2p(self, what, tensor, peer, group, async_op, config):
        def prepare(engine):
            other = self._root(peer, "dst" if what == "send" else "src", what)
            if other == engine.me:
                raise ValueError(f"heap.ccl.{what}: the peer is this PE ({other}); send and "
                                 f"recv pair two different PEs")
            offset = self._operand(tensor, "tensor", what)
            bits = self._bits(tensor, what)
            if offset % tensor.element_size():
                raise ValueError(f"heap.ccl.{what}: the tensor is not aligned to its element "
                                 f"size on the heap")
            n = tensor.numel()
            cfg = config or Config()
            block = block_of(cfg)
            word = call_word("p2p", n, tensor.element_size(), block)
            elements = offset // tensor.element_size()
            self.last_algorithm[what] = "pull_by_receiver"
            kernel = (kernels.send if what == "send" else kernels.recv)[engine.grid]
            if what == "send":
                args = (engine.p2p, engine.status, word, elements, engine.me, other,
                        engine.bases, engine.max_polls)
                options = dict(N_PES=engine.n_pes)
            else:
                args = (bits, engine.p2p, engine.status, word, elements, engine.me, other,
                        engine.bases, engine.max_polls, n)
                options = dict(N_PES=engine.n_pes, BLOCK=block, num_warps=cfg.num_warps)
            key = (what, word, tensor.data_ptr(), other)
            return key, lambda: kernel(*args, **options), (tensor,)

        self._call(what, prepare, async_op, group, config)

    # -- all_to_all_v (MoE dispatch / combine) ----------------------------------------------
    def all_to_all_v(self, output, input, in_splits, out_splits_offsets, group=None,
                     async_op=True, config=None) -> None:
        """torch's all_to_all_vdev on the device: `input` (rows, ...) holds this
        PE's rows for PE 0, then PE 1, ... (`in_splits[q]` rows for PE q, a
        symmetric int64 tensor of n_pes on the device); every PE's rows for
        this PE land in `output` (capacity, ...) in PE order, and
        `out_splits_offsets` (a symmetric int64 (2, n_pes)) gets row 0 the
        counts received from each PE and row 1 their row offsets in output.
        Nothing goes through the host: the counts are read and written on the
        device. The combine (inverse) is all_to_all_v(original, expert_output,
        out_splits_offsets[0], other_splits_offsets).

        Raises (from this call when async_op=False, else from the next call or
        synchronize()):
            ValueError: splits that are negative or overflow the input or the
                output (those rows are not moved; the counts are written).
        """
        what = "all_to_all_v"

        def prepare(engine):
            world = engine.n_pes
            src_off = self._operand(input, "input", what)
            dst_off = self._operand(output, "output", what)
            splits_off = self._operand(in_splits, "in_splits", what)
            so_off = self._operand(out_splits_offsets, "out_splits_offsets", what)
            if in_splits.dtype != torch.int64 or in_splits.numel() != world:
                raise ValueError(f"heap.ccl.{what}: in_splits must be int64 of {world} "
                                 f"elements (one a PE), got {in_splits.dtype} "
                                 f"{tuple(in_splits.shape)}")
            if out_splits_offsets.dtype != torch.int64 or \
                    out_splits_offsets.numel() != 2 * world:
                raise ValueError(f"heap.ccl.{what}: out_splits_offsets must be int64 (2, "
                                 f"{world}), got {out_splits_offsets.dtype} "
                                 f"{tuple(out_splits_offsets.shape)}")
            if input.dim() == 0 or output.dim() == 0 or input.shape[1:] != output.shape[1:] \
                    or input.dtype != output.dtype:
                raise ValueError(f"heap.ccl.{what}: input (rows, ...) and output "
                                 f"(capacity, ...) must have the same row shape and dtype, got "
                                 f"{tuple(input.shape)} {input.dtype} and "
                                 f"{tuple(output.shape)} {output.dtype}")
            self._no_overlap(dst_off, output, src_off, input, what)
            width = 1
            for size in input.shape[1:]:
                width *= size
            cfg = config or Config()
            block = block_of(cfg)
            word = call_word(what, src_off, dst_off, splits_off, so_off, width,
                             input.element_size(), block)
            args = (self._bits(input, what), self._bits(output, what), in_splits,
                    out_splits_offsets, engine.pads, engine.status, word, engine.me,
                    engine.bases, engine.max_polls, width, input.shape[0], output.shape[0])
            options = dict(N_PES=world, NP2=max(2, 1 << (world - 1).bit_length()),
                           BLOCK=block, num_warps=cfg.num_warps)
            self.last_algorithm[what] = "pull"
            kernel = kernels.all_to_all_v[engine.grid]
            key = (what, word, input.data_ptr(), output.data_ptr(), input.shape[0],
                   output.shape[0])
            return key, lambda: kernel(*args, **options), (input, output, in_splits,
                                                            out_splits_offsets)

        self._call(what, prepare, async_op, group, config)
