"""The agreement (agreement.py): phase codes, exact arguments, the user's call
numbers, the flag and the dead-offset release, and a property test of
mismatched call sequences. Run under mpirun -n 2 (and 1, 4); the encoding's
tests, in one process, are tests/unit/agreement/test_protocol.py.
"""

from __future__ import annotations

import gc
import re

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import Phase as HypothesisPhase
from hypothesis import strategies as st
from mpi4py import MPI

import shmemvm
from shmemvm import SymmetricHeap, SymmetryError
from shmemvm.agreement.agreement import Agreement
from shmemvm.agreement.protocol import Call, Phase
from shmemvm.core.state import parts_of
from util import barrier_interrupted_on_pe_1

world = MPI.COMM_WORLD

HEAP_OPTIONS = {"backend": "host", "timeout": 10}  # the conftest heap fixture


# -- the false agreements of issue 12 --------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_zeros_never_agrees_with_malloc_then_barrier(heap):
    me = heap.my_pe
    with pytest.raises(SymmetryError) as info:
        if me == 0:
            heap.zeros(32, torch.uint8)
        else:
            heap.malloc(32)
            heap.barrier_all()          # not reached: the malloc already disagrees
    message = str(info.value)
    assert "zeros(32, torch.uint8)" in message and "malloc(32)" in message, message
    assert heap.heap_info()["live_allocations"] == 0
    assert_usable(heap)


@pytest.mark.mpi(min_size=2)
def test_shapes_with_a_crc32_collision_disagree(heap):
    a, b = (8, 4, 32, 1024, 4, 4), (8, 4, 1024, 128, 1, 4)   # 16 MiB of uint8 each
    with pytest.raises(SymmetryError, match=re.escape(repr(a)) + ".*" + re.escape(repr(b))):
        heap.empty(a if heap.my_pe == 0 else b, torch.uint8)
    assert heap.heap_info()["live_allocations"] == 0
    x = heap.empty(a, torch.uint8)                           # the same shape still agrees
    heap.free(x)


@pytest.mark.mpi(min_size=2)
def test_empty_and_malloc_of_the_same_bytes_agree(heap):
    x = heap.malloc(32) if heap.my_pe == 0 else heap.empty(32, torch.uint8)
    assert x.shape == (32,) and x.dtype == torch.uint8
    heap.free(x)


# -- numbering, flag, dead offsets -----------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_symmetry_error_numbers_the_users_own_calls(heap):
    with pytest.raises(SymmetryError) as info:
        heap.malloc(8 + heap.my_pe)                          # the first call after init
    assert set(re.findall(r"collective call #(\d+)", str(info.value))) == {"1"}, info.value
    heap.zeros(4)                                            # #2, with its fill step
    heap.barrier_all()                                       # #3
    with pytest.raises(SymmetryError) as info:               # #4
        heap.sync_all() if heap.my_pe == 0 else heap.barrier_all()
    assert set(re.findall(r"your collective call #(\d+)", str(info.value))) == {"4"}, info.value
    # an internal step names the call it belongs to
    with pytest.raises(SymmetryError) as info:
        heap._core.agree(Call(Phase.ZEROS_FILLED if heap.my_pe == 0 else Phase.BARRIER_ALL,
                        text="step"))
    assert "step (in your collective call #4)" in str(info.value)
    assert "step (your collective call #5)" in str(info.value)


