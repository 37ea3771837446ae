"""A counter on PE 0 that every PE increments with a plain get and put
(read-modify-write, not atomic) inside a critical section: with the lock no
increment is lost. Once with set_lock/clear_lock, once with a Lock object."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

ROUNDS = 25
me, npes = shmem.my_pe(), shmem.n_pes()

counter = shmem.zeros(1, dtype=np.int64)
value = np.zeros(1, dtype=np.int64)

lock = shmem.new_lock()
for _ in range(ROUNDS):
    shmem.set_lock(lock)
    shmem.get(value, counter, 0)
    value += 1
    shmem.put(counter, value, 0)
    shmem.clear_lock(lock)                   # completes the put first
shmem.barrier_all()
first = shmem.atomic_fetch(counter, 0)

lock_object = shmem.Lock()
for _ in range(ROUNDS):
    with lock_object:
        shmem.get(value, counter, 0)
        value += 1
        shmem.put(counter, value, 0)
shmem.barrier_all()
second = shmem.atomic_fetch(counter, 0)

shmem.barrier_all()
lock_object.destroy()
shmem.del_lock(lock)
shmem.free(counter)
if first != ROUNDS * npes or second != 2 * ROUNDS * npes:
    print(f"PE {me}: FAILED: counter {first} then {second}, expected {ROUNDS * npes} then "
          f"{2 * ROUNDS * npes}")
    sys.exit(1)
if me == 0:
    print(f"lock counter: {second} increments, none lost")
