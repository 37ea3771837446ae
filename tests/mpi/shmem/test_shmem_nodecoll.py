"""The NumPy face's reductions fused with their agreed board step or combined
in C (transport/nodecoll.py; issue 30) give NumPy's ufuncs' bytes, the same on
every PE, for every integer and float width, and NumPy's dtypes C leaves to
the ufuncs (float16, long double, bool, non-native byte order) still work.

    mpirun -n 2 python -m pytest --with-mpi -m mpi tests/mpi/shmem/test_shmem_nodecoll.py
"""

from __future__ import annotations

import contextlib
import gc
import hashlib

import numpy as np
import pytest
from mpi4py import MPI

from shmemvm import rc

rc(initialize=False, finalize=False)  # this module makes and ends its own heap
from shmemvm import shmem  # noqa: E402
from shmemvm.agreement.board import PAYLOAD  # noqa: E402
from shmemvm.transport import nodecoll  # noqa: E402

WORLD = MPI.COMM_WORLD
TYPES = list("bhilqBHILQfd") + ["e", "g", "?", ">i4", "<f8"]
OPS = ["sum", "prod", "min", "max", "and", "or", "xor"]


@pytest.fixture(scope="module")
def world():
    shmem.init()
    yield
    gc.collect()
    shmem.finalize()


@contextlib.contextmanager
def _general(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(nodecoll, "fusion", lambda group: nodecoll.Fusion(None, len(group.pes)))
        m.setattr(nodecoll, "combined", lambda views, dtype, op, native, into=None: None)
        yield


def _values(t: str, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(t)
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(count) * 3).astype(dtype)
    return rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8).view(
        dtype.newbyteorder("=")).astype(dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("t", TYPES)
def test_numpy_reductions_fused_or_in_c_match_the_ufuncs(world, monkeypatch, t):
    me = shmem.my_pe()
    itemsize = np.dtype(t).itemsize
    for count in sorted({1, 7, PAYLOAD // itemsize, PAYLOAD // itemsize + 1, 3001}):
        source, target = shmem.zeros(count, dtype=t), shmem.zeros(count, dtype=t)
        source[:] = _values(t, count, 100 * me + count)
        for op in OPS:
            results = []
            for general in (False, True):
                with _general(monkeypatch) if general else contextlib.nullcontext():
                    target[:] = 0
                    try:
                        shmem.reduce(target, source, op)
                        got = target.tobytes()
                    except TypeError:   # no such loop in NumPy: on every PE, both paths
                        got = b"TypeError"
                    shmem.barrier_all()
                results.append(got)
            assert results[0] == results[1], (t, count, op)
            digests = WORLD.allgather(hashlib.sha256(results[0]).hexdigest())
            assert len(set(digests)) == 1, (t, count, op)
            if op in ("sum", "max") and results[0] != b"TypeError":   # what the ufunc gives
                every = WORLD.allgather(np.array(source))
                expected = every[0].copy()
                for other in every[1:]:
                    (np.add if op == "sum" else np.maximum)(expected, other, out=expected)
                assert results[0] == expected.tobytes(), (t, count, op)
        shmem.free(source), shmem.free(target)


@pytest.mark.mpi(min_size=1)
def test_the_faces_checked_offsets_are_the_routines_own(world):
    """The NumPy face hands the collectives each operand's heap offset, checked
    once (arrays.symmetric_span); the routine then skips its own look-up
    (Operand.offset). On odd operands (slices at odd bytes, Fortran order,
    dtype views, a count short of the size) it is exactly the offset the
    routine's own check gives, and a freed array still raises on the face."""
    from shmemvm import FreedTensorError
    from shmemvm.openshmem.collectives import _offset
    from shmemvm.shmem import arrays
    from shmemvm.shmem.collectives import _operand
    core = arrays.core()
    a = shmem.zeros(64, dtype="i1")
    f = shmem.zeros((3, 5), dtype="f8", order="F")
    odd = [a, a[3:40], a[1:2], a[7:], a[8:48].view("i4"), a[:0], f, f.reshape(-1, order="A"),
           f.reshape(-1, order="A").view("u1")[5:77]]
    for array in odd:
        for count in sorted({None, 0, array.size // 2 or None}, key=lambda c: (c is None, c)):
            operand = _operand(array, "target", count)
            assert operand.offset is not None
            own = _offset(core, operand._replace(offset=None), "target", "test")
            assert operand.offset == own, (array.shape, array.dtype, count)
            assert operand.count == (array.size if count is None else count)
    shmem.free(f)
    with pytest.raises(FreedTensorError):
        _operand(f, "target")
    shmem.free(a)
    del a, f, odd
    gc.collect()
