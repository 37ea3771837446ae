/* The core's dead blocks in one call each (issue 30): the blocks nothing views
 * any more here, taken from the engine into the pending set that the next
 * agreed step carries, and the release of those every PE dropped.
 *
 * Every NumPy-face malloc after a free carries the freed block (dead once its
 * arrays died) and releases it in its step. In Python each half is about six
 * frames across the core and the engine (HeapCore._dead_to_release ->
 * HeapMemory.take_dead -> _take_dead -> _absorb_events; HeapCore.release_dead
 * -> forget -> release -> _release -> the compiled release), with almost no
 * work in any; timed in place they were 2.1 and 1.8 us of a 13 us malloc +
 * free. DeadBlocks does the same on the same objects:
 *
 *   DeadBlocks(core, cached)
 *       core: the HeapCore (its `_pending` and `_held` read and written in
 *       its instance dict; its forget(), local.release() and release_dead()
 *       called); cached: its engine's CachedBlocks (blocks.c).
 *   take(): HeapCore._dead_to_release: the engine's dead blocks
 *       (CachedBlocks.take_dead) added to the pending set, which it returns.
 *   release(offsets): HeapCore.release_dead: where allocate() holds the
 *       releases (`_held` not None), release_dead() itself; else forget(),
 *       each offset in order released (CachedBlocks' release of a small block,
 *       else the engine's release()), and the pending set less them.
 *
 * The Python methods stay (SHMEMVM_NATIVE=0, and every case this steps aside
 * for); tests/mpi/memory/test_quick_alloc.py holds heaps with and without it
 * equal. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "blocks.h"
#include "dead.h"

typedef struct {
    PyObject_HEAD
    PyObject *core_dict, *cached;
    /* core.forget, core.local.release, core.release_dead (bound) */
    PyObject *forget, *local_release, *release_dead;
} DeadBlocks;

static PyObject *name_pending, *name_held;

static int dead_init(DeadBlocks *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"core", "cached", NULL};
    PyObject *core, *cached;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:DeadBlocks", names, &core, &cached))
        return -1;
    if (!is_cached_blocks(cached)) {
        PyErr_SetString(PyExc_TypeError, "DeadBlocks(core, cached): cached must be a "
                        "CachedBlocks");
        return -1;
    }
    PyObject *type = (PyObject *)Py_TYPE(core);
    if (Py_TYPE(core)->tp_dictoffset == 0 || PyObject_HasAttr(type, name_pending)
        || PyObject_HasAttr(type, name_held)) {
        PyErr_SetString(PyExc_TypeError, "DeadBlocks: the core keeps _pending and _held in "
                        "its instance dict");
        return -1;
    }
    PyObject *core_dict = PyObject_GenericGetDict(core, NULL);
    PyObject *forget = core_dict ? PyObject_GetAttrString(core, "forget") : NULL;
    PyObject *release_dead = forget ? PyObject_GetAttrString(core, "release_dead") : NULL;
    PyObject *local = release_dead ? PyObject_GetAttrString(core, "local") : NULL;
    PyObject *local_release = local ? PyObject_GetAttrString(local, "release") : NULL;
    Py_XDECREF(local);
    if (local_release == NULL) {
        Py_XDECREF(core_dict);
        Py_XDECREF(forget);
        Py_XDECREF(release_dead);
        return -1;
    }
    Py_XSETREF(self->core_dict, core_dict);
    Py_XSETREF(self->cached, Py_NewRef(cached));
    Py_XSETREF(self->forget, forget);
    Py_XSETREF(self->release_dead, release_dead);
    Py_XSETREF(self->local_release, local_release);
    return 0;
}

/* the core's pending set (borrowed), or NULL with an error set */
static PyObject *pending_of(DeadBlocks *self) {
    if (self->core_dict == NULL) {
        PyErr_SetString(PyExc_ValueError, "DeadBlocks: not initialised");
        return NULL;
    }
    PyObject *pending = PyDict_GetItemWithError(self->core_dict, name_pending);
    if (pending == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "DeadBlocks: no _pending");
        return NULL;
    }
    if (!PySet_CheckExact(pending)) {
        PyErr_SetString(PyExc_TypeError, "DeadBlocks: the core's _pending is not a set");
        return NULL;
    }
    return pending;
}

