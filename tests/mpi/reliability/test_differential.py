"""The compiled paths against the pure Python ones, byte for byte (issue 32):
the same random odd inputs (lazy conjugate and negative views, non-contiguous,
0-d, expanded and overlapping tensors, every dtype class, C and Fortran order,
small and medium sizes) go through a heap with the compiled piece (native
"auto") and one without (native=0), and must leave the same bytes and raise
the same kind of error. Seeds are fixed, so a failure names a case that
reproduces:

    mpirun -n 2 python -m pytest -q --with-mpi -m mpi tests/mpi/reliability/test_differential.py

The torch face runs both heaps side by side; the NumPy face acts on the
default heap, so it runs every case on a native heap, then on a Python one,
and compares what each case left.
"""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest
import torch
from mpi4py import MPI

import shmemvm
from shmemvm import SymmetricHeap, native, rc

rc(initialize=False, finalize=False)  # the NumPy face's heaps are made and ended here
from shmemvm import shmem  # noqa: E402
from shmemvm.core.state import parts_of

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(native._native is None, reason="the compiled piece is not "
                                 "built (pip install . builds it): nothing to compare")]

world = MPI.COMM_WORLD

SEEDS = list(range(40))

TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                torch.complex64, torch.complex128]


def _needs_the_window(heap: SymmetricHeap) -> None:
    """Skip where `heap` (the one without the compiled piece) has no MPI window:
    its atomics then raise UnsupportedError, so there is nothing to compare (Open
    MPI 4.1 makes no dynamic window: the device machine's image)."""
    if parts_of(heap).window is None:
        pytest.skip(f"the atomics without the compiled piece go through the heap's MPI "
                    f"window, and there is none: {parts_of(heap).window_error}")


def _outcome(call) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - compared between the two paths
        return type(exc).__name__
    return "ok"


def _twice(call, *args) -> None:
    call(*args)
    call(*args)


def _random_tensor(rng: random.Random, shape, dtype: torch.dtype, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30) + salt)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)


def _shape(rng: random.Random) -> tuple:
    pick = rng.random()
    if pick < 0.1:
        return ()
    if pick < 0.75:
        return (rng.randrange(0, 40),)
    if pick < 0.9:
        return (rng.randrange(1, 12), rng.randrange(1, 12))
    return (rng.choice([16384, 20000, 70000]),)   # medium: past the GIL's 64 KiB


def _odd(rng: random.Random, t: torch.Tensor, kinds) -> tuple[str, torch.Tensor]:
    """`t`, or a view of a lazy or strange kind that reads the same shape."""
    kind = rng.choice(kinds)
    if kind == "conj" and t.is_complex():
        return kind, t.conj()
    if kind == "neg" and t.dtype not in (torch.bool,) and t.dtype.is_signed:
        return kind, t._neg_view()
    if kind == "strided" and t.dim() >= 1 and t.numel():
        wide = torch.empty((t.shape[0] * 2,) + tuple(t.shape[1:]), dtype=t.dtype)
        view = wide[::2]
        view.copy_(t)
        return kind, view
    if kind == "transposed" and t.dim() == 2:
        return kind, t.t().contiguous().t()
    if kind == "expanded" and t.dim() >= 1 and t.numel():
        return kind, t[:1].expand(t.shape)
    return "plain", t


@pytest.fixture(scope="module")
def heaps():
    pair = [SymmetricHeap(world, heap_size="64M", backend="host", timeout=30, native=n)
            for n in ("auto", 0)]
    assert pair[0].native and not pair[1].native
    yield pair
    gc.collect()
    for h in pair:
        h.finalize()


