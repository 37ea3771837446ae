"""Communication contexts (OpenSHMEM 1.5 shmem_ctx_*) in one process: options,
help, a finalized heap's contexts, the completion tracker on a device stand-in,
and (with a CUDA GPU) a context's own stream. Contexts under MPI:
tests/mpi/openshmem/test_contexts.py.
"""

import inspect
import sys

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import CTX_NOSTORE, CTX_PRIVATE, CTX_SERIALIZED, Ctx, ShmemError, SymmetricHeap
from shmemvm.transport.completion import CompletionTracker

WORLD = MPI.COMM_WORLD
SENTINEL = -7


def test_options_are_checked_and_recorded(heap):
    assert (CTX_SERIALIZED, CTX_PRIVATE, CTX_NOSTORE) == (1, 2, 4)
    ctx = heap.ctx_create(CTX_SERIALIZED | CTX_NOSTORE)
    assert ctx.options == 5 and ctx.team is None and ctx.heap is heap
    with pytest.raises(ValueError, match="options"):
        heap.ctx_create(8)
    with pytest.raises(TypeError, match="options"):
        heap.ctx_create("private")
    with pytest.raises(TypeError, match="SymmetricHeap"):
        Ctx(object())
    ctx.destroy()


def test_module_functions_and_help():
    """A context issues the heap's own routines (written once, taking a context
    first), so its methods are those functions and show their documentation;
    the class says what a context changes (team-relative PEs, its own quiet)."""
    assert shmemvm.ctx_create.__doc__ == SymmetricHeap.ctx_create.__doc__
    for name in ("put", "put_nbi", "atomic_fetch_add_nbi", "put_signal", "iput"):
        assert getattr(Ctx, name) is getattr(SymmetricHeap, name), name
        assert "Raises:" in getattr(Ctx, name).__doc__, name
        assert "_tracker" not in str(inspect.signature(getattr(Ctx, name))), name
    assert "team-relative" in Ctx.__doc__ + sys.modules[Ctx.__module__].__doc__


def test_contexts_of_a_finalized_heap():
    h = SymmetricHeap(WORLD.Split(WORLD.Get_rank(), 0), heap_size="4M", backend="host",
                      timeout=30)
    ctx = h.ctx_create()
    counter = h.zeros((1,), torch.int64)
    old = torch.full((1,), SENTINEL, dtype=torch.int64)
    ctx.atomic_fetch_add_nbi(old, counter[0], 5, 0)
    del counter
    h.finalize()            # completes every context before the window goes
    assert old.item() == 0
    with pytest.raises(ShmemError, match="finalized"):
        ctx.quiet()
    ctx.destroy()
    with pytest.raises(ShmemError, match="finalized"):
        h.ctx_create()


# -- the completion tracker on a device stand-in ---------------------------------------------
class FakeStream:
    def __init__(self, stream_id):
        self.device_index, self.stream_id, self.synced = 0, stream_id, 0

    def synchronize(self):
        self.synced += 1


class FakeBackend:
    """copy() reports a stream as a device backend does; synchronize() counts."""
    device = torch.device("cpu")

    def __init__(self):
        self.stream, self.current_syncs = FakeStream(3), 0

    def copy(self, dst, src, blocking):
        dst.copy_(src)
        return None if blocking else self.stream

    def synchronize(self):
        self.current_syncs += 1


def test_tracker_waits_for_its_own_streams_only():
    backend = FakeBackend()
    default = CompletionTracker(backend, current_stream=True)
    mine = CompletionTracker(backend, current_stream=False)
    x = torch.zeros(4)
    mine.copy(x, torch.ones(4))
    mine.copy(x, torch.ones(4))
    assert mine.outstanding == 1 and default.outstanding == 0  # one stream, kept once
    default.quiet()
    assert backend.stream.synced == 0 and backend.current_syncs == 1
    mine.quiet()
    assert backend.stream.synced == 1 and backend.current_syncs == 1 and mine.outstanding == 0
    mine.quiet()
    assert backend.stream.synced == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the ctx's own "
                    "stream); the host tests above cover the bookkeeping")
def test_device_context_copies_on_its_own_stream():
    from shmemvm import backends
    if not backends.available("cuda"):
        pytest.skip("the cuda backend is not available (cuda-bindings missing)")
    h = SymmetricHeap(WORLD.Split(WORLD.Get_rank(), 0), heap_size="64M", backend="cuda",
                      timeout=30)
    try:
        x = h.zeros((1 << 20,), torch.float32)
        source = torch.arange(1 << 20, dtype=torch.float32, device=h.device)
        with h.ctx_create() as ctx:
            ctx.put_nbi(x, source, 0)
            assert ctx.completion.outstanding == 1
            stream = next(iter(ctx.completion._streams.values()))
            assert stream.stream_id != torch.cuda.current_stream(h.device).stream_id
            ctx.quiet()
            assert torch.equal(x, source) and ctx.completion.outstanding == 0
        del x
    finally:
        h.finalize()
