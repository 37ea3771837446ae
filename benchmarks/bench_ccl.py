"""Device collectives (heap.ccl, shmemvm/device/ccl/): bandwidth per collective
and size, beside a device-local copy of the same bytes measured in the same run.

    mpirun -n 2 python -m benchmarks device-ccl [--backend cuda] [--json PATH]
    mpirun -n 2 python -m benchmarks device-ccl --quick      # host heap, Triton's interpreter

Each figure is GB/s of one PE's input bytes per call (algorithm bandwidth: a
call is timed from launch until its stream is done, async_op=False), the
median over --repeat repeats, each repeat the slowest PE's mean over a loop of
at least --min-time seconds; the baseline is `dst.copy_(src)` of the same
bytes on this PE's device (synchronized the same way), interleaved with it.
The algorithm each call took (ccl.last_algorithm) is in the record's params;
all_gather and all_reduce are also measured with every algorithm forced.

On the host heap the kernels run in Triton's interpreter (TRITON_INTERPRET=1 is
set here before Triton is imported): a smoke test of the command and of every
collective, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from mpi4py import MPI

from . import schema
from .common import KiB, MiB, loop_time, parse_list, setup_logging

METHOD = ("GB/s of one PE's input bytes per call (algorithm bandwidth), async_op=False (the "
          "call until its stream is done); a figure is the median over repeats of the slowest "
          "PE's mean per call in a loop of at least --min-time s; baseline: dst.copy_(src) of "
          "the same bytes on the same device, synchronized alike, interleaved repeat by "
          "repeat; ratio median/median")

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "all_to_all_v")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks device-ccl",
                                description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats")
    p.add_argument("--sizes", type=parse_list, help="bytes of each PE's input, e.g. 4K,1M")
    p.add_argument("--ops", default=",".join(OPS), help="collectives, comma-separated")
    p.add_argument("--repeat", type=int, help="repeats per figure")
    p.add_argument("--min-time", type=float, help="seconds per timed loop")
    p.add_argument("--heap-size", default=None, help="heap size (default 64M host, 2G device)")
    p.add_argument("--backend", default=None, help="heap backend (default: cuda where a GPU "
                                                   "is, else host)")
    p.add_argument("--json", metavar="PATH", help="write the result (benchmarks/schema.py)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="store into benchmarks/results/ from a tree that differs from its commit")
    return p


def main(argv: list[str] | None = None, comm: MPI.Comm | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = comm if comm is not None else MPI.COMM_WORLD
    backend = args.backend or ("cuda" if torch.cuda.is_available() else "host")
    if backend == "host":
        os.environ.setdefault("TRITON_INTERPRET", "1")   # read when the kernels are made
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = set(ops) - set(OPS)
    if unknown:
        _parser().error(f"unknown collectives {sorted(unknown)}; choose from {', '.join(OPS)}")
    sizes = args.sizes or ([256, 4 * KiB] if args.quick or backend == "host" else
                           [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB])
    repeat = args.repeat or (2 if args.quick else 7)
    min_time = args.min_time if args.min_time is not None else (0.001 if args.quick else 0.05)
    setup_logging()
    run, refused = schema.run_on_pe0(
        comm, "python -m benchmarks device-ccl", "device-ccl",
        schema.command(comm.Get_size(), "-m benchmarks device-ccl", list(argv or [])),
        method=METHOD, path=args.json, allow_dirty=args.allow_dirty)
    if refused:
        return 2
    from shmemvm.device.ccl import Ccl
    from shmemvm.heap import SymmetricHeap

    heap = SymmetricHeap(comm, heap_size=args.heap_size or ("64M" if backend == "host" else "2G"),
                         backend=backend)
    records, started = [], time.perf_counter()
    try:
        ccl = Ccl(heap)
        for op in ops:
            for nbytes in sizes:
                for label, config in _configs(op):
                    records.append(_measure(comm, heap, ccl, op, nbytes, label, config, repeat,
                                            min_time))
                    comm.Barrier()
        interpreted = ccl.engine is not None and ccl.engine.interpreted
    finally:
        heap.finalize()
    if comm.Get_rank() != 0:
        return 0
    run.settings = {"n_pes": comm.Get_size(), "backend": backend, "sizes": sizes, "ops": ops,
                    "repeat": repeat, "min_time_s": min_time, "interpreted": interpreted,
                    "quick": args.quick, "elapsed_s": round(time.perf_counter() - started, 1),
                    "environment": schema.environment()}
    if interpreted:
        run.notes.append("Triton's interpreter on the host heap: a smoke test, not a "
                         "measurement of the kernels")
    run.measurements = records
    for r in records:
        print(f"{r['name']:28} {r['params']['bytes']:>10} B  {r['params']['config']:8} "
              f"{r['params']['algorithm']:16} "
              f"{r['value']['median']:10.4g} GB/s  local copy "
              f"{r['baseline']['value']['median']:10.4g} GB/s  ratio {r['ratio']}")
    if args.json:
        schema.write(run.document(), args.json)
    sys.stdout.flush()
    return 0


def _configs(op: str):
    """(label, config) of each way `op` is measured: its default (config=None, the
    algorithm chosen by size and PE count), and every algorithm forced."""
    from shmemvm.device.ccl import Config
    yield "auto", None
    if op == "all_reduce":
        yield "one_shot", Config(all_reduce_variant="one_shot")
        yield "two_shot", Config(all_reduce_variant="two_shot")
    elif op in ("all_gather", "all_to_all"):
        yield "push", Config(all_gather_variant="persistent")
        yield "pull", Config(all_gather_variant="partitioned")


def _measure(comm, heap, ccl, op, nbytes, label, config, repeat, min_time) -> dict:
    world, device = heap.n_pes, heap.device
    n = max(world, nbytes // 4 // world * world)   # float32 elements, a multiple of n_pes
    cols = 32 if n % (32 * world) == 0 else world
    inp = heap.empty((n // cols, cols), torch.float32)
    inp.copy_(torch.randn(n // cols, cols).to(device))
    local = torch.empty(n, dtype=torch.float32, device=device)
    scratch = torch.empty_like(local)
    if op == "all_gather":
        out = heap.empty((world * (n // cols), cols), torch.float32)
        call = lambda: ccl.all_gather(out, inp, config=config)   # noqa: E731
    elif op == "all_reduce":
        out = heap.empty((n // cols, cols), torch.float32)
        call = lambda: ccl.all_reduce(out, inp, config=config)   # noqa: E731
    elif op == "reduce_scatter":
        out = heap.empty((n // cols, cols), torch.float32)
        call = lambda: ccl.reduce_scatter(out, inp, config=config)   # noqa: E731
    elif op == "all_to_all":
        out = heap.empty((n // cols, cols), torch.float32)
        call = lambda: ccl.all_to_all(out, inp, config=config)   # noqa: E731
    elif op == "broadcast":
        out = inp
        call = lambda: ccl.broadcast(inp, src=0, config=config)   # noqa: E731
    else:   # all_to_all_v: an even split of the rows, the counts on the device
        rows = n // cols
        splits = heap.empty(world, torch.int64)
        even = [rows // world] * world
        even[-1] += rows - sum(even)
        splits.copy_(torch.tensor(even, dtype=torch.int64).to(device))
        out = heap.empty((rows * world, cols), torch.float32)
        out_so = heap.empty((2, world), torch.int64)

        def call():
            ccl.all_to_all_v(out, inp, splits, out_so, async_op=False, config=config)

    def copy():
        scratch.copy_(local)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()

    call()
    copy()
    # the same loop counts on every PE (a collective is called alike everywhere)
    counts = {}
    for name, fn in (("ccl", call), ("copy", copy)):
        comm.Barrier()
        once = comm.allreduce(loop_time(fn, 3), op=MPI.MAX)   # every PE calls it 3 times
        counts[name] = max(1, min(1 << 14, int(min_time / max(once, 1e-9))))
    times: dict[str, list[float]] = {"ccl": [], "copy": []}
    for _ in range(repeat):
        for name, fn in (("ccl", call), ("copy", copy)):
            comm.Barrier()
            seconds = loop_time(fn, counts[name])
            # a collective is done when its slowest PE is: the slowest PE's mean
            times[name].append(comm.allreduce(seconds, op=MPI.MAX) if name == "ccl"
                               else seconds)
    slowest = times["ccl"]
    samples = times
    bytes_in = n * 4
    algorithm = ccl.last_algorithm.get(op, label)
    del out
    return schema.measurement(
        f"device-ccl.{op}", {"n_pes": world, "bytes": bytes_in, "dtype": "float32",
                             "config": label, "algorithm": algorithm},
        "GB/s", [bytes_in / t / 1e9 for t in slowest],
        "device-local copy of the same bytes (dst.copy_(src))",
        [bytes_in / t / 1e9 for t in samples["copy"]], "higher")
