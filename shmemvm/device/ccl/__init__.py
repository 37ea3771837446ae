"""Iris's host collectives on the symmetric heap (`heap.ccl`, `shmemvm.ccl`)
and all_to_all_v, the MoE dispatch; Triton kernels over the heap's mappings.
Needs Triton. docs/device.md has the table of collectives."""

from .api import Ccl, Workspace
from .config import Config, reduce_op_name

__all__ = ["Ccl", "Config", "Workspace", "reduce_op_name"]