@pytest.mark.parametrize("seed", SEEDS)
def test_torch_put_and_get_agree(heaps, seed):
    rng = random.Random(seed)
    me, n = world.rank, world.size
    dtype = rng.choice(TORCH_DTYPES)
    shape = _shape(rng)
    step = rng.randrange(min(n, 2))
    pe = (me + step) % n
    source_kind, dest_kind = rng.random(), rng.random()
    layout = rng.choice(["plain", "strided", "transposed", "offset"])
    numel = int(np.prod(shape)) if shape else 1
    esize = torch.empty((), dtype=dtype).element_size()
    results = []
    for h in heaps:
        r = random.Random(seed * 7919)   # the same draws for both heaps
        space = h.zeros(max(2 * numel * esize + 64, 64), dtype=torch.uint8)
        typed = space.view(dtype)
        if layout == "strided" and shape and len(shape) == 1:
            dest = typed[:2 * numel:2][:shape[0]]
        elif layout == "transposed" and len(shape) == 2:
            dest = typed[:numel].view(shape[1], shape[0]).t()
        elif layout == "offset":
            dest = typed[1:1 + numel].view(shape)
        else:
            dest = typed[:numel].view(shape)
        space.copy_(torch.randint(0, 256, space.shape, dtype=torch.uint8,
                                  generator=torch.Generator().manual_seed(seed)))
        h.barrier_all()
        values = _random_tensor(r, shape, dtype, salt=me)
        kind, source = _odd(r, values, ["plain", "conj", "neg", "strided", "transposed",
                                        "expanded"])
        if source_kind < 0.15 and step == 0 and numel > 1:   # overlapping, on itself
            kind, source = "overlap", typed[numel // 2:numel // 2 + numel].view(shape)
        # (twice: a repeated put and get take the one pass, Where.located)
        put = _outcome(lambda: _twice(h.put, dest, source, pe))
        h.barrier_all()
        after_put = space.clone()
        # get: a local destination of an odd kind reads `dest`'s memory on pe
        local = torch.zeros(shape, dtype=dtype)
        base = local
        dkind = r.choice(["plain", "conj", "neg", "strided", "expanded"])
        if dkind == "conj" and local.is_complex():
            local = local.conj()
        elif dkind == "neg" and dtype.is_signed and dtype != torch.bool:
            local = local._neg_view()
        elif dkind == "strided" and local.dim() >= 1 and local.numel():
            base = torch.zeros((shape[0] * 2,) + tuple(shape[1:]), dtype=dtype)
            local = base[::2]
        elif dkind == "expanded" and local.dim() >= 1 and local.numel():
            base = torch.zeros((1,) + tuple(shape[1:]), dtype=dtype)
            local = base.expand(shape)
        if dest_kind < 0.15 and step == 0 and numel > 1:   # overlapping get on itself
            dkind, local, base = "overlap", typed[:numel].view(shape), space
        got = _outcome(lambda: _twice(h.get, local, dest, (me + 1) % n if step else me))
        h.barrier_all()
        results.append((kind, dkind, put, got, after_put,
                        base.reshape(-1).view(torch.uint8).clone(), space.clone()))
        h.barrier_all()
        h.free(space)
    (kind, dkind, put_a, get_a, put_bytes_a, get_a_bytes, end_a) = results[0]
    (_, _, put_b, get_b, put_bytes_b, get_b_bytes, end_b) = results[1]
    case = f"seed {seed}: {dtype} {shape} {layout} dest, {kind} source -> PE {pe}, {dkind} get"
    assert put_a == put_b, f"{case}: put {put_a} with the compiled piece, {put_b} without"
    assert torch.equal(put_bytes_a, put_bytes_b), f"{case}: put left different bytes"
    assert get_a == get_b, f"{case}: get {get_a} with the compiled piece, {get_b} without"
    assert torch.equal(get_a_bytes, get_b_bytes), f"{case}: get read different bytes"
    assert torch.equal(end_a, end_b), f"{case}: different bytes at the end"


TORCH_WORDS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16,
               torch.uint32, torch.uint64, torch.float32, torch.float64, torch.float16,
               torch.complex64]
TORCH_ATOMICS = {"atomic_fetch": 0, "atomic_set": 1, "atomic_swap": 1, "atomic_add": 1,
                 "atomic_inc": 0, "atomic_fetch_add": 1, "atomic_fetch_inc": 0,
                 "atomic_and": 1, "atomic_or": 1, "atomic_xor": 1, "atomic_fetch_and": 1,
                 "atomic_fetch_or": 1, "atomic_fetch_xor": 1, "atomic_compare_swap": 2}


