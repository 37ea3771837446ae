"""Distributed locks over one symmetric int64 word (shmem_set_lock,
shmem_clear_lock, shmem_test_lock).

A ticket lock on PE 0's copy of the word: the high 32 bits count the tickets
taken, the low 32 bits the ticket now served; the lock is free when they are
equal. set_lock takes a ticket with one atomic fetch-add of 2**32 and polls
the word until its ticket is served; clear_lock serves the next ticket with one
atomic add of 1 to the low half. Why a ticket lock rather than MCS: it needs
nothing but the one word the user allocates (MCS needs a symmetric queue node
per PE, which a non-collective set_lock cannot allocate), it is FIFO, so no PE
starves under contention, and MCS's advantage, spinning on local memory, buys
nothing here: every read of the word goes through MPI anyway (the atomics'
path, atomic with respect to each other on and off the node), and a waiter
backs off in proportion to its place in the queue, so PE 0 is not flooded.

Waiting for a lock that a live PE holds for a long time is legitimate, so the
poll has no deadline; each MPI operation still has the heap's (an unanswering
PE 0 raises PeerTimeoutError). A wait that cannot end raises (issue 25): each
PE publishes which locks it holds or queues for, with its ticket, in its
liveness record (agreement/liveness.py), and set_lock's wait is watched: where
the PE with the ticket now served is dead or has left the heap it raises
PeerDeadError at once, and where every PE waits with nothing changing for the
timeout (two locks taken in opposite orders), DeadlockError on every PE. A
new word is all zeros, which is a free lock,
as OpenSHMEM's ``long lock = 0``. The word wraps after 2**32 acquisitions of
one lock without ill effect; the ticket count after 2**31 wraps through the
int64 sign, which the arithmetic here takes modulo 2**64.

Which locks this PE holds (and with which ticket) is this module's own state
of each heap (a feature of it: Core.calls.feature). The lock word is given to
acquire/try_acquire/release as its bytes (a uint8 tensor over symmetric
memory), as both faces have it; its atomics go through atomics.apply.
"""

from __future__ import annotations

import time

import torch

from .. import _args
from ..agreement import liveness
from ..core.state import Core, FeatureKey
from ..errors import ShmemError
from . import atomics, rma
from .words import INT64

#: the PE whose copy of the lock word is the lock
HOME_PE = 0
_TICKET = 1 << 32
_LOW = _TICKET - 1
_MASK64 = (1 << 64) - 1

# Polling: a waiter sleeps about this long per PE ahead of it, up to the cap,
# so the head of the queue notices its turn at once and the tail stays quiet.
_SLEEP_PER_WAITER = 20e-6
_MAX_SLEEP = 2e-3


#: this module's per-heap state: the locks held (HeapCore.feature)
HELD: FeatureKey[dict[int, int]] = FeatureKey("locks.held")


def _held(heap: Core) -> dict[int, int]:
    """The locks this PE holds on `heap`: lock offset -> its ticket."""
    return heap.calls.feature(HELD, dict)


def _publish(heap: Core, offset: int, ticket: int | None, how: str | None) -> None:
    """Tell the other PEs (this PE's liveness record) that it takes a ticket for
    the lock at `offset`, queues with `ticket`, holds it, or (how None) not."""
    heap.calls.publish_lock(offset, ticket, how)


def _lock_bytes(heap: Core, lock, what: str) -> torch.Tensor:
    """The lock word's bytes, after checking it is a one-element int64 symmetric
    tensor (TypeError, ValueError, NotSymmetricError or its subclass
    FreedTensorError otherwise)."""
    if not isinstance(lock, torch.Tensor):
        raise TypeError(f"{what}: lock must be a symmetric int64 tensor of one element, got "
                        f"{type(lock).__name__}")
    if lock.dtype != torch.int64:
        raise TypeError(f"{what}: lock must have dtype torch.int64 (OpenSHMEM's long), got "
                        f"{lock.dtype}; allocate it with heap.zeros(1, torch.int64)")
    if lock.numel() != 1:
        raise ValueError(f"{what}: lock must have exactly one element, got shape "
                         f"{tuple(lock.shape)}; pass a one-element tensor or view (locks[i:i+1])")
    return atomics.element_bytes(lock, what, "lock")   # (any strides; a negated view refused)


def _offset(heap: Core, word: torch.Tensor, what: str) -> int:
    """The heap offset of the lock word `word` (its 8 bytes), checked symmetric."""
    heap.where.symmetric(word, f"lock of {what} (a tensor from this heap's zeros)")
    return heap.where.offset_of(word)


def _atomic(heap: Core, word: torch.Tensor, op: str, value=0, cond=0, *, what: str):
    """`op` on PE HOME_PE's copy of the lock word (atomics.apply)."""
    return atomics.apply(heap, INT64, word, HOME_PE, op, value, cond, what=what)


def set_lock(heap: Core, lock: torch.Tensor) -> None:
    """Acquire `lock`, waiting for it as long as other PEs hold it (shmem_set_lock).

    PEs are served in the order they asked (a ticket lock), so none starves.
    Not collective. Once it returns, this PE sees every store that earlier
    holders made before their clear_lock.

    Args:
        lock: a one-element int64 symmetric tensor (or a view of one), allocated
            and zeroed collectively (``heap.zeros(1, torch.int64)``), and used
            only through set_lock/clear_lock/test_lock.

    Returns:
        None, once this PE holds the lock.

    Raises:
        TypeError: `lock` is not a tensor of dtype int64.
        ValueError: `lock` is not one element.
        NotSymmetricError: `lock` is not a symmetric tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        ShmemError: this PE already holds `lock` (it would wait for itself).
        UnsupportedError: the heap's memory is not reachable by MPI (a device
            heap: keep locks in a host-backend heap).
        PeerTimeoutError: PE 0, which keeps the lock, did not answer within the
            heap's timeout (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
            Waiting for a live holder has no deadline.
        PeerDeadError: the PE that holds the lock, or queues for it ahead of
            this one, is dead or has left the heap (raised within the timeout).
        DeadlockError: every PE waits (set_lock, wait_until, signal_wait_until)
            and nothing has changed for the timeout.
    """
    acquire(heap, _lock_bytes(heap, lock, "set_lock"), "set_lock")


