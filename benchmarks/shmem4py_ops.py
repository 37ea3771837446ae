"""The operations of issue 24's host comparison, written once against shmem4py's API.

    python benchmarks/shmem4py_ops.py --impl oshmem|shmemvm|torch --out PREFIX [options]

`--impl oshmem` imports the real `shmem4py` (run it under Open MPI's oshrun),
`--impl shmemvm` imports `shmemvm.shmem` in its place (under MPICH's mpirun),
and the same functions below run on either: only the import differs.
`--impl torch` runs shmemvm's torch API equivalents of the same operations
(TorchOps), for the other face of shmemvm.

Each PE writes PREFIX.pe<N>.json with its raw samples (seconds per call, one
sample per timed loop) for every operation, and beside them its same-run
baselines: a local np.copyto of the same bytes (put/get), and, where mpi4py
is there (not under OSHMEM), MPI.Barrier, Bcast, Allgather, Alltoall and
Allreduce. --rows goal measures issue 30's rows alone (the collectives,
malloc + free, atomic_fetch_add, put 8 B, put 1 MiB). This file needs
only NumPy and the implementation under test: benchmarks/host_vs_oshmem.py
launches it, alternates the implementations and writes the one result.

How each operation is timed:
  - one-sided operations (put, get, atomics): PE 0 calls them on PE 1 while
    every other PE is idle in barrier_all (the peer does nothing to help);
  - collectives (barrier_all, sync_all, broadcast, fcollect and alltoall of
    8 bytes, malloc + free, sum reduce): every PE runs the same number of calls;
    the driver takes the slowest PE's time per repeat;
  - each repeat is one loop of at least --min-time seconds (the count is
    PE 0's, broadcast), operation and baseline taking turns every repeat.
Every operation is checked once for its result (a broken path must not pass
for a fast one); "verified" in the output says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time

import numpy as np

KiB, MiB = 1 << 10, 1 << 20
SIZES = (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB)
clock = time.perf_counter


def loop(fn, iters: int) -> float:
    """Seconds per call of fn over iters calls."""
    start = clock()
    for _ in range(iters):
        fn()
    return (clock() - start) / iters


def count_for(fn, min_time: float, cap: int) -> int:
    """Calls of fn (already warm) that take about min_time seconds."""
    n = 1
    while True:
        elapsed = loop(fn, n) * n
        if elapsed >= min(min_time, 0.002) or n >= cap:
            return max(1, min(cap, int(min_time / max(elapsed / n, 1e-9))))
        n *= 4


class ShmemOps:
    """The operations, through a module with shmem4py's API (shmem4py.shmem or shmemvm.shmem)."""

    face = "shmem4py API"

    def __init__(self, shmem):
        self.shmem = shmem
        self.me, self.n = shmem.my_pe(), shmem.n_pes()
        self.peer = 1 % self.n
        self.src = np.arange(max(SIZES), dtype=np.uint8) % 251
        self.dst = shmem.zeros(max(SIZES), dtype=np.uint8)           # symmetric
        self.local = np.zeros(max(SIZES), dtype=np.uint8)
        self.counter = shmem.zeros(1, dtype=np.int64)
        self.red_src = shmem.zeros(64 * KiB, dtype=np.float64)
        self.red_dst = shmem.zeros(64 * KiB, dtype=np.float64)
        self.red_src[:] = self.me + 1
        self.iters = shmem.zeros(1, dtype=np.int64)
        self.iters_root = shmem.zeros(1, dtype=np.int64)
        self._small_collectives(shmem.zeros)
        shmem.barrier_all()

    def _small_collectives(self, zeros) -> None:
        """The operands of the 8-byte collectives (one int64 a PE, or a PE pair)."""
        n, me = self.n, self.me
        self.bcast_src, self.bcast_dst = zeros(1, dtype=np.int64), zeros(1, dtype=np.int64)
        self.bcast_src[0] = 42 + me
        self.fc_src, self.fc_dst = zeros(1, dtype=np.int64), zeros(n, dtype=np.int64)
        self.fc_src[0] = 100 + me
        self.a2a_src, self.a2a_dst = zeros(n, dtype=np.int64), zeros(n, dtype=np.int64)
        for pe in range(n):   # element by element: a NumPy array or a torch tensor
            self.a2a_src[pe] = me * n + pe
        self.col_dst = zeros(n, dtype=np.int64)
        self.red8_src, self.red8_dst = zeros(1, dtype=np.float64), zeros(1, dtype=np.float64)
        self.red8_src[0] = me + 1
        self.team = self._split()

    def _split(self):
        """A team of every PE split from the world (its own agreement: a team row)."""
        return self.shmem.TEAM_WORLD.split_strided(0, 1, self.n)

    def barrier(self):
        return self.shmem.barrier_all

    def agree(self, value: int) -> int:
        """PE 0's value on every PE (collective)."""
        self.iters_root[0] = value
        self.shmem.broadcast(self.iters, self.iters_root, 0)
        self.shmem.barrier_all()
        return int(self.iters[0])

    def put(self, nbytes: int, quiet: bool):
        shmem, dst, src, pe = self.shmem, self.dst[:nbytes], self.src[:nbytes], self.peer
        if quiet:
            def op():
                shmem.put(dst, src, pe)
                shmem.quiet()
            return op
        return lambda: shmem.put(dst, src, pe)

    def get(self, nbytes: int):
        shmem, local, dst, pe = self.shmem, self.local[:nbytes], self.dst[:nbytes], self.peer
        return lambda: shmem.get(local, dst, pe)

    def atomic_fetch_add(self):
        shmem, counter, pe = self.shmem, self.counter, self.peer
        return lambda: shmem.atomic_fetch_add(counter, 1, pe)

    def atomic_add(self):
        shmem, counter, pe = self.shmem, self.counter, self.peer
        return lambda: shmem.atomic_add(counter, 1, pe)

    def malloc_free(self, nbytes: int):
        shmem = self.shmem
        return lambda: shmem.free(shmem.alloc(nbytes, clear=False))

    def sum_reduce(self, count: int):
        shmem, dst, src = self.shmem, self.red_dst[:count], self.red_src[:count]
        return lambda: shmem.sum_reduce(dst, src)

    def sync_all(self):
        return self.shmem.sync_all

    def broadcast(self):
        shmem, dst, src = self.shmem, self.bcast_dst, self.bcast_src
        return lambda: shmem.broadcast(dst, src, 0)

    def fcollect(self):
        shmem, dst, src = self.shmem, self.fc_dst, self.fc_src
        return lambda: shmem.fcollect(dst, src)

    def alltoall(self):
        shmem, dst, src = self.shmem, self.a2a_dst, self.a2a_src
        return lambda: shmem.alltoall(dst, src)

    def collect(self):
        shmem, dst, src = self.shmem, self.col_dst, self.fc_src
        return lambda: shmem.collect(dst, src)

    def team_sync(self):
        shmem, team = self.shmem, self.team
        return lambda: shmem.sync(team)

    def team_sum_reduce(self):
        shmem, dst, src, team = self.shmem, self.red8_dst, self.red8_src, self.team
        return lambda: shmem.sum_reduce(dst, src, team=team)

    # -- the results, checked once -------------------------------------------------------
    def counter_value(self) -> int:
        return int(self.counter[0])

    def reset_counter(self) -> None:
        self.counter[0] = 0
        self.shmem.barrier_all()

    def landed(self, nbytes: int) -> bool:
        return bool(np.array_equal(self.dst[:nbytes], self.src[:nbytes]))

    def got(self, nbytes: int) -> bool:
        return bool(np.array_equal(self.local[:nbytes], self.src[:nbytes]))

    def reduced(self, count: int) -> bool:
        expected = self.n * (self.n + 1) / 2
        return bool(np.all(self.red_dst[:count] == expected))

    def small_collected(self, what: str) -> bool | None:
        """Whether the 8-byte collective `what` left the right values here (the root's
        own destination of a broadcast is not checked: OpenSHMEM 1.4 leaves it)."""
        n, me = self.n, self.me
        if what == "broadcast":
            return None if me == 0 else int(self.bcast_dst[0]) == 42
        if what == "fcollect":
            return [int(x) for x in self.fc_dst] == [100 + pe for pe in range(n)]
        if what == "collect":
            return [int(x) for x in self.col_dst] == [100 + pe for pe in range(n)]
        if what == "team sum_reduce":
            return float(self.red8_dst[0]) == n * (n + 1) / 2
        return [int(x) for x in self.a2a_dst] == [pe * n + me for pe in range(n)]

    def finalize(self) -> None:
        self.shmem.barrier_all()


