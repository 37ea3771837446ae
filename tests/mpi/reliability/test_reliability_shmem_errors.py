"""Issue 25, item 8, through the NumPy face (shmemvm.shmem): a zero stride is
named as the face names it (tst), and alloc() with two negative factors is a
ValueError, not 64 bytes.

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/reliability/test_reliability_shmem_errors.py
"""

from __future__ import annotations

import pytest

from shmemvm import FreedTensorError, rc

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


def test_shmem_errors_about_a_freed_array_name_its_role_once(default_heap):
    """Issue 32, item 16: the NumPy face's messages read "the the target"."""
    flags = shmem.zeros(4, dtype="i8")
    view = flags[:1]
    shmem.barrier_all()
    shmem.free(flags)
    for call, role in ((lambda: shmem.wait_until(view, shmem.CMP.EQ, 0), "ivar"),
                       (lambda: shmem.atomic_fetch(view, shmem.my_pe()), "target"),
                       (lambda: shmem.set_lock(view), "lock")):
        with pytest.raises(FreedTensorError) as raised:
            call()
        message = str(raised.value)
        assert "the the" not in message, message
        assert message.startswith(f"the {role} must be a live symmetric"), message
