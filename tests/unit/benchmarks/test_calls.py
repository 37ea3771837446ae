"""The calls family's counter (benchmarks/calls.py), in one process: it counts
what cProfile counts, it sets the polling functions' calls apart (everything
they call too, even where an exception leaves them), and the figure keeps the
calls that polled least. The family run under MPI, twice, with the same
figures: tests/mpi/benchmarks/test_bench_calls.py."""

from __future__ import annotations

import cProfile
import pstats
import sys

import pytest

from benchmarks import calls


def _leaf(x):
    return abs(x) + len(str(x))


def _gen(n):
    for i in range(n):
        yield _leaf(i)


def _work():
    """Python calls, builtins, a generator resumed, an exception caught, a lambda."""
    total = sum(_gen(3))
    try:
        int("x")
    except ValueError:
        total += max(1, 2)
    return sorted([3, 1, 2], key=lambda v: -v), total


def _cprofile_total(fn) -> int:
    profile = cProfile.Profile()
    profile.enable()
    fn()
    profile.disable()
    return sum(entry[1] for entry in pstats.Stats(profile).stats.values())


def test_the_count_is_cprofiles():
    """The same calls as cProfile's total, the wrapper's and the switch's left out."""
    expected = _cprofile_total(lambda: _work()) - _cprofile_total(lambda: None)
    assert expected > 10
    assert calls.count_calls(lambda: _work()) == (expected, 0)
    assert calls.count_calls(lambda: None) == (0, 0)
    assert sys.getprofile() is None


def _poll(ready):
    """A stand-in for a polling function: what it calls is polling too."""
    while not ready():
        _leaf(1)


def _poll_and_raise():
    _leaf(1)
    raise TimeoutError("gave up")


def test_calls_inside_a_polling_function_are_set_apart():
    skip = frozenset({_poll.__code__, _poll_and_raise.__code__})
    state = {"left": 3}

    def ready():
        state["left"] -= 1
        return state["left"] <= 0

    alone = calls.count_calls(lambda: _leaf(5))
    polled = calls.count_calls(lambda: (_leaf(5), _poll(ready), _leaf(5)), skip)
    assert polled.counted == 2 * alone.counted
    assert polled.polled == 1 + 3 + 2 * alone.counted   # _poll, ready x 3, _leaf's x 2

    def raising():
        _leaf(5)
        try:
            _poll_and_raise()
        except TimeoutError:
            pass
        _leaf(5)   # counted again: the exception left the polling function

    counted = calls.count_calls(raising, skip)
    assert counted.counted == 2 * alone.counted
    assert counted.polled == 1 + alone.counted    # _poll_and_raise, and _leaf's
    assert sys.getprofile() is None


def test_the_profiler_is_removed_when_the_call_raises():
    with pytest.raises(ZeroDivisionError):
        calls.count_calls(lambda: 1 / 0)
    assert sys.getprofile() is None


def test_the_figure_keeps_the_calls_that_polled_least():
    counts = [calls.Count(16, 0), calls.Count(23, 11), calls.Count(16, 0), calls.Count(23, 3)]
    assert calls.no_wait_counts(counts) == ([16, 16], 2)
    # over MPI every call enters a wait once: the least is not 0
    counts = [calls.Count(120, 2), calls.Count(120, 9), calls.Count(120, 2)]
    assert calls.no_wait_counts(counts) == ([120, 120], 1)


def test_every_polling_function_is_found():
    """A renamed polling function fails here, not by counting its polls."""
    codes = calls.polling_codes()
    assert len(codes) == len(calls.POLLING)
    names = {code.co_name for code in codes}
    assert names == {"wait_until", "ready", "complete"}
    with pytest.raises(AttributeError):
        calls.polling_codes(("shmemvm.agreement.deadline:no_such_function",))
