"""shmemvm: OpenSHMEM-style symmetric memory for Python.

The module functions (api.py) act on a default heap made by init(); a
SymmetricHeap (heap.py) has the same routines as methods. The layers, from
the top (each imports only from below it; tests/unit/test_house.py keeps it so):

    api, shmem (the NumPy face), triton (device API)   the faces
    device/        kernels over symmetric memory (DeviceAllReduce, ccl)
    heap           SymmetricHeap: the core with every routine bound by name
    openshmem/     the routines, one module a family, each with its own state
    core/          the heap core: state, agree(), routes; setup; sharing
    transport/     route (self | node mapping | MPI), offnode, completion, kernels
    node/          fd passing, the exchange, peers, anchor
    agreement/     protocol, deadlines, board, the agreement
    memory/        buddy allocator, VMM heap, ownership, limits
    backends/      host, cuda, hip
    errors, config, _args, thread_levels, _version
"""

from . import api
from ._version import __version__
from .api import *  # noqa: F401,F403 - the module functions, listed in api.__all__
from .errors import (DeadlockError, FreedTensorError, HeapExhaustedError, NotSymmetricError,
                     PeerDeadError, PeerTimeoutError, ResourceLimitError, ShmemError,
                     SymmetryError, UnsupportedError)
from .heap import FACTORIES, SymmetricHeap
from .memory.buddy import Pow2Allocator
from .memory.vmm import VMemPow2Allocator
from .openshmem.alloc import MALLOC_ATOMICS_REMOTE, MALLOC_SIGNAL_REMOTE
from .openshmem.contexts import CTX_NOSTORE, CTX_PRIVATE, CTX_SERIALIZED, Ctx
from .openshmem.signals import SIGNAL_ADD, SIGNAL_SET
from .openshmem.teams import Team
from .thread_levels import THREAD_FUNNELED, THREAD_MULTIPLE, THREAD_SERIALIZED, THREAD_SINGLE


def _make_ccl(heap):
    """heap.ccl's object (heap.FACTORIES): Triton, an optional dependency, is imported
    at the first use."""
    try:
        from .device.ccl import Ccl
    except ImportError as exc:
        raise UnsupportedError(f"heap.ccl runs Triton kernels: pip install triton (or "
                               f"shmemvm[triton]); importing it failed: {exc}") from exc
    return Ccl(heap)


FACTORIES["ccl"] = _make_ccl


def __getattr__(name):
    # DeviceAllReduce needs Triton, an optional dependency: imported on first use
    if name == "DeviceAllReduce":
        from .device.allreduce import DeviceAllReduce
        return DeviceAllReduce
    if name == "ccl":   # the default heap's collectives (shmemvm.ccl.all_gather(...))
        return api.default_heap().ccl
    raise AttributeError(f"module 'shmemvm' has no attribute {name!r}")


__all__ = [
    "__version__", "SymmetricHeap", "Pow2Allocator", "VMemPow2Allocator", "Team", "Ctx",
    "THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE",
    "SIGNAL_SET", "SIGNAL_ADD", "CTX_SERIALIZED", "CTX_PRIVATE", "CTX_NOSTORE",
    "MALLOC_ATOMICS_REMOTE", "MALLOC_SIGNAL_REMOTE",
    "ShmemError", "HeapExhaustedError", "SymmetryError", "PeerTimeoutError",
    "UnsupportedError", "FreedTensorError", "NotSymmetricError", "ResourceLimitError",
    "PeerDeadError", "DeadlockError",
]
__all__ += api.__all__
