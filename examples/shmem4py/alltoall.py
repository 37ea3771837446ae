"""alltoall: PE i sends block j (value 100*i + j) to PE j, which keeps it as its block i."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

K = 4
me, npes = shmem.my_pe(), shmem.n_pes()

source = shmem.empty(K * npes, dtype=np.int64)
for j in range(npes):
    source[j * K:(j + 1) * K] = 100 * me + j
target = shmem.full(K * npes, -1, dtype=np.int64)
shmem.barrier_all()

shmem.alltoall(target, source, K)

expected = np.repeat(100 * np.arange(npes) + me, K)
ok = np.array_equal(target, expected)
shmem.barrier_all()
shmem.free(source)
shmem.free(target)
if not ok:
    print(f"PE {me}: FAILED: received {target}, expected {expected}")
    sys.exit(1)
print(f"PE {me}: alltoall OK")
