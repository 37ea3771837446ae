"""heap_bases() of a host heap outside Triton's interpreter (issue 33, item 11).

A Triton kernel over the host heap runs only in Triton's interpreter: without
TRITON_INTERPRET=1 on a machine without a GPU, its launch fails with Triton's
bare "0 active drivers". heap_bases() of a host heap, which every such kernel
is given, warns at once saying what to do. It warns instead of raising: the
table is also read by code that is not Triton (ctypes, the tests' address
checks), which keeps working. Each case is a process of its own, since
TRITON_INTERPRET is read from the environment.
"""

import subprocess
import sys

import pytest
from mpi4py import MPI

from util import REPO, clean_env

WORLD = MPI.COMM_WORLD
HINT = "set TRITON_INTERPRET=1 before importing triton"

CODE = """
import warnings
warnings.simplefilter("always")
from mpi4py import MPI
from shmemvm import SymmetricHeap
h = SymmetricHeap(MPI.COMM_WORLD, heap_size='4M', backend='host', timeout=30)
with warnings.catch_warnings(record=True) as seen:
    bases = h.heap_bases()
    again = h.heap_bases()
assert int(bases[h.my_pe]) != 0 and again is bases   # the table itself is unchanged
h.finalize()
for w in seen:
    print("WARNING", w.category.__name__, w.message)
print("count", len(seen))
"""


def run(interpret: str | None) -> str:
    env = clean_env()
    env.pop("TRITON_INTERPRET", None)
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    out = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(WORLD.Get_size() > 1, reason="starts its own process")
def test_host_heap_bases_outside_the_interpreter_says_what_to_do():
    out = run(None)
    assert "count 1" in out, out        # once per heap, not per call
    assert "RuntimeWarning" in out and HINT in out, out
    assert "host heap" in out and "interpreter" in out, out


@pytest.mark.skipif(WORLD.Get_size() > 1, reason="starts its own process")
@pytest.mark.parametrize("value", ["1", "true"])
def test_host_heap_bases_in_the_interpreter_is_silent(value):
    out = run(value)
    assert "count 0" in out, out
