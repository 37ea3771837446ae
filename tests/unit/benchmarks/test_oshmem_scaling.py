"""Issue 30's comparison over PE counts (benchmarks/host_vs_oshmem.py with
benchmarks/oshmem_scaling.py), in one process with canned launches: each row
marked against the goal, the barrier's scaling over the counts, one result per
count under --out-dir, rounds left out at --deadline, the paths that ran (the
MPI window among them), and a launch whose PEs all wrote their results kept when
the launcher then aborts or hangs at exit (OSHMEM at 4-8 PEs). The real launches:
tests/unit/benchmarks/test_bench_cli.py (shmemvm's side at 2 PEs, quick)."""

from __future__ import annotations

import os
import sys
import time

import pytest

WINDOWLESS = {"backend": "host", "compiled_piece": "/x/_native.so", "native": True,
              "agreement": "board", "atomics": "cpu", "shmemvm": "/x/shmemvm",
              "mpi": "Open MPI v4.1.6", "mpi_window": False,
              "window_error": "MPI could not create a dynamic window: MPI_ERR_WIN"}


def _op(kind, nbytes, seconds, base=None):
    return {"kind": kind, "bytes": nbytes, "samples_s": [seconds] * 3,
            "baseline": None if base is None else {"name": base[0], "samples_s": [base[1]] * 3}}


def _launch(impl: str, n: int) -> dict:
    """What launch() returns: OSHMEM's barrier flat over n, shmemvm's growing with n;
    shmemvm's put 8 B 1.33x OSHMEM's time (goal met), its 1 MiB put half its
    bandwidth and its reduce twice its time (not met)."""
    mine = impl != "oshmem"
    return {"load": [1.0, 1.0], "module": "/x/shmemvm", "versions": {}, "environment": {},
            "checks": {"put": True}, "paths": dict(WINDOWLESS) if mine else None,
            "ops": {"barrier_all": _op("collective", 0, 2e-6 * n if mine else 1e-6),
                    "put 8 B": _op("one-sided", 8, 2e-6 if mine else 1.5e-6),
                    "put 1048576 B + quiet": _op("one-sided", 1 << 20, 2e-4 if mine else 1e-4),
                    "sum_reduce 1 float64": _op("collective", 8, 6e-6 if mine else 3e-6)}}


def test_goal_marks_times_and_bandwidths():
    from benchmarks import oshmem_scaling as s

    assert s.meets(1.5, "us") and not s.meets(1.51, "us") and s.meets(None, "us") is None
    assert s.meets(1.0, "GB/s") and not s.meets(0.99, "GB/s")
    row = {"unit": "GB/s", "shmemvm_ratio": 0.5, "torch_ratio": 1.2}
    s.mark_goal(row, ["shmemvm", "torch"])
    assert row["goal"] == ">= 1x OSHMEM"
    assert row["shmemvm_meets_goal"] is False and row["torch_meets_goal"] is True


def test_barrier_scaling_is_a_measurement_of_the_largest_count_over_the_smallest():
    from benchmarks import oshmem_scaling, schema

    run = schema.Run("host-vs-oshmem", "cmd")
    summary = oshmem_scaling.barrier_scaling(
        run, {"oshmem": {2: [1.0, 1.2], 16: [2.0, 2.4]}, "shmemvm": {2: [4.0], 16: [40.0]},
              "torch": {2: [3.0]}}, 2, 16)
    assert summary["oshmem"]["ratio"] == pytest.approx(2.0) and summary["oshmem"]["meets_goal"]
    assert summary["shmemvm"]["ratio"] == pytest.approx(10.0)
    assert summary["shmemvm"]["meets_goal"] is False
    assert "torch" not in summary                       # not measured at 16 PEs
    doc = run.document()
    assert schema.validate(doc, stored=False) == []
    m = next(m for m in doc["measurements"] if m["params"]["face"] == "shmemvm.shmem")
    assert m["name"] == "barrier_all scaling"
    assert m["baseline"]["name"].endswith("at 2 PEs (same run)")


def _fake_run(monkeypatch, tmp_path, argv, launch_s=0.05):
    from benchmarks import host_vs_oshmem

    calls = []

    def launch(impl, n, split, workdir, round_no, args, peer, mpirun, log, timeout=None):
        calls.append((round_no, n, impl))
        time.sleep(launch_s)
        return _launch(impl, n)

    monkeypatch.setattr(host_vs_oshmem, "find_peer", lambda *a: (["oshrun", "python"], None))
    monkeypatch.setattr(host_vs_oshmem, "find_mpirun", lambda given: ["mpirun"])
    monkeypatch.setattr(host_vs_oshmem, "launch", launch)
    code = host_vs_oshmem.main(argv + ["--out-dir", str(tmp_path), "--name", "vs"])
    return code, calls


