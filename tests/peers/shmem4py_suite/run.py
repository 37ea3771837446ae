#!/usr/bin/env python3
"""Run shmem4py 1.0.0's own test suite, unchanged, against shmemvm.shmem (or the
real shmem4py, for comparison) under mpirun, one test module per launch.

    python tests/peers/shmem4py_suite/run.py --np 2 [--mpirun CMD] [--json OUT] [test names...]

The suite is not part of this repository: the sdist is fetched at run time with
`pip download` into $SHMEM4PY_SUITE_CACHE (default: <tmpdir>/shmem4py-suite-cache)
and reused from there; --suite DIR uses an unpacked tree instead. Against
shmemvm (the default target) the directory alias/ goes first on PYTHONPATH: its
package `shmem4py` makes `shmem4py.rc` shmemvm.rc and `shmem4py.shmem`
shmemvm.shmem. See README.md beside this file.

Test names: a module (`test_amo` or `amo`), or a test inside one
(`test_amo.TestAMO.testFetchBitwise`). Every PE writes unittest's verbose output
to a file of its own (no interleaving); the runner parses those files and merges
the PEs: a test passes when it passed on every PE.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
ALIAS = HERE / "alias"
SHMEM4PY_VERSION = "1.0.0"

# Tests that reach into shmem4py's C layer (cffi's `ffi`, `lib`, `_getbuffer`),
# which shmemvm does not have. Such a test counts as "C-layer, not applicable"
# only when it is listed here AND its error is an AttributeError/ImportError on
# one of those names; failing on anything else first, it counts as a failure.
# A module id (no class) stands for every test of a module that cannot be
# imported for that reason. Reasons: README.md.
C_LAYER = {
    "test_alloc.TestAlloc.testAlloc": "checks alignment through shmem.ffi.from_buffer / ffi.cast('uintptr_t')",
    "test_buf.TestBuf.testGetBuffer": "shmem._getbuffer and shmem.ffi.CData",
    "test_buf.TestBuf.testReadOnly": "shmem._getbuffer",
    "test_buf.TestBuf.testContiguous": "shmem._getbuffer",
    "test_buf.TestBuf.testBadType": "shmem._getbuffer",
    "test_ctx.TestCtx.testNew": "shmem.Ctx(shmem.ffi.cast('int', 0)) must raise TypeError",
    "test_team.TestTeam.testNew": "shmem.Team(shmem.ffi.cast('int', 0)) must raise TypeError",
    "test_team.TestTeam.testSplit": "reads shmem.lib.SHMEM_TEAM_NUM_CONTEXTS when the split team is a new team",
    "test_ptr": "the module does `from shmem4py.shmem import ffi` at import (its two tests do not use it)",
}
C_LAYER_ERROR = re.compile(
    r"(AttributeError: .*has no attribute '(ffi|lib|_getbuffer)'"
    r"|ImportError: cannot import name '(ffi|lib|_getbuffer)')")

# Tests whose own code needs NumPy 1: under NumPy 2, `np.full(n, -1, dtype=t)` in the
# test itself raises OverflowError for an unsigned t before any shmem call on it
# (NumPy 1 wrapped -1; shmem4py 1.0 itself needs NumPy < 2, its np.array(...,
# copy=False) fails under 2). Counted apart ("NumPy-1", not a failure) only when
# the PEs run NumPy 2, the error is that OverflowError, and no frame of it is
# shmemvm's; under --numpy1 they must pass like any other test. Reasons: README.md.
NUMPY1_ONLY = {
    "test_rma.TestRMA.testGet": "dst = np.full(1, -1, dtype=t) in the test, t unsigned",
    "test_rma.TestRMA.testGetNBI": "dst = np.full(1, -1, dtype=t) in the test, t unsigned",
}
NUMPY1_ONLY_ERROR = re.compile(r"OverflowError: Python integer -1 out of bounds for uint")

#: the outcomes that do not fail a run
ACCEPTED = ("passed", "skipped", "c_layer", "numpy1")
OUTCOMES = ("passed", "failed", "error", "skipped", "c_layer", "numpy1", "timeout", "crashed",
            "not run")

STATUS_WORDS = ("ok", "FAIL", "ERROR", "expected failure", "unexpected success")
SEP1 = "=" * 70
SEP2 = "-" * 70


# ---------------------------------------------------------------- on each PE

def pe_main(logdir: str, testdir: str, names: list) -> None:
    """Run the named tests with unittest, verbose output to <logdir>/pe<rank>.log."""
    rank = (os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
            or os.environ.get("PMIX_RANK") or f"pid{os.getpid()}")
    if sys.path and Path(sys.path[0]).resolve() == HERE:
        del sys.path[0]
    os.chdir(testdir)
    sys.path.insert(0, testdir)
    with open(os.path.join(logdir, f"pe{rank}.log"), "w", buffering=1) as stream:
        runner = unittest.TextTestRunner(stream=stream, verbosity=2, descriptions=False)
        unittest.main(module=None, argv=["shmem4py-suite"] + names, testRunner=runner, exit=False)
    # Where this PE's shmemvm package lies: a traceback's frame is shmemvm's when its
    # file is in there (a folder named shmemvm in the path says nothing: a checkout
    # named shmemvm holds .venv/ with NumPy in it).
    package = sys.modules.get("shmemvm")
    if package is not None and getattr(package, "__file__", None):
        Path(logdir, f"pe{rank}.package").write_text(
            os.path.dirname(os.path.realpath(package.__file__)))
    # Exit 0 whatever the tests said: a non-zero exit makes mpirun/oshrun abort
    # the other PEs, possibly before they have written their results. The
    # runner reads the results from the logs; a non-zero mpirun status then
    # means a crash.


# ---------------------------------------------------------------- the suite

def fetch_suite(cache: Path, python: str) -> Path:
    """The unpacked shmem4py-1.0.0 tree in `cache`, downloaded by pip if missing."""
    tree = cache / f"shmem4py-{SHMEM4PY_VERSION}"
    if (tree / "test").is_dir():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / f"shmem4py-{SHMEM4PY_VERSION}.tar.gz"
    if not sdist.exists():
        print(f"fetching shmem4py=={SHMEM4PY_VERSION} sdist into {cache}", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"shmem4py=={SHMEM4PY_VERSION}", "-d", str(cache)],
                       check=True, stdout=subprocess.DEVNULL)
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(cache, filter="data")
        else:
            tar.extractall(cache)
    if not (tree / "test").is_dir():
        raise SystemExit(f"{sdist} has no {tree.name}/test")
    return tree


def static_tests(testdir: Path) -> dict:
    """{module: [Class.method, ...]} read from the test files (without importing them)."""
    out = {}
    for path in sorted(testdir.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        tests = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                    (isinstance(b, ast.Attribute) and b.attr == "TestCase")
                    or (isinstance(b, ast.Name) and b.id == "TestCase") for b in node.bases):
                tests += [f"{node.name}.{f.name}" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name.startswith("test")]
        out[path.stem] = tests
    return out


def select(all_tests: dict, names: list) -> dict:
    """{module: [unittest names to pass]} ([] = the whole module)."""
    if not names:
        return {m: [] for m in all_tests}
    chosen: dict = {}
    for name in names:
        name = name.removesuffix(".py")
        mod, _, rest = name.partition(".")
        if mod not in all_tests and f"test_{mod}" in all_tests:
            mod = f"test_{mod}"
        if mod not in all_tests:
            raise SystemExit(f"no test module {mod!r}; the modules are {', '.join(all_tests)}")
        if rest:
            if chosen.get(mod) != []:
                chosen.setdefault(mod, []).append(f"{mod}.{rest}")
        else:
            chosen[mod] = []
    return chosen


# ---------------------------------------------------------------- parsing

LINE = re.compile(r"^(?P<indent>\s*)(?P<name>\S+) \((?P<id>[\w.]+)\)(?P<params> .*?)? \.\.\. ?(?P<status>.*)$")


def parse_log(text: str) -> dict:
    """One PE's verbose unittest output -> {test id: record}."""
    tests: dict = {}
    body, _, _ = text.partition("\n" + SEP2 + "\nRan ")
    for line in body.split("\n"):
        if line == SEP1:
            break
        m = LINE.match(line)
        if not m:
            continue
        tid = m.group("id")
        status = m.group("status").strip()
        rec = tests.setdefault(tid, {"status": None, "subtests": []})
        if m.group("indent"):                                  # a failed subtest
            rec["subtests"].append({"params": (m.group("params") or "").strip(), "status": status,
                                    "message": None, "traceback": None})
        elif status:
            rec["status"] = "skipped" if status.startswith("skipped") else status
            if status.startswith("skipped"):
                rec["reason"] = status[len("skipped "):].strip("'\"")
    # The error and failure reports.
    blocks = text.split("\n" + SEP1 + "\n")[1:]
    for block in blocks:
        block = block.split("\n" + SEP2 + "\nRan ")[0]
        head, _, tb = block.partition("\n" + SEP2 + "\n")
        hm = re.match(r"^(ERROR|FAIL): (\S+) \(([\w.]+)\)(.*)$", head.strip())
        if not hm:
            continue
        tid, params = hm.group(3), hm.group(4).strip()
        rec = tests.setdefault(tid, {"status": hm.group(1), "subtests": []})
        info = {"message": exception_text(tb), "traceback": tb.strip(), "frames": frames(tb)}
        target = rec
        if params:
            for st in rec["subtests"]:
                if st["params"] == params and st["message"] is None:
                    target = st
                    break
            else:
                st = {"params": params, "status": hm.group(1), "message": None, "traceback": None}
                rec["subtests"].append(st)
                target = st
        target.update(info)
    for tid, rec in tests.items():
        if rec["status"] is None:
            if rec["subtests"]:
                rec["status"] = "ERROR" if any(s["status"] == "ERROR" for s in rec["subtests"]) else "FAIL"
            else:
                rec["status"] = "hung"           # started, never finished
        if rec["status"] in ("ERROR", "FAIL") and not rec.get("message") and rec["subtests"]:
            first = next((s for s in rec["subtests"] if s.get("message")), None)
            if first:
                rec["message"], rec["traceback"], rec["frames"] = first["message"], first["traceback"], first.get("frames")
    return tests


