"""A job that ends without MPI_Finalize leaves MPICH's /dev/shm/mpich_shm_*
file (2-3 MiB; issue 32 item 17): the test session removes those its jobs
left (tests/helpers/mpich_shm.py, run by tests/conftest.py), and only files
whose job is gone."""

import mmap
import os
import subprocess
import sys
import uuid

import pytest

from helpers import mpich_shm
from util import clean_env, mpiexec


@pytest.fixture
def no_grace(monkeypatch):
    monkeypatch.setattr(mpich_shm, "GRACE_S", 0.0)


def _fake(tag: str):
    path = mpich_shm.SHM / f"mpich_shm_shmemvmtest{tag}{uuid.uuid4().hex[:8]}_0"
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    return path


def test_only_new_files_of_jobs_that_are_gone_are_removed(no_grace):
    old = _fake("old")                       # there before: not this session's
    try:
        before = mpich_shm.snapshot()
        mapped, opened, orphan = _fake("mapped"), _fake("open"), _fake("orphan")
        with open(mapped, "r+b") as handle:
            view = mmap.mmap(handle.fileno(), mmap.PAGESIZE)   # mapped, its fd closed below
        fd = os.open(opened, os.O_RDWR)      # held open, not mapped
        try:
            removed = mpich_shm.remove_orphans(before)
            assert removed == [orphan.name], removed
            assert mapped.exists() and opened.exists() and old.exists()
        finally:
            view.close()
            os.close(fd)
        assert sorted(mpich_shm.remove_orphans(before)) == sorted([mapped.name, opened.name])
        assert old.exists()
    finally:
        for path in mpich_shm.SHM.glob("mpich_shm_shmemvmtest*"):
            path.unlink()


@pytest.mark.skipif(os.environ.get("PMI_RANK") is not None, reason="starts its own job")
def test_a_job_ending_without_finalize_leaves_a_file_that_is_then_removed(no_grace):
    before = mpich_shm.snapshot()
    code = "from mpi4py import MPI; import os; MPI.COMM_WORLD.Barrier(); os._exit(0)"
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", code], env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    left = mpich_shm.snapshot() - before
    if not left:
        pytest.skip("this MPI left no /dev/shm/mpich_shm_* file (not MPICH's shared memory)")
    removed = mpich_shm.remove_orphans(before)
    # (what stays is another job's, running now: the first test shows which stay)
    assert removed and set(removed) <= set(left), (left, removed)
    assert not set(removed) & mpich_shm.snapshot()
