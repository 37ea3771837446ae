"""Run by tests/jobs/memory/test_ownership_jobs.py as its own small MPI job:

    mpiexec -n 2 python tests/helpers/ownership_scenarios.py SCENARIO[+SCENARIO...] OUTDIR

Ownership cases of the symmetric heap that kill the process where the rules
are broken (a tensor reading memory that was unmapped under it, torch.save
walking a storage that spans unmapped holes). Each PE writes its checks to
OUTDIR/pe<N>.json as it makes them, so a crash still shows how far it got.
Scenarios joined by "+" run one after another in the job, each with heaps of its
own, recording into OUTDIR/<scenario>/: one start-up of the PEs for all (issue 33,
item 16); the first that does not finish ends the job, and those after it report
nothing.

Scenarios:
  save_ptr   torch.save, pickle, clone, str and repr of ptr() views (whole
             tensor, a slice, after the block was freed) and of own tensors
  outlive    tensors, views and ptr views that outlive their heap's finalize()
             keep their old data and never alias a later heap; once they die
             nothing is left (memfd mappings, descriptors)
  evict      a freed block kept by views (own and ptr) survives budget
             pressure and trim() on a small heap; released once they die
"""

from __future__ import annotations

import faulthandler
import gc
import io
import os
import pickle
import sys

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

from ownership_vmem import Report, raises  # noqa: E402  (this directory)
from shmemvm import HeapExhaustedError, NotSymmetricError, ShmemError, SymmetricHeap  # noqa: E402
from util import open_fds, shmemvm_mappings  # noqa: E402

world = MPI.COMM_WORLD


def new_heap(size: str = "16M") -> SymmetricHeap:
    return SymmetricHeap(world, heap_size=size, backend="host", timeout=30)


def serialized_forms(t: torch.Tensor) -> dict[str, torch.Tensor]:
    buffer = io.BytesIO()
    torch.save(t, buffer)
    buffer.seek(0)
    return {"torch.save/load": torch.load(buffer), "pickle": pickle.loads(pickle.dumps(t)),
            "clone": t.clone()}


def check_serializes(report: Report, name: str, t: torch.Tensor, expected: torch.Tensor,
                     block_bytes: int) -> None:
    report.stage(f"serialize {name}")
    for how, copy in serialized_forms(t).items():
        report.check(f"{name}: {how} gives the data", torch.equal(copy, expected))
        if how != "clone":
            report.check(f"{name}: {how} stores only the block's bytes",
                         copy.untyped_storage().nbytes() == block_bytes,
                         copy.untyped_storage().nbytes())
    report.stage(f"str/repr {name}")
    report.check(f"{name}: str() shows the data", str(t) == str(expected), str(t)[:200])
    report.check(f"{name}: repr() shows the data", repr(t) == repr(expected), repr(t)[:200])


def save_ptr(report: Report) -> None:
    heap = new_heap()
    me, n = heap.my_pe, heap.n_pes
    right = (me + 1) % n

    def content(pe):
        return torch.arange(64 * 33, dtype=torch.int64).reshape(64, 33) + 10_000 * pe

    x = heap.empty((64, 33), torch.int64)
    x.copy_(content(me))
    block_bytes = x.untyped_storage().nbytes()
    heap.barrier_all()
    whole = heap.ptr(x, right)
    part = heap.ptr(x[3:7, 5:], right)
    report.check("ptr view's storage is exactly the block",
                 whole.untyped_storage().nbytes() == block_bytes,
                 whole.untyped_storage().nbytes())
    check_serializes(report, "own tensor", x, content(me), block_bytes)
    check_serializes(report, "own slice", x[3:7, 5:], content(me)[3:7, 5:], block_bytes)
    check_serializes(report, "ptr view", whole, content(right), block_bytes)
    check_serializes(report, "ptr view of a slice", part, content(right)[3:7, 5:], block_bytes)
    heap.barrier_all()
    heap.free(x)
    later = heap.empty((64, 33), torch.int64)
    later.fill_(-1)
    heap.barrier_all()
    check_serializes(report, "ptr view of a freed block", whole, content(right), block_bytes)
    heap.barrier_all()
    del whole, part, later
    gc.collect()
    heap.finalize()


