"""pi as the integral of 4/(1+x^2) over [0, 1]: each PE sums every n_pes-th
interval, a sum reduction adds the parts on every PE."""
import math
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

INTERVALS = 1_000_000
me, npes = shmem.my_pe(), shmem.n_pes()

h = 1.0 / INTERVALS
x = h * (np.arange(me, INTERVALS, npes, dtype=np.float64) + 0.5)
part = shmem.array([h * np.sum(4.0 / (1.0 + x * x))])
pi = shmem.zeros(1)

shmem.sum_reduce(pi, part)

error = abs(pi[0] - math.pi)
shmem.barrier_all()
shmem.free(part)
ok = error < 1e-9
value = float(pi[0])
shmem.free(pi)
if not ok:
    print(f"PE {me}: FAILED: pi = {value!r}, off by {error}")
    sys.exit(1)
if me == 0:
    print(f"pi = {value:.12f} on {npes} PEs (error {error:.1e})")
