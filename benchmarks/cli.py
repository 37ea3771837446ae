"""The host suite's command line: `mpirun -n N python -m benchmarks [BENCH ...]`."""

from __future__ import annotations

import argparse
import sys
import time

import torch
from mpi4py import MPI

from . import bench_trace, calls, footprint, live, malloc, putget, schema
from .common import Bench, Options, cpu_busy, parse_list, setup_logging
from .plot import matplotlib_missing
from .targets import evaluate, format_results

FAMILIES = {
    "putget": putget.run,       # put/get bandwidth and latency across sizes
    "malloc": malloc.run,       # collective malloc/free latency, cached and fresh
    "live": live.run,           # malloc latency against live allocations
    "footprint": footprint.run,  # physical bytes per requested byte
    "trace": bench_trace.run,   # what the torch.profiler ranges cost an 8 B put
    "calls": calls.run,         # Python calls per operation, both faces (issue 30)
}

USAGE = """\
mpirun -n N python -m benchmarks [BENCH ...] [options]
       python -m benchmarks report RUN.json [RUN.json ...] [--markdown PATH] [--plot DIR]
       python -m benchmarks host-vs-oshmem [options]      (see benchmarks/host_vs_oshmem.py)
mpirun -n N python -m benchmarks device-ccl [options]   (see benchmarks/bench_ccl.py)
       python -m benchmarks check [RESULT.json ...]

BENCH is one or more of: all (default), putget, malloc, live, footprint, trace, calls."""

METHOD = ("Every figure is the median of --repeat repeats (min, max and quartiles beside it); "
          "a repeat is one timed loop of at least --min-time seconds; each figure's baseline is "
          "measured in the same process and run, interleaved with it repeat by repeat; a "
          "collective figure is, per repeat, the slowest PE's mean per call; ratios are median "
          "over median. put/get: PE 0 to PE 1 while the other PEs rest without spinning. "
          "calls.*: not times but Python calls per operation on PE 0, one sample a call "
          "(those where PE 0 did not wait), against the face's plain local copy of the same "
          "bytes (benchmarks/calls.py).")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", usage=USAGE,
                                description="shmemvm benchmarks, each against a baseline "
                                            "measured in the same run.")
    p.add_argument("benchmarks", nargs="*", metavar="BENCH", default=["all"],
                   help="all, " + ", ".join(FAMILIES))
    p.add_argument("--quick", action="store_true", help="fewer sizes, repeats and counts")
    p.add_argument("--json", metavar="PATH",
                   help="write the result (benchmarks/schema.py) here (PE 0); into "
                        "benchmarks/results/ only from a clean tree")
    p.add_argument("--allow-dirty", action="store_true",
                   help="store into benchmarks/results/ from a tree that differs from its "
                        "commit (recorded in the result)")
    p.add_argument("--plot", metavar="DIR", help="write PNG charts into DIR (needs matplotlib)")
    p.add_argument("--sizes", type=parse_list, help="put/get sizes, e.g. 8,4K,1M")
    p.add_argument("--live", type=parse_list, help="live-allocation counts, e.g. 10,100,1000")
    p.add_argument("--repeat", type=int, help="repeats per figure")
    p.add_argument("--min-time", type=float, help="seconds per timed loop")
    p.add_argument("--heap-size", default="1G", help="heap size of the benchmark heap")
    p.add_argument("--backend", default=None, help="heap backend (default: SHMEMVM_BACKEND)")
    p.add_argument("--strict", action="store_true", help="exit with 1 when a target is missed")
    return p


