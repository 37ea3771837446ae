/* The faces' frees in one call each (issue 30): the NumPy face's shmem.free of
 * the memoryview alloc returned, or of an array from empty, zeros, new_array...,
 * and the torch API's free(tensor), where the free's quick step is kept.
 *
 * In Python a free is about fifteen frames across the face, the routine,
 * core/steps.py's free(), the core and the engine (find, whole, retire,
 * _record_of, Retirement, quick_free, finish_free, _finish_free, _release or
 * _absorb_events) around one compiled step; timed in place they were most of
 * a 5.6 us NumPy free and a 6.3 us torch free. FaceFree does that path, in
 * its order, for the common case:
 *
 *   the tensor found (NumPy: a memoryview of a HeapMemory, or an array over
 *   one, at its start; torch: a torch.Tensor that is all of its storage, from
 *   its start, contiguous: whole()); under the core's lock, the engine's check
 *   of its record (_record_of: a live block whose storage is the tensor's, not
 *   imported memory); the free's quick step kept under ("free", offset)
 *   (HeapCore.quick_free); for a torch tensor the Retirement (detached: set_()
 *   and marked; alone where no registered view and no other tensor holds the
 *   storage); forget(); the step, with the flag alone (false for the NumPy
 *   face's own tensor, kept while its arrays live); then the block released at
 *   once where the flag is everywhere (the engine's release), else the record
 *   marked freed and the watches' reports applied (_finish_free).
 *
 *   FaceFree(core, cached, tensor_type, use_count, held_alone)
 *       core: the HeapCore (its lock, its kept quick steps `quick`, forget(),
 *       local.release()); cached: its engine's CachedBlocks (blocks.c does the
 *       engine's parts); tensor_type: torch.Tensor; use_count, held_alone:
 *       ownership.py's storage use count (None: never alone) and its reading
 *       for a storage held by one reference.
 *   free_memory(memory[, array_type]) -> True where it did that free of the
 *       NumPy face's memory (array_type: the face's numpy.ndarray, exactly;
 *       this module stays free of NumPy; a C-contiguous array).
 *   free_tensor(tensor) -> True where it did that free of a torch tensor.
 *
 *   Either returns None where it stepped aside with nothing done (at most a
 *   forget(): a cache dropped; a detached tensor is restored): another object
 *   or form, the lock held by another thread, no live record (a freed block:
 *   the Python path raises FreedTensorError), imported memory, no quick step
 *   kept yet, the tensor cannot be detached (it requires grad), or the step
 *   did nothing (something pending). The Python path then does the free, or
 *   raises what it raises, on every PE. An error of the step itself
 *   (SymmetryError, PeerTimeoutError, ...) is raised, the tensor restored, as
 *   there.
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
    PyObject *cached, *quick, *forget, *local_release;
    PyObject *acquire, *release;   /* the core's lock's (an RLock) */
    PyObject *not_blocking;        /* (False,): acquire's arguments, made once */
    PyObject *tensor_type;         /* torch.Tensor: the tensors free_tensor takes */
    PyObject *use_count;           /* torch's storage use count (ownership.py's), or None */
    long long held_alone;          /* its reading for a storage one reference holds */
} FaceFree;

/* "free": the first item of a free's quick step's key; an array's "base"; the
 * tensor and storage methods and the attributes the free reads and writes */
static PyObject *free_key, *name_base, *name_untyped_storage, *name_data_ptr, *name_nbytes,
    *name_storage_offset, *name_is_contiguous, *name_size, *name_stride, *name_set,
    *name_cdata, *name_freed_mark, *name_views, *name_flag_everywhere;

