"""A repeated malloc and a free in one native call each (issue 30): an
allocation without a fill is its agreed step and then the block and tensor
(HeapCore._allocated) in one _collective.Quick call, which also carries the
dead blocks that are pending (a free deferred to its last view's death, as the
NumPy face's always is); a free is its agreed step with the flag that says
whether the block can go at once. The two paths make the same steps and the
same blocks: PEs on different paths agree, a mismatch is a SymmetryError on
every PE with nothing allocated or freed. A face's repeated allocation takes
the quick step kept under its own arguments (remembered_allocation), without
forming its call again: what those arguments keep apart stays apart. The
engine's compiled cached branch (native/blocks.c), which the quick allocation
delivers through, gives the blocks, state and counters of a heap made without it.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/memory/test_quick_alloc.py
"""

from __future__ import annotations

import gc
import random

import pytest
import torch
from mpi4py import MPI

from shmemvm import SymmetryError, native

WORLD = MPI.COMM_WORLD
HEAP_OPTIONS = {"backend": "host"}

pytestmark = pytest.mark.skipif(native._native is None,
                                reason="the compiled piece is not built (pip install . builds it)")


class _Paths:
    """Counts the steps agree() takes (the general path) on `heap`'s core and
    the quick steps taken; `general` sends this PE's allocations and frees
    the general way."""

    def __init__(self, heap, monkeypatch):
        core = heap._core
        if core.agreement.board is None:
            pytest.skip("the heap's PEs share no board here (a quick step needs one)")
        self.agreed = self.quick = 0
        self.general = False
        real_agree = core.agree

        def agree(call, *, flag=True):
            self.agreed += 1
            return real_agree(call, flag=flag)

        def counted(make):
            def lookup(*args):
                quick = make(*args)
                if quick is None or self.general:
                    return None

                def step(*flag):
                    try:
                        result = quick(*flag)
                    except BaseException:   # (taken: its step raised, a mismatch)
                        self.quick += 1
                        raise
                    self.quick += result is not None
                    return result
                return step
            return lookup

        real_remembered = core.remembered_allocation

        def remembered(memo):   # (a face's repeated call: the step kept by a counted one)
            self.remembered += 1
            return None if self.general else real_remembered(memo)

        def one_call(free):   # (the faces' frees in one call: their quick steps)
            def counted_free(*args):
                if self.general:
                    return None
                try:
                    done = free(*args)
                except BaseException:
                    self.quick += 1
                    raise
                self.quick += done is not None
                return done
            return counted_free

        self.remembered = 0
        monkeypatch.setattr(core, "free_memory", one_call(core.free_memory))
        monkeypatch.setattr(core, "free_tensor", one_call(core.free_tensor))
        monkeypatch.setattr(core, "agree", agree)
        monkeypatch.setattr(core, "quick_allocation", counted(core.quick_allocation))
        monkeypatch.setattr(core, "quick_free", counted(core.quick_free))
        monkeypatch.setattr(core, "remembered_allocation", remembered)


def _offset(heap, tensor) -> int:
    return tensor.untyped_storage().data_ptr() - heap._core.local.base


def _same_everywhere(value) -> bool:
    return len(set(WORLD.allgather(value))) == 1


def _random_steps(heap, plain, script: random.Random, steps: int, view_chance: float,
                  allocate, check, sizes: list[int]) -> None:
    """`steps` random mallocs (allocate(roll, nbytes): a pair of tensors, one of
    each heap) and frees alike on `heap` and `plain`, a free's block kept by a view
    (released at its death, carried into a later step) at `view_chance`, the views
    dropped at that chance too; the two tensors of each pair at the same offset,
    check() after every step; then every pair freed (_free_all_alike)."""
    live: list[tuple] = []
    views: list[tuple] = []
    for _ in range(steps):
        roll = script.random()
        if live and roll < 0.45:
            t, u = live.pop(script.randrange(len(live)))
            if script.random() < view_chance:
                views.append((t[:1], u[:1]))    # the free is deferred to its death
            heap.free(t)
            plain.free(u)
        else:
            t, u = allocate(roll, sizes[script.randrange(len(sizes))])
            assert _offset(heap, t) == _offset(plain, u)
            live.append((t, u))
        if views and script.random() < view_chance:
            views.pop(script.randrange(len(views)))
            gc.collect()
        check()
    _free_all_alike(heap, plain, live, views)


