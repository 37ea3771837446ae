"""shmemvm.triton.Deadline in one process: its seconds default to SHMEMVM_TIMEOUT,
more seconds give more polls, and none or negative seconds are refused. Waits
that give up at a deadline, under MPI: tests/mpi/device/test_device_wait.py.

Needs triton (pip install triton); skipped without it.
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")
from shmemvm import triton as sv  # noqa: E402

BACKEND = os.environ.get("SHMEMVM_TEST_BACKEND", "host")
pytestmark = pytest.mark.skipif(
    (BACKEND == "host") != (os.environ.get("TRITON_INTERPRET") == "1"),
    reason="the host heap runs kernels in Triton's interpreter (TRITON_INTERPRET=1), device "
           "heaps run them compiled")


@pytest.mark.skipif(BACKEND != "host", reason="times the interpreter's polls (device cpu)")
def test_deadline_takes_shmemvm_timeout_and_refuses_none_positive(monkeypatch):
    monkeypatch.setenv("SHMEMVM_TIMEOUT", "2.5")
    assert sv.Deadline(device="cpu").timeout == 2.5
    assert sv.Deadline(1, "cpu").max_polls <= sv.Deadline(4, "cpu").max_polls
    for bad in (0, -1):
        with pytest.raises(ValueError, match="> 0"):
            sv.Deadline(bad, "cpu")