def exception_text(tb: str) -> str:
    """The exception lines at the end of a traceback (the final one of a chain)."""
    lines = tb.rstrip().split("\n")
    last = max((i for i, l in enumerate(lines) if l.startswith("  File ")), default=-1)
    i = last + 1
    while last >= 0 and i < len(lines) and lines[i].startswith("    "):
        i += 1
    text = "\n".join(lines[i:]).strip() or (lines[-1] if lines else "")
    return text[:2000]


def frames(tb: str) -> list:
    return re.findall(r'^  File "([^"]+)", line (\d+), in (\S+)', tb, re.MULTILINE)


SEVERITY = {"ok": 0, "skipped": 0, "expected failure": 0, "unexpected success": 2,
            "FAIL": 2, "ERROR": 3, "hung": 4, "missing": 4}


def in_package(path: str, packages) -> bool:
    """Whether the file `path` lies in one of the directories `packages`."""
    where = os.path.realpath(path)
    return any(where.startswith(os.path.realpath(p) + os.sep) for p in packages)


def merge(mod: str, expected: list, per_pe: dict, timed_out: bool, numpy1: bool = False,
          packages=()) -> dict:
    """Merge the PEs' records of one module into one outcome per test (`per_pe`
    may hold other modules' too: one launch for several). `numpy1`: the PEs run
    NumPy 1, so NUMPY1_ONLY tests are not counted apart. `packages`: the
    directories of the shmemvm package the PEs imported (a frame in one of them
    is shmemvm's)."""
    results = {}
    failed_import = None
    for tests in per_pe.values():
        for tid, rec in tests.items():
            if tid == f"unittest.loader._FailedTest.{mod}":
                failed_import = rec
    ids = [f"{mod}.{t}" for t in expected]
    for pe_tests in per_pe.values():
        ids += [t for t in pe_tests if t not in ids and t.startswith(mod + ".")
                and t.count(".") >= 2]
    for tid in ids:
        # A test without a line of its own takes its class's or module's
        # (setUpClass/setUpModule skipped or failed: "setUpClass (mod.Class) ... skipped 'x'").
        cls = tid.rsplit(".", 1)[0]
        recs = {pe: tests.get(tid) or tests.get(cls) or tests.get(mod) for pe, tests in per_pe.items()}
        if failed_import is not None:
            recs = {pe: failed_import for pe in per_pe}
        statuses = {pe: (r["status"] if r else "missing") for pe, r in recs.items()}
        if not statuses:
            statuses = {"-": "missing"}
        worst = max(statuses.values(), key=lambda s: SEVERITY.get(s, 3))
        if all(s == "skipped" for s in statuses.values()):
            outcome = "skipped"
        elif worst in ("ok", "expected failure"):
            outcome = "passed"
        elif worst in ("FAIL", "unexpected success"):
            outcome = "failed"
        elif worst == "ERROR":
            outcome = "error"
        elif worst == "hung":
            outcome = "timeout" if timed_out else "crashed"
        else:  # missing on some PE
            started = any(s != "missing" for s in statuses.values())
            outcome = ("timeout" if timed_out else "crashed") if started or timed_out else "not run"
        entry = {"outcome": outcome, "per_pe": statuses}
        bad = [r for r in recs.values() if r and r.get("message")]
        if bad:
            entry["message"] = bad[0]["message"]
            entry["frames"] = bad[0].get("frames", [])
            entry["traceback"] = bad[0].get("traceback")
            subs = bad[0].get("subtests") or []
            if subs:
                entry["subtests"] = [{k: s.get(k) for k in ("params", "status", "message")} for s in subs]
        skipped = [r for r in recs.values() if r and r.get("reason")]
        if skipped:
            entry["reason"] = skipped[0]["reason"]
        if outcome in ("failed", "error"):
            key = tid if failed_import is None else mod
            messages = [r.get("message") or "" for r in recs.values() if r and r["status"] in ("FAIL", "ERROR")]
            if key in C_LAYER and messages and all(C_LAYER_ERROR.search(m) for m in messages):
                entry["outcome"] = "c_layer"
                entry["c_layer_reason"] = C_LAYER[key]
            elif messages and all(C_LAYER_ERROR.search(m) for m in messages):
                entry["note"] = "C-layer name, but not in the C_LAYER list: counted as an error"
            elif (key in NUMPY1_ONLY and not numpy1 and messages
                  and all(NUMPY1_ONLY_ERROR.search(m) for m in messages)
                  and not any(in_package(f[0], packages) for r in recs.values() if r
                              for f in r.get("frames") or [])):
                entry["outcome"] = "numpy1"
                entry["numpy1_reason"] = NUMPY1_ONLY[key]
        results[tid] = entry
    return results


