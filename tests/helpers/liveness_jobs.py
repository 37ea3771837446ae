"""Run by tests/jobs/reliability/test_reliability_liveness.py as its own small MPI job:

    mpiexec -disable-auto-cleanup -n N python liveness_jobs.py SCENARIO[+SCENARIO...] TIMEOUT OUTDIR [SPLIT]

Waits that cannot end (issue 25, items 1 and 5): every PE writes, to
OUTDIR/pe<N>.json, what its wait raised (or returned) and after how long. A PE
that dies leaves with os._exit(3) (see peer_death.py for why not a signal);
the others leave with os._exit too, since MPI_Finalize would wait for it,
once every PE has reported (until then they serve MPI: a PE that left would
make another's pending MPI operation on it wait for the timeout).
SPLIT, where given, is node_split= (1: every PE on a node of its own, so the
PEs see each other only through MPI). Scenarios joined by "+" (only those whose
waits all return: RETURNING) run one after another in one job, on fresh
variables of one heap, each recording into OUTDIR/<scenario>/pe<N>.json: one
job's start-up instead of one each (issue 33, item 16: CI's time).

Scenarios (the wait each PE makes, none with a timeout of its own; SCENARIO-dropped
runs SCENARIO and drops its tensors before finalize()):
  dead-holder     PE 2 takes the lock and dies holding it; PEs 0 and 1 set_lock
  dead-queued     PE 1 holds the lock, PE 2 queues for it and dies while
                  queued, PE 0 queues behind PE 2; PE 1 clears the lock (PE 2
                  dead by then) and queues again: PEs 0 and 1 wait for PE 2's
                  turn
  signal-deadlock every PE waits in signal_wait_until for a signal the next PE
                  would send after its own wait
  mixed-deadlock  PE 0 holds the lock and waits in wait_until, PE 1 waits in
                  signal_wait_until, PE 2 (and the rest) in set_lock
  lock-order      PE 0 holds lock A and sets lock B; PE 1 holds B and sets A
                  (the rest wait_until on a variable nobody sets)
  legit-long-wait PE 0 waits in wait_until while the others compute for two
                  timeouts, then PE 1 sets the variable: PE 0's wait returns
  wait-on-dead    every PE but the last waits in wait_until; the last dies
  two-heaps       (issue 32, item 3) two heaps over the same PEs: PE 0 waits on a
                  flag of the first, the others on a flag of the second, each
                  PE setting the next one's after its own wait: a deadlock
  timed-wait      (item 6) PE 0 waits with timeout=4 timeouts; the others wait
                  with timeout=2 timeouts (which pass), then PE 1 sets PE 0's flag:
                  PE 0's wait returns, no deadlock
  start-new-thread (item 7) PE 0 waits on a flag that a thread of PE 1, started
                  with _thread.start_new_thread, sets after 2 timeouts, while PE 1
                  (and the rest) waits on a flag PE 0 sets after its wait
  idle-threads    (item 9) every PE has an idle ThreadPoolExecutor worker and a
                  thread blocked in queue.get(), and waits on a flag nobody sets:
                  a deadlock
  stopped-satisfied (item 8) PE 1 waits on a flag; PE 0 stops it (SIGSTOP), sets
                  the flag, has it continued (SIGCONT) after 1.5 timeouts, and
                  waits on a flag that PE 1 sets after its wait; the rest wait
                  on a flag PE 1 sets too: every wait returns
"""

import _thread
import faulthandler
import gc
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from mpi4py import MPI

from job_records import finish, record
from shmemvm import PeerTimeoutError, SymmetricHeap

DEATH = 3  # os._exit status of the dying PE
#: the scenarios whose waits all return (no error, no dead PE): several may share a job
RETURNING = ("legit-long-wait", "timed-wait", "start-new-thread", "stopped-satisfied")
#: each scenario's tensors, alive until the PE leaves, as when each job ran one
#: scenario (a scenario named with DROPPED drops them before finalize() instead)
KEPT: list = []
#: the suffix of a scenario whose tensors are dropped before finalize(): on a heap a
#: dead PE broke, off the node, that made a survivor die of a segmentation fault in
#: its next MPI call (the window, left allocated, still named memory then unmapped)
DROPPED = "-dropped"


