"""GPU benchmark of shmemvm's device-side API on 2 PEs (two GPUs of one node).

    mpirun -n 2 python benchmarks/bench_triton.py [--out benchmarks/results/triton-2xh200.json]

Every figure beside its baseline, measured in the same run:

- all_reduce (float32 sum), 4 KiB .. 256 MiB: shmemvm.DeviceAllReduce
  (device-side barriers, reads peers through heap_bases; "auto" picks one-shot
  or two-shot by size, and both are also measured alone) and
  examples/triton_allreduce.py's plain one-shot kernel (a Triton launch per
  call), beside torch.distributed._symmetric_memory's one_shot_all_reduce and
  two_shot_all_reduce_ (CUDA backend, multicast off) and NCCL's all_reduce.
  CUDA events around back-to-back calls; both PEs run every call; five rounds,
  every library once a round, and the median round per library. The records
  compare "auto" with each baseline and with the best of torch's two.
- device-side remote store bandwidth: a Triton kernel storing a local buffer
  into the peer's memory (sv.store with a contiguity hint) beside the copy
  engine (a copy_ into heap.ptr(), the peer's memory), 1 MiB .. 256 MiB.
- host atomic latency on device memory: heap.atomic_fetch_add on the peer
  and on this PE (one kernel + .item() per call), median and p99.

PE 0 writes the result (benchmarks/schema.py, as bench_gpu.py: every figure's
median, min, max, quartiles and count beside its baseline's, ratios median over
median) to --out after each phase. Runs in about 1-2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)   # never NVLink multicast on shared machines

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import shmemvm  # noqa: E402
from bench_gpu import Run, TorchSymm, log, per_call_events  # noqa: E402
from shmemvm import triton as sv  # noqa: E402
from shmemvm.device.allreduce import DeviceAllReduce  # noqa: E402
from triton_allreduce import OneShotAllReduce  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
comm = MPI.COMM_WORLD
rank, n_pes = comm.Get_rank(), comm.Get_size()
peer = 1 - rank


@triton.jit
def remote_store(src, dst, n, me, to, heap_bases, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    step = tl.num_programs(0) * BLOCK
    while start < n:
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        data = tl.load(src + offs, mask=mask)
        sv.store(dst + offs, data, me, to, heap_bases, mask=mask, hint=BLOCK)
        start += step


def events(fn, iters: int) -> float:
    """Seconds per call of back-to-back GPU work (CUDA events), after a barrier."""
    torch.cuda.synchronize()
    comm.Barrier()
    return per_call_events(fn, iters)


def slowest(seconds: float) -> float:
    """The slower PE's time: a collective is done when the last PE is."""
    return max(comm.allgather(seconds))


