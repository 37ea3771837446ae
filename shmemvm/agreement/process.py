"""What the liveness records (liveness.py) know of this whole process, not of
one heap (issue 32): the waits of every heap and thread, which threads could
still write, and a PE that leaves on an exception or a signal.

One process may hold several heaps over the same PEs. A wait in one heap can
be ended only by a PE that runs, whatever heap it waits in; so every heap's
record says whether *this process* waits (each of its threads is inside a
watched wait, of any heap, or idle), and its waits, serial and progress epoch
are the process's, published in every open heap's record.

Threads: a thread counts as one that may still write unless it is inside a
watched wait without a deadline of its own, or idle. Idle means what the
kernel says (/proc/self/task/<tid>/syscall): blocked in a process-private
futex wait with no timeout, which is what a lock acquire, queue.get(),
Thread.join() or Event.wait() without a timeout come to (an idle
ThreadPoolExecutor worker, a thread waiting on a queue, torch's and OpenMP's
idle pools). Such a thread can be woken only by another thread of this
process, and those wait or are idle too. Every other thread (running,
sleeping, waiting with a timeout, blocked in I/O or on a futex shared with
other processes) may write, so while one exists no deadlock is declared.
Every Python thread counts, also those started with _thread.start_new_thread,
which `threading` does not list (the interpreter's count of them is, and as
their native ids are unknown, such a thread outside a wait counts as one that
may write). Threads that never run Python (MPI's progress thread, torch's
and OpenMP's pools) do not count: they write only what a Python thread's call
asked for. Where /proc cannot tell (another kernel, another architecture), a
thread outside a wait counts as one that may write.

Leaving: once the process leaves on an exception that nothing caught (or a
signal turned into one), every open heap's record says "left" first, so that
every waiting PE raises PeerDeadError naming this PE within a check (about a
fifth of a second), and a PE in a collective step raises too; then the
traceback is printed as before, the others are given a moment to see it, and
the job is aborted (MPI_Abort, as `python -m mpi4py` does, once the
launcher has read what was printed), so that no PE waits in MPI_Finalize
for one that has left. Ctrl-C (SIGINT) raises
KeyboardInterrupt as Python's own handler does, except inside shmemvm's
callbacks that the garbage collector runs (an exception there would be
"ignored" and the interrupt lost): there it is delivered again once the
callback has returned.
"""

from __future__ import annotations

import _thread
import atexit
import logging
import os
import signal
import stat
import struct
import sys
import threading
import time
import traceback as tracebacks
import weakref
from collections.abc import Callable

from ..errors import clip

log = logging.getLogger("shmemvm")

#: one lock for every heap's liveness of this process and the state below
LOCK = threading.RLock()
#: the open heaps' Liveness objects
OPEN: weakref.WeakSet = weakref.WeakSet()
#: every watched wait of this process (liveness.Watch), any heap, any thread
WAITS: list = []
#: serial: bumped whenever a wait starts or ends; epoch: whenever what one reads
#: changes; since: when either last changed (time.monotonic()); waiting: as last published
COUNTS = {"serial": 0, "epoch": 0, "since": 0.0, "waiting": False, "heaps": 0}
#: native ids of shmemvm's own heartbeat threads (never writers)
BEATING: set[int] = set()
#: PEs this process saw dead (a PeerDeadError was raised for them): it then
#: does not wait in MPI_Finalize at exit (a PE that left on an exception ends
#: the job itself: excepthook)
LOST: list[str] = []

#: the futex system call's number, by machine
_FUTEX = {"x86_64": 202, "aarch64": 98, "riscv64": 98, "ppc64le": 221, "ppc64": 221,
          "s390x": 238}.get(os.uname().machine)
_FUTEX_PRIVATE = 128
_FUTEX_WAITS = (0, 9)          # FUTEX_WAIT, FUTEX_WAIT_BITSET
_TASKS = "/proc/self/task"


def idle(tid: int) -> bool:
    """Thread `tid` of this process is blocked for good unless another of its
    threads wakes it (module doc); False where that cannot be told."""
    try:
        with open(f"{_TASKS}/{tid}/syscall", "rb") as status:
            fields = status.read().split()
    except FileNotFoundError:
        return True       # it has ended
    except OSError:
        return False
    if _FUTEX is None or len(fields) < 5 or fields[0] != str(_FUTEX).encode():
        return False
    try:
        op, timeout = int(fields[2], 16), int(fields[4], 16)
    except ValueError:
        return False
    return bool(op & _FUTEX_PRIVATE) and (op & 0x7F) in _FUTEX_WAITS and timeout == 0


def python_threads() -> tuple[set[int], int]:
    """(the native ids of the Python threads that `threading` lists, the number
    of Python threads it does not list: started with _thread.start_new_thread)."""
    listed = threading.enumerate()
    return ({thread.native_id for thread in listed if thread.native_id is not None},
            max(0, 1 + _thread._count() - len(listed)))


def waiting() -> bool:
    """This process waits: it has a watched wait without a deadline, none with
    one, and each of its Python threads is in such a wait or idle (module doc).
    Threads that never run Python (MPI's, torch's pools) do not count: they
    write nothing the program did not ask a Python thread's call to write."""
    waits = list(WAITS)
    if not waits or any(watch.deadline is not None for watch in waits):
        return False
    inside = {watch.tid for watch in waits} | BEATING
    listed, unlisted = python_threads()
    if unlisted > len(inside - listed):
        return False     # a thread that `threading` does not list, outside a wait: may write
    return all(tid in inside or idle(tid) for tid in listed)


