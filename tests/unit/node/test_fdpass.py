"""Socket directories of fdpass.FdChannel do not pile up in the temporary
directory: closed, dropped, or left by a process that died, they go."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from shmemvm.node import fdpass
from shmemvm.node.fdpass import FdChannel, sweep_stale_directories

FDPASS = Path(fdpass.__file__)


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    """A temporary directory of this test's own, so that other jobs' live
    channels are neither seen nor touched."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def crashed_channel(tmp: Path) -> str:
    """The directory of a channel whose process left with os._exit (no close, no
    atexit): fdpass.py run alone in a child process, so it starts fast."""
    code = ("import importlib.util, os, sys, tempfile\n"
            "tempfile.tempdir = sys.argv[2]\n"
            "spec = importlib.util.spec_from_file_location('fdpass', sys.argv[1])\n"
            "fdpass = sys.modules['fdpass'] = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(fdpass)\n"
            "channel = fdpass.FdChannel('pe7')\n"
            "print(channel.directory, flush=True)\n"
            "os._exit(0)\n")
    done = subprocess.run([sys.executable, "-c", code, str(FDPASS), str(tmp)],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_close_removes_the_directory(tmp):
    channel = FdChannel("pe0")
    assert Path(channel.path).is_socket() and Path(channel.directory).name.startswith(
        f"shmemvm-{os.getpid()}-")
    channel.close()
    channel.close()  # twice is harmless
    assert not os.path.lexists(channel.directory)


def test_a_channel_never_closed_is_removed_when_dropped(tmp):
    channel = FdChannel("pe0")
    directory = channel.directory
    del channel
    gc.collect()
    assert not os.path.lexists(directory)


def test_the_next_channel_removes_what_a_dead_process_left(tmp):
    left = crashed_channel(tmp)
    assert Path(left, "pe7.sock").is_socket()          # os._exit left it behind
    live = FdChannel("pe1")                            # sweeps
    try:
        assert not os.path.lexists(left)
        assert os.path.isdir(live.directory)
    finally:
        live.close()


def test_sweep_keeps_live_channels_and_what_is_not_a_channel(tmp):
    live = FdChannel("pe0")
    other = tmp / "shmemvm-peer-death-abc" / "job0"    # a test's own directory
    other.mkdir(parents=True)
    files = tmp / f"shmemvm-{os.getpid()}-files"         # not a channel's content
    files.mkdir()
    (files / "notes.txt").write_text("x")
    try:
        assert sweep_stale_directories() == []
        assert os.path.isdir(live.directory) and other.is_dir() and files.is_dir()
    finally:
        live.close()


def test_sweep_of_directories_without_a_socket(tmp):
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = int(child.stdout)
    old = time.time() - 3600
    dead_old = tmp / f"shmemvm-{dead}-aaaa"            # bound never, owner gone: stale
    dead_new = tmp / f"shmemvm-{dead}-bbbb"            # maybe about to be bound: kept
    alive_old = tmp / f"shmemvm-{os.getpid()}-cccc"    # its owner lives: kept
    for directory in (dead_old, dead_new, alive_old):
        directory.mkdir()
    for directory in (dead_old, alive_old):
        os.utime(directory, (old, old))
    assert sweep_stale_directories() == [str(dead_old)]
    assert dead_new.is_dir() and alive_old.is_dir()


def test_sweep_survives_directories_that_vanish_while_it_looks(tmp, monkeypatch):
    """Other PEs close and remove their directories during a sweep (seen in the
    4-PE suite: a socket gone between listing and stat); a new channel must
    still be made."""
    (tmp / "shmemvm-1-gone").mkdir()

    def vanished(directory, name, info):
        raise FileNotFoundError(2, "No such file or directory", directory)

    monkeypatch.setattr(fdpass, "_is_stale", vanished)
    assert sweep_stale_directories() == []
    FdChannel("pe0").close()
