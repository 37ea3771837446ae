"""Signals (OpenSHMEM 1.5): a put whose arrival is signalled (put_signal),
and this PE's side of it (signal_fetch, signal_wait_until).

put_signal copies the data first (a copy through the node mapping, or an MPI
put complete at the target), then updates the signal with an atomic on the
heap's atomic path, so whoever sees the signal change sees the data.

Written once over words (words.py): signal_put() takes the signal as its
Word and bytes, as both faces give it; the torch functions map a tensor.
"""

from __future__ import annotations

import torch

from .. import _docs
from ..core.state import Context, Core
from . import atomics, rma, waits
from .words import Word

#: signal update operations of put_signal
SIGNAL_SET = "set"
SIGNAL_ADD = "add"
#: each signal update as an atomic operation (atomics.apply)
_SIGNAL_OPS = {SIGNAL_SET: "set", SIGNAL_ADD: "add"}


def put_signal(ctx: Context, dest: torch.Tensor, source: torch.Tensor, sig: torch.Tensor, value: int,
               op: str, pe: int) -> None:
    """Put `source` into `dest` on PE `pe`, then update `sig` there: whoever sees
    the signal change sees the data.

    Args:
        dest: symmetric destination tensor (as for put).
        source: any tensor with dest's dtype and number of elements.
        sig: a one-element view of an integer symmetric tensor.
        value: the signal value (an integer that fits sig's dtype).
        op: "set" (SIGNAL_SET: sig = value) or "add" (SIGNAL_ADD: sig += value).
        pe: the PE that receives the data and the signal.

    Returns:
        None; data and signal are complete at PE `pe`.

    Raises:
        ValueError: `op` is not "set" or "add", or as for put and the atomics.
        TypeError, NotSymmetricError (FreedTensorError: freed), UnsupportedError:
            as for put and the atomics.
        PeerTimeoutError: PE `pe` did not take the data or the signal within the
            heap's timeout (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
    """
    word, where = waits.tensor_ivar(sig, "put_signal (signal)", "target")
    signal_put(ctx, dest, source, word, where, value, op, pe, what="put_signal")


def signal_put(ctx: Context, dest: torch.Tensor, source: torch.Tensor, word: Word,
               sig: torch.Tensor, value, op: str, pe, *, what: str) -> None:
    """put_signal over any tensors `dest` (symmetric) and `source` (bytes too),
    the signal given as its integer `word` and bytes `sig` (a uint8 tensor over
    symmetric memory): both faces' one implementation."""
    heap, pe = ctx.core, ctx.world_pe(pe)
    if op not in _SIGNAL_OPS:
        raise ValueError(f"{what}: op must be {SIGNAL_SET!r} or {SIGNAL_ADD!r} (the signal "
                         f"update), got {op!r}")
    waits.check_word(word, what, "signal")
    # every check of the signal's atomic before any data moves
    atomics.prepare(heap, word, sig, pe, _SIGNAL_OPS[op], f"{what} (signal)")
    word.value(value, what)
    rma.put(heap, dest, source, pe)   # on the node: copied; off the node: put, complete there
    heap.calls.synchronize()
    atomics.apply(heap, word, sig, pe, _SIGNAL_OPS[op], value, what=f"{what} (signal)")


def put_signal_nbi(ctx: Context, dest: torch.Tensor, source: torch.Tensor, sig: torch.Tensor,
                   value: int, op: str, pe: int) -> None:
    """put_signal that OpenSHMEM lets complete as late as quiet(); this one is
    blocking (OpenSHMEM allows an nbi call to complete before it returns): data
    and signal are complete at PE `pe` when it returns, and `source` may be
    reused at once.

    Args:
        dest: symmetric destination tensor (as for put).
        source: any tensor with dest's dtype and number of elements.
        sig: a one-element view of an integer symmetric tensor.
        value: the signal value (an integer that fits sig's dtype).
        op: "set" (SIGNAL_SET: sig = value) or "add" (SIGNAL_ADD: sig += value).
        pe: the PE that receives the data and the signal.

    Returns:
        None; data and signal are complete at PE `pe`.

    Raises:
        As put_signal.
    """
    put_signal(ctx, dest, source, sig, value, op, pe)


@_docs.appended(waits.LOCAL_RAISES)
def signal_fetch(heap: Core, sig: torch.Tensor) -> int:
    """This PE's signal value, read atomically.

    Args:
        sig: a one-element view of an integer symmetric tensor.

    Returns:
        The value of this PE's `sig`, as a Python int.
    """
    word, where = waits.tensor_ivar(sig, "signal_fetch", "signal")
    return atomics.read(heap, word, where, "signal_fetch")


@_docs.appended(waits.WAIT_RAISES)
def signal_wait_until(heap: Core, sig: torch.Tensor, cmp: str, value: int,
                      timeout: float | None = None) -> int:
    """Wait until this PE's `sig` compares `cmp` to `value` (see put_signal).

    Args:
        sig: a one-element view of an integer symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (sig `cmp` value).
        value: the integer to compare with.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        The signal value seen that satisfied the comparison.
    """
    word, where = waits.tensor_ivar(sig, "signal_wait_until", "signal")
    return waits.wait_for(heap, word, where, cmp, value, timeout, "signal_wait_until")
