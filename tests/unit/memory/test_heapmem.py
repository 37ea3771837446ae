"""The split of the allocator (issue 29): VMemPow2Allocator shows the documented
stand-alone API only; HeapMemory, the symmetric heap's engine, adds the steps
the heap takes one by one, keeps dead blocks until release(), and tells its
listeners what it releases (host backend, one process)."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest
import torch

from shmemvm import VMemPow2Allocator
from shmemvm.memory.heapmem import HeapMemory

G = 64 * 1024           # default host granularity (SHMEMVM_HOST_GRANULARITY)
README = Path(__file__).resolve().parents[3] / "README.md"

#: what the stand-alone allocator shows besides the methods README lists
DOCUMENTED_PROPERTIES = {"heap_size", "chunk", "device"}

#: the steps and lookups of HeapMemory that core/ and openshmem/ use
HEAP_STEPS = {"allocate_unmapped", "export", "map_created", "undo_allocation", "tensor_for",
              "resize", "allocate_external", "place_external", "external_tensor_for",
              "imported", "storage_start", "retire", "finish_free", "take_dead", "release",
              "hold", "block_of", "offset_of", "size_class", "allocator_state"}


def _readme_methods() -> set[str]:
    """The methods README's paragraph on the stand-alone allocator lists."""
    text = README.read_text()
    start = text.index("`shmemvm.VMemPow2Allocator(heap_size")
    end = text.find("\n\n", start)
    paragraph = text[start:end if end >= 0 else len(text)]
    return set(re.findall(r"`([a-z_]+)\(", paragraph))


def test_the_public_allocator_shows_the_documented_api_only():
    public = {name for name in dir(VMemPow2Allocator) if not name.startswith("_")}
    documented = _readme_methods() - {"shmemvm.VMemPow2Allocator"}
    assert "allocate" in documented and "close" in documented, documented
    assert public == documented | DOCUMENTED_PROPERTIES, (
        f"VMemPow2Allocator shows {sorted(public - documented - DOCUMENTED_PROPERTIES)} "
        f"beyond README's list and lacks {sorted(documented - public)}: a step of the "
        f"symmetric heap belongs to HeapMemory (memory/heapmem.py)")


def test_heap_memory_adds_the_heap_steps():
    public = {name for name in dir(HeapMemory) if not name.startswith("_")}
    assert HEAP_STEPS <= public, sorted(HEAP_STEPS - public)
    assert not HEAP_STEPS & set(dir(VMemPow2Allocator))


def _drop_one_block(h: VMemPow2Allocator) -> None:
    t = h.allocate(G)
    t.fill_(1)
    del t
    gc.collect()


def test_the_stand_alone_allocator_releases_a_dead_block_at_the_next_call():
    with VMemPow2Allocator(8 * G, backend="host", granularity=G) as h:
        _drop_one_block(h)
        assert h.stats()["live_allocations"] == 0


def test_heap_memory_keeps_a_dead_block_until_it_is_released():
    """The heap releases a block only once every PE agrees nothing views it."""
    with HeapMemory(8 * G, backend="host", granularity=G) as h:
        t = h.allocate(G)
        offset = h.offset_of(t)
        assert h.block_of(t).offset == offset
        del t
        gc.collect()
        assert h.stats()["live_allocations"] == 1      # dead, not released
        assert h.take_dead() == [offset]
        assert h.take_dead() == []                     # handed over once
        assert h.release(offset) is None
        assert h.stats()["live_allocations"] == 0


def test_heap_memory_releases_dead_blocks_itself_when_asked_to():
    with HeapMemory(8 * G, backend="host", granularity=G, release_dead=True) as h:
        _drop_one_block(h)
        assert h.stats()["live_allocations"] == 0


def test_every_release_listener_runs_though_one_fails():
    h = HeapMemory(8 * G, backend="host", granularity=G)
    seen: list[tuple[str, int]] = []

    def failing(segment):
        seen.append(("failing", segment.offset))
        raise OSError("injected listener failure")

    h.release_listeners.extend([failing, lambda segment: seen.append(("second", segment.offset))])
    t = h.allocate(G)
    offset = h.offset_of(t)
    h.free(t)
    assert seen == []                                  # cached, not released
    with pytest.raises(OSError, match="injected listener failure"):
        h.trim()
    assert seen == [("failing", offset), ("second", offset)]
    assert h.stats()["segments"] == 0                  # released all the same
    closed = []
    h.close_listeners.append(lambda: closed.append(True))
    h.close()
    assert closed == [True]


def test_close_listeners_wait_for_the_last_view():
    """A closed heap whose memory a tensor still views tells its close
    listeners only when that view dies (the heap lingers until then)."""
    h = HeapMemory(8 * G, backend="host", granularity=G, release_dead=True)
    closed = []
    h.close_listeners.append(lambda: closed.append(True))
    t = h.allocate(G)
    t.fill_(7)
    h.close()
    assert closed == [] and int(t.sum()) == 7 * G      # still mapped, still readable
    del t
    gc.collect()
    assert closed == [True]


def test_a_tensor_of_no_block_is_refused_by_both():
    foreign = torch.zeros(4)
    with HeapMemory(8 * G, backend="host", granularity=G) as h:
        assert not h.owns_tensor(foreign)
        with pytest.raises(Exception, match="not in this heap"):
            h.block_of(foreign)
