"""Settings: sizes as users write them; the test suite's own setting."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import shmemvm.backends

from shmemvm.config import SETTINGS, parse_size


@pytest.mark.parametrize("text, size", [
    ("4096", 4096), (4096, 4096), ("64K", 64 << 10), ("512m", 512 << 20), ("2G", 2 << 30),
    ("1T", 1 << 40), (" 2 GiB", 2 << 30), ("64KB", 64 << 10),
    ("1.5G", 3 << 29), ("0.5K", 512), (".25M", 1 << 18), ("1.K", 1024),
    ("0.3K", 308),          # 307.2 bytes: fractions round up to a whole byte
    ("1.5", 2),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1K", "1e9", "1,5G", "1.2.3", "12Q", "1 .5G"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="cannot read .* as a size; use e.g. .*1.5G"):
        parse_size(text)


def test_heap_size_setting_says_it_rounds():
    assert "granularity" in SETTINGS["SHMEMVM_HEAP_SIZE"][1]


@pytest.mark.skipif(shmemvm.backends.available("cuda"), reason="cuda can run here")
def test_an_unavailable_test_backend_fails_the_run():
    """SHMEMVM_TEST_BACKEND asks for a backend: where it cannot run, the run fails
    instead of skipping every test that would use it."""
    env = {**os.environ, "SHMEMVM_TEST_BACKEND": "cuda"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--co", __file__], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "SHMEMVM_TEST_BACKEND=cuda was asked for, but that backend cannot run here" in \
        done.stdout + done.stderr


def test_info_command_names_what_it_runs_on():
    """`python -m shmemvm info` shows the versions a bug report needs."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "shmemvm", "info", "--json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    data = json.loads(out)
    versions = data["versions"]
    assert versions["torch"] and versions["mpi4py"] and versions["python"]
    assert "triton" in versions and "numpy" in versions
    assert versions["MPI"] and not versions["MPI"].startswith("unavailable")
    text = subprocess.run([sys.executable, "-m", "shmemvm", "info"], capture_output=True,
                          text=True, timeout=120, check=True).stdout
    assert f"torch {versions['torch']}" in text and "MPI " in text


# -- one table: every setting the code reads, `info` and the README list, each checked --------

import re as _re

import shmemvm.config as config

PACKAGE = Path(shmemvm.backends.__file__).resolve().parents[1]
README = PACKAGE.parent / "README.md"

#: a value each setting refuses (issue 32 item 14: DEBUG, PROFILE and DEVICE took anything)
BAD = {"SHMEMVM_HEAP_SIZE": "lots", "SHMEMVM_BACKEND": "gpu", "SHMEMVM_VA_FACTOR": "0",
       "SHMEMVM_HOST_GRANULARITY": "3000", "SHMEMVM_CHUNK_SIZE": "100K",
       "SHMEMVM_TIMEOUT": "-1", "SHMEMVM_DEVICE": "abc", "SHMEMVM_NODE_SPLIT": "two",
       "SHMEMVM_AGREEMENT": "fast", "SHMEMVM_ANCHOR": "big", "SHMEMVM_NATIVE": "maybe",
       "SHMEMVM_DEBUG": "abc", "SHMEMVM_PROFILE": "abc"}


