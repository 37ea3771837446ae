/* The NumPy face's HeapMemory in C (part of shmemvm.native._native; issue 30:
 * an array over a new allocation took 3 us through the pure class's array
 * interface, a sixth of a NumPy malloc + free).
 *
 *   HeapMemory(tensor)
 *       tensor: a uint8 tensor of a block. Its `address` (where its bytes
 *       start), `nbytes` and `tensor`; its buffer is those bytes, writable,
 *       so numpy.asarray(memory) is a uint8 array over them in 0.2 us (its
 *       base a memoryview of the memory: shmem/arrays.py's owner() walks
 *       through it). The array interface too, as the pure class's
 *       (native/__init__.py's PyHeapMemory). Subclassable.
 *
 * It does not touch the memory: the tensor keeps the block, and what the
 * block is the heap has checked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include "views.h"

/* the tensor methods it calls, by interned name (a C string's method call makes the
 * name anew each time: a fifth of the memory's making) */
static PyObject *name_data_ptr, *name_untyped_storage, *name_storage_offset, *name_numel;

typedef struct {
    PyObject_HEAD
    PyObject *tensor;
    unsigned long long address;
    Py_ssize_t nbytes;
} HeapMemory;

/* where a uint8 tensor's bytes start: its data_ptr(), but for a tensor without
 * elements, whose data_ptr() torch may give as 0: then its storage's start plus
 * its offset (the pure class's reading, for every tensor) */
static int start_of(PyObject *tensor, Py_ssize_t nbytes, unsigned long long *address) {
    PyObject *start;
    long long skip = 0;
    if (nbytes > 0) {
        start = PyObject_CallMethodNoArgs(tensor, name_data_ptr);
    } else {
        PyObject *storage = PyObject_CallMethodNoArgs(tensor, name_untyped_storage);
        if (storage == NULL) return -1;
        start = PyObject_CallMethodNoArgs(storage, name_data_ptr);
        Py_DECREF(storage);
        PyObject *offset = start == NULL ? NULL
                           : PyObject_CallMethodNoArgs(tensor, name_storage_offset);
        skip = offset == NULL ? -1 : PyLong_AsLongLong(offset);
        Py_XDECREF(offset);
    }
    if (start == NULL) return -1;
    *address = PyLong_AsUnsignedLongLong(start);
    Py_DECREF(start);
    if (PyErr_Occurred()) return -1;
    if (skip < 0) {
        PyErr_SetString(PyExc_ValueError, "HeapMemory: the tensor's offset must be >= 0");
        return -1;
    }
    *address += (unsigned long long)skip;
    return 0;
}

static int memory_init(HeapMemory *self, PyObject *args, PyObject *kwargs) {
    PyObject *tensor;
    static char *names[] = {"tensor", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:HeapMemory", names, &tensor))
        return -1;
    PyObject *numel = PyObject_CallMethodNoArgs(tensor, name_numel);
    if (numel == NULL) return -1;
    Py_ssize_t nbytes = PyLong_AsSsize_t(numel);
    Py_DECREF(numel);
    if (nbytes < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "HeapMemory: a negative size");
        return -1;
    }
    unsigned long long address;
    if (start_of(tensor, nbytes, &address) < 0) return -1;
    Py_INCREF(tensor);
    Py_XSETREF(self->tensor, tensor);
    self->address = address;
    self->nbytes = nbytes;
    return 0;
}

static int memory_traverse(HeapMemory *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->tensor);
    return 0;
}

static int memory_clear(HeapMemory *self) {
    Py_CLEAR(self->tensor);
    return 0;
}

static void memory_dealloc(HeapMemory *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    memory_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static int memory_getbuffer(HeapMemory *self, Py_buffer *view, int flags) {
    if (self->tensor == NULL) {
        PyErr_SetString(PyExc_ValueError, "HeapMemory: not initialised");
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, (void *)(uintptr_t)self->address,
                             self->nbytes, 0, flags);
}

/* the array interface too (NumPy's older way in; the Python class's only one) */
static PyObject *memory_interface(HeapMemory *self, void *closure) {
    (void)closure;
    return Py_BuildValue("{s:(KO),s:(n),s:s,s:i}", "data", self->address, Py_False,
                         "shape", self->nbytes, "typestr", "|u1", "version", 3);
}

static PyMemberDef memory_members[] = {
    {"tensor", T_OBJECT, offsetof(HeapMemory, tensor), READONLY,
     "the uint8 tensor of the block"},
    {"address", T_ULONGLONG, offsetof(HeapMemory, address), READONLY,
     "where its bytes start"},
    {"nbytes", T_PYSSIZET, offsetof(HeapMemory, nbytes), READONLY, "how many"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef memory_getset[] = {
    {"__array_interface__", (getter)memory_interface, NULL, "NumPy's array interface", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot memory_slots[] = {
    {Py_tp_doc, "One allocation of the heap as NumPy sees it: a writable buffer over the "
                "bytes of a uint8 tensor of its block (HeapMemory(tensor))."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, memory_init},
    {Py_tp_dealloc, memory_dealloc},
    {Py_tp_traverse, memory_traverse},
    {Py_tp_clear, memory_clear},
    {Py_tp_members, memory_members},
    {Py_tp_getset, memory_getset},
    {Py_bf_getbuffer, memory_getbuffer},
    {0, NULL},
};

static PyType_Spec memory_spec = {
    "shmemvm.native._native.HeapMemory", sizeof(HeapMemory), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, memory_slots,
};

static PyTypeObject *memory_type;   /* HeapMemory (for face_free.c) */

int heap_memory_parts(PyObject *obj, PyObject **tensor, unsigned long long *address) {
    if (memory_type == NULL || Py_TYPE(obj) != memory_type
        || ((HeapMemory *)obj)->tensor == NULL)
        return 0;
    *tensor = ((HeapMemory *)obj)->tensor;
    *address = ((HeapMemory *)obj)->address;
    return 1;
}

int add_views(PyObject *module) {
    if ((name_data_ptr = PyUnicode_InternFromString("data_ptr")) == NULL
        || (name_untyped_storage = PyUnicode_InternFromString("untyped_storage")) == NULL
        || (name_storage_offset = PyUnicode_InternFromString("storage_offset")) == NULL
        || (name_numel = PyUnicode_InternFromString("numel")) == NULL)
        return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &memory_spec, NULL);
    if (type == NULL) return -1;
    int failed = PyModule_AddObjectRef(module, "HeapMemory", type);
    if (!failed) memory_type = (PyTypeObject *)type;   /* (the module keeps it) */
    Py_DECREF(type);
    return failed;
}
