#!/usr/bin/env bash
# One MPI rank of a run_all.sh phase: rank 0 prints to the console, every other
# rank only to DIR/rank<N>.log, which run_all.sh shows when that rank failed; so
# pytest-mpi's banner and summary print once. conftest.py keeps
# DIR/rank<N>.progress: the test running now, then the exit status and the skips.
# Usage: mpirun -n N bash tests/rank_output.sh DIR command...
set -eu
dir=$1
shift
# MPICH (hydra) sets PMI_RANK, Open MPI OMPI_COMM_WORLD_RANK, PMIx launchers PMIX_RANK
rank=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-}}}
if [ -z "$rank" ]; then
    echo "rank_output.sh: no rank in the environment (PMI_RANK, OMPI_COMM_WORLD_RANK," \
         "PMIX_RANK): run it under mpirun" >&2
    exit 2
fi
export SHMEMVM_TEST_PROGRESS="$dir/rank$rank.progress"
# exec: the launcher's signals reach the command itself, not this shell
if [ "$rank" = 0 ]; then
    exec "$@"
fi
exec "$@" > "$dir/rank$rank.log" 2>&1
