"""The allocator's cached branch in C (native/blocks.c, issue 30) against the
Python path it shortcuts: the same requests on two engines, one with the
compiled CachedBlocks and one without, leave the same allocator state, the same
records and the same addresses after every step; every case the branch is not
for (odd sizes, large blocks, full quick lists, imported memory, unknown
offsets) is left to the Python path with nothing done."""

from __future__ import annotations

import gc
import random
import types

import numpy as np
import pytest
import torch

from shmemvm import VMemPow2Allocator, native
from shmemvm.errors import HeapExhaustedError
from shmemvm.memory import buddy, ownership

pytestmark = pytest.mark.skipif(native._native is None,
                                reason="the compiled piece is not built (pip install . builds it)")

G = 64 * 1024           # the host backend's granularity here
CHUNK = 4 * G


def _engine(monkeypatch, compiled: bool) -> VMemPow2Allocator:
    with monkeypatch.context() as patch:
        patch.setattr(native, "CachedBlocks", native._native.CachedBlocks if compiled else None)
        engine = VMemPow2Allocator(64 * G, backend="host", granularity=G, chunk=CHUNK)
    assert (engine._cached is not None) == compiled
    return engine


@pytest.fixture
def pair(monkeypatch):
    engines = (_engine(monkeypatch, True), _engine(monkeypatch, False))
    yield engines
    for engine in engines:
        engine.close()


def _state(engine: VMemPow2Allocator) -> tuple:
    records = sorted((offset, record.block, record.freed, record.own_alive)
                     for offset, record in engine._records.items())
    return engine._core.state(), records, sorted(engine._dead), engine.stats()


def _offset(engine, tensor) -> int:
    return tensor.untyped_storage().data_ptr() - engine.base


SIZES = [0, 1, 63, 64, 65, 100, 1000, 1024, 4096, 5000, CHUNK // 2 - 1, CHUNK // 2,
         CHUNK - 1, CHUNK, CHUNK + 1, 3 * G]
DTYPES = [torch.uint8, torch.float32, torch.int64, torch.bfloat16]


@pytest.mark.parametrize("seed", range(6))
def test_random_requests_leave_both_engines_alike(pair, seed):
    rng = random.Random(seed)
    live: list[tuple[torch.Tensor, torch.Tensor]] = []
    held: list[tuple[torch.Tensor, torch.Tensor]] = []     # views that defer a free
    cached_taken = dead_taken = 0
    for step in range(400):
        action = rng.random()
        if action < 0.55 or not live:
            nbytes, dtype = rng.choice(SIZES), rng.choice(DTYPES)
            count = nbytes // dtype.itemsize
            cached_taken += pair[0]._core.cached_block(count * dtype.itemsize) not in (None, -1)
            made = []
            for engine in pair:
                try:
                    made.append(engine.allocate(count, dtype))
                except HeapExhaustedError:     # (on both, in the same state: checked below)
                    made.append(None)
            assert (made[0] is None) == (made[1] is None), step
            if made[0] is None:
                continue
            assert _offset(pair[0], made[0]) == _offset(pair[1], made[1]), step
            assert made[0].shape == made[1].shape and made[0].dtype == made[1].dtype
            made[0].fill_(step % 251)
            live.append((made[0], made[1]))
        elif action < 0.7 and live:
            # a view outlives the free: the block is deferred, released at its death
            pick = live.pop(rng.randrange(len(live)))
            held.append((pick[0][:1], pick[1][:1]))
            for engine, tensor in zip(pair, pick):
                engine.free(tensor)
        elif action < 0.8 and held:
            held.pop(rng.randrange(len(held)))
            gc.collect()
            if rng.random() < 0.5:
                # its death reported, taken by the compiled take_dead and by the
                # Python one (what a heap's step carries), released on both
                taken = pair[0]._cached.take_dead(), pair[1]._take_dead()
                assert taken[0] == taken[1], f"seed {seed}, step {step}"
                dead_taken += len(taken[0])
                for engine, offsets in zip(pair, taken):
                    for offset in offsets:
                        engine._release(offset)
        else:
            pick = live.pop(rng.randrange(len(live)))
            for engine, tensor in zip(pair, pick):
                engine.free(tensor)
        assert _state(pair[0]) == _state(pair[1]), f"seed {seed}, step {step}"
    assert cached_taken > 20, "the cached branch was hardly taken: the test proves little"
    assert dead_taken > 3, "take_dead hardly found a block: the test proves little"
    for first, second in live:
        for engine, tensor in zip(pair, (first, second)):
            engine.free(tensor)
    held.clear()
    gc.collect()
    pair[0].trim(), pair[1].trim()
    assert _state(pair[0]) == _state(pair[1])