static int face_init(FaceFree *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"core", "cached", "tensor_type", "use_count", "held_alone", NULL};
    PyObject *core, *cached, *tensor_type, *use_count, *held_alone;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:FaceFree", names, &core, &cached,
                                     &tensor_type, &use_count, &held_alone))
        return -1;
    if (!is_cached_blocks(cached) || !PyType_Check(tensor_type)
        || (use_count != Py_None && !PyCallable_Check(use_count))) {
        PyErr_SetString(PyExc_TypeError, "FaceFree(core, cached, tensor_type, use_count, "
                        "held_alone): cached must be a CachedBlocks, tensor_type a type, "
                        "use_count callable or None");
        return -1;
    }
    long long alone = held_alone == Py_None ? -1 : PyLong_AsLongLong(held_alone);
    if (alone == -1 && PyErr_Occurred()) return -1;
    PyObject *quick = PyObject_GetAttrString(core, "quick");
    PyObject *forget = quick ? PyObject_GetAttrString(core, "forget") : NULL;
    PyObject *local = forget ? PyObject_GetAttrString(core, "local") : NULL;
    PyObject *local_release = local ? PyObject_GetAttrString(local, "release") : NULL;
    Py_XDECREF(local);
    PyObject *lock = local_release ? PyObject_GetAttrString(core, "lock") : NULL;
    PyObject *acquire = lock ? PyObject_GetAttrString(lock, "acquire") : NULL;
    PyObject *release = acquire ? PyObject_GetAttrString(lock, "release") : NULL;
    PyObject *not_blocking = release ? PyTuple_Pack(1, Py_False) : NULL;
    Py_XDECREF(lock);
    if (not_blocking != NULL && !PyDict_Check(quick))
        PyErr_SetString(PyExc_TypeError, "FaceFree: the core's quick steps are not a dict");
    if (PyErr_Occurred()) {
        Py_XDECREF(quick);
        Py_XDECREF(forget);
        Py_XDECREF(local_release);
        Py_XDECREF(acquire);
        Py_XDECREF(release);
        Py_XDECREF(not_blocking);
        return -1;
    }
    Py_XSETREF(self->cached, Py_NewRef(cached));
    Py_XSETREF(self->quick, quick);
    Py_XSETREF(self->forget, forget);
    Py_XSETREF(self->local_release, local_release);
    Py_XSETREF(self->acquire, acquire);
    Py_XSETREF(self->release, release);
    Py_XSETREF(self->not_blocking, not_blocking);
    Py_XSETREF(self->tensor_type, Py_NewRef(tensor_type));
    Py_XSETREF(self->use_count, use_count == Py_None || alone < 0 ? NULL : Py_NewRef(use_count));
    self->held_alone = alone;
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
    /* (not released: read above where obj is the memory given) */
    int found = PyMemoryView_Check(obj) && (obj == memory || start_of(obj) != NULL);
    PyObject *owner = found ? PyMemoryView_GET_BUFFER(obj)->obj : NULL;
    found = owner != NULL && heap_memory_parts(owner, tensor, address)
            && (unsigned long long)(uintptr_t)start == *address;
    if (found) Py_INCREF(*tensor);   /* (its memory may go with obj) */
    Py_DECREF(obj);
    return found;
}

