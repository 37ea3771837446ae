"""Ownership rules of the symmetric heap (DESIGN.md, "Ownership").

- Every tensor shmemvm returns (malloc/empty/zeros/calloc/realloc, ptr()) and
  every view torch makes of it keeps its memory alive through its storage. A
  block is reused only when it was freed (explicitly, or by the garbage
  collector on every PE) and no storage on any PE still views it.
- free(x) detaches x (it becomes empty; using it raises FreedTensorError).
  Views made before the free, on any PE (ptr views too), keep the block's old
  memory, and the block is not reused until the last of them is gone;
  heap_info() counts such blocks ("deferred_allocations", "deferred_bytes").
  After the last view dies on every PE, the next collective releases them.
- ptr(x, pe) views exactly x's block on PE pe, and keeps it from being reused.
- realloc(x, n) detaches x like free; views of the old x keep their data.
- Tensors that outlive their heap keep their old data, never alias a later
  heap, and give everything back when they die.
- init/SymmetricHeap take thread_level (THREAD_SINGLE..THREAD_MULTIPLE);
  query_thread() says what is provided; at THREAD_MULTIPLE one thread may do
  put/get/ptr while another allocates.

Run under mpirun -n 1, 2 and 4:

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/memory/test_ownership.py

The cases that kill the process where the rules are broken (SIGSEGV) run in
jobs of their own: tests/jobs/memory/test_ownership_jobs.py.
"""

from __future__ import annotations

import gc
import io
import pickle
import sys
import threading

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import NotSymmetricError, ShmemError, SymmetricHeap
from shmemvm.core.state import parts_of

