"""Rotating put and get: each PE puts its block to the next PE, then gets the
next PE's block, and checks both."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

N = 16
me, npes = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % npes, (me - 1) % npes

source = shmem.array(np.arange(N, dtype=np.int32) + 1000 * me)
target = shmem.zeros(N, dtype=np.int32)

shmem.put(target, source, right)             # rotate right with put
shmem.barrier_all()
put_ok = np.array_equal(target, np.arange(N, dtype=np.int32) + 1000 * left)

fetched = np.zeros(N, dtype=np.int32)        # a local array
shmem.get(fetched, source, right)            # rotate left with get
get_ok = np.array_equal(fetched, np.arange(N, dtype=np.int32) + 1000 * right)

half = np.zeros(N // 2, dtype=np.int32)      # part of a symmetric array: a slice
shmem.get(half, source[N // 2:], left)
slice_ok = np.array_equal(half, np.arange(N // 2, N, dtype=np.int32) + 1000 * left)

shmem.barrier_all()
shmem.free(source)
shmem.free(target)
if not (put_ok and get_ok and slice_ok):
    print(f"PE {me}: FAILED: put {put_ok}, get {get_ok}, slice get {slice_ok}")
    sys.exit(1)
print(f"PE {me}: rotated put and get OK")
