"""OpenSHMEM's info_get_version/name, pcontrol and global_exit, from one
process: global_exit in a 2-PE job of its own ends every PE. The routines
under MPI: tests/mpi/openshmem/test_openshmem_sync.py.
"""

import subprocess
import sys
import time

import pytest

import shmemvm
from util import REPO, clean_env, mpiexec


# -- info, pcontrol, global_exit ----------------------------------------------------------------
def test_info_and_pcontrol():
    assert shmemvm.info_get_version() == (1, 5)
    assert shmemvm.info_get_name() == f"shmemvm {shmemvm.__version__}"
    shmemvm.pcontrol(0)
    assert shmemvm.openshmem.info.pcontrol_level() == 0
    shmemvm.pcontrol(1)
    assert shmemvm.openshmem.info.pcontrol_level() == 1
    with pytest.raises(TypeError, match="level must be an int"):
        shmemvm.pcontrol("on")
    with pytest.raises(TypeError, match="status must be an int"):
        shmemvm.global_exit(1.0)


GLOBAL_EXIT_JOB = """
import time, shmemvm
shmemvm.init(heap_size="1M", backend="host", timeout=120)
if shmemvm.my_pe() == 0:
    time.sleep(0.3)
    shmemvm.global_exit(3)
shmemvm.barrier_all()        # PE 1 waits here until global_exit ends the job
print("PE", shmemvm.my_pe(), "passed the barrier", flush=True)
"""

def test_global_exit_ends_every_pe():
    launcher = mpiexec()
    start = time.monotonic()
    job = subprocess.run([launcher, "-n", "2", sys.executable, "-c", GLOBAL_EXIT_JOB],
                         env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=90)
    elapsed = time.monotonic() - start
    assert job.returncode != 0, job.stdout + job.stderr
    assert "passed the barrier" not in job.stdout
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end"
