"""global_exit ends the whole job at once, with an exit code that is nonzero
whenever the status is: status & 255, or 1 where that is 0 (issue 25, item 7).

How each status becomes an exit code (openshmem.info.exit_code) is checked in
this process, for every status below. Not an `mpi` test: the jobs start their
own job in which the last PE calls global_exit(status) (the torch face's or the
NumPy face's) while any other PE sleeps far longer than the test waits; the job
must end promptly with that code. One case of each face runs at 2 PEs (the
sleeping PE is ended too); at 1 PE, the codes the launcher must pass on as they
are (0, 255, and 7 from a status beyond a C int). The other statuses took a job
each to prove the same path with another number (issue 33, item 16: CI's time).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from util import REPO, clean_env, mpiexec

JOB = """
import sys, time
from mpi4py import MPI
status = eval(sys.argv[1])
if sys.argv[2] == "shmem":
    from shmemvm import shmem
    exit_ = shmem.global_exit
else:
    import shmemvm
    exit_ = shmemvm.global_exit
if MPI.COMM_WORLD.Get_rank() == MPI.COMM_WORLD.Get_size() - 1:
    exit_(status)
time.sleep(120)     # the other PEs: only global_exit ends them
"""

CASES = [("3", 3), ("256", 1), ("512", 1), ("257", 1), ("2**40", 1), ("2**40 + 7", 7),
         ("-1", 255), ("0", 0)]


@pytest.mark.parametrize("status, code", CASES, ids=[status for status, _ in CASES])
def test_a_status_becomes_its_low_byte_or_1_where_that_is_0(status, code):
    from shmemvm.openshmem.info import exit_code

    assert exit_code(eval(status)) == code


#: the jobs: at 2 PEs one of each face (3 through the torch face; 512, whose low byte
#: is 0, through the NumPy face's, the same call); at 1 PE the codes 0 and 255, and 7
#: from a status beyond a C int
RUNS = [("torch", "3", 3), ("shmem", "512", 1), ("torch", "0", 0), ("torch", "-1", 255),
        ("torch", "2**40 + 7", 7)]
#: the cases that run at 2 PEs (the others at 1): one of each face
TWO_PES = {("torch", "3"), ("shmem", "512")}


@pytest.mark.parametrize("face, status, code", RUNS, ids=[f"{f}-{s}" for f, s, _ in RUNS])
def test_global_exit_ends_the_job_with_a_nonzero_code_for_a_nonzero_status(face, status, code):
    n_pes = 2 if (face, status) in TWO_PES else 1
    start = time.monotonic()
    job = subprocess.Popen([mpiexec(), "-n", str(n_pes), sys.executable, "-c", JOB, status, face],
                           env=clean_env(), cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        pytest.fail(f"global_exit({status}) did not end the job")
    elapsed = time.monotonic() - start
    assert job.returncode == code, (job.returncode, output[-3000:])
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"
