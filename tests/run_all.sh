#!/usr/bin/env bash
# The whole test suite: single-process tests, then the MPI tests at 1, 2 and 4 PEs.
# Usage: tests/run_all.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export SHMEMVM_TIMEOUT="${SHMEMVM_TIMEOUT:-30}"
MPIRUN="${MPIRUN:-mpirun}"
status=0
echo "== single process"
python -m pytest -q -m "not mpi" "$@" || status=1
# The agreement's two transports (SHMEMVM_AGREEMENT): the default at 1 and 2
# PEs, the shared-memory board for every heap at 4.
for n in 1 2 4; do
    agreement=auto
    [ "$n" = 4 ] && agreement=board
    echo "== mpirun -n $n (SHMEMVM_AGREEMENT=$agreement)"
    SHMEMVM_AGREEMENT=$agreement timeout 900 $MPIRUN -n "$n" \
        python -m pytest -q -p no:cacheprovider --with-mpi -m mpi "$@" || status=1
done
exit $status
