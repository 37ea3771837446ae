"""Run by tests/unit/memory/test_vmm_ownership.py in a process of its own:

    python tests/helpers/ownership_vmem.py SCENARIO OUTFILE

The cases where a tensor of a VMemPow2Allocator outlives its block's place
in the heap (close() with live views, budget pressure on a deferred block).
Where the allocator unmaps memory that a tensor still views, reading that
tensor kills the process (SIGSEGV); here that fails one test instead of the
whole pytest run. Every check is written to OUTFILE (JSON) as soon as it is
made, so a crash still shows how far the scenario got.

Scenarios:
  close_with_views   close() while tensors and views of it are alive: they
                     keep their data and never alias a later heap; once they
                     die nothing is left (memfd mappings, descriptors)
  evict_deferred     a freed block kept by a view is never evicted under
                     budget pressure nor by trim(); released once the view dies
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

from shmemvm import (FreedTensorError, HeapExhaustedError, NotSymmetricError,  # noqa: E402
                     ShmemError, VMemPow2Allocator)
from util import open_fds, shmemvm_mappings  # noqa: E402

G = 64 * 1024


class Report:
    def __init__(self, path: str):
        self.path = path
        self.data = {"checks": [], "done": False, "error": None, "stage": "start"}
        self.write()

    def write(self) -> None:
        with open(self.path + ".tmp", "w") as out:
            json.dump(self.data, out, indent=1)
        os.replace(self.path + ".tmp", self.path)

    def run(self, scenario) -> None:
        """scenario(self), its end or its traceback recorded, then written."""
        try:
            scenario(self)
            self.data["done"] = True
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.data["error"] = "".join(traceback.format_exception(exc))[-3000:]
        self.write()

    def stage(self, name: str) -> None:
        """About to do something that may crash the process."""
        self.data["stage"] = name
        self.write()

    def check(self, name: str, ok, detail: str = "") -> None:
        self.data["checks"].append({"name": name, "ok": bool(ok), "detail": str(detail)[:500]})
        self.write()

    def check_nothing_left(self, fds_before: set) -> None:
        """No shmemvm mapping and no descriptor beyond `fds_before` remain."""
        self.check("no shmemvm mappings left", shmemvm_mappings() == [], shmemvm_mappings())
        after = open_fds()
        self.check("no descriptors left", after == fds_before,
                   f"new {sorted(after - fds_before)}, gone {sorted(fds_before - after)}")


def raises(call, *types) -> str | None:
    """The name of the exception `call` raised if it is one of `types`, else None."""
    try:
        call()
    except types as exc:
        return type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - the wrong kind is reported, not raised
        return f"wrong: {type(exc).__name__}: {exc}"
    return None


def close_with_views(report: Report) -> None:
    warm = VMemPow2Allocator(8 * G, backend="host", granularity=G)
    warm.allocate(10).fill_(1)
    warm.close()
    gc.collect()
    fds_before = open_fds()
    report.check("no shmemvm mappings at the start", shmemvm_mappings() == [], shmemvm_mappings())

    h1 = VMemPow2Allocator(16 * G, backend="host", granularity=G)
    small = h1.allocate(1000, torch.uint8)
    small.fill_(3)
    big = h1.allocate(3 * G, torch.uint8)          # a segment of its own
    big.fill_(4)
    small_view = small[10:20]
    big_view = big.view(torch.int32)[5:]
    report.stage("close h1")
    h1.close()
    report.check("h1 is closed", h1.closed)

    h2 = VMemPow2Allocator(16 * G, backend="host", granularity=G)
    later = [h2.allocate(1000, torch.uint8), h2.allocate(3 * G, torch.uint8),
             h2.allocate(8 * G, torch.uint8)]
    for t in later:
        t.fill_(9)
    del t  # a loop variable would keep the last tensor (and its memory) alive
    report.stage("read tensors of the closed heap")
    report.check("own tensor keeps its data after close()", bool((small == 3).all()),
                 small[:16].tolist())
    report.check("slice keeps its data after close()", bool((small_view == 3).all()))
    report.check("segment tensor keeps its data after close()", bool((big == 4).all()))
    report.check("int32 view keeps its data after close()",
                 bool((big_view == 0x04040404).all()))
    report.stage("write tensors of the closed heap")
    small.fill_(7)
    big_view.fill_(-1)
    report.check("writing the closed heap's tensors leaves the new heap alone",
                 all(bool((t == 9).all()) for t in later))
    report.check("closed heap's tensor reads what was written", bool((small_view == 7).all()))

    report.check("free() on the closed heap raises ShmemError",
                 raises(lambda: h1.free(small), ShmemError) is not None)
    report.check("another heap refuses the tensor (NotSymmetricError: never its own)",
                 raises(lambda: h2.free(small), NotSymmetricError) == "NotSymmetricError")
    report.check("owns_tensor is False for the closed heap's tensor",
                 not h1.owns_tensor(small) and not h2.owns_tensor(small))

    report.stage("drop the closed heap's tensors")
    del small, big, small_view, big_view
    gc.collect()
    h2.close()
    del later
    gc.collect()
    report.check_nothing_left(fds_before)


def evict_deferred(report: Report) -> None:
    h = VMemPow2Allocator(2 * G, backend="host", granularity=G)
    a = h.allocate(G, torch.uint8)
    a.fill_(5)
    view = a[1:]
    h.free(a)
    report.check("free() detaches the tensor", a.numel() == 0, a.numel())
    report.check("stats report one deferred block", h.stats().get("deferred_allocations") == 1,
                 h.stats())
    report.stage("budget pressure")
    try:
        b = h.allocate(2 * G, torch.uint8)            # would need the deferred block's memory
        b.fill_(6)
        overlaps = b.data_ptr() <= view.data_ptr() < b.data_ptr() + b.numel()
        outcome = f"allocated at {b.data_ptr():#x}"
    except HeapExhaustedError:
        b, overlaps, outcome = None, False, "HeapExhaustedError"
    report.check("a request for the whole budget does not take the deferred block",
                 not overlaps, outcome)
    del b
    report.stage("trim")
    h.trim()
    c = h.allocate(G, torch.uint8)
    c.fill_(8)
    report.stage("read the view after pressure and trim")
    report.check("view keeps its data under budget pressure and trim()",
                 bool((view == 5).all()), view[:8].tolist())
    report.check("the block a view keeps is not handed out again",
                 not (c.data_ptr() <= view.data_ptr() < c.data_ptr() + c.numel()))
    del view
    gc.collect()
    h.free(c)
    stats = h.stats()
    report.check("deferred block released once its view died",
                 stats.get("deferred_allocations") == 0 and stats.get("deferred_bytes") == 0,
                 stats)
    report.stage("whole budget after release")
    try:
        d = h.allocate(2 * G, torch.uint8)
        d.fill_(1)
        ok = int(d.sum()) == 2 * G
    except HeapExhaustedError as exc:
        ok = f"HeapExhaustedError: {exc}"
    report.check("the whole budget is available again", ok is True, ok)
    h.close()


SCENARIOS = {"close_with_views": close_with_views, "evict_deferred": evict_deferred}


def main() -> None:
    faulthandler.enable()
    faulthandler.dump_traceback_later(100, exit=True)
    scenario, outfile = sys.argv[1], sys.argv[2]
    Report(outfile).run(SCENARIOS[scenario])


if __name__ == "__main__":
    main()
