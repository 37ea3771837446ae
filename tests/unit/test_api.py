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
    "check_usable": "the core's state check, for the routines and faces",
    "check_pe": "the core's argument check, for the routines and faces",
    "symmetric": "the core's lookup of a tensor's block, for the routines and faces",
    "symmetric_contiguous": "the collectives' operand check, for the routines",
    "offset_of": "the core's heap offset of a tensor, for the routines and faces",
    "world_pe": "the default context's PE mapping (core/state.py's Context)",
    "window_for": "the core's MPI window, for the routines",
    "agree": "one agreed step of a collective, for the routines",
    "release_dead": "the agreement's callback",
    "feature": "a routine module's per-heap state", "made_feature": "the same, if made",
    "close_features": "teardown", "add_tracker": "contexts register their trackers",
    "drop_tracker": "the same, at destroy", "quiet_all": "every context's quiet (free, finalize)",
    "map_new": "this PE's part of sharing new memory (core/sharing.py)",
}


def _public_methods(cls) -> dict[str, object]:
    members = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, value in vars(klass).items():
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


def test_the_heap_binds_each_routine_as_written():
    """SymmetricHeap's methods are the openshmem functions themselves (or the
    core's), not wrappers: one declaration, one docstring."""
    for name, method in _public_methods(SymmetricHeap).items():
        if name in NOT_MODULE_FUNCTIONS:
            continue
        module = method.__module__
        assert module.startswith("shmemvm.openshmem.") or method is getattr(HeapCore, name), \
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