@pytest.mark.mpi(min_size=2)
def test_flag_is_reduced_not_compared(heap):
    me = heap.my_pe
    outcome = heap._core.agree(Call(Phase.BARRIER_ALL, text="barrier"), flag=me != 0)
    assert outcome.flag_everywhere is False
    outcome = heap._core.agree(Call(Phase.BARRIER_ALL, text="barrier"), flag=True)
    assert outcome.flag_everywhere is True
    assert parts_of(heap).agreement.all_ok(me != 1, Call(Phase.BACKING, text="vote")) is False
    assert parts_of(heap).agreement.all_ok(True, Call(Phase.BACKING, text="vote")) is True


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", ["board", "mpi"])
def test_an_agreed_step_gives_the_same_flag_and_releases_on_the_board_as_over_mpi(path):
    """The board's one native call decides an agreed step whose flag is not
    everywhere, or that carries the same dead block on every PE, without the
    general outcome (agreement.py's fast branch): the same Outcome as the
    MPI path's, which always takes the general one."""
    heap = SymmetricHeap(world, "16M", agreement=path, **HEAP_OPTIONS)
    try:
        me, core = heap.my_pe, heap._core
        step = Call(Phase.BARRIER_ALL, text="barrier")
        outcome = core.agree(step, flag=me != 0)
        assert outcome.flag_everywhere is False and outcome.released == frozenset()
        for flag, everywhere in ((me != 0, False), (True, True)):
            dropped = heap.empty(16, torch.float32)
            offset = parts_of(heap).local.offset_of(dropped)
            del dropped             # dead on every PE alike: the same digest everywhere
            gc.collect()
            outcome = core.agree(step, flag=flag)
            assert outcome.flag_everywhere is everywhere
            assert outcome.released == frozenset({offset})
            assert heap.heap_info()["live_allocations"] == 0
    finally:
        heap.finalize()


@pytest.mark.mpi(min_size=2)
def test_offsets_dead_on_every_pe_are_released_before_the_error():
    comm = world.Dup()
    events = []
    agreement = Agreement(comm, 10.0, comm.rank, release=lambda offsets: events.append(
        ("release", sorted(offsets))))
    me = comm.rank
    try:
        # dead only on some PEs: nothing released, no gather at all
        outcome = agreement.collective(Call(Phase.BARRIER_ALL), dead={64} if me == 0 else set())
        assert outcome.released == frozenset() and events == []
        # dead everywhere, partly in common; the call itself fails everywhere
        dead = {0, 64, 128, 4096 * (me + 1)}
        with pytest.raises(ValueError, match="bad size"):
            try:
                agreement.collective(Call(Phase.MALLOC, error=ValueError("bad size")), dead=dead)
            finally:
                events.append("raised")
        assert events == [("release", [0, 64, 128]), "raised"]
        assert agreement.collective(Call(Phase.TRIM), dead=dead).released == frozenset(
            {0, 64, 128})                 # the Agreement keeps no state of its own about it
    finally:
        agreement.close()
        comm.Free()


@pytest.fixture
def mpi_heap():
    """A heap whose steps go through MPI (SHMEMVM_AGREEMENT=mpi), not the board."""
    h = SymmetricHeap(world, "16M", agreement="mpi", **HEAP_OPTIONS)
    yield h
    h.finalize()


@pytest.mark.mpi(min_size=2)
def test_steps_agree_alike_with_a_new_iallreduce_each_and_after_an_interrupted_wait(mpi_heap):
    heap = mpi_heap
    assert parts_of(heap).agreement.board is None
    me = heap.my_pe
    x = heap.malloc(64)
    heap.free(x)
    # a persistent allreduce where MPI has them (MPI 4.0: MPICH 4, Open MPI 5)
    assert parts_of(heap).agreement._request is False or isinstance(parts_of(heap).agreement._request, MPI.Prequest)
    # an interrupted wait (KeyboardInterrupt): the next step waits for that step first
    barrier_interrupted_on_pe_1(heap)
    heap.barrier_all()
    y = heap.malloc(128)
    assert parts_of(heap).agreement.broken is None
    # without a persistent request (MPI before 4.0): a new Iallreduce every step
    parts_of(heap).agreement.close()
    assert parts_of(heap).agreement._request is False
    heap.free(y)
    z = heap.zeros(8, torch.int32)
    with pytest.raises(SymmetryError, match="malloc"):
        heap.malloc(64 if me == 0 else 32)
    heap.free(z)
    heap.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_an_interrupted_iallreduce_keeps_its_buffers_until_it_has_completed(mpi_heap):
    """Without persistent collectives (MPI before 4.0, e.g. Open MPI 4.1) every
    step is a new Iallreduce on buffers of its own. An interrupted wait leaves
    it in flight, and MPI writes its result later: its buffers must live until
    then (they went with the step's frame, and Open MPI 4.1 crashed in a later
    step), and the next step waits for it first."""
    heap = mpi_heap
    parts_of(heap).agreement.close()            # from here on, a new Iallreduce every step
    barrier_interrupted_on_pe_1(heap)
    if heap.my_pe == 1:
        request, buffers = parts_of(heap).agreement._interrupted
        assert isinstance(request, MPI.Request) and len(buffers) == 2
    for n in (64, 128, 4096):         # later steps: the same on every PE
        heap.free(heap.malloc(n))
    assert parts_of(heap).agreement._interrupted is None
    assert parts_of(heap).agreement.broken is None


