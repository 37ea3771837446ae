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
target (put) or here (get). Given a context's completion tracker (put_nbi,
get_nbi; completion.py) they return once the operation is issued, and the
tracker's quiet() completes it with the same deadline. A destination that is not contiguous (a strided
slice) is described to MPI by a derived datatype, so it is written in place;
the local side is staged contiguously.

No wait without a deadline. A target PE that has died, is stopped, or stays
out of MPI would make MPI_Win_flush (and the blocking one-sided calls) wait
forever, and MPI has no flush with a timeout. So every operation here and in
atomics.py is issued in its request-based form and `complete()` polls the
requests with MPI_Test until the heap's deadline (SHMEMVM_TIMEOUT); at the
deadline the heap is marked broken (later calls say it is unusable) and
PeerTimeoutError names the PE and the operation. What a request's completion
proves differs by operation, so each says how it reaches remote completion:

- get (MPI_Rget): the data is here when the request completes. Done.
- put (MPI_Rput): the request completes when the origin buffer may be reused,
  which says nothing about the target. A probe, an MPI_Rget of a word that
  each PE attaches for this purpose alone (so it conflicts with no data),
  is issued right after the put and waited for with the deadline: its answer
  shows that the target serves our operations. Only then MPI_Win_flush
  completes the put at the target, with a live target that serves requests,
  so it returns promptly (`finish`).
- atomics (atomics.py): MPI_Rget_accumulate, whose request needs the
  target's answer, waited for with the deadline, then the flush.

The one window this leaves: a target that answers and then dies or stops
before it has completed the operation still leaves the flush waiting. Closing
it needs a flush with a timeout, which MPI lacks (no MPI_Win_rflush in MPI 4.1).

