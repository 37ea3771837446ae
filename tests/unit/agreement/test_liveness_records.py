"""agreement/liveness.py's pieces in one process: the record's encoding (read
back whole, refused while half written), whether a process lives (gone, a
zombie, another process that took its pid), and the register of abandoned
steps (the first proposal wins, for every PE that asks, per agreement)."""

from __future__ import annotations

import _thread
import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from shmemvm.agreement import liveness, process
from shmemvm.agreement.liveness import ABANDONED, COMMITTED, FileRegister, Liveness


def test_a_record_reads_back_and_a_half_written_one_does_not():
    buffer = memoryview(bytearray(liveness.RECORD))
    assert liveness.read_record(buffer) is None            # never written
    payload = {"waiting": True, "wait": "wait_until(ivar, 'eq', 1) still sees 0", "epoch": 3}
    liveness.write_record(buffer, 1, liveness.encode(payload))
    assert liveness.read_record(buffer) == payload
    buffer[liveness._HEAD] ^= 0xFF                          # torn: the CRC no longer holds
    assert liveness.read_record(buffer) is None
    huge = {"wait": "x" * 10000, "verdict": {"kind": "deadlock", "text": "y" * 10000,
                                             "id": [0, 1], "at": {"0": [1, 2]}}}
    data = liveness.encode(huge)                            # shortened to fit
    assert len(data) <= liveness.RECORD - liveness._HEAD
    liveness.write_record(buffer, 2, data)
    assert liveness.read_record(buffer)["verdict"]["kind"] == "deadlock"


def test_a_process_is_alive_until_it_exits_and_is_not_another_with_its_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = liveness.process_start(child.pid)
        assert started is not None and liveness.process_alive(child.pid, started)
        assert not liveness.process_alive(child.pid, started + 1)   # pid reused
        child.kill()
        deadline = time.monotonic() + 10
        while liveness.process_alive(child.pid, started):            # a zombie: dead
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert not liveness.process_alive(child.pid, started)            # reaped: gone
    assert liveness.process_alive(os.getpid(), liveness.process_start(os.getpid()))


def test_the_register_decides_once_per_step_and_agreement(tmp_path):
    mine = Liveness(0, 2, 5.0, str(tmp_path))
    try:
        # two PEs' views of PE 0's register (each PE opens the file itself)
        first, second = (FileRegister(mine.path, 5.0) for _ in range(2))
        assert first.settle(0, 10, ABANDONED, "step", 0) == ABANDONED
        assert second.settle(0, 10, COMMITTED, "step", 1) == ABANDONED   # the first won
        assert second.settle(0, 11, COMMITTED, "step", 1) == COMMITTED   # the next step
        assert first.settle(0, 11, ABANDONED, "step", 0) == COMMITTED
        assert first.settle(0, 10, ABANDONED, "step", 0) == COMMITTED    # a later one decided
        other = 12345 * liveness.REGISTER_SLOTS   # another agreement (same slot, other tag)
        assert second.settle(other, 10, COMMITTED, "team", 1) == COMMITTED
        assert first.settle(other, 10, ABANDONED, "team", 0) == COMMITTED
        # racing proposals from threads: one outcome for everybody
        outcomes = []

        def propose(register, proposal):
            outcomes.append(register.settle(7, 99, proposal, "race", 0))

        threads = [threading.Thread(target=propose, args=(register, proposal))
                   for register, proposal in ((first, ABANDONED), (second, COMMITTED)) * 8]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(outcomes)) == 1 and len(outcomes) == 16
        first.close()
        second.close()
    finally:
        mine.close(healthy=True)
    assert not os.path.exists(mine.path) or os.path.getsize(mine.path) == liveness.SIZE


def test_a_wait_publishes_itself_only_after_a_while(tmp_path):
    mine = Liveness(0, 1, 2.0, str(tmp_path))
    try:
        view = memoryview(mine._map)[:liveness.RECORD]
        with liveness.watch(mine, lambda seen: f"wait_until(x) still sees {seen}") as watch:
            watch.tick(0)
            assert not liveness.read_record(view)["waiting"]     # a short wait costs nothing
            time.sleep(0.25)
            watch.tick(0)
            record = liveness.read_record(view)
            assert record["waiting"] and record["wait"] == "wait_until(x) still sees 0"
            epoch = record["epoch"]
            watch.tick(1)                                         # what it reads changed
            assert liveness.read_record(view)["epoch"] == epoch + 1
        assert not liveness.read_record(view)["waiting"]
        view.release()
    finally:
        mine.close(healthy=True)
    assert liveness.watch(None, str).tick(0) is None               # no liveness: no watch


