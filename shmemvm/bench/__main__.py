"""`python -m shmemvm.bench`: see shmemvm/bench/__init__.py."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