static PyObject *dead_take(DeadBlocks *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *pending = pending_of(self);
    if (pending == NULL) return NULL;
    Py_INCREF(pending);   /* (the engine's calls below run no Python of the core's) */
    PyObject *dead = cached_take_dead(self->cached);
    int failed = dead == NULL;
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(dead); i++)
        failed = PySet_Add(pending, PyList_GET_ITEM(dead, i)) < 0;
    Py_XDECREF(dead);
    if (failed) Py_CLEAR(pending);
    return pending;
}

static PyObject *dead_release(DeadBlocks *self, PyObject *offsets) {
    if (pending_of(self) == NULL) return NULL;
    PyObject *held = PyDict_GetItemWithError(self->core_dict, name_held);
    if (held == NULL && PyErr_Occurred()) return NULL;
    if (held != NULL && held != Py_None)   /* allocate()'s one step holds them */
        return PyObject_CallOneArg(self->release_dead, offsets);
    PyObject *order = PySequence_List(offsets);
    if (order == NULL) return NULL;
    PyObject *forgot = PyList_Sort(order) < 0 ? NULL : PyObject_CallNoArgs(self->forget);
    int failed = forgot == NULL;
    Py_XDECREF(forgot);
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(order); i++) {
        PyObject *offset = PyList_GET_ITEM(order, i);
        int done = cached_release(self->cached, offset);
        if (done == 0) {   /* not a small block's: the engine's Python release */
            PyObject *failure = PyObject_CallOneArg(self->local_release, offset);
            failed = failure == NULL;   /* (a returned failure is logged there, not raised) */
            Py_XDECREF(failure);
        }
        failed = failed || done < 0;
    }
    Py_DECREF(order);
    if (failed) return NULL;
    /* a new set, not `-=` (release_dead says why) */
    PyObject *pending = pending_of(self);
    PyObject *left = pending ? PyNumber_Subtract(pending, offsets) : NULL;
    if (left == NULL) return NULL;
    failed = PyDict_SetItem(self->core_dict, name_pending, left) < 0;
    Py_DECREF(left);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static int dead_traverse(DeadBlocks *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->core_dict);
    Py_VISIT(self->cached);
    Py_VISIT(self->forget);
    Py_VISIT(self->local_release);
    Py_VISIT(self->release_dead);
    return 0;
}

static int dead_clear(DeadBlocks *self) {
    Py_CLEAR(self->core_dict);
    Py_CLEAR(self->cached);
    Py_CLEAR(self->forget);
    Py_CLEAR(self->local_release);
    Py_CLEAR(self->release_dead);
    return 0;
}

static void dead_dealloc(DeadBlocks *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    dead_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMethodDef dead_methods[] = {
    {"take", (PyCFunction)dead_take, METH_NOARGS,
     "take() -> the core's pending set, the engine's dead blocks added (_dead_to_release)"},
    {"release", (PyCFunction)dead_release, METH_O,
     "release(offsets): the core's release_dead(offsets), the blocks every PE dropped"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot dead_slots[] = {
    {Py_tp_doc, "DeadBlocks(core, cached): the core's dead blocks taken and released in one "
                "call each (dead.c says what it does)."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, dead_init},
    {Py_tp_dealloc, dead_dealloc},
    {Py_tp_traverse, dead_traverse},
    {Py_tp_clear, dead_clear},
    {Py_tp_methods, dead_methods},
    {0, NULL},
};

static PyType_Spec dead_spec = {
    "shmemvm.native._native.DeadBlocks", sizeof(DeadBlocks), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, dead_slots,
};

int add_dead(PyObject *module) {
    if ((name_pending = PyUnicode_InternFromString("_pending")) == NULL
        || (name_held = PyUnicode_InternFromString("_held")) == NULL)
        return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &dead_spec, NULL);
    if (type == NULL) return -1;
    int failed = PyModule_AddObjectRef(module, "DeadBlocks", type);
    Py_DECREF(type);
    return failed;
}
