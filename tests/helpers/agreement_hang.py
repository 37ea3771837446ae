"""Run by tests/jobs/agreement/test_agreement_hangs.py as its own small MPI job:

    mpiexec -n 2 python -m mpi4py agreement_hang.py SCENARIO TIMEOUT OUTDIR

PE 1 is late or absent at the point SCENARIO names; each PE that gets an
exception writes OUTDIR/pe<N>.json (which exception, its message, and when)
and raises it again. `python -m mpi4py` turns an uncaught exception into
MPI_Abort, which ends the whole job at once with a nonzero status: that is
how a user's job ends promptly too (plain `python app.py` would go on to
MPI_Finalize, which waits for the PE that is not there).

Scenarios:
  late-init   PE 1 starts init TIMEOUT + 3 s after PE 0
  no-init     PE 1 never calls init
  gc          both PEs drop a symmetric tensor; PE 1 then computes for
              TIMEOUT + 1.5 s before barrier_all(), so that PE 0 times out in
              the agreement while PE 1, arriving later, has its allreduce
              completed by PE 0's contribution and waits in the GC agreement
              (which once was a blocking allgather: PE 1 hung for ever)
"""

import faulthandler
import gc
import os
import sys
import time

from mpi4py import MPI

from job_records import record
from shmemvm import SymmetricHeap


def main() -> None:
    faulthandler.dump_traceback_later(60, exit=True)  # a hang shows where, in the job's log
    scenario, timeout, outdir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    me = MPI.COMM_WORLD.Get_rank()
    start = time.time()
    try:
        if scenario in ("late-init", "no-init") and me == 1:
            time.sleep(timeout + 3 if scenario == "late-init" else 120)
            start = time.time()
        heap = SymmetricHeap(MPI.COMM_WORLD, heap_size="4M", backend="host", timeout=timeout)
        if scenario == "gc":
            dropped = heap.malloc(100)
            heap.barrier_all()
            del dropped
            gc.collect()                       # queued on both PEs, freed at the next call
            if me == 1:
                time.sleep(timeout + 1.5)      # "computing"
            start = time.time()
            heap.barrier_all()
        record(outdir, me, error=None, start=start, end=time.time())
    except Exception as exc:
        record(outdir, me, error=type(exc).__name__, message=str(exc), start=start,
               end=time.time())
        if scenario == "gc" and me == 0:
            # Let PE 1 get its error too before this one ends the job, and drive MPI's
            # progress meanwhile, so that PE 0's half of the timed-out allreduce arrives.
            until = time.monotonic() + 4 * timeout + 10
            while time.monotonic() < until and not os.path.exists(
                    os.path.join(outdir, "pe1.json")):
                MPI.COMM_WORLD.Iprobe()
                time.sleep(0.001)
        raise


if __name__ == "__main__":
    main()
