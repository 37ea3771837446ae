"""Settings: arguments first, environment second, defaults last.

Every environment variable shmemvm reads is one entry of SETTINGS (its
default, a one-line meaning, the values it accepts in words, and the words or
the reader that check them). `python -m shmemvm info` prints the table, the
README's settings table lists the same entries (tests/unit/test_config.py keeps
them equal), and setting() reads the environment through it: a value the
table refuses raises ValueError naming the setting and what it accepts, and
open_heap checks every setting (check_all()), used by that heap or not.
"""

from __future__ import annotations

import math
import mmap
import os
import re
from fractions import Fraction
from typing import Callable, NamedTuple


class Setting(NamedTuple):
    """One environment variable: SETTINGS[name].default, .meaning (one line of
    help), .accepted (the values it takes, in words: errors and `info` say it),
    .choices (words it takes, compared stripped and lower-case) and .read (a
    reader of any other text, raising ValueError where it is not accepted)."""
    default: str
    meaning: str
    accepted: str
    choices: tuple[str, ...] = ()
    read: Callable[[str], object] | None = None


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


def _positive_size(text: str) -> int:
    size = parse_size(text)
    if size <= 0:
        raise ValueError(text)
    return size


def _pow2_size(minimum: int = 1) -> Callable[[str], int]:
    def read(text: str) -> int:
        size = parse_size(text)
        if size < minimum or size & (size - 1):
            raise ValueError(text)
        return size
    return read


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def read(text: str) -> int:
        number = int(text)
        if number < minimum:
            raise ValueError(text)
        return number
    return read


def _seconds(text: str) -> float:
    seconds = float(text)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(text)
    return seconds


def gpu_index(text: str) -> int | None:
    """SHMEMVM_DEVICE's text as a GPU index ('1', 'cuda:1', 'hip:1'); None where
    it is empty (the backend's default). ValueError where it is none of these."""
    text = str(text).strip().lower()
    if not text:
        return None
    match = re.fullmatch(r"(?:cuda:|hip:)?(\d+)", text)
    if not match:
        raise ValueError(f"cannot read {text!r} as a GPU index; use e.g. 0, 1 or cuda:1")
    return int(match.group(1))


_OFF = ("", "0")
_SWITCH = ("0", "1")

SETTINGS: dict[str, Setting] = {
    "SHMEMVM_HEAP_SIZE": Setting(
        "1G", "physical budget of each PE's heap (bytes; K/M/G/T suffixes, 1.5G too), rounded "
              "up to the backend granularity",
        "a size > 0 such as 4096, 64M, 1.5G or 2G", read=_positive_size),
    "SHMEMVM_BACKEND": Setting(
        "auto", "host, cuda, hip, or auto (cuda/hip where a GPU is present)",
        "auto, host, cuda or hip", choices=("auto", "host", "cuda", "hip")),
    "SHMEMVM_VA_FACTOR": Setting(
        "4", "address space reserved per heap, as a multiple of the heap size",
        "an integer >= 1", read=_int_at_least(1)),
    "SHMEMVM_HOST_GRANULARITY": Setting(
        "64K", "segment granularity of the host backend",
        f"a power of two of at least the page size ({mmap.PAGESIZE}), such as 64K",
        read=_pow2_size(mmap.PAGESIZE)),
    "SHMEMVM_CHUNK_SIZE": Setting(
        "auto", "allocations below this size are carved from segments of this size (a power "
                "of two >= the granularity; auto: heap size / 64 rounded up), so a heap has at "
                "most heap size / chunk segments, each costing one fd and one mapping per PE "
                "of the node; a chunk is returned only when all of it is free",
        "auto or a power of two >= the backend's granularity, such as 16M",
        choices=("", "auto"), read=_pow2_size()),
    "SHMEMVM_TIMEOUT": Setting(
        "60", "seconds any wait for the other PEs lasts (collectives, atomics, off-node "
              "put/get) before raising (finite, > 0)",
        "a finite number of seconds > 0, such as 60 or 0.5", read=_seconds),
    "SHMEMVM_DEVICE": Setting(
        "", "GPU index for this PE (default: node-local rank modulo GPU count)",
        "empty (the default) or a GPU index such as 0, 1 or cuda:1", choices=("",),
        read=gpu_index),
    "SHMEMVM_NODE_SPLIT": Setting(
        "", "force a node split on one machine: N = PEs per simulated node",
        "empty (no split) or an integer >= 1", choices=("",), read=_int_at_least(1)),
    "SHMEMVM_AGREEMENT": Setting(
        "auto", "how collective calls agree: board (through memory the PEs share, where every "
                "PE is on one node), mpi (an MPI allreduce every step), or auto (board where "
                "every PE has the compiled piece, SHMEMVM_NATIVE, or where MPI has no "
                "persistent collectives, i.e. before MPI 4.0; else mpi)",
        "auto, board or mpi", choices=("auto", "board", "mpi")),
    "SHMEMVM_ANCHOR": Setting(
        "auto", "device memory each PE keeps exported and mapped by the node's other PEs for "
                "the heap's life, outside the heap size, because the CUDA driver shares fresh "
                "memory 8-12x faster then (bytes, 0 = none; auto: 512M on CUDA where the node "
                "has several PEs, else none)",
        "auto, 0 or a size such as 512M", choices=("auto",), read=parse_size),
    "SHMEMVM_NATIVE": Setting(
        "auto", "the compiled fast paths on memory the node's PEs share (CPU atomics, waits, "
                "the board's steps): auto (where every PE has them), or 0 (the pure Python "
                "paths: MPI atomics, the Python board)",
        "auto or 0 (also 1/on/true/yes for auto, off/false/no for 0)",
        choices=("auto", "1", "on", "true", "yes", "0", "off", "false", "no")),
    "SHMEMVM_DEBUG": Setting(
        "0", "1 = log every collective and mapping at DEBUG level",
        "0 or 1", choices=_OFF + _SWITCH),
    "SHMEMVM_PROFILE": Setting(
        "0", "1 = time the steps of every collective allocation of every heap "
             "(shmemvm.core.profile)",
        "0 or 1", choices=_OFF + _SWITCH),
}


def check(name: str, text: str) -> str:
    """`text` if SETTINGS[name] accepts it, else ValueError naming the setting,
    the value, and what it accepts."""
    entry = SETTINGS[name]
    if text.strip().lower() in entry.choices:
        return text
    if entry.read is not None:
        try:
            entry.read(text)
            return text
        except (TypeError, ValueError):
            pass
    raise ValueError(f"{name} must be {entry.accepted}, got {text!r} from the environment "
                     f"(unset it for the default{f' {entry.default!r}' if entry.default else ''}; "
                     f"`python -m shmemvm info` lists every setting)")


def setting(name: str, value=None) -> str:
    """The argument if given (its reader checks it), else the environment
    (checked here: ValueError where SETTINGS[name] refuses it), else the default."""
    if value is not None:
        return value
    text = os.environ.get(name)
    if text is None:
        return SETTINGS[name].default
    return check(name, text)


def raw(name: str) -> str:
    """The environment's text for `name`, else the default, unchecked (`info`
    shows a bad value instead of failing on it)."""
    return os.environ.get(name, SETTINGS[name].default)


def check_all() -> None:
    """Every setting in the environment is one its entry accepts (ValueError
    naming the first that is not), used by this heap or not."""
    for name in SETTINGS:
        setting(name)


def current() -> dict[str, str]:
    return {name: setting(name) for name in SETTINGS}
