"""Rogue local processes against a PE's fd-passing socket (host backend; run
under mpirun -n 1, 2 and 4; the exchange needs at least 2 PEs on the node).

A rogue that can reach the socket (same user) may send garbage, descriptors,
or a well-formed message claiming to come from a peer PE. Every such message
is rejected and logged, its descriptors are closed, nothing of it is mapped,
and the next collective that exchanges memory completes with the right data.
Other users cannot reach the socket at all (its directory is 0700).
"""

from __future__ import annotations

import array
import copy
import gc
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from mpi4py import MPI

from shmemvm.node import exchange
from shmemvm import SymmetricHeap
from shmemvm.core.state import parts_of
from util import open_fds, shmemvm_mappings

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD
ROGUE = Path(__file__).resolve().parents[2] / "helpers" / "rogue_sender.py"
ROGUE_NAME = "memfd:shmemvm-rogue"


HEAP_OPTIONS = {"backend": "host"}  # the conftest heap fixture, pinned to host memory


def run_rogue(path: str, *kinds: str) -> dict:
    done = subprocess.run([sys.executable, str(ROGUE), path, *kinds], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def forged_payload(heap: SymmetricHeap, source: int, nbytes: int) -> bytes:
    """Exactly what PE `source` will send for the next malloc(nbytes): the right
    magic, collective number and segments (predicted with a copy of the pure
    allocator)."""
    _, created = copy.deepcopy(parts_of(heap).local._core).allocate(nbytes)
    assert created, "the malloc must create a segment for this test"
    return exchange.encode(source, parts_of(heap).agreement.seq + 1, created)


def rogue_lines() -> list[str]:
    with open("/proc/self/maps") as maps:
        mapped = [line for line in maps if "rogue" in line]
    return mapped + [entry for entry in open_fds() if "rogue" in entry]


def check_new_memory(heap: SymmetricHeap, t: torch.Tensor) -> None:
    """Every PE's copy of `t` holds what that PE wrote, seen through ptr, get and put."""
    me, n = heap.my_pe, heap.n_pes
    t.fill_(me)
    heap.barrier_all()
    for pe in range(n):
        view = heap.ptr(t, pe)
        assert bool((view == pe).all()), f"PE {pe}'s memory as mapped here is not its own"
        back = torch.empty_like(t)
        heap.get(back, t, pe)
        assert bool((back == pe).all())
    heap.barrier_all()
    heap.put(t, torch.full_like(t, 100 + me), (me + 1) % n)
    heap.barrier_all()
    assert bool((t == 100 + (me - 1) % n).all())


def test_socket_directory_is_private(heap):
    directory = Path(parts_of(heap).channel.directory)
    info = directory.stat()
    assert stat.S_ISDIR(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
    assert info.st_uid == os.getuid()
    sock = Path(parts_of(heap).channel.path)
    assert sock.parent == directory and stat.S_ISSOCK(sock.stat().st_mode)
    assert sock.stat().st_uid == os.getuid()
    # one private directory per PE, none shared
    directories = world.allgather(str(directory))
    assert len(set(directories)) == len(directories)


def _interpreter_for_nobody() -> str | None:
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            done = subprocess.run([candidate, "-c", "pass"], user=65534, group=65534,
                                  capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a process as another user")
def test_other_users_cannot_reach_the_socket(heap):
    python = _interpreter_for_nobody()
    if python is None:
        pytest.skip("no Python interpreter that user 65534 may run")
    code = ("import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            "try:\n    s.sendto(b'x' * 64, sys.argv[1])\n"
            "except PermissionError:\n    print('EACCES')\nelse:\n    print('SENT')\n")
    done = subprocess.run([python, "-c", code, parts_of(heap).channel.path], user=65534, group=65534,
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "EACCES", (done.stdout, done.stderr)
    heap.barrier_all()
    rejected = parts_of(heap).channel.rejected
    t = heap.malloc(1 << 20)                        # nothing arrived to be rejected
    assert parts_of(heap).channel.rejected == rejected
    check_new_memory(heap, t)


@pytest.mark.mpi(min_size=2)
def test_rogue_messages_are_rejected_logged_and_never_mapped(heap, caplog):
    caplog.set_level(logging.WARNING, logger="shmemvm")
    me, n = heap.my_pe, heap.n_pes
    nbytes = 1 << 20
    t0 = heap.malloc(4096)                          # map the first segments before we start
    heap.barrier_all()
    gc.collect()
    fds_before, maps_before = open_fds(), shmemvm_mappings()
    rejected_before = parts_of(heap).channel.rejected
    left = (me - 1) % n

    # a rogue process: garbage, descriptors, and a perfect forgery claiming to be a peer
    forged = forged_payload(heap, left, nbytes).hex()
    rogue = run_rogue(parts_of(heap).channel.path, "garbage", "garbage-fd", "short-fd", "empty-fd",
                      f"forged:{forged}", "many-fds", "oversize-fd")
    # a rogue thread of this very process, with a socket of its own: same forgery
    def thread_rogue():
        fd = os.memfd_create("shmemvm-rogue", 0)
        os.ftruncate(fd, 1 << 20)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendmsg([bytes.fromhex(forged)],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))], 0,
                      parts_of(heap).channel.path)
        os.close(fd)
    thread = threading.Thread(target=thread_rogue)
    thread.start()
    thread.join()
    sent = rogue["delivered"] + 1
    assert rogue["delivered"] == 7

    heap.barrier_all()                              # every rogue message is queued now
    t = heap.malloc(nbytes)                         # a new segment: the exchange reads them

    assert parts_of(heap).channel.rejected - rejected_before == sent
    records = [r.getMessage() for r in caplog.records
               if r.name == "shmemvm" and "rejected a message" in r.getMessage()]
    assert len(records) == sent, records
    assert sum(f"from pid {rogue['pid']} " in r for r in records) == rogue["delivered"]
    assert sum(f"from pid {os.getpid()} " in r for r in records) == 1     # the thread
    text = "\n".join(records)
    for reason in ("not a shmemvm message", "too short", f"claims to be PE {left}",
                   "truncated"):
        assert reason in text, text
    assert "(200 fds)" in text

    # nothing of the rogue's is open or mapped; the new memory is the peers'
    assert rogue_lines() == []
    new_fds = open_fds() - fds_before
    assert all("memfd:shmemvm (deleted)" in entry for entry in new_fds), new_fds
    assert not any(ROGUE_NAME in line for line in shmemvm_mappings())
    assert len(shmemvm_mappings()) > len(maps_before)
    block = parts_of(heap).local.block_of(t)
    for pe in parts_of(heap).peers.windows:
        assert block.segment in parts_of(heap).peers.mapped(pe)
    check_new_memory(heap, t)
    heap.free(t)
    heap.free(t0)


@pytest.mark.mpi(min_size=2)
def test_flooded_mailboxes_do_not_stall_the_exchange(heap, caplog):
    """A rogue fills every PE's mailbox (net.unix.max_dgram_qlen datagrams): PEs
    that only sent before receiving would all block in send and time out."""
    caplog.set_level(logging.WARNING, logger="shmemvm")
    rejected_before = parts_of(heap).channel.rejected
    flood = run_rogue(parts_of(heap).channel.path, "flood")
    assert flood["delivered"] >= 1
    heap.barrier_all()
    start = time.monotonic()
    t = heap.malloc(1 << 20)
    assert time.monotonic() - start < 5, "the exchange stalled behind the flood"
    assert parts_of(heap).channel.rejected - rejected_before == flood["delivered"]
    assert rogue_lines() == []
    check_new_memory(heap, t)
    heap.free(t)


@pytest.mark.mpi(min_size=2)
def test_rogue_message_between_collectives_is_harmless_later(heap, caplog):
    """Queued while no exchange runs, read (and rejected) at the next one, even
    many collectives later; the collectives that exchange nothing are unaffected."""
    caplog.set_level(logging.WARNING, logger="shmemvm")
    keep = heap.malloc(64)                          # its small segment is exchanged now
    rejected_before = parts_of(heap).channel.rejected
    run_rogue(parts_of(heap).channel.path, "garbage-fd")
    for _ in range(20):
        heap.barrier_all()
        heap.free(heap.malloc(64))                  # same small segment: no exchange
    assert parts_of(heap).channel.rejected == rejected_before
    t = heap.malloc(2 << 20)
    assert parts_of(heap).channel.rejected == rejected_before + 1
    assert rogue_lines() == []
    check_new_memory(heap, t)
    heap.free(t)
    heap.free(keep)
