"""The compiled piece's entry points refuse what would make them touch memory
they were not given: a negative length, a null or absurd address (below the
lowest page a process can map), a range that wraps past the end of the address
space (issue 29's C edges: native.copy(dst, src, -1) was memmove(SIZE_MAX), a
segfault; native.atomic(8, "q", FETCH) too). Each case runs in a child
process, so that a regression is one failed test, not a crashed run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shmemvm import native

pytestmark = pytest.mark.skipif(native._native is None,
                                reason="the compiled piece is not built (pip install . builds it)")

#: name -> a call with `buf` (a writable bytearray), `a` (its address), `n` (the module)
CASES = {
    "copy, negative length": "n.copy(a, a + 8, -1)",
    "copy, null destination": "n.copy(0, a, 8)",
    "copy, absurd destination": "n.copy(8, a, 8)",
    "copy, absurd source": "n.copy(a, 4096, 8)",
    "copy, a range past the end of memory": "n.copy((1 << 64) - 8, a, 16)",
    "copy, a length past the end of memory": "n.copy(a, a, (1 << 63) - 1)",
    "atomic, absurd address": "n.atomic(8, 'q', n.FETCH)",
    "atomic, null address": "n.atomic(0, 'q', n.ADD, 1)",
    "load, absurd address": "n.load(16, 'q')",
    "copy_from, negative length": "n.copy_from(a, bytes(8), -1)",
    "copy_from, absurd destination": "n.copy_from(8, bytes(8), 8)",
    "copy_into, absurd source": "n.copy_into(buf, 8, 8)",
    "board_write, absurd slot": "n.board_write(8, bytes(16), 1)",
    "board_read, absurd slot": "n.board_read(8, 2, 1, 0, 10, bytearray(16))",
    "board_read, negative words": "n.board_read(a, -2, 1, 0, 10, bytearray(16))",
}

CHILD = """
import json, sys
from shmemvm import native as n
buf = bytearray(64)
a = n.address(buf)
outcome = {}
for name, call in json.loads(sys.argv[1]).items():
    try:
        eval(call)
        outcome[name] = "no error"
    except Exception as exc:
        outcome[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({name: outcome[name]}), flush=True)
"""


def test_every_entry_point_refuses_bad_lengths_and_addresses():
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)],
                            capture_output=True, text=True, timeout=120)
    seen = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            seen.update(json.loads(line))
    assert result.returncode == 0, (f"the child died (signal {-result.returncode}) after "
                                    f"{list(seen)}: {result.stderr[-2000:]}")
    for name in CASES:
        assert seen[name].startswith("ValueError"), (name, seen[name])


def test_good_calls_still_work_at_the_edges():
    buf = bytearray(b"abcdefgh")
    a = native.address(buf)
    native.copy(a, a + 4, 0)            # nothing to move
    native.copy(a, a + 4, 4)
    assert bytes(buf) == b"efghefgh"
    assert native._native.copy(a, a, 0) is None


def test_the_header_names_only_functions_the_module_has():
    import re
    from pathlib import Path
    source = (Path(native.__file__).parent / "_native.c").read_text()
    header = source.split("*/", 1)[0]
    named = set(re.findall(r"^ \*   (\w+)\(", header, re.M))
    assert named, header
    assert named <= set(dir(native._native)), named - set(dir(native._native))
