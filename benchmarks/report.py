"""`python -m benchmarks report RUN.json ...`: a markdown summary of runs
(no MPI needed), optionally with their charts."""

from __future__ import annotations

import argparse
import json
import sys

from .malloc import BARRIER, RAW_BACK
from .plot import matplotlib_missing
from .putget import LOCAL, MPI_GET, MPI_PUT


def _find(records, name, baseline=None, **params):
    for r in records:
        if r["name"] == name and (baseline is None or r["baseline_name"] == baseline) and \
                all(r["params"].get(k) == v for k, v in params.items()):
            return r
    return None


def _fmt(x, digits=3):
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"


def markdown(docs: list[dict], chart: str | None = None) -> str:
    docs = sorted(docs, key=lambda d: d["n_pes"])
    m = docs[0]["machine"]
    pes = " and ".join(str(d["n_pes"]) for d in docs)
    out = [
        "### Host backend performance",
        "",
        f"Measured on a {m['cpus']}-core {m['cpu']} VM ({m['memory_gib']} GiB, Linux "
        f"{m['kernel']}), {pes} PEs on the one machine; Python {m['python']}, torch "
        f"{m['torch']} ({m['torch_threads']} thread(s) per PE), mpi4py {m['mpi4py']} over "
        f"{m['mpi'].replace('Version: ', '')}; runs of "
        f"{', '.join(d['date'][:16].replace('T', ' ') + ' UTC' for d in docs)}"
        f" ({_busy(docs)}). Every figure has its baseline measured in the same process and run, "
        f"interleaved with it; statistic: {docs[0].get('statistic', 'median of repeats')}. "
        f"Reproduce with `mpirun -n N python -m benchmarks --json host-Npe.json --plot DIR`.",
        "",
        "| target | " + " | ".join(f"{d['n_pes']} PEs" for d in docs) + " |",
        "|---|" + "---|" * len(docs),
    ]
    names = []
    for d in docs:
        for t in d["targets"]:
            key = t["target"]
            if key not in names:
                names.append(key)
    for name in names:
        cells = []
        for d in docs:
            t = next((t for t in d["targets"] if t["target"] == name), None)
            cells.append("n/a" if t is None else f"**{t['status']}** {t['ratio']:.2f}x "
                                                   f"({t['detail']})")
        out.append(f"| {name} | " + " | ".join(cells) + " |")

    out += ["", "| figure | " + " | ".join(f"{d['n_pes']} PEs" for d in docs) + " |",
            "|---|" + "---|" * len(docs)]

    def row(label, fn):
        out.append(f"| {label} | " + " | ".join(fn(d["records"]) for d in docs) + " |")

    for size, label in ((8, "8 B"), (1 << 20, "1 MiB"), (64 << 20, "64 MiB")):
        for op, mpi in (("put", MPI_PUT), ("get", MPI_GET)):
            unit = "latency" if size == 8 else "bandwidth"
            loc = _find_any(docs, f"{op}.{unit}", LOCAL, bytes=size)
            if loc is None:
                continue

            def cell(records, op=op, unit=unit, size=size, mpi=mpi):
                a = _find(records, f"{op}.{unit}", LOCAL, bytes=size)
                b = _find(records, f"{op}.{unit}", mpi, bytes=size)
                if a is None:
                    return "n/a"
                u = "us" if unit == "latency" else "GB/s"
                return (f"{_fmt(a['value'])} {u} (local copy {_fmt(a['baseline_value'])}, "
                        f"MPI {_fmt(b['baseline_value']) if b else 'n/a'})")
            row(f"{op} {label} {unit}", cell)
    for size, label in ((1 << 10, "1 KiB"), (1 << 20, "1 MiB")):
        if _find_any(docs, "malloc.latency", BARRIER, bytes=size, kind="cached"):
            def cell(records, size=size):
                a = _find(records, "malloc.latency", BARRIER, bytes=size, kind="cached")
                f = _find(records, "free.latency", BARRIER, bytes=size, kind="cached")
                return "n/a" if a is None else (
                    f"malloc {_fmt(a['value'])} us, free {_fmt(f['value'])} us "
                    f"(MPI.Barrier {_fmt(a['baseline_value'])} us)")
            row(f"collective malloc/free, cached {label}", cell)
    if _find_any(docs, "malloc.latency", RAW_BACK, bytes=1 << 20, kind="fresh segment"):
        def cell(records):
            a = _find(records, "malloc.latency", RAW_BACK, bytes=1 << 20, kind="fresh segment")
            f = _find(records, "free+trim.latency", None, bytes=1 << 20, kind="fresh segment")
            return "n/a" if a is None else (
                f"malloc {_fmt(a['value'])} us (raw create+map {_fmt(a['baseline_value'])} us), "
                f"free+trim {_fmt(f['value'])} us (raw {_fmt(f['baseline_value'])} us)")
        row("malloc, fresh 1 MiB segment", cell)

    def live_cell(records):
        rows = sorted((r for r in records if r["name"] == "malloc.live_latency"),
                      key=lambda r: r["params"]["live"])
        return ", ".join(f"{r['params']['live']}: {_fmt(r['value'])}" for r in rows) + " us" \
            if rows else "n/a"
    row("malloc 1 KiB vs live allocations", live_cell)

    def foot_cell(records):
        p = _find(records, "footprint.physical_per_requested")
        u = _find(records, "footprint.in_use_per_requested")
        if p is None:
            return "n/a"
        return (f"{_fmt(p['value'])} mapped, {_fmt(u['value'])} in use (bump arena "
                f"{_fmt(p['baseline_value'])})")
    row("physical bytes per requested byte (transformer steps)", foot_cell)
    if chart:
        out += ["", f"![host benchmarks]({chart})"]
    return "\n".join(out) + "\n"


def _busy(docs) -> str:
    """How busy the machine was with other work around each run."""
    parts = []
    for d in docs:
        busy = d.get("cpu_busy_while_idle") or {}
        values = [v for v in (busy.get("before"), busy.get("after")) if v is not None]
        if values:
            parts.append(f"{d['n_pes']} PEs: " + "/".join(f"{v:.0%}" for v in values))
    if not parts:
        return "machine load not sampled"
    return "CPU busy with other work just before/after the run: " + ", ".join(parts)


def _find_any(docs, *args, **kwargs):
    for d in docs:
        r = _find(d["records"], *args, **kwargs)
        if r is not None:
            return r
    return None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks report")
    p.add_argument("runs", nargs="+", help="JSON files written with --json")
    p.add_argument("--markdown", metavar="PATH", help="write the summary here (default: stdout)")
    p.add_argument("--plot", metavar="DIR", help="also write each run's chart into DIR")
    p.add_argument("--chart", help="chart path to reference from the markdown")
    args = p.parse_args(argv)
    if args.plot and (missing := matplotlib_missing()):
        p.error(missing)  # exits with status 2, no traceback
    docs = []
    for path in args.runs:
        with open(path) as f:
            docs.append(json.load(f))
    if args.plot:
        from .plot import plot_run
        for doc in docs:
            for path in plot_run(doc, args.plot):
                print(f"wrote {path}", file=sys.stderr)
    text = markdown(docs, args.chart)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
        print(f"wrote {args.markdown}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
