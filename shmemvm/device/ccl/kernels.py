"""The collectives' Triton kernels over the heap's mappings (heap_bases()).

Each kernel is one call of a collective on one PE: it meets its counterparts
at entry (call words compared) and exit (sync.py), and between them moves or
reduces data by translating local symmetric pointers to the peers'. Copies
move bits (tensors are viewed as integers of their width); reductions run in
PE order 0..n_pes-1, half types computed in float32 and rounded after every
step (as torch does on the CPU), so every PE gets the same bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import triton as sv
from .sync import MISMATCH, OVERFLOW, TIMED_OUT, enter, leave

#: how a dtype is computed in reductions: natively, float16 via float32,
#: bfloat16 (passed as int16 bits) via float32
NATIVE, HALF, BF16 = 0, 1, 2
#: reduce() modes
ONE_SHOT, TWO_SHOT, TO_ROOT = 0, 1, 2


# -- arithmetic --------------------------------------------------------------------------
@triton.jit
def widen(x, KIND: tl.constexpr):
    if KIND == 1:
        out = x.to(tl.float32)
    elif KIND == 2:
        out = (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        out = x
    return out


@triton.jit
def narrow(x, KIND: tl.constexpr):
    """Back to the stored type, rounding to nearest even (bfloat16 as torch's
    round_to_nearest_even, NaN as 0x7FC0)."""
    if KIND == 1:
        out = x.to(tl.float16)
    elif KIND == 2:
        u = x.to(tl.uint32, bitcast=True)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out = tl.where(x != x, 0x7FC0, rounded).to(tl.int16)
    else:
        out = x
    return out


@triton.jit
def combine(acc, x, OP: tl.constexpr, KIND: tl.constexpr):
    """acc (op) x in the stored type's arithmetic; acc and x are widened."""
    if OP == 0:
        out = acc + x
    elif OP == 1:
        out = acc * x
    elif OP == 2:
        out = tl.minimum(acc, x)
    else:
        out = tl.maximum(acc, x)
    if KIND != 0:
        out = widen(narrow(out, KIND), KIND)   # round every step, as the host does
    return out


# -- copies ------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["word", "me", "max_polls", "rows", "inner", "src_ld", "dst_ld",
                               "src_stride", "dst_stride", "only_pe", "active"])
def move(src, dst, pads, status, word, me, heap_bases, max_polls, rows, inner, src_ld, dst_ld,
         src_stride, dst_stride, only_pe, active, N_PES: tl.constexpr, BLOCK: tl.constexpr,
         PUSH: tl.constexpr, CONTIG: tl.constexpr):
    """For every PE p (only `only_pe` where >= 0), a rows x inner block:
    pull: mine[p*dst_stride + r*dst_ld + c] <- p's[me*src_stride + r*src_ld + c];
    push: p's[me*dst_stride + r*dst_ld + c] <- mine[p*src_stride + r*src_ld + c].
    PEs with active == 0 only meet. CONTIG: rows == 1 (no index arithmetic)."""
    epoch, arrived, same = enter(pads, status, word, me, heap_bases, max_polls, N_PES)
    if arrived & same & (active != 0):
        total = rows * inner
        step = tl.num_programs(0) * BLOCK
        for i in tl.static_range(N_PES):
            pe = (me + i) % N_PES   # each PE starts with a different peer
            if (only_pe < 0) | (pe == only_pe):
                if PUSH:
                    s_off = pe * src_stride
                    d_off = me * dst_stride
                else:
                    s_off = me * src_stride
                    d_off = pe * dst_stride
                start = tl.program_id(0) * BLOCK
                while start < total:   # a while loop: the interpreter cannot range() run-time ints
                    e = start + tl.arange(0, BLOCK)
                    mask = e < total
                    if CONTIG:
                        si = e
                        di = e
                    else:
                        r = e // inner
                        c = e - r * inner
                        si = r * src_ld + c
                        di = r * dst_ld + c
                    if PUSH:
                        v = tl.load(src + s_off + si, mask=mask)
                        sv.store(dst + d_off + di, v, me, pe, heap_bases, mask=mask)
                    else:
                        v = sv.load(src + s_off + si, me, pe, heap_bases, mask=mask)
                        tl.store(dst + d_off + di, v, mask=mask)
                    start += step
    leave(pads, status, epoch, arrived, me, heap_bases, max_polls, N_PES, PUSH)


@triton.jit(do_not_specialize=["word", "me", "max_polls"])
def sync_only(pads, status, word, me, heap_bases, max_polls, N_PES: tl.constexpr):
    """The device barrier (and the stand-in call of a PE whose arguments were
    refused: its word differs, so its peers report a mismatch at once)."""
    epoch, arrived, same = enter(pads, status, word, me, heap_bases, max_polls, N_PES)
    leave(pads, status, epoch, arrived, me, heap_bases, max_polls, N_PES, False)


