"""Every setting is checked at init, from config.SETTINGS, as the arguments are:
a bad value on every PE is a ValueError on every PE naming it; on one PE only,
the others raise SymmetryError naming it ("rejected here"), not a hang
(issue 32 item 14: SHMEMVM_DEBUG=abc, SHMEMVM_PROFILE=abc and SHMEMVM_DEVICE=abc
on a host heap were accepted).

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/core/test_settings_checked_at_init.py
"""

import pytest
from mpi4py import MPI

from shmemvm import SymmetricHeap, SymmetryError

world = MPI.COMM_WORLD


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["SHMEMVM_DEBUG", "SHMEMVM_PROFILE", "SHMEMVM_DEVICE"])
def test_a_bad_setting_on_every_pe_is_refused_by_a_host_heap(monkeypatch, name):
    monkeypatch.setenv(name, "abc")
    with pytest.raises(ValueError, match=rf"{name} must be .*, got 'abc'") as info:
        SymmetricHeap(world, heap_size="4M", backend="host", timeout=20)
    assert type(info.value) is ValueError
    monkeypatch.delenv(name)
    SymmetricHeap(world, heap_size="4M", backend="host", timeout=20).finalize()


@pytest.mark.mpi(min_size=2)
def test_a_bad_setting_on_one_pe_is_a_symmetry_error_on_the_others(monkeypatch):
    last = world.size - 1
    if world.rank == last:
        monkeypatch.setenv("SHMEMVM_DEBUG", "abc")
    with pytest.raises((SymmetryError, ValueError)) as info:
        SymmetricHeap(world, heap_size="4M", backend="host", timeout=20)
    if world.rank != last:
        assert type(info.value) is SymmetryError
    assert "SHMEMVM_DEBUG must be 0 or 1, got 'abc'" in str(info.value), str(info.value)
    monkeypatch.delenv("SHMEMVM_DEBUG", raising=False)
    SymmetricHeap(world, heap_size="4M", backend="host", timeout=20).finalize()
