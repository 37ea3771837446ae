/* What both compiled modules (_native.c, _collective.c) share: the bounds of a
 * user address and the numbering tables they export for native/__init__.py to
 * check against shmemvm/vocabulary.py. Included by each (one translation unit
 * each: the functions are static). */
#ifndef SHMEMVM_NATIVE_SHARED_H
#define SHMEMVM_NATIVE_SHARED_H

#include <Python.h>

/* No address below this is ever mapped (Linux's default vm.mmap_min_addr), and
 * none at or above MAX_ADDRESS is a user address (57-bit: 5-level paging). */
#define MIN_ADDRESS ((unsigned long long)64 * 1024)
#define MAX_ADDRESS ((unsigned long long)1 << 57)

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
