"""Shared fixtures. MPI tests carry the `mpi` marker (pytest-mpi) and run under
`mpirun -n N python -m pytest --with-mpi -m mpi`; the rest run in one process.
Tests that need a GPU carry the `gpu` marker. The markers decide how a test
runs; the folders (unit/, mpi/, gpu/, each by the library's layers) are for
people, and a test whose folder does not match its markers fails collection."""

import gc
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# util.py and helpers/ live here, above the test folders that import them.
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

#: backend the heap tests run on: host by default (CI); SHMEMVM_TEST_BACKEND=cuda on GPUs
TEST_BACKEND = os.environ.get("SHMEMVM_TEST_BACKEND", "host")

# On the host backend, Triton kernels (shmemvm.triton, the device atomics) run in
# Triton's interpreter, which reaches the host heap's peer windows. Triton reads
# this when a kernel is decorated, so it is decided here, once for the whole
# process, before any test module imports triton: test modules that set it
# themselves would make the outcome depend on the order they are collected in.
if TEST_BACKEND == "host":
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    """A test backend asked for that cannot run here fails the run at once: skipping
    every test that uses it would report a green run that tested nothing."""
    import shmemvm.backends

    names = sorted(shmemvm.backends._REGISTRY)
    if TEST_BACKEND not in names:
        raise pytest.UsageError(f"SHMEMVM_TEST_BACKEND={TEST_BACKEND!r} is not a backend; "
                                f"choose one of {', '.join(names)}")
    if not shmemvm.backends.available(TEST_BACKEND):
        raise pytest.UsageError(
            f"SHMEMVM_TEST_BACKEND={TEST_BACKEND} was asked for, but that backend cannot run "
            f"here (no device, or its Python bindings are missing: `python -m shmemvm info` "
            f"says which). Unset SHMEMVM_TEST_BACKEND to test the host backend")


#: run_all.sh's progress file for this process: the test running now; at the end,
#: the exit status and every skip with its reason (run_all.sh checks them against
#: tests/skip_budget, and names the running tests when a phase outlives its limit)
PROGRESS = os.environ.get("SHMEMVM_TEST_PROGRESS")
_skips: list[str] = []


def pytest_runtest_logstart(nodeid, location):
    if PROGRESS:
        Path(PROGRESS).write_text(f"running {nodeid}\n")


def pytest_runtest_logreport(report):
    if PROGRESS and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _skips.append(f"skip {report.nodeid}: {str(reason).removeprefix('Skipped: ')}")


def pytest_sessionfinish(session, exitstatus):
    if PROGRESS:
        Path(PROGRESS).write_text("\n".join([f"exit status {int(exitstatus)}",
                                             f"skipped {len(_skips)}", *_skips]) + "\n")


def pytest_collection_finish(session):
    """What collection imported (torch, triton, numpy, the test modules) lives for
    the whole session: frozen out of the collector's way, each gc.collect() (the
    heap fixture runs one per test, tests many more) scans only what the tests
    made since. Measured on the 2-core machine: 0.6-0.8 s a collection before,
    under 1 ms after."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)   # before -m deselects: every collected test is checked
def pytest_collection_modifyitems(config, items):
    """A test lives in the folder of its kind: gpu/ with the `gpu` marker, else
    mpi/ with the `mpi` marker, else unit/, or jobs/ where it starts MPI jobs of
    its own (run_all.sh's `jobs` phase; test_run_all.py keeps them out of unit/)."""
    misplaced = []
    for item in items:
        try:
            folder = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue   # not one of ours
        marks = {mark.name for mark in item.iter_markers()}
        kind = "gpu" if "gpu" in marks else "mpi" if "mpi" in marks else "unit"
        if folder != kind and not (kind == "unit" and folder == "jobs"):
            where = "tests/unit/ (or tests/jobs/)" if kind == "unit" else f"tests/{kind}/"
            misplaced.append(f"  {item.nodeid}: marked {kind}, so it belongs under {where}")
    if misplaced:
        raise pytest.UsageError("tests in the wrong folder (move them, or change their "
                                "markers):\n" + "\n".join(misplaced))


@pytest.fixture
def heap(request):
    """A fresh symmetric heap over COMM_WORLD, finalized after the test: 64 MiB on
    TEST_BACKEND, 30 s timeout, unless the test module's HEAP_OPTIONS say otherwise
    (the reliability tests pin backend="host")."""
    from mpi4py import MPI

    from shmemvm import SymmetricHeap

    options = {"heap_size": "64M", "backend": TEST_BACKEND, "timeout": 30}
    options.update(getattr(request.module, "HEAP_OPTIONS", {}))
    h = SymmetricHeap(MPI.COMM_WORLD, **options)
    yield h
    gc.collect()
    h.finalize()


@pytest.fixture(scope="session", autouse=True)
def _mpich_files_of_ended_jobs():
    """Remove, at the end of the session, the /dev/shm/mpich_shm_* files that
    the jobs its tests started left (a job ending without MPI_Finalize leaves
    one): those made since the session started whose job is gone
    (helpers/mpich_shm.py; a running job's, this session's own, stay)."""
    from helpers import mpich_shm

    before = mpich_shm.snapshot()
    yield
    mpich_shm.remove_orphans(before, settle=True)
