"""Hardware probe for the cuda backend (scratch tool, not part of the library).

  python3 tools/cuda_dmabuf_probe.py            # both allocator modes + timings
  python3 tools/cuda_dmabuf_probe.py external   # only the import experiment, this process

1. Can memory from torch's caching allocator become a VMM handle?
   - cuMemGetHandleForAddressRange(DMA_BUF_FD) on the allocation, then
     cuMemImportFromShareableHandle(fd, POSIX_FILE_DESCRIPTOR);
   - cuMemRetainAllocationHandle on the tensor (works only on VMM memory);
   - with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (torch then uses
     cuMemCreate itself): retain + cuMemExportToShareableHandle(POSIX fd) +
     import + map at a second VA, compare contents.
   - control: DMA-BUF export of our own cuMemCreate memory, imported the same way.
2. Timings of the backend's create/map/set_access/unmap/release/export/import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from shmemvm.backends.cuda import CudaBackend, _result_name, driver  # noqa: E402

OK = driver.CUresult.CUDA_SUCCESS
POSIX = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
DMABUF = driver.CUmemRangeHandleType.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD


def say(*a):
    print(*a, flush=True)


def fd_kind(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        return f"? ({e})"


def try_import_and_map(be, fd, size, expect: torch.Tensor | None, label, offset=0):
    """Import fd as a VMM handle; if that works map it at a second VA and
    compare its bytes from `offset` with `expect`."""
    r = driver.cuMemImportFromShareableHandle(fd, POSIX)
    os.close(fd)
    say(f"  [{label}] cuMemImportFromShareableHandle(fd, POSIX_FD) -> {_result_name(r[0])}")
    if r[0] != OK:
        return False
    h = int(r[1])
    va = be.reserve(size, be.granularity)
    try:
        be.map(va, size, h)
        be.set_access(va, size)
        if expect is not None:
            want = expect.reshape(-1).view(torch.uint8)[: size - offset]
            view = be.tensor(va, (size,), torch.uint8)[offset: offset + want.numel()]
            say(f"  [{label}] mapped at a second VA; {want.numel()} bytes equal: "
                f"{torch.equal(view, want)}")
            del view
        be.unmap(va, size)
    except Exception as e:  # noqa: BLE001
        say(f"  [{label}] map failed: {e}")
    finally:
        be.unreserve(va, size)
        be.release(h)
    return True


def external(be: CudaBackend):
    mode = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "default"
    say(f"== external import experiment, allocator conf: {mode}")
    dev = be._cudev
    for attr in ("CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED",
                 "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED",
                 "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"):
        r = driver.cuDeviceGetAttribute(getattr(driver.CUdevice_attribute, attr), dev)
        say(f"  {attr} = {r[1]} ({_result_name(r[0])})")
    x = torch.arange(4 << 20, dtype=torch.int32, device=be.device)  # 16 MiB
    torch.cuda.synchronize()
    ptr = x.data_ptr()
    r = driver.cuMemGetAddressRange(ptr)
    base, size = int(r[1]), int(r[2])
    say(f"  tensor {ptr:#x}: cuMemGetAddressRange -> {_result_name(r[0])} base={base:#x} "
        f"size={size} offset={ptr - base}")
    r = driver.cuMemGetHandleForAddressRange(base, size, DMABUF, 0)
    say(f"  cuMemGetHandleForAddressRange(base, {size}, DMA_BUF_FD) -> {_result_name(r[0])}")
    if r[0] == OK:
        fd = int(r[1])
        say(f"  dma-buf fd {fd}: {fd_kind(fd)}")
        try_import_and_map(be, fd, size, x, "caching-allocator dma-buf", ptr - base)
    r = driver.cuMemRetainAllocationHandle(ptr)
    say(f"  cuMemRetainAllocationHandle(tensor) -> {_result_name(r[0])}")
    if r[0] == OK:
        h = int(r[1])
        p = driver.cuMemGetAllocationPropertiesFromHandle(h)
        if p[0] == OK:
            say(f"  torch's handle: requestedHandleTypes={p[1].requestedHandleTypes!r} "
                f"type={p[1].type!r}")
        # Which part of the range does this one handle cover? (same handle
        # value <=> same allocation; walk in 2 MiB steps)
        owner = []
        for k in range(0, size, 2 << 20):
            rr = driver.cuMemRetainAllocationHandle(base + k)
            owner.append(int(rr[1]) if rr[0] == OK else None)
            if rr[0] == OK:
                driver.cuMemRelease(rr[1])
        mine = [base + k * (2 << 20) for k, o in enumerate(owner) if o == h]
        say(f"  {len(set(owner))} distinct handle(s) over the {size}-byte range; "
            f"the tensor's handle covers {len(mine) * 2} MiB")
        e = driver.cuMemExportToShareableHandle(h, POSIX, 0)
        say(f"  cuMemExportToShareableHandle(torch handle, POSIX_FD) -> {_result_name(e[0])}")
        if e[0] == OK and mine:
            fd = int(e[1])
            say(f"  fd {fd}: {fd_kind(fd)}")
            hsize = len(mine) * (2 << 20)
            try_import_and_map(be, fd, hsize, x, "torch VMM handle, POSIX fd", ptr - mine[0])
        driver.cuMemRelease(h)
    # Control: DMA-BUF export of our own cuMemCreate memory.
    g = be.granularity
    h = be.create(g)
    va = be.reserve(g, g)
    be.map(va, g, h)
    be.set_access(va, g)
    own = be.tensor(va, (g // 4,), torch.int32)
    own.copy_(torch.arange(g // 4, dtype=torch.int32, device=be.device))
    torch.cuda.synchronize()
    r = driver.cuMemGetHandleForAddressRange(va, g, DMABUF, 0)
    say(f"  control: cuMemGetHandleForAddressRange(own cuMemCreate memory) -> {_result_name(r[0])}")
    if r[0] == OK:
        fd = int(r[1])
        say(f"  dma-buf fd: {fd_kind(fd)}")
        try_import_and_map(be, fd, g, own.clone(), "own memory dma-buf")
    fd = be.export_fd(h)
    say(f"  control: cuMemExportToShareableHandle(own) fd: {fd_kind(fd)}")
    try_import_and_map(be, fd, g, own.clone(), "own memory POSIX fd")
    # What the backend says to a user.
    try:
        be.import_external(x)
    except Exception as exc:  # noqa: BLE001
        say(f"  import_external -> {type(exc).__name__}: {exc}")
    del own
    be.unmap(va, g)
    be.unreserve(va, g)
    be.release(h)


def timed(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def timings(be: CudaBackend):
    say("== timings (mean per operation)")
    for size in (2 << 20, 1 << 30):
        n = 50 if size < (1 << 28) else 5
        va = be.reserve(size * n, be.granularity)
        hs, fds = [], []
        t0 = time.perf_counter()
        for i in range(n):
            hs.append(be.create(size))
        t1 = time.perf_counter()
        for i in range(n):
            be.map(va + i * size, size, hs[i])
        t2 = time.perf_counter()
        for i in range(n):
            be.set_access(va + i * size, size)
        t3 = time.perf_counter()
        for i in range(n):
            fds.append(be.export_fd(hs[i]))
        t4 = time.perf_counter()
        imp = [be.import_fd(fd, size) for fd in fds]
        t5 = time.perf_counter()
        for h in imp:
            be.release(h)
        t5b = time.perf_counter()
        for i in range(n):
            be.unmap(va + i * size, size)
        t6 = time.perf_counter()
        for h in hs:
            be.release(h)
        t7 = time.perf_counter()
        be.unreserve(va, size * n)
        us = lambda a, b: f"{(b - a) / n * 1e6:9.1f} us"  # noqa: E731
        say(f"  {size >> 20:5d} MiB x{n}: create {us(t0, t1)} map {us(t1, t2)} "
            f"set_access {us(t2, t3)} export {us(t3, t4)} import {us(t4, t5)} "
            f"release-import {us(t5, t5b)} unmap {us(t5b, t6)} release {us(t6, t7)}")
    # Peer path inside one process: device 0's memory mapped for device 1.
    if torch.cuda.device_count() >= 2:
        other = CudaBackend(device=1 - be.index)
        size = 1 << 30
        h = be.create(size)
        fd = be.export_fd(h)
        h2 = other.import_fd(fd, size)
        va = other.reserve(size, other.granularity)
        t = time.perf_counter()
        other.map(va, size, h2)
        other.set_access(va, size)
        t_map = time.perf_counter() - t
        peer = other.tensor(va, (size,), torch.uint8)  # on other.device, memory on be.device
        src = torch.ones(size, dtype=torch.uint8, device=other.device)
        other.copy(peer, src, blocking=True)
        torch.cuda.synchronize(other.device)
        t = time.perf_counter()
        for _ in range(5):
            other.copy(peer, src, blocking=False)
        other.synchronize()
        put = 5 * size / (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(5):
            other.copy(src, peer, blocking=False)
        other.synchronize()
        get = 5 * size / (time.perf_counter() - t)
        say(f"  peer 1 GiB: map+set_access {t_map * 1e3:.1f} ms, put {put / 1e9:.0f} GB/s, "
            f"get {get / 1e9:.0f} GB/s, sum seen {int(peer[:1 << 20].sum())}")
        del peer
        other.unmap(va, size)
        other.unreserve(va, size)
        other.release(h2)
        be.release(h)
        other.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "external":
        be = CudaBackend(0)
        external(be)
        be.close()
        return
    for conf in ("", "expandable_segments:True"):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        p = subprocess.run([sys.executable, __file__, "external"], env=env,
                           capture_output=True, text=True, timeout=120)
        sys.stdout.write(p.stdout)
        if p.returncode:
            say(f"  (exit {p.returncode}) {p.stderr[-3000:]}")
    be = CudaBackend(0)
    say(f"backend: {be.describe()}")
    timings(be)
    be.close()


if __name__ == "__main__":
    main()
