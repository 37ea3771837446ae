"""Communication contexts (OpenSHMEM 1.5 shmem_ctx_*): a Ctx issues the heap's
put/get/nbi/atomic calls, and its quiet() completes its own outstanding
operations and no other context's (nor the default context's). Checked through
what can be observed: an nbi atomic's fetched value is stored only at the quiet
of the context that issued it, and the completion tracker of each context counts
what it still has to complete.

The MPI tests run with all PEs on one node and with simulated nodes of
SHMEMVM_NODE_SPLIT PEs (node_split=n//2, one PE per node at -n 2), where other
PEs are reached through MPI and put_nbi/get_nbi stay outstanding until quiet.

    mpirun -n 4 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_contexts.py
"""

import pytest
import torch
from mpi4py import MPI

from shmemvm import CTX_PRIVATE, Ctx, ShmemError, SymmetricHeap
from shmemvm.transport.route import AtomicPath
from shmemvm.core.state import parts_of

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
    if parts_of(h).routes.atomics is not AtomicPath.WINDOW:
        # CPU atomics (and device kernels) complete at once, as OpenSHMEM allows an
        # nbi call to: nothing is left for any quiet; the values are there already
        assert (a.completion.outstanding, b.completion.outstanding,
                parts_of(h).completion.outstanding) == (0, 0, 0)
        assert sorted(v.item() for v in fetched.values()) == [0, 1, 2]
        a.destroy(), b.destroy()
        h.barrier_all()
        assert h.atomic_fetch(counter[0], me) == 3
        return
    assert (a.completion.outstanding, b.completion.outstanding,
            parts_of(h).completion.outstanding) == (1, 1, 1)

    a.quiet()
    assert fetched["a"].item() != SENTINEL
    assert fetched["b"].item() == SENTINEL and fetched["h"].item() == SENTINEL
    assert b.completion.outstanding == 1 and parts_of(h).completion.outstanding == 1

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
    assert b.completion.outstanding == 1 and parts_of(h).completion.outstanding == 1
    a.quiet()
    h.quiet()
    assert b.completion.outstanding == 1 and parts_of(h).completion.outstanding == 0
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
