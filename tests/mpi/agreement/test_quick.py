"""The quick step (issue 30): barrier_all, sync_all and a team's sync are one native call
(_collective.Quick) where nothing is unusual, and the general path where
something is. The two make the same step: PEs that take different paths
agree, a mismatch is a SymmetryError on every PE, and whatever the general
path would deal with first (a block to release, another thread's call) sends
the call there. A dead, stopped or late PE in a barrier: the jobs of
tests/jobs/reliability/ (test_reliability_peer_death.py's mid-barrier,
test_reliability_stopped_peer.py, test_reliability_abandoned.py's
barrier-board), whose barriers take this path."""

from __future__ import annotations

import gc
import threading
import time

import pytest
from mpi4py import MPI

from shmemvm import ShmemError, SymmetricHeap, SymmetryError, native
from shmemvm.core.state import core_of
from shmemvm.openshmem.barrier import BARRIER_ALL, SYNC_ALL

world = MPI.COMM_WORLD
# (native= over SHMEMVM_NATIVE: these tests are of the compiled path; the last one is
# of a heap without it)
OPTIONS = {"backend": "host", "timeout": 10, "agreement": "board", "native": "auto"}

pytestmark = pytest.mark.skipif(native._native is None,
                                reason="the compiled piece is not built (pip install . builds it)")


@pytest.fixture
def heap():
    h = SymmetricHeap(world, "16M", **OPTIONS)
    yield h
    h.finalize()


def _counts(heap):
    agreement = core_of(heap).agreement
    return agreement.seq, agreement.calls


@pytest.mark.mpi(min_size=2)
def test_a_barrier_is_one_native_call_and_counts_as_the_general_path_does(heap, monkeypatch):
    core = core_of(heap)
    from shmemvm.native import _collective
    assert isinstance(core.quick[BARRIER_ALL], _collective.Quick)
    assert isinstance(core.quick[SYNC_ALL], _collective.Quick)
    seq, calls = _counts(heap)

    def general(*args, **kwargs):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(core.agreement, "collective", general)
    for _ in range(5):
        heap.barrier_all()
        heap.sync_all()
    assert _counts(heap) == (seq + 10, calls + 10)
    monkeypatch.undo()
    heap.barrier_all()                                  # the general path counts alike
    assert _counts(heap) == (seq + 11, calls + 11)


@pytest.mark.mpi(min_size=2)
def test_pes_on_different_paths_make_the_same_step(heap):
    core = core_of(heap)
    quick = core.quick[BARRIER_ALL]
    for i in range(40):
        # PE 0 quick on odd rounds, the others on even ones: they meet in every step
        general = (i + core.my_pe) % 2 == 0
        core.quick[BARRIER_ALL] = None if general else quick
        heap.barrier_all()
    core.quick[BARRIER_ALL] = quick
    counts = world.allgather(_counts(heap))
    assert len(set(counts)) == 1, counts


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("quick_on", ["every PE", "PE 0 alone"])
def test_a_mismatch_is_a_symmetry_error_on_every_pe(heap, quick_on):
    core = core_of(heap)
    if quick_on == "PE 0 alone" and core.my_pe != 0:
        core.quick[BARRIER_ALL] = core.quick[SYNC_ALL] = None
    with pytest.raises(SymmetryError, match=r"barrier_all\(\).*sync_all\(\)|sync_all\(\).*"
                                            r"barrier_all\(\)"):
        heap.barrier_all() if core.my_pe == 0 else heap.sync_all()
    core.quick.clear()                                  # (made again at first use)
    heap.barrier_all()                                  # nothing was done: the heap goes on
    x = heap.malloc(64)
    heap.free(x)
    assert len(set(world.allgather(_counts(heap)))) == 1


@pytest.mark.mpi(min_size=2)
def test_a_block_to_release_sends_the_barrier_the_general_way_which_releases_it(heap):
    core = core_of(heap)
    quick = core.quick[BARRIER_ALL]
    x = heap.malloc(1024)
    live = heap.heap_info()["live_allocations"]
    del x
    gc.collect()
    assert quick() is None                              # stepped aside: nothing done
    heap.barrier_all()                                  # the general path releases it
    assert heap.heap_info()["live_allocations"] == live - 1
    assert quick() is not None                          # and the next one is taken again


@pytest.mark.mpi(min_size=2)
def test_a_barrier_waits_for_another_threads_collective_call(heap):
    core = core_of(heap)
    entered, order = threading.Event(), []

    def other_thread():
        with core.lock:                                 # as a collective call holds it
            entered.set()
            time.sleep(0.2)
            order.append("other thread")

    thread = threading.Thread(target=other_thread)
    thread.start()
    entered.wait()
    assert core.quick[BARRIER_ALL]() is None           # the lock is taken: nothing done
    heap.barrier_all()                                  # waits for it, then the step
    order.append("barrier")
    thread.join()
    assert order == ["other thread", "barrier"]


@pytest.mark.mpi(min_size=2)
def test_a_finalized_heap_has_no_quick_step():
    heap = SymmetricHeap(world, "16M", **OPTIONS)
    core = core_of(heap)
    quick = core.quick[BARRIER_ALL]
    heap.finalize()
    assert not core.quick                               # dropped with the board
    assert quick() is None                              # a kept one refuses: the heap is closed


