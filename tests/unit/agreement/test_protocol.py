"""The agreement's encoding (agreement/protocol.py), in one process: phase
codes, integers exact and everything else a wide digest, and a call that could
not be formed never looking valid. The MPI half is tests/mpi/agreement/test_agreement.py.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from shmemvm.agreement.protocol import N_ARGS, Call, Phase, _encode


# -- the encoding (one process) -----------------------------------------------------------
def test_phase_codes_are_distinct_and_only_user_calls_are_counted():
    assert len({int(p) for p in Phase}) == len(Phase)
    counted = {p for p in Phase if p.counted}
    assert Phase.INIT not in counted and Phase.MALLOC in counted and Phase.ALLTOALL in counted
    assert not any(p.counted for p in (Phase.ZEROS_FILLED, Phase.BACKING, Phase.SHARING,
                                       Phase.RELEASE_DEAD,
                                       Phase.REDUCE_GATHERED, Phase.INIT_READY))


def test_integers_are_exact_and_everything_else_is_a_wide_digest():
    assert _encode(0) == (0, 0)
    assert _encode((1 << 63) - 1) == (0, (1 << 63) - 1)
    big = {_encode(1 << 63), _encode(1 << 64), _encode((1 << 64) + 64), _encode(-1)}
    assert len(big) == 4 and all(high >= 1 for high, _ in big)  # never an exact pair
    for high, low in big:
        assert 0 < high < 1 << 63 and 0 <= low < 1 << 63     # fit an int64, negated too


def test_shapes_that_crc32_confused_are_different():
    a, b = (8, 4, 32, 1024, 4, 4), (8, 4, 1024, 128, 1, 4)
    assert zlib.crc32(repr(a).encode()) == zlib.crc32(repr(b).encode())  # the old code
    assert _encode(a) != _encode(b)
    assert _encode((4,)) != _encode((4, 1)) != _encode((1, 4))            # ndim counts
    assert _encode(()) != _encode((0,))
    assert _encode(torch.float32) != _encode(torch.int32)
    assert _encode((5,)) != _encode(5)


def test_a_call_that_could_not_be_formed_never_looks_valid():
    bad = Call(Phase.MALLOC, error=ValueError("no"))
    assert bad.words() == [-1] * (1 + 2 * N_ARGS)
    assert Call(Phase.FREE, (0,)).words() != Call(Phase.FREE).words()   # arity counts
    assert all(w >= 0 for w in Call(Phase.MALLOC, (0, torch.uint8, (0,))).words())
    with pytest.raises(ValueError):
        Call(Phase.MALLOC, tuple(range(N_ARGS + 1))).words()


def test_a_lazy_text_reads_as_the_eager_one_and_an_exact_call_encodes_alike():
    shape, dtype, offset = [2, 3], torch.float16, 0x4c0
    call = Call(Phase.ZEROS, (), ("zeros({!r}, {}) (filled)", shape, dtype))
    assert call.text == f"zeros({shape!r}, {dtype}) (filled)" == call.text
    assert Call(Phase.FREE, (), ("free(tensor at heap offset {:#x})", offset)).text == \
        f"free(tensor at heap offset {offset:#x})"
    assert Call(Phase.MALLOC, (), ("malloc({!r})", 7)).step(Phase.BACKING, "x").text == \
        "malloc(7) (x)"
    args = (24, torch.float16, (2, 6))
    assert Call(Phase.MALLOC, args, "", None, True).vector() == Call(Phase.MALLOC, args).vector()
    assert Call(Phase.FREE, (1,)).vector() != Call(Phase.FREE, (True,)).vector()


def test_dead_block_digests_tell_sets_apart():
    """A step's digest of its dead blocks (agreement._digest): one offset is its
    own digest (even), several a BLAKE2b digest (odd); the same set gives the
    same digest in any order, every digest lies in 1 .. 2**62 - 1, and no two
    single offsets, nor a single offset and a set, share one here."""
    from shmemvm.agreement.agreement import _digest
    singles = [_digest({offset}) for offset in (0, 1, 64, 4096, 1 << 40, (1 << 60) - 1)]
    assert len(set(singles)) == len(singles) and all(d % 2 == 0 for d in singles)
    sets = [{0, 64}, {64, 0}, {4096, 1 << 40, 7}, {1 << 61}]   # (the last: too large for one)
    digests = [_digest(s) for s in sets]
    assert digests[0] == digests[1] and all(d % 2 == 1 for d in digests)
    assert len(set(digests[1:])) == 3 and not set(digests) & set(singles)
    assert all(1 <= d < 1 << 62 for d in singles + digests)
