"""agreement/liveness.py's pieces in one process: the record's encoding (read
back whole, refused while half written), whether a process lives (gone, a
zombie, another process that took its pid), and the register of abandoned
steps (the first proposal wins, for every PE that asks, per agreement)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from shmemvm.agreement import liveness
from shmemvm.agreement.liveness import ABANDONED, COMMITTED, FileRegister, Liveness


def test_a_record_reads_back_and_a_half_written_one_does_not():
    buffer = memoryview(bytearray(liveness.RECORD))
    assert liveness.read_record(buffer) is None            # never written
    payload = {"waiting": True, "wait": "wait_until(ivar, 'eq', 1) still sees 0", "epoch": 3}
    liveness.write_record(buffer, 1, liveness.encode(payload))
    assert liveness.read_record(buffer) == payload
    buffer[liveness._HEAD] ^= 0xFF                          # torn: the CRC no longer holds
    assert liveness.read_record(buffer) is None
    huge = {"wait": "x" * 10000, "verdict": {"kind": "deadlock", "text": "y" * 10000}}
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
