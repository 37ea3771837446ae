"""Iris's `Config` for the collectives (iris/ccl/config.py), field for field,
with Iris's defaults and checks, and the reduction ops.

Where a field has no meaning here (AMD's XCDs, waves per EU, Gluon) it is
accepted and checked as Iris checks it, and ignored; docs/device.md lists
them. Ours alone: the value "auto" of `all_gather_variant` and
`all_reduce_variant`, which the ops use when called with `config=None` (the
algorithm chosen by size and PE count)."""

from __future__ import annotations

from dataclasses import dataclass

from ...vocabulary import REDUCE_OPS as REDUCE_NAMES, numbering

#: reduction ops, by name (the kernels' constexpr codes: the first four of the
#: vocabulary's, numbered in its order)
REDUCE_OPS = numbering(REDUCE_NAMES[:4])
ALL_GATHER_VARIANTS = ("auto", "persistent", "partitioned")
ALL_REDUCE_VARIANTS = ("auto", "atomic", "ring", "two_shot", "one_shot", "spinlock")
REDUCE_SCATTER_VARIANTS = ("two_shot", "ring_chunked")


@dataclass
class Config:
    """Block sizes, program counts and variants of a collective call (Iris's
    fields and defaults). Used here: block_size_m and block_size_n (the tile
    of reduce_scatter, and their product the elements a program moves per
    step elsewhere), comm_sms (the programs a call runs, at most the device's
    multiprocessors), swizzle_size and all_reduce_distribution (which tiles a
    PE gets in reduce_scatter), num_warps, num_stages, the variants. Accepted
    and ignored: num_xcds, chunk_size, all_reduce_num_rings,
    all_reduce_ring_slice_n, threads_per_warp, waves_per_eu.

    Raises:
        ValueError: a value Iris refuses (as Iris's __post_init__).
    """

    block_size_m: int = 32
    block_size_n: int = 64
    swizzle_size: int = 4
    comm_sms: int = 64
    num_xcds: int | None = None
    chunk_size: int | None = None
    use_gluon: bool = False
    all_gather_variant: str = "persistent"
    all_reduce_variant: str = "two_shot"
    all_reduce_distribution: int = 1
    all_reduce_num_rings: int = 1
    all_reduce_ring_slice_n: int | None = None
    reduce_scatter_variant: str = "two_shot"
    num_stages: int = 1
    num_warps: int = 4
    threads_per_warp: int = 64
    waves_per_eu: int = 0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Check every field (also after a field was changed, as Iris's tests do)."""
        for name in ("block_size_m", "block_size_n", "swizzle_size", "comm_sms",
                     "all_reduce_num_rings", "num_stages", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Config.{name} must be a positive int, got {value!r}")
        for name in ("num_xcds", "chunk_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"Config.{name} must be None or a positive int, got {value!r}")
        if self.all_gather_variant not in ALL_GATHER_VARIANTS:
            raise ValueError(f"Config.all_gather_variant must be one of {ALL_GATHER_VARIANTS}, "
                             f"got {self.all_gather_variant!r}")
        if self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"Config.all_reduce_variant must be one of {ALL_REDUCE_VARIANTS}, "
                             f"got {self.all_reduce_variant!r}")
        if self.reduce_scatter_variant not in REDUCE_SCATTER_VARIANTS:
            raise ValueError(f"Config.reduce_scatter_variant must be one of "
                             f"{REDUCE_SCATTER_VARIANTS}, got {self.reduce_scatter_variant!r}")
        if self.all_reduce_distribution not in (0, 1):
            raise ValueError(f"Config.all_reduce_distribution must be 0 (striding) or 1 "
                             f"(block), got {self.all_reduce_distribution!r}")
        if self.threads_per_warp not in (32, 64):
            raise ValueError(f"Config.threads_per_warp must be 32 or 64, got "
                             f"{self.threads_per_warp!r}")
        if self.waves_per_eu < 0:
            raise ValueError(f"Config.waves_per_eu must be >= 0, got {self.waves_per_eu!r}")
        slice_n = self.all_reduce_ring_slice_n
        if slice_n is not None and (slice_n <= 0 or slice_n & (slice_n - 1)
                                    or self.block_size_n % slice_n):
            raise ValueError(f"Config.all_reduce_ring_slice_n must be a power of two that "
                             f"divides block_size_n ({self.block_size_n}), got {slice_n!r}")


def reduce_op_name(op) -> str:
    """'sum', 'prod', 'min' or 'max' for `op`: None (sum, as Iris), one of
    those names, or torch.distributed's ReduceOp (by its name)."""
    if op is None:
        return "sum"
    name = op if isinstance(op, str) else getattr(op, "name", None) or str(op).rpartition(".")[2]
    name = str(name).lower().rstrip(">").split(":")[0]
    if name == "product":
        name = "prod"
    if name not in REDUCE_OPS:
        raise ValueError(f"op must be one of {sorted(REDUCE_OPS)} (or torch.distributed.ReduceOp's "
                         f"SUM, PRODUCT, MIN, MAX), got {op!r}")
    return name
