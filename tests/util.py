"""Helpers for tests: what this process holds, to check that nothing leaks, and
how to start a small MPI job of our own."""

import gc
import os
import shutil
import sys
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