# -- reductions --------------------------------------------------------------------------
@triton.jit(do_not_specialize=["word", "me", "max_polls", "n", "root"])
def reduce(src, dst, pads, status, word, me, heap_bases, max_polls, n, root,
           N_PES: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr, KIND: tl.constexpr,
           MODE: tl.constexpr):
    """dst <- src reduced over the PEs in PE order. MODE 0 one-shot (every PE
    reads everything), 1 two-shot (PE k reduces the k-th slice and stores it
    into every PE), 2 to `root` only (the others only meet)."""
    epoch, arrived, same = enter(pads, status, word, me, heap_bases, max_polls, N_PES)
    if arrived & same & ((MODE != 2) | (me == root)):
        step = tl.num_programs(0) * BLOCK
        if MODE == 1:
            chunk = tl.cdiv(tl.cdiv(n, N_PES), BLOCK) * BLOCK
            end = tl.minimum(n, (me + 1) * chunk)
            start = me * chunk + tl.program_id(0) * BLOCK
        else:
            end = n
            start = tl.program_id(0) * BLOCK
        while start < end:
            offs = start + tl.arange(0, BLOCK)
            mask = offs < end
            acc = widen(sv.load(src + offs, me, 0, heap_bases, mask=mask), KIND)
            for pe in tl.static_range(1, N_PES):
                acc = combine(acc, widen(sv.load(src + offs, me, pe, heap_bases, mask=mask),
                                         KIND), OP, KIND)
            out = narrow(acc, KIND)
            if MODE == 1:
                for pe in tl.static_range(N_PES):
                    sv.store(dst + offs, out, me, pe, heap_bases, mask=mask)
            else:
                tl.store(dst + offs, out, mask=mask)
            start += step
    leave(pads, status, epoch, arrived, me, heap_bases, max_polls, N_PES, MODE == 1)