@pytest.mark.mpi(min_size=2)
def test_a_team_sync_is_one_native_call_after_its_first(heap, monkeypatch):
    team = heap.team_split_strided(heap.team_world(), 0, 1, heap.n_pes)
    dest, source = heap.malloc(8), heap.malloc(8)
    team.sync()                                         # the first makes its quick step
    seq = team.agreement.seq

    def general(*args, **kwargs):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(team.agreement, "collective", general)
    for _ in range(5):
        team.sync()
    assert team.agreement.seq == seq + 5
    monkeypatch.undo()
    # a mismatch on the team: a SymmetryError on every member, the team goes on
    with pytest.raises(SymmetryError, match=r"sync\(\)"):
        team.sync() if heap.my_pe == 0 else team.broadcast(dest, source, 0)
    team.sync()
    team.destroy()
    with pytest.raises(Exception, match="destroyed"):
        team.sync()                                     # refused, not stepped


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_calls_on_random_paths_keep_every_pe_in_step(heap, seed):
    """The same random sequence of barrier_all, sync_all and a team's sync on
    every PE, each PE choosing its own path for each call at random (the quick
    step, or the general one), with blocks dropped now and then (which send
    the quick step aside on the PE that has them): every PE ends at the same
    step and count, and the dropped blocks are released everywhere."""
    import random
    core = core_of(heap)
    team = heap.team_split_strided(heap.team_world(), 0, 1, heap.n_pes)
    quick = {call: core.quick[call] for call in (BARRIER_ALL, SYNC_ALL)}
    team.sync()                                          # (makes the team's quick step)
    team_quick = team._quick_sync
    assert team_quick is not None
    calls = random.Random(seed)                          # the same on every PE
    paths = random.Random(seed * 1000 + core.my_pe)      # this PE's own
    live = heap.heap_info()["live_allocations"]
    for _ in range(200):
        what = calls.choice(["barrier", "sync", "team", "drop"])
        if what == "drop":
            heap.malloc(64)                          # dropped at once: released later
            continue
        for call in quick:
            core.quick[call] = quick[call] if paths.random() < 0.5 else None
        team._quick_sync = team_quick if paths.random() < 0.5 else None
        {"barrier": heap.barrier_all, "sync": heap.sync_all, "team": team.sync}[what]()
    core.quick.update(quick)
    heap.barrier_all()
    heap.barrier_all()
    gc.collect()
    heap.barrier_all()
    assert heap.heap_info()["live_allocations"] == live
    assert len(set(world.allgather(_counts(heap)))) == 1
    assert len(set(world.allgather(team.agreement.seq))) == 1
    team.destroy()


@pytest.mark.mpi(min_size=2)
def test_a_heap_without_the_compiled_piece_has_no_quick_step_and_its_barriers_agree():
    heap = SymmetricHeap(world, "16M", **{**OPTIONS, "native": 0})
    try:
        core = core_of(heap)
        assert core.quick[BARRIER_ALL] is None and core.quick[SYNC_ALL] is None
        team = heap.team_split_strided(heap.team_world(), 0, 1, heap.n_pes)
        seq, calls = _counts(heap)
        for _ in range(3):
            heap.barrier_all()
            heap.sync_all()
            team.sync()
        assert team._quick_sync is None
        assert _counts(heap) == (seq + 6, calls + 6)
        with pytest.raises(SymmetryError, match=r"barrier_all\(\).*sync_all\(\)|sync_all\(\).*"
                                                r"barrier_all\(\)"):
            heap.barrier_all() if core.my_pe == 0 else heap.sync_all()
        team.destroy()
    finally:
        heap.finalize()


@pytest.mark.mpi(min_size=2)
def test_the_module_functions_barriers_are_the_quick_step_and_a_profiler_still_sees_them(
        monkeypatch):
    """shmemvm.barrier_all() and sync_all() on the default heap take its quick step
    themselves (not through the heap's method), and while a torch profiler
    records, the method, whose range the trace shows."""
    import shmemvm
    from shmemvm.core import trace
    heap = shmemvm.init(world, "16M", **OPTIONS)
    try:
        seq, calls = _counts(heap)

        def method(*args):
            raise AssertionError("the heap's method ran")

        with monkeypatch.context() as m:
            m.setitem(vars(heap), "barrier_all", method)
            m.setitem(vars(heap), "sync_all", method)
            m.setattr(core_of(heap).agreement, "collective", method)
            for _ in range(3):
                shmemvm.barrier_all()
                shmemvm.sync_all()
        assert _counts(heap) == (seq + 6, calls + 6)
        ran: list = []
        with monkeypatch.context() as m:
            m.setattr(trace.FLAG, "_is_profiler_enabled", True, raising=False)
            for name in ("barrier_all", "sync_all"):
                real = getattr(heap, name)
                m.setitem(vars(heap), name, lambda real=real, name=name: (ran.append(name),
                                                                          real())[1])
            shmemvm.barrier_all()
            shmemvm.sync_all()
        assert ran == ["barrier_all", "sync_all"] and _counts(heap) == (seq + 8, calls + 8)
    finally:
        shmemvm.finalize()
    # the functions find their steps in api.quick_steps, which finalize() empties and
    # init() fills with the new heap's (importing the NumPy face here would make its
    # default heap: tests/mpi/shmem runs its barriers)
    for barrier in (shmemvm.barrier_all, shmemvm.sync_all):
        with pytest.raises(ShmemError, match="no symmetric heap"):
            barrier()
    heap = shmemvm.init(world, "16M", **OPTIONS)
    try:
        assert shmemvm.api.quick_steps is core_of(heap).quick
        seq, calls = _counts(heap)
        shmemvm.barrier_all()
        shmemvm.sync_all()
        assert _counts(heap) == (seq + 2, calls + 2)
    finally:
        shmemvm.finalize()
