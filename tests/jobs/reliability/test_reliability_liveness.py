"""Waits that cannot end raise on every PE instead of hanging (issue 25, items 1
and 5): a lock whose holder, or a PE queued ahead, is dead; every PE waiting
(wait_until, signal_wait_until, set_lock) with nothing changing; every live
PE waiting on a PE that is dead. A long wait that a live, computing PE ends
still waits.

Not an `mpi` test: it starts its own small jobs (tests/helpers/liveness_jobs.py)
with MPICH's mpiexec -disable-auto-cleanup (as test_reliability_peer_death.py),
three at a time, 3 PEs each, timeout 3 s. Each PE reports what its wait raised
and after how long. The scenarios in which no PE dies share two jobs (one after
another, each on a heap of its own: the helper's `cases`), the deadlocks and the
waits that return, to save CI the start-up of eight more (issue 33, item 16); each
keeps its own test.
"""

from __future__ import annotations

import sys

import pytest

from util import REPO, agreement_env, is_hydra, mpiexec, job_outcomes, split_shared

HELPER = REPO / "tests" / "helpers" / "liveness_jobs.py"
N_PES = 3
TIMEOUT = 3.0
MARGIN = 3.0            # scheduling slack: 9 processes on 2 cores
JOB_LIMIT = 120         # seconds: a job that takes longer than this hangs

# name -> (scenario, node_split or None)
JOBS = {
    "dead-holder": ("dead-holder", None),
    "dead-queued": ("dead-queued", None),
    "wait-on-dead": ("wait-on-dead", None),
    "signal-deadlock": ("signal-deadlock", None),
    "mixed-deadlock": ("mixed-deadlock", None),
    "lock-order": ("lock-order", None),
    "signal-deadlock-off-node": ("signal-deadlock", 1),
    "dead-holder-off-node": ("dead-holder", 1),
    "dead-holder-off-node-dropped": ("dead-holder-dropped", 1),
    "two-heaps": ("two-heaps", None),
    "idle-threads": ("idle-threads", None),
    "legit-long-wait": ("legit-long-wait", None),
    "timed-wait": ("timed-wait", None),
    "start-new-thread": ("start-new-thread", None),
    "stopped-satisfied": ("stopped-satisfied", None),
}
#: the jobs that run several of JOBS one after another (no PE dies in them), as if
#: each had a job of its own: the deadlocks (each about a timeout) and the waits that
#: return (each about two)
SHARED = {
    "deadlocks": ("signal-deadlock", "mixed-deadlock", "lock-order", "signal-deadlock-off-node",
                  "idle-threads", "two-heaps"),   # two-heaps leaves a heap: last (the helper)
    "returning": ("legit-long-wait", "timed-wait", "start-new-thread", "stopped-satisfied"),
}
BATCH = 3


@pytest.fixture(scope="module")
def outcomes():
    launcher = mpiexec()
    if not is_hydra(launcher):
        pytest.skip(f"{launcher} is not MPICH's hydra; these jobs rely on -disable-auto-cleanup")

    roots = []

    def jobs_in(root):
        roots.append(root)
        start = [launcher, "-disable-auto-cleanup", "-n", str(N_PES), sys.executable, str(HELPER)]
        jobs = {}
        for job, names in SHARED.items():   # the longest first: the others run beside them
            cases = [":".join([name, JOBS[name][0]] + ([] if JOBS[name][1] is None
                                                       else [str(JOBS[name][1])]))
                     for name in names]
            jobs[job] = ([*start, "cases", f"{TIMEOUT:g}", str(root / job), *cases],
                         agreement_env())
        for name, (scenario, split) in JOBS.items():
            if any(name in names for names in SHARED.values()):
                continue
            command = [*start, scenario, f"{TIMEOUT:g}", str(root / name)]
            if split is not None:
                command.append(str(split))
            jobs[name] = (command, agreement_env())
        return jobs

    with job_outcomes("shmemvm-liveness-", jobs_in, JOB_LIMIT, N_PES, BATCH) as results:
        # each scenario of a shared job as if it had its own: its records from
        # <job>/<name>/, the job's end and log
        for job, names in SHARED.items():
            split_shared(results, job, roots[0] / job, names, N_PES)
        yield results


def _records(outcomes, name, dead=()):
    result = outcomes[name]
    context = f"{name}: {result}"
    assert result["returncode"] is not None, f"the job hung past {JOB_LIMIT} s: {context}"
    # a PE that reported may still crash after: in the MPI calls it serves until all report
    assert "Segmentation fault" not in result["log"], f"a PE crashed: {context}"
    records = result["records"]
    for pe in dead:
        assert records.get(pe, {}).get("died"), context
    live = [pe for pe in range(N_PES) if pe not in dead]
    assert all(pe in records for pe in live), f"a live PE did not report: {context}"
    return {pe: records[pe] for pe in live}, context


