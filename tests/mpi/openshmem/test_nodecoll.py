"""Small collectives fused with their agreed board step (transport/nodecoll.py,
native/_collective.c; issue 30): the same bytes as the general path
(collectives.py's node path, torch's combiners) on every PE, for every dtype
class and sizes around the payload limit; a mismatch is a SymmetryError on
every PE with dest left as it was.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/openshmem/test_nodecoll.py
    (also -n 3; SHMEMVM_NATIVE=0 or SHMEMVM_AGREEMENT=mpi: no board in C, so
    both runs take the general path and the fused-count checks are skipped)
"""

from __future__ import annotations

import contextlib
import gc
import hashlib

import pytest
import torch
from mpi4py import MPI
from util import replays

from shmemvm import SymmetricHeap, SymmetryError
from shmemvm.agreement.board import PAYLOAD
from shmemvm.transport import nodecoll
from shmemvm.core.state import parts_of

comm = MPI.COMM_WORLD

DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16,
          torch.uint32, torch.uint64, torch.float32, torch.float64,
          # not combined in C: the general path all the same, fused or not
          torch.float16, torch.bfloat16, torch.bool, torch.complex64]
OPS = ["sum", "prod", "min", "max", "and", "or", "xor"]


@pytest.fixture(scope="module")
def heap():
    h = SymmetricHeap(comm, heap_size="16M", backend="host", timeout=30)
    yield h
    gc.collect()
    h.finalize()


def _fuses(h) -> bool:
    board = parts_of(h).agreement.board
    return board is not None and board.fuses


class _Counted:
    """How many calls delivered fused data, while it is active."""

    def __init__(self, monkeypatch):
        self.count = 0
        deliver = nodecoll.Fusion.deliver

        def counted(fusion):
            done = deliver(fusion)
            self.count += done
            return done

        monkeypatch.setattr(nodecoll.Fusion, "deliver", counted)
        deliver_collected = nodecoll.Fusion.deliver_collected

        def counted_collect(fusion, counts, dest):
            deliver_collected(fusion, counts, dest)
            self.count += 1

        monkeypatch.setattr(nodecoll.Fusion, "deliver_collected", counted_collect)
        deliver_strided = nodecoll.Fusion.deliver_strided

        def counted_strided(fusion, into):
            done = deliver_strided(fusion, into)
            self.count += done
            return done

        monkeypatch.setattr(nodecoll.Fusion, "deliver_strided", counted_strided)


@contextlib.contextmanager
def _general(monkeypatch):
    """The general path: no call stages its data, nothing is copied or folded
    in C (torch views of the mappings and the Python combiners)."""
    with monkeypatch.context() as m:
        m.setattr(nodecoll, "fusion", lambda group: nodecoll.Fusion(None, len(group.pes)))
        m.setattr(nodecoll, "combined", lambda views, dtype, op, native, into=None: None)
        m.setattr(nodecoll, "peer_addresses", lambda core, pes, tensor: None)
        yield


