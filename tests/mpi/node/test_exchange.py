"""The fd exchange as a transaction (exchange.py; host backend): a PE that
fails while sending or receiving still hears every peer out, so the step
fails on every PE, nothing stays in a mailbox, no descriptor leaks, and the
next new segments work. Run under mpirun -n 2, 3 and 4 (the suite runs 1, 2
and 4; the receiving failure needs 3 PEs, so that a second peer's datagram is
still queued when the first one fails to map).
"""

from __future__ import annotations

import errno
import logging
import os
import time

import pytest
from mpi4py import MPI

from shmemvm import ShmemError
from shmemvm.node import exchange
from shmemvm.memory.buddy import Segment
from shmemvm.core.state import parts_of
from util import open_fds

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD

HEAP_OPTIONS = {"backend": "host", "timeout": 10}  # the conftest heap fixture


def new_segment_round_trip(heap, nbytes: int = 256 << 10) -> None:
    """A malloc that creates (and exchanges) a new segment, checked, freed and
    given back, so that the next one is new again."""
    t = heap.malloc(nbytes)
    t.fill_(heap.my_pe)
    heap.barrier_all()
    for pe in range(heap.n_pes):
        assert int(heap.ptr(t, pe)[nbytes - 1]) == pe
    heap.barrier_all()
    heap.free(t)
    heap.trim()


def warm_up(heap) -> None:
    new_segment_round_trip(heap)          # sockets, peer windows, first mappings made
    new_segment_round_trip(heap)


def still_works_and_kept_nothing(heap, fds: int, rejected: int) -> None:
    """After a failed step: new segments still go round, no datagram was
    rejected, and no descriptor is left open."""
    for _ in range(3):
        new_segment_round_trip(heap)
    assert parts_of(heap).channel.rejected == rejected
    assert open_fds() == fds


def injected_enomem(calls: list):
    """A PeerTable.map that fails once as mmap would without memory (it owns
    the descriptor, so it closes it, as the real one does)."""
    def fail(pe, segment, fd):
        os.close(fd)
        calls.append(pe)
        raise OSError(errno.ENOMEM, "Cannot allocate memory (injected)")
    return fail


@pytest.mark.mpi(min_size=3)
def test_failure_while_receiving_drains_the_mailbox_and_fails_everywhere(heap, monkeypatch,
                                                                        caplog):
    caplog.set_level(logging.WARNING, logger="shmemvm")
    victim = heap.n_pes - 1
    warm_up(heap)
    fds, rejected = open_fds(), parts_of(heap).channel.rejected
    calls: list[int] = []
    if heap.my_pe == victim:
        monkeypatch.setattr(parts_of(heap).peers, "map", injected_enomem(calls))
    start = time.monotonic()
    with pytest.raises(ShmemError, match=r"failed while PEs shared the new memory") as info:
        heap.malloc(1 << 20)
    assert time.monotonic() - start < heap.timeout / 2     # no PE waited for a deadline
    if heap.my_pe == victim:
        assert len(calls) == 1 and "Cannot allocate memory" in str(info.value)
        monkeypatch.undo()
    assert heap.heap_info()["live_allocations"] == 0     # undone on every PE
    for _ in range(100):                                 # the mailbox holds nothing stale
        new_segment_round_trip(heap, 64 << 10)
    assert parts_of(heap).channel.rejected == rejected, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if "stale" in r.getMessage()]
    assert open_fds() == fds                              # every descriptor was closed


@pytest.mark.mpi(min_size=2)
def test_failure_to_export_tells_the_peers_instead_of_timing_out(heap, monkeypatch):
    victim = heap.n_pes - 1
    warm_up(heap)
    fds, rejected = open_fds(), parts_of(heap).channel.rejected
    if heap.my_pe == victim:
        def no_descriptors(segment):
            raise OSError(errno.EMFILE, "Too many open files (injected)")
        monkeypatch.setattr(parts_of(heap).local, "export", no_descriptors)
    start = time.monotonic()
    with pytest.raises(ShmemError, match=r"failed while PEs shared the new memory") as info:
        heap.malloc(1 << 20)
    assert time.monotonic() - start < heap.timeout / 2
    if heap.my_pe == victim:
        assert "Too many open files" in str(info.value)
        monkeypatch.undo()
    still_works_and_kept_nothing(heap, fds, rejected)


