"""fcollect: every PE contributes 3 elements; every PE gets all of them in PE order."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

K = 3
me, npes = shmem.my_pe(), shmem.n_pes()

source = shmem.array(np.arange(K, dtype=np.int64) + 10 * me)
target = shmem.zeros(K * npes, dtype=np.int64)

shmem.fcollect(target, source)

expected = np.concatenate([np.arange(K) + 10 * i for i in range(npes)])
ok = np.array_equal(target, expected)
shmem.barrier_all()
shmem.free(source)
shmem.free(target)
if not ok:
    print(f"PE {me}: FAILED: collected {target}, expected {expected}")
    sys.exit(1)
print(f"PE {me}: fcollect OK")
