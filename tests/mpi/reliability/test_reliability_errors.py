"""Issue 25, the errors a PE makes alone: a user's exception that leaves a
`with shmemvm.init():` block while the other PEs are in a collective, a view
passed to realloc/free, and the smaller wrong errors (item 8). Each raises the
same TypeError/ValueError (or SymmetryError where the PEs differ) on every PE,
naming the argument or setting, and leaves the heap usable.

    mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/mpi/reliability/test_reliability_errors.py
"""

from __future__ import annotations

import os
import re
import time
import traceback

import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import SymmetricHeap, SymmetryError
from shmemvm.core.state import parts_of

pytestmark = pytest.mark.mpi

world = MPI.COMM_WORLD

HEAP_OPTIONS = {"backend": "host"}  # the conftest heap fixture, pinned to host memory


def same_everywhere(text: str) -> bool:
    return len(set(world.allgather(text))) == 1


def assert_usable(heap: SymmetricHeap) -> None:
    """The allocators agree and a malloc / put / barrier / get / free round trip works."""
    assert same_everywhere(repr(parts_of(heap).local.allocator_state())), "the PEs' allocators diverged"
    me, n = heap.my_pe, heap.n_pes
    x = heap.zeros(300, torch.uint8)
    heap.put(x, torch.full((300,), 7 + me, dtype=torch.uint8), (me + 1) % n)
    heap.barrier_all()
    assert bool((x == 7 + (me - 1) % n).all())
    heap.free(x)
    heap.barrier_all()


# ---------------------------------------------------------------------------
# item 4: the user's exception is not lost under `with shmemvm.init():`
# ---------------------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
def test_a_users_exception_leaving_the_with_block_is_named_on_every_pe():
    """PE 1 raises ValueError("user bug") between two barriers; the others are in
    the second barrier. PE 1 says that it left (issue 32, item 4) and releases
    its heap without waiting for anyone; the user's exception goes on, its
    traceback intact. The others raise PeerDeadError at once, naming PE 1 and
    its exception, instead of a mismatch report or a wait for the timeout."""
    raised = None
    try:
        with shmemvm.init(heap_size="4M", backend="host", timeout=30) as heap:
            heap.barrier_all()
            if heap.my_pe == 1:
                raise ValueError("user bug")
            heap.barrier_all()
    except (ValueError, shmemvm.PeerDeadError) as exc:
        raised = exc
    assert heap.closed
    shmemvm.finalize()                 # the default heap is gone: a no-op
    if heap.my_pe == 1:
        assert isinstance(raised, ValueError) and str(raised) == "user bug"
        printed = "".join(traceback.format_exception(raised))
        assert 'raise ValueError("user bug")' in printed, printed
    else:
        assert isinstance(raised, shmemvm.PeerDeadError), raised
        message = str(raised)
        assert "PE 1 has left" in message and "ValueError: user bug" in message, message
        assert "barrier_all()" in message, message
    world.Barrier()


@pytest.mark.mpi(min_size=2)
def test_a_pe_arriving_at_finalize_after_another_left_raises_at_once():
    """PE 1 leaves its with block on KeyError while the others are outside
    shmemvm (an MPI barrier, until PE 1 has left); their finalize() then raises
    PeerDeadError at once, naming PE 1 (before: PeerTimeoutError after the
    timeout), and releases the heap all the same."""
    heap = SymmetricHeap(world, heap_size="4M", backend="host", timeout=30)
    raised = None
    start = time.monotonic()
    try:
        with heap:
            if heap.my_pe == 1:
                raise KeyError("lost key")
            world.Barrier()     # outside shmemvm, until PE 1 has left
    except (KeyError, shmemvm.PeerDeadError) as exc:
        raised = exc
    if heap.my_pe == 1:
        world.Barrier()
        assert isinstance(raised, KeyError), raised
    else:
        assert isinstance(raised, shmemvm.PeerDeadError), raised
        assert "PE 1 has left" in str(raised) and "KeyError" in str(raised), raised
        assert time.monotonic() - start < 25     # not the timeout (30 s)
    assert heap.closed


# ---------------------------------------------------------------------------
# item 6: a view is not an allocation
# ---------------------------------------------------------------------------

def test_realloc_and_free_of_a_view_raise_on_every_pe_and_free_nothing(heap):
    r = heap.zeros(16, torch.float32)
    r.copy_(torch.arange(16, dtype=torch.float32) + 100)
    q = heap.zeros(16, torch.float32)
    q.fill_(5)
    live = heap.heap_info()["live_allocations"]
    for call, name in ((lambda: heap.realloc(r[2:], 32), "realloc"),
                       (lambda: heap.free(q[4:8]), "free"),
                       (lambda: heap.free(q[::2]), "free"),
                       (lambda: heap.realloc(q.view(4, 4)[1:], 16), "realloc")):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert same_everywhere(message), message
        assert name in message and "view" in message and "heap offset" in message, message
        assert heap.heap_info()["live_allocations"] == live, "a view's call freed its block"
    # nothing happened to r or q: their elements, and they are still symmetric
    assert r.shape == (16,) and torch.equal(r, torch.arange(16, dtype=torch.float32) + 100)
    assert q.shape == (16,) and bool((q == 5).all())
    heap.put(r, torch.zeros(16), heap.my_pe)
    heap.put(q, torch.ones(16), heap.my_pe)
    heap.barrier_all()
    # a view of the whole block, in another shape or dtype, is the allocation itself
    heap.free(q.view(4, 4))
    grown = heap.realloc(r.view(torch.int32), 128)
    assert grown.dtype == torch.int32 and grown.numel() == 32
    heap.free(grown)
    assert heap.heap_info()["live_allocations"] == live - 2
    assert_usable(heap)