@pytest.mark.parametrize("seed", SEEDS[:20])
def test_torch_atomics_agree(heaps, seed):
    """The torch API's atomics in two calls (the CPU's atomics where the heap has
    the compiled piece) against apply() over MPI (native=0): odd targets (0-d,
    strided, negated, expanded, two elements, local), every word and a few that
    are not, out-of-range and wrong-kind values."""
    _needs_the_window(heaps[1])
    me, n = world.rank, world.size
    results = []
    for h in heaps:
        rng = random.Random(seed)
        pe = (me + rng.randrange(min(n, 2))) % n
        dtype = rng.choice(TORCH_WORDS)
        space = h.zeros(64, dtype=torch.uint8)
        typed = space[8:40].view(dtype)
        kind = rng.choice(["plain", "0-d", "strided", "neg", "two", "expanded", "local"])
        if kind == "0-d":
            target = typed[1]
        elif kind == "strided":
            target = typed[::4][:1]
        elif kind == "neg" and dtype.is_signed and not dtype.is_complex:
            target = typed[:1]._neg_view()
        elif kind == "two":
            target = typed[:2]
        elif kind == "expanded":
            target = typed[3:4].expand(1)
        elif kind == "local":
            target = torch.zeros(1, dtype=dtype)
        else:
            target = typed[2:3]
        h.barrier_all()
        seen = []
        for _ in range(6):
            name = rng.choice(sorted(TORCH_ATOMICS))
            args = [rng.choice([0, 1, 3, -1, 2 ** 40, 1.5]) for _ in range(TORCH_ATOMICS[name])]
            kept = []
            outcome = _outcome(lambda: kept.append(getattr(h, name)(target, *args, pe)))
            seen.append((name, outcome, kept[0] if kept else None))
            h.barrier_all()
        fetch = torch.zeros(2, dtype=dtype)[::2]
        seen.append(("atomic_fetch_add_nbi",
                     _outcome(lambda: (h.atomic_fetch_add_nbi(fetch, target, 2, pe), h.quiet())),
                     fetch.clone()))
        h.barrier_all()
        results.append((kind, dtype, seen, space.clone()))
        h.barrier_all()
        h.free(space)
    (kind, dtype, seen_a, bytes_a), (_, _, seen_b, bytes_b) = results
    case = f"seed {seed}: {dtype} {kind} target"
    for a, b in zip(seen_a, seen_b):
        if isinstance(a[2], torch.Tensor):
            assert a[:2] == b[:2] and torch.equal(a[2], b[2]), f"{case}: {a} against {b}"
        else:
            assert a == b, f"{case}: {a} with the compiled piece, {b} without"
    assert torch.equal(bytes_a, bytes_b), f"{case}: different bytes at the end"


# -- the NumPy face ----------------------------------------------------------------------
NUMPY_DTYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8", "c8", "c16", "?",
                "f2", ">i8", ">f8", "V3", "g"]
WORD_DTYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8", ">i4"]
ATOMICS = ["atomic_fetch", "atomic_set", "atomic_swap", "atomic_compare_swap", "atomic_add",
           "atomic_inc", "atomic_fetch_add", "atomic_fetch_inc", "atomic_and", "atomic_or",
           "atomic_xor", "atomic_fetch_and", "atomic_fetch_or", "atomic_fetch_xor"]


