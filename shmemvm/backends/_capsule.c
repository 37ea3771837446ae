/* shmemvm.backends._capsule: a torch tensor over an address, made in C (issue
 * 30: through ctypes, backends/_dlpack.py's tensor_at cost 1.7 us of a cached
 * malloc; this costs 0.5).
 *
 *   tensor_at(consume, address, shape, code, bits, device_type, device_id)
 *       consume(capsule): the tensor of a DLPack capsule (torch's own
 *       consumer) over `address` with a compact `shape` of DLPack dtype
 *       (code, bits), on DLPack device (device_type, device_id). The
 *       capsule's struct is its own allocation, freed by its deleter once
 *       torch lets the tensor's storage go: plain C, safe from any thread
 *       and during interpreter teardown (_dlpack.py's ctypes path shares one
 *       struct instead, because a ctypes deleter would be Python).
 *
 * It does not touch the memory: what the address means (a live, mapped block)
 * the heap has checked. It checks what it is given: a tuple shape of at most
 * 64 non-negative sizes, a DLPack type code and width that exist, a device.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

/* dlpack.h's structs (DLPack 0.8, the unversioned capsule "dltensor") */
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape, *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *);
} DLManagedTensor;

#define MAX_NDIM 64
#define DL_MAX_CODE 6   /* kDLBool; kDLOpaqueHandle (3) is no element type */

/* the struct and its shape in one allocation */
typedef struct { DLManagedTensor managed; int64_t shape[]; } Managed;

static void managed_free(DLManagedTensor *managed) { free(managed); }

/* a capsule torch never took (its consumer failed) still owns its struct */
static void capsule_free(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        DLManagedTensor *managed = PyCapsule_GetPointer(capsule, "dltensor");
        if (managed != NULL && managed->deleter != NULL) managed->deleter(managed);
    }
}

static PyObject *capsule_tensor_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "tensor_at(consume, address, shape, code, bits, "
                                         "device_type, device_id) takes 7 arguments");
        return NULL;
    }
    PyObject *consume = args[0], *shape = args[2];
    unsigned long long address = PyLong_AsUnsignedLongLong(args[1]);
    if (address == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(shape)) {
        PyErr_SetString(PyExc_TypeError, "tensor_at: shape must be a tuple of ints");
        return NULL;
    }
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim > MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "at most %d dimensions are supported, got %zd",
                     MAX_NDIM, ndim);
        return NULL;
    }
    long code = PyLong_AsLong(args[3]), bits = PyLong_AsLong(args[4]);
    long device_type = PyLong_AsLong(args[5]), device_id = PyLong_AsLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (code < 0 || code > DL_MAX_CODE || code == 3 || bits <= 0 || bits > 255 || bits % 8 ||
            device_type < 1 || device_type > INT32_MAX || device_id < 0 ||
            device_id > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "tensor_at: no DLPack dtype (code %ld, %ld bits) or "
                     "device (%ld, %ld) of that kind", code, bits, device_type, device_id);
        return NULL;
    }
    Managed *made = malloc(sizeof(Managed) + (ndim ? ndim : 1) * sizeof(int64_t));
    if (made == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < ndim; i++) {
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (size < 0) {
            free(made);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "tensor_at: size %lld of dimension %zd is "
                             "negative", size, i);
            return NULL;
        }
        made->shape[i] = size;
    }
    DLManagedTensor *managed = &made->managed;
    managed->dl_tensor = (DLTensor){
        .data = (void *)(uintptr_t)address,
        .device = {(int32_t)device_type, (int32_t)device_id},
        .ndim = (int32_t)ndim,
        .dtype = {(uint8_t)code, (uint8_t)bits, 1},
        .shape = made->shape, .strides = NULL, .byte_offset = 0,
    };
    managed->manager_ctx = NULL;
    managed->deleter = managed_free;
    PyObject *capsule = PyCapsule_New(managed, "dltensor", capsule_free);
    if (capsule == NULL) {
        free(made);
        return NULL;
    }
    PyObject *tensor = PyObject_CallOneArg(consume, capsule);
    Py_DECREF(capsule);   /* renamed "used_dltensor" once torch took it: frees nothing */
    return tensor;
}

static PyMethodDef methods[] = {
    {"tensor_at", (PyCFunction)(void (*)(void))capsule_tensor_at, METH_FASTCALL,
     "tensor_at(consume, address, shape, code, bits, device_type, device_id) -> tensor"},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {{0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_capsule",
    "A torch tensor over an address through a DLPack capsule of its own (see the source).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__capsule(void) {
    return PyModuleDef_Init(&module);
}