# -- property: different call sequences ------------------------------------------------------
SIZES = st.sampled_from([0, 1, 64, 100, 4096, 65536, 1 << 20])
DTYPES = st.sampled_from([torch.uint8, torch.int32, torch.float32, torch.float64])
SHAPES = st.lists(st.integers(0, 40), max_size=3).map(tuple)
CALLS = st.one_of(
    st.tuples(st.just("malloc"), SIZES),
    st.tuples(st.just("empty"), SHAPES, DTYPES),
    st.tuples(st.just("zeros"), SHAPES, DTYPES),
    st.tuples(st.just("free"), st.integers(0, 7)),
    st.tuples(st.just("realloc"), st.integers(0, 7), st.integers(0, 3000)),
    st.just(("barrier_all",)), st.just(("sync_all",)), st.just(("trim",)),
    st.tuples(st.just("broadcast"), st.integers(0, 1)),
    st.tuples(st.just("reduce"), st.sampled_from(["sum", "max"])),
)


def near(call) -> list[tuple]:
    """Calls that differ from `call` in one thing only: the kind, the dtype,
    the shape (same bytes), the tensor, the size, the root or op."""
    op = call[0]
    if op in ("malloc", "empty", "zeros"):
        shape, dtype = ((call[1],), torch.uint8) if op == "malloc" else call[1:]
        numel = 1
        for d in shape:
            numel *= d
        out = [(kind, shape, dtype) for kind in ("empty", "zeros") if kind != op] * 3
        out += [(op if op != "malloc" else "empty", shape, other)
                for other in (torch.uint8, torch.int8, torch.float32) if other != dtype]
        out += [(op if op != "malloc" else "empty", other, dtype)
                for other in ((numel,), (1, numel), (numel, 1), shape + (1,)) if other != shape]
        if op != "malloc" and dtype == torch.uint8 and len(shape) == 1:
            out.append(("malloc", shape[0]))
        return out
    if op == "free":
        return [("free", call[1] + 1), ("realloc", call[1], 1)]
    if op == "realloc":
        return [("realloc", call[1] + 1, call[2]), ("realloc", call[1], call[2] + 1),
                ("free", call[1])]
    if op == "broadcast":
        return [("broadcast", 1 - call[1]), ("reduce", "sum")]
    if op == "reduce":
        return [("reduce", "max" if call[1] == "sum" else "sum"), ("broadcast", 0)]
    return [(other,) for other in ("barrier_all", "sync_all", "trim") if other != op]


@st.composite
def programs(draw):
    """A common prefix, PE 0's next call, and the other PEs' (None: the same as
    PE 0's); the other call is mostly a near miss, which is where false
    agreements hide."""
    prefix, mine = draw(st.lists(CALLS, max_size=5)), draw(CALLS)
    how = draw(st.sampled_from(["same", "near", "near", "any"]))
    if how == "same":
        return prefix, mine, None
    return prefix, mine, draw(st.sampled_from(near(mine)) if how == "near" else CALLS)


