"""What the torch.profiler ranges (shmemvm/core/trace.py) cost an 8 B put.

Every routine of a heap is wrapped once so that, while a torch profiler
records, each call is a named range. With no profiler the wrapper only asks
torch's flag and calls the routine. Measured on PE 0, putting 8 B to PE 1
(itself when alone), while the other PEs rest:

  trace.put_hook_off   heap.put, as every user calls it (the wrapper, no profiler)
                       against the same routine without the wrapper
                       (SymmetricHeap.put.__wrapped__): the ratio is the hook's cost
  trace.hook_alone     the wrapper around a routine that does nothing, against
                       the routine: the hook's own cost in ns
  trace.put_profiling  heap.put inside torch.profiler.profile() (one range a call)
                       against the same routine without the wrapper, no profiler

    mpirun -n 2 python -m benchmarks trace [--json PATH]
    python -m benchmarks.bench_trace [--json PATH]      (1 PE; the suite's options)
"""

from __future__ import annotations

import torch
from torch.profiler import profile

from shmemvm.core.state import core_of
from shmemvm.core.trace import ranged

from .common import Bench, interleaved

UNHOOKED = "rma.put without the hook (SymmetricHeap.put.__wrapped__)"
NBYTES = 8


def _nothing(ctx, dest, source, pe) -> None:
    """A routine with put's parameters that does nothing."""


def run(bench: Bench) -> None:
    heap = bench.heap
    target = 1 if bench.n_pes > 1 else 0
    dest = heap.zeros(NBYTES // 4, torch.int32)          # collective
    source = torch.ones(NBYTES // 4, dtype=torch.int32)
    if bench.rank == 0:
        _measure(bench, heap, dest, source, target)
        bench.rested()
    else:
        bench.rest()
    heap.barrier_all()
    heap.free(dest)


def _measure(bench: Bench, heap, dest, source, target: int) -> None:
    options = bench.options
    routine = type(heap).put.__wrapped__
    core = core_of(heap)   # the routine's first argument: the heap's core
    ops = {"hooked": lambda: heap.put(dest, source, target),
           "unhooked": lambda: routine(core, dest, source, target)}
    samples = interleaved(ops, options.repeat, options.min_time)
    params = {"bytes": NBYTES, "target": target}
    us = {name: [s * 1e6 for s in values] for name, values in samples.items()}
    entry = bench.record("trace.put_hook_off", params, us["hooked"], "us", UNHOOKED,
                         us["unhooked"], "lower")
    bench.progress("8 B put, profiler off: %.3f us with the hook, %.3f us without (ratio %s)",
                   entry["value"]["median"], entry["baseline"]["value"]["median"],
                   entry["ratio"])
    # the hook alone, around a routine that does nothing: its cost in ns, free of the
    # put's own noise on a shared machine
    hooked_nothing = ranged(_nothing, "shmemvm.nothing")
    alone = interleaved({"hooked": lambda: hooked_nothing(heap, dest, source, target),
                         "plain": lambda: _nothing(heap, dest, source, target)},
                        options.repeat, options.min_time)
    entry = bench.record("trace.hook_alone", {"routine": "no-op, put's parameters"},
                         [s * 1e9 for s in alone["hooked"]], "ns", "the no-op itself",
                         [s * 1e9 for s in alone["plain"]], "lower")
    bench.progress("the hook alone: %.0f ns a call over the no-op's %.0f ns",
                   entry["value"]["median"] - entry["baseline"]["value"]["median"],
                   entry["baseline"]["value"]["median"])
    with profile() as prof:     # a profiler recording: a range a call
        profiling = interleaved({"profiling": ops["hooked"]}, options.repeat, options.min_time)
    del prof
    plain = interleaved({"unhooked": ops["unhooked"]}, options.repeat, options.min_time)
    entry = bench.record("trace.put_profiling", params, [s * 1e6 for s in profiling["profiling"]],
                         "us", UNHOOKED + ", no profiler",
                         [s * 1e6 for s in plain["unhooked"]], "lower")
    bench.progress("8 B put, profiler recording: %.3f us (ratio %s)", entry["value"]["median"],
                   entry["ratio"])


if __name__ == "__main__":
    import sys

    from .cli import main
    raise SystemExit(main(["trace", *sys.argv[1:]]))
