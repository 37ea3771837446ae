"""Randomized test of the ownership rules against a byte model (host backend;
made for mpirun -n 2, runs at any size).

Every PE draws the same operations from one seed, so all make the same
collective calls and all keep the same model: for every object, the bytes its
block must hold on each PE. Operations: malloc / zeros / realloc of random
sizes (0 bytes, small blocks, segments of their own; often the size of a
block freed a moment ago), fills of own tensors with a pattern derived from
(step, PE), views (slices, strides, int16/int32/int64 views, reshapes) of own
tensors and ptr() views of the right neighbour's, kept on some PEs only and
across frees, writes through views (own memory, and the neighbour's through
ptr views), dropping views, free (explicit, or by dropping the tensor on every
PE, all at once or a few PEs at a time), barrier_all.

The rules checked (DESIGN.md, "Ownership"):
- a new block never overlaps a block that is live or kept by a view anywhere
  (explicitly freed, or garbage-collected on every PE, while a view of it
  lives on some PE: own views, or ptr views on a neighbour);
- every live tensor and every kept view holds exactly the model's bytes, on
  a ptr view the neighbour's data as of its last write, after a barrier;
- after a barrier, heap_info()["deferred_allocations"] is the number of freed
  blocks that views still keep, and at the end nothing is left.

SHMEMVM_TEST_SEED and SHMEMVM_RANDOM_STEPS (default 10000) change the seed
and the length.
"""

from __future__ import annotations

import gc
import os
import random
from collections import Counter, deque
from dataclasses import dataclass, field

import pytest
import torch
from mpi4py import MPI

from shmemvm import SymmetricHeap
from shmemvm.core.state import parts_of

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD
SEED = int(os.environ.get("SHMEMVM_TEST_SEED", "7001"))
STEPS = int(os.environ.get("SHMEMVM_RANDOM_STEPS", "10000"))
CHECK_EVERY = 20             # full check of every object and view
MAX_OBJECTS = 16             # live or kept by views
MAX_VIEWS = 28
MAX_BYTES = 600 << 10
VIEW_DTYPES = (torch.uint8, torch.uint8, torch.int16, torch.int32, torch.int64)

_PERIOD = 251
_RING = ((torch.arange(MAX_BYTES + _PERIOD, dtype=torch.int64) * 7) % _PERIOD + 1).to(torch.uint8)


def pattern(step: int, pe: int, count: int) -> torch.Tensor:
    """What PE `pe` writes at `step`: bytes 1..251, never 0, different per step and PE."""
    shift = (step * 31 + pe * 17) % _PERIOD
    return _RING[shift:shift + count]


@dataclass
class Obj:
    name: int
    nbytes: int
    offset: int                              # heap offset, the same on every PE
    model: list[torch.Tensor]                # per PE: the bytes of its block there
    tensor: torch.Tensor | None              # this PE's tensor (None: dropped or freed here)
    owners: set[int]                         # PEs that still hold their tensor
    freed: bool = False                      # freed explicitly, by realloc, or by the collector
    freed_by_call: bool = False              # by free()/realloc(): what heap_info calls deferred
    views: dict[int, "View"] = field(default_factory=dict)


@dataclass
class View:
    name: int
    obj: Obj
    remote: bool                             # a ptr() view of the right neighbour's block
    dtype: torch.dtype
    start: int
    stop: int
    stride: int
    rows: int                                # > 0: viewed as (rows, -1)
    holders: set[int]                        # PEs that hold it
    tensor: torch.Tensor | None              # this PE's (None where it does not hold it)


def region(flat: torch.Tensor, v: View) -> torch.Tensor:
    """The part of a block's bytes (a 1-D uint8 tensor) that `v` shows, shaped like it."""
    part = flat.view(v.dtype)[v.start:v.stop:v.stride]
    return part.view(v.rows, -1) if v.rows else part


