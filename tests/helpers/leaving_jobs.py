"""Run by tests/jobs/reliability/test_reliability_leaving.py as its own MPI job,
launched as users do (no -disable-auto-cleanup), in either form:

    mpiexec -n N python leaving_jobs.py SCENARIO OUTDIR
    mpiexec -n N python -m mpi4py leaving_jobs.py SCENARIO OUTDIR

A PE that leaves on an exception (or a signal) says so at once, every waiting
PE raises naming it, and the job ends within seconds (issue 32, item 4). The
heap's timeout is 100 s: a PE that waited for the timeout, or a job that did,
would be far past the test's limit. Each PE that catches the error writes
OUTDIR/pe<N>.json (what it raised, after how long), then ends its program
normally (which no longer waits in MPI_Finalize for the PE that left).

Scenarios:
  uncaught    PE 1 raises RuntimeError("boom") that nothing catches; the
              others wait in wait_until on a flag nobody sets
  with-block  PE 1 raises ValueError("user bug") inside `with shmemvm.init()`;
              the others are in barrier_all() in theirs
  sigint      every PE waits in wait_until on a flag nobody sets, having
              written OUTDIR/ready<N>; the test sends SIGINT to mpiexec (hydra
              forwards it to every PE)
"""

import faulthandler
import os
import sys
import time

import torch

from job_records import record
import shmemvm

TIMEOUT = 100.0
LEAVER = 1


def main() -> None:
    faulthandler.dump_traceback_later(90, exit=True)
    scenario, outdir = sys.argv[1], sys.argv[2]
    if scenario == "with-block":
        start = None
        try:
            with shmemvm.init(heap_size="4M", backend="host", timeout=TIMEOUT) as heap:
                me = heap.my_pe
                heap.barrier_all()
                start = time.monotonic()
                if me == LEAVER:
                    time.sleep(0.5)
                    raise ValueError("user bug")      # leaves the with block: nothing catches it
                heap.barrier_all()
        except shmemvm.PeerDeadError as exc:
            record(outdir, me, error=type(exc).__name__, message=str(exc),
                   elapsed=time.monotonic() - start)
        return
    heap = shmemvm.init(heap_size="4M", backend="host", timeout=TIMEOUT)
    me = heap.my_pe
    flag = heap.zeros(1, torch.int64)
    heap.barrier_all()
    start = time.monotonic()
    if scenario == "uncaught" and me == LEAVER:
        time.sleep(0.5)
        raise RuntimeError("boom")
    if scenario == "sigint":
        with open(os.path.join(outdir, f"ready{me}"), "w"):
            pass
        heap.wait_until(flag, "eq", 1)
        return
    try:
        heap.wait_until(flag, "eq", 1)
    except shmemvm.PeerDeadError as exc:
        record(outdir, me, error=type(exc).__name__, message=str(exc),
               elapsed=time.monotonic() - start)


if __name__ == "__main__":
    main()
