"""AMD GPU memory through HIP's virtual-memory management (hip-python).

A physical piece is pinned device memory on this PE's GPU, created exportable
as a POSIX file descriptor (hipMemCreate with
hipMemHandleTypePosixFileDescriptor). VA ranges come from
hipMemAddressReserve; pieces are mapped with hipMemMap and made accessible
from the local device with hipMemSetAccess, also for peer pieces mapped here.
File descriptors travel through hipMemExportToShareableHandle and
hipMemImportFromShareableHandle.

ROCm constraint (DESIGN.md): hipMemSetAccess only works when called from the
base of the reservation over the whole mapped prefix; a sub-range, or a range
with an unmapped hole, fails with hipErrorInvalidValue (1). So this backend sets
access cumulatively: per reservation it tracks every mapped piece and the
highest mapped end (the "high water"), and set_access(va, size) always sets
access over [reservation base, high water).

The heap leaves holes below the high water all the time (buddy offsets: a
small-block segment at 0, the next segment at 1 MiB; peer segments mapped into
a window in any order; pieces unmapped in the middle), so the backend keeps
[base, high water) gap-free itself with a *filler*: one physical piece of
`granularity` bytes, created on first need (not exportable), mapped at offset
0 into every granule of a hole, the same piece at many addresses.
  - map(): filler granules inside the new piece are unmapped first, then the
    piece is mapped, then the granules between the old high water and the
    piece (if it lies above) get the filler;
  - unmap(): a piece below another one is replaced by filler granules; when
    the topmost piece goes, the high water drops to the end of the highest
    remaining piece and the filler granules above it are unmapped;
  - unreserve() unmaps a reservation's fillers, close() every remaining
    filler and then releases the filler piece.
The filler is one granule of device memory per backend, outside the heap's
budget (SHMEMVM_HEAP_SIZE). Every hole reads and writes the same granule, so
its contents are garbage shared between holes; no live block ever lies in a
hole, so nothing in shmemvm reads or writes there. Each filler granule is its
own hipMemMap and is unmapped with its own hipMemUnmap (a hole of n granules
costs n calls; ROCm has had trouble freeing VA after one hipMemUnmap spanning
several mappings). If HIP refuses a filler map, the error names the filler,
and a later set_access refused over a hole names the hole.

hip-python is imported on first use (`_import_hip`), not when this module is
imported, so that `shmemvm.backends.available("hip")` costs nothing without
it and tests can put a stand-in `hip` package in sys.modules.

Checked without an AMD GPU (hip-python 10.0.0.0.1.2 installed, no ROCm):
  - every hip-python call made here accepts the argument forms used (ints for
    addresses, hip-python enums, its struct wrappers); without libamdhip64.so
    each call gets as far as loading the library (the tests check this);
  - hip-python returns (hipError_t, value...) tuples; hipError_t is an IntEnum;
  - hip-python's hipMemAllocationProp wrapper leaves out the anonymous union
    {requestedHandleType, requestedHandleTypes} (older releases exposed
    `requestedHandleType`); the union is the int at offset 4, between `type`
    and `location` (hip_runtime_api.h), so it is written there when the
    wrapper has no such property, after checking that `location` sits at
    offset 8 as that layout requires;
  - from ROCm's sources (clr hip_vm.cpp, rocclr): hipMemCreate allocates on
    the *current* device and import uses the current device too (hence the
    device guard around those calls); the export writes an int fd through the
    pointer it is given; the import takes the fd by value, cast to void*
    (so fd 0 is refused as a NULL pointer: it is dup()ed first);
  - torch built for ROCm takes DLPack capsules with kDLROCM (10) and rejects
    kDLCUDA (2), and names the device "cuda"; `tensor()` here asks
    shmemvm.backends._dlpack for kDLROCM capsules.

Not verified (no AMD GPU anywhere we could run):
  - that the calls succeed on real hardware at all, the granularity value,
    and that hipMemAddressReserve honours alignments above the granularity
    (checked after the call: a misaligned result is an error);
  - that hipMemSetAccess over [base, high water) succeeds after every map
    (including maps of imported peer pieces) when that range is made of
    separate mappings, some of them filler granules that all map one physical
    piece, and what it costs as the heap grows (it re-sets the whole prefix
    each time); the tests only check this against a stand-in that enforces
    the base-and-no-holes rule as DESIGN.md states it;
  - that ROCm lets one physical piece be mapped at many addresses of one or
    several reservations (the VMM API allows it and ROCm documents virtual
    aliases; not run here), and what many filler mappings cost in page tables
    and call time;
  - that the importer may close its fd right after hipMemImportFromShareableHandle
    (true for CUDA and for dma-buf imports in general; assumed here), and
    that fstat() of the exported fd reports the piece's size (dma-buf does;
    used only as a sanity check, skipped when it reports 0);
  - that hipMemUnmap succeeds while the piece is still accessible, and that
    hipDeviceSynchronize before it covers the streams torch uses;
  - peer access: that a piece imported from another GPU and mapped here is
    usable by copies and kernels of this GPU;
  - that copies on torch's current stream through peer mappings behave as on
    CUDA.
"""