def _free_all_alike(heap, plain, live: list, views: list) -> None:
    """Free every pair of `live` on `heap` and `plain`, drop `views`, take a step on
    both (the last dead blocks released) and check that their allocators agree."""
    for t, u in live:
        heap.free(t)
        plain.free(u)
    live.clear()
    views.clear()
    gc.collect()
    heap.malloc(8)   # (a step: the last dead blocks released on both)
    plain.malloc(8)
    assert heap._core.local.allocator_state() == plain._core.local.allocator_state()


@pytest.mark.mpi(min_size=2)
def test_repeated_mallocs_and_frees_are_one_quick_step_each(heap, monkeypatch):
    paths = _Paths(heap, monkeypatch)
    heap.free(heap.malloc(1024))              # the first: the general path makes the block
    x = heap.empty((4, 8), torch.float64)
    heap.free(x)
    before = heap.heap_info()["live_allocations"]
    paths.agreed = paths.quick = 0
    offsets = set()
    for i in range(20):
        t = heap.malloc(1024)
        y = heap.empty((4, 8), torch.float64)
        assert t.shape == (1024,) and t.dtype == torch.uint8
        assert y.shape == (4, 8) and y.dtype == torch.float64 and y.is_contiguous()
        y.fill_(i)
        offsets.add((_offset(heap, t), _offset(heap, y)))
        heap.free(y)
        heap.free(t)
    assert paths.agreed == 0 and paths.quick == 80, (paths.agreed, paths.quick)
    assert len(offsets) == 1 and _same_everywhere(offsets.pop())   # the cached blocks again
    assert heap.heap_info()["live_allocations"] == before


@pytest.mark.mpi(min_size=2)
def test_a_deferred_release_rides_in_the_next_quick_allocation(heap, monkeypatch):
    paths = _Paths(heap, monkeypatch)
    heap.free(heap.malloc(4096))
    t = heap.malloc(4096)
    first = _offset(heap, t)
    for _ in range(3):
        view = t[16:]                   # a view outlives the free: the release waits for it
        paths.agreed = paths.quick = 0
        heap.free(t)                    # its flag (alone) not everywhere: quick all the same
        assert paths.agreed == 0 and paths.quick == 1, (paths.agreed, paths.quick)
        assert heap.heap_info()["live_allocations"] == 0   # freed, not yet released
        del view
        gc.collect()
        paths.agreed = paths.quick = 0
        t = heap.malloc(4096)           # carries the dead block, released, then taken again
        assert paths.agreed == 0 and paths.quick == 1
        assert not heap._core._pending
        assert _offset(heap, t) == first and _same_everywhere(_offset(heap, t))
    heap.free(t)


@pytest.mark.mpi(min_size=2)
def test_a_deferred_release_rides_in_the_next_quick_free(heap, monkeypatch):
    # The NumPy face's loop `x = empty(); free(x)`: x's last view dies when x is
    # bound to the next array, after that allocation, so the free comes with a
    # dead block pending. Its step carries it (as agree()'s would), quick still.
    paths = _Paths(heap, monkeypatch)
    heap.free(heap.malloc(4096))
    s = heap.malloc(1024)
    heap.free(s)
    for _ in range(3):
        t = heap.malloc(4096)
        s = heap.malloc(1024)
        view = t[16:]
        heap.free(t)
        del view
        gc.collect()
        assert heap.heap_info()["live_allocations"] == 1   # t freed, its block not released
        paths.agreed = paths.quick = 0
        heap.free(s)                    # carries t's dead block, released in its step
        assert paths.agreed == 0 and paths.quick == 1, (paths.agreed, paths.quick)
        assert not heap._core._pending
        assert heap.heap_info()["live_allocations"] == 0


