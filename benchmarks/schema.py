"""The one format of every stored benchmark result (benchmarks/results/*.json).

A result is one JSON object, written by every benchmark through this module:

    schema        "shmemvm.results/1"
    benchmark     which benchmark made it ("host-suite", "host-vs-oshmem", "gpu", ...)
    command       the command line that made it
    date          when the run started (ISO 8601, UTC)
    code          {"commit": the full hash of HEAD, "clean": whether the tree was
                  exactly that commit (`git status --porcelain`, untracked files
                  included, benchmarks/results/ left out), "changed": what differed,
                  "allow_dirty": whether --allow-dirty let a dirty tree store here,
                  "shmemvm": the package measured (a checkout's own, or not)}
    machine       {"cpu", "cores", "memory_gib", "kernel", "host", "gpus",
                  "load_average": {"start": [1, 5, 15 min], "end": [...]}}
    versions      {"python", "torch", "numpy", "mpi4py", "mpi", "triton", ...}: None where absent
    settings      what the run was asked: PEs, backend, sizes, environment, ...; and
                  paths: which of shmemvm's paths ran (heap_paths(): backend, the
                  compiled piece, the agreement's transport, the atomics' path)
    method        how the figures were taken (interleaving, repeats, statistic)
    measurements  [{"name", "params", "unit", "better": "higher"|"lower"|None,
                    "value": STATS,
                    "baseline": None or {"name", "value": STATS},
                    "ratio": value median / baseline median (None without a baseline),
                    "ratio_of": "median/median"}]
                  STATS = {"median", "min", "max", "q1", "q3", "n"}: n samples
    notes         [text]: what a reader must know (load, a machine shared with others)
    summary       free-form figures derived from the measurements (targets, tables)
    history       False; True for results kept only to trace old figures (made from a
                  dirty tree, before the anchor, or with an older method), with
                  history_reason saying why; these live in benchmarks/results/history/

A result is stored in benchmarks/results/ only from a clean tree: Run refuses
the destination before anything is measured, unless --allow-dirty is given,
and then the result says so. validate() checks a document against all of this;
tests/unit/benchmarks/test_results.py runs it on every stored result.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys

SCHEMA = "shmemvm.results/1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
HISTORY = os.path.join(RESULTS, "history")
RATIO_OF = "median/median"
STAT_KEYS = ("median", "min", "max", "q1", "q3", "mean", "n")   # mean: history only
TOP_KEYS = {"schema", "benchmark", "command", "date", "code", "machine", "versions", "settings",
            "method", "measurements", "notes", "summary", "history", "history_reason",
            "converted_from"}


class DirtyTreeError(RuntimeError):
    """A result from a tree that differs from its commit would go into benchmarks/results/."""


# -- figures -----------------------------------------------------------------------------

def sig(x, digits: int = 5):
    """x rounded to `digits` significant digits (None, ints and non-finite values as they are)."""
    if x is None or isinstance(x, (bool, int)) or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def stats(samples) -> dict:
    """median, min, max, quartiles and count of `samples` (at least one finite number)."""
    xs = sorted(float(x) for x in samples if x is not None and math.isfinite(x))
    if not xs:
        raise ValueError(f"no finite sample among {list(samples)!r}")
    if len(xs) > 1:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1 = q3 = xs[0]
    return {"median": sig(statistics.median(xs)), "min": sig(xs[0]), "max": sig(xs[-1]),
            "q1": sig(q1), "q3": sig(q3), "n": len(xs)}


def measurement(name: str, params: dict, unit: str, samples, baseline_name: str | None = None,
                baseline_samples=None, better: str | None = None, **extra) -> dict:
    """One figure: the statistics of `samples` (in `unit`), and where given the
    baseline's, measured in the same run, with the ratio of their medians."""
    if better not in (None, "higher", "lower"):
        raise ValueError(f"better must be 'higher', 'lower' or None, got {better!r}")
    value = stats(samples)
    entry = {"name": name, "params": params, "unit": unit, "better": better, "value": value,
             "baseline": None, "ratio": None, "ratio_of": None}
    if baseline_name is not None and baseline_samples:
        base = stats(baseline_samples)
        entry["baseline"] = {"name": baseline_name, "value": base}
        entry["ratio"] = sig(value["median"] / base["median"]) if base["median"] else None
        entry["ratio_of"] = RATIO_OF
    entry.update(extra)
    return entry


