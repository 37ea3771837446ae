"""profile.py: per-step timing of a heap's allocation path.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/core/test_profile.py
"""

import time

import pytest
from mpi4py import MPI

from shmemvm import SymmetricHeap
from shmemvm.core import profile
from shmemvm.core.state import parts_of

WORLD = MPI.COMM_WORLD
KiB, MiB = 1 << 10, 1 << 20
HEAP_OPTIONS = {"heap_size": "16M", "backend": "host"}


@pytest.mark.mpi(min_size=1)
def test_fresh_malloc_steps_are_timed_and_add_up(heap):
    with profile.instrumented(heap._core) as timed:
        heap.trim()
        WORLD.Barrier()
        with timed.measuring():
            t0 = time.perf_counter_ns()
            x = heap.malloc(1 * MiB)
            total = time.perf_counter_ns() - t0
        heap.free(x)
        steps = timed.breakdown(total, 1)
        counts = timed.totals()
    # a fresh segment is created, then (once sent to the peers) mapped and made
    # accessible here, inside the exchange, and attached to the MPI window
    for step in ("agreement", "allocate", "allocate/create", "exchange", "exchange/map_new",
                 "exchange/map_new/map", "exchange/map_new/set_access",
                 "exchange/map_new/window_attach", "tensor"):
        assert steps[step] > 0, (step, steps)
    assert counts["allocate/create"]["calls"] == 1
    assert counts["exchange/map_new/map"]["calls"] == 1
    # two agreements: the call's own and the one vote after the exchange
    assert counts["agreement"]["calls"] == 2, counts
    if heap.n_pes > 1:  # exported to every other PE and theirs mapped here
        assert counts["exchange/peer_map"]["calls"] == heap.n_pes - 1
        assert counts["exchange/export/export_fd"]["calls"] == 1
    else:               # nobody to export to
        assert "exchange/export" not in counts, counts
    # the top-level steps and the rest make up the caller's total
    top = sum(v for k, v in steps.items() if "/" not in k and k not in ("total",))
    assert abs(top - steps["total"]) < 1e-6 * steps["total"] + 1e-3
    assert steps["python"] >= 0
    # free() and trim() ran outside measuring(): not counted
    assert "retire" not in counts and "finish_free" not in counts


@pytest.mark.mpi(min_size=1)
def test_cached_malloc_has_no_backend_steps(heap):
    heap.free(heap.malloc(4 * KiB))  # now cached
    with profile.instrumented(heap._core) as timed:
        with timed.measuring():
            x = heap.malloc(4 * KiB)
        heap.free(x)
        counts = timed.totals()
    assert set(counts) >= {"agreement", "allocate", "tensor"}
    assert not any("create" in k or "exchange" in k for k in counts), counts


@pytest.mark.mpi(min_size=1)
def test_uninstrumented_heap_runs_its_own_methods(heap):
    with profile.instrumented(heap._core) as timed:
        assert hasattr(heap.backend.create, "__shmemvm_profiled__")
    # after the block, nothing of the wrapper is left on any object
    for obj in (parts_of(heap).agreement, parts_of(heap).local, heap.backend):
        assert not any(hasattr(v, "__shmemvm_profiled__") for v in vars(obj).values())
    assert profile.of(heap._core) is None
    timed.reset()
    heap.free(heap.malloc(64 * KiB))
    assert timed.totals() == {}