def iterations(nbytes: int) -> int:
    return max(20, min(200, (2 << 30) // max(nbytes, 1) // 4))


#: rounds of the all-reduce comparison (each library measured once a round)
TRIALS = 5


OURS = "shmemvm DeviceAllReduce (auto)"
TORCH = ("torch symm_mem one_shot_all_reduce", "torch symm_mem two_shot_all_reduce_")


def all_reduce(run, heap, symm, sizes, dev):
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401  (registers torch.ops.symm_mem)
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    device_reduce = DeviceAllReduce(heap)
    log(f"DeviceAllReduce: waits give up after {device_reduce.max_polls} polls "
        f"(~{device_reduce.timeout:g} s)")
    plain = OneShotAllReduce(heap, programs=programs)
    largest = sizes[-1] // 4
    src, dst = heap.empty(largest, torch.float32), heap.empty(largest, torch.float32)
    src.copy_(torch.randn(largest, device=dev))
    tsrc = symm.mod.empty(largest, dtype=torch.float32, device=dev)
    symm.mod.rendezvous(tsrc, symm.group)
    tsrc.copy_(src)
    nccl = src.clone()
    for nbytes in sizes:
        n = nbytes // 4
        s, d, t, c = src[:n], dst[:n], tsrc[:n], nccl[:n]
        iters = iterations(nbytes)
        ops = {
            OURS: lambda: device_reduce(d, s),
            "shmemvm DeviceAllReduce one_shot": lambda: device_reduce(d, s, algorithm="one_shot"),
            "shmemvm DeviceAllReduce two_shot": lambda: device_reduce(d, s, algorithm="two_shot"),
            "examples/triton_allreduce.py (a Triton launch per call)": lambda: plain(d, s),
            TORCH[0]: lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", symm.group),
            TORCH[1]: lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", symm.group),
            "NCCL all_reduce": lambda: dist.all_reduce(c),
        }
        samples: dict = {}
        for name, op in ops.items():
            try:
                op()   # warm-up (compiles, records the CUDA graph, rendezvous)
                samples[name] = []
            except Exception as exc:  # noqa: BLE001 - e.g. a size torch refuses
                run.errors.append(f"all_reduce {name} {nbytes} B: {exc!r}"[:300])
        # TRIALS rounds, every library once a round: the median over rounds leaves out
        # a round that the machine disturbed, for every library alike
        for _ in range(TRIALS):
            for name in samples:
                samples[name].append(slowest(events(ops[name], iters)))
        times = {name: (statistics.median(samples[name]) if name in samples else None)
                 for name in ops}
        # correctness of each of ours at this size, against a host-order sum (a PE-ordered sum)
        gathered = [torch.empty_like(s) for _ in range(n_pes)]
        dist.all_gather(gathered, s)
        expected = gathered[0].clone()
        for g in gathered[1:]:
            expected += g
        correct = {}
        for algorithm in ("auto", "one_shot", "two_shot"):
            d.zero_()
            heap.barrier_all()
            device_reduce(d, s, algorithm=algorithm)
            device_reduce.synchronize()
            correct[algorithm] = bool(torch.equal(d, expected))
        ours = times[OURS]
        baselines = dict(times)
        best_torch = min((k for k in TORCH if times[k] is not None), key=lambda k: times[k],
                         default=None)
        if best_torch is not None:   # the faster of torch's two, by median
            baselines["best of torch symm_mem one-shot/two-shot"] = times[best_torch]
            samples["best of torch symm_mem one-shot/two-shot"] = samples[best_torch]
        gbps = {name: [nbytes / t / 1e9 for t in v] for name, v in samples.items()}
        for name, value in baselines.items():
            if name == OURS or ours is None or value is None:
                continue
            run.record("all_reduce float32 sum", {"bytes": nbytes, "iters": iters,
                                                   "trials": TRIALS, "statistic": "one sample "
                                                   "a trial: its mean time per call",
                                                   "correct": correct, "us": ours * 1e6,
                                                   "baseline_us": value * 1e6},
                       gbps[OURS], "GB/s (algbw)", name, gbps[name], "higher")
        log(f"all_reduce {nbytes:>10} B: " + ", ".join(
            f"{k}={v * 1e6:.1f}us" if v else f"{k}=n/a" for k, v in times.items())
            + f"; correct {correct}")
        run.dump()


def remote_stores(run, heap, sizes, dev):
    largest = sizes[-1]
    dst = heap.empty(largest, torch.uint8)
    src = torch.randint(0, 255, (largest,), dtype=torch.uint8, device=dev)
    view = heap.ptr(dst, peer)
    bases = heap.heap_bases()
    for nbytes in sizes:
        words = nbytes // 16
        s32, d32 = src[:nbytes].view(torch.int32), dst[:nbytes].view(torch.int32)
        n = nbytes // 4
        grid = (min(264, triton.cdiv(n, 4096)),)
        iters = iterations(nbytes)

        def kernel():
            remote_store[grid](s32, d32, n, rank, peer, bases, BLOCK=4096, num_warps=8)

        def engine():
            view[:nbytes].copy_(src[:nbytes], non_blocking=True)

        kernel()
        t_kernel = events(kernel, iters) if rank == 0 else (events(lambda: None, 1), None)[1]
        engine()
        t_engine = events(engine, iters) if rank == 0 else (events(lambda: None, 1), None)[1]
        if rank == 0:
            # one sample each: the mean over `iters` back-to-back calls
            run.record("remote store bandwidth, PE 0 -> PE 1", {"bytes": nbytes, "iters": iters,
                                                               "words": words},
                       [nbytes / t_kernel / 1e9], "GB/s", "copy engine (copy_ into heap.ptr view)",
                       [nbytes / t_engine / 1e9], "higher")
            log(f"remote store {nbytes:>10} B: kernel {nbytes / t_kernel / 1e9:.1f} GB/s, "
                f"copy engine {nbytes / t_engine / 1e9:.1f} GB/s")
        heap.barrier_all()
        if not torch.equal(heap.ptr(dst, peer)[:nbytes], src[:nbytes]):
            run.errors.append(f"remote store {nbytes} B: data differs")
        run.dump()


def atomic_latency(run, heap, iters: int):
    counter = heap.zeros(2, torch.int64)
    for target, name in ((peer, "peer GPU"), (rank, "own GPU")):
        heap.barrier_all()
        samples = []
        if rank == 0:
            heap.atomic_fetch_add(counter[0], 1, target)   # warm-up: compiles the kernel
            for _ in range(iters):
                t0 = time.perf_counter()
                heap.atomic_fetch_add(counter[0], 1, target)
                samples.append(time.perf_counter() - t0)
            samples.sort()
            median, p99 = statistics.median(samples), samples[int(0.99 * (len(samples) - 1))]
            # baseline: a one-element device read back to the host (.item()), the floor of
            # any host call that returns a device value
            reads = []
            for _ in range(iters):
                t0 = time.perf_counter()
                counter[1].item()
                reads.append(time.perf_counter() - t0)
            run.record(f"host atomic_fetch_add latency on device memory ({name})",
                       {"iters": iters, "p99_us": p99 * 1e6}, [t * 1e6 for t in samples], "us",
                       "one-element .item() of device memory", [t * 1e6 for t in reads], "lower")
            log(f"atomic_fetch_add ({name}): median {median * 1e6:.1f} us, p99 {p99 * 1e6:.1f} us")
        heap.barrier_all()
    run.dump()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/triton-2xh200.json")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="store into benchmarks/results/ from a tree that differs from its "
                         "commit (recorded in the result)")
    ap.add_argument("--max-size", default="256M")
    ap.add_argument("--master-port", default=os.environ.get("MASTER_PORT", "29541"))
    args = ap.parse_args()
    if n_pes != 2:
        log("bench_triton.py runs on exactly 2 PEs: mpirun -n 2 ...")
        return 2
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to measure")
        return 3
    run = Run(args, "triton", "CUDA events around back-to-back calls after an MPI barrier; "
              "collectives: the slower PE's time; all-reduce: one sample a round, every library "
              "once a round; host atomics: one sample a call; every figure is a median, ratios "
              "shmemvm median / baseline median (GB/s: higher is better; us: lower is better)")
    max_size = shmemvm.config.parse_size(args.max_size)
    heap = shmemvm.init(heap_size="2G", backend="cuda")
    dev = heap.device
    torch.cuda.set_device(dev)
    run.meta = {"what": "shmemvm.triton on 2 PEs (one GPU each)", "n_pes": n_pes,
                "gpu": torch.cuda.get_device_name(dev), "max_size": max_size}
    symm = TorchSymm(dev, args.master_port, 4 * KiB)
    try:
        sizes = []
        n = 4 * KiB
        while n <= max_size:
            sizes.append(n)
            n *= 4
        all_reduce(run, heap, symm, sizes, dev)
        remote_stores(run, heap, [s for s in sizes if s >= MiB], dev)
        atomic_latency(run, heap, 2000)
    finally:
        run.dump()
        symm.close()
        shmemvm.finalize()
    if rank == 0:
        print(json.dumps({"records": len(run.records), "errors": run.errors}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