Device memory goes over MPI only where the MPI library can read and write it
(GPU-aware MPI), which shmemvm does not assume: device segments are not
attached, and put/get/atomics to them on other nodes raise UnsupportedError
(see docs/multinode.md).
"""

from __future__ import annotations

import array
from collections.abc import Callable
import logging
import os
import time

import torch
from mpi4py import MPI

from ..memory.buddy import Block, Segment
from ..errors import PeerTimeoutError, UnsupportedError

log = logging.getLogger("shmemvm")

#: Windows left allocated on a broken heap, with the memory they exposed. Another
#: PE's operation may still be on its way (it timed out there, not here), and MPI
#: applies it to this PE's memory whenever this PE next makes MPI progress, window
#: detached or not: memory unmapped under it was a segmentation fault in the
#: survivor's next MPI call (tests/jobs/reliability/test_reliability_liveness.py,
#: dead-holder-off-node-dropped). Both live as long as MPI does: process-wide.
_LEFT_TO_MPI: list[tuple[MPI.Win, object]] = []


class OffNodeWindow:
    """One dynamic window over the heaps of all PEs of `comm` (collective)."""

    def __init__(self, comm: MPI.Comm, local, healthy=None, timeout: float | None = None,
                 broken=None):
        """`healthy()` says whether the heap still works (close() then frees the
        window collectively); `timeout` is the heap's SHMEMVM_TIMEOUT in seconds
        (None: wait for ever); `broken(text)` marks the heap unusable when an
        operation timed out."""
        self.comm = comm
        self.my_pe = comm.Get_rank()
        self.local = local                      # the VMemPow2Allocator of this PE
        self._healthy = healthy or (lambda: True)
        self._broken = broken or (lambda text: None)
        self.timeout = timeout
        self.device_memory = not local.backend.mpi_accessible  # a backend property
        self.win = MPI.Win.Create_dynamic(comm=comm)   # type: ignore[arg-type]  # an Intracomm
        self.win.Set_errhandler(MPI.ERRORS_RETURN)
        self._attached: dict[int, MPI.buffer] = {}
        self.left_to_mpi = False   # close() left the window and its memory to MPI
        # The probe word (see the module doc): host memory that only probes read.
        self._probe_word = array.array("q", [0])
        self._probe_memory = MPI.memory.frombuffer(self._probe_word)
        self._probe_result = array.array("q", [0])
        self.win.Attach(self._probe_memory)
        pairs = comm.allgather((local.base, MPI.Get_address(self._probe_memory)))
        self.bases = [base for base, _ in pairs]
        self._probes = [probe for _, probe in pairs]
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

    # -- completion with a deadline --------------------------------------------------
    def complete(self, requests, pe: int, what: str) -> None:
        """Complete MPI `requests` (one or a list) of an operation on PE `pe`, or at
        the deadline mark the heap broken and raise PeerTimeoutError."""
        test: Callable[[], bool]
        if isinstance(requests, MPI.Request):
            test = requests.Test      # the common case: one request, a few microseconds
        else:
            def test() -> bool:
                return MPI.Request.Testall(requests)
        if test():
            return
        deadline = time.monotonic() + (self.timeout if self.timeout is not None else float("inf"))
        spins = 0
        while not test():
            spins += 1
            if spins & 63:
                continue
            if time.monotonic() > deadline:
                self._broken(f"{what} to PE {pe} timed out after {self.timeout:g} s")
                raise PeerTimeoutError(
                    f"PE {self.my_pe}: {what} to PE {pe} did not complete within "
                    f"{self.timeout:g} s (SHMEMVM_TIMEOUT): PE {pe} has died, is stopped, or "
                    f"has not entered MPI (any shmemvm call) for that long. This heap cannot "
                    f"be used any more; finalize() releases it")
            # Yield the core, as the heap's own waits do (not sleep(0): a timed sleep).
            if spins < 4096:
                os.sched_yield()
            else:
                time.sleep(0.0002)

    def finish(self, requests, pe: int, what: str) -> None:
        """complete() the `requests` of operations on PE `pe`, then MPI_Win_flush
        them: once a request that needs `pe`'s answer has completed, `pe` is known
        to serve this PE's operations and the flush returns promptly. The flush is
        still needed: MPICH was seen to complete an MPI_Rget_accumulate request
        before the target had applied the update (as the standard allows)."""
        self.complete(requests, pe, what)
        self.win.Flush(pe)

    def _probe(self, pe: int, result: array.array | None = None) -> MPI.Request:
        """A read of PE `pe`'s probe word into `result` (default: a buffer of the
        window's, for probes completed before the next is issued): its completion
        needs `pe`'s answer."""
        return self.win.Rget([self._probe_result if result is None else result, 1,
                              MPI.INT64_T], pe, [self._probes[pe], 1, MPI.INT64_T])

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

    def put(self, dest: torch.Tensor, source: torch.Tensor, pe: int, block: Block,
            tracker=None) -> None:
        """dest (symmetric, any strides) on PE `pe` <- source (any tensor of dest's
        shape): complete at `pe` on return, or, given a `tracker` (put_nbi), issued
        and left for tracker.quiet() to complete (the staged copy of `source` is
        made here, so the caller may reuse `source` at once)."""
        _, target, nbytes, datatype = self._target(dest, pe, "put", writing=True)
        deferred = False
        try:
            if nbytes:
                staged = source.to("cpu").contiguous()
                put = self.win.Rput([MPI.memory.fromaddress(staged.data_ptr(), nbytes),
                                     MPI.BYTE], pe, target)
                if tracker is None:
                    self.finish([put, self._probe(pe)], pe, "off-node put")
                else:
                    # The probe needs pe's answer, so quiet() can wait for it with the
                    # deadline; it reads into a buffer of its own (others may be in flight).
                    answer = array.array("q", [0])
                    tracker.defer([put, self._probe(pe, answer)], pe, self,
                                  buffers=(staged, answer, datatype),
                                  done=datatype.Free if datatype is not None else None)
                    deferred = True
        finally:
            if datatype is not None and not deferred:
                datatype.Free()

    def get(self, dest: torch.Tensor, source: torch.Tensor, pe: int, block: Block,
            tracker=None) -> None:
        """dest (any tensor of source's shape) <- source (symmetric, any strides) on
        PE `pe`: the data is in `dest` on return, or, given a `tracker` (get_nbi),
        once tracker.quiet() has returned."""
        _, target, nbytes, datatype = self._target(source, pe, "get", writing=False)
        deferred = False
        try:
            staging = dest if dest.device.type == "cpu" and dest.is_contiguous() else \
                torch.empty(dest.shape, dtype=dest.dtype)

            def unstage():
                if staging is not dest:
                    dest.copy_(staging)
                if datatype is not None:
                    datatype.Free()

            if nbytes:
                get = self.win.Rget([MPI.memory.fromaddress(staging.data_ptr(), nbytes),
                                     MPI.BYTE], pe, target)
                if tracker is not None:  # an Rget completes only with pe's answer
                    tracker.defer(get, pe, self, buffers=(staging, dest), done=unstage)
                    deferred = True
                    return
                self.complete(get, pe, "off-node get")  # complete: the data is here
            if staging is not dest:
                dest.copy_(staging)
        finally:
            if datatype is not None and not deferred:
                datatype.Free()

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        if self.win == MPI.WIN_NULL:
            return
        if self._healthy():
            self.win.Unlock_all()  # waits on every target: hangs when one has died
        for memory in self._attached.values():
            self.win.Detach(memory)
        self._attached.clear()
        self.win.Detach(self._probe_memory)
        if self._healthy():
            self.win.Free()  # collective (and synchronizing in some MPIs)
        else:
            log.warning("shmemvm: the heap is broken (a PE left, died or timed out), so its "
                        "MPI window is left allocated instead of freed collectively (which "
                        "could hang), and the memory it exposed stays mapped until the "
                        "process ends")
            _LEFT_TO_MPI.append((self.win, self.local))
            self.left_to_mpi = True
            self.win = MPI.WIN_NULL


def _strided_type(tensor: torch.Tensor, op: str, writing: bool) -> MPI.Datatype:
    """A committed MPI datatype whose bytes are `tensor`'s elements in order,
    relative to its first element (torch strides are never negative)."""
    itemsize = tensor.element_size()
    dims: list[tuple[int, int]] = []  # (count, byte stride), innermost first, adjacent contiguous dims merged
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
