"""Ownership rules of VMemPow2Allocator (host backend, one process).

- free(t) detaches `t`: it becomes an empty tensor that no longer references
  the block, and using it again raises FreedTensorError.
- Views made before the free keep the block's old memory: they read and write
  it, and the block is not handed out again while one of them lives (reuse is
  deferred). stats() counts such blocks ("deferred_allocations",
  "deferred_bytes"); once the last view dies the next call releases them.
- close() with live tensors or views keeps their memory valid until they die,
  then releases it: no memfd mapping or descriptor is left.

The cases that crash the process where the rules are broken (reading memory
that was unmapped under a live tensor) run in a process of their own,
tests/helpers/ownership_vmem.py.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import shmemvm
from shmemvm import VMemPow2Allocator

G = 64 * 1024           # default host granularity
REPO = Path(__file__).resolve().parents[3]
HELPER = REPO / "tests" / "helpers" / "ownership_vmem.py"


@pytest.fixture
def vheap():
    h = VMemPow2Allocator(64 * G, backend="host", granularity=G)
    yield h
    gc.collect()
    h.close()


def offset_of(h: VMemPow2Allocator, t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() - h.base


def block_range(h: VMemPow2Allocator, t: torch.Tensor) -> tuple[int, int]:
    start = offset_of(h, t)
    return start, start + max(t.untyped_storage().nbytes(), 1)


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def settle(h: VMemPow2Allocator) -> dict:
    """gc, one call that lets the heap release what died, and the stats after it."""
    gc.collect()
    h.free(h.allocate(1))
    return h.stats()


VIEW_MAKERS = {
    "slice": lambda t: t[100:300],
    "strided": lambda t: t[1::3],
    "int32": lambda t: t.view(torch.int32),
    "reshape": lambda t: t.view(-1, 8)[2:],
    "detach": lambda t: t.detach(),
    "set_storage": lambda t: torch.empty(0, dtype=t.dtype).set_(t.untyped_storage()),
}


# ---------------------------------------------------------------------------
# free detaches the tensor itself
# ---------------------------------------------------------------------------

def test_free_without_views_reuses_the_block_at_once(vheap):
    x = vheap.allocate(1000, torch.uint8)
    offset = offset_of(vheap, x)
    vheap.free(x)
    y = vheap.allocate(1000, torch.uint8)
    assert offset_of(vheap, y) == offset
    with pytest.raises(shmemvm.FreedTensorError):
        vheap.free(x)
    assert not vheap.owns_tensor(x)


@pytest.mark.parametrize("nbytes", [0, 100, 4096, G, 3 * G])
def test_free_detaches_the_tensor(vheap, nbytes):
    x = vheap.allocate(nbytes, torch.uint8)
    x.fill_(1)
    vheap.free(x)
    assert x.numel() == 0, f"freed tensor still has {x.numel()} elements"
    assert x.untyped_storage().nbytes() == 0, "freed tensor still references its block"
    with pytest.raises(shmemvm.FreedTensorError):
        vheap.free(x)
    assert not vheap.owns_tensor(x)


def test_detached_tensor_does_not_keep_its_block(vheap):
    """The freed tensor itself is no view: with it alive and no other view,
    the block is reused at once and nothing is deferred."""
    x = vheap.allocate(3 * G, torch.uint8)
    offset = offset_of(vheap, x)
    vheap.free(x)
    stats = vheap.stats()
    assert stats["deferred_allocations"] == 0 and stats["deferred_bytes"] == 0
    y = vheap.allocate(3 * G, torch.uint8)
    assert offset_of(vheap, y) == offset
    y.fill_(2)
    assert x.numel() == 0


# ---------------------------------------------------------------------------
# views made before the free keep the old memory
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [4096, 3 * G])
@pytest.mark.parametrize("kind", sorted(VIEW_MAKERS))
def test_view_made_before_free_keeps_the_old_block(vheap, kind, nbytes):
    x = vheap.allocate(nbytes, torch.uint8)
    x.copy_(torch.arange(nbytes, dtype=torch.int64).remainder(251).to(torch.uint8))
    old = block_range(vheap, x)
    view = VIEW_MAKERS[kind](x)
    expected = view.clone()
    vheap.free(x)
    assert torch.equal(view, expected)
    again = [vheap.allocate(nbytes, torch.uint8) for _ in range(2)]   # the same size class
    for t in again:
        t.fill_(0xEE)
    assert torch.equal(view, expected), "a view of a freed block lost its data"
    for t in again:
        assert not overlaps(block_range(vheap, t), old), "block reused while a view lives"
    view.fill_(7)                                 # writes the old block only
    assert all(bool((t == 0xEE).all()) for t in again)
    assert bool((view == 7).all())


def test_stats_report_deferred_blocks_until_their_views_die(vheap):
    before = vheap.stats()
    assert before["deferred_allocations"] == 0 and before["deferred_bytes"] == 0
    small = vheap.allocate(1000, torch.uint8)      # 1 KiB class
    big = vheap.allocate(3 * G, torch.uint8)       # 256 KiB class, a segment of its own
    small_off, big_off = offset_of(vheap, small), offset_of(vheap, big)
    views = [small[10:], big.view(torch.int64)[::5]]
    vheap.free(small)
    vheap.free(big)
    stats = vheap.stats()
    assert stats["deferred_allocations"] == 2
    assert stats["deferred_bytes"] == 1024 + 4 * G
    views.pop()                                    # big's view dies
    stats = settle(vheap)
    assert stats["deferred_allocations"] == 1 and stats["deferred_bytes"] == 1024
    assert offset_of(vheap, vheap.allocate(3 * G)) == big_off
    views.pop()
    stats = settle(vheap)
    assert stats["deferred_allocations"] == 0 and stats["deferred_bytes"] == 0
    assert offset_of(vheap, vheap.allocate(1000)) == small_off


def test_views_of_a_stale_view_see_the_old_block(vheap):
    """A view made before the free, and views torch makes of it afterwards,
    all reach the old block."""
    x = vheap.allocate(4096, torch.uint8)
    x.fill_(3)
    old = block_range(vheap, x)
    view = x.view(torch.int16)[100:]
    vheap.free(x)
    inner = view[10:20][::2]                       # made after the free, from the stale view
    assert vheap.stats()["deferred_allocations"] == 1
    y = vheap.allocate(4096, torch.uint8)
    y.fill_(9)
    assert not overlaps(block_range(vheap, y), old)
    assert bool((inner == 0x0303).all())
    inner.fill_(0x0101)
    assert bool((view[10:20:2] == 0x0101).all()) and bool((y == 9).all())


def test_stale_view_is_not_a_symmetric_tensor(vheap):
    x = vheap.allocate(4096, torch.uint8)
    view = x[8:]
    vheap.free(x)
    assert not vheap.owns_tensor(view)
    with pytest.raises(shmemvm.FreedTensorError):
        vheap.free(view)
    y = vheap.allocate(4096)
    assert vheap.owns_tensor(y) and not vheap.owns_tensor(view)


def test_view_kept_across_free_and_dropped_tensor_are_independent(vheap):
    """A freed block with a view, and a block whose tensor was merely dropped:
    each is released by its own rule, neither takes the other with it."""
    a = vheap.allocate(512, torch.uint8)
    b = vheap.allocate(512, torch.uint8)
    a.fill_(1)
    b.fill_(2)
    a_view, b_view = a[1:], b[1:]
    vheap.free(a)
    del b                                          # dropped: b_view keeps it live
    stats = settle(vheap)
    assert stats["deferred_allocations"] == 1
    assert stats["live_allocations"] >= 1          # b's block is still in use
    fresh = [vheap.allocate(512) for _ in range(4)]
    for t in fresh:
        t.fill_(0)
    del t  # a loop variable would keep the last block alive
    assert bool((a_view == 1).all()) and bool((b_view == 2).all())
    del a_view, b_view
    stats = settle(vheap)
    assert stats["deferred_allocations"] == 0
    del fresh
    assert settle(vheap)["live_allocations"] == 0


# ---------------------------------------------------------------------------
# close() with live tensors, and budget pressure (own process: may crash)
# ---------------------------------------------------------------------------

def _run_helper(scenario: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("SHMEMVM_HEAP_SIZE", None)
    with tempfile.TemporaryDirectory(prefix="shmemvm-own-") as tmp:
        outfile = os.path.join(tmp, "report.json")
        try:
            proc = subprocess.run([sys.executable, str(HELPER), scenario, outfile], env=env,
                                  cwd=REPO, capture_output=True, text=True, timeout=120)
            returncode, log = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired as exc:
            returncode, log = "timeout", str(exc.stdout or "")[-3000:]
        report = json.loads(Path(outfile).read_text()) if os.path.exists(outfile) else {}
    return {"returncode": returncode, "log": log, **report}


def _assert_report(result: dict) -> None:
    failed = [c for c in result.get("checks", []) if not c["ok"]]
    crashed = result["returncode"] != 0
    summary = (f"returncode {result['returncode']}"
               + (" (killed by SIGSEGV)" if result["returncode"] == -11 else "")
               + f"; last stage {result.get('stage')!r}; failed checks "
               + "; ".join(f"{c['name']} [{c['detail']}]" for c in failed)
               + (f"; error {result['error']}" if result.get("error") else "")
               + f"\n--- log ---\n{result['log']}")
    assert not crashed and result.get("done") and not failed, summary


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_close_keeps_live_tensors_valid_then_releases_everything():
    _assert_report(_run_helper("close_with_views"))


def test_deferred_block_survives_budget_pressure_and_trim():
    _assert_report(_run_helper("evict_deferred"))
