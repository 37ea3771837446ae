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

Each part is made into a local of _build, and all of them are handed to
HeapCore in one step at the end: no core exists half-made. Until then
_Made notes what a failed init must release.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from .. import native, thread_levels
from ..agreement import process
from ..agreement.agreement import Agreement
from ..agreement.deadline import DEFAULT_TIMEOUT, duplicate, parse_timeout, persistent_collectives
from ..agreement.liveness import Liveness
from ..agreement.protocol import Call, Phase
from ..backends.base import VMMBackend
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
from .state import HeapCore, Identity, Parts

log = logging.getLogger("shmemvm")


def open_heap(face: Any, comm: MPI.Comm | None, heap_size, backend, *, timeout=None,
              node_split=None, va_factor=None, thread_level=None, agreement=None,
              anchor=None, native=None) -> HeapCore:
    """The core of SymmetricHeap `face`, built whole (collective over `comm`,
    default COMM_WORLD): every part is made first, then handed to HeapCore in
    one step, so that no core exists half-made. On any failure what was made
    is released and the error raised."""
    if raw("SHMEMVM_DEBUG").strip() == "1":   # checked in _build with every setting
        log.setLevel(logging.DEBUG)
    made = _Made()
    try:
        core = _build(face, made, thread_levels.provide(thread_level), comm, heap_size, backend,
                      timeout, node_split, va_factor, agreement, anchor, native)
    except BaseException:
        _release(made, broken=made.agreement is not None and bool(made.agreement.broken))
        raise
    try:
        if profile.enabled():   # SHMEMVM_PROFILE=1: time every step (profile.py)
            profile.start(core)
    except BaseException:
        teardown(core)
        raise
    return core


@dataclass(slots=True)
class _Made:
    """What init has made so far that must be released if it fails before the
    core is whole (teardown() releases a whole core's, the same parts)."""
    comm: MPI.Intracomm | None = None
    node: MPI.Comm | None = None
    agreement: Agreement | None = None
    local: HeapMemory | None = None
    channel: FdChannel | None = None
    liveness: Liveness | None = None
    anchor: Anchor | None = None
    window: OffNodeWindow | None = None


