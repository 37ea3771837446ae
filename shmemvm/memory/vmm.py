"""VMemPow2Allocator: the pure allocator backed by a VMM backend, in one process.

It owns one VA reservation, creates/maps physical pieces for the segments the
allocator creates, unmaps/releases the ones it evicts, and hands out tensors
that view the blocks without copying.

A block's memory is reused only when nothing views it any more
(ownership.py says how that is known). free(t) detaches `t` itself (it becomes
an empty tensor) and releases the block at once when no other view exists;
otherwise the block is *deferred*: the other views keep reading and writing
its old memory, and it is released when the last of them dies. close()
releases everything nothing views and keeps the rest mapped (and the VA
reserved) until its last view dies.

This is the stand-alone public allocator. The symmetric heap builds on
HeapMemory (heapmem.py), its subclass that exposes the steps of an
allocation one by one and releases a block only when every PE agrees that
nothing views it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TypedDict

import torch

from .. import _args, native
from ..backends import VMMBackend, create_backend
from ..config import parse_size, setting
from ..errors import Attempts, FreedTensorError, NotSymmetricError, ShmemError
from . import ownership
from .buddy import (QUICK_LIMIT, Block, Pow2Allocator, Segment, format_bytes, is_pow2,
                    next_pow2)
from .limits import naming_limits

log = logging.getLogger("shmemvm")

#: Closed allocators whose memory tensors still view, held until the last view
#: dies. Process-wide on purpose: what keeps such an allocator alive is only
#: tensors the user holds, and its watches are weak references that fire only
#: while the watch objects themselves live. The allocator, its records (the
#: watches) and their mailbox form a cycle that nothing outside references
#: once the user dropped the allocator, so without a root here the garbage
#: collector would take the watches with it: the callbacks would never run and
#: the mappings under those tensors would never be released (or, through the
#: backend's finalizer, released under them). The last view's death removes
#: its allocator from here (_finish_close).
_LINGERING: set[VMemPow2Allocator] = set()


#: the automatic chunk size gives a heap at most this many chunks (SHMEMVM_CHUNK_SIZE)
MAX_CHUNKS = 64


def chunk_size(value, budget: int, granularity: int) -> int:
    """The chunk size of a heap of `budget` bytes: SHMEMVM_CHUNK_SIZE (or the
    chunk_size= argument), "auto" giving at most MAX_CHUNKS chunks; never more
    than the largest power of two in the budget, so a small heap still works."""
    raw = setting("SHMEMVM_CHUNK_SIZE", value)
    if isinstance(raw, str) and raw.strip().lower() in ("", "auto"):
        chunk = max(granularity, next_pow2(budget // MAX_CHUNKS))
    else:
        try:
            chunk = parse_size(raw)
        except ValueError as exc:
            raise ValueError(f"SHMEMVM_CHUNK_SIZE: {exc}") from None
        if not is_pow2(chunk) or chunk < granularity:
            raise ValueError(f"chunk size must be a power of two of at least the backend's "
                             f"granularity ({format_bytes(granularity)}), got {raw!r} "
                             f"(SHMEMVM_CHUNK_SIZE, or auto)")
    return min(chunk, 1 << (budget.bit_length() - 1))



class HeapStats(TypedDict):
    """VMemPow2Allocator.stats(): this process's heap in bytes and counts."""
    heap_size: int              # the physical budget
    chunk: int                  # allocations below it are carved from chunks of this size
    used: int                   # bytes in blocks (deferred ones too)
    requested: int              # bytes asked for
    mapped: int                 # physical bytes backing the heap
    cached: int                 # mapped bytes of freed segments kept for reuse
    free: int                   # bytes that can still be allocated
    live_allocations: int
    segments: int
    deferred_allocations: int   # freed, still viewed by some storage
    deferred_bytes: int


@dataclass(eq=False)
class Imported:
    """Memory of another allocator placed in the heap (import_external_tensor):
    its pieces, where they are mapped here, and the tensor that owns it, kept
    alive so that its allocator cannot reuse the memory while it is mapped."""
    segment: Segment
    pieces: list                  # the backend's pieces, each holding a handle reference
    placed: list[tuple[int, int]]  # (va, size) of each mapping here
    owner: torch.Tensor | None
    start: int                    # heap offset of the imported storage's first byte


