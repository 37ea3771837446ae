"""Shared fixtures. MPI tests carry the `mpi` marker (pytest-mpi) and run under
`mpirun -n N python -m pytest --with-mpi -m mpi`; the rest run in one process."""

import gc

import pytest


@pytest.fixture
def heap():
    """A fresh host-backend symmetric heap over COMM_WORLD, finalized after the test."""
    from mpi4py import MPI

    from shmemvm import SymmetricHeap

    h = SymmetricHeap(MPI.COMM_WORLD, heap_size="64M", backend="host", timeout=30)
    yield h
    gc.collect()
    h.finalize()
