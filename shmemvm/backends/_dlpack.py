"""Zero-copy torch tensors over raw addresses, through a DLPack capsule.

One path for every backend: the capsule names the device the memory is
*accessed from* (the local device), which is what makes peer GPU memory
usable (torch.as_tensor on __cuda_array_interface__ rejects it).

Where the package is built (meson), each capsule is a C struct of its own
whose C deleter frees it (_capsule.c: 0.5 us a tensor against 1.7 here). The
ctypes path below is used where it is not built; like native.address, the
capsule needs no peer, so SHMEMVM_NATIVE does not turn it off, and
tests/unit/native/test_views.py holds the two equal.

The ctypes capsule carries no deleter: a ctypes deleter callback can fire during
interpreter shutdown and crash. torch copies shape and strides when it takes
the capsule but keeps the struct's address and reads its `deleter` field when
the storage dies, so the struct must outlive every tensor made from it: one
module-level struct, always with a NULL deleter, is reused under a lock.
Lifetime of the memory is tracked on the torch storage instead (vmem.py).
"""

from __future__ import annotations

import ctypes
import threading

import torch

try:   # the capsule made in C (_capsule.c), built with the package
    from ._capsule import tensor_at as _compiled_tensor_at  # type: ignore[import-not-found]
except ImportError:   # a source tree used without meson: the ctypes path below
    _compiled_tensor_at = None

# DLPack device types (dlpack.h).
KDL_CPU = 1
KDL_CUDA = 2
KDL_ROCM = 10

_DEVICE_TYPE = {"cpu": KDL_CPU, "cuda": KDL_CUDA}

# DLDataType codes.
_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6

_DTYPES = {
    torch.uint8: (_UINT, 8), torch.int8: (_INT, 8),
    torch.int16: (_INT, 16), torch.int32: (_INT, 32), torch.int64: (_INT, 64),
    torch.uint16: (_UINT, 16), torch.uint32: (_UINT, 32), torch.uint64: (_UINT, 64),
    torch.float16: (_FLOAT, 16), torch.float32: (_FLOAT, 32), torch.float64: (_FLOAT, 64),
    torch.bfloat16: (_BFLOAT, 16),
    torch.complex64: (_COMPLEX, 64), torch.complex128: (_COMPLEX, 128),
    torch.bool: (_BOOL, 8),
}

SUPPORTED_DTYPES = frozenset(_DTYPES)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),  # NULL: nothing to call back into Python
    ]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


MAX_NDIM = 64
_managed = _DLManagedTensor()  # lives for the whole process, never freed
_shape = (ctypes.c_int64 * MAX_NDIM)()
_lock = threading.Lock()
# Made once (building ctypes objects per call was most of tensor_at's cost):
# views into the one struct, its address, and the pointer to the shape array.
_dl = _managed.dl_tensor
_dl_device = _dl.device
_dl_dtype = _dl.dtype
_managed_address = ctypes.addressof(_managed)
_shape_pointer = ctypes.cast(_shape, ctypes.POINTER(ctypes.c_int64))
# The fields every capsule has alike (compact strides, no offset, one lane),
# set once; the device and dtype of the last tensor made (tensor_at).
_dl.shape = _shape_pointer
_dl.strides = None
_dl.byte_offset = 0
_dl_dtype.lanes = 1
# What the struct holds now, so that tensor_at writes only what changed. Module
# state on purpose (issue 29 asked): it describes the one struct above, which
# is per process because torch reads it whenever a storage made from it dies;
# a cache per backend over a shared struct would go stale as soon as two
# backends took turns. Measured (tensor_at of a 64-float CPU tensor, best of
# 6 x 50k calls, this 2-core machine): 3.8 us with it, 5.6 us writing every
# field each call.
_last: list = [None, None, None]   # device key, dtype, ndim written in the struct
_device_key: tuple = (None, None, None)   # tensor_at's last device, device_type and their DLPack pair
# torch's own capsule consumer: torch.utils.dlpack.from_dlpack only adds checks
# for objects with __dlpack__, which a capsule is not
_from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in _DTYPES:
        raise TypeError(
            f"dtype {dtype} is not supported for symmetric memory; "
            f"use one of {sorted(str(d) for d in _DTYPES)}"
        )


def tensor_at(address: int, shape: tuple[int, ...], dtype: torch.dtype,
              device: torch.device, device_type: int | None = None) -> torch.Tensor:
    """A contiguous tensor of `shape`/`dtype` whose first element is at `address`.
    `device_type` overrides the DLPack device type (ROCm torch calls its devices
    "cuda" but only accepts kDLROCM)."""
    global _device_key
    try:
        code, bits = _DTYPES[dtype]
    except (KeyError, TypeError):
        check_dtype(dtype)
        raise
    # the DLPack device of the last device asked for, kept (reading torch.device's
    # type and index and making the pair cost about as much as a ctypes write)
    known_device, known_type, device_key = _device_key
    if known_device is not device or known_type != device_type:
        device_key = (device_type or _DEVICE_TYPE[device.type], device.index or 0)
        _device_key = (device, device_type, device_key)
    if _compiled_tensor_at is not None:
        return _compiled_tensor_at(_from_dlpack, address,
                                 shape if type(shape) is tuple else tuple(shape), code, bits,
                                 *device_key)
    ndim = len(shape)
    if ndim > MAX_NDIM:
        raise ValueError(f"at most {MAX_NDIM} dimensions are supported, got {ndim}")
    with _lock:
        # Only what changed since the last tensor is written: each ctypes field
        # write costs about as much as a Python call.
        _shape[:ndim] = shape   # type: ignore[call-overload]  # ctypes takes any sequence
        dl = _dl
        dl.data = address
        if _last[2] != ndim:
            dl.ndim = _last[2] = ndim
        if _last[0] != device_key:
            _dl_device.device_type, _dl_device.device_id = _last[0] = device_key
        if _last[1] is not dtype:
            _dl_dtype.code, _dl_dtype.bits = code, bits
            _last[1] = dtype
        capsule = _PyCapsule_New(_managed_address, b"dltensor", None)
        return _from_dlpack(capsule)
