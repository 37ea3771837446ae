"""trace.py's wrapper, without a heap: every kind of parameter passes through
unchanged, the wrapper has the routine's signature, and a range is made only
while a torch profiler records. The ranges of a heap's calls:
tests/mpi/core/test_trace.py."""

import inspect

import torch
from torch.profiler import profile

from shmemvm.core import trace


def every_kind(a, b, /, c, d=3, *args, e, g=5, **kw):
    return (a, b, c, d, args, e, g, kw)


def plain(ctx, dest, source, pe):
    return (ctx, dest, source, pe)


def keyword_only(ctx, dest, *, team=None):
    return (ctx, dest, team)


def test_arguments_pass_through_with_the_routines_signature():
    for function in (every_kind, plain, keyword_only):
        wrapped = trace.ranged(function, "shmemvm.x")
        assert inspect.signature(wrapped) == inspect.signature(function)
        assert wrapped.__wrapped__ is function and wrapped.__name__ == function.__name__
    w = trace.ranged(every_kind, "shmemvm.x")
    assert w(1, 2, 3, e=4) == (1, 2, 3, 3, (), 4, 5, {})
    assert w(1, 2, 3, 4, 9, e=0, g=1, z=2) == (1, 2, 3, 4, (9,), 0, 1, {"z": 2})
    assert trace.ranged(keyword_only, "shmemvm.x")(1, 2, team=7) == (1, 2, 7)
    assert trace.ranged(keyword_only, "shmemvm.x")(1, 2) == (1, 2, None)


def test_a_range_only_while_a_profiler_records():
    put = trace.ranged(plain, "shmemvm.put")
    x = torch.zeros(4, dtype=torch.int16)
    assert put("ctx", x, x, 3) == ("ctx", x, x, 3)         # no profiler: just the call
    with profile() as prof:
        put("ctx", x, x, 3)
    names = [event.name for event in prof.events()]
    assert names.count("shmemvm.put(pe=3, bytes=8)") == 1, names


def test_traced_wraps_the_public_functions_of_the_class_itself():
    class Base:
        def inherited(self):
            return 1

    @trace.traced(skip=("helper",))
    class Routines(Base):
        put = plain

        def helper(self):
            return 2

        def _private(self):
            return 3

        @property
        def value(self):
            return 4

    assert Routines.put.__shmemvm_traced__ == "shmemvm.put"
    for name in ("helper", "_private", "inherited"):
        assert not hasattr(getattr(Routines, name), "__shmemvm_traced__"), name
    assert Routines().value == 4


def test_the_name_shows_pe_and_bytes():
    x = torch.zeros(3, dtype=torch.float64)
    assert trace.describe("shmemvm.put", {"dest": x, "source": x, "pe": 2}) == \
        "shmemvm.put(pe=2, bytes=24)"
    assert trace.describe("shmemvm.malloc", {"nbytes": 100}) == "shmemvm.malloc(bytes=100)"
    assert trace.describe("shmemvm.zeros", {"shape": (2, 3), "dtype": torch.int32}) == \
        "shmemvm.zeros(bytes=24)"
    assert trace.describe("shmemvm.barrier_all", {"self": object()}) == "shmemvm.barrier_all()"


def test_the_flag_follows_every_way_of_profiling():
    from torch.profiler import schedule

    assert not trace.profiling()
    with profile():
        assert trace.profiling()
    assert not trace.profiling()
    with torch.autograd.profiler.profile():
        assert trace.profiling()
    seen = []
    with profile(schedule=schedule(wait=1, warmup=1, active=1), acc_events=True) as prof:
        for _ in range(4):
            seen.append(trace.profiling())
            prof.step()
    assert seen == [False, False, True, False]     # only the active step records