def die(outdir: str, heap: SymmetricHeap) -> None:
    record(outdir, heap.my_pe, died=True, directory=heap._core.channel.directory)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(DEATH)


def main() -> None:
    faulthandler.dump_traceback_later(float(os.environ.get("DUMP_AFTER", 100)), exit=True)  # a hang shows where, in the job's log
    scenarios, timeout, outdir = sys.argv[1].split("+"), float(sys.argv[2]), sys.argv[3]
    split = int(sys.argv[4]) if len(sys.argv) > 4 else None
    heap = SymmetricHeap(MPI.COMM_WORLD, heap_size="4M", backend="host", timeout=timeout,
                         node_split=split)
    me, n = heap.my_pe, heap.n_pes
    if len(scenarios) == 1:
        scenario = scenarios[0].removesuffix(DROPPED)
        fields = run(heap, scenario, timeout, outdir, split)
        if scenario != scenarios[0]:
            KEPT.clear()
            gc.collect()
        finish(heap, outdir, me, n, fields)
    if not set(scenarios) <= set(RETURNING):
        raise ValueError(f"only {RETURNING} may share a job, not {scenarios}")
    for scenario in scenarios:
        os.makedirs(os.path.join(outdir, scenario), exist_ok=True)
        fields = run(heap, scenario, timeout, outdir, split)
        record(os.path.join(outdir, scenario), me, **fields)
    finish(heap, outdir, me, n, {"pe": me, "scenarios": scenarios})


