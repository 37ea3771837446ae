"""Reaching a system limit that segments use up raises a ResourceLimitError on
every PE, quickly, naming the limit and the settings to change, undoes the
call everywhere and leaves the heap usable, with nothing leaked.

Both limits are real, not injected (see tests/helpers/resource_limits.py):
RLIMIT_NOFILE is lowered in each PE, and vm.max_map_count (which only root
can lower) is approached by each PE splitting a mapping of its own into
single pages. The chunk size is the granularity there, so that every
allocation is a segment of its own.

Not an `mpi` test: it starts its own jobs of 2 and 4 PEs, each running both
scenarios one after another (a heap each),

    mpiexec -n N python tests/helpers/resource_limits.py OUTDIR fds+maps

side by side, each with a hard time limit. It runs in the `jobs` phase
of tests/run_all.sh.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from util import REPO, clean_env, mpiexec, run_jobs

HELPER = REPO / "tests" / "helpers" / "resource_limits.py"
JOB_LIMIT = 300        # seconds for all jobs, side by side on a 2-core machine
QUICK = 5.0            # seconds the failing call may take (the heaps' timeout is 20 s)
CASES = [(scenario, n) for n in (2, 4) for scenario in ("fds", "maps")]
NAMES = {"fds": ("RLIMIT_NOFILE", "ulimit -n"),
         "maps": ("vm.max_map_count", "sysctl vm.max_map_count")}


@pytest.fixture(scope="module")
def outcomes():
    launcher = mpiexec()
    root = Path(tempfile.mkdtemp(prefix="shmemvm-limits-"))
    try:
        # one job per PE count runs both scenarios, one after another, each recording
        # into <job>/<scenario>/ (one start-up instead of two: CI's time)
        scenarios = "+".join(dict.fromkeys(scenario for scenario, _ in CASES))
        counts = sorted({n for _, n in CASES})
        jobs = {f"n{n}": ([launcher, "-n", str(n), sys.executable, str(HELPER),
                           str(root / f"n{n}"), scenarios], clean_env()) for n in counts}
        # run_jobs gives each job a records directory of its own; its limit is per job
        results = run_jobs(root, jobs, JOB_LIMIT, max(counts))
        outcomes = {}
        for scenario, n in CASES:
            folder = root / f"n{n}" / scenario
            records = {pe: json.loads((folder / f"pe{pe}.json").read_text())
                       for pe in range(n) if (folder / f"pe{pe}.json").exists()}
            outcomes[f"{scenario}-{n}"] = {**results[f"n{n}"], "records": records}
        yield outcomes
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("scenario, n", CASES)
def test_a_system_limit_raises_a_clear_error_everywhere_and_the_heap_recovers(
        outcomes, scenario, n):
    job = outcomes[f"{scenario}-{n}"]
    context = f"{scenario} at {n} PEs: {job['records']}\n{job['log']}"
    assert job["returncode"] == 0, f"the job failed or hung: {context}"
    records = job["records"]
    assert sorted(records) == list(range(n)), context
    for pe, record in records.items():
        assert "unexpected" not in record, context
        assert record["chunk"] == 64 << 10, context
        # the limit was reached, by this call on every PE, and named
        assert record["error"] == "ResourceLimitError", context
        assert 0 < record["failed_at"] < 4000, context
        message = record["message"]
        for name in NAMES[scenario]:
            assert name in message, context
        assert "SHMEMVM_CHUNK_SIZE" in message and "undone on every PE" in message, context
        if scenario == "maps":
            assert "fewer PEs per node" in message, context
        # at once, not at the timeout; the failed call left nothing behind
        assert record["elapsed"] < QUICK, context
        assert record["fds_leaked"] == 0 and record["maps_leaked"] == 0, context
        # usable afterwards: reuse, trim, new memory, data between PEs
        assert record["recovered"] and record["data_ok"], context
        # and everything is given back in the end
        assert record["after_trim_segments"] == 0, context
        assert record["fds_left"] == [] and record["maps_left"] == 0, context
    assert len({r["failed_at"] for r in records.values()}) == 1, context
    assert len({r["message"] for r in records.values()}) == 1, context
