"""Tests of VMemPow2Allocator on the host (memfd + mmap) backend, one process."""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
import weakref

import pytest
import torch

import shmemvm
from shmemvm import VMemPow2Allocator
from shmemvm.backends.host import HostBackend
from shmemvm.memory.heapmem import HeapMemory
from util import open_fds, shmemvm_mappings

G = 64 * 1024           # default host granularity (SHMEMVM_HOST_GRANULARITY)


@pytest.fixture
def vheap():
    """A 1 MiB host heap in this process (not conftest's collective `heap`)."""
    h = VMemPow2Allocator(16 * G, backend="host", granularity=G)
    yield h
    h.close()


def offset_of(h: VMemPow2Allocator, t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() - h.base


def span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the bytes a tensor's storage covers (at least one byte:
    a zero-element tensor still holds a distinct block)."""
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + max(storage.nbytes(), 1)


def probe(h: VMemPow2Allocator, nbytes: int) -> int:
    """Offset a fresh block of `nbytes` lands at (freed again at once).

    allocate() also releases blocks whose tensors were garbage-collected,
    so this is how a test makes pending collections take effect.
    """
    t = h.allocate(nbytes)
    offset = offset_of(h, t)
    h.free(t)
    return offset


def collect(h: VMemPow2Allocator) -> dict:
    """gc, let the heap release collected blocks, and return its stats."""
    gc.collect()
    probe(h, 1)
    return h.stats()


# ---------------------------------------------------------------------------
# allocation and data
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int8,
                                   torch.bfloat16, torch.float16, torch.bool, torch.complex64])
def test_allocate_returns_writable_cpu_tensor(vheap, dtype):
    t = vheap.allocate((3, 5), dtype)
    assert t.device.type == "cpu" and t.dtype == dtype and t.shape == (3, 5)
    assert t.is_contiguous()
    assert vheap.base <= t.data_ptr() < vheap.base + vheap.va_size
    src = (torch.arange(15).reshape(3, 5) % 2).to(dtype)
    t.copy_(src)
    assert torch.equal(t, src)
    # the data lives in the mapping: a second view of the same address sees it
    again = HostBackend(G).tensor(t.data_ptr(), (3, 5), dtype)
    assert torch.equal(again, src)


def test_allocate_by_element_count_and_shapes(vheap):
    a = vheap.allocate(10, torch.float32)
    b = vheap.allocate([2, 3, 4], torch.int32)
    c = vheap.allocate(torch.Size([4, 4]), torch.float64)
    d = vheap.allocate((), torch.float32)
    assert a.shape == (10,) and b.shape == (2, 3, 4) and c.shape == (4, 4) and d.shape == ()
    d.fill_(2.5)
    assert d.item() == 2.5
    assert vheap.stats()["live_allocations"] == 4
    assert vheap.stats()["requested"] == 40 + 96 + 128 + 4


def test_distinct_allocations_do_not_alias(vheap):
    tensors = [vheap.allocate(n, torch.uint8) for n in (0, 1, 63, 64, 100, 5000, G, 3 * G)]
    for i, t in enumerate(tensors):
        t.fill_(i + 1)
    for i, t in enumerate(tensors):
        assert bool((t == i + 1).all())
    spans = sorted(span(t) for t in tensors)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    assert len({offset_of(vheap, t) for t in tensors}) == len(tensors)


@pytest.mark.parametrize("shape, dtype, exc", [
    (-1, torch.float32, ValueError),
    ((2, -3), torch.float32, ValueError),
    (2.0, torch.float32, TypeError),
    ((2, True), torch.float32, TypeError),
    ("4", torch.float32, TypeError),
    (4, "float32", TypeError),
    (4, float, TypeError),
])
def test_bad_arguments_raise_and_leak_nothing(vheap, shape, dtype, exc):
    before = vheap.stats()
    with pytest.raises(exc):
        vheap.allocate(shape, dtype)
    assert vheap.stats() == before


def test_too_many_dims_leaks_no_block(vheap):
    before = vheap.stats()
    with pytest.raises(ValueError):
        vheap.allocate((1,) * 65, torch.uint8)
    assert vheap.stats() == before


def test_heap_size_from_environment(monkeypatch):
    monkeypatch.setenv("SHMEMVM_HEAP_SIZE", "512K")
    with VMemPow2Allocator(backend="host", granularity=G) as h:
        assert h.heap_size == 512 * 1024
    with VMemPow2Allocator("1M", backend="host", granularity=G) as h:
        assert h.heap_size == 1 << 20        # the argument wins over the environment


# ---------------------------------------------------------------------------
# free, reuse, and freed tensors
# ---------------------------------------------------------------------------

def test_free_releases_block_and_offset_is_reused(vheap):
    t = vheap.allocate(100, torch.float32)
    offset = offset_of(vheap, t)
    assert vheap.stats()["live_allocations"] == 1
    vheap.free(t)
    assert vheap.stats()["live_allocations"] == 0
    assert vheap.stats()["used"] == 0
    u = vheap.allocate(100, torch.float32)
    assert offset_of(vheap, u) == offset


def test_free_of_freed_tensor_raises(vheap):
    t = vheap.allocate(16, torch.int64)
    offset = offset_of(vheap, t)
    vheap.free(t)
    assert t.numel() == 0                     # free() detaches the tensor from its block
    with pytest.raises(shmemvm.FreedTensorError) as info:
        vheap.free(t)
    assert isinstance(info.value, shmemvm.ShmemError) and isinstance(info.value, ValueError)
    assert "not a live allocation" in str(info.value)
    # still an error once the same offset belongs to a new allocation
    u = vheap.allocate(16, torch.int64)
    assert offset_of(vheap, u) == offset
    with pytest.raises(shmemvm.FreedTensorError, match=r"not a live allocation \(freed: free\(\)"):
        vheap.free(t)
    with pytest.raises(shmemvm.FreedTensorError):
        vheap.free(t[3:])
    assert vheap.owns_tensor(u)               # the new owner is untouched
    assert vheap.stats()["live_allocations"] == 1


def test_free_of_foreign_tensor_raises(vheap):
    with pytest.raises(shmemvm.NotSymmetricError, match="not in this heap"):
        vheap.free(torch.zeros(4))
    with pytest.raises(TypeError):
        vheap.free([1, 2, 3])


# ---------------------------------------------------------------------------
# automatic free on garbage collection
# ---------------------------------------------------------------------------

def test_dropped_tensor_is_freed_at_next_call(vheap):
    t = vheap.allocate(256, torch.uint8)
    offset = offset_of(vheap, t)
    del t
    gc.collect()
    assert probe(vheap, 256) == offset         # the block went back, the offset is reused
    assert vheap.stats()["live_allocations"] == 0


@pytest.mark.parametrize("make_views", [
    lambda t: [t.view(8, 8)],
    lambda t: [t.reshape(4, 16)],
    lambda t: [t[10:20]],
    lambda t: [t[::2]],
    lambda t: [t.view(torch.int32)],
    lambda t: [t.detach()],
    lambda t: [torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())],   # no ._base
    lambda t: [t.view(8, 8), t[5:], t.reshape(2, 32)[1]],
])
def test_block_freed_only_when_last_view_dies(vheap, make_views):
    t = vheap.allocate(64, torch.float64)
    offset = offset_of(vheap, t)
    views = make_views(t)
    del t
    assert all(vheap.owns_tensor(v) for v in views)
    while views:
        gc.collect()
        assert probe(vheap, 64 * 8) != offset, "block freed while a view is alive"
        assert vheap.stats()["live_allocations"] == 1
        views.pop()
    gc.collect()
    assert probe(vheap, 64 * 8) == offset
    assert vheap.stats()["live_allocations"] == 0


def test_copy_made_by_reshape_does_not_keep_block(vheap):
    t = vheap.allocate((4, 8), torch.float32)
    t.copy_(torch.arange(32, dtype=torch.float32).reshape(4, 8))
    offset = offset_of(vheap, t)
    c = t.t().reshape(-1)                    # not viewable: reshape copies
    assert not vheap.owns_tensor(c)
    del t
    assert collect(vheap)["live_allocations"] == 0
    assert probe(vheap, 128) == offset
    assert torch.equal(c, torch.arange(32, dtype=torch.float32).reshape(4, 8).t().reshape(-1))


def test_explicit_free_then_drop_does_not_free_twice(vheap):
    t = vheap.allocate(64)
    offset = offset_of(vheap, t)
    vheap.free(t)
    u = vheap.allocate(64)                    # takes the same offset
    assert offset_of(vheap, u) == offset
    del t
    stats = collect(vheap)
    assert stats["live_allocations"] == 1    # dropping the freed tensor did not free `u`
    assert vheap.owns_tensor(u)


# ---------------------------------------------------------------------------
# owns_tensor
# ---------------------------------------------------------------------------

def test_owns_tensor_edge_cases(vheap):
    t = vheap.allocate((4, 4), torch.float32)
    z = vheap.allocate(0, torch.float32)
    assert vheap.owns_tensor(t)
    assert vheap.owns_tensor(t[1:, 2:])
    assert vheap.owns_tensor(t.view(-1)[5:6])
    assert vheap.owns_tensor(z)                       # own zero-element tensor
    assert z.numel() == 0
    assert vheap.owns_tensor(t[4:])                   # empty slice of an own tensor
    assert not vheap.owns_tensor(torch.zeros(4, 4))   # foreign
    assert not vheap.owns_tensor(torch.empty(0))      # foreign zero-element
    assert not vheap.owns_tensor(t.clone())
    assert not vheap.owns_tensor(t + 0)
    vheap.free(t)
    assert not vheap.owns_tensor(t)                   # freed
    vheap.free(z)
    assert not vheap.owns_tensor(z)                   # freed zero-element


def test_owns_tensor_other_heap(vheap):
    with VMemPow2Allocator(4 * G, backend="host", granularity=G) as other:
        t = other.allocate(10)
        assert other.owns_tensor(t)
        assert not vheap.owns_tensor(t)


# ---------------------------------------------------------------------------
# segments and generations
# ---------------------------------------------------------------------------

def test_get_allocation_segments_and_generation_after_evict(vheap):
    assert vheap.get_allocation_segments() == []
    t = vheap.allocate(G, torch.uint8)
    segs = vheap.get_allocation_segments()
    assert len(segs) == 1
    offset, size, va, gen = segs[0]
    assert offset == offset_of(vheap, t) and size == G and va == vheap.base + offset
    assert va == t.data_ptr() and gen == 1
    vheap.free(t)
    assert vheap.get_allocation_segments() == segs       # freed: still mapped, cached
    assert vheap.stats()["cached"] == G
    u = vheap.allocate(G)                                 # reused: no new generation
    assert vheap.get_allocation_segments() == segs
    vheap.free(u)
    assert vheap.trim() == G
    assert vheap.get_allocation_segments() == []
    assert vheap.stats()["mapped"] == 0 and vheap.stats()["segments"] == 0
    w = vheap.allocate(G)
    segs2 = vheap.get_allocation_segments()
    assert [(o, s, v) for o, s, v, _ in segs2] == [(offset, size, va)]
    assert segs2[0][3] == gen + 1
    w.fill_(7)                                           # the new piece is mapped
    assert bool((w == 7).all())


def test_segments_cover_small_and_large_blocks(vheap):
    small = [vheap.allocate(100) for _ in range(3)]
    big = vheap.allocate(3 * G)
    segs = vheap.get_allocation_segments()
    assert sorted(segs) == segs
    for t in small + [big]:
        addr = t.data_ptr()
        holders = [s for s in segs if s[2] <= addr < s[2] + s[1]]
        assert len(holders) == 1
        assert addr + t.numel() <= holders[0][2] + holders[0][1]
    assert {s[1] for s in segs} == {G, 4 * G}
    assert vheap.stats()["mapped"] == sum(s[1] for s in segs) == 5 * G


def test_segment_evicted_under_budget_pressure_gets_new_generation():
    with VMemPow2Allocator(2 * G, backend="host", granularity=G) as h:
        a = h.allocate(G)
        (off_a, _, _, gen_a), = h.get_allocation_segments()
        h.free(a)
        b = h.allocate(2 * G)                 # evicts the cached piece of `a`
        assert [s[1] for s in h.get_allocation_segments()] == [2 * G]
        h.free(b)
        c = h.allocate(G)                     # evicts `b`, re-creates `a`'s offset
        (off_c, size_c, _, gen_c), = h.get_allocation_segments()
        assert (off_c, size_c) == (off_a, G) and gen_c > gen_a
        c.fill_(3)
        assert int(c.sum()) == 3 * G


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

def test_import_external_tensor_unsupported(vheap):
    with pytest.raises(shmemvm.UnsupportedError) as info:
        vheap.import_external_tensor(torch.zeros(16))
    message = str(info.value)
    assert isinstance(info.value, shmemvm.ShmemError)
    assert "host" in message and "copy" in message       # says what to do instead


def test_heap_exhausted_then_usable():
    with VMemPow2Allocator(4 * G, backend="host", granularity=G) as h:
        with pytest.raises(shmemvm.HeapExhaustedError) as info:
            h.allocate(4 * G + 1)
        assert isinstance(info.value, RuntimeError)
        assert str(4 * G + 1) in str(info.value) and "SHMEMVM_HEAP_SIZE" in str(info.value)
        full = [h.allocate(G // 4, torch.float32) for _ in range(4)]   # G bytes each
        assert h.stats()["mapped"] == 4 * G and h.stats()["free"] == 0
        for n in (1, G):
            with pytest.raises(shmemvm.HeapExhaustedError, match="SHMEMVM_HEAP_SIZE"):
                h.allocate(n)
        assert h.stats()["live_allocations"] == 4
        h.free(full.pop())
        t = h.allocate(G)
        t.fill_(1)
        assert int(t.sum()) == G
        # a dropped (garbage-collected) tensor also makes room
        full.pop()
        gc.collect()
        u = h.allocate(100)
        assert h.owns_tensor(u) and h.stats()["live_allocations"] == 4


class FlakyHostBackend(HostBackend):
    """The host backend with one injected failure of map() on demand."""

    fail_next_map = False

    def map(self, va, size, handle):
        if self.fail_next_map:
            self.fail_next_map = False
            raise OSError(12, "injected mapping failure")
        super().map(va, size, handle)


@pytest.mark.parametrize("nbytes", [100, G, 3 * G])
def test_backend_failure_leaves_nothing_behind(nbytes):
    backend = FlakyHostBackend(granularity=G)
    with VMemPow2Allocator(8 * G, backend=backend) as h:
        keep = h.allocate(G)                  # one live segment already there
        keep.fill_(9)
        before, segs, fds = h.stats(), h.get_allocation_segments(), open_fds()
        backend.fail_next_map = True
        with pytest.raises(OSError, match="injected"):
            h.allocate(nbytes)
        assert h.stats() == before
        assert h.get_allocation_segments() == segs
        assert open_fds() == fds                  # the memfd made for it was closed
        t = h.allocate(nbytes)                # and the heap still works
        t.fill_(1)
        assert int(t.sum()) == nbytes and bool((keep == 9).all())


class StrictHostBackend(FlakyHostBackend):
    """Refuses to unmap what it never mapped, as cuMemUnmap does, and counts
    the handles it holds: the symmetric heap creates new memory, exports it
    and only then maps it (allocate_unmapped / map_created), so undoing such
    an allocation must release the handle without unmapping it."""

    def __init__(self, **options):
        super().__init__(**options)
        self.mapped: set[tuple[int, int]] = set()
        self.handles: set[int] = set()

    def create(self, size):
        handle = super().create(size)
        self.handles.add(handle)
        return handle

    def release(self, handle):
        self.handles.discard(handle)
        super().release(handle)

    def map(self, va, size, handle):
        super().map(va, size, handle)
        self.mapped.add((va, size))

    def unmap(self, va, size):
        assert (va, size) in self.mapped, f"unmapping {size} bytes at {va:#x}, never mapped"
        self.mapped.discard((va, size))
        super().unmap(va, size)


@pytest.mark.parametrize("when", ["before mapping", "mapping fails"])
def test_created_but_unmapped_segment_is_undone_without_unmapping(when):
    backend = StrictHostBackend(granularity=G)
    with HeapMemory(8 * G, backend=backend, release_dead=True) as h:
        keep = h.allocate(G)
        before, segs, fds = h.stats(), h.get_allocation_segments(), open_fds()
        held = set(backend.handles)
        block, created, failure = h.allocate_unmapped(2 * G)
        assert failure is None and len(created) == 1
        assert len(backend.handles) == len(held) + 1      # created ...
        assert len(backend.mapped) == 1                   # ... not mapped (only keep's)
        fd = h.export(created[0])                         # exportable before it is mapped
        os.close(fd)
        if when == "mapping fails":
            backend.fail_next_map = True
            with pytest.raises(OSError, match="injected"):
                h.map_created(created)
        h.undo_allocation(block, created)                 # as every PE does after the vote
        assert backend.handles == held and len(backend.mapped) == 1
        assert h.stats() == before and h.get_allocation_segments() == segs
        assert open_fds() == fds
        t = h.allocate(2 * G)                             # the heap still works
        t.fill_(3)
        assert int(t.sum()) == 3 * 2 * G and keep.numel() == G


def test_creation_failure_is_returned_with_what_it_was_for():
    """allocate_unmapped returns a backend failure (already undone here) with
    the block and segments, so the heap can tell its peers which step failed."""
    backend = StrictHostBackend(granularity=G)
    with HeapMemory(8 * G, backend=backend, release_dead=True) as h:
        before, fds = h.stats(), open_fds()

        def no_memory(size):
            raise OSError(12, "injected creation failure")
        backend.create = no_memory
        block, created, failure = h.allocate_unmapped(2 * G)
        del backend.create
        assert isinstance(failure, OSError) and "injected" in str(failure)
        assert block.size == 2 * G and [s.offset for s in created] == [block.offset]
        assert h.stats() == before and open_fds() == fds and not backend.handles


# ---------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------

@pytest.fixture
def frequent_thread_switches():
    """Switch threads far more often than the default 5 ms, so that races
    inside the allocator's bookkeeping have a chance to show."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_concurrent_allocate_free_drop(frequent_thread_switches):
    n_threads, steps = 6, 300
    errors: list[BaseException] = []
    kept: list[list[tuple[torch.Tensor, int]]] = [[] for _ in range(n_threads)]
    start = threading.Barrier(n_threads)
    with VMemPow2Allocator(1024 * G, backend="host", granularity=G) as h:
        def work(tid: int) -> None:
            rng = random.Random(tid)
            mine: list[tuple[torch.Tensor, int]] = []
            try:
                start.wait()
                for step in range(steps):
                    r = rng.random()
                    if r < 0.55 or not mine:
                        n = rng.choice([0, 1, 100, 1000, 5000, G, 2 * G + 3])
                        t = h.allocate(n, torch.uint8)
                        value = (tid * 31 + step) % 251 + 1
                        t.fill_(value)
                        mine.append((t, value))
                    elif r < 0.75:
                        t, value = mine.pop(rng.randrange(len(mine)))
                        assert bool((t == value).all()), "data overwritten by another thread"
                        h.free(t)
                    else:
                        t, value = mine.pop(rng.randrange(len(mine)))
                        assert bool((t == value).all()), "data overwritten by another thread"
                        del t                     # dropped: freed by the collector
                    if step % 50 == 0:
                        gc.collect()
                kept[tid] = mine
            except BaseException as e:      # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not any(th.is_alive() for th in threads)
        assert errors == []

        survivors = [pair for mine in kept for pair in mine]
        for t, value in survivors:
            assert bool((t == value).all())
            assert h.owns_tensor(t)
        spans = sorted(span(t) for t, _ in survivors)
        for (_, end), (begin, _) in zip(spans, spans[1:]):
            assert end <= begin, "live allocations overlap"
        stats = collect(h)
        assert stats["live_allocations"] == len(survivors)
        assert stats["mapped"] <= stats["heap_size"]

        kept.clear()
        del survivors, spans, t
        stats = collect(h)
        assert stats["live_allocations"] == 0 and stats["used"] == 0
        assert stats["requested"] == 0
        h.trim()
        assert h.stats()["mapped"] == 0 and h.get_allocation_segments() == []


