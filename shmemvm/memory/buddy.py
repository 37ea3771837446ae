"""Pure power-of-two bookkeeping for one heap: no I/O, no MPI, no clocks.

Given the same sequence of requests, every PE computes the same offsets, the
same segments and the same evictions, which is what lets a collective malloc
cost a single agreement instead of an exchange of addresses.

Layout
  - The VA range [0, va_size) is a buddy system whose smallest unit is the
    backend granularity G. A request of class >= the chunk size C (a power
    of two >= G) takes a block of its own there: a *segment*, backed by one
    physical piece.
  - Requests below C are carved by a second buddy system out of C-sized
    chunks (segments too); a chunk goes back when its last block does.
    Every segment is thus at least C bytes, so a heap never has more than
    budget / C of them, whatever the allocation pattern: each segment costs
    a file descriptor and a mapping per PE of the node, and those are
    limited per process (RLIMIT_NOFILE, vm.max_map_count). The price: a
    chunk's physical memory is returned (trim, eviction) only when every
    block in it is free, and one small allocation keeps a whole chunk
    backed. C = G reproduces one segment per allocation of G and above.
  - A segment whose block is freed stays backed, in a cache ordered by age:
    a later request of the same class reuses it at no cost. When a fresh
    segment would exceed the physical budget, the oldest cached segments are
    evicted first (their VA returns to the buddy system).
  - Every offset has a generation that increases each time a new physical
    piece is placed there; peers key their mappings by it.

The backing layer (vmem.py) maps what `allocate` reports as created and
unmaps what `take_released` returns.
"""

from __future__ import annotations

import heapq
import operator
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import HeapExhaustedError


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def format_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class Segment:
    """One physical piece: [offset, offset + size), placed there for the
    `generation`-th time."""
    offset: int
    size: int
    generation: int


class Block(NamedTuple):
    """A live allocation. `serial` numbers allocations in request order.
    Immutable; a named tuple because one is made per allocation, and a frozen
    dataclass cost three times as much to make (the allocator makes them with
    _new_block)."""
    offset: int
    size: int
    nbytes: int
    segment: Segment
    serial: int


_new_block = tuple.__new__   # _new_block(Block, (offset, size, nbytes, segment, serial))


class Buddy:
    """Free lists of a buddy system between 2**min_order and 2**max_order.

    `free` maps the offset of each free block to its order; per-order heaps
    give the lowest free offset first (deterministic) and are cleaned lazily.
    """

    def __init__(self, min_order: int, max_order: int):
        self.min_order = min_order
        self.max_order = max_order
        self.free: dict[int, int] = {}
        self._heaps: list[list[int]] = [[] for _ in range(max_order + 1)]
        self._counts = [0] * (max_order + 1)

    def _push(self, offset: int, order: int) -> None:
        self.free[offset] = order
        self._counts[order] += 1
        heap = self._heaps[order]
        heapq.heappush(heap, offset)
        if len(heap) > 64 + 4 * self._counts[order]:  # too many stale entries
            self._heaps[order] = [o for o, k in self.free.items() if k == order]
            heapq.heapify(self._heaps[order])

    def _drop(self, offset: int) -> None:
        self._counts[self.free.pop(offset)] -= 1

    def add(self, offset: int, order: int) -> None:
        """Give back a block, merging it with free buddies up to max_order."""
        while order < self.max_order:
            buddy = offset ^ (1 << order)
            if self.free.get(buddy) != order:
                break
            self._drop(buddy)
            offset = min(offset, buddy)
            order += 1
        self._push(offset, order)

    def take(self, order: int) -> int | None:
        """The lowest-offset free block of `order`, splitting a larger one if needed."""
        for k in range(order, self.max_order + 1):
            heap = self._heaps[k]
            while heap and self.free.get(heap[0]) != k:
                heapq.heappop(heap)  # stale
            if heap:
                offset = heapq.heappop(heap)
                self._drop(offset)
                while k > order:
                    k -= 1
                    self._push(offset + (1 << k), k)
                return offset
        return None

    def remove(self, offset: int, order: int) -> None:
        """Take out a specific free block (heap entry goes stale)."""
        if self.free.get(offset) != order:
            raise AssertionError(f"block {offset:#x} of order {order} is not free")
        self._drop(offset)