class TorchOps(ShmemOps):
    """The same operations through shmemvm's torch API (module functions, one heap)."""

    face = "torch API"

    def __init__(self, shmemvm, torch):
        self.sv, self.torch = shmemvm, torch
        shmemvm.init()
        self.me, self.n = shmemvm.my_pe(), shmemvm.n_pes()
        self.peer = 1 % self.n
        self.src = (torch.arange(max(SIZES), dtype=torch.int64) % 251).to(torch.uint8)
        self.dst = shmemvm.zeros(max(SIZES), torch.uint8)
        self.local = torch.zeros(max(SIZES), dtype=torch.uint8)
        self.counter = shmemvm.zeros(1, torch.int64)
        self.red_src = shmemvm.zeros(64 * KiB, torch.float64)
        self.red_dst = shmemvm.zeros(64 * KiB, torch.float64)
        self.red_src.fill_(self.me + 1)
        self.iters = shmemvm.zeros(1, torch.int64)
        self._small_collectives(lambda count, dtype: shmemvm.zeros(
            count, torch.float64 if dtype == np.float64 else torch.int64))
        shmemvm.barrier_all()

    def barrier(self):
        return self.sv.barrier_all

    def agree(self, value: int) -> int:
        sv = self.sv
        self.iters[0] = value if self.me == 0 else 0
        sv.barrier_all()
        if self.me != 0:
            sv.get(self.iters, self.iters, 0)
        sv.barrier_all()
        return int(self.iters[0])

    def put(self, nbytes: int, quiet: bool):
        sv, dst, src, pe = self.sv, self.dst[:nbytes], self.src[:nbytes], self.peer
        if quiet:
            def op():
                sv.put(dst, src, pe)
                sv.quiet()
            return op
        return lambda: sv.put(dst, src, pe)

    def get(self, nbytes: int):
        sv, local, dst, pe = self.sv, self.local[:nbytes], self.dst[:nbytes], self.peer
        return lambda: sv.get(local, dst, pe)

    def atomic_fetch_add(self):
        sv, counter, pe = self.sv, self.counter, self.peer
        return lambda: sv.atomic_fetch_add(counter, 1, pe)

    def atomic_add(self):
        sv, counter, pe = self.sv, self.counter, self.peer
        return lambda: sv.atomic_add(counter, 1, pe)

    def malloc_free(self, nbytes: int):
        sv = self.sv
        return lambda: sv.free(sv.malloc(nbytes))

    def sum_reduce(self, count: int):
        sv, dst, src = self.sv, self.red_dst[:count], self.red_src[:count]
        return lambda: sv.reduce(dst, src, "sum")

    def sync_all(self):
        return self.sv.sync_all

    def broadcast(self):
        sv, dst, src = self.sv, self.bcast_dst, self.bcast_src
        return lambda: sv.broadcast(dst, src, 0)

    def fcollect(self):
        sv, dst, src = self.sv, self.fc_dst, self.fc_src
        return lambda: sv.fcollect(dst, src)

    def alltoall(self):
        sv, dst, src = self.sv, self.a2a_dst, self.a2a_src
        return lambda: sv.alltoall(dst, src)

    def _split(self):
        sv = self.sv
        return sv.team_split_strided(sv.team_world(), 0, 1, self.n)

    def collect(self):
        sv, dst, src = self.sv, self.col_dst, self.fc_src
        return lambda: sv.collect(dst, src)

    def team_sync(self):
        sv, team = self.sv, self.team
        return lambda: sv.team_sync(team)

    def team_sum_reduce(self):
        sv, dst, src, team = self.sv, self.red8_dst, self.red8_src, self.team
        return lambda: sv.reduce(dst, src, "sum", team=team)

    def counter_value(self) -> int:
        return int(self.counter[0])

    def reset_counter(self) -> None:
        self.counter.zero_()
        self.sv.barrier_all()

    def landed(self, nbytes: int) -> bool:
        return bool(self.torch.equal(self.dst[:nbytes], self.src[:nbytes]))

    def got(self, nbytes: int) -> bool:
        return bool(self.torch.equal(self.local[:nbytes], self.src[:nbytes]))

    def reduced(self, count: int) -> bool:
        return bool((self.red_dst[:count] == self.n * (self.n + 1) / 2).all())

    def finalize(self) -> None:
        self.sv.barrier_all()
        self.sv.finalize()


