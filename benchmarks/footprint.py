"""Physical bytes per requested byte on a mixed workload.

The workload is the tensor traffic of training steps of a small GPT-style
transformer (fp32 parameters, gradients and AdamW states; the activations a
naive attention implementation saves in forward and frees in backward, with
the temporaries of both passes). It runs through a symmetric heap of its own
(collective empty/free on every PE, memory never touched) and the heap's
mapped bytes are sampled after every allocation.

Baseline: a bump (arena) allocator fed the same requests: persistent tensors
(parameters, gradients, optimizer states) bump-allocated once, every other
tensor bump-allocated in a per-step arena that is reset when the step ends,
both with 64-byte alignment and physical memory in granularity pieces.

Second workload: many small and medium tensors alive at once (64 KiB and
8 KiB, on every PE), counting what the heap holds of the process's limited
resources: open file descriptors (RLIMIT_NOFILE) and shmemvm's memory
mappings (vm.max_map_count; host backend, read from /proc/self/maps).
Baseline: one segment per allocation, which costs one descriptor and one
mapping per PE of the node for each allocation.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from .common import Bench, MiB

ALIGN = 64


@dataclass(frozen=True)
class Model:
    vocab: int = 8192
    d_model: int = 512
    heads: int = 8
    layers: int = 4
    batch: int = 4
    seq: int = 256
    steps: int = 3
    itemsize: int = 4


QUICK = Model(vocab=1024, d_model=128, heads=4, layers=1, batch=2, seq=64, steps=2)


def workload(m: Model) -> list[tuple]:
    """Events: ("alloc", name, nbytes, persistent) and ("free", name), ("step",)."""
    events: list[tuple] = []
    live: dict[str, int] = {}
    b, s, d, h, v, e = m.batch, m.seq, m.d_model, m.heads, m.vocab, m.itemsize

    def alloc(name, *shape, persistent=False, itemsize=e):
        n = itemsize
        for extent in shape:
            n *= extent
        events.append(("alloc", name, n, persistent))
        live[name] = n

    def free(*names):
        for name in names:
            events.append(("free", name))
            del live[name]

    params = {"tok_emb": (v, d), "pos_emb": (s, d), "lnf.w": (d,), "lnf.b": (d,)}
    for l in range(m.layers):
        params.update({f"{l}.ln1.w": (d,), f"{l}.ln1.b": (d,), f"{l}.qkv.w": (3 * d, d),
                       f"{l}.qkv.b": (3 * d,), f"{l}.proj.w": (d, d), f"{l}.proj.b": (d,),
                       f"{l}.ln2.w": (d,), f"{l}.ln2.b": (d,), f"{l}.fc.w": (4 * d, d),
                       f"{l}.fc.b": (4 * d,), f"{l}.out.w": (d, 4 * d), f"{l}.out.b": (d,)})
    for name, shape in params.items():
        alloc(name, *shape, persistent=True)

    for step in range(m.steps):
        first = step == 0
        # forward
        alloc("ids", b, s, itemsize=8)
        alloc("x0", b, s, d)
        for l in range(m.layers):
            alloc(f"{l}.ln1", b, s, d), alloc(f"{l}.ln1.mean", b, s), alloc(f"{l}.ln1.rstd", b, s)
            alloc(f"{l}.qkv", b, s, 3 * d)
            alloc("scores", b, h, s, s)
            alloc(f"{l}.probs", b, h, s, s)
            free("scores")
            alloc(f"{l}.attn", b, s, d)
            alloc("proj", b, s, d)
            alloc(f"{l}.x1", b, s, d)
            free("proj")
            alloc(f"{l}.ln2", b, s, d), alloc(f"{l}.ln2.mean", b, s), alloc(f"{l}.ln2.rstd", b, s)
            alloc(f"{l}.fc", b, s, 4 * d)
            alloc(f"{l}.gelu", b, s, 4 * d)
            alloc("mlp", b, s, d)
            alloc(f"x{l + 1}", b, s, d)
            free("mlp")
        top = f"x{m.layers}"
        alloc("lnf", b, s, d), alloc("lnf.mean", b, s), alloc("lnf.rstd", b, s)
        alloc("logits", b, s, v)
        alloc("lse", b, s)
        alloc("loss", 1)
        # backward
        alloc("dlogits", b, s, v)
        free("logits", "lse")
        if first:
            alloc("grad.tok_emb", v, d, persistent=True)
        alloc("dlnf", b, s, d)
        free("dlogits")
        if first:
            alloc("grad.lnf.w", d, persistent=True), alloc("grad.lnf.b", d, persistent=True)
        alloc("dx", b, s, d)
        free("dlnf", "lnf", "lnf.mean", "lnf.rstd", top)
        for l in reversed(range(m.layers)):
            def grads(*names):
                if first:
                    for name in names:
                        alloc(f"grad.{l}.{name}", *params[f"{l}.{name}"], persistent=True)
            alloc("dgelu", b, s, 4 * d)
            grads("out.w", "out.b")
            free(f"{l}.gelu")
            alloc("dfc", b, s, 4 * d)
            free("dgelu", f"{l}.fc")
            grads("fc.w", "fc.b")
            alloc("dln2", b, s, d)
            free("dfc")
            grads("ln2.w", "ln2.b")
            alloc("dx1", b, s, d)
            free("dln2", f"{l}.ln2", f"{l}.ln2.mean", f"{l}.ln2.rstd", f"{l}.x1", "dx")
            alloc("dattn", b, s, d)
            grads("proj.w", "proj.b")
            alloc("dprobs", b, h, s, s)
            alloc("dscores", b, h, s, s)
            free("dprobs", f"{l}.probs")
            alloc("dqkv", b, s, 3 * d)
            free("dscores", "dattn", f"{l}.attn", f"{l}.qkv")
            grads("qkv.w", "qkv.b")
            alloc("dln1", b, s, d)
            free("dqkv")
            grads("ln1.w", "ln1.b")
            alloc("dx", b, s, d)
            free("dln1", f"{l}.ln1", f"{l}.ln1.mean", f"{l}.ln1.rstd", "dx1", f"x{l}")
        if first:
            alloc("grad.pos_emb", s, d, persistent=True)
        free("dx", "ids", "loss")
        # AdamW: states on the first step, one temporary per parameter
        for name, shape in params.items():
            if first:
                alloc(f"adam.m.{name}", *shape, persistent=True)
                alloc(f"adam.v.{name}", *shape, persistent=True)
            alloc("denom", *shape)
            free("denom")
        assert all(name in params or name.startswith(("grad.", "adam.")) for name in live), \
            sorted(n for n in live if n not in params and not n.startswith(("grad.", "adam.")))
        events.append(("step",))
    return events


def bump_peak(events: list[tuple], granularity: int) -> int:
    """Peak physical bytes of a bump allocator with a per-step arena."""
    persistent = arena = peak = 0
    for event in events:
        if event[0] == "alloc":
            size = -(-event[2] // ALIGN) * ALIGN
            if event[3]:
                persistent += size
            else:
                arena += size
            peak = max(peak, -(-persistent // granularity) * granularity
                       + -(-arena // granularity) * granularity)
        elif event[0] == "step":
            arena = 0
    return peak


def run(bench: Bench) -> None:
    from shmemvm.heap import SymmetricHeap

    model = QUICK if bench.options.quick else Model()
    events = workload(model)
    heap_size = "256M" if bench.options.quick else "2G"
    bench.progress("footprint: %d allocations of a transformer training workload (%d steps)",
                   sum(1 for e in events if e[0] == "alloc"), model.steps)
    heap = SymmetricHeap(bench.comm, heap_size=heap_size, backend=bench.heap.backend.name,
                         timeout=bench.heap.timeout)
    try:
        tensors: dict[str, torch.Tensor] = {}
        requested = peak_requested = peak_mapped = peak_in_use = 0
        for event in events:
            if event[0] == "alloc":
                _, name, nbytes, _ = event
                tensors[name] = heap.empty((nbytes,), torch.uint8)
                requested += nbytes
                info = heap.heap_info()
                peak_requested = max(peak_requested, requested)
                peak_mapped = max(peak_mapped, info["mapped"])
                peak_in_use = max(peak_in_use, info["mapped"] - info["cached"])
            elif event[0] == "free":
                tensor = tensors.pop(event[1])
                requested -= tensor.numel()
                heap.free(tensor)
        for tensor in tensors.values():
            heap.free(tensor)
        granularity = heap.backend.granularity
    finally:
        heap.finalize()
    bump = bump_peak(events, granularity)
    params = {"workload": "transformer training step", **asdict(model), "heap_size": heap_size,
              "granularity": granularity, "peak_requested_bytes": peak_requested}
    # one deterministic figure each (a single sample): the workload is replayed once
    bench.record("footprint.physical_per_requested", params, [peak_mapped / peak_requested],
                 "B/B", "bump arena allocator", [bump / peak_requested], "lower")
    bench.record("footprint.in_use_per_requested", params, [peak_in_use / peak_requested],
                 "B/B", "bump arena allocator", [bump / peak_requested], "lower")
    bench.record("footprint.peak_physical", params, [peak_mapped / MiB], "MiB",
                 "bump arena allocator", [bump / MiB], "lower")
    run_many(bench)


def open_fd_count() -> int:
    """Descriptors this process holds now."""
    return len(os.listdir("/proc/self/fd"))


def shmemvm_mapping_count() -> int:
    """Mappings of shmemvm's memory in this process (host backend's memfd pieces)."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if "memfd:shmemvm" in line)


