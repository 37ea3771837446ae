"""The cuda backend on its own and under VMemPow2Allocator (one process, no MPI).

Skipped where there is no CUDA GPU or no cuda-bindings.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import shmemvm
import shmemvm.backends
from shmemvm.errors import ShmemError, UnsupportedError
from util import REPO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not shmemvm.backends.available("cuda"),
                       reason="needs a CUDA GPU, a CUDA build of torch and cuda-bindings"),
]

MiB = 1 << 20


def _python(script: str, **env) -> subprocess.CompletedProcess:
    """Run `script` in a fresh interpreter that imports this checkout."""
    root = str(REPO)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=path, **env))


def two_gpus():
    return pytest.mark.skipif(not shmemvm.backends.available("cuda")
                              or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


@pytest.fixture(autouse=True)
def keep_current_device():
    """The backend selects its device; give the previous one back after each test."""
    previous = torch.cuda.current_device()
    yield
    torch.cuda.synchronize()
    torch.cuda.set_device(previous)


@pytest.fixture
def backend():
    from shmemvm.backends.cuda import CudaBackend
    be = CudaBackend(device=0)
    yield be
    be.close()


class Piece:
    """One physical piece mapped in its own reservation; undone in reverse."""

    def __init__(self, be, size=None, handle=None):
        self.be = be
        self.size = size or be.granularity
        self.handle = be.create(self.size) if handle is None else handle
        self.va = be.reserve(self.size, be.granularity)
        be.map(self.va, self.size, self.handle)
        be.set_access(self.va, self.size)

    def view(self, dtype=torch.int32):
        return self.be.tensor(self.va, (self.size // dtype.itemsize,), dtype)

    def close(self):
        self.be.unmap(self.va, self.size)
        self.be.unreserve(self.va, self.size)
        self.be.release(self.handle)


# -- the backend directly ---------------------------------------------------------

def test_device_and_granularity(backend):
    assert backend.name == "cuda"
    assert backend.device == torch.device("cuda", 0)
    g = backend.granularity
    assert g >= 64 * 1024 and g & (g - 1) == 0, g
    info = backend.describe()
    assert info["backend"] == "cuda" and info["granularity"] == g and info["device"] == "cuda:0"


def test_device_from_argument_and_environment(monkeypatch):
    from shmemvm.backends.cuda import CudaBackend
    last = torch.cuda.device_count() - 1
    monkeypatch.setenv("SHMEMVM_DEVICE", str(last))
    be = CudaBackend()
    assert be.device == torch.device("cuda", last)
    assert torch.cuda.current_device() == last
    be.close()
    be = CudaBackend(device=0)  # the argument wins over the environment
    assert be.device == torch.device("cuda", 0)
    be.close()
    with pytest.raises(ValueError, match="SHMEMVM_DEVICE"):
        CudaBackend(device=last + 1)


def test_create_map_write_read(backend):
    piece = Piece(backend, 2 * backend.granularity)
    t = piece.view()
    assert t.device == backend.device and t.data_ptr() == piece.va
    t.copy_(torch.arange(t.numel(), dtype=torch.int32, device=backend.device))
    t[-1] = -7
    torch.cuda.synchronize()
    expect = torch.arange(t.numel(), dtype=torch.int32)
    expect[-1] = -7
    assert torch.equal(t.cpu(), expect)
    del t
    piece.close()


def test_copy_blocking_and_nonblocking(backend):
    piece = Piece(backend)
    t = piece.view(torch.float32)
    src = torch.randn(t.numel(), device=backend.device)
    backend.copy(t, src, blocking=True)
    assert torch.equal(t, src)
    host = torch.empty(t.numel(), dtype=torch.float32).pin_memory()
    backend.copy(host, t, blocking=False)
    backend.synchronize()
    assert torch.equal(host, src.cpu())
    backend.copy(t, torch.zeros_like(src), blocking=False)
    backend.synchronize()
    assert int(torch.count_nonzero(t)) == 0
    del t
    piece.close()


def test_driver_errors_name_call_arguments_and_result(backend):
    g = backend.granularity
    va = backend.reserve(2 * g, g)
    handle = backend.create(g)
    try:
        with pytest.raises(ShmemError) as info:
            backend.map(va + 1, g, handle)  # unaligned VA
        message = str(info.value)
        assert "cuMemMap" in message and "CUDA_ERROR_" in message and f"{va + 1:#x}" in message
        assert info.value.call == "cuMemMap"
        with pytest.raises(ShmemError, match="cuMemImportFromShareableHandle"):
            r, w = os.pipe()
            os.close(w)
            backend.import_fd(r, g)  # not a CUDA fd; closed by import_fd anyway
        with pytest.raises(OSError):
            os.fstat(r)
    finally:
        backend.release(handle)
        backend.unreserve(va, 2 * g)


def test_export_import_round_trip_second_va(backend):
    """The same physical memory at two VAs: writes through one show in the other."""
    first = Piece(backend, 2 * backend.granularity)
    a = first.view()
    a.copy_(torch.arange(a.numel(), dtype=torch.int32, device=backend.device))
    fd = backend.export_fd(first.handle)
    assert fd >= 0
    imported = backend.import_fd(fd, first.size)
    with pytest.raises(OSError):
        os.fstat(fd)  # import_fd took ownership and closed it
    second = Piece(backend, first.size, handle=imported)
    assert second.va != first.va
    b = second.view()
    torch.cuda.synchronize()
    assert torch.equal(b, a)
    b[: 1024].fill_(-1)
    torch.cuda.synchronize()
    assert int(a[: 1024].sum()) == -1024 and int(a[1024]) == 1024
    # The importer's reference keeps the memory alive after the creator lets go.
    del a
    first.close()
    assert int(b[1024]) == 1024
    del b
    second.close()


def test_export_gives_independent_fds(backend):
    piece = Piece(backend)
    fds = [backend.export_fd(piece.handle) for _ in range(3)]
    assert len(set(fds)) == 3
    handles = [backend.import_fd(fd, piece.size) for fd in fds]
    for h in handles:
        backend.release(h)
    piece.close()


@two_gpus()
def test_peer_piece_mapped_for_the_other_device():
    """Device 0's memory, imported and mapped for device 1, used from device 1."""
    from shmemvm.backends.cuda import CudaBackend
    owner, user = CudaBackend(device=0), CudaBackend(device=1)
    mine = Piece(owner, 4 * owner.granularity)
    local = mine.view()
    local.fill_(5)
    torch.cuda.synchronize(owner.device)
    peer = Piece(user, mine.size, handle=user.import_fd(owner.export_fd(mine.handle), mine.size))
    remote = peer.view()
    assert remote.device == torch.device("cuda", 1)
    assert int(remote.sum()) == 5 * remote.numel()
    src = torch.arange(remote.numel(), dtype=torch.int32, device=user.device)
    user.copy(remote, src, blocking=True)   # put through the peer mapping
    assert torch.equal(local.cpu(), src.cpu())
    back = torch.empty_like(src)
    user.copy(back, remote, blocking=True)  # get
    assert torch.equal(back, src)
    remote.mul_(2)                           # a kernel on device 1 storing into device 0
    torch.cuda.synchronize(user.device)
    assert torch.equal(local.cpu(), 2 * src.cpu())
    del remote, local
    peer.close()
    mine.close()
    user.close()
    owner.close()