def test_a_full_quick_list_is_merged_by_the_python_path(pair):
    for engine in pair:
        tensors = [engine.allocate(100) for _ in range(buddy.QUICK_LIMIT + 40)]
        for tensor in tensors:
            engine.free(tensor)
        again = [engine.allocate(100) for _ in range(50)]
        for tensor in again:
            engine.free(tensor)
    assert _state(pair[0]) == _state(pair[1])
    assert pair[0]._core._quick_blocks <= buddy.QUICK_LIMIT


def test_requests_the_branch_is_not_for_do_nothing(pair):
    engine = pair[0]
    engine.free(engine.allocate(100))          # a block of 128 on its quick list
    before = _state(engine)
    take = engine._cached.take
    for nbytes in (True, -1, 1 << 70, 100.0, "100", CHUNK, 3 * G, 1 << 40, 5000):
        assert take(nbytes, (1,), torch.uint8) is None, nbytes
        assert _state(engine) == before, nbytes
    seen = []
    assert take(5000, (5000,), torch.uint8, lambda *args: seen.append(args) or "fallback",
                1, "two") == "fallback"
    assert seen == [(1, "two")]
    assert _state(engine) == before
    tensor = take(100, (100,), torch.uint8, pytest.fail)    # the cached one: no fallback
    assert tensor is not None and tensor.shape == (100,)
    assert _offset(engine, tensor) in engine._records
    engine.free(tensor)


def test_a_release_the_branch_is_not_for_does_nothing(pair):
    engine = pair[0]
    large = engine.allocate(CHUNK)
    small = engine.allocate(100)
    before = _state(engine)
    release = engine._cached.release
    for offset in (_offset(engine, large), _offset(engine, small) + 64, 1 << 50, -1, "0", None):
        assert release(offset) is False, offset
        assert _state(engine) == before, offset
    engine.free(large)
    engine.free(small)
    assert _offset(engine, small) not in engine._records


def test_segments_released_and_not_yet_unmapped_leave_the_take_to_python(pair):
    engine = pair[0]
    engine.free(engine.allocate(100))
    engine._core.released.append("a segment still to unmap")   # (what take_released returns)
    try:
        before = _state(engine)
        assert engine._cached.take(100, (100,), torch.uint8) is None
        assert _state(engine) == before
    finally:
        engine._core.released.clear()


def test_the_constructor_checks_what_it_is_given(pair):
    engine = pair[0]
    CachedBlocks = native._native.CachedBlocks
    good = (engine, engine._core, engine.backend.tensor, ownership.record, buddy.Block, 256)
    for at, bad in ((2, None), (3, 5), (4, int), (5, -1)):
        args = list(good)
        args[at] = bad
        with pytest.raises(TypeError):
            CachedBlocks(*args)

    class Shaped:
        """An allocator whose type gives one of the names a meaning of its own."""
        _records = property(lambda self: {})

    with pytest.raises(TypeError, match="defines"):
        CachedBlocks(Shaped(), engine._core, *good[2:])
    with pytest.raises(TypeError, match="instance dict"):
        CachedBlocks(engine, object(), *good[2:])
    unset = CachedBlocks.__new__(CachedBlocks)
    with pytest.raises(ValueError, match="not initialised"):
        unset.take(1, (1,), torch.uint8)
    with pytest.raises(ValueError, match="not initialised"):
        unset.release(0)
    with pytest.raises(TypeError):
        engine._cached.take(1, (1,))


