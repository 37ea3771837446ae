"""Issue 24's host comparison: shmemvm against shmem4py on Open MPI's OSHMEM.

    python -m benchmarks host-vs-oshmem [--pes 2,4] [--node-split] [--rounds 3]
        [--json benchmarks/results/host-vs-oshmem-2pe.json] [--plot PNG] [--allow-dirty]
    python -m benchmarks host-vs-oshmem --table RESULT.json     # its markdown table

One script, benchmarks/shmem4py_ops.py, written against shmem4py's API, is
launched once a round under each implementation:
  - oshmem:  the real shmem4py 1.0 on Open MPI's OSHMEM (oshrun, UCX over shared
             memory), from --oshmem-venv (default /opt/oshmem-venv);
  - shmemvm: the same script with `shmemvm.shmem` imported in its place (MPICH's
             mpirun, this checkout's shmemvm);
  - torch:   shmemvm's torch API doing the same operations (--no-torch leaves it out).
The implementations alternate (the first of one round is the last of the next),
and every figure is the median of all rounds' samples, with the load average
at the start and end of each launch kept beside it. Where the peer is not
installed (CI), it says so and measures shmemvm against its own same-run
baselines only (a local np.copyto of the same bytes, MPI.Barrier, MPI
Allreduce), which it also does where the peer is there.

--node-split measures the off-node path: shmemvm with SHMEMVM_NODE_SPLIT=1
(every PE its own simulated node: puts, gets and atomics go through MPI) and
MPICH on its network module (MPIR_CVAR_NOLOCAL=1); OSHMEM with UCX over TCP
(UCX_TLS=tcp,self) and Open MPI's TCP transport (--mca btl self,tcp).

The result (benchmarks/schema.py) has, per operation and mode, shmemvm's figure,
OSHMEM's as its baseline and their ratio (shmemvm / OSHMEM: for times above 1 is
slower, for bandwidth below 1 is slower), and the chart draws the slowdowns.
Without the peer, the table and the chart compare each face with its same-run
baseline instead (operations without one, the atomics, get no bar). The result
says which of shmemvm's paths each face ran (settings.paths: the compiled piece,
the agreement's transport, the atomics' path), and a run without the compiled
piece says so as it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from . import schema

OPS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shmem4py_ops.py")
PEER = "shmem4py 1.0 on Open MPI OSHMEM"
FACES = {"shmemvm": "shmemvm.shmem", "torch": "shmemvm torch API"}
GOAL = 1.5   # issue 24: small-operation latency at most 1.5x OSHMEM's


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks host-vs-oshmem",
                                description=__doc__.splitlines()[0])
    p.add_argument("--pes", default="2", help="PE counts, e.g. 2,4 (default 2)")
    p.add_argument("--node-split", action="store_true",
                   help="also measure the off-node path (SHMEMVM_NODE_SPLIT=1; OSHMEM on TCP)")
    p.add_argument("--only-node-split", action="store_true",
                   help="measure the off-node path alone")
    p.add_argument("--rounds", type=int, default=3, help="rounds, implementations alternating")
    p.add_argument("--repeat", type=int, default=5, help="timed loops per operation and launch")
    p.add_argument("--min-time", type=float, default=0.02, help="seconds per timed loop")
    p.add_argument("--quick", action="store_true", help="fewer sizes (a check that all runs)")
    p.add_argument("--no-torch", action="store_true", help="leave out the torch API")
    p.add_argument("--oshmem-venv", default=os.environ.get("OSHMEM_VENV", "/opt/oshmem-venv"),
                   help="a virtual environment with shmem4py built on Open MPI's OSHMEM, and "
                        "oshrun in its bin/ or on PATH")
    p.add_argument("--mpirun", default=None,
                   help="the mpirun of shmemvm's MPI (default: $MPIRUN, else the one beside "
                        "this Python, else PATH's)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    p.add_argument("--json", metavar="PATH", help="write the result here (benchmarks/schema.py)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="store into benchmarks/results/ from a tree that differs from its "
                        "commit (recorded in the result)")
    p.add_argument("--plot", metavar="PNG", help="write the chart here (needs matplotlib)")
    p.add_argument("--table", metavar="RESULT", help="print the markdown table of a result")
    return p


# -- the implementations -----------------------------------------------------------------------

def find_peer(venv: str) -> tuple[list[str] | None, str | None]:
    """(oshrun and python of the peer, None) or (None, why it cannot run here)."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        return None, f"no Python at {python}"
    oshrun = (os.path.join(venv, "bin", "oshrun") if os.path.exists(os.path.join(venv, "bin",
                                                                                "oshrun"))
              else shutil.which("oshrun"))
    if oshrun is None:
        return None, "no oshrun (Open MPI's OSHMEM launcher) on PATH"
    probe = subprocess.run([python, "-c", "import shmem4py, numpy"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        return None, f"{python} cannot import shmem4py: {probe.stderr.strip()[-200:]}"
    return [oshrun, python], None


def find_mpirun(given: str | None) -> str:
    candidates = [given, os.environ.get("MPIRUN"),
                  os.path.join(os.path.dirname(sys.executable), "mpirun"), shutil.which("mpirun")]
    for c in candidates:
        if c and (os.path.exists(c) or shutil.which(c)):
            version = subprocess.run([c, "--version"], capture_output=True, text=True,
                                     timeout=60)
            if "Open MPI" in version.stdout + version.stderr and not given:
                continue   # Open MPI's mpirun (e.g. /usr/bin/mpirun beside OSHMEM): not ours
            return c
    raise SystemExit("no mpirun for shmemvm found: pass --mpirun (MPICH's, as mpi4py uses)")


def command(impl: str, n: int, split: bool, prefix: str, args, peer, mpirun) -> tuple[list, dict]:
    ops = ["--impl", impl, "--out", prefix, "--repeat", str(args.repeat),
           "--min-time", str(args.min_time)] + (["--quick"] if args.quick else [])
    env = dict(os.environ)
    if impl == "oshmem":
        oshrun, python = peer
        env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        for key in ("PYTHONPATH", "MPI4PY_LIBMPI"):
            env.pop(key, None)
        tls = "tcp,self" if split else "posix,self"
        cmd = [oshrun, "-n", str(n), "--oversubscribe", "--mca", "memory", "^patcher"]
        if split:
            cmd += ["--mca", "btl", "self,tcp"]
        cmd += ["-x", "UCX_MEM_EVENTS=no", "-x", "UCX_MEM_MALLOC_HOOKS=no", "-x",
                f"UCX_TLS={tls}", python, OPS_SCRIPT] + ops
        return cmd, env
    env["PYTHONPATH"] = schema.ROOT + (os.pathsep + env["PYTHONPATH"]
                                       if env.get("PYTHONPATH") else "")
    if split:
        env.update(SHMEMVM_NODE_SPLIT="1", MPIR_CVAR_NOLOCAL="1")
    else:
        env.pop("SHMEMVM_NODE_SPLIT", None)
    return [mpirun, "-n", str(n), sys.executable, OPS_SCRIPT] + ops, env


def launch(impl, n, split, workdir, round_no, args, peer, mpirun, log) -> dict | str:
    """One launch of the ops script: its PEs' outputs merged, or why it failed."""
    prefix = os.path.join(workdir, f"{impl}-{n}pe{'-split' if split else ''}-r{round_no}")
    cmd, env = command(impl, n, split, prefix, args, peer, mpirun)
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=args.timeout, cwd=workdir)
    except subprocess.TimeoutExpired:
        return f"{impl} at {n} PEs{' (split)' if split else ''}: no result in {args.timeout:g} s"
    outs = []
    for pe in range(n):
        path = f"{prefix}.pe{pe}.json"
        if not os.path.exists(path):
            tail = (done.stdout + done.stderr).strip()[-1500:]
            return f"{impl} at {n} PEs: PE {pe} wrote nothing (exit {done.returncode}): {tail}"
        with open(path) as f:
            outs.append(json.load(f))
    log(f"{impl:8} {n} PEs{' split' if split else ''}, round {round_no}: "
        f"{time.perf_counter() - started:.0f} s, load {outs[0]['load_start'][0]:.1f} -> "
        f"{outs[0]['load_end'][0]:.1f}")
    return merge(outs)


def merge(outs: list[dict]) -> dict:
    """PE 0's samples of one-sided operations; the slowest PE's of each repeat of
    collectives."""
    first = outs[0]
    merged = {"load": [first["load_start"][0], first["load_end"][0]], "module": first["module"],
              "paths": first.get("paths"),
              "versions": first["versions"], "environment": first["environment"],
              "checks": {k: all(o["checks"].get(k) is not False for o in outs)
                         for k in first["checks"]},
              "ops": {}}
    for key, op in first["ops"].items():
        entry = {"kind": op["kind"], "bytes": op["bytes"]}
        for side in ("samples_s", "baseline"):
            if side == "baseline" and op["baseline"] is None:
                entry["baseline"] = None
                continue
            per_pe = [(o["ops"][key][side]["samples_s"] if side == "baseline"
                       else o["ops"][key][side]) for o in outs]
            samples = per_pe[0] if op["kind"] == "one-sided" else \
                [max(values) for values in zip(*per_pe)]
            if side == "baseline":
                entry["baseline"] = {"name": op["baseline"]["name"], "samples_s": samples}
            else:
                entry["samples_s"] = samples
        merged["ops"][key] = entry
    return merged


# -- the result --------------------------------------------------------------------------------

def _unit(op: dict) -> str:
    return "GB/s" if op["bytes"] >= 64 * 1024 and op["kind"] == "one-sided" else "us"


def _figures(op: dict, samples: list[float]) -> list[float]:
    if _unit(op) == "GB/s":
        return [op["bytes"] / s / 1e9 for s in samples]
    return [s * 1e6 for s in samples]


def _label(key: str) -> tuple[str, dict]:
    """A measurement name and its params from the ops script's key."""
    words = key.split()
    if words[0] in ("put", "get"):
        params = {"bytes": int(words[1])}
        return words[0] + (" + quiet" if "quiet" in words else ""), params
    if words[0] == "sum_reduce":
        return "sum_reduce", {"elements": int(words[1]), "dtype": "float64"}
    if words[0] == "malloc+free":
        return "malloc+free", {"bytes": 1024, "cached": True}
    return key, {}


def build(run: schema.Run, launches: dict, rounds: int, peer_why: str | None) -> None:
    """Measurements from every mode's launches: (face vs OSHMEM) and (face vs its own
    same-run baselines)."""
    table = []
    for (n, split), by_impl in launches.items():
        pooled = {}
        for impl, results in by_impl.items():
            good = [r for r in results if isinstance(r, dict)]
            if not good:
                continue
            ops = {}
            for r in good:
                for key, op in r["ops"].items():
                    slot = ops.setdefault(key, {"op": op, "samples": [], "base": [],
                                                "base_name": (op["baseline"] or {}).get("name")})
                    slot["samples"] += op["samples_s"]
                    if op["baseline"]:
                        slot["base"] += op["baseline"]["samples_s"]
            pooled[impl] = {"ops": ops, "loads": [x for r in good for x in r["load"]],
                            "launches": len(good),
                            "checks": {k: all(r["checks"][k] for r in good)
                                       for k in good[0]["checks"]}}
        peer = pooled.get("oshmem")
        for key in (pooled.get("shmemvm") or pooled.get("torch") or {"ops": {}})["ops"]:
            name, extra = _label(key)
            row = {"operation": key, "n_pes": n, "node_split": split}
            if peer and key in peer["ops"]:
                p = peer["ops"][key]
                row["oshmem"] = statistics.median(_figures(p["op"], p["samples"]))
            for impl, face in FACES.items():
                mine = pooled.get(impl)
                if mine is None or key not in mine["ops"]:
                    continue
                slot = mine["ops"][key]
                op, unit = slot["op"], _unit(slot["op"])
                better = "higher" if unit == "GB/s" else "lower"
                params = {"n_pes": n, "node_split": split, "face": face, **extra,
                          "kind": op["kind"], "rounds": mine["launches"],
                          "load_average_1min": [min(mine["loads"]), max(mine["loads"])]}
                if peer and key in peer["ops"]:
                    p = peer["ops"][key]
                    params_peer = {**params, "baseline_load_average_1min":
                                   [min(peer["loads"]), max(peer["loads"])],
                                   "baseline_rounds": peer["launches"]}
                    m = run.add(name, params_peer, unit, _figures(op, slot["samples"]), PEER,
                                _figures(p["op"], p["samples"]), better)
                    row[impl] = m["value"]["median"]
                    row[f"{impl}_ratio"] = m["ratio"]
                if slot["base"]:
                    m = run.add(name, params, unit, _figures(op, slot["samples"]),
                                slot["base_name"], _figures(op, slot["base"]), better)
                    row.setdefault(impl, m["value"]["median"])
                    row[f"{impl}_own"] = [slot["base_name"], m["baseline"]["value"]["median"],
                                          m["ratio"]]
                elif not (peer and key in peer["ops"]):
                    m = run.add(name, params, unit, _figures(op, slot["samples"]),
                                better=better)
                    row.setdefault(impl, m["value"]["median"])
            row["unit"] = _unit(next(iter(pooled.values()))["ops"][key]["op"])
            row["load"] = {impl: [min(v["loads"]), max(v["loads"])] for impl, v in pooled.items()}
            table.append(row)
        run.summary.setdefault("checks", {})[f"{n} PEs{' split' if split else ''}"] = {
            impl: v["checks"] for impl, v in pooled.items()}
    run.summary["table"] = table
    paths = {impl: r["paths"] for by_impl in launches.values() for impl, results in
             by_impl.items() for r in results if isinstance(r, dict) and r.get("paths")}
    run.settings["paths"] = paths
    for impl, ran in paths.items():
        if warning := schema.paths_warning(ran):
            run.notes.append(f"{FACES[impl]}: {warning}")
    if peer_why:
        run.notes.append(f"the peer was not measured: {peer_why}")


def display(key: str) -> str:
    """An operation's key with its byte count in KiB/MiB ("put 65536 B" -> "put 64 KiB")."""
    words = key.split()
    for i, word in enumerate(words[:-1]):
        if word.isdigit() and words[i + 1] == "B":
            n = int(word)
            for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
                if n >= scale and n % scale == 0:
                    words[i:i + 2] = [f"{n // scale} {unit}"]
                    break
            return " ".join(words)
    return key


def _peer_measured(rows: list[dict]) -> bool:
    return any(r.get("oshmem") is not None for r in rows)


def _figure(v, unit: str) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.0f} {unit}" if v >= 1000 else f"{v:.3g} {unit}"


