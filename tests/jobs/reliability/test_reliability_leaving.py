"""No PE waits for a PE that has left (issue 32, item 4): a PE that dies of an
exception nothing catches, leaves a `with shmemvm.init()` block on one, or is
interrupted (Ctrl-C, forwarded by hydra to every PE), says so at once; every
waiting PE raises PeerDeadError naming it, and the job ends, under either
launch form (`python app.py` and `python -m mpi4py app.py`), long before the
heap's timeout (100 s).

Not an `mpi` test: it starts its own jobs (tests/helpers/leaving_jobs.py) with
MPICH's mpiexec as a user does, each bounded by a subprocess timeout; a job that
outlives it is killed (its whole process group). Each scenario runs at 2 and 3
PEs as `python app.py`, and at 3 as `python -m mpi4py app.py` (the launch form
changes how the leaver ends, not how many PEs wait; a 2-PE run of that form too
proved nothing the 3-PE one does not, at CI's cost: issue 33, item 16).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from util import REPO, agreement_env, is_hydra, mpiexec

HELPER = REPO / "tests" / "helpers" / "leaving_jobs.py"
HEAP_TIMEOUT = 100      # the jobs' heap timeout
JOB_LIMIT = 60          # a job still running after this waits for the timeout: it hangs
LEAVER = 1


def _run(scenario: str, n_pes: int, module: bool, tmp: Path, interrupt: bool = False):
    launcher = mpiexec()
    if not is_hydra(launcher):
        pytest.skip(f"{launcher} is not MPICH's hydra (these jobs rely on how it ends a job)")
    outdir = tmp / f"{scenario}-{n_pes}-{'m' if module else 'p'}"
    outdir.mkdir()
    command = [launcher, "-n", str(n_pes), sys.executable,
               *(["-m", "mpi4py"] if module else []), str(HELPER), scenario, str(outdir)]
    with open(outdir / "job.log", "w") as log:
        job = subprocess.Popen(command, env=agreement_env(), stdout=log, stderr=subprocess.STDOUT,
                               cwd=REPO / "tests" / "helpers", start_new_session=True)
        try:
            if interrupt:
                until = time.monotonic() + JOB_LIMIT
                while not all((outdir / f"ready{pe}").exists() for pe in range(n_pes)):
                    assert time.monotonic() < until and job.poll() is None, \
                        (outdir / "job.log").read_text()[-3000:]
                    time.sleep(0.05)
                time.sleep(1.0)                      # every PE is in its wait
                job.send_signal(signal.SIGINT)       # Ctrl-C: hydra forwards it
            returncode = job.wait(timeout=JOB_LIMIT)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    records = {}
    for pe in range(n_pes):
        path = outdir / f"pe{pe}.json"
        if path.exists():
            import json
            records[pe] = json.loads(path.read_text())
    return returncode, records, (outdir / "job.log").read_text()[-4000:]


@pytest.fixture
def tmp():
    root = Path(tempfile.mkdtemp(prefix="shmemvm-leaving-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


#: (n_pes, module): `python app.py` at 2 and 3 PEs, `python -m mpi4py app.py` at 3
RUNS = [(2, False), (3, False), (3, True)]
RUN_IDS = ["2-python", "3-python", "3-python-m-mpi4py"]


@pytest.mark.parametrize("n_pes, module", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("scenario, exception", [("uncaught", "RuntimeError: boom"),
                                                 ("with-block", "ValueError: user bug")],
                         ids=["uncaught", "with-block"])
def test_a_pe_that_leaves_on_an_exception_is_named_and_the_job_ends(tmp, scenario, exception,
                                                                    n_pes, module):
    returncode, records, log = _run(scenario, n_pes, module, tmp)
    context = f"{scenario} at {n_pes} PEs, module={module}: {records}\n{log}"
    assert returncode is not None, f"the job hung past {JOB_LIMIT} s: {context}"
    assert returncode != 0, context                   # it died of an exception
    for pe in range(n_pes):
        if pe == LEAVER:
            continue
        assert pe in records, f"PE {pe} did not report: {context}"
        record = records[pe]
        assert record["error"] == "PeerDeadError", context
        assert f"PE {LEAVER} has left" in record["message"], context
        assert exception in record["message"], context
        assert record["elapsed"] < HEAP_TIMEOUT / 2, context   # not the timeout
    assert f"{exception}" in log                      # the leaver's traceback is printed


@pytest.mark.parametrize("n_pes, module", RUNS, ids=RUN_IDS)
def test_ctrl_c_ends_the_job(tmp, n_pes, module):
    returncode, _, log = _run("sigint", n_pes, module, tmp, interrupt=True)
    assert returncode is not None, f"the job hung past {JOB_LIMIT} s after Ctrl-C:\n{log}"
    assert returncode != 0, log
    assert "KeyboardInterrupt" in log, log
    assert "PeerTimeoutError" not in log, log         # nobody waited for the timeout
