"""Every PE reports the same outcome of every call (issue 25, item 3): a PE
stopped past the others' timeout, arriving at a collective they gave up on,
raises for that call too, at once, instead of completing it (it used to get a
tensor from malloc and learn only at its next call). A PE late by less than
the timeout changes nothing: every PE's call succeeds.

Not an `mpi` test: it starts its own 3-PE jobs (tests/helpers/abandoned_call.py),
with timeout 3 s; the last PE is stopped (SIGSTOP) for 6 s (or 1 s) just before
the call. Through both transports of the agreement (an MPI allreduce, the board
in shared memory), on a team's own agreement, and with every PE on a node of its
own (the decision then goes through MPI). The calls share three jobs, side by
side, one call after another in each, on a heap of its own (the helper's
`cases`), to save CI the start-up of seven more (issue 33, item 16); each keeps
its own test.
"""

from __future__ import annotations

import sys

import pytest

from util import REPO, clean_env, mpiexec, job_outcomes, split_shared

HELPER = REPO / "tests" / "helpers" / "abandoned_call.py"
N_PES = 3
TIMEOUT = 3.0
STOP = 6.0
MARGIN = 2.5
JOB_LIMIT = 150

# name -> (scenario, seconds stopped, agreement, node_split)
JOBS = {
    "malloc-mpi": ("malloc", STOP, "mpi", None),
    "malloc-segment-mpi": ("malloc-segment", STOP, "mpi", None),
    "barrier-mpi": ("barrier", STOP, "mpi", None),
    "team-sync-mpi": ("team-sync", STOP, "mpi", None),
    "malloc-board": ("malloc", STOP, "board", None),
    "barrier-board": ("barrier", STOP, "board", None),
    "malloc-off-node": ("malloc", STOP, "mpi", 1),
    "in-time-mpi": ("malloc", 1.0, "mpi", None),
    "in-time-board": ("barrier", 1.0, "board", None),
    "in-time-off-node": ("malloc", 1.0, "mpi", 1),
}
#: the jobs late by less than the timeout
IN_TIME = [name for name, job in JOBS.items() if job[1] != STOP]
#: the jobs that run the calls, each one after another (a late one about 7 s, so
#: three of those at most in a job, which takes about as long as the three side by side)
SHARED = {
    "mpi": ("malloc-mpi", "malloc-segment-mpi", "barrier-mpi", "in-time-mpi"),
    # first: a team's MPI agreement that timed out, its heap finalized, then more
    # heaps in the same process (its pending request's buffers must outlive it)
    "board-and-team": ("team-sync-mpi", "malloc-board", "barrier-board", "in-time-board"),
    "off-node": ("malloc-off-node", "in-time-off-node"),
}


@pytest.fixture(scope="module")
def outcomes():
    launcher = mpiexec()

    roots = []

    def jobs_in(root):
        roots.append(root)
        return {job: ([launcher, "-n", str(N_PES), sys.executable, str(HELPER), "cases",
                       f"{TIMEOUT:g}", str(root / job)] + [case(name) for name in names],
                      clean_env())
                for job, names in SHARED.items()}

    with job_outcomes("shmemvm-abandoned-", jobs_in, JOB_LIMIT, N_PES) as results:
        # each call of a shared job as if it had its own: its records from
        # <job>/<name>/, the job's end and log
        for job, names in SHARED.items():
            split_shared(results, job, roots[0] / job, names, N_PES)
        yield results


def case(name: str) -> str:
    """JOBS[name] as the helper's NAME:SCENARIO:STOP:AGREEMENT[:SPLIT]."""
    scenario, stop, agreement, split = JOBS[name]
    return ":".join([name, scenario, f"{stop:g}", agreement] + ([] if split is None
                                                                 else [str(split)]))


def _records(outcomes, name):
    result = outcomes[name]
    context = f"{name}: {result}"
    assert result["returncode"] is not None, f"the job hung past {JOB_LIMIT} s: {context}"
    records = result["records"]
    assert sorted(records) == list(range(N_PES)), f"a PE did not report: {context}"
    return records, context


@pytest.mark.parametrize("name", [name for name, job in JOBS.items() if job[1] == STOP])
def test_a_pe_arriving_after_the_others_gave_up_raises_for_that_call(outcomes, name):
    records, context = _records(outcomes, name)
    off_node = JOBS[name][3] is not None
    if name == "barrier-board":   # (every PE's barrier the one native call of the quick step)
        assert all(record["quick"] for record in records.values()), context
    if name == "malloc-board":    # (every PE's malloc its allocation's quick step)
        assert all(record["quick_malloc"] for record in records.values()), context
    for pe, record in records.items():
        assert record["error"] == "PeerTimeoutError", context
        if record["late"]:
            # it learns at this call, not at the next, and without waiting a timeout
            # of its own on the node (off the node: the decision waits for PE 0's MPI)
            assert "gave up" in record["message"], context
            assert record["elapsed"] <= (TIMEOUT if off_node else 0) + MARGIN, context
        else:
            assert TIMEOUT - 0.1 <= record["elapsed"] <= TIMEOUT + MARGIN, context
        # the heap is unusable everywhere afterwards, and finalizes at once
        assert record["second_error"] == "PeerTimeoutError", context
        assert "unusable" in record["second_message"], context
        assert record["second_elapsed"] < 1.0, context
        assert record["finalize_elapsed"] < 5.0, context


@pytest.mark.parametrize("name", IN_TIME)
def test_a_pe_late_by_less_than_the_timeout_changes_nothing(outcomes, name):
    records, context = _records(outcomes, name)
    for record in records.values():
        assert record["error"] is None, context
        assert record["second_error"] is None, context
        assert "finalize_error" not in record, context
