"""Teams (OpenSHMEM 1.5) over one symmetric heap, and the collectives over
teams: team-relative PE numbers, members only, the same results as a plain
computation, mismatches as SymmetryError on every member, clear errors.

Every test that moves data runs twice, as tests/mpi/transport/test_multinode.py does: all
PEs on one node (peer mappings) and a forced split into simulated nodes
(node_split=n_pes//2: at -n 4 two 2-PE nodes, at -n 2 one PE per node), where
a team that spans the halves takes the MPI path.

    mpirun -n 4 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_teams.py
"""

import pytest
import torch
from mpi4py import MPI

import shmemvm
from conftest import TEST_BACKEND
from shmemvm import ShmemError, SymmetricHeap, SymmetryError, Team

WORLD = MPI.COMM_WORLD


def _split_size(mode):
    return None if mode == "one-node" else max(1, WORLD.Get_size() // 2)


@pytest.fixture(params=["one-node", "split-nodes"])
def mheap(request):
    """A heap over COMM_WORLD, all PEs on one node (on the test backend) or split
    into simulated nodes (host memory: device memory is not given to MPI)."""
    split = _split_size(request.param)
    h = SymmetricHeap(WORLD, heap_size="16M", backend=TEST_BACKEND if split is None else "host",
                      timeout=30, node_split=split)
    yield h
    h.finalize()


def _all(flag) -> bool:
    """True on every PE when `flag` is true on every PE."""
    return WORLD.allreduce(bool(flag), op=MPI.LAND)


#: the teams the data tests run over; each needs at least `_MIN_PES[spec]` PEs
SPECS = ["world", "shared", "even", "odd", "tail", "nested"]
_MIN_PES = {"world": 1, "shared": 1, "even": 1, "odd": 2, "tail": 2, "nested": 2}


def _make(h, spec):
    """(team or None on non-members, the expected heap PEs of the team)."""
    n, w = h.n_pes, h.team_world()
    if n < _MIN_PES[spec]:
        pytest.skip(f"the {spec} team needs {_MIN_PES[spec]} PEs")
    if spec == "world":
        return w, list(range(n))
    if spec == "shared":
        return h.team_shared(), list(h.node_pes)
    if spec == "even":
        return w.split_strided(0, 2, (n + 1) // 2), list(range(0, n, 2))
    if spec == "odd":
        return h.team_split_strided(w, 1, 2, n // 2), list(range(1, n, 2))
    if spec == "tail":   # start and size: every PE but the first
        return w.split_strided(1, 1, n - 1), list(range(1, n))
    # nested: every other PE of the tail team, split from the tail (not the world)
    tail = w.split_strided(1, 1, n - 1)
    child = tail.split_strided(0, 2, n // 2) if tail is not None else None
    return child, list(range(1, n, 2))


# -- membership and numbering -------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("spec", SPECS)
def test_team_members_numbering_and_translation(mheap, spec):
    h, me = mheap, mheap.my_pe
    team, members = _make(h, spec)
    w = h.team_world()
    assert (team is None) == (me not in members)
    for pe in range(h.n_pes):
        assert w.translate_pe(pe, team) == (members.index(pe) if team is not None and
                                            pe in members else -1)
    if team is not None:
        assert isinstance(team, Team) and team.heap is h
        assert team.my_pe() == members.index(me) == h.team_my_pe(team)
        assert team.n_pes() == len(members) == h.team_n_pes(team)
        for i, pe in enumerate(members):
            assert team.world_pe(i) == pe
            assert team.translate_pe(i, w) == pe == h.team_translate_pe(team, i, w)
            assert w.translate_pe(pe, team) == i
            assert team.translate_pe(i, None) == -1
        shared = h.team_shared()
        for i, pe in enumerate(members):
            assert team.translate_pe(i, shared) == (h.node_pes.index(pe) if pe in h.node_pes
                                                    else -1)
        assert team.get_config() == {"num_contexts": 0}
        team.sync()
        h.team_sync(team)
        if team.kind == "split":
            team.destroy()
    # OpenSHMEM's SHMEM_TEAM_INVALID answers -1 to the queries
    assert h.team_my_pe(None) == -1 and h.team_n_pes(None) == -1
    assert h.team_translate_pe(None, 0, w) == -1
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_predefined_teams(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    w, shared = h.team_world(), h.team_shared()
    assert w is h.team_world() and shared is h.team_shared()
    assert w.pes == tuple(range(n)) and w.my_pe() == me and w.n_pes() == n
    assert list(shared.pes) == h.node_pes and shared.my_pe() == h.node_pes.index(me)
    x = h.zeros(4, torch.int32)
    for i in range(shared.n_pes()):   # the shared team's PEs are mapped directly
        assert h.ptr(x, shared.world_pe(i)) is not None
    assert shared.get_config() == {"num_contexts": 0}
    for team in (w, shared):
        with pytest.raises(ShmemError, match="predefined"):
            team.destroy()
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("xrange", [1, 2, 3, "n", "n+1"])
@pytest.mark.parametrize("parent", ["world", "shared"])
def test_split_2d_shapes_and_round_trips(mheap, xrange, parent):
    h = mheap
    p = h.team_world() if parent == "world" else h.team_shared()
    n, me = p.n_pes(), p.my_pe()
    x = {"n": n, "n+1": n + 1}.get(xrange, xrange)
    cols = min(x, n)
    row, col = me // cols, me % cols
    xt, yt = p.split_2d(x, xaxis_config={"num_contexts": 1})
    assert [p.translate_pe(i, h.team_world()) for i in (range(n))] == list(p.pes)
    expected_row = [row * cols + c for c in range(cols) if row * cols + c < n]
    expected_col = list(range(col, n, cols))
    assert list(xt.pes) == [p.world_pe(i) for i in expected_row]
    assert list(yt.pes) == [p.world_pe(i) for i in expected_col]
    assert (xt.my_pe(), yt.my_pe()) == (col, row)
    assert xt.get_config() == {"num_contexts": 1} and yt.get_config() == {"num_contexts": 0}
    # round trips: team -> parent -> team, and the row/column meet in this PE only
    for team in (xt, yt):
        for i in range(team.n_pes()):
            assert p.translate_pe(team.translate_pe(i, p), team) == i
    assert xt.translate_pe(xt.my_pe(), yt) == yt.my_pe()
    for i in range(xt.n_pes()):
        if i != col:
            assert xt.translate_pe(i, yt) == -1
    # a row and a column reduction of the world PE numbers
    value = h.zeros(1, torch.int64)
    total = h.zeros(1, torch.int64)
    value.fill_(h.my_pe)
    for team in (xt, yt):
        team.reduce(total, value)
        assert total.item() == sum(team.pes)
    xt.destroy()
    yt.destroy()
    h.barrier_all()


# -- collectives over teams ------------------------------------------------------------------------
def _values(pe: int, count: int, dtype) -> torch.Tensor:
    """PE `pe`'s source: known to every PE, distinct per PE."""
    g = torch.Generator().manual_seed(1000 + pe)
    if dtype.is_floating_point:
        return torch.randn(count, generator=g).to(dtype)
    return torch.randint(-1000, 1000, (count,), generator=g).to(dtype)


def _eq(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal on the CPU: the heap's tensors may be device tensors."""
    return torch.equal(a.cpu(), b.cpu())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("spec", SPECS)
def test_team_collectives_match_a_plain_computation(mheap, spec):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    team, members = _make(h, spec)
    k = len(members)
    m = 6
    sentinel = -7
    # world-allocated symmetric tensors, used by the team's members only
    src = h.zeros(k * m, torch.int64)
    dst = h.zeros(k * k * m, torch.int64)
    fsrc = h.zeros(m, torch.float32)
    fdst = h.zeros(m, torch.float32)
    gathered = h.zeros(k * m, torch.float32)
    src.copy_(_values(me, k * m, torch.int64))
    fsrc.copy_(_values(me, m, torch.float32))
    dst.fill_(sentinel)
    fdst.fill_(sentinel)
    h.barrier_all()
    if team is None:  # non-members take no part: their memory stays as it was
        assert _eq(dst, torch.full_like(dst, sentinel))
    else:
        t = team.my_pe()
        # broadcast from the last team PE (team-relative root)
        team.broadcast(dst[:m], src[:m], k - 1)
        assert _eq(dst[:m], _values(members[-1], k * m, torch.int64)[:m])
        assert _eq(dst[m:], torch.full((k * k * m - m,), sentinel))
        # fcollect: team order
        team.fcollect(dst[:k * m], src[:m])
        assert _eq(dst[:k * m],
                           torch.cat([_values(pe, k * m, torch.int64)[:m] for pe in members]))
        # collect: team PE i gives i + 1 elements
        dst.fill_(sentinel)
        team.collect(dst, src[:t + 1])
        expected = torch.cat([_values(pe, k * m, torch.int64)[:i + 1]
                              for i, pe in enumerate(members)])
        assert _eq(dst[:len(expected)], expected)
        assert _eq(dst[len(expected):], torch.full((k * k * m - len(expected),), sentinel))
        # alltoall: block j of dest on team PE t <- block t of source on team PE j
        team.alltoall(dst[:k * m], src)
        assert _eq(dst[:k * m], torch.cat(
            [_values(pe, k * m, torch.int64)[t * m:(t + 1) * m] for pe in members]))
        # alltoalls: dest[dst*(j*ne + e)] on PE t <- source[sst*(t*ne + e)] on PE j
        ne, ds, ss = 2, 3, 2
        dst.fill_(sentinel)
        team.alltoalls(dst, src, ds, ss, ne)
        expected = torch.full((k * k * m,), sentinel)
        for j, pe in enumerate(members):
            theirs = _values(pe, k * m, torch.int64)
            for e in range(ne):
                expected[ds * (j * ne + e)] = theirs[ss * (t * ne + e)]
        assert _eq(dst, expected)
        # reduce: combined in team order, bit for bit
        for op, combine in (("sum", torch.add), ("max", torch.maximum)):
            team.reduce(fdst, fsrc, op)
            acc = _values(members[0], m, torch.float32)
            for pe in members[1:]:
                acc = combine(acc, _values(pe, m, torch.float32))
            assert _eq(fdst, acc), (op, fdst, acc)
        team.reduce(dst[:m], src[:m], "xor")
        acc = _values(members[0], k * m, torch.int64)[:m]
        for pe in members[1:]:
            acc = acc ^ _values(pe, k * m, torch.int64)[:m]
        assert _eq(dst[:m], acc)
        # the heap's functions with team= are the same calls
        h.fcollect(dst[:k * m], src[:m], team=team)
        assert _eq(dst[:k * m],
                           torch.cat([_values(pe, k * m, torch.int64)[:m] for pe in members]))
        # every member has the same reduce result (bitwise): compare over the team
        team.fcollect(gathered, fdst)
        assert all(_eq(gathered[i * m:(i + 1) * m], fdst) for i in range(k))
    h.barrier_all()
    # the world still works after the team's calls, on every PE
    h.reduce(fdst, fsrc)
    acc = _values(0, m, torch.float32)
    for pe in range(1, n):
        acc = acc + _values(pe, m, torch.float32)
    assert _eq(fdst, acc)


@pytest.mark.mpi(min_size=1)
def test_collect_variable_sizes_and_a_dest_too_small(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    src = h.zeros(n + 1, torch.float64)
    src.copy_(torch.arange(n + 1, dtype=torch.float64) + 100 * me)
    total = sum(range(n))           # PE i gives i elements (PE 0: none)
    dest = h.zeros(total + 3, torch.float64)
    dest.fill_(-1)
    h.collect(dest, src[:me])
    expected = torch.cat([torch.arange(i, dtype=torch.float64) + 100 * i for i in range(n)])
    assert _eq(dest[:total], expected)
    assert _eq(dest[total:], torch.full((3,), -1.0, dtype=torch.float64))
    # larger contributions: PE i gives n + 1 - i elements
    big = h.zeros(n * (n + 1), torch.float64)
    h.collect(big, src[:n + 1 - me])
    expected = torch.cat([torch.arange(n + 1 - i, dtype=torch.float64) + 100 * i
                          for i in range(n)])
    assert _eq(big[:len(expected)], expected)
    # nothing at all: dest untouched
    before = dest.clone()
    h.collect(dest, src[:0])
    assert _eq(dest, before)
    # dest too small by one: the same clear ValueError on every PE, nothing done
    small = h.zeros(len(expected) - 1, torch.float64)
    small.fill_(-1)
    with pytest.raises(ValueError, match=rf"collect: dest has {len(expected) - 1} elements, but "
                                         rf"the team's PEs contribute {len(expected)}"):
        h.collect(small, src[:n + 1 - me])
    assert _eq(small, torch.full_like(small, -1))
    # a dtype that differs is refused on every PE
    wrong = h.zeros(n * (n + 1), torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        h.collect(wrong, src[:1])
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_alltoalls_strides_and_world_alltoall_equivalence(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    src = h.zeros(4 * n, torch.int32)
    src.copy_(torch.arange(4 * n, dtype=torch.int32) + 1000 * me)
    a, b = h.zeros(4 * n, torch.int32), h.zeros(4 * n, torch.int32)
    # unit strides: alltoalls is alltoall
    h.alltoall(a, src)
    h.alltoalls(b, src, 1, 1, 4)
    assert _eq(a, b)
    # dst = 2, sst = 1, nelems = 2 over the world
    b.fill_(-1)
    h.alltoalls(b, src[:2 * n], 2, 1, 2)
    expected = torch.full((4 * n,), -1, dtype=torch.int32)
    for j in range(n):
        for e in range(2):
            expected[2 * (j * 2 + e)] = (me * 2 + e) + 1000 * j
    assert _eq(b, expected)
    # nelems = 0 moves nothing
    h.alltoalls(b, src, 5, 7, 0)
    assert _eq(b, expected)
    h.barrier_all()


# -- agreement over the team ---------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_mismatched_team_calls_raise_symmetry_error_on_every_member(mheap):
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    team = h.team_world().split_strided(0, 1, n)   # every PE, a team of its own
    x = h.zeros(4, torch.int64)
    y = h.zeros(4 * n, torch.int64)
    # different calls
    with pytest.raises(SymmetryError, match=r"the team of PEs .*sync\(\).*broadcast"):
        if me == 0:
            team.sync()
        else:
            team.broadcast(x, x, 0)
    # the same call with different arguments
    with pytest.raises(SymmetryError, match="PEs made different collective calls"):
        team.broadcast(x, x, me % 2)
    with pytest.raises(SymmetryError):
        team.split_strided(0, 1, 1 if me == 0 else 2)
    z = h.zeros(4, torch.int64)
    with pytest.raises(SymmetryError):
        team.fcollect(y, x if me == 0 else z)
    # a PE whose arguments are bad fails the call on every member
    with pytest.raises((SymmetryError, ValueError)):
        team.broadcast(x, x, n if me == 0 else 0)
    # the team and the world are still usable, in step
    team.sync()
    team.fcollect(y, x)
    team.destroy()
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_teams_run_independently_of_each_other_and_the_world(mheap):
    """Calls on disjoint teams do not meet: each team's agreement has its own
    communicator and sequence."""
    h, me, n = mheap, mheap.my_pe, mheap.n_pes
    w = h.team_world()
    even = w.split_strided(0, 2, (n + 1) // 2)
    odd = w.split_strided(1, 2, n // 2)
    x = h.zeros(1, torch.int64)
    x.fill_(me)
    mine = even if me % 2 == 0 else odd
    calls = 3 if me % 2 == 0 else 1
    for _ in range(calls):
        mine.sync()
        mine.reduce(x, x, "max")
    assert x.item() == max(mine.pes)
    h.barrier_all()
    mine.destroy()
    h.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_a_non_member_calling_with_team_none_meets_the_members_next_world_call(mheap):
    """team=None is every PE of the heap: a PE left out of a split that calls a
    collective with the None it got is in a world call; the members, done with
    their team call, meet it at their next world call and every PE raises."""
    h, me = mheap, mheap.my_pe
    first = h.team_world().split_strided(0, 1, 1)     # PE 0 alone
    x = h.zeros(4, torch.int64)
    with pytest.raises(SymmetryError, match=r"barrier_all\(\).*broadcast|broadcast.*barrier_all"):
        if me == 0:
            first.broadcast(x, x, 0)
            h.barrier_all()
        else:
            h.broadcast(x, x, 0, team=first)           # first is None here
    if first is not None:
        first.destroy()
    h.barrier_all()


# -- lifetime and errors ------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_destroyed_team_raises_shmem_error(mheap):
    h, n = mheap, mheap.n_pes
    team = h.team_split_strided(h.team_world(), 0, 1, n)
    x = h.zeros(2, torch.int64)
    team.destroy()
    assert "destroyed" in repr(team)
    for call in (team.my_pe, team.n_pes, team.sync, team.destroy, team.get_config,
                 lambda: team.world_pe(0), lambda: team.translate_pe(0, h.team_world()),
                 lambda: team.split_strided(0, 1, 1), lambda: team.broadcast(x, x, 0),
                 lambda: h.reduce(x, x, team=team), lambda: h.team_sync(team),
                 lambda: h.team_world().translate_pe(0, team)):
        with pytest.raises(ShmemError, match="destroyed"):
            call()
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_finalize_destroys_the_heaps_teams():
    n = WORLD.Get_size()
    h = SymmetricHeap(WORLD, heap_size="4M", backend="host", timeout=30)
    team = h.team_world().split_strided(0, 1, n)
    world = h.team_world()
    h.finalize()
    for call in (team.my_pe, world.n_pes, team.sync, h.team_world):
        with pytest.raises(ShmemError):
            call()


@pytest.mark.mpi(min_size=1)
def test_bad_arguments_give_clear_errors_on_every_pe(mheap):
    h, n = mheap, mheap.n_pes
    w = h.team_world()
    for args, pattern in (((0, 0, 1), "stride must be >= 1"),
                          ((0, -1, 1), "stride must be >= 1"),
                          ((0, 1, 0), "size must be >= 1"),
                          ((n, 1, 1), "start is out of range"),
                          ((-1, 1, 1), "start is out of range"),
                          ((0, 1, n + 1), "the last PE would be"),
                          ((0, 2, (n + 1) // 2 + 1), "the last PE would be")):
        with pytest.raises(ValueError, match=pattern):
            w.split_strided(*args)
    with pytest.raises(TypeError, match="start must be an int"):
        w.split_strided(0.0, 1, 1)
    with pytest.raises(ValueError, match="xrange must be >= 1"):
        w.split_2d(0)
    with pytest.raises(ValueError, match="unknown team configuration key"):
        w.split_strided(0, 1, 1, config={"bogus": 1})
    with pytest.raises(TypeError, match="config must be None or a dict"):
        w.split_2d(1, yaxis_config=[1])
    # None is SHMEM_TEAM_INVALID: no team to call on
    for call in (lambda: h.team_sync(None), lambda: h.team_destroy(None),
                 lambda: h.team_split_strided(None, 0, 1, 1), lambda: h.team_split_2d(None, 1)):
        with pytest.raises(TypeError, match="SHMEM_TEAM_INVALID"):
            call()
    with pytest.raises(TypeError, match="must be a shmemvm Team"):
        h.team_my_pe("world")
    # team-relative PE numbers are checked against the team
    half = w.split_strided(0, 1, 1)  # PE 0 alone
    x = h.zeros(4, torch.int64)
    y = h.zeros(4 * n, torch.int64)
    if half is not None:
        with pytest.raises(ValueError, match=r"root 1 is out of range: .* has 1 PE \(0..0\)"):
            half.broadcast(x, x, 1)
        with pytest.raises(ValueError, match="team_pe 1 is out of range"):
            half.world_pe(1)
        with pytest.raises(ValueError, match="pe -1 is out of range"):
            half.translate_pe(-1, w)
        half.destroy()
    # collective arguments, on every PE
    with pytest.raises(ValueError, match="dst must be an integer >= 1"):
        h.alltoalls(y, x, 0, 1, 1)
    with pytest.raises(ValueError, match="nelems must be an integer >= 0"):
        h.alltoalls(y, x, 1, 1, -1)
    with pytest.raises(ValueError, match=r"alltoalls: source has 4 elements"):
        h.alltoalls(y, x, 1, 5, 2)
    with pytest.raises(ValueError, match="overlap"):
        h.alltoalls(y, y, 1, 1, 1)
    uneven_a, uneven_b = h.zeros(n + 1, torch.int64), h.zeros(n + 1, torch.int64)
    if n > 1:
        with pytest.raises(ValueError, match=f"do not split into {n} equal blocks"):
            h.alltoall(uneven_a, uneven_b)
    with pytest.raises(ValueError, match=rf"dest must have {4 * n} elements for a source of 4 "
                                         rf"on {n} PEs?\b"):
        w.fcollect(y[:-1], x)
    # a team of another heap is refused
    other = SymmetricHeap(WORLD, heap_size="4M", backend="host", timeout=30)
    try:
        with pytest.raises(ValueError, match="another symmetric heap"):
            h.reduce(x, x, team=other.team_world())
        with pytest.raises(ValueError, match="another symmetric heap"):
            w.translate_pe(0, other.team_world())
    finally:
        other.finalize()
    h.barrier_all()


@pytest.mark.mpi(min_size=1)
def test_the_module_team_sync_takes_what_the_heaps_takes_and_refuses_the_rest(heap):
    # shmemvm.team_sync() syncs a Team of the default heap itself (fewer calls); it
    # must raise as the heap's method does for everything else
    n = WORLD.Get_size()
    with shmemvm.init(heap_size="4M", backend="host", timeout=30) as default:
        team = shmemvm.team_split_strided(shmemvm.team_world(), 0, 1, n)
        for _ in range(3):
            shmemvm.team_sync(team)
            shmemvm.team_sync(shmemvm.team_world())
        other = heap.team_split_strided(heap.team_world(), 0, 1, n)   # another heap's
        for bad, error in ((None, TypeError), (other, ValueError), (object(), TypeError)):
            with pytest.raises(error):
                shmemvm.team_sync(bad)
            with pytest.raises(error):
                default.team_sync(bad)
        shmemvm.team_destroy(team)
        for sync in (shmemvm.team_sync, default.team_sync):
            with pytest.raises(ShmemError, match="destroyed"):
                sync(team)
        heap.team_destroy(other)


@pytest.mark.mpi(min_size=1)
def test_module_functions_forward_to_the_default_heap():
    n = WORLD.Get_size()
    with shmemvm.init(heap_size="4M", backend="host", timeout=30) as heap:
        world = shmemvm.team_world()
        assert world is heap.team_world() and shmemvm.team_shared() is heap.team_shared()
        team = shmemvm.team_split_strided(world, 0, 1, n)
        assert shmemvm.team_n_pes(team) == n and shmemvm.team_my_pe(team) == heap.my_pe
        x = shmemvm.zeros(1, torch.int64)
        y = shmemvm.zeros(n, torch.int64)
        x.fill_(heap.my_pe)
        shmemvm.collect(y, x, team=team)
        assert y.tolist() == list(range(n))
        z = shmemvm.zeros(n, torch.int64)
        shmemvm.alltoalls(z, y, 1, 1, 1, team=team)   # z[j] <- y[me] of PE j = me
        assert z.tolist() == [heap.my_pe] * n
        xt, yt = shmemvm.team_split_2d(world, 1)
        assert (shmemvm.team_n_pes(xt), shmemvm.team_n_pes(yt)) == (1, n)
        shmemvm.team_sync(team)
        for t in (team, xt, yt):
            shmemvm.team_destroy(t)
