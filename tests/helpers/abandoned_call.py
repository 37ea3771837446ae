"""Run by tests/jobs/reliability/test_reliability_abandoned.py as its own small MPI job:

    mpiexec -n 3 python abandoned_call.py SCENARIO TIMEOUT STOP OUTDIR AGREEMENT [SPLIT]

A PE stopped past the others' timeout (issue 25, item 3). The last PE stops
itself (SIGSTOP; a child process sends SIGCONT after STOP seconds) just
before the collective SCENARIO names; the others make it at once. Every PE
writes OUTDIR/pe<N>.json: what the call raised (or that it returned) and
after how long (the stopped PE counts from when it was resumed), what a
second call raised, and how long finalize() took. AGREEMENT is
SHMEMVM_AGREEMENT (mpi or board); SPLIT, where given, is node_split=.

Scenarios: malloc (malloc(64), of a chunk already there), malloc-segment
(malloc of a new segment, whose memory the PEs exchange), barrier
(barrier_all()), team-sync (sync() of a team split from the world team, whose
agreement is the team's own); fcollect, reduce, broadcast, alltoall (8 bytes
a PE: on the board in C, the data in the agreed step, transport/nodecoll.py);
numpy-alltoall (the NumPy face's, on the default heap, made twice before: the
late call replays its Plan, and `replayed` says whether it did).

Every PE leaves with os._exit once every PE has reported (or after a while):
MPI's finalization could wait for requests a timed-out step left behind.

    mpiexec -n 3 python abandoned_call.py cases TIMEOUT OUTDIR \
        NAME:SCENARIO:STOP:AGREEMENT[:SPLIT]...

runs several calls one after another in one job, each on a heap of its own
(finalized, and every PE past an MPI barrier, before the next is made: the last
PE, stopped, arrives STOP - TIMEOUT s after the others gave up), recording into
OUTDIR/NAME/pe<N>.json as a job of its own would: one start-up of the PEs instead
of one per call (issue 33, item 16). A timed-out step leaves requests pending on
its heap's own communicators only (a duplicate of COMM_WORLD each), which the
next heap does not use.
"""

import faulthandler
import os
import signal
import subprocess
import sys
import time

from mpi4py import MPI

import shmemvm
from job_records import finalize_into, finish, next_case, record
from shmemvm import SymmetricHeap, rc
from shmemvm.core.state import core_of
from shmemvm.openshmem.barrier import BARRIER_ALL
from shmemvm.transport import nodecoll

rc(initialize=False, finalize=False)   # (a numpy- scenario makes the NumPy face's heap)
from shmemvm import shmem  # noqa: E402


def stop_for(seconds: float) -> None:
    """SIGSTOP this process; a child resumes it `seconds` later."""
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)


