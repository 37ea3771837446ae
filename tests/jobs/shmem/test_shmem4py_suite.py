"""shmem4py 1.0's own test suite passes on shmemvm.shmem at 1, 2 and 4 PEs,
all but the tests that reach into shmem4py's C layer (C_LAYER in
tests/peers/shmem4py_suite/run.py, each with its reason).

The suite is not in this repository: run.py fetches the sdist at test time
(pip download, cached in $SHMEM4PY_SUITE_CACHE) and runs it unchanged through
a two-file `shmem4py` alias, all modules in one launch per PE count. It is a
NumPy-1 suite (shmem4py 1.0 itself needs NumPy < 2), so it runs with NumPy 1
(run.py --numpy1: pip-installed once into the cache) at 1 and 4 PEs, and at
2 PEs with this environment's NumPy, where only the two tests whose own code
needs NumPy 1 (NUMPY1_ONLY, run.py) may be counted apart. (A run at 2 PEs
with NumPy 1 as well was the same suite at the same count a second time.)
Single process: each run is a job of its own, ended at a deadline.

    python -m pytest -q -m "not mpi" tests/jobs/shmem/test_shmem4py_suite.py
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from util import REPO, clean_env, mpiexec, yield_when_oversubscribed

RUNNER = REPO / "tests" / "peers" / "shmem4py_suite" / "run.py"
LIMIT = 270          # seconds per run, under pytest-timeout's 300: a hang fails this test
#: tests the C layer keeps out (run.py's C_LAYER: 8 tests and test_ptr's 2)
C_LAYER_TESTS = 10


@pytest.mark.parametrize("n_pes,numpy1", [(1, True), (4, True), (2, False)],
                         ids=["n1-numpy1", "n4-numpy1", "n2-numpy-here"])
def test_shmem4py_suite_passes(tmp_path, n_pes, numpy1):
    result_file = tmp_path / "suite.json"
    command = [sys.executable, str(RUNNER), "--np", str(n_pes), "--python", sys.executable,
               "--mpirun", mpiexec(), "--shmemvm-dir", str(REPO), "--one-launch",
               "--timeout", "15", "--json", str(result_file)] + (["--numpy1"] if numpy1 else [])
    # 4 PEs on 2 cores: MPICH sleeps between polls (util.yield_when_oversubscribed)
    env = yield_when_oversubscribed(clean_env("30"), n_pes)
    job = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        pytest.fail(f"the suite at -n {n_pes} did not finish within {LIMIT} s:\n{output[-3000:]}")
    assert result_file.exists(), output[-4000:]
    totals = json.loads(result_file.read_text())["totals"]
    assert job.returncode == 0, output[-6000:]
    assert totals["c_layer"] == C_LAYER_TESTS, output[-6000:]
    assert totals["numpy1"] == 0 if numpy1 else totals["numpy1"] <= 2, output[-6000:]
    assert totals["passed"] == 110 - C_LAYER_TESTS - totals["numpy1"], output[-6000:]
