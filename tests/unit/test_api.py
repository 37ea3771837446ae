"""The public API is declared once: each routine is a function of an openshmem/
module (or a HeapCore method) with its real signature and docstring;
SymmetricHeap and Ctx bind those functions by name; shmemvm's module
functions are written out in api.py with the same signature less the heap,
and show the routine's docstring."""

from __future__ import annotations

import inspect
import pydoc

import pytest
import torch

import shmemvm
from shmemvm import Ctx, SymmetricHeap, api
from shmemvm.core.state import HeapCore
from shmemvm.openshmem import info

#: the heap's public methods that are not module functions, and why
NOT_MODULE_FUNCTIONS = {
    "finalize": "the module's finalize() releases the default heap itself",
    "close": "finalize() under the name context managers use",
}

#: what a heap is, beside its routines (properties; `ccl` is the device collectives)
HEAP_PROPERTIES = {"my_pe", "n_pes", "node_pes", "comm", "device", "backend", "heap_size",
                   "timeout", "native", "closed", "ccl"}


def _public_methods(cls) -> dict[str, object]:
    members = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name in vars(klass):
            value = getattr(cls, name)   # (a heap's routine: the function it binds)
            if not name.startswith("_") and callable(value) and not isinstance(value, type):
                members[name] = value
    return members


def test_every_heap_routine_is_a_module_function_with_its_signature():
    heap_methods = _public_methods(SymmetricHeap)
    routines = {name: fn for name, fn in heap_methods.items() if name not in NOT_MODULE_FUNCTIONS}
    assert set(routines) <= set(api.__all__), set(routines) - set(api.__all__)
    for name, method in routines.items():
        function = getattr(shmemvm, name)
        assert function is getattr(api, name), name
        expected = list(inspect.signature(method).parameters.values())[1:]   # less the heap
        assert list(inspect.signature(function).parameters.values()) == expected, name
        assert inspect.signature(function).return_annotation == \
            inspect.signature(method).return_annotation, name
        assert function.__doc__ == method.__doc__, name
    # and nothing in api.__all__ that the heap does not have, but the heap-less ones
    extra = set(api.__all__) - set(routines)
    assert extra == {"init", "finalize", "default_heap", "current_heap", "my_pe", "n_pes",
                     "info_get_version", "info_get_name", "pcontrol", "global_exit"}, extra


def test_dir_of_a_heap_is_its_api():
    """A heap shows its API and nothing else: the routines (every one a
    module function of api.py, but finalize and close), what it is, and its
    lifetime; its core (agreement, memory, peers, ...) is private."""
    public = {name for name in dir(SymmetricHeap) if not name.startswith("_")}
    routines = public - HEAP_PROPERTIES - set(NOT_MODULE_FUNCTIONS)
    assert routines == set(api.__all__) - {
        "init", "finalize", "default_heap", "current_heap", "my_pe", "n_pes",
        "info_get_version", "info_get_name", "pcontrol", "global_exit"}, \
        routines ^ (set(api.__all__))
    assert public >= HEAP_PROPERTIES | set(NOT_MODULE_FUNCTIONS)
    for internal in ("local", "peers", "agreement", "routes", "window", "feature", "agree",
                     "check_usable", "symmetric", "lock", "liveness", "channel"):
        assert internal not in public, internal


def test_dir_of_a_heap_object_is_the_same_api(heap):
    """An instance shows what its class shows (its core is private: `_core`),
    and each routine on it is bound, with the routine's signature less the core."""
    assert {name for name in dir(heap) if not name.startswith("_")} == \
        {name for name in dir(SymmetricHeap) if not name.startswith("_")}
    assert list(inspect.signature(heap.put).parameters) == ["dest", "source", "pe"]
    assert heap.put.__doc__ == SymmetricHeap.put.__doc__


def test_the_heap_binds_each_routine_as_written():
    """SymmetricHeap's methods are the openshmem functions themselves (or the
    core's), not wrappers: one declaration, one docstring."""
    for name, method in _public_methods(SymmetricHeap).items():
        if name in NOT_MODULE_FUNCTIONS:
            continue
        module = method.__module__
        assert module.startswith("shmemvm.openshmem.") or \
            getattr(method, "__wrapped__", method) is getattr(HeapCore, name), \
            (name, module)
        doc = method.__doc__
        assert "Returns:" in doc and "Raises:" in doc, name
        parameters = list(inspect.signature(method).parameters)[1:]
        if parameters:
            assert "Args:" in doc, name
        for parameter in parameters:
            assert f"{parameter}:" in doc or f"{parameter}," in doc, (name, parameter)


def test_contexts_issue_the_same_routines():
    one_sided = [name for name, method in _public_methods(SymmetricHeap).items()
                 if "pe" in inspect.signature(method).parameters
                 and name not in ("ptr", "check_pe", "world_pe")]
    assert {"put", "get", "put_nbi", "get_nbi", "iput", "iget", "atomic_fetch_add",
            "atomic_compare_swap_nbi", "put_signal"} <= set(one_sided)
    for name in one_sided:
        assert getattr(Ctx, name) is getattr(SymmetricHeap, name), name


def test_no_private_parameter_in_a_public_signature():
    for name in api.__all__:
        function = getattr(shmemvm, name)
        if inspect.isfunction(function):
            assert not [p for p in inspect.signature(function).parameters if p.startswith("_")], \
                name


def test_put_help_is_useful():
    text = pydoc.render_doc(shmemvm.put, renderer=pydoc.plaintext)
    assert "put(dest: 'torch.Tensor', source: 'torch.Tensor', pe: 'int') -> 'None'" in text
    assert "PeerTimeoutError" in text and "heap" not in str(inspect.signature(shmemvm.put))


def test_heap_less_functions_are_documented():
    for name in ("info_get_version", "info_get_name", "pcontrol", "global_exit"):
        assert getattr(shmemvm, name) is getattr(info, name), name
        doc = getattr(info, name).__doc__
        assert "Returns:" in doc and "Raises:" in doc, name


def test_forwarders_without_a_heap_say_to_call_init():
    with pytest.raises(shmemvm.ShmemError, match=r"call shmemvm.init\(\) first"):
        shmemvm.atomic_fetch_add(torch.zeros(1, dtype=torch.int64)[0], 1, 0)
    with pytest.raises(shmemvm.ShmemError, match=r"call shmemvm.init\(\) first"):
        shmemvm.my_pe()
    assert shmemvm.current_heap() is None


def test_names_kept():
    assert shmemvm.test.__test__ is False and shmemvm.test_all.__test__ is False
    assert shmemvm.calloc.__name__ == "calloc" and shmemvm.calloc.__doc__ == \
        SymmetricHeap.zeros.__doc__
    missing = [name for name in shmemvm.__all__ if not hasattr(shmemvm, name)]
    assert not missing
