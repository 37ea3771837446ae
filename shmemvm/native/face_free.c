/* The NumPy face's free in one call (issue 30): shmem.free(memory) of the
 * memoryview that shmem.alloc returned, or of an array from empty, zeros,
 * new_array..., its quick step kept.
 *
 * In Python that free is about fifteen frames across the face, the routine,
 * core/steps.py's free(), the core and the engine (find, retire, _record_of,
 * Retirement, quick_free, finish_free, _finish_free, _absorb_events), around
 * one compiled step; timed in place they were most of a 5.6 us free. For the
 * face's own tensor (never detached, so never alone: its block is released
 * once its arrays die) that free is, in order:
 *
 *   the memory found (find(): a memoryview of a HeapMemory, or an array over
 *   one, at its start);
 *   under the core's lock, the engine's check of its record (_record_of: a
 *   live block whose storage is the tensor's); forget(); the free's quick
 *   step of the block (HeapCore.quick_free, kept under ("free", offset)) with
 *   the flag false; the record marked freed and the watches' reports applied
 *   (_finish_free with release_now false).
 *
 *   FaceFree(core, cached)
 *       core: the HeapCore (its lock, its kept quick steps `quick`, its
 *       forget()); cached: its engine's CachedBlocks (blocks.c does the
 *       engine's halves).
 *   free(memory[, array_type]) -> True where it did that free; None where it
 *       stepped aside before its step, with nothing done but a forget() (a
 *       cache dropped): not a memoryview of a HeapMemory at its start, nor an
 *       array of array_type (the face's numpy.ndarray; this module stays free
 *       of NumPy) over one from its start, C-contiguous, the lock held by
 *       another thread, no live record (a freed block: the Python path raises
 *       FreedTensorError), imported memory, no quick step kept yet, or the
 *       quick step did nothing (something pending). The Python path then does
 *       the free, or raises what it raises, on every PE. An error of the step
 *       itself (SymmetryError, PeerTimeoutError, ...) is raised, as there.
 *
 * SHMEMVM_NATIVE=0 has no FaceFree (core/steps.py's free() does it all), and
 * tests/mpi/memory/test_quick_alloc.py holds heaps with and without it equal. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "blocks.h"
#include "face_free.h"
#include "views.h"

typedef struct {
    PyObject_HEAD
    PyObject *cached, *quick, *forget;
    PyObject *acquire, *release;   /* the core's lock's (an RLock) */
    PyObject *not_blocking;        /* (False,): acquire's arguments, made once */
} FaceFree;

static PyObject *free_key;   /* "free": the first item of a free's quick step's key */
static PyObject *name_base;  /* an array's "base" */

static int face_init(FaceFree *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"core", "cached", NULL};
    PyObject *core, *cached;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:FaceFree", names, &core, &cached))
        return -1;
    if (!is_cached_blocks(cached)) {
        PyErr_SetString(PyExc_TypeError, "FaceFree(core, cached): cached must be a CachedBlocks");
        return -1;
    }
    PyObject *quick = PyObject_GetAttrString(core, "quick");
    PyObject *forget = quick ? PyObject_GetAttrString(core, "forget") : NULL;
    PyObject *lock = forget ? PyObject_GetAttrString(core, "lock") : NULL;
    PyObject *acquire = lock ? PyObject_GetAttrString(lock, "acquire") : NULL;
    PyObject *release = acquire ? PyObject_GetAttrString(lock, "release") : NULL;
    PyObject *not_blocking = release ? PyTuple_Pack(1, Py_False) : NULL;
    Py_XDECREF(lock);
    if (not_blocking != NULL && !PyDict_Check(quick))
        PyErr_SetString(PyExc_TypeError, "FaceFree: the core's quick steps are not a dict");
    if (PyErr_Occurred()) {
        Py_XDECREF(quick);
        Py_XDECREF(forget);
        Py_XDECREF(acquire);
        Py_XDECREF(release);
        Py_XDECREF(not_blocking);
        return -1;
    }
    Py_XSETREF(self->cached, Py_NewRef(cached));
    Py_XSETREF(self->quick, quick);
    Py_XSETREF(self->forget, forget);
    Py_XSETREF(self->acquire, acquire);
    Py_XSETREF(self->release, release);
    Py_XSETREF(self->not_blocking, not_blocking);
    return 0;
}

/* where a buffer starts (C-contiguous), or NULL where it exports none so (an
 * error cleared: a released memoryview, an array of another order) */
static void *start_of(PyObject *obj) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return NULL;
    }
    void *start = view.buf;
    PyBuffer_Release(&view);
    return start;
}

/* find()'s accepted case, the common one: `memory` a memoryview of a HeapMemory,
 * or an array of `array_type` (exactly) whose bases lead to one (arrays.owner()'s
 * chain), starting where the HeapMemory does. 1 with the memory's tensor (a new
 * reference) and address; else 0 (nothing to free here: find() decides) */