def _random(dtype: torch.dtype, count: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g).bool()
    if dtype.is_complex:
        return torch.randn(count, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(count, generator=g, dtype=torch.float64) * 3).to(dtype)
    bits = torch.iinfo(dtype).bits
    raw = torch.randint(-(1 << 62), 1 << 62, (count,), generator=g, dtype=torch.int64)
    return raw.view(torch.uint8).view(-1, 8)[:, :bits // 8].contiguous().view(dtype).reshape(-1)


def _same_everywhere(t: torch.Tensor) -> bytes:
    data = t.view(torch.uint8).numpy().tobytes()
    digests = comm.allgather(hashlib.sha256(data).hexdigest())
    assert len(set(digests)) == 1, digests
    return data


def _counts(itemsize: int, n: int = 1) -> list[int]:
    """Element counts of n blocks whose bytes straddle the payload limit, and small ones."""
    edge = PAYLOAD // (itemsize * n)
    return sorted({0, 1, 3, edge - 1, edge, edge + 1})


def _run_both(monkeypatch, h, call, same: bool = True):
    """call() fused and on the general path: (fused bytes, general bytes, calls
    fused); the bytes checked to be the same on every PE where `same`."""
    counted = _Counted(monkeypatch)
    take = _same_everywhere if same else (lambda t: t.view(torch.uint8).numpy().tobytes())
    fused = take(call())
    fused_calls = counted.count
    with _general(monkeypatch):
        general = take(call())
    return fused, general, fused_calls


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_reduce_matches_general_path(heap, monkeypatch, dtype):
    h, me = heap, heap.my_pe
    size = torch.empty(0, dtype=dtype).element_size()
    fused_calls = expected_fused = 0
    for count in _counts(size):
        src, dst = h.zeros(count, dtype), h.zeros(count, dtype)
        src.copy_(_random(dtype, count, 1000 * me + count))
        for op in OPS:
            def call():
                try:
                    h.reduce(dst, src, op)
                except TypeError:   # op not for this dtype: on every PE, on both paths
                    return torch.tensor([-1], dtype=torch.int8)
                h.barrier_all()
                return dst.clone()
            fused, general, calls = _run_both(monkeypatch, h, call)
            assert fused == general, (dtype, count, op)
            fused_calls += calls
            if nodecoll.element_kind(dtype) is not None and 0 < count * size <= PAYLOAD and (
                    op in ("sum", "prod") or not dtype.is_floating_point) and fused != b"\xff":
                expected_fused += 1
        h.free(src), h.free(dst)
    if _fuses(h):
        assert fused_calls == expected_fused
    else:
        assert fused_calls == 0


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.float64, torch.complex64],
                         ids=str)
def test_fused_data_movers_match_general_path(heap, monkeypatch, dtype):
    """broadcast (every root), fcollect and alltoall, around the payload limit."""
    h, n, me = heap, heap.n_pes, heap.my_pe
    size = torch.empty(0, dtype=dtype).element_size()
    fused_calls = expected = 0
    for count in _counts(size):
        src, dst = h.zeros(count, dtype), h.zeros(count, dtype)
        gathered = h.zeros(n * count, dtype)
        src.copy_(_random(dtype, count, 7 * me + count))
        for root in range(n):
            def bcast():
                dst.zero_()
                h.broadcast(dst, src, root)
                h.barrier_all()
                return dst.clone()
            fused, general, calls = _run_both(monkeypatch, h, bcast)
            assert fused == general == _random(dtype, count, 7 * root + count).view(
                torch.uint8).numpy().tobytes()
            fused_calls, expected = fused_calls + calls, expected + (0 < count * size <= PAYLOAD)

        def fcollect():
            gathered.zero_()
            h.fcollect(gathered, src)
            h.barrier_all()
            return gathered.clone()
        fused, general, calls = _run_both(monkeypatch, h, fcollect)
        assert fused == general
        fused_calls, expected = fused_calls + calls, expected + (0 < count * size <= PAYLOAD)
        for t in (src, dst, gathered):
            h.free(t)
    for per in _counts(size, n):
        src, dst = h.zeros(n * per, dtype), h.zeros(n * per, dtype)
        src.copy_(_random(dtype, n * per, 11 * me + per))

        def alltoall():
            dst.zero_()
            h.alltoall(dst, src)
            h.barrier_all()
            return dst.clone()
        fused, general, calls = _run_both(monkeypatch, h, alltoall, same=False)
        assert fused == general
        fused_calls, expected = fused_calls + calls, expected + (0 < n * per * size <= PAYLOAD)
        h.free(src), h.free(dst)
    assert fused_calls == (expected if _fuses(h) else 0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", ["reduce-count", "reduce-op", "broadcast-root",
                                  "fcollect-count", "alltoall-dtype", "collect-dest"])
