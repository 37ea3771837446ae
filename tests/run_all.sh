#!/usr/bin/env bash
# The whole test suite, exactly what CI runs (.ci/run) and the README gives:
#   single     python -m pytest -m "not mpi"                  tests/unit, tests/gpu
#   jobs       python -m pytest -m "not mpi"                  tests/jobs: one process that
#              starts MPI jobs of its own; it and then n1 run beside the others (below)
#   n1 n2      mpirun -n N python -m pytest --with-mpi -m mpi tests/mpi, tests/gpu
#   n4         the same at -n 4, for the files where 4 PEs prove more than 2 (N4_TESTS)
#   n4-network tests/mpi/transport/test_multinode.py at -n 4 on two simulated nodes,
#              with MPICH on its network transport (below)
# Every phase prints why each test skipped (-rs) and fails when more tests skip than
# tests/skip_budget allows. A hung test fails alone at pytest-timeout's per-test limit
# (pyproject.toml); a phase still running after PHASE_LIMIT seconds is stopped, and the
# tests each rank was running are named. Under mpirun, rank 0 prints to the console and
# the other ranks write to log files, shown when that rank failed.
# Usage: tests/run_all.sh [extra pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
export SHMEMVM_TIMEOUT="${SHMEMVM_TIMEOUT:-30}"
MPIRUN="${MPIRUN:-mpirun}"
# well above the per-test limit (300 s): it stops only a phase that hangs as a whole
PHASE_LIMIT="${PHASE_LIMIT:-1800}"
BUDGET=tests/skip_budget
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/shmemvm-tests.XXXXXX")
PHASES=()   # in the order they started; each writes $LOGS/<phase>.summary

budget_of() {  # the skip budget of phase $1
    awk -v phase="$1" '$1 == phase { print $2; found = 1 } END { exit !found }' "$BUDGET" || {
        echo "run_all.sh: $BUDGET has no line for phase $1" >&2
        exit 2
    }
}

cpu_seconds() {  # user + system seconds of the children, from `times` written to file $1
    awk 'END { t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] }
               printf "%d", t }' "$1"
}

# The command, in a subshell that writes its children's CPU time (`times`) to $1:
# a phase's own, not a background phase's that this shell reaped meanwhile
timed() {
    local out=$1
    shift
    ( "$@"; rc=$?; times > "$out"; exit $rc )
}

# Run phase $1 (ranks: $2, 0 for one process) with the command after them; check its
# status and its skips against the budget, and say what ran when it was stopped. Its
# line of the summary goes to $LOGS/$1.summary, with "failed" in $LOGS/$1.failed.
phase() {
    local name=$1 ranks=$2 dir="$LOGS/$1" start=$SECONDS rc=0 budget skips=0 progress log n
    shift 2
    budget=$(budget_of "$name") || exit 2
    mkdir -p "$dir"
    echo "0m0s 0m0s" > "$dir/times"
    if [ "$ranks" = 0 ]; then
        SHMEMVM_TEST_PROGRESS="$dir/rank0.progress" \
            timed "$dir/times" timeout -k 60 "$PHASE_LIMIT" "$@"
        rc=$?
    else
        timed "$dir/times" \
            timeout -k 60 "$PHASE_LIMIT" "$MPIRUN" -n "$ranks" bash tests/rank_output.sh "$dir" "$@"
        rc=$?
    fi
    local took=$((SECONDS - start)) used verdict=passed
    used=$(cpu_seconds "$dir/times")
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        verdict="stopped after $PHASE_LIMIT s"
        echo "!! phase $name ran past its limit of $PHASE_LIMIT s (PHASE_LIMIT) and was" \
             "stopped; each rank was then:"
        for progress in "$dir"/rank*.progress; do
            [ -e "$progress" ] && echo "!!   $(basename "$progress" .progress):" \
                                       "$(head -n 1 "$progress")"
        done
    elif [ "$rc" != 0 ]; then
        verdict=failed
    fi
    # the other ranks' output (rank 0's is on the console), where one did not pass
    for log in "$dir"/rank*.log; do
        [ -e "$log" ] || continue
        if ! grep -qx "exit status 0" "${log%.log}.progress" 2>/dev/null; then
            echo "!! $(basename "$log" .log) of phase $name did not pass; the end of its" \
                 "output ($log):"
            tail -n 60 "$log"
        fi
    done
    # skips: the most any rank had
    for progress in "$dir"/rank*.progress; do
        n=$(sed -n 's/^skipped \([0-9]*\)$/\1/p' "$progress")
        [ -n "$n" ] && [ "$n" -gt "$skips" ] && skips=$n
    done
    if [ "$skips" -gt "$budget" ]; then
        verdict="$verdict, over its skip budget"
        echo "!! phase $name skipped $skips tests, more than its budget of $budget" \
             "($BUDGET); each skip and why:"
        grep -h '^skip ' "$dir"/rank*.progress | sort -u | sed 's/^skip /!!   /'
        rc=1
    fi
    [ "$rc" = 0 ] || echo failed > "$LOGS/$name.failed"
    printf '%-11s %-30s %4s s (CPU %4s s)  %3s skipped (budget %s)\n' \
        "$name" "$verdict" "$took" "$used" "$skips" "$budget" > "$LOGS/$name.summary"
}

