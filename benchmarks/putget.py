"""put/get bandwidth and latency across sizes.

PE 0 puts to / gets from PE 1 (itself when alone) while the other PEs rest
without spinning. Baselines, in the same process and loop:
  - a local torch copy of the same bytes (`dst.copy_(src)`, private memory);
  - mpi4py one-sided `Put`/`Get` + `Flush` on an `MPI.Win.Allocate_shared`
    window, in a passive-target epoch (`Lock_all`) held for the whole run.
Every view is made before timing, so each loop times the call only.
"""

from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

from .common import Bench, format_size, interleaved
from .names import LOCAL, MPI_GET, MPI_PUT


def run(bench: Bench) -> None:
    comm, heap = bench.comm, bench.heap
    me, n = bench.rank, bench.n_pes
    target = 1 if n > 1 else 0
    sizes = sorted(bench.options.sizes)
    largest = max(sizes)

    symmetric = heap.empty((largest,), torch.uint8)            # collective
    symmetric.fill_(me + 1)
    source = torch.full((largest,), 7, dtype=torch.uint8)
    local_dst = torch.zeros(largest, dtype=torch.uint8)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, me)
    if node.Get_size() == n:  # ranks of `node` are those of `comm`
        win = MPI.Win.Allocate_shared(largest, 1, comm=node)
    else:  # PEs on several nodes: no shared window, fall back to a plain one
        win = MPI.Win.Allocate(largest, 1, comm=comm)
    np.frombuffer(win.tomemory(), dtype=np.uint8)[:largest] = me + 1
    source_np, dst_np = source.numpy(), local_dst.numpy()
    comm.Barrier()
    win.Lock_all()
    try:
        if me == 0:
            _measure(bench, heap, symmetric, source, local_dst, source_np, dst_np, win, target,
                     sizes)
            bench.rested()
        else:
            bench.rest()
    finally:
        win.Unlock_all()
        comm.Barrier()
        win.Free()
        node.Free()
    _verify(bench, symmetric, target, min(largest, 1 << 20))
    heap.free(symmetric)


def _measure(bench, heap, symmetric, source, local_dst, source_np, dst_np, win, target,
             sizes) -> None:
    options = bench.options
    for i, size in enumerate(sizes):
        bench.progress("put/get %s (%d/%d)", format_size(size), i + 1, len(sizes))
        dest, src = symmetric[:size], source[:size]
        ldst = local_dst[:size]
        snp, dnp = source_np[:size], dst_np[:size]

        def put():
            heap.put(dest, src, target)

        def get():
            heap.get(ldst, dest, target)

        def copy():
            ldst.copy_(src)

        def mpi_put():
            win.Put(snp, target)
            win.Flush(target)

        def mpi_get():
            win.Get(dnp, target)
            win.Flush(target)

        t = interleaved({"put": put, "copy": copy, "mpi_put": mpi_put, "get": get,
                         "mpi_get": mpi_get}, options.repeat, options.min_time)
        params = {"bytes": size, "target_pe": target}
        gbps = {name: [size / seconds / 1e9 for seconds in v] for name, v in t.items()}
        us = {name: [seconds * 1e6 for seconds in v] for name, v in t.items()}
        for op, mpi_name, mpi_key in (("put", MPI_PUT, "mpi_put"), ("get", MPI_GET, "mpi_get")):
            bench.record(f"{op}.bandwidth", params, gbps[op], "GB/s", LOCAL, gbps["copy"], "higher")
            bench.record(f"{op}.bandwidth", params, gbps[op], "GB/s", mpi_name, gbps[mpi_key],
                         "higher")
            bench.record(f"{op}.latency", params, us[op], "us", LOCAL, us["copy"], "lower")
            bench.record(f"{op}.latency", params, us[op], "us", mpi_name, us[mpi_key], "lower")


def _verify(bench: Bench, symmetric: torch.Tensor, target: int, size: int) -> None:
    """One checked put and get, so that a broken path cannot pass for a fast one."""
    heap, me = bench.heap, bench.rank
    pattern = (torch.arange(size, dtype=torch.int64) % 251).to(torch.uint8)
    if me == 0:
        heap.put(symmetric[:size], pattern, target)
    heap.barrier_all()
    ok = True
    if me == target:
        ok = bool(torch.equal(symmetric[:size], pattern))
    back = torch.zeros(size, dtype=torch.uint8)
    if me == 0:
        heap.get(back, symmetric[:size], target)
        ok = ok and bool(torch.equal(back, pattern))
    heap.barrier_all()
    if not bench.comm.allreduce(ok, op=MPI.LAND):
        raise RuntimeError("put/get benchmark: the data did not arrive intact")
