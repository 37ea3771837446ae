"""The shmem4py suite's runner (tests/peers/shmem4py_suite/run.py) tells
shmemvm's frames from others' by where the PEs' shmemvm package lies, not by
a folder named `shmemvm` in the path: a checkout named shmemvm (the default of
`git clone .../shmemvm`) holds .venv/, NumPy's frames under it are not ours,
and a test whose error is NumPy's own (NUMPY1_ONLY) counts apart there too.
One process, no MPI: the runner's merge of two PEs' records.
"""

import importlib.util
import sys

from util import REPO

RUNNER = REPO / "tests" / "peers" / "shmem4py_suite" / "run.py"


def _runner():
    spec = importlib.util.spec_from_file_location("shmem4py_suite_run", RUNNER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _records(frames):
    message = "OverflowError: Python integer -1 out of bounds for uint8"
    rec = {"status": "ERROR", "subtests": [], "message": message, "traceback": message,
           "frames": frames}
    return {pe: {"test_rma.TestRMA.testGet": dict(rec)} for pe in ("0", "1")}


def test_numpys_frames_under_a_checkout_named_shmemvm_are_not_shmemvms():
    run = _runner()
    checkout = "/home/user/shmemvm"
    numpy_frame = (f"{checkout}/.venv/lib/python3.12/site-packages/numpy/_core/numeric.py",
                   "353", "full")
    test_frame = ("/tmp/cache/shmem4py-1.0.0/test/test_rma.py", "40", "testGet")
    packages = {f"{checkout}/shmemvm"}
    merged = run.merge("test_rma", ["TestRMA.testGet"], _records([test_frame, numpy_frame]),
                       False, numpy1=False, packages=packages)
    assert merged["test_rma.TestRMA.testGet"]["outcome"] == "numpy1"


def test_a_frame_of_the_shmemvm_package_still_counts_as_a_failure():
    run = _runner()
    checkout = "/home/user/shmemvm"
    ours = (f"{checkout}/shmemvm/shmem/rma.py", "120", "get")
    merged = run.merge("test_rma", ["TestRMA.testGet"], _records([ours]), False,
                       numpy1=False, packages={f"{checkout}/shmemvm"})
    assert merged["test_rma.TestRMA.testGet"]["outcome"] == "error"
