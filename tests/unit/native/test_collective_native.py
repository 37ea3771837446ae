"""native/_collective.c on its own (issue 30): exchange() over a board in
process memory with one PE, combine() folds in order like the Python
combiners, and every entry point refuses what it is given wrongly with a
ValueError, never a crash."""

from __future__ import annotations

import array
import ctypes
import functools
import time

import numpy as np
import pytest

_collective = pytest.importorskip("shmemvm.native._collective")

# a slot: the step word and its summary (8 words), a vector of 4 words, its check word and
# 88 payload bytes (whole cache lines: 24 words)
WORDS, SEQ_WORD, SLOT, VECTOR_AT = 4, 1, 24, 8


def _board(size: int):
    memory = np.zeros(2 * size * SLOT, dtype=np.int64)
    return memory, memory.ctypes.data, memory.nbytes


def _exchange(board, nbytes, size, rank, seq, vector, out, done, payload=0, payload_len=0,
              scratch=None, part=0, src_offset=0, dst_stride=0, only=-1, *, volatile=0,
              slot=SLOT):
    return _collective.exchange(board, nbytes, size, rank, slot, WORDS, SEQ_WORD, 16, volatile,
                                seq,
                                vector, out, done, payload, payload_len, scratch, part,
                                src_offset, dst_stride, only)


def test_one_pe_step_writes_its_slot_and_gathers_its_payload():
    memory, board, nbytes = _board(1)
    vector = array.array("q", [7, 3, -3, 9])
    out, done = array.array("q", bytes(32)), bytearray(1)
    payload = np.arange(8, dtype=np.uint8)
    scratch = bytearray(8)
    assert _exchange(board, nbytes, 1, 0, 3, vector, out, done, payload.ctypes.data, 8,
                     scratch, 8, 0, 8) == 0
    assert list(out) == list(vector) and done == b"\x01"
    assert bytes(scratch) == payload.tobytes()
    slot = memory[SLOT:2 * SLOT]          # step 3: bank 1
    assert slot[0] == 3 and list(slot[VECTOR_AT:VECTOR_AT + 4]) == list(vector)


def test_a_missing_pe_is_left_and_the_max_is_taken_once_it_writes():
    memory, board, nbytes = _board(2)
    out0, done0 = array.array("q", bytes(32)), bytearray(2)
    assert _exchange(board, nbytes, 2, 0, 2, array.array("q", [1, 2, 5, 0]), out0, done0) == 1
    out1, done1 = array.array("q", bytes(32)), bytearray(2)
    assert _exchange(board, nbytes, 2, 1, 2, array.array("q", [4, 2, -1, 8]), out1, done1) == 0
    assert _exchange(board, nbytes, 2, 0, 2, None, out0, done0) == 0
    assert list(out0) == list(out1) == [4, 2, 5, 8]


@pytest.mark.parametrize("seed", range(40))
def test_the_summary_line_gives_the_max_of_every_word_as_the_whole_vectors_do(seed):
    """A PE whose summary hash is the reader's own folds only its volatile words
    (one cache line); any other its whole vector. Either way `out` is the MAX of
    every word over every PE: vectors that agree but for the volatile words,
    that differ in one other word on one PE, or anywhere."""
    rng = np.random.default_rng(seed)
    size, volatile = int(rng.integers(1, 6)), 0b1100      # words 2 and 3 may differ
    memory, board, nbytes = _board(size)
    common = rng.integers(-2**62, 2**62, WORDS)
    vectors = []
    for pe in range(size):
        v = common.copy()
        v[2:] = rng.integers(-2**62, 2**62, 2)           # the volatile words: each PE's own
        case = seed % 3
        if case == 1 and pe == size - 1:
            v[0] += int(rng.choice([-1, 1]))              # one other word, one PE
        elif case == 2:
            v[0] = rng.integers(-2**62, 2**62)            # every word anywhere
        v[SEQ_WORD] = 5
        vectors.append(array.array("q", v.tolist()))
    outs, dones = [], []
    for pe in range(size):
        out, done = array.array("q", bytes(8 * WORDS)), bytearray(size)
        _exchange(board, nbytes, size, pe, 5, vectors[pe], out, done, volatile=volatile)
        outs.append(out)
        dones.append(done)
    expected = np.max(np.array([list(v) for v in vectors]), axis=0).tolist()
    for pe in range(size):   # (the early PEs read the later ones' slots now)
        assert _exchange(board, nbytes, size, pe, 5, None, outs[pe], dones[pe],
                         volatile=volatile) == 0
        assert list(outs[pe]) == expected, (pe, seed)


