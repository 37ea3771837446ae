"""Smoke test of the benchmark suite: `python -m benchmarks --quick` on tiny
sizes writes a result of the one schema (benchmarks/schema.py) with positive
medians. No timing is asserted."""

from __future__ import annotations

import os

import pytest


@pytest.mark.mpi(min_size=2)
def test_bench_quick_writes_a_result_of_the_schema(tmp_path):
    from mpi4py import MPI

    from benchmarks import schema
    from benchmarks.cli import main

    comm = MPI.COMM_WORLD
    directory = comm.bcast(str(tmp_path) if comm.rank == 0 else None, root=0)
    path = os.path.join(directory, "bench.json")
    try:
        import matplotlib  # noqa: F401
        plot = ["--plot", directory]
    except ImportError:
        plot = []
    assert main(["--quick", "--sizes", "8,4K", "--live", "10,20", "--repeat", "2",
                 "--min-time", "0.001", "--json", path, *plot], comm=comm) == 0
    comm.Barrier()

    doc = schema.load(path)
    assert schema.validate(doc, stored=False) == []   # stored or not: this tree may be dirty
    if plot:
        chart = os.path.join(directory, f"{doc['settings']['backend']}-{comm.size}pe.png")
        assert os.path.getsize(chart) > 1000
    assert doc["benchmark"] == "host-suite" and doc["settings"]["n_pes"] == comm.size
    assert doc["command"].startswith(f"mpirun -n {comm.size} python -m benchmarks --quick")
    assert len(doc["code"]["commit"]) == 40 and isinstance(doc["code"]["clean"], bool)
    assert all(len(doc["machine"]["load_average"][k]) == 3 for k in ("start", "end"))
    records = doc["measurements"]
    names = {r["name"] for r in records}
    for expected in ("put.bandwidth", "get.bandwidth", "put.latency", "get.latency",
                     "malloc.latency", "free.latency", "free+trim.latency",
                     "malloc.live_latency", "footprint.physical_per_requested"):
        assert expected in names, f"no {expected} record in {sorted(names)}"
    for r in records:
        assert r["params"]["n_pes"] == comm.size
        assert r["baseline"]["name"] and r["ratio_of"] == "median/median"
        assert r["value"]["median"] > 0 and r["baseline"]["value"]["median"] > 0
        assert r["ratio"] == pytest.approx(r["value"]["median"] / r["baseline"]["value"]["median"],
                                           rel=1e-3)
        if r["name"].startswith(("put.", "get.")):
            assert r["value"]["n"] == 2   # one sample a repeat
    assert {r["params"]["bytes"] for r in records if r["name"] == "put.bandwidth"} == {8, 4096}
    assert {r["params"]["live"] for r in records if r["name"] == "malloc.live_latency"} == {10, 20}
    targets = doc["summary"]["targets"]
    assert {t["status"] for t in targets} <= {"PASS", "MISS"}
    assert len(targets) == 3  # no >= 1 MiB sizes, so no bandwidth target

    if comm.rank == 0:  # the markdown summary of a run, no MPI needed
        summary = os.path.join(directory, "summary.md")
        assert main(["report", path, "--markdown", summary]) == 0
        with open(summary) as f:
            text = f.read()
        assert "| target |" in text and "malloc" in text and "bench.json" in text
    comm.Barrier()


def test_bench_rejects_unknown_benchmark(capsys):
    from benchmarks.cli import main

    with pytest.raises(SystemExit):
        main(["no-such-benchmark"])
    assert "unknown benchmark" in capsys.readouterr().err


def test_bench_refuses_to_store_a_dirty_tree_in_results(tmp_path, monkeypatch):
    """Into benchmarks/results/ only from a clean tree, checked before measuring;
    --allow-dirty stores and says so."""
    from benchmarks import schema

    dirty = {"commit": "0" * 40, "clean": False, "changed": ["shmemvm/heap.py"],
             "allow_dirty": False, "shmemvm": None}
    monkeypatch.setattr(schema, "code_state", lambda root=schema.ROOT: dict(dirty))
    inside = os.path.join(schema.RESULTS, "never-written.json")
    with pytest.raises(schema.DirtyTreeError, match="shmemvm/heap.py.*--allow-dirty"):
        schema.Run("test", "cmd", path=inside)
    assert not os.path.exists(inside)
    assert schema.Run("test", "cmd", path=inside, allow_dirty=True).code["allow_dirty"] is True
    elsewhere = schema.Run("test", "cmd", path=str(tmp_path / "x.json"))   # not stored: allowed
    assert elsewhere.code["clean"] is False and elsewhere.code["allow_dirty"] is False


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


def test_host_vs_oshmem_without_the_peer_says_so_and_measures_shmemvm(tmp_path):
    """Where shmem4py on OSHMEM is not installed (CI), the comparison says why and
    still measures shmemvm against its own same-run baselines (it launches its
    own `mpirun -n 2`)."""
    import subprocess
    import sys

    from benchmarks import schema

    out = tmp_path / "vs.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "host-vs-oshmem", "--oshmem-venv",
         str(tmp_path / "no-such-venv"), "--quick", "--rounds", "1", "--repeat", "1",
         "--min-time", "0.001", "--json", str(out)],
        cwd=schema.ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the peer (shmem4py on Open MPI's OSHMEM) is not installed here" in done.stderr
    doc = schema.load(out)
    assert schema.validate(doc, stored=False) == []
    assert doc["settings"]["peer"] is None and "no Python at" in doc["settings"]["peer_missing"]
    by = {(m["name"], m["params"]["face"], (m["baseline"] or {}).get("name"))
          for m in doc["measurements"]}
    assert ("barrier_all", "shmemvm.shmem", "MPI.Barrier (mpi4py, COMM_WORLD)") in by
    assert ("put", "shmemvm torch API", "np.copyto (local, same bytes)") in by
    assert ("atomic_fetch_add", "shmemvm.shmem", None) in by     # no baseline without the peer
    assert all(m["baseline"] is None or "OSHMEM" not in m["baseline"]["name"]
               for m in doc["measurements"])
    checks = doc["summary"]["checks"]["2 PEs"]
    assert all(all(v.values()) for v in checks.values()), checks