@triton.jit(do_not_specialize=["word", "me", "max_polls", "m", "n", "ld"])
def reduce_tiles(src, dst, pads, status, word, me, heap_bases, max_polls, m, n, ld,
                 N_PES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr,
                 DISTRIBUTION: tl.constexpr, OP: tl.constexpr, KIND: tl.constexpr):
    """Iris's reduce_scatter: the (m, n) plane in BM x BN tiles, tile ids in
    grouped order (GROUP rows of tiles a group); this PE's tiles (striding:
    me, me + N_PES, ...; block: the me-th run of ceil(T / N_PES)) of its own
    dst get the reduction over the PEs."""
    epoch, arrived, same = enter(pads, status, word, me, heap_bases, max_polls, N_PES)
    if arrived & same:
        num_m = tl.cdiv(m, BM)
        num_n = tl.cdiv(n, BN)
        tiles = num_m * num_n
        if DISTRIBUTION == 0:
            tile = me + tl.program_id(0) * N_PES
            last = tiles
            stride = N_PES * tl.num_programs(0)
        else:
            per_pe = tl.cdiv(tiles, N_PES)
            tile = me * per_pe + tl.program_id(0)
            last = tl.minimum(tiles, (me + 1) * per_pe)
            stride = tl.num_programs(0)
        while tile < last:
            in_group = GROUP * num_n
            first_m = (tile // in_group) * GROUP
            group_m = tl.minimum(num_m - first_m, GROUP)
            pid_m = first_m + (tile % in_group) % group_m
            pid_n = (tile % in_group) // group_m
            rm = pid_m * BM + tl.arange(0, BM)
            rn = pid_n * BN + tl.arange(0, BN)
            offs = rm[:, None] * ld + rn[None, :]
            mask = (rm < m)[:, None] & (rn < n)[None, :]
            acc = widen(sv.load(src + offs, me, 0, heap_bases, mask=mask), KIND)
            for pe in tl.static_range(1, N_PES):
                acc = combine(acc, widen(sv.load(src + offs, me, pe, heap_bases, mask=mask),
                                         KIND), OP, KIND)
            tl.store(dst + offs, narrow(acc, KIND), mask=mask)
            tile += stride
    leave(pads, status, epoch, arrived, me, heap_bases, max_polls, N_PES, False)


# -- all-to-all-v ------------------------------------------------------------------------
@triton.jit(do_not_specialize=["word", "me", "max_polls", "width", "src_rows", "cap_rows"])
def all_to_all_v(src, dst, splits, out_splits_offsets, pads, status, word, me, heap_bases,
                 max_polls, width, src_rows, cap_rows, N_PES: tl.constexpr,
                 NP2: tl.constexpr, BLOCK: tl.constexpr):
    """Rows of `width` elements: PE p's splits[q] rows (after its splits[:q])
    go to PE q, which stores them after those of PEs < p and writes
    out_splits_offsets[0, p] (the count) and [1, p] (the row offset). Splits
    that are negative or overflow src or dst set OVERFLOW and move nothing
    from that PE (the counts are still written)."""
    epoch, arrived, same = enter(pads, status, word, me, heap_bases, max_polls, N_PES)
    if arrived & same:
        ar = tl.arange(0, NP2)
        first = tl.program_id(0) == 0
        step = tl.num_programs(0) * BLOCK
        dst_row = tl.full((), 0, tl.int64)
        for p in tl.static_range(N_PES):
            s = sv.load(splits + ar, me, p, heap_bases, mask=ar < N_PES, other=0).to(tl.int64)
            count = tl.sum(tl.where(ar == me, s, 0))
            src_row = tl.sum(tl.where(ar < me, s, 0))
            smallest = tl.min(tl.where(ar < N_PES, s, 0))
            bad = (smallest < 0) | (src_row + count > src_rows) | (dst_row + count > cap_rows)
            tl.store(out_splits_offsets + p, count, mask=first)
            tl.store(out_splits_offsets + N_PES + p, dst_row, mask=first)
            if bad:
                tl.store(status + OVERFLOW, 1)
            else:
                total = count * width
                base_in = src + src_row * width
                base_out = dst + dst_row * width
                start = (tl.program_id(0) * BLOCK).to(tl.int64)
                while start < total:
                    e = start + tl.arange(0, BLOCK)
                    mask = e < total
                    v = sv.load(base_in + e, me, p, heap_bases, mask=mask)
                    tl.store(base_out + e, v, mask=mask)
                    start += step
            dst_row += tl.maximum(count, 0)
    leave(pads, status, epoch, arrived, me, heap_bases, max_polls, N_PES, False)


# -- send / recv -------------------------------------------------------------------------
# p2p pads, per program on every PE, 7 * N_PES int64 slots: [arrive from q], [word from q],
# [offset from q], [ack from q], [sends to q], [receives from q], [receiver q's word]
@triton.jit(do_not_specialize=["word", "offset", "me", "peer", "max_polls"])
def send(p2p, status, word, offset, me, peer, heap_bases, max_polls, N_PES: tl.constexpr):
    """Announce this PE's tensor (its heap offset in elements) to `peer` and
    wait until the peer has read it."""
    row = p2p + tl.program_id(0) * (7 * N_PES)
    e = tl.load(row + 4 * N_PES + peer, volatile=True) + 1
    tl.store(row + 4 * N_PES + peer, e)
    sv.store(row + N_PES + me, word, me, peer, heap_bases)
    sv.store(row + 2 * N_PES + me, offset, me, peer, heap_bases)
    tl.debug_barrier()
    sv.atomic_xchg(row + me, e, me, peer, heap_bases, sem="release", scope="sys")
    seen = sv.signal_wait_until(row + 3 * N_PES + peer, sv.CMP_GE, e, max_polls)
    if seen < e:
        tl.store(status + TIMED_OUT, 1)
    elif tl.load(row + 6 * N_PES + peer, volatile=True) != word:
        tl.store(status + MISMATCH, 1)


@triton.jit(do_not_specialize=["word", "offset", "me", "peer", "max_polls", "n"])
def recv(dst, p2p, status, word, offset, me, peer, heap_bases, max_polls, n,
         N_PES: tl.constexpr, BLOCK: tl.constexpr):
    """Wait for `peer`'s send, read its tensor into dst where the words agree,
    then acknowledge (with this PE's word, which the sender compares)."""
    row = p2p + tl.program_id(0) * (7 * N_PES)
    e = tl.load(row + 5 * N_PES + peer, volatile=True) + 1
    tl.store(row + 5 * N_PES + peer, e)
    seen = sv.signal_wait_until(row + peer, sv.CMP_GE, e, max_polls)
    if seen < e:
        tl.store(status + TIMED_OUT, 1)
    else:
        theirs = tl.load(row + N_PES + peer, volatile=True)
        if theirs == word:
            src = dst + (tl.load(row + 2 * N_PES + peer, volatile=True) - offset)
            start = tl.program_id(0) * BLOCK
            step = tl.num_programs(0) * BLOCK
            while start < n:
                o = start + tl.arange(0, BLOCK)
                mask = o < n
                tl.store(dst + o, sv.load(src + o, me, peer, heap_bases, mask=mask), mask=mask)
                start += step
        else:
            tl.store(status + MISMATCH, 1)
        sv.store(row + 6 * N_PES + me, word, me, peer, heap_bases)
        tl.debug_barrier()
        sv.atomic_xchg(row + 3 * N_PES + me, e, me, peer, heap_bases, sem="release", scope="sys")
