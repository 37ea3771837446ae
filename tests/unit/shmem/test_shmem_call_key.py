"""The NumPy face's memo key of a collective call (issue 30): native.call_key
(_collective.c, one call) is a shortcut of python_key, never a second
definition. On every array it is given it returns python_key's very tuple,
or steps aside (None) where python_key must decide; _call_key, which the
collectives use, equals python_key on every input; and the entry point
refuses what it is given wrongly with an error, never a crash. No heap: the
arrays lie over HeapMemory objects of plain tensors, as the face's do."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from shmemvm import native, rc

rc(initialize=False, finalize=False)  # importing shmem makes no heap here
from shmemvm.shmem import arrays, collectives  # noqa: E402

pytestmark = pytest.mark.skipif(native.call_key is None, reason="_collective is not built")


def _whole(nbytes: int = 256) -> np.ndarray:
    """A uint8 array over a whole allocation, as the face makes one."""
    return arrays.over(torch.zeros(nbytes, dtype=torch.uint8))


def _native(target, source, values=(0, None), group_id=None):
    return native.call_key("broadcast", group_id, values, target, source, np.ndarray,
                           arrays.HeapMemory)


def _python(target, source, values=(0, None), group=None):
    return collectives.python_key("broadcast", group, target, source, *values)


def _layouts(whole: np.ndarray) -> list[np.ndarray]:
    readonly = whole[16:48]
    readonly.flags.writeable = False
    return [whole, whole[8:40].view(np.float64), whole[3:19], whole[40:0:-1], whole[::7],
            whole.view(np.int32).reshape(8, 8)[1:5, ::3], whole.view(np.int32).reshape(8, 8).T,
            whole[:64].reshape(8, 8, order="F")[:, 1:3], whole.view(np.int64)[:0], whole[:0], whole.view(np.int16)[5:6].reshape(()),
            readonly, whole[:32].view(np.complex128), whole[255:], whole[-8:].view(np.int64)]


def test_the_native_key_is_python_keys_tuple_for_every_layout_over_the_heap():
    whole = _whole()
    layouts = _layouts(whole)
    for target in layouts:
        for source in layouts:
            key = _native(target, source)
            assert key is not None, (target.shape, target.strides)
            assert key == _python(target, source)
            assert type(key[2]) is int and key[5] is target.dtype and key[6] is \
                target.flags.writeable


def test_values_team_and_kind_land_where_plan_key_puts_them():
    whole = _whole()
    for values in [(0, None), (3, 17), ("sum", None), (), (1, 2, 3, "max")]:
        for group in (None, object()):
            key = native.call_key("reduce", None if group is None else id(group), values,
                                  whole, whole, np.ndarray, arrays.HeapMemory)
            assert key == collectives.python_key("reduce", group, whole, whole, *values)


def test_a_value_python_key_refuses_is_refused_natively_too():
    whole = _whole()
    for values in [(1.0, None), (np.int64(1), None), (True, None), (0, [1])]:
        assert _python(whole, whole, values) is None
        assert _native(whole, whole, values) is None


def test_arrays_that_are_not_heap_memory_have_no_key_on_either_path():
    whole = _whole()

    class Sub(np.ndarray):
        pass

    heap = SimpleNamespace(where=SimpleNamespace(call_key=native.call_key))
    # (whole[::-2] starts at its last byte: its bytes seem to run past the allocation)
    others = [np.zeros(8), whole.copy(), whole.view(Sub), whole[::-2],
              np.lib.stride_tricks.as_strided(whole, (4,), (1,))]
    for other in others:
        for target, source in ((other, whole), (whole, other)):
            assert _native(target, source) is None
            assert collectives._call_key(heap, "broadcast", None, target, source, 0, None) is None


def test_what_only_python_can_follow_is_left_to_python():
    """A base chain through a memoryview, or ending at a HeapMemory subclass:
    python_key has a key; call_key steps aside, and _call_key gives Python's."""
    whole = _whole()

    class Memory(arrays.HeapMemory):
        pass

    through_view = np.asarray(memoryview(whole))[4:12]
    subclassed = np.asarray(Memory(torch.zeros(64, dtype=torch.uint8)))
    heap = SimpleNamespace(where=SimpleNamespace(call_key=native.call_key))
    for array in (through_view, subclassed):
        assert _python(array, whole) is not None
        assert _native(array, whole) is None
        assert collectives._call_key(heap, "broadcast", None, array, whole, 0, None) == \
            _python(array, whole)


def test_call_key_equals_python_key_on_random_views_either_way():
    rng = random.Random(30)
    whole = _whole(512)
    dtypes = [np.uint8, np.int16, np.float32, np.int64, np.complex64]
    keys = 0
    for native_on in (True, False):
        maker = native.call_key if native_on else None
        heap = SimpleNamespace(where=SimpleNamespace(call_key=maker))
        for _ in range(300):
            views = []
            for _ in range(2):
                dtype = np.dtype(rng.choice(dtypes))
                typed = whole.view(dtype)
                start = rng.randrange(len(typed))
                stop = rng.randrange(start, len(typed) + 1)
                views.append(typed[start:stop:rng.choice([1, 2, 3, -1])])
            values = (rng.choice([0, 1, None, "sum", 2.5]), rng.choice([None, 4]))
            key = collectives._call_key(heap, "fcollect", None, *views, *values)
            assert key == collectives.python_key("fcollect", None, *views, *values)
            keys += key is not None
    assert keys > 200     # (most of them have one: the keys themselves were compared)


def test_the_import_probe_found_the_native_key_agrees():
    assert collectives.NATIVE_KEY is True
    assert collectives._native_key_agrees() is True


def test_bad_calls_are_errors_not_crashes():
    whole = _whole()
    with pytest.raises(TypeError):
        native.call_key("k", None, (0,), whole, whole, np.ndarray)           # 6 arguments
    with pytest.raises(TypeError):
        native.call_key("k", None, [0], whole, whole, np.ndarray, arrays.HeapMemory)
    with pytest.raises(TypeError):
        native.call_key("k", None, (), whole, whole, np.ndarray, "HeapMemory")

    class Impostor:            # not NumPy's array type: its fields are not read
        pass

    with pytest.raises(TypeError, match="numpy.ndarray"):
        native.call_key("k", None, (), Impostor(), whole, Impostor, arrays.HeapMemory)

    class Memory:              # a "memory" whose address is no address
        def __init__(self, address, nbytes=64):
            self.address, self.nbytes = address, nbytes
            self.__array_interface__ = {"data": (whole.ctypes.data, False), "shape": (nbytes,),
                                        "typestr": "|u1", "version": 3}

    for address in ("x", -1, None):
        over = np.asarray(Memory(address))
        with pytest.raises((TypeError, ValueError)):
            native.call_key("k", None, (), over, over, np.ndarray, Memory)
    far = np.asarray(Memory(whole.ctypes.data + 4096))     # not where its bytes are
    assert native.call_key("k", None, (), far, far, np.ndarray, Memory) is None


def test_a_reading_that_disagrees_with_numpy_turns_the_native_key_off(monkeypatch):
    monkeypatch.setattr(native, "call_key", lambda *args: ("another", "key"))
    assert collectives._native_key_agrees() is False

    def refuses(*args):
        raise TypeError("call_key: ndarray must be numpy.ndarray, got numpy.ndarray2")

    monkeypatch.setattr(native, "call_key", refuses)
    assert collectives._native_key_agrees() is False
    monkeypatch.setattr(native, "call_key", None)
    assert collectives._native_key_agrees() is False
