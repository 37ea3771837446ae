#!/usr/bin/env bash
# Cached malloc/free latency of this checkout against an older revision, at 2 PEs,
# in alternating runs of this checkout's `python -m benchmarks malloc` (the same benchmark
# code and machine state for both sides; only the library differs).
# Usage: tools/malloc_vs_revision.sh REV [ROUNDS]   e.g. tools/malloc_vs_revision.sh 793bc14 3
# Needs the checkout's environment (torch, mpi4py, mpirun); each side's `shmemvm` is put first
# on sys.path (the old revision from a temporary git worktree) and an editable install's
# import hook is set aside, so the right library runs whatever is installed; `benchmarks`
# always comes from this checkout.
set -euo pipefail
rev=$1; rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$work/old" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$here" worktree add -q --detach "$work/old" "$rev"
mkdir "$work/oldlib" && ln -s "$work/old/shmemvm" "$work/oldlib/shmemvm"   # its library alone
cat > "$work/run.py" <<'PY'
import runpy, sys
source, here = sys.argv.pop(1), sys.argv.pop(1)
# meson-python's editable install finds `shmemvm` before sys.path does: set it aside
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "MesonpyMetaFinder"]
sys.path.insert(0, source)
import shmemvm
assert shmemvm.__file__.startswith(source), (shmemvm.__file__, source)
sys.path.insert(1, here)      # after `source`: this checkout's benchmarks, not its shmemvm
runpy.run_module("benchmarks", run_name="__main__", alter_sys=True)
PY
for i in $(seq "$rounds"); do
    for side in old new; do
        src=$here; [ "$side" = old ] && src=$work/oldlib
        mpirun -n 2 python "$work/run.py" "$src" "$here" malloc --json "$work/$side$i.json" >/dev/null 2>&1
    done
done
python - "$work" "$rounds" "$rev" <<'PY'
import json, statistics, sys
work, rounds, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def pairs(side):
    out = {}
    for i in range(1, rounds + 1):
        data = json.load(open(f"{work}/{side}{i}.json"))
        per = {}
        for r in data["measurements"]:   # benchmarks/schema.py; figures are medians
            # the cached figures against MPI.Barrier (not the board-vs-MPI comparison's)
            if r["params"].get("kind") == "cached" and (r["baseline"] or {}).get("name") == \
                    "MPI.Barrier":
                per[(r["name"], r["params"]["bytes"])] = r["value"]["median"]
        for size in {b for _, b in per}:
            out.setdefault(size, []).append(per[("malloc.latency", size)] + per[("free.latency", size)])
    return out
old, new = pairs("old"), pairs("new")
for size in sorted(old):
    o, n = statistics.median(old[size]), statistics.median(new[size])
    print(f"cached malloc+free of {size} B at 2 PEs: {rev} {o:.1f} us, this checkout {n:.1f} us, "
          f"ratio {n / o:.2f} (medians of {rounds} alternating runs)")
PY
