"""Small collectives fused with their agreed board step (transport/nodecoll.py,
native/_collective.c; issue 30) keep the agreement's guarantees: a PE that
dies before the call, or one stopped (SIGSTOP) past the others' timeout that
then arrives late, ends the call with PeerTimeoutError on every PE (the late
PE for that very call: "the other PEs gave up"), and a PE late by less than
the timeout changes nothing. late-alltoall is the NumPy face's, replayed from
the Plan its earlier calls left (nodecoll.replay): no check, the same step.

Not an `mpi` test: it starts its own 3-PE jobs with the helpers of
test_reliability_abandoned.py and test_reliability_peer_death.py
(tests/helpers/abandoned_call.py, peer_death.py), agreement on the board, the
compiled piece on (the default where it is built), timeout 3 s. The late
calls share one job, one after another, each on a heap of its own (the helper's
`cases`), beside the two jobs whose PE dies (issue 33, item 16: 6 -> 3 jobs).
"""

from __future__ import annotations

import sys

import pytest

from util import REPO, clean_env, is_hydra, mpiexec, job_outcomes, split_shared

ABANDONED = REPO / "tests" / "helpers" / "abandoned_call.py"
DEATH = REPO / "tests" / "helpers" / "peer_death.py"
N_PES = 3
TIMEOUT = 3.0
STOP = 6.0
MARGIN = 2.5
JOB_LIMIT = 150

#: the calls a PE is late for: name -> (scenario, seconds stopped), all in the job "late"
LATE = {
    "late-reduce": ("reduce", STOP),
    "late-fcollect": ("fcollect", STOP),
    # the NumPy face's alltoall from its memoized Plan (shmem/collectives.py, nodecoll.replay)
    "late-alltoall": ("numpy-alltoall", STOP),
    "in-time-broadcast": ("broadcast", 1.0),
}
#: the jobs in which a PE dies in the call: name -> peer_death.py's scenario
DEAD = {"dead-reduce": "mid-reduce", "dead-fcollect": "mid-numpy-fcollect"}   # (replayed, as above)


@pytest.fixture(scope="module")
def outcomes():
    launcher = mpiexec()
    if not is_hydra(launcher):
        pytest.skip(f"{launcher} is not MPICH's hydra; the dead-PE jobs rely on "
                    f"-disable-auto-cleanup")

    roots = []

    def jobs_in(root):
        roots.append(root)
        cases = [f"{name}:{scenario}:{stop:g}:board" for name, (scenario, stop) in LATE.items()]
        jobs = {"late": ([launcher, "-n", str(N_PES), sys.executable, str(ABANDONED), "cases",
                          f"{TIMEOUT:g}", str(root / "late"), *cases], clean_env())}
        for name, scenario in DEAD.items():
            jobs[name] = ([launcher, "-disable-auto-cleanup", "-n", str(N_PES), sys.executable,
                           str(DEATH), scenario, f"{TIMEOUT:g}", str(root / name)], clean_env())
        return jobs

    with job_outcomes("shmemvm-nodecoll-faults-", jobs_in, JOB_LIMIT, N_PES) as results:
        split_shared(results, "late", roots[0] / "late", LATE, N_PES)
        yield results


def _records(outcomes, name):
    result = outcomes[name]
    context = f"{name}: {result}"
    assert result["returncode"] is not None, f"the job hung past {JOB_LIMIT} s: {context}"
    return result["records"], context


@pytest.mark.parametrize("name", [n for n in LATE if n.startswith("late-")])
def test_a_stopped_pe_arriving_late_raises_for_the_call_the_others_gave_up(outcomes, name):
    records, context = _records(outcomes, name)
    assert sorted(records) == list(range(N_PES)), f"a PE did not report: {context}"
    for record in records.values():
        assert record["error"] == "PeerTimeoutError", context
        if record["late"]:
            assert "gave up" in record["message"], context
            assert record["elapsed"] <= MARGIN, context
        else:
            assert TIMEOUT - 0.1 <= record["elapsed"] <= TIMEOUT + MARGIN, context
        assert record["second_error"] == "PeerTimeoutError", context
        assert "unusable" in record["second_message"], context
        if name == "late-alltoall":   # (the call that timed out was a replayed one,
            # whole in its quick step: the native step, its wait and settle)
            assert record["replayed"] and record["replayed_quick"], context


def test_a_pe_late_by_less_than_the_timeout_changes_nothing(outcomes):
    records, context = _records(outcomes, "in-time-broadcast")
    assert sorted(records) == list(range(N_PES)), f"a PE did not report: {context}"
    for record in records.values():
        assert record["error"] is None, context
        assert record["second_error"] is None, context


@pytest.mark.parametrize("name", DEAD)
def test_survivors_of_a_dead_pe_raise_within_the_timeout(outcomes, name):
    records, context = _records(outcomes, name)
    assert records.get(N_PES - 1, {}).get("died"), context
    survivors = [records.get(pe) for pe in range(N_PES - 1)]
    assert all(r is not None for r in survivors), f"a surviving PE did not report: {context}"
    what = "reduce" if "reduce" in name else "fcollect"
    for record in survivors:
        assert record["error"] in ("PeerTimeoutError", "PeerDeadError"), context
        assert what in record["message"], context
        assert record["elapsed"] <= TIMEOUT + MARGIN, context
        assert record["second_error"] in ("PeerTimeoutError", "PeerDeadError"), context
        assert record["closed"], context
        if name == "dead-fcollect":   # (replayed whole by its quick step)
            assert record["replayed"] and record["replayed_quick"], context
