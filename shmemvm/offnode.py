"""The heap's MPI window: put/get to PEs on other nodes, and every atomic.

Every segment of the heap is attached to one `MPI.Win.Create_dynamic` window
when it is created and detached just before its physical memory is released.
Since offsets are symmetric, the target displacement of an object on PE p is
p's heap base (exchanged once) plus the object's offset. The window is kept
in a passive-target epoch (Lock_all) for the whole lifetime of the heap.

The window exists even when every PE is on one node: MPI atomics are atomic
only with respect to other MPI atomics, so atomics.py sends *all* atomics
through it, to PEs on the node too.

put/get here are blocking: they return once the data is complete at the
target (put) or here (get), each with one MPI_Win_flush. A destination that is
not contiguous (a strided slice) is described to MPI by a derived datatype,
so it is written in place; the local side is staged contiguously.

Device memory goes over MPI only where the MPI library can read and write it
(GPU-aware MPI), which shmemvm does not assume: device segments are not
attached, and put/get/atomics to them on other nodes raise UnsupportedError
(see docs/multinode.md).
"""

from __future__ import annotations

import logging

import torch
from mpi4py import MPI

from .allocator import Block, Segment
from .errors import UnsupportedError

log = logging.getLogger("shmemvm")


class OffNodeWindow:
    """One dynamic window over the heaps of all PEs of `comm` (collective)."""

    def __init__(self, comm: MPI.Comm, local, healthy=None):
        self.comm = comm
        self.my_pe = comm.Get_rank()
        self.local = local                      # the VMemPow2Allocator of this PE
        self._healthy = healthy or (lambda: True)
        self.device_memory = not local.backend.mpi_accessible  # a backend property
        self.win = MPI.Win.Create_dynamic(comm=comm)
        self.win.Set_errhandler(MPI.ERRORS_RETURN)
        self.bases = comm.allgather(local.base)
        self._attached: dict[int, memoryview] = {}
        #: operations issued and not yet completed by a flush of their own. put/get
        #: here and every atomic flush each operation as they issue it, so this stays
        #: 0 and flush() costs nothing; code that issues an operation without its
        #: flush must count it here, so that quiet() completes it.
        self.outstanding = 0
        local.release_listeners.append(self.detach)
        self.win.Lock_all()
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            log.debug("shmemvm: MPI thread level %d < MPI_THREAD_MULTIPLE: call shmemvm "
                      "from one thread at a time", MPI.Query_thread())

    # -- segments -------------------------------------------------------------------
    def attach(self, segment: Segment) -> None:
        if self.device_memory:
            return  # device memory is not handed to a non-GPU-aware MPI (see module doc)
        memory = MPI.memory.fromaddress(self.local.base + segment.offset, segment.size)
        self.win.Attach(memory)
        self._attached[segment.offset] = memory

    def detach(self, segment: Segment) -> None:
        memory = self._attached.pop(segment.offset, None)
        if memory is not None:
            self.win.Detach(memory)

    def displacement(self, tensor: torch.Tensor, pe: int) -> int:
        """Where `tensor` (a symmetric tensor of this PE) lies in PE `pe`'s window."""
        return self.bases[pe] + self.local.offset_of(tensor)

    def check_host(self, pe: int, what: str) -> None:
        if self.device_memory:
            raise UnsupportedError(
                f"{what} to PE {pe} goes through MPI, and this heap holds {self.local.device} "
                f"memory: shmemvm does not assume a GPU-aware MPI, so device memory is not "
                f"attached to its MPI window; use a host-backend heap (backend='host') for "
                f"this data, or keep it on PEs of one node and use put/get/ptr")

    # -- put/get ----------------------------------------------------------------------
    def _target(self, tensor: torch.Tensor, pe: int, op: str, writing: bool):
        """(displacement, target datatype spec, nbytes, derived type to free or None)."""
        self.check_host(pe, f"off-node {op}")
        nbytes = tensor.numel() * tensor.element_size()
        displacement = self.displacement(tensor, pe)
        if tensor.is_contiguous():
            return displacement, [displacement, nbytes, MPI.BYTE], nbytes, None
        datatype = _strided_type(tensor, op, writing)
        return displacement, [displacement, 1, datatype], nbytes, datatype

    def put(self, dest: torch.Tensor, source: torch.Tensor, pe: int, block: Block) -> None:
        """dest (symmetric, any strides) on PE `pe` <- source (any tensor of dest's shape)."""
        _, target, nbytes, datatype = self._target(dest, pe, "put", writing=True)
        try:
            if nbytes:
                staged = source.to("cpu").contiguous()
                self.win.Put([MPI.memory.fromaddress(staged.data_ptr(), nbytes), MPI.BYTE], pe,
                             target)
                self.win.Flush(pe)
        finally:
            if datatype is not None:
                datatype.Free()

    def get(self, dest: torch.Tensor, source: torch.Tensor, pe: int, block: Block) -> None:
        """dest (any tensor of source's shape) <- source (symmetric, any strides) on PE `pe`."""
        _, target, nbytes, datatype = self._target(source, pe, "get", writing=False)
        try:
            staging = dest if dest.device.type == "cpu" and dest.is_contiguous() else \
                torch.empty(dest.shape, dtype=dest.dtype)
            if nbytes:
                self.win.Get([MPI.memory.fromaddress(staging.data_ptr(), nbytes), MPI.BYTE], pe,
                             target)
                self.win.Flush(pe)
            if staging is not dest:
                dest.copy_(staging)
        finally:
            if datatype is not None:
                datatype.Free()

    def flush(self) -> None:
        """Complete outstanding operations. Flush_all is skipped when there are
        none: it is not free even then (a round trip to every target in MPICH,
        about 4 us with both PEs polling and up to 100 us when a target is not in
        an MPI call), and quiet() runs on every free and barrier_all."""
        if self.outstanding:
            self.win.Flush_all()
            self.outstanding = 0

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        if self.win == MPI.WIN_NULL:
            return
        if self._healthy():
            self.win.Unlock_all()  # waits on every target: hangs when one has died
        for memory in self._attached.values():
            self.win.Detach(memory)
        self._attached.clear()
        if self._healthy():
            self.win.Free()  # collective (and synchronizing in some MPIs)
        else:
            log.warning("shmemvm: the heap is broken (a PE timed out), so its MPI window is "
                        "left allocated instead of freed collectively (which could hang)")
            self.win = MPI.WIN_NULL


