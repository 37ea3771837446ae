"""What every benchmark family of the host suite shares: the run context,
timing loops, measurements.

Timing rules used throughout:
  - every figure has a baseline measured in the same process and the same
    run, interleaved with it (repeat r measures the subject, then its
    baselines), so drift on a shared machine hits both alike;
  - each repeat is one loop that runs long enough (`min_time`) to make timer
    resolution irrelevant; a figure is the median over `repeat` repeats, with
    min, max and quartiles beside it, and a ratio compares the subject's
    median with its baseline's (benchmarks/schema.py);
  - a collective figure is, per repeat, the slowest PE's mean per call.
"""

from __future__ import annotations

import gc
import itertools
import logging
import sys
import time
from dataclasses import dataclass, field

from mpi4py import MPI

from .schema import measurement

log = logging.getLogger("benchmarks")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass
class Options:
    quick: bool = False
    sizes: list[int] | None = None          # put/get sizes in bytes
    live: list[int] | None = None           # live-allocation counts
    repeat: int | None = None               # repeats per figure
    min_time: float | None = None           # seconds per timed loop
    heap_size: str = "1G"
    backend: str | None = None

    def __post_init__(self):
        if self.sizes is None:
            self.sizes = ([8, 4 * KiB, 1 * MiB, 4 * MiB] if self.quick else
                          [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, 1 * MiB, 4 * MiB,
                           16 * MiB, 64 * MiB])
        if self.live is None:
            self.live = [10, 100] if self.quick else [10, 100, 1000, 10000]
        if self.repeat is None:
            self.repeat = 3 if self.quick else 11
        if self.min_time is None:
            self.min_time = 0.005 if self.quick else 0.02


@dataclass
class Bench:
    """One benchmark run on the PEs of `comm`."""
    comm: MPI.Comm
    options: Options
    heap: object = None
    records: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def n_pes(self) -> int:
        return self.comm.Get_size()

    def progress(self, message: str, *args) -> None:
        """Progress line on stderr, from PE 0 only."""
        if self.rank == 0:
            log.info("[%6.1fs] " + message, time.perf_counter() - self.started, *args)

    def record(self, name: str, params: dict, samples: list[float], unit: str,
               baseline_name: str, baseline_samples: list[float], better: str) -> dict:
        """Add a measurement: the statistics of `samples` and of its baseline's
        (same unit, same run), and the ratio of their medians."""
        entry = measurement(name, {"n_pes": self.n_pes, **params}, unit, samples,
                            baseline_name, baseline_samples, better)
        self.records.append(entry)
        return entry

    # -- PE coordination ----------------------------------------------------------
    def max_over_pes(self, value: float) -> float:
        return self.comm.allreduce(value, op=MPI.MAX)

    def rest(self) -> None:
        """Wait for every PE without keeping a core busy (the PEs that are not
        measuring call this, so the measuring PE has the machine)."""
        request = self.comm.Ibarrier()
        while not request.Test():
            time.sleep(0.001)

    def rested(self) -> None:
        """The measuring PE's side of rest()."""
        self.comm.Ibarrier().Wait()


def loop_time(fn, iterations: int) -> float:
    """Seconds per call of `fn` over `iterations` calls."""
    start = time.perf_counter()
    for _ in itertools.repeat(None, iterations):
        fn()
    return (time.perf_counter() - start) / iterations


def calibrate(fn, min_time: float, cap: int = 1 << 20) -> int:
    """Calls of `fn` that take about `min_time` seconds (fn already warm)."""
    n = 1
    while True:
        elapsed = loop_time(fn, n) * n
        if elapsed >= min(min_time, 0.002) or n >= cap:
            per_call = elapsed / n
            return max(1, min(cap, int(min_time / max(per_call, 1e-9))))
        n *= 4


def interleaved(ops: dict, repeat: int, min_time: float) -> dict[str, list[float]]:
    """Seconds per call of each op, one sample a repeat, the ops taking turns
    in every repeat."""
    counts = {}
    for name, fn in ops.items():
        fn()
        fn()
        counts[name] = calibrate(fn, min_time)
    samples: dict[str, list[float]] = {name: [] for name in ops}
    gc.collect()
    for _ in range(repeat):
        for name, fn in ops.items():
            samples[name].append(loop_time(fn, counts[name]))
    return samples


def setup_logging() -> None:
    if not any(getattr(h, "_benchmarks", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("bench %(message)s"))
        handler._benchmarks = True
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def format_size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def parse_list(text: str) -> list[int]:
    from shmemvm.config import parse_size
    return [parse_size(part) for part in text.split(",") if part.strip()]


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Fraction of the machine's CPU time that was busy over `seconds` (taken
    while this run's PEs are idle, it is what other processes use)."""
    def sample():
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]), idle
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return round(1 - (idle1 - idle0) / max(1, total1 - total0), 3)
