"""The core's multi-step memory calls, each one core call of a routine: free,
realloc, trim and importing another allocator's memory.

Each is a sequence over the core's parts (the engine's retire/finish_free,
the agreement, the sharing of core/sharing.py) that used to be driven from
openshmem/ one core member at a time; here it is one function, and the
routine (openshmem/alloc.py, external.py) forms the call and makes one core
call (HeapCore.free, reallocate, trim_all, import_external).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from .. import _args
from ..agreement.protocol import Call, Outcome, Phase
from ..errors import ShmemError
from . import sharing


class Steps(sharing.Sharing, Protocol):
    """What these sequences need of the core (state.HeapCore has it; typed
    here, so that the core can call them without a circle)."""

    lock: threading.RLock

    def agree(self, call: Call, *, flag: bool = True) -> Outcome: ...
    def quick_free(self, offset: int) -> Callable[[bool], Outcome | int | None] | None: ...
    def quiet_all(self) -> None: ...
    def retire(self, tensor: torch.Tensor, detach: bool = True) -> Any: ...


def whole(core: Steps, tensor, what: str) -> None:
    """ValueError where `tensor` is a view of part of its block (a slice, a
    strided view): free() and realloc() take an allocation, and a view of all of
    it (another shape or dtype) is one; a part is not. Checked before anything
    is done, so the call fails on every PE (the agreement) and frees nothing."""
    if not isinstance(tensor, torch.Tensor):
        return   # retire() says what it must be
    itemsize = tensor.element_size()
    nbytes = tensor.numel() * itemsize
    if tensor.storage_offset() == 0 and nbytes == tensor.untyped_storage().nbytes() and (
            tensor.is_contiguous() or _dense(tensor)):
        return   # the common case, without a lookup: all of its storage, which is the block's
    block = core.local.block_of(tensor)   # (NotSymmetricError for a tensor of no live block)
    start = tensor.storage_offset() * itemsize
    raise ValueError(f"{what}: the tensor is a view of part of a symmetric tensor ({nbytes} "
                     f"bytes at byte {start} of the {block.nbytes}-byte allocation at heap "
                     f"offset {block.offset:#x}, shape {tuple(tensor.shape)}, strides "
                     f"{tuple(tensor.stride())}); a view is not an allocation: pass the tensor "
                     f"that malloc/empty/zeros/realloc returned (or a view of all of it)")


def _dense(tensor: torch.Tensor) -> bool:
    """Its elements fill the span from its first to its last element exactly once."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride())
                   if size > 0)
    return span == tensor.numel() and all(stride for size, stride in
                                          zip(tensor.shape, tensor.stride()) if size > 1)


def free(core: Steps, find: Callable[[], torch.Tensor], text: str, own: bool = False) -> None:
    """Free the tensor find() gives, in one agreed step (alloc.release says
    what find() may raise: at this call on every PE, nothing freed). With
    `own`, find() gives the face's own tensor of a whole allocation, kept by
    the face while its arrays live: not checked for being whole, nor emptied
    (the block is released once it dies)."""
    retirement = None
    call: Call | None = None
    try:
        with core.lock:
            try:
                tensor = find()
                if not own:
                    whole(core, tensor, "free")
                retirement = core.retire(tensor, not own)
            except (TypeError, ValueError) as exc:   # (NotSymmetricError is a ValueError)
                call = Call(Phase.FREE, (), text, exc)
                outcome = None
            else:
                offset = retirement.block.offset   # (its call made where the general path needs it)
                # this step's quick one, where quiet_all() and agree() have nothing to
                # do: 0 (agreed, the flag everywhere), -2 (agreed, the flag not
                # everywhere), the general path's Outcome, or None (not taken)
                quick = core.quick_free(offset)
                outcome = quick(retirement.alone) if quick is not None else None
            if outcome is None:
                if call is None:
                    call = free_call(offset)
                core.quiet_all()
                outcome = core.agree(call, flag=retirement is not None and retirement.alone)
            alone_everywhere = outcome == 0 if isinstance(outcome, int) else \
                outcome.flag_everywhere
            assert retirement is not None   # (else the agreement raised every PE's error)
            # imported memory is unmapped at once: where that fails on one PE, every PE says so
            imported = alone_everywhere and core.local.imported(offset) is not None
            failure = core.local.finish_free(retirement, release_now=alone_everywhere)
            if imported:
                sharing.agree_on_unmapping(core, call or free_call(offset), failure,
                                           "the imported memory")
    except BaseException:
        if retirement is not None and retirement.storage is not None:
            retirement.restore()  # nothing was done: the tensor stays usable
        raise