def markdown(doc: dict) -> str:
    """The comparison table of a result, one block per mode: against OSHMEM where
    the peer was measured, else each face against its own same-run baseline."""
    rows = doc["summary"]["table"]
    out = []
    modes = sorted({(r["n_pes"], r["node_split"]) for r in rows})
    for n, split in modes:
        mine = [r for r in rows if (r["n_pes"], r["node_split"]) == (n, split)]
        load = mine[0]["load"]
        loads = ", ".join(f"{impl} {lo:.1f}-{hi:.1f}" for impl, (lo, hi) in load.items())
        where = ", off-node path (SHMEMVM_NODE_SPLIT=1; OSHMEM on TCP)" if split else ""
        head = (f"**{n} PEs{where}**, medians of {doc['settings']['rounds']} alternating "
                f"rounds; load average (1 min) during the launches: {loads}.")
        if not _peer_measured(mine):
            out += [head + " The peer was not measured: each face against its same-run "
                    "baseline (ratio: face ÷ baseline, for bandwidth the share of it).", "",
                    "| operation | shmemvm.shmem | same-run baseline | ratio "
                    "| torch API | same-run baseline | ratio |",
                    "|---|---:|---|---:|---:|---|---:|"]
            for r in mine:
                unit = "GB/s" if r["unit"] == "GB/s" else "µs"
                cells = []
                for impl in FACES:
                    own = r.get(f"{impl}_own")
                    if own is None:
                        cells += [_figure(r.get(impl), unit), "none", "n/a"]
                        continue
                    name, base, ratio = own
                    cells += [_figure(r.get(impl), unit), f"{_figure(base, unit)} ({name})",
                              "n/a" if ratio is None else f"{ratio:.2f}×"]
                out.append(f"| {display(r['operation'])} | " + " | ".join(cells) + " |")
            out.append("")
            continue
        out += [head, "",
                "| operation | OSHMEM | shmemvm.shmem | ratio | torch API | ratio |",
                "|---|---:|---:|---:|---:|---:|"]
        for r in mine:
            unit = "GB/s" if r["unit"] == "GB/s" else "µs"

            def ratio(key):
                v = r.get(f"{key}_ratio")
                if v is None:
                    return "n/a"
                if unit == "GB/s":
                    return f"{v:.2f} of its bandwidth"
                return f"{v:.2g}× slower" if v >= 1 else f"{1 / v:.2g}× faster"
            out.append(f"| {display(r['operation'])} | {_figure(r.get('oshmem'), unit)} | "
                       f"{_figure(r.get('shmemvm'), unit)} | {ratio('shmemvm')} | "
                       f"{_figure(r.get('torch'), unit)} | {ratio('torch')} |")
        out.append("")
    return "\n".join(out)