# -- leaving ----------------------------------------------------------------------------------
_installed = [False]
_previous_hook: list[Callable[..., object] | None] = [None]
#: how long a leaving PE gives the others to see that it left, at most
GRACE_S = 3.0
#: shmemvm's callbacks that the garbage collector runs: (module, qualified name)
GC_CALLBACKS = {("shmemvm.memory.ownership", "Mailbox.died"),
                ("shmemvm.memory.vmm", "VMemPow2Allocator._drain_after_close"),
                ("shmemvm.memory.vmm", "VMemPow2Allocator._absorb_events")}


def install() -> None:
    """Chain sys.excepthook, register the exit check and, where Python's own
    SIGINT handler is in place (main thread), shmemvm's (module doc). Once per
    process; called as the first heap is made."""
    if _installed[0]:
        return
    _installed[0] = True
    _previous_hook[0] = sys.excepthook
    sys.excepthook = excepthook
    atexit.register(_at_exit)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)


def in_gc_callback(frame) -> bool:
    """Whether `frame`, or a frame that called it, is one of shmemvm's GC callbacks."""
    while frame is not None:
        code = frame.f_code
        if (frame.f_globals.get("__name__"), getattr(code, "co_qualname", code.co_name)) \
                in GC_CALLBACKS:
            return True
        frame = frame.f_back
    return False


def on_sigint(signum, frame) -> None:
    """SIGINT: KeyboardInterrupt, as Python's handler, but never inside a GC
    callback of shmemvm, where it would be lost: there it is delivered again
    a moment later, from another thread)."""
    if in_gc_callback(frame):
        # (not interrupt_main() here: the handler would run again at once, in here)
        _thread.start_new_thread(_deliver_again, (signum,))
        return
    raise KeyboardInterrupt


def _deliver_again(signum: int) -> None:
    """In a thread of its own: the signal again, a moment later (the GC
    callback has returned by then, or it is put off once more)."""
    time.sleep(0.001)
    _thread.interrupt_main(signal.Signals(signum))


def leave(why: str) -> None:
    """Publish in every open heap's record that this process leaves (`why`)."""
    with LOCK:
        for liveness in list(OPEN):
            try:
                liveness.leave(why)
            except Exception:   # noqa: BLE001 - leaving anyway; tell the rest
                log.exception("shmemvm: could not publish that this PE leaves")


#: a heap was left on an exception (heap.py) and released: its PEs had no time yet
LEFT_HEAP = [False]
#: how long the PEs of a heap left that way are given to see it (they check
#: their waits about five times a second)
LEFT_GRACE_S = 1.0


def excepthook(kind, value, traceback) -> None:
    """sys.excepthook: say that this PE leaves (before anything else), print
    the traceback (the previous hook), give the others a moment to see it,
    then end the job (MPI_Abort) where MPI is still initialized."""
    text = f"{kind.__name__}: {value}" if str(value) else kind.__name__
    heaps = list(OPEN)
    leave(f"an exception nobody caught ({clip(text, 300)})")
    previous = _previous_hook[0] or sys.__excepthook__
    try:
        if previous is sys.__excepthook__:
            _print_whole(kind, value, traceback)
        else:
            previous(kind, value, traceback)
    finally:
        if heaps or LEFT_HEAP[0]:
            _give_the_others_time(heaps)
            _abort(1)


def _print_whole(kind, value, traceback) -> None:
    """Python's own hook, in one write: unbuffered (PYTHONUNBUFFERED=1) it
    writes the type, ": ", the message and the newline one by one, and the
    other PEs' output, merged by the launcher, landed between them."""
    try:
        text = "".join(tracebacks.format_exception(kind, value, traceback))
    except Exception:  # noqa: BLE001 - an exception that cannot be formatted
        sys.__excepthook__(kind, value, traceback)
        return
    sys.stderr.write(text)
    sys.stderr.flush()


def _give_the_others_time(heaps) -> None:
    """Wait (at most GRACE_S) until every PE of `heaps` has seen that this one
    left: it has left too (its own exception, or its exit), or is dead."""
    until = time.monotonic() + (GRACE_S if heaps else LEFT_GRACE_S)
    while time.monotonic() < until:
        if heaps and all(liveness.all_seen() for liveness in heaps):
            return
        time.sleep(0.02)


def _abort(status: int) -> None:
    """MPI_Abort where MPI runs a job of several processes (else nothing)."""
    try:
        from mpi4py import MPI
        if not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() < 2:
            return
        _drain_output()
        MPI.COMM_WORLD.Abort(status)
    except Exception:  # noqa: BLE001 - at exit: nothing else to do
        pass


#: how long MPI_Abort waits for the launcher to read what this process printed
DRAIN_S = 0.5


def _drain_output() -> None:
    """Flush stdout and stderr, then wait (at most DRAIN_S) until the launcher
    has read what is still in them where they are pipes (hydra's, Open MPI's):
    MPI_Abort ends its forwarding at once, and the traceback just printed
    would be lost with it (a Ctrl-C that printed no KeyboardInterrupt)."""
    pipes = []
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            fd = stream.fileno()
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append(fd)
        except (AttributeError, OSError, ValueError):    # closed, replaced, not a file
            continue
    until = time.monotonic() + DRAIN_S
    while pipes and time.monotonic() < until:
        pipes = [fd for fd in pipes if _unread(fd) > 0]
        if pipes:
            time.sleep(0.002)


def _unread(fd: int) -> int:
    """Bytes written to the pipe `fd` and not yet read (FIONREAD answers on
    either end of a pipe); 0 where it cannot tell."""
    import fcntl
    import termios
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _at_exit() -> None:
    """At exit, after a PE died: MPI_Finalize would wait for it for ever."""
    if LOST:
        log.warning("shmemvm: ending the job without MPI_Finalize: %s", LOST[0])
        heaps = list(OPEN)
        leave(f"its program ended after {LOST[0]}")
        _give_the_others_time(heaps)   # (those that have not seen it yet)
        _abort(1)