def test_fused_mismatch_is_a_symmetry_error_everywhere(heap, case):
    """One PE passes something else: every PE raises at this call, dest untouched,
    and the heap goes on (the next fused call is right)."""
    h, n, me = heap, heap.n_pes, heap.my_pe
    odd = me == n - 1
    src = h.zeros(2 * n, torch.int64)
    src.fill_(me + 1)
    dst = h.zeros(2 * n * n, torch.int64)
    dst.fill_(-5)
    h.barrier_all()
    with pytest.raises(SymmetryError):
        if case == "reduce-count":
            h.reduce(dst[:3 if odd else 2], src[:3 if odd else 2])
        elif case == "reduce-op":
            h.reduce(dst[:2], src[:2], "max" if odd else "sum")
        elif case == "broadcast-root":
            h.broadcast(dst[:2], src[:2], 1 if odd else 0)
        elif case == "collect-dest":
            h.collect(dst[:2 * n + (1 if odd else 0)], src[:2])
        elif case == "fcollect-count":
            h.fcollect(dst[:n * (2 if odd else 1)], src[:2 if odd else 1])
        else:
            h.alltoall(dst[:n].view(torch.float64) if odd else dst[:n], src[:n].view(
                torch.float64) if odd else src[:n])
    assert torch.all(dst == -5)
    h.reduce(dst[:2], src[:2])
    assert dst[:2].tolist() == [n * (n + 1) // 2] * 2
    h.free(src), h.free(dst)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64,
                                   torch.float32, torch.float64, torch.float16], ids=str)
def test_larger_reduce_combined_in_c_matches_python_combiners(heap, monkeypatch, dtype):
    """Past the payload: every PE reading every source (up to 16 KiB), and the
    reduce-scatter and gather (above), combined in C from the peers' mappings."""
    h, me = heap, heap.my_pe
    size = torch.empty(0, dtype=dtype).element_size()
    in_c = []
    combined_at = nodecoll.combined_at
    monkeypatch.setattr(nodecoll, "combined_at", lambda *args: in_c.append(combined_at(*args))
                        or in_c[-1])
    for nbytes in (PAYLOAD + 8, 16 << 10, (40 << 10) + 8, (300 << 10) + 24):
        count = nbytes // size
        src, dst = h.zeros(count, dtype), h.zeros(count, dtype)
        src.copy_(_random(dtype, count, 5 * me + count))
        for op in OPS:
            def call():
                try:
                    h.reduce(dst, src, op)
                except TypeError:   # op not for this dtype: on every PE, on both paths
                    return torch.tensor([-1], dtype=torch.int8)
                h.barrier_all()
                return dst.clone()
            fused, general, calls = _run_both(monkeypatch, h, call)
            assert fused == general, (dtype, nbytes, op)
            assert calls == 0     # past the payload: not fused
            with monkeypatch.context() as m:   # C folds torch views (a device heap's way)
                m.setattr(nodecoll, "peer_addresses", lambda core, pes, tensor: None)
                assert _same_everywhere(call()) == general, (dtype, nbytes, op, "views")

            def in_place():   # dest is source: a PE's chunk not folded first needs a copy
                dst.copy_(src)
                try:
                    h.reduce(dst, dst, op)
                except TypeError:
                    return torch.tensor([-1], dtype=torch.int8)
                h.barrier_all()
                return dst.clone()
            fused, general, calls = _run_both(monkeypatch, h, in_place)
            assert fused == general, (dtype, nbytes, op, "in place")
        h.free(src), h.free(dst)
    # C combined what it could (not float16, not float min/max, not bitwise on floats)
    assert any(in_c) == (h.native and dtype != torch.float16)


