"""The device-side API (shmemvm.triton) in one process: heap_bases() of a
finalized heap, the kernels compiled (not run) for sm_90 and gfx942, and a
wait bounded by time. Kernels on the heap, in Triton's interpreter under MPI,
are tests/mpi/device/test_triton.py.

    python -m pytest -q -m "not mpi" tests/unit/device/test_triton_one_process.py

Needs triton (pip install triton); skipped without it.
"""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")
import triton.language as tl  # noqa: E402
from mpi4py import MPI  # noqa: E402

from shmemvm import SymmetricHeap  # noqa: E402
from shmemvm import triton as sv  # noqa: E402

# conftest.py turns the interpreter on for host-backend runs (before triton is imported)
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs in Triton's interpreter: host-backend test runs "
                                       "only (tests/conftest.py sets TRITON_INTERPRET=1)")


def test_heap_bases_of_a_finalized_heap_raises():
    from shmemvm import ShmemError
    h = SymmetricHeap(MPI.COMM_SELF, heap_size="1M", backend="host", timeout=30)
    h.finalize()
    with pytest.raises(ShmemError, match="finalized"):
        h.heap_bases()


# -- the compiled path ------------------------------------------------------------------------
def test_device_functions_compile_for_cuda_and_hip():
    """Every device function and the host atomics' kernel, lowered to machine code
    for an H100/H200 (sm_90) and an MI300 (gfx942) without a GPU: what the
    interpreter cannot check (the types the compiler insists on, loops,
    constexpr branches) fails here. In a process of its own, since kernels are
    interpreted in this one."""
    import subprocess
    import sys

    from util import REPO, clean_env

    env = clean_env()
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, str(REPO / "tests/helpers/triton_compile.py")],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "cuda ok" in result.stdout and "hip ok" in result.stdout, result.stdout


@triton.jit
def wait_polls(sig, out, value, max_polls):
    tl.store(out, sv.signal_wait_until(sig, sv.CMP_EQ, value, max_polls))


def test_max_polls_for_bounds_a_wait_by_time():
    import time
    polls = sv.max_polls_for(0.2, "cpu")
    assert polls >= 1 and sv.max_polls_for(0.4, "cpu") >= polls   # one rate per device
    sig = torch.zeros(1, dtype=torch.int64)
    out = torch.full((1,), -1, dtype=torch.int64)
    start = time.perf_counter()
    wait_polls[(1,)](sig, out, 7, polls)      # never true: gives up after about 0.2 s
    assert out.item() == 0
    assert time.perf_counter() - start < 20   # a bound, not a hang (CI machines are noisy)
    with pytest.raises(ValueError, match="> 0"):
        sv.max_polls_for(0, "cpu")