# -rfEs: the short summary names each failure and error, and why each test skipped
PYTEST=(python -m pytest -rfEs)
MPI_PYTEST=(python -m pytest -rfEs -p no:cacheprovider --with-mpi -m mpi)

# The agreement's two transports (SHMEMVM_AGREEMENT): the default (auto) at 1
# and 2 PEs, which is the board where every PE has the compiled piece, else the
# MPI allreduce here (MPICH has persistent collectives); the board for every
# heap at 4, the Python board too (heaps with native=0).

# At 4 PEs, the files where 4 PEs prove more than 2: teams (splits, strides, a team
# that is not the world), collectives and all_reduce (trees and rings of more than
# two), the agreement and its board (several PEs contributing, the vote), the node
# paths and the off-node path on one machine (two simulated nodes of two PEs),
# locks (a queue of several waiters), atomics under contention from three PEs,
# the device collectives, and test_exchange.py's test that needs 3 PEs. Every
# other file runs at 1 and 2 PEs (n1, n2) as before: at 4 it proved the same
# things as at 2, at 4 PEs' cost on two cores (issue 33, item 16). The README's
# "Tests" names these files (tests/unit/test_run_all.py checks).
N4_TESTS=(
    tests/mpi/agreement
    tests/mpi/native/test_native_vote.py
    tests/mpi/node
    tests/mpi/openshmem/test_teams.py
    tests/mpi/openshmem/test_all_reduce.py
    tests/mpi/openshmem/test_nodecoll.py
    tests/mpi/openshmem/test_locks.py
    tests/mpi/shmem/test_shmem_nodecoll.py
    tests/mpi/transport
    tests/mpi/device/test_ccl.py
    tests/mpi/device/test_device_allreduce.py
)

# 4 PEs on 2 cores: MPICH busy-polls while it waits, so a waiting PE keeps a core
# from a working one. MPIR_CVAR_ENABLE_HEAVY_YIELD=1 (mpivars: "use nanosleep to
# ensure other threads have a chance to grab the lock"; mpi4py initialises MPI at
# MPI_THREAD_MULTIPLE) made the same tests take less CPU and wall time, measured
# on this 2-core VM (loaded, two runs each): test_agreement.py at -n 4 took 99-105 s
# and 41-44 CPU-s without it, 51-52 s and 24-27 CPU-s with it; test_teams.py 53 s /
# 29 CPU-s against 35 s / 18 CPU-s. At 2 PEs it changed nothing measurable, the
# jobs phase (mostly start-up) took no less, and over TCP (n4-network) it made
# test_multinode.py slower (41-49 s against 18-32 s, the same CPU): the sleep
# delays the network's progress. So only the n4 phase sets it, and in the jobs phase
# the jobs of more PEs than cores (tests/util.py: yield_when_oversubscribed).

