"""mypy on the library itself, ratcheted (issue 29): `mypy --follow-imports=silent
shmemvm` runs once, its errors are counted per folder (or per file, where
tests/mypy_ratchet.txt names one), and no count may exceed the ratchet's. A
count below it fails too, so that the ratchet is lowered as errors are fixed
and never gives the room back. (test_typing.py checks what a user's program
sees; this checks the library's own code.)

Runs in a few seconds with mypy's cache (.mypy_cache, gitignored), well under a
minute without it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RATCHET = REPO / "tests" / "mypy_ratchet.txt"
ERROR = re.compile(r"^shmemvm/(?P<path>\S+?\.py):\d+: error: ")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (pip install '.[test]' installs it)")


def read_ratchet(text: str) -> dict[str, int]:
    """`folder-or-file max` per line under shmemvm/ ('.' for the top-level
    modules); '#' starts a comment."""
    limits = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise ValueError(f"{RATCHET.name}:{number}: expected 'folder max', got {line!r}")
        limits[parts[0].rstrip("/")] = int(parts[1])
    return limits


def entry_of(path: str, limits: dict[str, int]) -> str:
    """The ratchet's most specific entry for a file under shmemvm/: itself, its
    deepest listed folder, or '.' for a top-level module; '' where none is."""
    if path in limits:
        return path
    parts = path.split("/")[:-1]
    while parts:
        if "/".join(parts) in limits:
            return "/".join(parts)
        parts.pop()
    return "." if "/" not in path and "." in limits else ""


def group(lines: list[str], limits: dict[str, int]) -> dict[str, list[str]]:
    """mypy's error lines by ratchet entry ('' for those no entry covers)."""
    found: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        match = ERROR.match(line)
        if match:
            found[entry_of(match["path"], limits)].append(line)
    return found


def test_reading_the_ratchet():
    limits = read_ratchet("# comment\ncore 3\nagreement 0\nagreement/board.py 2  # E's\n. 1\n")
    assert limits == {"core": 3, "agreement": 0, "agreement/board.py": 2, ".": 1}
    assert entry_of("agreement/board.py", limits) == "agreement/board.py"
    assert entry_of("agreement/liveness.py", limits) == "agreement"
    assert entry_of("rc.py", limits) == "."
    assert entry_of("device/ccl/api.py", limits) == ""
    lines = ["shmemvm/core/a.py:3: error: x  [attr-defined]", "shmemvm/core/a.py:3: note: y",
             "shmemvm/rc.py:1: error: z  [assignment]"]
    assert group(lines, limits) == {"core": lines[:1], ".": lines[2:]}
    with pytest.raises(ValueError, match="expected 'folder max'"):
        read_ratchet("core three\n")


@pytest.fixture(scope="module")
def mypy_errors() -> tuple[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "shmemvm"],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode in (0, 1), result.stdout + result.stderr   # 2: mypy itself failed
    version = subprocess.run([sys.executable, "-m", "mypy", "--version"],
                             capture_output=True, text=True).stdout.strip()
    return version, result.stdout.splitlines()


def test_no_folder_has_more_mypy_errors_than_its_ratchet(mypy_errors):
    version, lines = mypy_errors
    limits = read_ratchet(RATCHET.read_text())
    found = group(lines, limits)
    problems = []
    if found.get(""):
        problems.append(f"errors in files no line of {RATCHET.name} covers (add one):\n"
                        + "\n".join(found[""]))
    for entry, limit in sorted(limits.items()):
        errors = found.get(entry, [])
        if len(errors) > limit:
            problems.append(f"shmemvm/{entry}: {len(errors)} mypy errors, the ratchet allows "
                            f"{limit}; fix the new ones (its errors now):\n" + "\n".join(errors))
    assert not problems, (f"`mypy --follow-imports=silent shmemvm` ({version}):\n\n"
                          + "\n\n".join(problems))


def test_the_ratchet_is_lowered_as_errors_are_fixed(mypy_errors):
    version, lines = mypy_errors
    limits = read_ratchet(RATCHET.read_text())
    found = group(lines, limits)
    loose = [f"{entry} {limit} -> {entry} {len(found.get(entry, []))}"
             for entry, limit in sorted(limits.items()) if len(found.get(entry, [])) < limit]
    assert not loose, (f"fewer mypy errors than {RATCHET.name} allows ({version}): lower "
                       f"these lines so that the room is not given back:\n" + "\n".join(loose))


if __name__ == "__main__":
    # `python tests/unit/test_mypy_ratchet.py`: the counts now, in the ratchet's
    # format, for the entries it has (to lower it after a fix)
    limits = read_ratchet(RATCHET.read_text())
    out = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "shmemvm"],
                         capture_output=True, text=True, cwd=REPO).stdout.splitlines()
    found = group(out, limits)
    for entry, limit in limits.items():
        print(f"{entry} {len(found.get(entry, []))}" + (f"  # was {limit}" if
                                                        len(found.get(entry, [])) != limit else ""))
    if found.get(""):
        print("# not covered:\n" + "\n".join(found[""]))