def test_the_dead_blocks_constructor_checks_what_it_is_given(pair):
    """DeadBlocks (native/dead.c) takes a core that keeps _pending and _held in its
    instance dict, and its engine's CachedBlocks."""
    DeadBlocks = native._native.DeadBlocks

    class Core:
        def __init__(self, local):
            self.local, self._pending, self._held = local, set(), None

        def forget(self):
            pass

        def release_dead(self, offsets):
            pass

    engine = pair[0]
    local = types.SimpleNamespace(release=engine._release)   # (the heap's engine's face)
    with pytest.raises(TypeError, match="CachedBlocks"):
        DeadBlocks(Core(local), object())

    class Slotted(Core):
        _held = property(lambda self: None)

        def __init__(self, local):
            self.local, self._pending = local, set()

    with pytest.raises(TypeError, match="instance dict"):
        DeadBlocks(Slotted(local), engine._cached)
    dead = DeadBlocks(Core(local), engine._cached)
    assert dead.take() == set()   # (nothing died)
    unset = DeadBlocks.__new__(DeadBlocks)
    with pytest.raises(ValueError, match="not initialised"):
        unset.take()
    with pytest.raises(ValueError, match="not initialised"):
        unset.release({0})


def _face_free(core, engine):
    return native._native.FaceFree(core, engine._cached, torch.Tensor, ownership.use_count_of,
                                   ownership.HELD_ALONE)


class _Core:
    """What FaceFree reads of a core (a lock, the kept quick steps, forget(),
    the engine's release)."""

    def __init__(self, engine):
        import threading
        self.lock, self.quick, self.forgot = threading.RLock(), {}, 0
        self.local = types.SimpleNamespace(release=engine._release)

    def forget(self):
        self.forgot += 1


def test_the_face_free_checks_what_it_is_given(pair):
    FaceFree = native._native.FaceFree
    engine = pair[0]
    with pytest.raises(TypeError, match="CachedBlocks"):
        FaceFree(_Core(engine), object(), torch.Tensor, None, 1)
    with pytest.raises(TypeError, match="tensor_type a type"):
        FaceFree(_Core(engine), engine._cached, "Tensor", None, 1)
    with pytest.raises(TypeError, match="use_count callable"):
        FaceFree(_Core(engine), engine._cached, torch.Tensor, 3, 1)
    odd = _Core(engine)
    odd.quick = []
    with pytest.raises(TypeError, match="not a dict"):
        _face_free(odd, engine)
    unset = FaceFree.__new__(FaceFree)
    for call in (lambda: unset.free_memory(memoryview(b"x")), lambda: unset.free_tensor(None)):
        with pytest.raises(ValueError, match="not initialised"):
            call()
    with pytest.raises(TypeError, match="array_type"):
        _face_free(_Core(engine), engine).free_memory(memoryview(b"x"), 3)
    with pytest.raises(TypeError, match="free_memory"):
        _face_free(_Core(engine), engine).free_memory()


def test_the_face_free_of_memory_does_the_whole_free_or_nothing(pair):
    """FaceFree.free_memory (native/face_free.c) frees alloc's memoryview, or an
    array over it, in one call: the record's check, forget(), the quick step
    kept under ("free", offset) with the flag false, the record marked freed.
    Where anything is unusual it does nothing and says None, so that the
    Python path does the free or raises."""
    import threading
    engine = pair[0]
    stepped: list = []
    core = _Core(engine)
    face_free = _face_free(core, engine).free_memory
    tensor = engine.allocate(96, torch.uint8)
    offset = _offset(engine, tensor)
    memory = memoryview(native._native.HeapMemory(tensor))
    record = engine._records[offset]
    assert face_free(memory) is None          # no quick step kept for it yet
    core.quick[("free", offset)] = None
    assert face_free(memory) is None          # none made (a heap that has none)
    core.quick[("free", offset)] = lambda flag: stepped.append(flag)   # did nothing: None
    assert face_free(memory) is None and stepped == [False] and not record.freed
    core.quick[("free", offset)] = lambda flag: stepped.append(flag) or -2
    stepped.clear()
    core.forgot = 0

    class Sub(native._native.HeapMemory):
        pass

    class Array(np.ndarray):
        pass
    released = memory[:]
    released.release()
    array = np.asarray(memory).view("f8").reshape(3, 4)   # (the face's empty((3, 4), "f8"))
    # not alloc's memoryview of a live allocation, nor an array of the type given
    # over one from its start (C-contiguous): nothing done, not even forget()
    for other, array_type in [
            (object(), np.ndarray), (memoryview(b"x" * 96), np.ndarray), (memory[1:], None),
            (tensor.numpy(), np.ndarray), (released, None), (memoryview(Sub(tensor)), None),
            (memoryview(native._native.HeapMemory(torch.frombuffer(memory, dtype=torch.uint8))),
             None),
            (array, None), (array, Array), (array.view(Array), np.ndarray),
            (array[1:], np.ndarray), (array.T, np.ndarray), (np.zeros(12), np.ndarray)]:
        assert face_free(other, array_type) is None and core.forgot == 0 and not record.freed
    assert stepped == []

    def mismatch(flag):
        raise ValueError("a mismatch")
    core.quick[("free", offset)] = mismatch
    with pytest.raises(ValueError, match="a mismatch"):
        face_free(memory)
    assert not record.freed and core.lock.acquire(False)   # (released: this thread takes it)
    core.lock.release()
    held = threading.Event()
    done = threading.Event()
    other_thread = threading.Thread(target=lambda: (core.lock.acquire(), held.set(), done.wait(),
                                                    core.lock.release()))
    other_thread.start()
    held.wait()
    core.quick[("free", offset)] = lambda flag: stepped.append(flag) or -2
    try:
        assert face_free(memory) is None and not record.freed   # another thread holds the lock
    finally:
        done.set()
        other_thread.join()
    assert face_free(array[:1], np.ndarray) is True and record.freed and stepped[-1] is False
    assert face_free(memory) is None          # freed: the Python path raises
    del tensor, memory, released, array
    gc.collect()
    assert engine._take_dead() == [offset]   # released once its last array died
    engine._release(offset)


