"""Issue 25, item 8, through the NumPy face (shmemvm.shmem): a zero stride is
named as the face names it (tst), and alloc() with two negative factors is a
ValueError, not 64 bytes.

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/reliability/test_reliability_shmem_errors.py
"""

from __future__ import annotations

import pytest

from shmemvm import rc

rc(initialize=False, finalize=False)  # as tests/mpi/shmem/test_shmem_layer.py: heaps made per test
from shmemvm import shmem  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture
def default_heap():
    shmem.init()
    yield
    shmem.finalize()


def test_shmem_iput_with_a_zero_stride_names_it(default_heap):
    target = shmem.zeros(8, dtype="i8")
    try:
        with pytest.raises(ValueError, match="tst"):
            shmem.iput(target, shmem.array(range(8), dtype="i8"), shmem.my_pe(), tst=0)
    finally:
        shmem.barrier_all()
        shmem.free(target)


def test_shmem_alloc_with_two_negative_factors_is_a_value_error(default_heap):
    with pytest.raises(ValueError, match="count|size"):
        shmem.alloc(-4, -16)    # (once allocated 64 bytes)