@pytest.mark.parametrize("dtype,kind", [("i1", 0), ("u1", 1), ("i2", 2), ("u2", 3), ("i4", 4),
                                        ("u4", 5), ("i8", 6), ("u8", 7), ("f4", 8), ("f8", 9)])
def test_combine_folds_in_pe_order_like_numpy(dtype, kind):
    rng = np.random.default_rng(30)
    n, count = 3, 37
    if dtype[0] == "f":
        parts = (rng.standard_normal((n, count)) * 1e3).astype(dtype)
        ops = {0: np.add, 1: np.multiply}
    else:
        parts = rng.integers(0, 256, (n, count * np.dtype(dtype).itemsize),
                             dtype=np.uint8).view(dtype)
        ops = {0: np.add, 1: np.multiply, 2: np.minimum, 3: np.maximum, 4: np.bitwise_and,
               5: np.bitwise_or, 6: np.bitwise_xor}
    scratch = np.ascontiguousarray(parts)
    for code, ufunc in ops.items():
        expected = parts[0].copy()
        for i in range(1, n):
            ufunc(expected, parts[i], out=expected)
        got = np.zeros(count, dtype)
        _collective.combine(got.ctypes.data, got.nbytes, scratch, n, kind, code)
        assert got.tobytes() == expected.tobytes(), (dtype, code)


def test_combine_from_addresses_is_combine_and_refuses_overlaps():
    rng = np.random.default_rng(7)
    parts = [rng.standard_normal(100).astype("f4") for _ in range(4)]
    expected = parts[0].copy()
    for part in parts[1:]:
        expected += part
    got = np.zeros(100, "f4")
    _collective.combine_from(got.ctypes.data, got.nbytes, tuple(p.ctypes.data for p in parts),
                             8, 0)
    assert got.tobytes() == expected.tobytes()
    first = parts[0].copy()
    _collective.combine_from(first.ctypes.data, first.nbytes,       # into the first source
                             (first.ctypes.data, *(p.ctypes.data for p in parts[1:])), 8, 0)
    assert first.tobytes() == expected.tobytes()
    with pytest.raises(ValueError, match="overlaps source 1"):
        _collective.combine_from(parts[1].ctypes.data, 400, tuple(p.ctypes.data for p in parts),
                                 8, 0)
    with pytest.raises(ValueError):
        _collective.combine_from(got.ctypes.data, 400, (), 8, 0)
    with pytest.raises(ValueError):
        _collective.combine_from(got.ctypes.data, 400, (got.ctypes.data + 1,), 8, 0)
    with pytest.raises(TypeError):
        _collective.combine_from(got.ctypes.data, 400, [parts[0].ctypes.data], 8, 0)



