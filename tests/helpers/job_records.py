"""What the MPI jobs of the reliability tests share: each PE records its
outcome as OUTDIR/pe<N>.json (written whole, then renamed, so the test never
reads half a file), and ends by finalizing its heap, recording, and serving
MPI until every PE has reported, then leaving without MPI_Finalize (which
would wait for PEs that will never call it). Imported by the scripts beside
it, which run with this folder first on sys.path."""

import json
import os
import sys
import time

from mpi4py import MPI


def record(outdir: str, pe: int, /, **fields) -> None:
    """OUTDIR/pe<pe>.json holds `fields` (which may have a "pe" of their own)."""
    path = os.path.join(outdir, f"pe{pe}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(fields, out)
    os.rename(path + ".tmp", path)


def finalize_into(heap, fields: dict) -> None:
    """finalize() `heap`; its error (if any) and how long it took go into `fields`."""
    start = time.monotonic()
    try:
        heap.finalize()
    except Exception as exc:  # noqa: BLE001 - recorded
        fields["finalize_error"] = type(exc).__name__
    fields["finalize_elapsed"] = time.monotonic() - start


def next_case() -> None:
    """Wait until every PE is done with the case before (an MPI barrier, without
    deadline: a job's hang ends at its dump), sleeping between tests of it rather than
    spinning: the PEs that wait for a stopped one would take the cores from the rest."""
    request = MPI.COMM_WORLD.Ibarrier()
    while not request.Test():
        time.sleep(0.01)


def finish(heap, outdir: str, pe: int, n_pes: int, fields: dict) -> None:
    """finalize() `heap` (its error and time added to `fields`), record
    `fields` for PE `pe` (this one), stay (serving MPI, at most 30 s) until every PE has
    reported (or died), so that no PE's next MPI operation waits for one
    that left, then exit."""
    finalize_into(heap, fields)
    record(outdir, pe, **fields)
    until = time.monotonic() + 30
    while time.monotonic() < until and not all(
            os.path.exists(os.path.join(outdir, f"pe{pe}.json")) for pe in range(n_pes)):
        MPI.COMM_WORLD.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        time.sleep(0.01)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
