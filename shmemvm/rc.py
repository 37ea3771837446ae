"""Runtime settings that `shmemvm.shmem` reads when it is first imported, as
shmem4py's `shmem4py.rc` (the same attributes, defaults and environment
variables):

    from shmemvm import rc
    rc.initialize = False        # or rc(initialize=False); before the import below
    from shmemvm import shmem    # no heap yet: call shmem.init() yourself

Environment variables SHMEM4PY_RC_INITIALIZE, SHMEM4PY_RC_THREADS,
SHMEM4PY_RC_THREAD_LEVEL and SHMEM4PY_RC_FINALIZE override them at that import
(true/yes/on/y/1, false/no/off/n/0). As in shmem4py, `shmemvm.rc` is this one
object, not a module.
"""

from __future__ import annotations

import sys
from typing import Any, Optional


class Rc:
    """Settings of `shmemvm.shmem`'s import.

    Attributes:
        initialize: create the default heap at import (default True).
        threads: create it with init_thread(thread_level) rather than init()
            (default False).
        thread_level: "multiple", "serialized", "funneled" or "single"
            (default "multiple"); used where `threads` is true.
        finalize: finalize the heap at exit; None (the default) means "where
            the import initialised it".
    """

    initialize: bool = True
    threads: bool = False
    thread_level: str = "multiple"
    finalize: Optional[bool] = None

    def __init__(self, **kwargs: Any) -> None:
        self(**kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if not hasattr(self, name):
            raise TypeError(f"shmemvm.rc has no setting {name!r}; the settings are "
                            f"initialize, threads, thread_level and finalize")
        super().__setattr__(name, value)

    def __call__(self, **kwargs: Any) -> None:
        """Set several settings at once: rc(initialize=False, finalize=True)."""
        for key in kwargs:
            if not hasattr(self, key):
                raise TypeError(f"shmemvm.rc has no setting {key!r}; the settings are "
                                f"initialize, threads, thread_level and finalize")
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        # shmem4py's form, "<module of the class>.rc" (its Rc's module is shmem4py)
        return f"<{type(self).__module__}.rc>"


Rc.__module__ = "shmemvm"   # as shmem4py's Rc says "shmem4py": repr(rc) is "<shmemvm.rc>"
rc = Rc()
# `from shmemvm import rc` / `import shmemvm.rc` give the object (sys.modules holds
# modules as typeshed has it; any object works, as the import system documents)
sys.modules[__name__] = rc  # type: ignore[assignment]
