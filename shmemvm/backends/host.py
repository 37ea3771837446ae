"""Host memory: memfd files mapped with mmap. Runs anywhere; the default where
there is no GPU.

VA is a PROT_NONE, MAP_NORESERVE anonymous mapping (costs no memory). A
physical piece is a memfd of the piece's size; mapping it is
mmap(MAP_FIXED|MAP_SHARED) over part of the reservation, and unmapping puts a
fresh PROT_NONE mapping back so that the reservation keeps its hole.
Exporting is dup(); a peer maps the fd it receives the same way.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import torch

from ..config import parse_size, setting
from .base import VMMBackend

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = 0x10
_MAP_FIXED_NOREPLACE = 0x100000
_PROT_NONE = 0
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_RESERVE_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE


def _check_mmap(result: int | None, what: str) -> int:
    if result is None or result == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed: {os.strerror(err)}")
    return result


class HostBackend(VMMBackend):
    name = "host"
    device = torch.device("cpu")
    mpi_accessible = True        # plain process memory: any MPI reads and writes it

    @staticmethod
    def is_available() -> bool:
        return hasattr(os, "memfd_create")

    def __init__(self, granularity: int | str | None = None, **_device_options):
        granularity = parse_size(setting("SHMEMVM_HOST_GRANULARITY", granularity))
        page = mmap.PAGESIZE
        if granularity < page or granularity & (granularity - 1):
            raise ValueError(
                f"host granularity must be a power of two of at least the page size "
                f"({page}), got {granularity} (SHMEMVM_HOST_GRANULARITY)")
        self.granularity = granularity

    def reserve(self, size: int, alignment: int) -> int:
        # Over-reserve, then trim the unaligned head and tail.
        span = size + alignment
        raw = _check_mmap(_libc.mmap(None, span, _PROT_NONE, _RESERVE_FLAGS, -1, 0),
                          f"reserving {size} bytes of address space")
        va = (raw + alignment - 1) & ~(alignment - 1)
        if va > raw:
            _libc.munmap(raw, va - raw)
        tail = raw + span - (va + size)
        if tail:
            _libc.munmap(va + size, tail)
        return va

    def unreserve(self, va: int, size: int) -> None:
        if _libc.munmap(va, size) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"munmap of {size} bytes at {va:#x}: {os.strerror(err)}")

    def create(self, size: int) -> int:
        fd = os.memfd_create("shmemvm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(self, handle: int) -> None:
        os.close(handle)

    def export_fd(self, handle: int) -> int:
        return os.dup(handle)

    def import_fd(self, fd: int, size: int) -> int:
        actual = os.fstat(fd).st_size
        if actual < size:
            os.close(fd)
            raise ValueError(f"received memory of {actual} bytes where {size} were expected")
        return fd

    def map(self, va: int, size: int, handle: int) -> None:
        _check_mmap(_libc.mmap(va, size, mmap.PROT_READ | mmap.PROT_WRITE,
                               mmap.MAP_SHARED | _MAP_FIXED, handle, 0),
                    f"mapping {size} bytes at {va:#x}")

    def unmap(self, va: int, size: int) -> None:
        result = _libc.mmap(va, size, _PROT_NONE, _RESERVE_FLAGS | _MAP_FIXED, -1, 0)
        if result is not None and result != _MAP_FAILED:
            return
        err = ctypes.get_errno()
        if err != errno.ENOMEM:
            raise OSError(err, f"unmapping {size} bytes at {va:#x} failed: {os.strerror(err)}")
        # At vm.max_map_count the kernel refuses any new mapping, even one that
        # replaces a mapping exactly; removing the mapping whole is allowed (it
        # splits nothing), and then the hole in the reservation is closed at once.
        if _libc.munmap(va, size) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unmapping {size} bytes at {va:#x} failed: {os.strerror(err)}")
        result = _check_mmap(_libc.mmap(va, size, _PROT_NONE, _RESERVE_FLAGS | _MAP_FIXED_NOREPLACE,
                                        -1, 0), f"reserving {size} bytes at {va:#x} again")
        if result != va:  # a kernel without MAP_FIXED_NOREPLACE took it as a hint
            _libc.munmap(result, size)
            raise OSError(errno.EEXIST, f"reserving {size} bytes at {va:#x} again failed: "
                                        f"something else was mapped there meanwhile")

    def set_access(self, va: int, size: int) -> None:
        """mmap already granted read/write."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor, blocking: bool) -> None:
        # Host copies complete synchronously; "non-blocking" is the same copy.
        dst.copy_(src)
