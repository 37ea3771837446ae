"""The peer table: other PEs' heap segments mapped into this process.

Each PE on the node gets a VA window of the same size as a heap, so a peer's
object at heap offset `o` is at `window + o` here, exactly as it is at
`base + o` on the peer. Imports are keyed by (offset, size, generation): a
lookup with a generation other than the one mapped fails instead of reaching
memory that has been renewed.
"""

from __future__ import annotations

import os

import torch

from ..memory.buddy import Segment
from ..backends import VMMBackend
from ..errors import Attempts, ShmemError
from ..memory.limits import naming_limits

_COPY_VIEWS = 1024  # cached put/get views; all dropped when full


class PeerTable:
    def __init__(self, backend: VMMBackend, va_size: int, peers: list[int]):
        self.backend = backend
        self.va_size = va_size
        self.windows: dict[int, int] = {}
        self._imports: dict[int, dict[int, Segment]] = {}   # pe -> offset -> segment
        # pe -> offset -> the pieces mapped for a segment of imported memory
        # (import_external_tensor), which each PE maps in pieces of its own
        self._pieces: dict[int, dict[int, list[Segment]]] = {}
        self._heap_tensors: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self._copy_views: dict[tuple, torch.Tensor] = {}     # see copy_view()
        try:
            for pe in peers:
                self.windows[pe] = backend.reserve(va_size, backend.granularity)
                self._imports[pe] = {}
                self._pieces[pe] = {}
        except BaseException:
            self.close()
            raise

    def __contains__(self, pe: int) -> bool:
        return pe in self.windows

    def map(self, pe: int, segment: Segment, fd: int) -> None:
        """Map the peer's piece received as `fd` (ownership of fd is taken)."""
        imports = self._imports[pe]
        if segment.offset in imports:
            self.unmap(pe, segment.offset)
        with naming_limits(f"importing PE {pe}'s new memory"):
            handle = self.backend.import_fd(fd, segment.size)  # owns fd from here on
        va = self.windows[pe] + segment.offset
        try:
            with naming_limits(f"mapping PE {pe}'s new memory"):
                self.backend.map_accessible(va, segment.size, handle)
        finally:
            # The mapping keeps the memory alive; the handle is not needed again.
            self.backend.release(handle)
        imports[segment.offset] = segment

    def map_piece(self, pe: int, owner: Segment, piece: Segment, fd: int) -> None:
        """Map one piece of the peer's imported memory (received as `fd`, whose
        ownership is taken) inside the range `owner` of its heap."""
        imports = self._imports[pe]
        if imports.get(owner.offset) is not owner:   # its first piece
            if owner.offset in imports:
                self.unmap(pe, owner.offset)
            imports[owner.offset] = owner
            self._pieces[pe][owner.offset] = []
        if not owner.offset <= piece.offset <= piece.offset + piece.size <= owner.offset + owner.size:
            os.close(fd)
            raise ShmemError(f"PE {pe} sent a piece at heap offset {piece.offset:#x} "
                             f"({piece.size} bytes) outside the imported range {owner}")
        handle = self.backend.import_fd(fd, piece.size)
        try:
            self.backend.map_accessible(self.windows[pe] + piece.offset, piece.size, handle)
        finally:
            self.backend.release(handle)
        self._pieces[pe][owner.offset].append(piece)

    def unmap(self, pe: int, offset: int) -> None:
        segment = self._imports[pe].pop(offset, None)
        if segment is None:
            return
        pieces = self._pieces[pe].pop(offset, None)
        for piece in pieces if pieces is not None else (segment,):
            self.backend.unmap(self.windows[pe] + piece.offset, piece.size)

    def drop(self, segment: Segment) -> None:
        """The segment at this offset was released on every PE: unmap it everywhere.
        Every peer's copy is tried (and forgotten); the first failure is raised after."""
        attempts = Attempts()
        for pe in self._imports:
            attempts.attempt(self.unmap, pe, segment.offset)
        attempts.raise_first()

    def check(self, pe: int, segment: Segment) -> None:
        """Raise unless `segment` (offset and generation) is what is mapped for `pe`."""
        mapped = self._imports[pe].get(segment.offset)
        # Compared field by field: cheaper than the dataclass __eq__ (a tuple of
        # each), and this runs on every put and get to a peer.
        if mapped is None or (mapped.generation != segment.generation
                              or mapped.size != segment.size):
            raise ShmemError(
                f"PE {pe}'s memory at heap offset {segment.offset:#x} (generation "
                f"{segment.generation}) is not mapped here (have {mapped}); the PEs' heaps "
                f"have diverged, which points to a collective call made on some PEs only")

    def block_view(self, pe: int, start: int, like: torch.Tensor) -> torch.Tensor:
        """`like` (a view of one of our blocks, whose storage starts at heap
        offset `start`) as it lies on `pe`: same shape, strides and dtype, in a
        storage of its own that covers exactly the bytes like's storage covers
        here (so torch.save, pickling, printing read only mapped memory)."""
        nbytes = like.untyped_storage().nbytes()
        storage = self.backend.tensor(self.windows[pe] + start, (nbytes,),
                                      torch.uint8).untyped_storage()
        return torch.empty(0, dtype=like.dtype, device=like.device).set_(
            storage, like.storage_offset(), like.shape, like.stride())

    def _window_view(self, pe: int, offset: int, like: torch.Tensor) -> torch.Tensor:
        """`like`'s counterpart on `pe` inside one tensor spanning the peer's
        whole window: cheap to make, for shmemvm's own copies only (it spans
        unmapped holes, so it must never reach a user)."""
        key = (pe, like.dtype)
        heap = self._heap_tensors.get(key)
        if heap is None:
            heap = self.backend.tensor(self.windows[pe], (self.va_size // like.dtype.itemsize,),
                                       like.dtype)
            self._heap_tensors[key] = heap
        return torch.as_strided(heap, like.shape, like.stride(), offset // like.dtype.itemsize)

    def copy_view(self, pe: int, offset: int, like: torch.Tensor) -> torch.Tensor:
        """A window view, cached, for put/get to copy through: making a view costs
        more than a small copy. Such views never leave shmemvm. A view is only an address in the peer's window; whether
        memory is mapped there is for check() to say before every use."""
        key = (pe, offset, like.dtype, like.shape, like.stride())
        view = self._copy_views.get(key)
        if view is None:
            if len(self._copy_views) >= _COPY_VIEWS:
                self._copy_views.clear()
            view = self._copy_views[key] = self._window_view(pe, offset, like)
        return view

    def mapped(self, pe: int) -> list[Segment]:
        return sorted(self._imports[pe].values(), key=lambda s: s.offset)

    def close(self) -> None:
        self._copy_views.clear()
        self._heap_tensors.clear()
        for pe, window in list(self.windows.items()):
            for offset in list(self._imports.get(pe, ())):
                self.unmap(pe, offset)
            self.backend.unreserve(window, self.va_size)
        self.windows.clear()
        self._imports.clear()

