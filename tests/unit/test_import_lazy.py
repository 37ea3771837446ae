"""`import shmemvm` loads only what a heap needs (issue 33, item 13): the
optional parts (the NumPy face, Triton and the device layer, the CUDA and HIP
backends with their bindings) are imported where they are first used, so a
program that does not use them does not wait for them. In a process of its
own, since the test session itself imports them all."""

import subprocess
import sys

import pytest
from mpi4py import MPI

from util import REPO, clean_env

OPTIONAL = ("triton", "shmemvm.shmem", "shmemvm.triton", "shmemvm.device",
            "shmemvm.backends.cuda", "shmemvm.backends.hip", "cuda", "hip")


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own process")
def test_import_shmemvm_leaves_the_optional_parts_unimported():
    code = ("import sys, shmemvm\n"
            f"optional = {OPTIONAL!r}\n"
            "print(sorted(m for m in sys.modules if m in optional or m.startswith("
            "tuple(o + '.' for o in optional))))\n")
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
