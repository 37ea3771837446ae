"""The hip backend on real hardware: runs only with an AMD GPU with VMM
support, a ROCm build of torch and hip-python. It has never run on AMD
hardware: the hip backend is tested against a stand-in for hip-python
(tests/unit/backends/test_hip_backend.py), which models ROCm's access rule.
"""

from __future__ import annotations

import pytest
import torch

from shmemvm.backends import hip as hipmod
from shmemvm.backends.hip import HipBackend


# -- real hardware ------------------------------------------------------------------
def _why_no_amd_gpu() -> str:
    try:
        hipmod._import_hip()
        have_bindings = "installed"
    except ImportError:
        have_bindings = "not installed"
    return (f"needs an AMD GPU with VMM support, a ROCm build of torch and hip-python; here "
            f"torch {torch.__version__} has torch.version.hip="
            f"{getattr(torch.version, 'hip', None)!r} and hip-python is {have_bindings}")


@pytest.mark.gpu
@pytest.mark.skipif(not HipBackend.is_available(), reason=_why_no_amd_gpu())
class TestOnAMDGPU:
    @pytest.fixture
    def be(self):
        be = HipBackend(device=0)
        yield be
        torch.cuda.synchronize()
        be.close()

    def test_piece_roundtrip(self, be):
        g = be.granularity
        base = be.reserve(4 * g, g)
        handle = be.create(g)
        be.map(base, g, handle)
        be.set_access(base, g)
        t = be.tensor(base, (g // 4,), torch.float32)
        assert t.device == be.device
        t.fill_(1.5)
        assert t.sum().item() == 1.5 * (g // 4)
        del t
        be.unmap(base, g)
        be.release(handle)
        be.unreserve(base, 4 * g)

    def test_cumulative_access_over_several_maps_and_a_renewal(self, be):
        g = be.granularity
        base = be.reserve(8 * g, g)
        handles = []
        for i in range(4):
            handles.append(be.create(g))
            be.map(base + i * g, g, handles[-1])
            be.set_access(base + i * g, g)
            be.tensor(base + i * g, (g,), torch.uint8).fill_(i + 1)
        whole = be.tensor(base, (4, g), torch.uint8)
        assert whole[:, 0].tolist() == [1, 2, 3, 4]
        be.unmap(base + g, g)
        be.release(handles[1])
        handles[1] = be.create(g)
        be.map(base + g, g, handles[1])
        be.set_access(base + g, g)
        be.tensor(base + g, (g,), torch.uint8).fill_(9)
        assert whole[:, -1].tolist() == [1, 9, 3, 4]
        del whole
        be.unmap(base, 4 * g)
        for handle in handles:
            be.release(handle)
        be.unreserve(base, 8 * g)

    def test_export_import_in_one_process(self, be):
        g = be.granularity
        a, b = be.reserve(2 * g, g), be.reserve(2 * g, g)
        handle = be.create(g)
        be.map(a, g, handle)
        be.set_access(a, g)
        imported = be.import_fd(be.export_fd(handle), g)
        be.map(b, g, imported)
        be.set_access(b, g)
        be.tensor(a, (g // 4,), torch.int32).fill_(42)
        torch.cuda.synchronize()
        assert bool((be.tensor(b, (g // 4,), torch.int32) == 42).all())
        be.unmap(b, g)
        be.release(imported)
        be.unmap(a, g)
        be.release(handle)
        be.unreserve(a, 2 * g)
        be.unreserve(b, 2 * g)

    def test_copy(self, be):
        g = be.granularity
        base = be.reserve(2 * g, g)
        handles = [be.create(g) for _ in range(2)]
        for i, handle in enumerate(handles):
            be.map(base + i * g, g, handle)
            be.set_access(base + i * g, g)
        src = be.tensor(base, (g // 4,), torch.float32)
        dst = be.tensor(base + g, (g // 4,), torch.float32)
        src.copy_(torch.arange(g // 4, dtype=torch.float32, device=be.device))
        be.copy(dst, src, blocking=False)
        be.synchronize()
        assert torch.equal(dst, src)
        del src, dst
        be.unmap(base, 2 * g)
        for handle in handles:
            be.release(handle)
        be.unreserve(base, 2 * g)

    def test_rocm_still_refuses_sub_range_set_access(self, be):
        """The DESIGN.md fact this backend is built around; if this starts to
        fail, ROCm may have lifted the limit and the filler can go."""
        hip = hipmod._import_hip()
        g = be.granularity
        base = be.reserve(2 * g, g)
        handles = [be.create(g) for _ in range(2)]
        for i, handle in enumerate(handles):
            be.map(base + i * g, g, handle)
        (err,) = hip.hipMemSetAccess(base + g, g, be._access, 1)
        assert int(err) == int(hip.hipError_t.hipErrorInvalidValue)
        be.set_access(base + g, g)  # the cumulative call works
        be.unmap(base, 2 * g)
        for handle in handles:
            be.release(handle)
        be.unreserve(base, 2 * g)
