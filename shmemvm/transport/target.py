"""Where an operation lands: locate(), resolved once per operation.

An operation on symmetric bytes of PE `pe` (a put, a get, ptr(), an atomic,
a wait, a signal, a lock) first resolves a Target: the route to `pe`
(route.py), the live block the bytes are in with its generation checked
against what is mapped here for a node peer, and then how it is reached:

- `address`: where the bytes lie in this process (this PE's heap or a node
  peer's mapping), None for a PE only MPI reaches;
- `cpu_address`: the same address where the CPU itself copies there with the
  compiled piece (a host heap, every PE with the compiled piece), else None;
- `atomic_address`: the same address where this heap's atomics are the CPU's
  (route.AtomicPath.CPU), else None;
- `by_kernel`: atomics on it run as a Triton kernel on the mapping (a device
  heap's node);
- `window`: the MPI window, for a PE only MPI reaches.

"Fast" is a property of the target (`target.cpu_address is not None`), never
a second function that re-checks what locate() checked: a fast path takes
exactly what the general path takes. Every branch on the route, on the
compiled piece and on the backend's kind is here or in route.py.
"""

from __future__ import annotations

import torch

from .. import native
from ..native import call_key as native_call_key
from ..backends.base import VMMBackend
from ..errors import UnsupportedError
from ..memory.buddy import Block
from ..node.peers import PeerTable
from .offnode import OffNodeWindow
from .route import AtomicPath, Route, Routes


def data_address(array) -> int:
    """Where NumPy `array`'s data starts (native.address: the compiled piece's
    where built, for C-contiguous arrays)."""
    if array.flags.c_contiguous:
        return native.address(array)
    return native.interface_address(array)


class Target:
    """Symmetric bytes at heap offset `offset` of block `block`, on PE `pe`,
    as locate() resolved them (see the module doc)."""

    __slots__ = ("pe", "route", "block", "offset", "address", "cpu_address", "atomic_address",
                 "by_kernel", "window", "mapping")

    def __init__(self, pe: int, route: Route, block: Block, offset: int, address: int | None,
                 cpu_address: int | None, atomic_address: int | None, by_kernel: bool,
                 window: OffNodeWindow | None, peers: PeerTable | None) -> None:
        self.pe = pe
        self.route = route
        self.block = block
        self.offset = offset
        self.address = address
        self.cpu_address = cpu_address
        self.atomic_address = atomic_address
        self.by_kernel = by_kernel
        self.window = window
        #: the node peer's mapping these bytes are reached through (None: this PE's own
        #: memory, or a PE only MPI reaches)
        self.mapping = peers

    @property
    def own(self) -> bool:
        """These are this PE's own bytes (route SELF)."""
        return self.route is Route.SELF

    def copy_view(self, like: torch.Tensor) -> torch.Tensor:
        """`like` (a view of these bytes on this PE) as the tensor a copy to or
        from PE `pe` goes through: `like` itself for this PE, a cached view of
        the peer's mapping for a node peer (never handed to a user)."""
        if self.mapping is None:
            return like
        return self.mapping.copy_view(self.pe, self.offset, like)

    def block_view(self, like: torch.Tensor, start: int) -> torch.Tensor:
        """`like` as it lies on PE `pe` in a storage of its own over exactly the
        bytes like's storage covers (ptr()); `start`: the heap offset where
        like's storage starts. `like` itself for this PE."""
        if self.mapping is None:
            return like
        return self.mapping.block_view(self.pe, start, like)


class Locator:
    """The one place that turns (block, offset, PE) into a Target for a heap:
    its routes, its node peers' mappings, its base, its MPI window, and
    whether the CPU copies (host memory, the compiled piece everywhere)."""

    def __init__(self, routes: Routes, peers: PeerTable, base: int, backend: VMMBackend,
                 window: OffNodeWindow | None, *, native: bool) -> None:
        self.routes = routes
        self.peers = peers
        self.base = base
        self.backend = backend
        self.window = window
        #: the CPU copies with the compiled piece: host memory, every PE has the piece
        self.cpu_copies = native and backend.device.type == "cpu"
        self.cpu_atomics = routes.atomics is AtomicPath.CPU
        self.kernel_atomics = routes.atomics is AtomicPath.KERNEL
        #: the NumPy face's one-pass paths (a copy or an atomic by the CPU itself) apply
        self.one_pass = self.cpu_copies or self.cpu_atomics
        #: the NumPy face's memo key of a collective call in one call, where every PE
        #: has the compiled piece (native.call_key); None: the face's Python key
        self.call_key = native_call_key if native else None

    def array_address(self, array) -> int | None:
        """Where C-contiguous NumPy `array`'s data starts (the compiled piece
        reads it), for the NumPy face's one-pass paths; None where no one-pass
        path applies on this heap (no compiled piece on some PE, device memory
        without CPU atomics), so that the face takes the general path."""
        return native.address(array) if self.one_pass else None

    def locate(self, block: Block, offset: int, pe: int) -> Target:
        """The Target of heap offset `offset` (inside live `block`) on PE `pe` (a
        checked PE number): for a node peer, the block's segment is checked to be
        what is mapped here (offset and generation), else ShmemError."""
        route = self.routes[pe]
        if route is Route.MPI:
            return Target(pe, route, block, offset, None, None, None, False, self.window, None)
        peers = None
        if route is Route.NODE:
            self.peers.check(pe, block.segment)
            address = self.peers.windows[pe] + offset
            peers = self.peers
        else:
            address = self.base + offset
        return Target(pe, route, block, offset, address,
                      address if self.cpu_copies else None,
                      address if self.cpu_atomics else None, self.kernel_atomics,
                      None, peers)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """A blocking copy between two tensors of this process (the backend's)."""
        self.backend.copy(dst, src, True)

    def atomics_window(self, what: str, pe: int, window_error: str | None) -> OffNodeWindow:
        """The MPI window an atomic on PE `pe` goes through (neither the CPU's
        nor a kernel's), or UnsupportedError saying why there is none."""
        if not self.backend.mpi_accessible:
            raise UnsupportedError(
                f"{what}: this heap holds {self.backend.name} backend memory on "
                f"{self.backend.device}, which shmemvm does not hand to MPI (no GPU-aware MPI "
                f"is assumed), so PE {pe} on another node cannot be reached by atomics; PEs "
                f"on this node can (Triton kernels), and a host-backend heap (backend='host') "
                f"reaches every PE")
        if self.window is None:
            raise UnsupportedError(f"{what} needs the heap's MPI window, which is unavailable: "
                                   f"{window_error}")
        return self.window