class Run:
    def __init__(self, heap: SymmetricHeap, seed: int):
        self.heap = heap
        self.me, self.n = heap.my_pe, heap.n_pes
        self.rng = random.Random(seed)
        self.objects: dict[int, Obj] = {}
        self.next_name = 0
        self.recent_sizes: deque[int] = deque(maxlen=8)     # sizes just freed
        self.written = self.read = False
        self.done = Counter()
        self.history: deque[str] = deque(maxlen=12)
        self.step = 0
        self.count_problem: str | None = None
        self.failures: list[str] = []            # this PE's first failures, not yet agreed on

    # -- helpers ---------------------------------------------------------------------
    def target(self, pe: int, v: View) -> int:
        return (pe + 1) % self.n if v.remote else pe

    def fail(self, what: str) -> None:
        """Note one of this PE's first failures (the first is often a block
        handed out again, the next the data a view lost); agree() raises them
        on every PE together (raising here alone would leave the other PEs
        waiting in a collective)."""
        if len(self.failures) < 3:
            self.failures.append(f"step {self.step} (seed {SEED}), PE {self.me}: {what}\n"
                                 f"  last operations: {list(self.history)}")

    def agree(self) -> None:
        failures = [f for pe_failures in world.allgather(self.failures) for f in pe_failures]
        if failures:
            raise AssertionError("\n".join(failures) + (f"\nalso: {self.count_problem}"
                                                         if self.count_problem else ""))

    def offset(self, t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr() - parts_of(self.heap).local.base

    def own_storage_alive(self, obj: Obj, pe: int) -> bool:
        return pe in obj.owners or any(pe in v.holders and self.target(pe, v) == pe
                                       for v in obj.views.values())

    def deferred(self) -> int:
        """Blocks free()/realloc() gave up that views still keep. A block whose
        tensors were collected on every PE while a view holds it counts as live
        in heap_info: no PE knows that every other one dropped it."""
        return sum(1 for o in self.objects.values() if o.freed_by_call)

    def before_read(self) -> None:
        """Barrier before reading what another PE may have written."""
        if self.written:
            self.collective_barrier()

    def before_write(self) -> None:
        """Barrier before writing what another PE may have been reading."""
        if self.read:
            self.collective_barrier()

    def collective_barrier(self) -> None:
        self.before_collective()
        self.heap.barrier_all()
        self.written = self.read = False

    def before_collective(self) -> None:
        """What every collective does first: blocks whose tensors died on every
        PE count as freed, freed blocks without views go."""
        for obj in list(self.objects.values()):
            if not obj.freed and not any(self.own_storage_alive(obj, pe) for pe in range(self.n)):
                obj.freed = True                          # collected on every PE
            if obj.freed and not obj.views:
                del self.objects[obj.name]

    def check_counts(self) -> None:
        """Right after a barrier: the heap agrees on what views keep."""
        info = self.heap.heap_info()
        if info.get("deferred_allocations") != self.deferred() and self.count_problem is None:
            self.count_problem = (f"step {self.step}: heap_info deferred_allocations "
                                  f"{info.get('deferred_allocations')!r}, the model has "
                                  f"{self.deferred()} freed blocks kept by views")

    def check_new_block(self, t: torch.Tensor, nbytes: int, skip: Obj | None = None) -> int:
        start = self.offset(t)
        end = start + max(nbytes, 1)
        for obj in self.objects.values():
            if obj is skip:
                continue
            if start < obj.offset + max(obj.nbytes, 1) and obj.offset < end:
                kind = "a freed block kept by views" if obj.freed else "a live block"
                holders = {pe: sorted(v.remote for v in obj.views.values() if pe in v.holders)
                           for pe in range(self.n)}
                self.fail(f"a new block of {nbytes} bytes at {start:#x} overlaps {kind}: object "
                          f"{obj.name} ({obj.nbytes} bytes at {obj.offset:#x}; views per PE, "
                          f"True = ptr view: {holders})")
        return start

    def subset(self, pes) -> set[int]:
        pes = sorted(pes)
        if not pes or self.rng.random() < 0.5:
            return set(pes)
        return set(self.rng.sample(pes, self.rng.randint(1, len(pes))))

    def size(self) -> int:
        r = self.rng.random()
        if self.recent_sizes and r < 0.35:
            return self.rng.choice(self.recent_sizes)          # the size of a block just freed
        if r < 0.38:
            return 0
        if r < 0.75:
            return self.rng.randrange(1, 4096)
        if r < 0.88:
            return self.rng.randrange(4096, 64 << 10)
        return self.rng.randrange(64 << 10, MAX_BYTES)         # segments of their own

    def new_obj(self, t: torch.Tensor, nbytes: int, model: list[torch.Tensor],
                skip: Obj | None = None) -> Obj:
        offset = self.check_new_block(t, nbytes, skip)
        obj = Obj(self.next_name, nbytes, offset, model, t, set(range(self.n)))
        self.next_name += 1
        self.objects[obj.name] = obj
        return obj

    def live(self) -> list[Obj]:
        return [o for o in self.objects.values() if not o.freed and o.owners]

    def held_by_all(self) -> list[Obj]:
        return [o for o in self.objects.values() if not o.freed and len(o.owners) == self.n]

    def all_views(self) -> list[View]:
        return [v for o in self.objects.values() for v in o.views.values()]

    # -- operations ------------------------------------------------------------------------
    def op_malloc(self) -> None:
        nbytes = self.size()
        zeros = self.rng.random() < 0.2
        self.before_collective()
        if zeros:
            t = self.heap.zeros((nbytes,), torch.uint8)
            if t.count_nonzero():
                self.fail(f"zeros({nbytes}) is not zero")
            model = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(self.n)]
        else:
            t = self.heap.malloc(nbytes)
            t.copy_(pattern(self.step, self.me, nbytes))
            model = [pattern(self.step, pe, nbytes).clone() for pe in range(self.n)]
            self.written = True
        self.new_obj(t, nbytes, model)
        self.history.append(f"{'zeros' if zeros else 'malloc'}({nbytes})")

    def op_free(self) -> None:
        obj = self.rng.choice(self.held_by_all())
        self.before_collective()
        self.heap.free(obj.tensor)
        obj.tensor = None
        obj.owners.clear()
        obj.freed = obj.freed_by_call = True
        if not obj.views:
            del self.objects[obj.name]
        self.recent_sizes.append(obj.nbytes)
        self.history.append(f"free(obj {obj.name}, {len(obj.views)} views)")

    def op_realloc(self) -> None:
        obj = self.rng.choice(self.held_by_all())
        if self.rng.random() < 0.5 and obj.nbytes:
            nbytes = self.rng.randrange(max(obj.nbytes // 2, 0), obj.nbytes + 1)  # often in place
        else:
            nbytes = self.size()
        self.before_collective()
        t = self.heap.realloc(obj.tensor, nbytes)
        keep = min(nbytes, obj.nbytes)
        if not torch.equal(t[:keep], obj.model[self.me][:keep]):
            self.fail(f"realloc of object {obj.name} to {nbytes} bytes lost its first {keep} bytes")
        obj.tensor = None
        obj.owners.clear()
        obj.freed = obj.freed_by_call = True
        self.recent_sizes.append(obj.nbytes)
        t.copy_(pattern(self.step, self.me, nbytes))
        self.written = True
        model = [pattern(self.step, pe, nbytes).clone() for pe in range(self.n)]
        # in place is fine where no view keeps the old block
        self.new_obj(t, nbytes, model, skip=None if obj.views else obj)
        self.history.append(f"realloc(obj {obj.name}: {obj.nbytes} -> {nbytes}, "
                            f"{len(obj.views)} views)")
        if not obj.views:
            del self.objects[obj.name]

    def op_drop(self) -> None:
        obj = self.rng.choice(self.live())
        who = self.subset(obj.owners)
        obj.owners -= who
        if self.me in who:
            obj.tensor = None
        self.history.append(f"drop obj {obj.name} on PEs {sorted(who)}")

    def op_view(self) -> None:
        obj = self.rng.choice(self.live())
        remote = self.rng.random() < 0.45
        dtype = self.rng.choice([d for d in VIEW_DTYPES if obj.nbytes % d.itemsize == 0])
        count = obj.nbytes // dtype.itemsize
        start = self.rng.randrange(count + 1)
        stop = self.rng.randrange(start, count + 1)
        stride = self.rng.choice((1, 1, 1, 2, 5))
        length = len(range(start, stop, stride))
        rows = 2 if stride == 1 and length and length % 2 == 0 and self.rng.random() < 0.3 else 0
        view = View(self.next_name, obj, remote, dtype, start, stop, stride, rows,
                    self.subset(obj.owners), None)
        self.next_name += 1
        if self.me in view.holders:
            own = region(obj.tensor, view)                 # a new view object, never the tensor
            view.tensor = self.heap.ptr(own, (self.me + 1) % self.n) if remote else own
        obj.views[view.name] = view
        self.history.append(f"{'ptr ' if remote else ''}view {view.name} of obj {obj.name} "
                            f"[{dtype}, {start}:{stop}:{stride}] on PEs {sorted(view.holders)}")

    def op_drop_view(self) -> None:
        view = self.rng.choice(self.all_views())
        who = self.subset(view.holders)
        view.holders -= who
        if self.me in who:
            view.tensor = None
        if not view.holders:
            del view.obj.views[view.name]
        self.history.append(f"drop view {view.name} (obj {view.obj.name}) on PEs {sorted(who)}")

    def op_fill(self) -> None:
        obj = self.rng.choice(self.live())
        self.before_write()
        for pe in obj.owners:
            obj.model[pe].copy_(pattern(self.step, pe, obj.nbytes))
        if self.me in obj.owners:
            obj.tensor.copy_(pattern(self.step, self.me, obj.nbytes))
        self.written = True
        self.history.append(f"fill obj {obj.name} on PEs {sorted(obj.owners)}")

    def op_write_view(self) -> None:
        view = self.rng.choice(self.all_views())
        if view.remote:
            self.collective_barrier()                      # nobody reads the neighbour's block now
        else:
            self.before_write()
        for pe in view.holders:
            part = region(view.obj.model[self.target(pe, view)], view)
            part.copy_(pattern(self.step, pe, part.numel() * view.dtype.itemsize)
                       .clone().view(view.dtype).view(part.shape))
        if view.tensor is not None:
            t = view.tensor
            t.copy_(pattern(self.step, self.me, t.numel() * view.dtype.itemsize)
                    .clone().view(view.dtype).view(t.shape))
        self.written = True
        if view.remote:
            self.collective_barrier()                      # the neighbour sees it from here on
        self.history.append(f"write through {'ptr ' if view.remote else ''}view {view.name} "
                            f"(obj {view.obj.name}, freed={view.obj.freed}) on PEs "
                            f"{sorted(view.holders)}")

    def op_barrier(self) -> None:
        self.collective_barrier()
        self.check_counts()
        self.history.append("barrier_all")

    # -- checks ----------------------------------------------------------------------------
    def check_all(self) -> None:
        self.before_read()
        for obj in self.objects.values():
            if obj.tensor is not None and not torch.equal(obj.tensor, obj.model[self.me]):
                bad = (obj.tensor != obj.model[self.me]).nonzero()[0].item()
                self.fail(f"object {obj.name} ({obj.nbytes} bytes at {obj.offset:#x}) differs "
                          f"at byte {bad}: {obj.tensor[bad].item()} where "
                          f"{obj.model[self.me][bad].item()} was written")
            for view in obj.views.values():
                self.read = self.read or view.remote        # on every PE alike: it decides barriers
                if view.tensor is None:
                    continue
                want = region(obj.model[self.target(self.me, view)], view)
                if view.tensor.shape != want.shape or not torch.equal(view.tensor, want):
                    self.fail(f"{'ptr ' if view.remote else ''}view {view.name} of object "
                              f"{obj.name} ({'freed' if obj.freed else 'live'}, "
                              f"{obj.nbytes} bytes at {obj.offset:#x}) "
                              f"[{view.dtype}, {view.start}:{view.stop}:{view.stride}] holds "
                              f"{view.tensor.reshape(-1)[:6].tolist()}..., the model "
                              f"{want.reshape(-1)[:6].tolist()}...")
        self.done["check"] += 1
        self.agree()

    def check_symmetric(self) -> None:
        offsets = sorted((o.name, o.offset) for o in self.objects.values())
        if world.allgather(offsets) != [offsets] * self.n:
            self.fail("PEs disagree on the offsets of their objects")
        self.agree()

    # -- the run ---------------------------------------------------------------------------
    def choose(self) -> str:
        n_objects = len(self.objects)
        n_views = len(self.all_views())
        choices = [("barrier", 5), ("malloc", 22 if n_objects < MAX_OBJECTS else 0)]
        if self.live():
            choices += [("fill", 8), ("drop", 6), ("view", 16 if n_views < MAX_VIEWS else 0)]
        if self.held_by_all():
            choices += [("free", 10), ("realloc", 4)]
        if n_views:
            choices += [("drop_view", 12 if n_views < MAX_VIEWS else 30), ("write_view", 6)]
        if n_objects >= MAX_OBJECTS and not self.held_by_all() and not n_views:
            choices += [("barrier", 20)]
        names, weights = zip(*choices)
        return self.rng.choices(names, weights)[0]

    def run(self, steps: int) -> None:
        for self.step in range(steps):
            op = self.choose()
            getattr(self, f"op_{op}")()
            self.done[op] += 1
            if self.step % CHECK_EVERY == 0:
                self.check_all()
            if self.step % 500 == 0:
                self.check_symmetric()      # (no gc.collect() here: 0.3 s each with torch loaded;
                                            # nothing here makes cycles, tensors die by refcount)
        self.check_all()

    def finish(self) -> None:
        for obj in self.objects.values():
            obj.tensor = None
            for view in obj.views.values():
                view.tensor = None
        self.objects.clear()
        gc.collect()
        self.heap.barrier_all()
        info = self.heap.heap_info()
        if self.count_problem is None and info.get("deferred_allocations") != 0:
            self.count_problem = f"at the end heap_info says {info}"
        assert info["live_allocations"] == 0, info


def test_random_ownership():
    heap = SymmetricHeap(world, heap_size="128M", backend="host", timeout=60)
    try:
        run = Run(heap, SEED)
        run.run(STEPS)
        run.finish()
        assert run.count_problem is None, run.count_problem
        # the run did what it is for
        assert run.done["free"] > STEPS // 50 and run.done["view"] > STEPS // 50, run.done
        assert run.done["check"] >= STEPS // CHECK_EVERY, run.done
    finally:
        gc.collect()
        heap.finalize()
