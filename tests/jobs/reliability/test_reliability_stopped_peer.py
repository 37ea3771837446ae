"""One-sided operations aimed at a PE that is alive but stopped (SIGSTOP) end at
the heap's deadline with PeerTimeoutError instead of waiting for ever: atomics
and put_signal (through the heap's MPI window) and off-node put/get. An atomic
by the CPU on the peer's mapping (the compiled piece, one node) needs nothing
of the target, and completes at once.

Not an `mpi` test: it starts its own small jobs of 2 PEs,

    mpiexec -n 2 python tests/helpers/stopped_peer.py TIMEOUT OUTDIR SCENARIO ...

(see the helper), two side by side to keep the test short, each with a hard
limit. It runs in the `jobs` phase of tests/run_all.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from shmemvm import native
from util import REPO, clean_env, mpiexec

HELPER = REPO / "tests" / "helpers" / "stopped_peer.py"
TIMEOUT = 2.0          # the heaps' timeout= in the jobs
MARGIN = 2.0           # scheduling slack on 2 cores
JOB_LIMIT = 120        # seconds: a job that takes longer than this hangs
JOBS = [["atomic_fetch_add", "atomic_compare_swap", "atomic_add"],
        ["put_signal", "put", "get", "atomic_fetch_add_by_cpu"]]


@pytest.fixture(scope="module")
def outcomes():
    launcher = mpiexec()
    root = Path(tempfile.mkdtemp(prefix="shmemvm-stopped-peer-"))
    jobs = []
    try:
        for i, scenarios in enumerate(JOBS):
            outdir = root / f"job{i}"
            outdir.mkdir()
            log = open(outdir / "job.log", "w")
            command = [launcher, "-n", "2", sys.executable, str(HELPER), f"{TIMEOUT:g}",
                       str(outdir), *scenarios]
            jobs.append((subprocess.Popen(command, env=clean_env(), stdout=log,
                                          stderr=subprocess.STDOUT, cwd=REPO,
                                          start_new_session=True), log, outdir))
        started = time.monotonic()
        results = {}
        for (job, log, outdir), scenarios in zip(jobs, JOBS):
            try:
                returncode = job.wait(timeout=max(1.0, JOB_LIMIT - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, 9)  # the stopped PE too: SIGKILL ends stopped processes
                job.wait()
                returncode = None
            log.close()
            path = outdir / "pe0.json"
            record = json.loads(path.read_text()) if path.exists() else {}
            tail = (outdir / "job.log").read_text()[-3000:]
            for scenario in scenarios:
                results[scenario] = {"returncode": returncode, "stopped": record.get("stopped"),
                                     "result": record.get("scenarios", {}).get(scenario),
                                     "log": tail}
        yield results
    finally:
        for job, log, _ in jobs:
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait()
            log.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_cpu_atomic_on_a_stopped_pe_completes(outcomes):
    if native.built() is None:
        pytest.skip("the compiled piece is not built (pip install . builds it)")
    outcome = outcomes["atomic_fetch_add_by_cpu"]
    context = f"atomic_fetch_add_by_cpu: {outcome}"
    assert outcome["returncode"] is not None, f"the job hung past {JOB_LIMIT} s: {context}"
    assert outcome["stopped"] and outcome["result"] is not None, context
    assert outcome["result"]["error"] is None and outcome["result"]["elapsed"] < 1.0, context


@pytest.mark.parametrize("scenario", [s for job in JOBS for s in job
                                      if s != "atomic_fetch_add_by_cpu"])
def test_operation_on_a_stopped_pe_raises_peer_timeout(outcomes, scenario):
    outcome = outcomes[scenario]
    context = f"{scenario}: {outcome}"
    assert outcome["returncode"] is not None, f"the job hung past {JOB_LIMIT} s: {context}"
    assert outcome["stopped"], f"PE 1 was not seen stopped: {context}"
    result = outcome["result"]
    assert result is not None, f"PE 0 did not report: {context}"
    assert result["error"] == "PeerTimeoutError", context
    # names the PE, the operation and the setting
    assert "to PE 1" in result["message"] and "SHMEMVM_TIMEOUT" in result["message"], context
    assert scenario in result["message"], context
    # waited the configured time, not (much) longer and not for ever
    assert TIMEOUT - 0.1 <= result["elapsed"] <= TIMEOUT + MARGIN, context
    # the heap refuses further calls at once, and still finalizes
    assert result["second_error"] == "PeerTimeoutError", context
    assert "unusable" in result["second_message"], context
    assert result["second_elapsed"] < 1.0, context
    assert result["closed"] and result["finalize_elapsed"] < 5.0, context