def test_import_external_of_host_memory_says_how_to_copy_in(backend):
    """(The GPU cases are in test_gpu_external.py.)"""
    with pytest.raises(UnsupportedError, match="not CUDA memory") as info:
        backend.import_external(torch.zeros(4))
    assert "x.copy_(t)" in str(info.value)


def test_close_is_idempotent_and_final():
    from shmemvm.backends.cuda import CudaBackend
    be = CudaBackend(device=0)
    be.close()
    be.close()
    with pytest.raises(ShmemError, match="closed"):
        be.create(be.granularity)


# -- under VMemPow2Allocator --------------------------------------------------------

@pytest.fixture
def heap():
    h = shmemvm.VMemPow2Allocator(64 * MiB, backend="cuda", device=0)
    yield h
    h.close()


def test_allocator_allocate_write_read_free(heap):
    assert heap.device == torch.device("cuda", 0)
    small = heap.allocate((10, 10), torch.float32)
    big = heap.allocate(3 * MiB, torch.uint8)
    assert small.shape == (10, 10) and small.device == heap.device
    assert heap.base <= small.data_ptr() < heap.base + heap.va_size
    small.copy_(torch.arange(100, dtype=torch.float32).reshape(10, 10))
    big.fill_(9)
    assert float(small.sum()) == sum(range(100))
    assert int(big.sum()) == 9 * 3 * MiB
    assert heap.owns_tensor(small) and heap.owns_tensor(big)
    assert not heap.owns_tensor(torch.zeros(4, device=heap.device))
    heap.free(small)
    heap.free(big)
    assert heap.stats()["live_allocations"] == 0
    with pytest.raises(shmemvm.FreedTensorError):
        heap.free(big)


