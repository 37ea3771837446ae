"""`python -m benchmarks` (from a checkout's root): see benchmarks/__init__.py."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