from __future__ import annotations

import bisect
import ctypes
import importlib
import logging
import os
import re
import threading
from dataclasses import dataclass, field

import torch

from . import _dlpack
from ..config import parse_size, setting
from ..errors import ShmemError, UnsupportedError
from .base import VMMBackend

log = logging.getLogger(__name__)

# hipMemAllocationProp layout (hip_runtime_api.h): type (4 bytes), the union
# {requestedHandleType, requestedHandleTypes} (4 bytes), location (8 bytes)...
_HANDLE_TYPE_OFFSET = 4
_LOCATION_OFFSET = 8


class HipError(ShmemError):
    """A HIP call failed. `call` is the HIP function, `code` the hipError_t
    value and `error_name` its name."""

    def __init__(self, message: str, call: str, code: int, error_name: str):
        super().__init__(message)
        self.call = call
        self.code = code
        self.error_name = error_name


def _import_hip():
    """hip-python's runtime module (`from hip import hip`), imported when first needed."""
    try:
        return importlib.import_module("hip").hip
    except AttributeError as exc:
        raise ImportError(f"the installed 'hip' package has no 'hip' module ({exc}); "
                          f"install hip-python (pip install hip-python)") from exc


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _error_name(hip, code: int) -> str:
    try:
        return hip.hipError_t(code).name
    except (ValueError, AttributeError, TypeError):
        return f"hipError_t({code})"


def _error_text(hip, err) -> str:
    """HIP's own description of `err`, or '' when it cannot be had."""
    try:
        result = hip.hipGetErrorString(err)
        text = result[1] if isinstance(result, tuple) else result
    except Exception:  # the description is a nicety; never hide the real error
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text or ""


def _parse_device(value) -> int:
    """A GPU index from an argument or SHMEMVM_DEVICE: 1, '1', 'cuda:1', torch.device."""
    if isinstance(value, torch.device):
        if value.type != "cuda":
            raise ValueError(f"the hip backend needs a GPU device (torch names ROCm GPUs "
                             f"'cuda'), got {value}")
        return value.index or 0
    if isinstance(value, int):
        index = value
    else:
        text = str(value).strip().lower()
        if not text:
            return 0
        match = re.fullmatch(r"(?:cuda:|hip:)?(\d+)", text)
        if not match:
            raise ValueError(f"cannot read {value!r} as a GPU index; use e.g. 0, 1 or cuda:1 "
                             f"(argument `device` or SHMEMVM_DEVICE)")
        index = int(match.group(1))
    if index < 0:
        raise ValueError(f"GPU index must be >= 0, got {index} "
                         f"(argument `device` or SHMEMVM_DEVICE)")
    return index


