"""A fused collective's repeated call in one native call (issue 30): where a
call runs again from its Plan (transport/nodecoll.py's replay), its lock, its
agreed step with the payload and the delivery of the result are one
_collective.Quick call while nothing is unusual, and the Plan's steps in Python
(nodecoll.staged) where something is. The two paths make the same step and
write the same bytes: PEs on different paths agree, a mismatch is a
SymmetryError on every PE with nothing written, and a block to release, a busy
lock or a destroyed team sends the call the Python way. A dead, late or stopped
PE in a replayed call: tests/jobs/reliability/test_nodecoll_faults.py's
late-alltoall and dead-fcollect jobs, whose calls take this path (they check
it: replayed_quick).

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/transport/test_quick_replay.py
"""

from __future__ import annotations

import gc
import random
import threading

import pytest
from mpi4py import MPI

from shmemvm import SymmetryError, native, rc
from shmemvm.errors import ShmemError

rc(initialize=False, finalize=False)  # this module makes and ends its own heap
from shmemvm import api, shmem  # noqa: E402
from shmemvm.native import _collective  # noqa: E402
from shmemvm.transport import nodecoll  # noqa: E402

WORLD = MPI.COMM_WORLD

pytestmark = pytest.mark.skipif(native._native is None,
                                reason="the compiled piece is not built (pip install . builds it)")


@pytest.fixture(scope="module")
def world():
    shmem.init()
    if api.default_core().agreement.board is None:
        shmem.finalize()
        pytest.skip("the heap's PEs share no board here (a quick step needs one)")
    yield
    gc.collect()
    shmem.finalize()


class _Paths:
    """Counts the replays taken whole by their quick step and those taken step
    by step (nodecoll.staged); `general` makes this PE take the latter."""

    def __init__(self, monkeypatch):
        self.quick = self.staged = 0
        self.general = False
        real_replay, real_staged = nodecoll.replay, nodecoll.staged

        def replay(core, plan):
            if self.general:
                return nodecoll.staged(core, plan)
            before = self.staged
            done = real_replay(core, plan)
            if done and self.staged == before:
                assert isinstance(plan.quick, _collective.Quick)
                self.quick += 1
            return done

        def staged(core, plan):
            self.staged += 1
            return real_staged(core, plan)

        monkeypatch.setattr(nodecoll, "replay", replay)
        monkeypatch.setattr(nodecoll, "staged", staged)


