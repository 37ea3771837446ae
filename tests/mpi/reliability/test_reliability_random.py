"""Randomized differential test of the symmetric heap against a plain model
(host backend; run under mpirun -n 1, 2 and 4).

Every PE draws from the same seeded generator, so all PEs make the same
collective calls; every PE also keeps the same model: for each object, the
contents it must have on each PE (one flat CPU tensor per PE). Steps are
malloc / empty / zeros, put (blocking, non-blocking, stores through ptr,
strided), get (the same three ways), free, realloc, dropping a tensor for the
garbage collector on every PE or on some PEs only (freed by agreement once all
have dropped it), trim, barrier, and a too-large request. After each
collective the number of live allocations must match the model, and regularly
every object is compared, here and on a peer, and the allocators' states
compared across PEs: nothing lost, nothing mixed up.

SHMEMVM_TEST_SEED and SHMEMVM_RANDOM_STEPS change the seed and the length.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from mpi4py import MPI

from shmemvm import HeapExhaustedError, SymmetricHeap
from shmemvm.core.state import parts_of

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD
SEED = int(os.environ.get("SHMEMVM_TEST_SEED", "6061"))
STEPS = int(os.environ.get("SHMEMVM_RANDOM_STEPS", "4000"))
MAX_OBJECTS = 24
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.bool]


_PERIOD = 113
_MAX_COUNT = (640 << 10) + 1
_RING = (torch.arange(_MAX_COUNT + _PERIOD, dtype=torch.int64) * 7) % _PERIOD
_RINGS: dict[torch.dtype, torch.Tensor] = {}


def pattern(step: int, pe: int, count: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """What PE `pe` writes at `step`: element i is (7 i + 31 step + 17 pe + salt) mod 113,
    exact in every dtype and different per PE and step. A read-only view: clone
    it to keep it."""
    ring = _RINGS.get(dtype)
    if ring is None:
        ring = _RINGS[dtype] = (_RING % 2).bool() if dtype == torch.bool else _RING.to(dtype)
    shift = (step * 31 + pe * 17 + salt) * 97 % _PERIOD     # 97 = 1/7 mod 113
    return ring[shift:shift + count]


@dataclass
class Obj:
    name: int
    dtype: torch.dtype
    numel: int
    tensor: torch.Tensor | None                  # this PE's symmetric tensor (None: dropped here)
    expected: list[torch.Tensor]                 # per PE, flat
    held_by: set[int] = field(default_factory=set)


class Run:
    def __init__(self, heap: SymmetricHeap, seed: int):
        self.heap = heap
        self.me, self.n = heap.my_pe, heap.n_pes
        self.rng = random.Random(seed)
        self.objects: dict[int, Obj] = {}
        self.next_name = 0
        self.written = False                     # symmetric memory written since the last barrier
        self.read = False                        # ... or read remotely
        self.done = Counter()

    # -- helpers ---------------------------------------------------------------
    def sync(self, before_write: bool = False) -> None:
        """Barrier where needed: before reading what may have been written, and
        before writing what a PE may still be reading."""
        if self.written or (before_write and self.read):
            self.heap.barrier_all()
            self.written = self.read = False

    def live(self) -> list[Obj]:
        return [o for o in self.objects.values() if len(o.held_by) == self.n]

    def partial(self) -> list[Obj]:
        return [o for o in self.objects.values() if 0 < len(o.held_by) < self.n]

    def check_live_count(self) -> None:
        """Called right after a collective: blocks dropped by every PE are gone."""
        assert self.heap.heap_info()["live_allocations"] == len(self.objects)

    def flat(self, obj: Obj) -> torch.Tensor:
        return obj.tensor.view(-1)

    def pick_slice(self, numel: int) -> slice:
        a = self.rng.randrange(numel + 1)
        b = self.rng.randrange(a, numel + 1)
        return slice(a, b, self.rng.choice((1, 1, 1, 2, 3)))

    def size(self, dtype: torch.dtype) -> int:
        r = self.rng.random()
        if r < 0.03:
            return 0
        if r < 0.75:
            return self.rng.randrange(1, 3000)
        return self.rng.randrange(1, (640 << 10) // dtype.itemsize)    # new segments

    # -- steps -----------------------------------------------------------------
    def alloc(self, step: int) -> None:
        dtype = self.rng.choice(DTYPES)
        numel = self.size(dtype)
        how = self.rng.choice(("malloc", "empty", "zeros"))
        if how == "malloc":
            dtype = torch.uint8
            tensor = self.heap.malloc(numel)
        else:
            rows = self.rng.choice([r for r in (1, 2, 3, 4) if numel % r == 0])
            shape = (numel,) if self.rng.random() < 0.5 else (rows, numel // rows)
            tensor = getattr(self.heap, how)(shape, dtype)
        if how == "zeros":
            expected = [torch.zeros(numel, dtype=dtype) for _ in range(self.n)]
        else:
            tensor.view(-1).copy_(pattern(step, self.me, numel, dtype))
            expected = [pattern(step, pe, numel, dtype).clone() for pe in range(self.n)]
            self.written = True
        name = self.next_name
        self.next_name += 1
        self.objects[name] = Obj(name, dtype, numel, tensor, expected, set(range(self.n)))
        self.check_live_count()
        self.done[how] += 1

    def put(self, step: int, obj: Obj) -> None:
        self.sync(before_write=True)
        k = self.rng.randrange(self.n)
        where = self.pick_slice(obj.numel)
        how = self.rng.choice(("put", "put_nbi", "ptr"))
        count = len(range(obj.numel)[where])
        target = (self.me + k) % self.n
        source = pattern(step, self.me, count, obj.dtype, salt=1)
        dest = self.flat(obj)[where]
        if how == "ptr":
            self.heap.ptr(obj.tensor, target).view(-1)[where].copy_(source)
        else:
            getattr(self.heap, how)(dest, source, target)
            if how == "put_nbi":
                self.heap.quiet()
        for pe in range(self.n):
            obj.expected[(pe + k) % self.n][where] = pattern(step, pe, count, obj.dtype, salt=1)
        self.written = True
        self.done[how] += 1

    def get(self, obj: Obj) -> None:
        self.sync()
        k = self.rng.randrange(self.n)
        where = self.pick_slice(obj.numel)
        how = self.rng.choice(("get", "get_nbi", "ptr"))
        source_pe = (self.me + k) % self.n
        count = len(range(obj.numel)[where])
        if how == "ptr":
            got = self.heap.ptr(obj.tensor, source_pe).view(-1)[where].clone()
        else:
            got = torch.empty(count, dtype=obj.dtype)
            getattr(self.heap, how)(got, self.flat(obj)[where], source_pe)
            if how == "get_nbi":
                self.heap.quiet()
        assert torch.equal(got, obj.expected[source_pe][where]), \
            f"object {obj.name} on PE {source_pe}, {where}, via {how}"
        self.read = True
        self.done["get:" + how] += 1

    def free(self, obj: Obj) -> None:
        self.heap.free(obj.tensor)
        obj.tensor = None
        del self.objects[obj.name]
        self.check_live_count()
        self.done["free"] += 1

    def realloc(self, step: int, obj: Obj) -> None:
        self.sync()
        numel = self.size(obj.dtype)
        new = self.heap.realloc(obj.tensor, numel * obj.dtype.itemsize)
        self.check_live_count()
        keep = min(numel, obj.numel)
        assert new.shape == (numel,) and torch.equal(new[:keep], obj.expected[self.me][:keep])
        new[keep:] = pattern(step, self.me, numel - keep, obj.dtype, salt=2)
        for pe in range(self.n):
            obj.expected[pe] = torch.cat([obj.expected[pe][:keep],
                                          pattern(step, pe, numel - keep, obj.dtype, salt=2)])
        obj.tensor, obj.numel = new, numel
        self.written = True
        self.done["realloc"] += 1

    def drop(self, obj: Obj, pes: set[int]) -> None:
        """Drop the tensor for the garbage collector on `pes` (all or some PEs)."""
        if self.me in pes:
            obj.tensor = None
        obj.held_by -= pes
        if not obj.held_by:
            del self.objects[obj.name]
        self.done["drop-all" if len(pes) == self.n else "drop-some"] += 1

    def verify_all(self) -> None:
        self.heap.barrier_all()
        self.check_live_count()
        states = world.allgather(repr(parts_of(self.heap).local.allocator_state()))
        assert all(s == states[0] for s in states), "the PEs' allocators diverged"
        peer = self.rng.randrange(self.n)
        for obj in self.objects.values():
            if obj.tensor is not None:
                assert torch.equal(self.flat(obj), obj.expected[self.me]), f"object {obj.name}"
            if len(obj.held_by) == self.n:
                got = torch.empty(obj.numel, dtype=obj.dtype)
                self.heap.get(got, self.flat(obj), peer)
                assert torch.equal(got, obj.expected[peer]), f"object {obj.name} on PE {peer}"
        self.heap.barrier_all()
        self.written = self.read = False
        self.done["verify"] += 1

    def step(self, step: int) -> None:
        rng = self.rng
        live, partial = self.live(), self.partial()
        kinds = ["alloc"] * 25 + ["barrier"] * 3 + ["trim"] + ["too-large"]
        if live:
            kinds += ["put"] * 20 + ["get"] * 20 + ["free"] * 8 + ["realloc"] * 6 + \
                ["drop-all"] * 4 + (["drop-some"] * 4 if self.n > 1 else [])
        if partial:
            kinds += ["drop-rest"] * 4
        kind = rng.choice(kinds)
        if kind == "alloc" and len(self.objects) >= MAX_OBJECTS:
            kind = "free" if live else "drop-rest"
        if kind == "alloc":
            self.alloc(step)
        elif kind == "put":
            self.put(step, rng.choice(live))
        elif kind == "get":
            self.get(rng.choice(live))
        elif kind == "free":
            self.free(rng.choice(live))
        elif kind == "realloc":
            self.realloc(step, rng.choice(live))
        elif kind == "drop-all":
            self.drop(rng.choice(live), set(range(self.n)))
        elif kind == "drop-some":
            some = set(rng.sample(range(self.n), rng.randrange(1, self.n)))
            self.drop(rng.choice(live), some)
        elif kind == "drop-rest":
            obj = rng.choice(partial)
            self.drop(obj, set(obj.held_by))
        elif kind == "barrier":
            rng.choice((self.heap.barrier_all, self.heap.sync_all))()
            self.check_live_count()
            self.written = self.read = False
            self.done["barrier"] += 1
        elif kind == "trim":
            self.sync()
            self.heap.trim()
            self.check_live_count()
            self.done["trim"] += 1
        elif kind == "too-large":
            with pytest.raises(HeapExhaustedError):
                self.heap.malloc(self.heap.heap_size + 1)
            self.check_live_count()
            self.done["too-large"] += 1

    def finish(self) -> None:
        self.verify_all()
        for obj in list(self.objects.values()):
            if len(obj.held_by) == self.n and self.rng.random() < 0.5:
                self.free(obj)
            else:
                self.drop(obj, set(obj.held_by))
        self.heap.barrier_all()
        assert self.heap.heap_info()["live_allocations"] == 0
        self.heap.trim()
        assert self.heap.heap_info()["mapped"] == 0


HEAP_OPTIONS = {"backend": "host", "timeout": 60}  # the conftest heap fixture, pinned to host memory


def test_random_steps_match_the_model(heap):
    seed = world.bcast(SEED)
    run = Run(heap, seed)
    for step in range(STEPS):
        run.step(step)
        if step % 250 == 249:
            run.verify_all()
    run.finish()
    expected_kinds = {"malloc", "empty", "zeros", "put", "put_nbi", "ptr", "get:get",
                      "get:get_nbi", "get:ptr", "free", "realloc", "drop-all", "barrier",
                      "trim", "too-large", "verify"}
    if heap.n_pes > 1:
        expected_kinds.add("drop-some")
    assert expected_kinds <= set(run.done), run.done
    assert sum(run.done.values()) >= STEPS
