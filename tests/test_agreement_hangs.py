"""No wait without a deadline: a PE that is late for init, never calls it, or
computes past the timeout while a dropped tensor waits to be freed ends the
job with PeerTimeoutError instead of a hang.

Not an `mpi` test: it starts its own small jobs side by side,

    mpiexec -n 2 python -m mpi4py tests/helpers/agreement_hang.py SCENARIO TIMEOUT OUTDIR

(see the helper), and runs in the single-process pass of tests/run_all.sh.
`python -m mpi4py` aborts the job on an uncaught exception, so mpiexec must
exit nonzero right after the first PE's PeerTimeoutError.
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

REPO = Path(__file__).resolve().parent.parent
HELPER = REPO / "tests" / "helpers" / "agreement_hang.py"
TIMEOUT = 2.0          # SHMEMVM_TIMEOUT of the jobs
MARGIN = 2.0           # scheduling slack on 2 cores with 6 processes
EXIT_SLACK = 5.0       # from the first PE's error to mpiexec's exit
JOB_LIMIT = 90         # seconds: a job that takes longer than this hangs
SCENARIOS = ("late-init", "no-init", "gc")


def _mpiexec() -> str:
    for candidate in (os.environ.get("MPIEXEC"), str(Path(sys.executable).parent / "mpiexec"),
                      shutil.which("mpiexec")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no mpiexec found (set MPIEXEC)")


def _clean_env() -> dict[str, str]:
    """Our environment minus what an enclosing MPI launch put there."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPI_LOCALRANKID",
                                "MPI_LOCALNRANKS", "OMPI_", "SHMEMVM_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="module")
def outcomes():
    mpiexec = _mpiexec()
    root = Path(tempfile.mkdtemp(prefix="shmemvm-agreement-hang-"))
    jobs = {}
    try:
        for scenario in SCENARIOS:
            outdir = root / scenario
            outdir.mkdir()
            log = open(outdir / "job.log", "w")
            command = [mpiexec, "-n", "2", sys.executable, "-m", "mpi4py", str(HELPER),
                       scenario, f"{TIMEOUT:g}", str(outdir)]
            jobs[scenario] = (subprocess.Popen(command, env=_clean_env(), stdout=log,
                                               stderr=subprocess.STDOUT, cwd=REPO,
                                               start_new_session=True), log, time.monotonic())
        results = {}
        for scenario, (job, log, started) in jobs.items():
            try:
                returncode = job.wait(timeout=max(1.0, JOB_LIMIT - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, 9)
                job.wait()
                returncode = None
            ended = time.time()
            log.close()
            outdir = root / scenario
            records = {pe: json.loads((outdir / f"pe{pe}.json").read_text())
                       for pe in (0, 1) if (outdir / f"pe{pe}.json").exists()}
            results[scenario] = {"returncode": returncode, "ended": ended, "records": records,
                                 "log": (outdir / "job.log").read_text()[-3000:]}
        yield results
    finally:
        for job, log, _ in jobs.values():
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait()
            log.close()
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
    for record in records.values():
        _timed_out(record, context)
        assert "barrier_all() (your collective call #3)" in record["message"], context
    # PE 1 arrived after PE 0 had given up: its allreduce completed, the gather did not
    assert "freeing blocks dropped on every PE" in records[1]["message"], context
    assert result["ended"] - records[1]["end"] <= EXIT_SLACK, context
