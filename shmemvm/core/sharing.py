"""New memory shared with the node's PEs, as one transaction of a collective.

A collective call that creates segments (malloc of a new size class, the
anchor, imported memory) shares them in one step after its own agreement:
each PE creates the segment's physical memory, exports it and sends it to
the other PEs of the node (node/exchange.py), maps it here (and attaches it
to the MPI window) while they import it, and imports theirs. A PE that fails
anywhere in that still tells its peers and hears every peer out; one vote
after the exchange then says whether every PE managed all of it, and where
one did not, every PE undoes the same allocation, so the allocators stay
identical everywhere. Either the call completes on every PE or it leaves
every PE as it was.
"""

from __future__ import annotations

import struct
from typing import Protocol

import torch
from mpi4py import MPI

from ..agreement.agreement import Agreement
from ..agreement.protocol import Call, Phase
from ..backends.base import VMMBackend
from ..errors import (HeapExhaustedError, PeerTimeoutError, ResourceLimitError, ShmemError,
                      SymmetryError, clip)
from ..memory.buddy import Block, Segment
from ..memory.heapmem import HeapMemory
from ..node.exchange import Exchange
from ..node.peers import PeerTable


class Sharing(Protocol):
    """What sharing new memory needs of a heap's core (state.HeapCore has it;
    typed here, so that the core can call these steps without a circle)."""

    local: HeapMemory
    peers: PeerTable
    exchange: Exchange
    agreement: Agreement
    backend: VMMBackend

    def map_new(self, created: list[Segment]) -> None: ...


def allocate_collectively(core: Sharing, nbytes: int, call: Call) -> Block:
    """Allocate the block every PE agreed on (`call` was agreed); create, share
    and map the segments it needs. The same block on every PE, or the same
    error on every PE with nothing left behind."""
    failure = None
    try:
        block, created, failure = core.local.allocate_unmapped(nbytes)
    except HeapExhaustedError:
        raise  # same state everywhere, so every PE raises it
    except Exception as exc:  # the allocator failed here alone: the others must undo too
        failure, block, created = exc, None, []
    # Segment creation is the same on every PE; only where segments were
    # created can a PE fail alone, so only then is it agreed on.
    if failure is None and not created:
        assert block is not None   # (allocate_unmapped made it)
        return block
    step_failure = exchange(core.exchange, core.agreement, call, created, core.local.export,
                            core.peers.map,
                            local=lambda: core.map_new(created), failed=failure)
    # Undoing releases the new segments, which unmaps peers' copies and
    # detaches them from the window (release listeners). A PE whose
    # allocation failed has undone it already (allocate_unmapped).
    if not core.agreement.all_ok(step_failure is None,
                                 call.step(Phase.SHARING, "sharing the new memory")):
        if failure is None:
            assert block is not None
            core.local.undo_allocation(block, created)
        raise_undone(core, call, step_failure, (
            f"{call.text} failed while PEs shared the new memory "
            f"({step_failure or 'see the other PEs'}); undone on every PE"))
    assert block is not None
    return block


def exchange(exchanger: Exchange, agreement: Agreement, call: Call, segments: list, export,
             map_peer, **options):
    """The fd exchange of `call`'s step (`exchanger.run`, numbered by `agreement`):
    the failure to agree on, or None. A timeout is raised instead: a PE is gone or stuck, and agreeing
    on it would wait as long again (2x SHMEMVM_TIMEOUT), so the heap is
    unusable from here on."""
    try:
        exchanger.run(agreement.seq, segments, export, map_peer, call.text, **options)
    except PeerTimeoutError as exc:
        agreement.mark_broken(f"{call.text}: {exc}")
        raise
    except (OSError, ShmemError, MPI.Exception) as exc:
        return exc
    return None


