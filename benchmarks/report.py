"""`python -m benchmarks report RUN.json ...`: a markdown summary of host-suite
results (no MPI needed), optionally with their charts. Every figure is a
median, and the summary names the files it was read from."""

from __future__ import annotations

import argparse
import os
import sys

from . import schema
from .names import BARRIER, LOCAL, MPI_GET, MPI_PUT, RAW_BACK, RAW_UNBACK
from .plot import matplotlib_missing
from .schema import baseline_median, median


def _find(records, name, baseline=None, **params):
    for r in records:
        if r["name"] == name and (baseline is None or schema.baseline_name(r) == baseline) and \
                all(r["params"].get(k) == v for k, v in params.items()):
            return r
    return None


def _fmt(x, digits=3):
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"


def _shown(path: str) -> str:
    """`path` from the checkout's root where it lies inside it."""
    where = os.path.abspath(path)
    inside = where.startswith(schema.ROOT + os.sep)
    return os.path.relpath(where, schema.ROOT) if inside else where


def _pes(doc) -> int:
    return doc["settings"]["n_pes"]


def _paths(docs: list[dict]) -> str:
    """Which of shmemvm's paths the runs took (settings.paths), as a sentence."""
    said = []
    for d in docs:
        ran = d["settings"].get("paths")
        if not ran:
            continue
        piece = ("the compiled piece" if ran.get("native") else
                 "the pure Python paths (compiled piece "
                 + ("unused" if ran.get("compiled_piece") else "missing") + ")")
        said.append(f"{_pes(d)} PEs: {piece}, agreement through {ran.get('agreement')}, "
                    f"atomics through {ran.get('atomics')}")
    return ("Paths: " + "; ".join(said) + ". ") if said else ""


def markdown(docs: list[dict], chart: str | None = None, paths: list[str] | None = None) -> str:
    """The summary of host-suite results `docs` (read from `paths`, named in it)."""
    order = sorted(range(len(docs)), key=lambda i: _pes(docs[i]))
    docs = [docs[i] for i in order]
    paths = [paths[i] for i in order] if paths else None
    m, v = docs[0]["machine"], docs[0]["versions"]
    pes = " and ".join(str(_pes(d)) for d in docs)
    sources = (", ".join(f"`{_shown(p)}`" for p in paths) if paths else "the runs given")
    commits = sorted({d["code"]["commit"][:10] + ("" if d["code"]["clean"] else " (dirty)")
                      for d in docs})
    out = [
        "### Host backend performance",
        "",
        f"From {sources} (commit {', '.join(commits)}). Measured on a {m['cores']}-core "
        f"{m['cpu']} machine ({m['memory_gib']} GiB, Linux {m['kernel']}), {pes} PEs on the one "
        f"machine; Python {v['python']}, torch {v['torch']}, mpi4py {v['mpi4py']} over "
        f"{v['mpi']}; runs of "
        f"{', '.join(d['date'][:16].replace('T', ' ') + ' UTC' for d in docs)} "
        f"({_load(docs)}). {docs[0]['method']} "
        f"{_paths(docs)}Reproduce with "
        + "; ".join(f"`{d['command']}`" for d in docs) + ".",
        "",
        "| target | " + " | ".join(f"{_pes(d)} PEs" for d in docs) + " |",
        "|---|" + "---|" * len(docs),
    ]
    names = []
    for d in docs:
        for t in d.get("summary", {}).get("targets", []):
            if t["target"] not in names:
                names.append(t["target"])
    for name in names:
        cells = []
        for d in docs:
            t = next((t for t in d["summary"]["targets"] if t["target"] == name), None)
            cells.append("n/a" if t is None else f"**{t['status']}** {t['ratio']:.2f}x "
                                                   f"({t['detail']})")
        out.append(f"| {name} | " + " | ".join(cells) + " |")

    out += ["", "| figure (median) | " + " | ".join(f"{_pes(d)} PEs" for d in docs) + " |",
            "|---|" + "---|" * len(docs)]

    def row(label, fn):
        out.append(f"| {label} | " + " | ".join(fn(d["measurements"]) for d in docs) + " |")

    for size, label in ((8, "8 B"), (1 << 20, "1 MiB"), (64 << 20, "64 MiB")):
        for op, mpi in (("put", MPI_PUT), ("get", MPI_GET)):
            unit = "latency" if size == 8 else "bandwidth"
            if _find_any(docs, f"{op}.{unit}", LOCAL, bytes=size) is None:
                continue

            def cell(records, op=op, unit=unit, size=size, mpi=mpi):
                a = _find(records, f"{op}.{unit}", LOCAL, bytes=size)
                b = _find(records, f"{op}.{unit}", mpi, bytes=size)
                if a is None:
                    return "n/a"
                u = "us" if unit == "latency" else "GB/s"
                return (f"{_fmt(median(a))} {u} (local copy {_fmt(baseline_median(a))}, "
                        f"MPI {_fmt(baseline_median(b)) if b else 'n/a'})")
            row(f"{op} {label} {unit}", cell)
    for size, label in ((1 << 10, "1 KiB"), (1 << 20, "1 MiB")):
        if _find_any(docs, "malloc.latency", BARRIER, bytes=size, kind="cached"):
            def cell(records, size=size):
                a = _find(records, "malloc.latency", BARRIER, bytes=size, kind="cached")
                f = _find(records, "free.latency", BARRIER, bytes=size, kind="cached")
                return "n/a" if a is None else (
                    f"malloc {_fmt(median(a))} us, free {_fmt(median(f))} us "
                    f"(MPI.Barrier {_fmt(baseline_median(a))} us)")
            row(f"collective malloc/free, cached {label}", cell)
    branch = "the same, the engine's Python branch"   # (malloc.py's engine_branch)
    if _find_any(docs, "malloc+free.latency", branch, bytes=1 << 10, kind="cached"):
        def cell(records):
            a = _find(records, "malloc+free.latency", branch, bytes=1 << 10, kind="cached")
            return "n/a" if a is None else (
                f"{_fmt(median(a))} us with the engine's cached branch in C "
                f"(Python branch {_fmt(baseline_median(a))} us)")
        row("malloc + free, cached 1 KiB: the engine's branch", cell)
    if _find_any(docs, "malloc.latency", RAW_BACK, bytes=1 << 20, kind="fresh segment"):
        def cell(records):
            a = _find(records, "malloc.latency", RAW_BACK, bytes=1 << 20, kind="fresh segment")
            f = _find(records, "free+trim.latency", RAW_UNBACK, bytes=1 << 20,
                      kind="fresh segment")
            return "n/a" if a is None else (
                f"malloc {_fmt(median(a))} us (raw create+map {_fmt(baseline_median(a))} us), "
                f"free+trim {_fmt(median(f))} us (raw {_fmt(baseline_median(f))} us)")
        row("malloc, fresh 1 MiB segment", cell)

    def live_cell(records):
        rows = sorted((r for r in records if r["name"] == "malloc.live_latency"),
                      key=lambda r: r["params"]["live"])
        return ", ".join(f"{r['params']['live']}: {_fmt(median(r))}" for r in rows) + " us" \
            if rows else "n/a"
    row("malloc 1 KiB vs live allocations", live_cell)

    def foot_cell(records):
        p = _find(records, "footprint.physical_per_requested")
        u = _find(records, "footprint.in_use_per_requested")
        if p is None:
            return "n/a"
        return (f"{_fmt(median(p))} mapped, {_fmt(median(u))} in use (bump arena "
                f"{_fmt(baseline_median(p))})")
    row("physical bytes per requested byte (transformer steps)", foot_cell)
    if chart:
        out += ["", f"![host benchmarks]({chart})"]
    return "\n".join(out) + "\n"


