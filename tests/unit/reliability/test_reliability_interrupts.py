"""Ctrl-C is never lost inside a callback that the garbage collector runs
(issue 32, item 5): a KeyboardInterrupt raised in a weakref callback is
"ignored" by Python (printed, then dropped), so the PE went on running while
the others raised. shmemvm's SIGINT handler (agreement/process.py) delivers
it again once the callback has returned."""

from __future__ import annotations

import os
import signal
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
