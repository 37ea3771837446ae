"""Barriers over every PE of the heap: barrier_all (puts complete, then wait
for every PE) and sync_all (this PE's stores complete, then wait).

Both are one agreed step (Core.calls.agree): the same allreduce that checks
every PE is in the same call is the barrier, on the node through the
agreement's shared-memory board where it has one.
"""

from __future__ import annotations

from ..agreement.protocol import Call, Phase
from ..core.state import Core
from . import rma

#: the calls of the two barriers, made once: they have no arguments, and the
#: agreement never changes a Call it is given (its vector: protocol's cache; issue 30)
BARRIER_ALL = Call(Phase.BARRIER_ALL, text="barrier_all()", exact=True).fixed()
SYNC_ALL = Call(Phase.SYNC_ALL, text="sync_all()", exact=True).fixed()


def barrier_all(heap: Core) -> None:
    """Complete this PE's puts, then wait for every PE (collective).

    This PE's queued device work (kernels and copies on the current stream)
    and its off-node puts are complete first, so after the barrier every PE
    sees every put made before it.

    Returns:
        None.

    Raises:
        SymmetryError: some PE is in another collective call.
        PeerTimeoutError: a PE did not arrive within the heap's timeout
            (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
        ShmemError: the heap is finalized.
    """
    quick = heap.calls.quick[BARRIER_ALL]   # (the same step, whole in C, where nothing is unusual)
    if quick is None or quick() is None:
        with heap.lock:
            rma.quiet(heap)
            heap.calls.agree(BARRIER_ALL)


def sync_all(heap: Core) -> None:
    """Wait for every PE (collective). This PE's own stores are complete
    first, including device work queued on the current stream (a kernel
    writing symmetric memory), since a host-side barrier that let them run
    on would order nothing; off-node nbi operations are not flushed.

    Returns:
        None.

    Raises:
        SymmetryError: some PE is in another collective call.
        PeerTimeoutError: a PE did not arrive within the heap's timeout
            (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
        ShmemError: the heap is finalized.
    """
    quick = heap.calls.quick[SYNC_ALL]
    if quick is None or quick() is None:
        with heap.lock:
            heap.calls.synchronize()
            heap.calls.agree(SYNC_ALL)
