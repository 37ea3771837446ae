"""Helpers for tests: what this process holds, to check that nothing leaks, and
how to start a small MPI job of our own."""

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def open_fds() -> set[str]:
    """Open descriptors as 'fd->target' (the listing's own descriptor left out)."""
    gc.collect()
    entries = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the directory descriptor used for the listing itself
        if not target.startswith("/proc/"):
            entries.add(f"{fd}->{target}")
    return entries


def shmemvm_mappings() -> list[str]:
    """Lines of /proc/self/maps that are shmemvm's memfd pieces."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "memfd:shmemvm" in line]



def mpiexec() -> str:
    """The mpiexec to start jobs with ($MPIEXEC, next to python, or on PATH); skips
    the test where there is none."""
    candidates = [os.environ.get("MPIEXEC"), str(Path(sys.executable).parent / "mpiexec"),
                  shutil.which("mpiexec")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no mpiexec found (set MPIEXEC)")


def is_hydra(launcher: str) -> bool:
    """Whether `launcher` is MPICH's hydra (the job tests rely on how it ends a
    job, e.g. -disable-auto-cleanup)."""
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in out.stdout + out.stderr


def clean_env(timeout_env: str | None = None) -> dict[str, str]:
    """Our environment minus what an enclosing MPI launch put there (a nested
    mpiexec would take it for its own) and minus SHMEMVM_* settings; the
    repository on PYTHONPATH; SHMEMVM_TIMEOUT=`timeout_env` where given."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPI_LOCALRANKID",
                                "MPI_LOCALNRANKS", "OMPI_", "SHMEMVM_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if timeout_env is not None:
        env["SHMEMVM_TIMEOUT"] = timeout_env
    return env


def yield_when_oversubscribed(env: dict[str, str], n_pes: int) -> dict[str, str]:
    """`env`, with MPIR_CVAR_ENABLE_HEAVY_YIELD=1 where a job of `n_pes` PEs over
    MPICH's shared memory has more PEs than this machine has cores.

    MPICH busy-polls while it waits, so a waiting PE keeps a core from a working
    one; with it MPICH sleeps (nanosleep) between polls (see tests/run_all.sh's n4
    phase). Measured on the 2-core VM beside other work (load 4-7, as in CI's jobs
    phase), `pytest tests/jobs/... -k ...` under /usr/bin/time, 3 runs each: the
    shmem4py suite at 4 PEs took 44, 43, 38 CPU-s (55, 31, 28 s) without it and 29,
    29, 28 CPU-s (19, 24, 18 s) with it; the examples at 4 PEs 14.2, 14.9, 12.7
    CPU-s against 11.8, 12.9, 13.0. Not for jobs whose PEs talk through MPI's
    progress: the examples on two simulated nodes took the same (14.0 against 14.2
    CPU-s), and over TCP it made test_multinode.py slower; nor for the fault and
    timeout jobs, whose deadlines it was not measured against."""
    if n_pes > (os.cpu_count() or 1):
        env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
    return env


def agreement_env() -> dict[str, str]:
    """clean_env(), with this run's SHMEMVM_AGREEMENT (board or mpi) passed on, so
    that the jobs a test starts run with either agreement transport."""
    env = clean_env()
    if os.environ.get("SHMEMVM_AGREEMENT"):
        env["SHMEMVM_AGREEMENT"] = os.environ["SHMEMVM_AGREEMENT"]
    return env


