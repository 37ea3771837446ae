"""Shared fixtures. MPI tests carry the `mpi` marker (pytest-mpi) and run under
`mpirun -n N python -m pytest --with-mpi -m mpi`; the rest run in one process."""

import gc
import os

import pytest

#: backend the heap tests run on: host by default (CI); SHMEMVM_TEST_BACKEND=cuda on GPUs
TEST_BACKEND = os.environ.get("SHMEMVM_TEST_BACKEND", "host")


def pytest_collection_modifyitems(config, items):
    """Modules that run on TEST_BACKEND (they import it) skip where it cannot run."""
    import shmemvm.backends

    if TEST_BACKEND == "host" or shmemvm.backends.available(TEST_BACKEND):
        return
    skip = pytest.mark.skip(reason=f"SHMEMVM_TEST_BACKEND={TEST_BACKEND}: that backend cannot "
                                   f"run here (no device, or its Python bindings are missing)")
    for item in items:
        if getattr(item.module, "TEST_BACKEND", None) is not None:
            item.add_marker(skip)


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
