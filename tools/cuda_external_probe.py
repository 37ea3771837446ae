"""Hardware probe for import_external_tensor on the cuda backend (not part of
the library). Every step is tried on its own and its result printed.

  python3 tools/cuda_external_probe.py              # one process: both allocator modes
  mpirun -n 2 python3 tools/cuda_external_probe.py heap
      # the heap path end to end, in the allocator mode of the launch
      # (export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first, and
      #  pass it on: Open MPI -x PYTORCH_CUDA_ALLOC_CONF)

One process, for a tensor from torch with and without expandable segments:
what cuMemGetAddressRange, cuMemRetainAllocationHandle,
cuMemGetAllocationPropertiesFromHandle and cuMemExportToShareableHandle(POSIX
fd) return, which handles lie under the tensor (2 MiB steps), what the
backend's import_external finds, and VMemPow2Allocator.import_external_tensor
end to end (same bytes, a write through the import shows in the original).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import traceback
import weakref

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

PREFIX = ""


def say(*a):
    print(PREFIX, *a, flush=True)


def step(what, fn, *args, **kwargs):
    """Run one step; print and return its result, or print its error."""
    try:
        result = fn(*args, **kwargs)
        say(f"  {what}: {result!r}"[:2000])
        return result
    except Exception as exc:  # noqa: BLE001 - a probe reports everything
        say(f"  {what}: FAILED {type(exc).__name__}: {exc}"[:3000])
        if os.environ.get("PROBE_TRACEBACK"):
            traceback.print_exc()
        return None


def name(err):
    return getattr(err, "name", str(err))


def fd_kind(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        return f"? ({e})"


def inspect(driver, t: torch.Tensor, label: str):
    ok = driver.CUresult.CUDA_SUCCESS
    posix = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    ptr = t.data_ptr()
    say(f"-- {label}: {t.numel() * t.element_size()} bytes at {ptr:#x} "
        f"(ptr mod 2 MiB = {ptr % (2 << 20)})")
    r = driver.cuMemGetAddressRange(ptr)
    say(f"  cuMemGetAddressRange -> {name(r[0])}"
        + (f" base={int(r[1]):#x} size={int(r[2])} offset={ptr - int(r[1])}" if r[0] == ok else ""))
    r = driver.cuMemRetainAllocationHandle(ptr)
    say(f"  cuMemRetainAllocationHandle(ptr) -> {name(r[0])}")
    if r[0] != ok:
        return
    handle = r[1]
    p = driver.cuMemGetAllocationPropertiesFromHandle(handle)
    if p[0] == ok:
        prop = p[1]
        say(f"  properties: type={prop.type!r} requestedHandleTypes={prop.requestedHandleTypes!r} "
            f"(POSIX fd bit: {bool(int(prop.requestedHandleTypes) & int(posix))}) "
            f"location=({prop.location.type!r}, {prop.location.id}) "
            f"compressionType={getattr(prop.allocFlags, 'compressionType', '?')!r}")
        g = driver.cuMemGetAllocationGranularity(
            prop, driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        say(f"  granularity (minimum) -> {name(g[0])} {g[1] if g[0] == ok else ''}")
    else:
        say(f"  cuMemGetAllocationPropertiesFromHandle -> {name(p[0])}")
    e = driver.cuMemExportToShareableHandle(handle, posix, 0)
    say(f"  cuMemExportToShareableHandle(POSIX fd) -> {name(e[0])}"
        + (f" fd -> {fd_kind(int(e[1]))}" if e[0] == ok else ""))
    if e[0] == ok:
        os.close(int(e[1]))
    driver.cuMemRelease(handle)
    # which handles lie under the tensor, 2 MiB at a time
    step2, start = 2 << 20, ptr - ptr % (2 << 20)
    runs, last = [], None
    for addr in range(start, ptr + t.numel() * t.element_size(), step2):
        rr = driver.cuMemRetainAllocationHandle(addr)
        h = int(rr[1]) if rr[0] == ok else None
        if rr[0] == ok:
            driver.cuMemRelease(rr[1])
        if runs and h == last:
            runs[-1][1] += 1
        else:
            runs.append([h, 1])
        last = h
    say(f"  handles under the tensor (handle, 2 MiB steps): {[(hex(h or 0), n) for h, n in runs]}")


def one_mode():
    from shmemvm import VMemPow2Allocator
    from shmemvm.backends.cuda import CudaBackend, driver
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "(default)"
    say(f"== PYTORCH_CUDA_ALLOC_CONF={conf}; torch {torch.__version__}")
    step("device", torch.cuda.get_device_name, 0)
    step("cuDriverGetVersion", lambda: driver.cuDriverGetVersion())
    be = step("CudaBackend(0)", CudaBackend, device=0)
    if be is None:
        return
    tensors = {}
    for label, count in (("1 MiB", 1 << 18), ("16 MiB", 4 << 20), ("100 MiB", 25 << 20)):
        t = step(f"torch.arange({label})", torch.arange, count, dtype=torch.int32, device="cuda:0")
        if t is None:
            continue
        torch.cuda.synchronize()
        tensors[label] = t
        step(f"inspect {label}", inspect, driver, t, label)
        pieces = step(f"backend.import_external({label})", be.import_external, t)
        for piece in pieces or ():
            be.release(piece.handle)
    be.close()
    heap = step("VMemPow2Allocator(64M, cuda)", VMemPow2Allocator, "64M", backend="cuda", device=0)
    if heap is None:
        return
    for label, t in tensors.items():
        x = step(f"import_external_tensor({label})", heap.import_external_tensor, t)
        if x is None:
            continue
        step("  in the heap's VA", lambda: heap.base <= x.data_ptr() < heap.base + heap.va_size)
        step("  same bytes", lambda: torch.equal(x, t))
        step("  pieces", lambda: [(hex(p.va), p.size) for p in
                                   heap.imported(heap.block_of(x).offset).pieces])

        def write_through():
            x[3] = -3
            torch.cuda.synchronize()
            return int(t[3]) == -3
        step("  a write through the import shows in the original", write_through)
        step("  free", heap.free, x)
    del tensors
    step("close", heap.close)


def heap_mode():
    global PREFIX
    from mpi4py import MPI

    from shmemvm import SymmetricHeap
    comm = MPI.COMM_WORLD
    PREFIX = f"[PE {comm.rank}]"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "(default)"
    say(f"== heap, {comm.size} PEs, PYTORCH_CUDA_ALLOC_CONF={conf}")
    heap = step("SymmetricHeap(256M, cuda)", SymmetricHeap, comm, heap_size="256M",
                backend="cuda", timeout=60)
    if heap is None:
        return
    try:
        torch.cuda.synchronize(heap.device)
        t = torch.full(((48 << 20) // 4,), float(heap.my_pe), device=heap.device)
        torch.cuda.synchronize(heap.device)
        say(f"  tensor at {t.data_ptr():#x}, mod 2 MiB = {t.data_ptr() % (2 << 20)}")
        x = step("import_external_tensor(48 MiB)", heap.import_external_tensor, t)
        if x is None:
            return
        step("offset (same on every PE?)", lambda: comm.allgather(heap.local.offset_of(x)))
        step("pieces", lambda: [(hex(p.va), p.size) for p in
                                heap.local.imported(heap.local.block_of(x).offset).pieces])
        heap.barrier_all()
        for pe in range(heap.n_pes):
            step(f"ptr(x, {pe}) all == {pe}",
                 lambda pe=pe: (lambda v: None if v is None else bool((v == pe).all()))(
                     heap.ptr(x, pe)))
            got = torch.empty_like(x)
            step(f"get from {pe} all == {pe}",
                 lambda pe=pe, got=got: (heap.get(got, x, pe), bool((got == pe).all()))[1])
        gc.collect()
        heap.barrier_all()
        right = (heap.my_pe + 1) % heap.n_pes
        step("put 1000 values to the right",
             heap.put, x[:1000], torch.full((1000,), 100.0 + heap.my_pe, device=heap.device), right)
        heap.barrier_all()
        torch.cuda.synchronize(heap.device)
        left = (heap.my_pe - 1) % heap.n_pes
        step("the left PE's put shows in the original", lambda: bool((t[:1000] == 100.0 + left).all()))
        original = weakref.ref(t)
        del t
        gc.collect()
        step("original alive while imported", lambda: original() is not None)
        step("free", heap.free, x)
        del x
        gc.collect()
        step("original released after free", lambda: original() is None)
        heap.barrier_all()
    finally:
        gc.collect()
        step("finalize", heap.finalize)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "heap":
        heap_mode()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        one_mode()
        return
    for conf in ("", "expandable_segments:True"):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "one"], env=env,
                               capture_output=True, text=True, timeout=300)
            sys.stdout.write(p.stdout)
            if p.returncode:
                say(f"  (exit {p.returncode}) {p.stderr[-3000:]}")
        except subprocess.TimeoutExpired as exc:
            say(f"  timed out: {(exc.stdout or b'')[-3000:]!r}")


if __name__ == "__main__":
    main()
