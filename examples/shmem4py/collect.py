"""collect: PE i contributes i + 1 copies of i; every PE gets them all in PE order."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

me, npes = shmem.my_pe(), shmem.n_pes()

source = shmem.full(npes, me, dtype=np.int32)           # room for the largest share
target = shmem.full(npes * (npes + 1) // 2, -1, dtype=np.int32)

shmem.collect(target, source, me + 1)

expected = np.concatenate([np.full(i + 1, i, dtype=np.int32) for i in range(npes)])
ok = np.array_equal(target, expected)
shmem.barrier_all()
shmem.free(source)
shmem.free(target)
if not ok:
    print(f"PE {me}: FAILED: collected {target}, expected {expected}")
    sys.exit(1)
print(f"PE {me}: collect OK ({target.size} elements)")
