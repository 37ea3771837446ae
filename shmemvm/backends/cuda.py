"""NVIDIA GPU memory through the driver's virtual-memory management (VMM),
called through cuda-bindings (`cuda.bindings.driver`).

VA is a cuMemAddressReserve range. A physical piece is a cuMemCreate handle of
pinned device memory on this PE's GPU, created exportable as a POSIX file
descriptor; mapping is cuMemMap plus cuMemSetAccess (read/write for the LOCAL
device, also for peer pieces mapped here). Exporting is
cuMemExportToShareableHandle; a peer imports the fd it receives with
cuMemImportFromShareableHandle and maps it the same way.

The backend works in the device's primary context, the one torch uses, so
tensors made here and torch kernels see the same address space. Tensor views
name the local device (see _dlpack.py), which is what makes memory that
physically lives on a peer GPU usable from torch.

Every driver error raises CudaDriverError naming the call, its arguments and
the CUresult.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import torch

from ..config import gpu_index, setting
from ..errors import ShmemError, UnsupportedError
from .base import VMMBackend

try:  # cuda-bindings >= 12.6
    from cuda.bindings import driver
except ImportError:  # pragma: no cover - older cuda-python
    try:
        from cuda import cuda as driver
    except ImportError:
        driver = None

log = logging.getLogger("shmemvm")


class CudaDriverError(ShmemError):
    """A CUDA driver call failed; `call` and `result` name what and how."""

    def __init__(self, message: str, call: str = "", result=None):
        super().__init__(message)
        self.call = call
        self.result = result


def _result_name(err) -> str:
    name = getattr(err, "name", None)
    if name:
        return name
    try:
        e, text = driver.cuGetErrorName(err)
        return text.decode() if e == driver.CUresult.CUDA_SUCCESS else str(err)
    except Exception:  # noqa: BLE001 - best effort for a message
        return str(err)


def _result_text(err) -> str:
    try:
        e, text = driver.cuGetErrorString(err)
        return text.decode() if e == driver.CUresult.CUDA_SUCCESS and text else ""
    except Exception:  # noqa: BLE001
        return ""


def _fmt(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 4096:
        return f"{value:#x}"
    return repr(value) if isinstance(value, str) else str(value)


def _check(result, call: str, hint: str = "", **args):
    """Unpack a cuda-bindings result tuple; raise CudaDriverError on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in args.items())
        text = _result_text(err)
        message = f"{call}({shown}) failed with {_result_name(err)}"
        if text:
            message += f" ({text})"
        if hint:
            message += f"; {hint}"
        raise CudaDriverError(message, call, err)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


_POSIX_FD = None  # filled in when the bindings are present
#: the current stream's cudaStream_t as an int (torch's CUDA builds)
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
if driver is not None:
    _POSIX_FD = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


@dataclass(frozen=True)
class ExternalPiece:
    """A physical piece of someone else's VMM memory: mapped at `va` (in the
    owner's address space) for `size` bytes; `handle` holds one reference."""
    va: int
    size: int
    handle: int


class _Refused(Exception):
    """Why external memory cannot be imported (turned into UnsupportedError)."""


COPY_IN = ("Allocate a symmetric tensor with the same shape and dtype and copy into it "
           "(x = heap.empty(t.shape, t.dtype); x.copy_(t)); a device-local copy runs at about "
           "2 TB/s on H200")


def external_refusal(tensor: torch.Tensor, reason: str) -> UnsupportedError:
    """The error for memory that cannot be imported, with the way to copy it in."""
    return UnsupportedError(
        f"the cuda backend cannot import the memory of the tensor at {tensor.data_ptr():#x} "
        f"on {tensor.device}: {reason}. {COPY_IN}")


def _name(drv, err) -> str:
    name = getattr(err, "name", None)
    return name if name else str(err)


