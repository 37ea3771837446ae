"""Issue 24's host comparison: shmemvm against shmem4py on Open MPI's OSHMEM.

    python -m benchmarks host-vs-oshmem [--pes 2,4] [--node-split] [--rounds 3]
        [--json benchmarks/results/host-vs-oshmem-2pe.json] [--plot PNG] [--allow-dirty]
    python -m benchmarks host-vs-oshmem --pes 2,4,8,16 --rows goal --out-dir DIR
        [--deadline 420]      # issue 30: one result and chart per PE count, a scaling chart
    python -m benchmarks host-vs-oshmem --table RESULT.json     # its markdown table
    python -m benchmarks host-vs-oshmem --scaling-table R2.json R4.json ...

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

--out-dir writes one result per PE count (NAME-<N>pe.json, and -split for the
off-node path) with its chart (NAME-<N>pe.png), rewritten after every round, and
over the counts NAME-scaling.png and NAME-scaling.md (benchmarks/oshmem_scaling.py:
issue 30's goal, each row's ratio against it, barrier_all at the largest count
over the smallest). Rounds go over every PE count in turn, so that --deadline
(seconds for the whole run) leaves every count its first rounds; a round that
would not end in time is left out and the result says so. A launch's results
are kept once every PE has written them, also where the launcher then aborts or
hangs at exit (OSHMEM at 4-8 PEs): it is stopped after --exit-grace seconds.

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
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from . import oshmem_scaling, schema

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
    p.add_argument("--rows", choices=("all", "goal"), default="all",
                   help="every operation, or issue 30's rows alone (goal: barrier_all, "
                        "sync_all, broadcast/fcollect/alltoall 8 B, sum_reduce 8 B and "
                        "512 KiB, malloc+free 1 KiB, atomic_fetch_add, put 8 B, put 1 MiB)")
    p.add_argument("--no-torch", action="store_true", help="leave out the torch API")
    p.add_argument("--oshmem-venv", default=os.environ.get("OSHMEM_VENV", "/opt/oshmem-venv"),
                   help="a virtual environment with shmem4py built on Open MPI's OSHMEM, and "
                        "oshrun in its bin/ or on PATH")
    p.add_argument("--oshmem-python", default=None,
                   help="the peer's Python (default: the venv's bin/python)")
    p.add_argument("--oshmem-pythonpath", default=None,
                   help="PYTHONPATH of the peer's Python (e.g. where shmem4py was built with "
                        "--target)")
    p.add_argument("--mpirun", default=None,
                   help="the mpirun command of shmemvm's MPI, options included, e.g. "
                        "'/usr/bin/mpirun --allow-run-as-root --oversubscribe' (default: "
                        "$MPIRUN, else the one beside this Python, else PATH's, not Open MPI's)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    p.add_argument("--exit-grace", type=float, default=20,
                   help="seconds a launcher may take to exit once every PE wrote its results")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds for the whole run: no round is started that would not end "
                        "in time (each count keeps the rounds it finished)")
    p.add_argument("--json", metavar="PATH", help="write the result here (benchmarks/schema.py)")
    p.add_argument("--out-dir", metavar="DIR",
                   help="write one result and chart per PE count here, and the scaling "
                        "chart and table (see above)")
    p.add_argument("--redraw", action="store_true",
                   help="draw --out-dir's charts and scaling table again from its results")
    p.add_argument("--name", default="host-vs-oshmem",
                   help="file names' stem under --out-dir (default host-vs-oshmem)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="store into benchmarks/results/ from a tree that differs from its "
                        "commit (recorded in the result)")
    p.add_argument("--plot", metavar="PNG", help="write the chart here (needs matplotlib)")
    p.add_argument("--table", metavar="RESULT", help="print the markdown table of a result")
    p.add_argument("--scaling-table", metavar="RESULT", nargs="+",
                   help="print issue 30's table over results of several PE counts")
    return p


# -- the implementations -----------------------------------------------------------------------

def peer_env(python: str, pythonpath: str | None) -> dict:
    """The environment of the peer's launches: its Python's folder first on PATH,
    nothing of shmemvm's MPICH (PYTHONPATH only where given), run as root allowed."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for key in ("PYTHONPATH", "MPI4PY_LIBMPI"):
        env.pop(key, None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def find_peer(venv: str, python: str | None = None,
              pythonpath: str | None = None) -> tuple[list[str] | None, str | None]:
    """(oshrun and python of the peer, None) or (None, why it cannot run here)."""
    python = python or os.path.join(venv, "bin", "python")
    if not os.path.exists(python) and shutil.which(python) is None:
        return None, f"no Python at {python}"
    python = python if os.path.exists(python) else shutil.which(python)
    oshrun = (os.path.join(venv, "bin", "oshrun") if os.path.exists(os.path.join(venv, "bin",
                                                                                "oshrun"))
              else shutil.which("oshrun"))
    if oshrun is None:
        return None, "no oshrun (Open MPI's OSHMEM launcher) on PATH"
    probe = subprocess.run([python, "-c", "import shmem4py, numpy"], capture_output=True,
                           text=True, timeout=60, env=peer_env(python, pythonpath))
    if probe.returncode != 0:
        return None, f"{python} cannot import shmem4py: {probe.stderr.strip()[-200:]}"
    return [oshrun, python], None


def find_mpirun(given: str | None) -> list[str]:
    """shmemvm's mpirun command, options included (--mpirun is taken as given)."""
    if given:
        return shlex.split(given)
    candidates = [os.environ.get("MPIRUN"),
                  os.path.join(os.path.dirname(sys.executable), "mpirun"), shutil.which("mpirun")]
    for c in candidates:
        if c and (os.path.exists(c) or shutil.which(c)):
            version = subprocess.run([c, "--version"], capture_output=True, text=True,
                                     timeout=60)
            if "Open MPI" in version.stdout + version.stderr:
                continue   # Open MPI's mpirun (e.g. /usr/bin/mpirun beside OSHMEM): not ours
            return [c]
    raise SystemExit("no mpirun for shmemvm found: pass --mpirun (the mpirun of the MPI "
                     "mpi4py was built with, e.g. MPICH's; Open MPI's is taken only when given)")


def command(impl: str, n: int, split: bool, prefix: str, args, peer, mpirun) -> tuple[list, dict]:
    ops = ["--impl", impl, "--out", prefix, "--repeat", str(args.repeat),
           "--min-time", str(args.min_time), "--rows", args.rows] + \
        (["--quick"] if args.quick else [])
    env = dict(os.environ)
    if impl == "oshmem":
        oshrun, python = peer
        env = peer_env(python, args.oshmem_pythonpath)
        tls = "tcp,self" if split else "posix,self"
        root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        cmd = [oshrun, *root, "-n", str(n), "--oversubscribe", "--mca", "memory", "^patcher"]
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
    return [*mpirun, "-n", str(n), sys.executable, OPS_SCRIPT] + ops, env


def _wait(cmd, env, workdir, files, timeout, grace) -> tuple[int | None, str, str]:
    """Run `cmd` in a process group of its own until it exits, or until every file
    of `files` exists and `grace` more seconds passed, or `timeout`; then stop the
    group. (exit status or None, how it ended, its output's tail)."""
    log_path = os.path.join(workdir, f"{os.path.basename(files[0])}.log")
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started, written = time.monotonic(), None
        how = "exited"
        while proc.poll() is None:
            now = time.monotonic()
            if written is None and all(os.path.exists(f) for f in files):
                written = now
            if written is not None and now - written > grace:
                how = f"stopped {grace:g} s after every PE wrote its results"
                break
            if now - started > timeout:
                how = f"stopped after {timeout:g} s"
                break
            time.sleep(0.1)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # the group this launch started
            except ProcessLookupError:
                pass
            proc.wait()
            rc = None
        else:
            rc = proc.returncode
    with open(log_path, errors="replace") as f:
        tail = f.read()[-1500:].strip()
    return rc, how, tail


def launch(impl, n, split, workdir, round_no, args, peer, mpirun, log,
           timeout: float | None = None) -> dict | str:
    """One launch of the ops script: its PEs' outputs merged (with "exit": how the
    launcher ended, where not cleanly), or why it failed."""
    prefix = os.path.join(workdir, f"{impl}-{n}pe{'-split' if split else ''}-r{round_no}")
    cmd, env = command(impl, n, split, prefix, args, peer, mpirun)
    files = [f"{prefix}.pe{pe}.json" for pe in range(n)]
    started = time.perf_counter()
    where = f"{impl} at {n} PEs{' (split)' if split else ''}, round {round_no}"
    rc, how, tail = _wait(cmd, env, workdir, files, timeout or args.timeout, args.exit_grace)
    missing = [pe for pe, path in enumerate(files) if not os.path.exists(path)]
    if missing:
        return (f"{where}: PE {missing[0]} wrote nothing ({how}, exit {rc}): {tail}")
    outs = []
    for path in files:
        with open(path) as f:
            outs.append(json.load(f))
    log(f"{impl:8} {n} PEs{' split' if split else ''}, round {round_no}: "
        f"{time.perf_counter() - started:.0f} s, load {outs[0]['load_start'][0]:.1f} -> "
        f"{outs[0]['load_end'][0]:.1f}" + ("" if rc == 0 else f"; launcher {how}, exit {rc}"))
    merged = merge(outs)
    if rc != 0:
        merged["exit"] = (f"{where}: the launcher {how} (exit {rc}) after every PE had "
                          f"written its results: kept. Its output's end: {tail[-300:]}")
    return merged


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
    if words[0] in ("broadcast", "fcollect", "alltoall", "collect"):
        return words[0], {"bytes": int(words[1])}
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
            row["rounds"] = {impl: v["launches"] for impl, v in pooled.items()}
            if peer:
                oshmem_scaling.mark_goal(row, FACES)
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
        if ran.get("mpi_window") is False:
            run.notes.append(
                f"{FACES[impl]}: no MPI dynamic window on {ran.get('mpi') or 'this MPI'} "
                f"({ran.get('window_error')}); on one node with the compiled piece the atomics "
                f"are the CPU's and the agreement the board, which need no window (atomics: "
                f"{ran.get('atomics')}, agreement: {ran.get('agreement')}); off-node access "
                f"would")
    run.notes += [r["exit"] for by_impl in launches.values() for results in by_impl.values()
                  for r in results if isinstance(r, dict) and r.get("exit")]
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
        done = mine[0].get("rounds") or {"all": doc["settings"]["rounds"]}   # older results
        rounds = (str(min(done.values())) if len(set(done.values())) == 1 else
                  ", ".join(f"{impl} {k}" for impl, k in done.items()))
        head = (f"**{n} PEs{where}**, medians of {rounds} alternating "
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
        faces = [impl for impl in FACES if any(impl in r for r in mine)]
        goal = any("goal" in r for r in mine)
        out += [head + (f" Goal (issue 30): times at most {oshmem_scaling.GOAL_TIME:g}× "
                        f"OSHMEM's, bandwidths at least {oshmem_scaling.GOAL_BANDWIDTH:g}×; "
                        f"✓ met, ✗ not." if goal else ""), "",
                "| operation | OSHMEM | " + " | ".join(f"{FACES[impl]} | ratio"
                                                     for impl in faces) + " |",
                "|---|---:|" + "---:|---:|" * len(faces)]
        for r in mine:
            unit = "GB/s" if r["unit"] == "GB/s" else "µs"

            def ratio(key):
                v = r.get(f"{key}_ratio")
                if v is None:
                    return "n/a"
                met = {True: " ✓", False: " ✗"}.get(r.get(f"{key}_meets_goal"), "")
                if unit == "GB/s":
                    return f"{v:.2f} of its bandwidth{met}"
                return (f"{v:.2g}× slower" if v >= 1 else f"{1 / v:.2g}× faster") + met
            out.append(f"| {display(r['operation'])} | {_figure(r.get('oshmem'), unit)} | "
                       + " | ".join(f"{_figure(r.get(impl), unit)} | {ratio(impl)}"
                                    for impl in faces) + " |")
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
            schema.check_destination(run.path, run.code, args.allow_dirty)
        except schema.DirtyTreeError as exc:
            ap.error(str(exc))


METHOD = ("one script (benchmarks/shmem4py_ops.py) against shmem4py's API, launched once a "
          "round per implementation, implementations alternating; one-sided operations on PE 0 "
          "towards PE 1 while the other PEs wait in barrier_all, collectives on every PE (the "
          "slowest PE per repeat); one sample per timed loop of at least --min-time s; figures "
          "are medians of all rounds' samples, ratios shmemvm median / OSHMEM median (or / its "
          "own same-run baseline)")


def mode_path(args, mode: tuple[int, bool]) -> str:
    """Where --out-dir puts the result of one mode (PE count, off-node or not)."""
    n, split = mode
    return os.path.join(args.out_dir, f"{args.name}-{n}pe{'-split' if split else ''}.json")


def barrier_samples(launches: dict) -> dict:
    """{impl: {n_pes: barrier_all's samples in µs}} over every launch on the node."""
    out: dict = {}
    for (n, split), by_impl in launches.items():
        for impl, results in by_impl.items():
            xs = [x * 1e6 for r in results if isinstance(r, dict) and not split
                  and "barrier_all" in r["ops"] for x in r["ops"]["barrier_all"]["samples_s"]]
            if xs:
                out.setdefault(impl, {})[n] = xs
    return out


def result(run: schema.Run, launches: dict, settings: dict, why, errors, skipped,
           scaling_over: dict | None = None) -> dict | None:
    """The document of `run` over `launches` (made anew: a partial result is rewritten
    after every round), or None where nothing was measured. With `scaling_over`
    (every mode's launches), barrier_all at the largest PE count measured over the
    smallest, where `launches` holds that largest count."""
    run.measurements, run.notes, run.summary = [], [], {}
    run.settings = dict(settings, pes=sorted({n for n, _ in launches}),
                        modes=[{"n_pes": n, "node_split": split} for n, split in launches])
    build(run, launches, settings["rounds"], why)
    samples = barrier_samples(scaling_over or {})
    counts = sorted({n for by_n in samples.values() for n in by_n})
    if len(counts) > 1 and (counts[-1], False) in launches:
        run.summary["barrier_scaling"] = oshmem_scaling.barrier_scaling(
            run, samples, counts[0], counts[-1])
    if not run.measurements:
        return None
    run.notes += [f"error: {e}" for e in errors] + [f"left out: {s}" for s in skipped]
    run.notes.append("the machine is shared: every figure carries the 1-minute load average "
                     "at the start and end of its launches (params.load_average_1min, "
                     "baseline_load_average_1min)")
    return run.document()


def write_outputs(args, docs: dict, log, final: bool) -> None:
    """--out-dir: each mode's result; when `final`, the scaling table, and each
    mode's chart and the scaling chart where matplotlib is there (the results are
    what counts: --redraw draws the charts from them later)."""
    for mode, doc in docs.items():
        schema.write(doc, mode_path(args, mode))
    on_node = [doc for (n, split), doc in sorted(docs.items()) if not split]
    if not final or not on_node:
        return
    stem = os.path.join(args.out_dir, f"{args.name}-scaling")
    with open(stem + ".md", "w") as f:
        f.write(oshmem_scaling.scaling_markdown(on_node, label=display))
        if not args.no_torch:
            f.write("\n" + oshmem_scaling.scaling_markdown(on_node, "torch", label=display))
    log(f"wrote {stem}.md")
    from .plot import matplotlib_missing
    if missing := matplotlib_missing():
        log(f"no charts: {missing}")
        return
    for mode, doc in docs.items():
        if write_chart(doc, mode_path(args, mode)[:-5] + ".png"):
            log(f"wrote {mode_path(args, mode)[:-5]}.png")
    if oshmem_scaling.write_scaling_chart(on_node, stem + ".png", label=display):
        log(f"wrote {stem}.png")


def redraw(args, log) -> int:
    """--redraw: the charts and the scaling table again from --out-dir's results."""
    docs = {}
    for mode in [(n, split) for split in (False, True) for n in range(1, 1025)]:
        if os.path.exists(mode_path(args, mode)):
            docs[mode] = schema.load(mode_path(args, mode))
    if not docs:
        log(f"no result {args.name}-<N>pe.json under {args.out_dir}")
        return 1
    write_outputs(args, docs, log, final=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.table:
        sys.stdout.write(markdown(schema.load(args.table)))
        return 0
    if args.scaling_table:
        docs = sorted((schema.load(p) for p in args.scaling_table),
                      key=lambda d: min(d["settings"]["pes"]))
        sys.stdout.write(oshmem_scaling.scaling_markdown(docs, label=display))
        return 0
    from .plot import matplotlib_missing
    if args.plot and (missing := matplotlib_missing()):
        ap.error(missing)

    def log(message):
        print(f"host-vs-oshmem [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr,
              flush=True)

    if args.redraw:
        if not args.out_dir:
            ap.error("--redraw needs --out-dir (where the results are)")
        return redraw(args, log)
    began = time.monotonic()
    modes = [(int(n), False) for n in args.pes.split(",") if not args.only_node_split]
    if args.node_split or args.only_node_split:
        modes += [(int(n), True) for n in args.pes.split(",")]
    line = schema.command(None, "-m benchmarks host-vs-oshmem",
                          list(sys.argv[1:] if argv is None else argv))
    try:   # every destination is checked before anything is measured
        run = schema.Run("host-vs-oshmem", line, method=METHOD, path=args.json,
                         allow_dirty=args.allow_dirty)
        per_mode = {mode: schema.Run("host-vs-oshmem", line, method=METHOD,
                                     path=mode_path(args, mode), allow_dirty=args.allow_dirty)
                    for mode in modes} if args.out_dir else {}
    except schema.DirtyTreeError as exc:
        ap.error(str(exc))
    peer, why = find_peer(args.oshmem_venv, args.oshmem_python, args.oshmem_pythonpath)
    if peer is None:
        log(f"the peer (shmem4py on Open MPI's OSHMEM) is not installed here: {why}. Measuring "
            f"shmemvm against its own same-run baselines only; docs/performance.md has the "
            f"recipe to install the peer.")
    mpirun = find_mpirun(args.mpirun)
    impls = (["oshmem"] if peer else []) + ["shmemvm"] + ([] if args.no_torch else ["torch"])
    launches: dict = {mode: {i: [] for i in impls} for mode in modes}
    errors: list[str] = []
    skipped: list[str] = []
    took: dict = {}   # seconds the last round of each mode took
    settings = {
        "rounds": args.rounds, "repeat": args.repeat, "min_time_s": args.min_time,
        "quick": args.quick, "rows": args.rows, "deadline_s": args.deadline,
        "implementations": impls, "peer": PEER if peer else None, "peer_missing": why,
        "oshmem_launch": "oshrun -n N --oversubscribe --mca memory ^patcher -x "
        "UCX_MEM_EVENTS=no -x UCX_MEM_MALLOC_HOOKS=no -x UCX_TLS=posix,self (split: "
        "UCX_TLS=tcp,self, --mca btl self,tcp); --allow-run-as-root as root",
        "shmemvm_launch": f"{shlex.join(mpirun)} -n N (split: SHMEMVM_NODE_SPLIT=1 "
        "MPIR_CVAR_NOLOCAL=1)", "environment": schema.environment()}

    def results_of(mode_launches: dict, into: schema.Run) -> dict | None:
        return result(into, mode_launches, settings, why, errors, skipped, launches)

    def mode_docs() -> dict:
        return {m: d for m in modes if (d := results_of({m: launches[m]}, per_mode[m]))}

    with tempfile.TemporaryDirectory(prefix="host-vs-oshmem-") as work:
        for r in range(args.rounds):   # every PE count in turn, round by round
            for mode in modes:
                n, split = mode
                left = None if args.deadline is None else \
                    args.deadline - (time.monotonic() - began)
                # a count's first round runs while time is left; a later one where the
                # last one's time (and a margin) is
                if left is not None and (left <= 0 or mode in took
                                         and left < took[mode] * 1.2 + 5):
                    skipped.append(f"round {r} at {n} PEs{' (split)' if split else ''}: "
                                   f"{max(left, 0):.0f} s left of --deadline {args.deadline:g}, "
                                   f"the last round took {took.get(mode, 0):.0f} s")
                    log(f"left out: {skipped[-1]}")
                    continue
                started = time.monotonic()
                order = impls if r % 2 == 0 else impls[::-1]   # alternate who goes first
                for impl in order:
                    limit = args.timeout if left is None else \
                        max(10.0, min(args.timeout, args.deadline - (time.monotonic() - began)))
                    found = launch(impl, n, split, work, r, args, peer, mpirun, log, limit)
                    if isinstance(found, str):
                        log(f"FAILED: {found}")
                        errors.append(found)
                    launches[mode][impl].append(found)
                    if isinstance(found, dict):
                        for into in [run, per_mode.get(mode)]:
                            if into is None:
                                continue
                            if impl != "oshmem":
                                _check_measured(into, found["module"], args, ap)
                            into.extra_versions.update({
                                f"{impl}:{k}" if impl == "oshmem" and k in ("python", "numpy")
                                else k: v for k, v in found["versions"].items()})
                took[mode] = time.monotonic() - started
            if per_mode:   # what is measured so far survives a run cut short
                write_outputs(args, mode_docs(), log, final=False)
    doc = results_of(launches, run)
    if doc is None:
        log("nothing was measured: " + "; ".join(errors))
        return 1
    for impl, ran in doc["settings"]["paths"].items():
        if warning := schema.paths_warning(ran):
            log(f"WARNING: {FACES[impl]}: {warning}")
    sys.stdout.write(markdown(doc))
    if args.json:
        schema.write(doc, args.json)
        log(f"wrote {args.json}")
    if per_mode:   # the barrier's scaling goes into the largest PE count's result
        docs = mode_docs()
        write_outputs(args, docs, log, final=True)
        log(f"wrote {len(docs)} results under {args.out_dir}")
    if args.plot:
        if write_chart(doc, args.plot):
            log(f"wrote {args.plot}")
        else:
            log(f"no chart written to {args.plot}: no operation has a ratio to draw")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
