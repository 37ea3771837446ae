"""The routines of openshmem/ against a fake of the narrow door they see
(core/state.py's Core Protocol), without MPI: a two-PE "heap" of two local
buffers, whose locate() hands out Targets (transport/target.py) for PE 0
(this PE's buffer) and PE 1 (the other buffer, as a node peer's mapping).

What the fake shows: put/get/ptr reach the right buffer through the Target
alone; an atomic lands on the target's atomic address; a reduce's combiner
combines; and the error paths (a bad PE, a freed or foreign tensor) raise
what the real heap raises."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from shmemvm import _args, native
from shmemvm.errors import FreedTensorError, NotSymmetricError
from shmemvm.memory.buddy import Block, Segment
from shmemvm.openshmem import atomics, collectives, rma, words
from shmemvm.transport.route import Route
from shmemvm.transport.target import Target

SIZE = 256


class Tracker:
    """The default context's tracker: a blocking copy, nothing outstanding."""

    def copy(self, dst, src):
        dst.copy_(src)

    def quiet(self):
        pass

    def fence(self):
        pass


class Mapping:
    """PE 1's memory as a node peer's mapping: views of the second buffer."""

    def __init__(self, memory: torch.Tensor):
        self.memory = memory

    def copy_view(self, pe, offset, like):
        assert pe == 1
        return torch.as_strided(self.memory.view(like.dtype), like.shape, like.stride(),
                                offset // like.element_size())

    def block_view(self, pe, start, like):
        return self.copy_view(pe, start + like.storage_offset() * like.element_size(), like)


class FakeCore:
    """Two PEs over two local buffers; only the Core members the routines
    under test use. `cpu`: the targets carry CPU (atomic) addresses."""

    my_pe, n_pes, native, closed, broken = 0, 2, False, False, None

    def __init__(self, cpu: bool = False):
        self.mine = torch.zeros(SIZE, dtype=torch.uint8)
        self.theirs = torch.zeros(SIZE, dtype=torch.uint8)
        self.lock = threading.RLock()
        self.tracker = Tracker()
        self.device = torch.device("cpu")
        #: what the heap is (Core.identity): only the facts the routines under test read
        self.identity = SimpleNamespace(my_pe=self.my_pe, n_pes=self.n_pes, native=self.native,
                                        device=self.device)
        self.cpu = cpu
        self.freed = False
        self.targets: list[tuple[int, int]] = []   # (pe, offset) of each Target made
        self.segment = Segment(0, SIZE, 1)
        #: the door's facets (Core.calls, .where, ...): the fake itself, as HeapCore's are
        self.calls = self.where = self.memory = self.contexts = self

    @property
    def core(self):
        return self

    def check_pe(self, pe):
        return _args.pe(pe, self.n_pes)

    world_pe = check_pe

    def check_usable(self):
        pass

    def symmetric(self, tensor, role):
        start = self.mine.data_ptr()
        if not start <= tensor.untyped_storage().data_ptr() < start + SIZE:
            raise NotSymmetricError(f"the {role} must be a live symmetric tensor")
        if self.freed:
            raise FreedTensorError(f"the {role} must be a live symmetric tensor: freed")
        return Block(0, SIZE, SIZE, self.segment, 0)

    def locate(self, tensor, pe, role):
        block = self.symmetric(tensor, role)
        return self._target(block, tensor.data_ptr() - self.mine.data_ptr(), pe)

    def located(self, tensor, pe):
        return None   # (no one pass kept: every put and get takes transfer())

    def locate_in(self, allocation, address, pe):
        if self.freed:
            return None
        return self._target(self.symmetric(allocation, "allocation"),
                            address - self.mine.data_ptr(), pe)

    def _target(self, block, offset, pe):
        self.targets.append((pe, offset))
        memory = self.mine if pe == 0 else self.theirs
        address = memory.data_ptr() + offset
        return Target(pe, Route.SELF if pe == 0 else Route.NODE, block, offset, address,
                      address if self.cpu else None, address if self.cpu else None, False,
                      None, None if pe == 0 else Mapping(self.theirs))

    def storage_offset(self, tensor):
        return tensor.untyped_storage().data_ptr() - self.mine.data_ptr()

    def hold(self, block, view):
        return view

    def copy(self, dst, src):
        dst.copy_(src)

    def window_for(self, what):
        raise AssertionError(f"{what}: no PE of the fake is off the node")

    def atomics_window(self, what, pe):
        raise AssertionError(f"{what}: the fake's atomics are the CPU's")

    def tensor(self, dtype=torch.int64):
        """A symmetric tensor over this PE's whole buffer."""
        return self.mine.view(dtype)


def test_put_and_get_go_through_the_located_target():
    core = FakeCore()
    dest = core.tensor(torch.float32)[4:8]
    rma.put(core, dest, torch.arange(4, dtype=torch.float32), 1)
    assert core.theirs.view(torch.float32)[4:8].tolist() == [0, 1, 2, 3]   # PE 1's copy
    assert core.mine.count_nonzero() == 0                               # not this PE's
    assert core.targets == [(1, 16)]                                    # located once
    got = torch.empty(4, dtype=torch.float32)
    rma.get(core, got, dest, 1)
    assert got.tolist() == [0, 1, 2, 3]
    rma.put(core, dest, torch.full((4,), 7.0), 0)                       # to itself
    assert core.tensor(torch.float32)[4:8].tolist() == [7.0] * 4


def test_ptr_is_the_targets_view():
    core = FakeCore()
    t = core.tensor()[2:4]
    assert rma.ptr(core, t, 0) is t
    there = rma.ptr(core, t, 1)
    there.fill_(5)
    assert core.theirs.view(torch.int64)[2:4].tolist() == [5, 5]


@pytest.mark.skipif(native._native is None, reason="the compiled piece is not built here")
def test_an_atomic_lands_on_the_targets_atomic_address():
    core = FakeCore(cpu=True)
    word, where = atomics.tensor_word(core.tensor()[3], "atomic_fetch_add")
    assert atomics.apply(core, word, where, 1, "add", 5, what="atomic_fetch_add") == 0
    assert atomics.apply(core, word, where, 1, "fetch", what="atomic_fetch") == 5
    assert core.theirs.view(torch.int64)[3] == 5 and core.tensor()[3] == 0
    # the one-pass form takes the same target's address: fast is the target's property
    there = atomics.cpu_word(core, core.mine, where.data_ptr(), word, 1)
    assert there == core.theirs.data_ptr() + 24
    assert atomics.at_address(there, word, "cas", 9, 5, what="atomic_compare_swap") == 5
    assert core.theirs.view(torch.int64)[3] == 9
    misaligned = atomics.cpu_word(core, core.mine, where.data_ptr() + 1, word, 1)
    assert misaligned is None   # apply() then names what is wrong


def test_a_reduce_combiner_combines_elementwise():
    core = FakeCore()
    acc = torch.tensor([1, 5, 3], dtype=torch.int32)
    for op, other, expected in (("sum", [1, 1, 1], [2, 6, 4]), ("max", [4, 0, 9], [4, 6, 9]),
                                ("prod", [2, 2, 2], [8, 12, 18])):
        collectives.torch_combiner(core, op, torch.int32)(acc, torch.tensor(other,
                                                                            dtype=torch.int32))
        assert acc.tolist() == expected, op
    with pytest.raises(TypeError):
        collectives.torch_combiner(core, "xor", torch.float32)


def test_bad_pe_freed_and_foreign_tensors_raise():
    core = FakeCore()
    dest = core.tensor()[0:2]
    with pytest.raises(ValueError, match="pe"):
        rma.put(core, dest, torch.zeros(2, dtype=torch.int64), 2)
    with pytest.raises(TypeError, match="pe"):
        rma.put(core, dest, torch.zeros(2, dtype=torch.int64), "1")
    with pytest.raises(NotSymmetricError, match="destination"):
        rma.put(core, torch.zeros(2, dtype=torch.int64), dest, 1)
    core.freed = True
    with pytest.raises(FreedTensorError, match="source"):
        rma.get(core, torch.zeros(2, dtype=torch.int64), dest, 1)
    with pytest.raises(FreedTensorError):
        word, where = atomics.tensor_word(dest[0], "atomic_fetch")
        atomics.apply(core, word, where, 1, "fetch", what="atomic_fetch")
    assert core.theirs.count_nonzero() == 0   # nothing moved
    assert words.of_torch(torch.int64) is not None
