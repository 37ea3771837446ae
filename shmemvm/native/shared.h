/* What both compiled modules (_native.c, _collective.c) share: the bounds of a
 * user address and the numbering tables they export for native/__init__.py to
 * check against shmemvm/vocabulary.py. Included by each (one translation unit
 * each: the functions are static). */
#ifndef SHMEMVM_NATIVE_SHARED_H
#define SHMEMVM_NATIVE_SHARED_H

#include <Python.h>
#include <sched.h>

/* No address below this is ever mapped (Linux's default vm.mmap_min_addr), and
 * none at or above MAX_ADDRESS is a user address (57-bit: 5-level paging). */
#define MIN_ADDRESS ((unsigned long long)64 * 1024)
#define MAX_ADDRESS ((unsigned long long)1 << 57)

/* a spinning read's pause: it yields the core's pipeline to a hyperthread
 * sibling (perhaps the PE this one waits for) and saves power */
static inline void spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Every waiting loop of the compiled piece, after its i-th read of shared
 * memory found nothing to do (and without the GIL): a long wait yields the core
 * at one read in YIELD_EVERY (a power of two) from the 64th on and pauses at the
 * others, staying on its core as OSHMEM's progress loop does. On the 16-core
 * machine, while 15 PEs waited in a barrier, PE 0's put of 1 MiB ran at
 * 15.3-19.1 GB/s where they yielded at every read, 15.3-15.8 where they slept
 * and 20.5-21.8 where they spun (docs/performance.md). With more PEs than cores
 * the yield still comes every few microseconds. */
#define YIELD_EVERY 64
static inline void wait_between_reads(long long i) {
    if (i >= 64 && (i & (YIELD_EVERY - 1)) == 0) sched_yield();
    else spin_pause();
}

/* {names[i]: i} as the module attribute `attr`; 0, or -1 with an error set. */
static inline int add_numbering(PyObject *module, const char *attr, const char *const *names, int n) {
    PyObject *table = PyDict_New();
    if (table == NULL) return -1;
    for (int i = 0; i < n; i++) {
        PyObject *code = PyLong_FromLong(i);
        int failed = code == NULL || PyDict_SetItemString(table, names[i], code) < 0;
        Py_XDECREF(code);
        if (failed) { Py_DECREF(table); return -1; }
    }
    int result = PyModule_AddObjectRef(module, attr, table);
    Py_DECREF(table);
    return result;
}

#endif