@pytest.mark.mpi(min_size=2)
def test_a_mismatched_quick_malloc_raises_on_every_pe_and_allocates_nothing(heap, monkeypatch):
    paths = _Paths(heap, monkeypatch)
    for size in (1024, 2048):
        heap.free(heap.malloc(size))
    live = heap.heap_info()["live_allocations"]
    paths.quick = 0
    with pytest.raises(SymmetryError):
        heap.malloc(1024 if WORLD.rank == 0 else 2048)
    assert paths.quick == 1       # the quick step was taken, and settled the mismatch
    assert heap.heap_info()["live_allocations"] == live
    t = heap.malloc(2048)         # in step again
    assert _same_everywhere(_offset(heap, t))
    heap.free(t)


@pytest.mark.mpi(min_size=2)
def test_a_mismatched_quick_free_raises_on_every_pe_and_frees_nothing(heap, monkeypatch):
    paths = _Paths(heap, monkeypatch)
    a, b = heap.malloc(64), heap.malloc(64)
    for t in (a, b):                 # their quick frees made (by offset), then in use again
        heap.free(t)
    a, b = heap.malloc(64), heap.malloc(64)
    a.fill_(1)
    b.fill_(2)
    paths.quick = 0
    with pytest.raises(SymmetryError):
        heap.free(a if WORLD.rank == 0 else b)
    assert paths.quick == 1
    assert int(a.sum()) == 64 and int(b.sum()) == 128    # both still live and usable
    heap.free(a)
    heap.free(b)
    assert paths.quick == 3


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_allocations_on_mixed_paths_give_the_general_paths_blocks(heap, monkeypatch,
                                                                         seed):
    # Each PE takes the quick or the general path at random for each call; the
    # blocks must be the ones a second heap taking only the general path gives, on
    # every PE, with views kept at random (their release deferred into later steps)
    paths = _Paths(heap, monkeypatch)
    plain = type(heap)(MPI.COMM_WORLD, heap_size="64M", backend="host", timeout=30)
    try:
        monkeypatch.setattr(plain._core, "quick_allocation", lambda *args: None)
        monkeypatch.setattr(plain._core, "quick_free", lambda offset: None)
        script = random.Random(seed)
        chance = random.Random(seed * 1000 + WORLD.rank)
        shapes = [(1024,), (8, 8), (3, 5), (4096,), (1,), (0,), ()]
        dtypes = [torch.float32, torch.float16, torch.bool, torch.complex64, torch.int8]
        live: list[tuple] = []
        views = []
        for _ in range(60):
            if live and script.random() < 0.45:
                t, u = live.pop(script.randrange(len(live)))
                if script.random() < 0.3:
                    # a view keeps the block until dropped (0-d ones too: view(-1))
                    views.append((t.view(-1)[:1], u.view(-1)[:1]))
                paths.general = chance.random() < 0.5
                heap.free(t)
                plain.free(u)
            else:
                shape = shapes[script.randrange(len(shapes))]
                dtype = dtypes[script.randrange(len(dtypes))]
                paths.general = chance.random() < 0.5
                t = heap.empty(shape, dtype)
                u = plain.empty(shape, dtype)
                assert (t.shape, t.dtype, t.is_contiguous()) == (u.shape, u.dtype, True)
                assert _offset(heap, t) == _offset(plain, u)
                assert _same_everywhere(_offset(heap, t))
                live.append((t, u))
            if views and script.random() < 0.3:
                views.pop(script.randrange(len(views)))
                gc.collect()
        assert paths.quick > 0
        _free_all_alike(heap, plain, live, views)
    finally:
        gc.collect()
        plain.finalize()



def _heap_without(heap, monkeypatch, piece: str):
    """A heap like `heap` made without the compiled `piece` of native (its Python
    path instead); the test skips where there is none to leave out."""
    if getattr(native, piece) is None:
        pytest.skip("the compiled piece is not used here (SHMEMVM_NATIVE=0)")
    with monkeypatch.context() as patch:
        patch.setattr(native, piece, None)
        return type(heap)(MPI.COMM_WORLD, heap_size="64M", backend="host", timeout=30)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("seed", [4, 5])
