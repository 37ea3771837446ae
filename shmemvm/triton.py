"""Iris's device functions for Triton kernels: ``from shmemvm import triton as iris``.

The public name of shmemvm/device/triton.py, where they are written and documented.
"""

from .device.triton import *  # noqa: F401,F403 - the public face of device/triton.py
from .device.triton import __all__  # noqa: F401
