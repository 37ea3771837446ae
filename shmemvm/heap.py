"""SymmetricHeap: collective malloc/free over MPI, peers on the node, put/get/ptr.

Every PE runs the same deterministic allocator (allocator.py), so the same
sequence of collective calls gives the same offsets everywhere; a collective
therefore only has to *agree* that every PE made the same call, which is one
small allreduce (agreement.py). Only segments that a call creates are exported
and passed to the other PEs of the node (exchange.py); a segment released on
one PE is released at the same call on all of them, so each PE drops its
imports of it without being told.

Errors instead of hangs: every wait (MPI request, socket) has a deadline
(SHMEMVM_TIMEOUT); a mismatched collective raises SymmetryError on every PE
with what each PE asked for; a local failure while backing a new segment is
agreed on and undone everywhere.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import struct
import threading
import weakref

import torch
from mpi4py import MPI

from .openshmem import atomics, collectives, locks, strided, waits as sync, teams
from . import profile, thread_levels
from .agreement.protocol import (DEFAULT_TIMEOUT, Agreement, Call, Outcome, Phase, duplicate,
    parse_timeout, persistent_collectives)
from .memory.buddy import Block, Segment
from .node.anchor import Anchor, anchor_setting, anchor_size
from .transport.completion import CompletionTracker
from .config import setting
from .errors import (FreedTensorError, HeapExhaustedError, PeerTimeoutError, ResourceLimitError,
    ShmemError, SymmetryError, UnsupportedError)
from .node.exchange import Exchange
from .node.fdpass import FdChannel
from .transport.offnode import OffNodeWindow
from .node.peers import PeerTable
from .memory.vmm import VMemPow2Allocator, tensor_nbytes

log = logging.getLogger("shmemvm")

#: malloc_with_hints' hints (OpenSHMEM 1.5 values): accepted and recorded, no effect yet
MALLOC_ATOMICS_REMOTE = 1
MALLOC_SIGNAL_REMOTE = 2

class SymmetricHeap:
    """One symmetric heap over the PEs of `comm` (collective constructor)."""

    def __init__(self, comm: MPI.Comm | None = None, heap_size: int | str | None = None,
                 backend=None, *, timeout: float | None = None, node_split: int | None = None,
                 va_factor: int | None = None, thread_level: int | None = None,
                 agreement: str | None = None, anchor: int | str | None = None):
        if setting("SHMEMVM_DEBUG") not in ("", "0"):
            log.setLevel(logging.DEBUG)
        self.thread_level = thread_levels.provide(thread_level)
        self._lock = threading.RLock()
        self._pending: set[int] = set()    # offsets GC'd here, not yet agreed
        self.closed = False
        #: the default context's outstanding nbi operations (quiet() completes them)
        self.completion: CompletionTracker | None = None
        self._contexts = weakref.WeakSet()   # live Ctx objects (contexts.py)
        self._held_locks: dict[int, int] = {}  # lock offset -> this PE's ticket (locks.py)
        self._hints: dict[int, int] = {}       # block offset -> malloc_with_hints' hints
        # Built one by one in _setup; _teardown releases whatever was built.
        self.comm = self.node = self.agreement = self.exchange = None
        self.local = self.peers = self.channel = self.offnode = self.anchor = None
        self._heap_bases: torch.Tensor | None = None   # heap_bases(), made once
        self._teams = teams.TeamRegistry()  # its teams, destroyed at finalize (teams.py)
        try:
            self._setup(comm, heap_size, backend, timeout, node_split, va_factor, agreement,
                        anchor)
        except BaseException:
            self._teardown()
            raise

    def _setup(self, comm, heap_size, backend, timeout, node_split, va_factor,
               agreement, anchor) -> None:
        """Every step waits with the deadline, and a PE that fails locally (bad
        settings, no memory) still takes part until the init agreement, where
        every PE raises: that error where every PE has it, else SymmetryError."""
        call = Call(Phase.INIT, text="init")
        try:
            self.timeout = parse_timeout(timeout)
        except ValueError as exc:
            call.error, self.timeout = exc, DEFAULT_TIMEOUT  # a deadline to fail by
        try:
            split = _node_split(node_split)
        except ValueError as exc:
            call.error, split = call.error or exc, None
        try:
            transport = _agreement_transport(agreement)
        except ValueError as exc:
            call.error, transport = call.error or exc, "mpi"
        try:
            anchor = anchor_setting(anchor)
        except ValueError as exc:
            call.error, anchor = call.error or exc, 0
        self.comm = duplicate(comm if comm is not None else MPI.COMM_WORLD, self.timeout)
        self.my_pe = self.comm.Get_rank()
        self.n_pes = self.comm.Get_size()
        self.agreement = Agreement(self.comm, self.timeout, self.my_pe, self._release)
        # MPI has no nonblocking split: it runs right after the Idup, which every
        # PE has joined, with nothing in between that can fail or wait.
        self.node = self._split_node(split)
        if call.error is None:
            try:
                # Blocks nothing views any more are released only once every PE
                # agrees (agree()), so release_dead=False.
                self.local = VMemPow2Allocator(heap_size, backend, va_factor=va_factor,
                                               release_dead=False,
                                               local_rank=self.node.Get_rank())
                self.backend = self.local.backend
                self.completion = CompletionTracker(self.backend, current_stream=True)
                _note_rounding(heap_size, self.local, self.my_pe)
                call.args = (self.local.heap_size, self.local.va_size, self.backend.granularity,
                             (self.backend.name, transport, anchor), self.local.chunk)
                call.text = (f"init(heap_size={self.local.heap_size}, backend="
                             f"{self.backend.name}, granularity={self.backend.granularity}, "
                             f"va_size={self.local.va_size}, chunk={self.local.chunk}, "
                             f"SHMEMVM_AGREEMENT={transport}, SHMEMVM_ANCHOR={anchor})")
                self.channel = FdChannel(f"pe{self.my_pe}")
            except Exception as exc:
                call.error = exc
        self.agreement.collective(call)
        mine = json.dumps([self.my_pe, os.getpid(), self.channel.path]).encode()
        node_info = [json.loads(info) for info in self.agreement.allgather_bytes(
            Phase.INIT_NODE, mine, "init (the PEs of the node)", comm=self.node)]
        self.node_pes = [pe for pe, _, _ in node_info]
        self._peer_pids = {pe: pid for pe, pid, _ in node_info if pe != self.my_pe}
        self._peer_paths = {pe: path for pe, _, path in node_info if pe != self.my_pe}
        failure = None
        try:
            self.peers = PeerTable(self.backend, self.local.va_size, sorted(self._peer_pids))
        except Exception as exc:  # no address space: the others must not wait in the window
            failure = exc
        # Every PE on this node: the agreement's steps can go through shared
        # memory instead of MPI (board.py). Every PE decides alike (the same
        # PEs, the same setting: compared at init, the same MPI), so all or
        # none make one.
        board = board_failure = None
        tried_board = 1 < self.n_pes == len(self.node_pes) and (
            transport == "board" or (transport == "auto" and not persistent_collectives()))
        if tried_board:
            try:
                board = self.agreement.make_board()
            except Exception as exc:  # noqa: BLE001 - agreed on below
                board_failure = exc
                if transport == "board":   # asked for: no board, no heap
                    failure = failure or exc
        if not self.agreement.all_ok(failure is None, call.step(
                Phase.INIT_PEERS, "reserving the peers' windows and the agreement's board")):
            if board is not None:
                board.close()   # not freed: some PE may have none (left to MPI_Finalize)
            raise ShmemError(f"init failed: a PE could not reserve address space for its "
                             f"peers' heaps or make the agreement's board in shared memory "
                             f"({failure or 'see the other PEs'}; SHMEMVM_AGREEMENT=mpi "
                             f"does without the board)") from failure
        # auto: where some PE has no board (Open MPI 4.1 with osc pt2pt cannot make
        # shared windows), every PE agrees through MPI instead
        if tried_board and transport == "auto" and not self.agreement.all_ok(
                board is not None, call.step(Phase.INIT_BOARD, "the agreement's board")):
            if board is not None:
                board.close()   # not freed, as above
            board = None
            if self.my_pe == 0:
                log.info("shmemvm: no shared-memory board for the agreement (%s); it goes "
                         "through MPI", board_failure or "another PE could not make one")
        if board is not None:
            self.agreement.use_board(board)
        self.exchange = Exchange(self.channel, self.my_pe, self._peer_paths, self._peer_pids,
                                 self.timeout)
        self.local.release_listeners.append(self.peers.drop)
        self.local.close_listeners.append(self.peers.close)
        self.anchor = self._make_anchor(call, anchor_size(anchor, self.backend,
                                                          len(self.node_pes)))
        self.offnode = self._open_window()
        self.agreement.collective(call.step(Phase.INIT_READY, "peers ready"))
        self.agreement.initialized = True
        if profile.ENABLED:   # SHMEMVM_PROFILE=1: time every step (profile.py)
            profile.instrument(self)
        log.debug("PE %d/%d ready: node PEs %s, backend %s", self.my_pe, self.n_pes,
                  self.node_pes, self.backend.name)

    def _make_anchor(self, call: Call, size: int) -> Anchor | None:
        """This PE's anchor of `size` bytes (0: none), mapped by every PE of the
        node (anchor.py); None on every PE where some PE could not make or map
        one: it only speeds up sharing new memory, so the heap goes on without."""
        anchor = failure = None
        try:
            if size:
                try:
                    anchor = Anchor(self.backend, size, sorted(self._peer_pids))
                except Exception as exc:  # noqa: BLE001 - told to the peers, agreed on below
                    failure = exc
                # one segment, the same on every PE (the exchange compares them)
                failure = self._exchange(call, [Segment(0, size, 0)],
                                         anchor.export if anchor else None,
                                         anchor.map_peer if anchor else None, failed=failure)
            # Every PE takes this step, those without an anchor (alone on their node) too.
            everywhere = self.agreement.all_ok(failure is None,
                                               call.step(Phase.INIT_ANCHOR, "the anchor"))
        except BaseException:  # a timeout: init fails, and the anchor is not the heap's yet
            if anchor is not None:
                anchor.close()
            raise
        if everywhere:
            return anchor
        if anchor is not None:
            anchor.close()
        log.warning("shmemvm: PE %d: no anchor (%s): sharing new memory with the node's "
                    "other PEs may be 5-20x slower (SHMEMVM_ANCHOR, docs/performance.md)",
                    self.my_pe, failure or "some PE could not make its anchor")
        return None

    def _open_window(self) -> OffNodeWindow | None:
        """The MPI window that carries off-node put/get and every atomic (on the
        node too), or None where there is nothing for it to carry or the MPI
        library cannot make one (the reason is kept for the error messages)."""
        self._window_error = None
        if not self.backend.mpi_accessible and len(self.node_pes) == self.n_pes:
            self._window_error = (f"{self.backend.name} backend's {self.device.type} memory is "
                                  f"not handed to MPI (shmemvm does not assume a GPU-aware MPI)")
            return None
        try:
            return OffNodeWindow(self.comm, self.local, healthy=lambda: not self._broken,
                                 timeout=self.timeout, broken=self.agreement.mark_broken)
        except MPI.Exception as exc:  # e.g. Open MPI without a usable osc component
            self._window_error = (f"MPI could not create a dynamic window: {exc} (Open MPI 4.1: "
                                  f"run with -mca osc pt2pt and MPI4PY_RC_THREAD_LEVEL="
                                  f"serialized; docs/multinode.md)")
            log.warning("shmemvm: %s; off-node access and atomics are unavailable",
                        self._window_error)
            return None

    def window(self, what: str) -> OffNodeWindow:
        """The MPI window, or UnsupportedError saying why `what` cannot use one."""
        if self.offnode is None:
            raise UnsupportedError(f"{what} needs the heap's MPI window, which is unavailable: "
                                   f"{self._window_error}")
        return self.offnode

    def _split_node(self, size: int | None) -> MPI.Comm:
        """PEs that share memory; nodes of `size` PEs each where given."""
        if size:
            return self.comm.Split(self.my_pe // size, self.my_pe)
        return self.comm.Split_type(MPI.COMM_TYPE_SHARED, self.my_pe)

    # -- properties ---------------------------------------------------------------
    def query_thread(self) -> int:
        """The thread level this heap provides.

        Returns:
            shmemvm.THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED or
            THREAD_MULTIPLE (0..3): what init(thread_level=...) asked for, or
            by default the highest level MPI was initialised at.

        Raises:
            Nothing; the level is fixed when the heap is made.
        """
        return self.thread_level

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def heap_size(self) -> int:
        return self.local.heap_size

    # -- collective allocation ------------------------------------------------
    def malloc(self, nbytes: int) -> torch.Tensor:
        """`nbytes` of symmetric memory as a uint8 tensor (collective).

        Args:
            nbytes: the size in bytes, an integer >= 0 (NumPy and other integer
                types too); the same on every PE.

        Returns:
            A 1-D uint8 CPU or device tensor of `nbytes` elements, at the same
            heap offset on every PE. It frees itself once dropped on every PE.

        Raises:
            SymmetryError: the PEs made different calls or passed different
                arguments (every PE raises it; nothing was done).
            HeapExhaustedError: the heap cannot hold the request (it names the
                request, the usage and SHMEMVM_HEAP_SIZE).
            PeerTimeoutError: a PE did not join within the heap's timeout
                (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
            ShmemError: the heap is finalized.
            TypeError, ValueError: `nbytes` is not an integer >= 0.
        """
        text = ("malloc({!r})", nbytes)   # made into text only if a message needs it
        if type(nbytes) is not int or nbytes < 0:
            return self.empty((nbytes,), torch.uint8, _op_text=text)  # checked (or rejected) there
        # empty((nbytes,), torch.uint8) with tensor_nbytes' answer for a plain int, inline
        dims = (nbytes,)
        call = Call(Phase.MALLOC, (nbytes, torch.uint8, dims), text, None, True)
        with self._lock:
            self.agree(call)
            block = self._allocate_collectively(nbytes, call)
            return self.local.tensor_for(block, dims, torch.uint8)

    def empty(self, shape, dtype: torch.dtype = torch.float32, *, _op_text: str | tuple = "",
              _phase: Phase = Phase.MALLOC) -> torch.Tensor:
        """An uninitialised symmetric tensor (collective).

        Args:
            shape: an int or a sequence of ints >= 0 (at most 64 dimensions).
            dtype: a torch.dtype (default float32).

        Returns:
            A contiguous tensor of that shape and dtype on the heap's device, at
            the same heap offset on every PE; its contents are undefined.

        Raises:
            SymmetryError: the PEs made different calls or passed different
                arguments (every PE raises it; nothing was done).
            HeapExhaustedError: the heap cannot hold the request (it names the
                request, the usage and SHMEMVM_HEAP_SIZE).
            PeerTimeoutError: a PE did not join within the heap's timeout
                (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
            ShmemError: the heap is finalized.
            TypeError, ValueError: a bad shape or a dtype symmetric memory
                does not support.
        """
        # the call's text is made only if a message needs it (Call)
        text = _op_text or ("empty({!r}, {})", shape, dtype)
        try:
            dims, nbytes = tensor_nbytes(shape, dtype)
        except (TypeError, ValueError) as exc:
            call = Call(_phase, (), text, exc)
        else:
            call = Call(_phase, (nbytes, dtype, dims), text, None, True)  # exact: ints, a dtype
        with self._lock:
            self.agree(call)
            block = self._allocate_collectively(nbytes, call)
            return self.local.tensor_for(block, dims, dtype)

    def zeros(self, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A zero-filled symmetric tensor (collective, like shmem_calloc). It is
        zero on every PE before any PE returns, so peers may write at once.

        Args:
            shape: an int or a sequence of ints >= 0 (at most 64 dimensions).
            dtype: a torch.dtype (default float32).

        Returns:
            A contiguous zero-filled tensor of that shape and dtype, at the same
            heap offset on every PE.

        Raises:
            SymmetryError: the PEs made different calls or passed different
                arguments (every PE raises it; nothing was done).
            HeapExhaustedError: the heap cannot hold the request (it names the
                request, the usage and SHMEMVM_HEAP_SIZE).
            PeerTimeoutError: a PE did not join within the heap's timeout
                (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
            ShmemError: the heap is finalized.
            TypeError, ValueError: a bad shape or a dtype symmetric memory
                does not support.
        """
        # the texts are made only if a message needs them (Call)
        tensor = self.empty(shape, dtype, _op_text=("zeros({!r}, {})", shape, dtype),
                            _phase=Phase.ZEROS)
        tensor.zero_()
        self.backend.synchronize()
        self.agree(Call(Phase.ZEROS_FILLED, (), ("zeros({!r}, {}) (filled)", shape, dtype)))
        return tensor

    calloc = zeros

    def align(self, alignment: int, nbytes: int) -> torch.Tensor:
        """`nbytes` of symmetric memory whose address is a multiple of
        `alignment` on every PE (collective, shmem_align).

        Blocks of 2**k bytes lie at multiples of 2**k from the heap's base, so an
        alignment up to the block's size costs nothing; a larger one takes a
        block of `alignment` bytes (the rest of it is unused). The base is
        aligned to the backend's granularity (heap_info()'s backend; 2 MiB on
        CUDA) and no more on every PE, so that is the largest alignment.

        Args:
            alignment: a power of two (bytes), the same on every PE.
            nbytes: the size in bytes, an integer >= 0, the same on every PE.

        Returns:
            A 1-D uint8 tensor of `nbytes` elements at the same heap offset on
            every PE, with data_ptr() % alignment == 0. It frees itself once
            dropped on every PE, or with free().

        Raises:
            TypeError: `alignment` or `nbytes` is not an integer.
            ValueError: `alignment` is not a power of two or exceeds the
                backend's granularity, or `nbytes` < 0.
            SymmetryError: the PEs made different calls or passed different
                arguments (every PE raises it; nothing was done).
            HeapExhaustedError: the heap cannot hold the aligned block.
            PeerTimeoutError: a PE did not join within the heap's timeout.
            ShmemError: the heap is finalized.
        """
        text = f"align({alignment!r}, {nbytes!r})"
        call = Call(Phase.ALIGN, text=text)
        try:
            alignment = _whole_int(alignment, "alignment")
            (count,), nbytes = tensor_nbytes((nbytes,), torch.uint8)
            if alignment < 1 or alignment & (alignment - 1):
                raise ValueError(f"align: alignment must be a power of two, got {alignment}")
            if alignment > self.backend.granularity:  # the same limit on every PE
                raise ValueError(f"align: alignment {alignment} exceeds the {self.backend.name} "
                                 f"backend's granularity {self.backend.granularity}, the "
                                 f"alignment of the heap's base on every PE and so the largest "
                                 f"this heap can give")
            call.args = (alignment, nbytes)
        except (TypeError, ValueError) as exc:
            call.error = exc
        with self._lock:
            self.agree(call)
            block = self._allocate_collectively(max(nbytes, alignment), call)
            return self.local.tensor_for(block, (count,), torch.uint8)

    def malloc_with_hints(self, nbytes: int, hints: int = 0) -> torch.Tensor:
        """malloc() with OpenSHMEM 1.5's usage hints (collective,
        shmem_malloc_with_hints). The hints are checked, agreed on (part of what
        every PE must pass alike) and recorded with the block, but change nothing
        yet: every block already suits atomics and signals, which all go through
        the heap's MPI window.

        Args:
            nbytes: the size in bytes, an integer >= 0, the same on every PE.
            hints: 0, or an OR of shmemvm.MALLOC_ATOMICS_REMOTE (1) and
                MALLOC_SIGNAL_REMOTE (2); the same on every PE.

        Returns:
            A 1-D uint8 tensor of `nbytes` elements, as malloc() returns.

        Raises:
            TypeError: `nbytes` or `hints` is not an integer.
            ValueError: `nbytes` < 0 or `hints` has bits other than those two.
            SymmetryError: the PEs made different calls or passed different
                arguments (hints included; every PE raises it).
            HeapExhaustedError: the heap cannot hold the request.
            PeerTimeoutError: a PE did not join within the heap's timeout.
            ShmemError: the heap is finalized.
        """
        call = Call(Phase.MALLOC_WITH_HINTS, text=f"malloc_with_hints({nbytes!r}, {hints!r})")
        try:
            hints = _whole_int(hints, "hints")
            if hints < 0 or hints & ~(MALLOC_ATOMICS_REMOTE | MALLOC_SIGNAL_REMOTE):
                raise ValueError(f"malloc_with_hints: hints must be 0 or an OR of "
                                 f"MALLOC_ATOMICS_REMOTE (1) and MALLOC_SIGNAL_REMOTE (2), got "
                                 f"{hints}")
            (count,), nbytes = tensor_nbytes((nbytes,), torch.uint8)
            call.args = (nbytes, hints)
        except (TypeError, ValueError) as exc:
            call.error = exc
        with self._lock:
            self.agree(call)
            block = self._allocate_collectively(nbytes, call)
            self._hints[block.offset] = hints
            return self.local.tensor_for(block, (count,), torch.uint8)

    def free(self, tensor: torch.Tensor) -> None:
        """Free a symmetric tensor (collective). `tensor` itself becomes empty;
        views of it made before (slices, ptr() views, on any PE) keep the old
        memory and data, but are no longer symmetric tensors; the block is
        reused only once all of them are gone (heap_info()'s deferred count).

        This PE's outstanding put/get/nbi operations are completed first, on
        every context (the default one and every Ctx): nothing may still be in
        flight into memory that is released.

        Args:
            tensor: a tensor from this heap (malloc/empty/zeros/realloc), the
                same one on every PE.

        Returns:
            None.

        Raises:
            FreedTensorError: `tensor` is not a live tensor of this heap.
            TypeError: `tensor` is not a torch.Tensor.
            SymmetryError: the PEs freed different tensors (nothing was freed).
            PeerTimeoutError: a PE did not join within the heap's timeout.
        """
        retirement = None
        try:
            with self._lock:
                try:
                    retirement = self.local.retire(tensor)
                except (TypeError, FreedTensorError) as exc:
                    call = Call(Phase.FREE, (), "free(tensor)", exc)
                else:
                    offset = retirement.block.offset
                    call = Call(Phase.FREE, (offset,), ("free(tensor at heap offset {:#x})", offset),
                                None, True)
                self._quiet_every_context()
                alone_everywhere = self.agree(
                    call, flag=retirement is not None and retirement.alone).flag_everywhere
                # imported memory is unmapped at once: where that fails on one PE, every PE says so
                imported = alone_everywhere and self.local.imported(offset) is not None
                failure = self.local.finish_free(retirement, release_now=alone_everywhere)
                if imported:
                    self._agree_on_unmapping(call, failure, "the imported memory")
        except BaseException:
            if retirement is not None and retirement.storage is not None:
                retirement.restore()  # nothing was done: the tensor stays usable
            raise

    def realloc(self, tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
        """A symmetric tensor of `nbytes` holding `tensor`'s leading bytes, as a
        1-D tensor of its dtype; `tensor` is freed (collective).

        Args:
            tensor: a live tensor of this heap, the same one on every PE.
            nbytes: the new size in bytes, an integer (NumPy integers too) that
                is a multiple of the element size of tensor's dtype.

        Returns:
            A 1-D tensor of nbytes // element size elements of tensor's dtype;
            at the same place where it fits and nothing else views the old
            block on any PE. The old tensor becomes empty, as with free().

        Raises:
            SymmetryError: the PEs made different calls or passed different
                arguments (every PE raises it; nothing was done).
            HeapExhaustedError: the heap cannot hold the request (it names the
                request, the usage and SHMEMVM_HEAP_SIZE).
            PeerTimeoutError: a PE did not join within the heap's timeout
                (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
            ShmemError: the heap is finalized.
            FreedTensorError: `tensor` is not a live tensor of this heap.
            TypeError, ValueError: `nbytes` is not an integer, is negative or
                not a multiple of the element size.
        """
        call = Call(Phase.REALLOC, text=f"realloc(tensor, {nbytes!r})")
        retirement = None
        try:
            with self._lock:
                try:
                    retirement = self.local.retire(tensor)  # undone below if anything fails
                    block = retirement.block
                    dtype = tensor.dtype
                    (count,), new_bytes = tensor_nbytes(_whole_elements(nbytes, dtype), dtype)
                    call.args = (block.offset, new_bytes, dtype)
                    call.text = f"realloc(tensor at heap offset {block.offset:#x}, {new_bytes})"
                except (TypeError, ValueError, FreedTensorError) as exc:
                    call.error = exc
                self._quiet_every_context()
                alone_everywhere = self.agree(
                    call, flag=retirement is not None and retirement.alone).flag_everywhere
                if (alone_everywhere and self.local.size_class(new_bytes) == block.size
                        and self.local.imported(block.offset) is None):
                    return self.local.resize(retirement, new_bytes, (count,), dtype)
                new_block = self._allocate_collectively(new_bytes, call)
                result = self.local.tensor_for(new_block, (count,), dtype)
                keep = min(block.nbytes, new_bytes)
                if keep:
                    result.view(torch.uint8)[:keep].copy_(retirement.old_bytes()[:keep])
                self.backend.synchronize()
                # (imported memory: a failed unmap is logged and not raised, as when
                # released later; free() agrees on it)
                self.local.finish_free(retirement, release_now=alone_everywhere)
                return result
        except BaseException:
            if retirement is not None and retirement.storage is not None:
                retirement.restore()
            raise

    def import_external_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Make another allocator's tensor symmetric without copying it
        (collective): its memory is mapped into the heap and shared with the
        PEs of the node like memory the heap made.

        Where the backend can share that memory: on cuda, memory torch
        allocated with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, when
        torch made its pieces exportable. Each PE passes its own tensor; its
        byte offset inside the backend's granularity (2 MiB on cuda) must be
        the same on every PE, which the same sequence of torch allocations
        gives.

        Args:
            tensor: a tensor on the heap's device, of the same shape, strides,
                storage offset, dtype and storage size on every PE.

        Returns:
            A tensor of tensor's shape, strides and dtype over the same physical
            memory (a write through either shows in the other), at the same heap
            offset on every PE: put/get/ptr()/heap_bases() reach it like any
            symmetric tensor. The heap holds `tensor` until the returned tensor
            and every view of it (ptr() views on other PEs too) are gone, so
            torch cannot reuse its memory while it is shared; free() releases it.

        Raises:
            UnsupportedError: the backend cannot share this memory (host memory,
                cudaMalloc memory, pieces made without POSIX fd export); the
                message says why and how to copy in instead
                (x = heap.empty(t.shape, t.dtype); x.copy_(t)). Every PE raises
                (SymmetryError on the PEs whose tensor could be imported).
            SymmetryError: the PEs passed different shapes/dtypes, or their
                tensors lie at different offsets inside the granularity.
            HeapExhaustedError: no free address range of the heap can hold it.
            TypeError: `tensor` is not a torch.Tensor.
            PeerTimeoutError: a PE did not join within the heap's timeout.
            ShmemError: the heap is finalized, or mapping/sharing failed on a PE
                (undone on every PE).
        """
        call = Call(Phase.IMPORT_EXTERNAL, text="import_external_tensor(tensor)")
        pieces = None
        if not isinstance(tensor, torch.Tensor):
            call.error = TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        else:
            call.args = (tensor.untyped_storage().nbytes(), tensor.dtype, tuple(tensor.shape),
                         tuple(tensor.stride()), tensor.storage_offset())
            call.text = (f"import_external_tensor(tensor of shape {tuple(tensor.shape)}, "
                         f"{tensor.dtype})")
        with self._lock:
            if call.error is None:
                try:
                    pieces = self.backend.import_external(tensor)
                except ShmemError as exc:
                    call.error = exc
            try:
                self.agree(call)
                block, shift, lead = self._place_external(tensor, pieces, call)
            except BaseException:
                for piece in pieces or ():
                    self.backend.release(piece.handle)
                raise
            failure = None
            try:  # from here on the block owns the pieces
                self.local.place_external(block, tensor, pieces, shift)
            except Exception as exc:  # noqa: BLE001 - agreed on below
                failure = exc
            if not self.agreement.all_ok(failure is None,
                                         call.step(Phase.BACKING, "mapping the imported memory")):
                self.local.undo_allocation(block, [])
                raise ShmemError(f"{call.text} failed: a PE could not map the imported memory "
                                 f"({failure or 'see the error on the other PEs'}); undone on "
                                 f"every PE") from failure
            self._share_external(block, shift, pieces, call)
            return self.local.external_tensor_for(block, shift + lead, tensor)

    def _place_external(self, tensor: torch.Tensor, pieces: list, call: Call):
        """The block for imported memory and where this PE's pieces go in it:
        (block, shift of the first piece, offset of the storage in the pieces)."""
        granularity = self.backend.granularity
        lead = tensor.untyped_storage().data_ptr() - pieces[0].va
        span = sum(piece.size for piece in pieces)
        places = [struct.unpack("<qq", data) for data in self.agreement.allgather_bytes(
            Phase.IMPORT_PLACES, struct.pack("<qq", lead, span), call.text)]
        if len({pe_lead % granularity for pe_lead, _ in places}) != 1:
            where = ", ".join(f"PE {pe}: byte {pe_lead % granularity}"
                              for pe, (pe_lead, _) in enumerate(places))
            raise SymmetryError(
                f"{call.text}: the tensors lie at different offsets inside the heap's "
                f"{granularity}-byte granularity ({where}), so no heap offset can hold all of "
                f"them; allocate them at the same place on every PE (the same sequence of "
                f"torch allocations), or copy in: x = heap.empty(t.shape, t.dtype); x.copy_(t)")
        top = max(pe_lead for pe_lead, _ in places)
        size = max(top - pe_lead + pe_span for pe_lead, pe_span in places)
        block = self.local.allocate_external(size)   # the same answer on every PE
        return block, top - lead, lead

    def _share_external(self, block: Block, shift: int, pieces: list, call: Call) -> None:
        """Hand this PE's pieces of imported memory to the PEs of the node and
        map theirs (each PE's pieces differ: torch's, where torch put them)."""
        handles, segments, offset = {}, [], block.offset + shift
        for piece in pieces:
            segments.append(Segment(offset, piece.size, block.segment.generation))
            handles[offset] = piece.handle
            offset += piece.size
        failure = self._exchange(
            call, segments, lambda segment: self.backend.export_fd(handles[segment.offset]),
            lambda pe, piece, fd: self.peers.map_piece(pe, block.segment, piece, fd),
            within=block.segment)
        if not self.agreement.all_ok(failure is None,
                                     call.step(Phase.SHARING, "sharing the imported memory")):
            self.local.undo_allocation(block, [])
            raise ShmemError(f"{call.text} failed while PEs shared the imported memory "
                             f"({failure or 'see the other PEs'}); undone on every PE") from failure

    def _allocate_collectively(self, nbytes: int, call: Call) -> Block:
        """Allocate the block every PE agreed on; create, share and map new segments.

        A new segment costs one step and one agreement after the call's own:
        each PE creates the segment's physical memory, exports it and sends it
        to the other PEs of the node first, then maps it here (and attaches it
        to the MPI window) while they import it, and imports theirs (exchange.py).
        A PE that fails anywhere in that, creating its memory included, still
        tells its peers (a FAILED datagram instead of descriptors) and hears
        every peer out; the one vote after the exchange (SHARING) then says
        whether every PE managed all of it, and where one did not, every PE
        undoes the same allocation (the allocator stays identical everywhere)."""
        failure = None
        try:
            block, created, failure = self.local.allocate_unmapped(nbytes)
        except HeapExhaustedError:
            raise  # same state everywhere, so every PE raises it
        except Exception as exc:  # the allocator failed here alone: the others must undo too
            failure, block, created = exc, None, []
        # Segment creation is the same on every PE; only where segments were
        # created can a PE fail alone, so only then is it agreed on.
        if failure is None and not created:
            self._hints.pop(block.offset, None)
            return block
        step_failure = self._exchange(call, created, self.local.export, self.peers.map,
                                      local=lambda: self._map_created(created), failed=failure)
        # Undoing releases the new segments, which unmaps peers' copies and
        # detaches them from the window (release listeners). A PE whose
        # allocation failed has undone it already (allocate_unmapped).
        if not self.agreement.all_ok(step_failure is None,
                                     call.step(Phase.SHARING, "sharing the new memory")):
            if failure is None:
                self.local.undo_allocation(block, created)
            self._raise_undone(call, step_failure, (
                f"{call.text} failed while PEs shared the new memory "
                f"({step_failure or 'see the other PEs'}); undone on every PE"))
        self._hints.pop(block.offset, None)  # a former block's (malloc_with_hints sets its own)
        return block

    def _exchange(self, call: Call, segments: list, export, map_peer, **options):
        """The fd exchange of `call`'s step (Exchange.run): the failure to agree
        on, or None. A timeout is raised instead: a PE is gone or stuck, and
        agreeing on it would wait as long again (2x SHMEMVM_TIMEOUT), so the
        heap is unusable from here on."""
        try:
            self.exchange.run(self.agreement.seq, segments, export, map_peer, call.text,
                              **options)
        except PeerTimeoutError as exc:
            self.agreement.mark_broken(f"{call.text}: {exc}")
            raise
        except (OSError, ShmemError, MPI.Exception) as exc:
            return exc
        return None

    def _map_created(self, created: list) -> None:
        """This PE's own part of sharing new segments, run by the exchange once
        they are sent: map them here, and attach them to the MPI window."""
        self.local.map_created(created)
        if self.offnode is not None:
            for segment in created:
                self.offnode.attach(segment)

    def _raise_undone(self, call: Call, failure: BaseException | None, message: str):
        """Raise the error of a step undone on every PE, the same kind on every
        PE: ResourceLimitError where some PE reached a system limit (descriptors,
        mappings: its message, which names the limit and what to change, is
        told to every PE), else ShmemError with `message`."""
        limit = failure
        while isinstance(limit, ResourceLimitError) and isinstance(limit.__cause__,
                                                                   ResourceLimitError):
            limit = limit.__cause__  # the innermost: without the layers' prefixes
        mine = str(limit).encode()[:2048] if isinstance(limit, ResourceLimitError) else b""
        reports = self.agreement.allgather_bytes(Phase.LIMIT_REPORT, mine,
                                                 f"{call.text} (reporting system limits)")
        limited = [pe for pe, report in enumerate(reports) if report]
        if limited:
            first = reports[limited[0]].decode(errors="replace")
            others = (f" (PE(s) {', '.join(map(str, limited[1:]))} too)"
                      if len(limited) > 1 else "")
            raise ResourceLimitError(f"{call.text} failed and was undone on every PE: PE "
                                     f"{limited[0]}{others}: {first}") from failure
        raise ShmemError(message) from failure

    # -- the agreement (agreement.py) ----------------------------------------------
    @property
    def _broken(self) -> str | None:
        """Why the heap is unusable (a timed-out step), or None."""
        return self.agreement.broken if self.agreement is not None else None

    def agree(self, call: Call, *, flag: bool = True) -> Outcome:
        """One agreed step of a collective (for this module and the ones built on
        the heap, like collectives.py): every PE makes this same `call` (else
        SymmetryError everywhere), and the blocks that nothing views on any PE
        any more are released first. The same outcome on every PE."""
        agreement = self.agreement
        if self.closed or agreement is None or agreement.broken:
            self._check_usable()
        dead = self.local.take_dead()
        if dead:
            self._pending.update(dead)
        return agreement.collective(call, dead=self._pending, flag=flag)

    def _release(self, offsets: set[int]) -> None:
        """Release the blocks that nothing views on any PE any more."""
        for offset in sorted(offsets):
            # An unmap failure of imported memory (logged, returned) is not raised:
            # this runs inside whichever collective call came next, and raising on
            # one PE alone would put the PEs out of step. The mapping left behind
            # is replaced when the offset is mapped again.
            self.local.release(offset)
        self._pending -= offsets

    # -- one-sided access ------------------------------------------------------------
    def _check_pe(self, pe) -> int:
        """`pe` as an int (NumPy and other integer types too), or a clear error."""
        if isinstance(pe, bool) or not hasattr(type(pe), "__index__") or isinstance(pe, torch.Tensor):
            raise TypeError(f"pe must be an int, got {type(pe).__name__} {pe!r}")
        pe = operator.index(pe)
        if not 0 <= pe < self.n_pes:
            raise ValueError(f"pe {pe} is out of range: there are {self.n_pes} PEs (0..{self.n_pes - 1})")
        return pe

    def _symmetric(self, tensor: torch.Tensor, role: str) -> Block:
        if self.closed or self._broken:  # the call only where it raises (put/get fast path)
            self._check_usable()
        try:
            return self.local.block_of(tensor)
        except FreedTensorError as exc:
            raise FreedTensorError(f"the {role} must be a live symmetric tensor: {exc}") from None

    def ptr(self, tensor: torch.Tensor, pe: int) -> torch.Tensor | None:
        """`tensor` as it lies on PE `pe`, directly addressable from here; None
        where `pe` is not reachable by loads and stores (another node).

        Args:
            tensor: a symmetric tensor of this heap, or a view of one.
            pe: the PE whose copy is wanted (this PE: `tensor` itself).

        Returns:
            A tensor with tensor's shape, strides and dtype over PE `pe`'s
            memory (loads and stores, kernels included), or None for a PE on
            another node.

        Raises:
            TypeError: `pe` is not an integer.
            ValueError: `pe` is out of range.
            FreedTensorError: `tensor` is not a live tensor of this heap.
        """
        pe = self._check_pe(pe)
        block = self._symmetric(tensor, "tensor")
        if pe == self.my_pe:
            return tensor
        if pe not in self.peers:
            return None
        # A live block cannot be released by a collective in another thread
        # (nothing here is dead), and hold() checks it is still live.
        self.peers.check(pe, block.segment)
        start = tensor.untyped_storage().data_ptr() - self.local.base
        return self.local.hold(block, self.peers.block_view(pe, start, tensor))

    def heap_bases(self) -> torch.Tensor:
        """Where each PE's heap lies in this process, for kernels that address
        peers themselves (shmemvm.triton's translate/load/store/atomics).

        Entry k is the address here of heap offset 0 of PE k: this PE's own
        heap base at my_pe, a peer's window on this node, 0 for PEs only MPI
        reaches. A symmetric tensor `t` lies on PE k at
        ``heap_bases[k] + (t.data_ptr() - heap_bases[my_pe])``. The windows are
        reserved once, at init, so the table stays valid across malloc/free
        until finalize(); memory is only mapped at a peer's window where a
        live segment is, so translate only pointers into live symmetric tensors.

        Returns:
            A 1-D int64 tensor of n_pes entries on the heap's device (the same
            tensor on every call: do not write to it).

        Raises:
            ShmemError: the heap is finalized or unusable.
        """
        self._check_usable()
        bases = self._heap_bases
        if bases is None:
            table = [0] * self.n_pes
            table[self.my_pe] = self.local.base
            for pe, window in self.peers.windows.items():
                table[pe] = window
            bases = self._heap_bases = torch.tensor(table, dtype=torch.int64, device=self.device)
        return bases

    def _source_for(self, source: torch.Tensor, dest: torch.Tensor, op: str) -> torch.Tensor:
        """put's `source` as dest's shape, or a clear error."""
        if not isinstance(source, torch.Tensor):
            raise TypeError(f"{op}: source must be a torch.Tensor, got {type(source).__name__}")
        if source.dtype != dest.dtype:
            raise TypeError(f"{op}: source dtype {source.dtype} differs from destination dtype "
                            f"{dest.dtype}; convert with .to({dest.dtype}) first")
        shape = dest.shape
        if source.shape == shape:  # the common case; the same shape has the same numel
            return source
        if source.numel() != dest.numel():
            raise ValueError(f"{op}: source has {source.numel()} elements, destination "
                             f"{dest.numel()}; slice them to the same length")
        return source.reshape(shape)

    @staticmethod
    def _check_get_dest(dest: torch.Tensor, source: torch.Tensor) -> None:
        """get's checks, named the way round they are: `dest` (any tensor) receives
        symmetric `source`."""
        if not isinstance(dest, torch.Tensor):
            raise TypeError(f"get: dest must be a torch.Tensor, got {type(dest).__name__}")
        if dest.dtype != source.dtype:
            raise TypeError(f"get: destination dtype {dest.dtype} differs from source dtype "
                            f"{source.dtype}; get into a {source.dtype} tensor and convert "
                            f"it afterwards")
        if dest.numel() != source.numel():
            raise ValueError(f"get: source has {source.numel()} elements, destination "
                             f"{dest.numel()}; slice them to the same length")

    def put(self, dest: torch.Tensor, source: torch.Tensor, pe: int, *,
            _nbi: CompletionTracker | None = None) -> None:
        """Copy `source` (any tensor) into symmetric `dest` on PE `pe`.

        Args:
            dest: a symmetric tensor of this heap, or a view of one (any
                strides); its copy on PE `pe` is written.
            source: any tensor (any device) with dest's dtype and number of
                elements; it is read as dest's shape.
            pe: the PE to write to (this PE too).

        Returns:
            None, once `source` may be reused. On the node the copy is done
            (device heaps: on the current stream); off the node it is complete
            at PE `pe`. barrier_all() makes it visible to `pe`'s reads.

        Raises:
            TypeError: the dtypes differ.
            ValueError: the numbers of elements differ.
            TypeError: `pe` is not an integer, or a tensor is not a torch.Tensor.
            ValueError: `pe` is out of range.
            FreedTensorError: the symmetric tensor is not a live tensor of this heap.
            UnsupportedError: `pe` is on another node and the heap has no MPI
                window, or holds device memory that MPI is not given.
            PeerTimeoutError: `pe` is on another node and did not complete the
                transfer within the heap's timeout (SHMEMVM_TIMEOUT); the heap
                is unusable afterwards.
        """
        if type(pe) is not int or not 0 <= pe < self.n_pes:  # else it is valid as it is
            pe = self._check_pe(pe)
        block = self._symmetric(dest, "destination")
        source = self._source_for(source, dest, "put")
        if pe == self.my_pe:
            target = dest
        elif pe in self.peers:
            target = self._peer_copy_view(pe, block, dest)
        else:
            self.window(f"put to PE {pe} on another node").put(dest, source, pe, block, _nbi)
            return
        self._copy(target, source, _nbi)

    def get(self, dest: torch.Tensor, source: torch.Tensor, pe: int, *,
            _nbi: CompletionTracker | None = None) -> None:
        """Copy symmetric `source` on PE `pe` into `dest` (any tensor).

        Args:
            dest: any tensor (any device) with source's dtype and number of
                elements; written as source's shape.
            source: a symmetric tensor of this heap, or a view of one; its copy
                on PE `pe` is read.
            pe: the PE to read from (this PE too).

        Returns:
            None, once the data is in `dest` (device heaps: the copy ran on the
            current stream and is complete).

        Raises:
            TypeError: the dtypes differ.
            ValueError: the numbers of elements differ.
            TypeError: `pe` is not an integer, or a tensor is not a torch.Tensor.
            ValueError: `pe` is out of range.
            FreedTensorError: the symmetric tensor is not a live tensor of this heap.
            UnsupportedError: `pe` is on another node and the heap has no MPI
                window, or holds device memory that MPI is not given.
            PeerTimeoutError: `pe` is on another node and did not complete the
                transfer within the heap's timeout (SHMEMVM_TIMEOUT); the heap
                is unusable afterwards.
        """
        if type(pe) is not int or not 0 <= pe < self.n_pes:  # else it is valid as it is
            pe = self._check_pe(pe)
        block = self._symmetric(source, "source")
        self._check_get_dest(dest, source)
        try:
            target = dest if dest.shape == source.shape else dest.view(source.shape)
        except RuntimeError:  # dest's strides cannot take source's shape: stage it
            staged = torch.empty(source.shape, dtype=dest.dtype, device=dest.device)
            self.get(staged, source, pe)
            dest.copy_(staged.view(dest.shape))
            return
        if pe == self.my_pe:
            remote = source
        elif pe in self.peers:
            remote = self._peer_copy_view(pe, block, source)
        else:
            self.window(f"get from PE {pe} on another node").get(target, source, pe, block, _nbi)
            return
        self._copy(target, remote, _nbi)

    def _peer_copy_view(self, pe: int, block: Block, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (a view of our `block`) as it lies on node peer `pe`, for put/get
        to copy through, after checking the peer's memory there is the block's."""
        self.peers.check(pe, block.segment)
        # = local.offset_of(tensor): block_of() found tensor's storage at storage_start
        offset = self.local.storage_start(block) + tensor.storage_offset() * tensor.element_size()
        return self.peers.copy_view(pe, offset, tensor)

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, nbi: CompletionTracker | None) -> None:
        """A blocking copy, or (put_nbi/get_nbi) one the context that issued it
        completes at its quiet() (completion.py)."""
        if nbi is None:
            self.backend.copy(dst, src, True)
        else:
            nbi.copy(dst, src)

    def put_nbi(self, dest: torch.Tensor, source: torch.Tensor, pe: int, *,
                _tracker: CompletionTracker | None = None) -> None:
        """put() that returns once the copy is issued; quiet() completes it (the
        default context's quiet(): a Ctx's put_nbi is completed by its own).

        Args:
            dest: a symmetric tensor of this heap (or a view of one).
            source: any tensor with dest's dtype and number of elements; it must
                not change until quiet() returns.
            pe: the PE to write to.

        Returns:
            None; the copy may still be running (device heaps on the node; MPI
            off the node, where `pe`'s answer is awaited at quiet()).

        Raises:
            As put(); a PE that does not answer raises PeerTimeoutError at quiet().
        """
        self.put(dest, source, pe, _nbi=self.completion if _tracker is None else _tracker)

    def get_nbi(self, dest: torch.Tensor, source: torch.Tensor, pe: int, *,
                _tracker: CompletionTracker | None = None) -> None:
        """get() that returns once the copy is issued; quiet() completes it (the
        default context's quiet(): a Ctx's get_nbi is completed by its own).

        Args:
            dest: any tensor with source's dtype and number of elements; read it
                only after quiet().
            source: a symmetric tensor of this heap (or a view of one).
            pe: the PE to read from.

        Returns:
            None; the copy may still be running (device heaps on the node; MPI
            off the node).

        Raises:
            As get(); a PE that does not answer raises PeerTimeoutError at quiet().
        """
        self.get(dest, source, pe, _nbi=self.completion if _tracker is None else _tracker)

    def quiet(self) -> None:
        """Complete every put/get/nbi atomic issued by this PE on the default
        context (the heap's own calls), as shmem_quiet does: operations issued
        through a Ctx are completed by that context's quiet() (or its destroy(),
        or free/realloc/finalize, which complete every context's).

        Returns:
            None, once they are all complete (nbi atomics' fetched values stored).

        Raises:
            ShmemError: the heap is finalized.
            PeerTimeoutError: a PE did not answer an nbi operation within the
                heap's timeout; the heap is unusable afterwards.
        """
        if self.closed:
            self._check_usable()  # raises: finalized (its MPI window is gone)
        self.completion.quiet()

    def _quiet_every_context(self) -> None:
        """quiet() the default context and every live Ctx: before memory is freed
        or the window goes, nothing may still be in flight into it."""
        if self.closed:
            self._check_usable()  # raises: finalized (as quiet())
        self.completion.quiet()
        if self._contexts.data:  # (most programs make none: skip copying the weak set)
            for ctx in list(self._contexts):
                ctx.completion.quiet()

    def fence(self) -> None:
        """Order this PE's puts to each PE on the default context. Copies on the
        node already complete in issue order (one stream); off the node the
        outstanding nbi operations are completed.

        Returns:
            None.

        Raises:
            ShmemError: the heap is finalized.
            PeerTimeoutError: a PE did not answer within the heap's timeout.
        """
        if self.closed:
            self._check_usable()  # raises: finalized (its MPI window is gone)
        self.completion.fence()

    def barrier_all(self) -> None:
        """Complete this PE's puts, then wait for every PE (collective).

        This PE's queued device work (kernels and copies on the current stream)
        and its off-node puts are complete first, so after the barrier every PE
        sees every put made before it.

        Returns:
            None.

        Raises:
            SymmetryError: some PE is in another collective call.
            PeerTimeoutError: a PE did not arrive within the heap's timeout
                (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
            ShmemError: the heap is finalized.
        """
        with self._lock:
            self.quiet()
            self.agree(Call(Phase.BARRIER_ALL, text="barrier_all()"))

    def sync_all(self) -> None:
        """Wait for every PE (collective). This PE's own stores are complete
        first, including device work queued on the current stream (a kernel
        writing symmetric memory), since a host-side barrier that let them run
        on would order nothing; off-node nbi operations are not flushed.

        Returns:
            None.

        Raises:
            SymmetryError: some PE is in another collective call.
            PeerTimeoutError: a PE did not arrive within the heap's timeout
                (SHMEMVM_TIMEOUT); the heap is unusable afterwards.
            ShmemError: the heap is finalized.
        """
        with self._lock:
            self.backend.synchronize()
            self.agree(Call(Phase.SYNC_ALL, text="sync_all()"))

    def heap_info(self) -> dict:
        """This PE's heap in numbers (local, not collective).

        Returns:
            A dict: heap_size (the physical budget), chunk (allocations below
            it are carved from segments of that size: SHMEMVM_CHUNK_SIZE), used
            (bytes in blocks), requested (bytes asked for), mapped (physical
            bytes backing the heap), cached (mapped bytes of freed segments kept for reuse), free
            (bytes that can still be allocated), live_allocations, segments,
            anchor (bytes of this PE's anchor, outside the heap size:
            SHMEMVM_ANCHOR), and pe, n_pes, backend, device, node_pes (the
            PEs of this node).

        Raises:
            ShmemError: the heap is finalized (a heap broken by a timeout still
                reports).
        """
        if self.closed:  # stats of released memory would mislead; a broken heap still reports
            raise ShmemError("this symmetric heap is finalized; call init() again for a new one")
        stats = self.local.stats()
        stats.update(pe=self.my_pe, n_pes=self.n_pes, backend=self.backend.name,
                     device=str(self.device), node_pes=list(self.node_pes),
                     anchor=self.anchor.size if self.anchor is not None else 0)
        return stats

    def trim(self) -> int:
        """Give back cached physical memory now (collective).

        Freed segments stay mapped as a cache for reuse; trim() releases them
        on every PE (peers drop their mappings of them too).

        Returns:
            The number of bytes released on this PE (the same on every PE).

        Raises:
            SymmetryError: some PE is in another collective call.
            PeerTimeoutError: a PE did not arrive within the heap's timeout.
            ShmemError: the heap is finalized, or unmapping failed on some PE
                (every PE raises it; the segments are released everywhere,
                and the heap stays usable).
        """
        with self._lock:
            call = Call(Phase.TRIM, text="trim()")
            self.agree(call)
            failure = None
            try:
                freed = self.local.trim()
            except Exception as exc:  # noqa: BLE001 - an unmap here; every segment was tried
                failure = exc
            self._agree_on_unmapping(call, failure, "the cached memory")
            return freed

    def _agree_on_unmapping(self, call: Call, failure: Exception | None, what: str) -> None:
        """After memory was released on every PE (the allocators moved on alike),
        only unmapping it can have failed, on one PE alone: agreed on, so that
        every PE raises the same ShmemError naming the failures, or none does."""
        step = call.step(Phase.UNMAPPED, f"unmapping {what}")
        if self.agreement.all_ok(failure is None, step):
            return
        reports = self.agreement.allgather_bytes(Phase.UNMAPPED, str(failure or "").encode()[:1024],
                                                 f"{step.text} (reporting the failures)")
        failed = "; ".join(f"PE {pe}: {report.decode(errors='replace')}"
                           for pe, report in enumerate(reports) if report)
        raise ShmemError(f"{call.text} released {what} on every PE, but unmapping it failed "
                         f"({failed}); the heap stays usable") from failure

    # -- atomics and signals (atomics.py): one-element int32/int64/uint64 views ------
    # Defined once, in atomics.py, taking the heap first: bound here as methods.
    atomic_fetch = atomics.atomic_fetch
    atomic_set = atomics.atomic_set
    atomic_add = atomics.atomic_add
    atomic_inc = atomics.atomic_inc
    atomic_fetch_add = atomics.atomic_fetch_add
    atomic_fetch_inc = atomics.atomic_fetch_inc
    atomic_swap = atomics.atomic_swap
    atomic_compare_swap = atomics.atomic_compare_swap
    atomic_fetch_and = atomics.atomic_fetch_and
    atomic_fetch_or = atomics.atomic_fetch_or
    atomic_fetch_xor = atomics.atomic_fetch_xor
    atomic_and = atomics.atomic_and
    atomic_or = atomics.atomic_or
    atomic_xor = atomics.atomic_xor
    wait_until = atomics.wait_until
    test = atomics.test
    put_signal = atomics.put_signal
    signal_fetch = atomics.signal_fetch
    signal_wait_until = atomics.signal_wait_until
    put_signal_nbi = atomics.put_signal_nbi
    atomic_fetch_nbi = atomics.atomic_fetch_nbi
    atomic_fetch_add_nbi = atomics.atomic_fetch_add_nbi
    atomic_fetch_inc_nbi = atomics.atomic_fetch_inc_nbi
    atomic_swap_nbi = atomics.atomic_swap_nbi
    atomic_compare_swap_nbi = atomics.atomic_compare_swap_nbi
    atomic_fetch_and_nbi = atomics.atomic_fetch_and_nbi
    atomic_fetch_or_nbi = atomics.atomic_fetch_or_nbi
    atomic_fetch_xor_nbi = atomics.atomic_fetch_xor_nbi
    # point-to-point synchronization over vectors (sync.py): 1-D int ivars
    wait_until_all = sync.wait_until_all
    wait_until_any = sync.wait_until_any
    wait_until_some = sync.wait_until_some
    wait_until_all_vector = sync.wait_until_all_vector
    wait_until_any_vector = sync.wait_until_any_vector
    wait_until_some_vector = sync.wait_until_some_vector
    test_all = sync.test_all
    test_any = sync.test_any
    test_some = sync.test_some
    test_all_vector = sync.test_all_vector
    test_any_vector = sync.test_any_vector
    test_some_vector = sync.test_some_vector
    # strided put/get (strided.py)
    iput = strided.iput
    iget = strided.iget
    # distributed locks (locks.py)
    set_lock = locks.set_lock
    clear_lock = locks.clear_lock
    test_lock = locks.test_lock

    # -- contexts (contexts.py) ------------------------------------------------------------
    def ctx_create(self, options: int = 0):
        """A communication context on this heap (shmem_ctx_create; not collective).

        Args:
            options: 0 or an OR of shmemvm.CTX_SERIALIZED (1), CTX_PRIVATE (2)
                and CTX_NOSTORE (4), recorded on the context (see contexts.Ctx).

        Returns:
            A contexts.Ctx: put/get/nbi/atomics whose quiet() completes only its
            own operations. Usable as a context manager (destroyed on exit).

        Raises:
            TypeError: `options` is not an integer.
            ValueError: `options` has other bits.
            ShmemError: the heap is finalized.
        """
        from .openshmem.contexts import Ctx   # contexts.py builds on this module
        return Ctx(self, options)

    def ctx_destroy(self, ctx) -> None:
        """Complete `ctx`'s operations and make it unusable (shmem_ctx_destroy).

        Args:
            ctx: a contexts.Ctx of this heap (destroying it twice is harmless).

        Returns:
            None.

        Raises:
            TypeError: `ctx` is not a context of this heap.
            PeerTimeoutError: a PE did not answer ctx's nbi operations in time.
        """
        if getattr(ctx, "heap", None) is not self or not hasattr(ctx, "destroy"):
            raise TypeError(f"ctx_destroy: expected a context made by this heap's ctx_create, "
                            f"got {type(ctx).__name__}")
        ctx.destroy()

    # -- collectives (collectives.py): contiguous symmetric tensors ----------------------
    broadcast = collectives.broadcast
    collect = collectives.collect
    fcollect = collectives.fcollect
    reduce = collectives.reduce
    alltoall = collectives.alltoall
    all_reduce = collectives.all_reduce
    alltoalls = collectives.alltoalls

    # -- teams (teams.py): views of this heap over a subset of its PEs ----------------------
    team_world = teams.team_world
    team_shared = teams.team_shared
    team_split_strided = teams.team_split_strided
    team_split_2d = teams.team_split_2d
    team_my_pe = teams.team_my_pe
    team_n_pes = teams.team_n_pes
    team_translate_pe = teams.team_translate_pe
    team_sync = teams.team_sync
    team_destroy = teams.team_destroy

    # -- lifetime -----------------------------------------------------------------
    def _check_usable(self) -> None:
        if self.closed:
            raise ShmemError("this symmetric heap is finalized; call init() again for a new one")
        if self.agreement is not None:
            self.agreement.check_usable()

    def finalize(self) -> None:
        """Release everything (collective when the heap is healthy)."""
        if self.closed:
            return
        try:
            if not self._broken:
                with self._lock:
                    self._quiet_every_context()
                    self.agree(Call(Phase.FINALIZE, text="finalize()"))
        except SymmetryError:
            raise  # other PEs are in another call: as the error says, nothing was done
        except BaseException:
            self._teardown()
            raise
        self._teardown()

    close = finalize

    def _teardown(self) -> None:
        self.closed = True
        self._teams.close()  # before the communicators they were split from
        # The peer table goes with the allocator (a close listener): memory that
        # tensors or ptr() views still view stays mapped until they die.
        for part in (self.offnode, self.channel, self.anchor, self.local):
            if part is not None:
                try:
                    part.close()
                except Exception:  # keep releasing the rest
                    log.exception("shmemvm: error while releasing %s", type(part).__name__)
        if self._broken:
            # A timed-out collective is still pending on these communicators;
            # freeing them under it crashed Open MPI at exit. They are left to
            # MPI_Finalize.
            return
        if self.agreement is not None:
            self.agreement.close()  # its persistent request, before its communicator
        for comm in (getattr(self, "node", None), self.comm):
            if comm is not None and comm != MPI.COMM_NULL:
                comm.Free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()


def _note_rounding(heap_size, local: VMemPow2Allocator, pe: int) -> None:
    """Say (INFO, once: PE 0) where the heap size was rounded up to the granularity."""
    if local.heap_size != local.requested_size and pe == 0:
        backend = local.backend
        log.info("shmemvm: heap_size %d (%r) rounded up to %d bytes, a multiple of the %s "
                 "backend's granularity %d", local.requested_size, heap_size
                 if heap_size is not None else setting("SHMEMVM_HEAP_SIZE"), local.heap_size,
                 backend.name, backend.granularity)


def _agreement_transport(value) -> str:
    """SHMEMVM_AGREEMENT (or agreement=): auto, board or mpi (config.py)."""
    raw = setting("SHMEMVM_AGREEMENT", value)
    text = raw.strip().lower() if isinstance(raw, str) else raw
    if text not in ("auto", "board", "mpi"):
        raise ValueError(f"SHMEMVM_AGREEMENT (the agreement= argument) must be 'auto', "
                         f"'board' or 'mpi', got {raw!r}")
    return text


def _node_split(value) -> int | None:
    """SHMEMVM_NODE_SPLIT=N (or node_split=N) fakes nodes of N PEs each."""
    split = setting("SHMEMVM_NODE_SPLIT", None if value is None else str(value))
    if not split:
        return None
    try:
        size = int(split)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"SHMEMVM_NODE_SPLIT must be an integer >= 1, got {split!r}")
    return size


def _whole_int(value, name: str) -> int:
    """`value` as an int (NumPy and other integer types too), or TypeError."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__") or \
            isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return operator.index(value)


def _whole_elements(nbytes, dtype: torch.dtype) -> int:
    """realloc's `nbytes` as a number of elements of `dtype`. Any integer type is
    accepted (NumPy's, a one-element integer tensor), as malloc accepts them."""
    if isinstance(nbytes, bool) or not hasattr(nbytes, "__index__"):
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__} {nbytes!r}")
    try:
        nbytes = operator.index(nbytes)
    except TypeError:  # e.g. a float tensor: has __index__, refuses it
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__} {nbytes!r}") from None
    if nbytes < 0 or nbytes % dtype.itemsize:
        raise ValueError(f"nbytes must be a non-negative multiple of the element size "
                         f"{dtype.itemsize} of {dtype}, got {nbytes}")
    return nbytes // dtype.itemsize

