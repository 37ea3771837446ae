"""profile.py keeps a heap's step timings with that heap (issue 29: its sums
were module dicts, shared by every heap of the process). Fake heaps, one
process: the objects instrument() wraps, with methods that do nothing. The
timings of a real heap's allocation path: tests/mpi/core/test_profile.py."""

from __future__ import annotations

from types import SimpleNamespace

from shmemvm.core import profile


class _Part:
    """An object with every method profile.py may wrap."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(type(self), "_call")

    def _call(self, *args):
        return args

    collective = all_ok = allocate_unmapped = tensor_for = retire = finish_free = _call
    export = create = map = set_access = export_fd = import_fd = release = _call
    attach = run = try_send = receive = _call


def _heap():
    heap = SimpleNamespace(agreement=_Part(), local=_Part(), backend=_Part(), window=_Part(),
                           exchange=_Part(), peers=_Part(), channel=_Part())
    heap.map_new = lambda *args: args
    return heap


def test_two_heaps_are_timed_apart():
    first, second = _heap(), _heap()
    with profile.instrumented(first) as a, profile.instrumented(second) as b:
        assert a is not b and profile.of(first) is a and profile.of(second) is b
        with a.measuring():
            first.agreement.collective(1)
            first.backend.create(2)
            second.agreement.collective(3)   # not measured: b is not recording
        with b.measuring():
            second.local.allocate_unmapped(4)
        assert {path: t["calls"] for path, t in a.totals().items()} == {"agreement": 1,
                                                                        "create": 1}
        assert {path: t["calls"] for path, t in b.totals().items()} == {"allocate": 1}
    assert profile.of(first) is None and profile.of(second) is None


def test_a_started_heap_records_every_call_and_nests_its_steps():
    heap = _heap()
    heap.exchange.run = lambda: (heap.peers.map(), heap.backend.map())   # steps inside a step
    steps = profile.start(heap)
    assert profile.instrument(heap) is steps     # idempotent: the same sums
    heap.exchange.run()                          # outside measuring(): recorded all the same
    assert {path: t["calls"] for path, t in steps.totals().items()} == {
        "exchange": 1, "exchange/peer_map": 1, "exchange/map": 1}
    steps.reset()
    assert steps.totals() == {}
    profile.uninstrument(heap)
    assert profile.of(heap) is None


def test_breakdown_is_the_callers_total_less_the_top_level_steps():
    steps = profile.Steps()
    steps.ns.update({"agreement": 4000, "allocate": 2000, "allocate/create": 1000})
    steps.calls.update(dict.fromkeys(steps.ns, 1))
    assert steps.breakdown(10_000, 2) == {"agreement": 2.0, "allocate": 1.0,
                                          "allocate/create": 0.5, "python": 2.0, "total": 5.0}


def test_the_module_keeps_no_sums_of_its_own():
    assert not [name for name, value in vars(profile).items()
                if isinstance(value, (dict, list)) and not name.startswith("__")]