/* the core's lock taken without waiting: 1, 0 (another thread holds it), -1 */
static int lock(FaceFree *self) {
    PyObject *got = PyObject_Call(self->acquire, self->not_blocking, NULL);
    int held = got ? PyObject_IsTrue(got) : -1;
    Py_XDECREF(got);
    return held;
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

/* (the core's lock held) the live record of `storage` at `address` (cached_live)
 * and the free's quick step kept for its block: 1 with the block's offset, the
 * record and the step (new references), 0 where either is missing (nothing done:
 * steps.free makes the step), -1 with an error set */
static int live_step(FaceFree *self, PyObject *storage, unsigned long long address,
                     PyObject **offset, PyObject **record, PyObject **quick) {
    int live = cached_live(self->cached, storage, address, offset, record);
    if (live <= 0) return live;
    PyObject *key = PyTuple_Pack(2, free_key, *offset);
    PyObject *kept = key ? PyDict_GetItemWithError(self->quick, key) : NULL;  /* (no __missing__) */
    Py_XDECREF(key);
    if (kept != NULL && kept != Py_None) {
        *quick = Py_NewRef(kept);
        return 1;
    }
    Py_CLEAR(*offset);
    Py_CLEAR(*record);
    return PyErr_Occurred() ? -1 : 0;
}

/* forget() (retire()'s first step), then the quick step with `flag`: what it
 * returned (None: it did nothing), or NULL with an error set */
static PyObject *forget_and_step(FaceFree *self, PyObject *quick, PyObject *flag) {
    PyObject *forgot = PyObject_CallNoArgs(self->forget);
    if (forgot == NULL) return NULL;
    Py_DECREF(forgot);
    return PyObject_CallOneArg(quick, flag);
}

/* an int a method of `obj` returns, or -1 with an error set */
static long long int_call(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_CallMethodNoArgs(obj, name);
    long long result = value ? PyLong_AsLongLong(value) : -1;
    Py_XDECREF(value);
    return result;
}

static PyObject *free_memory(FaceFree *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "free_memory(memory[, array_type])");
        return NULL;
    }
    if (self->cached == NULL) {
        PyErr_SetString(PyExc_ValueError, "FaceFree: not initialised");
        return NULL;
    }
    PyObject *array_type = nargs == 2 && args[1] != Py_None ? args[1] : NULL;
    if (array_type != NULL && !PyType_Check(array_type)) {
        PyErr_SetString(PyExc_TypeError, "free_memory: array_type must be a type or None");
        return NULL;
    }
    PyObject *tensor;   /* (held across the calls below, which run Python) */
    unsigned long long address;
    if (!memory_of(args[0], array_type, &tensor, &address)) Py_RETURN_NONE;
    PyObject *storage = PyObject_CallMethodNoArgs(tensor, name_untyped_storage);
    Py_DECREF(tensor);
    if (storage == NULL) return NULL;
    int held = lock(self);
    if (held <= 0) {   /* another thread holds it: the Python path waits for it */
        Py_DECREF(storage);
        return held < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *result = NULL, *offset = NULL, *record = NULL, *quick = NULL;
    int found = live_step(self, storage, address, &offset, &record, &quick);
    if (found <= 0) {
        if (found == 0) result = Py_NewRef(Py_None);
        goto done;
    }
    Py_CLEAR(record);   /* (not read: the face's own tensor is never alone) */
    PyObject *outcome = forget_and_step(self, quick, Py_False);   /* never alone: false */
    if (outcome == NULL) goto done;
    int stepped = outcome != Py_None;
    Py_DECREF(outcome);
    if (!stepped) {   /* something pending: the general path deals with it */
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* agreed, the flag not everywhere (ours is false): the block waits for its arrays
     * (our reference to its storage dropped first, as _finish_free drops the Retirement's) */
    Py_CLEAR(storage);
    if (cached_defer(self->cached, offset) == 0) result = Py_NewRef(Py_True);
done:
    Py_XDECREF(quick);
    Py_XDECREF(record);
    Py_XDECREF(offset);
    Py_XDECREF(storage);
    if (unlock(self) < 0) Py_CLEAR(result);
    return result;
}

/* Retirement.restore(): the detached tensor set back to its storage, unmarked (an
 * exception pending kept; a failure here replaces it only where none was) */
static void restore(PyObject *tensor, PyObject *storage, PyObject *size, PyObject *stride) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *zero = PyLong_FromLong(0);
    PyObject *done = zero ? PyObject_CallMethodObjArgs(tensor, name_set, storage, zero, size,
                                                       stride, NULL) : NULL;
    Py_XDECREF(zero);
    if (done == NULL || PyObject_DelAttr(tensor, name_freed_mark) < 0) {
        if (type != NULL) PyErr_Clear();
    }
    Py_XDECREF(done);
    if (type != NULL) PyErr_Restore(type, value, traceback);
}

static PyObject *free_tensor(FaceFree *self, PyObject *tensor) {
    if (self->cached == NULL) {
        PyErr_SetString(PyExc_ValueError, "FaceFree: not initialised");
        return NULL;
    }
    if (Py_TYPE(tensor) != (PyTypeObject *)self->tensor_type) Py_RETURN_NONE;
    /* whole(): all of its storage, from its start, contiguous (else steps.free says) */
    PyObject *storage = PyObject_CallMethodNoArgs(tensor, name_untyped_storage);
    if (storage == NULL) return NULL;
    long long start = int_call(storage, name_data_ptr), nbytes = int_call(storage, name_nbytes);
    long long skip = start < 0 || nbytes < 0 ? -1 : int_call(tensor, name_storage_offset);
    PyObject *own_bytes = skip < 0 ? NULL : PyObject_GetAttr(tensor, name_nbytes);
    long long tensor_bytes = own_bytes ? PyLong_AsLongLong(own_bytes) : -1;
    Py_XDECREF(own_bytes);
    PyObject *contiguous = tensor_bytes < 0 ? NULL
                           : PyObject_CallMethodNoArgs(tensor, name_is_contiguous);
    int dense = contiguous ? PyObject_IsTrue(contiguous) : -1;
    Py_XDECREF(contiguous);
    if (dense < 0) {
        Py_DECREF(storage);
        return NULL;
    }
    if (!dense || skip != 0 || tensor_bytes != nbytes) {
        Py_DECREF(storage);
        Py_RETURN_NONE;
    }
    int held = lock(self);
    if (held <= 0) {
        Py_DECREF(storage);
        return held < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *result = NULL, *offset = NULL, *record = NULL, *quick = NULL, *size = NULL,
        *stride = NULL;
    int detached = 0;
    int found = live_step(self, storage, (unsigned long long)start, &offset, &record, &quick);
    if (found <= 0) {
        if (found == 0) result = Py_NewRef(Py_None);
        goto done;
    }
    /* Retirement: the tensor detached (emptied) and marked, its geometry kept */
    size = PyObject_CallMethodNoArgs(tensor, name_size);
    stride = size ? PyObject_CallMethodNoArgs(tensor, name_stride) : NULL;
    if (stride == NULL) goto done;
    PyObject *emptied = PyObject_CallMethodNoArgs(tensor, name_set);
    if (emptied == NULL) {   /* (a tensor that requires grad: steps.free defers it) */
        if (PyErr_ExceptionMatches(PyExc_RuntimeError)) {
            PyErr_Clear();
            result = Py_NewRef(Py_None);
        }
        goto done;
    }
    Py_DECREF(emptied);
    detached = 1;
    if (PyObject_SetAttr(tensor, name_freed_mark, offset) < 0) goto done;
    /* alone: no registered view, and only our reference holds its storage */
    int alone = 0;
    PyObject *views = PyObject_GetAttr(record, name_views);
    int viewed = views ? PyObject_IsTrue(views) : -1;
    Py_XDECREF(views);
    /* (the record, a watch of the storage, no longer held here: a release drops it,
     * and its storage's death then reports nothing, as on the Python path) */
    Py_CLEAR(record);
    if (viewed < 0) goto done;
    if (!viewed && self->use_count != NULL) {
        PyObject *cdata = PyObject_GetAttr(storage, name_cdata);
        PyObject *count = cdata ? PyObject_CallOneArg(self->use_count, cdata) : NULL;
        Py_XDECREF(cdata);
        long long uses = count ? PyLong_AsLongLong(count) : -1;
        Py_XDECREF(count);
        if (uses == -1 && PyErr_Occurred()) goto done;
        alone = uses == self->held_alone;
    }
    PyObject *outcome = forget_and_step(self, quick, alone ? Py_True : Py_False);
    if (outcome == NULL) goto done;
    if (outcome == Py_None) {   /* something pending: the general path deals with it */
        Py_DECREF(outcome);
        result = Py_NewRef(Py_None);
        goto done;
    }
    detached = 0;   /* agreed: the tensor stays empty, whatever follows */
    int everywhere;
    if (PyLong_CheckExact(outcome)) {
        everywhere = PyLong_AsLong(outcome) == 0;
    } else {
        PyObject *flag = PyObject_GetAttr(outcome, name_flag_everywhere);
        everywhere = flag ? PyObject_IsTrue(flag) : -1;
        Py_XDECREF(flag);
    }
    Py_DECREF(outcome);
    if (everywhere < 0) goto done;
    int failed;
    if (everywhere) {   /* nothing views it on any PE: released now (_finish_free's _release) */
        int small = cached_release(self->cached, offset);
        PyObject *failure = small == 0 ? PyObject_CallOneArg(self->local_release, offset) : NULL;
        failed = small < 0 || (small == 0 && failure == NULL);
        Py_XDECREF(failure);   /* (not imported memory: nothing to unmap, no failure to tell) */
        Py_CLEAR(storage);
    } else {   /* deferred to its views' death, our reference dropped first */
        Py_CLEAR(storage);
        failed = cached_defer(self->cached, offset) < 0;
    }
    if (!failed) result = Py_NewRef(Py_True);
done:
    if (detached) {   /* nothing done after all (steps.free does it), or an error */
        restore(tensor, storage, size, stride);
        if (result != NULL && PyErr_Occurred()) Py_CLEAR(result);
    }
    Py_XDECREF(size);
    Py_XDECREF(stride);
    Py_XDECREF(quick);
    Py_XDECREF(record);
    Py_XDECREF(offset);
    Py_XDECREF(storage);
    if (unlock(self) < 0) Py_CLEAR(result);
    return result;
}

static int face_traverse(FaceFree *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->cached);
    Py_VISIT(self->quick);
    Py_VISIT(self->forget);
    Py_VISIT(self->local_release);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->use_count);
    return 0;
}