def resolve(heap, call, live, buf):
    """(key, run) for a model call: keys are equal exactly where the calls must
    agree; run() makes the call and updates `live`."""
    op = call[0]
    if op in ("malloc", "empty", "zeros"):
        shape, dtype = ((call[1],), torch.uint8) if op == "malloc" else call[1:]
        make = {"malloc": lambda: heap.malloc(call[1]), "zeros": lambda: heap.zeros(shape, dtype),
                "empty": lambda: heap.empty(shape, dtype)}[op]
        return ("zeros" if op == "zeros" else "alloc", shape, dtype), lambda: live.append(make())
    if op in ("free", "realloc") and live:
        k = call[1] % len(live)
        target = live[k]
        offset = target.untyped_storage().data_ptr() - parts_of(heap).local.base
        if op == "free":
            return ("free", offset), lambda: (heap.free(target), live.pop(k))
        nbytes = call[2] * target.element_size()

        def run():
            live[k] = heap.realloc(target, nbytes)
        return ("realloc", offset, nbytes, target.dtype), run
    if op in ("free", "realloc"):                         # nothing live: a barrier instead
        return ("barrier_all",), heap.barrier_all
    if op == "broadcast":
        return call, lambda: heap.broadcast(buf, buf, call[1])
    if op == "reduce":
        return call, lambda: heap.reduce(buf, buf, call[1])
    return call, getattr(heap, op)


def assert_usable(heap):
    states = world.allgather(repr(parts_of(heap).local.allocator_state()))
    assert all(s == states[0] for s in states), "the PEs' allocators diverged"
    x = heap.malloc(256 << 10)                            # a new segment, exchanged
    x.fill_(heap.my_pe)
    heap.barrier_all()
    right = (heap.my_pe + 1) % heap.n_pes
    assert bool((heap.ptr(x, right) == right).all())
    heap.barrier_all()
    heap.free(x)


def run_example(program) -> None:
    prefix, mine, theirs = program
    me = world.rank
    heap = SymmetricHeap(world, heap_size="16M", backend="host", timeout=10)
    live: list[torch.Tensor] = []
    try:
        buf = heap.zeros(16, torch.int64)                 # your collective call #1
        for call in prefix:
            resolve(heap, call, live, buf)[1]()
        key, run = resolve(heap, mine if me == 0 or theirs is None else theirs, live, buf)
        keys = world.allgather(key)
        before = len(live)
        if all(k == keys[0] for k in keys):
            run()                                         # identical: must not raise
        else:
            with pytest.raises(SymmetryError) as info:
                run()
            numbers = set(re.findall(r"collective call #(\d+)", str(info.value)))
            assert numbers == {str(len(prefix) + 2)}, info.value   # at the differing call
            assert len(live) == before                    # nothing was done ...
            assert heap.heap_info()["live_allocations"] == before + 1
            assert_usable(heap)                           # ... and the heap goes on
    finally:
        live.clear()
        heap.finalize()                                   # (no gc.collect(): 0.4 s a time)


@pytest.mark.mpi(min_size=2)
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          phases=[HypothesisPhase.explicit, HypothesisPhase.generate],
          suppress_health_check=list(HealthCheck))
@given(program=programs())
@example(program=([], ("zeros", (32,), torch.uint8), ("malloc", 32)))       # issue 12
@example(program=([("malloc", 64)], ("empty", (18,), torch.float32),
                  ("zeros", (18,), torch.float32)))
@example(program=([], ("empty", (32,), torch.uint8), ("malloc", 32)))      # these agree
@example(program=([("zeros", (), torch.uint8)], ("barrier_all",), ("sync_all",)))
def test_different_calls_raise_symmetry_error_at_the_first_difference_everywhere(program):
    program = world.bcast(program, root=0)            # every PE runs PE 0's example
    try:
        run_example(program)
        failure = None
    except (Exception, pytest.fail.Exception) as exc:  # shared below: every PE stops here
        failure = f"PE {world.rank}: {type(exc).__name__}: {exc}"
    failures = [f for f in world.allgather(failure) if f]
    assert not failures, f"{program}: {failures}"


# -- init: errors reach the user unchanged, the timeout is checked ---------------------------
INIT_ERRORS = [
    ({"heap_size": "abc"}, ValueError, r"cannot read 'abc' as a size"),
    ({"heap_size": 0}, ValueError, r"heap size must be positive"),
    ({"backend": "foo"}, ValueError, r"unknown backend 'foo'"),
    ({"timeout": float("inf")}, ValueError, r"SHMEMVM_TIMEOUT.*finite number of seconds > 0"),
    ({"timeout": float("nan")}, ValueError, r"SHMEMVM_TIMEOUT"),
    ({"timeout": 0}, ValueError, r"SHMEMVM_TIMEOUT.*got 0"),
    ({"timeout": -1}, ValueError, r"SHMEMVM_TIMEOUT.*got -1"),
    ({"timeout": "abc"}, ValueError, r"SHMEMVM_TIMEOUT.*got 'abc'"),
    ({"node_split": 0}, ValueError, r"SHMEMVM_NODE_SPLIT must be an integer >= 1, got '0'"),
]