def outlive(report: Report) -> None:
    warm = new_heap()                  # MPI's own descriptors are open before the baseline
    warm.malloc(10)
    warm.finalize()
    gc.collect()
    fds_before = open_fds()
    report.check("no shmemvm mappings at the start", shmemvm_mappings() == [], shmemvm_mappings())

    h1 = new_heap()
    me, n = h1.my_pe, h1.n_pes
    right = (me + 1) % n
    x = h1.zeros(100, torch.float32)
    x.fill_(me + 3)
    big = h1.malloc(3 << 20)           # a segment of its own
    big.fill_(me + 5)
    view = x[10:20]
    h1.barrier_all()
    remote = h1.ptr(x, right)
    remote_big = h1.ptr(big, right)
    report.stage("finalize h1")
    h1.finalize()

    h2 = new_heap()
    later = [h2.zeros(100, torch.float32), h2.malloc(3 << 20), h2.malloc(8 << 20)]
    for t in later:
        t.fill_(100)
    del t  # a loop variable would keep the last tensor (and its memory) alive
    h2.barrier_all()
    report.stage("read tensors of the finalized heap")
    report.check("own tensor keeps its data after finalize()", bool((x == me + 3).all()),
                 x[:8].tolist())
    report.check("slice keeps its data after finalize()", bool((view == me + 3).all()))
    report.check("segment tensor keeps its data after finalize()",
                 bool((big == me + 5).all()))
    report.check("ptr view keeps the peer's data after finalize()",
                 bool((remote == right + 3).all()), remote[:8].tolist())
    report.check("ptr view of a segment keeps the peer's data after finalize()",
                 bool((remote_big == right + 5).all()))
    h2.barrier_all()
    report.stage("write tensors of the finalized heap")
    x.fill_(7)
    big.fill_(7)
    h2.barrier_all()
    report.check("writing the finalized heap's tensors leaves the new heap alone",
                 bool((later[0] == 100).all()) and all(bool((t == 100).all()) for t in later[1:]))
    report.check("a peer's write to the old heap shows in the ptr view",
                 bool((remote == 7).all()) and bool((remote_big == 7).all()))

    zeros = torch.zeros(100)
    report.check("put to a tensor of the finalized heap raises",
                 raises(lambda: h1.put(x, zeros, me), ShmemError) is not None)
    report.check("the new heap refuses the old heap's tensor (NotSymmetricError)",
                 raises(lambda: h2.put(x, zeros, me), NotSymmetricError) == "NotSymmetricError")
    report.check("the new heap refuses the old heap's ptr view (NotSymmetricError)",
                 raises(lambda: h2.get(zeros, remote, me), NotSymmetricError)
                 == "NotSymmetricError")
    report.check("ptr() of the old heap's tensor raises",
                 raises(lambda: h2.ptr(x, right), ShmemError) is not None)

    report.stage("drop the finalized heap's tensors")
    del x, big, view, remote, remote_big
    gc.collect()
    h2.barrier_all()
    h2.finalize()
    del later
    gc.collect()
    report.check_nothing_left(fds_before)


def evict(report: Report) -> None:
    heap = new_heap("4M")
    me, n = heap.my_pe, heap.n_pes
    right = (me + 1) % n
    x = heap.malloc(1 << 20)
    x.fill_(me + 1)
    own = x[1000:]
    heap.barrier_all()
    remote = heap.ptr(x, right)
    heap.free(x)
    heap.barrier_all()
    report.check("heap_info reports the deferred block",
                 heap.heap_info().get("deferred_allocations") == 1, heap.heap_info())
    report.stage("budget pressure")
    for size in (2 << 20, 1 << 20, 512 << 10, 2 << 20, 256 << 10, 1 << 20):
        t = heap.malloc(size)
        t.fill_(0xEE)
        heap.free(t)
    try:
        whole = heap.malloc(3 << 20)        # a 4 MiB block: the whole heap
        whole.fill_(0xDD)
        overlaps = whole.data_ptr() <= own.data_ptr() < whole.data_ptr() + whole.numel()
        outcome = "allocated"
    except HeapExhaustedError:
        whole, overlaps, outcome = None, False, "HeapExhaustedError"
    report.check("a request for the whole heap does not take the deferred block",
                 not overlaps, outcome)
    del whole
    report.stage("trim")
    heap.trim()
    heap.barrier_all()
    report.stage("read the views after pressure and trim")
    report.check("own view keeps its data under budget pressure and trim()",
                 bool((own == me + 1).all()), own[:8].tolist())
    report.check("ptr view keeps the peer's data under budget pressure and trim()",
                 bool((remote == right + 1).all()), remote[:8].tolist())
    heap.barrier_all()
    del own, remote
    gc.collect()
    heap.barrier_all()
    info = heap.heap_info()
    report.check("deferred block released once every view died",
                 info.get("deferred_allocations") == 0 and info.get("deferred_bytes") == 0, info)
    report.stage("whole heap after release")
    try:
        whole = heap.malloc(3 << 20)
        whole.fill_(1)
        ok = int(whole.sum()) == 3 << 20
        del whole
    except HeapExhaustedError as exc:
        ok = f"HeapExhaustedError: {exc}"
    report.check("the whole heap is available again", ok is True, ok)
    gc.collect()
    heap.finalize()


SCENARIOS = {"save_ptr": save_ptr, "outlive": outlive, "evict": evict}


def main() -> None:
    faulthandler.enable()
    faulthandler.dump_traceback_later(100, exit=True)
    scenarios, outdir = sys.argv[1].split("+"), sys.argv[2]
    for scenario in scenarios:
        folder = os.path.join(outdir, scenario) if len(scenarios) > 1 else outdir
        os.makedirs(folder, exist_ok=True)
        report = Report(os.path.join(folder, f"pe{world.rank}.json"))
        report.data["pe"] = world.rank
        report.run(SCENARIOS[scenario])
        sys.stdout.flush()
        if not report.data["done"]:
            os._exit(1)      # the other PEs may wait in a collective: do not finalize MPI
        world.Barrier()      # every PE done with this scenario before the next


if __name__ == "__main__":
    main()
