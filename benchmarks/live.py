"""Allocation latency against the number of live allocations.

The heap holds N live allocations of mixed sizes (64 B .. 40 KB, all below
the segment granularity, so they share chunks) while PEs time collective
malloc (and free) of 1 KiB. Counts are visited going up, then again going
down (freeing back), and each count's figure is taken over both visits,
so slow drift of the machine does not read as a trend. The baseline of each
count is the smallest count, measured in the same run.
"""

from __future__ import annotations

import gc

from .common import Bench, KiB
from .malloc import malloc_free_time

HELD_SIZES = (64, 200, 1024, 3000, 8192, 40000)
PROBE = 1 * KiB


def run(bench: Bench) -> None:
    heap = bench.heap
    counts = sorted(set(bench.options.live))
    iterations = 100 if bench.options.quick else 1000
    held = []
    samples: dict[int, dict[str, list[float]]] = {n: {"malloc": [], "free": []} for n in counts}
    visits = counts + counts[-2::-1]
    for i, count in enumerate(visits):
        bench.progress("malloc with %d live allocations (%d/%d)", count, i + 1, len(visits))
        while len(held) < count:
            held.append(heap.malloc(HELD_SIZES[len(held) % len(HELD_SIZES)]))
        while len(held) > count:
            heap.free(held.pop())
        gc.collect()
        _measure(bench, iterations, samples[count])
    for tensor in reversed(held):
        heap.free(tensor)
    held.clear()
    base = counts[0]
    for count in counts:
        params = {"bytes": PROBE, "live": count}
        for op in ("malloc", "free"):
            bench.record(f"{op}.live_latency", params, _us(samples[count][op]), "us",
                         f"{op} with {base} live", _us(samples[base][op]), "lower")


def _us(seconds: list[float]) -> list[float]:
    return [s * 1e6 for s in seconds]


def _measure(bench: Bench, iterations: int, into: dict[str, list[float]]) -> None:
    bench.heap.free(bench.heap.malloc(PROBE))
    for _ in range(max(1, bench.options.repeat // 2 + 1)):
        m, f = malloc_free_time(bench, PROBE, iterations)
        into["malloc"].append(m)
        into["free"].append(f)
