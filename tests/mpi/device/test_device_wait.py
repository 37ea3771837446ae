"""Device-side waits with a deadline in time: signal_wait_until gives up after
about the seconds a shmemvm.triton.Deadline was made with, and reports it in
the deadline's status word, which the host reads and raises PeerTimeoutError
from. A kernel cannot raise, and a peer that never signals must not hang it.

On the host heap the kernels run in Triton's interpreter (CI); with
SHMEMVM_TEST_BACKEND=cuda the same file runs compiled, one GPU per PE:

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/device/test_device_wait.py
    SHMEMVM_TEST_BACKEND=cuda mpirun -n 2 python -m pytest -q -p no:cacheprovider \\
        --with-mpi -m mpi tests/mpi/device/test_device_wait.py

Needs triton (pip install triton); skipped without it.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")
import triton.language as tl  # noqa: E402

from shmemvm import PeerTimeoutError  # noqa: E402
from shmemvm import triton as sv  # noqa: E402

BACKEND = os.environ.get("SHMEMVM_TEST_BACKEND", "host")
pytestmark = pytest.mark.skipif(
    (BACKEND == "host") != (os.environ.get("TRITON_INTERPRET") == "1"),
    reason="the host heap runs kernels in Triton's interpreter (TRITON_INTERPRET=1), device "
           "heaps run them compiled")


@triton.jit
def wait_kernel(sig, out, value, max_polls, status):
    tl.store(out, sv.signal_wait_until(sig, sv.CMP_EQ, value, max_polls, status))


@triton.jit
def signal_kernel(sig, value, me, pe, heap_bases):
    sv.signal_set(sig, value, me, pe, heap_bases)


def wait(sig, value, deadline) -> tuple[int, float]:
    """(the value the wait returned, seconds it took), the kernel finished."""
    out = torch.full((1,), -1, dtype=sig.dtype, device=sig.device)
    start = time.perf_counter()
    wait_kernel[(1,)](sig, out, value, deadline.max_polls, deadline.status)
    seen = out.item()                       # waits for the kernel
    return seen, time.perf_counter() - start


@pytest.mark.mpi
def test_a_wait_never_met_gives_up_in_time_and_the_host_raises(heap):
    sig = heap.zeros(1, torch.int64)
    deadline = sv.Deadline(0.5, heap.device)
    assert deadline.timeout == 0.5 and deadline.max_polls >= 1
    wait(sig, 1, deadline)                   # compiled outside the timing (on GPUs)
    deadline.reset()
    seen, took = wait(sig, 1, deadline)
    assert seen == 0
    assert deadline.timed_out
    with pytest.raises(PeerTimeoutError, match="0.5 s"):
        deadline.check()
    # about the time asked for: polls are counted, at a rate measured once per device
    assert 0.05 < took < 20, took
    deadline.reset()
    assert not deadline.timed_out
    deadline.check()
    heap.barrier_all()


@pytest.mark.mpi
def test_a_wait_met_leaves_the_status_clear(heap):
    me, n = heap.my_pe, heap.n_pes
    sig = heap.zeros(1, torch.int64)
    deadline = sv.Deadline(20, heap.device)
    heap.barrier_all()
    signal_kernel[(1,)](sig, 7, me, (me + 1) % n, heap.heap_bases())
    seen, _ = wait(sig, 7, deadline)
    assert seen == 7
    deadline.synchronize()                   # nothing to raise
    assert not deadline.timed_out
    heap.barrier_all()


@pytest.mark.mpi(min_size=2)
def test_a_pe_that_never_signals_makes_its_consumer_raise_instead_of_hang(heap):
    me = heap.my_pe
    sig = heap.zeros(1, torch.int32)
    deadline = sv.Deadline(0.3, heap.device)
    heap.barrier_all()
    if me == 1:                               # PE 0 does not signal in round 1
        wait(sig, 1, deadline)
        with pytest.raises(PeerTimeoutError):
            deadline.synchronize()
        deadline.reset()
    heap.barrier_all()
    if me == 0:                               # round 2: it does
        signal_kernel[(1,)](sig, 2, 0, 1, heap.heap_bases())
    elif me == 1:
        deadline = sv.Deadline(20, heap.device)
        assert wait(sig, 2, deadline)[0] == 2
        deadline.synchronize()
    heap.barrier_all()


@pytest.mark.mpi
def test_max_polls_alone_still_bounds_a_wait_without_a_status_word(heap):
    sig = heap.zeros(1, torch.int64)
    out = torch.full((1,), -1, dtype=torch.int64, device=heap.device)
    wait_kernel[(1,)](sig, out, 3, 5, None)   # 5 reads, nowhere to report
    assert out.item() == 0
    heap.barrier_all()
