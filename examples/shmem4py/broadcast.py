"""Broadcast from the last PE to every PE."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

N = 10
me, npes = shmem.my_pe(), shmem.n_pes()
root = npes - 1

source = shmem.full(N, -1.0)
if me == root:
    source[:] = np.linspace(0.0, 1.0, N)
target = shmem.zeros(N)
shmem.barrier_all()                          # root's source is ready

shmem.broadcast(target, source, root)

# OpenSHMEM 1.5 also writes root's target; 1.4 libraries leave it: check the others
ok = me == root or np.allclose(target, np.linspace(0.0, 1.0, N))
shmem.free(source)
shmem.free(target)
if not ok:
    print(f"PE {me}: FAILED: received {target}")
    sys.exit(1)
print(f"PE {me}: broadcast from PE {root} OK")
