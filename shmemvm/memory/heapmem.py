"""HeapMemory: one PE's memory of the symmetric heap, the engine under core/.

The stand-alone VMemPow2Allocator (vmm.py) allocates and frees in one call
each. The symmetric heap needs the steps in between, because every PE must
take each of them together: a block's physical memory is created, exported
to the node's peers and only then mapped (allocate_unmapped, export,
map_created); a failure on one PE is undone the same way on all of them
(undo_allocation); a free is detached first and finished once every PE has
said whether anything still views the block (retire, finish_free); and a
block nothing views any more is released only once every PE agrees
(take_dead, then release). HeapMemory exposes those steps, the lookups that
core/ and openshmem/ make on this PE's memory, and listeners for the parts
that hold mappings of it (peers' imports, the MPI window).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..backends import VMMBackend
from ..errors import Attempts, FreedTensorError
from .buddy import Block, Segment
from .limits import naming_limits
from .ownership import VIEW, Retirement, watch
from .vmm import Imported, VMemPow2Allocator


class HeapMemory(VMemPow2Allocator):
    """One PE's heap memory under the symmetric heap.

    `release_dead=False` (the heap's) leaves blocks that nothing views any
    more allocated until release() is called (once every PE agrees); True
    releases them at the next call, as the stand-alone allocator does.
    """

    def __init__(self, heap_size: int | str | None = None, backend: str | VMMBackend | None = "host",
                 *, release_dead: bool = False, **options):
        super().__init__(heap_size, backend, **options)
        self._releases_dead = release_dead
        #: called with each segment just before its physical memory is released
        self.release_listeners: list[Callable[[Segment], object]] = []
        #: called once everything is released (after close and the last view's death)
        self.close_listeners: list[Callable[[], object]] = []

    # -- allocating, step by step ---------------------------------------------------
    def allocate_unmapped(self, nbytes: int) -> tuple[Block, list[Segment], Exception | None]:
        """Allocate a block and create the physical memory of the segments made
        for it, without mapping it yet: the symmetric heap exports it to the
        node's peers first and maps it (map_created) while they import it.

        Returns (block, created, failure). A backend failure is returned, not
        raised, once the allocation is undone here (undo_allocation, which the
        other PEs mirror), with the block and segments it was for, so that the
        caller can still tell its peers which step failed. The allocator's own
        errors (HeapExhaustedError: the same on every PE) are raised."""
        return self._allocate_unmapped(nbytes)

    def export(self, segment: Segment) -> int:
        """A new fd for a backed segment, owned by the caller."""
        with naming_limits("exporting new memory to the PEs of the node"):
            return self.backend.export_fd(self._handles[segment.offset])

    def map_created(self, created: list[Segment]) -> None:
        """Map the segments allocate_unmapped created, readable and writable
        here. A segment whose mapping fails stays created and unmapped, for
        undo_allocation to release."""
        self._map_created(created)

    def undo_allocation(self, block: Block, created: list[Segment]) -> None:
        """Return a block just allocated and evict the segments made for it.
        Deterministic, so PEs whose backing succeeded can mirror a PE whose
        backing failed and stay identical."""
        self._undo_allocation(block, created)

    def tensor_for(self, block: Block, dims: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The block's own tensor; its storage's life decides the block's."""
        return self._tensor_for(block, dims, dtype)

    @property
    def cached_blocks(self):
        """The engine's CachedBlocks (native/blocks.c), the compiled cached branch,
        or None where the compiled piece is not used. Its take(nbytes, dims, dtype,
        fallback, *args) is allocate_unmapped() and tensor_for() of a block of a
        size freed lately in one call, else fallback(*args) with nothing done."""
        return self._cached

    def cached_block(self, nbytes: int) -> int | None:
        """For an allocation of `nbytes` carved from a chunk (below
        SHMEMVM_CHUNK_SIZE): the offset of the cached block it takes now, or
        -1; None for a larger one (Pow2Allocator.cached_block)."""
        return self._core.cached_block(nbytes)

    def scratch(self, offset: int, nbytes: int) -> torch.Tensor:
        """A uint8 tensor over `nbytes` at heap offset `offset` of this PE's
        mapped memory, owning nothing (a fill of a cached block before its
        allocation is agreed: HeapCore.allocate)."""
        return self.backend.tensor(self.base + offset, (nbytes,), torch.uint8)

    def resize(self, retirement: Retirement, nbytes: int, dims, dtype) -> torch.Tensor:
        """A new tensor over the retired block, which now holds `nbytes` (same
        size class, same place); only when nothing viewed the old tensor anywhere."""
        offset = retirement.block.offset
        with self._lock:
            del self._records[offset]          # its watch goes first: no report
            retirement.storage = None
            return self._tensor_for(self._core.resize(offset, nbytes), dims, dtype)

    # -- memory of another allocator (import_external_tensor, collectively) --------
    def allocate_external(self, nbytes: int) -> Block:
        """An address range for imported memory (place_external maps it)."""
        with self._lock:
            return self._core.allocate_external(nbytes)

    def place_external(self, block: Block, owner: torch.Tensor, pieces: list, shift: int) -> None:
        """Map another allocator's `pieces` (backend.import_external) one after
        the other from heap offset block.offset + shift; the block owns their
        handle references and keeps `owner` alive from here on. Nothing stays
        mapped if a mapping fails, and the handles are given back."""
        self._place_external(block, owner, pieces, shift)

    def external_tensor_for(self, block: Block, lead: int, like: torch.Tensor) -> torch.Tensor:
        """The heap's tensor over imported memory: `like`'s geometry over a
        storage of like's size at heap offset block.offset + lead."""
        return self._external_tensor_for(block, lead, like)

    def imported(self, offset: int) -> Imported | None:
        """The imported memory of the block at `offset`, if it holds any."""
        return self._imported.get(offset)

    def storage_start(self, block: Block) -> int:
        """Heap offset where the storage of the block's tensor starts: the
        block's own offset, but for imported memory, which starts where its
        allocator put it inside its pieces."""
        imported = self._imported.get(block.offset)
        return block.offset if imported is None else imported.start

    # -- freeing, in two halves, and releasing what every PE agreed on ------------
    def retire(self, tensor: torch.Tensor, detach: bool = True) -> Retirement:
        """Detach `tensor` from its live block (first half of a free; not a
        face's own tensor, `detach` false: ownership.Retirement)."""
        return self._retire(tensor, detach)

    def finish_free(self, retirement: Retirement, release_now: bool) -> Exception | None:
        """Second half of a free: release the block now (nothing views it, here
        or on any PE), or defer it to its views' death. Returns what release()
        returns."""
        return self._finish_free(retirement, release_now)

    def take_dead(self) -> list[int]:
        """Offsets of blocks nothing here views any more (GC'd, or freed and
        their last view gone), handed over to be released (release())."""
        return self._take_dead()

    @property
    def idle_guards(self) -> tuple:
        """The (object, attribute) pairs that are all false while take_dead()
        would find nothing: what lets a quick barrier skip it (_collective.Quick)."""
        return ((self, "_dead"), (self._mailbox, "events"))

    def release(self, offset: int) -> Exception | None:
        """Give the block back to the allocator (its segment is cached).
        Imported memory is unmapped at once instead: where that fails, the
        release is done all the same (the allocator moved on) and the failure,
        logged, is returned, for the caller to decide whom to tell; else None."""
        return self._release(offset)

    def hold(self, block: Block, view: torch.Tensor) -> torch.Tensor:
        """Let `view` (memory at this block's offset elsewhere, e.g. a peer's
        copy) keep the block from being released until its storage dies."""
        with self._lock:
            record = self._records.get(block.offset)
            if record is None or record.block.serial != block.serial or record.freed:
                raise FreedTensorError(f"the block at heap offset {block.offset:#x} was freed "
                                       f"while a view of it was being made")
            if record.views is None:
                record.views = set()
            record.views.add(watch(view.untyped_storage(), self._died, block.offset,
                                   block.serial, VIEW))
        return view

    # -- lookups ---------------------------------------------------------------------
    def block_of(self, tensor: torch.Tensor) -> Block:
        """The live block `tensor` views; FreedTensorError for a tensor of a
        block freed since, NotSymmetricError for one that never was this heap's.

        A tensor counts as ours when its storage is the storage we created for
        a still-live block: a freed block's old views fail even while they keep
        its memory, and after the offset is reused, because the storage differs.
        """
        return self._record_of(tensor)[0].block

    def offset_of(self, tensor: torch.Tensor) -> int:
        """Heap offset of `tensor`'s first element (from the storage: data_ptr()
        is 0 for a tensor without elements)."""
        return (tensor.untyped_storage().data_ptr() - self.base
                + int(tensor.storage_offset()) * tensor.element_size())

    def size_class(self, nbytes: int) -> int:
        return self._core.size_class(nbytes)

    def allocator_state(self) -> tuple:
        """Everything that decides the allocator's future answers (for comparing PEs)."""
        with self._lock:
            return self._core.state()

    # -- the hooks of VMemPow2Allocator ----------------------------------------------
    def _releasing(self, segment: Segment) -> None:
        """Every listener is called, whatever fails; the first failure is raised after."""
        attempts = Attempts()
        for listener in self.release_listeners:
            attempts.attempt(listener, segment)
        attempts.raise_first()

    def _closing(self) -> None:
        for listener in self.close_listeners:
            listener()