def chart(doc: dict) -> tuple[str, dict]:
    """What the chart draws: (what a bar is, {(n_pes, node_split): [(operation,
    {face: slowdown})]}), slowdowns against OSHMEM where the peer was measured, else
    against each face's same-run baseline; a slowdown is a time ratio, or the inverse
    of a bandwidth ratio (> 1: slower). Operations without either are left out."""
    rows = doc["summary"]["table"]
    peer = _peer_measured(rows)
    panels: dict = {}
    for r in rows:
        bars = {}
        for impl in FACES:
            if peer:
                v = r.get(f"{impl}_ratio")
            else:
                v = (r.get(f"{impl}_own") or [None, None, None])[2]
            if v:
                bars[impl] = 1 / v if r["unit"] == "GB/s" else v
        if bars:
            panels.setdefault((r["n_pes"], r["node_split"]), []).append(
                (display(r["operation"]), bars))
    what = ("slowdown against OSHMEM (median; >1 slower)" if peer else
            "slowdown against the same-run baseline (median; >1 slower; the peer was not "
            "measured)")
    return what, dict(sorted(panels.items()))


def write_chart(doc: dict, path: str) -> bool:
    """Draw chart(doc) into the PNG `path`, one panel per mode, both faces; False
    (nothing written) where it has no bar."""
    what, panels = chart(doc)
    if not panels:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peer = _peer_measured(doc["summary"]["table"])
    loads = {(r["n_pes"], r["node_split"]): r["load"] for r in doc["summary"]["table"]}
    fig, axes = plt.subplots(1, len(panels), figsize=(max(9, 6.5 * len(panels)), 7),
                             squeeze=False)
    for ax, ((n, split), bars) in zip(axes[0], panels.items()):
        y = range(len(bars))
        for offset, impl, color in ((-0.2, "shmemvm", "tab:blue"), (0.2, "torch", "tab:orange")):
            ax.barh([i + offset for i in y], [b.get(impl, 0) for _, b in bars], 0.4,
                    color=color, label=FACES[impl])
        ax.axvline(1, color="black", lw=1)
        if peer:
            ax.axvline(GOAL, color="red", ls=":", lw=1, label=f"goal: {GOAL}x (latency)")
        ax.set_xscale("log")
        ax.set_yticks(list(y), [label for label, _ in bars], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{n} PEs{' off-node (split)' if split else ''}; load "
                     + ", ".join(f"{k} {lo:.1f}-{hi:.1f}"
                                 for k, (lo, hi) in loads[(n, split)].items()), fontsize=9)
        ax.set_xlabel(what)
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize=8)
    against = "shmem4py on OSHMEM" if peer else "same-run baselines (no peer)"
    fig.suptitle(f"shmemvm vs {against}, one script (benchmarks/shmem4py_ops.py), "
                 f"{doc['date'][:16]} UTC, commit {doc['code']['commit'][:10]}", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True


def _check_measured(run: schema.Run, module: str, args, ap) -> None:
    """The shmemvm the launches imported must be this checkout's (an editable install
    elsewhere would win over PYTHONPATH); else the result is not of this commit."""
    mine = os.path.join(os.path.realpath(schema.ROOT), "shmemvm")
    if os.path.realpath(module) == mine:
        return
    problem = f"the launches imported shmemvm from {module}, not from this checkout"
    if problem not in run.code["changed"]:
        run.code["changed"].append(problem)
        run.code["clean"] = False
        try:
            schema.check_destination(args.json, run.code, args.allow_dirty)
        except schema.DirtyTreeError as exc:
            ap.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.table:
        sys.stdout.write(markdown(schema.load(args.table)))
        return 0
    if args.plot:
        from .plot import matplotlib_missing
        if missing := matplotlib_missing():
            ap.error(missing)

    def log(message):
        print(f"host-vs-oshmem [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr,
              flush=True)

    try:
        run = schema.Run("host-vs-oshmem", schema.command(
            None, "-m benchmarks host-vs-oshmem", list(sys.argv[1:] if argv is None else argv)),
            method="one script (benchmarks/shmem4py_ops.py) against shmem4py's API, launched "
                   "once a round per implementation, implementations alternating; one-sided "
                   "operations on PE 0 towards PE 1 while the other PEs wait in barrier_all, "
                   "collectives on every PE (the slowest PE per repeat); one sample per timed "
                   "loop of at least --min-time s; figures are medians of all rounds' samples, "
                   "ratios shmemvm median / OSHMEM median (or / its own same-run baseline)",
            path=args.json, allow_dirty=args.allow_dirty)
    except schema.DirtyTreeError as exc:
        ap.error(str(exc))
    peer, why = find_peer(args.oshmem_venv)
    if peer is None:
        log(f"the peer (shmem4py on Open MPI's OSHMEM) is not installed here: {why}. Measuring "
            f"shmemvm against its own same-run baselines only; docs/performance.md has the "
            f"recipe to install the peer.")
    mpirun = find_mpirun(args.mpirun)
    impls = (["oshmem"] if peer else []) + ["shmemvm"] + ([] if args.no_torch else ["torch"])
    modes = [(int(n), False) for n in args.pes.split(",") if not args.only_node_split]
    if args.node_split or args.only_node_split:
        modes += [(int(n), True) for n in args.pes.split(",")]
    launches: dict = {}
    errors = []
    with tempfile.TemporaryDirectory(prefix="host-vs-oshmem-") as work:
        for n, split in modes:
            by_impl = launches.setdefault((n, split), {i: [] for i in impls})
            for r in range(args.rounds):
                order = impls if r % 2 == 0 else impls[::-1]   # alternate who goes first
                for impl in order:
                    result = launch(impl, n, split, work, r, args, peer, mpirun, log)
                    if isinstance(result, str):
                        log(f"FAILED: {result}")
                        errors.append(result)
                    by_impl[impl].append(result)
                    if isinstance(result, dict) and impl != "oshmem":
                        _check_measured(run, result["module"], args, ap)
                    if isinstance(result, dict):
                        run.extra_versions.update({
                            f"{impl}:{k}" if impl == "oshmem" and k in ("python", "numpy") else k:
                            v for k, v in result["versions"].items()})
    run.settings = {"pes": [n for n, _ in modes], "modes": [
        {"n_pes": n, "node_split": split} for n, split in modes],
        "rounds": args.rounds, "repeat": args.repeat, "min_time_s": args.min_time,
        "quick": args.quick, "implementations": impls, "peer": PEER if peer else None,
        "peer_missing": why, "oshmem_launch": "oshrun -n N --oversubscribe --mca memory ^patcher "
        "-x UCX_MEM_EVENTS=no -x UCX_MEM_MALLOC_HOOKS=no -x UCX_TLS=posix,self (split: "
        "UCX_TLS=tcp,self, --mca btl self,tcp)", "shmemvm_launch": f"{mpirun} -n N (split: "
        "SHMEMVM_NODE_SPLIT=1 MPIR_CVAR_NOLOCAL=1)", "environment": schema.environment()}
    build(run, launches, args.rounds, why)
    for impl, ran in run.settings["paths"].items():
        if warning := schema.paths_warning(ran):
            log(f"WARNING: {FACES[impl]}: {warning}")
    run.notes += [f"error: {e}" for e in errors]
    run.notes.append("the machine is shared: every figure carries the 1-minute load average "
                     "at the start and end of its launches (params.load_average_1min, "
                     "baseline_load_average_1min)")
    doc = run.document()
    sys.stdout.write(markdown(doc))
    if args.json:
        schema.write(doc, args.json)
        log(f"wrote {args.json}")
    if args.plot:
        if write_chart(doc, args.plot):
            log(f"wrote {args.plot}")
        else:
            log(f"no chart written to {args.plot}: no operation has a ratio to draw")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