@pytest.mark.parametrize("seed", range(6))
def test_deliver_collected_writes_what_the_python_check_and_delivery_write(seed):
    """A collect's delivery in one call (nodecoll.Collected) against the Python
    path it shortcuts (collectives._collect_fits, then nodecoll's delivery):
    on random counts, bounds and element sizes, C writes exactly the Python
    path's bytes where its check passes, and nothing where it refuses the
    counts or a count does not fit its payload (the Python path decides there)."""
    from types import SimpleNamespace

    from shmemvm.agreement.board import PAYLOAD
    from shmemvm.openshmem.collectives import _collect_fits
    from shmemvm.transport import nodecoll
    rng = np.random.default_rng(seed)
    outcomes = set()
    for _ in range(60):
        n, size = int(rng.integers(1, 6)), int(rng.choice([1, 2, 4, 8, 16]))
        words = array.array("q", bytes(n * PAYLOAD))
        raw = np.frombuffer(words, dtype=np.uint8)
        raw[:] = rng.integers(0, 256, raw.size, dtype=np.uint8)
        counts = [int(rng.integers(0, 40)) * size for _ in range(n)]
        if rng.random() < 0.15:   # a count past its payload, or below zero
            counts[int(rng.integers(n))] = int(rng.choice([-size, PAYLOAD - 8 + size]))
        for pe, count in enumerate(counts):
            words[pe * PAYLOAD // 8] = count
        total = sum(max(c, 0) for c in counts)
        dest_count = int(rng.integers(0, total // size + 8))
        d = int(rng.integers(0, 4)) * 256
        s = d + int(rng.integers(-300, 600)) if rng.random() < 0.5 else d + 100_000
        s = max(s, 0)
        got = np.full(total + 64, 0xEE, dtype=np.uint8)
        want = got.copy()
        written = _collective.deliver_collected(got.ctypes.data, words, n, PAYLOAD, d, s,
                                                dest_count, size)
        outcomes.add(written)
        try:
            _collect_fits("collect", d, s, dest_count, size, [c // size for c in counts])
            if not all(0 <= c <= PAYLOAD - 8 for c in counts):
                raise ValueError("a count past its payload")
        except ValueError:
            assert written is False and got.tobytes() == want.tobytes()
            continue
        nodecoll._deliver_collected(SimpleNamespace(scratch=words), counts, want.ctypes.data)
        assert written is True and got.tobytes() == want.tobytes()
    assert outcomes == {True, False}   # (both sides of the check, every seed)

def test_every_entry_point_refuses_bad_arguments():
    memory, board, nbytes = _board(2)
    vector, out, done = array.array("q", bytes(32)), array.array("q", bytes(32)), bytearray(2)
    bad = [
        lambda: _exchange(board, nbytes, 2, 2, 1, vector, out, done),            # rank >= size
        lambda: _exchange(board, nbytes, 0, 0, 1, vector, out, done),            # no PEs
        lambda: _exchange(board, nbytes, 4, 0, 1, vector, out, done),            # board too small
        lambda: _exchange(0, nbytes, 2, 0, 1, vector, out, done),                # null board
        lambda: _exchange(board + 1, nbytes, 2, 0, 1, vector, out, done),        # misaligned
        lambda: _exchange(board, nbytes, 2, 0, 1, array.array("q", [1]), out, done),
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, array.array("q", [0]), done),
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, bytearray(1)),
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, 0, 89),     # > payload area
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, 0, -1),
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, 0, 8),      # null payload
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, 0, 0, bytearray(8), 8, 0,
                          8),                                                    # scratch short
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, 0, 0, None, 8),
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, 0, 0, bytearray(64), 8,
                          84, 0),                                                # past the area
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, volatile=0b10),  # seq word
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, volatile=0b10000),  # > words
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, slot=SLOT - 1),  # not lines
        lambda: _exchange(board, nbytes, 2, 0, 1, vector, out, done, only=2),
        lambda: _collective.combine(out.buffer_info()[0], 8, bytearray(8), 2, 6, 0),  # scratch
        lambda: _collective.combine(out.buffer_info()[0], -8, bytearray(8), 1, 6, 0),
        lambda: _collective.combine(out.buffer_info()[0], 8, bytearray(8), 1, 8, 2),  # float min
        lambda: _collective.combine(out.buffer_info()[0], 8, bytearray(8), 1, 10, 0),
        lambda: _collective.combine(out.buffer_info()[0], 6, bytearray(8), 1, 6, 0),  # not whole
        lambda: _collective.combine(0, 8, bytearray(8), 1, 6, 0),
        lambda: _collective.deliver(out.buffer_info()[0], bytearray(8), 4, 8),
        lambda: _collective.deliver(out.buffer_info()[0], bytearray(8), 0, -1),
        lambda: _collective.deliver(1 << 60, bytearray(8), 0, 8),
        lambda: _collective.deliver_collected(out.buffer_info()[0], bytearray(64), 2, 64, 0,
                                              0, 8, 8),                          # scratch short
        lambda: _collective.deliver_collected(out.buffer_info()[0], bytearray(128), 2, 64, -1,
                                              0, 8, 8),
        lambda: _collective.deliver_collected(out.buffer_info()[0], bytearray(128), 2, 64, 0,
                                              0, 8, 0),                          # no element size
        lambda: _collective.deliver_collected(0, bytearray([8] + [0] * 127), 2, 64, 0, 64, 8,
                                              8),                                # null dst
    ]
    for i, call in enumerate(bad):
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"case {i} was accepted")
    assert memory.sum() == 0     # nothing was written by a refused call


# step(): a vector of 6 words: phase, step number, its negation, flag, time, an argument
STEP_WORDS, SKIP = 6, (1 << 3) | (1 << 4)       # the flag and the time are not compared


def _stepper(board, nbytes, size, rank, send, out, done, *, tick=10**9, hot=0):
    return _collective.Stepper(board, nbytes, size, rank, SLOT, STEP_WORDS, 1, 16, SKIP, 2, 3, 4,
                               tick, send, out, done, hot)


def _step(board, nbytes, size, rank, seq, template, send, out, done, *, flag=True,
          prompt=-1, budget=0, tick=10**9, hot=0):
    stepper = _stepper(board, nbytes, size, rank, send, out, done, tick=tick, hot=hot)
    return stepper.step(prompt, budget, seq, template, flag, 0, 0, None, 0, 0, 0, -1)


def _step_buffers():
    return array.array("q", bytes(48)), array.array("q", bytes(48)), bytearray(2)


