"""Every PE races to write its number into a slot on PE 0 with compare-and-swap;
exactly one wins, and every PE agrees which."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

me, npes = shmem.my_pe(), shmem.n_pes()

winner = shmem.full(1, -1, dtype=np.int64)
old = shmem.atomic_compare_swap(winner, -1, me, 0)
won = old == -1
shmem.barrier_all()

champion = shmem.atomic_fetch(winner, 0)
wins = shmem.array([1 if won else 0], dtype=np.int64)
total = shmem.zeros(1, dtype=np.int64)
shmem.sum_reduce(total, wins)

ok = total[0] == 1 and 0 <= champion < npes and won == (champion == me)
shmem.barrier_all()
count = int(total[0])
for array in (winner, wins, total):
    shmem.free(array)
if not ok:
    print(f"PE {me}: FAILED: {count} winners, slot says PE {champion}, this PE won: {won}")
    sys.exit(1)
if won:
    print(f"PE {me} won the race")
