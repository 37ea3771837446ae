"""Ctrl-C is never lost inside a callback that the garbage collector runs
(issue 32, item 5): a KeyboardInterrupt raised in a weakref callback is
"ignored" by Python (printed, then dropped), so the PE went on running while
the others raised. shmemvm's SIGINT handler (agreement/process.py) delivers
it again once the callback has returned."""

from __future__ import annotations

import os
import signal
import threading
import time

from shmemvm.agreement import process
from shmemvm.memory import ownership


class Storage:
    """Something to watch weakly (a storage, in the library)."""


def test_an_interrupt_inside_a_gc_callback_is_delivered_after_it():
    previous = signal.signal(signal.SIGINT, process.on_sigint)
    try:
        mailbox = ownership.Mailbox()
        storage = Storage()
        watch = ownership.watch(storage, mailbox.died, 0, 0, 0)
        # Ctrl-C arrives while the callback runs (what the GC calls when the storage dies)
        mailbox.after_close = lambda: os.kill(os.getpid(), signal.SIGINT)
        interrupted = False
        try:
            del storage
            until = time.monotonic() + 5
            while time.monotonic() < until:   # the interrupt lands here, in the program
                time.sleep(0.001)
        except KeyboardInterrupt:
            interrupted = True
        assert interrupted, "the KeyboardInterrupt was lost inside the callback"
        assert list(mailbox.events) == [watch], "the death itself was lost"
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupt_elsewhere_is_a_keyboard_interrupt_at_once():
    previous = signal.signal(signal.SIGINT, process.on_sigint)
    try:
        raised = False
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):
                pass
        except KeyboardInterrupt:
            raised = True
        assert raised
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_handler_is_installed_with_the_first_heap_only_over_pythons_own():
    """process.install() replaces Python's default SIGINT handler only."""
    assert signal.getsignal(signal.SIGINT) in (signal.default_int_handler, process.on_sigint)


def _pipe_as_stderr(monkeypatch):
    """A pipe in place of stderr (as under hydra): its write end and read end."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    monkeypatch.setattr(process.sys, "stderr", stream)
    return stream, read_end


def test_the_job_is_aborted_only_once_the_launcher_has_read_the_traceback(monkeypatch):
    # CI saw a Ctrl-C whose KeyboardInterrupt traceback never reached the log:
    # MPI_Abort ended hydra's forwarding while the traceback was still in the pipe
    stream, read_end = _pipe_as_stderr(monkeypatch)
    monkeypatch.setattr(process, "DRAIN_S", 5.0)      # it returns on the read, long before
    got = []

    def launcher():                       # reads the pipe a moment later
        time.sleep(0.15)
        got.append(os.read(read_end, 1 << 16))

    reader = threading.Thread(target=launcher)
    try:
        stream.write("Traceback ...\nKeyboardInterrupt\n")     # printed, not yet flushed
        reader.start()
        start = time.monotonic()
        process._drain_output()
        waited = time.monotonic() - start
        reader.join()
        assert got == [b"Traceback ...\nKeyboardInterrupt\n"]
        assert 0.1 < waited < 4.0, waited
    finally:
        stream.close()
        os.close(read_end)


def test_output_nobody_reads_holds_the_abort_back_no_longer_than_the_limit(monkeypatch):
    stream, read_end = _pipe_as_stderr(monkeypatch)
    try:
        stream.write("x" * 100)
        start = time.monotonic()
        process._drain_output()
        waited = time.monotonic() - start
        assert process.DRAIN_S <= waited < process.DRAIN_S + 1.0, waited
        assert os.read(read_end, 1000) == b"x" * 100      # flushed, not dropped
    finally:
        stream.close()
        os.close(read_end)


class _Writes:
    """A stream that keeps each write apart (an unbuffered stderr, as under
    PYTHONUNBUFFERED=1, hands each piece to the pipe as it comes)."""

    def __init__(self):
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_leaving_pe_prints_its_traceback_in_one_write(monkeypatch):
    # CI saw "ValueError: " and "user bug" apart in a job's log, another PE's
    # warning between them: with PYTHONUNBUFFERED=1 Python's own hook writes
    # the type, ": ", the message and the newline one by one
    stream = _Writes()
    monkeypatch.setattr(process.sys, "stderr", stream)
    monkeypatch.setattr(process, "_previous_hook", [process.sys.__excepthook__])
    monkeypatch.setattr(process, "OPEN", set())
    try:
        raise ValueError("user bug")
    except ValueError as exc:
        process.excepthook(ValueError, exc, exc.__traceback__)
    whole = [text for text in stream.writes if "ValueError: user bug\n" in text]
    assert len(whole) == 1, stream.writes
    assert whole[0].startswith("Traceback (most recent call last):\n"), whole[0]
    assert 'raise ValueError("user bug")' in whole[0], whole[0]


def test_a_hook_of_the_programs_own_is_still_called(monkeypatch):
    seen = []
    monkeypatch.setattr(process, "_previous_hook", [lambda *args: seen.append(args)])
    monkeypatch.setattr(process, "OPEN", set())
    error = RuntimeError("boom")
    process.excepthook(RuntimeError, error, None)
    assert seen == [(RuntimeError, error, None)]
