#!/usr/bin/env bash
# Issue 30's measurement: shmemvm against shmem4py 1.0 on Open MPI 4.1.6's OSHMEM at
# 2, 4, 8 and 16 PEs on the device machine's 16 CPU cores (no GPU used), in about
# 8 minutes of wall time. Run from the repository root, as root, with $OUT set:
#
#     bash benchmarks/device/oshmem_scaling.sh [WHEELS]       (WHEELS: .whl/osh)
#
# WHEELS holds cffi's and pycparser's cp312 wheels and shmem4py's sdist, downloaded
# on a machine with PyPI (the device machine has none):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#       -d .whl/osh cffi pycparser
#     python3 -m pip download --no-deps --no-binary :all: -d .whl/osh shmem4py==1.0.0
# and the device run carries it (carry: [".whl"]).
#
# Steps: shmem4py built against OSHMEM with oshcc into /tmp/osh (the recipe of the
# workplace's oshmem-on-device.sh); shmemvm's compiled pieces built in place
# (build_compiled.sh); then `python -m benchmarks host-vs-oshmem` (--rows goal: issue 30's
# rows) with OSHMEM under `oshrun --allow-run-as-root --oversubscribe` and shmemvm
# under `/usr/bin/mpirun --allow-run-as-root --oversubscribe`, alternating, every PE
# count in turn round by round, within what is left of BUDGET seconds (default 480).
# A launch whose PEs all wrote their results is kept where OSHMEM then aborts or
# hangs at exit.
#
# Iterations, the trade-off: up to ROUNDS (5) rounds of 5 timed loops of >= 10 ms
# per operation and implementation (up to 25 samples each side), the NumPy face
# only (TORCH=1 adds the torch API: half as many launches again, so fewer rounds
# fit). A launch should cost about 5-15 s there, most of it Python's and torch's
# import and the heap's set-up on every PE, the timed loops about 2 s: a round of
# all four counts about a minute, so 3-5 rounds fit after shmem4py's build. Longer
# loops would steady each sample but leave fewer rounds, and the rounds are what
# spreads the figures over the machine's moods. --deadline leaves out the rounds
# that would not end in time (every count keeps its first), and each result notes
# the rounds it lacks.
#
# $OUT gets: log.txt (everything printed), summary.md (issue 30's table over the
# counts and each count's table), results.tar.gz (host-vs-oshmem-16core-<N>pe.json
# and .png per count, -scaling.png and -scaling.md). To store them: untar into
# benchmarks/results/ of the commit that ran (the results record it).
#
# Settings (environment): BUDGET (seconds in all, 480), PES (2,4,8,16), ROUNDS (5), TORCH (0),
# NAME (host-vs-oshmem-16core); for a dry run elsewhere, PY (the Python, python3's)
# and SVMPIRUN (shmemvm's mpirun command, Open MPI's as above).
set -u -o pipefail
W=${1:-.whl/osh}
: "${OUT:?set OUT to the folder for the results}"
START=$SECONDS
BUDGET=${BUDGET:-480}
NAME=${NAME:-host-vs-oshmem-16core}
PES=${PES:-2,4,8,16}
ROUNDS=${ROUNDS:-5}
PY=${PY:-$(command -v python3)}
SVMPIRUN=${SVMPIRUN:-/usr/bin/mpirun --allow-run-as-root --oversubscribe}
export PYTHONUNBUFFERED=1 SHMEMVM_TIMEOUT=${SHMEMVM_TIMEOUT:-120}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

main() {
echo "== where: $(nproc) cores; $($PY --version); $(command -v oshrun oshcc | tr '\n' ' ')"
/usr/bin/mpirun --version 2>&1 | head -1
git log --oneline -1 2>&1 | head -1; git status --porcelain 2>&1 | head -5

echo "== shmem4py 1.0 on OSHMEM ($((SECONDS - START)) s)"
if ls /tmp/osh/shmem4py/*.so 2>/dev/null; then
    echo "already built (a warm machine)"
else
    $PY -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/osh-deps \
        "$W"/cffi-*.whl "$W"/pycparser-*.whl || { echo "FAILED: cffi/pycparser from $W"; exit 1; }
    src=$(mktemp -d); tar xzf "$W"/shmem4py-1.0.0.tar.gz -C "$src" || exit 1
    (cd "$src"/shmem4py-1.0.0 && PYTHONPATH=/tmp/osh-deps CC=oshcc $PY -m pip install -q \
        --no-build-isolation --no-deps --no-index --upgrade --target /tmp/osh .) \
        || { echo "FAILED: shmem4py's build against OSHMEM"; exit 1; }
    ls /tmp/osh/shmem4py/*.so || exit 1
    rm -rf "$src"
fi

echo "== shmemvm's compiled piece ($((SECONDS - START)) s)"
PY="$PY" bash benchmarks/device/build_compiled.sh
$PY -m shmemvm info 2>&1 | head -8

LEFT=$((BUDGET - (SECONDS - START) - 30))
echo "== the benchmark, $LEFT s for it ($((SECONDS - START)) s so far)"
TORCHARG=--no-torch; [ "${TORCH:-0}" = 1 ] && TORCHARG=
rm -rf /tmp/vs; mkdir -p /tmp/vs
$PY -m benchmarks host-vs-oshmem --pes "$PES" --rows goal $TORCHARG --rounds "$ROUNDS" --repeat 5 \
    --min-time 0.01 --deadline "$LEFT" --timeout 150 --exit-grace 15 \
    --oshmem-python "$PY" --oshmem-pythonpath /tmp/osh:/tmp/osh-deps \
    --mpirun "$SVMPIRUN" \
    --out-dir /tmp/vs --name "$NAME" > /tmp/vs/tables.md
echo "benchmark exit: $?"
ls /tmp/vs/"$NAME"-*pe.json >/dev/null 2>&1 || { echo "FAILED: no result"; cat /tmp/vs/tables.md; exit 1; }
[ -f /tmp/vs/"$NAME"-scaling.png ] || $PY -m benchmarks host-vs-oshmem --redraw --out-dir /tmp/vs --name "$NAME"
{ cat /tmp/vs/"$NAME"-scaling.md; echo; cat /tmp/vs/tables.md; } > "$OUT/summary.md"
tar czf "$OUT/results.tar.gz" -C /tmp/vs --exclude tables.md .
cat "$OUT/summary.md"
echo "== done in $((SECONDS - START)) s"
}

main "$@" 2>&1 | tee -a "$OUT/log.txt"
