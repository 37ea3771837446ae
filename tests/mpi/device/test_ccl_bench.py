"""Smoke test of `python -m benchmarks device-ccl` (benchmarks/bench_ccl.py): on
the host heap in Triton's interpreter, at tiny sizes, it writes a result of
the one schema with every collective, its algorithm and a device-local copy
baseline. No timing is asserted.

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/device/test_ccl_bench.py
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton", reason="needs triton (pip install triton)")

BACKEND = os.environ.get("SHMEMVM_TEST_BACKEND", "host")
pytestmark = pytest.mark.skipif(
    (BACKEND == "host") != (os.environ.get("TRITON_INTERPRET") == "1"),
    reason="the host heap runs kernels in Triton's interpreter (TRITON_INTERPRET=1), device "
           "heaps run them compiled")


@pytest.mark.mpi
def test_device_ccl_benchmark_writes_every_collective(tmp_path):
    from mpi4py import MPI

    from benchmarks import schema
    from benchmarks.cli import main

    comm = MPI.COMM_WORLD
    directory = comm.bcast(str(tmp_path) if comm.rank == 0 else None, root=0)
    path = os.path.join(directory, "ccl.json")
    assert main(["device-ccl", "--quick", "--backend", BACKEND, "--sizes", "256",
                 "--repeat", "1", "--min-time", "0", "--json", path], comm=comm) == 0
    comm.Barrier()
    doc = schema.load(path)
    assert schema.validate(doc, stored=False) == []
    assert doc["benchmark"] == "device-ccl" and doc["settings"]["n_pes"] == comm.size
    assert doc["settings"]["interpreted"] == (BACKEND == "host")
    records = doc["measurements"]
    assert {r["name"] for r in records} == {f"device-ccl.{op}" for op in (
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "all_to_all_v")}
    for r in records:
        assert r["value"]["median"] > 0 and r["baseline"]["value"]["median"] > 0
        assert r["baseline"]["name"].startswith("device-local copy")
        assert r["params"]["algorithm"]
    forced = {(r["name"], r["params"]["config"]): r["params"]["algorithm"] for r in records}
    assert forced[("device-ccl.all_reduce", "two_shot")] == "two_shot"
    assert forced[("device-ccl.all_gather", "push")] == "push"
    assert forced[("device-ccl.all_gather", "pull")] == "pull"
