"""The agreement's board (board.py): where every PE is on one node, steps go
through shared memory and must decide exactly what the MPI allreduce did.
Run under mpirun -n 2 and 4 (the suite runs 1, 2 and 4; most need 2 PEs).
"""

from __future__ import annotations

import array
import os
import random
import time
import zlib

import pytest
import torch
from mpi4py import MPI

import shmemvm.agreement.agreement
import shmemvm.core.setup
from shmemvm import native
from shmemvm import PeerTimeoutError, ShmemError, SymmetricHeap, SymmetryError
from shmemvm.agreement.deadline import persistent_collectives
from shmemvm.agreement.protocol import SEQ_SLOT
from shmemvm.agreement.board import Board
from shmemvm.core.state import parts_of
from util import barrier_interrupted_on_pe_1, open_fds

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD
OPTIONS = {"backend": "host", "timeout": 10, "agreement": "board"}
WORDS = 28


def no_wait(ready):
    while not ready():
        pass


@pytest.fixture(params=["python", "native"])
def board(request):
    """A board whose steps run in Python, or in the compiled piece (the same
    layout: each reads what the other writes)."""
    if request.param == "native" and native._native is None:
        pytest.skip("the compiled piece is not built (pip install . builds it)")
    b = Board(world, WORDS, SEQ_SLOT)
    b.freeable = True
    if request.param == "native":
        b.use_native()
    yield b
    world.Barrier()
    b.close()


def vector(seq: int, fill: int = 7) -> array.array:
    v = array.array("q", [fill] * WORDS)
    v[SEQ_SLOT] = seq
    return v


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("setting, fast, on_one_node", [
    ("board", "auto", True), ("mpi", "auto", False),
    ("auto", "auto", native._native is not None or not persistent_collectives()),
    ("auto", "0", not persistent_collectives())])
def test_the_setting_chooses_the_board_where_every_pe_is_on_one_node(setting, fast, on_one_node):
    """auto: the board where its steps run in C, or where MPI has no persistent
    allreduce; never where some PE is on another node."""
    for node_split, expected in ((None, on_one_node), (1, False)):   # node_split=1: not one node
        heap = SymmetricHeap(world, "16M", backend="host", timeout=10, agreement=setting,
                             node_split=node_split, native=fast)
        try:
            assert (parts_of(heap).agreement.board is not None) == expected
            heap.free(heap.malloc(100))
        finally:
            heap.finalize()


@pytest.mark.parametrize("setting, fast, expected", [
    ("auto", "auto", native._native is not None or not persistent_collectives()),
    ("board", "auto", True), ("mpi", "auto", False)])
def test_a_heap_of_one_pe_steps_on_the_board_as_larger_ones_do(setting, fast, expected):
    """One PE is on one node: its steps take the board (and the quick steps
    in C) where a heap of more PEs would. A one-process program agreed
    through MPI's general path before, at twice the cost of 2 PEs' malloc."""
    heap = SymmetricHeap(MPI.COMM_SELF, "16M", backend="host", timeout=10, agreement=setting,
                         native=fast)
    try:
        assert (parts_of(heap).agreement.board is not None) == expected
        for _ in range(3):
            heap.free(heap.malloc(100))
        heap.barrier_all()
        x, y = heap.zeros(4, torch.int64), heap.zeros(4, torch.int64)
        x += 5
        heap.all_reduce(y, x)
        assert y.tolist() == [5] * 4
        with pytest.raises(ValueError):
            heap.malloc(-1)
        heap.free(x)
        heap.free(y)
    finally:
        heap.finalize()


