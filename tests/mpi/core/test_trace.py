"""trace.py: shmemvm's calls as ranges in a torch.profiler trace (issue 33, item 15).

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/core/test_trace.py
"""

import json

import pytest
import torch
from torch.profiler import profile

import shmemvm
from shmemvm import SymmetricHeap

HEAP_OPTIONS = {"heap_size": "16M", "backend": "host"}


def range_names(prof) -> list[str]:
    return [event.name for event in prof.events() if event.name.startswith("shmemvm.")]


@pytest.mark.mpi(min_size=1)
def test_heap_calls_show_as_ranges_with_pe_and_bytes(heap, tmp_path):
    me, n = heap.my_pe, heap.n_pes
    peer = (me + 1) % n
    with profile() as prof:
        x = heap.zeros(2, torch.int32)             # 8 bytes
        heap.put(x, torch.ones(2, dtype=torch.int32), peer)
        heap.get(torch.empty(2, dtype=torch.int32), x, peer)
        heap.barrier_all()
        heap.atomic_add(x[0], 1, peer)
        heap.quiet()
        flag = heap.zeros(1, torch.int64)
        heap.barrier_all()
        heap.atomic_set(flag, 1, peer)
        heap.wait_until(flag, "ge", 1)
        out = heap.zeros(4, torch.float32)
        heap.all_reduce(out, heap.zeros(4, torch.float32))
        with heap.ctx_create() as ctx:
            ctx.put(x, torch.zeros(2, dtype=torch.int32), peer)
            ctx.quiet()
        heap.barrier_all()
        heap.free(x)
    names = range_names(prof)
    for expected in (f"shmemvm.put(pe={peer}, bytes=8)", f"shmemvm.get(pe={peer}, bytes=8)",
                     "shmemvm.zeros(", "shmemvm.barrier_all(", "shmemvm.free(bytes=8)",
                     f"shmemvm.atomic_add(pe={peer}, value=1, bytes=4)", "shmemvm.quiet(",
                     "shmemvm.wait_until(value=1, cmp=ge, bytes=8)",
                     "shmemvm.all_reduce(bytes=16)", "shmemvm.ctx_create(",
                     f"shmemvm.atomic_set(pe={peer}, value=1, bytes=8)"):
        assert any(name.startswith(expected) for name in names), (expected, names)
    assert sum(name.startswith("shmemvm.put(") for name in names) == 2      # the ctx's too
    # the trace file a trace viewer opens has them, by name
    trace = tmp_path / f"trace{me}.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    assert f"shmemvm.put(pe={peer}, bytes=8)" in {event.get("name") for event in events}


@pytest.mark.mpi(min_size=1)
def test_module_functions_show_as_ranges_and_nothing_without_a_profiler():
    with profile() as prof:
        shmemvm.init(heap_size="16M", backend="host", timeout=30)
        try:
            x = shmemvm.zeros(4, torch.int64)
            shmemvm.put(x, torch.arange(4), shmemvm.my_pe())
            shmemvm.barrier_all()
        finally:
            shmemvm.finalize()
    names = range_names(prof)
    for expected in ("shmemvm.init(", "shmemvm.zeros(", "shmemvm.barrier_all(",
                     "shmemvm.put(pe=", "shmemvm.finalize("):
        assert any(name.startswith(expected) for name in names), (expected, names)
    # with no profiler running, nothing is recorded and the calls still work
    with profile() as idle:
        pass
    h = SymmetricHeap(heap_size="16M", backend="host", timeout=30)
    try:
        y = h.zeros(2, torch.int32)
        h.put(y, torch.ones(2, dtype=torch.int32), h.my_pe)
        assert y.tolist() == [1, 1]
    finally:
        h.finalize()
    assert range_names(idle) == []


@pytest.mark.mpi(min_size=1)
def test_traced_routines_keep_their_signatures_and_docs():
    import inspect

    from shmemvm.openshmem import rma
    assert inspect.signature(SymmetricHeap.put) == inspect.signature(rma.put)
    assert SymmetricHeap.put.__doc__ == rma.put.__doc__
    assert SymmetricHeap.put.__wrapped__ is rma.put
