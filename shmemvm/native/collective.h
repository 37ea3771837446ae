/* What the sources of the _collective module share: _collective.c (a
 * collective's agreed step on the node's board: exchange, Stepper), quick.c
 * (Quick: a whole call of one step) and collective_data.c (a collective's data: the reductions combined in C, a
 * delivery from scratch, the NumPy face's memo key). The argument checks both
 * make, and the data functions the module's method table names. */
#ifndef SHMEMVM_NATIVE_COLLECTIVE_H
#define SHMEMVM_NATIVE_COLLECTIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include "shared.h"

/* `obj` as an address of `nbytes` bytes that a process can map, aligned to
 * `align` (> 1); 0, or -1 with a ValueError naming `what`. */
static inline int parse_address(PyObject *obj, uintptr_t *address, unsigned long long nbytes,
                         int align, const char *what) {
    unsigned long long a = PyLong_AsUnsignedLongLong(obj);
    if (a == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (a < MIN_ADDRESS) {
        PyErr_Format(PyExc_ValueError, "%s: address %p is null or below the lowest address a "
                     "process can map (64 KiB)", what, (void *)(uintptr_t)a);
        return -1;
    }
    if (nbytes > MAX_ADDRESS || a > MAX_ADDRESS - nbytes) {
        PyErr_Format(PyExc_ValueError, "%s: %llu bytes at %p run past the highest user "
                     "address", what, nbytes, (void *)(uintptr_t)a);
        return -1;
    }
    if (align > 1 && a % (unsigned long long)align) {
        PyErr_Format(PyExc_ValueError, "%s: address %p is not aligned to %d bytes", what,
                     (void *)(uintptr_t)a, align);
        return -1;
    }
    *address = (uintptr_t)a;
    return 0;
}

static inline int get_ssize(PyObject *obj, Py_ssize_t *out, Py_ssize_t least, const char *name) {
    Py_ssize_t v = PyLong_AsSsize_t(obj);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < least) {
        PyErr_Format(PyExc_ValueError, "%s must be >= %zd, got %zd", name, least, v);
        return -1;
    }
    *out = v;
    return 0;
}

/* the steps (_collective.c), which Quick (quick.c) takes too */
/* the longest vector a step compares (the agreement's is 30 words) */
#define MAX_WORDS 64

/* The board and this PE's place on it (exchange()'s first 8 arguments), checked. */
typedef struct {
    int64_t *board;
    Py_ssize_t nbytes, size, rank, slot_words, words, seq_word;
    long long spins;
    unsigned long long volatile_words;   /* bit mask: the words a summary carries */
} Head;

/* A step's payload (exchange()'s last 7 arguments: payload, payload_len, scratch,
 * part, src_offset, dst_stride, only), checked against the head; it holds
 * scratch's buffer until release_payload(). */
typedef struct {
    uintptr_t payload;
    Py_ssize_t payload_len, part, src_offset, dst_stride;
    long only;
    Py_buffer scratch;   /* .obj NULL: none */
} Payload;

void release_payload(Payload *p);
int parse_payload(const Head *h, PyObject *const *args, int writing, Payload *p);

/* the Stepper (its contract in _collective.c) */
typedef struct {
    PyObject_HEAD
    Head h;
    Py_ssize_t neg_word, flag_word, time_word;
    long long tick, hot_ns;
    int coarse;   /* entry times from CLOCK_REALTIME_COARSE (wall_ns) */
    Py_buffer send, out, done;
} Stepper;

/* a whole step on checked arguments: the PEs left (> 0), or 0, -2 or -1 once every
 * slot is read (Stepper.step's contract) */
Py_ssize_t run_step(Stepper *self, long long prompt, long long budget, long long seq,
                    const int64_t *template, int flag, const Payload *p);
/* the end of a dealloc of an instance of a heap type (PyType_FromSpec's) */
void free_instance(PyObject *self);
/* quick.c: the Quick type added to the module, given its Stepper type */
int quick_exec(PyObject *module, PyTypeObject *stepper);

/* collective_data.c: see the top of _collective.c for what each does */
PyObject *coll_combine(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *coll_combine_from(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *coll_deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *coll_deliver_collected(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *coll_call_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* the data side's part of the module's exec: its tables (KINDS, REDUCE_OPS) and names */
int collective_data_exec(PyObject *module);

#endif
