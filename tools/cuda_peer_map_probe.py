"""Hardware probe (scratch tool, not part of the library): a timeline of the
driver calls that share one fresh segment between two processes, one GPU each,
in the order shmemvm's fresh malloc makes them.

    mpirun -n 2 --bind-to none python tools/cuda_peer_map_probe.py [MiB] [MODE] [ORDERS]

MiB: the segment sizes, comma-separated (default 1024). ORDERS: comma-separated, of
  inline     create, export, send, map + set access here, receive, import, map + set access
  threaded   map + set access here on a thread from the start (GIL released by the driver)
  own_first  map + set access here before exporting
MODE (what the process holds or does before the trials), parts joined by +:
  plain      nothing
  keep       a segment of ANCHOR_MB (default 512) MiB of each GPU, mapped by both processes
  nvshmem    NVSHMEM4Py initialised over MPI (nvshmem4py-cu13 and cuda-python needed)
  spin       a thread of this process keeps a core busy without the GIL (as
             NVSHMEM's proxy thread does)
  syncmemops the context gets CU_CTX_SYNC_MEMOPS (cuCtxSetFlags, as NVSHMEM's init)
  rdma       the trial segments are made with gpuDirectRDMACapable (as NVSHMEM's)
  bigva      a 256 GiB address reservation is held (as NVSHMEM's heap)
  nccl       a 2-rank NCCL communicator (torch.distributed) has run an all-reduce
  pinned     three small pinned host buffers (cudaHostAlloc, as NVSHMEM's proxy)
  streams    16 priority streams with an event each (as NVSHMEM's init)
  holdfd     a 2 MiB piece exported to a file descriptor that stays open
  holdfdpeer the same, and the peer keeps the descriptor it received open too
  nvheap     NVSHMEM's heap rebuilt: a 256 GiB reservation per PE, a 512 MiB
             gpuDirectRDMACapable piece at its base, mapped by the peer at +128 GiB

SETTLE_MS (default 0): idle milliseconds before each trial, after the last
one's memory was released.

Each process prints, per trial, every call as name[start-end] in us from a
common start. What it showed on 2 x H200 (docs/performance.md): without
NVSHMEM or a live peer mapping of >= 512 MiB, setting access to the peer's
fresh 1 GiB takes 9-20 ms and the processes' calls run one after the other.
"""

from __future__ import annotations

import array
import os
import socket
import sys
import threading
import time

import torch
from cuda.bindings import driver as d
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, other = comm.rank, 1 - comm.rank
FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def check(result):
    error, *values = result if isinstance(result, tuple) else (result,)
    assert error == d.CUresult.CUDA_SUCCESS, error
    return values[0] if values else None


torch.cuda.set_device(rank)
torch.zeros(1, device=f"cuda:{rank}")
context = check(d.cuCtxGetCurrent())
prop = d.CUmemAllocationProp()
prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = rank
prop.requestedHandleTypes = FD
access = d.CUmemAccessDesc()
access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
access.location.id = rank
access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE

sizes = [int(mb) << 20 for mb in (sys.argv[1] if len(sys.argv) > 1 else "1024").split(",")]
size = max(sizes)
modes = set((sys.argv[2] if len(sys.argv) > 2 else "plain").split("+"))
orders = (sys.argv[3] if len(sys.argv) > 3 else "inline,threaded,own_first").split(",")
va = int(check(d.cuMemAddressReserve(4 * size + (4 << 30), 2 << 20, 0, 0)))
own_va, peer_va, anchor_va = va, va + size, va + 2 * size
mailbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
mailbox.bind(f"\0shmemvm-probe{rank}")
comm.Barrier()   # both mailboxes exist before anything is sent
events: list = []
t0 = 0.0


def timed(name, call):
    start = time.perf_counter()
    value = call()
    events.append((name, round((start - t0) * 1e6), round((time.perf_counter() - t0) * 1e6)))
    return value


def send_handle(handle):
    fd = int(timed("export", lambda: check(d.cuMemExportToShareableHandle(handle, FD, 0))))
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
    timed("send", lambda: mailbox.sendmsg([b"x"], rights, 0, f"\0shmemvm-probe{other}"))
    os.close(fd)


def receive_handle():
    _, fds, _, _ = timed("recv", lambda: socket.recv_fds(mailbox, 16, 1))
    handle = timed("import", lambda: check(d.cuMemImportFromShareableHandle(fds[0], FD)))
    os.close(fds[0])
    return handle


def map_here(name, at, nbytes, handle):
    check(d.cuCtxSetCurrent(context))
    timed(f"{name}_map", lambda: check(d.cuMemMap(at, nbytes, 0, handle, 0)))
    timed(f"{name}_set", lambda: check(d.cuMemSetAccess(at, nbytes, [access], 1)))