def test_the_face_free_of_a_tensor_does_the_whole_free_or_nothing(pair):
    """FaceFree.free_tensor frees a torch tensor in one call: detached and
    marked, the step with the flag alone, the block released at once where the
    flag is everywhere, else deferred. Where anything is unusual it does
    nothing (a detached tensor restored) and says None."""
    engine = pair[0]
    core = _Core(engine)
    face_free = _face_free(core, engine).free_tensor
    flags: list = []
    tensor = engine.allocate(24, torch.float32)
    tensor.copy_(torch.arange(24.0))
    offset = _offset(engine, tensor)
    record = engine._records[offset]
    assert face_free(tensor) is None          # no quick step kept for it yet
    core.quick[("free", offset)] = lambda flag: flags.append(flag)   # did nothing: restored
    assert face_free(tensor) is None and flags == [True]
    assert tensor.shape == (24,) and tensor.stride() == (1,) and tensor[5] == 5.0
    assert not hasattr(tensor, "_shmemvm_freed") and not record.freed

    def mismatch(flag):
        raise ValueError("a mismatch")
    core.quick[("free", offset)] = mismatch
    with pytest.raises(ValueError, match="a mismatch"):
        face_free(tensor)
    assert tensor.shape == (24,) and tensor[23] == 23.0 and not hasattr(tensor, "_shmemvm_freed")
    core.quick[("free", offset)] = lambda flag: flags.append(flag) or (0 if flag else -2)
    flags.clear()
    core.forgot = 0

    class Sub(torch.Tensor):
        pass
    grad = tensor.view(24).requires_grad_()   # (set_() refuses it: steps.free defers it)
    for other in (tensor[1:], tensor.view(4, 6).t(), tensor.as_subclass(Sub), torch.zeros(24),
                  object(), grad):
        assert face_free(other) is None and core.forgot == 0 and not record.freed
    del grad, other
    assert flags == [] and tensor[7] == 7.0
    view = tensor[:2]                         # another tensor holds the storage: deferred
    assert face_free(tensor.view(2, 12)) is True and flags == [False] and record.freed
    assert tensor.shape == (24,)              # (the view of all of it was freed, emptied)
    assert face_free(tensor) is None          # freed: the Python path raises
    del view, tensor
    gc.collect()
    assert engine._take_dead() == [offset]
    engine._release(offset)
    alone = engine.allocate(24, torch.float32)   # nothing else views it: released at once
    offset = _offset(engine, alone)
    core.quick[("free", offset)] = lambda flag: flags.append(flag) or (0 if flag else -2)
    assert face_free(alone) is True and flags[-1] is True and offset not in engine._records
    assert alone.numel() == 0 and alone._shmemvm_freed == offset
