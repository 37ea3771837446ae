"""One numbering of word kinds and atomic operations (issue 29: the C numbers
were retyped by hand in native/__init__.py). The compiled module exports its
enums (WORDS, OPERATIONS); shmemvm.native takes them from it and refuses at
import a build whose numbers are not its own table, which is what stands in
where the module is not built (the pure Python paths use the codes too)."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from shmemvm import native

NAMES = ("fetch", "set", "add", "and", "or", "xor", "cas")


@pytest.mark.skipif(native._native is None,
                    reason="the compiled piece is not built (pip install . builds it)")
def test_the_compiled_module_exports_its_numbering():
    assert native._native.WORDS == native.WORDS
    assert native._native.OPERATIONS == native.OPERATIONS
    assert set(native.WORDS) == set("bBhHiIqQfd")
    assert (native.FETCH, native.SET, native.ADD, native.AND, native.OR, native.XOR,
            native.CAS) == tuple(native.OPERATIONS[name] for name in NAMES)
    assert len(set(native.OPERATIONS.values())) == len(NAMES)


def test_a_build_with_other_numbers_is_refused_at_import():
    stale = types.SimpleNamespace(__file__="/old/_native.so", WORDS=dict(native.WORDS),
                                  OPERATIONS={**native.OPERATIONS, "add": 3, "and": 2})
    with pytest.raises(ImportError, match=r"/old/_native.so numbers its OPERATIONS .*Rebuild"):
        native._numbering(stale)
    older = types.SimpleNamespace(__file__="/old/_native.so")   # built before it exported them
    with pytest.raises(ImportError, match="numbers its WORDS None"):
        native._numbering(older)


def test_the_names_exist_with_the_same_values_where_it_is_not_built():
    child = ("import sys, json; sys.modules['shmemvm.native._native'] = None\n"
             "from shmemvm import native as n\n"
             "print(json.dumps([n._native is None, n.WORDS, n.OPERATIONS,"
             " [n.FETCH, n.SET, n.ADD, n.AND, n.OR, n.XOR, n.CAS]]))")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    missing, words, operations, codes = json.loads(out.splitlines()[-1])
    assert missing is True
    assert words == native.WORDS and operations == native.OPERATIONS
    assert codes == [native.OPERATIONS[name] for name in NAMES]