def test_the_engines_compiled_cached_branch_gives_the_python_branchs_blocks(heap, monkeypatch,
                                                                            seed):
    # The quick allocation delivers through the engine's compiled cached branch
    # (native/blocks.c) and a release gives a small block back through it; a heap
    # made without it (its engine's Python path) must give the same blocks, with
    # the same allocator state, on every PE, views kept at random (their release
    # carried into later steps, where every PE carries them alike)
    plain = _heap_without(heap, monkeypatch, "CachedBlocks")
    try:
        assert heap._core.local._cached is not None and plain._core.local._cached is None
        # (the quick allocation delivers through the compiled take on one, _allocated on
        # the other)
        assert heap._core._delivery(8, (8,), torch.uint8, None)[0] == \
            heap._core.local._cached.take
        assert plain._core._delivery(8, (8,), torch.uint8, None)[0] == plain._core._allocated
        def allocate(roll: float, nbytes: int) -> tuple:
            t, u = heap.malloc(nbytes), plain.malloc(nbytes)
            assert t.shape == u.shape == (nbytes,)
            assert _same_everywhere(_offset(heap, t))
            return t, u

        def check() -> None:
            assert heap._core.local.allocator_state() == plain._core.local.allocator_state()
            assert heap._core.local.stats() == plain._core.local.stats()   # (its counters)

        _random_steps(heap, plain, random.Random(seed), 120, 0.3, allocate, check,
                      [0, 1, 8, 64, 100, 1024, 4096, 5000, 100_000, 1 << 20, 3 << 20])
        assert _same_everywhere(repr(heap._core.local.allocator_state()))
    finally:
        gc.collect()
        plain.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("seed", [6, 7])
def test_the_cores_compiled_dead_blocks_release_what_its_python_methods_release(
        heap, monkeypatch, seed):
    # The core takes the engine's dead blocks into its pending set and releases
    # those every PE dropped in one compiled call each (native/dead.c); a heap
    # made without it (HeapCore._dead_to_release and release_dead, the engine's
    # compiled branch kept on both) must release the same blocks at the same
    # steps: views kept at random defer frees, zeros() (a fill) holds a step's
    # releases until its block is taken, and every step compares the pending
    # sets, the allocators and their counters
    plain = _heap_without(heap, monkeypatch, "DeadBlocks")
    try:
        core, other = heap._core, plain._core
        assert core.agreement.release != core.release_dead   # (the compiled one)
        assert other.agreement.release == other.release_dead
        assert other._take_dead == other._dead_to_release
        def allocate(roll: float, nbytes: int) -> tuple:
            if roll < 0.6:   # a fill: the step's releases held until its block is taken
                return heap.zeros(nbytes, dtype=torch.uint8), plain.zeros(nbytes, dtype=torch.uint8)
            return heap.malloc(nbytes), plain.malloc(nbytes)

        def check() -> None:
            assert core._pending == other._pending
            assert core.local.allocator_state() == other.local.allocator_state()
            assert core.local.stats() == other.local.stats()

        _random_steps(heap, plain, random.Random(seed), 150, 0.4, allocate, check,
                      [0, 1, 8, 64, 1024, 5000, 100_000, 3 << 20])
        assert core._pending == other._pending == set()
    finally:
        gc.collect()
        plain.finalize()


def _alike(core, other) -> None:
    """The two cores' memory alike: pending releases, allocator, counters, records,
    the watches' reports not yet applied."""
    assert core._pending == other._pending
    assert core.local.allocator_state() == other.local.allocator_state()
    assert core.local.stats() == other.local.stats()
    assert sorted((o, r.freed, r.own_alive) for o, r in core.local._records.items()) == \
        sorted((o, r.freed, r.own_alive) for o, r in other.local._records.items())
    assert len(core.local._mailbox.events) == len(other.local._mailbox.events)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("seed", [8, 9])
