"""Signals (OpenSHMEM 1.5): a put whose arrival is signalled (put_signal),
and this PE's side of it (signal_fetch, signal_wait_until).

put_signal copies the data first (a copy through the node mapping, or an MPI
put complete at the target), then updates the signal with an atomic on the
heap's atomic path, so whoever sees the signal change sees the data.
"""

from __future__ import annotations

import torch
from mpi4py import MPI

from .. import _docs
from ..core.state import Context, HeapCore
from . import atomics, rma, waits

#: signal update operations of put_signal
SIGNAL_SET = "set"
SIGNAL_ADD = "add"
_SIGNAL_OPS = {SIGNAL_SET: MPI.REPLACE, SIGNAL_ADD: MPI.SUM}


def put_signal(ctx: Context, dest: torch.Tensor, source: torch.Tensor, sig: torch.Tensor, value: int,
               op: str, pe: int) -> None:
    """Put `source` into `dest` on PE `pe`, then update `sig` there: whoever sees
    the signal change sees the data.

    Args:
        dest: symmetric destination tensor (as for put).
        source: any tensor with dest's dtype and number of elements.
        sig: a one-element view of an int32, int64 or uint64 symmetric tensor.
        value: the signal value (an integer that fits sig's dtype).
        op: "set" (SIGNAL_SET: sig = value) or "add" (SIGNAL_ADD: sig += value).
        pe: the PE that receives the data and the signal.

    Returns:
        None; data and signal are complete at PE `pe`.

    Raises:
        ValueError: `op` is not "set" or "add", or as for put and the atomics.
        TypeError, FreedTensorError, UnsupportedError: as for put and the atomics.
        PeerTimeoutError: PE `pe` did not take the data or the signal within the
            heap's timeout (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
    """
    heap, pe = ctx.core, ctx.world_pe(pe)
    what = "put_signal"
    if op not in _SIGNAL_OPS:
        raise ValueError(f"{what}: op must be {SIGNAL_SET!r} or {SIGNAL_ADD!r} (the signal "
                         f"update), got {op!r}")
    pe = atomics.check_target(heap, sig, pe, f"{what} (signal)")  # check before any data moves
    if not atomics.by_kernel(heap, pe):
        atomics.locate(heap, sig, pe, f"{what} (signal)", "target")
    atomics.value_for(value, sig.dtype, what)
    rma.put(heap, dest, source, pe)   # on the node: copied; off the node: put, complete there
    heap.backend.synchronize()
    atomics.fetch_op(heap, sig, value, pe, _SIGNAL_OPS[op], f"{what} (signal)")


def put_signal_nbi(ctx: Context, dest: torch.Tensor, source: torch.Tensor, sig: torch.Tensor,
                   value: int, op: str, pe: int) -> None:
    """put_signal that OpenSHMEM lets complete as late as quiet(); this one is
    blocking (OpenSHMEM allows an nbi call to complete before it returns): data
    and signal are complete at PE `pe` when it returns, and `source` may be
    reused at once.

    Args:
        dest: symmetric destination tensor (as for put).
        source: any tensor with dest's dtype and number of elements.
        sig: a one-element view of an int32, int64 or uint64 symmetric tensor.
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
def signal_fetch(heap: HeapCore, sig: torch.Tensor) -> int:
    """This PE's signal value, read atomically.

    Args:
        sig: a one-element view of an int32, int64 or uint64 symmetric tensor.

    Returns:
        The value of this PE's `sig`, as a Python int.
    """
    return atomics.read_local(heap, sig, "signal_fetch")


@_docs.appended(waits.WAIT_RAISES)
def signal_wait_until(heap: HeapCore, sig: torch.Tensor, cmp: str, value: int,
                      timeout: float | None = None) -> int:
    """Wait until this PE's `sig` compares `cmp` to `value` (see put_signal).

    Args:
        sig: a one-element view of an int32, int64 or uint64 symmetric tensor.
        cmp: "eq", "ne", "gt", "ge", "lt" or "le" (sig `cmp` value).
        value: the integer to compare with.
        timeout: seconds to wait at most; None (the default) waits for ever.

    Returns:
        The signal value seen that satisfied the comparison.
    """
    return waits.wait_for(heap, sig, cmp, value, timeout, "signal_wait_until")
