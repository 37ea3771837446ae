"""The NumPy face's reductions fused with their agreed board step or combined
in C (transport/nodecoll.py; issue 30) give NumPy's ufuncs' bytes, the same on
every PE, for every integer and float width, and NumPy's dtypes C leaves to
the ufuncs (float16, long double, bool, non-native byte order) still work.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/shmem/test_shmem_nodecoll.py
"""

from __future__ import annotations

import contextlib
import gc
import hashlib

import numpy as np
import pytest
from mpi4py import MPI
from util import replays

from shmemvm import rc

rc(initialize=False, finalize=False)  # this module makes and ends its own heap
from shmemvm import shmem  # noqa: E402
from shmemvm.agreement.board import PAYLOAD  # noqa: E402
from shmemvm.transport import nodecoll  # noqa: E402

WORLD = MPI.COMM_WORLD
TYPES = list("bhilqBHILQfd") + ["e", "g", "?", ">i4", "<f8"]
OPS = ["sum", "prod", "min", "max", "and", "or", "xor"]


@pytest.fixture(scope="module")
def world():
    shmem.init()
    yield
    gc.collect()
    shmem.finalize()


@contextlib.contextmanager
def _general(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(nodecoll, "fusion", lambda group: nodecoll.Fusion(None, len(group.pes)))
        m.setattr(nodecoll, "combined", lambda views, dtype, op, native, into=None: None)
        yield


def _values(t: str, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(t)
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(count) * 3).astype(dtype)
    return rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8).view(
        dtype.newbyteorder("=")).astype(dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("t", TYPES)
def test_numpy_reductions_fused_or_in_c_match_the_ufuncs(world, monkeypatch, t):
    me = shmem.my_pe()
    itemsize = np.dtype(t).itemsize
    for count in sorted({1, 7, PAYLOAD // itemsize, PAYLOAD // itemsize + 1, 3001}):
        source, target = shmem.zeros(count, dtype=t), shmem.zeros(count, dtype=t)
        source[:] = _values(t, count, 100 * me + count)
        for op in OPS:
            results = []
            for general in (False, True):
                with _general(monkeypatch) if general else contextlib.nullcontext():
                    target[:] = 0
                    try:
                        shmem.reduce(target, source, op)
                        got = target.tobytes()
                    except TypeError:   # no such loop in NumPy: on every PE, both paths
                        got = b"TypeError"
                    shmem.barrier_all()
                results.append(got)
            assert results[0] == results[1], (t, count, op)
            digests = WORLD.allgather(hashlib.sha256(results[0]).hexdigest())
            assert len(set(digests)) == 1, (t, count, op)
            if op in ("sum", "max") and results[0] != b"TypeError":   # what the ufunc gives
                every = WORLD.allgather(np.array(source))
                expected = every[0].copy()
                for other in every[1:]:
                    (np.add if op == "sum" else np.maximum)(expected, other, out=expected)
                assert results[0] == expected.tobytes(), (t, count, op)
        shmem.free(source), shmem.free(target)


@pytest.mark.mpi(min_size=1)
def test_the_faces_checked_offsets_are_the_routines_own(world):
    """The NumPy face hands the collectives each operand's heap offset, checked
    once (arrays.symmetric_span); the routine then skips its own look-up
    (Operand.offset). On odd operands (slices at odd bytes, Fortran order,
    dtype views, a count short of the size) it is exactly the offset the
    routine's own check gives, and a freed array still raises on the face."""
    from shmemvm import FreedTensorError
    from shmemvm.openshmem.collectives import _offset
    from shmemvm.shmem import arrays
    from shmemvm.shmem.collectives import _operand
    core = arrays.core()
    a = shmem.zeros(64, dtype="i1")
    f = shmem.zeros((3, 5), dtype="f8", order="F")
    odd = [a, a[3:40], a[1:2], a[7:], a[8:48].view("i4"), a[:0], f, f.reshape(-1, order="A"),
           f.reshape(-1, order="A").view("u1")[5:77]]
    for array in odd:
        for count in sorted({None, 0, array.size // 2 or None}, key=lambda c: (c is None, c)):
            operand = _operand(array, "target", count)
            assert operand.offset is not None
            own = _offset(core, operand._replace(offset=None), "target", "test")
            assert operand.offset == own, (array.shape, array.dtype, count)
            assert operand.count == (array.size if count is None else count)
    shmem.free(f)
    with pytest.raises(FreedTensorError):
        _operand(f, "target")
    shmem.free(a)
    del a, f, odd
    gc.collect()


def _fuses() -> bool:
    """Whether the world's calls carry their data in the agreed step here
    (a board in C: the compiled piece, more than one PE): else nothing has a Plan."""
    from shmemvm.openshmem import group
    from shmemvm.shmem import arrays
    return nodecoll.fusion(group.world(arrays.core())).board is not None


def _calls(t: str, count: int):
    """Each memoized collective of the NumPy face on fresh arrays of dtype t."""
    n, me = WORLD.Get_size(), WORLD.Get_rank()
    source, target = shmem.zeros(count * n, dtype=t), shmem.zeros(count * n, dtype=t)
    calls = {
        "broadcast": lambda: shmem.broadcast(target[:count], source[:count], n - 1),
        "broadcast_size": lambda: shmem.broadcast(target, source, 0, size=count - 1),
        "fcollect": lambda: shmem.fcollect(target, source[:count]),
        # (each PE its own count: the others' are checked again at every replay)
        "collect": lambda: shmem.collect(target, source[:count - me % 2]),
        "alltoall": lambda: shmem.alltoall(target, source),
        "sum_reduce": lambda: shmem.sum_reduce(target[1:count], source[1:count]),
        "max_reduce": lambda: shmem.reduce(target[:count], source[:count], "max"),
        "xor_reduce": lambda: shmem.xor_reduce(target, source),
        # 0-d views (a new view object each call: the key is where it lies, not the object)
        "broadcast_0d": lambda: shmem.broadcast(target[1:2].reshape(()),
                                                source[2:3].reshape(()), n - 1),
        "sum_reduce_0d": lambda: shmem.sum_reduce(target[:1].reshape(()),
                                                  source[3:4].reshape(())),
        # a team's own (split, with a board of its own where the world has one)
        "team_sum_reduce": lambda: shmem.sum_reduce(target[:count], source[:count],
                                                     team=_team()),
        "team_broadcast": lambda: shmem.broadcast(target[:count], source[:count], 0,
                                                  team=_team()),
    }
    return source, target, calls


_TEAMS: list = []


def _team():
    """A team of every PE split from the world (made once, the same on every PE)."""
    if not _TEAMS:
        _TEAMS.append(shmem.TEAM_WORLD.split_strided(0, 1, shmem.n_pes()))
    return _TEAMS[0]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("t", ["i1", "u2", "i4", "q", "f4", "d", ">i4", "e", "?"])
def test_replayed_collectives_give_the_general_paths_bytes(world, monkeypatch, t):
    """A NumPy-face collective repeated on the same arrays runs from the Plan
    its first call left (one agreed step, no checks again): on new data every
    time, its bytes are the general path's, the same on every PE."""
    me = shmem.my_pe()
    count = 5
    source, target, calls = _calls(t, count)
    for name, call in calls.items():
        if name == "xor_reduce" and np.dtype(t).kind == "f":
            continue   # (no such ufunc loop: raises on both paths, tested above)
        for round_ in range(3):
            source[:] = _values(t, source.size, 1000 * round_ + 10 * me + len(name))
            results = []
            with replays(monkeypatch) as ran:
                for general in (True, False):   # general first: it makes the Plan
                    with _general(monkeypatch) if general else contextlib.nullcontext():
                        target[:] = 0
                        call()
                        results.append(target.tobytes())
                    shmem.barrier_all()
            assert results[0] == results[1], (t, name, round_)
            if name != "alltoall":   # (its result is each PE's own)
                digests = WORLD.allgather(hashlib.sha256(results[1]).digest())
                assert len(set(digests)) == 1, (t, name, round_)
            words = name.split("_")   # (a reduction's op is the word before "reduce")
            fused = _fuses() and ("reduce" not in words or nodecoll.combinable(
                np.dtype(t), words[words.index("reduce") - 1]) is not None)
            if round_ and fused:   # (the first round's second call may be what makes it)
                assert ran, f"{name} never ran from its Plan"
            elif not fused:   # (float min/max: NumPy combines them; 1 PE: no board)
                assert not ran, name
    shmem.free(source), shmem.free(target)


@pytest.mark.mpi(min_size=2)
def test_a_replayed_call_is_still_agreed(world, monkeypatch):
    """A call that differs on one PE raises SymmetryError on every PE where the
    others run from their Plans, and nothing is written."""
    from shmemvm import SymmetryError
    me, n = shmem.my_pe(), shmem.n_pes()
    source, target = shmem.zeros(4, dtype="q"), shmem.zeros(4, dtype="q")
    source[:] = me + 1
    with replays(monkeypatch) as ran:
        for _ in range(3):
            shmem.broadcast(target, source, 0)
            shmem.sum_reduce(target, source)
        assert ran or not _fuses()
        target[:] = -7
        with pytest.raises(SymmetryError):
            shmem.broadcast(target, source, 0 if me else 1)   # the root differs on PE 0
        with pytest.raises(SymmetryError):
            shmem.sum_reduce(target, source, size=4 if me else 3)
        assert target.tolist() == [-7] * 4
        shmem.sum_reduce(target, source)   # and the heap goes on
        assert target.tolist() == [n * (n + 1) // 2] * 4
    shmem.barrier_all()
    shmem.free(source), shmem.free(target)


@pytest.mark.mpi(min_size=2)
def test_a_replayed_collect_checks_the_other_pes_counts_at_every_call(world, monkeypatch):
    """A collect's counts are not agreed, so a PE whose own call stays the same
    (it replays) reads the others' counts from every step: they may change,
    and where they no longer fit dest every PE raises, the replaying one too,
    and nothing is written."""
    me, n = shmem.my_pe(), shmem.n_pes()
    source, target = shmem.zeros(8, dtype="i4"), shmem.zeros(4 * n, dtype="i4")
    source[:] = np.arange(8, dtype="i4") + 100 * me
    # Earlier tests' arrays released first, on every PE: a release in the loop would
    # forget PE 0's Plan (as any release does), and when the collector frees them
    # on each PE depends on how much the earlier calls allocated
    gc.collect()
    shmem.barrier_all()
    with replays(monkeypatch) as ran:
        for count in (2, 2, 2, 3, 1, 0, 4, 2):   # PE 0 keeps 2 (it replays), the others vary
            target[:] = -1
            shmem.collect(target, source[:2 if me == 0 else count])
            expected = np.concatenate([np.arange(2 if pe == 0 else count) + 100 * pe
                                       for pe in range(n)])
            assert target[:expected.size].tolist() == expected.tolist(), count
            assert (target[expected.size:] == -1).all()
        assert (len(ran) == 7 if me == 0 else len(ran) >= 2) or not _fuses()   # PE 0: 7 of 8
        ran.clear()
        target[:] = -1
        with pytest.raises(ValueError, match="allocate dest with at least"):
            shmem.collect(target, source[:2 if me == 0 else 8])   # 2 + 8 (n - 1) > 4 n
        assert (target == -1).all()
        shmem.collect(target, source[:2])   # and the heap goes on
        assert target[:2 * n].tolist() == [v + 100 * pe for pe in range(n) for v in (0, 1)]
    shmem.barrier_all()
    shmem.free(source), shmem.free(target)


@pytest.mark.mpi(min_size=2)
def test_a_replayed_collect_refuses_a_total_that_reaches_the_source(world, monkeypatch):
    """dest and source are views of one array, source after dest's first 2 n
    elements. PE 0 collects 1 element every call (it replays); where the others'
    counts make the total reach into source, every PE raises the general path's
    overlap error, the replaying one too, and neither view is written."""
    me, n = shmem.my_pe(), shmem.n_pes()
    whole = shmem.zeros(3 * n + 4, dtype="i4")
    dest, source = whole[:3 * n], whole[2 * n:2 * n + 4]
    reaching = (2 * n - 1) // (n - 1) + 1   # the least count with 1 + (n-1) count > 2 n
    assert 2 * n < 1 + (n - 1) * reaching <= 3 * n   # (it fits dest: only the overlap is wrong)
    with replays(monkeypatch) as ran:
        for _ in range(3):   # 1 + 2 (n - 1) = 2 n - 1 elements: short of source
            dest[:] = -1
            source[:] = np.arange(4, dtype="i4") + 100 * me
            shmem.collect(dest, source[:1 if me == 0 else 2])
            expected = [100 * pe + i for pe in range(n) for i in range(1 if pe == 0 else 2)]
            assert dest[:2 * n - 1].tolist() == expected
        # (PE 0 replays from the 2nd call on, unless a block released meanwhile (an
        # earlier test's) dropped the memo: then from the next)
        assert me != 0 or ran or not _fuses()
        dest[:2 * n] = -1
        source[:] = np.arange(4, dtype="i4") + 100 * me
        before = whole.copy()
        with pytest.raises(ValueError, match="overlap"):
            shmem.collect(dest, source[:1 if me == 0 else reaching])
        assert whole.tolist() == before.tolist()
        shmem.collect(dest, source[:1 if me == 0 else 2])   # and the heap goes on
        assert dest[:2 * n - 1].tolist() == [100 * pe + i for pe in range(n)
                                             for i in range(1 if pe == 0 else 2)]
    shmem.barrier_all()
    shmem.free(whole)


@pytest.mark.mpi(min_size=1)
def test_a_replay_accepts_only_what_the_general_path_accepts(world, monkeypatch):
    """Arrays with a Plan's key in all but one thing the checks ask take the
    general path and its error: a read-only view of target, an array over the
    same bytes that is not the heap's, a freed array, an int subclass, a
    destroyed team."""
    from shmemvm import FreedTensorError, NotSymmetricError, ShmemError
    source, target = shmem.zeros(4, dtype="q"), shmem.zeros(4, dtype="q")
    with replays(monkeypatch) as ran:
        for _ in range(3):
            shmem.broadcast(target, source, 0)
        assert ran or not _fuses()
        team = shmem.TEAM_WORLD.split_strided(0, 1, shmem.n_pes())
        ran.clear()
        for _ in range(3):
            shmem.broadcast(target, source, 0, team=team)
        assert ran or not _fuses()
        team.destroy()
        ran.clear()
        with pytest.raises(ShmemError, match="TEAM_INVALID"):
            shmem.broadcast(target, source, 0, team=team)
        assert not ran
        read_only = target.view()
        read_only.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            shmem.broadcast(read_only, source, 0)
        stranger = np.ctypeslib.as_array(
            (np.ctypeslib.ctypes.c_int64 * 4).from_address(target.ctypes.data))
        with pytest.raises(NotSymmetricError):
            shmem.broadcast(stranger, source, 0)
        with pytest.raises(TypeError):
            shmem.broadcast(target, source, True)   # (a bool is no PE number, as before)
        ran.clear()
        for _ in range(2):   # (a release since, e.g. the team's, forgets the Plan: made again)
            shmem.broadcast(target, source, 0)
        assert ran or not _fuses()   # (the errors above broke nothing)
        shmem.free(source)
        ran.clear()
        with pytest.raises(FreedTensorError):
            shmem.broadcast(target, source, 0)
        assert not ran
    shmem.barrier_all()
    shmem.free(target)
