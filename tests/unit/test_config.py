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