@pytest.mark.mpi(min_size=2)
def test_node_addresses_of_a_block_made_again_give_the_general_paths_bytes(heap, monkeypatch):
    """peer_addresses() remembers each member's address by this PE's address and
    extent while the blocks live (a free forgets it all): a block of the same
    size class made again at an address used before, with another size, gives
    the general path's bytes, for a reduce and an fcollect past the payload."""
    h, me, n = heap, heap.my_pe, heap.n_pes
    located = []
    peer_addresses = nodecoll.peer_addresses
    monkeypatch.setattr(nodecoll, "peer_addresses", lambda core, pes, tensor: located.append(
        tensor.nbytes) or peer_addresses(core, pes, tensor))
    used: set[int] = set()
    for count in (PAYLOAD // 4 + 3, PAYLOAD // 2 - 200):   # (one size class: 16 KiB)
        src, dst = h.zeros(count, torch.float64), h.zeros(count, torch.float64)
        gathered = h.zeros(n * count, torch.float64)
        assert not used or {src.data_ptr(), dst.data_ptr()} & used   # (made again there)
        used |= {src.data_ptr(), dst.data_ptr()}
        for round_ in range(2):
            src.copy_(_random(torch.float64, count, 31 * me + count + round_))

            def reduce():
                h.reduce(dst, src, "sum")
                h.barrier_all()
                return dst.clone()

            def fcollect():
                h.fcollect(gathered, src)
                h.barrier_all()
                return gathered.clone()
            for call in (reduce, fcollect):
                fused, general, _ = _run_both(monkeypatch, h, call)
                assert fused == general, (count, round_, call.__name__)
        h.free(src), h.free(dst), h.free(gathered)
    assert len(set(located)) >= 2   # (both sizes were asked for)


@pytest.mark.mpi(min_size=2)
def test_team_collectives_fuse_on_the_teams_board_and_match_the_general_path(heap, monkeypatch):
    """A split team (here of every PE) gets a board of its own where the heap's steps run on one
    in C: its small collectives fuse, its larger reduce combines in C, with the
    bytes of the general path; a mismatch is a SymmetryError on every member."""
    h, n, me = heap, heap.n_pes, heap.my_pe
    team = h.team_world().split_strided(0, 1, n)
    assert team is not None and team.n_pes() == n
    board = team.agreement.board
    assert (board is not None and board.fuses) == _fuses(h)
    fused_calls = expected = 0
    for dtype, count in ((torch.int32, 5), (torch.float64, 3), (torch.int8, PAYLOAD + 1),
                         (torch.float64, (20 << 10) // 8 + 1)):
        size = torch.empty(0, dtype=dtype).element_size()
        src, dst = h.zeros(count, dtype), h.zeros(count, dtype)
        gathered = h.zeros(n * count, dtype)
        src.copy_(_random(dtype, count, 13 * me + count))
        small = count * size <= PAYLOAD

        def bcast():
            dst.zero_()
            team.broadcast(dst, src, n - 1)
            team.sync()
            return dst.clone()

        def fcollect():
            gathered.zero_()
            team.fcollect(gathered, src)
            team.sync()
            return gathered.clone()

        def reduce():
            dst.zero_()
            team.reduce(dst, src, "sum")
            team.sync()
            return dst.clone()
        for call in (bcast, fcollect, reduce):
            fused, general, calls = _run_both(monkeypatch, h, call)
            assert fused == general, (dtype, count, call.__name__)
            fused_calls, expected = fused_calls + calls, expected + small
        for t in (src, dst, gathered):
            h.free(t)
    assert fused_calls == (expected if _fuses(h) else 0)
    src, dst = h.zeros(2, torch.int64), h.zeros(2, torch.int64)
    dst.fill_(-5)
    team.sync()
    with pytest.raises(SymmetryError):
        team.reduce(dst, src, "max" if me == n - 1 else "sum")
    assert torch.all(dst == -5)
    src.fill_(me + 1)
    team.reduce(dst, src)
    assert dst.tolist() == [n * (n + 1) // 2] * 2
    team.destroy()
    h.free(src), h.free(dst)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [torch.int8, torch.float64, torch.complex64], ids=str)
def test_fused_collect_of_different_sizes_matches_the_general_path(heap, monkeypatch, dtype):
    """collect (each PE its own count, random with a fixed seed) fuses its sizes
    and data into the agreed step where dest fits a slot: the bytes of the
    general path (a step, an allgather of the sizes and a copy step); dest
    too small for the total is a ValueError on every PE, on both paths."""
    h, n, me = heap, heap.n_pes, heap.my_pe
    size = torch.empty(0, dtype=dtype).element_size()
    rng = torch.Generator().manual_seed(33)
    fused_calls = expected = 0
    for room in (1, 7, (PAYLOAD - 8) // size, (PAYLOAD - 8) // size + 1, 3 * PAYLOAD // size):
        counts = torch.randint(0, max(1, room // n) + 1, (n,), generator=rng).tolist()
        src, dst = h.zeros(max(1, room), dtype), h.zeros(room, dtype)
        src.copy_(_random(dtype, max(1, room), 17 * me + room))
        mine = src[:counts[me]]

        def collect():
            dst.fill_(7)
            h.collect(dst, mine)
            h.barrier_all()
            return dst.clone()
        fused, general, calls = _run_both(monkeypatch, h, collect)
        assert fused == general, (room, counts)
        want = torch.cat([_random(dtype, max(1, room), 17 * pe + room)[:counts[pe]]
                          for pe in range(n)])
        assert torch.equal(torch.frombuffer(bytearray(fused), dtype=dtype)[:len(want)].view(
            torch.uint8), want.view(torch.uint8))
        fused_calls += calls
        expected += 0 < room * size <= PAYLOAD - 8 and sum(counts) > 0
        h.free(src), h.free(dst)
    assert fused_calls == (expected if _fuses(h) else 0)
    src, dst = h.zeros(4, dtype), h.zeros(4, dtype)
    dst.fill_(7)
    for general in (False, True):
        with _general(monkeypatch) if general else contextlib.nullcontext():
            with pytest.raises(ValueError, match="contribute"):
                h.collect(dst, src[:4 if me == 0 else 1])    # 4 + (n - 1) > 4 elements
    assert torch.all(dst == 7)
    h.free(src), h.free(dst)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [torch.int16, torch.float64], ids=str)
def test_fused_alltoalls_matches_the_general_path(heap, monkeypatch, dtype):
    """alltoalls (strides and counts from a fixed seed) fuses its data into the
    agreed step where n * nelems elements fit a slot: the general path's bytes,
    the elements of dest between the strided ones left as they were."""
    h, n, me = heap, heap.n_pes, heap.my_pe
    size = torch.empty(0, dtype=dtype).element_size()
    rng = torch.Generator().manual_seed(34)
    fused_calls = expected = 0
    for nelems in (1, 3, PAYLOAD // (size * n), PAYLOAD // (size * n) + 1):
        ds, ss = torch.randint(1, 4, (2,), generator=rng).tolist()
        src = h.zeros(ss * (n * nelems - 1) + 1, dtype)
        dst = h.zeros(ds * (n * nelems - 1) + 1, dtype)
        src.copy_(_random(dtype, src.numel(), 19 * me + nelems))

        def alltoalls():
            dst.fill_(3)
            h.alltoalls(dst, src, ds, ss, nelems)
            h.barrier_all()
            return dst.clone()
        fused, general, calls = _run_both(monkeypatch, h, alltoalls, same=False)
        assert fused == general, (nelems, ds, ss)
        fused_calls += calls
        expected += n * nelems * size <= PAYLOAD
        h.free(src), h.free(dst)
    assert fused_calls == (expected if _fuses(h) else 0)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.float32, torch.float64],
                         ids=str)
def test_replayed_torch_calls_match_the_general_path(heap, monkeypatch, dtype):
    """The torch face's repeated world calls run from the Plan of their first
    (openshmem/collectives.py: _tensor_key, nodecoll.replay): on new data each
    round, the general path's bytes on every PE."""
    h, me, n = heap, heap.my_pe, heap.n_pes
    source, dest = h.zeros(4 * n, dtype=dtype), h.zeros(4 * n, dtype=dtype)
    calls = {"broadcast": lambda: h.broadcast(dest[:4], source[:4], n - 1),
             "fcollect": lambda: h.fcollect(dest, source[:4]),
             "collect": lambda: h.collect(dest, source[:4 - me % 2]),   # (its own count)
             "alltoall": lambda: h.alltoall(dest, source),
             "reduce": lambda: h.reduce(dest[1:4], source[1:4], "sum"),
             # a team's own (split: a board of its own where the world has one)
             "team reduce": lambda: h.reduce(dest[1:4], source[1:4], "sum", team=team),
             "team fcollect": lambda: h.fcollect(dest, source[:4], team=team)}
    team = h.team_split_strided(h.team_world(), 0, 1, n)
    for name, call in calls.items():
        with replays(monkeypatch) as ran:
            for round_ in range(3):
                source.copy_(_random(dtype, 4 * n, 100 * round_ + 10 * me + len(name)))
                results = []
                for general in (True, False):
                    with _general(monkeypatch) if general else contextlib.nullcontext():
                        dest.zero_()
                        call()
                        results.append(dest.view(torch.uint8).numpy().tobytes())
                    h.barrier_all()
                assert results[0] == results[1], (name, round_)
            assert bool(ran) == _fuses(h), name
    team.destroy()
    h.free(source), h.free(dest)


@pytest.mark.mpi(min_size=2)
def test_replayed_torch_calls_are_agreed_and_check_the_storage(heap, monkeypatch):
    """A root that differs on one PE raises SymmetryError everywhere; a tensor
    over the same bytes with a storage of its own (not the heap's) takes the
    general path's NotSymmetricError, though its key is the Plan's; a
    conjugated or strided view of a replayed tensor takes its ValueError."""
    from shmemvm import NotSymmetricError
    h, me = heap, heap.my_pe
    source, dest = h.zeros(4, dtype=torch.int64), h.zeros(4, dtype=torch.int64)
    with replays(monkeypatch) as ran:
        for _ in range(3):
            h.broadcast(dest, source, 0)
        assert bool(ran) == _fuses(h)
        dest.fill_(-3)
        with pytest.raises(SymmetryError):
            h.broadcast(dest, source, 0 if me else 1)
        assert dest.tolist() == [-3] * 4
        stranger = torch.from_numpy(dest.numpy())   # the same bytes, another storage
        assert stranger.data_ptr() == dest.data_ptr()
        ran.clear()
        with pytest.raises(NotSymmetricError):
            h.broadcast(stranger, source, 0)
        assert not ran
        h.broadcast(dest, source, 0)
        assert dest.tolist() == [0] * 4
        # the same bytes viewed oddly: a key of its own, the general path's error
        z, zs = h.zeros(4, dtype=torch.complex64), h.zeros(4, dtype=torch.complex64)
        for _ in range(3):
            h.broadcast(z, zs, 0)
        ran.clear()
        with pytest.raises(ValueError, match="conjugated"):
            h.broadcast(z.conj(), zs, 0)
        with pytest.raises(ValueError, match="not contiguous"):
            h.broadcast(z[::2], zs[::2], 0)
        assert not ran
        h.free(z), h.free(zs)
        # contiguous, with other strides on its dimensions of 1: the same bytes, so the
        # same key and Plan (the key asks is_contiguous(), not stride()), and the root's data
        source.copy_(torch.arange(4) + 10 * me)
        for _ in range(2):
            h.broadcast(dest.view(4, 1), source.view(4, 1), 0)
        ran.clear()
        dest.zero_()
        h.broadcast(dest.as_strided((4, 1), (1, 7)), source.as_strided((4, 1), (1, 5)), 0)
        assert dest.tolist() == [0, 1, 2, 3] and bool(ran) == _fuses(h)
        # a negated view of a real dtype (the key skips is_conj() there, not is_neg()):
        # the general path's ValueError, not the plain tensor's Plan
        ran.clear()
        for negated in ((torch._neg_view(dest), source), (dest, torch._neg_view(source))):
            with pytest.raises(ValueError, match="negated"):
                h.broadcast(*negated, 0)
        assert not ran and dest.tolist() == [0, 1, 2, 3]
        # 0-d tensors: contiguous, a key of shape (), replayed with the root's data
        x, y = h.zeros((), dtype=torch.float64), h.zeros((), dtype=torch.float64)
        y.fill_(5.0 + me)
        ran.clear()
        for _ in range(3):
            x.zero_()
            h.broadcast(x, y, 1)
            assert x.item() == 6.0
        assert bool(ran) == _fuses(h)
        h.free(x), h.free(y)
    h.barrier_all()
    h.free(source), h.free(dest)