def _load(docs) -> str:
    """How loaded the machine was around each run."""
    parts = []
    for d in docs:
        load = d["machine"]["load_average"]
        busy = d["settings"].get("cpu_busy_while_idle") or {}
        text = (f"{_pes(d)} PEs: load average {load['start'][0]:.1f} at the start, "
                f"{load['end'][0]:.1f} at the end")
        values = [x for x in (busy.get("before"), busy.get("after")) if x is not None]
        if values:
            text += ", CPU busy with other work before/after " + "/".join(f"{x:.0%}"
                                                                          for x in values)
        parts.append(text)
    return "; ".join(parts)


def _find_any(docs, *args, **kwargs):
    for d in docs:
        r = _find(d["measurements"], *args, **kwargs)
        if r is not None:
            return r
    return None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks report")
    p.add_argument("runs", nargs="+", help="host-suite results written with --json")
    p.add_argument("--markdown", metavar="PATH", help="write the summary here (default: stdout)")
    p.add_argument("--plot", metavar="DIR", help="also write each run's chart into DIR")
    p.add_argument("--chart", help="chart path to reference from the markdown")
    args = p.parse_args(argv)
    if args.plot and (missing := matplotlib_missing()):
        p.error(missing)  # exits with status 2, no traceback
    docs = [schema.load(path) for path in args.runs]
    for path, doc in zip(args.runs, docs):
        problems = schema.validate(doc, stored=False)
        if problems or doc.get("benchmark") != "host-suite":
            p.error(f"{path} is not a host-suite result of {schema.SCHEMA}: "
                    f"{'; '.join(problems[:3]) or doc.get('benchmark')}")
    if args.plot:
        from .plot import plot_run
        for doc in docs:
            for path in plot_run(doc, args.plot):
                print(f"wrote {path}", file=sys.stderr)
    text = markdown(docs, args.chart, args.runs)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
        print(f"wrote {args.markdown}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