def test_step_fills_the_vector_and_says_whether_the_outcome_is_plain():
    memory, board, nbytes = _board(2)
    template = array.array("q", [5, 0, 0, 0, 0, 42])
    (send0, out0, done0), (send1, out1, done1) = _step_buffers(), _step_buffers()
    assert _step(board, nbytes, 2, 0, 7, template, send0, out0, done0) == 1    # PE 1 not there
    assert list(send0[:4]) == [5, 7, -7, -1] and send0[4] < 0 and send0[5] == 42
    assert _step(board, nbytes, 2, 1, 7, template, send1, out1, done1) == 0    # plain
    assert _exchange_step(board, nbytes, 0, 7, out0, done0) == 0
    # a different argument (smaller here: the MAX is the other PE's): every slot read,
    # but not plain (the agreement's vectors hold each word negated too, so some PE sees it)
    other = array.array("q", [5, 0, 0, 0, 0, 41])
    assert _step(board, nbytes, 2, 0, 8, template, send0, out0, done0) == 1
    assert _step(board, nbytes, 2, 1, 8, other, send1, out1, done1) == -1
    # the flag not set on one PE: agreed, but not everywhere (-2)
    assert _step(board, nbytes, 2, 0, 9, template, send0, out0, done0, flag=False) == 1
    assert _step(board, nbytes, 2, 1, 9, template, send1, out1, done1) == -2   # agreed, no flag
    # entered long ago (a tick of 1 ns, no ticks of slack): late, not plain
    assert _step(board, nbytes, 2, 0, 10, template, send0, out0, done0, tick=1) == 1
    assert _step(board, nbytes, 2, 1, 10, template, send1, out1, done1, tick=1,
                 prompt=0) == -1
    # reading on hot (the GIL kept, no yield) for 20 us, then the spins' own end: PE 1
    # never came, so the PEs left, as without it; and with PE 1 there, plain
    start = time.monotonic()
    assert _step(board, nbytes, 2, 0, 12, template, send0, out0, done0, hot=20_000,
                 budget=50_000) == 1
    assert time.monotonic() - start >= 20e-6
    assert _step(board, nbytes, 2, 1, 12, template, send1, out1, done1, hot=20_000) == 0


def test_step_stamps_the_entry_time_in_ticks_of_the_wall_clock():
    # A tick of a second or of a millisecond is stamped from the coarse clock (a
    # tenth of the fine one's cost: Stepper's `coarse`), one of a microsecond from
    # the fine one; either way the time.time_ns() of the entry, in ticks, give or
    # take the tick that the stamp's floor and the coarse clock's lag may cost.
    memory, board, nbytes = _board(2)
    template = array.array("q", [5, 0, 0, 0, 0, 42])
    send, out, done = _step_buffers()
    for seq, tick in enumerate((10**9, 10**6, 10**3), start=20):
        before = time.time_ns() // tick
        assert _step(board, nbytes, 2, 0, seq, template, send, out, done, tick=tick) == 1
        after = time.time_ns() // tick
        assert before - 1 <= -send[4] <= after, (tick, before, -send[4], after)


def _exchange_step(board, nbytes, rank, seq, out, done):
    return _collective.exchange(board, nbytes, 2, rank, SLOT, STEP_WORDS, 1, 16, SKIP, seq, None,
                                out, done, 0, 0, None, 0, 0, 0, -1)


def test_step_refuses_bad_arguments():
    memory, board, nbytes = _board(2)
    template = array.array("q", bytes(48))
    send, out, done = _step_buffers()
    bad = [
        lambda: _step(board, nbytes, 2, 0, 1, array.array("q", [1]), send, out, done),
        lambda: _step(board, nbytes, 2, 0, 1, template, array.array("q", [1]), out, done),
        lambda: _step(board, nbytes, 2, 0, 1, template, send, array.array("q", [1]), done),
        lambda: _step(board, nbytes, 2, 0, 1, template, send, out, done, tick=0),
        lambda: _step(board, nbytes, 2, 0, 1, template, send, out, done, budget=-1),
        lambda: _step(board, nbytes, 2, 0, 1, template, send, out, done, hot=-1),
        lambda: _step(board, nbytes, 2, 0, 1, template, send, out, done, hot=10**6 + 1),
        lambda: _step(board, nbytes, 2, 2, 1, template, send, out, done),         # rank >= size
        lambda: _step(0, nbytes, 2, 0, 1, template, send, out, done),             # null board
        lambda: _step(board, nbytes, 2, 0, 1, template, send, out, bytearray(1)),  # done < size
        lambda: _stepper(board, nbytes, 2, 0, send, out, done).step(            # a payload
            -1, 0, 1, template, True, 0, 1 << 20, None, 0, 0, 0, -1),             # too long
        lambda: _stepper(board, nbytes, 2, 0, send, out, done).step(            # part without
            -1, 0, 1, template, True, 0, 0, None, 8, 0, 0, -1),                   # a scratch
    ]
    for i, call in enumerate(bad):
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"case {i} was accepted")
    with pytest.raises(TypeError):
        _collective.Stepper(board, nbytes)
    with pytest.raises(TypeError):
        _stepper(board, nbytes, 2, 0, send, out, done).step(-1, 0, 1)