static int face_clear(FaceFree *self) {
    Py_CLEAR(self->cached);
    Py_CLEAR(self->quick);
    Py_CLEAR(self->forget);
    Py_CLEAR(self->local_release);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->not_blocking);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->use_count);
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
    {"free_memory", (PyCFunction)(void (*)(void))free_memory, METH_FASTCALL,
     "free_memory(memory[, array_type]) -> True (freed), or None (stepped aside, nothing done)"},
    {"free_tensor", (PyCFunction)free_tensor, METH_O,
     "free_tensor(tensor) -> True (freed), or None (stepped aside, nothing done)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot face_slots[] = {
    {Py_tp_doc, "FaceFree(core, cached, tensor_type, use_count, held_alone): the faces' frees "
                "in one call (face_free.c says what it does)."},
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
    struct { PyObject **name; const char *text; } names[] = {
        {&free_key, "free"}, {&name_base, "base"}, {&name_untyped_storage, "untyped_storage"},
        {&name_data_ptr, "data_ptr"}, {&name_nbytes, "nbytes"},
        {&name_storage_offset, "storage_offset"}, {&name_is_contiguous, "is_contiguous"},
        {&name_size, "size"}, {&name_stride, "stride"}, {&name_set, "set_"},
        {&name_cdata, "_cdata"}, {&name_freed_mark, "_shmemvm_freed"}, {&name_views, "views"},
        {&name_flag_everywhere, "flag_everywhere"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &face_spec, NULL);
    if (type == NULL) return -1;
    int failed = PyModule_AddObjectRef(module, "FaceFree", type);
    Py_DECREF(type);
    return failed;
}
