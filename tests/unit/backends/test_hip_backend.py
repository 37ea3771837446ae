"""The hip backend.

Most tests run anywhere: a stand-in for hip-python's `hip.hip` module
(FakeHip) is put in sys.modules, records every call and models the ROCm rule
that hipMemSetAccess works only from a reservation's base over a gap-free
mapped prefix. Where hip-python is installed but no HIP runtime is, the same
flows also push every call through hip-python's real functions, which convert
the arguments and then fail to load libamdhip64.so: that checks the argument
forms (addresses, enums, struct wrappers) against the real bindings. Where
hip-python is installed those checks run or fail, never skip: a hip-python
that does not import fails this module, and refusals that the backend's broad
excepts would swallow (is_available, the error text) are collected in
FakeHip.problems and checked after each test.
tests/gpu/test_hip_on_amd_gpu.py runs only with an AMD GPU, a ROCm build of
torch and hip-python.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import gc
import importlib.util
import os
import random
import sys
import types

import pytest
import torch

import shmemvm.backends
from shmemvm.backends import _dlpack
from shmemvm.backends import hip as hipmod
from shmemvm.backends.hip import HipBackend, HipError
from shmemvm.memory.buddy import Segment
from shmemvm.errors import HeapExhaustedError, ShmemError, UnsupportedError
from shmemvm.node.peers import PeerTable
from shmemvm.memory.vmm import VMemPow2Allocator

KiB, MiB = 1 << 10, 1 << 20
G = 2 * MiB  # the fake's default granularity


# -- a stand-in for hip-python -------------------------------------------------
class hipError_t(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorOutOfMemory = 2
    hipErrorNoDevice = 100
    hipErrorInvalidDevice = 101
    hipErrorNotSupported = 801


class hipMemAllocationType(enum.IntEnum):
    hipMemAllocationTypeInvalid = 0
    hipMemAllocationTypePinned = 1


class hipMemLocationType(enum.IntEnum):
    hipMemLocationTypeInvalid = 0
    hipMemLocationTypeDevice = 1


class hipMemAllocationHandleType(enum.IntEnum):
    hipMemHandleTypeNone = 0
    hipMemHandleTypePosixFileDescriptor = 1


class hipMemAccessFlags(enum.IntEnum):
    hipMemAccessFlagsProtNone = 0
    hipMemAccessFlagsProtRead = 1
    hipMemAccessFlagsProtReadWrite = 3


class hipMemAllocationGranularity_flags(enum.IntEnum):
    hipMemAllocationGranularityMinimum = 0
    hipMemAllocationGranularityRecommended = 1


class hipDeviceAttribute_t(enum.IntEnum):
    hipDeviceAttributeVirtualMemoryManagementSupported = 1000


class _Location:
    def __init__(self):
        self.type = hipMemLocationType.hipMemLocationTypeInvalid
        self.id = 0


class _FakeProp:
    """Like hip-python releases that expose `requestedHandleType` directly."""

    def __init__(self):
        self.type = hipMemAllocationType.hipMemAllocationTypeInvalid
        self.requestedHandleType = hipMemAllocationHandleType.hipMemHandleTypeNone
        self.location = _Location()

    @staticmethod
    def PROPERTIES():
        return ["type", "requestedHandleType", "location", "win32HandleMetaData", "allocFlags"]


class _FakeAccessDesc:
    def __init__(self):
        self.location = _Location()
        self.flags = hipMemAccessFlags.hipMemAccessFlagsProtNone


class _Pointer:
    """hip-python returns addresses as Pointer objects; only int() gives the address."""

    def __init__(self, address):
        self._address = address

    def __int__(self):
        return self._address


SUCCESS = hipError_t.hipSuccess
INVALID = hipError_t.hipErrorInvalidValue


class FakeHip:
    """Records every call as (name, args). `fail[name] = code` makes that call
    return the error code. With `real` (hip-python's `hip.hip`), enums and
    structs are hip-python's own and each call is first made through the real
    function, which must get as far as loading the HIP runtime."""

    def __init__(self, device_count=2, granularity=(G, G), vmm=True, real=None):
        self.real = real
        types_from = real if real is not None else sys.modules[__name__]
        for name in ("hipError_t", "hipMemAllocationType", "hipMemLocationType",
                     "hipMemAllocationHandleType", "hipMemAccessFlags",
                     "hipMemAllocationGranularity_flags", "hipDeviceAttribute_t"):
            setattr(self, name, getattr(types_from, name))
        if real is not None:
            self.hipMemAllocationProp = real.hipMemAllocationProp
            self.hipMemAccessDesc = real.hipMemAccessDesc
        else:
            self.hipMemAllocationProp = _FakeProp
            self.hipMemAccessDesc = _FakeAccessDesc
        self.device_count = device_count
        self.granularity = granularity
        self.vmm = vmm
        self.current = 0
        self.calls: list[tuple[str, tuple]] = []
        self.fail: dict[str, int] = {}
        self.misalign = False
        self.next_va = 0x7F00_0000_0000
        self.next_handle = 0x1000
        self.reservations: dict[int, int] = {}     # base -> size
        self.mapped: dict[int, tuple[int, int]] = {}  # va -> (size, handle)
        self.handles: dict[int, int] = {}           # handle -> size (live allocations)
        self.exportable: set[int] = set()           # handles created for export or imported
        self.created_on: dict[int, int] = {}        # handle -> current device at creation
        self.access: list[tuple[int, int, int, int]] = []  # (va, size, device, flags)
        #: with `real`: the calls hip-python accepted, and what it refused. The
        #: refusals are also kept here because the backend catches broad
        #: exceptions in places (is_available, the error text), where a raised
        #: AssertionError alone would vanish; the fixture checks this list.
        self.real_checked: set[str] = set()
        self.problems: list[str] = []

    # bookkeeping
    def _enter(self, name, *args):
        self.calls.append((name, args))
        if self.real is not None:
            self._check_with_real(name, args)
        return self.fail.get(name)

    def _check_with_real(self, name, args):
        """Make the call through hip-python's real function, which must convert the
        arguments and then fail only for want of libamdhip64.so. Most functions
        raise that failure; some (hipGetErrorString) only report it as an
        unraisable exception and return, which counts the same."""
        unraisable = []
        hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
        try:
            getattr(self.real, name)(*args)
        except RuntimeError as exc:
            problem = None if "dlopen" in str(exc) else f"hip-python refused {name}{args}: {exc}"
        except Exception as exc:  # TypeError, ...: the argument forms are wrong
            problem = f"hip-python refused {name}{args}: {type(exc).__name__}: {exc}"
        else:
            load_failed = any(isinstance(u.exc_value, RuntimeError) and "dlopen" in
                              str(u.exc_value) for u in unraisable)
            problem = None if load_failed else f"{name} reached a HIP runtime"
        finally:
            sys.unraisablehook = hook
        if problem is not None:
            self.problems.append(problem)
            raise AssertionError(problem)
        self.real_checked.add(name)

    def names(self):
        return [name for name, _ in self.calls]

    def args_of(self, name):
        return [args for n, args in self.calls if n == name]

    def _handle_type_of(self, prop):
        if isinstance(prop, _FakeProp):
            return int(prop.requestedHandleType)
        return ctypes.c_int.from_address(int(prop) + 4).value

    # device
    def hipGetDeviceCount(self):
        err = self._enter("hipGetDeviceCount")
        return (err, None) if err else (SUCCESS, self.device_count)

    def hipGetDevice(self):
        err = self._enter("hipGetDevice")
        return (err, None) if err else (SUCCESS, self.current)

    def hipSetDevice(self, index):
        err = self._enter("hipSetDevice", index)
        if err:
            return (err,)
        if not 0 <= index < self.device_count:
            return (hipError_t.hipErrorInvalidDevice,)
        self.current = index
        return (SUCCESS,)

    def hipDeviceGetAttribute(self, attribute, index):
        err = self._enter("hipDeviceGetAttribute", attribute, index)
        return (err, None) if err else (SUCCESS, int(self.vmm))

    def hipDeviceSynchronize(self):
        return (self._enter("hipDeviceSynchronize") or SUCCESS,)

    def hipGetErrorString(self, err):
        self._enter("hipGetErrorString", err)
        return (SUCCESS, f"fake description of {int(err)}".encode())

    # VMM
    def hipMemGetAllocationGranularity(self, prop, option):
        err = self._enter("hipMemGetAllocationGranularity", prop, option)
        if err:
            return (err, None)
        return (SUCCESS, self.granularity[int(option)])

    def hipMemAddressReserve(self, size, alignment, addr, flags):
        err = self._enter("hipMemAddressReserve", size, alignment, addr, flags)
        if err:
            return (err, None)
        align = max(alignment, 1 << 30)
        va = -(-self.next_va // align) * align + (4096 if self.misalign else 0)
        self.next_va = va + size + (1 << 30)
        self.reservations[va] = size
        return (SUCCESS, _Pointer(va))

    def hipMemAddressFree(self, ptr, size):
        err = self._enter("hipMemAddressFree", ptr, size)
        if err:
            return (err,)
        if self.reservations.get(ptr) != size or any(ptr <= v < ptr + size for v in self.mapped):
            return (INVALID,)
        del self.reservations[ptr]
        return (SUCCESS,)

    def hipMemCreate(self, size, prop, flags):
        err = self._enter("hipMemCreate", size, prop, flags)
        if err:
            return (err, None)
        if (int(prop.type) != 1 or int(prop.location.type) != 1 or size % self.granularity[0]
                or self._handle_type_of(prop) not in (0, 1) or flags != 0):
            return (INVALID, None)
        handle = self.next_handle
        self.next_handle += 1
        self.handles[handle] = size
        if self._handle_type_of(prop) == 1:
            self.exportable.add(handle)
        self.created_on[handle] = self.current
        return (SUCCESS, handle)

    def hipMemRelease(self, handle):
        err = self._enter("hipMemRelease", handle)
        if err:
            return (err,)
        self.exportable.discard(handle)
        return (SUCCESS,) if self.handles.pop(handle, None) is not None else (INVALID,)

    def hipMemExportToShareableHandle(self, address, handle, handle_type, flags):
        err = self._enter("hipMemExportToShareableHandle", address, handle, handle_type, flags)
        if err:
            return (err,)
        if int(handle_type) != 1 or handle not in self.exportable:
            return (INVALID,)
        fd = os.memfd_create("fake-hip-export", os.MFD_CLOEXEC)
        os.ftruncate(fd, self.handles[handle])
        ctypes.c_int.from_address(address).value = fd
        return (SUCCESS,)

    def hipMemImportFromShareableHandle(self, os_handle, handle_type):
        err = self._enter("hipMemImportFromShareableHandle", os_handle, handle_type)
        if err:
            return (err, None)
        if not os_handle or int(handle_type) != 1:
            return (INVALID, None)
        handle = self.next_handle
        self.next_handle += 1
        self.handles[handle] = os.fstat(os_handle).st_size
        self.exportable.add(handle)
        self.created_on[handle] = self.current
        return (SUCCESS, handle)

    def hipMemMap(self, ptr, size, offset, handle, flags):
        err = self._enter("hipMemMap", ptr, size, offset, handle, flags)
        if err:
            return (err,)
        inside = any(b <= ptr and ptr + size <= b + n for b, n in self.reservations.items())
        overlaps = any(v < ptr + size and ptr < v + n for v, (n, _) in self.mapped.items())
        if (not inside or overlaps or offset != 0 or flags != 0
                or size > self.handles.get(handle, 0)):
            return (INVALID,)
        self.mapped[ptr] = (size, handle)
        return (SUCCESS,)

    def hipMemUnmap(self, ptr, size):
        err = self._enter("hipMemUnmap", ptr, size)
        if err:
            return (err,)
        cursor = ptr
        while cursor < ptr + size:
            if cursor not in self.mapped:
                return (INVALID,)
            cursor += self.mapped.pop(cursor)[0]
        return (SUCCESS,)

    def hipMemSetAccess(self, ptr, size, desc, count):
        """ROCm's rule: from a reservation's base over a gap-free mapped prefix."""
        err = self._enter("hipMemSetAccess", ptr, size, desc, count)
        if err:
            return (err,)
        if ptr not in self.reservations or count != 1:
            return (INVALID,)
        cursor = ptr
        while cursor < ptr + size:
            if cursor not in self.mapped:
                return (INVALID,)
            cursor += self.mapped[cursor][0]
        if cursor != ptr + size:
            return (INVALID,)
        self.access.append((ptr, size, int(desc.location.id), int(desc.flags)))
        return (SUCCESS,)


def install(monkeypatch, fake, rocm_torch=True):
    package = types.ModuleType("hip")
    package.hip = fake
    monkeypatch.setitem(sys.modules, "hip", package)
    monkeypatch.setattr(torch.version, "hip", "6.2.0-fake" if rocm_torch else None,
                        raising=False)
    monkeypatch.delenv("SHMEMVM_DEVICE", raising=False)
    return fake


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeHip())


@pytest.fixture
def backend(fake):
    be = HipBackend()
    yield be
    be.close()


def _real_hip_python_without_runtime():
    """(hip-python's `hip.hip`, "") where it is installed and cannot load
    libamdhip64.so; (None, why not) where the checks against it cannot run here.

    Installed means installed: hip-python that is there but does not import, or
    fails in any other way than not finding the HIP runtime, is an error of
    this module (the run fails), never a reason to skip (CI installs hip-python
    precisely so that these checks run)."""
    if importlib.util.find_spec("hip") is None:
        return None, ("needs hip-python (pip install hip-python; CI installs it): it is not "
                      "installed here")
    real = hipmod._import_hip()  # ImportError: installed but broken, fails the module
    try:
        real.hipGetDeviceCount()
    except RuntimeError as exc:
        if "dlopen" not in str(exc):
            raise
        return real, ""
    # a HIP runtime is present: never push fake addresses into it (TestOnAMDGPU runs instead)
    return None, "hip-python found a HIP runtime here; the checks without one do not apply"


REAL_HIP, _NO_REAL_HIP = _real_hip_python_without_runtime()
needs_real_bindings = pytest.mark.skipif(REAL_HIP is None, reason=_NO_REAL_HIP)


# -- availability and construction ----------------------------------------------
class TestAvailability:
    def test_available_with_hip_python_rocm_torch_and_a_vmm_device(self, fake):
        assert HipBackend.is_available()

    def test_not_available_with_a_non_rocm_torch(self, monkeypatch):
        install(monkeypatch, FakeHip(), rocm_torch=False)
        assert not HipBackend.is_available()

    def test_not_available_without_devices(self, monkeypatch):
        install(monkeypatch, FakeHip(device_count=0))
        assert not HipBackend.is_available()

    def test_not_available_without_vmm_support(self, monkeypatch):
        install(monkeypatch, FakeHip(vmm=False))
        assert not HipBackend.is_available()

    def test_not_available_when_the_runtime_fails(self, monkeypatch):
        fake = install(monkeypatch, FakeHip())
        fake.fail["hipGetDeviceCount"] = hipError_t.hipErrorNoDevice
        assert not HipBackend.is_available()

    def test_not_available_without_hip_python(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "hip", None)  # import hip -> ImportError
        monkeypatch.setattr(torch.version, "hip", "6.2.0-fake", raising=False)
        assert not HipBackend.is_available()
        assert not shmemvm.backends.available("hip")
        with pytest.raises(UnsupportedError, match="pip install hip-python"):
            HipBackend()

    def test_registry_agrees_with_the_class_here(self):
        assert shmemvm.backends.available("hip") == HipBackend.is_available()
        if not getattr(torch.version, "hip", None):
            assert not HipBackend.is_available()

    def test_construction_refuses_a_non_rocm_torch(self, monkeypatch):
        install(monkeypatch, FakeHip(), rocm_torch=False)
        with pytest.raises(UnsupportedError, match="torch.version.hip"):
            HipBackend()

    @needs_real_bindings
    def test_real_hip_python_without_runtime_is_a_clear_error(self, monkeypatch):
        monkeypatch.setattr(torch.version, "hip", "6.2.0-fake", raising=False)
        assert not HipBackend.is_available()
        with pytest.raises(UnsupportedError, match="HIP runtime cannot be loaded"):
            HipBackend()

    def test_create_backend_by_name(self, fake):
        be = shmemvm.backends.create_backend("hip", device=1)
        assert isinstance(be, HipBackend) and be.device == torch.device("cuda", 1)


class TestDevice:
    def test_default_is_device_zero(self, backend):
        assert backend.index == 0
        assert backend.device == torch.device("cuda", 0)
        assert backend.name == "hip"

    @pytest.mark.parametrize("spec", [1, "1", "cuda:1", "hip:1", torch.device("cuda", 1)])
    def test_argument(self, fake, spec):
        assert HipBackend(device=spec).device == torch.device("cuda", 1)

    def test_environment(self, fake, monkeypatch):
        monkeypatch.setenv("SHMEMVM_DEVICE", "1")
        assert HipBackend().index == 1
        assert HipBackend(device=0).index == 0  # the argument wins

    def test_missing_device(self, fake):
        with pytest.raises(ValueError, match=r"device 5 does not exist.*sees 2"):
            HipBackend(device=5)

    @pytest.mark.parametrize("spec", ["gpu-one", torch.device("cpu"), -1])
    def test_unreadable_device(self, fake, spec):
        with pytest.raises(ValueError):
            HipBackend(device=spec)

    def test_device_without_vmm(self, monkeypatch):
        install(monkeypatch, FakeHip(vmm=False))
        with pytest.raises(UnsupportedError, match="virtual memory management"):
            HipBackend()

    def test_device_made_current_around_create_and_import_then_restored(self, fake):
        be = HipBackend(device=1)
        assert fake.current == 0
        fake.calls.clear()
        handle = be.create(G)
        assert fake.created_on[handle] == 1 and fake.current == 0
        assert fake.names() == ["hipGetDevice", "hipSetDevice", "hipMemCreate", "hipSetDevice"]
        assert fake.args_of("hipSetDevice") == [(1,), (0,)]
        fd = be.export_fd(handle)
        imported = be.import_fd(fd, G)
        assert fake.created_on[imported] == 1 and fake.current == 0

    def test_no_device_switch_when_already_current(self, fake):
        be = HipBackend(device=0)
        fake.calls.clear()
        be.create(G)
        assert "hipSetDevice" not in fake.names()

    def test_allocation_properties_and_access_descriptor(self, fake):
        be = HipBackend(device=1)
        prop = be._prop
        assert prop.type == hipMemAllocationType.hipMemAllocationTypePinned
        assert prop.location.type == hipMemLocationType.hipMemLocationTypeDevice
        assert prop.location.id == 1
        posix_fd = hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor
        assert prop.requestedHandleType == posix_fd
        assert be._access.location.id == 1
        assert be._access.flags == hipMemAccessFlags.hipMemAccessFlagsProtReadWrite


class TestGranularity:
    @pytest.mark.parametrize("minimum, recommended, expected", [
        (G, G, G),
        (4 * KiB, G, G),                 # recommended when it is a power-of-two multiple
        (64 * KiB, 96 * KiB, 64 * KiB),  # otherwise the minimum
        (G, MiB, G),                     # recommended below the minimum: the minimum
    ])
    def test_choice(self, monkeypatch, minimum, recommended, expected):
        install(monkeypatch, FakeHip(granularity=(minimum, recommended)))
        be = HipBackend()
        assert be.granularity == expected and be.min_granularity == minimum

    def test_minimum_not_a_power_of_two(self, monkeypatch):
        install(monkeypatch, FakeHip(granularity=(3 * MiB, 3 * MiB)))
        with pytest.raises(UnsupportedError, match="not a power of two"):
            HipBackend()

    def test_requested(self, fake):
        assert HipBackend(granularity="8M").granularity == 8 * MiB
        assert HipBackend(granularity=4 * MiB).granularity == 4 * MiB

    @pytest.mark.parametrize("requested", ["3M", MiB, "1K"])
    def test_requested_must_be_a_pow2_multiple_of_the_minimum(self, fake, requested):
        with pytest.raises(ValueError, match="power-of-two multiple"):
            HipBackend(granularity=requested)

    def test_queries_both_granularities_for_the_device(self, fake):
        HipBackend(device=1)
        options = [int(args[1]) for args in fake.args_of("hipMemGetAllocationGranularity")]
        assert options == [0, 1]

    def test_reserve_rounds_up_and_unreserve_frees_what_was_reserved(self, backend, fake):
        va = backend.reserve(3 * MiB, G)
        assert fake.args_of("hipMemAddressReserve") == [(4 * MiB, G, None, 0)]
        assert va % G == 0
        backend.unreserve(va, 3 * MiB)
        assert fake.args_of("hipMemAddressFree") == [(va, 4 * MiB)]
        assert fake.reservations == {}

    def test_misaligned_reservation_is_given_back(self, backend, fake):
        fake.misalign = True
        with pytest.raises(ShmemError, match="not aligned"):
            backend.reserve(8 * G, 1 << 30)
        assert fake.reservations == {}

    def test_map_needs_granularity_multiples(self, backend, fake):
        va = backend.reserve(8 * G, G)
        handle = backend.create(G)
        for bad_va, bad_size in ((va + 4096, G), (va, G + 4096), (va, 0)):
            with pytest.raises(ValueError, match="multiples of the granularity"):
                backend.map(bad_va, bad_size, handle)
        assert "hipMemMap" not in fake.names()


# -- cumulative access --------------------------------------------------------------
def _map_new(be, va, size=G):
    handle = be.create(size)
    be.map(va, size, handle)
    return handle


class TestCumulativeAccess:
    def test_each_set_access_covers_base_to_high_water(self, backend, fake):
        base = backend.reserve(16 * G, G)
        for i in range(4):
            _map_new(backend, base + i * G)
            backend.set_access(base + i * G, G)
        assert fake.args_of("hipMemSetAccess") == [
            (base, (i + 1) * G, backend._access, 1) for i in range(4)]
        assert [(va, size) for va, size, _, _ in fake.access] == [
            (base, (i + 1) * G) for i in range(4)]
        assert {(dev, flags) for _, _, dev, flags in fake.access} == {(0, 3)}

    def test_multi_granule_pieces(self, backend, fake):
        base = backend.reserve(16 * G, G)
        _map_new(backend, base, 4 * G)
        backend.set_access(base, 4 * G)
        _map_new(backend, base + 4 * G, 2 * G)
        backend.set_access(base + 4 * G, 2 * G)
        assert [a[:2] for a in fake.args_of("hipMemSetAccess")] == [(base, 4 * G), (base, 6 * G)]

    def test_unmap_in_the_middle_keeps_base_and_high_water(self, backend, fake):
        base = backend.reserve(16 * G, G)
        handles = [_map_new(backend, base + i * G) for i in range(4)]
        backend.set_access(base, 4 * G)
        backend.unmap(base + G, G)
        backend.release(handles[1])
        assert backend.mapped_prefix(base) == (base, base + 4 * G)
        # Renewal: new physical memory at the same place, then access over the prefix.
        _map_new(backend, base + G)
        backend.set_access(base + G, G)
        assert fake.args_of("hipMemSetAccess")[-1][:2] == (base, 4 * G)
        assert fake.access[-1][:2] == (base, 4 * G)

    def test_failed_filler_map_is_named_and_the_hole_too(self, backend, fake):
        base = backend.reserve(16 * G, G)
        for i in range(4):
            _map_new(backend, base + i * G)
        backend.set_access(base, 4 * G)
        fake.fail["hipMemMap"] = hipError_t.hipErrorOutOfMemory
        with pytest.raises(HipError, match="filler") as info:
            backend.unmap(base + G, G)
        assert info.value.call == "hipMemMap" and f"va={base + G:#x}" in str(info.value)
        del fake.fail["hipMemMap"]
        with pytest.raises(HipError) as info:
            backend.set_access(base + 3 * G, G)
        # The call was still made from the base over the whole prefix.
        assert fake.args_of("hipMemSetAccess")[-1][:2] == (base, 4 * G)
        message = str(info.value)
        assert "hipMemSetAccess" in message and "hipErrorInvalidValue" in message
        assert f"{base + G:#x}..{base + 2 * G:#x}" in message
        assert info.value.call == "hipMemSetAccess" and info.value.code == 1
        # Renewing the piece closes the hole.
        _map_new(backend, base + G)
        backend.set_access(base + G, G)
        assert fake.access[-1][:2] == (base, 4 * G)

    def test_out_of_order_maps(self, backend, fake):
        base = backend.reserve(16 * G, G)
        _map_new(backend, base)
        _map_new(backend, base + 2 * G)
        backend.set_access(base + 2 * G, G)  # granule 1 holds the filler
        assert fake.access[-1][:2] == (base, 3 * G)
        assert _fillers(fake, backend) == [base + G]
        _map_new(backend, base + G)
        backend.set_access(base + G, G)
        assert fake.access[-1][:2] == (base, 3 * G)
        assert _fillers(fake, backend) == []

    def test_unmapping_the_top_lowers_the_high_water(self, backend, fake):
        base = backend.reserve(16 * G, G)
        for i in range(3):
            _map_new(backend, base + i * G)
        backend.unmap(base + 2 * G, G)
        assert backend.mapped_prefix(base) == (base, base + 2 * G)
        backend.set_access(base, G)
        assert fake.args_of("hipMemSetAccess")[-1][:2] == (base, 2 * G)
        backend.unmap(base, 2 * G)  # two pieces at once
        assert fake.args_of("hipMemUnmap")[-1] == (base, 2 * G)
        assert backend.mapped_prefix(base) == (base, base)

    def test_reservations_are_independent(self, backend, fake):
        a = backend.reserve(8 * G, G)
        b = backend.reserve(8 * G, G)
        for i in range(3):
            _map_new(backend, a + i * G)
        _map_new(backend, b)
        backend.set_access(b, G)
        backend.set_access(a + 2 * G, G)
        assert [x[:2] for x in fake.args_of("hipMemSetAccess")] == [(b, G), (a, 3 * G)]

    def test_set_access_needs_a_mapped_range(self, backend, fake):
        base = backend.reserve(8 * G, G)
        _map_new(backend, base)
        with pytest.raises(ValueError, match="map the range first"):
            backend.set_access(base + G, G)
        with pytest.raises(ValueError, match="not inside a range from reserve"):
            backend.set_access(base - 16 * G, G)
        assert "hipMemSetAccess" not in fake.names()

    def test_overlapping_map_is_refused(self, backend, fake):
        base = backend.reserve(8 * G, G)
        _map_new(backend, base, 2 * G)
        with pytest.raises(ValueError, match="overlaps"):
            backend.map(base + G, G, backend.create(G))
        assert len(fake.args_of("hipMemMap")) == 1

    def test_map_outside_reservations(self, backend, fake):
        base = backend.reserve(4 * G, G)
        with pytest.raises(ValueError, match="not inside a range from reserve"):
            backend.map(base + 4 * G, G, backend.create(G))
        with pytest.raises(ValueError, match="not inside a range from reserve"):
            backend.map(base + 3 * G, 2 * G, backend.create(2 * G))

    def test_unmap_must_cover_whole_pieces(self, backend, fake):
        base = backend.reserve(8 * G, G)
        _map_new(backend, base, 2 * G)
        for va, size in ((base, G), (base + G, G), (base, 4 * G), (base + 4 * G, G)):
            with pytest.raises(ValueError, match="whole mapped pieces"):
                backend.unmap(va, size)
        assert "hipMemUnmap" not in fake.names()

    def test_unmap_waits_for_the_device_first(self, backend, fake):
        base = backend.reserve(8 * G, G)
        _map_new(backend, base)
        fake.calls.clear()
        backend.unmap(base, G)
        names = fake.names()
        assert names.index("hipDeviceSynchronize") < names.index("hipMemUnmap")

    def test_unreserve_refuses_while_mapped(self, backend, fake):
        base = backend.reserve(8 * G, G)
        _map_new(backend, base)
        with pytest.raises(ValueError, match="still mapped"):
            backend.unreserve(base, 8 * G)
        backend.unmap(base, G)
        backend.unreserve(base, 8 * G)
        assert fake.reservations == {}
        with pytest.raises(ValueError, match="not the start of a range"):
            backend.unreserve(base, 8 * G)


# -- the filler: holes below the high water -----------------------------------------
def _fillers(fake, be):
    """Addresses where the fake has the backend's filler piece mapped."""
    return sorted(va for va, (_, h) in fake.mapped.items() if h == be._filler)


def _assert_gap_free(fake, be, base):
    """[base, high water) is tiled by fake mappings, each granule of a hole is
    the filler, and nothing is mapped above the high water."""
    _, high = be.mapped_prefix(base)
    res = be._reservations[base]
    cursor = base
    while cursor < high:
        size, handle = fake.mapped[cursor]
        if handle == be._filler:
            assert size == be.granularity and cursor in res.fillers
        else:
            assert res.pieces.get(cursor) == size
        cursor += size
    assert cursor == high
    assert not any(high <= va < base + res.size for va in fake.mapped)
    assert res.fillers == {va for va in _fillers(fake, be) if base <= va < base + res.size}


class TestFiller:
    def test_buddy_pattern(self, backend, fake):
        base = backend.reserve(64 * G, G)
        _map_new(backend, base)
        backend.set_access(base, G)
        _map_new(backend, base + 16 * G, 16 * G)
        backend.set_access(base + 16 * G, 16 * G)
        assert fake.access[-1][:2] == (base, 32 * G)
        assert _fillers(fake, backend) == [base + i * G for i in range(1, 16)]
        # One filler piece, not exportable, mapped at offset 0 at every granule.
        filler = backend._filler
        assert fake.handles[filler] == G and filler not in fake.exportable
        assert {a[1:] for a in fake.args_of("hipMemMap") if a[3] == filler} == {(G, 0, filler, 0)}
        _assert_gap_free(fake, backend, base)

    def test_unmapping_a_middle_piece_refills_it(self, backend, fake):
        base = backend.reserve(64 * G, G)
        handles = [_map_new(backend, base + i * 4 * G, 4 * G) for i in range(3)]
        backend.set_access(base, 12 * G)
        backend.unmap(base + 4 * G, 4 * G)
        backend.release(handles[1])
        assert backend.mapped_prefix(base) == (base, base + 12 * G)
        assert _fillers(fake, backend) == [base + i * G for i in range(4, 8)]
        backend.set_access(base + 8 * G, 4 * G)
        assert fake.access[-1][:2] == (base, 12 * G)
        _assert_gap_free(fake, backend, base)

    def test_unmapping_the_top_lowers_high_water_and_drops_trailing_fillers(self, backend, fake):
        base = backend.reserve(64 * G, G)
        _map_new(backend, base)
        _map_new(backend, base + 4 * G, 4 * G)
        _map_new(backend, base + 16 * G, 16 * G)
        assert len(_fillers(fake, backend)) == 3 + 8
        backend.unmap(base + 16 * G, 16 * G)
        assert backend.mapped_prefix(base) == (base, base + 8 * G)
        assert _fillers(fake, backend) == [base + i * G for i in range(1, 4)]
        backend.set_access(base, G)
        assert fake.access[-1][:2] == (base, 8 * G)
        backend.unmap(base + 4 * G, 4 * G)
        assert backend.mapped_prefix(base) == (base, base + G)
        assert _fillers(fake, backend) == []
        _assert_gap_free(fake, backend, base)
        # Each filler granule is unmapped by a call of its own.
        assert all(size == G for va, size in fake.args_of("hipMemUnmap") if va < base + 4 * G
                   and va != base)

    def test_remapping_over_filler_granules(self, backend, fake):
        base = backend.reserve(64 * G, G)
        _map_new(backend, base)
        _map_new(backend, base + 16 * G, 16 * G)
        _map_new(backend, base + 4 * G, 4 * G)  # lands on fillers 4..7
        backend.set_access(base + 4 * G, 4 * G)
        assert fake.access[-1][:2] == (base, 32 * G)
        assert _fillers(fake, backend) == [base + i * G for i in (1, 2, 3, *range(8, 16))]
        _assert_gap_free(fake, backend, base)
        _map_new(backend, base + 2 * G, 2 * G)
        _map_new(backend, base + G)
        _map_new(backend, base + 8 * G, 8 * G)
        assert _fillers(fake, backend) == []
        backend.set_access(base, G)
        _assert_gap_free(fake, backend, base)

    def test_failed_map_puts_the_fillers_back(self, backend, fake):
        base = backend.reserve(64 * G, G)
        _map_new(backend, base + 8 * G)
        handle = backend.create(4 * G)
        real_map = fake.hipMemMap

        def map_failing_for_the_piece(ptr, size, offset, h, flags):
            if h == handle:
                return (hipError_t.hipErrorOutOfMemory,)
            return real_map(ptr, size, offset, h, flags)

        fake.hipMemMap = map_failing_for_the_piece
        with pytest.raises(HipError, match="hipMemMap"):
            backend.map(base + 2 * G, 4 * G, handle)
        assert _fillers(fake, backend) == [base + i * G for i in range(8)]
        _assert_gap_free(fake, backend, base)
        backend.set_access(base + 8 * G, G)

    def test_failed_gap_fill_unmaps_the_piece(self, backend, fake):
        base = backend.reserve(64 * G, G)
        _map_new(backend, base)
        handle = backend.create(G)
        real_map = fake.hipMemMap

        def map_failing_on_the_third_filler(ptr, size, offset, h, flags):
            if h == backend._filler and ptr == base + 3 * G:
                return (hipError_t.hipErrorOutOfMemory,)
            return real_map(ptr, size, offset, h, flags)

        fake.hipMemMap = map_failing_on_the_third_filler
        with pytest.raises(HipError, match="filler") as info:
            backend.map(base + 8 * G, G, handle)
        assert f"va={base + 3 * G:#x}" in str(info.value)
        assert backend.mapped_prefix(base) == (base, base + G)
        assert sorted(fake.mapped) == [base]  # the piece and fillers 1, 2 are gone
        _assert_gap_free(fake, backend, base)

    def test_unreserve_and_close_leave_nothing(self, fake):
        be = HipBackend()
        a, b = be.reserve(64 * G, G), be.reserve(64 * G, G)
        pieces = [(a, G), (a + 16 * G, 16 * G), (b + 8 * G, 8 * G), (b + 32 * G, 4 * G)]
        handles = [_map_new(be, va, size) for va, size in pieces]
        be.set_access(a + 16 * G, 16 * G)
        be.set_access(b + 32 * G, 4 * G)
        filler = be._filler
        assert filler in fake.handles
        for (va, size), handle in zip(pieces[:2], handles[:2]):
            be.unmap(va, size)
            be.release(handle)
        be.unreserve(a, 64 * G)
        assert not any(a <= va < a + 64 * G for va in fake.mapped)
        # b still holds pieces and fillers at close(): the fillers go, then the filler piece.
        be.close()
        assert _fillers(fake, be) == [] and filler not in fake.handles
        assert sorted(fake.mapped) == [b + 8 * G, b + 32 * G]
        for (va, size), handle in zip(pieces[2:], handles[2:]):
            be.unmap(va, size)  # after close: nothing is filled again
            be.release(handle)
        be.unreserve(b, 64 * G)
        assert fake.mapped == {} and fake.handles == {} and fake.reservations == {}

    def test_unreserve_still_refuses_real_pieces(self, backend, fake):
        base = backend.reserve(16 * G, G)
        _map_new(backend, base + 4 * G)
        with pytest.raises(ValueError, match="still mapped"):
            backend.unreserve(base, 16 * G)
        assert _fillers(fake, backend) == [base + i * G for i in range(4)]

    def test_no_filler_without_holes(self, backend, fake):
        base = backend.reserve(16 * G, G)
        for i in range(4):
            _map_new(backend, base + i * G)
        backend.unmap(base + 3 * G, G)
        assert backend._filler is None and len(fake.handles) == 4

    def test_heap_random_workload(self, fake):
        be = HipBackend()
        # CPU tensors at the fake addresses: never read, only their addresses matter.
        be.tensor = lambda va, shape, dtype: _dlpack.tensor_at(va, shape, dtype,
                                                               torch.device("cpu"))
        heap = VMemPow2Allocator(64 * G, backend=be)
        rng = random.Random(1234)
        live, exhausted = [], 0
        for _ in range(300):
            action = rng.random()
            if action < 0.55 or not live:
                nbytes = rng.choice([rng.randint(1, 4 * KiB), rng.randint(1, G),
                                     rng.randint(1, 6 * G)])
                try:
                    live.append(heap.allocate(nbytes))
                except HeapExhaustedError:
                    exhausted += 1
            elif action < 0.95:
                heap.free(live.pop(rng.randrange(len(live))))
            else:
                heap.trim()
            _assert_gap_free(fake, be, heap.base)
        assert len(fake.access) > 10 and be._filler is not None
        assert _fillers(fake, be)  # the workload did leave holes
        heap.close()
        assert live and fake.mapped  # memory the live tensors view stays mapped for them
        live.clear()
        gc.collect()                 # the last views die: everything is released
        assert fake.mapped == {} and fake.handles == {} and fake.reservations == {}

    def test_peer_table_out_of_order_and_drops(self, backend, fake):
        peers = PeerTable(backend, 64 * G, [1, 2])
        exporter = [backend.create(size) for size in (G, 16 * G, 4 * G, 8 * G)]
        segments = [Segment(40 * G, G, 1), Segment(16 * G, 16 * G, 1),
                    Segment(4 * G, 4 * G, 1), Segment(8 * G, 8 * G, 1)]
        for pe in (1, 2):
            order = segments if pe == 1 else segments[::-1]
            for segment in order:
                handle = exporter[segments.index(segment)]
                peers.map(pe, segment, backend.export_fd(handle))
                _assert_gap_free(fake, backend, peers.windows[pe])
        assert fake.access[-1][:2] == (peers.windows[2], 41 * G)
        assert len(fake.access) == 8  # every map_accessible set access, none refused
        peers.drop(segments[1])   # the middle: refilled
        peers.drop(segments[0])   # the top: high water falls to 16 G
        for pe in (1, 2):
            window = peers.windows[pe]
            assert backend.mapped_prefix(window) == (window, window + 16 * G)
            _assert_gap_free(fake, backend, window)
        peers.map(1, Segment(16 * G, 16 * G, 2), backend.export_fd(exporter[1]))
        assert fake.access[-1][:2] == (peers.windows[1], 32 * G)
        peers.close()
        for handle in exporter:
            backend.release(handle)
        backend.close()
        assert fake.mapped == {} and fake.handles == {} and fake.reservations == {}


# -- errors -----------------------------------------------------------------------
class TestErrors:
    def test_error_names_call_and_hip_error(self, backend, fake):
        base = backend.reserve(8 * G, G)
        handle = backend.create(G)
        fake.fail["hipMemMap"] = hipError_t.hipErrorOutOfMemory
        with pytest.raises(HipError) as info:
            backend.map(base, G, handle)
        error = info.value
        assert isinstance(error, RuntimeError) and isinstance(error, ShmemError)
        assert error.call == "hipMemMap" and error.error_name == "hipErrorOutOfMemory"
        assert error.code == 2
        message = str(error)
        assert message.startswith("hipMemMap(")
        assert "hipErrorOutOfMemory (2)" in message and f"va={base:#x}" in message
        assert "fake description of 2" in message  # hipGetErrorString's text
        # Nothing was recorded as mapped.
        assert backend.mapped_prefix(base) == (base, base)

    def test_unknown_error_code(self, backend, fake):
        fake.fail["hipMemCreate"] = 12345
        with pytest.raises(HipError, match=r"hipMemCreate\(.*\) failed with hipError_t\(12345\)"):
            backend.create(G)

    def test_create_failure_has_a_hint(self, backend, fake):
        fake.fail["hipMemCreate"] = hipError_t.hipErrorOutOfMemory
        with pytest.raises(HipError, match="SHMEMVM_HEAP_SIZE"):
            backend.create(G)

    def test_device_restored_after_a_failed_call(self, fake):
        be = HipBackend(device=1)
        fake.fail["hipMemCreate"] = hipError_t.hipErrorOutOfMemory
        with pytest.raises(HipError):
            be.create(G)
        assert fake.current == 0

    def test_construction_errors(self, monkeypatch):
        fake = install(monkeypatch, FakeHip())
        fake.fail["hipGetDeviceCount"] = hipError_t.hipErrorNoDevice
        with pytest.raises(HipError, match="hipGetDeviceCount.*hipErrorNoDevice"):
            HipBackend()
        del fake.fail["hipGetDeviceCount"]
        fake.fail["hipMemGetAllocationGranularity"] = INVALID
        with pytest.raises(HipError, match="hipMemGetAllocationGranularity"):
            HipBackend()

    def test_closed_backend(self, backend):
        backend.close()
        with pytest.raises(ShmemError, match="closed"):
            backend.create(G)


# -- file descriptors ---------------------------------------------------------------
def _is_open(fd):
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False
    return True


class TestFileDescriptors:
    def test_export_returns_the_fd_hip_wrote(self, backend, fake):
        handle = backend.create(2 * G)
        fd = backend.export_fd(handle)
        try:
            assert os.fstat(fd).st_size == 2 * G
            address, h, handle_type, flags = fake.args_of("hipMemExportToShareableHandle")[0]
            assert h == handle and int(handle_type) == 1 and flags == 0
        finally:
            os.close(fd)

    def test_import_passes_the_fd_by_value_and_closes_it(self, backend, fake):
        fd = backend.export_fd(backend.create(G))
        handle = backend.import_fd(fd, G)
        assert fake.args_of("hipMemImportFromShareableHandle")[0][0] == fd
        assert fake.handles[handle] == G
        assert not _is_open(fd)

    def test_import_of_too_small_memory(self, backend, fake):
        fd = backend.export_fd(backend.create(G))
        with pytest.raises(ValueError, match=f"{G} bytes where {2 * G}"):
            backend.import_fd(fd, 2 * G)
        assert not _is_open(fd)
        assert "hipMemImportFromShareableHandle" not in fake.names()

    def test_import_failure_still_closes_the_fd(self, backend, fake):
        fd = backend.export_fd(backend.create(G))
        fake.fail["hipMemImportFromShareableHandle"] = INVALID
        with pytest.raises(HipError, match="hipMemImportFromShareableHandle"):
            backend.import_fd(fd, G)
        assert not _is_open(fd)

    def test_export_failure(self, backend, fake):
        fake.fail["hipMemExportToShareableHandle"] = hipError_t.hipErrorNotSupported
        with pytest.raises(HipError, match="hipMemExportToShareableHandle.*hipErrorNotSupported"):
            backend.export_fd(backend.create(G))


# -- tensors and copies ----------------------------------------------------------------
class TestData:
    def test_tensor_capsule_names_the_rocm_device(self, fake, monkeypatch):
        be = HipBackend(device=1)
        seen = {}

        def from_dlpack(capsule):
            get = ctypes.pythonapi.PyCapsule_GetPointer
            get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
            managed = _dlpack._DLManagedTensor.from_address(get(capsule, b"dltensor"))
            dl = managed.dl_tensor
            seen.update(data=dl.data, device=(dl.device.device_type, dl.device.device_id),
                        shape=[dl.shape[i] for i in range(dl.ndim)],
                        dtype=(dl.dtype.code, dl.dtype.bits, dl.dtype.lanes),
                        strides=bool(dl.strides), deleter=managed.deleter)
            return "tensor"

        monkeypatch.setattr(_dlpack, "_from_dlpack", from_dlpack)
        # both capsules: the compiled piece's (its own struct, which its C deleter
        # frees) and the ctypes one (one shared struct, no deleter)
        for compiled in (_dlpack._compiled_tensor_at, None):
            monkeypatch.setattr(_dlpack, "_compiled_tensor_at", compiled)
            assert be.tensor(0x7F00_0020_0000, (3, 5), torch.bfloat16) == "tensor"
            deleter = seen.pop("deleter")
            assert seen == {"data": 0x7F00_0020_0000, "device": (_dlpack.KDL_ROCM, 1),
                            "shape": [3, 5], "dtype": (4, 16, 1), "strides": False}
            assert (deleter is not None) == (compiled is not None)

    def test_tensor_refuses_unsupported_dtypes(self, backend):
        with pytest.raises(TypeError, match="not supported"):
            backend.tensor(0x7F00_0020_0000, (4,), torch.float8_e4m3fn)

    def test_copies_on_the_current_stream(self, backend, monkeypatch):
        class Stream:
            device_index, stream_id = 0, 7
            synced = 0

            def synchronize(self):
                Stream.synced += 1

        monkeypatch.setattr(backend, "_current_stream", lambda: Stream())
        src, dst = torch.arange(8.0), torch.zeros(8)
        backend.copy(dst, src, blocking=False)
        assert torch.equal(dst, src) and Stream.synced == 0
        backend.copy(dst, src * 2, blocking=False)
        backend.synchronize()
        assert Stream.synced == 1  # one stream (current and used), synchronized once
        backend.synchronize()
        assert Stream.synced == 2  # the current stream, for kernels queued on it
        backend.copy(dst, src, blocking=True)
        assert Stream.synced == 3 and torch.equal(dst, src)

    def test_describe(self, backend):
        info = backend.describe()
        assert info["backend"] == "hip" and info["granularity"] == G
        assert info["device"] == "cuda:0" and info["cumulative_access"] is True


# -- the same flows through hip-python's real argument handling ---------------------------
@needs_real_bindings
class TestAgainstHipPythonBindings:
    """Every call goes through hip-python's real function first (which converts
    the arguments and then fails to load libamdhip64.so), then through the fake."""

    @pytest.fixture
    def fake(self, monkeypatch):
        fake = install(monkeypatch, FakeHip(real=REAL_HIP))
        yield fake
        # also what the backend's broad excepts (is_available, error text) swallowed
        assert fake.problems == [], fake.problems

    def test_full_flow(self, fake):
        be = HipBackend(device=1)
        base = be.reserve(8 * G, G)
        handles = [be.create(G) for _ in range(3)]
        for i, handle in enumerate(handles):
            be.map(base + i * G, G, handle)
            be.set_access(base + i * G, G)
        assert [a[:2] for a in fake.args_of("hipMemSetAccess")] == [
            (base, G), (base, 2 * G), (base, 3 * G)]
        fd = be.export_fd(handles[0])
        imported = be.import_fd(fd, G)
        peer = be.reserve(4 * G, G)
        be.map(peer, G, imported)
        be.set_access(peer, G)
        be.unmap(peer, G)
        be.release(imported)
        be.unreserve(peer, 4 * G)
        for i, handle in enumerate(handles):
            be.unmap(base + i * G, G)
            be.release(handle)
        be.unreserve(base, 8 * G)
        be.close()  # the filler (granules 0 and 1 were filled in turn) goes here
        assert fake.reservations == {} and fake.handles == {} and fake.mapped == {}
        assert fake.access[-1][2:] == (1, 3)  # device 1, ProtReadWrite
        # every call of the flow went through the real bindings, none around them
        assert fake.real_checked >= {
            "hipGetDeviceCount", "hipSetDevice", "hipGetDevice", "hipMemGetAllocationGranularity",
            "hipMemAddressReserve", "hipMemCreate", "hipMemMap", "hipMemSetAccess",
            "hipMemExportToShareableHandle", "hipMemImportFromShareableHandle", "hipMemUnmap",
            "hipMemRelease", "hipMemAddressFree"}, fake.real_checked
        assert fake.real_checked == {name for name, _ in fake.calls}

    def test_availability_probe(self, fake):
        # is_available() catches every exception, so a refused argument would only
        # show as "not available": fake.problems (checked by the fixture) catches it
        assert HipBackend.is_available()
        assert {"hipGetDeviceCount", "hipDeviceGetAttribute"} <= fake.real_checked

    def test_error_path(self, fake):
        # the error text is fetched inside a broad except (a nicety that must never
        # hide the error), so only fake.problems would show a refused argument there
        be = HipBackend(device=1)
        fake.fail["hipMemCreate"] = fake.hipError_t.hipErrorOutOfMemory
        with pytest.raises(HipError, match="hipMemCreate.*hipErrorOutOfMemory"):
            be.create(G)
        assert "hipGetErrorString" in fake.real_checked
        be.close()

    def test_handle_type_written_into_the_union(self, fake):
        be = HipBackend(device=1)
        prop = be._prop
        words = list((ctypes.c_int32 * 4).from_address(int(prop)))
        # type = Pinned, requestedHandleType = PosixFileDescriptor, location = (Device, 1)
        assert words == [1, 1, 1, 1]
        posix_fd = REAL_HIP.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor
        union = getattr(REAL_HIP, "hipMemAllocationProp_union_0", None)
        if union is not None:   # releases that wrap the union on its own
            assert union.fromObj(int(prop) + 4).requestedHandleType == posix_fd
        else:                   # releases that expose the field on the struct itself
            assert prop.requestedHandleType == posix_fd
