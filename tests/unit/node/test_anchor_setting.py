"""The anchor (node/anchor.py) in one process: its setting, the size `auto`
means, and an anchor that fails halfway. Where it is mapped, agreed on and
left behind under MPI: tests/mpi/node/test_anchor.py.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from conftest import TEST_BACKEND
from shmemvm.node.anchor import CUDA_ANCHOR, Anchor, anchor_setting, anchor_size
from shmemvm.backends import create_backend
from shmemvm.errors import ShmemError
from shmemvm.memory.buddy import Segment
from util import open_fds, shmemvm_mappings

SIZE = 4 << 20      # a multiple of every backend's granularity (host 64 KiB, CUDA 2 MiB)


def test_the_setting_is_auto_or_a_size():
    assert anchor_setting("auto") == anchor_setting(" AUTO ") == "auto"
    assert anchor_setting("512M") == 512 << 20
    assert anchor_setting("0") == anchor_setting(0) == 0
    for bad in ("lots", "-1M", True):
        with pytest.raises(ValueError, match="SHMEMVM_ANCHOR.*'auto', 0 or a size"):
            anchor_setting(bad)


def test_auto_means_512m_on_cuda_with_node_peers_and_nothing_elsewhere():
    cuda = SimpleNamespace(name="cuda", granularity=2 << 20)
    host = SimpleNamespace(name="host", granularity=64 << 10)
    assert anchor_size("auto", cuda, 2) == CUDA_ANCHOR == 512 << 20
    assert anchor_size("auto", cuda, 1) == 0          # alone on its node: nothing to share
    assert anchor_size("auto", host, 4) == 0
    assert anchor_size(100, host, 2) == 64 << 10      # rounded up to the granularity
    assert anchor_size(SIZE, host, 1) == 0


def test_an_anchor_that_fails_halfway_releases_what_it_made():
    backend = create_backend(TEST_BACKEND)
    fds, mappings = open_fds(), shmemvm_mappings()

    def refuse(handle):
        raise OSError("export refused (test)")

    backend.export_fd = refuse
    try:
        with pytest.raises(OSError, match="export refused"):
            Anchor(backend, SIZE, [1, 2])
        assert open_fds() == fds
        assert shmemvm_mappings() == mappings
    finally:
        backend.close()


def test_a_closed_anchor_says_so_when_asked_to_export():
    """(It was os.dup(None): a TypeError that named nothing.)"""
    backend = create_backend(TEST_BACKEND)
    try:
        anchor = Anchor(backend, SIZE, [1])
        segment = Segment(0, SIZE, 1)
        os.close(anchor.export(segment))
        anchor.close()
        with pytest.raises(ShmemError, match="anchor is closed"):
            anchor.export(segment)
    finally:
        backend.close()