def acquire(heap: Core, word: torch.Tensor, what: str = "set_lock") -> None:
    """set_lock on the lock word whose 8 bytes `word` views (either face's)."""
    offset = _offset(heap, word, what)
    if offset in _held(heap):
        raise ShmemError(f"set_lock: PE {heap.identity.my_pe} already holds this lock (heap offset "
                         f"{offset:#x}); locks are not recursive: clear_lock it first")
    _publish(heap, offset, None, "taking")   # (a PE that dies here is still known)
    ticket = (_atomic(heap, word, "add", _TICKET, what=what) & _MASK64) >> 32
    _publish(heap, offset, ticket, "queued")
    serving = None

    def describe(bits) -> str:
        return (f"set_lock(lock at heap offset {offset:#x}: ticket {ticket}, ticket {serving} "
                f"is served)")

    with liveness.watch(heap.calls.liveness, describe, lambda: (offset, serving)) as watch:
        while True:
            bits = _atomic(heap, word, "fetch", what=what)
            serving = bits & _LOW
            ahead = (ticket - serving) & _LOW
            if ahead == 0:
                break
            watch.tick(bits)   # (a ticket taken or served is progress)
            time.sleep(min(ahead * _SLEEP_PER_WAITER, _MAX_SLEEP))
    _held(heap)[offset] = ticket   # (published already: "queued" with the ticket now served)


def test_lock(heap: Core, lock: torch.Tensor) -> bool:
    """Acquire `lock` only if it is free now (shmem_test_lock); never waits for it.

    Args:
        lock: a one-element int64 symmetric tensor, as for set_lock.

    Returns:
        True when this PE acquired the lock (OpenSHMEM's 0), False when another
        PE holds it or is queued for it (OpenSHMEM's 1), or this PE already
        holds it.

    Raises:
        TypeError: `lock` is not a tensor of dtype int64.
        ValueError: `lock` is not one element.
        NotSymmetricError: `lock` is not a symmetric tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        UnsupportedError: the heap's memory is not reachable by MPI.
        PeerTimeoutError: PE 0 did not answer within the heap's timeout.
    """
    return try_acquire(heap, _lock_bytes(heap, lock, "test_lock"), "test_lock")


def try_acquire(heap: Core, word: torch.Tensor, what: str = "test_lock") -> bool:
    """test_lock on the lock word whose 8 bytes `word` views (either face's)."""
    offset = _offset(heap, word, what)
    if offset in _held(heap):
        return False
    old = _atomic(heap, word, "fetch", what=what)
    bits = old & _MASK64
    taken, serving = bits >> 32, bits & _LOW
    if taken != serving:
        return False
    # Free: take the ticket being served, unless another PE changed the word first.
    _publish(heap, offset, None, "taking")
    if _atomic(heap, word, "cas", _args.signed64(bits + _TICKET), old, what=what) != old:
        _publish(heap, offset, None, None)
        return False
    _held(heap)[offset] = serving
    _publish(heap, offset, serving, "held")
    return True


def clear_lock(heap: Core, lock: torch.Tensor) -> None:
    """Release `lock`, which this PE holds (shmem_clear_lock). This PE's puts and
    nbi operations on the default context are completed first (quiet()), so
    the next holder sees them.

    Args:
        lock: the one-element int64 symmetric tensor passed to set_lock.

    Returns:
        None; the next PE in line may now hold the lock.

    Raises:
        TypeError: `lock` is not a tensor of dtype int64.
        ValueError: `lock` is not one element.
        NotSymmetricError: `lock` is not a symmetric tensor of this heap
            (its subclass FreedTensorError: of one that was freed).
        ShmemError: this PE does not hold `lock`, or the word was changed by
            something other than set_lock/clear_lock/test_lock.
        UnsupportedError: the heap's memory is not reachable by MPI.
        PeerTimeoutError: PE 0 did not answer within the heap's timeout.
    """
    release(heap, _lock_bytes(heap, lock, "clear_lock"), "clear_lock")


def release(heap: Core, word: torch.Tensor, what: str = "clear_lock") -> None:
    """clear_lock on the lock word whose 8 bytes `word` views (either face's)."""
    offset = _offset(heap, word, what)
    ticket = _held(heap).get(offset)
    if ticket is None:
        raise ShmemError(f"clear_lock: PE {heap.identity.my_pe} does not hold this lock "
                         f"(heap offset "
                         f"{offset:#x}); only the PE that acquired it with set_lock or "
                         f"test_lock may release it")
    rma.quiet(heap)
    # Serve the next ticket: +1 in the low half, without a carry into the high one.
    step = 1 if ticket != _LOW else 1 - _TICKET
    old = _atomic(heap, word, "add", step, what=what)
    del _held(heap)[offset]
    _publish(heap, offset, None, None)
    if old & _LOW != ticket:
        raise ShmemError(f"clear_lock: the lock word (heap offset {offset:#x}) served ticket "
                         f"{old & _LOW}, not this PE's {ticket}: something other than "
                         f"set_lock/clear_lock/test_lock wrote it; the lock is now corrupt")