def test_the_numpy_faces_one_call_free_frees_as_its_general_path_does(default_heap, monkeypatch,
                                                                      seed):
    # shmem.free of alloc's memoryview, or of an array over one (empty, zeros,
    # new_array, a view from its start), is one compiled call (native/face_free.c)
    # where its quick step is kept; a heap made without it (core/steps.py's free)
    # must end every step alike: the same blocks, pending releases, records and
    # counters, arrays over the memory kept at random (the release deferred to
    # their death) and odd inputs among the frees, whose errors must be the same
    import numpy as np
    from shmemvm import FreedTensorError
    from shmemvm.core.state import core_of
    from shmemvm.shmem import arrays
    from shmemvm import shmem   # (after the default heap: the import makes none)
    heap = default_heap
    plain = _heap_without(heap, monkeypatch, "FaceFree")
    core, other = core_of(heap), core_of(plain)
    taken = []
    real = core.free_memory
    monkeypatch.setattr(core, "free_memory", lambda memory, array_type: taken.append(
        (type(memory), real(memory, array_type))) or taken[-1][1])
    assert other.free_memory(memoryview(b"x"), None) is None   # (steps aside: no compiled piece)

    def on(h, call, *args, **kwargs):   # the face's call on heap h's core
        monkeypatch.setattr(arrays, "core", lambda: core_of(h))
        return call(*args, **kwargs)

    def refused(pair, error: type) -> None:   # shmem.free of each on its heap raises on both
        for h, memory in zip((heap, plain), pair):
            with pytest.raises(error):
                on(h, shmem.free, memory)
        gc.collect()   # (the errors' tracebacks hold the memory: gone on both at once)

    def check() -> None:
        _alike(core, other)

    script = random.Random(seed)
    live: list[tuple] = []
    arrays_kept: list = []
    freed: list[tuple] = []
    for _ in range(160):
        roll = script.random()
        if live and roll < 0.5:
            m, n = live.pop(script.randrange(len(live)))
            if script.random() < 0.3:
                arrays_kept.append((np.asarray(m)[...], np.asarray(n)[...]))
            odd = script.random()
            if odd < 0.1 and len(m) > 1:   # a slice after its start: refused by both
                refused((m[1:], n[1:]), ValueError)
            elif odd < 0.15:   # a slice from its start frees the allocation on both
                m, n = m[:1], n[:1]
            elif odd < 0.2:   # an array over it frees it too
                m, n = np.asarray(m)[...], np.asarray(n)[...]
            on(heap, shmem.free, m)
            on(plain, shmem.free, n)
            if odd >= 0.9:    # a second free: FreedTensorError on both
                refused((m, n), FreedTensorError)
            if script.random() < 0.3:   # kept a while (it keeps its block until dropped)
                freed.append((m, n))
                del freed[:-3]
        elif freed and roll > 0.93:   # a free of memory freed before (its offset reused, maybe)
            refused(freed[script.randrange(len(freed))], FreedTensorError)
        else:   # alloc's memoryview, or an array: C order, zeroed, Fortran order
            nbytes, k = script.choice([0, 1, 8, 96, 1024, 5000, 100_000]), script.choice([0, 1, 3, 40])
            make = script.choice([lambda: shmem.alloc(nbytes, clear=False),
                                  lambda: shmem.empty((k, 8), "f8"), lambda: shmem.zeros(k, "i4"),
                                  lambda: shmem.new_array((2, k), "f4", order="F")])
            m = on(heap, make)
            n = on(plain, make)
            assert (arrays.owner(m).address - core.local.base
                    == arrays.owner(n).address - other.local.base)
            live.append((m, n))
        if arrays_kept and script.random() < 0.3:
            arrays_kept.pop(script.randrange(len(arrays_kept)))
            gc.collect()
        check()
    for m, n in live:
        on(heap, shmem.free, m)
        on(plain, shmem.free, n)
    del live, arrays_kept, freed, m, n
    gc.collect()
    on(heap, shmem.alloc, 8)   # (a step: the last dead blocks released on both)
    on(plain, shmem.alloc, 8)
    check()
    gone = {h: on(h, shmem.alloc, 8) for h in (heap, plain)}
    for h in (heap, plain):   # a released memoryview of it: refused by both, nothing freed
        gone[h] = gone[h][:]
        gone[h].release()
    refused((gone[heap], gone[plain]), ValueError)
    check()
    # memory made over a live allocation's bytes by another tensor (its own storage):
    # not the allocation's, refused by both (FreedTensorError: no live block of its
    # storage there), the allocation left live
    live_memory = {h: on(h, shmem.alloc, 96, clear=False) for h in (heap, plain)}
    for _ in range(2):   # (the second time, the free's quick step is kept)
        refused(tuple(memoryview(arrays.HeapMemory(torch.frombuffer(live_memory[h],
                                                                    dtype=torch.uint8)))
                      for h in (heap, plain)), FreedTensorError)
        check()
    for h in (heap, plain):
        on(h, shmem.free, live_memory[h])
    check()
    # frees in one call of memoryviews and arrays, and frees stepped aside
    assert {(memoryview, True), (np.ndarray, True), (memoryview, None)} <= set(taken)
    gc.collect()
    plain.finalize()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("seed", [10, 11])
