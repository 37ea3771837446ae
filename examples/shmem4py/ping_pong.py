"""Ping-pong between PE 0 and the last PE (PE 0 with itself on one PE): the
ball goes over with put, a flag set with an atomic after a fence says it
arrived, and the other side sends it back doubled."""
import sys

import numpy as np

from shmemvm import shmem  # under shmem4py: from shmem4py import shmem

ROUNDS = 20
me, npes = shmem.my_pe(), shmem.n_pes()
ping, pong = 0, npes - 1

ball = shmem.zeros(1, dtype=np.int64)        # written at the pong side
reply = shmem.zeros(1, dtype=np.int64)       # written at the ping side
ping_flag = shmem.zeros(1, dtype=np.int64)
pong_flag = shmem.zeros(1, dtype=np.int64)
errors = 0

for i in range(1, ROUNDS + 1):
    if me == ping:
        shmem.put(ball, np.array([i], dtype=np.int64), pong)
        shmem.fence()                        # the ball lands before the flag
        shmem.atomic_set(ping_flag, i, pong)
    if me == pong:
        shmem.wait_until(ping_flag, shmem.CMP_EQ, i)
        if ball[0] != i:
            errors += 1
        shmem.put(reply, 2 * ball, ping)
        shmem.fence()
        shmem.atomic_set(pong_flag, i, ping)
    if me == ping:
        shmem.wait_until(pong_flag, shmem.CMP_EQ, i)
        if reply[0] != 2 * i:
            errors += 1

shmem.barrier_all()
for array in (ball, reply, ping_flag, pong_flag):
    shmem.free(array)
if errors:
    print(f"PE {me}: FAILED: {errors} wrong balls")
    sys.exit(1)
if me == ping:
    print(f"ping-pong: {ROUNDS} rounds between PE {ping} and PE {pong}")
