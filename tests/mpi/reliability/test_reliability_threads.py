"""Issue 25, item 2: collectives on different teams from different threads
(THREAD_MULTIPLE) complete. Each team's collectives hold the team's own lock
(group.Group.lock), not the heap's: one heap-wide lock held while a team
collective waits for its members made each thread's collective time out.

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/reliability/test_reliability_threads.py
"""

from __future__ import annotations

import threading

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import SymmetricHeap

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_collectives_on_two_teams_from_two_threads_complete():
    """THREAD_MULTIPLE: thread A reduces over team X, thread B syncs and reduces
    over team Y, at the same time; the two teams' orders differ between PEs.
    Each thread's collective timed out when one heap-wide lock was held while
    a team collective waited for its members."""
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        pytest.skip("MPI was not initialised at THREAD_MULTIPLE")
    heap = SymmetricHeap(world, heap_size="8M", backend="host", timeout=5,
                         thread_level=shmemvm.THREAD_MULTIPLE)
    try:
        world_team = heap.team_world()
        x = heap.team_split_strided(world_team, 0, 1, heap.n_pes)
        y = heap.team_split_strided(world_team, 0, 1, heap.n_pes)
        src_x, dst_x = heap.zeros(4, torch.int64), heap.zeros(4, torch.int64)
        src_y, dst_y = heap.zeros(4, torch.int64), heap.zeros(4, torch.int64)
        src_x.fill_(1)
        src_y.fill_(2)
        heap.barrier_all()
        errors = []

        def run(team, dst, src):
            try:
                for _ in range(20):
                    team.sync()
                    team.reduce(dst, src, "sum")
            except Exception as exc:  # noqa: BLE001 - judged below
                errors.append(exc)

        first, second = ((x, dst_x, src_x), (y, dst_y, src_y))
        if heap.my_pe % 2:            # the two threads start in the other order on odd PEs
            first, second = second, first
        threads = [threading.Thread(target=run, args=args, daemon=True)
                   for args in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads), "a thread hung"
        assert not errors, errors
        assert dst_x.tolist() == [heap.n_pes] * 4 and dst_y.tolist() == [2 * heap.n_pes] * 4
    finally:
        heap.finalize()