def median(m: dict) -> float:
    return m["value"]["median"]


def baseline_median(m: dict) -> float | None:
    return m["baseline"]["value"]["median"] if m.get("baseline") else None


def baseline_name(m: dict) -> str | None:
    return m["baseline"]["name"] if m.get("baseline") else None


# -- where and what ran ------------------------------------------------------------------------

def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def code_state(root: str = ROOT) -> dict:
    """The commit of the checkout at `root`, and whether the tree is exactly it.

    Untracked files count (a stray module would be imported); what is under
    benchmarks/results/ does not (results are outputs, not code). The shmemvm
    package that Python imports here must be the checkout's own."""
    state = {"commit": None, "clean": False, "changed": [], "allow_dirty": False,
             "shmemvm": None}
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        status = subprocess.run(["git", "-C", root, "status", "--porcelain",
                                 "--untracked-files=all"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        state["changed"] = [f"git could not be run: {exc!r}"]
        return state
    commit = head.stdout.strip()
    if head.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", commit):
        state["changed"] = [f"not a git checkout: {head.stderr.strip()[:200]}"]
        return state
    state["commit"] = commit
    changed = [line[3:] for line in status.stdout.splitlines() if line.strip()]
    changed = [path for path in changed if not path.strip('"').startswith("benchmarks/results/")]
    shmemvm = sys.modules.get("shmemvm")
    where = os.path.dirname(os.path.abspath(shmemvm.__file__)) if shmemvm else None
    if where is not None:
        mine = os.path.join(os.path.realpath(root), "shmemvm")
        state["shmemvm"] = where
        if os.path.realpath(where) != mine:
            changed.append(f"shmemvm imported from {where}, not from this checkout")
    state["changed"] = changed
    state["clean"] = not changed
    return state


def heap_paths(heap) -> dict:
    """Which of shmemvm's paths `heap` runs (a result records it in settings.paths):
    backend; compiled_piece, the file of the compiled piece where it could be
    imported (None: the pure Python paths only, e.g. a checkout's unbuilt shmemvm/
    hiding an installed copy); native, whether every PE uses it (SHMEMVM_NATIVE);
    agreement, the collectives' transport ("board" or "mpi"); atomics, their path
    ("cpu", "window" or "kernel"); shmemvm, where the package was imported from;
    mpi, the MPI library (vendor and version, where mpi4py.MPI is imported);
    mpi_window, whether the heap's MPI dynamic window could be made (Open MPI 4.1
    cannot: off-node access and the window's atomics are then unavailable, which
    one node with the CPU's atomics and the board does not need), window_error why
    not."""
    import shmemvm
    from shmemvm import native

    core = getattr(heap, "_core", heap)   # a SymmetricHeap's parts are its core's (private)
    agreement = getattr(core, "agreement", None)
    routes = getattr(core, "routes", None)
    return {"backend": heap.backend.name, "compiled_piece": native.built(),
            "native": bool(getattr(core, "native", False)),
            "agreement": "board" if getattr(agreement, "board", None) is not None else "mpi",
            "atomics": getattr(getattr(routes, "atomics", None), "value", None),
            "shmemvm": os.path.dirname(os.path.abspath(shmemvm.__file__)),
            "mpi": mpi_library(),
            "mpi_window": getattr(core, "window", None) is not None,
            "window_error": getattr(core, "window_error", None)}


def mpi_library() -> str | None:
    """mpi4py's MPI library, vendor and version on one line (MPICH's padding
    squeezed), or None where mpi4py.MPI is not imported."""
    if "mpi4py.MPI" not in sys.modules:
        return None
    text = sys.modules["mpi4py.MPI"].Get_library_version()
    return " ".join(text.strip("\x00 \n").splitlines()[0].split())


def paths_warning(paths: dict) -> str | None:
    """What a reader of figures taken on `paths` (heap_paths) must know, or None."""
    if paths.get("compiled_piece") is None:
        return ("the compiled piece (shmemvm/native) could not be imported: these figures are "
                "of the pure Python paths. From a checkout, install in place (pip install "
                "--no-build-isolation -e .): the checkout's shmemvm/ hides an installed copy")
    if not paths.get("native"):
        return ("the compiled piece is built but not used (SHMEMVM_NATIVE=0, or a PE without "
                "it): these figures are of the pure Python paths")
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            return round(int(meminfo.readline().split()[1]) / (1 << 20), 1)
    except (OSError, ValueError, IndexError):
        return None


def _gpus() -> list[str] | None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no driver: no GPU to name
        pass
    return None


def machine(load_start: list[float] | None) -> dict:
    """Where the figures were taken; the load average at the end is read now."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": _memory_gib(),
            "kernel": platform.release(), "host": platform.node(), "gpus": _gpus(),
            "load_average": {"start": load_start, "end": load_average()}}


def _version(name: str) -> str | None:
    module = sys.modules.get(name)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:  # noqa: BLE001 - not installed
        return None


def versions(**more) -> dict:
    """python, torch, numpy, mpi4py and its MPI library, triton (None where absent).
    The MPI library is named only where mpi4py.MPI is already imported."""
    found = {"python": platform.python_version(), "torch": _version("torch"),
             "numpy": _version("numpy"), "mpi4py": _version("mpi4py"), "mpi": mpi_library(),
             "triton": _version("triton"), "shmemvm": _version_of_shmemvm()}
    found.update(more)
    return found


def _version_of_shmemvm() -> str | None:
    module = sys.modules.get("shmemvm")
    return getattr(module, "__version__", None) if module is not None else None


def command(n_pes: int | None, program: str, argv: list[str]) -> str:
    """The command line of a run: `mpirun -n N python PROGRAM ARGS`."""
    launch = f"mpirun -n {n_pes} " if n_pes else ""
    return f"{launch}python {program} {shlex.join(argv)}".rstrip()


def environment(*names: str) -> dict:
    """The SHMEMVM_* settings of this process, and the other variables named."""
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SHMEMVM_")}
    env.update({k: os.environ.get(k) for k in names})
    return env


# -- storing -----------------------------------------------------------------------------------

def stored(path: str) -> bool:
    """Whether `path` lies in benchmarks/results/ (where only clean results go)."""
    where = os.path.realpath(os.path.abspath(path))
    return where.startswith(os.path.realpath(RESULTS) + os.sep)


def check_destination(path: str | None, code: dict, allow_dirty: bool) -> None:
    """Refuse to store into benchmarks/results/ a result of a tree that is not its
    commit (before anything is measured), unless allow_dirty."""
    if path is None or not stored(path) or code["clean"]:
        return
    if allow_dirty:
        code["allow_dirty"] = True
        return
    changed = ", ".join(code["changed"][:8]) + (" ..." if len(code["changed"]) > 8 else "")
    raise DirtyTreeError(
        f"refusing to store {os.path.relpath(path, ROOT)}: the tree is not commit "
        f"{code['commit'] or '(none)'} ({changed}). Every stored result must be traceable to "
        f"a commit: commit or stash the changes and run again, write elsewhere (--json/--out "
        f"outside benchmarks/results/), or pass --allow-dirty (the result then says so).")


class Run:
    """A result being made: started now, measured into `measurements`, written as
    one document. `path` is checked at once (see check_destination)."""

    def __init__(self, benchmark: str, command: str, settings: dict | None = None,
                 method: str = "", path: str | None = None, allow_dirty: bool = False):
        self.path = path
        self.code = code_state()
        check_destination(path, self.code, allow_dirty)
        self.benchmark, self.command = benchmark, command
        self.settings = dict(settings or {})
        self.method = method
        self.date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.load_start = load_average()
        self.measurements: list[dict] = []
        self.notes: list[str] = []
        self.summary: dict = {}
        self.extra_versions: dict = {}

    def add(self, *args, **kwargs) -> dict:
        """measurement(...) appended to this run."""
        entry = measurement(*args, **kwargs)
        self.measurements.append(entry)
        return entry

    def document(self) -> dict:
        doc = {"schema": SCHEMA, "benchmark": self.benchmark, "command": self.command,
               "date": self.date, "code": self.code, "machine": machine(self.load_start),
               "versions": versions(**self.extra_versions), "settings": self.settings,
               "method": self.method, "measurements": self.measurements,
               "notes": self.notes, "summary": self.summary, "history": False}
        return doc

    def write(self, path: str | None = None) -> dict:
        doc = self.document()
        write(doc, path or self.path)
        return doc


def run_on_pe0(comm, prog: str, *args, **kwargs) -> tuple[Run | None, bool]:
    """A Run(*args, **kwargs) made on PE 0 of `comm`, which checks where the result
    goes before anything is measured, and whether it was refused there
    (DirtyTreeError): every PE learns it, so that all stop alike, and PE 0 prints
    why as "`prog`: why". (The Run on PE 0, None on the others; refused.)"""
    run, refused = None, None
    if comm.Get_rank() == 0:
        try:
            run = Run(*args, **kwargs)
        except DirtyTreeError as exc:
            refused = str(exc)
    refused = comm.bcast(refused, root=0)
    if refused and comm.Get_rank() == 0:
        print(f"{prog}: {refused}", file=sys.stderr)
    return run, bool(refused)


def write(doc: dict, path: str) -> None:
    """`doc` as indented JSON at `path`, replaced whole (a reader never sees half)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as out:
        json.dump(doc, out, indent=1, allow_nan=False)
        out.write("\n")
    os.replace(tmp, path)


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# -- checking ------------------------------------------------------------------------------------

def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_stats(where: str, s, history: bool) -> list[str]:
    if not isinstance(s, dict):
        return [f"{where}: statistics must be an object, got {s!r}"]
    problems = [f"{where}: unknown statistic {k!r}" for k in s if k not in STAT_KEYS]
    n = s.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        problems.append(f"{where}: n (the number of samples) must be an integer >= 1, got {n!r}")
    for k in STAT_KEYS[:-1]:
        if k in s and not _is_number(s[k]):
            problems.append(f"{where}: {k} must be a finite number, got {s[k]!r}")
    if history:
        if not any(k in s for k in STAT_KEYS[:-1]):
            problems.append(f"{where}: no figure (median, min, max, q1, q3 or mean)")
        return problems
    if "mean" in s:
        problems.append(f"{where}: a mean is no figure of a new result (medians only)")
    if "median" not in s:
        problems.append(f"{where}: no median")
    if not ({"min", "max"} <= set(s) or {"q1", "q3"} <= set(s)):
        problems.append(f"{where}: needs min and max, or q1 and q3, beside the median")
    if not problems and "min" in s and "max" in s and not s["min"] <= s["median"] <= s["max"]:
        problems.append(f"{where}: median {s['median']} outside [min {s['min']}, max {s['max']}]")
    return problems


def validate(doc, path: str | None = None, stored: bool = True) -> list[str]:
    """What is wrong with `doc` as a stored result ([] if nothing). With `path`,
    also where it may be stored: history results only in results/history/.
    stored=False checks the format alone (a run from a dirty tree written elsewhere)."""
    if not isinstance(doc, dict):
        return ["a result must be a JSON object"]
    p: list[str] = []
    if doc.get("schema") != SCHEMA:
        return [f"schema must be {SCHEMA!r}, got {doc.get('schema')!r}"]
    p += [f"unknown top-level key {k!r}" for k in doc if k not in TOP_KEYS]
    history = doc.get("history")
    if not isinstance(history, bool):
        p.append(f"history must be true or false, got {history!r}")
    elif history and not (isinstance(doc.get("history_reason"), str) and doc["history_reason"]):
        p.append("a history result must say why in history_reason")
    history = history is True
    for key in ("benchmark", "command", "date"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            p.append(f"{key} must be a non-empty string")
    try:
        datetime.datetime.fromisoformat(str(doc.get("date")))
    except ValueError:
        p.append(f"date is not ISO 8601: {doc.get('date')!r}")
    code = doc.get("code")
    if not isinstance(code, dict):
        p.append("code must be an object")
    else:
        if not isinstance(code.get("commit"), str) or not re.fullmatch(r"[0-9a-f]{40}",
                                                                        code["commit"]):
            p.append(f"code.commit must be a full 40-digit hash, got {code.get('commit')!r}")
        if not isinstance(code.get("clean"), bool):
            p.append("code.clean must be true or false")
        elif stored and not code["clean"] and not history and code.get("allow_dirty") is not True:
            p.append("made from a dirty tree without --allow-dirty (code.allow_dirty)")
        if not isinstance(code.get("changed"), list):
            p.append("code.changed must be a list")
    m = doc.get("machine")
    if not isinstance(m, dict):
        p.append("machine must be an object")
    else:
        cores = m.get("cores")
        if not isinstance(m.get("cpu"), str) or not (
                isinstance(cores, int) or (history and cores is None)):
            p.append("machine needs cpu (text) and cores (an integer)")
        load = m.get("load_average")
        if not isinstance(load, dict) or not {"start", "end"} <= set(load):
            p.append("machine.load_average needs start and end")
        elif not history:
            for when in ("start", "end"):
                v = load[when]
                if not (isinstance(v, list) and len(v) == 3 and all(map(_is_number, v))):
                    p.append(f"machine.load_average.{when} must be the 1, 5, 15 min averages")
    v = doc.get("versions")
    if not isinstance(v, dict) or not isinstance(v.get("python"), str):
        p.append("versions must be an object naming python at least")
    for key in ("settings", "summary"):
        if key in doc and not isinstance(doc[key], dict):
            p.append(f"{key} must be an object")
    if not isinstance(doc.get("method"), str):
        p.append("method must be text")
    if "notes" in doc and not (isinstance(doc["notes"], list)
                               and all(isinstance(x, str) for x in doc["notes"])):
        p.append("notes must be a list of text")
    ms = doc.get("measurements")
    if not isinstance(ms, list) or not ms:
        p.append("measurements must be a non-empty list")
        ms = []
    for i, e in enumerate(ms):
        p += _check_measurement(f"measurements[{i}]", e, history)
    if path is not None:
        in_history = os.path.realpath(os.path.abspath(path)).startswith(
            os.path.realpath(HISTORY) + os.sep)
        if history and not in_history:
            p.append("a history result belongs in benchmarks/results/history/")
        if in_history and not history:
            p.append("a result in benchmarks/results/history/ must be marked history")
    return p


def _check_measurement(where: str, e, history: bool) -> list[str]:
    if not isinstance(e, dict):
        return [f"{where}: a measurement must be an object"]
    name = e.get("name")
    where = f"{where} ({name})"
    p = []
    if not isinstance(name, str) or not name:
        p.append(f"{where}: name must be a non-empty string")
    if not isinstance(e.get("params"), dict):
        p.append(f"{where}: params must be an object")
    if not isinstance(e.get("unit"), str) or not e["unit"]:
        p.append(f"{where}: unit must be a non-empty string")
    if e.get("better") not in (None, "higher", "lower"):
        p.append(f"{where}: better must be 'higher', 'lower' or null")
    p += _check_stats(f"{where} value", e.get("value"), history)
    base, ratio = e.get("baseline"), e.get("ratio")
    if base is None:
        if ratio is not None:
            p.append(f"{where}: a ratio without a baseline")
        return p
    if not isinstance(base, dict) or not isinstance(base.get("name"), str) or not base["name"]:
        return p + [f"{where}: baseline must be an object with a name"]
    p += _check_stats(f"{where} baseline", base.get("value"), history)
    if ratio is None:
        return p
    if not _is_number(ratio):
        return p + [f"{where}: ratio must be a finite number or null"]
    if history:
        if not isinstance(e.get("ratio_of"), str):
            p.append(f"{where}: ratio_of must say what the ratio compares")
        return p
    if e.get("ratio_of") != RATIO_OF:
        p.append(f"{where}: ratio_of must be {RATIO_OF!r} (ratios compare median with median)")
    elif not p:
        expected = e["value"]["median"] / base["value"]["median"]
        if not math.isclose(ratio, expected, rel_tol=1e-3):
            p.append(f"{where}: ratio {ratio} is not median/median = {expected:.5g}")
    return p
