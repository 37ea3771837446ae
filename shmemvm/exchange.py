"""The fd exchange on the node: new segments' file descriptors to every peer.

A collective that creates segments hands each of them to every other PE of
the node as a datagram on the peer's FdChannel: a header naming the sender and
the collective, the segments' (offset, size, generation), and one descriptor
per segment (SCM_RIGHTS). Every PE sends and receives interleaved, with one
deadline for the whole exchange.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from .allocator import Segment
from .errors import PeerTimeoutError, ShmemError
from .fdpass import FdChannel, Message

MAGIC = b"SHMEMVM1"
HEADER = struct.Struct("<8siQI")    # magic, source PE, collective number, segment count
SEGMENT = struct.Struct("<QQQ")     # offset, size, generation


def encode(source: int, seq: int, segments: list[Segment]) -> bytes:
    """The datagram PE `source` sends for collective `seq` creating `segments`."""
    return HEADER.pack(MAGIC, source, seq, len(segments)) + b"".join(
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

    def run(self, seq: int, created: list[Segment], export, map_peer, text: str) -> None:
        """Send our new segments (`export(segment)` gives a descriptor to send)
        to every PE of the node and hand theirs to `map_peer(pe, segment, fd)`."""
        if not self.peer_paths:
            return
        payload = encode(self.my_pe, seq, created)
        fds = [export(segment) for segment in created]
        # Send and receive interleaved: a mailbox holds only net.unix.max_dgram_qlen
        # datagrams (often 10), so with more peers than that (or a flood from a rogue)
        # PEs that only sent before receiving would wait on each other forever.
        unsent, waiting = sorted(self.peer_paths), set(self.peer_paths)
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                unsent = [pe for pe in unsent
                          if not self.channel.try_send(self.peer_paths[pe], payload, fds)]
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
                source = self._accept(message, seq, created, waiting)
                if source is not None:
                    for segment, fd in zip(created, message.fds):
                        map_peer(source, segment, fd)
                    waiting.discard(source)
        finally:
            for fd in fds:
                os.close(fd)

    def _accept(self, message: Message, seq: int, expected: list[Segment],
                waiting: set[int]) -> int | None:
        """The sending PE if `message` is the one we wait for from it, else None
        (the message is then rejected: logged, its descriptors closed)."""
        if len(message.payload) < HEADER.size:
            self.channel.reject(message, "too short to be a shmemvm message")
            return None
        magic, source, their_seq, count = HEADER.unpack_from(message.payload)
        if magic != MAGIC:
            self.channel.reject(message, "not a shmemvm message")
            return None
        if source not in waiting or message.pid != self.peer_pids.get(source) \
                or message.uid != os.getuid():
            self.channel.reject(message, f"claims to be PE {source}, whose pid is "
                                         f"{self.peer_pids.get(source)}")
            return None
        body = message.payload[HEADER.size:]
        segments = [Segment(*SEGMENT.unpack_from(body, i * SEGMENT.size)) for i in range(count)
                    ] if len(body) == count * SEGMENT.size else None
        if their_seq != seq or segments != expected or len(message.fds) != count:
            self.channel.reject(message, "out of step with this collective")
            raise ShmemError(f"PE {source} sent segments {segments} for collective #{their_seq} "
                             f"where this PE expected {expected} for #{seq}: the heaps diverged")
        return source


def _pe_list(pes: list[int]) -> str:
    return ", ".join(map(str, pes))