# ---------------------------------------------------------------------------
# close, context manager, leaks
# ---------------------------------------------------------------------------

def test_close_releases_everything_and_later_calls_raise():
    h = VMemPow2Allocator(8 * G, backend="host", granularity=G)
    t = h.allocate(100, torch.float32)
    h.allocate(3 * G)
    assert h.stats()["segments"] == 2
    h.close()
    assert h.closed
    assert h.stats()["segments"] == 0
    for call in (lambda: h.allocate(10), lambda: h.free(t), lambda: h.trim(),
                 lambda: h.import_external_tensor(torch.zeros(2))):
        with pytest.raises(shmemvm.ShmemError, match="closed"):
            call()
    assert not h.owns_tensor(t)
    h.close()                                 # idempotent
    assert h.closed


def test_get_allocation_segments_raises_and_stats_are_zero_after_close():
    h = VMemPow2Allocator(8 * G, backend="host", granularity=G)
    h.allocate(G)
    h.close()
    with pytest.raises(shmemvm.ShmemError, match="closed"):
        h.get_allocation_segments()
    stats = h.stats()
    assert stats["heap_size"] == 8 * G
    assert stats["mapped"] == stats["used"] == stats["live_allocations"] == 0


def test_close_keeps_viewed_memory_until_its_views_die(monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    fds_before = open_fds()
    h = VMemPow2Allocator(4 * G, backend="host", granularity=G)
    t = h.allocate(100)
    t.fill_(7)
    v = t[10:]
    h.close()
    with pytest.raises(shmemvm.ShmemError, match="closed"):
        h.free(t)
    ref = weakref.ref(h)
    del h
    gc.collect()
    assert bool((v == 7).all()) and bool((t == 7).all())
    assert shmemvm_mappings()
    del t
    gc.collect()
    assert bool((v == 7).all())               # the view alone keeps it
    del v                                     # the last view: everything is released
    gc.collect()
    assert unraisable == []
    assert shmemvm_mappings() == []
    assert open_fds() == fds_before
    assert ref() is None                      # nothing holds the closed heap any more


def test_explicit_free_disarms_the_finalizer(vheap):
    t = vheap.allocate(100)
    vheap.free(t)
    del t
    gc.collect()
    assert len(vheap._mailbox.events) == 0    # nothing queued for a block already freed


def test_context_manager_closes():
    with VMemPow2Allocator(4 * G, backend="host", granularity=G) as h:
        assert isinstance(h, VMemPow2Allocator)
        t = h.allocate(10, torch.int32)
        t.fill_(5)
        assert int(t.sum()) == 50
        assert not h.closed
    assert h.closed and h.stats()["segments"] == 0
    with pytest.raises(shmemvm.ShmemError):
        h.allocate(1)


def test_context_manager_closes_on_exception():
    with pytest.raises(KeyError):
        with VMemPow2Allocator(4 * G, backend="host", granularity=G) as h:
            h.allocate(10)
            raise KeyError("boom")
    assert h.closed
    with pytest.raises(shmemvm.ShmemError):
        h.allocate(1)


def _maps() -> list[str]:
    with open("/proc/self/maps") as f:
        return f.read().splitlines()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_close_leaks_no_fd_or_mapping():
    def exercise():
        h = VMemPow2Allocator(32 * G, backend="host", granularity=G)
        keep = [h.allocate(n) for n in (1, 100, G, 3 * G, 5 * G)]
        for t in keep:
            t.fill_(1)
        h.free(keep.pop())
        h.trim()
        h.allocate(2 * G)
        span = (h.base, h.base + h.va_size)
        during = open_fds(), _maps()
        h.close()
        del keep
        return span, during

    exercise()                                  # warm up torch/ctypes/allocator paths
    gc.collect()
    fds_before, maps_before = open_fds(), _maps()
    span, (fds_during, maps_during) = exercise()
    gc.collect()
    fds_after, maps_after = open_fds(), _maps()

    # the check can see leaks: while open, memfds and mappings were there
    assert sum("memfd:shmemvm" in f for f in fds_during - fds_before) >= 4
    assert any("memfd:shmemvm" in line for line in maps_during)

    assert fds_after == fds_before
    # (the total count of mappings is not compared: Python's own allocator maps
    # and unmaps arenas at will; the heap's span and memfds are what we own)
    assert shmemvm_mappings() == []
    lo, hi = span
    for line in maps_after:
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if start < hi and lo < end:
            assert line in maps_before, f"mapping inside the closed heap remains: {line}"


@pytest.mark.parametrize("value, budget, expected", [
    (None, 1 << 30, 16 << 20),          # auto: heap size / 64
    ("auto", 3 << 29, 32 << 20),        # 1.5 GiB / 64 = 24 MiB, rounded up
    (None, 16 * G, G),                  # never below the granularity
    ("1M", 64 << 20, 1 << 20),          # as set
    ("1G", 3 * G, 2 * G),               # capped at the heap's largest power of two
])
def test_chunk_size(value, budget, expected):
    from shmemvm.memory.vmm import chunk_size
    assert chunk_size(value, budget, G) == expected


@pytest.mark.parametrize("value", ["100K", "32K", "lots"])
def test_bad_chunk_size_names_the_setting(value):
    from shmemvm.memory.vmm import chunk_size
    with pytest.raises(ValueError, match="SHMEMVM_CHUNK_SIZE"):
        chunk_size(value, 1 << 30, G)


def test_stats_report_the_chunk_and_small_blocks_share_it():
    with VMemPow2Allocator(64 * G, backend="host", granularity=G, chunk=4 * G) as h:
        tensors = [h.allocate(G) for _ in range(4)]
        stats = h.stats()
        assert stats["chunk"] == 4 * G and stats["segments"] == 1 and stats["mapped"] == 4 * G
        for t in tensors:
            h.free(t)