def free_call(offset: int) -> Call:
    """The call of a free of the block at heap `offset` (the agreed step's)."""
    return Call(Phase.FREE, (offset,), ("free(tensor at heap offset {:#x})", offset), None, True)


def reallocate(core: Steps, tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
    """realloc() (openshmem/alloc.py says what it does) as one core call."""
    call = Call(Phase.REALLOC, text=f"realloc(tensor, {nbytes!r})")
    retirement = None
    local = core.local
    try:
        with core.lock:
            try:
                whole(core, tensor, "realloc")
                retirement = core.retire(tensor)  # undone below if anything fails
                block = retirement.block
                dtype = tensor.dtype
                (count,), new_bytes = _args.tensor_nbytes(_args.elements_of(nbytes, dtype), dtype)
                call.args = (block.offset, new_bytes, dtype)
                call.text = f"realloc(tensor at heap offset {block.offset:#x}, {new_bytes})"
            except (TypeError, ValueError) as exc:   # (NotSymmetricError is a ValueError)
                call.error = exc
            core.quiet_all()
            alone_everywhere = core.agree(
                call, flag=retirement is not None and retirement.alone).flag_everywhere
            assert retirement is not None   # (else the agreement raised every PE's error)
            if (alone_everywhere and local.size_class(new_bytes) == block.size
                    and local.imported(block.offset) is None):
                return local.resize(retirement, new_bytes, (count,), dtype)
            new_block = sharing.allocate_collectively(core, new_bytes, call)
            result = local.tensor_for(new_block, (count,), dtype)
            keep = min(block.nbytes, new_bytes)
            if keep:
                result.view(torch.uint8)[:keep].copy_(retirement.old_bytes()[:keep])
            core.backend.synchronize()
            # (imported memory: a failed unmap is logged and not raised, as when
            # released later; free() agrees on it)
            local.finish_free(retirement, release_now=alone_everywhere)
            return result
    except BaseException:
        if retirement is not None and retirement.storage is not None:
            retirement.restore()
        raise


def trim(core: Steps) -> int:
    """trim() (openshmem/alloc.py) as one core call: the bytes released here."""
    with core.lock:
        call = Call(Phase.TRIM, text="trim()")
        core.agree(call)
        failure = None
        freed = 0
        try:
            freed = core.local.trim()
        except Exception as exc:  # noqa: BLE001 - an unmap here; every segment was tried
            failure = exc
        sharing.agree_on_unmapping(core, call, failure, "the cached memory")
        return freed


def import_external(core: Steps, tensor: torch.Tensor) -> torch.Tensor:
    """import_external_tensor() (openshmem/external.py) as one core call."""
    call = Call(Phase.IMPORT_EXTERNAL, text="import_external_tensor(tensor)")
    pieces = None
    if not isinstance(tensor, torch.Tensor):
        call.error = TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    else:
        call.args = (tensor.untyped_storage().nbytes(), tensor.dtype, tuple(tensor.shape),
                     tuple(tensor.stride()), tensor.storage_offset())
        call.text = (f"import_external_tensor(tensor of shape {tuple(tensor.shape)}, "
                     f"{tensor.dtype})")
    with core.lock:
        if call.error is None:
            try:
                pieces = core.backend.import_external(tensor)
            except ShmemError as exc:
                call.error = exc
        try:
            core.agree(call)
            assert pieces is not None   # (else the agreement raised every PE's error)
            block, shift, lead = sharing.place_imported(core, tensor, pieces, call)
        except BaseException:
            for piece in pieces or []:   # no block owns them
                core.backend.release(piece.handle)
            raise
        failure = None
        try:  # from here on the block owns the pieces
            core.local.place_external(block, tensor, pieces, shift)
        except Exception as exc:  # noqa: BLE001 - agreed on below
            failure = exc
        if not core.agreement.all_ok(failure is None,
                                     call.step(Phase.BACKING, "mapping the imported memory")):
            core.local.undo_allocation(block, [])
            raise ShmemError(f"{call.text} failed: a PE could not map the imported memory "
                             f"({failure or 'see the error on the other PEs'}); undone on "
                             f"every PE") from failure
        sharing.share_imported(core, block, shift, pieces, call)
        return core.local.external_tensor_for(block, shift + lead, tensor)


