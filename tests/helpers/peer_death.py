"""Run by tests/jobs/reliability/test_reliability_peer_death.py as its own small MPI job:

    mpiexec -disable-auto-cleanup -n 3 python peer_death.py SCENARIO TIMEOUT OUTDIR

TIMEOUT is seconds for timeout=, or "env" to leave it to SHMEMVM_TIMEOUT.

One PE (the last) dies at the point SCENARIO names; every other PE
records, in OUTDIR/pe<N>.json, which exception its pending collective raised
and after how long, what a further call raised, and whether finalize()
returned. Survivors leave with os._exit so that MPI's own finalization (which
would wait for the dead PE) cannot hang the job.

The victim leaves with os._exit(3), not by a signal: hydra's proxy SIGKILLs
every process of the job at its next event once a child has died *by a
signal*, whatever -disable-auto-cleanup says (pmip.c, main loop); for the
other PEs the two look the same (a process gone without a word: no MPI
finalize, its socket closed). Before dying it writes OUTDIR/pe<N>.json with
its channel directory, which os._exit leaves behind, for the test to remove.

Scenarios:
  before-malloc   the PE dies before a collective malloc: the others wait in
                  the agreement (the allreduce)
  mid-malloc      the PE dies inside a malloc that creates a new segment, after
                  the agreement and before it hands its memory to the others:
                  the others wait for its file descriptors
  mid-barrier     the PE dies while the others are already in barrier_all()
  mid-reduce, mid-fcollect   the same in an 8-byte reduce or fcollect, whose
                  data rides in the agreed step (transport/nodecoll.py)
  mid-numpy-fcollect  the same in the NumPy face's fcollect on the default heap,
                  made twice before: the call replays its Plan (`replayed`)
"""

import faulthandler
import json
import os
import sys
import time

import torch
from mpi4py import MPI

import shmemvm
from shmemvm import SymmetricHeap, rc
from shmemvm.core.state import parts_of
from shmemvm.transport import nodecoll

rc(initialize=False, finalize=False)   # (mid-numpy-fcollect makes the NumPy face's heap)
from shmemvm import shmem  # noqa: E402


def die(heap: SymmetricHeap, outdir: str) -> None:
    record = {"pe": heap.my_pe, "died": True, "directory": parts_of(heap).channel.directory}
    with open(os.path.join(outdir, f"pe{heap.my_pe}.json"), "w") as out:
        json.dump(record, out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(3)


def main() -> None:
    faulthandler.dump_traceback_later(60, exit=True)  # a hang shows where, in the job's log
    scenario, timeout, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    options = dict(heap_size="16M", backend="host",
                   timeout=None if timeout == "env" else float(timeout))
    numpy_face = scenario == "mid-numpy-fcollect"
    # (the NumPy face acts on the default heap: init() makes it)
    heap = shmemvm.init(MPI.COMM_WORLD, **options) if numpy_face else \
        SymmetricHeap(MPI.COMM_WORLD, **options)
    me, victim = heap.my_pe, heap.n_pes - 1
    warm = heap.malloc(100)                     # the heap works before anyone dies
    heap.put(warm, torch.full((100,), me, dtype=torch.uint8), (me + 1) % heap.n_pes)
    heap.barrier_all()
    record = {"pe": me, "scenario": scenario, "timeout": heap.timeout,
              "warm_ok": bool((warm == (me - 1) % heap.n_pes).all())}
    replayed: list = []
    stepwise: list = []
    if numpy_face:   # made twice: the call the victim misses replays its Plan
        gathered, mine = shmem.zeros(heap.n_pes, dtype="q"), shmem.zeros(1, dtype="q")
        real = nodecoll.replay
        nodecoll.replay = lambda h, plan: (replayed.append(True), real(h, plan))[1]
        # the steps of a replay that its quick step left to Python (nodecoll.staged)
        staged = nodecoll.staged
        nodecoll.staged = lambda h, plan: (stepwise.append(True), staged(h, plan))[1]
        for _ in range(2):
            shmem.fcollect(gathered, mine)
        replayed.clear()
        stepwise.clear()

    if me == victim:
        if scenario == "before-malloc":
            die(heap, outdir)
        elif scenario == "mid-malloc":
            parts_of(heap).local.export = lambda segment: die(heap, outdir)  # after agreeing, before sending fds
        elif scenario in ("mid-barrier", "mid-reduce", "mid-fcollect", "mid-numpy-fcollect"):
            time.sleep(0.5)                             # let the others enter the barrier
            die(heap, outdir)

    start = time.monotonic()
    try:
        if scenario == "mid-barrier":
            heap.barrier_all()
        elif scenario == "mid-reduce":
            heap.reduce(warm[8:16], warm[:8])
        elif scenario == "mid-fcollect":
            heap.fcollect(warm[:4 * heap.n_pes], warm[96:])
        elif scenario == "mid-numpy-fcollect":
            shmem.fcollect(gathered, mine)
        else:
            heap.malloc(1 << 20)                        # a new segment: fds are exchanged
        record.update(error=None)
    except Exception as exc:  # recorded for the test to judge
        record.update(error=type(exc).__name__, message=str(exc))
    record["elapsed"] = time.monotonic() - start
    record["replayed"] = bool(replayed)
    record["replayed_quick"] = bool(replayed) and not stepwise   # (as abandoned_call.py)

    start = time.monotonic()
    try:
        heap.malloc(10)
        record.update(second_error=None)
    except Exception as exc:
        record.update(second_error=type(exc).__name__, second_message=str(exc))
    record["second_elapsed"] = time.monotonic() - start

    start = time.monotonic()
    heap.finalize()
    record["finalize_elapsed"] = time.monotonic() - start
    record["closed"] = heap.closed
    with open(os.path.join(outdir, f"pe{me}.json.tmp"), "w") as out:
        json.dump(record, out)
    os.rename(os.path.join(outdir, f"pe{me}.json.tmp"), os.path.join(outdir, f"pe{me}.json"))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
