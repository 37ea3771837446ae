"""PEs on other nodes: MPI one-sided communication on a dynamic window.

Every segment of the heap is attached to one `MPI.Win.Create_dynamic` window
when it is created and detached when its physical memory is released. Since
offsets are symmetric, the target displacement of an object on PE p is
p's heap base (exchanged once) plus the object's offset. The window is kept
in a passive-target epoch (Lock_all) for the whole lifetime of the heap.

Device memory goes over MPI only where the MPI library can read and write it
(GPU-aware MPI); otherwise it is staged through host memory on the origin and
the target must be host memory (see docs/multinode.md).
"""

from __future__ import annotations

import torch
from mpi4py import MPI

from .allocator import Block, Segment
from .errors import UnsupportedError


class OffNodeWindow:
    def __init__(self, comm: MPI.Comm, local):
        self.comm = comm
        self.local = local                      # the VMemPow2Allocator of this PE
        self.win = MPI.Win.Create_dynamic(comm=comm)
        self.bases = comm.allgather(local.base)
        self.device_memory = local.device.type != "cpu"
        self._attached: dict[int, memoryview] = {}
        local.release_listeners.append(self.detach)
        self.win.Lock_all()

    def attach(self, segment: Segment) -> None:
        memory = MPI.memory.fromaddress(self.local.base + segment.offset, segment.size)
        self.win.Attach(memory)
        self._attached[segment.offset] = memory

    def detach(self, segment: Segment) -> None:
        memory = self._attached.pop(segment.offset, None)
        if memory is not None:
            self.win.Detach(memory)

    def _target(self, tensor: torch.Tensor, pe: int) -> tuple[int, int]:
        if not tensor.is_contiguous():
            raise ValueError("off-node put/get needs a contiguous symmetric tensor; "
                             "use a contiguous slice")
        if self.device_memory:
            raise UnsupportedError(
                f"PE {pe} is on another node and this heap holds {self.local.device} memory: "
                f"off-node access to device memory needs a GPU-aware MPI, which shmemvm does "
                f"not assume; stage through a host-backend heap (backend='host')")
        offset = tensor.data_ptr() - self.local.base
        return self.bases[pe] + offset, tensor.numel() * tensor.element_size()

    def put(self, dest: torch.Tensor, source: torch.Tensor, pe: int, block: Block) -> None:
        displacement, nbytes = self._target(dest, pe)
        source = source.to("cpu").contiguous()
        if nbytes:
            self.win.Put([MPI.memory.fromaddress(source.data_ptr(), nbytes), MPI.BYTE], pe,
                         [displacement, nbytes, MPI.BYTE])
            self.win.Flush(pe)

    def get(self, dest: torch.Tensor, source: torch.Tensor, pe: int, block: Block) -> None:
        displacement, nbytes = self._target(source, pe)
        staging = dest if dest.device.type == "cpu" and dest.is_contiguous() else \
            torch.empty(dest.shape, dtype=dest.dtype)
        if nbytes:
            self.win.Get([MPI.memory.fromaddress(staging.data_ptr(), nbytes), MPI.BYTE], pe,
                         [displacement, nbytes, MPI.BYTE])
            self.win.Flush(pe)
        if staging is not dest:
            dest.copy_(staging)

    def flush(self) -> None:
        self.win.Flush_all()

    def close(self) -> None:
        if self.win == MPI.WIN_NULL:
            return
        self.win.Unlock_all()
        for memory in self._attached.values():
            self.win.Detach(memory)
        self._attached.clear()
        self.win.Free()