# -- bookkeeping of reservations -----------------------------------------------
@dataclass
class _Reservation:
    base: int
    size: int                 # as reserved (rounded up to the granularity)
    #: start -> size of every piece mapped in it
    pieces: dict[int, int] = field(default_factory=dict)
    #: highest mapped end; == base while nothing is mapped
    high_water: int = 0
    #: granule addresses where the filler piece is mapped (holes below high_water)
    fillers: set[int] = field(default_factory=set)

    def __post_init__(self):
        self.high_water = self.base

    @property
    def end(self) -> int:
        return self.base + self.size

    def fillers_in(self, start: int, end: int) -> list[int]:
        return sorted(v for v in self.fillers if start <= v < end)

    def holes(self, granularity: int) -> list[tuple[int, int]]:
        """Ranges [start, end) below the high water mapped to nothing, not even
        the filler (only after a failed filler map)."""
        mapped = dict.fromkeys(self.fillers, granularity) | self.pieces
        gaps, cursor = [], self.base
        for start in sorted(mapped):
            if start > cursor:
                gaps.append((cursor, start))
            cursor = max(cursor, start + mapped[start])
        if cursor < self.high_water:
            gaps.append((cursor, self.high_water))
        return gaps


class HipBackend(VMMBackend):
    name = "hip"
    mpi_accessible = False       # device memory: no GPU-aware MPI is assumed

    @staticmethod
    def is_available() -> bool:
        """hip-python importable, torch built for ROCm, and a GPU with VMM support."""
        try:
            hip = _import_hip()
        except ImportError:
            return False
        if not getattr(torch.version, "hip", None):
            return False
        try:
            err, count = hip.hipGetDeviceCount()
            if int(err) != 0 or count < 1:
                return False
            attribute = hip.hipDeviceAttribute_t.hipDeviceAttributeVirtualMemoryManagementSupported
            for index in range(count):
                err, supported = hip.hipDeviceGetAttribute(attribute, index)
                if int(err) == 0 and supported:
                    return True
        except Exception:  # runtime library missing or broken: not available
            log.debug("HIP runtime not usable", exc_info=True)
        return False

    def __init__(self, device: int | str | torch.device | None = None,
                 granularity: int | str | None = None, local_rank: int = 0, **_ignored):
        """`device`: GPU index (argument, else SHMEMVM_DEVICE, else the node-local
        rank modulo the number of GPUs).
        `granularity`: piece size, a power-of-two multiple of HIP's minimum
        granularity (default: HIP's recommended granularity)."""
        try:
            self._hip = hip = _import_hip()
        except ImportError as exc:
            raise UnsupportedError(f"the hip backend needs hip-python ({exc}); install it with "
                                   f"`pip install hip-python` or choose another backend "
                                   f"(SHMEMVM_BACKEND=host)") from exc
        if not getattr(torch.version, "hip", None):
            raise UnsupportedError(
                f"the hip backend needs a ROCm build of torch, this one is {torch.__version__} "
                f"(torch.version.hip is {getattr(torch.version, 'hip', None)!r}); install torch "
                f"for ROCm or choose another backend (SHMEMVM_BACKEND=cuda or host)")
        self._closed = False
        self._lock = threading.RLock()
        self._reservations: dict[int, _Reservation] = {}
        self._bases: list[int] = []           # sorted reservation bases
        self._filler = None                   # the filler piece, made on first need

        requested = setting("SHMEMVM_DEVICE", device)
        try:
            count = self._call(hip.hipGetDeviceCount(), "hipGetDeviceCount")
        except HipError:
            raise
        except RuntimeError as exc:  # hip-python could not load libamdhip64.so
            raise UnsupportedError(
                f"hip-python is installed but the HIP runtime cannot be loaded ({exc}); install "
                f"ROCm (libamdhip64.so on the library path) or choose another backend "
                f"(SHMEMVM_BACKEND=host)") from exc
        index = _parse_device(requested) if str(requested).strip() else local_rank % max(count, 1)
        if index >= count:
            raise ValueError(f"HIP device {index} does not exist: this process sees {count} "
                             f"device(s); choose 0..{count - 1} (argument `device` or "
                             f"SHMEMVM_DEVICE)")
        self.index = index
        self.device = torch.device("cuda", index)  # torch's name for ROCm GPUs

        attribute = hip.hipDeviceAttribute_t.hipDeviceAttributeVirtualMemoryManagementSupported
        supported = self._call(hip.hipDeviceGetAttribute(attribute, index),
                               "hipDeviceGetAttribute", device=index,
                               attribute="hipDeviceAttributeVirtualMemoryManagementSupported")
        if not supported:
            raise UnsupportedError(f"HIP device {index} does not support virtual memory "
                                   f"management (hipDeviceAttributeVirtualMemoryManagementSupported"
                                   f" is 0); use a GPU and driver with VMM support or choose "
                                   f"another backend (SHMEMVM_BACKEND=host)")

        handle_type = hip.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor
        self._handle_type = handle_type
        self._prop = self._allocation_prop(index, handle_type)
        self._filler_prop = self._allocation_prop(
            index, hip.hipMemAllocationHandleType.hipMemHandleTypeNone)
        self._access = hip.hipMemAccessDesc()
        self._access.location.type = hip.hipMemLocationType.hipMemLocationTypeDevice
        self._access.location.id = index
        self._access.flags = hip.hipMemAccessFlags.hipMemAccessFlagsProtReadWrite

        flags = hip.hipMemAllocationGranularity_flags
        with self._on_device():
            self.min_granularity = int(self._call(
                hip.hipMemGetAllocationGranularity(self._prop,
                                                   flags.hipMemAllocationGranularityMinimum),
                "hipMemGetAllocationGranularity", device=index, option="Minimum"))
            recommended = int(self._call(
                hip.hipMemGetAllocationGranularity(self._prop,
                                                   flags.hipMemAllocationGranularityRecommended),
                "hipMemGetAllocationGranularity", device=index, option="Recommended"))
        self.granularity = self._choose_granularity(self.min_granularity, recommended, granularity)
        log.debug("hip backend on device %d, granularity %d (minimum %d, recommended %d)",
                  index, self.granularity, self.min_granularity, recommended)

    # -- helpers --------------------------------------------------------------
    def _allocation_prop(self, index: int, handle_type):
        hip = self._hip
        prop = hip.hipMemAllocationProp()
        prop.type = hip.hipMemAllocationType.hipMemAllocationTypePinned
        prop.location.type = hip.hipMemLocationType.hipMemLocationTypeDevice
        prop.location.id = index
        if "requestedHandleType" in prop.PROPERTIES():
            prop.requestedHandleType = handle_type
        else:
            # hip-python's wrapper leaves out the anonymous union that holds the
            # handle type; write it where hip_runtime_api.h puts it.
            offset = int(prop.location) - int(prop)
            if offset != _LOCATION_OFFSET:
                raise UnsupportedError(
                    f"this hip-python's hipMemAllocationProp has `location` at offset {offset}, "
                    f"not {_LOCATION_OFFSET}, and no `requestedHandleType` property: cannot "
                    f"request exportable memory; use a hip-python release matching your ROCm")
            ctypes.c_int.from_address(int(prop) + _HANDLE_TYPE_OFFSET).value = int(handle_type)
        return prop

    @staticmethod
    def _choose_granularity(minimum: int, recommended: int, requested) -> int:
        if not _is_pow2(minimum):
            raise UnsupportedError(f"HIP reports a minimum granularity of {minimum} bytes, which "
                                   f"is not a power of two; the heap needs power-of-two pieces")
        if requested is not None:
            value = parse_size(requested)
            if not _is_pow2(value) or value % minimum:
                raise ValueError(f"hip granularity must be a power-of-two multiple of HIP's "
                                 f"minimum granularity ({minimum} bytes), got {value} "
                                 f"(argument `granularity`)")
            return value
        if _is_pow2(recommended) and recommended % minimum == 0:
            return recommended
        return minimum

    def _call(self, result, call: str, hint: str = "", **context):
        """The value(s) of a hip-python call's (err, value...) tuple; a HipError
        naming the call, the hipError_t and the arguments if err is not success."""
        err, values = result[0], result[1:]
        code = int(err)
        if code != 0:
            name = _error_name(self._hip, code)
            text = _error_text(self._hip, err)
            args = ", ".join(f"{k}={v:#x}" if k in ("va", "base") and isinstance(v, int)
                             else f"{k}={v}" for k, v in context.items())
            message = f"{call}({args}) failed with {name} ({code})"
            if text:
                message += f": {text}"
            if hint:
                message += f"; {hint}"
            raise HipError(message, call, code, name)
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    def _on_device(self):
        return _DeviceGuard(self)

    def _check_open(self) -> None:
        if self._closed:
            raise ShmemError(f"the hip backend on device {self.index} is closed")

    def _reservation(self, va: int, size: int, what: str) -> _Reservation:
        """The reservation holding [va, va+size)."""
        i = bisect.bisect_right(self._bases, va) - 1
        if i >= 0:
            res = self._reservations[self._bases[i]]
            if va + size <= res.end:
                return res
        raise ValueError(f"{what} of {size} bytes at {va:#x} is not inside a range from "
                         f"reserve() of this hip backend")

    def _check_aligned(self, va: int, size: int, what: str) -> None:
        g = self.granularity
        if size <= 0 or va % g or size % g:
            raise ValueError(f"{what} needs an address and a size that are positive multiples "
                             f"of the granularity ({g} bytes), got {size} bytes at {va:#x}")

    # -- virtual address space ------------------------------------------------
    def reserve(self, size: int, alignment: int) -> int:
        self._check_open()
        if alignment and not _is_pow2(alignment):
            raise ValueError(f"reserve alignment must be a power of two, got {alignment}")
        g = self.granularity
        rounded = -(-size // g) * g
        if rounded <= 0:
            raise ValueError(f"cannot reserve {size} bytes of address space")
        hip = self._hip
        ptr = self._call(hip.hipMemAddressReserve(rounded, alignment, None, 0),
                         "hipMemAddressReserve", "the address space is exhausted or the "
                         "size is too large; lower SHMEMVM_HEAP_SIZE or SHMEMVM_VA_FACTOR",
                         size=rounded, alignment=alignment)
        va = int(ptr)
        if alignment and va % alignment:
            self._call(hip.hipMemAddressFree(va, rounded), "hipMemAddressFree", va=va,
                       size=rounded)
            raise ShmemError(f"hipMemAddressReserve returned {va:#x} for {rounded} bytes, which "
                             f"is not aligned to the requested {alignment} bytes")
        with self._lock:
            self._reservations[va] = _Reservation(va, rounded)
            bisect.insort(self._bases, va)
        return va

    def unreserve(self, va: int, size: int) -> None:
        with self._lock:
            res = self._reservations.get(va)
            if res is None:
                raise ValueError(f"unreserve at {va:#x}: not the start of a range from reserve() "
                                 f"of this hip backend")
            if res.pieces:
                raise ValueError(f"unreserve at {va:#x}: {len(res.pieces)} piece(s) are still "
                                 f"mapped in it (first at {min(res.pieces):#x}); unmap them first")
            self._unfill(res, res.fillers_in(res.base, res.end))
            self._call(self._hip.hipMemAddressFree(va, res.size), "hipMemAddressFree",
                       va=va, size=res.size)
            del self._reservations[va]
            self._bases.remove(va)

    # -- physical memory ------------------------------------------------------
    def create(self, size: int):
        self._check_open()
        hip = self._hip
        with self._on_device():
            return self._call(hip.hipMemCreate(size, self._prop, 0), "hipMemCreate",
                              "the device is out of memory or the size is not a multiple of "
                              "the granularity; lower SHMEMVM_HEAP_SIZE",
                              size=size, device=self.index, handle_type="PosixFileDescriptor")

    def release(self, handle) -> None:
        self._call(self._hip.hipMemRelease(handle), "hipMemRelease", handle=handle)

    def export_fd(self, handle) -> int:
        self._check_open()
        fd = ctypes.c_int(-1)
        with self._on_device():
            self._call(self._hip.hipMemExportToShareableHandle(
                ctypes.addressof(fd), handle, self._handle_type, 0),
                "hipMemExportToShareableHandle", "the piece must come from create() of this "
                "backend (created with hipMemHandleTypePosixFileDescriptor)",
                handle=handle, handle_type="PosixFileDescriptor")
        if fd.value < 0:
            raise ShmemError(f"hipMemExportToShareableHandle succeeded but returned fd {fd.value}")
        return fd.value

    def import_fd(self, fd: int, size: int):
        self._check_open()
        try:
            actual = os.fstat(fd).st_size
            if 0 < actual < size:
                raise ValueError(f"received memory of {actual} bytes where {size} were expected")
            if fd == 0:
                # HIP takes the fd by value as a void*, and refuses NULL.
                fd_for_hip = os.dup(fd)
                os.close(fd)
                fd = fd_for_hip
            with self._on_device():
                return self._call(self._hip.hipMemImportFromShareableHandle(fd, self._handle_type),
                                  "hipMemImportFromShareableHandle", fd=fd, size=size,
                                  device=self.index, handle_type="PosixFileDescriptor")
        finally:
            os.close(fd)

    # -- mappings -------------------------------------------------------------
    def map(self, va: int, size: int, handle) -> None:
        """Map `handle` at `va`, keeping [base, high water) gap-free (module docstring)."""
        self._check_open()
        self._check_aligned(va, size, "map")
        with self._lock:
            res = self._reservation(va, size, "map")
            for start, length in res.pieces.items():
                if start < va + size and va < start + length:
                    raise ValueError(f"map of {size} bytes at {va:#x} overlaps the piece "
                                     f"already mapped at {start:#x} ({length} bytes)")
            old_high = res.high_water
            try:
                self._unfill(res, res.fillers_in(va, va + size))
                self._call(self._hip.hipMemMap(va, size, 0, handle, 0), "hipMemMap",
                           va=va, size=size, handle=handle)
            except BaseException:
                self._fill(res, va, min(va + size, old_high))  # put the fillers back
                raise
            try:
                self._fill(res, old_high, va)  # the gap below a piece mapped above
            except BaseException:
                self._call(self._hip.hipMemUnmap(va, size), "hipMemUnmap", va=va, size=size)
                raise
            res.pieces[va] = size
            res.high_water = max(old_high, va + size)

    def unmap(self, va: int, size: int) -> None:
        """Unmap whole pieces; a hole left below the high water gets the filler."""
        with self._lock:
            res = self._reservation(va, size, "unmap")
            covered = sorted(s for s in res.pieces if va <= s < va + size)
            cursor = va
            for start in covered:
                if start != cursor:
                    break
                cursor = start + res.pieces[start]
            if not covered or cursor != va + size:
                raise ValueError(f"unmap of {size} bytes at {va:#x} does not cover whole mapped "
                                 f"pieces without gaps (mapped here: "
                                 f"{[(hex(s), res.pieces[s]) for s in covered] or 'nothing'})")
            # Unmapping is not stream-ordered: let queued work that may touch
            # the piece finish first.
            with self._on_device():
                self._call(self._hip.hipDeviceSynchronize(), "hipDeviceSynchronize",
                           device=self.index)
            self._call(self._hip.hipMemUnmap(va, size), "hipMemUnmap", va=va, size=size)
            for start in covered:
                del res.pieces[start]
            top = max((s + n for s, n in res.pieces.items()), default=res.base)
            if va + size <= top:
                self._fill(res, va, va + size)  # a hole below a remaining piece
            else:  # the topmost piece went: so do the fillers between it and the new top
                res.high_water = top
                self._unfill(res, res.fillers_in(top, va))

    def set_access(self, va: int, size: int) -> None:
        """Read/write access from this device, set over [reservation base, high
        water) as ROCm requires (fillers included); [va, va+size) must be mapped."""
        self._check_open()
        with self._lock:
            res = self._reservation(va, size, "set_access")
            if va + size > res.high_water:
                raise ValueError(f"set_access of {size} bytes at {va:#x}: only "
                                 f"{res.high_water - res.base} bytes from {res.base:#x} are "
                                 f"mapped; map the range first")
            span = res.high_water - res.base
            result = self._hip.hipMemSetAccess(res.base, span, self._access, 1)
            hint = ("ROCm sets access only from the reservation base over the whole mapped "
                    "prefix")
            holes = res.holes(self.granularity) if int(result[0]) != 0 else []
            if holes:
                hint += ("; the prefix has holes (a filler map failed earlier) at " +
                         ", ".join(f"{a:#x}..{b:#x}" for a, b in holes) +
                         ": map them before setting access")
            self._call(result, "hipMemSetAccess", hint, va=res.base, size=span,
                       device=self.index, flags="ProtReadWrite", requested=f"{va:#x}+{size}")

    # -- the filler -----------------------------------------------------------
    def _fill(self, res: _Reservation, start: int, end: int) -> None:
        """Map the filler into every granule of [start, end) that has none;
        all or nothing. [start, end) must hold no real piece."""
        if self._closed:
            return  # nothing sets access after close(); its fillers are gone
        g = self.granularity
        todo = [v for v in range(start, end, g) if v not in res.fillers]
        if not todo:
            return
        if self._filler is None:
            with self._on_device():
                self._filler = self._call(
                    self._hip.hipMemCreate(g, self._filler_prop, 0), "hipMemCreate",
                    "creating the filler piece that keeps the mapped prefix gap-free; the "
                    "device is out of memory", size=g, device=self.index, handle_type="None")
        done = []
        try:
            for v in todo:
                self._call(self._hip.hipMemMap(v, g, 0, self._filler, 0), "hipMemMap",
                           "mapping the filler piece into a hole below the high water "
                           "(ROCm needs [base, high water) gap-free)",
                           va=v, size=g, handle=self._filler, piece="filler")
                res.fillers.add(v)
                done.append(v)
        except BaseException:
            self._unfill(res, done)
            raise

    def _unfill(self, res: _Reservation, vas) -> None:
        """Unmap the filler granules at `vas`, one call each."""
        g = self.granularity
        for v in vas:
            self._call(self._hip.hipMemUnmap(v, g), "hipMemUnmap",
                       "unmapping a filler granule", va=v, size=g, piece="filler")
            res.fillers.discard(v)

    def mapped_prefix(self, va: int) -> tuple[int, int]:
        """(base, high water) of the reservation holding `va` (for tests and debugging)."""
        with self._lock:
            res = self._reservation(va, 0, "lookup")
            return res.base, res.high_water

    # -- data -----------------------------------------------------------------
    def tensor(self, va: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return _dlpack.tensor_at(va, shape, dtype, self.device, device_type=_dlpack.KDL_ROCM)

    def _current_stream(self):
        return torch.cuda.current_stream(self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, blocking: bool):
        """Copy engine, ordered on the current stream of this device. A
        non-blocking copy returns its stream, which the context that issued it
        keeps and synchronizes at its quiet() (completion.py)."""
        stream = self._current_stream()
        dst.copy_(src, non_blocking=True)
        if blocking:
            stream.synchronize()
            return None
        return stream

    def synchronize(self) -> None:
        """Wait for the current stream (kernels and copies queued on it)."""
        self._current_stream().synchronize()

    def close(self) -> None:
        """Unmap every filler granule left (reservations still alive keep their
        real pieces) and release the filler piece."""
        if not self._closed:
            with self._lock:
                for res in self._reservations.values():
                    self._unfill(res, res.fillers_in(res.base, res.end))
                if self._filler is not None:
                    self.release(self._filler)
                    self._filler = None
                self._closed = True

    def describe(self) -> dict:
        info = super().describe()
        info.update(device_index=self.index, min_granularity=self.min_granularity,
                    cumulative_access=True, torch_hip=getattr(torch.version, "hip", None))
        return info


class _DeviceGuard:
    """Makes the backend's GPU current for the HIP calls inside, then restores
    the previous one (hipMemCreate and the import allocate on the current device)."""

    __slots__ = ("backend", "previous")

    def __init__(self, backend: HipBackend):
        self.backend = backend
        self.previous = None

    def __enter__(self):
        be = self.backend
        current = be._call(be._hip.hipGetDevice(), "hipGetDevice")
        if current != be.index:
            be._call(be._hip.hipSetDevice(be.index), "hipSetDevice", device=be.index)
            self.previous = current
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            be = self.backend
            be._call(be._hip.hipSetDevice(self.previous), "hipSetDevice", device=self.previous)
        return False