def _names_read_in_the_package() -> dict[str, str]:
    """Every SHMEMVM_ name the library's code reads: a whole string literal
    "SHMEMVM_X" (setting("SHMEMVM_X"), os.environ.get("SHMEMVM_X"), ...)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _re.findall(r"""["'](SHMEMVM_[A-Z0-9_]+)["']""", path.read_text()):
            found.setdefault(name, str(path.relative_to(PACKAGE.parent)))
    return found


def test_every_setting_the_code_reads_is_in_the_table():
    found = _names_read_in_the_package()
    assert found, "the scan found no setting at all"
    missing = {name: where for name, where in found.items() if name not in config.SETTINGS}
    assert not missing, f"read but not in config.SETTINGS: {missing}"


def test_only_config_reads_the_environment_for_settings():
    """The environment is read in config.py alone, so every read is checked there."""
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "config.py" and path.parent == PACKAGE:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ("os.environ" in line or "getenv" in line) and "SHMEMVM_" in line:
                readers.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not readers, "read SHMEMVM_ settings through config.setting():\n" + "\n".join(readers)


def test_every_setting_has_a_bad_value_here():
    assert set(BAD) == set(config.SETTINGS)


def test_every_setting_is_in_the_readme_with_its_default():
    rows = dict(_re.findall(r"^\| `(SHMEMVM_[A-Z0-9_]+)` \|\s*([^|]*?)\s*\|", README.read_text(),
                            _re.MULTILINE))
    assert set(rows) == set(config.SETTINGS), (
        f"README settings table vs config.SETTINGS: only in the README "
        f"{sorted(set(rows) - set(config.SETTINGS))}, only in the table "
        f"{sorted(set(config.SETTINGS) - set(rows))}")
    for name, entry in config.SETTINGS.items():
        if entry.default:
            assert rows[name].strip() == f"`{entry.default}`", (name, rows[name], entry.default)


def test_info_lists_every_setting_with_what_it_accepts():
    from shmemvm.__main__ import info, main
    import contextlib
    import io

    data = info()["settings"]
    assert list(data) == list(config.SETTINGS)
    for name, entry in config.SETTINGS.items():
        assert data[name]["default"] == entry.default and data[name]["meaning"] == entry.meaning
        assert data[name]["accepted"] == entry.accepted
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([])
    for name in config.SETTINGS:
        assert f"  {name} = " in out.getvalue(), name


def test_info_anchor_figures_are_the_readmes():
    """One figure for what the anchor gains, where both say it (issue 33 item 6)."""
    readme = _re.findall(r"(\d+)[–-](\d+)× faster", README.read_text())
    ours = _re.findall(r"(\d+)-(\d+)x faster", config.SETTINGS["SHMEMVM_ANCHOR"].meaning)
    assert readme and ours and readme == ours, (readme, ours)


def test_info_mpi_line_has_no_padding():
    from shmemvm.__main__ import info

    version = info()["versions"]["MPI"]
    assert "  " not in version and "\t" not in version, version


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_of_every_setting_is_refused(monkeypatch, name):
    monkeypatch.setenv(name, BAD[name])
    entry = config.SETTINGS[name]
    for read in (lambda: config.setting(name), config.check_all):
        with pytest.raises(ValueError) as info:
            read()
        message = str(info.value)
        assert name in message and repr(BAD[name]) in message, message
        assert entry.accepted in message, message


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_default_of_every_setting_is_accepted(monkeypatch, name):
    monkeypatch.setenv(name, config.SETTINGS[name].default)
    assert config.setting(name) == config.SETTINGS[name].default


@pytest.mark.parametrize("name", ["SHMEMVM_DEBUG", "SHMEMVM_PROFILE", "SHMEMVM_DEVICE"])
def test_a_host_heap_refuses_a_bad_setting_it_does_not_use(name):
    """SHMEMVM_DEVICE=abc on a host heap, SHMEMVM_DEBUG=abc and SHMEMVM_PROFILE=abc
    were accepted (issue 32 item 14): init checks every setting."""
    from util import REPO, clean_env

    code = ("from mpi4py import MPI; from shmemvm import SymmetricHeap\n"
            "SymmetricHeap(MPI.COMM_WORLD, heap_size='4M', backend='host', timeout=30)\n")
    env = {**clean_env(), name: "abc"}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"{name} must be " in done.stderr and "got 'abc'" in done.stderr, done.stderr[-2000:]
    assert "ValueError" in done.stderr, done.stderr[-2000:]


#: environment reads outside config.py that are not shmemvm's settings: Triton's
#: own switch, and shmem4py's SHMEM4PY_RC_* (shmem/setup.py, by prefix)
FOREIGN = ("TRITON_INTERPRET", "SHMEM4PY_RC_")


def _environment_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of every environment read in `source`: os.environ.get/[]/in,
    os.getenv, environ imported bare. The key is the literal (an f-string: its
    leading literal part), or "?" where it is not written out."""
    import ast

    def environ(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
            (isinstance(node, ast.Name) and node.id == "environ")

    def key(node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr) and node.values and \
                isinstance(node.values[0], ast.Constant):
            return node.values[0].value
        return "?"

    reads = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault")
                    and environ(func.value)) or \
                    (isinstance(func, ast.Attribute) and func.attr == "getenv") or \
                    (isinstance(func, ast.Name) and func.id == "getenv"):
                reads.append((node.lineno, key(node.args[0])))
        elif isinstance(node, ast.Subscript) and environ(node.value):
            reads.append((node.lineno, key(node.slice)))
        elif isinstance(node, ast.Compare) and any(environ(c) for c in node.comparators):
            reads.append((node.lineno, key(node.left)))
    return reads


def test_the_environment_read_scan_sees_every_form():
    source = ("import os\nfrom os import environ, getenv\nname = 'SHMEMVM_X'\n"
              "a = os.environ.get('SHMEMVM_A')\nb = os.environ['SHMEMVM_B']\n"
              "c = 'SHMEMVM_C' in os.environ\nd = os.getenv(name)\ne = environ.get(f'SHMEMVM_{a}')\n"
              "f = getenv('TRITON_INTERPRET')\n")
    assert _environment_reads(source) == [(4, "SHMEMVM_A"), (5, "SHMEMVM_B"), (6, "SHMEMVM_C"),
                                          (7, "?"), (8, "SHMEMVM_"), (9, "TRITON_INTERPRET")]


def test_every_environment_read_outside_config_is_not_a_setting():
    """shmemvm reads its SHMEMVM_* settings through config.setting()/raw() alone,
    so each is in SETTINGS (checked, shown by `info`); any other read names a
    foreign variable, written out. The compiled piece reads none."""
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "config.py" and path.parent == PACKAGE:
            continue
        for line, name in _environment_reads(path.read_text()):
            if not name.startswith(FOREIGN):
                strays.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name}")
    assert not strays, ("read these through config.setting() (a SETTINGS entry), or add a "
                        "foreign variable to FOREIGN:\n" + "\n".join(strays))
    for path in sorted(PACKAGE.rglob("*.c")):
        assert "getenv" not in path.read_text(), path
