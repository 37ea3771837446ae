"""The programs of examples/shmem4py/, written against shmem4py's API, run on
shmemvm at 1, 2 and 4 PEs (and at 4 PEs on two simulated nodes): each checks
its own result and exits nonzero when it is wrong. Single process: each run is
an mpiexec job of its own, ended at a deadline.

    python -m pytest -q -m "not mpi" tests/unit/shmem/test_shmem4py_examples.py
"""

import os
import signal
import subprocess
import sys

import pytest

from util import REPO, clean_env, mpiexec

EXAMPLES = REPO / "examples" / "shmem4py"
NAMES = sorted(path.stem for path in EXAMPLES.glob("*.py"))
LIMIT = 180  # seconds per job; a hang fails the test instead of the run


def test_every_named_example_is_there():
    assert set(NAMES) >= {"hello", "ping_pong", "rotate", "broadcast", "collect", "fcollect",
                          "alltoall", "pi", "lock_counter", "race_winner"}


def test_examples_change_only_the_import_line():
    """Under shmem4py only the import differs: no shmemvm name is used but that line."""
    for name in NAMES:
        lines = (EXAMPLES / f"{name}.py").read_text().splitlines()
        uses = [line for line in lines if "shmemvm" in line]
        assert uses == ["from shmemvm import shmem  # under shmem4py: from shmem4py import shmem"], name


def _run(name: str, n_pes: int, node_split: int | None = None) -> subprocess.CompletedProcess:
    env = clean_env("30")
    if node_split:
        env["SHMEMVM_NODE_SPLIT"] = str(node_split)
    command = [mpiexec(), "-n", str(n_pes), sys.executable, str(EXAMPLES / f"{name}.py")]
    job = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        pytest.fail(f"{name} at -n {n_pes} did not finish within {LIMIT} s:\n{output[-3000:]}")
    return subprocess.CompletedProcess(command, job.returncode, output)


#: examples also run on two simulated nodes (the MPI path of puts, atomics, locks,
#: collectives); the others add nothing there but minutes of CI
ON_TWO_NODES = ("rotate", "alltoall", "collect", "lock_counter", "race_winner")


@pytest.mark.parametrize("n_pes,node_split", [(1, None), (2, None), (4, None)],
                         ids=["n1", "n2", "n4"])
@pytest.mark.parametrize("name", NAMES)
def test_example_runs_and_checks_itself(name, n_pes, node_split):
    _check(name, n_pes, node_split)


@pytest.mark.parametrize("name", ON_TWO_NODES)
def test_example_runs_on_two_simulated_nodes(name):
    _check(name, 4, 2)


def _check(name, n_pes, node_split):
    result = _run(name, n_pes, node_split)
    assert result.returncode == 0, f"{name} at -n {n_pes}:\n{result.stdout[-3000:]}"
    assert "FAILED" not in result.stdout
