"""heap.ccl's kernels (shmemvm/device/ccl/kernels.py) compiled, not run, for an
H100/H200 (sm_90) and an MI300 (gfx942) without a GPU: what Triton's
interpreter does not check (types the compiler insists on, loops, constexpr
branches) fails here. The compile runs in a process of its own (without
TRITON_INTERPRET). One process: the kernels' constants are fixed here, so a
run under mpirun at 1, 2 and 4 PEs compiled the same kernels three times.

    python -m pytest -q -p no:cacheprovider -m "not mpi" tests/unit/device/test_ccl_compile.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="needs triton (pip install triton)")

COMMON = {"pads": "*i64", "status": "*i32", "word": "i64", "me": "i32", "heap_bases": "*i64",
          "max_polls": "i32"}


def signatures():
    """(kernel, signature, constants): every kernel, every constexpr branch once."""
    from shmemvm.device.ccl import kernels as k
    for dt, push, contig in (("i16", False, False), ("i32", True, True), ("u8", True, False),
                             ("i64", False, True)):
        yield k.move, {"src": f"*{dt}", "dst": f"*{dt}", **COMMON, "rows": "i32",
                       "inner": "i32", "src_ld": "i32", "dst_ld": "i32", "src_stride": "i32",
                       "dst_stride": "i32", "only_pe": "i32", "active": "i32",
                       "N_PES": "constexpr", "BLOCK": "constexpr", "PUSH": "constexpr",
                       "CONTIG": "constexpr"}, {"N_PES": 4, "BLOCK": 2048, "PUSH": push,
                                                "CONTIG": contig}
    yield k.sync_only, {**COMMON, "N_PES": "constexpr"}, {"N_PES": 2}
    for dt, kind, op, mode in (("fp32", 0, 0, 0), ("fp16", 1, 1, 1), ("i16", 2, 2, 2),
                               ("i8", 0, 3, 1), ("u8", 0, 1, 0), ("i64", 0, 0, 2)):
        yield k.reduce, {"src": f"*{dt}", "dst": f"*{dt}", **COMMON, "n": "i32", "root": "i32",
                         "N_PES": "constexpr", "BLOCK": "constexpr", "OP": "constexpr",
                         "KIND": "constexpr", "MODE": "constexpr"}, {
            "N_PES": 4, "BLOCK": 2048, "OP": op, "KIND": kind, "MODE": mode}
        yield k.reduce_tiles, {"src": f"*{dt}", "dst": f"*{dt}", **COMMON, "m": "i32",
                               "n": "i32", "ld": "i32", "N_PES": "constexpr", "BM": "constexpr",
                               "BN": "constexpr", "GROUP": "constexpr",
                               "DISTRIBUTION": "constexpr", "OP": "constexpr",
                               "KIND": "constexpr"}, {
            "N_PES": 2, "BM": 32, "BN": 64, "GROUP": 4, "DISTRIBUTION": mode % 2, "OP": op,
            "KIND": kind}
    yield k.all_to_all_v, {"src": "*i16", "dst": "*i16", "splits": "*i64",
                           "out_splits_offsets": "*i64", **COMMON, "width": "i32",
                           "src_rows": "i32", "cap_rows": "i32", "N_PES": "constexpr",
                           "NP2": "constexpr", "BLOCK": "constexpr"}, {
        "N_PES": 3, "NP2": 4, "BLOCK": 2048}
    yield k.send, {"p2p": "*i64", "status": "*i32", "word": "i64", "offset": "i64", "me": "i32",
                   "peer": "i32", "heap_bases": "*i64", "max_polls": "i32",
                   "N_PES": "constexpr"}, {"N_PES": 2}
    yield k.recv, {"dst": "*i16", "p2p": "*i64", "status": "*i32", "word": "i64",
                   "offset": "i64", "me": "i32", "peer": "i32", "heap_bases": "*i64",
                   "max_polls": "i32", "n": "i32", "N_PES": "constexpr",
                   "BLOCK": "constexpr"}, {"N_PES": 2, "BLOCK": 2048}


def compile_all() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "helpers"))
    from gpu_targets import compile_for_gpus
    compile_for_gpus(signatures())


def test_ccl_kernels_compile_for_cuda_and_hip():
    from util import clean_env

    env = clean_env()
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, __file__], env=env, capture_output=True,
                            text=True, timeout=900)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    assert "cuda ok" in output and "hip ok" in output, output


if __name__ == "__main__":
    compile_all()