def test_one_result_per_count_with_goal_marks_paths_and_the_barrier_scaling(
        monkeypatch, tmp_path, capsys):
    from benchmarks import schema

    code, calls = _fake_run(monkeypatch, tmp_path, ["--pes", "2,16", "--rounds", "2",
                                                   "--no-torch"])
    assert code == 0
    # round by round over every count, the implementations alternating
    assert calls == [(0, 2, "oshmem"), (0, 2, "shmemvm"), (0, 16, "oshmem"),
                     (0, 16, "shmemvm"), (1, 2, "shmemvm"), (1, 2, "oshmem"),
                     (1, 16, "shmemvm"), (1, 16, "oshmem")]
    docs = {n: schema.load(tmp_path / f"vs-{n}pe.json") for n in (2, 16)}
    for n, doc in docs.items():
        assert schema.validate(doc, stored=False) == [], n
        assert doc["settings"]["pes"] == [n] and doc["settings"]["rows"] == "all"
        rows = {r["operation"]: r for r in doc["summary"]["table"]}
        assert rows["put 8 B"]["goal"] == "<= 1.5x OSHMEM"
        assert rows["put 8 B"]["shmemvm_meets_goal"] is True
        assert rows["put 1048576 B + quiet"]["shmemvm_meets_goal"] is False   # 0.5 of it
        assert rows["sum_reduce 1 float64"]["shmemvm_ratio"] == pytest.approx(2.0)
        paths = doc["settings"]["paths"]["shmemvm"]
        assert paths["mpi_window"] is False and paths["mpi"] == "Open MPI v4.1.6"
        assert any("no MPI dynamic window on Open MPI v4.1.6" in note and "MPI_ERR_WIN" in note
                   for note in doc["notes"]), doc["notes"]
    scaling = docs[16]["summary"]["barrier_scaling"]
    assert scaling["shmemvm"]["ratio"] == pytest.approx(8.0)
    assert scaling["shmemvm"]["meets_goal"] is False
    assert scaling["oshmem"]["ratio"] == pytest.approx(1.0) and scaling["oshmem"]["meets_goal"]
    assert "barrier_scaling" not in docs[2]["summary"]
    table = (tmp_path / "vs-scaling.md").read_text()
    assert "| 2 PEs | 16 PEs |" in table and "| put 1 MiB + quiet |" in table
    assert "0.50 of it ✗" in table and "1.3× ✓" in table
    assert "barrier_all at 16 PEs / at 2 PEs, shmemvm.shmem: 8.00 (goal <= 3: not met)" in table
    out = capsys.readouterr().out          # the peer's table: no torch columns, goal marks
    assert "torch API" not in out and "| 2× slower ✗ |" in out, out


def test_rounds_that_would_not_end_by_the_deadline_are_left_out(monkeypatch, tmp_path, capsys):
    from benchmarks import schema

    code, calls = _fake_run(monkeypatch, tmp_path, ["--pes", "2,4", "--rounds", "3",
                                                   "--no-torch", "--deadline", "3"])
    assert code == 0
    assert {r for r, _, _ in calls} == {0}            # every count's first round, no more
    assert {n for _, n, _ in calls} == {2, 4}
    doc = schema.load(tmp_path / "vs-4pe.json")
    left = [note for note in doc["notes"] if note.startswith("left out: ")]
    assert len(left) == 4 and "round 1 at 2 PEs" in left[0], doc["notes"]
    assert doc["summary"]["barrier_scaling"]["shmemvm"]["n_pes"] == [2, 4]
    assert doc["summary"]["table"][0]["rounds"] == {"oshmem": 1, "shmemvm": 1}
    assert "**4 PEs**, medians of 1 alternating rounds" in capsys.readouterr().out


def _fake_launcher(monkeypatch, then: str):
    """command() replaced by a launcher that writes every PE's results, then `then`."""
    from benchmarks import host_vs_oshmem

    def command(impl, n, split, prefix, args, peer, mpirun):
        out = {"load_start": [1.0, 1, 1], "load_end": [1.0, 1, 1], "module": "/x/shmem4py",
               "versions": {}, "environment": {}, "paths": None, "checks": {"put": True},
               "ops": {"barrier_all": _op("collective", 0, 1e-6)}}
        script = (f"import json\nfor pe in range({n}):\n"
                  f"    json.dump({out!r}, open({prefix!r} + f'.pe{{pe}}.json', 'w'))\n"
                  f"print('written', flush=True)\n{then}\n")
        return [sys.executable, "-c", script], dict(os.environ)

    monkeypatch.setattr(host_vs_oshmem, "command", command)