if "rdma" in modes:
    prop.allocFlags.gpuDirectRDMACapable = 1
if "bigva" in modes:
    big_va = check(d.cuMemAddressReserve(256 << 30, 512 << 20, 0, 0))
if "syncmemops" in modes:
    flags = check(d.cuCtxGetFlags())
    check(d.cuCtxSetFlags(int(flags) | int(d.CUctx_flags.CU_CTX_SYNC_MEMOPS)))
if "spin" in modes:
    import hashlib
    spinning = bytes(64 << 20)

    def spin():  # sha256 of a large buffer releases the GIL while it hashes
        while not stop_spinning.is_set():
            hashlib.sha256(spinning)

    stop_spinning = threading.Event()
    threading.Thread(target=spin, daemon=True).start()
if "nccl" in modes:
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    ones = torch.ones(1 << 20, device=f"cuda:{rank}")
    dist.all_reduce(ones)
    torch.cuda.synchronize()
    check(d.cuCtxSetCurrent(context))
if "pinned" in modes:
    held_pinned = [torch.empty(4096, dtype=torch.uint8, pin_memory=True) for _ in range(3)]
if "streams" in modes:
    held_streams = [torch.cuda.Stream(priority=-1) for _ in range(16)]
    held_events = [torch.cuda.Event() for _ in held_streams]
    for stream, event in zip(held_streams, held_events):
        event.record(stream)
    torch.cuda.synchronize()
    check(d.cuCtxSetCurrent(context))
if "nvheap" in modes:
    heap_prop = d.CUmemAllocationProp()
    heap_prop.type, heap_prop.location.type = prop.type, prop.location.type
    heap_prop.location.id, heap_prop.requestedHandleTypes = rank, FD
    heap_prop.allocFlags.gpuDirectRDMACapable = 1
    slot = 128 << 30
    heap_va = int(check(d.cuMemAddressReserve(2 * slot, 512 << 20, 0, 0)))
    chunk = check(d.cuMemCreate(512 << 20, heap_prop, 0))
    map_here("heap", heap_va, 512 << 20, chunk)
    send_handle(chunk)
    map_here("heap_peer", heap_va + slot, 512 << 20, receive_handle())
if "holdfd" in modes or "holdfdpeer" in modes:
    held_piece = check(d.cuMemCreate(2 << 20, prop, 0))
    held_fd = int(check(d.cuMemExportToShareableHandle(held_piece, FD, 0)))
    if "holdfdpeer" in modes:
        mailbox.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [held_fd]))],
                        0, f"\0shmemvm-probe{other}")
        _, held_fds, _, _ = socket.recv_fds(mailbox, 16, 1)
if "keep" in modes:
    anchor = (int(os.environ.get("ANCHOR_MB", "512")) << 20)
    mine = check(d.cuMemCreate(anchor, prop, 0))
    map_here("anchor", anchor_va, anchor, mine)
    send_handle(mine)
    map_here("anchor_peer", anchor_va + anchor, anchor, receive_handle())
if "nvshmem" in modes:
    import nvshmem.core as nvshmem
    from cuda.core import Device
    device = Device(rank)
    device.set_current()
    nvshmem.init(device=device, mpi_comm=comm, initializer_method="mpi")
    check(d.cuCtxSetCurrent(context))
print(f"PE {rank}: {len(os.sched_getaffinity(0))} CPUs in this process's affinity", flush=True)
comm.Barrier()

settle = float(os.environ.get("SETTLE_MS", "0")) / 1e3   # idle time before each trial
for size, order in [(size, order) for size in sizes for order in orders]:
    time.sleep(settle)
    comm.Barrier()
    events, t0 = [], time.perf_counter()
    handle = timed("create", lambda: check(d.cuMemCreate(size, prop, 0)))
    if order == "inline":
        send_handle(handle)
        map_here("own", own_va, size, handle)
        peer = receive_handle()
    elif order == "threaded":
        worker = threading.Thread(target=map_here, args=("own", own_va, size, handle))
        worker.start()
        send_handle(handle)
        peer = receive_handle()
    else:
        map_here("own", own_va, size, handle)
        send_handle(handle)
        peer = receive_handle()
    map_here("peer", peer_va, size, peer)
    if order == "threaded":
        worker.join()
    total = round((time.perf_counter() - t0) * 1e6)
    comm.Barrier()
    for at, h in ((peer_va, peer), (own_va, handle)):
        check(d.cuMemUnmap(at, size))
        check(d.cuMemRelease(h))
    everyone = comm.gather((total, events))
    if rank == 0:
        print(f"{size >> 20} MiB {order}: total us per process {[t for t, _ in everyone]}")
        for pe, (_, trial) in enumerate(everyone):
            print(f"  PE {pe}: " + " ".join(f"{n}[{a}-{b}]" for n, a, b in trial))
