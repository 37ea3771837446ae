"""The host comparison (benchmarks/host_vs_oshmem.py) run for real where its
peer is not installed: it starts its own `mpirun -n 2`, so it runs in the
`jobs` phase of tests/run_all.sh. Its table and chart, from canned launches in
one process: tests/unit/benchmarks/test_bench_cli.py.
"""

from __future__ import annotations


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
    # issue 30's collectives, each beside its MPI call of the same run
    assert ("sync_all", "shmemvm torch API", "MPI.Barrier (mpi4py, COMM_WORLD)") in by
    assert ("broadcast", "shmemvm.shmem", "MPI Bcast (mpi4py, 1 int64)") in by
    assert ("alltoall", "shmemvm torch API", "MPI Alltoall (mpi4py, 1 int64 a pair)") in by
    assert all(m["baseline"] is None or "OSHMEM" not in m["baseline"]["name"]
               for m in doc["measurements"])
    checks = doc["summary"]["checks"]["2 PEs"]
    assert all(all(v.values()) for v in checks.values()), checks
    paths = doc["settings"]["paths"]          # which of shmemvm's paths each face ran
    assert set(paths) == {"shmemvm", "torch"}, paths
    for ran in paths.values():
        assert ran["backend"] == "host" and ran["agreement"] in ("board", "mpi"), ran
        assert isinstance(ran["native"], bool) and "compiled_piece" in ran, ran
        assert ran["mpi"] and isinstance(ran["mpi_window"], bool), ran   # Open MPI 4.1: False
    # without the peer the table shows the same-run baselines, and the chart is not
    # announced where none was written
    assert "same-run baseline" in done.stdout and "MPI.Barrier" in done.stdout, done.stdout
