"""VMemPow2Allocator: the pure allocator backed by a VMM backend, in one process.

It owns one VA reservation, creates/maps physical pieces for the segments the
allocator creates, unmaps/releases the ones it evicts, and hands out tensors
that view the blocks without copying. A tensor frees its block when its
storage is garbage-collected: the finalizer only appends to a deque (no lock,
no I/O, safe from any thread) and the block is released at the next call.
The symmetric heap (heap.py) builds on the same object but decides collectively
when a collected block may go.
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field

import torch

from . import _dlpack
from .allocator import Block, Pow2Allocator, Segment, next_pow2
from .backends import VMMBackend, create_backend
from .config import parse_size, setting
from .errors import FreedTensorError, ShmemError

log = logging.getLogger("shmemvm")


def _shape_of(shape) -> tuple[int, ...]:
    if isinstance(shape, torch.Size):
        return tuple(shape)
    if isinstance(shape, (tuple, list)):
        dims = tuple(shape)
    else:
        dims = (shape,)
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) and not hasattr(d, "__index__"):
            raise TypeError(f"shape entries must be integers, got {type(d).__name__} {d!r}")
        d = int(d.__index__())
        if d < 0:
            raise ValueError(f"shape entries must be >= 0, got {d} in {shape!r}")
        out.append(d)
    return tuple(out)


def tensor_nbytes(shape, dtype: torch.dtype) -> tuple[tuple[int, ...], int]:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    _dlpack.check_dtype(dtype)
    dims = _shape_of(shape)
    if len(dims) > _dlpack.MAX_NDIM:
        raise ValueError(f"at most {_dlpack.MAX_NDIM} dimensions are supported, got {len(dims)}")
    return dims, math.prod(dims) * dtype.itemsize


@dataclass
class _Live:
    block: Block
    storage: weakref.ref
    finalizer: weakref.finalize = field(repr=False)


class VMemPow2Allocator:
    """Power-of-two allocator over a VMM heap of `heap_size` physical bytes."""

    def __init__(self, heap_size: int | str | None = None, backend: str | VMMBackend | None = "host",
                 *, va_factor: int | None = None, min_block: int = 64, **backend_options):
        self.backend = create_backend(backend, **backend_options)
        granularity = self.backend.granularity
        requested = parse_size(setting("SHMEMVM_HEAP_SIZE", heap_size))
        if requested <= 0:
            raise ValueError(f"heap size must be positive, got {requested}")
        budget = -(-requested // granularity) * granularity
        factor = int(setting("SHMEMVM_VA_FACTOR", va_factor))
        if factor < 1:
            raise ValueError(f"va_factor must be >= 1, got {factor} (SHMEMVM_VA_FACTOR)")
        self.va_size = next_pow2(budget * factor)
        self._core = Pow2Allocator(budget, granularity, self.va_size, min_block)
        self.base = self.backend.reserve(self.va_size, granularity)
        self._handles: dict[int, object] = {}        # segment offset -> physical handle
        self._live: dict[int, _Live] = {}            # block offset -> live block
        self._collected: deque[tuple[int, int]] = deque()  # (offset, serial) of GC'd blocks
        self._lock = threading.RLock()
        self.closed = False
        #: called with each segment just before its physical memory is released
        self.release_listeners: list = []
        #: free garbage-collected blocks at every call (False under a symmetric
        #: heap, which frees them only once every PE agrees)
        self.frees_collected = True
        log.debug("heap of %d bytes (VA %d) at %#x on %s", budget, self.va_size, self.base,
                  self.backend.name)

    # -- public API -----------------------------------------------------------
    @property
    def heap_size(self) -> int:
        return self._core.budget

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def allocate(self, shape, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """A tensor of `shape` (or a number of elements) in a block of its own."""
        dims, nbytes = tensor_nbytes(shape, dtype)
        with self._lock:
            self._check_open()
            self._free_collected()
            block, created = self._allocate_block(nbytes)
            return self._tensor_for(block, dims, dtype)

    def free(self, tensor: torch.Tensor) -> None:
        with self._lock:
            self._check_open()
            self._free_collected()
            self._free_block(self.block_of(tensor).offset)

    def owns_tensor(self, tensor: torch.Tensor) -> bool:
        """True when `tensor`'s memory lies in one live block of this heap."""
        if not isinstance(tensor, torch.Tensor):
            return False
        with self._lock:
            if self.closed or tensor.device.type != self.device.type:
                return False
            try:
                self.block_of(tensor)
            except FreedTensorError:
                return False
            return True

    def get_allocation_segments(self) -> list[tuple[int, int, int, int]]:
        """(offset, size, va, generation) of every backed segment, live or cached."""
        with self._lock:
            self._check_open()
            return [(s.offset, s.size, self.base + s.offset, s.generation)
                    for s in self._core.segments()]

    def import_external_tensor(self, tensor: torch.Tensor):
        """Place memory from another allocator in this heap, where the backend can."""
        self._check_open()
        return self.backend.import_external(tensor)

    def stats(self) -> dict:
        """Bytes and counts of this heap; all zero but heap_size once closed."""
        with self._lock:
            if self.closed:
                return dict.fromkeys(("used", "requested", "mapped", "cached", "free",
                                      "live_allocations", "segments"), 0) | {
                    "heap_size": self._core.budget}
            if self.frees_collected:
                self._free_collected()
            core = self._core
            return {
                "heap_size": core.budget,
                "used": core.block_bytes,
                "requested": core.requested_bytes,
                "mapped": core.backed_bytes,
                "cached": core.cached_bytes,
                "free": core.budget - core.backed_bytes + core.cached_bytes,
                "live_allocations": core.live_blocks,
                "segments": len(self._handles),
            }

    def trim(self) -> int:
        """Release every cached segment now; returns the bytes given back."""
        with self._lock:
            self._check_open()
            if self.frees_collected:
                self._free_collected()
            freed = self._core.trim()
            self._unback_released()
            return freed

    def close(self) -> None:
        """Unmap and release everything; tensors from this heap must not be used after."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for live in self._live.values():
                live.finalizer.detach()
            self._live.clear()
            self._collected.clear()
            for segment in self._core.segments():
                self._unback(segment)
            self.backend.unreserve(self.base, self.va_size)
            self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- lookups -------------------------------------------------------------
    def block_of(self, tensor: torch.Tensor) -> Block:
        """The live block `tensor` views, or FreedTensorError.

        A tensor counts as ours when its storage is the storage we created for
        a still-live block: a freed block's old tensors fail even after the
        offset is reused, because the storage object differs.
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        storage = tensor.untyped_storage()
        offset = storage.data_ptr() - self.base
        live = self._live.get(offset)
        if live is None or live.storage() is not storage:
            if 0 <= offset < self.va_size and tensor.device.type == self.device.type:
                raise FreedTensorError(
                    f"tensor at {tensor.data_ptr():#x} views heap offset {offset:#x}, which is "
                    f"not a live allocation (freed, or not made by this heap)")
            raise FreedTensorError(
                f"tensor at {tensor.data_ptr():#x} on {tensor.device} is not in this heap "
                f"({self.base:#x}..{self.base + self.va_size:#x} on {self.device})")
        return live.block

    def offset_of(self, tensor: torch.Tensor) -> int:
        """Heap offset of `tensor`'s first element (from the storage: data_ptr()
        is 0 for a tensor without elements)."""
        return (tensor.untyped_storage().data_ptr() - self.base
                + tensor.storage_offset() * tensor.element_size())

    # -- internals shared with the symmetric heap --------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ShmemError("this heap is closed (finalize()/close() was called); "
                             "create a new one to allocate again")

    def _allocate_block(self, nbytes: int) -> tuple[Block, list[Segment]]:
        """Allocate and back a block; on a backend failure nothing is left behind."""
        try:
            block, created = self._core.allocate(nbytes)
        finally:
            self._unback_released()
        try:
            for segment in created:
                self._back(segment)
        except BaseException:
            self._undo_allocation(block, created)
            raise
        return block, created

    def _undo_allocation(self, block: Block, created: list[Segment]) -> None:
        """Return a block just allocated and evict the segments made for it.
        Deterministic, so PEs whose backing succeeded can mirror a PE whose
        backing failed and stay identical."""
        self._live.pop(block.offset, None)
        self._core.free(block.offset)
        for segment in created:
            if self._core.is_cached(segment.offset):
                self._core.evict(segment.offset)
        self._unback_released()

    def _tensor_for(self, block: Block, dims: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        tensor = self.backend.tensor(self.base + block.offset, dims, dtype)
        storage = tensor.untyped_storage()
        finalizer = weakref.finalize(storage, self._collected.append, (block.offset, block.serial))
        finalizer.atexit = False
        self._live[block.offset] = _Live(block, weakref.ref(storage), finalizer)
        return tensor

    def _resize_block(self, offset: int, nbytes: int, dims, dtype) -> torch.Tensor:
        """A new tensor over the same block; the old tensor counts as freed."""
        old = self._live.pop(offset)
        old.finalizer.detach()
        return self._tensor_for(self._core.resize(offset, nbytes), dims, dtype)

    def _free_block(self, offset: int) -> Block:
        live = self._live.pop(offset)
        live.finalizer.detach()
        return self._core.free(offset)

    def _take_collected(self) -> list[int]:
        """Offsets of live blocks whose tensors were garbage-collected (the
        serial tells a collected block from a later one at the same offset)."""
        offsets = set()
        while self._collected:
            offset, serial = self._collected.popleft()
            live = self._live.get(offset)
            if live is not None and live.block.serial == serial:
                offsets.add(offset)
        return sorted(offsets)

    def _free_collected(self) -> None:
        for offset in self._take_collected():
            self._free_block(offset)

    def _back(self, segment: Segment) -> None:
        handle = self.backend.create(segment.size)
        va = self.base + segment.offset
        try:
            self.backend.map_accessible(va, segment.size, handle)
        except BaseException:
            self.backend.release(handle)
            raise
        self._handles[segment.offset] = handle

    def _unback(self, segment: Segment) -> None:
        for listener in self.release_listeners:
            listener(segment)
        handle = self._handles.pop(segment.offset, None)
        if handle is None:
            return  # never backed (its creation failed)
        self.backend.unmap(self.base + segment.offset, segment.size)
        self.backend.release(handle)

    def _export(self, segment: Segment) -> int:
        """A new fd for a backed segment, owned by the caller."""
        return self.backend.export_fd(self._handles[segment.offset])

    def _unback_released(self) -> list[Segment]:
        released = self._core.take_released()
        for segment in released:
            self._unback(segment)
        return released
