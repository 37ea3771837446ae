"""Command line of `python -m benchmarks` (run it under mpirun)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

from mpi4py import MPI

from . import footprint, live, malloc, putget
from .common import Bench, Options, code_version, cpu_busy, machine, parse_list, setup_logging
from .plot import matplotlib_missing
from .targets import evaluate, format_results

FAMILIES = {
    "putget": putget.run,       # put/get bandwidth and latency across sizes
    "malloc": malloc.run,       # collective malloc/free latency, cached and fresh
    "live": live.run,           # malloc latency against live allocations
    "footprint": footprint.run,  # physical bytes per requested byte
}
SCHEMA = "shmemvm.bench/1"

USAGE = """\
mpirun -n N python -m benchmarks [BENCH ...] [options]
       python -m benchmarks report RUN.json [RUN.json ...] [--markdown PATH] [--plot DIR]

BENCH is one or more of: all (default), putget, malloc, live, footprint."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", usage=USAGE,
                                description="shmemvm benchmarks, each against a baseline "
                                            "measured in the same run.")
    p.add_argument("benchmarks", nargs="*", metavar="BENCH", default=["all"],
                   help="all, " + ", ".join(FAMILIES))
    p.add_argument("--quick", action="store_true", help="fewer sizes, repeats and counts")
    p.add_argument("--json", metavar="PATH", help="write the records as JSON (PE 0)")
    p.add_argument("--plot", metavar="DIR", help="write PNG charts into DIR (needs matplotlib)")
    p.add_argument("--sizes", type=parse_list, help="put/get sizes, e.g. 8,4K,1M")
    p.add_argument("--live", type=parse_list, help="live-allocation counts, e.g. 10,100,1000")
    p.add_argument("--repeat", type=int, help="repeats per figure")
    p.add_argument("--stat", choices=["min", "median"], default="min",
                   help="figure over the repeats: min (best of, the default) or median")
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
                      min_time=args.min_time, heap_size=args.heap_size, backend=args.backend,
                      stat=args.stat)
    comm = comm if comm is not None else MPI.COMM_WORLD
    setup_logging()
    from shmemvm.heap import SymmetricHeap

    bench = Bench(comm, options)
    busy = {}
    bench.heap = SymmetricHeap(comm, heap_size=options.heap_size, backend=options.backend)
    try:
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
    doc = {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "n_pes": bench.n_pes,
        "backend": backend,
        "quick": args.quick,
        "benchmarks": chosen,
        "elapsed_s": round(time.perf_counter() - bench.started, 1),
        "statistic": f"{options.stat} over {options.repeat} repeats; collective figures: the "
                     f"slowest PE's mean per call in each repeat",
        "command": "mpirun -n %d python -m benchmarks %s" % (bench.n_pes, " ".join(argv)),
        "code": code_version(),
        "cpu_busy_while_idle": busy,
        "machine": machine(),
        "records": bench.records,
        "targets": targets,
    }
    print(format_table(bench.records))
    print(format_results(targets, bench.n_pes))
    if args.json:
        directory = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(directory, exist_ok=True)
        with open(args.json, "w") as out:
            json.dump(doc, out, indent=1)
            out.write("\n")
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
    lines = [f"{'benchmark':28} {'params':34} {'value':>12}  {'baseline':>12}  {'ratio':>7}  "
             f"baseline name"]
    for r in records:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items()
                           if k not in ("n_pes",) and not isinstance(v, dict))
        if len(params) > 34:
            params = params[:31] + "..."
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3g}"
        lines.append(f"{r['name']:28} {params:34} {r['value']:>8.4g} {r['unit']:<4}  "
                     f"{r['baseline_value']:>12.4g}  {ratio:>7}  {r['baseline_name']}")
    return "\n".join(lines)