def test_the_torch_apis_one_call_free_frees_as_its_general_path_does(heap, monkeypatch, seed):
    # heap.free(tensor) is one compiled call (native/face_free.c) where the free's
    # quick step is kept: the tensor detached, released at once where nothing
    # views it on any PE, else deferred to its views' death. A heap made without
    # it (core/steps.py's free) must end every step alike, views kept at random
    # (local ones, and registered ones of another PE's copy: heap.ptr), odd
    # tensors among the frees (slices, views of all of it, transposed, requiring
    # grad, foreign, freed before) with the same errors, the freed tensors alike
    from shmemvm import FreedTensorError, NotSymmetricError
    from shmemvm.core.state import core_of
    plain = _heap_without(heap, monkeypatch, "FaceFree")
    core, other = core_of(heap), core_of(plain)
    taken = []
    real = core.free_tensor
    monkeypatch.setattr(core, "free_tensor", lambda tensor: taken.append(real(tensor)) or
                        taken[-1])
    assert other.free_tensor(torch.zeros(1)) is None   # (steps aside: no compiled piece)

    def refused(pair, error: type) -> None:   # h.free(tensor) raises on both, alike
        for h, t in zip((heap, plain), pair):
            with pytest.raises(error):
                h.free(t)
        gc.collect()   # (the errors' tracebacks hold the tensors: gone on both at once)

    def free_both(pair) -> None:   # (a function: no loop variable keeps one of them alive)
        for h, t in zip((heap, plain), pair):
            h.free(t)

    def check() -> None:
        _alike(core, other)

    script = random.Random(seed)
    live: list[tuple] = []
    views: list[tuple] = []
    freed: list[tuple] = []
    for _ in range(160):
        roll = script.random()
        if live and roll < 0.5:
            pair = live.pop(script.randrange(len(live)))
            keep = script.random()
            if keep < 0.2:   # a view outlives the free: deferred to its death
                views.append(tuple(t.view(-1)[:1] for t in pair))
            elif keep < 0.35:   # a registered view, of the next PE's copy: deferred alike
                right = (WORLD.rank + 1) % WORLD.size
                views.append((heap.ptr(pair[0], right), plain.ptr(pair[1], right)))
            odd = script.random()
            if odd < 0.1 and pair[0].numel() > 1:   # a slice: refused by both
                refused(tuple(t.view(-1)[1:] for t in pair), ValueError)
            elif odd < 0.15:   # a view of all of it frees it (the tensor itself stays)
                pair = tuple(t.view(-1) for t in pair)
            elif odd < 0.2 and pair[0].dim() == 2:   # transposed, all of it (steps.free)
                pair = tuple(t.t() for t in pair)
            elif odd < 0.25 and pair[0].is_floating_point():   # requires grad: deferred
                pair = tuple(t.requires_grad_() for t in pair)
            free_both(pair)
            assert pair[0].numel() == pair[1].numel()   # (emptied on both, or on neither)
            assert getattr(pair[0], "_shmemvm_freed", None) == \
                getattr(pair[1], "_shmemvm_freed", None)
            if odd >= 0.9:   # a second free: refused by both
                refused(pair, FreedTensorError)
            if script.random() < 0.3:
                freed.append(pair)
                del freed[:-3]
        elif freed and roll > 0.95:   # freed before (emptied, or its block gone since)
            refused(freed[script.randrange(len(freed))], NotSymmetricError)
        elif roll > 0.93:   # a tensor of no heap
            refused((torch.zeros(4), torch.zeros(4)), NotSymmetricError)
        else:
            shape = script.choice([(0,), (1,), (3,), (96,), (5, 8), (300, 40), (4096,)])
            dtype = script.choice([torch.uint8, torch.float32, torch.int64])
            make = script.choice([lambda h: h.malloc(shape[0] * 8),
                                  lambda h: h.empty(shape, dtype), lambda h: h.zeros(shape, dtype)])
            pair = (make(heap), make(plain))
            assert _offset(heap, pair[0]) == _offset(plain, pair[1])
            live.append(pair)
        if views and script.random() < 0.3:
            views.pop(script.randrange(len(views)))
            gc.collect()
        check()
    for pair in live:
        free_both(pair)
    del live, views, freed, pair
    gc.collect()
    heap.malloc(8)   # (a step: the last dead blocks released on both)
    plain.malloc(8)
    check()
    assert True in taken and None in taken   # (frees in one call, and frees stepped aside)
    gc.collect()
    plain.finalize()


