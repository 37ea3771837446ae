"""The package is typed (py.typed): a type checker run on a user's program sees
the real signatures of the module functions, the heap's methods and the NumPy
face, not Any. Runs mypy once (about a minute: it reads torch's stubs too), with
the cache of test_mypy_ratchet.py's run (the checkout's .mypy_cache, or
$MYPY_CACHE_DIR): torch's and NumPy's modules checked there are not checked again
(its test 14 -> 9 s on the 2-core machine; issue 33, item 16)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROGRAM = '''
import numpy as np
import torch
import shmemvm
from shmemvm import shmem

heap = shmemvm.SymmetricHeap()
x = heap.zeros(4, torch.int64)
reveal_type(shmemvm.put)
reveal_type(heap.malloc)
reveal_type(heap.atomic_fetch_add)
reveal_type(heap.atomic_fetch_add(x[0], 1, 0))
reveal_type(shmem.put)
reveal_type(shmemvm.team_world())
reveal_type(heap.ctx_create().put)
reveal_type(shmemvm.heap_info()["free"])
reveal_type(heap.heap_info()["backend"])
a = shmem.zeros(1, np.int64)
reveal_type(shmem.atomic_fetch_add(a, 1, 0))
reveal_type(shmem.atomic_fetch(a, 0))
'''


def _documented_mypypath() -> str:
    """The README's way to type-check a program: `MYPYPATH=<checkout> mypy app.py`
    (mypy does not see meson-python's editable install, an import hook)."""
    found = re.findall(r"MYPYPATH=(\S+) mypy \S+\.py", (REPO / "README.md").read_text())
    assert found, "README.md says nowhere how to type-check a program (MYPYPATH=... mypy app.py)"
    return found[0]


def test_the_readme_says_how_to_type_check_a_program():
    assert _documented_mypypath() == "/path/to/checkout"


@pytest.mark.skipif(shutil.which("mypy") is None and
                    not (Path(sys.executable).parent / "mypy").exists(),
                    reason="mypy is not installed (pip install '.[test]' installs it)")
def test_a_type_checker_sees_real_types(tmp_path):
    """Run as the README says, from a directory outside the checkout: with the
    editable install alone mypy finds no shmemvm there."""
    assert not tmp_path.resolve().is_relative_to(REPO.resolve())
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    env = dict(os.environ, MYPYPATH=_documented_mypypath().replace("/path/to/checkout", str(REPO)))
    cache = os.environ.get("MYPY_CACHE_DIR") or str(REPO / ".mypy_cache")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--cache-dir", cache,
         str(program)],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    revealed = re.findall(r'Revealed type is "(.*)"', result.stdout)
    assert len(revealed) == 11, result.stdout + result.stderr
    (put, malloc, fetch_add, fetched, shmem_put, team, ctx_put, free, backend,
     shmem_fetched_add, shmem_fetched) = revealed
    # the NumPy face: an integer-only atomic returns int, a fetch int or float
    # (issue 33, 12: they were int | float | complex | numpy.number)
    assert shmem_fetched_add == "int", shmem_fetched_add
    assert shmem_fetched in ("int | float", "Union[int, float]"), shmem_fetched
    assert put.startswith("def (dest: torch._tensor.Tensor, source: torch._tensor.Tensor, "
                          "pe: int)"), put
    assert malloc == "def (nbytes: int) -> torch._tensor.Tensor", malloc
    assert fetch_add == ("def (dest: torch._tensor.Tensor, value: int, "
                         "pe: int) -> int"), fetch_add
    assert fetched == "int", fetched
    assert shmem_put.startswith("def (target: numpy.ndarray"), shmem_put
    assert team == "shmemvm.openshmem.teams.Team", team
    assert ctx_put.startswith("def (dest: torch._tensor.Tensor"), ctx_put
    assert (free, backend) == ("int", "str"), (free, backend)   # a TypedDict, not Any
    assert "error" not in result.stdout, result.stdout