# Quick: a whole collective call of one fixed step (a barrier), its state on the
# objects it is given (the agreement's counters, the board's carried payload)
class _Owner:
    def __init__(self):
        self.seq, self.calls, self._sub, self._entered = 6, 3, 5, 0


class _Flags:
    def __init__(self):
        self.pending, self.closed = set(), False


def _quick(board, nbytes, rank, send, out, done, template, owner, flags, lock, settle, *,
           budget=0, counted=True):
    stepper = _stepper(board, nbytes, 2, rank, send, out, done)
    carrier = _Flags()
    carrier.carried = ("an older payload",)
    quick = _collective.Quick(stepper, template, counted, -1, budget, lock, owner, carrier,
                              ((flags, "pending"), (flags, "closed")), settle)
    return quick, carrier


def test_quick_takes_the_step_where_every_guard_is_false_and_else_does_nothing():
    import threading
    memory, board, nbytes = _board(2)
    template = array.array("q", [5, 0, 0, 0, 0, 42])
    owner, flags, lock, settled = _Owner(), _Flags(), threading.RLock(), []
    quick, carrier = _quick(board, nbytes, 0, *_step_buffers(), template, owner, flags, lock,
                            lambda code: settled.append(code) or "settled")
    # a guard that holds: nothing done, nothing counted
    flags.pending.add(64)
    assert quick() is None
    assert (owner.seq, owner.calls, owner._sub) == (6, 3, 5) and not settled
    flags.pending.clear()
    # another thread holds the lock: nothing done (the caller's general path waits for it)
    taken, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=lambda: (lock.acquire(), taken.set(), release.wait(),
                                              lock.release()))
    holder.start()
    taken.wait()
    assert quick() is None and owner.seq == 6
    release.set()
    holder.join()
    # PE 1 made step 7 first: plain, the counters moved as collective() moves them
    send1, out1, done1 = _step_buffers()
    assert _step(board, nbytes, 2, 1, 7, template, send1, out1, done1) == 1
    assert quick() == 0 and not settled
    assert (owner.seq, owner.calls, owner._sub) == (7, 4, 0) and owner._entered > 0
    assert carrier.carried is None
    assert lock.acquire(blocking=False)   # released
    lock.release()
    # PE 1 with a greater argument (the MAX is not this PE's): not plain, settle(-1)
    # decides, its value returned
    other = array.array("q", [5, 0, 0, 0, 0, 43])
    assert _step(board, nbytes, 2, 1, 8, other, send1, out1, done1) == 1
    assert quick() == "settled" and settled == [-1] and owner.seq == 8
    # PE 1 not there and no budget: settle(1), the PEs left
    assert quick() == "settled" and settled == [-1, 1] and owner.seq == 9


def test_quick_releases_the_lock_when_settle_raises_and_refuses_bad_arguments():
    import threading
    memory, board, nbytes = _board(2)
    template = array.array("q", [5, 0, 0, 0, 0, 42])
    owner, flags, lock = _Owner(), _Flags(), threading.RLock()

    def settle(code):
        raise KeyboardInterrupt

    send, out, done = _step_buffers()
    quick, _ = _quick(board, nbytes, 0, send, out, done, template, owner, flags, lock, settle,
                      counted=False)
    with pytest.raises(KeyboardInterrupt):
        quick()   # (PE 1 never comes)
    assert owner.calls == 3 and owner.seq == 7    # not counted; the step was taken
    assert lock.acquire(blocking=False)
    lock.release()
    for wrong_call in [lambda: quick(1, 2), lambda: quick(flag=1)]:
        with pytest.raises(TypeError):
            wrong_call()   # (one positional argument at most: the flag)
    stepper = _stepper(board, nbytes, 2, 0, send, out, done)
    ok = (stepper, template, True, -1, 0, lock, owner, _Flags(), (), settle)
    for i, wrong in [(0, object()), (8, [(flags, "closed")]), (8, ((flags,),)),
                     (8, ((flags, 1),)), (9, None), (1, template.tolist())]:
        with pytest.raises(TypeError):
            _collective.Quick(*ok[:i], wrong, *ok[i + 1:])
            pytest.fail(f"argument {i} = {wrong!r} was accepted")
    for i, wrong in [(1, array.array("q", [1])), (4, -1), (3, -2)]:
        with pytest.raises(ValueError):
            _collective.Quick(*ok[:i], wrong, *ok[i + 1:])
            pytest.fail(f"argument {i} = {wrong!r} was accepted")
    with pytest.raises(TypeError):
        _collective.Quick(*ok[:5])
    # a guard naming a missing attribute: the AttributeError, the lock released
    broken = _collective.Quick(stepper, template, True, -1, 0, lock, owner, _Flags(),
                               ((flags, "no_such_attribute"),), settle)
    with pytest.raises(AttributeError):
        broken()
    assert lock.acquire(blocking=False)
    lock.release()