def _calls(team=None):
    """The collectives a Plan replays, over `team` (None: every PE), each with
    the arrays it writes and what they must hold, from sources filled by
    fill(round): (name, call, dest, expected(round))."""
    n = shmem.n_pes() if team is None else team.n_pes()
    me = shmem.my_pe() if team is None else team.my_pe()
    src = shmem.zeros(3, dtype="q")
    one = shmem.zeros(1, dtype="d")
    bcast, summed = shmem.zeros(3, dtype="q"), shmem.zeros(3, dtype="q")
    gathered, spread = shmem.zeros(n, dtype="q"), shmem.zeros(n, dtype="q")
    mine = shmem.zeros(n, dtype="q")
    biggest = shmem.zeros(1, dtype="d")
    collected = shmem.zeros(n * (n + 1) // 2, dtype="q")   # PE p gives p + 1 elements

    def fill(r):
        src[:] = [r, me + r, -me * r]
        one[0] = me * 0.5 + r
        mine[:] = [100 * me + j + r for j in range(n)]

    kw = {} if team is None else {"team": team}
    calls = [
        ("broadcast", lambda: shmem.broadcast(bcast, src, 0, **kw), bcast,
         lambda r: [r, r, 0]),
        ("sum_reduce", lambda: shmem.sum_reduce(summed, src, **kw), summed,
         lambda r: [n * r, n * (n - 1) // 2 + n * r, -r * n * (n - 1) // 2]),
        ("max_reduce", lambda: shmem.max_reduce(biggest, one, **kw), biggest,
         lambda r: [(n - 1) * 0.5 + r]),
        ("fcollect", lambda: shmem.fcollect(gathered, src[:1], **kw), gathered,
         lambda r: [r] * n),
        ("alltoall", lambda: shmem.alltoall(spread, mine, **kw), spread,
         lambda r: [100 * pe + me + r for pe in range(n)]),
        ("collect", lambda: shmem.collect(collected, mine[:me + 1], **kw), collected,
         lambda r: [100 * pe + j + r for pe in range(n) for j in range(pe + 1)]),
    ]
    arrays = [src, one, bcast, summed, gathered, spread, mine, biggest, collected]
    return calls, fill, arrays


def _replayed_sum(monkeypatch, r: int, team=None):
    """sum_reduce over `team` (None: every PE) on sources filled for round `r`,
    called twice (its Plan made, then replayed): (paths, call, dest, what dest
    must hold, arrays). Earlier tests' arrays are released on every PE first:
    a release forgets every Plan, and when the collector frees them on each PE
    depends on what ran before."""
    gc.collect()
    shmem.barrier_all()
    paths = _Paths(monkeypatch)
    calls, fill, arrays = _calls(team)
    name, call, dest, expected = calls[1]
    fill(r)
    for _ in range(2):
        call()
    return paths, call, dest, expected(r), arrays


def _free(arrays) -> None:
    """Free the arrays of _calls() (collective), once every PE is past its last use."""
    shmem.barrier_all()
    for a in arrays:
        shmem.free(a)


@pytest.mark.mpi(min_size=2)
def test_a_replayed_collective_is_one_native_call_with_the_general_paths_bytes(world,
                                                                             monkeypatch):
    paths = _Paths(monkeypatch)
    calls, fill, arrays = _calls()
    for r in range(4):   # the first round makes the Plans, the others replay them
        fill(r)
        for name, call, dest, expected in calls:
            call()
            assert dest.tolist() == expected(r), (name, r)
    # max_reduce of doubles stays with NumPy's combiner (no Plan): five calls a round replay
    assert paths.quick == 5 * 3 and paths.staged == 0
    _free(arrays)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_calls_on_random_paths_give_every_pe_the_same_bytes(world, monkeypatch, seed):
    """Each PE takes the quick or the Python path at random for each call of a
    random sequence, on the world and on a team: every result is what the
    general path computes, and every PE ends in step."""
    paths = _Paths(monkeypatch)
    me = shmem.my_pe()
    team = shmem.TEAM_WORLD.split_strided(0, 1, shmem.n_pes())
    world_calls, world_fill, world_arrays = _calls()
    team_calls, team_fill, team_arrays = _calls(team)
    order = random.Random(seed)            # the same sequence on every PE
    mine = random.Random(seed * 1000 + me)  # each PE's own paths
    for r in range(60):
        calls, fill = (world_calls, world_fill) if order.random() < 0.5 else \
            (team_calls, team_fill)
        name, call, dest, expected = order.choice(calls)
        fill(r)
        paths.general = mine.random() < 0.5
        call()
        assert dest.tolist() == expected(r), (name, r, paths.general)
    paths.general = False
    assert paths.quick > 0 and paths.staged > 0
    shmem.barrier_all()
    team.destroy()
    _free(world_arrays + team_arrays)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("quick_on", ["every PE", "PE 0 only"])
def test_a_mismatch_is_a_symmetry_error_on_every_pe_and_writes_nothing(world, monkeypatch,
                                                                       quick_on):
    paths = _Paths(monkeypatch)
    me = shmem.my_pe()
    calls, fill, arrays = _calls()
    (_, bcast, bdest, _), (_, summed, sdest, expected) = calls[:2]
    fill(1)
    for _ in range(2):
        bcast(), summed()
    bdest[:] = sdest[:] = -7
    paths.general = quick_on == "PE 0 only" and me != 0
    staged = paths.staged
    with pytest.raises(SymmetryError):
        (bcast if me == 0 else summed)()   # PE 0 broadcasts, the others reduce
    assert bdest.tolist() == [-7] * 3 and sdest.tolist() == [-7] * 3
    # (raised from the quick step's settle, or from the Python steps)
    assert paths.staged == staged + (1 if paths.general else 0)
    paths.general = False
    summed()   # and the heap goes on
    assert sdest.tolist() == expected(1)
    _free(arrays)


@pytest.mark.mpi(min_size=2)
def test_a_block_to_release_sends_the_replay_the_python_way_which_releases_it(world,
                                                                            monkeypatch):
    from shmemvm.core.state import parts_of
    paths, call, dest, expected, arrays = _replayed_sum(monkeypatch, 2)
    assert (paths.quick, paths.staged) == (1, 0)
    local = parts_of(api.default_core()).local
    live = local.stats()["live_allocations"]
    dropped = shmem.zeros(8, dtype="q")
    del dropped   # (dead here, and on every PE: each PE drops it)
    gc.collect()
    call()      # the dead block: this step releases it, step by step
    assert (paths.quick, paths.staged) == (1, 1) and dest.tolist() == expected
    assert local.stats()["live_allocations"] == live
    call()      # a release forgets every Plan: the general path, which makes it again
    assert (paths.quick, paths.staged) == (1, 1) and dest.tolist() == expected
    call()      # and the next is quick again
    assert (paths.quick, paths.staged) == (2, 1) and dest.tolist() == expected
    _free(arrays)


@pytest.mark.mpi(min_size=2)
def test_a_replay_waits_for_another_threads_collective_call(world, monkeypatch):
    paths, call, dest, expected, arrays = _replayed_sum(monkeypatch, 3)
    core = api.default_core()
    taken, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=lambda: (core.lock.acquire(), taken.set(), release.wait(),
                                              core.lock.release()))
    holder.start()
    taken.wait()
    staged = paths.staged
    timer = threading.Timer(0.2, release.set)
    timer.start()
    call()      # the lock is busy: the Python way, which waits for it
    holder.join()
    timer.join()
    assert paths.staged == staged + 1 and dest.tolist() == expected
    _free(arrays)


@pytest.mark.mpi(min_size=2)
def test_a_destroyed_teams_call_takes_no_quick_step_and_raises(world, monkeypatch):
    team = shmem.TEAM_WORLD.split_strided(0, 1, shmem.n_pes())
    paths, call, dest, expected, arrays = _replayed_sum(monkeypatch, 0, team)
    assert paths.quick == 1
    shmem.barrier_all()
    team.destroy()
    with pytest.raises(ShmemError):
        call()
    assert paths.quick == 1
    _free(arrays)
