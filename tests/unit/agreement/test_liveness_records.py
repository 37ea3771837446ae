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

from shmemvm.agreement import liveness, process, records
from shmemvm.agreement.liveness import ABANDONED, COMMITTED, FileRegister, Liveness


def test_a_record_reads_back_and_a_half_written_one_does_not():
    buffer = memoryview(bytearray(liveness.RECORD))
    assert liveness.read_record(buffer) is None            # never written
    payload = {"waiting": True, "wait": "wait_until(ivar, 'eq', 1) still sees 0", "epoch": 3}
    liveness.write_record(buffer, 1, liveness.encode(payload))
    assert liveness.read_record(buffer) == payload
    buffer[records.HEAD] ^= 0xFF                          # torn: the CRC no longer holds
    assert liveness.read_record(buffer) is None
    huge = {"wait": "x" * 10000, "verdict": {"kind": "deadlock", "text": "y" * 10000,
                                             "id": [0, 1], "at": {"0": [1, 2]}}}
    data = liveness.encode(huge)                            # shortened to fit
    assert len(data) <= liveness.RECORD - records.HEAD
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
        other = 12345 * records.REGISTER_SLOTS   # another agreement (same slot, other tag)
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


# -- verdicts that always settle (issue 32, the two-heaps hang) --------------------------------
#: run in a process of its own (a verdict that never settles would spin in this one for
#: ever): this process is PE 0 of one or two heaps of 2 PEs, PE 1 a fake whose records the
#: script writes; liveness' clock is wrapped so that the fake acts while PE 0 decides
VERDICT_SCRIPT = r'''
import faulthandler, json, mmap, os, sys, time
faulthandler.dump_traceback_later(25, exit=True)
from shmemvm.agreement import liveness, process
from shmemvm.agreement.liveness import ABANDONED, COMMITTED
from shmemvm.errors import DeadlockError

case, root = sys.argv[1], sys.argv[2]
TIMEOUT = 1.0
sequence = [0]


def heap(name):
    mine, fake = (os.path.join(root, name, pe) for pe in "01")
    os.makedirs(mine)
    os.makedirs(fake)
    with open(os.path.join(fake, "liveness"), "wb") as out:
        out.truncate(liveness.SIZE)
    live = liveness.Liveness(0, 2, TIMEOUT, mine)
    live.connect(None, {0: (os.getpid(), mine), 1: (os.getpid(), fake)})
    fd = os.open(os.path.join(fake, "liveness"), os.O_RDWR)
    view = mmap.mmap(fd, liveness.RECORD)
    os.close(fd)
    return live, view


def fake(view, waiting=True, verdict=None):
    """PE 1's record in one heap: it waits (serial 5), nothing changes."""
    sequence[0] += 1
    liveness.write_record(view, sequence[0], liveness.encode({
        "pid": os.getpid(), "serial": 5, "epoch": 0, "waiting": waiting,
        "wait": "wait_until(y) still sees 0", "locks": [], "verdict": verdict, "gone": None,
        "left": None, "failed": [], "beat": 0}))


hooks = []


class Clock:
    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def sleep(seconds):
        for hook in list(hooks):
            hook()
        time.sleep(seconds)


liveness.time = Clock()
first, first_view = heap("a")
second, second_view = (None, None) if case != "cross" else heap("b")
result = {}
if case == "cross":
    # PE 0 waits in the second heap and proposes there (in the first, PE 1 runs); then
    # PE 1 offers its own verdict in the first heap, as a PE that proposed there at once
    fake(first_view, waiting=False)
    fake(second_view)
    waits_in = second

    def offer():
        if second._state["verdict"] is not None:
            hooks.clear()
            now = [process.COUNTS["serial"], process.COUNTS["epoch"]]
            fake(first_view, verdict={"kind": "deadlock", "text": "the first heap's verdict",
                                      "id": [1, 1], "at": {"0": now, "1": [5, 0]}})
    hooks.append(offer)
else:
    fake(first_view)
    waits_in = first
    if case == "committed":
        def commit():   # PE 1 saw every PE adopt the verdict and settled it first
            held = first._state["verdict"]
            if held is not None:
                hooks.clear()
                result["settled"] = first.settle_verdict(held["id"], COMMITTED, "test")
        hooks.append(commit)
deadline = time.monotonic() + 20
try:
    with liveness.watch(waits_in, lambda seen: "wait_until(x) still sees 0") as watch:
        while time.monotonic() < deadline and not waits_in._state["failed"]:
            watch.tick(0)
            time.sleep(0.005)
    result["error"] = None
except DeadlockError as exc:
    result["error"] = str(exc)
result["failed"] = waits_in._state["failed"]
result["again"] = [waits_in.settle_verdict(ident, COMMITTED, "test")
                   for ident in waits_in._state["failed"]]
print(json.dumps(result))
'''


def _verdict_case(tmp_path, case: str) -> dict:
    script = tmp_path / "verdict.py"
    script.write_text(VERDICT_SCRIPT)
    try:
        done = subprocess.run([sys.executable, str(script), case, str(tmp_path / "heaps")],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{case}: the verdict never settled: {exc.stderr}") from None
    assert done.returncode == 0, f"{case}: the verdict never settled: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_verdict_a_named_pe_never_adopts_is_abandoned_after_the_timeout(tmp_path):
    """A PE that neither adopts a proposed verdict nor goes on (it looks at
    another heap, or is stopped) held the proposer in Watch._decide for ever;
    after the heap's timeout the proposer makes it ABANDONED through the
    register (every PE that asks gets that) and waits on."""
    result = _verdict_case(tmp_path, "bound")
    assert result["error"] is None, result
    assert result["failed"] and result["again"] == [ABANDONED] * len(result["failed"]), result


def test_a_verdict_committed_by_another_pe_raises_even_after_the_timeout(tmp_path):
    """The bound goes through the same register: where another PE settled
    the verdict COMMITTED first, this PE raises it too, with its text."""
    result = _verdict_case(tmp_path, "committed")
    assert result.get("settled") == COMMITTED, result
    assert result["error"] and "a deadlock: every PE has waited" in result["error"], result


def test_a_verdict_offered_in_an_earlier_heap_is_adopted_by_a_pe_deciding_another(tmp_path):
    """The two-heaps hang: PEs proposed at once in two heaps, each then waited
    in its own heap for the others to adopt its verdict. A PE deciding a
    verdict that sees one for it in an earlier heap abandons its own (through
    the register) and adopts that one: every PE raises the same text."""
    result = _verdict_case(tmp_path, "cross")
    assert result["error"] == "PE 0: the first heap's verdict", result
    assert result["failed"] == [[0, 1]] and result["again"] == [ABANDONED], result
