"""A PE that dies in the middle of a collective: the others raise
PeerTimeoutError within the configured time instead of hanging.

MPICH's mpiexec (hydra) takes the whole job down when one process dies, so
this is not an `mpi` test: it starts its own small jobs,

    mpiexec -disable-auto-cleanup -n 3 python tests/helpers/peer_death.py SCENARIO TIMEOUT OUTDIR

in which the last PE leaves abruptly (os._exit, see the helper for why not
SIGKILL) at the point SCENARIO names, and every other PE writes down what its
pending call raised and after how long. It runs in the `jobs` phase of
tests/run_all.sh. The scenarios run side by side to keep the test short.
"""

from __future__ import annotations

import sys

import pytest

from util import REPO, clean_env, is_hydra, mpiexec, job_outcomes

HELPER = REPO / "tests" / "helpers" / "peer_death.py"
N_PES = 3
TIMEOUT = 3.0          # SHMEMVM_TIMEOUT given to the jobs
MARGIN = 2.0           # scheduling slack on 2 cores with 9 processes
JOB_LIMIT = 150        # seconds: a job that takes longer than this hangs


# scenario -> how the survivors are given the timeout: "arg" (timeout=) or "env" (SHMEMVM_TIMEOUT)
SCENARIOS = {"before-malloc": "arg", "mid-malloc": "arg", "mid-barrier": "env"}


@pytest.fixture(scope="module")
def outcomes():
    launcher = mpiexec()
    if not is_hydra(launcher):
        pytest.skip(f"{launcher} is not MPICH's hydra; this test relies on -disable-auto-cleanup")

    def jobs_in(root):
        jobs = {}
        for scenario, how in SCENARIOS.items():
            timeout_arg = f"{TIMEOUT:g}" if how == "arg" else "env"
            command = [launcher, "-disable-auto-cleanup", "-n", str(N_PES), sys.executable,
                       str(HELPER), scenario, timeout_arg, str(root / scenario)]
            jobs[scenario] = (command, clean_env(f"{TIMEOUT:g}" if how == "env" else None))
        return jobs

    with job_outcomes("shmemvm-peer-death-", jobs_in, JOB_LIMIT, N_PES) as results:
        yield results


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_survivors_raise_peer_timeout_within_the_timeout(outcomes, scenario):
    result = outcomes[scenario]
    context = f"{scenario}: {result}"
    assert result["returncode"] is not None, f"the job hung past {JOB_LIMIT} s: {context}"
    records = result["records"]
    victim = N_PES - 1
    assert records.get(victim, {}).get("died"), context
    survivors = [records.get(pe) for pe in range(N_PES - 1)]
    assert all(r is not None for r in survivors), f"a surviving PE did not report: {context}"
    for record in survivors:
        assert record["warm_ok"], context
        assert record["timeout"] == TIMEOUT, context        # timeout= or SHMEMVM_TIMEOUT
        assert record["error"] == "PeerTimeoutError", context
        assert "SHMEMVM_TIMEOUT" in record["message"], context
        assert "malloc(1048576)" in record["message"] or "barrier_all()" in record["message"]
        # waited the configured time, not (much) longer and not forever
        assert TIMEOUT - 0.1 <= record["elapsed"] <= TIMEOUT + MARGIN, context
        # the heap refuses further collectives at once and still finalizes
        assert record["second_error"] == "PeerTimeoutError", context
        assert "unusable" in record["second_message"], context
        assert record["second_elapsed"] < 1.0, context
        assert record["closed"] and record["finalize_elapsed"] < 5.0, context
