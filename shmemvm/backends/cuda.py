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

import torch

from ..config import setting
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
if driver is not None:
    _POSIX_FD = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


class CudaBackend(VMMBackend):
    name = "cuda"
    cumulative_access = False
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
            env = setting("SHMEMVM_DEVICE").strip()
            device = int(env) if env else local_rank % count
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
        stream = torch.cuda.current_stream(self.device)
        dst.copy_(src, non_blocking=True)
        if blocking:
            stream.synchronize()
            return None
        return stream

    def synchronize(self) -> None:
        """Wait for the current stream (kernels and copies queued on it)."""
        torch.cuda.current_stream(self.device).synchronize()

    def import_external(self, tensor: torch.Tensor) -> tuple[int, int]:
        """Memory from torch's caching allocator cannot become a heap piece.

        Measured on 2xH200, driver 580.159, cuda-bindings 13.3, torch 2.11
        (tools/cuda_dmabuf_probe.py):
        - default caching allocator (cudaMalloc): the allocation exports as a
          DMA-BUF fd with cuMemGetHandleForAddressRange(DMA_BUF_FD), but
          cuMemImportFromShareableHandle(fd, POSIX_FILE_DESCRIPTOR) fails with
          CUDA_ERROR_UNKNOWN -- also for a DMA-BUF of our own cuMemCreate
          memory: a DMA-BUF fd is not an importable VMM handle.
          cuMemRetainAllocationHandle fails (CUDA_ERROR_INVALID_VALUE): not VMM.
        - PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: torch maps its own
          cuMemCreate pieces (POSIX fd type, 20 MiB each for large blocks);
          cuMemRetainAllocationHandle + cuMemExportToShareableHandle + import +
          cuMemMap at a second VA works and shows the tensor's bytes. But the
          tensor sits at an arbitrary offset inside such a piece (cuMemMap
          cannot map from an offset) and large tensors span several pieces, so
          (handle, size) cannot describe it; the heap protocol has no place
          for it yet.
        """
        ptr = tensor.data_ptr()
        where = f"tensor at {ptr:#x} on {tensor.device}"
        if tensor.device.type != "cuda":
            reason = "it is not CUDA memory"
        else:
            reason = self._probe_external(ptr, tensor.untyped_storage().nbytes())
        raise UnsupportedError(
            f"the cuda backend cannot import memory it did not create ({where}): {reason}. "
            f"Allocate a symmetric tensor with the same shape and dtype and copy into it "
            f"(t = heap.empty(x.shape, x.dtype); t.copy_(x)); a device-local copy runs at "
            f"about 2 TB/s on H200")

    def _probe_external(self, ptr: int, nbytes: int) -> str:
        """Say why the allocation holding `ptr` cannot be imported, trying the
        DMA-BUF route where the memory is not VMM memory."""
        self._check_open()
        result = driver.cuMemGetAddressRange(ptr)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            return f"cuMemGetAddressRange({ptr:#x}) failed with {_result_name(result[0])}"
        base, size = int(result[1]), int(result[2])
        retained = driver.cuMemRetainAllocationHandle(ptr)
        if retained[0] == driver.CUresult.CUDA_SUCCESS:
            _check(driver.cuMemRelease(retained[1]), "cuMemRelease", handle=int(retained[1]))
            return (f"it is VMM memory (e.g. torch's expandable segments), but it lies at offset "
                    f"{ptr - base} of a {size}-byte piece at {base:#x}"
                    + (" and extends past it" if ptr + nbytes > base + size else "")
                    + "; the heap maps whole pieces at granularity-aligned offsets, so it cannot "
                      "take part of someone else's piece")
        page = os.sysconf("SC_PAGE_SIZE")
        length = -(-size // page) * page
        result = driver.cuMemGetHandleForAddressRange(
            base, length, driver.CUmemRangeHandleType.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            return (f"it is not VMM memory, and cuMemGetHandleForAddressRange({base:#x}, "
                    f"{length}, DMA_BUF_FD) failed with {_result_name(result[0])}")
        fd = int(result[1])
        try:
            imported = driver.cuMemImportFromShareableHandle(fd, _POSIX_FD)
        finally:
            os.close(fd)
        if imported[0] == driver.CUresult.CUDA_SUCCESS:
            # A future driver may accept it; the heap has no way yet to place a
            # foreign allocation in itself, so still refuse.
            _check(driver.cuMemRelease(imported[1]), "cuMemRelease", handle=int(imported[1]))
            return ("the driver imported its DMA-BUF export, but placing a foreign allocation "
                    "in the symmetric heap is not implemented")
        return (f"it is not VMM memory (cudaMalloc); its allocation ({size} bytes at {base:#x}) "
                f"exports as a DMA-BUF fd with cuMemGetHandleForAddressRange, but "
                f"cuMemImportFromShareableHandle(fd, POSIX_FILE_DESCRIPTOR) rejects that fd with "
                f"{_result_name(imported[0])}: the driver imports only fds made by "
                f"cuMemExportToShareableHandle")

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