@pytest.mark.mpi(min_size=2)
def test_a_view_on_one_pe_is_a_mismatch_everywhere(heap):
    q = heap.zeros(16, torch.float32)
    live = heap.heap_info()["live_allocations"]
    with pytest.raises(SymmetryError) as info:
        heap.free(q[4:8] if heap.my_pe == 1 else q)
    message = str(info.value)
    assert same_everywhere(message) and "view" in message, message
    assert heap.heap_info()["live_allocations"] == live and q.numel() == 16
    heap.free(q)
    assert_usable(heap)


# ---------------------------------------------------------------------------
# item 8: the smaller wrong errors
# ---------------------------------------------------------------------------

def test_iput_iget_check_pe_also_without_elements(heap):
    x = heap.zeros(8, torch.float32)
    local = torch.ones(8)
    for pe in (heap.n_pes, -1):
        for call in (lambda: heap.iput(x, local, 1, 1, 0, pe),
                     lambda: heap.iget(local, x, 1, 1, 0, pe)):
            with pytest.raises(ValueError, match=rf"pe {pe} is out of range"):
                call()
    with pytest.raises(TypeError, match="pe must be an int"):
        heap.iput(x, local, 1, 1, 0, 0.0)
    heap.free(x)


def test_iput_iget_strides_beyond_a_ptrdiff_are_named(heap):
    x = heap.zeros(8, torch.float32)
    local = torch.arange(8, dtype=torch.float32)
    me = heap.my_pe
    with pytest.raises(ValueError, match=r"iput: dst must be at most 2\*\*63 - 1"):
        heap.iput(x, local, 1 << 63, 1, 1, me)
    with pytest.raises(ValueError, match=r"iget: sst must be at most 2\*\*63 - 1"):
        heap.iget(local, x, 1, 1 << 64, 1, me)
    # one element: any valid stride is the first element
    heap.iput(x, local + 1, (1 << 63) - 1, 1 << 62, 1, me)
    assert x.tolist() == [1.0] + [0.0] * 7
    out = torch.zeros(8)
    heap.iget(out, x, (1 << 63) - 1, 1 << 40, 1, me)
    assert out[0] == 1.0
    heap.barrier_all()
    heap.free(x)


@pytest.mark.parametrize("options, env, setting", [
    ({"heap_size": "100T"}, {}, "SHMEMVM_HEAP_SIZE"),
    ({}, {"SHMEMVM_HEAP_SIZE": "100T"}, "SHMEMVM_HEAP_SIZE"),
    ({"heap_size": "1G", "va_factor": 1000000}, {}, "SHMEMVM_VA_FACTOR"),
    ({"heap_size": "1G"}, {"SHMEMVM_VA_FACTOR": "1000000"}, "SHMEMVM_VA_FACTOR"),
], ids=["heap_size-arg", "heap_size-env", "va_factor-arg", "va_factor-env"])
def test_an_address_space_too_large_names_the_setting(monkeypatch, options, env, setting):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as info:
        SymmetricHeap(world, backend="host", timeout=30, **options)
    message = str(info.value)
    assert same_everywhere(message), message
    assert setting in message and "address space" in message, message
    assert not isinstance(info.value, OSError)


@pytest.mark.mpi(min_size=2)
def test_team_split_strided_config_must_be_the_same_everywhere(heap):
    world_team = heap.team_world()
    config = {"num_contexts": 1 + (heap.my_pe == 1)}
    with pytest.raises(SymmetryError) as info:
        world_team.split_strided(0, 1, heap.n_pes, config)
    message = str(info.value)
    assert same_everywhere(message), message
    assert "num_contexts" in message and "config" in message, message
    team = heap.team_split_strided(world_team, 0, 1, heap.n_pes, {"num_contexts": 2})
    assert team.get_config() == {"num_contexts": 2}
    team.destroy()
    assert_usable(heap)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="DeviceAllReduce on the host heap runs in Triton's interpreter")
@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 0, -1, True, "soon"])
def test_device_allreduce_timeout_is_checked(heap, timeout):
    pytest.importorskip("triton")
    from shmemvm.device.allreduce import DeviceAllReduce

    live = heap.heap_info()["live_allocations"]
    with pytest.raises(ValueError, match="timeout"):
        DeviceAllReduce(heap, timeout=timeout)
    assert heap.heap_info()["live_allocations"] == live
    assert_usable(heap)


# -- item 8, atomics: a value no float holds; a fetch into no memory -----------------------

def test_atomic_set_of_a_value_a_float32_cannot_hold_is_a_value_error(heap):
    x = heap.zeros(1, torch.float32)
    try:
        with pytest.raises(ValueError, match="value"):
            heap.atomic_set(x[0], 2 ** 1100, heap.my_pe)   # (was a raw OverflowError)
    finally:
        heap.barrier_all()
        heap.free(x)


def test_atomic_fetch_add_nbi_refuses_a_fetch_tensor_on_the_meta_device(heap):
    x = heap.zeros(1, torch.int64)
    fetch = torch.empty(1, dtype=torch.int64, device="meta")
    try:
        with pytest.raises((TypeError, ValueError), match="fetch"):
            heap.atomic_fetch_add_nbi(fetch, x[0], 1, heap.my_pe)   # (was accepted, and the old value lost)
            heap.quiet()
    finally:
        heap.barrier_all()
        heap.free(x)
