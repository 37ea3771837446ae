#!/usr/bin/env bash
# The CUDA backend's tests on the device machine (one H200; no PyPI there), in
# about 2 minutes. Run from the repository root, as root:
#
#     bash benchmarks/device/gpu_tests.sh [WHEELS]        (WHEELS: .whl, holding
#         pytest-mpi's wheel: python3 -m pip download --no-deps pytest-mpi -d .whl)
#
# and carry WHEELS with the run. It builds the compiled pieces in place
# (build_compiled.sh), then runs: tests/gpu on one process; under
# `/usr/bin/mpirun -n 2` (Open MPI, which mpi4py there is built against) with
# SHMEMVM_TEST_BACKEND=cuda, tests/gpu, tests/mpi/device and
# openshmem/test_external.py, then the memory, differential and one-step
# allocation tests, then the node collectives and the NumPy face; and
# examples/moe_dispatch.py on 2 PEs. Each pytest batch prints its summary and
# failures. Known there: Open MPI 4.1.6 makes no dynamic MPI window, so the
# off-node (node-split) cases raise UnsupportedError; every on-node case runs.
# NVLink multicast stays off for every process (the device's rules).
set -u
W=${1:-.whl}
PY=$(command -v python3)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$W"/pytest_mpi-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY="$PY" bash benchmarks/device/build_compiled.sh
# (PATH too: mpirun's processes would otherwise find a python3 without pytest)
MPI="/usr/bin/mpirun --allow-run-as-root --oversubscribe -n 2 -x PATH -x PYTHONPATH \
-x PYTHONUNBUFFERED -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST \
-x NVSHMEM_DISABLE_NVLS -x SHMEMVM_TEST_BACKEND"
PT="$PY -m pytest -q -p no:cacheprovider"
summary() { grep -aE "passed|failed|FAILED|ERROR" | sed 's/\x1b\[[0-9;]*m//g' | tail -40; }
echo "== tests/gpu, one process"; timeout 400 $PT tests/gpu 2>&1 | summary
export SHMEMVM_TEST_BACKEND=cuda
echo "== 2 PEs: tests/gpu, tests/mpi/device, external tensors"
timeout 300 $MPI $PT --with-mpi -m mpi tests/gpu tests/mpi/device \
    tests/mpi/openshmem/test_external.py 2>&1 | summary
echo "== 2 PEs: memory, differential, one-step allocation"
timeout 300 $MPI $PT --with-mpi -m mpi tests/mpi/memory tests/mpi/reliability/test_differential.py \
    tests/mpi/openshmem/test_alloc_one_step.py 2>&1 | summary
echo "== 2 PEs: node collectives, the NumPy face"
timeout 300 $MPI $PT --with-mpi -m mpi tests/mpi/openshmem/test_nodecoll.py tests/mpi/shmem 2>&1 | summary
echo "== 2 PEs: examples/moe_dispatch.py"
timeout 120 $MPI $PY examples/moe_dispatch.py 2>&1 | tail -4
