"""The programs of examples/shmem4py/, written against shmem4py's API, run on
shmemvm at 1, 2 and 4 PEs (and at 4 PEs on two simulated nodes): each checks
its own result and exits nonzero when it is wrong. Single process: each PE
count is one mpiexec job that runs every program in turn
(tests/helpers/shmem4py_examples.py), ended at a deadline.

    python -m pytest -q -m "not mpi" tests/jobs/shmem/test_shmem4py_examples.py
"""

import os
import signal
import subprocess
import sys

import pytest

from util import REPO, clean_env, mpiexec, yield_when_oversubscribed

EXAMPLES = REPO / "examples" / "shmem4py"
NAMES = sorted(path.stem for path in EXAMPLES.glob("*.py"))
DRIVER = REPO / "tests" / "helpers" / "shmem4py_examples.py"
LIMIT = 300  # seconds per job (every program); a hang fails the test instead of the run


def test_every_named_example_is_there():
    assert set(NAMES) >= {"hello", "ping_pong", "rotate", "broadcast", "collect", "fcollect",
                          "alltoall", "pi", "lock_counter", "race_winner"}


def test_examples_change_only_the_import_line():
    """Under shmem4py only the import differs: no shmemvm name is used but that line."""
    for name in NAMES:
        lines = (EXAMPLES / f"{name}.py").read_text().splitlines()
        uses = [line for line in lines if "shmemvm" in line]
        assert uses == ["from shmemvm import shmem  # under shmem4py: from shmem4py import shmem"], name


def _run(n_pes: int, programs=(), node_split: int | None = None) -> subprocess.CompletedProcess:
    """The driver at `n_pes` PEs over `programs` (default: every example)."""
    env = clean_env("30")
    if node_split:
        env["SHMEMVM_NODE_SPLIT"] = str(node_split)
    else:
        # more PEs than cores: MPICH sleeps between polls (util.yield_when_oversubscribed;
        # on two simulated nodes, where the PEs talk through MPI, it saved nothing)
        yield_when_oversubscribed(env, n_pes)
    command = [mpiexec(), "-n", str(n_pes), sys.executable, str(DRIVER), *map(str, programs)]
    job = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        pytest.fail(f"the examples at -n {n_pes} did not finish within {LIMIT} s:\n"
                    f"{output[-3000:]}")
    return subprocess.CompletedProcess(command, job.returncode, output)


@pytest.mark.parametrize("n_pes,node_split", [(1, None), (2, None), (4, None), (4, 2)],
                         ids=["n1", "n2", "n4", "n4-two-nodes"])
def test_every_example_runs_and_checks_itself(n_pes, node_split):
    """On two simulated nodes (SHMEMVM_NODE_SPLIT=2) puts, atomics, locks and
    collectives between the halves take the MPI path."""
    result = _run(n_pes, node_split=node_split)
    assert result.returncode == 0, result.stdout[-6000:]
    passed = [name for name in NAMES if f"-- {name}.py on {n_pes} PEs: passed" in result.stdout]
    assert passed == NAMES, result.stdout[-6000:]


PASSES = """\
from shmemvm import shmem
shmem.barrier_all()
"""
FAILS_ON_PE_1 = """\
import sys
from shmemvm import shmem
shmem.barrier_all()
if shmem.my_pe() == 1:
    print("PE 1: FAILED: wrong on purpose")
    sys.exit(1)
"""


def test_the_driver_names_the_program_that_failed_and_stops(tmp_path):
    """A program that fails on one PE only is named, with that PE and its exit
    status, on PE 0's output; the job fails and runs nothing after it."""
    programs = []
    for name, text in (("a_passes", PASSES), ("b_fails_on_pe_1", FAILS_ON_PE_1),
                       ("c_never_runs", PASSES)):
        programs.append(tmp_path / f"{name}.py")
        programs[-1].write_text(text)
    result = _run(2, programs)
    assert result.returncode != 0, result.stdout
    assert "-- a_passes.py on 2 PEs: passed" in result.stdout, result.stdout
    assert "example b_fails_on_pe_1.py failed on PE 1: exit status 1" in result.stdout, \
        result.stdout
    assert "failed on PE 0" not in result.stdout and "c_never_runs" not in result.stdout, \
        result.stdout