def call(scenario: str, timeout: float, stop: float, agreement: str,
         split: int | None):
    """A heap, the scenario's call on it with the last PE stopped for `stop` s
    just before, and a second call: (the heap, this PE's fields)."""
    options = dict(heap_size="4M", backend="host", timeout=timeout, agreement=agreement,
                   node_split=split)
    numpy_face = scenario.startswith("numpy-")
    # (the NumPy face acts on the default heap: init() makes it)
    heap = shmemvm.init(MPI.COMM_WORLD, **options) if numpy_face else \
        SymmetricHeap(MPI.COMM_WORLD, **options)
    me, n = heap.my_pe, heap.n_pes
    team = heap.team_split_strided(heap.team_world(), 0, 1, n) if scenario == "team-sync" \
        else None
    kept = heap.malloc(64)   # noqa: F841 - its chunk makes the malloc(64) below a cached one
    small = {"fcollect": lambda: heap.fcollect(gathered, source),
             "reduce": lambda: heap.reduce(gathered[:8], source),
             "broadcast": lambda: heap.broadcast(gathered[:8], source, 0),
             "alltoall": lambda: heap.alltoall(gathered, spread)}
    replayed: list = []
    stepwise: list = []
    if numpy_face:   # the NumPy face's alltoall, made twice: the call below replays its Plan
        arrays = [shmem.zeros(n, dtype="q") for _ in range(2)]
        small["numpy-alltoall"] = lambda: shmem.alltoall(arrays[0], arrays[1])
        real = nodecoll.replay
        nodecoll.replay = lambda h, plan: (replayed.append(True), real(h, plan))[1]
        # the steps of a replay that its quick step left to Python (nodecoll.staged)
        staged = nodecoll.staged
        nodecoll.staged = lambda h, plan: (stepwise.append(True), staged(h, plan))[1]
        for _ in range(2):
            small[scenario]()
        replayed.clear()
        stepwise.clear()
    elif scenario in small:   # warmed up: the call below is the fused one
        source, gathered, spread = heap.malloc(8), heap.malloc(8 * n), heap.malloc(8 * n)
        small[scenario]()
    heap.barrier_all()
    # whether the barrier below was taken whole by its quick step (core.quick)
    quick_steps: list = []
    core = core_of(heap)
    quick = core.quick[BARRIER_ALL]
    if quick is not None:
        core.quick[BARRIER_ALL] = _recorded(quick, quick_steps)
    # whether the malloc below was taken by its allocation's quick step
    quick_mallocs: list = []
    real_quick_allocation = core.quick_allocation

    def quick_allocation(*args):
        quick_malloc = real_quick_allocation(*args)
        return None if quick_malloc is None else _recorded(quick_malloc, quick_mallocs)
    core.quick_allocation = quick_allocation
    real_remembered = core.remembered_allocation   # (a repeated malloc's kept step)

    def remembered_allocation(memo):
        quick_malloc = real_remembered(memo)
        return None if quick_malloc is None else _recorded(quick_malloc, quick_mallocs)
    core.remembered_allocation = remembered_allocation
    late = me == n - 1
    if late:
        stop_for(stop)
    start = time.monotonic()
    fields = {"pe": me, "late": late}
    try:
        if scenario == "malloc":
            heap.malloc(64)
        elif scenario == "malloc-segment":
            heap.malloc(1 << 20)       # a new segment: its memory is exchanged
        elif scenario == "barrier":
            heap.barrier_all()
        elif scenario == "team-sync":
            team.sync()
        elif scenario in small:
            small[scenario]()
        else:
            raise ValueError(scenario)
        fields.update(error=None)
    except Exception as exc:  # recorded for the test to judge
        fields.update(error=type(exc).__name__, message=str(exc))
    fields["elapsed"] = time.monotonic() - start
    fields["replayed"] = bool(replayed)
    # replayed whole by its Plan's quick step (nodecoll.replay), not step by step
    fields["replayed_quick"] = bool(replayed) and not stepwise
    fields["quick"] = bool(quick_steps)
    fields["quick_malloc"] = bool(quick_mallocs)
    start = time.monotonic()
    try:
        heap.malloc(16)
        fields.update(second_error=None)
    except Exception as exc:
        fields.update(second_error=type(exc).__name__, second_message=str(exc))
    fields["second_elapsed"] = time.monotonic() - start
    return heap, fields


def _recorded(quick, taken: list):
    """`quick` (a quick step) that appends True to `taken` where it was taken,
    also where it raised, and not where it stepped aside (None: the general
    path runs)."""
    def traced():
        taken.append(True)
        result = quick()
        if result is None:
            taken.pop()
        return result
    return traced


def dump_on_hang() -> None:
    """A call still running after 100 s is a hang: its traceback goes to the job's
    log and the PE exits (armed again for each call of `cases`)."""
    faulthandler.dump_traceback_later(100, exit=True)


def main() -> None:
    dump_on_hang()
    if sys.argv[1] == "cases":
        cases(float(sys.argv[2]), sys.argv[3], sys.argv[4:])
    scenario, timeout, stop, outdir, agreement = sys.argv[1:6]
    split = int(sys.argv[6]) if len(sys.argv) > 6 else None
    heap, fields = call(scenario, float(timeout), float(stop), agreement, split)
    finish(heap, outdir, heap.my_pe, heap.n_pes, fields)


def cases(timeout: float, outdir: str, specs: list[str]) -> None:
    """Each NAME:SCENARIO:STOP:AGREEMENT[:SPLIT] of `specs` in turn, on a heap of its
    own, recorded (with its heap's finalize) into OUTDIR/NAME/; then leave as finish()."""
    for i, spec in enumerate(specs):
        name, scenario, stop, agreement, *split = spec.split(":")
        folder = os.path.join(outdir, name)
        os.makedirs(folder, exist_ok=True)
        # every PE done with the last call, the stopped one too (a hang here ends at
        # the last call's dump), then this one's own time
        next_case()
        dump_on_hang()
        heap, fields = call(scenario, timeout, float(stop), agreement,
                            int(split[0]) if split else None)
        me, n = heap.my_pe, heap.n_pes
        if i == len(specs) - 1:
            finish(heap, folder, me, n, fields)   # waits for every PE's record, exits
        finalize_into(heap, fields)
        record(folder, me, **fields)


if __name__ == "__main__":
    main()