@pytest.mark.mpi(min_size=2)
def test_a_free_steps_aside_while_a_context_lives_and_its_quiet_all_runs(heap, monkeypatch):
    # free() completes every context's operations first (quiet_all): while a context
    # lives the quick free (whose guards know only the default context) is not taken
    paths = _Paths(heap, monkeypatch)
    heap.free(heap.malloc(64))
    quieted = []
    real_quiet_all = heap._core.quiet_all
    monkeypatch.setattr(heap._core, "quiet_all", lambda: quieted.append(1) or real_quiet_all())
    ctx = heap.ctx_create()
    t = heap.malloc(64)
    paths.agreed = paths.quick = 0
    heap.free(t)
    assert quieted == [1] and paths.agreed == 1 and paths.quick == 0
    heap.ctx_destroy(ctx)
    gc.collect()
    t = heap.malloc(64)
    paths.agreed = paths.quick = 0
    heap.free(t)
    assert quieted == [1] and paths.agreed == 0 and paths.quick == 1


@pytest.mark.mpi(min_size=2)
def test_a_full_memo_of_quick_steps_forgets_its_older_half_and_keeps_making_new_ones(
        heap, monkeypatch):
    # a program that once freed many blocks at many offsets still gets quick steps
    # for the sizes and offsets it uses afterwards (the memo forgets its older half)
    from shmemvm.core import state
    monkeypatch.setattr(state, "QUICK_KEPT", 16)
    paths = _Paths(heap, monkeypatch)
    many = [heap.malloc(64) for _ in range(40)]
    for t in many:
        heap.free(t)
    del many
    assert len(heap._core.quick) <= 16
    heap.free(heap.malloc(4096))       # a new size: its quick steps made now
    paths.agreed = paths.quick = 0
    for _ in range(3):
        heap.free(heap.malloc(4096))
    assert paths.agreed == 0 and paths.quick == 6
    assert len(heap._core.quick) <= 16



@pytest.fixture
def default_heap():
    """The NumPy face's default heap (shmemvm.init()), finalized after the test."""
    import shmemvm
    heap = shmemvm.init(MPI.COMM_WORLD, heap_size="64M", backend="host", timeout=30)
    yield heap
    gc.collect()
    shmemvm.finalize()


