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
    from shmemvm import native
    paths = doc["settings"]["paths"]   # which of shmemvm's paths ran
    assert paths["backend"] == doc["settings"]["backend"], paths
    assert paths["compiled_piece"] == native.built() and isinstance(paths["native"], bool), paths
    assert paths["agreement"] in ("board", "mpi") and paths["atomics"] in ("cpu", "window"), paths
    assert doc["command"].startswith(f"mpirun -n {comm.size} python -m benchmarks --quick")
    assert len(doc["code"]["commit"]) == 40 and isinstance(doc["code"]["clean"], bool)
    assert all(len(doc["machine"]["load_average"][k]) == 3 for k in ("start", "end"))
    records = doc["measurements"]
    names = {r["name"] for r in records}
    for expected in ("put.bandwidth", "get.bandwidth", "put.latency", "get.latency",
                     "malloc.latency", "free.latency", "free+trim.latency",
                     "malloc.live_latency", "footprint.physical_per_requested",
                     "calls.barrier_all", "calls.sum_reduce", "calls.malloc+free", "calls.put"):
        assert expected in names, f"no {expected} record in {sorted(names)}"
    # the engine's cached branch, compiled against Python, where the compiled piece is used
    assert ("malloc+free.latency" in names) == (native.CachedBlocks is not None), sorted(names)
    counted = {(r["params"]["face"], r["name"]) for r in records if r["name"].startswith("calls.")}
    assert len(counted) == 20, sorted(counted)    # 10 operations, each on both faces
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