class VMemPow2Allocator:
    """Power-of-two allocator over a VMM heap of `heap_size` physical bytes.

    Blocks that nothing views any more are released at the next call.
    """

    #: whether blocks nothing views any more are released at the next call
    #: (HeapMemory: only when every PE agrees, through its release())
    _releases_dead: bool = True

    def __init__(self, heap_size: int | str | None = None, backend: str | VMMBackend | None = "host",
                 *, va_factor: int | None = None, min_block: int = 64,
                 chunk: int | str | None = None, **backend_options):
        self.backend = create_backend(backend, **backend_options)
        granularity = self.backend.granularity
        requested = parse_size(setting("SHMEMVM_HEAP_SIZE", heap_size))
        #: the size asked for, before rounding up to the granularity
        self.requested_size = requested
        if requested <= 0:
            raise ValueError(f"heap size must be positive, got {requested}")
        budget = -(-requested // granularity) * granularity
        raw_factor = setting("SHMEMVM_VA_FACTOR", va_factor)
        try:
            factor = int(raw_factor) if not isinstance(raw_factor, (bool, float)) else 0
        except ValueError:
            factor = 0
        if factor < 1:
            raise ValueError(f"va_factor must be an integer >= 1, got {raw_factor!r} "
                             f"(SHMEMVM_VA_FACTOR)")
        self.va_size = next_pow2(budget * factor)
        self._core = Pow2Allocator(budget, granularity, self.va_size, min_block,
                                   chunk_size(chunk, budget, granularity))
        try:
            self.base = self.backend.reserve(self.va_size, granularity)
        except OSError as exc:   # no such range (ENOMEM: beyond the address space, ulimit -v)
            raise ValueError(
                f"cannot reserve {format_bytes(self.va_size)} of address space for the heap "
                f"({exc.strerror or exc}): the heap size {format_bytes(budget)} (heap_size= "
                f"or SHMEMVM_HEAP_SIZE) times the VA factor {factor} (va_factor= or "
                f"SHMEMVM_VA_FACTOR), rounded up to a power of two. A process has at most "
                f"128 TiB of address space on x86-64 (less under ulimit -v); lower "
                f"SHMEMVM_HEAP_SIZE or SHMEMVM_VA_FACTOR") from exc
        self._handles: dict[int, object] = {}        # segment offset -> physical handle
        self._unmapped: set[int] = set()             # offsets created, not mapped yet
        self._imported: dict[int, Imported] = {}     # block offset -> imported memory
        self._storage_at: dict[int, int] = {}        # imported storage's offset -> block offset
        self._records: dict[int, ownership.Record] = {}       # block offset -> allocated block
        self._dead: set[int] = set()                 # offsets nothing here views any more
        self._mailbox = ownership.Mailbox()
        self._died = self._mailbox.died              # every watch's callback, bound once
        self._lock = threading.RLock()               # allocator, records, handles
        self._drain_lock = threading.Lock()          # after close: one drainer at a time
        self.closed = False
        #: the cached branch in one compiled call (native/blocks.c: a small block of a
        #: size freed lately taken with its tensor and record, a small block given
        #: back), or None: the Python path below does it all, as it does every other case
        self._cached = native.CachedBlocks(self, self._core, self.backend.tensor,
                                           ownership.record, Block, QUICK_LIMIT) \
            if native.CachedBlocks is not None else None
        log.debug("heap of %d bytes (VA %d) at %#x on %s", budget, self.va_size, self.base,
                  self.backend.name)

    # -- public API -----------------------------------------------------------
    @property
    def heap_size(self) -> int:
        return self._core.budget

    @property
    def chunk(self) -> int:
        """Allocations below this size are carved from segments of this size."""
        return self._core.chunk

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def allocate(self, shape, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """A tensor of `shape` (or a number of elements) in a block of its own."""
        dims, nbytes = _args.tensor_nbytes(shape, dtype)
        with self._lock:
            self._check_open()
            self._release_dead()
            if self._cached is not None:   # (a cached block's in one call, else nothing done)
                tensor = self._cached.take(nbytes, dims, dtype)
                if tensor is not None:
                    return tensor
            block, _ = self._allocate_block(nbytes)
            return self._tensor_for(block, dims, dtype)

    def free(self, tensor: torch.Tensor) -> None:
        """Free `tensor`'s block; `tensor` becomes empty. Other views of the
        block keep its memory (and data) until they die, then it is released."""
        with self._lock:
            self._check_open()
            self._release_dead()
            retirement = self._retire(tensor)
            self._finish_free(retirement, release_now=retirement.alone)

    def owns_tensor(self, tensor: torch.Tensor) -> bool:
        """True when `tensor`'s memory lies in one live block of this heap."""
        if not isinstance(tensor, torch.Tensor):
            return False
        with self._lock:
            if self.closed or tensor.device.type != self.device.type:
                return False
            try:
                self._record_of(tensor)
            except NotSymmetricError:
                return False
            return True

    def get_allocation_segments(self) -> list[tuple[int, int, int, int]]:
        """(offset, size, va, generation) of every backed segment, live or cached."""
        with self._lock:
            self._check_open()
            return [(s.offset, s.size, self.base + s.offset, s.generation)
                    for s in self._core.segments()]

    def import_external_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s memory placed in this heap without a copy, where the
        backend can share it (cuda: torch's expandable segments).

        Returns a tensor of the same shape, strides and dtype over the same
        physical memory, mapped inside this heap: writes through either show
        in the other. The heap keeps `tensor` alive until the returned tensor
        and its views are gone (its allocator must not reuse the memory).
        """
        with self._lock:
            self._check_open()
            self._release_dead()
            pieces = self.backend.import_external(tensor)
            try:
                lead = tensor.untyped_storage().data_ptr() - pieces[0].va
                block = self._core.allocate_external(sum(p.size for p in pieces))
            except BaseException:
                for piece in pieces:
                    self.backend.release(piece.handle)
                raise
            try:
                self._place_external(block, tensor, pieces, 0)
            except BaseException:
                self._undo_allocation(block, [])
                raise
            return self._external_tensor_for(block, lead, tensor)

    def stats(self) -> HeapStats:
        """Bytes and counts of this heap; all zero but heap_size once closed.
        `used` counts deferred blocks (freed, still viewed) too; they are also
        reported on their own."""
        with self._lock:
            if self.closed:
                return HeapStats(heap_size=self._core.budget, chunk=self._core.chunk, used=0,
                                 requested=0, mapped=0, cached=0, free=0, live_allocations=0,
                                 segments=0, deferred_allocations=0, deferred_bytes=0)
            self._release_dead()
            core = self._core
            deferred = [r.block for r in self._records.values() if r.freed]
            return {
                "heap_size": core.budget,
                "chunk": core.chunk,
                "used": core.block_bytes,
                "requested": core.requested_bytes,
                "mapped": core.backed_bytes,
                "cached": core.cached_bytes,
                "free": core.budget - core.backed_bytes + core.cached_bytes,
                "live_allocations": core.live_blocks - len(deferred),
                "segments": len(self._handles),
                "deferred_allocations": len(deferred),
                "deferred_bytes": sum(b.size for b in deferred),
            }

    def trim(self) -> int:
        """Release every cached segment now; returns the bytes given back."""
        with self._lock:
            self._check_open()
            self._release_dead()
            freed = self._core.trim()
            self._unback_released()
            return freed

    def close(self) -> None:
        """Unmap and release everything nothing views. Memory that tensors
        still view stays mapped, its VA reserved, until the last of them dies:
        such tensors keep their old data and never see memory of a later heap."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._absorb_events()
            kept = self._unback_unviewed()
            if kept:
                log.debug("heap at %#x closed with %d segment(s) still viewed; they are "
                          "released when their last view dies", self.base, len(kept))
                self._mailbox.after_close = self._drain_after_close
                _LINGERING.add(self)
            else:
                self._finish_close()
        self._drain_after_close()  # views that died meanwhile

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the steps of allocating and freeing (HeapMemory makes them public) -------
    def _record_of(self, tensor: torch.Tensor) -> tuple[ownership.Record, torch.UntypedStorage]:
        """The record of the live block `tensor` views, and tensor's storage;
        FreedTensorError for a tensor of a block freed since, NotSymmetricError
        for one that never was this heap's.

        A tensor counts as ours when its storage is the storage we created for
        a still-live block: a freed block's old views fail even while they keep
        its memory, and after the offset is reused, because the storage differs.
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        storage = tensor.untyped_storage()
        offset = storage.data_ptr() - self.base
        record = self._records.get(self._storage_at.get(offset, offset) if self._storage_at
                                   else offset)
        if record is None or record.freed or record() is not storage:
            freed_at = getattr(tensor, "_shmemvm_freed", None)
            if freed_at is not None:
                raise FreedTensorError(
                    f"this tensor is not a live allocation (freed: free() or realloc() of the "
                    f"block at heap offset {freed_at:#x} left it empty)")
            if 0 <= offset < self.va_size and tensor.device.type == self.device.type:
                raise FreedTensorError(
                    f"tensor at {tensor.data_ptr():#x} views heap offset {offset:#x}, which is "
                    f"not a live allocation (freed, or not made by this heap)")
            if storage.nbytes() == 0:   # free() empties a tensor; a view of it is empty too
                raise FreedTensorError(
                    "this tensor has no memory: free() or realloc() left it (or the tensor it "
                    "is a view of) empty, or it never was a symmetric tensor")
            raise NotSymmetricError(
                f"tensor at {tensor.data_ptr():#x} on {tensor.device} is not in this heap "
                f"({self.base:#x}..{self.base + self.va_size:#x} on {self.device})")
        return record, storage

    def _allocate_block(self, nbytes: int) -> tuple[Block, list[Segment]]:
        """Allocate and back a block (create and map its new segments); on a
        backend failure nothing is left behind."""
        with self._lock:
            block, created, failure = self._allocate_unmapped(nbytes)
            if failure is not None:
                raise failure
            try:
                self._map_created(created)
            except BaseException:
                self._undo_allocation(block, created)
                raise
            return block, created

    def _allocate_unmapped(self, nbytes: int) -> tuple[Block, list[Segment], Exception | None]:
        """HeapMemory.allocate_unmapped (which says what it returns)."""
        with self._lock:
            try:
                block, created = self._core.allocate(nbytes)
            except BaseException:
                try:
                    self._unback_released()  # what it evicted before it failed
                except Exception:  # noqa: BLE001 - logged there; the allocator's own error,
                    pass           # the same on every PE, is what every PE must raise
                raise
            try:
                # Unmapping evicted segments can fail on one PE alone: the block is
                # then returned here too, as the other PEs will (undo_allocation).
                if self._core.released:  # (a cached block: nothing evicted, nothing made)
                    self._unback_released()
                for segment in created:
                    self._create(segment)
            except Exception as exc:  # noqa: BLE001 - returned, agreed on by the caller
                self._undo_allocation(block, created)
                return block, created, exc
            except BaseException:
                self._undo_allocation(block, created)
                raise
            return block, created, None

    def _map_created(self, created: list[Segment]) -> None:
        """Map the segments _allocate_unmapped created, readable and writable
        here. A segment whose mapping fails stays created and unmapped, for
        _undo_allocation to release."""
        with self._lock:
            for segment in created:
                if segment.offset not in self._unmapped:
                    continue
                with naming_limits(f"mapping {format_bytes(segment.size)} of new memory"):
                    self.backend.map_accessible(self.base + segment.offset, segment.size,
                                                self._handles[segment.offset])
                self._unmapped.discard(segment.offset)

    def _undo_allocation(self, block: Block, created: list[Segment]) -> None:
        """Return a block just allocated and evict the segments made for it
        (deterministic: HeapMemory.undo_allocation says why)."""
        with self._lock:
            self._records.pop(block.offset, None)  # its watch goes with it
            self._core.free(block.offset)
            for segment in created:
                if self._core.is_cached(segment.offset):
                    self._core.evict(segment.offset)
            self._unback_released()

    def _tensor_for(self, block: Block, dims: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The block's own tensor; its storage's life decides the block's."""
        tensor = self.backend.tensor(self.base + block.offset, dims, dtype)
        record = ownership.record(tensor.untyped_storage(), self._died, block)
        with self._lock:
            self._records[block.offset] = record
        return tensor

    def _retire(self, tensor: torch.Tensor, detach: bool = True) -> ownership.Retirement:
        """Detach `tensor` from its live block (first half of a free; a face's
        own tensor, `detach` false, stays as it is: ownership.Retirement)."""
        with self._lock:
            record, storage = self._record_of(tensor)
            return ownership.Retirement(record, tensor, storage, detach)

    def _finish_free(self, retirement: ownership.Retirement, release_now: bool) -> Exception | None:
        """Second half of a free: release the block now (nothing views it), or
        defer it to its views' death. Returns what _release() returns."""
        offset = retirement.block.offset
        with self._lock:
            if release_now:
                failure = self._release(offset)    # its watch goes first: no report
                retirement.storage = None
                return failure
            self._records[offset].freed = True
            retirement.storage = None          # our reference: the storage may die here
            self._absorb_events()
            return None

    def _take_dead(self) -> list[int]:
        """Offsets of blocks nothing here views any more (GC'd, or freed and
        their last view gone), handed over to be released (_release())."""
        if not self._dead and not self._mailbox.events:
            return []  # the common case, without the lock
        with self._lock:
            self._absorb_events()
            dead, self._dead = sorted(self._dead), set()
            return dead

    def _release(self, offset: int) -> Exception | None:
        """Give the block back to the allocator (its segment is cached).
        Imported memory is unmapped at once instead: where that fails, the
        release is done all the same (the allocator moved on) and the failure,
        logged, is returned, for the caller to decide whom to tell; else None."""
        cached = self._cached
        if cached is not None and cached.release(offset):
            return None   # a small block, back on its quick list (this, in one call)
        with self._lock:
            del self._records[offset]              # with its watches: they report nothing
            self._dead.discard(offset)
            self._core.free(offset)
            if offset in self._imported:           # never cached: unmapped and given back now
                try:
                    self._unback_released()
                except Exception as exc:  # noqa: BLE001 - logged there; on this PE alone
                    return exc
            return None

    def _place_external(self, block: Block, owner: torch.Tensor, pieces: list, shift: int) -> None:
        """Map another allocator's `pieces` (backend.import_external) one after
        the other from heap offset block.offset + shift; the block owns their
        handle references and keeps `owner` alive from here on. Nothing stays
        mapped if a mapping fails, and the handles are given back."""
        with self._lock:
            placed = []
            va = self.base + block.offset + shift
            try:
                for piece in pieces:
                    self.backend.map_accessible(va, piece.size, piece.handle)
                    placed.append((va, piece.size))
                    va += piece.size
            except BaseException:
                for where, size in placed:
                    self.backend.unmap(where, size)
                for piece in pieces:
                    self.backend.release(piece.handle)
                raise
            start = owner.untyped_storage().data_ptr() - pieces[0].va + block.offset + shift
            self._imported[block.offset] = Imported(block.segment, list(pieces), placed, owner,
                                                    start)

    def _external_tensor_for(self, block: Block, lead: int, like: torch.Tensor) -> torch.Tensor:
        """The heap's tensor over imported memory: `like`'s geometry over a
        storage of like's size at heap offset block.offset + lead."""
        storage = self.backend.tensor(self.base + block.offset + lead,
                                      (like.untyped_storage().nbytes(),),
                                      torch.uint8).untyped_storage()
        tensor = torch.empty(0, dtype=like.dtype, device=self.device).set_(
            storage, like.storage_offset(), like.shape, like.stride())
        record = ownership.record(storage, self._died, block)
        with self._lock:
            self._records[block.offset] = record
            if lead:
                self._storage_at[block.offset + lead] = block.offset
        return tensor

    # -- hooks HeapMemory fills in ---------------------------------------------------
    def _releasing(self, segment: Segment) -> None:
        """Called with each segment just before its physical memory is released."""

    def _closing(self) -> None:
        """Called once everything is released (after close and the last view's
        death), before the VA reservation is given back."""

    # -- internals -----------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ShmemError("this heap is closed (finalize()/close() was called); "
                             "create a new one to allocate again")

    def _absorb_events(self) -> None:
        """Apply the watches' reports (under the lock)."""
        events = self._mailbox.events
        while events:
            watch = events.popleft()
            record = self._records.get(watch.offset)
            if record is None or record.block.serial != watch.serial:
                continue  # a block released since (explicit free with no other view)
            if watch.kind == ownership.OWN:
                record.own_alive = False
            elif record.views is not None:
                record.views.discard(watch)
            offset = watch.offset
            if not (record.own_alive or record.views):   # (Record.viewed, inline: the
                self._dead.add(offset)                    # deferred free's every release)

    def _release_dead(self) -> None:
        if self._releases_dead:
            for offset in self._take_dead():
                self._release(offset)

    def _unback_unviewed(self) -> set[int]:
        """After close: unmap every backed segment no live view needs; returns
        the offsets of those still kept."""
        kept = {r.block.segment.offset for r in self._records.values() if r.viewed}
        for segment in self._core.segments():
            if segment.offset not in kept and segment.offset in self._handles:
                self._unback(segment)
        for offset, imported in list(self._imported.items()):
            if offset not in kept:
                self._unback(imported.segment)
        return kept

    def _drain_after_close(self) -> None:
        """After close: release what the views that died leave unviewed. Runs
        from watches' callbacks, in any thread; a drainer already at work (this thread
        inside the garbage collector, or another) picks the events up."""
        if self._mailbox.after_close is None:
            return
        while self._mailbox.events and self._drain_lock.acquire(blocking=False):
            try:
                with self._lock:
                    if self._mailbox.after_close is None:
                        return
                    self._absorb_events()
                    for offset in [o for o, r in self._records.items() if not r.viewed]:
                        del self._records[offset]
                    if not self._unback_unviewed():
                        self._mailbox.after_close = None
                        self._finish_close()
            finally:
                self._drain_lock.release()

    def _finish_close(self) -> None:
        _LINGERING.discard(self)
        self._records.clear()  # with their watches
        self._dead.clear()
        self._mailbox.events.clear()
        self._closing()
        self.backend.unreserve(self.base, self.va_size)
        self.backend.close()

    def _create(self, segment: Segment) -> None:
        """Physical memory for `segment`, not mapped yet (_map_created maps it)."""
        with naming_limits(f"creating {format_bytes(segment.size)} of memory"):
            handle = self.backend.create(segment.size)
        self._handles[segment.offset] = handle
        self._unmapped.add(segment.offset)

    def _unback(self, segment: Segment) -> None:
        """Unmap and release a segment the allocator released. Every part is
        tried, and the segment is forgotten here whatever fails (the allocator
        has moved on); the first failure is raised after. A mapping that could
        not be removed is replaced when the offset is mapped again."""
        attempts = Attempts()
        attempt = attempts.attempt
        attempt(self._releasing, segment)
        imported = self._imported.pop(segment.offset, None)
        if imported is not None:
            self._storage_at.pop(imported.start, None)
            for va, size in imported.placed:
                attempt(self.backend.unmap, va, size)
            for piece in imported.pieces:
                attempt(self.backend.release, piece.handle)
            imported.owner = None              # its allocator may reuse the memory now
        else:
            handle = self._handles.pop(segment.offset, None)
            if handle is not None:             # (None: never backed, its creation failed)
                if segment.offset in self._unmapped:   # created, never mapped (a failed step)
                    self._unmapped.discard(segment.offset)
                else:
                    attempt(self.backend.unmap, self.base + segment.offset, segment.size)
                attempt(self.backend.release, handle)  # a mapping keeps its memory until unmapped
        attempts.raise_first()

    def _unback_released(self) -> list[Segment]:
        """Unmap what the allocator released; every segment is tried, the first
        failure is raised after (the allocator's state has moved on regardless)."""
        released = self._core.take_released()
        if not released:
            return []
        attempts = Attempts()
        for segment in released:
            failure = attempts.attempt(self._unback, segment)
            if failure is not None:
                log.warning("shmemvm: releasing segment %s failed: %s", segment, failure)
        attempts.raise_first()
        return released