def run_jobs(root: Path, jobs: dict, limit: float, n_pes: int, at_once: int | None = None) -> dict:
    """Run MPI jobs side by side, at most `at_once` at a time (None: all at once), the
    next one started as soon as one ends. `jobs` maps a name to (command, env); each
    job writes pe<N>.json records into root/<name> (made here; its command names it).
    Returns name -> {"returncode" (None: killed `limit` s after it started), "ended"
    (time.time() when it was seen to end), "records" {pe: dict}, "log" (its output's
    tail)}, in the order of `jobs`. Nothing it started outlives it."""
    waiting = list(jobs.items())
    running: dict = {}    # name -> (process, log, when it started)
    results = {}
    try:
        while waiting or running:
            while waiting and len(running) < (at_once or len(jobs)):
                name, (command, env) = waiting.pop(0)
                (root / name).mkdir(parents=True, exist_ok=True)
                log = open(root / name / "job.log", "w")
                running[name] = (subprocess.Popen(command, env=env, stdout=log,
                                                  stderr=subprocess.STDOUT, cwd=REPO,
                                                  start_new_session=True), log, time.monotonic())
            time.sleep(0.05)
            for name, (job, log, start) in list(running.items()):
                returncode = job.poll()
                if returncode is None:
                    if time.monotonic() - start < limit:
                        continue
                    os.killpg(job.pid, 9)
                    job.wait()
                ended = time.time()
                log.close()
                del running[name]
                records = {pe: json.loads((root / name / f"pe{pe}.json").read_text())
                           for pe in range(n_pes) if (root / name / f"pe{pe}.json").exists()}
                results[name] = {"returncode": returncode, "ended": ended, "records": records,
                                 "log": (root / name / "job.log").read_text()[-4000:]}
        return {name: results[name] for name in jobs}
    finally:
        for job, log, _ in running.values():
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait()
            log.close()


@contextlib.contextmanager
def job_outcomes(prefix: str, jobs_in, limit: float, n_pes: int, at_once: int | None = None):
    """run_jobs() over a fresh folder named `prefix`...: `jobs_in(root)` gives its
    jobs (name -> (command, env), each writing into root/<name>), run `at_once` at a
    time (None: all at once); yields their results. Afterwards the folder goes, and so
    do the heap directories that a killed or dead PE left behind (a record's
    "directory")."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    results: dict = {}
    try:
        results.update(run_jobs(root, jobs_in(root), limit, n_pes, at_once))
        yield results
    finally:
        for result in results.values():
            for record in result["records"].values():
                directory = record.get("directory", "")
                if Path(directory).name.startswith("shmemvm-"):
                    shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def split_shared(results: dict, job: str, folder: Path, names, n_pes: int) -> None:
    """The results of job `job`, whose scenarios `names` each recorded into
    folder/<name>/, replaced by one result per scenario as if each had its own
    job: its records, the shared job's end and log."""
    shared = results.pop(job)
    for name in names:
        records = {pe: json.loads((folder / name / f"pe{pe}.json").read_text())
                   for pe in range(n_pes) if (folder / name / f"pe{pe}.json").exists()}
        results[name] = {**shared, "records": records}


def barrier_interrupted_on_pe_1(heap) -> None:
    """heap.barrier_all() whose wait for the other PEs is interrupted on PE 1
    (KeyboardInterrupt, as Ctrl-C would) after PE 0 is late for it; checks that
    only PE 1 saw the interrupt. The next steps must still agree everywhere."""
    from shmemvm.core.state import parts_of
    agreement, real = parts_of(heap).agreement, parts_of(heap).agreement.wait_until
    if heap.my_pe == 1:
        def interrupted(ready, what, *step):   # (step: which wait of the step)
            agreement.wait_until = real
            raise KeyboardInterrupt
        agreement.wait_until = interrupted
    else:
        time.sleep(0.2)  # PE 1 finds the step not done and waits
    interrupted_here = False
    try:
        heap.barrier_all()
    except KeyboardInterrupt:
        interrupted_here = True
    assert interrupted_here == (heap.my_pe == 1)


@contextlib.contextmanager
def replays(monkeypatch):
    """A list that grows by one (the call's phase) for every collective call
    that ran from its memoized Plan (transport/nodecoll.py's replay), while active."""
    from shmemvm.transport import nodecoll
    ran: list = []
    real = nodecoll.replay

    def spy(core, plan):
        done = real(core, plan)
        if done:
            ran.append(plan.call.phase)
        return done

    with monkeypatch.context() as m:
        m.setattr(nodecoll, "replay", spy)
        yield ran
