"""What MPICH leaves in /dev/shm when a job ends without MPI_Finalize.

MPICH's shared-memory transport makes one file per job and node,
/dev/shm/mpich_shm_<id>_<n> (2-3 MiB for a few ranks), and removes it in
MPI_Finalize. A job that ends without it (os._exit, MPI_Abort, which
`python -m mpi4py` calls on an uncaught exception, or a kill) leaves the file
behind: the test machine once held 260 of them (675 MB). The reliability
tests end many jobs that way on purpose, so the test session removes what
its jobs left (tests/conftest.py): the files made since the session started
that no live process maps or holds open, i.e. whose job is gone. A file of a
job still running, this session's own included, is kept.

    before = snapshot()
    ... start jobs, let them end ...
    removed = remove_orphans(before)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SHM = Path("/dev/shm")
PATTERN = "mpich_shm_*"
#: a file younger than this is left alone: its job may be between creating
#: and mapping it (MPICH opens, sizes, then maps)
GRACE_S = 5.0


def snapshot() -> set[str]:
    """The names of the MPICH files in /dev/shm now."""
    return {path.name for path in SHM.glob(PATTERN)}


def in_use() -> set[str]:
    """The /dev/shm files some live process maps or holds open (processes we
    cannot read, another user's, count as holding nothing of ours)."""
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(line.split("/dev/shm/", 1)[1].split(" ", 1)[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/"):].split(" ", 1)[0])
        except OSError:   # it ended meanwhile, or is not ours to read
            continue
    return used


def orphans(names=None) -> list[Path]:
    """Those of `names` (default: every MPICH file) that are ours, older than
    GRACE_S, and that no live process maps or holds open: their job is gone."""
    candidates = [SHM / name for name in (snapshot() if names is None else names)]
    used = in_use()
    now = time.time()
    found = []
    for path in candidates:
        try:
            status = path.stat()
        except FileNotFoundError:
            continue
        if (status.st_uid == os.getuid() and now - status.st_mtime >= GRACE_S
                and path.name not in used):
            found.append(path)
    return found


def remove_orphans(before: set[str], settle: bool = False) -> list[str]:
    """Remove the MPICH files made since `before` (snapshot()) whose job is
    gone; the names removed. `settle`: where a new file no process uses is
    younger than GRACE_S (a job that has just ended), wait that long and look
    again, so that the session's last job is cleaned up too."""
    removed = []
    for path in orphans(snapshot() - before):
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:   # another PE of this session removed it first
            pass
    if settle and GRACE_S > 0:
        unused = snapshot() - before - in_use()
        if unused:
            time.sleep(GRACE_S)
            removed += remove_orphans(before)
    return removed