class Measure:
    """Timed loops of the operations on every PE; PE 0's samples, or every PE's."""

    def __init__(self, ops, repeat: int, min_time: float, mpi_comm):
        self.ops, self.repeat, self.min_time, self.comm = ops, repeat, min_time, mpi_comm
        self.results: dict[str, dict] = {}
        self.local_src = np.arange(max(SIZES), dtype=np.uint8) % 251
        self.local_dst = np.zeros(max(SIZES), dtype=np.uint8)

    def one_sided(self, key: str, fn, nbytes: int, baseline=None, cap: int = 1 << 20):
        """fn on PE 0 (towards PE 1) while the other PEs wait in barrier_all."""
        ops, barrier = self.ops, self.ops.barrier()
        samples, base = [], []
        iters = base_iters = 0
        barrier()
        if ops.me == 0:
            for _ in range(3):
                fn()
            iters = count_for(fn, self.min_time, cap)
            if baseline is not None:
                baseline[1]()
                base_iters = count_for(baseline[1], self.min_time, cap)
            gc.collect()
            for _ in range(self.repeat):
                samples.append(loop(fn, iters))
                if baseline is not None:
                    base.append(loop(baseline[1], base_iters))
        barrier()   # the other PEs were here all along: idle in a barrier
        self.results[key] = {"kind": "one-sided", "bytes": nbytes, "iters": iters,
                             "samples_s": samples,
                             "baseline": {"name": baseline[0], "iters": base_iters,
                                          "samples_s": base} if baseline else None}

    def collective(self, key: str, fn, nbytes: int, baseline=None, cap: int = 1 << 16):
        """fn on every PE, the same count everywhere (PE 0's calibration)."""
        ops = self.ops
        iters = self._calibrate_together(fn, cap)
        base_iters = self._calibrate_together(baseline[1], cap) if baseline is not None else 0
        samples, base = [], []
        gc.collect()
        for _ in range(self.repeat):
            ops.barrier()()
            samples.append(loop(fn, iters))
            if baseline is not None:
                ops.barrier()()
                base.append(loop(baseline[1], base_iters))
        ops.barrier()()
        self.results[key] = {"kind": "collective", "bytes": nbytes, "iters": iters,
                             "samples_s": samples,
                             "baseline": {"name": baseline[0], "iters": base_iters,
                                          "samples_s": base} if baseline else None}

    def _calibrate_together(self, fn, cap: int) -> int:
        """Calls of the collective fn that take about min_time on PE 0, agreed: every
        PE makes every call (a collective cannot be timed on one PE alone)."""
        for _ in range(3):
            fn()
        self.ops.barrier()()
        per_call = loop(fn, 10)
        return self.ops.agree(max(1, min(cap, int(self.min_time / max(per_call, 1e-9))))
                              if self.ops.me == 0 else 0)

    def copy(self, nbytes: int):
        dst, src = self.local_dst[:nbytes], self.local_src[:nbytes]
        return ("np.copyto (local, same bytes)", lambda: np.copyto(dst, src))

    def mpi(self, what: str, count: int = 0):
        """The same-run MPI baseline of `what` (None under OSHMEM: no mpi4py there)."""
        if self.comm is None:
            return None
        comm = self.comm
        if what == "barrier":
            return ("MPI.Barrier (mpi4py, COMM_WORLD)", comm.Barrier)
        from mpi4py import MPI
        n, me = comm.Get_size(), comm.Get_rank()
        if what == "bcast":
            one = np.zeros(1, dtype=np.int64)
            return ("MPI Bcast (mpi4py, 1 int64)", lambda: comm.Bcast(one, root=0))
        if what == "allgather":
            one, all_ = np.full(1, me, dtype=np.int64), np.zeros(n, dtype=np.int64)
            return ("MPI Allgather (mpi4py, 1 int64 a PE)", lambda: comm.Allgather(one, all_))
        if what == "alltoall":
            src, dst = np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
            return ("MPI Alltoall (mpi4py, 1 int64 a pair)", lambda: comm.Alltoall(src, dst))
        src = np.full(count, me + 1, dtype=np.float64)
        dst = np.zeros(count, dtype=np.float64)
        return (f"MPI Allreduce SUM (mpi4py, {count} float64)",
                lambda: comm.Allreduce(src, dst, op=MPI.SUM))

    def run(self, quick: bool, rows: str = "all") -> dict:
        """Every operation (rows "all"), or issue 30's rows alone ("goal": the
        collectives, malloc + free, atomic_fetch_add, put 8 B and put 1 MiB)."""
        ops = self.ops
        goal = rows == "goal"
        checks = {}
        self.collective("barrier_all", ops.barrier(), 0, self.mpi("barrier"))
        self.collective("sync_all", ops.sync_all(), 0, self.mpi("barrier"))
        for what, base in (("broadcast", "bcast"), ("fcollect", "allgather"),
                           ("alltoall", "alltoall")):
            self.collective(f"{what} 8 B", getattr(ops, what)(), 8, self.mpi(base))
            ops.barrier()()
            checks[what] = ops.small_collected(what)
        if not goal:   # (rows beyond issue 30's: collect, a split team's sync and reduce)
            self.collective("collect 8 B", ops.collect(), 8, self.mpi("allgather"))
            ops.barrier()()
            checks["collect"] = ops.small_collected("collect")
            self.collective("team sync", ops.team_sync(), 0, self.mpi("barrier"))
            self.collective("team sum_reduce 1 float64", ops.team_sum_reduce(), 8,
                            self.mpi("allreduce", 1))
            ops.barrier()()
            checks["team sum_reduce"] = ops.small_collected("team sum_reduce")
        self.one_sided("put 8 B", ops.put(8, quiet=False), 8, self.copy(8))
        if not goal:
            self.one_sided("put 8 B + quiet", ops.put(8, quiet=True), 8, self.copy(8))
            self.one_sided("get 8 B", ops.get(8), 8, self.copy(8))
        sizes = (1 * MiB,) if goal else SIZES[::2] if quick else SIZES
        for nbytes in sizes:
            self.one_sided(f"put {nbytes} B + quiet", ops.put(nbytes, quiet=True), nbytes,
                           self.copy(nbytes), cap=4096)
            if not goal:
                self.one_sided(f"get {nbytes} B", ops.get(nbytes), nbytes, self.copy(nbytes),
                               cap=4096)
        ops.barrier()()
        checks["put"] = ops.landed(max(sizes)) if ops.me == ops.peer else None
        if not goal:
            checks["get"] = ops.got(max(sizes)) if ops.me == 0 else None
        for name in ("atomic_fetch_add",) if goal else ("atomic_fetch_add", "atomic_add"):
            ops.reset_counter()
            self.one_sided(name, getattr(ops, name)(), 8)
            ops.barrier()()
            # every timed call landed (warm-up and calibration add a varying number more)
            timed = self.results[name]["iters"] * self.repeat if ops.me == 0 else 0
            checks[name] = ops.agree(timed) <= ops.counter_value() if ops.me == ops.peer \
                else ops.agree(timed) >= 0
        self.collective("malloc+free 1 KiB", ops.malloc_free(KiB), KiB, self.mpi("barrier"))
        for count in (1, 64 * KiB):
            self.collective(f"sum_reduce {count} float64", ops.sum_reduce(count), 8 * count,
                            self.mpi("allreduce", count))
            checks[f"sum_reduce {count}"] = ops.reduced(count)
        return checks


