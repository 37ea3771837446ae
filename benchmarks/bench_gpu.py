"""GPU benchmark of the symmetric heap between two PEs (two GPUs of one node).

    mpirun -n 2 python benchmarks/bench_gpu.py [--out benchmarks/results/gpu-2xh200.json]
    mpirun -n 2 python benchmarks/bench_gpu.py --backend host --quick   # dry run, no GPU

What it measures, every figure beside a baseline taken in the same run
(interleaved with it where both are copies):

- put / get bandwidth, 4 KiB .. 1 GiB: PE 0 calls the blocking heap.put /
  heap.get against PE 1 while PE 1 rests. Baseline ("raw peer copy"): the same
  bytes copied with `peer.copy_(src)` + stream synchronize, where `peer` is the
  peer's buffer from torch.distributed._symmetric_memory (torch's own VMM
  mapping of the other GPU's memory, the copy engine through NVLink, no
  shmemvm code on the path). Also recorded in params: the same copy pipelined
  (CUDA events around back-to-back copies), put_nbi x N + quiet, a copy
  through heap.ptr() (shmemvm's mapping without the put call), and an
  in-process cuda:0 -> cuda:1 `copy_` (cudaMemcpyPeer semantics) on PE 0.
- small-put / small-get latency, 8 B .. 4 KiB, blocking, per call (median, p99),
  beside the raw peer copy + synchronize of the same bytes.
- collective malloc latency for a cached block and for a fresh segment
  (malloc creates, exports, passes and maps it on every PE), beside the raw
  driver cycle through the backend object (create + map + set_access +
  unmap + release of the same segment size).
- torch.distributed._symmetric_memory empty + rendezvous for the same sizes,
  beside shmemvm's fresh-segment malloc.
- device memory (torch.cuda.mem_get_info) before SymmetricHeap init and after
  finalize(), on each PE's GPU.

PE 0 writes the result (benchmarks/schema.py: every figure's median, min, max,
quartiles and sample count, its baseline's, and the ratio of the medians) to
--out after each phase, so a run cut short still leaves what it measured.
Into benchmarks/results/ only from a clean tree (or with --allow-dirty).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
import traceback

# Before torch.distributed is imported: never NVLink multicast on shared machines.
for _name in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shmemvm  # noqa: E402
from benchmarks import schema  # noqa: E402
from shmemvm import SymmetricHeap  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
comm = MPI.COMM_WORLD
rank, n_pes = comm.Get_rank(), comm.Get_size()
peer = 1 - rank


def fmt_size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _round(x):
    if x is None or not isinstance(x, float) or not math.isfinite(x):
        return x
    return float(f"{x:.5g}")


def log(message: str) -> None:
    if rank == 0:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Run:
    """The result being made (benchmarks/schema.py); PE 0 holds and writes it.

    Made on every PE at the same point: PE 0 checks where args.out lies before
    anything is measured (benchmarks/results/ only from a clean tree, or with
    --allow-dirty), and every PE stops alike if it may not go there."""

    def __init__(self, args, benchmark: str, method: str):
        self.args = args
        self.records: list[dict] = []
        self.meta: dict = {}
        self.errors: list[str] = []
        self.fresh_malloc_us: dict[int, list[float]] = {}   # samples of each size
        program = os.path.relpath(os.path.abspath(sys.argv[0]), schema.ROOT)
        self.result, refused = schema.run_on_pe0(
            comm, sys.argv[0], benchmark, schema.command(n_pes, program, sys.argv[1:]),
            method=method, path=args.out, allow_dirty=getattr(args, "allow_dirty", False))
        if refused:
            raise SystemExit(2)

    def record(self, name, params, samples, unit, baseline_name=None, baseline_samples=None,
               better=None):
        """A measurement of `samples` (in `unit`) beside its baseline's samples,
        measured in the same run; the ratio compares the medians."""
        params = {"n_pes": n_pes, **params}
        if baseline_name is not None and not baseline_samples:
            params["baseline_missing"] = baseline_name   # e.g. why NVSHMEM4Py is not there
        entry = schema.measurement(name, params, unit, samples, baseline_name, baseline_samples,
                                   better)
        self.records.append(entry)
        return entry

    def dump(self):
        if rank != 0:
            return
        result = self.result
        result.settings = {**self.meta, "environment": schema.environment(
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}
        result.measurements = self.records
        result.notes = [f"error: {e}" for e in self.errors]
        result.write()


# -- timing ----------------------------------------------------------------------

def per_call(fn, iters: int, sync) -> float:
    """Seconds per call over `iters` calls, wall clock, synchronized at both ends."""
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def per_call_events(fn, iters: int) -> float:
    """Seconds per call of back-to-back GPU work, timed with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def each_call(fn, iters: int) -> list[float]:
    samples = []
    clock = time.perf_counter
    for _ in range(iters):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return samples


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def rest():
    """The PE that does not measure waits here without spinning a core hard."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)


def rested():
    comm.Ibarrier().Wait()


# -- the run -----------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--out", default=None, help="the result (default: benchmarks/results/"
                    "gpu-2xh200.json; --backend host: benchmarks/out/gpu-dryrun-host.json)")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="store into benchmarks/results/ from a tree that differs from its "
                         "commit (recorded in the result)")
    ap.add_argument("--quick", action="store_true", help="small sizes, few iterations")
    ap.add_argument("--heap-size", default=None)
    ap.add_argument("--max-size", default=None, help="largest put/get size (default 1G)")
    ap.add_argument("--no-torch-symm", action="store_true")
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--master-port", default=os.environ.get("MASTER_PORT", "29531"))
    args = ap.parse_args()
    if n_pes != 2:
        if rank == 0:
            print("bench_gpu.py runs on exactly 2 PEs: mpirun -n 2 ...", file=sys.stderr)
        return 2
    gpu = args.backend == "cuda"
    if args.out is None:
        args.out = ("benchmarks/results/gpu-2xh200.json" if gpu
                    else f"benchmarks/out/gpu-dryrun-{args.backend}.json")
    max_size = shmemvm.config.parse_size(args.max_size or ("4M" if args.quick else "1G"))
    heap_size = args.heap_size or ("64M" if args.quick else "4G")
    trials = args.trials or (2 if args.quick else 5)
    run = Run(args, "gpu", "blocking ops: perf_counter around N calls (each call "
              "synchronizes), one sample a trial, subject and baselines interleaved in every "
              "trial; latency: one sample a call; pipelined (params): CUDA events around N "
              "back-to-back copies; every figure is a median, ratios median over median")

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, rank)
    local_rank = node.Get_rank()
    if gpu:
        if not torch.cuda.is_available():
            log("no CUDA device: nothing to measure (use --backend host for a dry run)")
            return 3
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.cuda.init()
        sync = torch.cuda.current_stream(dev).synchronize
    else:
        dev = torch.device("cpu")
        sync = lambda: None  # noqa: E731
    devices = comm.allgather(str(dev))

    run.meta = {
        "what": "shmemvm SymmetricHeap on 2 PEs, PE 0 -> PE 1 (one GPU each)",
        "backend": args.backend, "heap_size": heap_size, "quick": args.quick,
        "trials": trials, "devices": devices, "n_pes": n_pes,
    }
    if gpu:
        run.meta["gpu"] = torch.cuda.get_device_name(dev)
        run.meta["device_count"] = torch.cuda.device_count()
        try:
            from cuda.bindings import driver
            run.meta["driver_version"] = int(driver.cuDriverGetVersion()[1])
        except Exception:  # noqa: BLE001
            pass

    # -- phase 0: torch.distributed symmetric memory (the raw baseline buffers) --
    symm = None
    if gpu and not args.no_torch_symm:
        try:
            symm = TorchSymm(dev, args.master_port, max_size)
            run.meta["torch_symm_mem_backend"] = symm.backend_name
        except Exception as exc:  # noqa: BLE001 - keep measuring the heap without it
            run.errors.append(f"PE {rank}: torch symmetric memory setup failed: {exc!r}")
            log(traceback.format_exc())
            symm = None
        if not all(comm.allgather(symm is not None)):
            symm = None

    # Local buffers, made before the "before" memory reading.
    src = torch.empty(max_size, dtype=torch.uint8, device=dev)
    src.copy_((torch.arange(max_size, dtype=torch.int64, device=dev) % 251).to(torch.uint8))
    landing = torch.empty(max_size, dtype=torch.uint8, device=dev)
    inproc = None  # PE 0: a buffer on PE 1's GPU, owned by this process
    if gpu and rank == 0 and devices[0] != devices[1]:
        try:
            inproc = torch.empty(max_size, dtype=torch.uint8, device=devices[1])
            inproc.copy_(src)  # enables peer access
            torch.cuda.synchronize(inproc.device)
        except Exception as exc:  # noqa: BLE001
            run.errors.append(f"in-process peer buffer: {exc!r}")
            inproc = None
    if gpu:
        torch.cuda.synchronize()
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    comm.Barrier()
    used_before = device_used(dev) if gpu else None
    comm.Barrier()

    # -- phase 1: the heap ----------------------------------------------------
    log(f"heap init ({heap_size}, backend {args.backend}) on {devices}")
    t0 = time.perf_counter()
    heap = SymmetricHeap(comm, heap_size=heap_size, backend=args.backend, timeout=120)
    init_s = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    run.meta["heap_init_s"] = _round(init_s)
    run.meta["heap"] = {k: v for k, v in heap.heap_info().items() if k in
                        ("backend", "device", "heap_size", "node_pes")}
    assert str(heap.device) == str(dev), (heap.device, dev)
    x = heap.empty((max_size,), torch.uint8)
    if gpu:
        torch.cuda.synchronize()
    comm.Barrier()
    used_during = device_used(dev) if gpu else None

    try:
        bandwidth(run, heap, x, src, landing, symm, inproc, dev, sync, max_size, trials, gpu)
        run.dump()
        correctness(run, heap, x, src, landing, max_size)
        run.dump()
        latency(run, heap, x, src, landing, symm, sync, trials, args.quick)
        run.dump()
        heap.free(x)
        del x
        malloc_latency(run, heap, max_size, args.quick, sync)
        run.dump()
    finally:
        heap.finalize()

    # -- memory after finalize ----------------------------------------------------
    gc.collect()
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    comm.Barrier()  # every PE has unmapped the others' memory
    if gpu:
        used_after = device_used(dev)
        rows = comm.gather((rank, str(dev), used_before, used_during, used_after), root=0)
        if rank == 0:
            for pe, device, before, during, after in rows:
                run.record("device_memory_after_finalize",
                           {"pe": pe, "device": device, "used_with_heap_bytes": during,
                            "delta_bytes": after - before, "heap_size": heap_size},
                           [after], "bytes", "device memory used before SymmetricHeap init",
                           [before], "lower")
                log(f"PE {pe} {device}: used before {before / MiB:.1f} MiB, with heap "
                    f"{during / MiB:.1f} MiB, after finalize {after / MiB:.1f} MiB "
                    f"(delta {(after - before) / MiB:+.2f} MiB)")
        run.dump()

    # -- phase 2: torch symmetric memory allocation latency ------------------------
    if symm is not None:
        try:
            symm_latency(run, symm, args.quick)
        except Exception as exc:  # noqa: BLE001
            run.errors.append(f"PE {rank}: torch symm-mem latency failed: {exc!r}")
            log(traceback.format_exc())
        run.dump()
        symm.close()
    run.dump()
    if rank == 0:
        print_table(run)
        log(f"wrote {args.out}")
    return 0


def device_used(dev) -> int:
    free, total = torch.cuda.mem_get_info(dev)
    return total - free


class TorchSymm:
    """torch.distributed over NCCL (env:// from the MPI rank/size), one symmetric
    buffer of `size` bytes and its peer's view."""

    def __init__(self, dev, port, size):
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem
        self.dist, self.mod, self.dev = dist, symm_mem, dev
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        try:
            symm_mem.set_backend("CUDA")  # torch's own VMM path (not NVSHMEM)
        except Exception as exc:  # noqa: BLE001 - torch 2.11 refuses before init; CUDA is
            log(f"symm_mem.set_backend('CUDA'): {exc!r} (get_backend is recorded)")  # its default
        import datetime
        dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=n_pes,
                                timeout=datetime.timedelta(seconds=120))
        self.group = dist.group.WORLD.group_name  # a name works on every torch version
        try:
            self.backend_name = str(symm_mem.get_backend(dev))
        except Exception:  # noqa: BLE001
            self.backend_name = "unknown"
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            import warnings
            with warnings.catch_warnings():  # deprecated (a no-op) in newer torch
                warnings.simplefilter("ignore", FutureWarning)
                try:
                    symm_mem.enable_symm_mem_for_group(self.group)
                except Exception:  # noqa: BLE001
                    pass
        self.buffer = symm_mem.empty(size, dtype=torch.uint8, device=dev)
        self.handle = symm_mem.rendezvous(self.buffer, self.group)
        self.peer = self.handle.get_buffer(peer, (size,), torch.uint8, 0)
        self.buffer.fill_(rank)
        torch.cuda.synchronize()
        comm.Barrier()
        assert int(self.peer[0]) == peer and int(self.peer[-1]) == peer, "peer view is wrong"
        comm.Barrier()

    def close(self):
        self.peer = self.handle = self.buffer = None
        gc.collect()
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def bandwidth(run, heap, x, src, landing, symm, inproc, dev, sync, max_size, trials, gpu):
    sizes = []
    n = 4 * KiB
    while n <= max_size:
        sizes.append(n)
        n *= 4
    if sizes[-1] != max_size:
        sizes.append(max_size)
    ptr_view = heap.ptr(x, peer)
    if gpu and inproc is not None:
        devs = (dev, inproc.device)

        def sync_both():
            for d in devs:
                torch.cuda.current_stream(d).synchronize()
    for n in sizes:
        iters = max(5 if run.args.quick else 10, min(400, (4 * GiB) // n))
        if run.args.quick:
            iters = min(iters, 50)
        if rank != 0:
            rest()
            continue
        s, xd, ld = src[:n], x[:n], landing[:n]
        pv = ptr_view[:n]
        ops = {
            "put": lambda: heap.put(xd, s, peer),
            "ptr_put": lambda: (pv.copy_(s, non_blocking=True), sync()),
            "get": lambda: heap.get(ld, xd, peer),
            "ptr_get": lambda: (ld.copy_(pv, non_blocking=True), sync()),
        }
        nbi = (lambda k: (lambda: ([heap.put_nbi(xd, s, peer) for _ in range(k)], heap.quiet())))
        if symm is not None:
            sp = symm.peer[:n]
            ops["raw_put"] = lambda: (sp.copy_(s, non_blocking=True), sync())
            ops["raw_get"] = lambda: (ld.copy_(sp, non_blocking=True), sync())
        if inproc is not None:
            ip = inproc[:n]
            ops["inproc_put"] = lambda: (ip.copy_(s, non_blocking=True), sync_both())
            ops["inproc_get"] = lambda: (ld.copy_(ip, non_blocking=True), sync_both())
        piped = {}
        if gpu:
            piped["put_nbi_piped"] = None  # timed as a whole below
            if symm is not None:
                piped["raw_put_piped"] = lambda: sp.copy_(s, non_blocking=True)
                piped["raw_get_piped"] = lambda: ld.copy_(sp, non_blocking=True)
            piped["ptr_put_piped"] = lambda: pv.copy_(s, non_blocking=True)
        for fn in ops.values():  # warm up
            for _ in range(3):
                fn()
        for name, fn in piped.items():
            if fn is not None:
                for _ in range(3):
                    fn()
        nbi(3)()
        sync()
        samples = {name: [] for name in list(ops) + list(piped)}
        for _ in range(trials):
            for name, fn in ops.items():
                samples[name].append(per_call(fn, iters, sync))
            for name, fn in piped.items():
                if name == "put_nbi_piped":
                    samples[name].append(per_call(nbi(iters), 1, sync) / iters)
                else:
                    samples[name].append(per_call_events(fn, iters))
        med = {name: statistics.median(v) for name, v in samples.items() if v}
        gbps = {name: n / t / 1e9 for name, t in med.items()}
        trial_gbps = {name: [n / t / 1e9 for t in v] for name, v in samples.items() if v}
        for op in ("put", "get"):
            if f"raw_{op}" in gbps:
                base_name, base = ("raw peer copy: copy_ through a torch.distributed."
                                   "_symmetric_memory peer buffer + stream synchronize"), \
                    trial_gbps[f"raw_{op}"]
            elif f"inproc_{op}" in gbps:
                base_name, base = ("in-process cuda:0<->cuda:1 copy_ (cudaMemcpyPeer semantics) "
                                   "+ synchronize"), trial_gbps[f"inproc_{op}"]
            else:
                base_name, base = ("copy_ through heap.ptr() (the same mapping, no put call) "
                                   "+ synchronize"), trial_gbps[f"ptr_{op}"]
            params = {"bytes": n, "size": fmt_size(n), "direction": "PE 0 -> PE 1" if op == "put"
                      else "PE 1 -> PE 0", "blocking": True, "iterations": iters,
                      "trials": trials}
            for key, value in gbps.items():
                if key != op and op in key.split("_"):
                    params[f"{key}_GBps"] = _round(value)
            params["us_per_call"] = _round(med[op] * 1e6)
            run.record(f"{op}_bandwidth", params, trial_gbps[op], "GB/s", base_name, base,
                       "higher")
        log(f"{fmt_size(n):>8}: " + "  ".join(f"{k} {v:7.1f}" for k, v in gbps.items()) + " GB/s")
        rested()


def correctness(run, heap, x, src, landing, max_size):
    """A full-size put PE 0 -> PE 1 and get back, checked byte for byte."""
    x.zero_()
    heap.barrier_all()
    if rank == 0:
        heap.put(x, src, peer)
    heap.barrier_all()
    put_ok = bool(torch.equal(x, src)) if rank == 1 else True
    heap.barrier_all()
    landing.zero_()
    if rank == 0:
        heap.get(landing, x, peer)
    get_ok = bool(torch.equal(landing, src)) if rank == 0 else True
    ok = comm.allreduce(put_ok and get_ok, op=MPI.LAND)
    run.meta["correctness"] = {"bytes": max_size, "put_then_get_identical": ok}
    if not ok:
        run.errors.append(f"put/get of {max_size} bytes did not arrive intact")
    log(f"correctness of a {fmt_size(max_size)} put + get: {ok}")


def latency(run, heap, x, src, landing, symm, sync, trials, quick):
    iters = 200 if quick else 3000
    for n in (8, 64, 512, 4 * KiB):
        if rank != 0:
            rest()
            continue
        s, xd, ld = src[:n], x[:n], landing[:n]
        pv = heap.ptr(x, peer)[:n]
        ops = {"put": lambda: heap.put(xd, s, peer), "get": lambda: heap.get(ld, xd, peer),
               "ptr_put": lambda: (pv.copy_(s, non_blocking=True), sync())}
        if symm is not None:
            sp = symm.peer[:n]
            ops["raw_put"] = lambda: (sp.copy_(s, non_blocking=True), sync())
            ops["raw_get"] = lambda: (ld.copy_(sp, non_blocking=True), sync())
        samples = {name: [] for name in ops}
        for fn in ops.values():
            for _ in range(50):
                fn()
        chunk = max(1, iters // trials)
        for _ in range(trials):  # interleaved chunks
            for name, fn in ops.items():
                samples[name].extend(each_call(fn, chunk))
        us = {name: statistics.median(v) * 1e6 for name, v in samples.items()}
        p99 = {name: p(v, 0.99) * 1e6 for name, v in samples.items()}
        per_call_us = {name: [t * 1e6 for t in v] for name, v in samples.items()}
        for op in ("put", "get"):
            if f"raw_{op}" in us:
                base_name, base = ("raw peer copy (copy_ through a torch symm-mem peer buffer) "
                                   "+ stream synchronize"), per_call_us[f"raw_{op}"]
            elif op == "put":
                base_name, base = ("copy_ through heap.ptr() + synchronize",
                                   per_call_us["ptr_put"])
            else:
                base_name, base = None, None
            params = {"bytes": n, "blocking": True, "calls": len(samples[op]),
                      "statistic": "median per call", "p99_us": _round(p99[op])}
            for key in us:
                if key != op:
                    params[f"{key}_us"] = _round(us[key])
            run.record(f"{op}_latency", params, per_call_us[op], "us", base_name, base, "lower")
        log(f"latency {n:>5} B: " + "  ".join(f"{k} {v:6.1f}" for k, v in us.items()) + " us")
        rested()


def malloc_latency(run, heap, max_size, quick, sync):
    """Collective malloc of a cached block and of a fresh segment, beside the raw
    driver cycle through the backend object."""
    be = heap.backend
    g = be.granularity
    sizes = [4 * KiB, 2 * MiB, 64 * MiB, 1 * GiB] if not quick else [4 * KiB, 2 * MiB, 8 * MiB]
    sizes = [n for n in sizes if n <= max(max_size, g)]
    heap.trim()
    for n in sizes:
        segment = max(g, 1 << (n - 1).bit_length())
        cached_iters = 10 if quick else 30
        fresh_iters = 3 if quick or n >= GiB else 6
        # cached: the segment stays mapped after free, so malloc only agrees
        t = heap.malloc(n)
        heap.free(t)
        cached = []
        for _ in range(cached_iters):
            comm.Barrier()
            before = heap._core.local.stats()["segments"]
            t0 = time.perf_counter()
            t = heap.malloc(n)
            cached.append(time.perf_counter() - t0)
            assert heap._core.local.stats()["segments"] == before, "cached malloc created a segment"
            heap.free(t)
        # fresh: trim() releases the cached segment on every PE, so malloc creates,
        # exports, passes and maps a new one
        fresh = []
        for _ in range(fresh_iters):
            heap.trim()
            comm.Barrier()
            before = heap._core.local.stats()["segments"]
            t0 = time.perf_counter()
            t = heap.malloc(n)
            fresh.append(time.perf_counter() - t0)
            assert heap._core.local.stats()["segments"] == before + 1, "fresh malloc made no segment"
            heap.free(t)
        heap.trim()
        # raw driver cycle of the same segment size, through the backend object
        va = be.reserve(segment, g)
        raw, make, export, undo = [], [], [], []
        try:
            for _ in range(fresh_iters + 1):
                t0 = time.perf_counter()
                h = be.create(segment)
                be.map(va, segment, h)
                be.set_access(va, segment)
                t1 = time.perf_counter()
                fd = be.export_fd(h)
                os.close(fd)
                t2 = time.perf_counter()
                be.unmap(va, segment)
                be.release(h)
                t3 = time.perf_counter()
                make.append(t1 - t0)
                export.append(t2 - t1)
                undo.append(t3 - t2)
                raw.append((t1 - t0) + (t3 - t2))
        finally:
            be.unreserve(va, segment)
        raw, make, export, undo = raw[1:], make[1:], export[1:], undo[1:]  # first: warm-up
        # every PE's medians; report PE 0's and the slowest PE's
        mine = {"cached": statistics.median(cached[1:]) * 1e6, "fresh": statistics.median(fresh) * 1e6,
                "raw": statistics.median(raw) * 1e6, "make": statistics.median(make) * 1e6,
                "undo": statistics.median(undo) * 1e6, "export": statistics.median(export) * 1e6}
        everyone = comm.gather(mine, root=0)
        if rank == 0:
            slowest = {k: max(e[k] for e in everyone) for k in mine}
            raw_name = (f"raw driver cycle via the backend object: create+map+set_access+"
                        f"unmap+release of {fmt_size(segment)} ({be.name})")
            common = {"bytes": n, "size": fmt_size(n), "segment_bytes": segment,
                      "raw_create_map_access_us": _round(mine["make"]),
                      "raw_unmap_release_us": _round(mine["undo"]),
                      "raw_export_fd_us": _round(mine["export"])}
            run.record("malloc_latency_cached", {**common, "calls": len(cached) - 1,
                       "slowest_pe_us": _round(slowest["cached"]), "statistic": "median, PE 0"},
                       _us(cached[1:]), "us", raw_name, _us(raw), "lower")
            run.record("malloc_latency_fresh_segment", {**common, "calls": len(fresh),
                       "slowest_pe_us": _round(slowest["fresh"]), "statistic": "median, PE 0",
                       "includes": "create+map+set_access, export fd, SCM_RIGHTS pass, peer "
                                   "import+map+set_access, 2-3 allreduces"},
                       _us(fresh), "us", raw_name, _us(raw), "lower")
            run.fresh_malloc_us[n] = _us(fresh)
            log(f"malloc {fmt_size(n):>8}: cached {mine['cached']:8.1f} us, fresh "
                f"{mine['fresh']:9.1f} us, raw driver {mine['raw']:8.1f} us "
                f"(make {mine['make']:.1f}, undo {mine['undo']:.1f}, export {mine['export']:.1f})")


def _us(seconds: list[float]) -> list[float]:
    return [t * 1e6 for t in seconds]


def symm_latency(run, symm, quick):
    mod, group = symm.mod, symm.group
    sizes = [4 * KiB, 2 * MiB, 64 * MiB, 1 * GiB] if not quick else [4 * KiB, 2 * MiB]
    fresh = run.fresh_malloc_us
    for n in sizes:
        iters = 3 if n >= GiB else 6
        empty_t, rdv_t, total = [], [], []
        for i in range(iters + 1):
            comm.Barrier()
            t0 = time.perf_counter()
            t = mod.empty(n, dtype=torch.uint8, device=symm.dev)
            t1 = time.perf_counter()
            h = mod.rendezvous(t, group)
            t2 = time.perf_counter()
            if i:  # the first is a warm-up
                empty_t.append(t1 - t0)
                rdv_t.append(t2 - t1)
                total.append(t2 - t0)
            del h, t
            torch.cuda.synchronize()
            gc.collect()
        med = statistics.median(total) * 1e6
        slowest = comm.allreduce(med, op=MPI.MAX)
        if rank == 0:
            base = fresh.get(n)   # shmemvm's fresh-malloc samples of this size (PE 0)
            run.record("torch_symm_mem_empty_rendezvous_latency",
                       {"bytes": n, "size": fmt_size(n), "calls": len(total),
                        "empty_us": _round(statistics.median(empty_t) * 1e6),
                        "rendezvous_us": _round(statistics.median(rdv_t) * 1e6),
                        "slowest_pe_us": _round(slowest), "symm_mem_backend": symm.backend_name,
                        "statistic": "median, PE 0"},
                       [t * 1e6 for t in total], "us",
                       "shmemvm collective malloc of a fresh segment (same size)", base, "lower")
            log(f"torch symm-mem {fmt_size(n):>8}: empty+rendezvous {med:9.1f} us "
                f"(shmemvm fresh malloc "
                f"{statistics.median(base) if base else float('nan'):9.1f} us)")


def print_table(run):
    rows = run.records
    print("\n| name | params | median | unit | baseline median | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        pr = r["params"]
        key = pr.get("size") or (f"{pr['bytes']} B" if "bytes" in pr else f"PE {pr.get('pe')}")
        print(f"| {r['name']} | {key} | {schema.median(r)} | {r['unit']} | "
              f"{schema.baseline_median(r)} | {r['ratio']} |")
    if run.errors:
        print("errors:", *run.errors, sep="\n  ")


if __name__ == "__main__":
    sys.exit(main())