# ---------------------------------------------------------------- launching

def kill_tree(proc: subprocess.Popen, marker: str) -> None:
    """End mpirun's process group, then any PE of this launch that outlived it."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    for _ in range(2):
        left = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == os.getpid():
                continue
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmd:
                left.append(int(p.name))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not left:
            break
        time.sleep(1)


def numpy1_dir(cache: Path, python: str) -> Path:
    """A directory holding NumPy 1 for `python` (pip install --target, once), to
    put first on the PEs' PYTHONPATH (--numpy1)."""
    target = cache / "numpy1"
    if not (target / "numpy").is_dir():
        print(f"installing numpy<2 into {target}", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary",
                        ":all:", "--target", str(target), "numpy<2"],
                       check=True, stdout=subprocess.DEVNULL)
    return target


def run_launch(chosen: dict, args, tree: Path, all_tests: dict, workdir: Path,
               label: str) -> dict:
    """One mpirun for the modules of `chosen` ({module: names, [] = all}): {module: result}."""
    logdir = workdir / label
    if logdir.exists():
        shutil.rmtree(logdir)
    logdir.mkdir(parents=True)
    names = [n for mod, given in chosen.items() for n in (given or [mod])]
    cmd = shlex.split(args.mpirun) + ["-n", str(args.np), args.python, str(HERE / "run.py"),
                                       "--_pe", str(logdir), str(tree / "test")] + names
    env = dict(os.environ)
    if args.target == "shmemvm":
        env["PYTHONPATH"] = os.pathsep.join([str(ALIAS)] + args.extra_path + [args.shmemvm_dir] + (
            [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.setdefault("SHMEMVM_TIMEOUT", "30")
        # The PEs' python's and the launcher's directories first: a system mpirun
        # (Open MPI's, in /usr/bin) must not stand in for ours or its helpers.
        dirs = [str(Path(args.python).parent)]
        launcher = shlex.split(args.mpirun)[0]
        if os.sep in launcher:
            dirs.append(str(Path(launcher).parent))
        env["PATH"] = os.pathsep.join(dirs + [env.get("PATH", "")])
    else:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    timeout = args.timeout * len(chosen)
    t0 = time.monotonic()
    with open(logdir / "mpirun.log", "w") as out:
        proc = subprocess.Popen(cmd, cwd=str(tree / "test"), env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        timed_out = False
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc, str(logdir))
            rc = proc.returncode
    wall = time.monotonic() - t0
    per_pe = {}
    for log in sorted(logdir.glob("pe*.log")):
        per_pe[log.stem[2:]] = parse_log(log.read_text(errors="replace"))
    mpirun_log = (logdir / "mpirun.log").read_text(errors="replace")
    packages = {p.read_text().strip() for p in logdir.glob("pe*.package")}
    results = {}
    for mod, given in chosen.items():
        expected = all_tests[mod]
        if given:  # only the named tests (mod.Class.test) and classes (mod.Class)
            wanted = [n[len(mod) + 1:] for n in given]
            expected = [t for t in expected if t in wanted or t.split(".")[0] in wanted]
        tests = merge(mod, expected, per_pe, timed_out, args.numpy1, packages)
        counts = {k: 0 for k in OUTCOMES}
        for t in tests.values():
            counts[t["outcome"]] += 1
        results[mod] = {"cmd": cmd, "rc": rc, "timed_out": timed_out, "wall_s": round(wall, 1),
                        "launch": label, "pes_reporting": sorted(per_pe), "counts": counts,
                        "tests": tests, "mpirun_output_tail": mpirun_log[-3000:]}
    return results


def describe(directory: str) -> str:
    """The git commit of `directory` ("+changes" when its shmemvm/ differs from it), if any."""
    try:
        head = subprocess.run(["git", "-C", directory, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", directory, "status", "--porcelain", "--", "shmemvm"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--_pe":
        pe_main(sys.argv[2], sys.argv[3], sys.argv[4:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="test modules or tests (default: the whole suite)")
    ap.add_argument("--np", type=int, default=2, help="number of PEs (default 2)")
    ap.add_argument("--mpirun", help="launcher command, '-n NP' is appended "
                    "(default: mpirun of this repo's .venv, else of the python's bin)")
    ap.add_argument("--python", help="python for the PEs (default: this repo's .venv python, "
                    "else this python; with --target shmem4py: this python)")
    ap.add_argument("--target", choices=("shmemvm", "shmem4py"), default="shmemvm",
                    help="shmemvm (through alias/, the default) or the installed real shmem4py")
    ap.add_argument("--oshmem", action="store_true",
                    help="the real peer: --target shmem4py, python $OSHMEM_PYTHON "
                    "(default /opt/oshmem-venv/bin/python), oshrun with the launch recipe of README.md")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per module (default 120)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--suite", help="an unpacked shmem4py-1.0.0 tree to use instead of fetching one")
    ap.add_argument("--shmemvm-dir", default=str(REPO),
                    help="directory whose shmemvm/ is tested (default: this repo); put on PYTHONPATH "
                    "after alias/, so it has no effect with a python where shmemvm is installed "
                    "editable (its import hook comes first)")
    ap.add_argument("--logdir", help="keep the per-PE logs here (default: a temporary directory)")
    ap.add_argument("--numpy1", action="store_true",
                    help="run the PEs with NumPy 1, the suite's own (pip-installed once into the "
                    "cache and put first on their PYTHONPATH); NUMPY1_ONLY tests then count as "
                    "any other")
    ap.add_argument("--one-launch", action="store_true",
                    help="one mpirun for all the modules (as the suite's own coverage.sh runs "
                    "them), not one a module: faster; a crash or timeout then ends the rest")
    ap.add_argument("--show", type=int, default=400, help="characters of each failure's message to print")
    args = ap.parse_args()

    if args.oshmem:
        args.target = "shmem4py"
        args.python = args.python or os.environ.get("OSHMEM_PYTHON", "/opt/oshmem-venv/bin/python")
        args.mpirun = args.mpirun or ("oshrun --oversubscribe --mca memory ^patcher "
                                      "-x UCX_MEM_EVENTS=no -x UCX_MEM_MALLOC_HOOKS=no -x UCX_TLS=posix,self")
    if not args.python:
        venv_py = REPO / ".venv" / "bin" / "python"
        args.python = str(venv_py) if args.target == "shmemvm" and venv_py.exists() else sys.executable
    if not args.mpirun:
        cand = Path(args.python).parent / "mpirun"
        args.mpirun = str(cand) if cand.exists() else (shutil.which("mpirun") or "mpirun")
    # The PEs start in the suite's test/ directory: make relative paths absolute.
    launcher = shlex.split(args.mpirun)
    if os.sep in launcher[0]:
        launcher[0] = os.path.abspath(launcher[0])
        args.mpirun = shlex.join(launcher)
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)

    if args.suite:
        tree = Path(args.suite).resolve()
    else:
        cache = Path(os.environ.get("SHMEM4PY_SUITE_CACHE")
                     or Path(tempfile.gettempdir()) / "shmem4py-suite-cache")
        tree = fetch_suite(cache, sys.executable)
    all_tests = static_tests(tree / "test")
    chosen = select(all_tests, args.names)

    args.extra_path = []
    if args.numpy1 and args.target == "shmemvm":
        cache = Path(os.environ.get("SHMEM4PY_SUITE_CACHE")
                     or Path(tempfile.gettempdir()) / "shmem4py-suite-cache")
        args.extra_path = [str(numpy1_dir(cache, args.python))]

    workdir = Path(args.logdir).resolve() if args.logdir else Path(tempfile.mkdtemp(prefix="shmem4py-suite-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = {}
    launches = [("all", chosen)] if args.one_launch else [(mod, {mod: names})
                                                          for mod, names in chosen.items()]
    t0 = time.monotonic()
    try:
        for label, part in launches:
            print(f"  {label} ...", end="", flush=True, file=sys.stderr)
            results.update(run_launch(part, args, tree, all_tests, workdir, label))
            r = results[next(iter(part))]
            print(f" {r['wall_s']} s{' (timed out)' if r['timed_out'] else ''}", file=sys.stderr)
    finally:
        if not args.logdir:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.monotonic() - t0

    cols = OUTCOMES
    heads = ("pass", "fail", "error", "skip", "C-n/a", "NumPy-1", "timeout", "crash", "not-run")
    what = (f"shmemvm from {args.shmemvm_dir} ({describe(args.shmemvm_dir)})"
            if args.target == "shmemvm" else "shmem4py")
    print(f"\nshmem4py {SHMEM4PY_VERSION} suite, target {what}, {args.np} PE(s), "
          f"launcher: {args.mpirun}, python: {args.python}"
          f"{', NumPy 1 from ' + args.extra_path[0] if args.extra_path else ''}, {wall:.1f} s")
    print(f"{'module':<12} {'tests':>5} " + " ".join(f"{h:>7}" for h in heads) + f" {'rc':>4} {'time':>6}")
    totals = {c: 0 for c in cols}
    for mod, r in results.items():
        n = len(r["tests"])
        print(f"{mod:<12} {n:>5} " + " ".join(f"{r['counts'][c]:>7}" for c in cols)
              + f" {r['rc'] if not r['timed_out'] else 'TO':>4} {r['wall_s']:>6}")
        for c in cols:
            totals[c] += r["counts"][c]
    print(f"{'total':<12} {sum(len(r['tests']) for r in results.values()):>5} "
          + " ".join(f"{totals[c]:>7}" for c in cols))
    bad = [(tid, t) for r in results.values() for tid, t in r["tests"].items()
           if t["outcome"] not in ACCEPTED]
    if bad:
        print("\nnot passed:")
        for tid, t in bad:
            msg = (t.get("message") or "").replace("\n", " | ")[:args.show]
            print(f"  {t['outcome']:<8} {tid}  {msg}")
    crashes = {r["launch"]: r for r in results.values()
               if r["rc"] not in (0, None) and not r["timed_out"]}
    for label, r in crashes.items():
        print(f"\n{label}: launcher exited {r['rc']}; its output ends:\n"
              + r["mpirun_output_tail"][-800:])
    if args.json:
        Path(args.json).write_text(json.dumps({
            "suite": f"shmem4py {SHMEM4PY_VERSION} test/", "suite_dir": str(tree),
            "target": args.target,
            "shmemvm": ({"dir": args.shmemvm_dir, "commit": describe(args.shmemvm_dir)}
                        if args.target == "shmemvm" else None),
            "np": args.np, "mpirun": args.mpirun, "python": args.python,
            "timeout_s": args.timeout, "numpy1": args.numpy1, "one_launch": args.one_launch,
            "wall_s": round(wall, 1), "totals": totals, "modules": results}, indent=1))
    return 0 if not bad and not crashes else 1


if __name__ == "__main__":
    sys.exit(main())