def main(argv: list[str] | None = None, comm: MPI.Comm | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        from .report import main as report_main
        return report_main(argv[1:])
    if argv[:1] == ["device-ccl"]:   # heap.ccl's collectives (benchmarks/bench_ccl.py)
        from .bench_ccl import main as device_ccl
        return device_ccl(argv[1:], comm)
    args = _parser().parse_args(argv)
    chosen = list(FAMILIES) if "all" in args.benchmarks or not args.benchmarks else []
    for name in args.benchmarks:
        if name != "all" and name not in FAMILIES:
            _parser().error(f"unknown benchmark {name!r}; choose from all, {', '.join(FAMILIES)}")
        if name in FAMILIES and name not in chosen:
            chosen.append(name)
    if args.plot and (missing := matplotlib_missing()):
        _parser().error(missing)  # before measuring, not after; exits with status 2
    options = Options(quick=args.quick, sizes=args.sizes, live=args.live, repeat=args.repeat,
                      min_time=args.min_time, heap_size=args.heap_size, backend=args.backend)
    comm = comm if comm is not None else MPI.COMM_WORLD
    setup_logging()
    # PE 0 checks where the result goes before anything is measured, and every PE
    # stops alike if it may not go there
    run, refused = schema.run_on_pe0(
        comm, "python -m benchmarks", "host-suite",
        schema.command(comm.Get_size(), "-m benchmarks", argv),
        method=METHOD, path=args.json, allow_dirty=args.allow_dirty)
    if refused:
        return 2
    from shmemvm.heap import SymmetricHeap

    bench = Bench(comm, options)
    busy = {}
    bench.heap = SymmetricHeap(comm, heap_size=options.heap_size, backend=options.backend)
    try:
        paths = schema.heap_paths(bench.heap)
        if warning := schema.paths_warning(paths):
            bench.progress("WARNING: %s", warning)
        busy["before"] = _idle_sample(bench, args.quick)
        bench.progress("%d PEs, %s backend, benchmarks: %s%s; CPU busy before: %s", bench.n_pes,
                       bench.heap.backend.name, ", ".join(chosen), " (quick)" if args.quick else "",
                       busy["before"])
        for name in chosen:
            FAMILIES[name](bench)
            comm.Barrier()
        busy["after"] = _idle_sample(bench, args.quick)
        backend = bench.heap.backend.name
    finally:
        bench.heap.finalize()
    targets = evaluate(bench.records)
    if bench.rank != 0:
        return 0
    run.settings = {
        "n_pes": bench.n_pes, "backend": backend, "quick": args.quick, "benchmarks": chosen,
        "repeat": options.repeat, "min_time_s": options.min_time, "heap_size": options.heap_size,
        "sizes": options.sizes, "live": options.live, "environment": schema.environment(),
        "torch_threads": torch.get_num_threads(),
        "elapsed_s": round(time.perf_counter() - bench.started, 1),
        # the share of the CPU other processes used while this run's PEs rested
        "cpu_busy_while_idle": busy,
        "paths": paths,
    }
    if warning := schema.paths_warning(paths):
        run.notes.append(warning)
    run.measurements = bench.records
    run.summary = {"targets": targets}
    doc = run.document()
    print(format_table(bench.records))
    print(format_results(targets, bench.n_pes))
    if args.json:
        schema.write(doc, args.json)
        bench.progress("wrote %s", args.json)
    if args.plot:
        from .plot import plot_run
        for path in plot_run(doc, args.plot):
            bench.progress("wrote %s", path)
    sys.stdout.flush()
    if args.strict and any(t["status"] != "PASS" for t in targets):
        return 1
    return 0


def _idle_sample(bench: Bench, quick: bool):
    """Share of the CPU that other processes use, sampled on PE 0 while the
    other PEs rest (None in quick runs)."""
    if quick:
        return None
    if bench.rank == 0:
        value = cpu_busy(1.0)
        bench.rested()
    else:
        bench.rest()
        value = None
    return value


def format_table(records: list[dict]) -> str:
    lines = [f"{'benchmark':28} {'params':34} {'median':>12}  {'baseline':>12}  {'ratio':>7}  "
             f"baseline name"]
    for r in records:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items()
                           if k not in ("n_pes",) and not isinstance(v, (dict, list)))
        if len(params) > 34:
            params = params[:31] + "..."
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3g}"
        base = schema.baseline_median(r)
        lines.append(f"{r['name']:28} {params:34} {schema.median(r):>8.4g} {r['unit']:<4}  "
                     f"{'' if base is None else f'{base:.4g}':>12}  {ratio:>7}  "
                     f"{schema.baseline_name(r) or ''}")
    return "\n".join(lines)
