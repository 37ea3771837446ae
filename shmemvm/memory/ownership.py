"""Which storages view a block, and when a block may be released.

A block's memory is reused only when nothing views it any more: its own
storage (the tensor the heap handed out, and every view torch makes of it,
which shares that storage) and every registered extra view (the symmetric
heap's ptr() views of peers' copies) keep it. The death of each such storage
is observed by a weak reference with a callback (a Watch) on the storage's
Python object, which torch keeps alive for exactly as long as the storage
itself lives. The callback only appends to the Mailbox's deque (no lock, no
I/O, safe from any thread and from the garbage collector); the allocator
applies the reports at its next call. During interpreter teardown it does
nothing at all, so nothing calls back into a half-torn-down interpreter; this
is why no DLPack deleter (which would need a compiled callback) is used.
Dropping a watch disarms it.

Freeing is two halves: a Retirement detaches the freed tensor (it becomes
empty) and says whether anything else on this process still views the block
(`alone`, from torch's storage use count); the allocator then releases the
block at once or defers it to its last view's death (vmm.py).
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from typing import Callable

import torch

from .buddy import Block

#: what died: the block's own storage, or a registered view
OWN, VIEW = 0, 1

_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)
#: what use_count() asks of a storage's _cdata, for compiled callers (None: unknown)
use_count_of = _storage_use_count


def use_count(storage: torch.UntypedStorage) -> int | None:
    return None if _storage_use_count is None else _storage_use_count(storage._cdata)


def _calibrate() -> int | None:
    # Use counts include torch's own reference from the storage's Python
    # object; measure what "held by one Python reference only" reads as here.
    tensor = torch.empty(1, dtype=torch.uint8)
    storage = tensor.untyped_storage()
    tensor.set_()  # type: ignore[call-overload]  # (no argument: empties it; torch's stubs lack it)
    return use_count(storage)


HELD_ALONE = _calibrate()


class Mailbox:
    """Where watches report dead storages. Kept apart from the allocator so
    that a watch never keeps the allocator alive; after close() it also drives
    the release of memory that was still viewed then."""

    def __init__(self) -> None:
        self.events: deque[Watch] = deque()
        #: called after each death once the allocator is closed
        self.after_close: Callable[[], None] | None = None

    def died(self, watch: "Watch") -> None:
        if sys.is_finalizing():
            return  # interpreter teardown: the process gives everything back
        self.events.append(watch)
        if self.after_close is not None:
            self.after_close()


class Watch(weakref.ref):
    """A weak reference to a storage that views a block (a ptr() view), which
    reports the storage's death to the mailbox. Cheaper than weakref.finalize,
    and dropping the watch disarms it. Made by watch(): weakref.ref's own
    constructor, then the slots (no Python-level __new__/__init__ to run)."""

    __slots__ = ("offset", "serial", "kind")
    offset: int
    serial: int
    kind: int              # OWN or VIEW


def watch(storage, died, offset: int, serial: int, kind: int) -> Watch:
    watch = Watch(storage, died)
    watch.offset, watch.serial, watch.kind = offset, serial, kind
    return watch


class Record(Watch):
    """An allocated block and what views it on this process. The record is
    itself the watch of the block's own storage (kind OWN): one object per
    allocation, and dropping the record disarms it."""

    __slots__ = ("block", "own_alive", "views", "freed")
    block: Block
    own_alive: bool
    #: watches of registered views (ptr views) alive, a set made at the first
    views: set[Watch] | None
    #: free()d, no longer a symmetric tensor, maybe still viewed
    freed: bool

    @property
    def viewed(self) -> bool:
        return self.own_alive or bool(self.views)


def record(storage, died, block: Block) -> Record:
    """The record of `block`, watching its own `storage`."""
    record = Record(storage, died)
    record.offset, record.serial, record.kind = block.offset, block.serial, OWN
    record.block, record.own_alive, record.views, record.freed = block, True, None, False
    return record




class Retirement:
    """First half of freeing a tensor: the tensor is detached from its block
    (it becomes empty) and `alone` says whether anything else here still views
    the block. restore() undoes the detaching (a collective free that failed).
    Without `detach` (a face's own tensor of the allocation, which keeps it
    until the face's arrays over it die: the NumPy face's) the tensor stays as
    it is, and the block is not alone: it is released once it dies."""

    __slots__ = ("block", "tensor", "storage", "_geometry", "detached", "alone")
    _geometry: tuple | None

    def __init__(self, record: Record, tensor: torch.Tensor, storage: torch.UntypedStorage,
                 detach: bool = True):
        self.block = block = record.block
        self.tensor = tensor
        #: tensor's, the block's own; None once the free is finished
        self.storage: torch.UntypedStorage | None = storage
        if not detach:   # (a face's own tensor: nothing to detach, nor to restore)
            self._geometry = None
            self.detached = self.alone = False
            return
        self._geometry = (tensor.storage_offset(), tensor.shape, tensor.stride())
        try:
            tensor.set_()  # type: ignore[call-overload]  # (see _calibrate)
            # for the error if it is used again: our own mark, which Tensor does not declare
            tensor._shmemvm_freed = block.offset  # type: ignore[attr-defined]
            self.detached = True
        except RuntimeError:  # e.g. a tensor that requires grad: leave it as it is
            self.detached = False
        # alone: nothing else views the block here: no registered view, and our
        # reference is all that keeps the storage alive (no tensor views it).
        # Unknown use counts say no: the block is then deferred, which is always safe.
        self.alone = (self.detached and not record.views and _storage_use_count is not None
                      and _storage_use_count(storage._cdata) == HELD_ALONE)

    def restore(self) -> None:
        if self.detached and self.storage is not None and self._geometry is not None:
            self.tensor.set_(self.storage, *self._geometry)
            del self.tensor._shmemvm_freed  # type: ignore[attr-defined]  # (our mark)
            self.detached = False

    def old_bytes(self) -> torch.Tensor:
        """The block's bytes as they were (for realloc's copy)."""
        if self.storage is None:
            raise RuntimeError("old_bytes() of a free already finished: the block's storage "
                               "is no longer held; read it before finish_free()")
        return torch.empty(0, dtype=torch.uint8, device=self.tensor.device).set_(self.storage)
