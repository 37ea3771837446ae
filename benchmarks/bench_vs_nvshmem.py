"""shmemvm against NVSHMEM4Py, side by side in the same processes (2 PEs, one GPU each).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        mpirun -n 2 python benchmarks/bench_vs_nvshmem.py [--quick] \\
        [--out benchmarks/results/gpu-vs-nvshmem4py.json]
    mpirun -n 2 python benchmarks/bench_vs_nvshmem.py --backend host   # no GPU: shmemvm only

Both libraries live in the same two processes (NVSHMEM4Py: `nvshmem4py-cu13`,
`import nvshmem.core`, initialised over MPI on COMM_WORLD with a cuda.core
Device; shmemvm: a SymmetricHeap on the CUDA backend). Every figure is one
measurement of the one result format (benchmarks/schema.py): shmemvm's samples
as the value, NVSHMEM4Py's as the baseline, both with their median, min, max,
quartiles and count, and ratio = shmemvm's median / NVSHMEM4Py's median (times:
smaller is better; GB/s: larger is better), the goal of issue 15 in
params["goal"]. Sections, in this order (the riskiest last):

1. cached allocate + free of 1 KiB, a pair of collectives on both sides
   (shmemvm malloc+free of a cached size; nvshmem.core.tensor + free_tensor,
   served from its pre-mapped heap), and shmemvm's cached malloc against an
   MPI.Barrier (issue 15's host goal: <= 3x).
2. blocking put of 8 B and 4 KiB from PE 0 to PE 1, per call: shmemvm
   heap.put (copy + stream synchronize) and nvshmem.core.put on a cuda.core
   Stream + Stream.sync() (the source a symmetric nvshmem.core.tensor of
   exactly that size, as put copies min(src, dst) bytes); put + quiet + sync
   is in params.
3. put bandwidth at 64 MiB and 1 GiB, the same blocking calls; each
   library's put is checked byte for byte at the smallest size.
4. collective allocation that needs new physical memory, 64 MiB and 1 GiB.
   shmemvm: after trim() every time, so malloc creates, maps, exports, passes
   and maps a new segment on every PE. NVSHMEM4Py maps its heap at init up to
   NVSHMEM_SYMMETRIC_SIZE (default here 3G) and never returns memory, so an
   allocation inside it needs none; the baseline of record 4a is that (what
   a NVSHMEM user sees), and section 6 measures NVSHMEM's own new-memory case.
5. profile (shmemvm only): where a fresh (64 KiB, 1 MiB, 64 MiB, 1 GiB) and a cached
   (1 KiB, 1 MiB) malloc spend their time, step by step (shmemvm/core/profile.py).
6. NVSHMEM4Py allocation beyond NVSHMEM_SYMMETRIC_SIZE: allocations of one
   size held until their total passes the pre-mapped size by two growth
   granules (NVSHMEM grows its heap through CUDA VMM in 512 MiB granules when
   NVSHMEM_DISABLE_CUDA_VMM is not set), each timed, with the device memory
   each call added; the calls that added memory are NVSHMEM's new-memory case
   (not every call past NVSHMEM_SYMMETRIC_SIZE is one: a call that fits in the
   granule the previous one mapped maps nothing). Record 4b compares shmemvm's fresh
   allocations with these, median with median: at 64 MiB each growth event is
   one sample (a call that grew the heap by a granule; before, the slowest of
   them was compared with our median), at 1 GiB each event's time per GiB of
   memory it added.

Robustness: every section runs in try/except, its errors (every PE's) go
into the JSON's meta.errors; PE 0 rewrites the JSON after every section; a
watchdog (--deadline) dumps the stacks and ends the process if something
hangs; --max-iters caps every loop; without nvshmem4py (or cuda.core) the
shmemvm half still runs and the records say why the baseline is missing.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import math
import os
import statistics
import sys
import time
import traceback

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)   # never NVLink multicast on shared machines

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import shmemvm  # noqa: E402
from benchmarks import schema  # noqa: E402
from bench_gpu import Run, _round, fmt_size, log, rest, rested  # noqa: E402
from shmemvm import SymmetricHeap  # noqa: E402
from shmemvm.core import profile  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
comm = MPI.COMM_WORLD
rank, n_pes = comm.Get_rank(), comm.Get_size()
peer = 1 - rank
NVSHMEM = "NVSHMEM4Py"

GOALS = {
    "new_memory": "<= 1.0 (new-memory allocation per GiB, shmemvm / NVSHMEM4Py)",
    "fresh_64M": "<= 1 ms absolute (a fresh 64 MiB allocation)",
    "cached_pair": "<= 0.5 (cached allocate+free, shmemvm / NVSHMEM4Py)",
    "put_8": "<= 1.0 (blocking 8 B put, shmemvm / NVSHMEM4Py)",
    "none": "none stated in issue 15",
    "barrier": "<= 3 (host backend, 2 PEs: cached malloc / MPI.Barrier)",
}


# -- small helpers ------------------------------------------------------------------

def say(message: str) -> None:
    """A progress line from any PE (log() prints PE 0's only)."""
    print(f"[PE {rank} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def slowest(seconds: float) -> float:
    """The slower PE's figure: a collective is done when its last PE is."""
    return comm.allreduce(seconds, op=MPI.MAX)


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _us(samples: list[float]) -> list[float]:
    return [t * 1e6 for t in samples]


def p99_us(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e6


class Bench:
    """The run's state: both libraries, the device, the limits."""

    def __init__(self, args, run: Run):
        self.args, self.run = args, run
        self.gpu = args.backend == "cuda"
        self.heap: SymmetricHeap | None = None
        self.nv: Nvshmem | None = None
        self.nv_missing = "not attempted"
        self.local_errors: list[str] = []

    def iters(self, full: int, quick: int) -> int:
        return max(1, min(self.args.max_iters, quick if self.args.quick else full))

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()

    def baseline(self, value):
        """(baseline_name, value) for a record: NVSHMEM4Py's figure, or why there is none."""
        if self.nv is None:
            return f"{NVSHMEM} (unavailable: {self.nv_missing})"[:300], None
        return NVSHMEM, value

    def error(self, where: str, exc: BaseException) -> None:
        text = f"PE {rank}: {where}: {exc!r}"[:600]
        say(text)
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        self.local_errors.append(text)

    def section(self, name: str, fn) -> bool:
        """Run one section on every PE; gather every PE's errors into the JSON."""
        log(f"-- {name}")
        t0 = time.perf_counter()
        try:
            fn()
            ok = True
        except Exception as exc:  # noqa: BLE001 - record and go on with the next section
            self.error(name, exc)
            ok = False
        everyone = comm.gather(self.local_errors, root=0)
        self.local_errors = []
        if rank == 0:
            for errors in everyone:
                self.run.errors.extend(errors)
            self.run.meta.setdefault("section_seconds", {})[name] = _round(
                time.perf_counter() - t0)
        self.run.dump()
        return comm.allreduce(ok, op=MPI.LAND)


class Nvshmem:
    """NVSHMEM4Py on this PE's GPU: init over MPI, uint8 tensors, put on one stream."""

    def __init__(self, local_device: int, method: str):
        import nvshmem.core as nvc
        try:
            from cuda.core import Device
        except ImportError:  # older cuda-python: cuda.core.experimental
            from cuda.core.experimental import Device
        self.nvc = nvc
        self.device = Device(local_device)
        self.device.set_current()
        self.stream = self.device.create_stream()
        if method == "mpi":
            nvc.init(device=self.device, mpi_comm=comm, initializer_method="mpi")
        else:
            nvc.init(device=self.device, mpi_comm=comm, initializer_method=method)
        self.method = method
        try:
            self.version = str(nvc.get_version())
        except Exception as exc:  # noqa: BLE001
            self.version = f"unknown ({exc!r})"

    def tensor(self, nbytes: int) -> torch.Tensor:
        """A symmetric uint8 tensor of nbytes (collective)."""
        return self.nvc.tensor((nbytes,), dtype=torch.uint8)

    def free(self, tensor: torch.Tensor) -> None:
        """Free a tensor from tensor() (collective)."""
        self.nvc.free_tensor(tensor)

    def put(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """PE `peer`'s dst <- src, both symmetric, on the stream (not waited for)."""
        self.nvc.put(dst, src, remote_pe=peer, stream=self.stream)

    def blocking_put(self, dst, src) -> None:
        self.put(dst, src)
        self.stream.sync()

    def put_quiet(self, dst, src) -> None:
        self.put(dst, src)
        self.nvc.quiet(stream=self.stream)
        self.stream.sync()

    def finalize(self) -> None:
        self.stream.sync()
        self.nvc.finalize()


def start_nvshmem(bench: Bench, local_device: int) -> None:
    """NVSHMEM4Py on every PE or on none (bench.nv_missing says why not)."""
    nv, why = None, None
    try:
        import nvshmem.core  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - not installed: the shmemvm half still runs
        why = (f"nvshmem.core cannot be imported ({exc!r}); install nvshmem4py-cu13 and "
               f"cuda-python (cuda.core)")
    if why is None:
        try:
            nv = Nvshmem(local_device, bench.args.nvshmem_init)
        except Exception as exc:  # noqa: BLE001
            why = f"nvshmem.core.init(initializer_method={bench.args.nvshmem_init!r}) failed: {exc!r}"
            bench.error("NVSHMEM4Py init", exc)
    everyone = comm.allgather(why)
    if any(everyone):
        bench.nv_missing = "; ".join(f"PE {pe}: {w}" for pe, w in enumerate(everyone) if w)[:400]
        if nv is not None:  # initialised here but not on every PE: unusable as a collective
            nv = None
        log(f"NVSHMEM4Py unavailable: {bench.nv_missing} -- measuring shmemvm only")
        return
    bench.nv = nv
    bench.run.meta["nvshmem4py"] = {"version": nv.version, "init": nv.method,
                                    "NVSHMEM_SYMMETRIC_SIZE": os.environ.get("NVSHMEM_SYMMETRIC_SIZE")}
    log(f"NVSHMEM4Py ready: {nv.version}, init {nv.method}")


# -- 1. cached allocate + free --------------------------------------------------------

def cached_alloc_free(bench: Bench) -> None:
    heap, nv, run = bench.heap, bench.nv, bench.run
    size = 1 * KiB
    pairs = bench.iters(300, 40)
    trials = 3
    heap.free(heap.malloc(size))  # now cached
    if nv is not None:
        nv.free(nv.tensor(size))
    ours, theirs = [], []
    for _ in range(trials):   # interleaved trials: both see the same machine state
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(pairs):
            heap.free(heap.malloc(size))
        ours.append(slowest((time.perf_counter() - t0) / pairs))
        if nv is not None:
            bench.sync()
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(pairs):
                nv.free(nv.tensor(size))
            theirs.append(slowest((time.perf_counter() - t0) / pairs))
    value = median_us(ours)
    base_name, base = bench.baseline(_us(theirs) if theirs else None)
    if rank == 0:
        run.record("alloc_free_cached", {
            "bytes": size, "size": fmt_size(size), "pairs_per_trial": pairs, "trials": trials,
            "statistic": "median over trials of the slower PE's mean per malloc+free pair",
            "situation": "shmemvm: the 1 KiB block's memory is already mapped (cached); "
                         "NVSHMEM4Py: served from its pre-mapped heap; no new physical memory "
                         "on either side",
            "nvshmem_call": "nvshmem.core.tensor((1024,), uint8) + free_tensor",
            "trials_us": [_round(t * 1e6) for t in ours],
            "baseline_trials_us": [_round(t * 1e6) for t in theirs],
            "goal": GOALS["cached_pair"]}, _us(ours), "us", base_name, base, "lower")
    log(f"cached 1 KiB alloc+free: shmemvm {value:.1f} us, {NVSHMEM} "
        f"{median_us(theirs) if theirs else float('nan'):.1f} us")

    # shmemvm's cached malloc alone against an MPI.Barrier (issue 15's host goal)
    calls = bench.iters(500, 50)
    mallocs, barriers = [], []
    for _ in range(trials):
        comm.Barrier()
        spent = 0.0
        for _ in range(calls):
            t0 = time.perf_counter()
            x = heap.malloc(size)
            spent += time.perf_counter() - t0
            heap.free(x)
        mallocs.append(slowest(spent / calls))
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            comm.Barrier()
        barriers.append(slowest((time.perf_counter() - t0) / calls))
    m, b = median_us(mallocs), median_us(barriers)
    if rank == 0:
        run.record("malloc_cached_vs_mpi_barrier", {
            "bytes": size, "size": fmt_size(size), "calls_per_trial": calls, "trials": trials,
            "backend": bench.args.backend,
            "statistic": "median over trials of the slower PE's mean per call",
            "goal": GOALS["barrier"] if bench.args.backend == "host" else GOALS["none"]},
            _us(mallocs), "us", "MPI.Barrier on COMM_WORLD (same run)", _us(barriers), "lower")
    log(f"cached 1 KiB malloc {m:.1f} us vs MPI.Barrier {b:.1f} us ({m / b:.1f}x)")


# -- 2. blocking put latency --------------------------------------------------------

def free_buffers(bench: Bench, ours: tuple, theirs: tuple) -> None:
    """Free a section's buffers: shmemvm's, and NVSHMEM4Py's where it runs."""
    for tensor in ours:
        bench.heap.free(tensor)
    if bench.nv is not None:
        for tensor in theirs:
            bench.nv.free(tensor)


def put_latency(bench: Bench) -> None:
    heap, nv, run = bench.heap, bench.nv, bench.run
    calls = bench.iters(3000, 200)
    chunks = 5
    for n in (8, 4 * KiB):
        ours_dst, ours_src = heap.malloc(n), heap.malloc(n)
        ours_src.fill_(7)
        theirs_dst = theirs_src = None
        if nv is not None:
            theirs_dst, theirs_src = nv.tensor(n), nv.tensor(n)
            theirs_src.fill_(7)
        bench.sync()
        comm.Barrier()
        if rank == 0:
            try:
                ops = {"shmemvm": lambda: heap.put(ours_dst, ours_src, peer)}
                if nv is not None:
                    ops[NVSHMEM] = lambda: nv.blocking_put(theirs_dst, theirs_src)
                    ops["nvshmem_quiet"] = lambda: nv.put_quiet(theirs_dst, theirs_src)
                samples = {name: [] for name in ops}
                for fn in ops.values():
                    for _ in range(min(50, calls)):
                        fn()
                clock = time.perf_counter
                for _ in range(chunks):   # interleaved chunks
                    for name, fn in ops.items():
                        got = samples[name]
                        for _ in range(max(1, calls // chunks)):
                            t0 = clock()
                            fn()
                            got.append(clock() - t0)
                us = {name: median_us(v) for name, v in samples.items()}
                base_name, base = bench.baseline(_us(samples[NVSHMEM]) if NVSHMEM in samples
                                                 else None)
                run.record("put_latency", {
                    "bytes": n, "size": fmt_size(n), "blocking": True,
                    "direction": "PE 0 -> PE 1", "calls": len(samples["shmemvm"]),
                    "statistic": "median per call (PE 0)", "p99_us": _round(p99_us(samples["shmemvm"])),
                    "baseline_p99_us": _round(p99_us(samples[NVSHMEM])) if NVSHMEM in samples else None,
                    "nvshmem_put_quiet_sync_us": _round(us.get("nvshmem_quiet")),
                    "shmemvm_call": "heap.put(dst, src, peer) (copy + stream synchronize)",
                    "nvshmem_call": "nvshmem.core.put(dst, src, remote_pe, stream) + stream.sync(); "
                                    "src and dst symmetric tensors of exactly this size",
                    "goal": GOALS["put_8"] if n == 8 else GOALS["none"]},
                    _us(samples["shmemvm"]), "us", base_name, base, "lower")
                log(f"put {fmt_size(n):>6}: " + ", ".join(f"{k} {v:.1f} us" for k, v in us.items()))
            finally:
                rested()
        else:
            rest()
        free_buffers(bench, (ours_dst, ours_src), (theirs_dst, theirs_src))


# -- 3. put bandwidth ----------------------------------------------------------------

def pattern(n: int, device) -> torch.Tensor:
    """n bytes counting 0..250 over and over (251: no power-of-two period)."""
    return torch.arange(251, dtype=torch.uint8, device=device).repeat(n // 251 + 1)[:n]


def put_bandwidth(bench: Bench) -> None:
    heap, nv, run = bench.heap, bench.nv, bench.run
    sizes = [n for n in (64 * MiB, 1 * GiB) if n <= bench.args.max_size]
    if not sizes:
        raise ValueError(f"--max-size {bench.args.max_size} is below 64 MiB: no bandwidth sizes")
    for i, n in enumerate(sizes):
        iters = bench.iters(max(3, min(60, (4 * GiB) // n)), 3)
        trials = 2 if bench.args.quick else 3
        ours_dst, ours_src = heap.malloc(n), heap.malloc(n)
        ours_src.copy_(pattern(n, heap.device))
        ours_dst.zero_()
        theirs_dst = theirs_src = None
        if nv is not None:
            theirs_dst, theirs_src = nv.tensor(n), nv.tensor(n)
            theirs_src.copy_(pattern(n, theirs_src.device))
            theirs_dst.zero_()
        bench.sync()
        comm.Barrier()
        if i == 0:   # each library's put arrives intact (checked on PE 1)
            if rank == 0:
                heap.put(ours_dst, ours_src, peer)
                if nv is not None:
                    nv.blocking_put(theirs_dst, theirs_src)
            bench.sync()
            comm.Barrier()
            checks = [True, True]
            if rank == 1:
                expected = pattern(n, heap.device)
                checks[0] = bool(torch.equal(ours_dst, expected))
                if nv is not None:
                    checks[1] = bool(torch.equal(theirs_dst, expected.to(theirs_dst.device)))
            checks = comm.bcast(checks, root=1)
            bench.run.meta["put_correct"] = {"bytes": n, "shmemvm": checks[0],
                                             NVSHMEM: checks[1] if nv is not None else None}
            if not all(checks):
                bench.local_errors.append(f"put of {n} B arrived altered: shmemvm ok {checks[0]}, "
                                          f"{NVSHMEM} ok {checks[1]}")
            log(f"put of {fmt_size(n)} intact: shmemvm {checks[0]}, {NVSHMEM} "
                f"{checks[1] if nv is not None else 'n/a'}")
        if rank == 0:
            try:
                ops = {"shmemvm": lambda: heap.put(ours_dst, ours_src, peer)}
                if nv is not None:
                    ops[NVSHMEM] = lambda: nv.blocking_put(theirs_dst, theirs_src)
                for fn in ops.values():
                    fn()
                samples = {name: [] for name in ops}
                for _ in range(trials):
                    for name, fn in ops.items():
                        t0 = time.perf_counter()
                        for _ in range(iters):
                            fn()
                        samples[name].append((time.perf_counter() - t0) / iters)
                gbps = {name: n / statistics.median(v) / 1e9 for name, v in samples.items()}
                trial_gbps = {name: [n / t / 1e9 for t in v] for name, v in samples.items()}
                base_name, base = bench.baseline(trial_gbps.get(NVSHMEM))
                run.record("put_bandwidth", {
                    "bytes": n, "size": fmt_size(n), "blocking": True, "direction": "PE 0 -> PE 1",
                    "iterations": iters, "trials": trials, "better": "higher",
                    "statistic": "bytes / median over trials of the mean blocking call (PE 0)",
                    "goal": GOALS["none"]}, trial_gbps["shmemvm"], "GB/s", base_name, base,
                    "higher")
                log(f"put {fmt_size(n):>7}: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in gbps.items()))
            finally:
                rested()
        else:
            rest()
        free_buffers(bench, (ours_dst, ours_src), (theirs_dst, theirs_src))


# -- 4. allocation that needs new physical memory ---------------------------------------

def new_memory(bench: Bench) -> None:
    heap, nv, run = bench.heap, bench.nv, bench.run
    for n in (64 * MiB, 1 * GiB):
        if n > bench.args.max_size:
            continue
        iters = bench.iters(6 if n < GiB else 4, 2)
        ours, ours_free, segments_made = [], [], []
        for _ in range(iters + 1):   # the first: warm-up
            heap.trim()
            bench.sync()
            comm.Barrier()
            before = heap._core.local.stats()["segments"]
            t0 = time.perf_counter()
            x = heap.malloc(n)
            t1 = time.perf_counter()
            segments_made.append(heap._core.local.stats()["segments"] - before)
            heap.free(x)
            t2 = time.perf_counter()
            ours.append(slowest(t1 - t0))
            ours_free.append(slowest(t2 - t1))
            del x
        heap.trim()
        ours, ours_free, segments_made = ours[1:], ours_free[1:], segments_made[1:]
        # The same new memory, allocated as NVSHMEM's growth (section 6) is: each
        # allocation held while the next is made, none freed in between, so the
        # driver gives memory this process did not just release.
        held, ours_held = [], []
        try:
            for _ in range(min(iters, heap.heap_size // n - 1)):   # room left for the rest
                bench.sync()
                comm.Barrier()
                t0 = time.perf_counter()
                held.append(heap.malloc(n))
                ours_held.append(slowest(time.perf_counter() - t0))
        finally:
            for x in held:
                heap.free(x)
            held.clear()
            heap.trim()
        if ours_held:
            bench.fresh_held_us[n] = _us(ours_held)
        if not all(segments_made):
            bench.local_errors.append(f"PE {rank}: fresh malloc({n}) made no new segment: "
                                      f"{segments_made}")
        theirs, theirs_free = [], []
        if nv is not None:
            for _ in range(iters + 1):
                bench.sync()
                comm.Barrier()
                t0 = time.perf_counter()
                y = nv.tensor(n)
                t1 = time.perf_counter()
                nv.free(y)
                t2 = time.perf_counter()
                theirs.append(slowest(t1 - t0))
                theirs_free.append(slowest(t2 - t1))
                del y
            theirs, theirs_free = theirs[1:], theirs_free[1:]
        value = median_us(ours)
        bench.fresh_us[n] = _us(ours)
        base_name, base = bench.baseline(_us(theirs) if theirs else None)
        if rank == 0:
            run.record("alloc_new_memory_vs_nvshmem_premapped", {
                "bytes": n, "size": fmt_size(n), "calls": len(ours),
                "statistic": "median over calls of the slower PE's time per malloc",
                "shmemvm_new_physical_memory": True,
                "shmemvm_situation": "after trim(): malloc creates + maps a segment, exports it, "
                                     "passes the fd, every peer imports + maps it; 2-3 agreements",
                "nvshmem_new_physical_memory": False,
                "nvshmem_situation": f"nvshmem.core.tensor inside its heap, mapped at init "
                                     f"(NVSHMEM_SYMMETRIC_SIZE="
                                     f"{os.environ.get('NVSHMEM_SYMMETRIC_SIZE')}); "
                                     f"section 6 / alloc_new_memory_vs_nvshmem_growth is NVSHMEM's "
                                     f"own new-memory case",
                "samples_us": [_round(t * 1e6) for t in ours],
                "held_samples_us": [_round(t * 1e6) for t in ours_held],
                "held_situation": "each malloc made while the previous ones are held (as "
                                  "NVSHMEM grows its heap), no free or trim in between",
                "baseline_samples_us": [_round(t * 1e6) for t in theirs],
                "free_us": _round(median_us(ours_free)),
                "baseline_free_us": _round(median_us(theirs_free)) if theirs_free else None,
                "goal": GOALS["fresh_64M"] if n == 64 * MiB else GOALS["new_memory"]},
                _us(ours), "us", base_name, base, "lower")
        log(f"new-memory malloc {fmt_size(n):>7}: shmemvm {value:.0f} us; {NVSHMEM} in its "
            f"pre-mapped heap {median_us(theirs) if theirs else float('nan'):.0f} us")


# -- 5. where shmemvm's time goes ---------------------------------------------------------

def profile_steps(bench: Bench) -> None:
    heap, run = bench.heap, bench.run
    fresh_sizes = [n for n in (64 * KiB, 1 * MiB, 64 * MiB, 1 * GiB) if n <= bench.args.max_size]
    with profile.instrumented(heap._core) as timed:
        for kind, sizes in (("fresh", fresh_sizes), ("cached", [1 * KiB, 1 * MiB])):
            for n in sizes:
                calls = bench.iters(8, 3) if kind == "fresh" else bench.iters(200, 30)
                if kind == "cached":
                    heap.free(heap.malloc(n))   # now cached
                timed.reset()
                total = 0
                for _ in range(calls):
                    if kind == "fresh":
                        heap.trim()
                    comm.Barrier()
                    with timed.measuring():
                        t0 = time.perf_counter_ns()
                        x = heap.malloc(n)
                        total += time.perf_counter_ns() - t0
                    heap.free(x)
                    del x
                steps = {k: _round(v) for k, v in timed.breakdown(total, calls).items()}
                everyone = comm.gather(steps, root=0)
                if rank == 0:
                    run.record(f"profile_malloc_{kind}", {
                        "bytes": n, "size": fmt_size(n), "calls": calls,
                        "backend": bench.args.backend,
                        "statistic": "mean per malloc on PE 0, by step (us, inclusive; a/b is "
                                     "b inside a); 'python' = total less the top-level steps",
                        "steps_us": everyone[0],
                        "pe1_steps_us": everyone[1] if len(everyone) > 1 else None,
                        "slowest_pe_total_us": max(e["total"] for e in everyone),
                        "timing": "SHMEMVM_PROFILE-style wrappers (profile.instrumented); each "
                                  "timed step adds ~1 us, so totals run above the plain figures"},
                        [everyone[0]["total"]], "us")
                    top = {k: v for k, v in everyone[0].items() if "/" not in k}
                    log(f"profile {kind} {fmt_size(n):>7}: " +
                        ", ".join(f"{k} {v:.1f}" for k, v in top.items()) + " us")
                if kind == "fresh":
                    heap.trim()


# -- 6. NVSHMEM4Py's own new-memory case: beyond NVSHMEM_SYMMETRIC_SIZE ----------------------

def nvshmem_growth(bench: Bench) -> None:
    nv, run = bench.nv, bench.run
    if nv is None:
        log(f"skipped: {NVSHMEM} unavailable")
        return
    premapped = shmemvm.config.parse_size(os.environ.get("NVSHMEM_SYMMETRIC_SIZE", "1G"))
    granule = 512 * MiB
    for n in (64 * MiB, 1 * GiB):
        count = min(bench.args.max_iters * 16, math.ceil(premapped / n) + max(2, 2 * granule // n))
        held, times, grown = [], [], []
        bench.sync()
        comm.Barrier()
        used_before = device_used()
        try:
            for _ in range(count):
                comm.Barrier()
                before = device_used()
                t0 = time.perf_counter()
                held.append(nv.tensor(n))
                elapsed = time.perf_counter() - t0
                after = device_used()
                times.append(slowest(elapsed))
                # which calls really mapped new memory (on any PE): not every call past
                # the pre-mapped size does, as NVSHMEM grows a granule at a time
                grown.append(max(comm.allgather((after or 0) - (before or 0))))
            bench.sync()
            comm.Barrier()
            used_after = device_used()
        finally:
            for t in held:
                nv.free(t)
            held.clear()
        beyond = [t for i, t in enumerate(times) if i * n >= premapped]
        inside = [t for i, t in enumerate(times) if (i + 1) * n <= premapped]
        growing = [(t, g) for t, g in zip(times, grown) if g > 0]
        if not beyond:
            raise RuntimeError(f"no {fmt_size(n)} allocation lay past NVSHMEM_SYMMETRIC_SIZE")
        if growing:
            # Every call that grew device memory is one sample (a call that fit in the
            # granule the previous one mapped mapped nothing and is no new memory): at
            # 64 MiB its time, at 1 GiB its time per n bytes of the memory it added.
            # The comparison is median with median, as everywhere.
            events = [t if n < granule else t / (g / n) for t, g in growing]
            statistic = ("each allocation that grew device memory (by a granule) is a sample"
                         if n < granule else
                         f"each allocation that grew device memory is a sample: its time per "
                         f"{fmt_size(n)} of the memory it added")
        else:   # no measurable growth (no device memory query): every call past the heap
            events = beyond
            statistic = "allocations past NVSHMEM_SYMMETRIC_SIZE (growth not measurable)"
        ours = bench.fresh_us.get(n)
        if rank == 0 and not ours:   # section 4 did not run: NVSHMEM's growth alone
            run.record("nvshmem_growth", {"bytes": n, "size": fmt_size(n), "statistic": statistic,
                                          "nvshmem_times_us": [_round(t * 1e6) for t in times]},
                       _us(events), "us")
        elif rank == 0:
            run.record("alloc_new_memory_vs_nvshmem_growth", {
                "bytes": n, "size": fmt_size(n), "held_allocations": count,
                "NVSHMEM_SYMMETRIC_SIZE": premapped,
                "statistic": "shmemvm: median fresh malloc (section 4); NVSHMEM4Py: " + statistic,
                "nvshmem_device_growth_per_call_bytes": grown,
                "nvshmem_situation": "nvshmem.core.tensor calls held until past the pre-mapped "
                                     "heap: those past it need new physical memory (CUDA VMM "
                                     "growth), if this NVSHMEM grows its heap at all",
                "nvshmem_times_us": [_round(t * 1e6) for t in times],
                "nvshmem_inside_median_us": _round(median_us(inside)) if inside else None,
                "nvshmem_beyond_median_us": _round(median_us(beyond)),
                "nvshmem_beyond_mean_us": _round(statistics.fmean(beyond) * 1e6),
                "device_used_before_bytes": used_before, "device_used_after_bytes": used_after,
                "device_used_growth_bytes": (used_after - used_before)
                if used_before is not None and used_after is not None else None,
                "nvshmem_slowest_growth_us": _round(max(events) * 1e6),
                "goal": GOALS["fresh_64M"] if n == 64 * MiB else GOALS["new_memory"]},
                ours, "us", NVSHMEM + " allocation past its pre-mapped heap", _us(events),
                "lower")
            if bench.fresh_held_us.get(n) is not None:
                run.record("alloc_new_memory_held_vs_nvshmem_growth", {
                    "bytes": n, "size": fmt_size(n),
                    "statistic": "shmemvm: median fresh malloc made while the previous ones "
                                 "are held (section 4's held_samples_us), as NVSHMEM's growth "
                                 "is measured; NVSHMEM4Py: " + statistic,
                    "goal": GOALS["fresh_64M"] if n == 64 * MiB else GOALS["new_memory"]},
                    bench.fresh_held_us[n], "us",
                    NVSHMEM + " allocation past its pre-mapped heap", _us(events), "lower")
        log(f"{NVSHMEM} {fmt_size(n)} past its heap: slowest {max(beyond) * 1e6:.0f} us, median "
            f"{median_us(beyond):.0f} us (inside: {median_us(inside) if inside else float('nan'):.0f}"
            f" us); device memory grew by {((used_after or 0) - (used_before or 0)) / MiB:.0f} MiB")


def device_used() -> int | None:
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return total - free


# -- the run -------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda", help="cuda (default) or host (shmemvm only)")
    ap.add_argument("--out", default=None, help="the result (default: benchmarks/results/"
                    "gpu-vs-nvshmem4py.json; --backend host: benchmarks/out/...)")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="store into benchmarks/results/ from a tree that differs from its "
                         "commit (recorded in the result)")
    ap.add_argument("--quick", action="store_true", help="few iterations (a check that all runs)")
    ap.add_argument("--heap-size", default=None, help="shmemvm heap (default 4G; host 1G)")
    ap.add_argument("--max-size", default=None,
                    help="largest put / allocation (default 1G; host 64M)")
    ap.add_argument("--max-iters", type=int, default=5000, help="hard cap on every loop")
    ap.add_argument("--deadline", type=float, default=480.0,
                    help="seconds after which a hung run dumps its stacks and exits")
    ap.add_argument("--nvshmem-init", default="mpi", choices=("mpi", "emulated_mpi"),
                    help="NVSHMEM4Py initializer_method (emulated_mpi: a UID broadcast over "
                         "mpi4py, for an NVSHMEM whose MPI bootstrap does not match this MPI)")
    ap.add_argument("--nvshmem-symmetric-size", default=None,
                    help="NVSHMEM_SYMMETRIC_SIZE where the environment does not set it (3G)")
    ap.add_argument("--no-nvshmem", action="store_true", help="measure shmemvm only")
    ap.add_argument("--sections", default="1,2,3,4,5,6", help="which sections to run")
    ap.add_argument("--hold", default=None,
                    help="a shmemvm allocation of this size held for the whole run (e.g. 512M)")
    args = ap.parse_args()
    if n_pes != 2:
        if rank == 0:
            print("bench_vs_nvshmem.py runs on exactly 2 PEs: mpirun -n 2 ...", file=sys.stderr)
        return 2
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    gpu = args.backend == "cuda"
    args.out = args.out or ("benchmarks/results/gpu-vs-nvshmem4py.json" if gpu
                            else f"benchmarks/out/vs-nvshmem-dryrun-{args.backend}.json")
    args.max_size = shmemvm.config.parse_size(args.max_size or ("1G" if gpu else "64M"))
    heap_size = args.heap_size or ("4G" if gpu else "1G")
    # Before nvshmem is imported: its heap, mapped at init, holds section 3's 2 x 1 GiB.
    if "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:
        os.environ["NVSHMEM_SYMMETRIC_SIZE"] = args.nvshmem_symmetric_size or "3G"
    sections = {s.strip() for s in args.sections.split(",")}
    run = Run(args, "vs-nvshmem", "collectives: perf_counter on every PE, the slower PE's "
              "figure, one sample a trial (or a call where params say so); puts: PE 0 times "
              "blocking calls while PE 1 rests; libraries interleaved per trial; every figure "
              "is a median, ratios shmemvm median / NVSHMEM4Py median")
    bench = Bench(args, run)
    bench.fresh_us = {}
    bench.fresh_held_us = {}

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, rank)
    local = node.Get_rank()
    if gpu:
        if not torch.cuda.is_available():
            log("no CUDA device (use --backend host for the shmemvm half on host memory)")
            return 3
        local = local % torch.cuda.device_count()
        torch.cuda.set_device(local)
        torch.cuda.init()
    run.meta = {
        "what": "shmemvm (value) against NVSHMEM4Py (baseline) in the same 2 processes, one "
                "GPU each; ratio = shmemvm / NVSHMEM4Py",
        "backend": args.backend, "heap_size": heap_size, "quick": args.quick,
        "max_size": args.max_size, "max_iters": args.max_iters,
        "devices": comm.allgather(f"cuda:{local}" if gpu else "cpu"), "n_pes": n_pes,
        "nvshmem_env": {k: os.environ.get(k) for k in (
            "NVSHMEM_SYMMETRIC_SIZE", "NVSHMEM_DISABLE_CUDA_VMM", "NVSHMEM_CUMEM_GRANULARITY")},
        "goals": "issue 15, item 4 (params.goal)",
    }
    if gpu:
        run.meta["gpu"] = torch.cuda.get_device_name(local)
    run.dump()

    if gpu and not args.no_nvshmem:
        bench.section("NVSHMEM4Py init", lambda: start_nvshmem(bench, local))
    elif args.no_nvshmem:
        bench.nv_missing = "--no-nvshmem"
    else:
        bench.nv_missing = f"--backend {args.backend} (NVSHMEM4Py needs a GPU)"

    log(f"shmemvm heap: {heap_size}, backend {args.backend}")
    t0 = time.perf_counter()
    bench.heap = SymmetricHeap(comm, heap_size=heap_size, backend=args.backend, timeout=60)
    run.meta["shmemvm_init_s"] = _round(slowest(time.perf_counter() - t0))
    held = bench.heap.malloc(shmemvm.config.parse_size(args.hold)) if args.hold else None
    run.meta["shmemvm_held_bytes"] = held.numel() if held is not None else 0
    try:
        plan = [("1", "cached allocate+free 1 KiB", cached_alloc_free),
                ("2", "blocking put latency", put_latency),
                ("3", "put bandwidth", put_bandwidth),
                ("4", "allocation needing new physical memory", new_memory),
                ("5", "profile of shmemvm's malloc", profile_steps),
                ("6", f"{NVSHMEM} allocation beyond NVSHMEM_SYMMETRIC_SIZE", nvshmem_growth)]
        for key, name, fn in plan:
            if key in sections:
                bench.section(name, lambda fn=fn: fn(bench))
                gc.collect()
    finally:
        try:
            if bench.nv is not None:
                bench.nv.finalize()
        except Exception as exc:  # noqa: BLE001
            bench.error(f"{NVSHMEM} finalize", exc)
        try:
            bench.heap.finalize()
        except Exception as exc:  # noqa: BLE001
            bench.error("shmemvm finalize", exc)
        if rank == 0:
            run.errors.extend(bench.local_errors)
        run.dump()
    faulthandler.cancel_dump_traceback_later()
    if rank == 0:
        print_table(run)
        log(f"wrote {args.out}")
    return 0


def print_table(run: Run) -> None:
    print("\n| name | size | shmemvm (median) | NVSHMEM4Py / baseline (median) | unit | ratio "
          "| goal |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in run.records:
        pr = r["params"]
        print(f"| {r['name']} | {pr.get('size', '')} | {schema.median(r)} | "
              f"{schema.baseline_median(r)} | {r['unit']} | {r['ratio']} | {pr.get('goal', '')} |")
    if run.errors:
        print("errors:", *run.errors, sep="\n  ")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
