#!/usr/bin/env python
"""Allocation benchmarks for VMemPow2Allocator (host backend), each beside a
plain bump allocator measured in the same run.

(a) allocate+free latency of one small size class while N other allocations
    are live (N = 10, 100, 1000, 10000): median and p90 in microseconds, and
    the growth latency(N) / latency(10), which should stay near 1 (flat).
(b) physical bytes per requested byte on a mixed-size workload: the tensors of
    a few training steps of a small transformer (weights, Adam state,
    activations freed during backward, gradients), at the peak.

    python benchmarks/bench_alloc.py --quick
    python benchmarks/bench_alloc.py --json benchmarks/out/alloc.json

--json writes the result in the one format (benchmarks/schema.py): every figure's
median, min, max, quartiles and sample count beside its baseline's, measured in
the same run, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from benchmarks import schema  # noqa: E402
from shmemvm import VMemPow2Allocator  # noqa: E402

ALIGN = 64


# ---------------------------------------------------------------------------
# baseline
# ---------------------------------------------------------------------------

class BumpAllocator:
    """A bump pointer into one big torch.empty buffer, handing out views.

    free() does nothing; mark()/reset(mark) roll the pointer back (an arena),
    and the pointer wraps to `floor` when the buffer is full (latency runs
    only). `high_water` is the furthest the pointer ever went: the physical
    bytes this allocator needs.
    """

    def __init__(self, capacity: int):
        self.buffer = torch.empty(capacity, dtype=torch.uint8)
        self.capacity = capacity
        self.top = 0
        self.floor = 0
        self.high_water = 0

    def allocate(self, shape, dtype=torch.uint8) -> torch.Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        start = self.top
        end = start + nbytes
        if end > self.capacity:
            start, end = self.floor, self.floor + nbytes
            if end > self.capacity:
                raise MemoryError(f"bump buffer of {self.capacity} bytes cannot hold {nbytes}")
        self.top = -(-end // ALIGN) * ALIGN
        self.high_water = max(self.high_water, self.top)
        return self.buffer[start:end].view(dtype).view(shape)

    def free(self, tensor: torch.Tensor) -> None:
        pass

    def mark(self) -> int:
        return self.top

    def reset(self, mark: int) -> None:
        self.top = mark


# ---------------------------------------------------------------------------
# (a) latency with N live allocations
# ---------------------------------------------------------------------------

def _live_sizes(n: int, rng: random.Random) -> list[int]:
    """Mixed sizes for the allocations held live while timing (64 B .. 256 KiB)."""
    return [rng.choice([rng.randrange(1, 512), rng.randrange(512, 8192),
                        rng.randrange(8192, 256 * 1024)]) if rng.random() < 0.3
            else rng.randrange(1, 512) for _ in range(n)]


def _time_pairs(alloc, nbytes: int, iters: int, warmup: int) -> list[float]:
    allocate, free = alloc.allocate, alloc.free
    clock = time.perf_counter_ns
    for _ in range(warmup):
        free(allocate(nbytes))
    samples = [0.0] * iters
    gc.collect()
    gc.disable()      # as timeit does: a collection pause is not allocator latency
    try:
        for i in range(iters):
            t0 = clock()
            t = allocate(nbytes)
            free(t)
            t1 = clock()
            samples[i] = (t1 - t0) / 1000.0
    finally:
        gc.enable()
    del t
    return samples


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def bench_latency(live_counts, nbytes: int, iters: int, repeats: int, seed: int) -> dict:
    """{allocator: {N: per-pair microseconds}}, the samples of `repeats` runs pooled."""
    results: dict[str, dict[int, list[float]]] = {"vmem": {}, "bump": {}}
    for n in live_counts:
        sizes = _live_sizes(n, random.Random(seed + n))
        held_bytes = sum(sizes)
        for name in ("vmem", "bump"):
            pooled: list[float] = []
            for _ in range(repeats):
                if name == "vmem":
                    alloc = VMemPow2Allocator(max(64 << 20, 4 * held_bytes), backend="host")
                else:
                    alloc = BumpAllocator(2 * held_bytes + iters * 2 * ALIGN + (1 << 20))
                held = [alloc.allocate(s) for s in sizes]
                if name == "bump":
                    alloc.floor = alloc.top      # wrap above the held data
                samples = _time_pairs(alloc, nbytes, iters, warmup=min(iters, 500))
                assert len(held) == n
                if name == "vmem":
                    assert alloc.stats()["live_allocations"] == n
                    alloc.close()
                del held
                pooled += samples
            results[name][n] = pooled
    return results


# ---------------------------------------------------------------------------
# (b) mapped bytes per requested byte on a transformer training step
# ---------------------------------------------------------------------------

class Tracker:
    """Wraps an allocator; records live requested bytes and their peak."""

    def __init__(self, alloc, physical, blocks=None):
        self.alloc = alloc
        self.physical = physical          # () -> physical bytes in use now
        self.blocks = blocks or physical  # () -> bytes of live blocks (after rounding)
        self.peak_blocks = 0
        self.live = {}
        self.requested = 0
        self.peak_requested = 0
        self.peak_physical = 0
        self.total_requested = 0
        self.count = 0

    def new(self, *shape, dtype=torch.float32) -> torch.Tensor:
        t = self.alloc.allocate(shape, dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        self.live[id(t)] = nbytes
        self.requested += nbytes
        self.total_requested += nbytes
        self.count += 1
        self.peak_requested = max(self.peak_requested, self.requested)
        self.peak_physical = max(self.peak_physical, self.physical())
        self.peak_blocks = max(self.peak_blocks, self.blocks())
        return t

    def free(self, *tensors) -> None:
        for t in tensors:
            self.requested -= self.live.pop(id(t))
            self.alloc.free(t)


def transformer_steps(m: Tracker, steps: int, vocab=8000, d=384, layers=4, heads=6,
                      ff=1536, seq=128, batch=8, on_step_end=None) -> None:
    """The allocation pattern of `steps` training steps of a small GPT-style
    model (fp32, Adam): every tensor is requested from `m`, and activations
    are freed in reverse order during backward, as autograd does."""
    B, S, H, V = batch, seq, heads, vocab
    shapes = {"emb": (V, d), "pos": (S, d), "lnf_w": (d,), "lnf_b": (d,)}
    for i in range(layers):
        shapes.update({
            f"{i}.ln1_w": (d,), f"{i}.ln1_b": (d,), f"{i}.qkv_w": (3 * d, d), f"{i}.qkv_b": (3 * d,),
            f"{i}.proj_w": (d, d), f"{i}.proj_b": (d,), f"{i}.ln2_w": (d,), f"{i}.ln2_b": (d,),
            f"{i}.ff1_w": (ff, d), f"{i}.ff1_b": (ff,), f"{i}.ff2_w": (d, ff), f"{i}.ff2_b": (d,),
        })
    params = {k: m.new(*s) for k, s in shapes.items()}
    adam_m = {k: m.new(*s) for k, s in shapes.items()}
    adam_v = {k: m.new(*s) for k, s in shapes.items()}
    tokens = m.new(B, S, dtype=torch.int64)
    targets = m.new(B, S, dtype=torch.int64)

    for _ in range(steps):
        grads = {}
        # forward: keep what backward needs
        saved = []
        x = m.new(B, S, d)                                # embedding + positions
        saved.append([x])
        for i in range(layers):
            ln1 = m.new(B, S, d)
            stats1 = m.new(B, S, 2)
            qkv = m.new(B, S, 3 * d)
            scores = m.new(B, H, S, S)
            probs = m.new(B, H, S, S)
            m.free(scores)                                # softmax in place of a temp
            attn = m.new(B, S, d)
            proj = m.new(B, S, d)
            x1 = m.new(B, S, d)                           # residual
            ln2 = m.new(B, S, d)
            stats2 = m.new(B, S, 2)
            h = m.new(B, S, ff)
            g = m.new(B, S, ff)                           # gelu
            out = m.new(B, S, d)
            x2 = m.new(B, S, d)                           # residual
            m.free(proj, out)
            saved.append([ln1, stats1, qkv, probs, attn, x1, ln2, stats2, h, g, x2])
        lnf = m.new(B, S, d)
        logits = m.new(B, S, V)
        loss = m.new(1)
        # backward
        dlogits = m.new(B, S, V)
        m.free(logits)
        grads["emb"] = m.new(V, d)                        # tied LM head
        dx = m.new(B, S, d)
        m.free(dlogits, lnf)
        grads["lnf_w"], grads["lnf_b"] = m.new(d), m.new(d)
        for i in reversed(range(layers)):
            acts = saved.pop()
            dh = m.new(B, S, ff)
            grads[f"{i}.ff2_w"], grads[f"{i}.ff2_b"] = m.new(d, ff), m.new(d)
            dh1 = m.new(B, S, ff)
            m.free(dh)
            grads[f"{i}.ff1_w"], grads[f"{i}.ff1_b"] = m.new(ff, d), m.new(ff)
            dln2 = m.new(B, S, d)
            m.free(dh1)
            dx1 = m.new(B, S, d)
            m.free(dln2, dx)
            grads[f"{i}.ln2_w"], grads[f"{i}.ln2_b"] = m.new(d), m.new(d)
            dattn = m.new(B, S, d)
            grads[f"{i}.proj_w"], grads[f"{i}.proj_b"] = m.new(d, d), m.new(d)
            dprobs = m.new(B, H, S, S)
            dscores = m.new(B, H, S, S)
            m.free(dprobs)
            dqkv = m.new(B, S, 3 * d)
            m.free(dscores, dattn)
            grads[f"{i}.qkv_w"], grads[f"{i}.qkv_b"] = m.new(3 * d, d), m.new(3 * d)
            dln1 = m.new(B, S, d)
            m.free(dqkv)
            dx = m.new(B, S, d)
            m.free(dln1, dx1)
            grads[f"{i}.ln1_w"], grads[f"{i}.ln1_b"] = m.new(d), m.new(d)
            m.free(*acts)
        grads["pos"] = m.new(S, d)
        m.free(dx, *saved.pop(), loss)
        # optimizer step: one temporary per parameter, then grads go away
        for k in shapes:
            tmp = m.new(*shapes[k])
            m.free(tmp)
        m.free(*grads.values())
        if on_step_end is not None:
            on_step_end()
    m.free(*params.values(), *adam_m.values(), *adam_v.values(), tokens, targets)


def bench_footprint(steps: int, granularities: list[int], model: dict) -> list[dict]:
    """Run the workload on the bump baseline and on VMemPow2Allocator at each
    granularity; peak physical and peak live requested bytes of each."""
    # Baseline: the persistent tensors (parameters, Adam state, token buffers:
    # the first 3 * P + 2 requests) are bumped once; everything after them is a
    # per-step arena, rolled back at the end of each step.
    bump = BumpAllocator(4 << 30)
    tb = Tracker(bump, lambda: bump.high_water)
    n_persistent = 3 * (4 + 12 * model["layers"]) + 2
    arena = {}
    plain_new = tb.new

    def new_with_mark(*shape, dtype=torch.float32):
        t = plain_new(*shape, dtype=dtype)
        if tb.count == n_persistent:
            arena["mark"] = bump.mark()
        return t

    tb.new = new_with_mark
    transformer_steps(tb, steps, on_step_end=lambda: bump.reset(arena["mark"]), **model)
    bump_row = dict(peak_physical=tb.peak_physical, peak_requested=tb.peak_requested,
                    total_requested=tb.total_requested, count=tb.count)

    rows = []
    for gran in granularities:
        heap = VMemPow2Allocator(4 << 30, backend="host", granularity=gran)
        tv = Tracker(heap, lambda: heap.stats()["mapped"], lambda: heap.stats()["used"])
        transformer_steps(tv, steps, **model)
        assert heap.stats()["live_allocations"] == 0
        heap.close()
        assert (tv.peak_requested, tv.total_requested) == (bump_row["peak_requested"],
                                                           bump_row["total_requested"])
        rows.append(dict(granularity=gran, peak_physical=tv.peak_physical,
                         peak_blocks=tv.peak_blocks,
                         peak_requested=tv.peak_requested, total_requested=tv.total_requested,
                         count=tv.count, bump=bump_row))
    return rows


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH",
                    help="write the result (benchmarks/schema.py) here; into benchmarks/results/ "
                         "only from a clean tree")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="store into benchmarks/results/ from a tree that differs from its "
                         "commit (recorded in the result)")
    ap.add_argument("--quick", action="store_true", help="short run (fewer iterations)")
    ap.add_argument("--live", default="10,100,1000,10000",
                    help="numbers of other live allocations (comma separated)")
    ap.add_argument("--size", type=int, default=256, help="bytes per timed allocation")
    ap.add_argument("--iters", type=int, help="timed allocate+free pairs per measurement")
    ap.add_argument("--repeats", type=int, help="measurements per point (their samples pooled)")
    ap.add_argument("--steps", type=int, help="training steps in the footprint workload")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:   # before measuring: may the result go where --json says?
        run = schema.Run("alloc", schema.command(None, "benchmarks/bench_alloc.py",
                                                 list(sys.argv[1:] if argv is None else argv)),
                         method="one sample per allocate+free pair (perf_counter_ns), the "
                                "samples of every repeat pooled; figures are medians, ratios "
                                "median over median; footprint figures are deterministic (one "
                                "sample)", path=args.json, allow_dirty=args.allow_dirty)
    except schema.DirtyTreeError as exc:
        ap.error(str(exc))

    iters = args.iters or (2000 if args.quick else 20000)
    repeats = args.repeats or (1 if args.quick else 3)
    steps = args.steps or (2 if args.quick else 4)
    live_counts = [int(x) for x in args.live.split(",")]
    model = (dict(vocab=4000, d=256, layers=2, heads=4, ff=1024, seq=64, batch=4) if args.quick
             else dict(vocab=8000, d=384, layers=4, heads=6, ff=1536, seq=128, batch=8))
    records = run.measurements
    print(f"shmemvm allocator benchmark ({'quick' if args.quick else 'full'}; python "
          f"{platform.python_version()}, torch {torch.__version__}, {platform.machine()})")

    # (a)
    lat = bench_latency(live_counts, args.size, iters, repeats, args.seed)
    base_n = live_counts[0]
    print(f"\n(a) allocate+free latency, {args.size}-byte tensor, {iters} pairs x "
          f"{repeats} repeats; microseconds")
    header = (f"{'live N':>7} | {'vmem med':>9} {'vmem p90':>9} {'growth':>7} | "
              f"{'bump med':>9} {'bump p90':>9} {'growth':>7} | {'vmem/bump':>9}")
    print(header)
    print("-" * len(header))
    med = {k: {n: statistics.median(v) for n, v in by_n.items()} for k, by_n in lat.items()}
    p90 = {k: {n: _percentile(v, 0.9) for n, v in by_n.items()} for k, by_n in lat.items()}
    for n in live_counts:
        vm, vp = med["vmem"][n], p90["vmem"][n]
        bm, bp = med["bump"][n], p90["bump"][n]
        vg, bg = vm / med["vmem"][base_n], bm / med["bump"][base_n]
        print(f"{n:>7} | {vm:>9.2f} {vp:>9.2f} {vg:>7.2f} | {bm:>9.2f} {bp:>9.2f} {bg:>7.2f} | "
              f"{vm / bm:>9.2f}")
        params = dict(allocator="VMemPow2Allocator(host)", size_bytes=args.size, live=n,
                      iters=iters, repeats=repeats, p90_us=schema.sig(vp),
                      baseline_p90_us=schema.sig(bp), bump_growth_vs_base=schema.sig(bg))
        run.add("alloc_free_latency", params, "us", lat["vmem"][n], "bump", lat["bump"][n],
                "lower")
        run.add(f"alloc_free_latency_vs_{base_n}_live", params, "us", lat["vmem"][n],
                f"VMemPow2Allocator with {base_n} live", lat["vmem"][base_n], "lower")

    # (b)
    grans = [64 << 10, 2 << 20]
    rows = bench_footprint(steps, grans, model)
    b = rows[0]["bump"]
    print(f"\n(b) physical bytes per requested byte, transformer training steps "
          f"({steps} steps, {rows[0]['count']} requests, {b['total_requested'] / 2**20:.1f} MiB "
          f"requested in all, peak live {b['peak_requested'] / 2**20:.1f} MiB)")
    model_s = ", ".join(f"{k}={v}" for k, v in model.items())
    print(f"    model: {model_s}")
    header = (f"{'allocator':<34} | {'peak physical MiB':>17} | {'per requested byte':>18} | "
              f"{'live blocks only':>16}")
    print(header)
    print("-" * len(header))
    bump_ratio = b["peak_physical"] / b["peak_requested"]
    print(f"{'bump (persistent + per-step arena)':<34} | {b['peak_physical'] / 2**20:>17.1f} | "
          f"{bump_ratio:>18.3f} | {'':>16}")
    for row in rows:
        ratio = row["peak_physical"] / row["peak_requested"]
        label = f"vmem host, granularity {row['granularity'] >> 10} KiB"
        blocks_ratio = row["peak_blocks"] / row["peak_requested"]
        print(f"{label:<34} | {row['peak_physical'] / 2**20:>17.1f} | {ratio:>18.3f} | "
              f"{blocks_ratio:>16.3f}")
        params = dict(allocator="VMemPow2Allocator(host)", granularity=row["granularity"],
                      steps=steps, requests=row["count"], peak_requested=row["peak_requested"],
                      peak_physical=row["peak_physical"], baseline_peak_physical=b["peak_physical"],
                      **model)
        run.add("mapped_per_requested_byte_peak", params, "bytes/byte", [ratio], "bump_arena",
                [bump_ratio], "lower")
        run.add("block_bytes_per_requested_byte_peak", params, "bytes/byte", [blocks_ratio],
                "bump_arena", [bump_ratio], "lower")
    print("\n    vmem: peak of stats()['mapped'] (live + cached segments) / peak live requested "
          "bytes;\n    live blocks only: peak of stats()['used'] (power-of-two rounding, no cache) / "
          "the same;\n    bump: high-water mark of the pointer / the same peak.")

    if args.json:
        run.settings = {"quick": args.quick, "size_bytes": args.size, "iters": iters,
                        "repeats": repeats, "live": live_counts, "steps": steps, "model": model,
                        "seed": args.seed}
        run.write()
        print(f"\nwrote {len(records)} measurements to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