class Pow2Allocator:
    def __init__(self, budget: int, granularity: int, va_size: int, min_block: int = 64,
                 chunk: int | None = None):
        chunk = granularity if chunk is None else chunk
        for name, value in (("granularity", granularity), ("va_size", va_size),
                            ("min_block", min_block), ("chunk", chunk)):
            if not is_pow2(value):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if budget <= 0 or budget % granularity or budget > va_size:
            raise ValueError(f"budget {budget} must be a positive multiple of the "
                             f"granularity {granularity} and at most va_size {va_size}")
        if not granularity <= chunk <= budget:
            raise ValueError(f"chunk {chunk} must be at least the granularity {granularity} "
                             f"and at most the budget {budget}")
        if min_block > chunk:
            raise ValueError(f"min_block {min_block} exceeds the chunk size {chunk}")
        self.budget = budget
        self.granularity = granularity
        self.va_size = va_size
        self.min_block = min_block
        #: blocks smaller than this are carved from segments of this size
        self.chunk = chunk
        self._chunk_order = chunk.bit_length() - 1
        self._va = Buddy(granularity.bit_length() - 1, va_size.bit_length() - 1)
        self._va.add(0, self._va.max_order)
        self._small = Buddy(min_block.bit_length() - 1, self._chunk_order)
        self._segments: dict[int, Segment] = {}      # every backed segment
        self._small_users: dict[int, int] = {}      # small segment -> live blocks in it
        # Freed small blocks not yet merged back, by order, last freed on top: a
        # malloc of a size just freed takes it back at once, without splitting
        # and merging a chunk every time. A chunk whose blocks are all free
        # (its users 0) is "idle": counted as cached at once, and moved to the
        # segment cache when the quick lists are merged (_flush_quick: before
        # any new or evicted segment, at trim, or when they grow too long).
        # (native/blocks.c takes and gives back such blocks in one call, on these same
        # attributes by name: allocate()'s quick branch and free()'s small one)
        self._quick: list[list[int]] = [[] for _ in range(self._chunk_order)]
        self._quick_blocks = 0
        self._idle: dict[int, None] = {}  # idle chunks, in the order they became idle
        self._cache: OrderedDict[int, Segment] = OrderedDict()  # freed, still backed; oldest first
        self._cache_by_size: dict[int, list[int]] = {}  # size -> heap of cached offsets
        self._generations: dict[int, int] = {}
        self._blocks: dict[int, Block] = {}
        #: segments evicted and not yet taken (take_released): to be unmapped
        self.released: list[Segment] = []
        self._external: dict[int, Segment] = {}   # address ranges of imported memory
        self._serial = 0
        self.backed_bytes = 0   # live + cached segments
        self.cached_bytes = 0
        self.block_bytes = 0    # sum of live block sizes
        self.requested_bytes = 0

    # -- queries --------------------------------------------------------------
    @property
    def live_blocks(self) -> int:
        return len(self._blocks)

    def block_at(self, offset: int) -> Block | None:
        return self._blocks.get(offset)

    def find_block(self, offset: int) -> Block | None:
        """The live block containing `offset`, if any."""
        if not 0 <= offset < self.va_size:
            return None
        size = self.min_block
        while size <= self.va_size:
            block = self._blocks.get(offset & ~(size - 1))
            if block is not None and block.size == size:
                return block
            size <<= 1
        return None

    def segments(self) -> list[Segment]:
        return [self._segments[o] for o in sorted(self._segments)]

    def is_cached(self, offset: int) -> bool:
        return offset in self._cache or offset in self._idle

    def size_class(self, nbytes: int) -> int:
        return max(self.min_block, next_pow2(nbytes))

    def state(self) -> tuple:
        """Everything that decides future answers, for comparing allocators."""
        return (sorted(self._va.free.items()), sorted(self._small.free.items()),
                tuple(map(tuple, self._quick)), tuple(self._idle), tuple(self._cache),
                sorted(self._blocks), sorted(self._segments), self.backed_bytes,
                sorted(self._external))

    # -- requests -------------------------------------------------------------
    def allocate(self, nbytes: int) -> tuple[Block, list[Segment]]:
        """A block for `nbytes` and the segments created for it (to be backed)."""
        if type(nbytes) is not int or nbytes < 0:  # (a plain int needs no check)
            nbytes = _check_size(nbytes)
        # = size_class(nbytes), inline
        size = self.min_block if nbytes <= self.min_block else 1 << (nbytes - 1).bit_length()
        if size > self.budget:
            raise HeapExhaustedError(self._exhausted_message(nbytes, size, "exceeds the whole heap"))
        created: list[Segment] = []
        chunk_size = self.chunk
        if size >= chunk_size:
            segment = self._take_segment(size, nbytes, created)
            offset = segment.offset
        else:
            quick = self._quick[size.bit_length() - 1]
            if quick:  # a block of this size freed lately: taken back as it is
                offset = quick.pop()
                self._quick_blocks -= 1
            else:
                order = size.bit_length() - 1
                taken = self._small.take(order)
                if taken is None and self._quick_blocks:
                    self._flush_quick()
                    taken = self._small.take(order)
                if taken is None:
                    chunk = self._take_segment(self.chunk, nbytes, created)
                    self._small_users[chunk.offset] = 0
                    self._small.add(chunk.offset, self._chunk_order)
                    taken = self._small.take(order)
                    assert taken is not None, "a new chunk holds a block of every smaller size"
                offset = taken
            chunk_offset = offset & -chunk_size   # (= ~(chunk_size - 1))
            if self._idle and chunk_offset in self._idle:  # in use again
                del self._idle[chunk_offset]
                self.cached_bytes -= chunk_size
            self._small_users[chunk_offset] += 1
            segment = self._segments[chunk_offset]
        self._serial = serial = self._serial + 1
        block = self._blocks[offset] = _new_block(Block, (offset, size, nbytes, segment, serial))
        self.block_bytes += size
        self.requested_bytes += nbytes
        return block, created

    def cached_block(self, nbytes: int) -> int | None:
        """For a small request (its size class below the chunk): the offset
        allocate(nbytes) gives now where that is a block of its size class
        freed lately (taken back as it is, creating nothing), else -1; None
        for any other request. Changes nothing: a collective allocation fills
        that block before its agreement (HeapCore.allocate), and checks after
        it that the block is the one it got."""
        if type(nbytes) is not int or nbytes < 0:
            return None
        size = self.min_block if nbytes <= self.min_block else 1 << (nbytes - 1).bit_length()
        if size >= self.chunk or size > self.budget:
            return None
        quick = self._quick[size.bit_length() - 1]
        return quick[-1] if quick else -1

    def allocate_external(self, nbytes: int) -> Block:
        """A granularity-aligned address range of at least `nbytes` for memory
        made elsewhere (import_external_tensor): it takes VA but no physical
        budget, and is never cached: freeing it releases its range at once
        (take_released reports its segment, to be unmapped)."""
        nbytes = _check_size(nbytes)
        size = max(self.granularity, self.size_class(nbytes))
        offset, generation = self._take_range(
            nbytes, size, "finds no free address range for the imported memory")
        segment = self._external[offset] = Segment(offset, size, generation)
        self._serial += 1
        block = self._blocks[offset] = Block(offset, size, nbytes, segment, self._serial)
        return block

    def free(self, offset: int) -> Block:
        block = self._blocks.pop(offset, None)
        if block is None:
            raise KeyError(f"no live block at offset {offset:#x}")
        segment = self._external.pop(offset, None)
        if segment is not None:  # imported memory: its range goes back at once
            self._va.add(offset, segment.size.bit_length() - 1)
            self.released.append(segment)
            return block
        size = block.size
        self.block_bytes -= size
        self.requested_bytes -= block.nbytes
        if size >= self.chunk:
            self._cache_segment(block.segment)
        else:
            self._quick[size.bit_length() - 1].append(offset)
            self._quick_blocks = quick_blocks = self._quick_blocks + 1
            chunk = block.segment.offset
            users = self._small_users
            users[chunk] -= 1
            if not users[chunk]:
                self._idle[chunk] = None
                self.cached_bytes += self.chunk
            if quick_blocks > QUICK_LIMIT:
                self._flush_quick()
        return block

    def resize(self, offset: int, nbytes: int) -> Block:
        """Let a live block hold `nbytes` now (same size class, same place)."""
        block = self._blocks[offset]
        if offset in self._external:
            raise ValueError(f"the block at {offset:#x} holds imported memory; it cannot grow")
        if self.size_class(_check_size(nbytes)) != block.size:
            raise ValueError(f"{nbytes} bytes do not fit the {block.size}-byte class of "
                             f"the block at {offset:#x}")
        self.requested_bytes += nbytes - block.nbytes
        block = block._replace(nbytes=nbytes)
        self._blocks[offset] = block
        return block

    def trim(self) -> int:
        """Evict every cached segment; returns the bytes given back."""
        self._flush_quick()
        before = self.cached_bytes
        while self._cache:
            self._evict_oldest()
        return before

    def evict(self, offset: int) -> None:
        """Evict one cached segment (e.g. one that could not be backed)."""
        if offset in self._idle:
            self._flush_quick()
        segment = self._cache.pop(offset)
        self._release(segment)

    def take_released(self) -> list[Segment]:
        """Segments evicted since the last call, to be unmapped by the caller."""
        released = self.released
        if released:  # (nothing released, the common case: no new list)
            self.released = []
        return released

    # -- internals --------------------------------------------------------------
    def _take_segment(self, size: int, nbytes: int, created: list[Segment]) -> Segment:
        cached = self._pop_cached(size)
        if cached is None and self._quick_blocks:  # chunks they free may be cached now
            self._flush_quick()
            cached = self._pop_cached(size)
        if cached is not None:
            return cached
        live_segment_bytes = self.backed_bytes - self.cached_bytes
        if live_segment_bytes + size > self.budget:
            raise HeapExhaustedError(self._exhausted_message(nbytes, size, "does not fit"))
        while self.backed_bytes + size > self.budget:
            self._evict_oldest()
        offset, generation = self._take_range(
            nbytes, size, "finds no free address range (fragmented)")
        segment = Segment(offset, size, generation)
        self._segments[offset] = segment
        self.backed_bytes += size
        created.append(segment)
        return segment

    def _take_range(self, nbytes: int, size: int, why: str) -> tuple[int, int]:
        """(offset, generation) of a free address range of `size` bytes (a power
        of two), evicting cached segments, oldest first, until one is free;
        HeapExhaustedError saying `why` where none is, even with the cache empty."""
        order = size.bit_length() - 1
        offset = self._va.take(order) if size <= self.va_size else None
        while offset is None and self._cache:
            self._evict_oldest()
            offset = self._va.take(order)
        if offset is None:
            raise HeapExhaustedError(self._exhausted_message(nbytes, size, why))
        generation = self._generations[offset] = self._generations.get(offset, 0) + 1
        return offset, generation

    def _flush_quick(self) -> None:
        """Merge the quick lists' blocks into the buddy system and move the idle
        chunks, whole again, to the segment cache (in the order they became idle)."""
        for order, quick in enumerate(self._quick):
            for offset in quick:
                self._small.add(offset, order)
            quick.clear()
        self._quick_blocks = 0
        for chunk in self._idle:
            del self._small_users[chunk]
            self._small.remove(chunk, self._chunk_order)
            self.cached_bytes -= self.chunk  # counted again by _cache_segment
            self._cache_segment(self._segments[chunk])
        self._idle.clear()

    def _pop_cached(self, size: int) -> Segment | None:
        heap = self._cache_by_size.get(size)
        while heap:
            offset = heapq.heappop(heap)
            segment = self._cache.get(offset)
            if segment is not None and segment.size == size:
                del self._cache[offset]
                self.cached_bytes -= size
                return segment
        return None

    def _cache_segment(self, segment: Segment) -> None:
        self._cache[segment.offset] = segment
        self.cached_bytes += segment.size
        heapq.heappush(self._cache_by_size.setdefault(segment.size, []), segment.offset)

    def _evict_oldest(self) -> None:
        _, segment = self._cache.popitem(last=False)
        self._release(segment)

    def _release(self, segment: Segment) -> None:
        # `segment` has just left the cache
        self.cached_bytes -= segment.size
        self.backed_bytes -= segment.size
        del self._segments[segment.offset]
        self._va.add(segment.offset, segment.size.bit_length() - 1)
        self.released.append(segment)

    def _exhausted_message(self, nbytes: int, size: int, why: str) -> str:
        live = self.backed_bytes - self.cached_bytes
        carved = (f" (allocations below {format_bytes(self.chunk)} are carved from chunks of "
                  f"that size, held while any block in them lives: a smaller SHMEMVM_CHUNK_SIZE "
                  f"wastes less)" if self.chunk > self.granularity and (size < self.chunk or self._small_users)
                  else "")
        if size == self.chunk and nbytes < size // 2:   # a small one, needing a new chunk
            rounded = f"{format_bytes(nbytes)}, carved from a new {format_bytes(size)} chunk"
        elif size != nbytes:
            rounded = (f"{format_bytes(nbytes)} -> {format_bytes(size)}: requests round up to "
                       f"a power of two")
        else:
            rounded = f"size class {format_bytes(size)}"
        needed = live + size if why != "exceeds the whole heap" else size
        allocations = "allocation" if len(self._blocks) == 1 else "allocations"
        return (f"cannot allocate {nbytes} bytes ({rounded}): it {why}; "
                f"heap size {format_bytes(self.budget)}, {format_bytes(live)} held by "
                f"{len(self._blocks)} live {allocations}, {format_bytes(self.cached_bytes)} "
                f"cached{carved}. With what is held now it needs a heap size of at least "
                f"{format_bytes(needed)}: free tensors, or raise the heap size (heap_size= or "
                f"SHMEMVM_HEAP_SIZE)")


#: freed small blocks kept unmerged (quick lists) before they are all merged
QUICK_LIMIT = 256


def _check_size(nbytes) -> int:
    if isinstance(nbytes, bool):
        raise TypeError("a size must be an integer number of bytes, got a bool")
    try:
        nbytes = operator.index(nbytes)
    except TypeError:
        raise TypeError(f"a size must be an integer number of bytes, got "
                        f"{type(nbytes).__name__} {nbytes!r}") from None
    if nbytes < 0:
        raise ValueError(f"a size must be >= 0 bytes, got {nbytes}")
    return nbytes
