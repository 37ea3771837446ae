"""The compiled piece (shmemvm/native/_native.c): CPU atomics, atomic loads, copies
and the board's steps on shared memory. Single process; the contention tests fork
processes that hammer one word of a shared mapping at once, as the node's PEs
do, and count that nothing is lost. Its vote at init, under MPI:
tests/mpi/native/test_native_vote.py."""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import struct

import pytest

from shmemvm import native

pytestmark = pytest.mark.skipif(native._native is None,
                                reason="the compiled piece is not built (pip install . builds it)")

#: every word kind: typecode -> (min, max) of its values (floats: a few values)
INTEGERS = {"b": (-2**7, 2**7 - 1), "B": (0, 2**8 - 1), "h": (-2**15, 2**15 - 1),
            "H": (0, 2**16 - 1), "i": (-2**31, 2**31 - 1), "I": (0, 2**32 - 1),
            "q": (-2**63, 2**63 - 1), "Q": (0, 2**64 - 1)}


def _word(code: str, value=0) -> tuple[array.array, int]:
    word = array.array(code, [value])
    return word, word.buffer_info()[0]


@pytest.mark.parametrize("code", sorted(INTEGERS))
def test_every_integer_operation_on_every_width(code):
    low, high = INTEGERS[code]
    word, address = _word(code, 5)
    assert native.atomic(address, code, native.ADD, 3) == 5 and word[0] == 8
    assert native.atomic(address, code, native.FETCH) == 8 and word[0] == 8
    assert native.atomic(address, code, native.SET, 12) == 8 and word[0] == 12
    assert native.atomic(address, code, native.AND, 4) == 12 and word[0] == 4
    assert native.atomic(address, code, native.OR, 3) == 4 and word[0] == 7
    assert native.atomic(address, code, native.XOR, 5) == 7 and word[0] == 2
    assert native.atomic(address, code, native.CAS, 9, 3) == 2 and word[0] == 2   # no swap
    assert native.atomic(address, code, native.CAS, 9, 2) == 2 and word[0] == 9   # swap
    # the ends of the range, and wrapping as the C type wraps
    assert native.atomic(address, code, native.SET, high) == 9
    assert native.atomic(address, code, native.ADD, 1) == high and word[0] == low
    assert native.load(address, code) == low


@pytest.mark.parametrize("code", ["f", "d"])
def test_floats_fetch_set_swap_only(code):
    word, address = _word(code, 1.5)
    assert native.atomic(address, code, native.FETCH) == 1.5
    assert native.atomic(address, code, native.SET, -2.25) == 1.5 and word[0] == -2.25
    assert native.load(address, code) == -2.25
    with pytest.raises(ValueError, match="does not apply"):
        native.atomic(address, code, native.ADD, 1.0)


def test_bad_addresses_and_kinds_are_refused_not_dereferenced():
    word, address = _word("q")
    with pytest.raises(ValueError, match="not aligned"):
        native.atomic(address + 4, "q", native.ADD, 1)
    with pytest.raises(ValueError, match="null"):
        native.load(0, "q")
    with pytest.raises(ValueError, match="bad word kind"):
        native._native.atomic(address, 42, 0, 0, 0)
    with pytest.raises(OverflowError):
        native.atomic(address, "Q", native.SET, -1)     # the caller checks ranges; C refuses too


def test_copy_moves_bytes_between_addresses():
    source, target = array.array("b", b"symmetric!"), array.array("b", bytes(10))
    native.copy(target.buffer_info()[0], source.buffer_info()[0], 10)
    assert target.tobytes() == b"symmetric!"
    native.copy(target.buffer_info()[0] + 2, target.buffer_info()[0], 5)   # overlapping
    assert target.tobytes() == b"sysymme" + b"ic!"


@pytest.mark.parametrize("nbytes", [64 * 1024 - 1, 64 * 1024, 64 * 1024 + 3, 1 << 20, 3 * (1 << 20) + 5])
def test_a_large_copy_moves_what_memmove_moves_apart_and_overlapping(nbytes):
    # from 64 KiB on a copy is one `rep movsb` where the CPU has FSRM (FAST_STRINGS),
    # which copies forward: ranges that overlap must still move as memmove moves them
    import random
    total = 2 * nbytes + 4096
    data = random.Random(nbytes).randbytes(total)
    for dst, src in ((nbytes + 1000, 7), (3, nbytes + 999),        # apart, odd alignments
                     (1001, 7), (7, 1001), (64, 0), (0, 64)):      # overlapping both ways
        moved = bytearray(data)
        moved[dst:dst + nbytes] = data[src:src + nbytes]
        buffer = array.array("B", data)
        native.copy(buffer.buffer_info()[0] + dst, buffer.buffer_info()[0] + src, nbytes)
        assert buffer.tobytes() == bytes(moved), (nbytes, dst, src, native._native.FAST_STRINGS)