@pytest.mark.mpi(min_size=2)
def test_board_reduces_as_mpi_allreduce_max_does(board):
    """Random vectors, mostly alike (the common case), sometimes with other
    flags or other words: the board's MAX is MPI's, word for word."""
    rng = random.Random(1234)
    for seq in range(1, 400):
        base = [rng.randrange(-2**62, 2**62) for _ in range(WORDS)]
        send = array.array("q", base)
        send[SEQ_SLOT] = seq
        kind = rng.random()
        if kind < 0.3:                       # flags differ
            send[-1] = -1 if rng.random() < 0.5 else 0
            send[-2] = -1 if rng.random() < 0.5 else 0
        elif kind < 0.4:                     # the PEs differ in a word
            send[rng.randrange(SEQ_SLOT)] += world.rank
        expected = array.array("q", bytes(8 * WORDS))
        world.Allreduce(send, expected, MPI.MAX)
        assert board.allreduce_max(send, seq, no_wait) == expected, seq


@pytest.mark.mpi(min_size=2)
def test_a_slot_is_read_only_when_written_whole(board):
    """A reader takes a slot only when its step word, the step inside the
    vector and the check word all say step s: a slot seen half written (any
    order of stores) or still holding the step before is read again."""
    seq = 5
    slot = board._theirs[seq & 1][0]          # on PE 1: PE 0's slot
    world.Barrier()
    if world.rank == 0:
        step, start, end, check = board._mine[seq & 1]
        data = vector(seq).tobytes()
        words, raw = board._words, board._bytes
        raw[start:end] = data
        words[step] = seq                     # step word first, check word not yet
        world.Barrier()
        world.Barrier()
        words[check] = zlib.crc32(data)       # now whole
        world.Barrier()
        world.Barrier()
        stale = vector(seq - 2).tobytes()     # an older step's vector, step word new
        raw[start:end] = stale
        words[check] = zlib.crc32(stale)
        world.Barrier()
        world.Barrier()
    else:
        world.Barrier()
        if world.rank == 1:
            assert board._read(slot, seq) is None
        world.Barrier()
        world.Barrier()
        if world.rank == 1:
            assert board._read(slot, seq) == vector(seq).tobytes()
        world.Barrier()
        world.Barrier()
        if world.rank == 1:
            assert board._read(slot, seq) is None
        world.Barrier()


@pytest.mark.mpi(min_size=2)
def test_mismatched_calls_raise_symmetry_error_everywhere_through_the_board():
    heap = SymmetricHeap(world, "16M", **OPTIONS)
    try:
        assert parts_of(heap).agreement.board is not None
        with pytest.raises(SymmetryError, match=r"malloc\(64\).*malloc\(32\)|malloc\(32\).*malloc\(64\)"):
            heap.malloc(64 if heap.my_pe == 0 else 32)
        x = heap.malloc(16)           # nothing was done: the heap goes on
        heap.free(x)
    finally:
        heap.finalize()


@pytest.mark.mpi(min_size=2)
def test_an_interrupted_wait_on_the_board_is_finished_by_the_next_step():
    heap = SymmetricHeap(world, "16M", **OPTIONS)
    try:
        barrier_interrupted_on_pe_1(heap)
        for n in (64, 128, 256):      # later steps: the same on every PE
            t = heap.zeros(n, torch.uint8)
            heap.free(t)
        assert parts_of(heap).agreement.broken is None
    finally:
        heap.finalize()


@pytest.mark.mpi(min_size=2)
def test_a_pe_that_does_not_come_in_time_is_a_timeout_through_the_board():
    """PE 0 gives up on a barrier that the others join only after the
    deadline; nobody hangs: PE 0 raises PeerTimeoutError, and the others,
    whose later finalize() PE 0 no longer joins, time out there."""
    heap = SymmetricHeap(world, "16M", backend="host", timeout=1, agreement="board")
    assert parts_of(heap).agreement.board is not None
    if heap.my_pe == 0:
        start = time.monotonic()
        with pytest.raises(PeerTimeoutError, match=r"not every PE joined barrier_all"):
            heap.barrier_all()
        assert time.monotonic() - start < 5
        world.Barrier()
        heap.finalize()                 # broken: releases this PE's memory alone
    else:
        world.Barrier()                 # after PE 0 gave up
        with pytest.raises(PeerTimeoutError):
            heap.barrier_all()          # completes with PE 0's old slot, or times out
            heap.finalize()
        heap.finalize()
    world.Barrier()


