"""shmemvm: OpenSHMEM-style symmetric memory for Python.

Layers (imports point down): api -> heap -> peers/fdpass/offnode -> vmem ->
allocator (pure) and backends (host, cuda, hip).
"""

from .allocator import Pow2Allocator
from .errors import (FreedTensorError, HeapExhaustedError, PeerTimeoutError, ShmemError,
                     SymmetryError, UnsupportedError)
from .vmem import VMemPow2Allocator

__version__ = "0.1.0"

__all__ = [
    "Pow2Allocator", "VMemPow2Allocator",
    "ShmemError", "HeapExhaustedError", "SymmetryError", "PeerTimeoutError",
    "UnsupportedError", "FreedTensorError",
]
