"""Tests of the pure power-of-two allocator (shmemvm.memory.buddy.Pow2Allocator).

No memory is mapped here: the allocator is bookkeeping only, so every property
is checked on offsets, sizes, segments and generations.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, initialize,
                                 invariant, multiple, rule)

import shmemvm
from shmemvm.memory.buddy import Pow2Allocator, Segment

G = 4096            # granularity used by most tests
MIN_BLOCK = 64
BUDGET = 8 * G
VA_SIZE = 32 * G


def make(budget=BUDGET, granularity=G, va_size=VA_SIZE, min_block=MIN_BLOCK,
         chunk=None) -> Pow2Allocator:
    return Pow2Allocator(budget, granularity, va_size, min_block, chunk)


def expected_class(nbytes: int, min_block: int = MIN_BLOCK) -> int:
    """The smallest power of two >= max(nbytes, min_block), computed naively."""
    size = 1
    while size < max(nbytes, min_block):
        size *= 2
    return size


# Sizes spread over every regime: tiny, sub-granularity, segments of several
# classes, and a few that exceed the whole heap.
sizes = st.one_of(
    st.integers(0, 2 * MIN_BLOCK),
    st.integers(0, G),
    st.integers(G // 2, 3 * G),
    st.sampled_from([0, 1, MIN_BLOCK - 1, MIN_BLOCK, MIN_BLOCK + 1, G - 1, G, G + 1,
                     2 * G, 4 * G, BUDGET, BUDGET + 1]),
)


def check_consistent(alloc: Pow2Allocator, live: dict[int, int]) -> None:
    """Every structural invariant, given `live`: offset -> requested nbytes."""
    segs = alloc.segments()
    assert [s.offset for s in segs] == sorted(s.offset for s in segs)
    by_offset = {s.offset: s for s in segs}

    # segments: aligned, inside VA, pairwise disjoint, within budget
    end = 0
    assert len(segs) <= alloc.budget // alloc.chunk, "more segments than budget / chunk"
    for s in segs:
        assert s.size >= alloc.chunk and s.size & (s.size - 1) == 0
        assert s.offset % s.size == 0
        assert 0 <= s.offset and s.offset + s.size <= alloc.va_size
        assert s.offset >= end, f"segments overlap at {s.offset:#x}"
        assert s.generation >= 1
        end = s.offset + s.size
    assert alloc.backed_bytes == sum(s.size for s in segs)
    assert alloc.backed_bytes <= alloc.budget
    assert 0 <= alloc.cached_bytes <= alloc.backed_bytes

    # blocks: class, alignment, disjointness, containment
    blocks = []
    for offset, nbytes in live.items():
        block = alloc.block_at(offset)
        assert block is not None, f"live block at {offset:#x} missing"
        assert block.offset == offset and block.nbytes == nbytes
        assert block.size == expected_class(nbytes, alloc.min_block)
        assert block.offset % block.size == 0
        seg = by_offset.get(block.segment.offset)
        assert seg == block.segment, "block refers to a segment that is not backed"
        assert seg.offset <= block.offset and block.offset + block.size <= seg.offset + seg.size
        if block.size >= alloc.chunk:
            assert (seg.offset, seg.size) == (block.offset, block.size)
        else:
            assert seg.size == alloc.chunk
        assert not alloc.is_cached(seg.offset), "a segment holding a live block is cached"
        assert alloc.find_block(offset) == block
        assert alloc.find_block(offset + block.size - 1) == block
        blocks.append((block.offset, block.offset + block.size))
    blocks.sort()
    for (_, a_end), (b_start, _) in zip(blocks, blocks[1:]):
        assert a_end <= b_start, "live blocks overlap"
    assert alloc.live_blocks == len(live)
    assert alloc.block_bytes == sum(expected_class(n, alloc.min_block) for n in live.values())
    assert alloc.requested_bytes == sum(live.values())

    # every backed segment is either in use or cached, never both
    used = {alloc.block_at(o).segment.offset for o in live}
    for s in segs:
        assert (s.offset in used) != alloc.is_cached(s.offset)
    assert alloc.cached_bytes == sum(s.size for s in segs if alloc.is_cached(s.offset))


def all_slots_blocked(alloc: Pow2Allocator, size: int) -> bool:
    """True when no size-aligned VA range of `size` is free of backed segments."""
    segs = [(s.offset, s.offset + s.size) for s in alloc.segments()]
    for start in range(0, alloc.va_size, size):
        if not any(a < start + size and start < b for a, b in segs):
            return False
    return True


# ---------------------------------------------------------------------------
# construction and argument checking
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(granularity=3000),                       # not a power of two
    dict(va_size=VA_SIZE + 1),                    # not a power of two
    dict(min_block=100),                          # not a power of two
    dict(budget=G + 1),                           # not a multiple of the granularity
    dict(budget=0),
    dict(budget=-G),
    dict(budget=2 * VA_SIZE),                     # larger than the VA range
    dict(min_block=2 * G),                        # larger than the granularity (= chunk)
    dict(chunk=3 * G),                            # not a power of two
    dict(chunk=G // 2),                           # smaller than the granularity
    dict(chunk=2 * BUDGET),                       # larger than the budget
    dict(chunk=2 * G, min_block=4 * G),           # min_block larger than the chunk
])
def test_constructor_rejects_bad_geometry(kwargs):
    with pytest.raises(ValueError):
        make(**kwargs)


@pytest.mark.parametrize("bad, exc", [
    (-1, ValueError), (-G, ValueError),
    (1.0, TypeError), (64.5, TypeError), (True, TypeError), (False, TypeError),
    ("64", TypeError), (None, TypeError), (b"\x40", TypeError), ([64], TypeError),
])
def test_bad_sizes_are_rejected_without_side_effects(bad, exc):
    alloc = make()
    before = alloc.state()
    with pytest.raises(exc):
        alloc.allocate(bad)
    assert alloc.state() == before
    assert alloc.take_released() == []
    block, created = alloc.allocate(8)      # still usable
    assert block.size == MIN_BLOCK and len(created) == 1


def test_integer_like_sizes_are_accepted():
    np = pytest.importorskip("numpy")
    alloc = make()
    block, _ = alloc.allocate(np.int64(100))
    assert block.nbytes == 100 and block.size == 128
    assert type(block.nbytes) is int


@pytest.mark.parametrize("nbytes, size", [
    (0, 64), (1, 64), (63, 64), (64, 64), (65, 128), (1000, 1024), (G - 1, G), (G, G),
    (G + 1, 2 * G), (3 * G, 4 * G), (BUDGET, BUDGET),
])
def test_size_class(nbytes, size):
    alloc = make()
    assert alloc.size_class(nbytes) == size
    block, _ = alloc.allocate(nbytes)
    assert block.size == size and block.offset % size == 0


def test_zero_byte_requests_get_distinct_blocks():
    alloc = make()
    blocks = [alloc.allocate(0)[0] for _ in range(5)]
    assert len({b.offset for b in blocks}) == 5
    assert all(b.size == MIN_BLOCK and b.nbytes == 0 for b in blocks)
    assert [b.serial for b in blocks] == sorted(b.serial for b in blocks)
    check_consistent(alloc, {b.offset: 0 for b in blocks})


# ---------------------------------------------------------------------------
# queries
# ---------------------------------------------------------------------------

def test_find_block():
    alloc = make()
    small, _ = alloc.allocate(100)
    big, _ = alloc.allocate(3 * G)
    for b in (small, big):
        assert alloc.find_block(b.offset) == b
        assert alloc.find_block(b.offset + b.nbytes // 2) == b
        assert alloc.find_block(b.offset + b.size - 1) == b
    # next to the small block (same segment, not allocated), outside, negative
    assert alloc.find_block(small.offset + small.size) is None
    assert alloc.find_block(-1) is None
    assert alloc.find_block(VA_SIZE) is None
    alloc.free(small.offset)
    assert alloc.find_block(small.offset) is None
    assert alloc.find_block(big.offset + 1) == big


def test_free_unknown_offsets_raise_keyerror_and_change_nothing():
    alloc = make()
    block, _ = alloc.allocate(200)
    before = alloc.state()
    for offset in (block.offset + 1, block.offset + block.size, VA_SIZE, -64):
        with pytest.raises(KeyError):
            alloc.free(offset)
    assert alloc.state() == before
    assert alloc.free(block.offset) == block
    with pytest.raises(KeyError):
        alloc.free(block.offset)       # double free


def test_trim_returns_cached_bytes_and_reports_released_segments():
    alloc = make()
    a, ca = alloc.allocate(G)
    b, cb = alloc.allocate(10)
    assert alloc.trim() == 0 and alloc.take_released() == []
    alloc.free(a.offset)
    alloc.free(b.offset)
    assert alloc.cached_bytes == 2 * G
    assert alloc.trim() == 2 * G
    released = alloc.take_released()
    assert sorted(released, key=lambda s: s.offset) == sorted(ca + cb, key=lambda s: s.offset)
    assert alloc.take_released() == []
    assert alloc.backed_bytes == 0 and alloc.cached_bytes == 0 and alloc.segments() == []


# ---------------------------------------------------------------------------
# segment cache, eviction, generations
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [G, 2 * G + 5, 4 * G])
def test_freed_segment_is_reused_for_same_class(nbytes):
    alloc = make()
    first, created = alloc.allocate(nbytes)
    assert [s.offset for s in created] == [first.offset]
    alloc.free(first.offset)
    assert alloc.is_cached(first.offset)
    again, created = alloc.allocate(nbytes)
    assert created == []
    assert again.offset == first.offset
    assert again.segment == first.segment            # same offset, size and generation
    assert alloc.take_released() == []
    assert again.serial > first.serial


def test_freed_small_segment_is_reused_by_small_blocks():
    alloc = make()
    a, created = alloc.allocate(100)
    assert len(created) == 1 and created[0].size == G
    alloc.free(a.offset)
    assert alloc.is_cached(created[0].offset)
    b, created2 = alloc.allocate(300)
    assert created2 == []
    assert b.segment == a.segment
    assert not alloc.is_cached(a.segment.offset)


def test_small_segment_is_reused_as_a_granularity_segment():
    alloc = make()
    a, created = alloc.allocate(100)
    alloc.free(a.offset)
    big, created2 = alloc.allocate(G)
    assert created2 == [] and big.segment == created[0]


def test_evicted_segment_recreated_gets_higher_generation_under_budget_pressure():
    alloc = make(budget=2 * G, va_size=8 * G)
    a, ca = alloc.allocate(G)                 # offset 0, generation 1
    assert ca == [Segment(0, G, 1)]
    alloc.free(a.offset)                      # cached
    big, cb = alloc.allocate(2 * G)           # needs the whole budget: evicts `a`
    assert alloc.take_released() == [a.segment]
    assert len(cb) == 1 and cb[0].size == 2 * G
    alloc.free(big.offset)                    # cached
    again, cc = alloc.allocate(G)             # evicts `big`, re-creates offset 0
    assert alloc.take_released() == [big.segment]
    assert again.offset == a.offset
    assert cc == [again.segment]
    assert again.segment.generation > a.segment.generation
    assert alloc.backed_bytes == G <= alloc.budget


def test_generation_increases_after_trim_and_recreate():
    alloc = make()
    gens = []
    for _ in range(4):
        block, created = alloc.allocate(G)
        assert [s.offset for s in created] == [0]
        gens.append(block.segment.generation)
        alloc.free(block.offset)
        alloc.trim()
        assert alloc.take_released() == [block.segment]
    assert gens == [1, 2, 3, 4]


def test_oldest_cached_segment_is_evicted_first():
    alloc = make(budget=4 * G, va_size=16 * G)
    blocks = [alloc.allocate(G)[0] for _ in range(4)]
    order = [2, 0, 3, 1]
    for i in order:
        alloc.free(blocks[i].offset)
    # a 2G segment needs two evictions: the two freed first
    _, created = alloc.allocate(2 * G)
    released = alloc.take_released()
    assert released == [blocks[2].segment, blocks[0].segment]
    assert len(created) == 1
    assert alloc.backed_bytes == 4 * G


# ---------------------------------------------------------------------------
# exhaustion
# ---------------------------------------------------------------------------

def test_request_larger_than_heap_raises_clear_error_and_allocator_stays_usable():
    alloc = make()
    keep, _ = alloc.allocate(500)
    before = alloc.state()
    nbytes = BUDGET + 1
    with pytest.raises(shmemvm.HeapExhaustedError) as info:
        alloc.allocate(nbytes)
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, shmemvm.ShmemError)
    message = str(info.value)
    assert str(nbytes) in message
    assert "SHMEMVM_HEAP_SIZE" in message
    assert alloc.state() == before
    block, _ = alloc.allocate(BUDGET // 2)
    check_consistent(alloc, {keep.offset: 500, block.offset: BUDGET // 2})


def test_heap_full_of_live_data_raises_then_recovers_after_free():
    alloc = make()
    live = {}
    for _ in range(BUDGET // G):
        block, _ = alloc.allocate(G)
        live[block.offset] = G
    assert alloc.backed_bytes == BUDGET
    before = alloc.state()
    for nbytes in (G, 1, 0, 2 * G):
        with pytest.raises(shmemvm.HeapExhaustedError) as info:
            alloc.allocate(nbytes)
        assert f"cannot allocate {nbytes} bytes" in str(info.value)
        assert "SHMEMVM_HEAP_SIZE" in str(info.value)
        assert alloc.state() == before
    victim = min(live)
    alloc.free(victim)
    del live[victim]
    block, created = alloc.allocate(G - 1)
    assert created == [] and block.offset == victim
    live[block.offset] = G - 1
    check_consistent(alloc, live)


def test_small_blocks_fill_heap_then_recover():
    alloc = make(budget=2 * G, va_size=4 * G, min_block=1024)
    blocks = [alloc.allocate(1000)[0] for _ in range(2 * G // 1024)]
    assert alloc.backed_bytes == 2 * G
    with pytest.raises(shmemvm.HeapExhaustedError, match="SHMEMVM_HEAP_SIZE"):
        alloc.allocate(1)
    alloc.free(blocks[3].offset)
    again, created = alloc.allocate(1)
    assert again.offset == blocks[3].offset and created == []


def test_fragmented_va_raises_and_names_the_cause():
    # VA equal to the budget: live G segments at both halves leave no 2G range.
    alloc = make(budget=4 * G, va_size=4 * G)
    blocks = [alloc.allocate(G)[0] for _ in range(4)]
    alloc.free(blocks[1].offset)
    alloc.free(blocks[2].offset)
    with pytest.raises(shmemvm.HeapExhaustedError, match="fragmented") as info:
        alloc.allocate(2 * G)
    assert "SHMEMVM_HEAP_SIZE" in str(info.value)
    # the cached segments were evicted while looking for space
    assert alloc.cached_bytes == 0
    alloc.free(blocks[0].offset)
    block, created = alloc.allocate(2 * G)
    assert block.offset == 0 and len(created) == 1


# ---------------------------------------------------------------------------
# property tests
# ---------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), sizes),
        st.tuples(st.just("free"), st.integers(0, 10 ** 6)),
        st.tuples(st.just("trim"), st.just(0)),
    ),
    max_size=60,
)


def run_ops(alloc: Pow2Allocator, program) -> list:
    """Apply `program`, returning a transcript of every answer."""
    live: list[int] = []
    transcript = []
    for op, arg in program:
        if op == "alloc":
            try:
                block, created = alloc.allocate(arg)
            except shmemvm.HeapExhaustedError as e:
                transcript.append(("oom", str(e), alloc.take_released()))
                continue
            live.append(block.offset)
            transcript.append(("alloc", block, created, alloc.take_released()))
        elif op == "free" and live:
            offset = live.pop(arg % len(live))
            transcript.append(("free", alloc.free(offset), alloc.take_released()))
        elif op == "trim":
            transcript.append(("trim", alloc.trim(), alloc.take_released()))
    transcript.append(("end", alloc.state()))
    return transcript


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from([G, 2 * G, 4 * G]))
def test_same_requests_give_identical_answers(program, chunk):
    a, b = make(chunk=chunk), make(chunk=chunk)
    assert run_ops(a, program) == run_ops(b, program)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(sizes, max_size=40), st.randoms(use_true_random=False))
def test_free_everything_and_trim_restores_initial_state(requests, rnd):
    alloc = make()
    initial = alloc.state()
    live = {}
    for nbytes in requests:
        try:
            block, _ = alloc.allocate(nbytes)
        except shmemvm.HeapExhaustedError:
            continue
        live[block.offset] = nbytes
        assert alloc.backed_bytes <= alloc.budget
    check_consistent(alloc, live)
    order = list(live)
    rnd.shuffle(order)
    for offset in order:
        alloc.free(offset)
    assert alloc.live_blocks == 0 and alloc.block_bytes == 0 and alloc.requested_bytes == 0
    assert alloc.backed_bytes == alloc.cached_bytes
    alloc.trim()
    assert alloc.state() == initial
    assert alloc.segments() == [] and alloc.backed_bytes == 0 and alloc.cached_bytes == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2 * G), min_size=1, max_size=60))
def test_blocks_aligned_sized_and_disjoint(requests):
    alloc = make(budget=64 * G, va_size=128 * G)
    live = {}
    for nbytes in requests:
        block, _ = alloc.allocate(nbytes)
        assert block.size == expected_class(nbytes)
        assert block.offset % block.size == 0
        live[block.offset] = nbytes
    check_consistent(alloc, live)


# ---------------------------------------------------------------------------
# stateful model: random interleavings of allocate / free / trim
# ---------------------------------------------------------------------------

class AllocatorMachine(RuleBasedStateMachine):
    """Drives two allocators in lockstep (they must agree on everything) and
    checks every invariant after each step."""

    blocks = Bundle("blocks")

    @initialize(geometry=st.sampled_from([
        (8 * G, G, 32 * G, 64),
        (4 * G, G, 4 * G, 64),       # VA == budget: fragmentation is reachable
        (16 * G, G, 64 * G, 256),
        (2 * G, G, 2 * G, G),        # no sub-granularity blocks at all
        (16 * G, G, 64 * G, 64, 4 * G),  # chunks of 4G: blocks up to 2G are carved
        (8 * G, G, 8 * G, 256, 2 * G),   # chunks, and fragmentation reachable
    ]))
    def setup(self, geometry):
        self.a = Pow2Allocator(*geometry)
        self.b = Pow2Allocator(*geometry)
        self.initial = self.a.state()
        self.live: dict[int, int] = {}
        self.generations: dict[int, int] = {}     # offset -> last generation seen
        self.segment_gen: dict[int, int] = {}     # block offset -> its segment's generation

    def _both(self, method, *args):
        """Call `method` on both allocators; they must answer alike."""
        results = []
        for alloc in (self.a, self.b):
            try:
                results.append(("ok", getattr(alloc, method)(*args), alloc.take_released()))
            except shmemvm.HeapExhaustedError as e:
                results.append(("oom", str(e), alloc.take_released()))
        assert results[0] == results[1]
        return results[0]

    def _note_released(self, released):
        current = set(self.a.segments())
        for seg in released:
            assert seg not in current, "a released segment is still reported as backed"
            assert all(not (seg.offset <= o < seg.offset + seg.size) for o in self.live), \
                "a segment holding a live block was released"

    def _note_created(self, created):
        for seg in created:
            previous = self.generations.get(seg.offset, 0)
            assert seg.generation == previous + 1, "generation must increase by one per re-creation"
            self.generations[seg.offset] = seg.generation

    @rule(target=blocks, nbytes=sizes)
    def allocate(self, nbytes):
        alloc = self.a
        size = expected_class(nbytes, alloc.min_block)
        needed = max(size, alloc.chunk)
        live_bytes_before = alloc.backed_bytes - alloc.cached_bytes
        status, answer, released = self._both("allocate", nbytes)
        self._note_released(released)
        if status == "oom":
            assert f"cannot allocate {nbytes} bytes" in answer
            assert "SHMEMVM_HEAP_SIZE" in answer
            if "fragmented" in answer:
                # every cached segment was evicted, and truly no aligned range is free
                assert alloc.cached_bytes == 0
                assert all_slots_blocked(alloc, needed)
            else:
                assert size > alloc.budget or live_bytes_before + needed > alloc.budget
            return multiple()
        block, created = answer
        self._note_created(created)
        for seg in created:
            assert seg in alloc.segments()
        assert alloc.backed_bytes <= alloc.budget
        self.live[block.offset] = nbytes
        self.segment_gen[block.offset] = block.segment.generation
        return block.offset

    @rule(offset=consumes(blocks))
    def free(self, offset):
        status, block, released = self._both("free", offset)
        assert status == "ok" and released == []
        assert block.offset == offset and block.nbytes == self.live.pop(offset)

    @rule(target=blocks, offset=consumes(blocks))
    def free_then_reallocate_same_class(self, offset):
        nbytes = self.live[offset]
        self.free(offset)
        status, (block, created), released = self._both("allocate", nbytes)
        assert status == "ok"
        assert created == [] and released == [], "same class after a free must reuse, not create"
        assert block.segment.generation == self.generations[block.segment.offset]
        self.live[block.offset] = nbytes
        return block.offset

    @rule()
    def trim(self):
        cached = self.a.cached_bytes
        status, freed, released = self._both("trim")
        assert freed == cached == sum(s.size for s in released)
        self._note_released(released)
        assert self.a.cached_bytes == 0

    @invariant()
    def consistent(self):
        if hasattr(self, "a"):
            check_consistent(self.a, self.live)
            assert self.a.state() == self.b.state()

    def teardown(self):
        if not hasattr(self, "a"):
            return
        for offset in sorted(self.live):
            self._both("free", offset)
        self._both("trim")
        assert self.a.state() == self.initial
        assert self.b.state() == self.initial


AllocatorMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40,
                                              deadline=None)
TestAllocatorMachine = AllocatorMachine.TestCase


# ---------------------------------------------------------------------------
# a longer deterministic soak, cheap and seeded
# ---------------------------------------------------------------------------

def test_seeded_soak_keeps_invariants_and_never_exceeds_budget():
    rng = random.Random(1234)
    alloc = make(budget=32 * G, va_size=128 * G)
    twin = make(budget=32 * G, va_size=128 * G)
    live: dict[int, int] = {}
    ooms = 0
    for step in range(3000):
        if live and rng.random() < 0.45:
            offset = rng.choice(sorted(live))
            assert alloc.free(offset) == twin.free(offset)
            del live[offset]
        elif rng.random() < 0.02:
            assert alloc.trim() == twin.trim()
        else:
            nbytes = rng.choice([rng.randrange(0, 512), rng.randrange(0, G),
                                 rng.randrange(G, 8 * G)])
            try:
                block, created = alloc.allocate(nbytes)
            except shmemvm.HeapExhaustedError:
                ooms += 1
                with pytest.raises(shmemvm.HeapExhaustedError):
                    twin.allocate(nbytes)
            else:
                assert twin.allocate(nbytes) == (block, created)
                live[block.offset] = nbytes
        assert alloc.take_released() == twin.take_released()
        assert alloc.backed_bytes <= alloc.budget
        if step % 100 == 0:
            check_consistent(alloc, live)
    check_consistent(alloc, live)
    assert ooms > 0, "the soak should reach the budget at least once"


# -- quick lists: a freed small block is taken back without splitting and merging
def test_a_freed_small_block_is_taken_back_at_once_and_its_idle_chunk_counts_as_cached():
    alloc = make()
    a, created = alloc.allocate(100)
    alloc.free(a.offset)
    chunk = created[0].offset
    assert alloc.is_cached(chunk) and alloc.cached_bytes == G   # idle: counted as cached
    b, created2 = alloc.allocate(100)
    assert created2 == [] and b.offset == a.offset and b.segment == a.segment
    assert not alloc.is_cached(chunk) and alloc.cached_bytes == 0
    alloc.free(b.offset)
    assert alloc.trim() == G and [s.offset for s in alloc.take_released()] == [chunk]
    assert alloc.backed_bytes == alloc.cached_bytes == 0 and alloc.segments() == []


def test_an_idle_chunk_is_evicted_when_the_budget_needs_its_memory():
    alloc = make(budget=2 * G)
    small, _ = alloc.allocate(100)
    alloc.free(small.offset)                       # idle chunk: G cached
    big, created = alloc.allocate(2 * G)           # needs the whole budget
    assert [s.size for s in created] == [2 * G]
    assert [s.offset for s in alloc.take_released()] == [small.segment.offset]
    assert alloc.backed_bytes == 2 * G and alloc.cached_bytes == 0


def test_an_idle_chunk_can_be_evicted_by_offset():
    alloc = make()
    small, created = alloc.allocate(100)
    alloc.free(small.offset)
    alloc.evict(created[0].offset)                 # as undo_allocation does
    assert alloc.take_released() == created and alloc.backed_bytes == alloc.cached_bytes == 0


def test_many_freed_small_blocks_are_merged_and_their_chunks_cached():
    alloc = make(budget=16 * G, va_size=64 * G)
    blocks = [alloc.allocate(64)[0] for _ in range(600)]      # 10 chunks of 64 blocks
    chunks = sorted({b.segment.offset for b in blocks})
    for block in blocks:
        alloc.free(block.offset)
    assert all(alloc.is_cached(c) for c in chunks) and alloc.cached_bytes == len(chunks) * G
    # after the merge every chunk is whole again: one of them serves a whole-granularity segment
    seg, created = alloc.allocate(G)
    assert created == [] and seg.offset in chunks


# -- chunks: every block below the chunk size is carved from chunk-sized segments
C = 4 * G   # chunk size of these tests


def test_blocks_below_the_chunk_size_share_one_chunk_segment():
    alloc = make(budget=16 * G, va_size=64 * G, chunk=C)
    first, created = alloc.allocate(G)
    assert created == [Segment(0, C, 1)]
    live = {first.offset: G}
    for nbytes in (G, G - 1, 100):           # in the rest of the chunk: nothing new
        block, created = alloc.allocate(nbytes)
        assert created == [] and block.segment == first.segment
        live[block.offset] = nbytes
    assert alloc.backed_bytes == C
    block, created = alloc.allocate(G)       # no free G left in it: a second chunk
    assert [s.size for s in created] == [C] and block.offset == created[0].offset
    live[block.offset] = G
    check_consistent(alloc, live)


def test_a_block_of_the_chunk_size_or_more_is_a_segment_of_its_own():
    alloc = make(budget=16 * G, va_size=64 * G, chunk=C)
    for nbytes in (C, C + 1):
        block, created = alloc.allocate(nbytes)
        assert created == [block.segment]
        assert (block.segment.offset, block.segment.size) == (block.offset, block.size)


def test_a_chunk_is_returned_only_when_every_block_in_it_is_free():
    alloc = make(budget=16 * G, va_size=64 * G, chunk=C)
    a, created = alloc.allocate(G)
    b, _ = alloc.allocate(G)
    alloc.free(a.offset)
    assert alloc.trim() == 0 and alloc.take_released() == []   # b still lives in it
    assert alloc.backed_bytes == C and not alloc.is_cached(created[0].offset)
    alloc.free(b.offset)
    assert alloc.is_cached(created[0].offset) and alloc.cached_bytes == C
    assert alloc.trim() == C and alloc.take_released() == created


def test_quick_lists_serve_blocks_between_the_granularity_and_the_chunk():
    alloc = make(budget=16 * G, va_size=64 * G, chunk=C)
    keep, _ = alloc.allocate(G)
    a, _ = alloc.allocate(2 * G)
    alloc.free(a.offset)
    assert alloc._quick[(2 * G).bit_length() - 1] == [a.offset]
    again, created = alloc.allocate(2 * G - 5)
    assert created == [] and again.offset == a.offset and again.segment == a.segment
    check_consistent(alloc, {keep.offset: G, again.offset: 2 * G - 5})


def test_a_cached_chunk_sized_segment_serves_as_a_chunk_and_back():
    alloc = make(budget=16 * G, va_size=64 * G, chunk=C)
    big, created = alloc.allocate(C)
    alloc.free(big.offset)
    small, created2 = alloc.allocate(10)
    assert created2 == [] and small.segment == big.segment
    alloc.free(small.offset)
    big2, created3 = alloc.allocate(C)       # the idle chunk, whole again
    assert created3 == [] and big2.segment == big.segment


def test_the_chunk_is_named_where_chunks_exhaust_the_heap():
    alloc = make(budget=2 * C, va_size=64 * G, chunk=C)
    alloc.allocate(C)
    alloc.allocate(C // 2)
    with pytest.raises(shmemvm.HeapExhaustedError, match="SHMEMVM_CHUNK_SIZE"):
        alloc.allocate(C)
    with pytest.raises(shmemvm.HeapExhaustedError) as info:
        make(budget=2 * G, va_size=8 * G).allocate(4 * G)
    assert "SHMEMVM_CHUNK_SIZE" not in str(info.value)  # chunk = granularity: not the cause


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2 * C)), max_size=80),
       st.sampled_from([G, 2 * G, C, 8 * G]))
def test_segments_never_exceed_budget_over_chunk_whatever_the_pattern(program, chunk):
    alloc = make(budget=32 * G, va_size=128 * G, chunk=chunk)
    live: dict[int, int] = {}
    for is_free, n in program:
        if is_free and live:
            offset = sorted(live)[n % len(live)]
            alloc.free(offset)
            del live[offset]
        else:
            try:
                block, _ = alloc.allocate(n)
            except shmemvm.HeapExhaustedError:
                continue
            live[block.offset] = n
        alloc.take_released()
        assert len(alloc.segments()) <= alloc.budget // chunk
    check_consistent(alloc, live)


def test_cached_block_is_the_block_allocate_takes_and_changes_nothing():
    """HeapCore.allocate fills the block cached_block() names before its agreed
    step: it must be exactly what allocate() then returns, and asking must not
    change the allocator."""
    a = make()
    rng = random.Random(7)
    live = []
    for _ in range(400):
        nbytes = rng.choice([1, 64, 100, 128, 1000, 4096, 65536, 3 << 20])
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
            continue
        before = a.state()
        guess = a.cached_block(nbytes)
        assert a.state() == before
        try:
            block, created = a.allocate(nbytes)
        except shmemvm.HeapExhaustedError:
            continue
        live.append(block.offset)
        if a.size_class(nbytes) >= a.chunk:
            assert guess is None
        elif guess is not None and guess >= 0:
            assert block.offset == guess and not created
        else:
            assert guess == -1
    assert a.cached_block(-1) is None and a.cached_block(1.5) is None