def raise_undone(core: Sharing, call: Call, failure: BaseException | None, message: str):
    """Raise the error of a step undone on every PE, the same kind on every
    PE: ResourceLimitError where some PE reached a system limit (descriptors,
    mappings: its message, which names the limit and what to change, is told
    to every PE), else ShmemError with `message`."""
    limit = failure
    while isinstance(limit, ResourceLimitError) and isinstance(limit.__cause__,
                                                               ResourceLimitError):
        limit = limit.__cause__  # the innermost: without the layers' prefixes
    # (cut at a word: clip; the bytes' bound stays for texts that are not ASCII)
    mine = (clip(str(limit), 2048).encode()[:2048] if isinstance(limit, ResourceLimitError)
            else b"")
    reports = core.agreement.allgather_bytes(Phase.LIMIT_REPORT, mine,
                                             f"{call.text} (reporting system limits)")
    limited = [pe for pe, report in enumerate(reports) if report]
    if limited:
        first = reports[limited[0]].decode(errors="replace")
        others = (f" (PE(s) {', '.join(map(str, limited[1:]))} too)"
                  if len(limited) > 1 else "")
        raise ResourceLimitError(f"{call.text} failed and was undone on every PE: PE "
                                 f"{limited[0]}{others}: {first}") from failure
    raise ShmemError(message) from failure


def agree_on_unmapping(core: Sharing, call: Call, failure: Exception | None, what: str) -> None:
    """After memory was released on every PE (the allocators moved on alike),
    only unmapping it can have failed, on one PE alone: agreed on, so that
    every PE raises the same ShmemError naming the failures, or none does."""
    step = call.step(Phase.UNMAPPED, f"unmapping {what}")
    if core.agreement.all_ok(failure is None, step):
        return
    reports = core.agreement.allgather_bytes(Phase.UNMAPPED,
                                             clip(str(failure or ""), 1024).encode()[:1024],
                                             f"{step.text} (reporting the failures)")
    failed = "; ".join(f"PE {pe}: {report.decode(errors='replace')}"
                       for pe, report in enumerate(reports) if report)
    raise ShmemError(f"{call.text} released {what} on every PE, but unmapping it failed "
                     f"({failed}); the heap stays usable") from failure


# -- another allocator's memory (openshmem/external.py) -----------------------------------
def place_imported(core: Sharing, tensor: torch.Tensor, pieces: list, call: Call):
    """The block for imported memory and where this PE's pieces go in it:
    (block, shift of the first piece, offset of the storage in the pieces)."""
    granularity = core.backend.granularity
    lead = tensor.untyped_storage().data_ptr() - pieces[0].va
    span = sum(piece.size for piece in pieces)
    places = [struct.unpack("<qq", data) for data in core.agreement.allgather_bytes(
        Phase.IMPORT_PLACES, struct.pack("<qq", lead, span), call.text)]
    if len({pe_lead % granularity for pe_lead, _ in places}) != 1:
        where = ", ".join(f"PE {pe}: byte {pe_lead % granularity}"
                          for pe, (pe_lead, _) in enumerate(places))
        raise SymmetryError(
            f"{call.text}: the tensors lie at different offsets inside the heap's "
            f"{granularity}-byte granularity ({where}), so no heap offset can hold all of "
            f"them; allocate them at the same place on every PE (the same sequence of "
            f"torch allocations), or copy in: x = heap.empty(t.shape, t.dtype); x.copy_(t)")
    top = max(pe_lead for pe_lead, _ in places)
    size = max(top - pe_lead + pe_span for pe_lead, pe_span in places)
    block = core.local.allocate_external(size)   # the same answer on every PE
    return block, top - lead, lead


def share_imported(core: Sharing, block: Block, shift: int, pieces: list, call: Call) -> None:
    """Hand this PE's pieces of imported memory to the PEs of the node and
    map theirs (each PE's pieces differ: torch's, where torch put them)."""
    handles, segments, offset = {}, [], block.offset + shift
    for piece in pieces:
        segments.append(Segment(offset, piece.size, block.segment.generation))
        handles[offset] = piece.handle
        offset += piece.size
    failure = exchange(
        core.exchange, core.agreement, call, segments, lambda segment: core.backend.export_fd(handles[segment.offset]),
        lambda pe, piece, fd: core.peers.map_piece(pe, block.segment, piece, fd),
        within=block.segment)
    if not core.agreement.all_ok(failure is None,
                                 call.step(Phase.SHARING, "sharing the imported memory")):
        core.local.undo_allocation(block, [])
        raise ShmemError(f"{call.text} failed while PEs shared the imported memory "
                         f"({failure or 'see the other PEs'}); undone on every PE") from failure

