"""Run by tests/jobs/memory/test_resource_limits.py as its own small MPI job:

    mpiexec -n N python resource_limits.py OUTDIR SCENARIO[+SCENARIO...]

Every PE makes a heap whose chunk size is the granularity (64 KiB), so every
allocation of 64 KiB is a segment of its own: one descriptor and one mapping
per PE of the node each. Then every PE brings itself close to a real system
limit, as a program that lowered it would be:

  fds    RLIMIT_NOFILE lowered (resource.setrlimit) to 24 descriptors above
         what the PE holds;
  maps   the PE's mappings raised to about 80 below vm.max_map_count, by
         splitting an anonymous mapping of its own into single pages (the
         sysctl cannot be lowered without root; the kernel's own limit is hit).

It allocates 64 KiB tensors until a call fails, and records in
OUTDIR/pe<N>.json which call failed, with what, after how long, whether the
failure left descriptors or mappings behind, and whether the heap still works
afterwards: freed tensors are reused, trim() gives memory back and new memory
can be allocated again, data put to a neighbour arrives. Last, every
allocation is freed and the heap finalized: the descriptors and mappings must
be those of before the heap. Scenarios joined by "+" run one after another in
the job, each with a heap of its own, recording into OUTDIR/<scenario>/: one
job's start-up for both (issue 33, item 16: CI's time).
"""

import ctypes
import faulthandler
import gc
import json
import mmap
import os
import resource
import sys
import time
import traceback

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from util import open_fds, shmemvm_mappings  # noqa: E402

from shmemvm import SymmetricHeap  # noqa: E402

K = 1 << 10
SEGMENT = 64 * K
MAX_TRIES = 4000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def map_count() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def fill_mappings(headroom: int) -> tuple[int, int]:
    """Split a mapping of our own into single pages until `headroom` mappings
    are left below vm.max_map_count; (address, length) to munmap later."""
    with open("/proc/sys/vm/max_map_count") as f:
        maximum = int(f.read())
    splits = (maximum - headroom - map_count()) // 2
    page = mmap.PAGESIZE
    length = (2 * splits + 2) * page
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    base = _libc.mmap(None, length, mmap.PROT_READ, flags, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value), "mmap failed"
    for i in range(splits):  # every other page PROT_NONE: each call adds two mappings
        if _libc.mprotect(base + (2 * i + 1) * page, page, 0) != 0:  # PROT_NONE
            raise OSError(ctypes.get_errno(), "mprotect while filling mappings")
    return base, length


def main(outdir: str, scenario: str) -> None:
    faulthandler.enable()
    comm = MPI.COMM_WORLD
    me, n = comm.Get_rank(), comm.Get_size()
    record = {"pe": me, "scenario": scenario}
    # What is alive now (torch, MPI, the last scenario's survivors) stays so: frozen
    # out of the collector's way, the gc.collect() of the open_fds() before each call
    # below (some 240 calls before the descriptors run out) scans only what came
    # since. On the 2-core VM, fds at 2 PEs took 41.5 CPU-s before, 4.2 after (issue 33,
    # item 16).
    gc.collect()
    gc.freeze()
    fds_start, maps_start = open_fds(), shmemvm_mappings()
    os.environ["SHMEMVM_CHUNK_SIZE"] = str(SEGMENT)
    heap = SymmetricHeap(comm, heap_size="512M", backend="host", timeout=20)
    record["chunk"] = heap.heap_info()["chunk"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filled = None
    held = []
    try:
        warm = heap.malloc(SEGMENT)      # sockets, window and first mappings made
        heap.free(warm)
        heap.trim()
        comm.Barrier()
        if scenario == "fds":
            highest = max(int(entry.split("->")[0]) for entry in open_fds())
            resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1 + 24, hard))
        else:
            filled = fill_mappings(headroom=80)
        comm.Barrier()
        for i in range(MAX_TRIES):
            fds_before, maps_before = len(open_fds()), len(shmemvm_mappings())
            started = time.monotonic()
            try:
                held.append(heap.malloc(SEGMENT))
            except Exception as exc:  # noqa: BLE001 - recorded for the test to judge
                record.update(failed_at=i, error=type(exc).__name__, message=str(exc),
                              elapsed=time.monotonic() - started,
                              fds_leaked=len(open_fds()) - fds_before,
                              maps_leaked=len(shmemvm_mappings()) - maps_before)
                break
        record["allocated"] = len(held)
        if "error" in record:
            # Usable afterwards: freed tensors come back without new memory ...
            for x in held[-4:]:
                heap.free(x)
            held[-4:] = [heap.malloc(SEGMENT) for _ in range(4)]
            # ... and, with some memory given back, new memory can be made again
            for x in held[-8:]:
                heap.free(x)
            del held[-8:]
            heap.trim()
            fresh = [heap.malloc(SEGMENT) for _ in range(4)]
            right, left = (me + 1) % n, (me - 1) % n
            for j, x in enumerate(fresh):
                heap.put(x, torch.full((SEGMENT,), (10 * me + j) % 251, dtype=torch.uint8),
                         right)
            heap.barrier_all()
            record["data_ok"] = all(bool((x == (10 * left + j) % 251).all())
                                    for j, x in enumerate(fresh))
            held += fresh
            record["recovered"] = True
        for x in held:
            heap.free(x)
        held.clear()
        heap.trim()
        record["after_trim_segments"] = heap.heap_info()["segments"]
    except Exception as exc:  # noqa: BLE001
        record["unexpected"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if filled is not None:
            _libc.munmap(*filled)
        held.clear()
        heap.finalize()
    record["fds_left"] = sorted(open_fds() - fds_start)
    record["maps_left"] = len(shmemvm_mappings()) - len(maps_start)
    with open(os.path.join(outdir, f"pe{me}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    for name in sys.argv[2].split("+"):
        os.makedirs(os.path.join(sys.argv[1], name), exist_ok=True)
        main(os.path.join(sys.argv[1], name), name)
