"""The anchor: a fixed piece of each PE's memory, exported once (the
descriptor stays open) and mapped by every PE of the node, for the heap's life.

It holds no data. It is there because the CUDA driver shares fresh memory
between processes about 8-12x faster while a process holds both (the
library's stored runs: a fresh 64 MiB malloc 7.6x, a fresh 1 GiB one 11.7x;
docs/performance.md). What it takes, measured on 2 x H200 with
tools/cuda_peer_map_probe.py:

- an open exported descriptor: without one, each export takes 1-2 ms and
  closing the last descriptor about as long; with one, an export takes
  about 0.1 ms;
- a peer's mapping of >= 512 MiB of its memory: without one, setting access
  to a peer's fresh 1 GiB takes 9-20 ms, with the other process's driver
  calls waiting meanwhile; with one, 50-110 us. 256 MiB was not enough.

Fresh segments of 64 MiB went from 3-5 ms to 0.45-0.65 ms, of 1 GiB from
12-23 ms to 0.8-2 ms. This is what NVSHMEM's own heap (512 MiB granules,
mapped by every peer) happens to give a process; the anchor gives it
without NVSHMEM. It costs its size in device memory per PE (the default: 512
MiB on CUDA where the node has several PEs, nothing elsewhere), outside the
heap's budget: SHMEMVM_ANCHOR sets it, 0 turns it off.
"""

from __future__ import annotations

import os

from ..memory.buddy import Segment
from ..config import parse_size, setting
from ..errors import Attempts, ShmemError

#: SHMEMVM_ANCHOR=auto on the CUDA backend where the node has other PEs
CUDA_ANCHOR = 512 << 20


def anchor_setting(value=None) -> int | str:
    """SHMEMVM_ANCHOR (or the anchor= argument): 'auto' or a size in bytes."""
    raw = setting("SHMEMVM_ANCHOR", value)
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    try:
        if isinstance(raw, bool):
            raise ValueError(raw)
        return parse_size(raw)
    except (TypeError, ValueError):
        raise ValueError(f"SHMEMVM_ANCHOR (the anchor= argument) must be 'auto', 0 or a size "
                         f"such as 512M, got {raw!r}") from None


def anchor_size(chosen: int | str, backend, node_pes: int) -> int:
    """The anchor's bytes for `chosen` (anchor_setting()): 0 where the node has
    no other PE (nothing is shared there), else rounded up to the granularity."""
    if node_pes < 2:
        return 0
    size = (CUDA_ANCHOR if backend.name == "cuda" else 0) if chosen == "auto" else int(chosen)
    granularity = backend.granularity
    return -(-size // granularity) * granularity


class Anchor:
    """This PE's anchor and its mappings of the node peers' anchors.

    Made in two halves: the constructor creates, maps and exports our piece;
    the heap's exchange then sends export() to every peer and hands theirs to
    map_peer(). close() releases everything, whatever was reached."""

    def __init__(self, backend, size: int, peers: list[int]):
        self.backend = backend
        self.size = size
        self.va = backend.reserve(size * (1 + len(peers)), backend.granularity)
        self._slots = {pe: self.va + size * (1 + i) for i, pe in enumerate(peers)}
        self._mapped: list[int] = []            # addresses mapped here, ours first
        self._handles: list = []                # ours first, then the peers'
        self.fd: int | None = None
        try:
            handle = backend.create(size)
            self._handles.append(handle)
            backend.map_accessible(self.va, size, handle)
            self._mapped.append(self.va)
            self.fd = backend.export_fd(handle)  # kept open: what makes exports fast
        except BaseException:
            self.close()
            raise

    def export(self, segment: Segment) -> int:
        """A descriptor of our piece for the exchange to send (it closes it)."""
        if self.fd is None:
            raise ShmemError("the node's anchor is closed (its heap was finalized): it has "
                             "nothing to export; make a new heap")
        return os.dup(self.fd)

    def map_peer(self, pe: int, segment: Segment, fd: int) -> None:
        """Map PE `pe`'s piece, received as `fd` (ours to close)."""
        handle = self.backend.import_fd(fd, self.size)
        try:
            self.backend.map_accessible(self._slots[pe], self.size, handle)
        except BaseException:
            self.backend.release(handle)
            raise
        self._handles.append(handle)
        self._mapped.append(self._slots[pe])

    def close(self) -> None:
        """Unmap and release everything; every part is tried. Raises the first
        failure after that."""
        attempts = Attempts()
        for va in reversed(self._mapped):
            attempts.attempt(self.backend.unmap, va, self.size)
        for handle in self._handles:
            attempts.attempt(self.backend.release, handle)
        self._mapped, self._handles = [], []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.va is not None and attempts.failure is None:  # a range still mapped stays
            attempts.attempt(self.backend.unreserve, self.va, self.size * (1 + len(self._slots)))
            self.va = None
        attempts.raise_first()
