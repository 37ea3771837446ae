"""shmem4py's names for shmemvm's, so that shmem4py's test suite runs unchanged:
`shmem4py.rc` is `shmemvm.rc` (also as a module, as shmem4py registers it);
`shmem4py.shmem` is `shmemvm.shmem` (shmem.py beside this file, imported on first
use as in shmem4py, so that rc can be set before the heap is made)."""
import sys

from shmemvm import rc

sys.modules[__name__ + ".rc"] = rc
