"""How an operation reaches a PE, decided once at init and used everywhere.

Every PE is reached one of three ways:

- SELF: this PE's own memory;
- NODE: a PE of this node, whose heap is mapped into this process (node/peers.py):
  put/get are copies through the mapping, ptr() views it, kernels address it;
- MPI: a PE of another node, reached through the heap's MPI window
  (offnode.py); ptr() is None for it.

Atomics take one path per heap, chosen once and the same on every PE, so that
every atomic on a word goes through one mechanism and they are atomic with
respect to each other (docs/multinode.md):

- CPU: a host heap whose PEs are all on one node, where every PE has the
  compiled piece (native/): every atomic is the CPU's own atomic instruction
  on the shared mapping. Atomic with respect to each other because every PE
  applies them to the same physical memory with locked instructions, and no
  other path exists on such a heap (no PE is off the node, no MPI atomic
  touches it);
- WINDOW: every other host heap: every atomic, to this node's PEs too, goes
  through the MPI window (MPI's atomics are atomic only with respect to each
  other, so the node's PEs must not use CPU atomics beside them);
- KERNEL: a device heap (memory MPI is not given): a Triton kernel with
  system-scope atomics on the mapped memory, for this node's PEs only.

A new path (CPU atomics on node memory, a compiled fast path) is a change here and in
target.py, whose Locator turns a route into the Target of one operation.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Route(enum.Enum):
    """How one PE is reached from this one."""
    SELF = "self"
    NODE = "node"
    MPI = "mpi"


class AtomicPath(enum.Enum):
    """How this heap's atomics reach their targets (the same for every PE)."""
    CPU = "cpu"
    WINDOW = "window"
    KERNEL = "kernel"


class Routes:
    """The route to every PE of a heap, as seen from `my_pe`."""

    def __init__(self, my_pe: int, n_pes: int, mapped: Iterable[int], *, mpi_memory: bool,
                 native: bool = False):
        """`mapped`: the PEs whose heaps are mapped here (this node's others);
        `mpi_memory`: the heap's memory can be handed to MPI (host memory);
        `native`: every PE has the compiled piece (voted on at init)."""
        self.my_pe = my_pe
        self.n_pes = n_pes
        mapped = set(mapped)
        self._routes = tuple(Route.SELF if pe == my_pe else Route.NODE if pe in mapped
                             else Route.MPI for pe in range(n_pes))
        #: every PE of the heap is on this node
        self.single_node = all(route is not Route.MPI for route in self._routes)
        #: the path of every atomic of this heap
        if not mpi_memory:
            self.atomics = AtomicPath.KERNEL
        elif native and self.single_node:
            self.atomics = AtomicPath.CPU
        else:
            self.atomics = AtomicPath.WINDOW

    def __getitem__(self, pe: int) -> Route:
        """The route to PE `pe` (a valid PE number)."""
        return self._routes[pe]

    def all_mapped(self, pes: Iterable[int]) -> bool:
        """Every PE of `pes` is addressable from here (a team's node path)."""
        routes = self._routes
        return all(routes[pe] is not Route.MPI for pe in pes)
