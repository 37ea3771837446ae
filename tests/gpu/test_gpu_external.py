"""import_external_tensor on the cuda backend (one GPU per PE).

torch reads PYTORCH_CUDA_ALLOC_CONF once, when it first allocates on a GPU,
so the allocator mode of this process is the launch's. The MPI tests need
torch's expandable segments and skip without them; the single-process tests
start their own interpreters with the mode they check.

    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    mpirun -n 2 -x PYTORCH_CUDA_ALLOC_CONF python -m pytest -q -p no:cacheprovider \
        --with-mpi -m mpi tests/gpu/test_gpu_external.py
    python -m pytest -q -p no:cacheprovider -m "not mpi" tests/gpu/test_gpu_external.py

Skipped where there is no CUDA GPU or no cuda-bindings.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch
from mpi4py import MPI

import shmemvm.backends
from util import REPO
from shmemvm.core.state import parts_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not shmemvm.backends.available("cuda"),
                       reason="needs a CUDA GPU, a CUDA build of torch and cuda-bindings"),
]

WORLD = MPI.COMM_WORLD
MiB = 1 << 20
EXPANDABLE = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower()
needs_expandable = pytest.mark.skipif(
    not EXPANDABLE, reason="torch shares its memory only as expandable segments: launch with "
                           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def _python(script: str, conf: str) -> subprocess.CompletedProcess:
    """Run `script` in a fresh interpreter with torch's allocator mode `conf`."""
    root = str(REPO)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, PYTORCH_CUDA_ALLOC_CONF=conf)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=120, env=env)


# -- one process -------------------------------------------------------------------------------
def test_without_expandable_segments_the_error_says_why_and_how_to_copy_in():
    p = _python("""
        import torch, shmemvm
        heap = shmemvm.VMemPow2Allocator("64M", backend="cuda", device=0)
        t = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
        try:
            heap.import_external_tensor(t)
            print("IMPORTED")
        except shmemvm.UnsupportedError as exc:
            print("REFUSED", exc)
        heap.close()
    """, conf="")
    assert p.returncode == 0, p.stderr
    assert "REFUSED" in p.stdout, p.stdout
    assert "not VMM memory" in p.stdout and "expandable_segments:True" in p.stdout, p.stdout
    assert "x.copy_(t)" in p.stdout, p.stdout


def test_with_expandable_segments_one_process_imports_without_a_copy():
    p = _python("""
        import gc, weakref, torch, shmemvm
        from shmemvm.memory.heapmem import HeapMemory   # block_of, imported: the heap's engine
        heap = HeapMemory("64M", backend="cuda", device=0, release_dead=True)
        t = torch.arange(25 << 20, dtype=torch.int32, device="cuda:0")   # 100 MiB
        x = heap.import_external_tensor(t)
        assert heap.base <= x.data_ptr() < heap.base + heap.va_size
        assert x.data_ptr() != t.data_ptr() and torch.equal(x, t)
        x[5] = -5
        torch.cuda.synchronize()
        assert int(t[5]) == -5, "the import is another address of the same memory"
        block = heap.block_of(x)
        print("PIECES", len(heap.imported(block.offset).pieces))
        original = weakref.ref(t)
        del t
        gc.collect()
        assert original() is not None, "the heap must hold the original"
        heap.free(x)
        gc.collect()
        assert original() is None, "released with the import"
        heap.close()
        print("OK")
    """, conf="expandable_segments:True")
    assert p.returncode == 0, p.stderr
    assert "OK" in p.stdout, p.stdout
    pieces = int(p.stdout.split("PIECES")[1].split()[0])
    assert pieces > 1, f"a 100 MiB tensor should span several of torch's 20 MiB pieces: {pieces}"


# -- the heap, one GPU per PE ------------------------------------------------------------------
HEAP_OPTIONS = {"heap_size": "256M", "backend": "cuda", "timeout": 60}   # the conftest heap fixture


@pytest.fixture
def gpu_heap(heap):
    """The conftest heap, on this PE's GPU."""
    return heap


def fresh(count: int, value: float, device) -> torch.Tensor:
    """A tensor torch places the same way on every PE (same sequence of calls)."""
    torch.cuda.synchronize(device)
    return torch.full((count,), value, dtype=torch.float32, device=device)


@pytest.mark.mpi(min_size=2)
@needs_expandable
def test_peers_read_and_write_the_imported_tensor(gpu_heap):
    heap = gpu_heap
    count = (48 * MiB) // 4                      # spans several of torch's pieces
    t = fresh(count, float(heap.my_pe), heap.device)
    x = heap.import_external_tensor(t)
    assert torch.equal(x, t) and x.device == heap.device
    assert len(set(WORLD.allgather(parts_of(heap).local.offset_of(x)))) == 1
    heap.barrier_all()
    for pe in range(heap.n_pes):
        view = heap.ptr(x, pe)
        if view is not None:
            assert bool((view == pe).all()), f"PE {pe}'s data through ptr()"
        got = torch.empty_like(x)
        heap.get(got, x, pe)
        assert bool((got == pe).all()), f"PE {pe}'s data through get()"
    del view
    heap.barrier_all()
    right = (heap.my_pe + 1) % heap.n_pes
    heap.put(x[:1000], torch.full((1000,), 100.0 + heap.my_pe, device=heap.device), right)
    heap.barrier_all()
    torch.cuda.synchronize(heap.device)
    left = (heap.my_pe - 1) % heap.n_pes
    assert bool((t[:1000] == 100.0 + left).all()), "a peer's put shows in the original tensor"
    assert bool((t[1000:] == heap.my_pe).all())
    heap.free(x)


@pytest.mark.mpi(min_size=1)
@needs_expandable
def test_the_original_stays_alive_while_imported(gpu_heap):
    heap = gpu_heap
    t = fresh(8 * MiB // 4, 1.0, heap.device)
    x = heap.import_external_tensor(t)
    original = weakref.ref(t)
    del t
    gc.collect()
    heap.barrier_all()
    assert original() is not None, "the heap holds the original while imported"
    filler = torch.zeros(8 * MiB // 4, device=heap.device)   # cannot take its memory
    assert bool((x == 1.0).all())
    del x, filler
    gc.collect()
    heap.barrier_all()
    heap.barrier_all()
    assert original() is None, "released once the import is gone on every PE"


@pytest.mark.mpi(min_size=1)
def test_memory_of_the_default_allocator_or_the_host_is_refused_everywhere(gpu_heap):
    heap = gpu_heap
    with pytest.raises(shmemvm.ShmemError) as info:
        heap.import_external_tensor(torch.zeros(16))       # host memory
    assert "copy" in str(info.value)
    x = heap.zeros(16)                                     # the heap goes on
    assert len(set(WORLD.allgather(parts_of(heap).local.offset_of(x)))) == 1