class _Slotted:
    __slots__ = ("busy",)

    def __init__(self):
        self.busy = False


class _Computed:
    """A guard whose value a property computes (never in the instance's dict)."""
    def __init__(self):
        self.items = []

    @property
    def busy(self):
        return bool(self.items)


class _Shadowed:
    """A class attribute of the guard's name, shadowed by the instance's own later."""
    busy = False


def test_quick_reads_guards_of_every_kind_each_call_and_state_in_the_owners_dict():
    # Quick reads a guard through its object's __dict__ where the type gives the
    # name no meaning of its own: a property, a slot and a class attribute still go
    # through the attribute protocol, and every value is read anew at each call.
    import threading
    memory, board, nbytes = _board(1)
    template = array.array("q", [5, 0, 0, 0, 0, 42])
    owner, flags, lock = _Owner(), _Flags(), threading.RLock()
    slotted, computed, shadowed = _Slotted(), _Computed(), _Shadowed()
    stepper = _stepper(board, nbytes, 1, 0, *_step_buffers())
    carrier = _Flags()
    quick = _collective.Quick(stepper, template, True, -1, 0, lock, owner, carrier,
                              ((flags, "pending"), (slotted, "busy"), (computed, "busy"),
                               (shadowed, "busy"), (flags, "added_later")), lambda code: code)
    flags.added_later = None
    assert quick() == 0 and owner.seq == 7 and owner.calls == 4
    for make_busy, make_idle in [
            (lambda: flags.pending.add(1), flags.pending.clear),
            (lambda: setattr(slotted, "busy", True), lambda: setattr(slotted, "busy", False)),
            (lambda: computed.items.append(1), computed.items.clear),
            (lambda: setattr(shadowed, "busy", 1), lambda: setattr(shadowed, "busy", 0)),
            (lambda: setattr(flags, "added_later", "yes"),
             lambda: setattr(flags, "added_later", None))]:
        seq = owner.seq
        make_busy()
        assert quick() is None and owner.seq == seq
        make_idle()
        assert quick() == 0 and owner.seq == seq + 1
    # the counters a Python step moved in between are the ones Quick moves on from
    owner.seq, owner.calls = 100, 50
    assert quick() == 0 and (owner.seq, owner.calls, owner._sub) == (101, 51, 0)
    assert vars(owner)["seq"] == 101 and carrier.carried is None
    # a guard that is gone from the dict: AttributeError, as Python says it, lock released
    del flags.added_later
    with pytest.raises(AttributeError):
        quick()
    assert lock.acquire(blocking=False)
    lock.release()


