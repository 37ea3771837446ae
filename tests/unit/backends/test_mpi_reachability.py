"""Whether MPI can reach a heap's memory (the off-node path) is an attribute of
its backend, which a new backend must set to get MPI. The off-node path
itself, under MPI: tests/mpi/transport/test_multinode.py.
"""


def test_mpi_reachability_is_a_backend_attribute():
    from shmemvm.backends.base import VMMBackend
    from shmemvm.backends.cuda import CudaBackend
    from shmemvm.backends.hip import HipBackend
    from shmemvm.backends.host import HostBackend

    assert HostBackend.mpi_accessible is True
    assert CudaBackend.mpi_accessible is False and HipBackend.mpi_accessible is False
    assert VMMBackend.mpi_accessible is False  # a new backend must say so to get MPI
