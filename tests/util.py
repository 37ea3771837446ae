"""Helpers for tests: what this process holds, to check that nothing leaks."""

import gc
import os


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

