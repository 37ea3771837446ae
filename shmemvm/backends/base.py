"""The VMM backend protocol: what the heap needs from a memory system.

A backend hands out three kinds of things and the heap never asks which
backend it holds:
  - virtual-address (VA) ranges: reserve / unreserve;
  - physical pieces ("handles"): create / release, export to a file
    descriptor / import from one;
  - mappings of a handle into a reserved range: map / unmap / set_access.
Plus a zero-copy tensor view of an address and the copy used by put/get.

Sizes given to create/map are multiples of `granularity`; VA given to map is
inside a range from `reserve` and granularity-aligned.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from . import _dlpack
from ..errors import UnsupportedError

Handle = Any  # backend-specific physical-memory handle


class VMMBackend(abc.ABC):
    #: short name ("host", "cuda", "hip")
    name: str = ""
    #: size and alignment unit of physical pieces, a power of two
    granularity: int = 0
    #: the device tensors live on (torch.device("cpu") for host memory)
    device: torch.device = torch.device("cpu")
    #: True where the MPI library can read and write this memory, so the heap
    #: attaches it to its MPI window (off-node put/get, atomics). Host memory:
    #: yes. Device memory: no, since shmemvm does not assume a GPU-aware MPI.
    #: The default is the safe answer for a new backend.
    mpi_accessible: bool = False

    @staticmethod
    def is_available() -> bool:
        """Whether this backend can run on this machine."""
        return True

    # -- virtual address space --------------------------------------------------
    @abc.abstractmethod
    def reserve(self, size: int, alignment: int) -> int:
        """Reserve `size` bytes of VA aligned to `alignment`; return its address."""

    @abc.abstractmethod
    def unreserve(self, va: int, size: int) -> None:
        """Give back a range from reserve() (nothing may be mapped in it)."""

    # -- physical memory ----------------------------------------------------
    @abc.abstractmethod
    def create(self, size: int) -> Handle:
        """New physical memory of `size` bytes, exportable as a file descriptor."""

    @abc.abstractmethod
    def release(self, handle: Handle) -> None:
        """Drop this process's reference to physical memory."""

    @abc.abstractmethod
    def export_fd(self, handle: Handle) -> int:
        """A new file descriptor for `handle`, owned by the caller."""

    @abc.abstractmethod
    def import_fd(self, fd: int, size: int) -> Handle:
        """A handle for memory received as `fd`. Takes ownership of `fd`
        (it is closed here or by release())."""

    # -- mappings -----------------------------------------------------------
    @abc.abstractmethod
    def map(self, va: int, size: int, handle: Handle) -> None:
        """Map `handle` at `va` (inside a reservation)."""

    @abc.abstractmethod
    def unmap(self, va: int, size: int) -> None:
        """Unmap `[va, va+size)`; the reservation stays."""

    @abc.abstractmethod
    def set_access(self, va: int, size: int) -> None:
        """Make a freshly mapped range readable and writable from this process's
        device. Where access can only be set from the reservation's base (ROCm),
        the backend widens the range itself (hip.py)."""

    def map_accessible(self, va: int, size: int, handle: Handle) -> None:
        """map() then set_access(); nothing is left mapped if either fails."""
        self.map(va, size, handle)
        try:
            self.set_access(va, size)
        except BaseException:
            self.unmap(va, size)
            raise

    # -- data ---------------------------------------------------------------
    def tensor(self, va: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A zero-copy tensor over mapped memory at `va`."""
        return _dlpack.tensor_at(va, shape, dtype, self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, blocking: bool):
        """dst <- src where either may be peer memory. Returns the stream a
        non-blocking copy may still be running on, which the caller completes
        (the context that issued it: completion.py), or None when the copy is
        complete (always on the host)."""
        dst.copy_(src, non_blocking=not blocking)
        return None

    def synchronize(self) -> None:
        """Wait for the work queued on the current device stream (none here:
        host memory has no stream; see waits())."""

    def import_external(self, tensor: torch.Tensor) -> list:
        """The physical pieces under memory another allocator made, if this
        backend can share it: objects with `va` (where the piece is mapped now),
        `size` and `handle` (one reference, for release()), covering
        tensor's storage contiguously in address order."""
        raise UnsupportedError(
            f"the {self.name} backend cannot import memory it did not create "
            f"(tensor at {tensor.data_ptr():#x} on {tensor.device}); allocate a "
            f"symmetric tensor with the same shape and dtype and copy into it "
            f"(t = heap.empty(x.shape, x.dtype); t.copy_(x))"
        )

    def close(self) -> None:
        """Release backend-wide resources (contexts, streams)."""

    def describe(self) -> dict:
        return {"backend": self.name, "granularity": self.granularity, "device": str(self.device)}


def waits(backend) -> bool:
    """Whether `backend.synchronize()` has work to wait for: not the base
    class's no-op (host memory). Callers that synchronize on every call (a
    barrier's quiet, a fused collective) skip the call where it would do
    nothing."""
    return getattr(type(backend), "synchronize", None) is not VMMBackend.synchronize
