"""Run shmem4py example programs one after the other in one MPI job:

    mpiexec -n N python tests/helpers/shmem4py_examples.py [PROGRAM.py ...]

(by default every examples/shmem4py/*.py, in name order). Each program runs
unchanged, as its own __main__ (runpy), with sys.argv as if it ran alone; the
heap the first one makes at `from shmemvm import shmem` serves the rest, as
shmem4py's one OpenSHMEM initialisation would.

A program fails on a PE when it exits nonzero (the examples check their own
result and sys.exit(1)), raises, or prints FAILED. After each program the PEs
agree, in one allgather, on what happened everywhere: at the first program
that failed on any PE, PE 0 names it, the PEs and why, and every PE exits 1
without running the rest (a failed program can leave the heap out of step).
Exit status 0: every program passed on every PE.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
import time
import traceback
from pathlib import Path

from mpi4py import MPI

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "shmem4py"


class _Tee(io.TextIOBase):
    """Writes to the real stdout and keeps a copy, to look for FAILED."""

    def __init__(self, out):
        self.out, self.copy = out, io.StringIO()

    def write(self, text):
        self.copy.write(text)
        return self.out.write(text)

    def flush(self):
        self.out.flush()


def run_one(path: Path) -> str | None:
    """Run one program as __main__; None when it passed here, else why not."""
    saved_argv = sys.argv
    sys.argv = [str(path)]
    tee = _Tee(sys.stdout)
    try:
        with contextlib.redirect_stdout(tee):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as done:
        if done.code not in (None, 0):
            return f"exit status {done.code!r}"
    except BaseException:  # noqa: BLE001 - a program's error of any kind is its failure
        return "raised:\n" + traceback.format_exc(limit=-8)
    finally:
        sys.argv = saved_argv
        sys.stdout.flush()
    if "FAILED" in tee.copy.getvalue():
        return "printed FAILED"
    return None


def main(argv: list[str]) -> int:
    comm = MPI.COMM_WORLD
    programs = [Path(a).resolve() for a in argv] or sorted(EXAMPLES.glob("*.py"))
    if not programs:
        print(f"no example programs in {EXAMPLES}", file=sys.stderr)
        return 1
    for path in programs:
        start = time.perf_counter()
        failure = run_one(path)
        failures = comm.allgather(failure)
        if comm.rank == 0:
            print(f"-- {path.name} on {comm.size} PEs: "
                  f"{'passed' if not any(failures) else 'FAILED'} "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)
        if any(failures):
            if comm.rank == 0:
                for pe, why in enumerate(failures):
                    if why:
                        print(f"example {path.name} failed on PE {pe}: {why}", flush=True)
                print(f"stopped at {path.name}: the programs after it were not run",
                      flush=True)
            return 1
    if comm.rank == 0:
        print(f"all {len(programs)} example programs passed on {comm.size} PEs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