comm = MPI.COMM_WORLD
mpi = pytest.mark.mpi


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def offset_of(heap: SymmetricHeap, t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() - parts_of(heap).local.base


def block_range(heap: SymmetricHeap, t: torch.Tensor) -> tuple[int, int]:
    start = offset_of(heap, t)
    return start, start + max(t.untyped_storage().nbytes(), 1)


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def pattern(nbytes: int, salt: int, device="cpu") -> torch.Tensor:
    """nbytes bytes, different per salt; as float bits never NaN (bytes < 0x61)."""
    return ((torch.arange(nbytes, dtype=torch.int64) * 7 + salt * 13) % 97).to(
        torch.uint8).to(device)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits as an integer tensor of the same shape (NaN-proof comparison;
    same-size dtype views work for any strides)."""
    return t.view(_BITS[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a).cpu(), bits(b).cpu())


def assert_everywhere(ok, what: str, detail="") -> None:
    """Assert on every PE together, so that a failure on one PE does not leave
    the others waiting in the next collective."""
    results = comm.allgather((bool(ok), str(detail)[:300]))
    bad = [f"PE {pe}: {d}" for pe, (good, d) in enumerate(results) if not good]
    assert not bad, f"{what} -- failed on " + "; ".join(bad)


def settle(heap: SymmetricHeap) -> dict:
    """Let what died here be collected, and one collective release it."""
    gc.collect()
    heap.barrier_all()
    return heap.heap_info()


def raises_freed(call) -> str:
    try:
        call()
    except NotSymmetricError as exc:   # FreedTensorError is one too: the name tells which
        return type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - the wrong kind is the failure
        return f"{type(exc).__name__}: {exc}"
    return "nothing raised"


def symmetric_uses(heap: SymmetricHeap, t: torch.Tensor) -> dict:
    """What put/get/ptr/free of `t` raise (free is collective: every PE calls it)."""
    right = (heap.my_pe + 1) % heap.n_pes
    probe = torch.zeros(t.shape, dtype=t.dtype, device=heap.device)
    return {"put": raises_freed(lambda: heap.put(t, probe, right)),
            "get": raises_freed(lambda: heap.get(probe, t, right)),
            "ptr": raises_freed(lambda: heap.ptr(t, right)),
            "free": raises_freed(lambda: heap.free(t))}


# 1-D tensors of `nbytes` bytes from each way shmemvm hands out memory
MAKERS = {
    "malloc": lambda heap, nbytes: heap.malloc(nbytes),
    "empty": lambda heap, nbytes: heap.empty((nbytes // 4,), torch.int32),
    "zeros": lambda heap, nbytes: heap.zeros((nbytes // 8,), torch.float64),
    "calloc": lambda heap, nbytes: heap.calloc((nbytes // 2,), torch.float16),
    "realloc": lambda heap, nbytes: heap.realloc(heap.malloc(16), nbytes),
}

# views torch makes of a 1-D tensor whose length is a multiple of 4
VIEW_MAKERS = {
    "slice": lambda t: t[10:50],
    "strided": lambda t: t[1::3],
    "bytes": lambda t: t.view(torch.uint8),
    "reshape": lambda t: t.view(-1, 4)[2:],
    "detach": lambda t: t.detach(),
    "set_storage": lambda t: torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.shape, t.stride()),
}


# ---------------------------------------------------------------------------
# free: the tensor itself is detached, without views the block goes at once
# ---------------------------------------------------------------------------

@mpi
def test_free_without_views_releases_at_once(heap):
    x = heap.malloc(1000)
    offset = offset_of(heap, x)
    heap.free(x)
    y = heap.malloc(1000)
    assert offset_of(heap, y) == offset
    assert comm.allgather(offset_of(heap, y)) == [offset] * comm.size
    uses = symmetric_uses(heap, x)
    assert uses == dict.fromkeys(uses, "FreedTensorError")


@mpi
@pytest.mark.parametrize("make", sorted(MAKERS))
def test_free_detaches_the_tensor(heap, make):
    x = MAKERS[make](heap, 4096)
    x.view(torch.uint8).fill_(1)
    heap.free(x)
    assert_everywhere(x.numel() == 0, "a freed tensor becomes empty", f"numel {x.numel()}")
    assert_everywhere(x.untyped_storage().nbytes() == 0,
                      "a freed tensor no longer references its block",
                      f"storage of {x.untyped_storage().nbytes()} bytes")
    uses = symmetric_uses(heap, x)
    assert uses == dict.fromkeys(uses, "FreedTensorError")
    info = heap.heap_info()
    assert_everywhere(info.get("deferred_allocations") == 0 and info.get("deferred_bytes") == 0,
                      "nothing is deferred when no view is left", info)


@mpi
def test_heap_info_reports_deferred_keys(heap):
    info = heap.heap_info()
    assert info.get("deferred_allocations") == 0, info
    assert info.get("deferred_bytes") == 0, info


# ---------------------------------------------------------------------------
# views made before free keep the old block
# ---------------------------------------------------------------------------

@mpi
@pytest.mark.parametrize("nbytes", [4096, 3 << 20])
@pytest.mark.parametrize("make", sorted(MAKERS))
def test_views_made_before_free_keep_the_old_block(heap, make, nbytes):
    x = MAKERS[make](heap, nbytes)
    x.view(torch.uint8).copy_(pattern(nbytes, heap.my_pe, heap.device))
    old = block_range(heap, x)
    views = {kind: view_of(x) for kind, view_of in VIEW_MAKERS.items()}
    expected = {kind: v.clone() for kind, v in views.items()}
    heap.free(x)
    again = [MAKERS[make](heap, nbytes) for _ in range(2)]     # the same size class
    for t in again:
        t.view(torch.uint8).fill_(0xEE)
    lost = [kind for kind, v in views.items() if not same(v, expected[kind])]
    assert_everywhere(not lost, "views of a freed block keep their data after mallocs of "
                                "the same size", f"lost: {lost}")
    reused = [offset_of(heap, t) for t in again if overlaps(block_range(heap, t), old)]
    assert_everywhere(not reused, "a block is not reused while views of it live",
                      f"old block {old}, reused by a tensor at {reused}")
    views["slice"].view(torch.uint8).fill_(7)                # writes the old block only
    assert_everywhere(all(bool((t.view(torch.uint8) == 0xEE).all()) for t in again),
                      "writing a stale view leaves the new blocks alone")


@mpi
def test_heap_info_reports_deferred_blocks_until_their_views_die(heap):
    me, n = heap.my_pe, heap.n_pes
    small = heap.malloc(1000)                         # 1 KiB class
    big = heap.malloc(3 << 20)                        # 4 MiB class, a segment of its own
    small_offset, big_offset = offset_of(heap, small), offset_of(heap, big)
    heap.barrier_all()
    big_view = heap.ptr(big, (me + 1) % n) if n > 1 else big[::2]
    small_view = small[10:]
    heap.free(small)
    heap.free(big)
    info = heap.heap_info()
    assert_everywhere(info.get("deferred_allocations") == 2
                      and info.get("deferred_bytes") == 1024 + (4 << 20),
                      "heap_info counts both deferred blocks and their size classes", info)
    del big_view
    info = settle(heap)
    assert_everywhere(info.get("deferred_allocations") == 1
                      and info.get("deferred_bytes") == 1024,
                      "the block whose last view died is released at the next collective", info)
    again = heap.malloc(3 << 20)
    assert_everywhere(offset_of(heap, again) == big_offset,
                      "the released block is handed out again", offset_of(heap, again))
    del small_view
    info = settle(heap)
    assert_everywhere(info.get("deferred_allocations") == 0 and info.get("deferred_bytes") == 0,
                      "nothing deferred once every view died", info)
    assert_everywhere(offset_of(heap, heap.malloc(1000)) == small_offset,
                      "the small block is handed out again")


@pytest.mark.mpi(min_size=2)
def test_view_held_on_one_pe_defers_reuse_on_every_pe(heap):
    me = heap.my_pe
    x = heap.malloc(4096)
    x.copy_(pattern(4096, me, heap.device))
    old = block_range(heap, x)
    keep = x[100:] if me == 0 else None
    heap.free(x)
    info = settle(heap)
    assert_everywhere(info.get("deferred_allocations") == 1,
                      "a view on PE 0 defers the block on every PE", info)
    y = heap.malloc(4096)
    y.fill_(0xEE)
    assert_everywhere(me != 0 or same(keep, pattern(4096, me)[100:]),
                      "PE 0's view keeps its data after a malloc of the same size")
    assert_everywhere(not overlaps(block_range(heap, y), old),
                      "no PE reuses a block that a view on PE 0 keeps", block_range(heap, y))
    del keep
    info = settle(heap)
    assert_everywhere(info.get("deferred_allocations") == 0, "released once PE 0's view died",
                      info)
    assert_everywhere(offset_of(heap, heap.malloc(4096)) == old[0],
                      "the released block is handed out again")


@mpi
def test_views_of_a_stale_view_reach_the_old_block(heap):
    x = heap.malloc(4096)
    x.fill_(3)
    old = block_range(heap, x)
    view = x.view(torch.int16)[100:]
    heap.free(x)
    inner = view[10:20][::2]                          # made after the free, from the stale view
    y = heap.malloc(4096)
    y.fill_(9)
    assert_everywhere(bool((inner == 0x0303).all()), "a view of a stale view reads the old block",
                      inner.tolist())
    assert_everywhere(not overlaps(block_range(heap, y), old), "the old block is not reused")
    inner.fill_(0x0101)
    assert_everywhere(bool((view[10:20:2] == 0x0101).all()) and bool((y == 9).all()),
                      "writes through it reach the old block only")


@mpi
def test_stale_views_are_not_symmetric_tensors(heap):
    right = (heap.my_pe + 1) % heap.n_pes
    x = heap.malloc(4096)
    heap.barrier_all()
    own = x[8:]
    remote = heap.ptr(x[8:], right)
    heap.free(x)
    probe = torch.zeros(4088, dtype=torch.uint8, device=heap.device)
    # a view of a freed block: FreedTensorError; a view of a peer's memory never was a
    # symmetric tensor of this PE's heap (before the free neither): NotSymmetricError
    # (with one PE, ptr(x, me) is x's own view)
    remote_error = "FreedTensorError" if right == heap.my_pe else "NotSymmetricError"
    for view, error in ((own, "FreedTensorError"), (remote, remote_error)):
        assert raises_freed(lambda: heap.put(view, probe, right)) == error
        assert raises_freed(lambda: heap.get(probe, view, right)) == error
    heap.barrier_all()


# ---------------------------------------------------------------------------
# ptr views
# ---------------------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shape, dtype", [((1000,), torch.float32), ((64, 33), torch.int64),
                                          ((0,), torch.float32), ((3 << 20,), torch.uint8)],
                         ids=["float32-1000", "int64-64x33", "empty", "uint8-3MiB"])
def test_ptr_view_storage_is_exactly_the_block(heap, shape, dtype):
    me, n = heap.my_pe, heap.n_pes
    right = (me + 1) % n
    x = heap.empty(shape, dtype)
    nbytes = x.numel() * x.element_size()
    x.view(torch.uint8).view(-1).copy_(pattern(nbytes, me, heap.device))
    heap.barrier_all()
    parts = {"whole": x, "slice": x[3:7], "strided": x[1::2]}
    if x.dim() == 2:
        parts["columns"] = x[:, 5:]
    problems = []
    for name, part in parts.items():
        view = heap.ptr(part, right)
        if view.untyped_storage().nbytes() != x.untyped_storage().nbytes():
            problems.append(f"{name}: storage of {view.untyped_storage().nbytes()} bytes, "
                            f"block {x.untyped_storage().nbytes()}")
        if (view.shape, view.stride(), view.storage_offset()) != (
                part.shape, part.stride(), part.storage_offset()):
            problems.append(f"{name}: {view.shape} {view.stride()} {view.storage_offset()} vs "
                            f"{part.shape} {part.stride()} {part.storage_offset()}")
        peer = pattern(nbytes, right).view(dtype).view(shape) if nbytes else x.cpu()
        region = {"whole": peer, "slice": peer[3:7], "strided": peer[1::2],
                  "columns": peer[:, 5:] if x.dim() == 2 else None}[name]
        if not same(view, region):
            problems.append(f"{name}: wrong data")
    heap.barrier_all()
    assert_everywhere(not problems, "ptr() views exactly the block, like the tensor", problems)


@pytest.mark.mpi(min_size=2)
def test_ptr_view_clone_str_repr(heap):
    me, n = heap.my_pe, heap.n_pes
    right = (me + 1) % n
    x = heap.empty((64, 33), torch.int64)
    x.copy_(torch.arange(64 * 33).reshape(64, 33) + 10_000 * me)
    heap.barrier_all()
    expected = torch.arange(64 * 33).reshape(64, 33) + 10_000 * right
    for view, want in ((heap.ptr(x, right), expected), (heap.ptr(x[3:7, 5:], right),
                                                        expected[3:7, 5:])):
        assert torch.equal(view.clone().cpu(), want)
        assert str(view.cpu()) == str(want) and repr(view.cpu()) == repr(want)
    heap.barrier_all()


@mpi
def test_own_tensors_save_pickle_and_print(heap):
    x = heap.empty((64, 33), torch.int64)
    x.copy_(torch.arange(64 * 33).reshape(64, 33))
    for t in (x, x[3:7, 5:], x.view(torch.uint8)[8:]):
        buffer = io.BytesIO()
        torch.save(t, buffer)
        buffer.seek(0)
        assert torch.equal(torch.load(buffer), t)
        assert torch.equal(pickle.loads(pickle.dumps(t)), t)
        assert str(t) == str(t.clone())
    heap.free(x)


@pytest.mark.mpi(min_size=2)
def test_ptr_view_keeps_the_peer_block_after_free(heap):
    me, n = heap.my_pe, heap.n_pes
    right = (me + 1) % n
    x = heap.malloc(4096)
    x.copy_(pattern(4096, me, heap.device))
    old = block_range(heap, x)
    heap.barrier_all()
    whole, part = heap.ptr(x, right), heap.ptr(x[100:200], right)
    heap.free(x)
    y = heap.malloc(4096)
    y.fill_(0xEE)
    heap.barrier_all()
    assert_everywhere(same(whole, pattern(4096, right)) and same(part, pattern(4096, right)[100:200]),
                      "a ptr view of a freed block keeps reading the peer's old data")
    assert_everywhere(not overlaps(block_range(heap, y), old),
                      "a block viewed by a peer's ptr view is not reused")
    info = heap.heap_info()
    assert_everywhere(info.get("deferred_allocations") == 1, "the block is deferred", info)
    heap.barrier_all()
    whole.fill_(5)                                    # writes the peer's old block
    heap.barrier_all()
    assert_everywhere(bool((y == 0xEE).all()),
                      "a write through a stale ptr view leaves the peer's new block alone")
    del whole, part
    info = settle(heap)
    assert_everywhere(info.get("deferred_allocations") == 0, "released once the views died", info)


@pytest.mark.mpi(min_size=2)
def test_ptr_view_keeps_a_block_every_pe_dropped(heap):
    me, n = heap.my_pe, heap.n_pes
    right = (me + 1) % n
    x = heap.malloc(4096)
    x.copy_(pattern(4096, me, heap.device))
    old = block_range(heap, x)
    heap.barrier_all()
    remote = heap.ptr(x, right) if me == 0 else None
    del x                                             # dropped everywhere: GC'd on every PE
    settle(heap)
    y = heap.malloc(4096)
    y.fill_(0xEE)
    heap.barrier_all()
    assert_everywhere(me != 0 or same(remote, pattern(4096, right)),
                      "PE 0's ptr view keeps the data of a block every PE dropped")
    assert_everywhere(not overlaps(block_range(heap, y), old),
                      "a dropped block that a ptr view keeps is not reused")
    heap.barrier_all()
    del remote
    settle(heap)
    assert_everywhere(offset_of(heap, heap.malloc(4096)) == old[0],
                      "released once the ptr view died")


# ---------------------------------------------------------------------------
# realloc
# ---------------------------------------------------------------------------

@mpi
def test_realloc_without_views_stays_in_place(heap):
    x = heap.empty(100, torch.int32)
    x.copy_(torch.arange(100, dtype=torch.int32))
    offset = offset_of(heap, x)
    y = heap.realloc(x, 120 * 4)                      # the same 512-byte class
    assert offset_of(heap, y) == offset
    assert torch.equal(y[:100].cpu(), torch.arange(100, dtype=torch.int32))


@mpi
def test_realloc_detaches_the_tensor(heap):
    x = heap.empty(100, torch.int32)
    y = heap.realloc(x, 120 * 4)
    assert_everywhere(x.numel() == 0 and x.untyped_storage().nbytes() == 0,
                      "realloc leaves the old tensor empty", x.numel())
    uses = symmetric_uses(heap, x)
    assert uses == dict.fromkeys(uses, "FreedTensorError")
    assert y.numel() == 120


@mpi
@pytest.mark.parametrize("new_nbytes", [120 * 4, 100_000 * 4])
def test_realloc_with_views_keeps_their_old_data(heap, new_nbytes):
    expected = torch.arange(100, dtype=torch.int32)
    x = heap.empty(100, torch.int32)
    x.copy_(expected)
    old = block_range(heap, x)
    view = x[:50]
    y = heap.realloc(x, new_nbytes)
    assert_everywhere(torch.equal(y[:100].cpu(), expected), "realloc keeps the contents")
    y.fill_(-1)
    assert_everywhere(torch.equal(view.cpu(), expected[:50]),
                      "a view of the old tensor keeps its data after realloc", view[:8].tolist())
    assert_everywhere(not overlaps(block_range(heap, y), old),
                      "realloc does not reuse a block that a view keeps")
    assert_everywhere(x.numel() == 0, "realloc leaves the old tensor empty")


@pytest.mark.mpi(min_size=2)
def test_realloc_with_ptr_view_on_one_pe_moves_on_every_pe(heap):
    me, n = heap.my_pe, heap.n_pes
    right = (me + 1) % n
    x = heap.malloc(1000)
    x.copy_(pattern(1000, me, heap.device))
    old = block_range(heap, x)
    heap.barrier_all()
    remote = heap.ptr(x, right) if me == 0 else None
    y = heap.realloc(x, 1020)                         # the same 1 KiB class
    y.fill_(0xEE)
    heap.barrier_all()
    assert_everywhere(me != 0 or same(remote, pattern(1000, right)),
                      "PE 0's ptr view keeps the old data after realloc")
    assert_everywhere(not overlaps(block_range(heap, y), old),
                      "realloc moves the block on every PE when a view of it exists anywhere")
    heap.barrier_all()


# ---------------------------------------------------------------------------
# finalize
# ---------------------------------------------------------------------------

@mpi
def test_finalized_heap_refuses_its_tensors():
    h = SymmetricHeap(comm, heap_size="4M", backend="host", timeout=30)
    x = h.malloc(100)
    view = x[10:]
    h.finalize()
    probe = torch.zeros(100, dtype=torch.uint8)
    for call in (lambda: h.put(x, probe, h.my_pe), lambda: h.get(probe, x, h.my_pe),
                 lambda: h.ptr(x, h.my_pe), lambda: h.free(x), lambda: h.put(view, probe[10:], 0)):
        with pytest.raises(ShmemError):
            call()
    del x, view
    gc.collect()


# ---------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------

@mpi
def test_thread_level_constants():
    levels = (shmemvm.THREAD_SINGLE, shmemvm.THREAD_FUNNELED, shmemvm.THREAD_SERIALIZED,
              shmemvm.THREAD_MULTIPLE)
    assert levels == (0, 1, 2, 3)
    assert levels == (MPI.THREAD_SINGLE, MPI.THREAD_FUNNELED, MPI.THREAD_SERIALIZED,
                      MPI.THREAD_MULTIPLE)


@mpi
def test_query_thread_says_what_is_provided():
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        pytest.skip("MPI was not initialized at MPI_THREAD_MULTIPLE")
    for level in (shmemvm.THREAD_SINGLE, shmemvm.THREAD_SERIALIZED, shmemvm.THREAD_MULTIPLE):
        h = SymmetricHeap(comm, heap_size="1M", backend="host", timeout=30, thread_level=level)
        try:
            provided = h.query_thread()
            # OpenSHMEM: at least what was asked where the library can give it
            assert level <= provided <= shmemvm.THREAD_MULTIPLE, (level, provided)
            if level == shmemvm.THREAD_MULTIPLE:
                assert provided == shmemvm.THREAD_MULTIPLE
        finally:
            h.finalize()
    with shmemvm.init(heap_size="1M", backend="host", timeout=30,
                      thread_level=shmemvm.THREAD_MULTIPLE) as heap:
        assert shmemvm.query_thread() == shmemvm.THREAD_MULTIPLE
        assert heap.query_thread() == shmemvm.THREAD_MULTIPLE


RMA_BYTES = 64 << 10
ALLOC_SIZES = (2 << 20, 1 << 20, 512 << 10, 256 << 10, 128 << 10, 64 << 10)  # cycled: evicts


@mpi
def test_thread_multiple_rma_while_another_thread_allocates():
    """One thread does put/get/ptr on live tensors (checking every byte) while
    the main thread mallocs and frees sizes that make a 4 MiB heap evict its
    cached segments again and again."""
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        pytest.skip("MPI was not initialized at MPI_THREAD_MULTIPLE")
    heap = SymmetricHeap(comm, heap_size="4M", backend="host", timeout=30,
                         thread_level=shmemvm.THREAD_MULTIPLE)
    interval = sys.getswitchinterval()
    try:
        assert heap.query_thread() == shmemvm.THREAD_MULTIPLE
        me, n = heap.my_pe, heap.n_pes
        right = (me + 1) % n
        live = heap.malloc(RMA_BYTES)
        live.copy_(pattern(RMA_BYTES, me))
        mailbox = heap.zeros(RMA_BYTES, torch.uint8)   # written only by the left neighbour
        heap.barrier_all()
        stop = threading.Event()
        errors: list[str] = []
        rounds = [0]

        def rma() -> None:
            mine, theirs = pattern(RMA_BYTES, me), pattern(RMA_BYTES, right)
            buffer = torch.empty(RMA_BYTES, dtype=torch.uint8)
            try:
                while not stop.is_set():
                    k = rounds[0]
                    heap.get(buffer, live, right)
                    if not torch.equal(buffer, theirs):
                        errors.append(f"round {k}: get from PE {right} read wrong data")
                    view = heap.ptr(live, right)
                    if view is not None and not torch.equal(view, theirs):
                        errors.append(f"round {k}: ptr view of PE {right} reads wrong data")
                    part = heap.ptr(live[100:300], right)
                    if part is not None and not torch.equal(part, theirs[100:300]):
                        errors.append(f"round {k}: ptr view of a slice reads wrong data")
                    value = k % 250 + 1
                    heap.put(mailbox[k % 64::64], torch.full_like(mailbox[k % 64::64], value),
                             right)
                    heap.get(buffer[:1024], mailbox[:1024], right)
                    if int(buffer[k % 64]) != value:
                        errors.append(f"round {k}: put to PE {right} was not read back")
                    heap.get(buffer, live, me)
                    if not torch.equal(buffer, mine):
                        errors.append(f"round {k}: own data changed")
                    rounds[0] = k + 1
                    if len(errors) > 5:
                        return
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(f"round {rounds[0]}: {type(exc).__name__}: {exc}")

        sys.setswitchinterval(1e-4)
        worker = threading.Thread(target=rma, daemon=True)
        worker.start()
        try:
            for i in range(40):                            # the same count on every PE (~1.5 s)
                size = ALLOC_SIZES[i % len(ALLOC_SIZES)]
                t = heap.malloc(size)
                t.fill_(i % 200)
                if not bool((t == i % 200).all()):
                    errors.append(f"allocation {i} of {size} bytes was overwritten")
                if i % 3 == 0:
                    del t                                  # for the collector
                else:
                    heap.free(t)
        finally:
            stop.set()
            worker.join(30)
        sys.setswitchinterval(interval)
        assert not worker.is_alive(), "the RMA thread hangs"
        generations = [g for _, _, _, g in parts_of(heap).local.get_allocation_segments()]
        heap.barrier_all()
        assert_everywhere(not errors, "RMA in one thread while another allocates", errors[:5])
        assert_everywhere(rounds[0] > 10, "the RMA thread ran alongside", rounds[0])
        assert_everywhere(max(generations, default=0) >= 2,
                          "the allocations evicted and re-created segments", generations)
        del live, mailbox
        gc.collect()
    finally:
        sys.setswitchinterval(interval)
        heap.finalize()
