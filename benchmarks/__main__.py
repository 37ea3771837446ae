"""`python -m benchmarks` (from a checkout's root): see benchmarks/__init__.py.

The sub-commands that need no MPI (report, check, host-vs-oshmem, which
launches its own MPI jobs) are dispatched before the host suite imports mpi4py.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        from .report import main as report
        return report(argv[1:])
    if argv[:1] == ["check"]:
        from .check import main as check
        return check(argv[1:])
    if argv[:1] == ["host-vs-oshmem"]:
        from .host_vs_oshmem import main as versus
        return versus(argv[1:])
    from .cli import main as suite
    return suite(argv)


if __name__ == "__main__":
    raise SystemExit(main())