def _build(face: Any, made: _Made, thread_level: int, comm, heap_size, backend, timeout,
           node_split, va_factor, transport, anchor_wanted, fast) -> HeapCore:
    call = Call(Phase.INIT, text="init")
    try:
        check_all()   # every setting, used by this heap or not (ValueError naming it)
    except ValueError as exc:
        call.error = exc
    try:
        timeout = parse_timeout(timeout)
    except ValueError as exc:
        call.error, timeout = exc, DEFAULT_TIMEOUT  # a deadline to fail by
    try:
        split = _node_split(node_split)
    except ValueError as exc:
        call.error, split = call.error or exc, None
    try:
        transport = _agreement_transport(transport)
    except ValueError as exc:
        call.error, transport = call.error or exc, "mpi"
    try:
        anchor_wanted = anchor_setting(anchor_wanted)
    except ValueError as exc:
        call.error, anchor_wanted = call.error or exc, 0
    try:
        fast = native.wanted(fast)
    except ValueError as exc:
        call.error, fast = call.error or exc, False
    made.comm = world = duplicate(comm if comm is not None else MPI.COMM_WORLD, timeout)
    my_pe, n_pes = world.Get_rank(), world.Get_size()
    # the core's release_dead is given to the agreement when the core is made (no block
    # is dropped before: no tensor exists yet)
    made.agreement = agreement = Agreement(world, timeout, my_pe)
    # MPI has no nonblocking split: it runs right after the Idup, which every
    # PE has joined, with nothing in between that can fail or wait.
    made.node = node = _split_node(world, my_pe, split)
    local = channel = liveness = completion = None
    if call.error is None:
        try:
            # Blocks nothing views any more are released only once every PE
            # agrees (HeapCore.agree), so release_dead=False.
            made.local = local = HeapMemory(heap_size, backend, va_factor=va_factor,
                                            release_dead=False, local_rank=node.Get_rank())
            completion = CompletionTracker(local.backend, current_stream=True)
            _note_rounding(heap_size, local, my_pe)
            # the timeout is agreed too: the agreement's decisions on late steps
            # (agreement.py) count on every PE giving up after the same time
            name, granularity = local.backend.name, local.backend.granularity
            call.args = (local.heap_size, local.va_size, granularity,
                         (name, transport, anchor_wanted, timeout), local.chunk)
            call.text = (f"init(heap_size={local.heap_size}, backend={name}, granularity="
                         f"{granularity}, va_size={local.va_size}, chunk={local.chunk}, "
                         f"SHMEMVM_AGREEMENT={transport}, SHMEMVM_ANCHOR={anchor_wanted}, "
                         f"SHMEMVM_TIMEOUT={timeout:g})")
            made.channel = channel = FdChannel(f"pe{my_pe}")
            made.liveness = liveness = Liveness(my_pe, n_pes, timeout, channel.directory)
        except Exception as exc:
            call.error = exc
    agreement.collective(call)
    # (made on every PE: the agreed step raised every PE's error otherwise)
    assert local is not None and completion is not None and channel is not None \
        and liveness is not None
    backend = local.backend
    mine = json.dumps([my_pe, os.getpid(), channel.path]).encode()
    node_info = [json.loads(info) for info in agreement.allgather_bytes(
        Phase.INIT_NODE, mine, "init (the PEs of the node)", comm=node)]
    node_pes = [pe for pe, _, _ in node_info]
    peer_pids = {pe: pid for pe, pid, _ in node_info if pe != my_pe}
    peer_paths = {pe: path for pe, _, path in node_info if pe != my_pe}
    failure = None
    try:
        # every PE maps its node's records (over several nodes: the window of every
        # PE's, a blocking collective, right after the agreed step above)
        liveness.connect(world, {pe: (pid, os.path.dirname(path))
                                 for pe, pid, path in node_info})
        agreement.liveness = liveness
        liveness.on_verdict = agreement.mark_broken
    except Exception as exc:  # noqa: BLE001 - voted on below: init fails everywhere
        failure = exc
    peers = None
    try:
        peers = PeerTable(backend, local.va_size, sorted(peer_pids))
        # (its reservations go with the memory: a failed init's release too)
        local.release_listeners.append(peers.drop)
        local.close_listeners.append(peers.close)
    except Exception as exc:  # no address space: the others must not wait in the window
        failure = failure or exc
    # the compiled paths where every PE has them (a PE without: every PE goes without),
    # voted on before the board, which they make worth making
    fast = agreement.all_ok(fast, call.step(Phase.INIT_NATIVE, "the compiled paths"))
    board = _make_board(agreement, call, transport, failure, fast, n_pes, len(node_pes))
    assert peers is not None   # (the vote above raised on every PE otherwise)
    if board is not None:
        if fast:
            board.use_native()
        agreement.use_board(board)
    exchange = Exchange(channel, my_pe, peer_paths, peer_pids, timeout)
    made.anchor = anchor = _make_anchor(
        exchange, agreement, call, anchor_size(anchor_wanted, backend, len(node_pes)),
        backend, sorted(peer_pids), my_pe)
    window, window_error = _open_window(world, local, agreement, timeout,
                                        single_node=len(node_pes) == n_pes)
    made.window = window
    routes = Routes(my_pe, n_pes, peer_pids, mpi_memory=backend.mpi_accessible, native=fast)
    locator = Locator(routes, peers, local.base, backend, window, native=fast)
    identity = Identity(my_pe, n_pes, tuple(node_pes), world, node, timeout, backend.device,
                        backend.name, backend.granularity,
                        anchor.size if anchor is not None else 0, fast)
    agreement.collective(call.step(Phase.INIT_READY, "peers ready"))
    agreement.initialized = True
    log.debug("PE %d/%d ready: node PEs %s, backend %s", my_pe, n_pes, node_pes, backend.name)
    parts = Parts(local=local, peers=peers, channel=channel, exchange=exchange, anchor=anchor,
                  window=window, window_error=window_error, agreement=agreement,
                  liveness=liveness, completion=completion, routes=routes, locator=locator,
                  peer_pids=peer_pids, peer_paths=peer_paths)
    return HeapCore(face, identity, parts, node_pes=node_pes, thread_level=thread_level)