def _versions(impl: str) -> dict:
    found = {"python": platform.python_version(), "numpy": np.__version__}
    if impl == "oshmem":
        import shmem4py
        from shmem4py import shmem
        found["shmem4py"] = shmem4py.__version__
        version = ".".join(map(str, shmem.info_get_version()))
        found["openshmem"] = f"{shmem.info_get_name()} (OpenSHMEM {version})"
    else:
        import mpi4py
        import torch
        from mpi4py import MPI

        import shmemvm
        found.update(shmemvm=shmemvm.__version__, torch=torch.__version__,
                     mpi4py=mpi4py.__version__,
                     mpi=" ".join(MPI.Get_library_version().strip("\x00 \n")
                                  .splitlines()[0].split()))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", required=True, choices=("oshmem", "shmemvm", "torch"))
    ap.add_argument("--out", required=True, help="PREFIX: each PE writes PREFIX.pe<N>.json")
    ap.add_argument("--repeat", type=int, default=5, help="timed loops per operation")
    ap.add_argument("--min-time", type=float, default=0.02, help="seconds per timed loop")
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    ap.add_argument("--rows", choices=("all", "goal"), default="all",
                    help="every operation, or issue 30's rows alone (goal)")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    started = clock()
    comm = None
    if args.impl == "oshmem":
        from shmem4py import shmem
        ops = ShmemOps(shmem)
    elif args.impl == "shmemvm":
        from mpi4py import MPI

        from shmemvm import shmem
        ops, comm = ShmemOps(shmem), MPI.COMM_WORLD
    else:
        import torch
        from mpi4py import MPI

        import shmemvm
        ops, comm = TorchOps(shmemvm, torch), MPI.COMM_WORLD
    if ops.n < 2:
        print("shmem4py_ops.py needs at least 2 PEs", file=sys.stderr)
        return 2
    measure = Measure(ops, args.repeat, args.min_time, comm)
    checks = measure.run(args.quick, args.rows)
    module = sys.modules["shmem4py" if args.impl == "oshmem" else "shmemvm"]
    paths = None
    if args.impl != "oshmem":   # which of shmemvm's paths ran (benchmarks/schema.py)
        from benchmarks.schema import heap_paths
        paths = heap_paths(sys.modules["shmemvm"].current_heap())
    out = {"impl": args.impl, "face": ops.face, "pe": ops.me, "n_pes": ops.n,
           "module": os.path.dirname(os.path.abspath(module.__file__)),
           "load_start": [round(x, 2) for x in load_start],
           "load_end": [round(x, 2) for x in os.getloadavg()],
           "elapsed_s": round(clock() - started, 2), "repeat": args.repeat,
           "min_time_s": args.min_time, "versions": _versions(args.impl),
           "environment": {k: v for k, v in sorted(os.environ.items())
                           if k.startswith(("SHMEMVM_", "UCX_", "MPIR_CVAR_", "OMPI_MCA_"))},
           "paths": paths, "checks": checks, "ops": measure.results}
    # whole or not at all: the driver takes a launch's results once every PE's file is
    # there, also where the launcher then aborts or hangs at exit (OSHMEM at 4-8 PEs)
    path = f"{args.out}.pe{ops.me}.json"
    with open(f"{path}.tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(f"{path}.tmp", path)
    ops.finalize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