def test_quick_carries_a_payload_delivers_after_a_plain_step_and_checks_what_it_is_given():
    # a fused collective's quick step (nodecoll's Plan): the payload is in scratch when
    # deliver runs; a carry needs a deliver, each of its shape, checked once
    import threading
    memory, board, nbytes = _board(1)
    template = array.array("q", [5, 0, 0, 0, 0, 42])
    owner, flags, lock = _Owner(), _Flags(), threading.RLock()
    stepper = _stepper(board, nbytes, 1, 0, *_step_buffers())
    source = ctypes.create_string_buffer(b"symmetric", 16)
    scratch = bytearray(64)
    carry = (ctypes.addressof(source), 9, scratch, 9, 0, 0, -1)
    delivered = []
    deliver = (lambda *args: delivered.append(bytes(scratch[:9])), ())
    make = functools.partial(_collective.Quick, stepper, template, True, -1, 0, lock, owner,
                             _Flags(), (), lambda code: code)
    quick = make(carry, deliver)
    assert quick() == 0 and delivered == [b"symmetric"] and owner.seq == 7
    for wrong in [(carry, None), (carry[:6], deliver), (list(carry), deliver),
                  (carry, (deliver[0],)), (carry, (None, ())), (carry, (deliver[0], [])),
                  (None, (deliver[0],)), (None, deliver, None, True, 1)]:
        with pytest.raises(TypeError):
            make(*wrong)
            pytest.fail(f"carry, deliver = {wrong!r} was accepted")
    for bad in [(0, 9, scratch, 9, 0, 0, -1),                              # a null payload
                (ctypes.addressof(source), 1 << 20, scratch, 9, 0, 0, -1),  # past the slot
                (ctypes.addressof(source), 9, bytearray(4), 9, 0, 0, -1),   # scratch too small
                (ctypes.addressof(source), 9, scratch, 9, 0, 0, 3)]:        # no PE 3
        with pytest.raises(ValueError):
            make(bad, deliver)
            pytest.fail(f"carry {bad!r} was accepted")
    # before: called first (collect's payload made again), its error raised with nothing
    # stepped; it needs a carry and is a (callable, args) pair
    made = []
    quick = make(carry, deliver, (lambda word: made.append(word) or source.__setitem__(0, word),
                                  (b"S",)))
    assert quick() == 0 and made == [b"S"] and delivered[-1] == b"Symmetric"
    seq = owner.seq
    with pytest.raises(ZeroDivisionError):
        make(carry, deliver, (lambda: 1 / 0, ()))()
    assert owner.seq == seq
    for wrong in [(None, None, (len, ())), (carry, deliver, len), (carry, deliver, (len, []))]:
        with pytest.raises(TypeError):
            make(*wrong)
            pytest.fail(f"before {wrong[2]!r} was accepted")
    # answer needs a deliver
    with pytest.raises(TypeError):
        make(None, None, None, True)
    # deliver raising: its exception, the lock released
    failing = make(carry, (lambda: 1 / 0, ()))
    with pytest.raises(ZeroDivisionError):
        failing()
    assert lock.acquire(blocking=False)
    lock.release()


def test_quick_without_a_carry_delivers_answers_and_takes_the_flag():
    # an allocation's quick step (HeapCore.quick_allocation): no payload, deliver's
    # result returned where answer is set (0 without); free's passes its flag, and
    # a step whose flag is not everywhere returns -2 where it delivers nothing and
    # carries no dead blocks (a free's), and settles where it delivers
    import threading
    memory, board, nbytes = _board(2)
    template = array.array("q", [5, 0, 0, 0, 0, 42])
    owner, lock = _Owner(), threading.RLock()
    send, out, done = _step_buffers()
    stepper = _stepper(board, nbytes, 2, 0, send, out, done)
    settled = []
    make = functools.partial(_collective.Quick, stepper, template, True, -1, 0, lock, owner,
                             _Flags(), (), lambda code: settled.append(code) or "settled")
    send1, out1, done1 = _step_buffers()
    taken = []
    answering = make(None, (lambda *args: taken.append(args) or "tensor", (1, 2)), None, True)
    assert _step(board, nbytes, 2, 1, 7, template, send1, out1, done1) == 1
    assert answering() == "tensor" and taken == [(1, 2)] and not settled
    quiet = make(None, (lambda: taken.append("quiet"), ()), None, False)
    assert _step(board, nbytes, 2, 1, 8, template, send1, out1, done1) == 1
    assert quiet() == 0 and taken[-1] == "quiet"
    # the flag: PE 1's set, this PE's not (False): agreed, not everywhere: -2, as a
    # plain step's 0, with the agreement's entry time taken from the step as then
    bare = make()
    owner._entered = None
    assert _step(board, nbytes, 2, 1, 9, template, send1, out1, done1) == 1
    assert bare(False) == -2 and not settled and owner.seq == 9
    assert owner._entered is not None
    assert _step(board, nbytes, 2, 1, 10, template, send1, out1, done1) == 1
    assert bare(True) == 0 and not settled and owner.seq == 10
    # a step that delivers settles where the flag is not everywhere (its settle then
    # delivers: agreement.py's _delivered)
    delivering = make(None, (lambda: taken.append("after"), ()), None, False)
    assert _step(board, nbytes, 2, 1, 11, template, send1, out1, done1) == 1
    assert delivering(False) == "settled" and settled == [-2] and owner.seq == 11


DEAD_WORD = 5   # (of _dead_blocks_steps()'s vector)