def _numpy_case(seed: int) -> dict:
    """Run one seed's NumPy-face put, get and atomics on the default heap; what
    each left (bytes, values, error kinds)."""
    rng = random.Random(seed)
    me, n = shmem.my_pe(), shmem.n_pes()
    step = rng.randrange(min(n, 2))
    pe = (me + step) % n
    dtype = np.dtype(rng.choice(NUMPY_DTYPES))
    count = rng.choice([0, 1, 2, 7, 33, 1000, 20000])
    order = rng.choice("CF")
    shape = (count,) if rng.random() < 0.6 or count < 4 else (2, count // 2)
    out = {}
    space = shmem.zeros(2 * count * dtype.itemsize + 64, np.uint8)
    space[:] = np.random.default_rng(seed).integers(0, 256, space.size, dtype=np.uint8)
    nelem = int(np.prod(shape))
    target = space[:nelem * dtype.itemsize].view(dtype).reshape(shape, order=order)
    g = np.random.default_rng(seed * 31 + me)
    source = np.frombuffer(g.integers(0, 256, nelem * dtype.itemsize, dtype=np.uint8).tobytes(),
                           dtype=dtype).reshape(shape, order=order).copy(order=order)
    source_kind = rng.choice(["plain", "plain", "readonly", "strided", "0-d", "other dtype",
                              "overlap"])
    if source_kind == "readonly":
        source.flags.writeable = False
    elif source_kind == "strided" and nelem > 1:
        source = np.repeat(source.reshape(-1), 2)[::2]
    elif source_kind == "0-d" and nelem == 1:
        source = source.reshape(())
    elif source_kind == "other dtype":
        source = source.view(np.uint8)
    elif source_kind == "overlap" and step == 0 and nelem > 1:
        source = space[dtype.itemsize:(nelem + 1) * dtype.itemsize].view(dtype).reshape(
            shape, order=order)
    shmem.barrier_all()
    out["put"] = _outcome(lambda: shmem.put(target, source, pe))
    shmem.barrier_all()
    out["put bytes"] = space.tobytes()
    shmem.barrier_all()
    local = np.zeros(shape, dtype=dtype, order=order)
    if rng.random() < 0.2 and step == 0 and nelem > 1:
        local = space[3 * dtype.itemsize:(nelem + 3) * dtype.itemsize].view(dtype)   # overlap
    out["get"] = _outcome(lambda: shmem.get(local, target, pe))
    out["get bytes"] = local.tobytes()
    shmem.barrier_all()
    # atomics: one word, a random operation, on this PE or its neighbour
    words = shmem.zeros(8, np.uint64)   # 64 bytes
    wdtype = np.dtype(rng.choice(WORD_DTYPES))
    word = words.view(np.uint8)[8:8 + wdtype.itemsize].view(wdtype)
    word_kind = rng.choice(["plain", "plain", "0-d", "misaligned", "two"])
    if word_kind == "0-d":
        word = word.reshape(())
    elif word_kind == "misaligned" and wdtype.itemsize > 1:
        word = words.view(np.uint8)[9:9 + wdtype.itemsize].view(wdtype)
    elif word_kind == "two":
        word = words.view(np.uint8)[8:8 + 2 * wdtype.itemsize].view(wdtype)
    shmem.barrier_all()
    values = []
    for i in range(6):
        name = rng.choice(ATOMICS)
        value = rng.choice([0, 1, 5, -1, 2 ** 31, 255, 1.5])
        cond = rng.choice([0, 1, 5])
        args = {"atomic_fetch": (), "atomic_inc": (), "atomic_fetch_inc": (),
                "atomic_compare_swap": (cond, value)}.get(name, (value,))
        call = getattr(shmem, name)
        target_pe = pe
        kept = []
        outcome = _outcome(lambda: kept.append(call(word, *args, target_pe)))
        values.append((name, outcome, kept[0] if kept else None))
        shmem.barrier_all()
    out["atomics"] = values
    # the word operations that read this PE's word: tests and a signal read
    for cmp in ("eq", "ne", "lt"):
        kept = []
        value = rng.choice([0, 1, 5, -1])
        values.append(("test", cmp, _outcome(lambda: kept.append(shmem.test(word, cmp, value))),
                       kept[0] if kept else None))
    kept = []
    values.append(("signal_fetch", _outcome(lambda: kept.append(shmem.signal_fetch(word))),
                   kept[0] if kept else None))
    shmem.barrier_all()
    out["atomic bytes"] = words.tobytes()
    shmem.barrier_all()
    shmem.free(words)
    shmem.free(space)
    return out


def test_numpy_face_put_get_and_atomics_agree():
    outcomes = []
    for nat in ("auto", 0):
        shmemvm.init(backend="host", heap_size="64M", timeout=30, native=nat)
        try:
            assert shmemvm.default_heap().native == (nat == "auto")
            _needs_the_window(shmemvm.default_heap())
            outcomes.append([_numpy_case(seed) for seed in SEEDS])
        finally:
            gc.collect()
            shmemvm.finalize()
    for seed, a, b in zip(SEEDS, *outcomes):
        for key in a:
            assert a[key] == b[key], (f"seed {seed}: {key} differs: {a[key]!r:.300} with the "
                                      f"compiled piece, {b[key]!r:.300} without")
