"""import_external_tensor's decision logic on the cuda backend
(backends/cuda.py external_pieces), without a GPU, over a stand-in driver:
which pieces it finds for a storage inside and across torch-like VMM pieces,
which error it gives for which properties, and that every handle reference it
takes is given back on refusal. The heap path over host memory, under MPI:
tests/mpi/openshmem/test_external.py.
"""

from __future__ import annotations

import enum
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from shmemvm import UnsupportedError
from shmemvm.backends.cuda import ExternalPiece, external_pieces

MiB = 1 << 20
G = 2 * MiB            # the stand-in driver's granularity


# -- the decision logic over a stand-in driver ------------------------------------------------
class Result(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1


class FakeDriver:
    """The driver calls external_pieces makes, over a list of mapped pieces
    (va, size, handle, requested handle types, device); counts references."""
    CUresult = Result
    CUmemAllocationHandleType = SimpleNamespace(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR=1)

    def __init__(self, pieces):
        self.pieces = pieces
        self.refs = Counter()

    def _at(self, addr):
        return next((p for p in self.pieces if p[0] <= addr < p[0] + p[1]), None)

    def cuMemRetainAllocationHandle(self, addr):
        piece = self._at(addr)
        if piece is None:
            return (Result.CUDA_ERROR_INVALID_VALUE, None)
        self.refs[piece[2]] += 1
        return (Result.CUDA_SUCCESS, piece[2])

    def cuMemRelease(self, handle):
        self.refs[handle] -= 1
        assert self.refs[handle] >= 0, f"handle {handle} released more often than retained"
        return (Result.CUDA_SUCCESS,)

    def cuMemGetAllocationPropertiesFromHandle(self, handle):
        piece = next(p for p in self.pieces if p[2] == handle)
        return (Result.CUDA_SUCCESS, SimpleNamespace(requestedHandleTypes=piece[3],
                                                     location=SimpleNamespace(id=piece[4])))

    def cuMemGetAddressRange(self, addr):
        piece = self._at(addr)
        if piece is None:
            return (Result.CUDA_ERROR_INVALID_VALUE, 0, 0)
        return (Result.CUDA_SUCCESS, piece[0], piece[1])


BASE = 0x7F0000000000


def torch_like(sizes_mib, handle_types=1, device=0, gap_after=None):
    """Pieces as torch's expandable segment maps them: one after the other."""
    pieces, va = [], BASE
    for k, size in enumerate(sizes_mib):
        pieces.append((va, size * MiB, 100 + k, handle_types, device))
        va += size * MiB
        if gap_after == k:
            va += G
    return FakeDriver(pieces)


def find(drv, offset, nbytes, device=0):
    return external_pieces(drv, BASE + offset, nbytes, device, G, torch.zeros(1))


def test_storage_inside_one_piece_gives_that_whole_piece():
    drv = torch_like([20, 20])
    pieces = find(drv, 3 * MiB + 512, 4 * MiB)
    assert pieces == [ExternalPiece(BASE, 20 * MiB, 100)]
    assert drv.refs == Counter({100: 1, 101: 0})       # one reference, for the caller


def test_storage_across_pieces_gives_each_whole_piece_and_no_other():
    drv = torch_like([2, 20, 20, 20, 2])
    # from 18 MiB into the second piece to 2 MiB into the fourth
    pieces = find(drv, 2 * MiB + 18 * MiB, 2 * MiB + 20 * MiB + 2 * MiB)
    assert pieces == [ExternalPiece(BASE + 2 * MiB, 20 * MiB, 101),
                      ExternalPiece(BASE + 22 * MiB, 20 * MiB, 102),
                      ExternalPiece(BASE + 42 * MiB, 20 * MiB, 103)]
    assert drv.refs == Counter({100: 0, 101: 1, 102: 1, 103: 1, 104: 0})


def test_storage_ending_on_a_piece_boundary_does_not_take_the_next_piece():
    drv = torch_like([2, 2, 2])
    pieces = find(drv, 2 * MiB, 2 * MiB)
    assert pieces == [ExternalPiece(BASE + 2 * MiB, 2 * MiB, 101)]
    assert drv.refs == Counter({100: 0, 101: 1, 102: 0})


def refused(drv, offset, nbytes, device=0) -> str:
    with pytest.raises(UnsupportedError) as info:
        find(drv, offset, nbytes, device)
    assert all(count == 0 for count in drv.refs.values()), drv.refs   # nothing kept
    message = str(info.value)
    assert "x = heap.empty(t.shape, t.dtype); x.copy_(t)" in message   # the way to copy in
    return message


def test_memory_that_is_not_vmm_says_to_use_expandable_segments():
    message = refused(torch_like([]), 0, 4096)
    assert "not VMM memory" in message and "CUDA_ERROR_INVALID_VALUE" in message
    assert "expandable_segments:True" in message


def test_piece_without_posix_fd_export_is_refused_with_its_handle_types():
    message = refused(torch_like([20], handle_types=0), MiB, MiB)
    assert "without POSIX file descriptor export" in message
    assert "requestedHandleTypes=0x0" in message


def test_a_later_piece_without_posix_fd_export_is_refused_too():
    drv = torch_like([2, 2])
    drv.pieces[1] = drv.pieces[1][:3] + (0, 0)
    assert "without POSIX file descriptor export" in refused(drv, 0, 3 * MiB)


def test_memory_of_another_gpu_is_refused():
    assert "lives on GPU 1, the heap on GPU 0" in refused(torch_like([2], device=1), 0, 4096)


def test_storage_over_a_hole_is_refused():
    message = refused(torch_like([2, 2], gap_after=0), 0, 6 * MiB)
    assert "not mapped contiguously" in message
