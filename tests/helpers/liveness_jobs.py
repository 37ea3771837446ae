"""Run by tests/jobs/reliability/test_reliability_liveness.py as its own small MPI job:

    mpiexec -disable-auto-cleanup -n N python liveness_jobs.py SCENARIO TIMEOUT OUTDIR [SPLIT]
    mpiexec -disable-auto-cleanup -n N python liveness_jobs.py cases TIMEOUT OUTDIR \
        NAME:SCENARIO[:SPLIT]...

Waits that cannot end (issue 25, items 1 and 5): every PE writes, to
OUTDIR/pe<N>.json, what its wait raised (or returned) and after how long. A PE
that dies leaves with os._exit(3) (see peer_death.py for why not a signal);
the others leave with os._exit too, since MPI_Finalize would wait for it,
once every PE has reported (until then they serve MPI: a PE that left would
make another's pending MPI operation on it wait for the timeout).
SPLIT, where given, is node_split= (1: every PE on a node of its own, so the
PEs see each other only through MPI). `cases` runs several scenarios in which no
PE dies one after another in one job, each on a heap of its own (finalized, and
every PE past an MPI barrier, before the next is made), each recording into
OUTDIR/NAME/pe<N>.json as a job of its own would: one start-up of the PEs instead
of one per scenario (issue 33, item 16: CI's time).

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

from job_records import finalize_into, finish, next_case, record
from shmemvm import PeerTimeoutError, SymmetricHeap
from shmemvm.core.state import parts_of

DEATH = 3  # os._exit status of the dying PE
#: the scenarios in which a PE dies: each ends its job, so none of them is one of `cases`
DYING = ("dead-holder", "dead-queued", "wait-on-dead")
#: the scenarios whose waits all return (no error, no dead PE)
RETURNING = ("legit-long-wait", "timed-wait", "start-new-thread", "stopped-satisfied")
#: each scenario's tensors, alive until the PE leaves, as when each job ran one
#: scenario (a scenario named with DROPPED drops them before finalize() instead)
KEPT: list = []
#: what a scenario leaves running beside its heap (idle threads): under `cases`,
#: undone once it has recorded, so that the next scenario starts clean
LEFT: list = []
#: the scenario whose second heap stays (unfinalized) until the PE leaves: after the
#: deadlock its PEs disagree on whether that heap broke (only those that waited in it
#: raised there), so its finalize() would time out on PE 0; under `cases` it comes last
LEAVES_A_HEAP = "two-heaps"
#: the suffix of a scenario whose tensors are dropped before finalize(): on a heap a
#: dead PE broke, off the node, that made a survivor die of a segmentation fault in
#: its next MPI call (the window, left allocated, still named memory then unmapped)
DROPPED = "-dropped"


def die(outdir: str, heap: SymmetricHeap) -> None:
    record(outdir, heap.my_pe, died=True, directory=parts_of(heap).channel.directory)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(DEATH)


def new_heap(timeout: float, split: int | None) -> SymmetricHeap:
    return SymmetricHeap(MPI.COMM_WORLD, heap_size="4M", backend="host", timeout=timeout,
                         node_split=split)


def dump_on_hang() -> None:
    """A scenario still running after DUMP_AFTER s (100) is a hang: its traceback goes
    to the job's log and the PE exits (armed again for each scenario of `cases`)."""
    faulthandler.dump_traceback_later(float(os.environ.get("DUMP_AFTER", 100)), exit=True)


def main() -> None:
    dump_on_hang()
    if sys.argv[1] == "cases":
        cases(float(sys.argv[2]), sys.argv[3], sys.argv[4:])
    named, timeout, outdir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    split = int(sys.argv[4]) if len(sys.argv) > 4 else None
    heap = new_heap(timeout, split)
    scenario = named.removesuffix(DROPPED)
    fields = run(heap, scenario, timeout, outdir, split)
    if scenario != named:
        KEPT.clear()
        gc.collect()
    finish(heap, outdir, heap.my_pe, heap.n_pes, fields)


def cases(timeout: float, outdir: str, specs: list[str]) -> None:
    """Each NAME:SCENARIO[:SPLIT] of `specs` in turn, on a heap of its own, recorded
    (with its heap's finalize) into OUTDIR/NAME/; then leave as finish() does."""
    for i, spec in enumerate(specs):
        name, scenario, *split = spec.split(":")
        if scenario in DYING or scenario.endswith(DROPPED):
            raise ValueError(f"{scenario}: a PE dies in it, or it drops its tensors; it "
                             f"needs a job of its own")
        if scenario == LEAVES_A_HEAP and i != len(specs) - 1:
            raise ValueError(f"{scenario} leaves a heap behind: it comes last")
        folder = os.path.join(outdir, name)
        os.makedirs(folder, exist_ok=True)
        # every PE done with the last scenario (a hang here ends at the last one's dump),
        # then this one's own time
        next_case()
        dump_on_hang()
        heap = new_heap(timeout, int(split[0]) if split else None)
        fields = run(heap, scenario, timeout, outdir, int(split[0]) if split else None)
        while LEFT:
            LEFT.pop()()
        if i == len(specs) - 1:
            finish(heap, folder, heap.my_pe, heap.n_pes, fields)   # waits for every record, exits
        finalize_into(heap, fields)
        record(folder, heap.my_pe, **fields)


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
            other = new_heap(timeout, split)
            KEPT.append(other)
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
            jobs: queue.Queue = queue.Queue()
            threading.Thread(target=jobs.get, daemon=True).start()
            LEFT.extend([pool.shutdown, lambda: jobs.put(None)])
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
    if scenario in RETURNING and fields["error"] is None:
        heap.barrier_all()   # the heap still works after a long wait
        fields["barrier"] = True
    return fields


if __name__ == "__main__":
    main()
