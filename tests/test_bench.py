"""Smoke test of the benchmark suite: `python -m benchmarks --quick` on tiny
sizes writes records of the documented schema with positive values. No
timing is asserted."""

from __future__ import annotations

import json
import math
import os

import pytest

RECORD_KEYS = {"name", "params", "value", "unit", "baseline_name", "baseline_value", "ratio"}


@pytest.mark.mpi(min_size=2)
def test_bench_quick_writes_records(tmp_path):
    from mpi4py import MPI

    from benchmarks.cli import main

    comm = MPI.COMM_WORLD
    directory = comm.bcast(str(tmp_path) if comm.rank == 0 else None, root=0)
    path = os.path.join(directory, "bench.json")
    try:
        import matplotlib  # noqa: F401
        plot = ["--plot", directory]
    except ImportError:
        plot = []
    assert main(["--quick", "--sizes", "8,4K", "--live", "10,20", "--repeat", "1",
                 "--min-time", "0.001", "--json", path, *plot], comm=comm) == 0
    comm.Barrier()

    with open(path) as f:
        doc = json.load(f)
    if plot:
        chart = os.path.join(directory, f"{doc['backend']}-{comm.size}pe.png")
        assert os.path.getsize(chart) > 1000
    assert doc["n_pes"] == comm.size
    assert doc["schema"].startswith("shmemvm.bench/")
    records = doc["records"]
    names = {r["name"] for r in records}
    for expected in ("put.bandwidth", "get.bandwidth", "put.latency", "get.latency",
                     "malloc.latency", "free.latency", "free+trim.latency",
                     "malloc.live_latency", "footprint.physical_per_requested"):
        assert expected in names, f"no {expected} record in {sorted(names)}"
    for r in records:
        assert set(r) == RECORD_KEYS, r
        assert isinstance(r["name"], str) and isinstance(r["unit"], str) and r["unit"]
        assert isinstance(r["params"], dict) and r["params"]["n_pes"] == comm.size
        assert isinstance(r["baseline_name"], str) and r["baseline_name"]
        for key in ("value", "baseline_value", "ratio"):
            assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r)
    assert {r["params"]["bytes"] for r in records if r["name"] == "put.bandwidth"} == {8, 4096}
    assert {r["params"]["live"] for r in records if r["name"] == "malloc.live_latency"} == {10, 20}
    assert {t["status"] for t in doc["targets"]} <= {"PASS", "MISS"}
    assert len(doc["targets"]) == 3  # no >= 1 MiB sizes, so no bandwidth target

    if comm.rank == 0:  # the markdown summary of a run, no MPI needed
        summary = os.path.join(directory, "summary.md")
        assert main(["report", path, "--markdown", summary]) == 0
        with open(summary) as f:
            text = f.read()
        assert "| target |" in text and "malloc" in text
    comm.Barrier()


def test_bench_rejects_unknown_benchmark(capsys):
    from benchmarks.cli import main

    with pytest.raises(SystemExit):
        main(["no-such-benchmark"])
    assert "unknown benchmark" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--quick", "--plot", "DIR"],
                                  ["report", "RUN.json", "--plot", "DIR"]])
def test_plot_without_matplotlib_says_what_to_install(argv, monkeypatch, capsys, tmp_path):
    import sys

    from benchmarks.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    argv = [str(tmp_path) if a == "DIR" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert 'pip install ".[bench]"' in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())                      # nothing measured or written
