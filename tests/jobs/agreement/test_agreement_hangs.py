"""No wait without a deadline: a PE that is late for init, never calls it, or
computes past the timeout while a dropped tensor waits to be freed ends the
job with PeerTimeoutError instead of a hang.

Not an `mpi` test: it starts its own small jobs side by side,

    mpiexec -n 2 python -m mpi4py tests/helpers/agreement_hang.py SCENARIO TIMEOUT OUTDIR

(see the helper), and runs in the `jobs` phase of tests/run_all.sh.
`python -m mpi4py` aborts the job on an uncaught exception, so mpiexec must
exit nonzero right after the first PE's PeerTimeoutError.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from util import REPO, clean_env, mpiexec, run_jobs

HELPER = REPO / "tests" / "helpers" / "agreement_hang.py"
TIMEOUT = 2.0          # SHMEMVM_TIMEOUT of the jobs
MARGIN = 2.0           # scheduling slack on 2 cores with 6 processes
EXIT_SLACK = 5.0       # from the first PE's error to mpiexec's exit
JOB_LIMIT = 90         # seconds: a job that takes longer than this hangs
SCENARIOS = ("late-init", "no-init", "gc")


@pytest.fixture(scope="module")
def outcomes():
    launcher = mpiexec()
    root = Path(tempfile.mkdtemp(prefix="shmemvm-agreement-hang-"))
    try:
        # python -m mpi4py: an uncaught exception aborts the job at once
        yield run_jobs(root, {scenario: ([launcher, "-n", "2", sys.executable, "-m", "mpi4py",
                                          str(HELPER), scenario, f"{TIMEOUT:g}",
                                          str(root / scenario)], clean_env())
                              for scenario in SCENARIOS}, JOB_LIMIT, 2)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _timed_out(record: dict, context: str) -> None:
    assert record["error"] == "PeerTimeoutError", context
    assert "SHMEMVM_TIMEOUT" in record["message"], context
    assert TIMEOUT - 0.1 <= record["end"] - record["start"] <= TIMEOUT + MARGIN, context


@pytest.mark.parametrize("scenario", ["late-init", "no-init"])
def test_init_waits_for_a_missing_pe_only_until_the_deadline(outcomes, scenario):
    result = outcomes[scenario]
    context = f"{scenario}: {result}"
    assert result["returncode"] not in (None, 0), context   # ended, and as a failure
    pe0 = result["records"].get(0)
    assert pe0 is not None, context
    _timed_out(pe0, context)
    assert "init" in pe0["message"] and "No heap was made" in pe0["message"], context
    assert result["ended"] - pe0["end"] <= EXIT_SLACK, context   # mpiexec exits promptly
    assert 1 not in result["records"], context   # PE 1 was still asleep when the job ended


def test_gc_agreement_has_a_deadline_too(outcomes):
    result = outcomes["gc"]
    context = f"gc: {result}"
    assert result["returncode"] not in (None, 0), context
    records = result["records"]
    assert set(records) == {0, 1}, context
    _timed_out(records[0], context)
    for record in records.values():
        assert "barrier_all() (your collective call #3)" in record["message"], context
    # PE 1 arrived after PE 0 had given up: its allreduce completed, and it raises for
    # that call at once (issue 25: the same outcome on every PE), where it once waited
    # in the gather of dropped blocks (which first hung for ever, then timed out)
    assert records[1]["error"] == "PeerTimeoutError", context
    assert "gave up" in records[1]["message"], context
    assert records[1]["end"] - records[1]["start"] <= MARGIN, context
    assert result["ended"] - records[1]["end"] <= EXIT_SLACK, context