def _make_board(agreement: Agreement, call: Call, transport: str, failure: Exception | None,
                fast: bool, n_pes: int, on_node: int):
    """The agreement's shared-memory board, where every PE is on this node (`on_node`
    of `n_pes`) and the setting asks for one (auto: where every PE has the compiled
    piece (`fast`), whose board steps beat an MPI allreduce, or where MPI has no
    persistent collectives). Every PE decides alike (the same PEs, the same setting:
    compared at init, the same MPI, the native vote), so all or none make one.
    A heap of one PE is on one node too: its steps take the board (and the
    quick steps in C) as larger heaps' do, where MPI's general path cost a
    one-process program's malloc + free 1.7 times the 2-PE one. Also the vote on `failure` (a
    PE that could not reserve its peers' windows): init then fails everywhere."""
    board = board_failure = None
    tried = n_pes == on_node and (
        transport == "board" or (transport == "auto" and (
            fast or not persistent_collectives())))
    if tried:
        try:
            board = agreement.make_board()
        except Exception as exc:  # noqa: BLE001 - agreed on below
            board_failure = exc
            if transport == "board":   # asked for: no board, no heap
                failure = failure or exc
    if not agreement.all_ok(failure is None, call.step(
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
    if tried and transport == "auto" and not agreement.all_ok(
            board is not None, call.step(Phase.INIT_BOARD, "the agreement's board")):
        if board is not None:
            board.close()   # not freed, as above
        board = None
        if agreement.my_pe == 0:
            log.info("shmemvm: no shared-memory board for the agreement (%s); it goes "
                     "through MPI", board_failure or "another PE could not make one")
    return board


def _make_anchor(exchange: Exchange, agreement: Agreement, call: Call, size: int,
                 backend: VMMBackend, peer_pes: list[int], my_pe: int) -> Anchor | None:
    """This PE's anchor of `size` bytes (0: none), mapped by every PE of the
    node (anchor.py); None on every PE where some PE could not make or map
    one: it only speeds up sharing new memory, so the heap goes on without."""
    anchor = failure = None
    try:
        if size:
            try:
                anchor = Anchor(backend, size, peer_pes)
            except Exception as exc:  # noqa: BLE001 - told to the peers, agreed on below
                failure = exc
            # one segment, the same on every PE (the exchange compares them)
            failure = sharing.exchange(exchange, agreement, call, [Segment(0, size, 0)],
                                       anchor.export if anchor else None,
                                       anchor.map_peer if anchor else None, failed=failure)
        # Every PE takes this step, those without an anchor (alone on their node) too.
        everywhere = agreement.all_ok(failure is None, call.step(Phase.INIT_ANCHOR, "the anchor"))
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
                my_pe, failure or "some PE could not make its anchor")
    return None


def _open_window(comm: MPI.Intracomm, local: HeapMemory, agreement: Agreement, timeout: float,
                 *, single_node: bool) -> tuple[OffNodeWindow | None, str | None]:
    """The MPI window that carries off-node put/get and every atomic of a host
    heap (on the node too), or None where there is nothing for it to carry or
    the MPI library cannot make one, with why (for messages: window_for())."""
    backend = local.backend
    if not backend.mpi_accessible and single_node:
        return None, (f"{backend.name} backend's {backend.device.type} memory is "
                      f"not handed to MPI (shmemvm does not assume a GPU-aware MPI)")
    try:
        return OffNodeWindow(comm, local, healthy=lambda: not agreement.broken,
                             timeout=timeout, broken=agreement.mark_broken), None
    except MPI.Exception as exc:  # e.g. Open MPI without a usable osc component
        why = (f"MPI could not create a dynamic window: {exc} (Open MPI 4.1: "
               f"run with -mca osc pt2pt and MPI4PY_RC_THREAD_LEVEL="
               f"serialized; docs/multinode.md)")
        log.warning("shmemvm: %s; off-node access and atomics are unavailable", why)
        return None, why


def _split_node(comm: MPI.Intracomm, my_pe: int, size: int | None) -> MPI.Comm:
    """PEs that share memory; nodes of `size` PEs each where given."""
    if size:
        return comm.Split(my_pe // size, my_pe)
    return comm.Split_type(MPI.COMM_TYPE_SHARED, my_pe)


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
        core.liveness.leave(why)
        process.LEFT_HEAP[0] = True   # (the excepthook gives the others a moment)
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
    """Release everything `core` holds: the routines' state first (teams before
    the communicators they were split from), then its parts (_release)."""
    core.closed = True
    core.quick.clear()   # (each holds the board's Stepper, which addresses its window)
    core.close_features()
    _release(_Made(comm=core.comm, node=core.node, agreement=core.agreement, local=core.local,
                   channel=core.channel, liveness=core.liveness, anchor=core.anchor,
                   window=core.window), broken=bool(core.broken))


def _release(made: _Made, *, broken: bool) -> None:
    """Release the parts `made` holds (a whole core's, or what a failed init
    made): the window, mailbox, anchor and memory, then the agreement and
    the communicators. The peer table goes with the memory (a close listener):
    memory that tensors or ptr() views still view stays mapped until they die,
    and memory a broken heap's window exposed, until the process ends."""
    liveness, window = made.liveness, made.window
    parts: list[Any] = [window, liveness, made.channel, made.anchor, made.local]
    for part in parts:
        if part is parts[-1] and window is not None and window.left_to_mpi:
            continue   # MPI may still write to it: it stays mapped (OffNodeWindow.close)
        if part is not None:
            try:
                if part is liveness:   # its record says so first; its window goes
                    liveness.close(healthy=not broken)
                else:
                    part.close()
            except Exception:  # keep releasing the rest
                log.exception("shmemvm: error while releasing %s", type(part).__name__)
    if broken:
        # A timed-out collective is still pending on these communicators;
        # freeing them under it crashed Open MPI at exit. They are left to
        # MPI_Finalize.
        return
    if made.agreement is not None:
        made.agreement.close()  # its persistent request, before its communicator
    for comm in (made.node, made.comm):
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
