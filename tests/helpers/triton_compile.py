"""Compile (not run) shmemvm.triton's device functions, the host atomics' kernel
and the examples' kernels for sm_90 (CUDA) and gfx942 (ROCm), without a GPU.
Prints "<backend> ok" per target; exits non-zero at the first failure.
Run without TRITON_INTERPRET (tests/unit/device/test_triton_one_process.py starts it)."""

import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from shmemvm.device import allreduce as device_allreduce  # noqa: E402
from shmemvm.transport import kernels as device_atomics
from shmemvm.device import triton as sv  # noqa: E402  (its private _poll_unset too)
import producer_consumer  # noqa: E402
import triton_allreduce  # noqa: E402
from gpu_targets import compile_for_gpus  # noqa: E402


@triton.jit
def every_function(x, y, c, sig, out, status, heap_bases, me, pe, n, value, max_polls,
                   BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, sv.load(x + offs, me, pe, heap_bases, mask=mask), mask=mask)
    sv.store(y + offs, offs.to(tl.float32), me, pe, heap_bases, mask=mask)
    sv.get(x + offs, y + offs, me, pe, heap_bases, mask=mask)
    sv.put(x + offs, y + offs, me, pe, heap_bases, mask=mask)
    sv.copy(x + offs, y + offs, pe, me, me, heap_bases, mask)
    sv.copy(x + offs, y + offs, me, pe, me, heap_bases, mask=mask, other=0.0,
            load_cache_modifier=".cg", store_cache_modifier=".wt", hint=BLOCK)
    one = tl.full((), 1, tl.int64)
    sv.atomic_add(c, one, me, pe, heap_bases, scope="sys")
    sv.atomic_add(c + offs, one, me, pe, heap_bases, mask, "relaxed", "sys", BLOCK)
    sv.atomic_sub(c, one, me, pe, heap_bases, sem="release", scope="sys")
    sv.atomic_cas(c, 1, 2, me, pe, heap_bases, sem="acquire", scope="sys")
    sv.atomic_cas(c + offs, offs * 0, offs, me, pe, heap_bases, "acq_rel", "sys", BLOCK)
    sv.atomic_xchg(c, one, me, pe, heap_bases)
    sv.atomic_and(c + offs, one, me, pe, heap_bases, mask=mask)
    sv.atomic_or(c, one, me, pe, heap_bases, scope="gpu")
    sv.atomic_xor(c, one, me, pe, heap_bases, sem="relaxed")
    sv.atomic_min(c, one, me, pe, heap_bases)
    sv.atomic_max(c, one, me, pe, heap_bases, scope="cta")
    sv.signal_set(sig, value, me, pe, heap_bases)
    sv.signal_add(sig, value, me, pe, heap_bases)
    seen = sv.signal_wait_until(sig, sv.CMP_GE, value)
    seen += sv.signal_wait_until(sig, sv.CMP_LT, value, 100)
    seen += sv.signal_wait_until(sig, sv.CMP_EQ, value, max_polls, status)
    ok = sv.signal_test(sig, sv.CMP_NE, value)
    tl.store(c + 1, seen + ok.to(tl.int64))


@triton.jit
def cache_modifiers(x, y, heap_bases, me, pe, n, LOAD: tl.constexpr, STORE: tl.constexpr,
                    VOLATILE: tl.constexpr, BLOCK: tl.constexpr):
    """Iris's newer parameters in Iris's positions, one modifier pair a compile."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    v = sv.load(x + offs, me, pe, heap_bases, mask, 0.0, LOAD, VOLATILE, BLOCK)
    sv.store(y + offs, v, me, pe, heap_bases, mask, BLOCK, STORE)
    sv.get(x + offs, y + offs, me, pe, heap_bases, mask, 0.0, LOAD, STORE, BLOCK)
    sv.put(x + offs, y + offs, me, pe, heap_bases, mask, 0.0, LOAD, STORE, BLOCK)
    sv.copy(x + offs, y + offs, pe, me, me, heap_bases, mask, 0.0, LOAD, STORE, BLOCK)


#: every load modifier and every store modifier at least once
MODIFIERS = [(None, None, False), (".ca", ".wb", True), (".cg", ".cg", True),
             (".cv", ".cs", True), (".cg", ".wt", False), ("", "", False)]


def kernels():
    yield every_function, {"x": "*fp32", "y": "*fp32", "c": "*i64", "sig": "*i64",
                           "out": "*fp32", "status": "*i32", "heap_bases": "*i64", "me": "i32",
                           "pe": "i32", "n": "i32", "value": "i64", "max_polls": "i32",
                           "BLOCK": "constexpr"}, {"BLOCK": 256}
    for load, store, volatile in MODIFIERS:
        yield cache_modifiers, {"x": "*fp32", "y": "*fp32", "heap_bases": "*i64", "me": "i32",
                                "pe": "i32", "n": "i32", "LOAD": "constexpr",
                                "STORE": "constexpr", "VOLATILE": "constexpr",
                                "BLOCK": "constexpr"}, {
            "LOAD": load, "STORE": store, "VOLATILE": volatile, "BLOCK": 128}
    for bits in ("i32", "i64"):
        for op in device_atomics.OPERATIONS.values():
            yield device_atomics._atomic, {
                "dest": f"*{bits}", "args": f"*{bits}", "out": f"*{bits}", "me": "i32",
                "pe": "i32", "heap_bases": "*i64", "OP": "constexpr"}, {"OP": op}
    yield from triton_allreduce.compile_signatures()
    for dtype in ("fp32", "bf16", "i64"):
        for two_shot in (False, True):
            for op in device_allreduce.OPS.values():
                yield device_allreduce._all_reduce, {
                    "src": f"*{dtype}", "dst": f"*{dtype}", "pads": "*i64", "status": "*i32",
                    "n": "i32", "word": "i64", "me": "i32", "heap_bases": "*i64",
                    "max_polls": "i32", "N_PES": "constexpr", "BLOCK": "constexpr",
                    "OP": "constexpr", "TWO_SHOT": "constexpr", "HINT": "constexpr"}, {
                    "N_PES": 4, "BLOCK": 2048, "OP": op, "TWO_SHOT": two_shot, "HINT": 2048}
    yield sv._poll_unset, {"sig_ptr": "*i64", "max_polls": "i32"}, {}
    yield from producer_consumer.compile_signatures()


if __name__ == "__main__":
    compile_for_gpus(kernels())