@pytest.mark.mpi(min_size=2)
def test_different_agreement_settings_are_an_init_error_on_every_pe():
    options = dict(OPTIONS, agreement="mpi" if world.rank == 0 else "board")
    with pytest.raises(SymmetryError, match="SHMEMVM_AGREEMENT"):
        SymmetricHeap(world, "16M", **options)
    world.Barrier()


def test_a_bad_agreement_setting_is_refused():
    with pytest.raises(ValueError, match="SHMEMVM_AGREEMENT.*'auto', 'board' or 'mpi'"):
        SymmetricHeap(MPI.COMM_SELF, "16M", **dict(OPTIONS, agreement="shm"))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("setting", ["auto", "board"])
@pytest.mark.parametrize("where", ["every PE", "PE 1"])
def test_a_board_that_cannot_be_made_means_mpi_for_auto_and_an_init_error_for_board(
        setting, where, monkeypatch):
    """Open MPI 4.1 with `-mca osc pt2pt` (which docs/multinode.md advises for
    its off-node window) cannot allocate shared windows, on every PE: `auto`,
    which picks the board there, must then agree through MPI; only an explicit
    `board` fails init, on every PE. The same where one PE alone fails after
    the window's collective allocation."""
    monkeypatch.setattr(shmemvm.core.setup, "persistent_collectives", lambda: False)
    make_board = shmemvm.agreement.agreement.Agreement.make_board

    def refuse(self):
        board = make_board(self)   # the collective part, on every PE
        if where == "every PE" or world.rank == 1:
            board.close()          # not freed: left to MPI_Finalize, as init leaves it
            raise MPI.Exception(MPI.ERR_INTERN)
        return board
    monkeypatch.setattr(shmemvm.agreement.agreement.Agreement, "make_board", refuse)
    options = dict(OPTIONS, agreement=setting)
    if setting == "board":
        with pytest.raises(ShmemError, match="agreement's board"):
            SymmetricHeap(world, "16M", **options)
        world.Barrier()
        return
    heap = SymmetricHeap(world, "16M", **options)
    try:
        assert parts_of(heap).agreement.board is None
        x = heap.malloc(64)
        heap.barrier_all()
        heap.free(x)
    finally:
        heap.finalize()


def _shared_files_mapped() -> set[str]:
    """Files this process maps shared, shmemvm's own memfd pieces left out: an
    MPI shared window's segments (MPI may unlink them at once, which adds
    " (deleted)" to the path)."""
    files = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[1][3] == "s" and fields[5].startswith("/") \
                    and not fields[5].startswith("/memfd:"):
                files.add(fields[5].strip().removesuffix(" (deleted)"))
    return files


@pytest.mark.mpi(min_size=2)
def test_heaps_with_boards_leave_no_descriptor_or_shared_file():
    """Only what the heaps made is checked (the shared files this process
    mapped while a heap lived, not all of /dev/shm, where other jobs come and
    go), and the PEs decide together, so a leak on one PE fails the test on
    every PE and they stay in step."""
    SymmetricHeap(world, "16M", **OPTIONS).finalize()   # MPI's own one-off state
    world.Barrier()
    fds, mapped = open_fds(), _shared_files_mapped()
    made = set()
    for _ in range(5):
        heap = SymmetricHeap(world, "16M", **OPTIONS)
        heap.free(heap.malloc(64))
        made |= _shared_files_mapped() - mapped
        heap.finalize()
    world.Barrier()
    problems = []
    if made == set():
        problems.append("no heap mapped a shared file: the board's window was not found")
    if open_fds() != fds:
        problems.append(f"descriptors left open: {sorted(open_fds() - fds)}")
    if _shared_files_mapped() - mapped:
        problems.append(f"still mapped: {sorted(_shared_files_mapped() - mapped)}")
    left = sorted(path for path in made if os.path.exists(path))
    if left:
        problems.append(f"files left behind: {left}")
    everywhere = world.allgather(problems)
    assert not any(everywhere), "; ".join(f"PE {pe}: {', '.join(p)}"
                                          for pe, p in enumerate(everywhere) if p)
