"""The profile switch, SHMEMVM_PROFILE=1, in a process of its own: every call of
a heap's allocation path is timed. The step timings under MPI:
tests/mpi/core/test_profile.py.
"""

import subprocess
import sys

import pytest
from mpi4py import MPI

from util import REPO, clean_env

WORLD = MPI.COMM_WORLD


@pytest.mark.skipif(WORLD.Get_size() > 1, reason="starts its own process")
def test_shmemvm_profile_env_times_every_call():
    code = ("from mpi4py import MPI; from shmemvm import SymmetricHeap; from shmemvm.core import profile\n"
            "h = SymmetricHeap(MPI.COMM_WORLD, heap_size='4M', backend='host', timeout=30)\n"
            "h.free(h.malloc(1024)); t = profile.of(h._core).totals(); h.finalize()\n"
            "print(sorted(k for k in t if '/' not in k))\n")
    env = clean_env()
    env["SHMEMVM_PROFILE"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    steps = eval(out.stdout.strip().splitlines()[-1])
    assert {"agreement", "allocate", "tensor", "retire", "finish_free"} <= set(steps), steps
