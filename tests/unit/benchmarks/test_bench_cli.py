"""The benchmark suite in one process (benchmarks/): its command line (an unknown
benchmark and --plot without matplotlib are clear errors), results stored only
from a clean tree, and the host comparison's table and chart without its peer.
The host comparison run for real (it starts its own mpirun):
tests/jobs/benchmarks/test_bench_host_vs_oshmem.py. The suite's smoke test
under MPI: tests/mpi/benchmarks/test_bench.py.
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
    # the hint keeps the Quick start's editable install: a plain `pip install ".[bench]"`
    # replaced it, hid the compiled piece, and the benchmark measured the pure Python paths
    assert "pip install matplotlib" in err and "Traceback" not in err
    assert 'pip install ".[bench]"' not in err and "pip install --no-build-isolation -e" in err
    assert not any(tmp_path.iterdir())                      # nothing measured or written


def _launch(impl, ops, load=1.0):
    """What launch() returns for one implementation: ops {key: (kind, bytes, samples_s,
    baseline (name, samples_s) or None)}."""
    return {"load": [load, load], "module": "/x/shmemvm", "versions": {}, "environment": {},
            "checks": {"put landed": True},
            "paths": {"backend": "host", "compiled_piece": None, "native": False,
                      "agreement": "mpi", "atomics": "window", "shmemvm": "/x/shmemvm"},
            "ops": {key: {"kind": kind, "bytes": nbytes, "samples_s": samples,
                          "baseline": None if base is None else
                          {"name": base[0], "samples_s": base[1]}}
                    for key, (kind, nbytes, samples, base) in ops.items()}}


def _doc_without_the_peer():
    from benchmarks import host_vs_oshmem, schema

    ops = {"put 8 B": ("one-sided", 8, [2e-6, 2e-6, 2e-6], ("np.copyto (local, same bytes)",
                                                             [1e-6, 1e-6, 1e-6])),
           "barrier_all": ("collective", 0, [5e-6, 5e-6], ("MPI.Barrier (mpi4py, COMM_WORLD)",
                                                          [1e-6, 1e-6])),
           "atomic_fetch_add": ("one-sided", 8, [3e-6, 3e-6], None)}
    run = schema.Run("host-vs-oshmem", "cmd")
    run.settings = {"rounds": 1}
    launches = {(2, False): {"shmemvm": [_launch("shmemvm", ops)],
                             "torch": [_launch("torch", ops)]}}
    host_vs_oshmem.build(run, launches, 1, "no Python at /nowhere/bin/python")
    return run.document()


def test_without_the_peer_the_table_gives_the_same_run_baselines():
    """Where the peer is missing, every ratio used to read n/a and no baseline was
    shown: the table then compares each face with its same-run baseline."""
    from benchmarks import host_vs_oshmem

    text = host_vs_oshmem.markdown(_doc_without_the_peer())
    assert "same-run baseline" in text and "OSHMEM |" not in text, text
    put = next(line for line in text.splitlines() if line.startswith("| put 8 B"))
    assert "1 µs" in put and "np.copyto" in put and "2.00×" in put, put
    barrier = next(line for line in text.splitlines() if line.startswith("| barrier_all"))
    assert "MPI.Barrier" in barrier and "5.00×" in barrier, barrier
    atomic = next(line for line in text.splitlines() if line.startswith("| atomic_fetch_add"))
    assert "3 µs" in atomic and "none" in atomic, atomic


def test_without_the_peer_the_chart_draws_the_same_run_ratios():
    """--plot without the peer said `wrote X` and wrote nothing (the chart drew only
    ratios against OSHMEM): its bars are now the ratios to the same-run baselines."""
    from benchmarks import host_vs_oshmem

    title, panels = host_vs_oshmem.chart(_doc_without_the_peer())
    assert "same-run baseline" in title
    (mode, rows), = panels.items()
    assert mode == (2, False)
    bars = {label: values for label, values in rows}
    assert bars["put 8 B"] == {"shmemvm": 2.0, "torch": 2.0}
    assert bars["barrier_all"] == {"shmemvm": 5.0, "torch": 5.0}
    assert "atomic_fetch_add" not in bars     # no baseline, no bar


def test_a_chart_not_written_is_not_announced(tmp_path, monkeypatch, capsys):
    from benchmarks import host_vs_oshmem

    monkeypatch.setattr(host_vs_oshmem, "chart", lambda doc: ("", {}))
    path = tmp_path / "vs.png"
    assert host_vs_oshmem.write_chart(_doc_without_the_peer(), str(path)) is False
    assert not path.exists()


def test_a_result_says_which_paths_ran():
    """A result records the compiled piece (or its absence), whether every PE used
    it, the agreement's transport and the atomics' path; where the piece is
    missing or unused, it says the figures are of the pure Python paths."""
    from types import SimpleNamespace

    from benchmarks import schema
    from shmemvm import native

    heap = SimpleNamespace(backend=SimpleNamespace(name="host"), native=True,
                           agreement=SimpleNamespace(board=object()),
                           routes=SimpleNamespace(atomics=SimpleNamespace(value="cpu")))
    paths = schema.heap_paths(heap)
    assert paths["backend"] == "host" and paths["compiled_piece"] == native.built()
    assert paths["native"] is True and paths["agreement"] == "board" and paths["atomics"] == "cpu"
    assert paths["shmemvm"].endswith("shmemvm")
    heap.agreement.board, heap.native = None, False
    assert schema.heap_paths(heap)["agreement"] == "mpi"
    built = {"compiled_piece": "/x/_native.so", "native": True}
    assert schema.paths_warning(built) is None
    assert "pure Python" in schema.paths_warning({**built, "native": False})
    missing = schema.paths_warning({**built, "compiled_piece": None, "native": False})
    assert "pure Python" in missing and "-e ." in missing


def test_the_documented_benchmark_commands_write_under_benchmarks():
    """The README's and docs' benchmark commands write into benchmarks/out/ (which git
    ignores) or benchmarks/results/: their outputs once landed, untracked, in the
    checkout's root."""
    import re

    from benchmarks import schema

    root = schema.ROOT
    docs = [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", name) for name in os.listdir(os.path.join(root, "docs"))
        if name.endswith(".md"))
    written = []
    for doc in docs:
        with open(doc) as f:
            for line in f:
                if "benchmarks" not in line:
                    continue
                written += [(os.path.basename(doc), path) for path in
                            re.findall(r"--(?:json|plot|markdown|out)[ =]([^\s`|)]+)", line)
                            if path != "..." and not path.isupper()]
    assert written, "no benchmark command with an output found"
    outside = [f"{doc}: {path}" for doc, path in written
               if not path.startswith(("benchmarks/out/", "benchmarks/results/"))]
    assert outside == []
