"""The device-side meeting points of the collectives (Triton functions).

Every call of a collective runs a fixed number of programs on every PE;
program `pid` meets its counterparts (program `pid` of every other PE) at the
call's entry and exit through a row of signal slots on the symmetric heap
(`pads`: 2 * n_pes int64 per program: n_pes barrier slots, n_pes call words).

- entry: each program writes the call's word (a hash of its arguments) into
  every PE's row, signals every PE (release: the words and everything this
  PE wrote before are visible), waits for every PE's signal, then compares
  the words. A wait gives up after `max_polls` polls.
- exit: every program signals again, so no PE returns while a peer may still
  read its input (or, after stores into peers, before they are visible).

What a call finds goes into the status words (int32, pinned host memory on
CUDA): [MISMATCH] the PEs made different calls, [OVERFLOW] all_to_all_v's
splits did not fit, [TIMED_OUT] a wait gave up. Plain stores of 1, each code
its own word, so no code hides another.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import triton as sv

#: indices of the status words
MISMATCH, OVERFLOW, TIMED_OUT = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
STATUS_WORDS = 3


@triton.jit
def meet(row, value, me, heap_bases, max_polls, N_PES: tl.constexpr, RELEASE: tl.constexpr):
    """Set this PE's slot of `row` to `value` on every PE and wait until every
    PE's slot here reached it; False where a wait gave up. RELEASE: a
    system-scope release (the stores made before are visible to a peer that
    sees the value; a fence costing ~1 us); without it the signal is relaxed,
    which is enough where nothing was written for peers. (DeviceAllReduce's
    kernel meets through this one too.)"""
    tl.debug_barrier()   # every thread's earlier loads and stores precede the signal
    tl.store(row + me, value)   # own slot: read only by this program (and its next call)
    for pe in tl.static_range(N_PES):
        if pe != me:
            target = sv.translate(row + me, me, pe, heap_bases)
            if RELEASE:
                tl.atomic_xchg(target, value, sem="release", scope="sys")
            else:
                tl.atomic_xchg(target, value, sem="relaxed", scope="sys")
    arrived = tl.full((), 1, tl.int1)
    for pe in tl.static_range(N_PES):
        if pe != me:
            seen = sv.signal_wait_until(row + pe, sv.CMP_GE, value, max_polls)
            arrived = arrived & (seen >= value)
    return arrived


@triton.jit
def enter(pads, status, word, me, heap_bases, max_polls, N_PES: tl.constexpr):
    """The entry meeting of this program: (epoch, arrived, same). `same`: every
    PE's call word equals `word`. Sets the status words accordingly."""
    row = pads + tl.program_id(0) * (2 * N_PES)
    # this program's call number: its own slot holds 2 * (last call) + 1
    epoch = tl.load(row + me, volatile=True) // 2 + 1
    for pe in tl.static_range(N_PES):
        sv.store(row + N_PES + me, word, me, pe, heap_bases)
    arrived = meet(row, 2 * epoch, me, heap_bases, max_polls, N_PES, True)
    same = tl.full((), 1, tl.int1)
    for pe in tl.static_range(N_PES):
        same = same & (tl.load(row + N_PES + pe, volatile=True) == word)
    if arrived == 0:
        tl.store(status + TIMED_OUT, 1)
    elif same == 0:
        tl.store(status + MISMATCH, 1)
    return epoch, arrived, same


@triton.jit
def leave(pads, status, epoch, arrived, me, heap_bases, max_polls, N_PES: tl.constexpr,
          RELEASE: tl.constexpr):
    """The exit meeting (skipped where the entry timed out: the epochs are lost)."""
    if arrived:
        row = pads + tl.program_id(0) * (2 * N_PES)
        left = meet(row, 2 * epoch + 1, me, heap_bases, max_polls, N_PES, RELEASE)
        if left == 0:
            tl.store(status + TIMED_OUT, 1)
