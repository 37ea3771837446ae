"""Run by tests/jobs/reliability/test_reliability_stopped_peer.py as its own small MPI job:

    mpiexec -n 2 python stopped_peer.py TIMEOUT OUTDIR SCENARIO [SCENARIO ...]

Both PEs make one heap per SCENARIO (collectively, before anything goes
wrong) and warm each up with the operation to come. Then PE 1 stops itself
with SIGSTOP: it is alive but never answers, like a PE stuck in a debugger or
in a long computation outside MPI. PE 0 runs each scenario's one-sided
operation on PE 1, each on its own heap (a timed-out heap is unusable), and
records in OUTDIR/pe0.json what it raised and after how long, what a second
call on that heap raised, and how long finalize() took. Then it sends PE 1
SIGCONT; PE 1 leaves at once with os._exit, and so does PE 0 (MPI's own
finalization would wait for operations that will never complete).

Scenarios (the operation PE 0 aims at PE 1):
  atomic_fetch_add, atomic_add, atomic_compare_swap   on a heap of one node
                without the compiled piece (native=0): MPI window atomics,
                which need the target's MPI (as every atomic across nodes)
  put_signal    the put is a copy through the peer mapping, which a stopped
                PE does not hinder; the signal is an MPI atomic (native=0)
  put, get      off-node put/get: the heap splits the PEs into nodes of one
  atomic_fetch_add_by_cpu   the compiled piece's CPU atomic on the peer's
                mapping: it needs nothing of the target, so it completes
                (the heap's finalize then times out, as PE 1 is stopped)
"""

import faulthandler
import json
import os
import signal
import sys
import time

import torch
from mpi4py import MPI

from shmemvm import SymmetricHeap
from shmemvm.core.state import parts_of

OFF_NODE = {"put", "get"}
#: the scenarios whose heap has the compiled piece (its CPU atomics)
BY_CPU = {"atomic_fetch_add_by_cpu"}


def operation(heap: SymmetricHeap, scenario: str, x: torch.Tensor, c: torch.Tensor, pe: int):
    if scenario in ("atomic_fetch_add", "atomic_fetch_add_by_cpu"):
        return lambda: heap.atomic_fetch_add(c[0], 1, pe)
    if scenario == "atomic_add":
        return lambda: heap.atomic_add(c[0], 1, pe)
    if scenario == "atomic_compare_swap":
        return lambda: heap.atomic_compare_swap(c[1], 0, 0, pe)
    if scenario == "put_signal":
        return lambda: heap.put_signal(x, torch.ones(64), c[2], 1, "add", pe)
    if scenario == "put":
        return lambda: heap.put(x, torch.ones(64), pe)
    if scenario == "get":
        return lambda: heap.get(torch.empty(64), x, pe)
    raise ValueError(scenario)


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def main() -> None:
    faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where, in the job's log
    timeout, outdir, scenarios = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    pids = comm.allgather(os.getpid())
    runs = []
    for scenario in scenarios:
        heap = SymmetricHeap(comm, heap_size="4M", backend="host", timeout=timeout,
                             node_split=1 if scenario in OFF_NODE else None,
                             native="auto" if scenario in BY_CPU else 0)
        x, c = heap.zeros(64, torch.float32), heap.zeros(4, torch.int64)
        if me == 0:
            operation(heap, scenario, x, c, 1)()     # warm: the path works while PE 1 runs
        heap.barrier_all()
        runs.append((scenario, heap, x, c))
    comm.Barrier()
    if me == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        for _, heap, _, _ in runs:                  # continued by PE 0 once it is done:
            parts_of(heap).channel.close()                    # leave no socket directory behind
        os._exit(0)

    deadline = time.monotonic() + 30
    while not stopped(pids[1]) and time.monotonic() < deadline:
        time.sleep(0.01)
    record = {"stopped": stopped(pids[1]), "timeout": timeout, "scenarios": {}}
    for scenario, heap, x, c in runs:
        result = {}
        start = time.monotonic()
        try:
            operation(heap, scenario, x, c, 1)()
            result["error"] = None
        except Exception as exc:  # recorded for the test to judge
            result.update(error=type(exc).__name__, message=str(exc))
        result["elapsed"] = time.monotonic() - start
        start = time.monotonic()
        try:
            operation(heap, scenario, x, c, 0)()     # on this PE: the heap refuses it
            result["second_error"] = None
        except Exception as exc:
            result.update(second_error=type(exc).__name__, second_message=str(exc))
        result["second_elapsed"] = time.monotonic() - start
        start = time.monotonic()
        try:
            heap.finalize()
        except Exception as exc:   # a collective with PE 1 stopped: where the op completed
            result["finalize_error"] = type(exc).__name__
        result.update(finalize_elapsed=time.monotonic() - start, closed=heap.closed)
        record["scenarios"][scenario] = result
    with open(os.path.join(outdir, "pe0.json.tmp"), "w") as out:
        json.dump(record, out)
    os.rename(os.path.join(outdir, "pe0.json.tmp"), os.path.join(outdir, "pe0.json"))
    os.kill(pids[1], signal.SIGCONT)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