@pytest.mark.mpi(min_size=2)
def test_failure_to_create_memory_tells_the_peers_instead_of_timing_out(heap, monkeypatch):
    """A PE that cannot create its new memory sends FAILED (no descriptors) in
    the exchange, as for an export failure: one vote after it undoes the call."""
    victim = heap.n_pes - 1
    warm_up(heap)
    fds, rejected = open_fds(), parts_of(heap).channel.rejected
    exported: list[int] = []
    if heap.my_pe == victim:
        def no_memory(size):
            raise OSError(errno.ENOMEM, "Cannot allocate memory (injected)")
        monkeypatch.setattr(heap.backend, "create", no_memory)
        monkeypatch.setattr(parts_of(heap).local, "export", lambda segment: exported.append(segment))
    start = time.monotonic()
    with pytest.raises(ShmemError, match=r"failed while PEs shared the new memory") as info:
        heap.malloc(1 << 20)
    assert time.monotonic() - start < heap.timeout / 2
    if heap.my_pe == victim:
        assert "Cannot allocate memory" in str(info.value) and not exported
        monkeypatch.undo()
    assert heap.heap_info()["live_allocations"] == 0
    still_works_and_kept_nothing(heap, fds, rejected)


@pytest.mark.mpi(min_size=2)
def test_failure_to_map_our_memory_after_sending_it_is_undone_by_the_peers_too(heap,
                                                                             monkeypatch):
    """Our new memory is sent before we map it: when mapping it here fails, the
    peers have imported and mapped it already, and they unmap it at the undo."""
    victim = heap.n_pes - 1
    warm_up(heap)
    fds, rejected = open_fds(), parts_of(heap).channel.rejected
    imported: list[int] = []
    real_map = parts_of(heap).peers.map
    if heap.my_pe == victim:
        def no_mapping(created):
            raise OSError(errno.ENOMEM, "Cannot allocate memory (injected)")
        monkeypatch.setattr(parts_of(heap).local, "map_created", no_mapping)
    else:
        def counting(pe, segment, fd):
            real_map(pe, segment, fd)
            imported.append(pe)
        monkeypatch.setattr(parts_of(heap).peers, "map", counting)
    start = time.monotonic()
    with pytest.raises(ShmemError, match=r"failed while PEs shared the new memory") as info:
        heap.malloc(1 << 20)
    assert time.monotonic() - start < heap.timeout / 2
    monkeypatch.undo()
    if heap.my_pe == victim:
        assert "Cannot allocate memory" in str(info.value)
    else:
        assert victim in imported      # it had reached us before the victim failed
    for pe in parts_of(heap).peers.windows:      # and nobody keeps anything of the call mapped
        assert [s.offset for s in parts_of(heap).peers.mapped(pe)] == \
            [s.offset for s in parts_of(heap).local._core.segments()]
    assert heap.heap_info()["live_allocations"] == 0
    still_works_and_kept_nothing(heap, fds, rejected)


@pytest.mark.mpi(min_size=2)
def test_stale_datagram_of_an_earlier_step_is_discarded_with_a_log_line(heap, caplog):
    caplog.set_level(logging.WARNING, logger="shmemvm")
    warm_up(heap)
    fds, rejected = open_fds(), parts_of(heap).channel.rejected
    if heap.my_pe == 1:   # from PE 1's own process, so its credentials are right
        fd = os.memfd_create("shmemvm-stale", 0)
        os.ftruncate(fd, 64 << 10)
        stale = exchange.encode(1, parts_of(heap).agreement.seq - 1, [Segment(0, 64 << 10, 1)])
        assert parts_of(heap).channel.try_send(parts_of(heap).peer_paths[0], stale, [fd])
        os.close(fd)
    heap.barrier_all()                                   # queued in PE 0's mailbox now
    new_segment_round_trip(heap)                         # its exchange meets it first
    if heap.my_pe == 0:
        assert parts_of(heap).channel.rejected == rejected + 1
        lines = [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
        assert len(lines) == 1 and "PE 1 sent it for step #" in lines[0], lines
    else:
        assert parts_of(heap).channel.rejected == rejected
    assert open_fds() == fds                             # its descriptor was closed
    heap.barrier_all()


def test_wire_format_round_trip():
    segments = [Segment(0, 65536, 1), Segment(1 << 20, 1 << 20, 7)]
    payload = exchange.encode(3, 42, segments, exchange.FAILED)
    magic, source, seq, count, status = exchange.HEADER.unpack_from(payload)
    assert (magic, source, seq, count, status) == (exchange.MAGIC, 3, 42, 2, exchange.FAILED)
    body = payload[exchange.HEADER.size:]
    assert [Segment(*exchange.SEGMENT.unpack_from(body, i * exchange.SEGMENT.size))
            for i in range(count)] == segments
