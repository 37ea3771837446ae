"""The benchmark suite in one process (benchmarks/): its command line (an unknown
benchmark and --plot without matplotlib are clear errors), results stored only
from a clean tree, and the host comparison without its peer (it starts its own
mpirun). The suite's smoke test under MPI: tests/mpi/benchmarks/test_bench.py.
"""

from __future__ import annotations

import os

import pytest


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
