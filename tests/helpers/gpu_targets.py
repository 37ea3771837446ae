"""Compiling Triton kernels for the GPUs we target, without a GPU: sm_90 (H100,
H200) and gfx942 (MI300). Imports Triton alone (no shmemvm, no MPI), so that
a process without an MPI launcher can use it; used by triton_compile.py and
tests/unit/device/test_ccl_compile.py, each in a process of its own without
TRITON_INTERPRET."""

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_for_gpus(signatures) -> None:
    """Compile each (kernel, signature, constants) of `signatures` for sm_90 and
    gfx942; print "<backend> ok (N kernels)" per target, raise at the first failure."""
    signatures = list(signatures)
    for name, target, binary in (("cuda", GPUTarget("cuda", 90, 32), "cubin"),
                                 ("hip", GPUTarget("hip", "gfx942", 64), "hsaco")):
        for fn, signature, constants in signatures:
            try:
                kernel = triton.compile(ASTSource(fn, signature, constants), target=target)
            except Exception as exc:
                print(f"{name}: {fn.__name__} {constants} failed to compile: {exc}")
                raise
            assert kernel.asm[binary], (name, fn.__name__)
        print(f"{name} ok ({len(signatures)} kernels)")