def _strided_type(tensor: torch.Tensor, op: str, writing: bool) -> MPI.Datatype:
    """A committed MPI datatype whose bytes are `tensor`'s elements in order,
    relative to its first element (torch strides are never negative)."""
    itemsize = tensor.element_size()
    dims = []  # (count, byte stride), innermost first, adjacent contiguous dims merged
    for size, stride in reversed(list(zip(tensor.shape, tensor.stride()))):
        if size == 1:
            continue
        if stride == 0 and writing:
            raise ValueError(
                f"off-node {op}: the destination {tuple(tensor.shape)} with strides "
                f"{tuple(tensor.stride())} names some elements more than once (stride 0, as "
                f"from expand()); write to a symmetric tensor whose elements are distinct")
        stride *= itemsize
        if dims and dims[-1][0] * dims[-1][1] == stride:
            dims[-1] = (dims[-1][0] * size, dims[-1][1])
        else:
            dims.append((size, stride))
    if dims and dims[0][1] == itemsize:   # innermost run is contiguous: one block of bytes
        count, _ = dims.pop(0)
        datatype = MPI.BYTE.Create_contiguous(count * itemsize)
    else:
        datatype = MPI.BYTE.Create_contiguous(itemsize)
    for count, stride in dims:
        outer = datatype.Create_hvector(count, 1, stride)
        datatype.Free()
        datatype = outer
    return datatype.Commit()
