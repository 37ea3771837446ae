"""The calls family (benchmarks/calls.py) under MPI: its figures, Python calls
per operation on PE 0, are the same in two runs, and every call it kept made
the same number, however the PEs arrived (a PE that waits polls; the count
leaves that out).

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/benchmarks/test_bench_calls.py
"""

from __future__ import annotations

import pytest


@pytest.mark.mpi(min_size=1)
def test_the_counts_are_the_same_in_two_runs():
    from mpi4py import MPI

    from benchmarks import calls
    from benchmarks.common import Bench, Options
    from shmemvm.heap import SymmetricHeap

    comm = MPI.COMM_WORLD
    figures = []
    with SymmetricHeap(comm, heap_size="64M", backend="host") as heap:
        for _ in range(2):
            bench = Bench(comm, Options(quick=True))
            bench.heap = heap
            calls.run(bench)
            figures.append({(r["params"]["face"], r["name"]): r for r in bench.records})
    if comm.rank != 0:
        assert figures == [{}, {}]   # PE 0 records
        return
    first, second = figures
    assert len(first) == 20 and first.keys() == second.keys(), sorted(first)
    for key, record in first.items():
        value = record["value"]
        assert value["min"] == value["max"] >= 1, (key, value)        # every kept call alike
        assert second[key]["value"]["median"] == value["median"], (key, value, second[key])
        assert record["baseline"]["value"]["median"] == 1, (key, record["baseline"])
        assert record["value"]["n"] + record["waited"] == 40, (key, record)
    numpy_face = {name for face, name in first if face == "numpy"}
    assert {"calls.broadcast", "calls.fcollect", "calls.alltoall", "calls.sum_reduce",
            "calls.get", "calls.atomic_fetch_add", "calls.sync_all"} <= numpy_face
