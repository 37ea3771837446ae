"""The fd exchange on the node: new segments' file descriptors to every peer.

A collective step that creates segments hands each of them to every other
PE of the node as one datagram on the peer's FdChannel (fdpass.py): a header
naming the sender, the step number and a status, the segments' (offset, size,
generation), and one descriptor per segment (SCM_RIGHTS). Every PE sends and
receives interleaved, with one deadline for the whole exchange.

A new segment is sent before it is mapped here: the heap creates its
physical memory only, and the exchange runs the heap's local work (mapping
it, attaching it to the MPI window) once the datagrams are out, so that it
overlaps the peers' imports of them.

The exchange is one half of a transaction (the heap agrees on its outcome
right after and undoes it everywhere on failure), so it must leave nothing
behind whatever fails:
- a PE that cannot create or export its memory still sends every peer a
  datagram, with status FAILED and no descriptors, so nobody waits for it in
  vain (a PE whose allocator failed before it knew its segments sends none);
- a PE whose local work fails after sending keeps receiving like one that
  failed while receiving; its peers may have mapped what it sent, and drop
  it when the step is undone;
- a PE that fails while receiving (mapping a peer's memory: ENOMEM, a bad
  descriptor, a peer that sent something else) keeps receiving until it has
  heard from every peer, closing what it no longer maps, so no datagram of
  this step stays in its mailbox to be read at the next one;
- a datagram of an earlier step that is still there (its receiver gave up on
  it) is discarded with a log line, not taken for the current one;
- a datagram whose descriptors the kernel could not all install here (this
  PE is at RLIMIT_NOFILE: MSG_CTRUNC) counts as heard from its sender, and
  the step fails with a ResourceLimitError naming the limit (limits.py).
Anything not from the expected peer process is rejected (fdpass.py).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time

from ..memory.buddy import Segment
from ..errors import PeerTimeoutError, ResourceLimitError, ShmemError
from .fdpass import FdChannel, Message
from ..memory.limits import fds_exhausted

log = logging.getLogger("shmemvm")

MAGIC = b"SHMEMVM2"
HEADER = struct.Struct("<8siQIi")   # magic, source PE, step number, segment count, status
SEGMENT = struct.Struct("<QQQ")     # offset, size, generation
OK, FAILED = 0, 1                   # status: the segments follow / the sender could not export


def encode(source: int, seq: int, segments: list[Segment], status: int = OK) -> bytes:
    """The datagram PE `source` sends for step `seq` creating `segments`."""
    return HEADER.pack(MAGIC, source, seq, len(segments), status) + b"".join(
        SEGMENT.pack(s.offset, s.size, s.generation) for s in segments)


class Exchange:
    """This PE's side of the exchange with the other PEs of its node."""

    def __init__(self, channel: FdChannel, my_pe: int, peer_paths: dict[int, str],
                 peer_pids: dict[int, int], timeout: float):
        self.channel = channel
        self.my_pe = my_pe
        self.peer_paths = peer_paths
        self.peer_pids = peer_pids
        self.timeout = timeout

    def run(self, seq: int, created: list[Segment], export, map_peer, text: str,
            within: Segment | None = None, *, local=None,
            failed: BaseException | None = None) -> None:
        """Send our new segments (`export(segment)` gives a descriptor to send,
        ours to close) to every PE of the node and hand theirs to
        `map_peer(pe, segment, fd)` (which owns `fd` from then on).

        `local()`, where given, is this PE's own work on its new segments
        (mapping them here): it runs once our datagrams are on their way, so
        that it overlaps the peers' imports of them, and also where the node
        has no other PE. `failed`: this PE already failed (creating its
        memory); it sends FAILED instead of descriptors, runs no local work,
        and the step fails here like any other failure.

        Each peer sends the same segments as we do, except with `within`
        (imported memory, laid out by another allocator on each PE): then each
        peer's segments need only lie inside that range, of its generation.

        Returns when every peer's datagram of step `seq` was received. Raises
        ShmemError when this PE failed (after hearing from every peer), and
        PeerTimeoutError when a peer was not heard from within the timeout."""
        failure: BaseException | None = failed
        fds: list[int] = []
        if self.peer_paths and failure is None:
            try:
                for segment in created:
                    fds.append(export(segment))
            except Exception as exc:  # tell the peers, so that they do not wait for us
                failure = exc
                _close(fds)
                fds = []
        payload = encode(self.my_pe, seq, created, OK if failure is None else FAILED)
        failed_peers: list[int] = []
        # Send and receive interleaved: a mailbox holds only net.unix.max_dgram_qlen
        # datagrams (often 10), so with more peers than that (or a flood from a rogue)
        # PEs that only sent before receiving would wait on each other forever.
        unsent, waiting = sorted(self.peer_paths), set(self.peer_paths)
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                still = []
                for pe in unsent:
                    try:
                        if not self.channel.try_send(self.peer_paths[pe], payload, fds):
                            still.append(pe)
                    except OSError as exc:  # its socket is gone: it will not answer either
                        failure = failure or exc
                unsent = still
                if local is not None:
                    # Our datagrams are out (or queued for a full mailbox): our own
                    # mapping now overlaps the peers' imports of what we sent.
                    if failure is None:
                        try:
                            local()
                        except Exception as exc:  # noqa: BLE001 - fails the step, after
                            failure = exc            # hearing from every peer
                    local = None
                if not unsent and not waiting:
                    break
                try:
                    if not waiting:
                        raise socket.timeout
                    message = self.channel.receive(
                        min(deadline, time.monotonic() + 0.001) if unsent else deadline)
                except socket.timeout:
                    if time.monotonic() < deadline:
                        if not waiting:
                            time.sleep(0.0005)  # only sends left: their mailboxes drain
                        continue
                    raise PeerTimeoutError(
                        f"PE {self.my_pe}: {text} waited {self.timeout:g} s (SHMEMVM_TIMEOUT) "
                        f"for the new memory of PE(s) {_pe_list(sorted(waiting)) or '-'}; "
                        f"mailbox full at PE(s) {_pe_list(unsent) or '-'}") from None
                source, status, problem, theirs = self._accept(message, seq, created, waiting,
                                                               within)
                if source is None:
                    continue
                waiting.discard(source)
                if problem is not None:
                    failure = failure or problem
                elif status == FAILED:
                    failed_peers.append(source)
                elif failure is not None or failed_peers:
                    _close(message.fds)  # nothing will use it: the step fails anyway
                else:
                    failure = self._map(source, theirs, message.fds, map_peer)
        finally:
            _close(fds)
        if failure is not None:
            kind = ResourceLimitError if isinstance(failure, ResourceLimitError) else ShmemError
            raise kind(f"PE {self.my_pe}: {text}: {failure}") from failure
        if failed_peers:
            log.debug("PE %d: %s: PE(s) %s could not share their memory", self.my_pe, text,
                      _pe_list(failed_peers))

    @staticmethod
    def _map(source: int, created: list[Segment], fds: list[int], map_peer):
        """Map `source`'s segments; the error that stopped it, if any (the
        descriptors not handed to map_peer are closed)."""
        for i, (segment, fd) in enumerate(zip(created, fds)):
            try:
                map_peer(source, segment, fd)
            except Exception as exc:
                _close(fds[i + 1:])
                return exc
        return None

    def _accept(self, message: Message, seq: int, expected: list[Segment], waiting: set[int],
                within: Segment | None = None):
        """(source PE, status, problem, its segments) for the datagram we wait
        for from that PE of this step; all None where it is not one (rejected:
        logged, its descriptors closed). `problem` says how it is out of step
        with ours (its descriptors are closed then too)."""
        if len(message.payload) < HEADER.size:
            self.channel.reject(message, "too short to be a shmemvm message")
            return None, None, None, None
        magic, source, their_seq, count, status = HEADER.unpack_from(message.payload)
        if magic != MAGIC:
            self.channel.reject(message, "not a shmemvm message")
            return None, None, None, None
        if message.pid != self.peer_pids.get(source) or message.uid != os.getuid():
            self.channel.reject(message, f"claims to be PE {source}, whose pid is "
                                         f"{self.peer_pids.get(source)}")
            return None, None, None, None
        if their_seq < seq:
            self.channel.reject(message, f"stale: PE {source} sent it for step #{their_seq}, "
                                         f"this is step #{seq}")
            return None, None, None, None
        if source not in waiting:
            self.channel.reject(message, f"a second message from PE {source} for step #{seq}")
            return None, None, None, None
        if message.truncated:
            _close(message.fds)
            return source, status, fds_exhausted(
                f"receiving PE {source}'s new memory ({len(message.fds)} of {count} "
                f"descriptors arrived)"), None
        body = message.payload[HEADER.size:]
        segments = [Segment(*SEGMENT.unpack_from(body, i * SEGMENT.size)) for i in range(count)
                    ] if len(body) == count * SEGMENT.size else None
        fds_expected = count if status == OK else 0
        # A PE that failed before it knew its segments (its allocator raised)
        # sends FAILED without any; every other datagram names ours.
        unnamed_failure = status == FAILED and segments == []
        if their_seq != seq or not (unnamed_failure or _matches(segments, expected, within)) \
                or len(message.fds) != fds_expected \
                or status not in (OK, FAILED):
            self.channel.reject(message, "out of step with this collective")
            return source, status, ShmemError(
                f"PE {source} sent segments {segments} for step #{their_seq} where this PE "
                f"expected {expected if within is None else f'pieces inside {within}'} for "
                f"#{seq}: the heaps diverged"), None
        return source, status, None, segments


def _matches(segments: list[Segment] | None, expected: list[Segment],
             within: Segment | None) -> bool:
    """A peer's segments are ours, or (imported memory) pieces inside `within`."""
    if within is None or segments is None:
        return segments == expected
    return bool(segments) and all(
        within.offset <= s.offset and s.offset + s.size <= within.offset + within.size
        and s.generation == within.generation for s in segments)


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _pe_list(pes: list[int]) -> str:
    return ", ".join(map(str, pes))
