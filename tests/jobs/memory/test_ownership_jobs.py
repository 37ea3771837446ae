"""Ownership rules of the symmetric heap (tests/mpi/memory/test_ownership.py
states them) in cases that kill the process where the rules are broken
(SIGSEGV): one 2-PE job (tests/helpers/ownership_scenarios.py) runs them one
after another, each on heaps of its own (a job each took two more start-ups of
the PEs: issue 33, item 16), from the `jobs` phase of tests/run_all.sh:

    python -m pytest -q -p no:cacheprovider -m "not mpi" tests/jobs/memory/test_ownership_jobs.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from util import REPO, clean_env, mpiexec, run_jobs, split_shared

HELPER = REPO / "tests" / "helpers" / "ownership_scenarios.py"
JOB_LIMIT = 150          # seconds for the helper's job


# ---------------------------------------------------------------------------
# cases that crash the process where the rules are broken: own 2-PE jobs
# ---------------------------------------------------------------------------

#: in the order the job runs them: outlive first (it checks that no shmemvm mapping is
#: there at its start)
SCENARIOS = ("outlive", "save_ptr", "evict")


@pytest.fixture(scope="module")
def scenario_results():
    """Every scenario's records from the one 2-PE job, as if it had a job of its own."""
    launcher = mpiexec()
    root = Path(tempfile.mkdtemp(prefix="shmemvm-ownership-"))
    try:
        results = run_jobs(root, {"all": ([launcher, "-n", "2", sys.executable, str(HELPER),
                                           "+".join(SCENARIOS), str(root / "all")],
                                          clean_env())}, JOB_LIMIT, 2)
        split_shared(results, "all", root / "all", SCENARIOS, 2)
        yield results
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_in_its_own_job(scenario_results, scenario):
    """save_ptr: torch.save/pickle/clone/str of ptr views (today: SIGSEGV, the
    storage spans the peer's whole window); outlive: tensors outliving
    finalize(); evict: a deferred block under budget pressure and trim()."""
    result = scenario_results[scenario]
    lines = [f"returncode {result['returncode']}"]
    ok = result["returncode"] == 0
    for pe in range(2):
        report = result["records"].get(pe)
        if report is None:
            lines.append(f"PE {pe}: no report")
            ok = False
            continue
        failed = [c for c in report["checks"] if not c["ok"]]
        ok = ok and report["done"] and not failed
        lines.append(f"PE {pe}: done={report['done']}, last stage {report['stage']!r}, "
                     f"{len(report['checks']) - len(failed)} checks passed, failed: "
                     + ("; ".join(f"{c['name']} [{c['detail'][:120]}]" for c in failed) or "-")
                     + (f"; error: {report['error'][-800:]}" if report.get("error") else ""))
    assert ok, "\n".join(lines) + f"\n--- job log ---\n{result['log']}"