def external_pieces(drv, ptr: int, nbytes: int, device: int, granularity: int,
                    tensor: torch.Tensor) -> list[ExternalPiece]:
    """The VMM pieces covering [ptr, ptr + nbytes), found through `drv` (the
    cuda-bindings driver module, or a stand-in with the same calls in tests).

    Pieces are found by retaining the handle mapped at each granularity step:
    the driver hands back the same handle value for every address of one
    allocation, so a run of equal handles is one piece; the first and the last
    piece are followed past the range to their own ends, because a piece can
    only be mapped whole (cuMemMap takes no offset into a handle).

    Returns:
        The pieces in address order, contiguous, each holding one reference
        (released by the caller).

    Raises:
        UnsupportedError: not VMM memory, a piece that cannot be exported as a
            POSIX fd, memory of another GPU, or pieces off the granularity.
    """
    ok = drv.CUresult.CUDA_SUCCESS
    posix = _as_int(drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    held: list[int] = []   # every reference taken, given back on failure

    def retain(addr: int) -> int | None:
        err, *rest = drv.cuMemRetainAllocationHandle(addr)
        if err != ok:
            return None
        held.append(int(rest[0]))
        return held[-1]

    def drop_last() -> None:
        drv.cuMemRelease(held.pop())

    try:
        first = ptr - ptr % granularity
        handle = retain(first)
        if handle is None:
            err, *_ = drv.cuMemRetainAllocationHandle(ptr)
            rng, *_ = drv.cuMemGetAddressRange(ptr)
            known = ("" if rng == ok else f"; cuMemGetAddressRange failed too ({_name(drv, rng)}), "
                     f"so it is not memory the driver knows in this context")
            raise _Refused(
                f"it is not VMM memory (cuMemRetainAllocationHandle failed with "
                f"{_name(drv, err)}{known}): torch's default caching allocator uses cudaMalloc; "
                f"run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for torch to "
                f"allocate VMM memory that can be shared")
        start = first
        while start >= granularity:  # back to the first piece's own start
            before = retain(start - granularity)
            if before is None:
                break
            drop_last()
            if before != handle:
                break
            start -= granularity
        pieces: list[ExternalPiece] = []
        addr, end = first + granularity, ptr + nbytes
        while True:  # forward, one step at a time, to the last piece's end
            nxt = retain(addr)
            if nxt is not None and nxt == handle:
                drop_last()
                addr += granularity
                continue
            pieces.append(ExternalPiece(start, addr - start, handle))
            if nxt is not None and addr < end:
                start, handle = addr, nxt
                addr += granularity
                continue
            if nxt is not None:
                drop_last()            # the piece after the range: not ours
            if addr < end:
                raise _Refused(f"its storage ({nbytes} bytes from {ptr:#x}) is not mapped "
                               f"contiguously: nothing is mapped at {addr:#x}")
            break
        for piece in pieces:
            _check_piece(drv, piece, posix, device, granularity)
        return pieces
    except _Refused as exc:
        for handle in held:
            drv.cuMemRelease(handle)
        raise external_refusal(tensor, str(exc)) from None
    except BaseException:
        for handle in held:
            drv.cuMemRelease(handle)
        raise


def _as_int(value) -> int:
    """A driver enum or flag word (cuda-bindings enums, or a plain int) as an int."""
    return int(getattr(value, "value", value))


def _check_piece(drv, piece: ExternalPiece, posix: int, device: int, granularity: int) -> None:
    """Refuse a piece that cannot be exported to peers or mapped in the heap."""
    err, *prop = drv.cuMemGetAllocationPropertiesFromHandle(piece.handle)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise _Refused(f"cuMemGetAllocationPropertiesFromHandle on the piece at {piece.va:#x} "
                       f"failed with {_name(drv, err)}")
    prop = prop[0]
    requested = _as_int(prop.requestedHandleTypes)
    if not requested & posix:
        raise _Refused(
            f"the VMM piece at {piece.va:#x} ({piece.size} bytes) was created without POSIX "
            f"file descriptor export (requestedHandleTypes={requested:#x}), so it cannot be "
            f"shared with other processes; torch creates its expandable segments exportable "
            f"only where it may share them (its IPC support for expandable segments)")
    location = _as_int(prop.location.id)
    if location != device:
        raise _Refused(f"the VMM piece at {piece.va:#x} lives on GPU {location}, the heap "
                       f"on GPU {device}")
    if piece.va % granularity or piece.size % granularity:
        raise _Refused(f"the VMM piece at {piece.va:#x} ({piece.size} bytes) is not aligned "
                       f"to the heap's granularity {granularity}")


class CudaBackend(VMMBackend):
    name = "cuda"
    mpi_accessible = False       # device memory: no GPU-aware MPI is assumed

    @staticmethod
    def is_available() -> bool:
        return driver is not None and torch.cuda.is_available()

    def __init__(self, device: int | None = None, local_rank: int = 0, **_ignored):
        if driver is None:
            raise ImportError("the cuda backend needs cuda-bindings: pip install cuda-bindings "
                              "(or choose another backend with SHMEMVM_BACKEND=host)")
        if not torch.cuda.is_available():
            raise UnsupportedError("the cuda backend needs a CUDA GPU and a CUDA build of torch; "
                                   "torch.cuda.is_available() is False (use SHMEMVM_BACKEND=host)")
        count = torch.cuda.device_count()
        if device is None:  # argument, then SHMEMVM_DEVICE, then one GPU per node-local PE
            env = gpu_index(setting("SHMEMVM_DEVICE"))   # '1', 'cuda:1' or empty
            device = env if env is not None else local_rank % count
        index = int(device)
        if not 0 <= index < count:
            raise ValueError(f"CUDA device {index} does not exist: this process sees {count} "
                             f"GPU(s) (check SHMEMVM_DEVICE and CUDA_VISIBLE_DEVICES)")
        self.index = index
        self.device = torch.device("cuda", index)
        self._closed = False
        self._local = threading.local()

        # Let torch create (or pick up) the device's primary context first, then
        # take our own reference to that same context.
        torch.cuda.set_device(index)
        torch.cuda.init()
        torch.cuda.current_stream(self.device)
        _check(driver.cuInit(0), "cuInit", flags=0)
        self._cudev = _check(driver.cuDeviceGet(index), "cuDeviceGet", ordinal=index)
        self._ctx = _check(driver.cuDevicePrimaryCtxRetain(self._cudev),
                           "cuDevicePrimaryCtxRetain", device=index)
        self._ensure_context()

        for attr, what in (
            ("CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", "virtual memory management"),
            ("CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
             "POSIX file descriptor export of VMM memory"),
        ):
            value = _check(driver.cuDeviceGetAttribute(getattr(driver.CUdevice_attribute, attr),
                                                       self._cudev),
                           "cuDeviceGetAttribute", attribute=attr, device=index)
            if not value:
                self._release_context()
                raise UnsupportedError(f"CUDA device {index} does not support {what} ({attr} "
                                       f"is 0); use SHMEMVM_BACKEND=host")

        prop = driver.CUmemAllocationProp()
        prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = index
        prop.requestedHandleTypes = _POSIX_FD
        self._prop = prop
        self.granularity = int(_check(
            driver.cuMemGetAllocationGranularity(
                prop, driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            "cuMemGetAllocationGranularity", device=index, option="RECOMMENDED"))

        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = index
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = [access]
        log.debug("cuda backend on device %d, granularity %d", index, self.granularity)

    # -- context ---------------------------------------------------------------
    def _ensure_context(self) -> None:
        """Make sure the calling thread has a context (ours if it has none)."""
        if getattr(self._local, "ready", False):
            return
        current = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if current is None or int(current) == 0:
            _check(driver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent", device=self.index)
        self._local.ready = True

    def _release_context(self) -> None:
        if self._ctx is not None:
            self._ctx = None
            _check(driver.cuDevicePrimaryCtxRelease(self._cudev), "cuDevicePrimaryCtxRelease",
                   device=self.index)

    def _check_open(self) -> None:
        if self._closed:
            raise ShmemError(f"the cuda backend on device {self.index} is closed")
        self._ensure_context()

    # -- virtual address space ---------------------------------------------------
    def reserve(self, size: int, alignment: int) -> int:
        self._check_open()
        ptr = _check(driver.cuMemAddressReserve(size, alignment, 0, 0), "cuMemAddressReserve",
                     size=size, alignment=alignment)
        return int(ptr)

    def unreserve(self, va: int, size: int) -> None:
        self._ensure_context()
        _check(driver.cuMemAddressFree(va, size), "cuMemAddressFree", va=va, size=size)

    # -- physical memory ------------------------------------------------------
    def create(self, size: int) -> int:
        self._check_open()
        result = driver.cuMemCreate(size, self._prop, 0)
        hint = ""
        if result[0] == driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            free, total = torch.cuda.mem_get_info(self.device)
            hint = (f"GPU {self.index} has {free} of {total} bytes free; lower the heap size "
                    f"(SHMEMVM_HEAP_SIZE) or free other GPU memory (torch.cuda.empty_cache())")
        return int(_check(result, "cuMemCreate", hint, size=size, device=self.index,
                          handle_type="POSIX_FILE_DESCRIPTOR"))

    def release(self, handle: int) -> None:
        self._ensure_context()
        _check(driver.cuMemRelease(handle), "cuMemRelease", handle=handle)

    def export_fd(self, handle: int) -> int:
        self._check_open()
        return int(_check(driver.cuMemExportToShareableHandle(handle, _POSIX_FD, 0),
                          "cuMemExportToShareableHandle", handle=handle,
                          handle_type="POSIX_FILE_DESCRIPTOR"))

    def import_fd(self, fd: int, size: int) -> int:
        try:
            self._check_open()
            return int(_check(driver.cuMemImportFromShareableHandle(fd, _POSIX_FD),
                              "cuMemImportFromShareableHandle", fd=fd, size=size,
                              handle_type="POSIX_FILE_DESCRIPTOR"))
        finally:
            os.close(fd)  # the driver holds its own reference to the memory now

    # -- mappings -------------------------------------------------------------
    def map(self, va: int, size: int, handle: int) -> None:
        self._check_open()
        _check(driver.cuMemMap(va, size, 0, handle, 0), "cuMemMap",
               va=va, size=size, offset=0, handle=handle)

    def unmap(self, va: int, size: int) -> None:
        self._ensure_context()
        # Unmapping is not stream-ordered: let queued work on this device that
        # may still touch the range finish first (torch does the same before
        # unmapping expandable segments).
        torch.cuda.synchronize(self.device)
        _check(driver.cuMemUnmap(va, size), "cuMemUnmap", va=va, size=size)

    def set_access(self, va: int, size: int) -> None:
        self._check_open()
        _check(driver.cuMemSetAccess(va, size, self._access, 1), "cuMemSetAccess",
               va=va, size=size, device=self.index, flags="PROT_READWRITE")

    # -- data -----------------------------------------------------------------
    def copy(self, dst: torch.Tensor, src: torch.Tensor, blocking: bool):
        """Copy engine, ordered on the current stream of this device. A
        non-blocking copy returns its stream, which the context that issued it
        keeps and synchronizes at its quiet() (completion.py)."""
        dst.copy_(src, non_blocking=True)
        if blocking:
            self.synchronize()
            return None
        return torch.cuda.current_stream(self.device)

    def synchronize(self) -> None:
        """Wait for the current stream (kernels and copies queued on it)."""
        if _current_raw_stream is None:
            torch.cuda.current_stream(self.device).synchronize()
        else:  # the raw handle: no torch Stream object made (a few us of a small put)
            _check(driver.cuStreamSynchronize(_current_raw_stream(self.index)),
                   "cuStreamSynchronize")

    def import_external(self, tensor: torch.Tensor) -> list["ExternalPiece"]:
        """The physical pieces under `tensor`'s storage, where they can be shared.

        Memory torch allocates with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        is driver VMM memory: torch maps its own cuMemCreate pieces (2 MiB for
        small blocks, 20 MiB for large ones) one after the other in one VA
        range, so a storage may start inside one piece and span several.
        Those pieces can be exported (cuMemExportToShareableHandle) when torch
        created them exportable as POSIX fds, which torch does when it may
        share expandable segments over IPC.

        Measured before (tools/cuda_dmabuf_probe.py, 2xH200, driver 580): memory
        of the default allocator (cudaMalloc) is not VMM memory, and its DMA-BUF
        export does not import as a VMM handle (CUDA_ERROR_UNKNOWN).

        Returns:
            The pieces covering [storage start, storage end), in address order,
            each with a retained handle the caller must give back with release().

        Raises:
            UnsupportedError: the memory is not CUDA VMM memory of this device
                that can be exported as a POSIX fd; the message says what the
                driver answered and how to copy into a symmetric tensor instead.
        """
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if tensor.device.type != "cuda":
            raise external_refusal(tensor, "it is not CUDA memory")
        if tensor.device.index != self.index:
            raise external_refusal(tensor, f"it is on {tensor.device}, this heap on {self.device}")
        if nbytes == 0:
            raise external_refusal(tensor, "its storage holds no bytes")
        self._check_open()
        torch.cuda.synchronize(self.device)  # torch maps pieces as it goes; see them all
        return external_pieces(driver, ptr, nbytes, self.index, self.granularity, tensor)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._release_context()
        except CudaDriverError as exc:  # driver already torn down at exit
            log.debug("releasing the primary context: %s", exc)

    def describe(self) -> dict:
        info = super().describe()
        info["device_name"] = torch.cuda.get_device_name(self.index)
        version = driver.cuDriverGetVersion()
        if version[0] == driver.CUresult.CUDA_SUCCESS:
            info["driver_version"] = int(version[1])
        return info