def _dead_blocks_steps():
    """Two PEs' Steppers on one board for quick steps that carry dead blocks: an
    8-word vector whose words 3 (flag), 4 (time), 5 and 6 (dead, DEAD_WORD) are
    volatile. Returns the board's memory (keep it), this PE's Stepper and its
    send buffer, the template, and peer_steps(seq, digest=0): PE 1's step of the
    template, carrying dead blocks of `digest` where it is not 0."""
    memory, board, nbytes = _board(2)
    words, volatile = 8, 0b1111000

    def stepper(rank):
        buffers = (array.array("q", bytes(8 * words)), array.array("q", bytes(8 * words)),
                   bytearray(2))
        return _collective.Stepper(board, nbytes, 2, rank, SLOT, words, 1, 16, volatile, 2, 3,
                                   4, 10**9, *buffers, 0), buffers[0]

    template = array.array("q", [5, 0, 0, 0, 0, 0, 0, 42])
    mine, sent = stepper(0)
    peer, _ = stepper(1)

    def peer_steps(seq, digest=0):
        vector = template[:]
        if digest:
            vector[DEAD_WORD], vector[DEAD_WORD + 1] = -digest, digest
        assert peer.step(-1, 0, seq, vector, True, 0, 0, None, 0, 0, 0, -1) == 1

    return memory, mine, sent, template, peer_steps


def test_quick_carries_dead_blocks_only_where_its_dead_guards_say_and_then_settles():
    # an allocation's quick step (HeapCore.make_quick(releasing=True)): where a dead
    # guard is true it asks for the digest and carries it in the vector's dead words
    # (-digest, digest), and such a step settles (the agreement releases them there);
    # where none is, the callable is not called and a plain step stays plain
    import threading
    memory, mine, sent, template, peer_steps = _dead_blocks_steps()
    owner, lock, flags = _Owner(), threading.RLock(), _Flags()
    asked, settled = [], []

    def digest():
        asked.append(1)
        return 14

    make = functools.partial(_collective.Quick, mine, template, True, -1, 0, lock,
                             owner, _Flags(), (),
                             lambda code: settled.append(code) or "settled",
                             None, (lambda: "tensor", ()), None, True)
    quick = make((digest, (), DEAD_WORD, ((flags, "pending"),)))
    peer_steps(7)
    assert quick() == "tensor" and not asked and not settled
    flags.pending.add(1)
    peer_steps(8)
    assert quick() == "settled" and asked == [1] and settled == [0]
    assert sent[DEAD_WORD] == -14 and sent[DEAD_WORD + 1] == 14
    for wrong in [(digest, (), DEAD_WORD), (digest, [], DEAD_WORD, ()),
                  (digest, (), DEAD_WORD, [(flags, "pending")]), (len, (), DEAD_WORD, ((1,),))]:
        with pytest.raises(TypeError):
            make(wrong)
            pytest.fail(f"dead {wrong!r} was accepted")
    for word in (-1, 0, 2, 3, 4, 6, 7):   # not a pair of volatile words apart from the
        # flag (3) and the time (4)
        with pytest.raises(ValueError):
            make((digest, (), word, ()))
            pytest.fail(f"dead word {word} was accepted")


def test_quick_releases_dead_blocks_every_pe_carried_alike_in_its_own_call():
    # with dead's fifth item (agreement.py's _release_carried): a step that carried
    # dead blocks and would otherwise be plain, whose MAX says every PE carried the
    # same (-min digest == max digest), calls it and ends as a plain step (its
    # deliver's answer); where the PEs' digests differ, or a PE carried none, it
    # settles as before (the agreement sorts it out there)
    import threading
    memory, mine, sent, template, peer_steps = _dead_blocks_steps()
    owner, lock, flags = _Owner(), threading.RLock(), _Flags()
    released, settled, delivered = [], [], []
    flags.pending.add(1)
    quick = _collective.Quick(mine, template, True, -1, 0, lock, owner, _Flags(),
                              (), lambda code: settled.append(code) or "settled", None,
                              (lambda: delivered.append(1) or "tensor", ()), None, True,
                              (lambda: 14, (), DEAD_WORD, ((flags, "pending"),),
                               lambda: released.append(owner._entered)))
    owner._entered = None
    peer_steps(7, 14)                   # the same dead blocks: released here, then delivered
    assert quick() == "tensor" and len(released) == 1 and not settled and delivered == [1]
    assert released[0] is not None      # (the agreement's _entered, noted before)
    peer_steps(8, 22)                   # other blocks there: settles
    assert quick() == "settled" and settled == [0] and len(released) == 1
    peer_steps(9, 0)                    # none there: settles
    assert quick() == "settled" and settled == [0, 0] and len(released) == 1
    with pytest.raises(TypeError):
        _collective.Quick(mine, template, True, -1, 0, lock, owner, _Flags(), (),
                          len, None, (len, ()), None, True,
                          (lambda: 14, (), DEAD_WORD, (), "not callable"))
