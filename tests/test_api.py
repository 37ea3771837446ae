"""The module API: each function is written once (in heap.py, atomics.py or
collectives.py), the heap binds atomics and collectives as they are, and
shmemvm's module functions are generated forwarders that show the real
signature and docstring in help()."""

from __future__ import annotations

import inspect
import pydoc

import pytest
import torch

import shmemvm
from shmemvm import SymmetricHeap, api
from shmemvm.openshmem import atomics
from shmemvm.openshmem import collectives
from shmemvm.openshmem import info
from shmemvm.openshmem import locks
from shmemvm.openshmem import strided
from shmemvm.openshmem import waits as sync
from shmemvm.openshmem import teams

def test_api_module_defines_only_init_finalize_default_heap_and_forwarders():
    own = {name for name, value in vars(api).items()
           if inspect.isfunction(value) and value.__module__ == api.__name__
           and not name.startswith("_")}
    assert own == {"init", "finalize", "default_heap", "my_pe", "n_pes", *api.FORWARDED}
    for name in api.FORWARDED:
        assert getattr(shmemvm, name) is getattr(api, name), name
    for name in api.NOT_HEAP:  # written once, in info.py
        assert getattr(shmemvm, name) is getattr(info, name), name
        doc = getattr(info, name).__doc__
        assert "Returns:" in doc and "Raises:" in doc, name


def test_atomics_and_collectives_are_the_heaps_methods_as_defined():
    for name in ("atomic_fetch", "atomic_add", "atomic_compare_swap", "wait_until", "test",
                 "put_signal", "signal_fetch", "signal_wait_until"):
        assert vars(SymmetricHeap)[name] is getattr(atomics, name), name
    for name in ("broadcast", "fcollect", "reduce", "alltoall", "collect", "alltoalls"):
        assert vars(SymmetricHeap)[name] is getattr(collectives, name), name
    for name in api.FORWARDED:
        if name.startswith("team_"):
            assert vars(SymmetricHeap)[name] is getattr(teams, name), name
    for name in api.FORWARDED:
        if name.endswith("_nbi") and name.startswith(("atomic_", "put_signal")):
            assert vars(SymmetricHeap)[name] is getattr(atomics, name), name
        elif name.startswith(("wait_until_", "test_")) and name != "test_lock":
            assert vars(SymmetricHeap)[name] is getattr(sync, name), name
    for name in ("iput", "iget"):
        assert vars(SymmetricHeap)[name] is getattr(strided, name), name
    for name in ("set_lock", "clear_lock", "test_lock"):
        assert vars(SymmetricHeap)[name] is getattr(locks, name), name


@pytest.mark.parametrize("name", api.FORWARDED)
def test_forwarder_shows_the_methods_signature_and_docstring(name):
    function, method = getattr(shmemvm, name), getattr(SymmetricHeap, name)
    assert function.__name__ == name and function.__doc__ == method.__doc__
    public = [p for p in list(inspect.signature(method).parameters.values())[1:]
              if not p.name.startswith("_")]
    assert list(inspect.signature(function).parameters.values()) == public
    text = pydoc.render_doc(function, renderer=pydoc.plaintext)
    assert f"{name}(" in text and "heap" not in str(inspect.signature(function))
    assert "Returns:" in method.__doc__ and "Raises:" in method.__doc__, name
    if public:
        assert "Args:" in method.__doc__, name
    for parameter in public:
        assert f"{parameter.name}:" in method.__doc__, (name, parameter.name)


def test_put_help_is_useful():
    text = pydoc.render_doc(shmemvm.put, renderer=pydoc.plaintext)
    assert "put(dest: 'torch.Tensor', source: 'torch.Tensor', pe: 'int')" in text
    assert "_blocking" not in text and "PeerTimeoutError" in text


def test_forwarders_without_a_heap_say_to_call_init():
    with pytest.raises(shmemvm.ShmemError, match=r"call shmemvm.init\(\) first"):
        shmemvm.atomic_fetch_add(torch.zeros(1, dtype=torch.int64)[0], 1, 0)
    with pytest.raises(shmemvm.ShmemError, match=r"call shmemvm.init\(\) first"):
        shmemvm.my_pe()


def test_names_kept():
    assert shmemvm.test.__test__ is False and shmemvm.test_all.__test__ is False
    assert shmemvm.calloc.__name__ == "calloc" and shmemvm.calloc.__doc__ == \
        SymmetricHeap.zeros.__doc__
    missing = [name for name in shmemvm.__all__ if not hasattr(shmemvm, name)]
    assert not missing


@pytest.mark.mpi(min_size=1)
def test_forwarders_call_the_default_heap():
    with shmemvm.init(heap_size="4M", backend="host", timeout=30) as heap:
        assert shmemvm.default_heap() is heap
        assert (shmemvm.my_pe(), shmemvm.n_pes()) == (heap.my_pe, heap.n_pes)
        counter = shmemvm.zeros(2, torch.int64)
        assert shmemvm.atomic_fetch_add(counter[1], 5, shmemvm.my_pe()) == 0
        assert shmemvm.atomic_fetch(counter[1], shmemvm.my_pe()) == 5
        shmemvm.put(counter[:1], torch.tensor([7]), shmemvm.my_pe())
        assert counter.tolist() == [7, 5]
        assert shmemvm.heap_info()["live_allocations"] == 1
        shmemvm.free(counter)
        shmemvm.barrier_all()
