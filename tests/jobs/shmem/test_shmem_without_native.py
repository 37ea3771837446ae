"""The NumPy face works where the compiled piece is not there (a source tree
used without building it): its one-pass put/get/atomics must step aside for
the general paths, not call into a module that is missing. A 2-PE job whose
PEs hide the compiled piece before init, so the vote leaves every path pure
Python.

    python -m pytest -q -m "not mpi" tests/jobs/shmem/test_shmem_without_native.py
"""

import subprocess
import sys

from util import REPO, clean_env, mpiexec

JOB = r"""
import numpy as np
import shmemvm.native
shmemvm.native._native = None          # as if never built
import shmemvm.shmem as shmem
shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
from shmemvm.shmem import arrays
assert shmemvm.native.built() is None and not arrays.heap().native
x = shmem.zeros(8, dtype=np.int64)
c = shmem.zeros(1, dtype=np.int64)
shmem.barrier_all()
shmem.put(x[:4], np.arange(4, dtype=np.int64) + 10 * me, (me + 1) % n)
shmem.atomic_add(c, 1, 0)
shmem.barrier_all()
left = (me - 1) % n
assert x[:4].tolist() == [10 * left + i for i in range(4)], x
got = np.zeros(4, dtype=np.int64)
shmem.get(got, x[:4], (me + 1) % n)
assert got.tolist() == [10 * me + i for i in range(4)], got
assert shmem.atomic_fetch(c, 0) == n
shmem.barrier_all()
shmem.free(x)
shmem.finalize()
print(f"ok-{me}", flush=True)
"""


def test_the_numpy_face_without_the_compiled_piece():
    job = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", JOB], env=clean_env(),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert job.stdout.count("ok-0") == 1 and job.stdout.count("ok-1") == 1, job.stdout