@pytest.mark.parametrize("then, expect", [
    ("import time; time.sleep(120)", "stopped 0.5 s after every PE wrote its results"),
    ("raise SystemExit(1)", "exited (exit 1)")])
def test_a_launch_whose_pes_all_wrote_is_kept_where_the_launcher_then_fails(
        monkeypatch, tmp_path, then, expect):
    """OSHMEM sometimes aborts, or hangs, at exit at 4 or 8 PEs: the round's results
    are kept (a hang no longer costs the whole --timeout), and the result says so."""
    from argparse import Namespace

    from benchmarks import host_vs_oshmem

    _fake_launcher(monkeypatch, then)
    args = Namespace(timeout=60, exit_grace=0.5)
    started = time.monotonic()
    got = host_vs_oshmem.launch("oshmem", 4, False, str(tmp_path), 1, args, None, None,
                                lambda message: None)
    assert time.monotonic() - started < 30
    assert isinstance(got, dict), got
    assert got["ops"]["barrier_all"]["samples_s"] == [1e-6] * 3
    assert "oshmem at 4 PEs, round 1: the launcher " + expect in got["exit"], got["exit"]
    assert "kept" in got["exit"] and "written" in got["exit"]


def test_a_launch_that_wrote_nothing_in_time_fails_saying_so(monkeypatch, tmp_path):
    from argparse import Namespace

    from benchmarks import host_vs_oshmem

    monkeypatch.setattr(host_vs_oshmem, "command", lambda *a: (
        [sys.executable, "-c", "import time; print('hung'); time.sleep(120)"], dict(os.environ)))
    got = host_vs_oshmem.launch("shmemvm", 2, False, str(tmp_path), 0,
                                Namespace(timeout=1, exit_grace=5), None, None,
                                lambda message: None)
    assert isinstance(got, str)
    assert "shmemvm at 2 PEs, round 0: PE 0 wrote nothing (stopped after 1 s" in got, got


def test_mpirun_given_with_its_options():
    """On the device machine shmemvm runs over Open MPI: its mpirun is given with
    --allow-run-as-root; found ones skip Open MPI's (mpi4py here is MPICH's)."""
    from benchmarks import host_vs_oshmem

    assert host_vs_oshmem.find_mpirun("/usr/bin/mpirun --allow-run-as-root --oversubscribe") \
        == ["/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe"]


def test_the_peer_python_and_its_pythonpath(tmp_path):
    """The device machine's shmem4py is built with --target: the peer is python3 with
    that folder on PYTHONPATH (and nothing of shmemvm's on it)."""
    from benchmarks import host_vs_oshmem

    fake = tmp_path / "shmem4py"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    peer, why = host_vs_oshmem.find_peer(str(tmp_path / "no-venv"), sys.executable,
                                         str(tmp_path))
    if peer is None:
        assert "oshrun" in why          # no OSHMEM launcher on this machine
    else:
        assert peer[1] == sys.executable and why is None
    peer, why = host_vs_oshmem.find_peer(str(tmp_path / "no-venv"), sys.executable, None)
    assert peer is None and ("cannot import shmem4py" in why or "oshrun" in why), why
    env = host_vs_oshmem.peer_env(sys.executable, "/tmp/osh")
    assert env["PYTHONPATH"] == "/tmp/osh" and env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"


def test_the_device_script_is_bash_that_passes_options_the_benchmark_has():
    """benchmarks/device/oshmem_scaling.sh runs where no test can (the 16-core
    device machine): its syntax and every option it gives host-vs-oshmem; the
    syntax of the scripts beside it (build_compiled.sh, gpu_tests.sh) too."""
    import re
    import subprocess

    from benchmarks import host_vs_oshmem, schema

    script = os.path.join(schema.ROOT, "benchmarks", "device", "oshmem_scaling.sh")
    build = os.path.join(schema.ROOT, "benchmarks", "device", "build_compiled.sh")
    gpu = os.path.join(schema.ROOT, "benchmarks", "device", "gpu_tests.sh")
    for path in (script, build, gpu):
        done = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    with open(script) as f:
        text = f.read()
    assert "bash benchmarks/device/build_compiled.sh" in text
    with open(build) as f:   # every C file of a compiled module is found where meson fails
        assert "shmemvm/native/*.c shmemvm/backends/*.c" in f.read()
    calls = re.findall(r"\$PY -m benchmarks host-vs-oshmem((?:[^\n]*\\\n)*[^\n]*)", text)
    assert len(calls) == 2, calls          # the run, and --redraw where charts are missing
    known = {o for a in host_vs_oshmem._parser()._actions for o in a.option_strings}
    for call in calls:
        given = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", call))
        assert given <= known, given - known
    assert "--rows goal" in calls[0] and "--deadline" in calls[0] and "--out-dir" in calls[0]
