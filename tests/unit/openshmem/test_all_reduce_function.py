"""all_reduce as a module function, in one process. Its results under MPI:
tests/mpi/openshmem/test_all_reduce.py.
"""

from __future__ import annotations

import shmemvm


def test_all_reduce_is_a_module_function():
    assert shmemvm.all_reduce.__name__ == "all_reduce"
    assert "Returns:" in shmemvm.all_reduce.__doc__