def run_many(bench: Bench) -> None:
    """Many small and medium tensors alive at once: descriptors and mappings held."""
    from shmemvm.heap import SymmetricHeap

    count = 500 if bench.options.quick else 4000
    sizes = (64 << 10, 8 << 10)
    heap_size = "1G"
    fds_before = open_fd_count()
    heap = SymmetricHeap(bench.comm, heap_size=heap_size, backend=bench.heap.backend.name,
                         timeout=bench.heap.timeout)
    try:
        bench.progress("footprint: %d tensors of 64 KiB and 8 KiB alive at once", count)
        tensors = [heap.empty((sizes[i % 2],), torch.uint8) for i in range(count)]
        info = heap.heap_info()
        fds = open_fd_count() - fds_before
        mappings = shmemvm_mapping_count() if heap.backend.name == "host" else None
        node_pes = len(info["node_pes"])
        params = {"workload": "many tensors alive", "allocations": count,
                  "sizes": list(sizes), "heap_size": heap_size, "node_pes": node_pes,
                  "chunk": info.get("chunk", heap.backend.granularity),
                  "segments": info["segments"], "mapped_bytes": info["mapped"],
                  "requested_bytes": info["requested"]}
        for tensor in tensors:
            heap.free(tensor)
    finally:
        heap.finalize()
    bench.record("footprint.many.fds", params, [max(fds, 1)], "fds",
                 "one segment per allocation", [count], "lower")
    if mappings is not None:
        bench.record("footprint.many.mappings", params, [max(mappings, 1)], "mappings",
                     "one segment per allocation", [count * node_pes], "lower")
    bench.record("footprint.many.physical_per_requested", params,
                 [params["mapped_bytes"] / params["requested_bytes"]], "B/B",
                 "one segment per allocation",
                 [sum(max(s, heap.backend.granularity) for s in (sizes * count)[:count])
                  / params["requested_bytes"]], "lower")