def _repeated_calls_take_the_kept_step(heap, monkeypatch, calls: dict) -> None:
    """Each of `calls` (an allocation and its free), repeated: the allocation
    takes the quick step kept for its arguments, without forming its call."""
    paths = _Paths(heap, monkeypatch)
    formed = []
    real = heap._core.quick_allocation
    monkeypatch.setattr(heap._core, "quick_allocation",
                        lambda *args: formed.append(1) or real(*args))
    for name, call in calls.items():
        for _ in range(3):   # the first forms the call and keeps its step
            call()
        formed.clear()
        paths.agreed = paths.quick = paths.remembered = 0
        for _ in range(4):
            call()
        assert formed == [] and paths.agreed == 0, (name, formed, paths.agreed)
        assert paths.remembered == 4 and paths.quick == 8, (name, paths.remembered, paths.quick)


@pytest.mark.mpi(min_size=2)
def test_a_repeated_allocation_takes_the_step_kept_for_its_arguments(heap, monkeypatch):
    _repeated_calls_take_the_kept_step(heap, monkeypatch, {
        "malloc": lambda: heap.free(heap.malloc(1024)),
        "empty": lambda: heap.free(heap.empty((4, 8), torch.float64))})


@pytest.mark.mpi(min_size=2)
def test_the_numpy_faces_repeated_allocation_takes_the_step_kept_for_its_arguments(
        default_heap, monkeypatch):
    from shmemvm import shmem

    def empty():
        x = shmem.empty((4, 8), "f8")
        shmem.free(x)
    _repeated_calls_take_the_kept_step(default_heap, monkeypatch, {
        "empty": empty, "alloc": lambda: shmem.free(shmem.alloc(96, clear=False))})


@pytest.mark.mpi(min_size=2)
def test_remembered_allocations_keep_apart_what_their_arguments_keep_apart(heap):
    # the same call text and request for equal arguments only: an int shape and a
    # one-element tuple, a float in a shape, a bool for an int
    for _ in range(3):
        a = heap.empty(3, torch.float32)
        b = heap.empty((3,), torch.float32)
        c = heap.empty((2, 3), torch.float16)
        assert (a.shape, b.shape, c.shape, c.dtype) == ((3,), (3,), (2, 3), torch.float16)
        for t in (a, b, c):
            heap.free(t)
        with pytest.raises(TypeError):
            heap.empty((3.0,), torch.float32)    # equal to (3,), refused as before
        with pytest.raises(TypeError):
            heap.empty(True, torch.float32)
        m = heap.malloc(40)
        assert m.shape == (40,) and m.dtype == torch.uint8
        heap.free(m)


@pytest.mark.mpi(min_size=2)
def test_the_numpy_faces_remembered_allocations_keep_their_form(default_heap):
    import numpy as np
    from shmemvm import shmem
    for _ in range(3):
        f = shmem.empty((2, 3), "f4", order="F")
        c = shmem.empty((2, 3), np.float32)
        i = shmem.empty((2, 3), "i4")
        assert f.flags.f_contiguous and not f.flags.c_contiguous and f.dtype == np.float32
        assert c.flags.c_contiguous and c.shape == (2, 3) and c.dtype == np.float32
        assert i.dtype == np.int32 and i.shape == (2, 3)
        m = shmem.alloc(12, 4, clear=False)
        assert m.nbytes == 48
        for x in (f, c, i, m):
            shmem.free(x)
        with pytest.raises(TypeError):
            shmem.empty((2, 3.0), "f4")


@pytest.mark.mpi(min_size=2)
def test_a_mismatch_of_remembered_allocations_raises_on_every_pe_and_allocates_nothing(
        default_heap):
    from shmemvm import shmem
    for shape in ((8,), (16,)):
        for _ in range(3):
            x = shmem.empty(shape, "i8")
            shmem.free(x)
    del x
    gc.collect()
    shmem.barrier_all()
    live = default_heap.heap_info()["live_allocations"]
    with pytest.raises(SymmetryError):
        shmem.empty((8,) if WORLD.rank == 0 else (16,), "i8")
    assert default_heap.heap_info()["live_allocations"] == live
    y = shmem.empty((16,), "i8")    # in step again
    assert _same_everywhere(y.__array_interface__["data"][0] - default_heap._core.local.base)
    shmem.free(y)
