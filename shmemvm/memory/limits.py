"""The system limits a heap's segments use up, and errors that name them.

On the host backend every segment of this PE holds one file descriptor (its
memfd) for as long as it is backed, and every segment of every PE of the node
is one memory mapping here: descriptors are bounded by RLIMIT_NOFILE
(`ulimit -n`), mappings by vm.max_map_count. Passing a segment to a peer needs
one more descriptor for a moment on both sides. Chunked growth (allocator.py,
SHMEMVM_CHUNK_SIZE) bounds the segments of a heap by heap size / chunk, so a
default heap stays far from both limits; a program that lowers them, or
shrinks the chunk, can still reach them, and then gets a ResourceLimitError
that says which limit and what to change instead of a bare OSError.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource

from ..errors import ResourceLimitError

#: an mmap ENOMEM with at most this many mappings left before vm.max_map_count
#: is taken for that limit (the kernel refuses splits at the limit itself)
_MAP_MARGIN = 16

_LOWER_USE = ("make fewer, larger segments: a larger SHMEMVM_CHUNK_SIZE (heap_info()['chunk'] "
              "says the current one), fewer live allocations of at least the chunk size, "
              "trim() to release cached segments")


def open_fd_count() -> int | None:
    """Descriptors this process holds now; None where listing them needs one
    more than the limit allows."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1   # less the listing's own
    except OSError:
        return None


def map_count() -> int:
    """Memory mappings of this process now (lines of /proc/self/maps); 0 where
    unreadable."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


def max_map_count() -> int | None:
    """vm.max_map_count, where readable."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def fds_exhausted(what: str, system_wide: bool = False) -> ResourceLimitError:
    """The error for running out of file descriptors while doing `what`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if system_wide:
        limit = ("the system ran out of file descriptors (ENFILE: fs.file-max, "
                 "`sysctl fs.file-max`; raise it as root)")
    else:
        count = open_fd_count()
        limit = (f"this process ran out of file descriptors ("
                 f"{'every one allowed' if count is None else count} open; "
                 f"RLIMIT_NOFILE soft limit {_limit_text(soft)}, hard {_limit_text(hard)}: "
                 f"raise it with `ulimit -n N` before mpirun, up to the hard limit, or "
                 f"resource.setrlimit(resource.RLIMIT_NOFILE, ...) in the program)")
    return ResourceLimitError(
        f"{what} failed: {limit}. On the host backend each segment of the heap holds one "
        f"descriptor; {_LOWER_USE}")


def maps_exhausted(what: str, count: int, maximum: int) -> ResourceLimitError:
    """The error for reaching vm.max_map_count while doing `what`."""
    return ResourceLimitError(
        f"{what} failed: this process has {count} memory mappings, at the system's limit "
        f"vm.max_map_count = {maximum} (`sysctl vm.max_map_count`; raise it as root with "
        f"`sysctl -w vm.max_map_count=N`). Each segment of every PE of the node is one "
        f"mapping in every PE of the node: run fewer PEs per node, or {_LOWER_USE}")


def translate(exc: BaseException, what: str) -> BaseException:
    """`exc` (raised while doing `what`) as a ResourceLimitError where it is
    one of the limits above: EMFILE/ENFILE, or ENOMEM from mmap with the
    process at vm.max_map_count. Anything else comes back as it is (an mmap
    ENOMEM far from the limit is another shortage, reported as it is)."""
    if not isinstance(exc, OSError) or isinstance(exc, ResourceLimitError):
        return exc
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        error = fds_exhausted(what, system_wide=exc.errno == errno.ENFILE)
    elif exc.errno == errno.ENOMEM:
        count, maximum = map_count(), max_map_count()
        if maximum is None or count < maximum - _MAP_MARGIN:
            return exc
        error = maps_exhausted(what, count, maximum)
    else:
        return exc
    error.__cause__ = exc
    return error


@contextlib.contextmanager
def naming_limits(what: str):
    """Raise the ResourceLimitError an OSError of the block stands for (translate())."""
    try:
        yield
    except OSError as exc:
        error = translate(exc, what)
        if error is exc:
            raise
        raise error from exc


def _limit_text(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)