static int memory_of(PyObject *memory, PyObject *array_type, PyObject **tensor,
                     unsigned long long *address) {
    void *start = start_of(memory);
    if (start == NULL) return 0;
    PyObject *obj = Py_NewRef(memory);
    for (int depth = 0; array_type != NULL && Py_TYPE(obj) == (PyTypeObject *)array_type
                        && depth < 8; depth++) {
        PyObject *base = PyObject_GetAttr(obj, name_base);
        Py_DECREF(obj);
        if (base == NULL) {
            PyErr_Clear();
            return 0;
        }
        obj = base;
    }
    int found = PyMemoryView_Check(obj) && start_of(obj) != NULL;   /* (not released) */
    PyObject *owner = found ? PyMemoryView_GET_BUFFER(obj)->obj : NULL;
    found = owner != NULL && heap_memory_parts(owner, tensor, address)
            && (unsigned long long)(uintptr_t)start == *address;
    if (found) Py_INCREF(*tensor);   /* (its memory may go with obj) */
    Py_DECREF(obj);
    return found;
}

/* the core's lock released, an exception pending kept; -1 where releasing failed */
static int unlock(FaceFree *self) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *released = PyObject_CallNoArgs(self->release);
    if (released == NULL) {
        if (type == NULL) return -1;
        PyErr_Clear();
    } else {
        Py_DECREF(released);
    }
    PyErr_Restore(type, value, traceback);
    return 0;
}

static PyObject *face_free(FaceFree *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "free(memory[, array_type])");
        return NULL;
    }
    if (self->cached == NULL) {
        PyErr_SetString(PyExc_ValueError, "FaceFree: not initialised");
        return NULL;
    }
    PyObject *array_type = nargs == 2 && args[1] != Py_None ? args[1] : NULL;
    if (array_type != NULL && !PyType_Check(array_type)) {
        PyErr_SetString(PyExc_TypeError, "free: array_type must be a type or None");
        return NULL;
    }
    PyObject *tensor;   /* (held across the calls below, which run Python) */
    unsigned long long address;
    if (!memory_of(args[0], array_type, &tensor, &address)) Py_RETURN_NONE;
    PyObject *got = PyObject_Call(self->acquire, self->not_blocking, NULL);
    int held = got ? PyObject_IsTrue(got) : -1;
    Py_XDECREF(got);
    if (held <= 0) {   /* another thread holds it: the Python path waits for it */
        Py_DECREF(tensor);
        return held < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *result = NULL, *offset = NULL, *key = NULL, *quick = NULL;
    int live = cached_retire_own(self->cached, tensor, address, &offset);
    if (live <= 0) {
        if (live == 0) result = Py_NewRef(Py_None);
        goto done;
    }
    key = PyTuple_Pack(2, free_key, offset);
    quick = key ? PyDict_GetItemWithError(self->quick, key) : NULL;   /* (no __missing__) */
    if (quick == NULL || quick == Py_None) {   /* none kept yet: steps.free makes it */
        if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
        quick = NULL;
        goto done;
    }
    Py_INCREF(quick);
    PyObject *forgot = PyObject_CallNoArgs(self->forget);   /* (retire()'s first step) */
    if (forgot == NULL) goto done;
    Py_DECREF(forgot);
    PyObject *outcome = PyObject_CallOneArg(quick, Py_False);   /* never alone: the flag false */
    if (outcome == NULL) goto done;
    int stepped = outcome != Py_None;
    Py_DECREF(outcome);
    if (!stepped) {   /* something pending: the general path deals with it */
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* agreed, the flag not everywhere (ours is false): the block waits for its arrays */
    if (cached_defer(self->cached, offset) == 0) result = Py_NewRef(Py_True);
done:
    Py_XDECREF(quick);
    Py_XDECREF(key);
    Py_XDECREF(offset);
    Py_DECREF(tensor);
    if (unlock(self) < 0) Py_CLEAR(result);
    return result;
}

static int face_traverse(FaceFree *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->cached);
    Py_VISIT(self->quick);
    Py_VISIT(self->forget);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    return 0;
}

static int face_clear(FaceFree *self) {
    Py_CLEAR(self->cached);
    Py_CLEAR(self->quick);
    Py_CLEAR(self->forget);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->not_blocking);
    return 0;
}

static void face_dealloc(FaceFree *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    face_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMethodDef face_methods[] = {
    {"free", (PyCFunction)(void (*)(void))face_free, METH_FASTCALL,
     "free(memory[, array_type]) -> True (freed), or None (stepped aside, nothing done)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot face_slots[] = {
    {Py_tp_doc, "FaceFree(core, cached): the NumPy face's free of alloc's memoryview in one "
                "call (face_free.c says what it does)."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, face_init},
    {Py_tp_dealloc, face_dealloc},
    {Py_tp_traverse, face_traverse},
    {Py_tp_clear, face_clear},
    {Py_tp_methods, face_methods},
    {0, NULL},
};

static PyType_Spec face_spec = {
    "shmemvm.native._native.FaceFree", sizeof(FaceFree), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, face_slots,
};

int add_face_free(PyObject *module) {
    if ((free_key = PyUnicode_InternFromString("free")) == NULL
        || (name_base = PyUnicode_InternFromString("base")) == NULL)
        return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &face_spec, NULL);
    if (type == NULL) return -1;
    int failed = PyModule_AddObjectRef(module, "FaceFree", type);
    Py_DECREF(type);
    return failed;
}
