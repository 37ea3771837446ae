"""Hello from every PE; each PE counts itself in on PE 0 with an atomic increment."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

me, npes = shmem.my_pe(), shmem.n_pes()
major, minor = shmem.info_get_version()
print(f"Hello from PE {me} of {npes} ({shmem.info_get_name()}, OpenSHMEM {major}.{minor})")

count = shmem.zeros(1, dtype=np.int64)
shmem.atomic_inc(count, 0)
shmem.barrier_all()
total = shmem.atomic_fetch(count, 0)
shmem.barrier_all()
shmem.free(count)

if not 0 <= me < npes or total != npes:
    print(f"PE {me}: FAILED: {total} PEs counted themselves in, expected {npes}")
    sys.exit(1)