@pytest.mark.parametrize("name", ["dead-holder", "dead-queued", "dead-holder-off-node",
                                  "dead-holder-off-node-dropped"])
def test_set_lock_raises_where_the_holder_or_a_pe_ahead_is_dead(outcomes, name):
    records, context = _records(outcomes, name, dead=[2])
    off_node = JOBS[name][1] is not None
    for record in records.values():
        assert record["error"] == "PeerDeadError", context
        assert "PE 2" in record["message"] and "set_lock" in record["message"], context
        # on the node a dead process is seen at once; off the node it is a PE that
        # does not answer for the timeout
        limit = (2 * TIMEOUT if off_node else TIMEOUT) + MARGIN
        assert record["elapsed"] <= limit, context
        assert record["finalize_elapsed"] < 5, context


def test_waiting_on_a_dead_pe_raises(outcomes):
    records, context = _records(outcomes, "wait-on-dead", dead=[N_PES - 1])
    for record in records.values():
        assert record["error"] == "PeerDeadError", context
        assert f"PE {N_PES - 1}" in record["message"], context
        assert "wait_until" in record["message"], context
        assert record["elapsed"] <= TIMEOUT + MARGIN, context


@pytest.mark.parametrize("name, waits", [
    ("signal-deadlock", ["signal_wait_until"] * N_PES),
    ("mixed-deadlock", ["wait_until", "signal_wait_until", "set_lock"]),
    ("lock-order", ["set_lock", "set_lock", "wait_until"]),
    ("signal-deadlock-off-node", ["signal_wait_until"] * N_PES),
])
def test_a_whole_job_deadlock_raises_on_every_pe_naming_each_wait(outcomes, name, waits):
    records, context = _records(outcomes, name)
    messages = set()
    for pe, record in records.items():
        assert record["error"] == "DeadlockError", context
        assert record["elapsed"] <= TIMEOUT + MARGIN, context
        assert record["finalize_elapsed"] < 5, context
        message = record["message"]
        messages.add(message[message.index("every PE"):] if "every PE" in message else message)
        for other, wait in enumerate(waits):   # each PE's wait is named
            assert f"PE {other}: {wait}" in message, context
    assert len(messages) == 1, f"the PEs told different stories: {context}"


def test_a_long_wait_that_a_computing_pe_ends_still_waits(outcomes):
    records, context = _records(outcomes, "legit-long-wait")
    assert records[0]["error"] is None and records[0]["result"] == "5", context
    assert records[0]["elapsed"] >= 2 * TIMEOUT - 0.5, context
    assert all(record.get("barrier") for record in records.values()), context


# -- issue 32 ------------------------------------------------------------------------------------
def test_a_deadlock_across_two_heaps_raises_on_every_pe(outcomes):
    """Item 3: each PE waits in one of two heaps over the same PEs."""
    records, context = _records(outcomes, "two-heaps")
    messages = set()
    for record in records.values():
        assert record["error"] == "DeadlockError", context
        assert record["elapsed"] <= 2 * TIMEOUT + MARGIN, context
        message = record["message"]
        messages.add(message[message.index("every PE"):])
        assert "wait_until(ivar at heap offset" in message, context   # item 16: the variable
    assert len(messages) == 1, f"the PEs told different stories: {context}"


@pytest.mark.parametrize("name, expected", [
    ("timed-wait", {0: "1"}),               # item 6: a wait with a deadline of its own
    ("start-new-thread", {0: "1"}),         # item 7: a thread threading does not list
    ("stopped-satisfied", {1: "1"}),        # item 8: a PE stopped in a satisfied wait
])
def test_waits_that_a_live_pe_ends_are_not_deadlocks(outcomes, name, expected):
    records, context = _records(outcomes, name)
    for pe, record in records.items():
        assert record["error"] is None, context
        assert record.get("barrier"), context     # and the heap still works
        if pe in expected:
            assert record["result"] == expected[pe], context


def test_idle_threads_leave_deadlock_detection_on(outcomes):
    """Item 9: an idle ThreadPoolExecutor worker and a thread in queue.get()."""
    records, context = _records(outcomes, "idle-threads")
    for record in records.values():
        assert record["error"] == "DeadlockError", context
        assert record["elapsed"] <= TIMEOUT + MARGIN, context
