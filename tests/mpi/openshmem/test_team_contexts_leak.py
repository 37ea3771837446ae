"""A team's contexts, made and destroyed many times, leave the team's
bookkeeping flat (issue 32 item 10: every destroyed context stayed in the
team's list, about 500 B each).

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_team_contexts_leak.py
"""

import gc

import pytest

from shmemvm.openshmem.contexts import Ctx

CYCLES = 2000


def _live_contexts() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, Ctx))


@pytest.mark.mpi(min_size=1)
def test_team_contexts_made_and_destroyed_leave_nothing_behind(heap):
    team = heap.team_world().split_strided(0, 1, heap.n_pes)
    held = team.create_ctx()          # one context that stays: it must stay counted
    before = _live_contexts()
    for _ in range(CYCLES):
        context = team.create_ctx()
        context.destroy()
    del context
    after = _live_contexts()
    assert after == before, f"{after - before} of {CYCLES} destroyed contexts are still alive"
    with team.create_ctx() as scoped:   # a context manager's exit destroys it too
        assert scoped is not held
    del scoped
    assert _live_contexts() == before
    team.destroy()                     # destroys `held` with the team
    with pytest.raises(Exception, match="destroyed"):
        held.quiet()
