"""shmemvm.shmem's names, constants and rc, in one process (no heap needed):
every shmem4py name is there, without the C layer, with OpenSHMEM's values.
The API over NumPy arrays under MPI: tests/mpi/shmem/test_shmem_layer.py.
"""

import pytest

import shmemvm
from shmemvm import rc

rc(initialize=False, finalize=False)  # importing shmem makes no heap here
from shmemvm import shmem  # noqa: E402


# -- names and constants (no heap needed) ------------------------------------------------------
SHMEM4PY_NAMES = """
info_get_version info_get_name init finalize global_exit init_thread query_thread THREAD
THREAD_SINGLE THREAD_FUNNELED THREAD_SERIALIZED THREAD_MULTIPLE my_pe n_pes pe_accessible
addr_accessible ptr alloc free fromalloc new_array del_array array empty zeros ones full MALLOC
MALLOC_ATOMICS_REMOTE MALLOC_SIGNAL_REMOTE Team TEAM_WORLD TEAM_SHARED TEAM_INVALID Ctx CTX
CTX_PRIVATE CTX_SERIALIZED CTX_NOSTORE CTX_DEFAULT CTX_INVALID put get iput iget put_nbi get_nbi
atomic_op atomic_fetch_op atomic_fetch_op_nbi AMO AMO_SET AMO_INC AMO_ADD AMO_AND AMO_OR AMO_XOR
atomic_set atomic_inc atomic_add atomic_and atomic_or atomic_xor atomic_fetch atomic_swap
atomic_compare_swap atomic_fetch_inc atomic_fetch_add atomic_fetch_and atomic_fetch_or
atomic_fetch_xor atomic_fetch_nbi atomic_swap_nbi atomic_compare_swap_nbi atomic_fetch_inc_nbi
atomic_fetch_add_nbi atomic_fetch_and_nbi atomic_fetch_or_nbi atomic_fetch_xor_nbi new_signal
del_signal signal_fetch put_signal put_signal_nbi SIGNAL SIGNAL_SET SIGNAL_ADD barrier_all
sync_all sync broadcast collect fcollect alltoall alltoalls reduce OP OP_AND OP_OR OP_XOR OP_MAX
OP_MIN OP_SUM OP_PROD and_reduce or_reduce xor_reduce max_reduce min_reduce sum_reduce
prod_reduce wait_until wait_until_all wait_until_any wait_until_some wait_until_all_vector
wait_until_any_vector wait_until_some_vector test test_all test_any test_some test_all_vector
test_any_vector test_some_vector signal_wait_until CMP CMP_EQ CMP_NE CMP_GT CMP_LE CMP_LT CMP_GE
fence quiet new_lock del_lock set_lock test_lock clear_lock Lock pcontrol MAJOR_VERSION
MINOR_VERSION VENDOR_STRING
""".split()


def test_every_shmem4py_name_is_there_and_no_c_layer():
    missing = [name for name in SHMEM4PY_NAMES if not hasattr(shmem, name)]
    assert missing == []
    assert not hasattr(shmem, "ffi") and not hasattr(shmem, "lib")
    for name in ("Team", "Ctx", "Lock"):
        for method in ("destroy",):
            assert callable(getattr(getattr(shmem, name), method))


def test_constants_have_openshmems_values():
    assert [int(c) for c in (shmem.CMP_EQ, shmem.CMP_NE, shmem.CMP_GT, shmem.CMP_LE,
                             shmem.CMP_LT, shmem.CMP_GE)] == [0, 1, 2, 3, 4, 5]
    assert [int(t) for t in shmem.THREAD] == [shmemvm.THREAD_SINGLE, shmemvm.THREAD_FUNNELED,
                                             shmemvm.THREAD_SERIALIZED, shmemvm.THREAD_MULTIPLE]
    assert (int(shmem.SIGNAL_SET), int(shmem.SIGNAL_ADD)) == (0, 1)
    assert (int(shmem.CTX_SERIALIZED), int(shmem.CTX_PRIVATE), int(shmem.CTX_NOSTORE)) == (1, 2, 4)
    assert (int(shmem.MALLOC_ATOMICS_REMOTE), int(shmem.MALLOC_SIGNAL_REMOTE)) == (1, 2)
    assert [str(op) for op in shmem.AMO] == ["set", "inc", "add", "and", "or", "xor"]
    assert [str(op) for op in shmem.OP] == ["and", "or", "xor", "max", "min", "sum", "prod"]
    assert (shmem.MAJOR_VERSION, shmem.MINOR_VERSION) == shmem.info_get_version() == (1, 5)
    assert shmem.VENDOR_STRING == shmem.info_get_name() == shmemvm.info_get_name()
    assert not shmem.TEAM_INVALID and shmem.TEAM_WORLD and shmem.TEAM_SHARED
    assert not shmem.CTX_INVALID and shmem.CTX_DEFAULT and not shmem.Ctx() and not shmem.Team()
    assert shmem.Team(shmem.TEAM_WORLD) == shmem.TEAM_WORLD != shmem.TEAM_SHARED


def test_ctx_and_malloc_constants_are_shmemvms():
    assert (shmem.CTX_SERIALIZED, shmem.CTX_PRIVATE, shmem.CTX_NOSTORE) == \
        (shmemvm.CTX_SERIALIZED, shmemvm.CTX_PRIVATE, shmemvm.CTX_NOSTORE)


def test_rc_is_shmem4pys():
    assert rc.initialize is False and rc.threads is False and rc.thread_level == "multiple"
    with pytest.raises(TypeError, match="no setting"):
        rc.initialise = True
    with pytest.raises(TypeError, match="no setting"):
        rc(bogus=1)


def test_without_a_heap_calls_say_to_initialise():
    with pytest.raises(shmemvm.ShmemError, match="init"):
        shmem.my_pe()
