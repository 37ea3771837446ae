"""Building a heap (init, a collective) and taking it down (teardown).

Every step waits with the deadline, and a PE that fails locally (bad
settings, no memory) still takes part until the init agreement, where every
PE raises: that error where every PE has it, else SymmetryError. The steps:

1. duplicate the communicator and split off the node's PEs;
2. reserve this PE's heap (memory/vmm.py) and agree on the settings;
3. tell the node's PEs where this PE's mailbox is, map their liveness
   records (agreement/liveness.py: over several nodes also a window of every
   PE's), reserve a window for each of their heaps, and make the agreement's
   shared-memory board where every PE is on one node (agreement/board.py);
4. the anchor (node/anchor.py), then the MPI window for the other nodes
   (transport/offnode.py), then the routes (transport/route.py).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from mpi4py import MPI

from .. import native, thread_levels
from ..agreement import process
from ..agreement.agreement import Agreement
from ..agreement.deadline import DEFAULT_TIMEOUT, duplicate, parse_timeout, persistent_collectives
from ..agreement.liveness import Liveness
from ..agreement.protocol import Call, Phase
from ..config import check_all, raw, setting
from ..errors import ShmemError, SymmetryError, clip
from ..memory.buddy import Segment
from ..memory.heapmem import HeapMemory
from ..memory.vmm import VMemPow2Allocator
from ..node.anchor import Anchor, anchor_setting, anchor_size
from ..node.exchange import Exchange
from ..node.fdpass import FdChannel
from ..node.peers import PeerTable
from ..transport.completion import CompletionTracker
from ..transport.offnode import OffNodeWindow
from ..transport.route import Routes
from ..transport.target import Locator
from . import profile, sharing
from .state import HeapCore, Identity

log = logging.getLogger("shmemvm")


def open_heap(core: HeapCore, comm: MPI.Comm | None, heap_size, backend, *, timeout=None,
              node_split=None, va_factor=None, thread_level=None, agreement=None,
              anchor=None, native=None) -> None:
    """Build `core` (collective over `comm`, default COMM_WORLD). On any failure
    what was made is released (teardown) and the error raised."""
    if raw("SHMEMVM_DEBUG").strip() == "1":   # checked in _build with every setting
        log.setLevel(logging.DEBUG)
    try:
        core.thread_level = thread_levels.provide(thread_level)
        _build(core, comm, heap_size, backend, timeout, node_split, va_factor, agreement, anchor,
               native)
    except BaseException:
        teardown(core)
        raise


def _build(core: HeapCore, comm, heap_size, backend, timeout, node_split, va_factor,
           transport, anchor, fast) -> None:
    call = Call(Phase.INIT, text="init")
    try:
        check_all()   # every setting, used by this heap or not (ValueError naming it)
    except ValueError as exc:
        call.error = exc
    try:
        core.timeout = parse_timeout(timeout)
    except ValueError as exc:
        call.error, core.timeout = exc, DEFAULT_TIMEOUT  # a deadline to fail by
    try:
        split = _node_split(node_split)
    except ValueError as exc:
        call.error, split = call.error or exc, None
    try:
        transport = _agreement_transport(transport)
    except ValueError as exc:
        call.error, transport = call.error or exc, "mpi"
    try:
        anchor = anchor_setting(anchor)
    except ValueError as exc:
        call.error, anchor = call.error or exc, 0
    try:
        fast = native.wanted(fast)
    except ValueError as exc:
        call.error, fast = call.error or exc, False
    core.comm = duplicate(comm if comm is not None else MPI.COMM_WORLD, core.timeout)
    core.my_pe = core.comm.Get_rank()
    core.n_pes = core.comm.Get_size()
    core.agreement = Agreement(core.comm, core.timeout, core.my_pe, core.release_dead)
    # MPI has no nonblocking split: it runs right after the Idup, which every
    # PE has joined, with nothing in between that can fail or wait.
    core.node = _split_node(core, split)
    if call.error is None:
        try:
            # Blocks nothing views any more are released only once every PE
            # agrees (HeapCore.agree), so release_dead=False.
            core.local = HeapMemory(heap_size, backend, va_factor=va_factor,
                                    release_dead=False, local_rank=core.node.Get_rank())
            core.backend = core.local.backend
            core.completion = CompletionTracker(core.backend, current_stream=True)
            _note_rounding(heap_size, core.local, core.my_pe)
            # the timeout is agreed too: the agreement's decisions on late steps
            # (agreement.py) count on every PE giving up after the same time
            call.args = (core.local.heap_size, core.local.va_size, core.backend.granularity,
                         (core.backend.name, transport, anchor, core.timeout), core.local.chunk)
            call.text = (f"init(heap_size={core.local.heap_size}, backend="
                         f"{core.backend.name}, granularity={core.backend.granularity}, "
                         f"va_size={core.local.va_size}, chunk={core.local.chunk}, "
                         f"SHMEMVM_AGREEMENT={transport}, SHMEMVM_ANCHOR={anchor}, "
                         f"SHMEMVM_TIMEOUT={core.timeout:g})")
            core.channel = FdChannel(f"pe{core.my_pe}")
            core.liveness = Liveness(core.my_pe, core.n_pes, core.timeout,
                                     core.channel.directory)
        except Exception as exc:
            call.error = exc
    core.agreement.collective(call)
    # (made on every PE: the agreed step raised every PE's error otherwise)
    channel, liveness = core.channel, core.liveness
    assert channel is not None and liveness is not None
    mine = json.dumps([core.my_pe, os.getpid(), channel.path]).encode()
    node_info = [json.loads(info) for info in core.agreement.allgather_bytes(
        Phase.INIT_NODE, mine, "init (the PEs of the node)", comm=core.node)]
    core.node_pes = [pe for pe, _, _ in node_info]
    core.peer_pids = {pe: pid for pe, pid, _ in node_info if pe != core.my_pe}
    core.peer_paths = {pe: path for pe, _, path in node_info if pe != core.my_pe}
    failure = None
    try:
        # every PE maps its node's records (over several nodes: the window of every
        # PE's, a blocking collective, right after the agreed step above)
        liveness.connect(core.comm, {pe: (pid, os.path.dirname(path))
                                          for pe, pid, path in node_info})
        core.agreement.liveness = liveness
        liveness.on_verdict = core.agreement.mark_broken
    except Exception as exc:  # noqa: BLE001 - voted on below: init fails everywhere
        failure = exc
    try:
        core.peers = PeerTable(core.backend, core.local.va_size, sorted(core.peer_pids))
    except Exception as exc:  # no address space: the others must not wait in the window
        failure = failure or exc
    # the compiled paths where every PE has them (a PE without: every PE goes without),
    # voted on before the board, which they make worth making
    core.native = core.agreement.all_ok(fast, call.step(Phase.INIT_NATIVE, "the compiled paths"))
    board = _make_board(core, call, transport, failure)
    if board is not None:
        if core.native:
            board.use_native()
        core.agreement.use_board(board)
    core.exchange = Exchange(channel, core.my_pe, core.peer_paths, core.peer_pids,
                             core.timeout)
    core.local.release_listeners.append(core.peers.drop)
    core.local.close_listeners.append(core.peers.close)
    core.anchor = _make_anchor(core, call, anchor_size(anchor, core.backend,
                                                       len(core.node_pes)))
    core.window = _open_window(core)
    core.routes = Routes(core.my_pe, core.n_pes, core.peer_pids,
                         mpi_memory=core.backend.mpi_accessible, native=core.native)
    core.locator = Locator(core.routes, core.peers, core.local.base, core.backend, core.window,
                           native=core.native)
    core.identity = Identity(core.my_pe, core.n_pes, tuple(core.node_pes), core.comm, core.node,
                             core.timeout, core.backend.device, core.backend.name,
                             core.backend.granularity, core.anchor_size, core.native)
    core.agreement.collective(call.step(Phase.INIT_READY, "peers ready"))
    core.agreement.initialized = True
    if profile.enabled():   # SHMEMVM_PROFILE=1: time every step (profile.py)
        profile.start(core)
    log.debug("PE %d/%d ready: node PEs %s, backend %s", core.my_pe, core.n_pes,
              core.node_pes, core.backend.name)


def _make_board(core: HeapCore, call: Call, transport: str, failure: Exception | None):
    """The agreement's shared-memory board, where every PE is on this node and
    the setting asks for one (auto: where every PE has the compiled piece, whose
    board steps beat an MPI allreduce, or where MPI has no persistent
    collectives). Every PE decides alike (the same PEs, the same setting:
    compared at init, the same MPI, the native vote), so all or none make one.
    Also the vote on `failure` (a PE that could not reserve its peers'
    windows): init then fails everywhere."""
    board = board_failure = None
    tried = 1 < core.n_pes == len(core.node_pes) and (
        transport == "board" or (transport == "auto" and (
            core.native or not persistent_collectives())))
    if tried:
        try:
            board = core.agreement.make_board()
        except Exception as exc:  # noqa: BLE001 - agreed on below
            board_failure = exc
            if transport == "board":   # asked for: no board, no heap
                failure = failure or exc
    if not core.agreement.all_ok(failure is None, call.step(
            Phase.INIT_PEERS, "reserving the peers' windows and the agreement's board")):
        if board is not None:
            board.close()   # not freed: some PE may have none (left to MPI_Finalize)
        raise ShmemError(f"init failed: a PE could not map its node's liveness records, "
                         f"reserve address space for its peers' heaps or make the "
                         f"agreement's board in shared memory "
                         f"({failure or 'see the other PEs'}; SHMEMVM_AGREEMENT=mpi "
                         f"does without the board)") from failure
    # auto: where some PE has no board (Open MPI 4.1 with osc pt2pt cannot make
    # shared windows), every PE agrees through MPI instead
    if tried and transport == "auto" and not core.agreement.all_ok(
            board is not None, call.step(Phase.INIT_BOARD, "the agreement's board")):
        if board is not None:
            board.close()   # not freed, as above
        board = None
        if core.my_pe == 0:
            log.info("shmemvm: no shared-memory board for the agreement (%s); it goes "
                     "through MPI", board_failure or "another PE could not make one")
    return board


def _make_anchor(core: HeapCore, call: Call, size: int) -> Anchor | None:
    """This PE's anchor of `size` bytes (0: none), mapped by every PE of the
    node (anchor.py); None on every PE where some PE could not make or map
    one: it only speeds up sharing new memory, so the heap goes on without."""
    anchor = failure = None
    try:
        if size:
            try:
                anchor = Anchor(core.backend, size, sorted(core.peer_pids))
            except Exception as exc:  # noqa: BLE001 - told to the peers, agreed on below
                failure = exc
            # one segment, the same on every PE (the exchange compares them)
            failure = sharing.exchange(core, call, [Segment(0, size, 0)],
                                       anchor.export if anchor else None,
                                       anchor.map_peer if anchor else None, failed=failure)
        # Every PE takes this step, those without an anchor (alone on their node) too.
        everywhere = core.agreement.all_ok(failure is None,
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
                "other PEs may be 8-12x slower (SHMEMVM_ANCHOR, docs/performance.md)",
                core.my_pe, failure or "some PE could not make its anchor")
    return None


def _open_window(core: HeapCore) -> OffNodeWindow | None:
    """The MPI window that carries off-node put/get and every atomic of a host
    heap (on the node too), or None where there is nothing for it to carry or
    the MPI library cannot make one (core.window_error says why, for messages)."""
    core.window_error = None
    if not core.backend.mpi_accessible and len(core.node_pes) == core.n_pes:
        core.window_error = (f"{core.backend.name} backend's {core.device.type} memory is "
                             f"not handed to MPI (shmemvm does not assume a GPU-aware MPI)")
        return None
    try:
        return OffNodeWindow(core.comm, core.local, healthy=lambda: not core.broken,
                             timeout=core.timeout, broken=core.agreement.mark_broken)
    except MPI.Exception as exc:  # e.g. Open MPI without a usable osc component
        core.window_error = (f"MPI could not create a dynamic window: {exc} (Open MPI 4.1: "
                             f"run with -mca osc pt2pt and MPI4PY_RC_THREAD_LEVEL="
                             f"serialized; docs/multinode.md)")
        log.warning("shmemvm: %s; off-node access and atomics are unavailable",
                    core.window_error)
        return None


def _split_node(core: HeapCore, size: int | None) -> MPI.Comm:
    """PEs that share memory; nodes of `size` PEs each where given."""
    if size:
        return core.comm.Split(core.my_pe // size, core.my_pe)
    return core.comm.Split_type(MPI.COMM_TYPE_SHARED, core.my_pe)


def finalize(core: HeapCore, leaving: BaseException | None) -> None:
    """SymmetricHeap.finalize(): collective where the heap is healthy, else a
    release here. `leaving`: the exception that left a with block, named in
    the call's text so that every PE's mismatch report says why this PE is
    in finalize() (the exception itself stays the context of what is raised)."""
    if core.closed:
        return
    text = "finalize()"
    if leaving is not None:
        what = f"{type(leaving).__name__}: {leaving}" if str(leaving) else \
            type(leaving).__name__
        # This PE leaves on an exception: it says so first (every PE waiting on it,
        # in a wait or a collective step, raises PeerDeadError naming it at once),
        # and no PE waits for it in a collective finalize (issue 32)
        why = f"it left a with block on {clip(what, 200)}"
        if core.liveness is not None:
            core.liveness.leave(why)
            process.LEFT_HEAP[0] = True   # (the excepthook gives the others a moment)
        if core.agreement is not None:
            core.agreement.mark_broken(f"PE {core.my_pe}: {why}")
        teardown(core)
        return
    try:
        if not core.broken:
            with core.lock:
                core.quiet_all()
                core.agree(Call(Phase.FINALIZE, text=text))
    except SymmetryError:
        raise  # other PEs are in another call: as the error says, nothing was done
    except BaseException:
        teardown(core)
        raise
    teardown(core)


def teardown(core: HeapCore) -> None:
    """Release everything `core` holds (whatever setup made of it): the
    routines' state first (teams before the communicators they were split
    from), then the window, mailbox, anchor and memory. The peer table goes
    with the memory (a close listener): memory that tensors or ptr() views
    still view stays mapped until they die, and memory a broken heap's window
    exposed, until the process ends."""
    core.closed = True
    core.close_features()
    liveness = core.liveness
    parts: list[Any] = [core.window, liveness, core.channel, core.anchor,
                        getattr(core, "local", None)]
    for part in parts:
        if part is parts[-1] and core.window is not None and core.window.left_to_mpi:
            continue   # MPI may still write to it: it stays mapped (OffNodeWindow.close)
        if part is not None:
            try:
                if part is liveness:   # its record says so first; its window goes
                    liveness.close(healthy=not core.broken)
                else:
                    part.close()
            except Exception:  # keep releasing the rest
                log.exception("shmemvm: error while releasing %s", type(part).__name__)
    if core.broken:
        # A timed-out collective is still pending on these communicators;
        # freeing them under it crashed Open MPI at exit. They are left to
        # MPI_Finalize.
        return
    if core.agreement is not None:
        core.agreement.close()  # its persistent request, before its communicator
    for comm in (getattr(core, "node", None), getattr(core, "comm", None)):
        if comm is not None and comm != MPI.COMM_NULL:
            comm.Free()


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