# The off-node path between two simulated nodes (SHMEMVM_NODE_SPLIT=2), with MPI
# itself off shared memory, so "another node" is as real as one machine allows:
# - MPIR_CVAR_NOLOCAL=1: MPICH takes every other process for one on another node, so
#   none of its traffic goes through its shared-memory module;
# - UCX_TLS=tcp,self: its network module (UCX in the mpich wheel) would still reach
#   processes of this machine through shared memory of its own (sysv; cma for puts
#   and gets, which UCX_PROTO_INFO=y shows as "cma/memory"); so restricted, it
#   goes through the kernel's TCP stack ("tcp/eth0"). FI_PROVIDER=tcp does the same
#   for MPICH's other network module (OFI), should a build pick that one.
# Those are MPICH's settings; under another MPI this phase is not run.
network_phase() {
    echo "== mpirun -n 4, two simulated nodes, MPI over TCP (MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self)"
    if python -c "from mpi4py import MPI; import sys; sys.exit('MPICH' not in MPI.Get_library_version())"
    then
        SHMEMVM_NODE_SPLIT=2 MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self FI_PROVIDER=tcp \
            phase n4-network 4 "${MPI_PYTEST[@]}" tests/mpi/transport/test_multinode.py "$@"
    else
        echo "not run: the MPI here is not MPICH, whose settings these are"
        printf '%-11s %s\n' n4-network 'not run (not MPICH)' > "$LOGS/n4-network.summary"
    fi
}

# Two lanes (CI has 2 cores). In the background, one process at a time: the jobs
# phase (it mostly waits on its jobs' start-up and deadlines), then n1, then
# n4-network; their output is printed when they are done. In the foreground: single,
# n2 and n4, whose PEs use the other core and the jobs' waits. (n1 in the foreground
# made that lane the longer one: single is one process, and n4 no longer outweighs
# jobs; n4-network went to the background when the foreground was the longer lane by
# 77 s in the rehearsal at b4f51a1: 524 s against 447 s.)
PHASES+=(jobs n1 n4-network)
(
    phase jobs 0 "${PYTEST[@]}" -p no:cacheprovider -m "not mpi" tests/jobs "$@" \
        > "$LOGS/jobs.out" 2>&1
    SHMEMVM_AGREEMENT=auto phase n1 1 "${MPI_PYTEST[@]}" tests/mpi tests/gpu "$@" \
        > "$LOGS/n1.out" 2>&1
    network_phase "$@" > "$LOGS/n4-network.out" 2>&1
) &
background=$!
echo "== single process (the jobs phase, then mpirun -n 1, then n4-network, run beside this and the MPI phases)"
PHASES+=(single)
phase single 0 "${PYTEST[@]}" -m "not mpi" tests/unit tests/gpu "$@"
echo "== mpirun -n 2 (SHMEMVM_AGREEMENT=auto)"
PHASES+=(n2)
SHMEMVM_AGREEMENT=auto phase n2 2 "${MPI_PYTEST[@]}" tests/mpi tests/gpu "$@"
echo "== mpirun -n 4 (SHMEMVM_AGREEMENT=board): ${N4_TESTS[*]} tests/gpu"
PHASES+=(n4)
MPIR_CVAR_ENABLE_HEAVY_YIELD=1 SHMEMVM_AGREEMENT=board \
    phase n4 4 "${MPI_PYTEST[@]}" "${N4_TESTS[@]}" tests/gpu "$@"

wait "$background"
for name in jobs n1 n4-network; do
    echo "== $name (ran beside the phases above): its output"
    cat "$LOGS/$name.out"
done
echo "== summary"
status=0
for name in "${PHASES[@]}"; do
    cat "$LOGS/$name.summary" 2>/dev/null || printf '%-11s %s\n' "$name" "ended without a summary"
    if [ -e "$LOGS/$name.failed" ] || [ ! -e "$LOGS/$name.summary" ]; then status=1; fi
done
echo "all phases: $SECONDS s"
if [ "$status" = 0 ]; then
    rm -rf "$LOGS"
else
    echo "every rank's output and progress: $LOGS"
fi
exit $status