# -- issue 32 ----------------------------------------------------------------------------------
FORGED = [
    {"locks": 5},                                   # set_lock raised "'int' object is not iterable"
    {"locks": [[1, 2]]},
    {"locks": [["16", "ticket", "held"]]},
    {"locks": [["x", 1, "held"]]},
    {"waiting": "yes"},
    {"serial": "1"},
    {"epoch": 1.5},
    {"gone": 3},
    {"left": ["a"]},
    {"verdict": {"kind": "deadlock"}},
    {"verdict": {"kind": "deadlock", "text": "t", "id": [0], "at": {}}},
    {"verdict": {"kind": "deadlock", "text": "t", "id": [0, 1], "at": {"0": 5}}},
    {"failed": [3]},
    [1, 2, 3],
    "a string",
]


def test_a_record_of_the_wrong_shape_is_ignored_whatever_its_crc():
    """Item 11: a same-user process can write a PE's record with a right CRC
    and fields of the wrong type; it is read as no record, never as a
    raw TypeError later (set_lock iterated 'locks')."""
    buffer = memoryview(bytearray(liveness.RECORD))
    good = {"pid": 1, "serial": 2, "epoch": 3, "waiting": True, "wait": "w",
            "locks": [["16", 4, "held"]], "verdict": None, "gone": None, "left": None,
            "failed": [[0, 1]], "beat": 0}
    liveness.write_record(buffer, 1, liveness.encode(good))
    assert liveness.read_record(buffer) == good
    for sequence, forged in enumerate(FORGED, 2):
        record = dict(good, **forged) if isinstance(forged, dict) else forged
        liveness.write_record(buffer, sequence, json.dumps(record).encode())
        assert liveness.read_record(buffer) is None, forged


def _untimed_wait(mine, body):
    """Run body() inside a watched wait of `mine` without a deadline (entered:
    published as a wait)."""
    with liveness.watch(mine, lambda seen: "wait_until(x) still sees 0") as watch:
        watch.check(time.monotonic())
        return body()


def test_idle_threads_do_not_keep_a_process_from_waiting(tmp_path):
    """Item 9: a thread blocked in queue.get(), an idle ThreadPoolExecutor
    worker and a thread in join() can write nothing until another thread of
    the process wakes them: the process waits. Item 7: a thread started with
    _thread.start_new_thread, which `threading` does not list, counts; so do a
    thread sleeping and one waiting with a timeout, which may still write."""
    mine = Liveness(0, 1, 2.0, str(tmp_path))
    stop = threading.Event()
    jobs = queue.Queue()
    idle = threading.Thread(target=jobs.get, daemon=True)
    timed = threading.Thread(target=stop.wait, args=(30,), daemon=True)
    pool = ThreadPoolExecutor(2)
    try:
        assert not process.waiting()                           # no wait at all
        assert _untimed_wait(mine, process.waiting)            # only this thread
        idle.start()
        pool.submit(int).result()
        time.sleep(0.2)
        assert _untimed_wait(mine, process.waiting)            # idle threads
        started = threading.Event()

        def sleeper():
            started.set()
            while not stop.is_set():
                time.sleep(0.01)
        _thread.start_new_thread(sleeper, ())
        assert started.wait(10)
        assert not _untimed_wait(mine, process.waiting)        # unlisted and running
        stop.set()
        time.sleep(0.2)
        assert _untimed_wait(mine, process.waiting)            # it ended
        stop.clear()
        timed.start()
        time.sleep(0.1)
        assert not _untimed_wait(mine, process.waiting)        # a timed wait may end
    finally:
        stop.set()
        jobs.put(None)
        pool.shutdown()
        for thread in (idle, timed):
            thread.join()
        mine.close(healthy=True)


def test_a_wait_with_a_deadline_of_its_own_is_never_part_of_a_deadlock(tmp_path):
    """Item 6: a wait given timeout= ends by itself: while one runs, the process
    does not wait (no PE can declare a deadlock over it)."""
    mine = Liveness(0, 1, 2.0, str(tmp_path))
    try:
        with liveness.watch(mine, lambda seen: "wait_until(x, timeout=10)", timeout=10) as watch:
            watch.check(time.monotonic())
            assert not process.waiting()
            view = memoryview(mine._map)[:liveness.RECORD]
            assert not liveness.read_record(view)["waiting"]
            view.release()
        assert _untimed_wait(mine, process.waiting)
    finally:
        mine.close(healthy=True)


def test_every_open_heap_publishes_the_waits_of_the_whole_process(tmp_path):
    """Item 3: a wait in one heap shows in the record of every heap of the
    process (a deadlock can span two heaps over the same PEs)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = Liveness(0, 1, 2.0, str(tmp_path / "a"))
    second = Liveness(0, 1, 2.0, str(tmp_path / "b"))
    try:
        view = memoryview(second._map)[:liveness.RECORD]
        with liveness.watch(first, lambda seen: "wait_until(x) in the first heap") as watch:
            watch.check(time.monotonic())
            record = liveness.read_record(view)
            assert record["waiting"] and "first heap" in record["wait"], record
        assert not liveness.read_record(view)["waiting"]
        view.release()
    finally:
        first.close(healthy=True)
        second.close(healthy=True)
