"""Communication contexts (OpenSHMEM 1.5 shmem_ctx_*): a Ctx issues the heap's
put/get/nbi/atomic calls, and its quiet() completes its own outstanding
operations and no other context's (nor the default context's). Checked through
what can be observed: an nbi atomic's fetched value is stored only at the quiet
of the context that issued it, and the completion tracker of each context counts
what it still has to complete.

The MPI tests run with all PEs on one node and with simulated nodes of
SHMEMVM_NODE_SPLIT PEs (node_split=n//2, one PE per node at -n 2), where other
PEs are reached through MPI and put_nbi/get_nbi stay outstanding until quiet.

    mpirun -n 4 python -m pytest --with-mpi -m mpi tests/test_contexts.py
"""

import inspect
import sys

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import CTX_NOSTORE, CTX_PRIVATE, CTX_SERIALIZED, Ctx, ShmemError, SymmetricHeap
from shmemvm.transport.completion import CompletionTracker
from shmemvm.transport.route import AtomicPath

WORLD = MPI.COMM_WORLD
SENTINEL = -7


def _split(mode):
    return None if mode == "one-node" else max(1, WORLD.Get_size() // 2)


@pytest.fixture(params=["one-node", "node-split"])
def mheap(request):
    h = SymmetricHeap(WORLD, heap_size="8M", backend="host", timeout=30,
                      node_split=_split(request.param))
    yield h
    h.finalize()


def _offnode_pes(h):
    return [pe for pe in range(h.n_pes) if pe not in h.node_pes]


# -- operations on a context -------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_ctx_put_get_and_atomics(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    right, left = (me + 1) % n, (me - 1) % n
    data = h.zeros((8,), torch.float64)
    counter = h.zeros((1,), torch.int64)
    h.barrier_all()
    with h.ctx_create() as ctx:
        ctx.put(data, torch.full((8,), float(me), dtype=torch.float64), right)
        h.barrier_all()
        assert torch.equal(data, torch.full((8,), float(left)))
        got = torch.empty(8, dtype=torch.float64)
        ctx.get(got, data, right)           # right's data came from me
        assert torch.equal(got, torch.full((8,), float(me)))
        assert ctx.atomic_fetch_add(counter[0], 10, 0) >= 0  # others add too: see the total
        ctx.atomic_inc(counter[0], 0)
        old = torch.full((1,), SENTINEL, dtype=torch.int64)
        ctx.atomic_fetch_add_nbi(old, counter[0], 100, pe=0)
        ctx.quiet()
        assert old.item() != SENTINEL and old.item() >= 0
        h.barrier_all()
        assert ctx.atomic_fetch(counter[0], 0) == 111 * n
        ctx.iput(data, torch.arange(8, dtype=torch.float64), 2, 1, 4, right)
        h.barrier_all()
        assert data[::2].tolist() == [0.0, 1.0, 2.0, 3.0]
        h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_ctx_quiet_lands_its_nbi_puts(mheap):
    """After ctx.quiet() (no barrier) the target holds the data: read it back."""
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    right = (me + 1) % n
    data = h.zeros((1000,), torch.int32)
    h.barrier_all()
    ctx = h.ctx_create()
    source = torch.arange(1000, dtype=torch.int32) + me
    ctx.put_nbi(data, source, right)
    ctx.quiet()
    assert ctx.completion.outstanding == 0
    back = torch.empty(1000, dtype=torch.int32)
    h.get(back, data, right)
    assert torch.equal(back, source)
    landed = torch.empty(1000, dtype=torch.int32)
    ctx.get_nbi(landed, data, right)
    ctx.quiet()
    assert torch.equal(landed, source)
    ctx.destroy()
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_quiet_completes_only_its_own_context(mheap):
    """Three contexts each hold an nbi fetch-add: each quiet stores its own
    fetched value and leaves the others outstanding."""
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    counter = h.zeros((1,), torch.int64)
    h.barrier_all()
    a, b = h.ctx_create(), h.ctx_create()
    fetched = {name: torch.full((1,), SENTINEL, dtype=torch.int64) for name in "abh"}
    target = (me + 1) % n
    a.atomic_fetch_add_nbi(fetched["a"], counter[0], 1, target)
    b.atomic_fetch_add_nbi(fetched["b"], counter[0], 1, target)
    h.atomic_fetch_add_nbi(fetched["h"], counter[0], 1, target)
    if h.routes.atomics is not AtomicPath.WINDOW:
        # CPU atomics (and device kernels) complete at once, as OpenSHMEM allows an
        # nbi call to: nothing is left for any quiet; the values are there already
        assert (a.completion.outstanding, b.completion.outstanding,
                h.completion.outstanding) == (0, 0, 0)
        assert sorted(v.item() for v in fetched.values()) == [0, 1, 2]
        a.destroy(), b.destroy()
        h.barrier_all()
        assert h.atomic_fetch(counter[0], me) == 3
        return
    assert (a.completion.outstanding, b.completion.outstanding,
            h.completion.outstanding) == (1, 1, 1)

    a.quiet()
    assert fetched["a"].item() != SENTINEL
    assert fetched["b"].item() == SENTINEL and fetched["h"].item() == SENTINEL
    assert b.completion.outstanding == 1 and h.completion.outstanding == 1

    h.quiet()   # the default context only, as shmem_quiet
    assert fetched["h"].item() != SENTINEL
    assert fetched["b"].item() == SENTINEL and b.completion.outstanding == 1

    b.quiet()
    assert fetched["b"].item() != SENTINEL and b.completion.outstanding == 0
    assert sorted(v.item() for v in fetched.values()) == [0, 1, 2]  # only my three hit it
    a.destroy(), b.destroy()
    h.barrier_all()
    assert h.atomic_fetch(counter[0], me) == 3


@pytest.mark.mpi(min_size=2)
def test_offnode_nbi_puts_stay_with_their_context(mheap):
    """Off the node, put_nbi leaves its MPI request with the context that issued
    it: another context's quiet() does not take it."""
    h, me = mheap, mheap.my_pe
    far = _offnode_pes(h)
    if not far:
        pytest.skip("every PE is on this node (the one-node variant)")
    pe = far[0]
    data = h.zeros((64,), torch.int64)
    h.barrier_all()
    a, b = h.ctx_create(), h.ctx_create()
    b.put_nbi(data, torch.full((64,), me, dtype=torch.int64), pe)
    h.put_nbi(data[:1], torch.full((1,), me, dtype=torch.int64), pe)
    assert b.completion.outstanding == 1 and h.completion.outstanding == 1
    a.quiet()
    h.quiet()
    assert b.completion.outstanding == 1 and h.completion.outstanding == 0
    b.quiet()
    assert b.completion.outstanding == 0
    a.destroy(), b.destroy()
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_nbi_strided_and_staged_land_at_quiet(mheap):
    """put_nbi into a strided view (an MPI derived datatype off the node, freed
    at quiet) and get_nbi into a non-contiguous tensor (staged, copied at quiet)."""
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    right = (me + 1) % n
    grid = h.zeros((6, 8), torch.int64)
    h.barrier_all()
    with h.ctx_create() as ctx:
        source = torch.arange(6, dtype=torch.int64) + 100 * me
        ctx.put_nbi(grid[:, 3], source, right)                # a column: stride 8
        ctx.quiet()
        out = torch.zeros((6, 2), dtype=torch.int64)
        ctx.get_nbi(out[:, 1], grid[:, 3], right)             # into a strided column
        ctx.quiet()
        assert torch.equal(out[:, 1], source) and not out[:, 0].any()
    h.barrier_all()
    expected = torch.zeros((6, 8), dtype=torch.int64)
    expected[:, 3] = torch.arange(6) + 100 * ((me - 1) % n)
    assert torch.equal(grid, expected)
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_free_completes_every_context(mheap):
    h, me = mheap, mheap.my_pe
    counter = h.zeros((1,), torch.int64)
    scratch = h.zeros((4,), torch.int64)
    h.barrier_all()
    ctx = h.ctx_create()
    old = torch.full((1,), SENTINEL, dtype=torch.int64)
    ctx.atomic_fetch_add_nbi(old, counter[0], 1, me)
    h.free(scratch)   # nothing may be in flight when memory is released
    assert ctx.completion.outstanding == 0 and old.item() == 0
    ctx.destroy()
    h.barrier_all()


# -- lifetime and options ------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_destroyed_context_refuses_use(mheap):
    h, me = mheap, mheap.my_pe
    counter = h.zeros((1,), torch.int64)
    h.barrier_all()
    ctx = h.ctx_create()
    old = torch.full((1,), SENTINEL, dtype=torch.int64)
    ctx.atomic_fetch_inc_nbi(old, counter[0], me)
    h.ctx_destroy(ctx)                      # completes first
    assert old.item() == 0
    for use in (lambda: ctx.put(counter, torch.zeros(1, dtype=torch.int64), me),
                lambda: ctx.atomic_inc(counter[0], me), ctx.quiet, ctx.fence,
                lambda: ctx.get_nbi(torch.empty(1, dtype=torch.int64), counter, me)):
        with pytest.raises(ShmemError, match="destroyed"):
            use()
    ctx.destroy()  # again: nothing
    with h.ctx_create(CTX_PRIVATE) as scoped:
        scoped.atomic_inc(counter[0], me)
    with pytest.raises(ShmemError, match="destroyed"):
        scoped.atomic_inc(counter[0], me)
    assert counter.item() == 2
    with pytest.raises(TypeError, match="ctx_destroy"):
        h.ctx_destroy(object())
    h.barrier_all()


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


# -- teams ---------------------------------------------------------------------------------
class ReversedTeam:
    """A stand-in for teams.Team: team PE p is heap PE n-1-p."""

    def __init__(self, heap):
        self.heap, self.n = heap, heap.n_pes

    def world_pe(self, pe):
        if not 0 <= pe < self.n:
            raise ValueError(f"team pe {pe} out of range")
        return self.n - 1 - pe


@pytest.mark.mpi(min_size=1)
def test_team_context_maps_pe_numbers(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    data = h.zeros((2,), torch.int64)
    h.barrier_all()
    ctx = Ctx(h, team=ReversedTeam(h))
    ctx.put(data[:1], torch.tensor([me]), 0)                    # team PE 0: heap PE n-1
    ctx.atomic_add(data[1], 1, pe=0)                            # by keyword too
    fetched = torch.full((1,), SENTINEL, dtype=torch.int64)
    ctx.atomic_fetch_nbi(fetched, data[1], n - 1)               # team PE n-1: heap PE 0
    ctx.quiet()
    h.barrier_all()
    if me == n - 1:
        assert data[1].item() == n and 0 <= data[0].item() < n
    else:
        assert data.tolist() == [0, 0]
    assert fetched.item() in range(n + 1)
    with pytest.raises(ValueError, match="team pe"):
        ctx.put(data, torch.zeros(2, dtype=torch.int64), n)
    ctx.destroy()

    team = ReversedTeam(h)
    team.heap = object()
    with pytest.raises(ValueError, match="another heap"):
        Ctx(h, team=team)
    h.barrier_all()


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