def _in_children(count: int, body) -> None:
    """Run body(child index) in `count` forked processes at once; each must exit 0."""
    pids = []
    for child in range(count):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                body(child)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    assert all(os.waitpid(pid, 0)[1] == 0 for pid in pids)


@pytest.mark.parametrize("code", ["i", "I", "q", "Q", "h"])
def test_contended_adds_and_compare_swaps_lose_nothing(code):
    """Four processes (more than this machine's cores: the scheduler interleaves
    them mid-loop) add to one word and take turns on another with
    compare-and-swap; every update lands exactly once."""
    region = mmap.mmap(-1, 64, flags=mmap.MAP_SHARED)
    anchor = ctypes.c_char.from_buffer(region)
    base = ctypes.addressof(anchor)
    size = struct.calcsize(code)
    counter, turn = base, base + 8   # both 8-byte aligned, so any width is aligned
    rounds = 20000 if size > 2 else 4000

    def body(child):
        for _ in range(rounds):
            native.atomic(counter, code, native.ADD, 1)
        for _ in range(200):   # a CAS increment: retry until this PE's swap wins
            while True:
                old = native.load(turn, code)
                if native.atomic(turn, code, native.CAS, old + 1, old) == old:
                    break

    _in_children(4, body)
    mask = (1 << (8 * size)) - 1
    assert native.load(counter, code) == (4 * rounds) & mask
    assert native.load(turn, code) == 800
    del anchor
    region.close()


def test_board_slots_written_in_c_read_in_python_and_back():
    """The compiled board and agreement/board.py's Python one use one layout and
    one test: each reads what the other wrote, and a half-written slot (a wrong
    CRC, an older step) is not taken."""
    import zlib
    words, seq_word = 6, 4
    slot = array.array("q", bytes(8 * (words + 2)))
    address = slot.buffer_info()[0]
    vector = array.array("q", [1, 2, 3, -4, 7, 9])
    native.board_write(address, vector, 7)
    assert slot[0] == 7 and slot[1:1 + words].tolist() == vector.tolist()
    assert slot[1 + words] == zlib.crc32(vector.tobytes())       # the Python board's check
    out = array.array("q", bytes(8 * words))
    assert native.board_read(address, words, 7, seq_word, 10, out) and out == vector
    assert not native.board_read(address, words, 8, seq_word, 10, out)   # not that step yet
    slot[1 + words] ^= 1                                                   # a torn write
    assert not native.board_read(address, words, 7, seq_word, 10, out)


def test_copies_from_and_into_buffers_check_their_length():
    import numpy as np
    source = np.arange(100_000, dtype=np.uint8)      # past the size that lets the GIL go
    dest = np.zeros_like(source)
    assert native.address(source) == source.ctypes.data
    native.copy_from(dest.ctypes.data + 10, source, 5)
    assert dest[10:15].tolist() == [0, 1, 2, 3, 4] and dest[:10].sum() == dest[15:].sum() == 0
    native.copy_into(dest, source.ctypes.data, source.nbytes)
    assert np.array_equal(dest, source)
    with pytest.raises(ValueError, match="bytes asked of a buffer of"):
        native.copy_from(dest.ctypes.data, source[:4], 5)     # never reads past the buffer
    with pytest.raises(ValueError, match="bytes asked of a buffer of"):
        native.copy_into(dest[:4], source.ctypes.data, 5)
    with pytest.raises((BufferError, ValueError), match="read-only"):   # never written
        native.copy_into(np.frombuffer(b"abcd", np.uint8), source.ctypes.data, 2)
    with pytest.raises(ValueError, match="null"):
        native.copy_from(0, source, 1)
    with pytest.raises(ValueError):
        native.copy_into(dest, source.ctypes.data, -1)


def test_wanted_needs_both_compiled_pieces(monkeypatch):
    """A heap votes once for the compiled paths: without _collective (the
    board's steps, the node collectives) it must not say yes."""
    monkeypatch.setenv("SHMEMVM_NATIVE", "auto")
    monkeypatch.setattr(native, "_native", object())
    monkeypatch.setattr(native, "_collective", object())
    assert native.wanted() is True
    monkeypatch.setattr(native, "_collective", None)
    assert native.wanted() is False
    monkeypatch.setattr(native, "_collective", object())
    monkeypatch.setattr(native, "_native", None)
    assert native.wanted() is False