def _init_options(bad: dict) -> dict:
    return {"heap_size": "4M", "backend": "host", "timeout": 10, **bad}


@pytest.mark.mpi
@pytest.mark.parametrize("bad, exc_type, pattern", INIT_ERRORS,
                         ids=[f"{k}={v!r}" for bad, _, _ in INIT_ERRORS for k, v in bad.items()])
def test_init_errors_reach_every_pe_unchanged(bad, exc_type, pattern):
    from util import open_fds
    fds = open_fds()
    with pytest.raises(exc_type, match=pattern) as info:
        SymmetricHeap(world, **_init_options(bad))
    assert type(info.value) is exc_type                   # not an AttributeError, not wrapped
    assert open_fds() == fds                              # the half-built heap is gone
    with pytest.raises(exc_type, match=pattern):          # the module API says the same
        shmemvm.init(world, **_init_options(bad))
    with shmemvm.init(world, **_init_options({})) as heap:  # and init works afterwards
        assert heap.n_pes == world.size
        heap.free(heap.malloc(100))


@pytest.mark.mpi(min_size=2)
def test_init_error_on_one_pe_is_a_symmetry_error_on_the_others():
    last = world.size - 1
    bad = {"heap_size": "abc"} if world.rank == last else {}
    with pytest.raises((SymmetryError, ValueError)) as info:
        SymmetricHeap(world, **_init_options(bad))
    if world.rank == last:
        assert type(info.value) is SymmetryError
    assert f"PE {last}: init [rejected here: cannot read 'abc' as a size" in str(info.value)
    SymmetricHeap(world, **_init_options({})).finalize()


@pytest.mark.mpi
def test_timeout_from_the_environment_is_checked(monkeypatch):
    monkeypatch.setenv("SHMEMVM_TIMEOUT", "inf")
    with pytest.raises(ValueError, match=r"SHMEMVM_TIMEOUT.*got 'inf'"):
        SymmetricHeap(world, heap_size="4M", backend="host")
    monkeypatch.setenv("SHMEMVM_TIMEOUT", "2.5")
    with SymmetricHeap(world, heap_size="4M", backend="host") as heap:
        assert heap.timeout == 2.5 and parts_of(heap).agreement.timeout == 2.5


@pytest.mark.mpi(min_size=2)
def test_an_agreement_closed_with_a_step_still_active_leaves_its_buffers_to_mpi(mpi_heap):
    """A step that was interrupted (or timed out: a team's sync over MPI, issue
    33's CI work) may still be active when its agreement is closed (a team
    destroyed, a heap finalized): MPI writes its result later, so the request
    and its buffers must outlive the agreement (freed with it, a later heap's
    PE died of a segmentation fault in pymalloc). They are kept for the
    process's life; an agreement with nothing active frees its request."""
    from shmemvm.agreement import agreement as module
    heap = mpi_heap
    agreement = parts_of(heap).agreement
    agreement.close()                    # a new Iallreduce every step from here on
    barrier_interrupted_on_pe_1(heap)
    kept = len(module._LEFT_TO_MPI)
    if heap.my_pe == 1:
        request, buffers = agreement._interrupted
        agreement.close()                # (as a team's destroy() would, mid-step)
        assert len(module._LEFT_TO_MPI) == kept + 1
        interrupted = module._LEFT_TO_MPI[-1][1]
        assert interrupted[0] is request and interrupted[1] is buffers
    heap.barrier_all()                   # the heap goes on: the step is waited for first
    idle = module.Agreement(world.Dup(), 30.0, heap.my_pe)
    idle.collective(Call(Phase.BARRIER_ALL))
    before = len(module._LEFT_TO_MPI)
    idle.close()                         # nothing active: freed, nothing kept
    assert len(module._LEFT_TO_MPI) == before
    idle.comm.Free()
