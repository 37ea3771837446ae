"""One table per vocabulary (issue 29): reduce operations, comparisons, atomic
operations and word kinds are named once, in shmemvm/vocabulary.py, and every
face's table is derived from it (the same names, in the same order); the
compiled pieces' numbering is the vocabulary's, checked at import."""

from __future__ import annotations

import types

import pytest
import torch

from shmemvm import native, vocabulary
from shmemvm.openshmem import atomics, waits
from shmemvm.openshmem import collectives as torch_collectives
from shmemvm.shmem import collectives as numpy_collectives
from shmemvm.shmem import constants
from shmemvm.transport import kernels, nodecoll


def test_reduce_ops_every_table_derived():
    names = vocabulary.REDUCE_OPS
    assert torch_collectives.REDUCE_NAMES == names
    assert tuple(torch_collectives.REDUCE_OPS) == names
    assert tuple(numpy_collectives.UFUNCS) == names
    assert set(constants.OP) == set(names)            # shmem4py's enum (its own order)
    assert native.REDUCE_OPS == vocabulary.numbering(names)
    assert nodecoll._OPS == native.REDUCE_OPS


def test_device_reduce_ops_are_the_vocabularys_first_four():
    config = pytest.importorskip("shmemvm.device.ccl.config")
    assert config.REDUCE_OPS == vocabulary.numbering(vocabulary.REDUCE_OPS[:4])


def test_comparisons_every_table_derived():
    names = vocabulary.COMPARISONS
    assert tuple(waits.COMPARISONS) == names
    assert waits.SYMBOLS is vocabulary.COMPARISON_SYMBOLS
    assert set(waits.SYMBOLS.values()) == set(names)
    assert [constants.CMP[name.upper()] for name in names] == list(range(len(names)))
    assert constants._CMP_NAMES == {constants.CMP(i): name for i, name in enumerate(names)}


def test_atomic_ops_every_table_derived():
    names = vocabulary.ATOMIC_OPS
    for table in (atomics.OPERATIONS, atomics._KERNEL_OPS, atomics._NATIVE_OPS):
        assert tuple(table) == names
    assert set(atomics._KERNEL_OPS.values()) <= set(kernels.OPERATIONS)
    assert tuple(native.OPERATIONS) == vocabulary.NATIVE_ATOMIC_OPS
    assert atomics._NATIVE_OPS["swap"] == native.OPERATIONS["set"]
    assert set(constants.AMO) - {"inc"} <= set(names)   # (inc is an add of 1)


def test_word_kinds_every_table_derived():
    codes = vocabulary.WORD_CODES
    assert tuple(native.WORDS) == codes and native.KINDS == native.WORDS
    assert [nodecoll._TORCH_KINDS[getattr(torch, name)]
            for _, name in vocabulary.WORD_KINDS] == list(range(len(codes)))
    np = pytest.importorskip("numpy")
    assert [nodecoll.element_kind(np.dtype(name)) for _, name in vocabulary.WORD_KINDS] == \
        list(range(len(codes)))


@pytest.mark.skipif(native._collective is None, reason="_collective is not built")
def test_the_collective_module_exports_the_vocabularys_numbering():
    assert native._collective.KINDS == vocabulary.numbering(vocabulary.WORD_CODES)
    assert native._collective.REDUCE_OPS == vocabulary.numbering(vocabulary.REDUCE_OPS)


def test_a_collective_build_with_other_numbers_is_refused():
    stale = types.SimpleNamespace(__file__="/old/_collective.so", KINDS=dict(native.KINDS),
                                  REDUCE_OPS={**native.REDUCE_OPS, "min": 3, "max": 2})
    with pytest.raises(ImportError, match=r"/old/_collective.so numbers its REDUCE_OPS"):
        native._numbering(stale, (("KINDS", native._WORDS), ("REDUCE_OPS", native._REDUCE_OPS)))
