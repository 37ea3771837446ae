"""Settings: arguments first, environment second, defaults last.

Every environment variable shmemvm reads is listed in SETTINGS, which is what
`python -m shmemvm info` prints.
"""

from __future__ import annotations

import math
import os
import re
from fractions import Fraction

SETTINGS = {
    "SHMEMVM_HEAP_SIZE": ("1G", "physical budget of each PE's heap (bytes; K/M/G/T suffixes, "
                                "1.5G too), rounded up to the backend granularity"),
    "SHMEMVM_BACKEND": ("auto", "host, cuda, hip, or auto (cuda/hip where a GPU is present)"),
    "SHMEMVM_VA_FACTOR": ("4", "address space reserved per heap, as a multiple of the heap size"),
    "SHMEMVM_HOST_GRANULARITY": ("64K", "segment granularity of the host backend"),
    "SHMEMVM_CHUNK_SIZE": ("auto", "allocations below this size are carved from segments of "
                                   "this size (a power of two >= the granularity; auto: heap "
                                   "size / 64 rounded up), so a heap has at most heap size / "
                                   "chunk segments, each costing one fd and one mapping per PE "
                                   "of the node; a chunk is returned only when all of it is free"),
    "SHMEMVM_TIMEOUT": ("60", "seconds any wait for the other PEs lasts (collectives, atomics, "
                              "off-node put/get) before raising (finite, > 0)"),
    "SHMEMVM_DEVICE": ("", "GPU index for this PE (default: node-local rank modulo GPU count)"),
    "SHMEMVM_NODE_SPLIT": ("", "force a node split on one machine: N = PEs per simulated node"),
    "SHMEMVM_AGREEMENT": ("auto", "how collective calls agree: board (through memory the PEs "
                                   "share, where every PE is on one node), mpi (an MPI "
                                   "allreduce every step), or auto (board where every PE has "
                                   "the compiled piece, SHMEMVM_NATIVE, or where MPI has no "
                                   "persistent collectives, i.e. before MPI 4.0; else mpi)"),
    "SHMEMVM_ANCHOR": ("auto", "device memory each PE keeps exported and mapped by the node's "
                               "other PEs for the heap's life, outside the heap size, because "
                               "the CUDA driver shares fresh memory 5-20x faster then (bytes, "
                               "0 = none; auto: 512M on CUDA where the node has several PEs, "
                               "else none)"),
    "SHMEMVM_NATIVE": ("auto", "the compiled fast paths on memory the node's PEs share (CPU "
                      "atomics, waits, the board's steps): auto (where every PE has them), "
                      "or 0 (the pure Python paths: MPI atomics, the Python board)"),
    "SHMEMVM_DEBUG": ("0", "1 = log every collective and mapping at DEBUG level"),
}

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """'64M' -> 67108864, '1.5G' -> 1610612736; integers pass through.

    Suffixes K, M, G, T are powers of 1024 (an optional B or iB after them is
    ignored). A fractional size is exact up to the byte and rounds up to a
    whole byte ('0.3K' -> 308). Where the size feeds a heap, the heap rounds
    it up again to its backend's granularity (SymmetricHeap.heap_size says
    the result)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text),
                         re.IGNORECASE)
    if not match:
        raise ValueError(f"cannot read {text!r} as a size; use e.g. 4096, 64K, 512M, 1.5G or 2G")
    return math.ceil(Fraction(match.group(1)) * _SUFFIX[match.group(2).upper()])


def setting(name: str, value=None) -> str:
    """The argument if given, else the environment, else the default."""
    if value is not None:
        return value
    return os.environ.get(name, SETTINGS[name][0])


def current() -> dict[str, str]:
    return {name: setting(name) for name in SETTINGS}