def run(heap: SymmetricHeap, scenario: str, timeout: float, outdir: str,
        split: int | None) -> dict:
    """One scenario's waits on fresh variables of `heap`: what this PE's raised
    or returned, after how long."""
    me, n = heap.my_pe, heap.n_pes
    locks = heap.zeros(2, torch.int64)
    flags = heap.zeros(4, torch.int64)
    sig = heap.zeros(1, torch.uint64)
    KEPT.append((locks, flags, sig))
    heap.barrier_all()
    lock_a, lock_b = locks[0:1], locks[1:2]
    result = None

    def wait():
        if scenario == "dead-holder":
            if me == 2:
                heap.set_lock(lock_a)
            heap.barrier_all()       # PE 2 holds it
            if me == 2:
                time.sleep(0.5)
                die(outdir, heap)
            heap.set_lock(lock_a)
            return "acquired"
        if scenario == "dead-queued":
            if me == 1:
                heap.set_lock(lock_a)
            heap.barrier_all()
            if me == 2:
                threading.Timer(1.5, die, (outdir, heap)).start()
                heap.set_lock(lock_a)                     # dies in here, queued
                return "acquired (should have died)"
            # queue behind PE 2 (PE 0), or clear once both queue and PE 2 is dead (PE 1)
            taken = 2 if me == 0 else 3
            while (heap.atomic_fetch(lock_a, 0) >> 32) < taken:
                time.sleep(0.01)
            if me == 0:
                heap.set_lock(lock_a)
                return "acquired"
            time.sleep(2.0)
            heap.clear_lock(lock_a)
            heap.set_lock(lock_a)
            return "acquired"
        if scenario == "signal-deadlock":
            heap.signal_wait_until(sig[0:1], "eq", 1)
            return heap.put_signal(flags[0:1], torch.ones(1, dtype=torch.int64), sig[0:1], 1,
                                   "set", (me + 1) % n)
        if scenario == "mixed-deadlock":
            if me == 0:
                heap.set_lock(lock_a)
                heap.barrier_all()
                return heap.wait_until(flags[0:1], "eq", 7)
            heap.barrier_all()
            if me == 1:
                return heap.signal_wait_until(sig[0:1], "ge", 3)
            time.sleep(0.2)
            heap.set_lock(lock_a)
            return "acquired"
        if scenario == "lock-order":
            if me < 2:
                heap.set_lock((lock_a, lock_b)[me])
            heap.barrier_all()
            if me < 2:
                heap.set_lock((lock_b, lock_a)[me])
                return "acquired"
            return heap.wait_until(flags[1:2], "ne", 0)
        if scenario == "legit-long-wait":
            if me == 0:
                return heap.wait_until(flags[2:3], "eq", 5)
            time.sleep(2 * timeout)                       # computing, not waiting
            if me == 1:
                heap.atomic_set(flags[2:3], 5, 0)
            return "computed"
        if scenario == "wait-on-dead":
            if me == n - 1:
                time.sleep(0.5)
                die(outdir, heap)
            return heap.wait_until(flags[3:4], "eq", 1)
        if scenario == "two-heaps":
            other = SymmetricHeap(MPI.COMM_WORLD, heap_size="4M", backend="host",
                                  timeout=timeout, node_split=split)
            flag = {id(heap): heap.zeros(1, torch.int64), id(other): other.zeros(1, torch.int64)}
            heap.barrier_all()
            other.barrier_all()

            def waits_in(pe):
                return heap if pe == 0 else other
            here, there = waits_in(me), waits_in((me + 1) % n)
            here.wait_until(flag[id(here)], "eq", 1)
            there.atomic_set(flag[id(there)], 1, (me + 1) % n)
            return "woken"
        if scenario == "timed-wait":
            if me == 0:
                return heap.wait_until(flags[0:1], "eq", 1, timeout=4 * timeout)
            try:
                heap.wait_until(flags[1:2], "eq", 1, timeout=2 * timeout)
            except PeerTimeoutError:
                pass                                      # as asked
            if me == 1:
                heap.atomic_set(flags[0:1], 1, 0)
            return "timed out as asked"
        if scenario == "start-new-thread":
            if me == 1:
                _thread.start_new_thread(
                    lambda: (time.sleep(2 * timeout), heap.atomic_set(flags[0:1], 1, 0)), ())
            if me == 0:
                value = heap.wait_until(flags[0:1], "eq", 1)
                for pe in range(1, n):
                    heap.atomic_set(flags[1:2], 1, pe)
                return value
            return heap.wait_until(flags[1:2], "eq", 1)
        if scenario == "idle-threads":
            pool = ThreadPoolExecutor(2)
            pool.submit(int).result()
            jobs = queue.Queue()
            threading.Thread(target=jobs.get, daemon=True).start()
            return heap.wait_until(flags[2:3], "eq", 1)
        if scenario == "stopped-satisfied":
            pids = MPI.COMM_WORLD.allgather(os.getpid())
            heap.barrier_all()
            if me == 1:
                value = heap.wait_until(flags[1:2], "eq", 1)
                for pe in range(n):
                    if pe != 1:
                        heap.atomic_set(flags[0:1], 1, pe)
                return value
            if me == 0:
                time.sleep(1.0)                           # PE 1 is in its wait
                os.kill(pids[1], signal.SIGSTOP)
                # satisfied, but PE 1 is stopped: a store through the node's mapping of
                # PE 1's memory (an atomic through MPI would wait for the stopped PE)
                heap.ptr(flags[1:2], 1).fill_(1)
                subprocess.Popen(["sh", "-c", f"sleep {1.5 * timeout}; kill -CONT {pids[1]}"])
            return heap.wait_until(flags[0:1], "eq", 1)
        raise ValueError(scenario)

    start = time.monotonic()
    try:
        result = wait()
        fields = {"error": None, "result": repr(result)}
    except Exception as exc:  # recorded for the test to judge
        fields = {"error": type(exc).__name__, "message": str(exc)}
    fields.update(pe=me, elapsed=time.monotonic() - start, timeout=heap.timeout)
    if scenario in ("legit-long-wait", "timed-wait", "start-new-thread", "stopped-satisfied") \
            and fields["error"] is None:
        heap.barrier_all()   # the heap still works after a long wait
        fields["barrier"] = True
    return fields


if __name__ == "__main__":
    main()