def test_allocator_gc_auto_free(heap):
    keep = heap.allocate(1024, torch.int64)
    for _ in range(4):
        heap.allocate(4 * MiB, torch.uint8)  # dropped at once
    gc.collect()
    again = heap.allocate(1024, torch.int64)  # frees the collected blocks first
    assert heap.stats()["live_allocations"] == 2
    assert heap.owns_tensor(keep) and heap.owns_tensor(again)


def test_allocator_segments(heap):
    g = heap.backend.granularity
    tensors = [heap.allocate(n, torch.uint8) for n in (100, g, 2 * g + 1)]
    segments = heap.get_allocation_segments()
    assert segments
    for offset, size, va, generation in segments:
        assert size % g == 0 and offset % size == 0 and va == heap.base + offset
        assert generation >= 0
    covered = lambda t: any(va <= t.data_ptr() < va + size for _, size, va, _ in segments)  # noqa: E731
    assert all(covered(t) for t in tensors)
    for t, n in zip(tensors, (100, g, 2 * g + 1)):
        t.fill_(1)
        assert int(t.sum()) == n


def test_allocator_exhaustion_is_a_clear_error(heap):
    with pytest.raises(shmemvm.HeapExhaustedError):
        heap.allocate(128 * MiB, torch.uint8)


def test_allocator_close_returns_device_memory():
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info(0)
    size = 512 * MiB
    heap = shmemvm.VMemPow2Allocator(size, backend="cuda", device=0)
    tensors = [heap.allocate(128 * MiB, torch.uint8) for _ in range(4)]
    for t in tensors:
        t.fill_(1)
    torch.cuda.synchronize()
    free_full, _ = torch.cuda.mem_get_info(0)
    assert free_before - free_full >= size - 16 * MiB, (free_before, free_full)
    del tensors, t  # a tensor alive at close() keeps its memory
    heap.close()
    free_after, _ = torch.cuda.mem_get_info(0)
    assert abs(free_after - free_before) <= 16 * MiB, (free_before, free_after)


def test_allocator_trim_returns_cached_segments():
    heap = shmemvm.VMemPow2Allocator(256 * MiB, backend="cuda", device=0)
    try:
        t = heap.allocate(128 * MiB, torch.uint8)
        free_mapped, _ = torch.cuda.mem_get_info(0)
        heap.free(t)
        assert heap.stats()["cached"] == 128 * MiB
        assert heap.trim() == 128 * MiB
        free_trimmed, _ = torch.cuda.mem_get_info(0)
        assert free_trimmed - free_mapped >= 120 * MiB
    finally:
        heap.close()


def test_no_crash_at_interpreter_exit_without_close():
    script = textwrap.dedent("""
        import torch, shmemvm
        heap = shmemvm.VMemPow2Allocator("64M", backend="cuda", device=0)
        t = heap.allocate((1 << 20,), torch.float32)
        t.fill_(2)
        print(float(t.sum()))
        other = shmemvm.VMemPow2Allocator("8M", backend="cuda", device=0)
        other.allocate(5)
        other.close()
    """)
    p = _python(script)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(2.0 * (1 << 20))
