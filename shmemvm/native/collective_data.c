/* shmemvm.native._collective, its data side (issue 30): the reductions
 * combined in C, a delivery from a step's scratch, and the NumPy face's memo
 * key of a collective call. What each entry point does is said at the top of
 * _collective.c, which holds the module's method table; the checks there hold
 * here too (a wrong call is a ValueError, never a crash). */
#include "collective.h"
#include <string.h>

/* element kinds, exported as KINDS by the array/struct typecode of their bits (the
 * same numbering as _native.c's WORDS), and reduce's ops, exported as REDUCE_OPS by
 * name: native/__init__.py checks both against shmemvm/vocabulary.py at import */
enum { K_I8, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64, K_F32, K_F64, K_COUNT };
static const char *const kind_codes[K_COUNT] = {"b", "B", "h", "H", "i", "I", "q", "Q", "f", "d"};
enum { O_SUM, O_PROD, O_MIN, O_MAX, O_AND, O_OR, O_XOR, O_COUNT };
static const char *const op_names[O_COUNT] = {"sum", "prod", "min", "max", "and", "or", "xor"};

static const int kind_sizes[K_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 4, 8};

/* dst <- src[0] op src[1] op ... op src[n-1], elementwise, folded left in that
 * order: dst takes src[0], then each next source is folded in over the whole
 * range (the same operations on each element as a fold element by element, so
 * the same bits, and loops a compiler vectorizes). dst may be src[0] itself but
 * overlap no other source (fold_overlaps() refuses that).
 * Integers: sum and prod in the unsigned type of the width (they wrap, as torch
 * and NumPy do, without C's signed overflow); floats: sum and prod only. */
#define FOLD(T, U, FLOAT)                                                                \
    do {                                                                                  \
        T *d_ = (T *)dst;                                                                 \
        const T *s0_ = (const T *)src[0];                                                 \
        if ((const void *)d_ != (const void *)s0_) memmove(d_, s0_, (size_t)count * sizeof(T)); \
        for (Py_ssize_t p = 1; p < n; p++) {                                              \
            const T *s_ = (const T *)src[p];                                              \
            switch (op) {                                                                 \
            case O_SUM:                                                                   \
                for (Py_ssize_t j = 0; j < count; j++)                                    \
                    d_[j] = FLOAT ? (T)(d_[j] + s_[j]) : (T)((U)d_[j] + (U)s_[j]);        \
                break;                                                                    \
            case O_PROD:                                                                  \
                for (Py_ssize_t j = 0; j < count; j++)                                    \
                    d_[j] = FLOAT ? (T)(d_[j] * s_[j]) : (T)((U)d_[j] * (U)s_[j]);        \
                break;                                                                    \
            case O_MIN:                                                                   \
                for (Py_ssize_t j = 0; j < count; j++) d_[j] = s_[j] < d_[j] ? s_[j] : d_[j]; \
                break;                                                                    \
            case O_MAX:                                                                   \
                for (Py_ssize_t j = 0; j < count; j++) d_[j] = s_[j] > d_[j] ? s_[j] : d_[j]; \
                break;                                                                    \
            default: fold_bits((unsigned char *)d_, (const unsigned char *)s_,           \
                               (size_t)count * sizeof(T), op);                            \
            }                                                                             \
        }                                                                                 \
    } while (0)

/* and, or, xor: on the bytes (the same as on the integers) */
static void fold_bits(unsigned char *d, const unsigned char *s, size_t nbytes, Py_ssize_t op) {
    for (size_t j = 0; j < nbytes; j++)
        d[j] = op == O_AND ? (d[j] & s[j]) : op == O_OR ? (d[j] | s[j]) : (d[j] ^ s[j]);
}

/* 0, or -1 with a ValueError where dst overlaps a source other than being src[0] */
static int fold_overlaps(uintptr_t dst, const unsigned char *const *src, Py_ssize_t n,
                         Py_ssize_t nbytes, const char *what) {
    for (Py_ssize_t p = 0; p < n && nbytes; p++) {
        uintptr_t a = (uintptr_t)src[p];
        if (a < dst + (uintptr_t)nbytes && dst < a + (uintptr_t)nbytes && !(p == 0 && a == dst)) {
            PyErr_Format(PyExc_ValueError, "%s: the destination overlaps source %zd; it may "
                         "be the first source itself, or none", what, p);
            return -1;
        }
    }
    return 0;
}

/* The fold of n sources into dst (checked by the callers); without the GIL
 * from 64 KiB on. */
static void fold(void *dst, const unsigned char *const *src, Py_ssize_t n, Py_ssize_t nbytes,
                 Py_ssize_t kind, Py_ssize_t op) {
    Py_ssize_t count = nbytes / kind_sizes[kind];
    PyThreadState *state = nbytes >= (64 << 10) ? PyEval_SaveThread() : NULL;
    switch (kind) {
    case K_I8:  FOLD(int8_t, uint8_t, 0); break;
    case K_U8:  FOLD(uint8_t, uint8_t, 0); break;
    case K_I16: FOLD(int16_t, uint16_t, 0); break;
    case K_U16: FOLD(uint16_t, uint16_t, 0); break;
    case K_I32: FOLD(int32_t, uint32_t, 0); break;
    case K_U32: FOLD(uint32_t, uint32_t, 0); break;
    case K_I64: FOLD(int64_t, uint64_t, 0); break;
    case K_U64: FOLD(uint64_t, uint64_t, 0); break;
    case K_F32: FOLD(float, float, 1); break;
    default:    FOLD(double, double, 1); break;
    }
    if (state) PyEval_RestoreThread(state);
}

/* kind and op checked: 0, or -1 with a ValueError */
static int check_fold(Py_ssize_t kind, Py_ssize_t op, Py_ssize_t nbytes, const char *what) {
    if (kind >= K_COUNT || op >= O_COUNT || (kind >= K_F32 && op > O_PROD)
        || nbytes % kind_sizes[kind]) {
        PyErr_Format(PyExc_ValueError, "%s: kind %zd, op %zd over %zd bytes: not one this "
                     "combines", what, kind, op, nbytes);
        return -1;
    }
    return 0;
}

/* combine(dst, nbytes, scratch, n, kind, op): see the top of the file */
PyObject *coll_combine(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "combine(dst, nbytes, scratch, n, kind, op)");
        return NULL;
    }
    Py_ssize_t nbytes, n, kind, op;
    if (get_ssize(args[1], &nbytes, 0, "combine: nbytes") < 0
        || get_ssize(args[3], &n, 1, "combine: n") < 0
        || get_ssize(args[4], &kind, 0, "combine: kind") < 0
        || get_ssize(args[5], &op, 0, "combine: op") < 0
        || check_fold(kind, op, nbytes, "combine") < 0)
        return NULL;
    if (n > 4096) {
        PyErr_Format(PyExc_ValueError, "combine: %zd PEs, at most 4096", n);
        return NULL;
    }
    uintptr_t dst_address;
    if (parse_address(args[0], &dst_address, (unsigned long long)nbytes, kind_sizes[kind],
                      "combine: dst") < 0)
        return NULL;
    Py_buffer scratch;
    if (PyObject_GetBuffer(args[2], &scratch, PyBUF_SIMPLE) < 0) return NULL;
    if (nbytes && n > scratch.len / nbytes) {
        PyBuffer_Release(&scratch);
        PyErr_Format(PyExc_ValueError, "combine: scratch has %zd bytes, not %zd PEs' %zd",
                     scratch.len, n, nbytes);
        return NULL;
    }
    if (((uintptr_t)scratch.buf) % kind_sizes[kind]) {
        PyBuffer_Release(&scratch);
        PyErr_SetString(PyExc_ValueError, "combine: scratch is not aligned to its elements");
        return NULL;
    }
    const unsigned char *src[4096];
    for (Py_ssize_t p = 0; p < n; p++) src[p] = (const unsigned char *)scratch.buf + p * nbytes;
    if (fold_overlaps(dst_address, src, n, nbytes, "combine") < 0) {
        PyBuffer_Release(&scratch);
        return NULL;
    }
    fold((void *)dst_address, src, n, nbytes, kind, op);
    PyBuffer_Release(&scratch);
    Py_RETURN_NONE;
}

/* combine_from(dst, nbytes, sources, kind, op): as combine(), from the
 * addresses in the tuple `sources` (the PEs' copies through the node's
 * mappings, in team PE order; each a live block the caller checked) */
PyObject *coll_combine_from(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "combine_from(dst, nbytes, sources: tuple, kind, op)");
        return NULL;
    }
    Py_ssize_t nbytes, kind, op, n = PyTuple_GET_SIZE(args[2]);
    if (get_ssize(args[1], &nbytes, 0, "combine_from: nbytes") < 0
        || get_ssize(args[3], &kind, 0, "combine_from: kind") < 0
        || get_ssize(args[4], &op, 0, "combine_from: op") < 0
        || check_fold(kind, op, nbytes, "combine_from") < 0)
        return NULL;
    if (n < 1 || n > 4096) {
        PyErr_Format(PyExc_ValueError, "combine_from: %zd sources, 1 to 4096", n);
        return NULL;
    }
    uintptr_t dst_address, address;
    const unsigned char *src[4096];
    if (parse_address(args[0], &dst_address, (unsigned long long)nbytes, kind_sizes[kind],
                      "combine_from: dst") < 0)
        return NULL;
    for (Py_ssize_t p = 0; p < n; p++) {
        if (parse_address(PyTuple_GET_ITEM(args[2], p), &address, (unsigned long long)nbytes,
                          kind_sizes[kind], "combine_from: a source") < 0)
            return NULL;
        src[p] = (const unsigned char *)address;
    }
    if (fold_overlaps(dst_address, src, n, nbytes, "combine_from") < 0) return NULL;
    fold((void *)dst_address, src, n, nbytes, kind, op);
    Py_RETURN_NONE;
}

/* deliver(dst, scratch, offset, nbytes) */
PyObject *coll_deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "deliver(dst, scratch, offset, nbytes)");
        return NULL;
    }
    Py_ssize_t offset, nbytes;
    if (get_ssize(args[2], &offset, 0, "deliver: offset") < 0
        || get_ssize(args[3], &nbytes, 0, "deliver: nbytes") < 0)
        return NULL;
    uintptr_t dst;
    if (parse_address(args[0], &dst, (unsigned long long)nbytes, 0, "deliver: dst") < 0)
        return NULL;
    Py_buffer scratch;
    if (PyObject_GetBuffer(args[1], &scratch, PyBUF_SIMPLE) < 0) return NULL;
    if (offset > scratch.len || nbytes > scratch.len - offset) {
        PyBuffer_Release(&scratch);
        PyErr_Format(PyExc_ValueError, "deliver: %zd bytes at %zd of a scratch of %zd",
                     nbytes, offset, scratch.len);
        return NULL;
    }
    if (nbytes) memmove((void *)dst, (unsigned char *)scratch.buf + offset, (size_t)nbytes);
    PyBuffer_Release(&scratch);
    Py_RETURN_NONE;
}


/* deliver_collected(dst, scratch, n, stride, d, s, dest_count, size) -> bool */
PyObject *coll_deliver_collected(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "deliver_collected(dst, scratch, n, stride, d, s, dest_count, size)");
        return NULL;
    }
    Py_ssize_t n, stride, d, s, dest_count, size;
    if (get_ssize(args[2], &n, 1, "deliver_collected: n") < 0
        || get_ssize(args[3], &stride, 16, "deliver_collected: stride") < 0
        || get_ssize(args[4], &d, 0, "deliver_collected: d") < 0
        || get_ssize(args[5], &s, 0, "deliver_collected: s") < 0
        || get_ssize(args[6], &dest_count, 0, "deliver_collected: dest_count") < 0
        || get_ssize(args[7], &size, 1, "deliver_collected: size") < 0)
        return NULL;
    Py_buffer scratch;
    if (PyObject_GetBuffer(args[1], &scratch, PyBUF_SIMPLE) < 0) return NULL;
    if (n > scratch.len / stride) {
        PyBuffer_Release(&scratch);
        PyErr_Format(PyExc_ValueError, "deliver_collected: %zd payloads of %zd bytes in a "
                     "scratch of %zd", n, stride, scratch.len);
        return NULL;
    }
    const unsigned char *payloads = (const unsigned char *)scratch.buf;
    /* the counts as the Python check reads them (collectives._collect_fits), in
     * elements; anything it would refuse, or a count that does not fit its payload,
     * is left to it (False, nothing written) */
    long long total = 0, widest = 0, nbytes = 0;
    int fits = 1;
    for (Py_ssize_t pe = 0; pe < n && fits; pe++) {
        int64_t count;
        memcpy(&count, payloads + pe * stride, 8);
        if (count < 0 || count > stride - 8) {
            fits = 0;
            break;
        }
        total += count / size;
        if (count / size > widest) widest = count / size;
        nbytes += count;
    }
    if (fits && total > dest_count) fits = 0;
    if (fits) {
        long long nd = total * size, ns = widest * size;   /* (at most n * stride each) */
        if (nd && ns && d < s + ns && s < d + nd) fits = 0;
    }
    uintptr_t dst = 0;
    if (fits && parse_address(args[0], &dst, (unsigned long long)nbytes, 0,
                              "deliver_collected: dst") < 0) {
        PyBuffer_Release(&scratch);
        return NULL;
    }
    if (fits) {
        unsigned char *to = (unsigned char *)dst;
        for (Py_ssize_t pe = 0; pe < n; pe++) {
            int64_t count;
            memcpy(&count, payloads + pe * stride, 8);
            if (count) memmove(to, payloads + pe * stride + 8, (size_t)count);
            to += count;
        }
    }
    PyBuffer_Release(&scratch);
    return PyBool_FromLong(fits);
}

/* -- call_key: a replayed collective's memo key of the NumPy face -------------------
 * The leading fields of a NumPy array, as NumPy's PyArrayObject_fields lays
 * them out. They are NumPy's ABI (its PyArray_DATA()... macros compile these
 * offsets into every extension) and have not moved from NumPy 1.7 to 2.x; the
 * caller still checks that this reading agrees with NumPy's own answers on
 * probe arrays before it uses call_key (shmem/collectives.py), and it is read
 * only from objects whose type is exactly the ndarray type it is given. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} numpy_array;
#define NUMPY_WRITEABLE 0x0400

/* the attribute names call_key reads, interned once (exec_module) */
static PyObject *name_address, *name_nbytes, *name_itemsize;

/* An int attribute of `obj` as a non-negative long long; -1 (error set) if not. */
static long long int_attribute(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) return -1;
    long long v = PyLong_Check(value) ? PyLong_AsLongLong(value) : -1;
    Py_DECREF(value);
    if (v < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "call_key: %U is not an int >= 0", name);
    return v < 0 ? -1 : v;
}

/* The facts of array `a` that a collective's checks read, as four new
 * references in `facts` (its data address, shape, strides, dtype), where `a` is
 * exactly an ndarray whose base chain of exact ndarrays (then perhaps a
 * memoryview: NumPy's of a buffer) ends at an object of exactly type `memory`
 * (the face's HeapMemory) and whose bytes lie inside it
 * (its `address` and `nbytes`). 1 where they were made, 0 where `a` is
 * anything else (the caller's Python path decides then), -1 on an error. */
static int array_facts(PyObject *a, PyTypeObject *ndarray, PyTypeObject *memory,
                       PyObject *facts[4]) {
    if (Py_TYPE(a) != ndarray) return 0;
    numpy_array *array = (numpy_array *)a;
    PyObject *owner = array->base;
    while (owner != NULL && Py_TYPE(owner) == ndarray) owner = ((numpy_array *)owner)->base;
    if (owner != NULL && Py_TYPE(owner) == &PyMemoryView_Type)   /* NumPy's view of a buffer */
        owner = PyMemoryView_GET_BUFFER(owner)->obj;             /* (NULL once released) */
    if (owner == NULL || Py_TYPE(owner) != memory || array->nd < 0 || array->nd > 64) return 0;
    long long first = int_attribute(owner, name_address);
    if (first < 0) return -1;
    long long extent = int_attribute(owner, name_nbytes);
    if (extent < 0) return -1;
    long long itemsize = int_attribute(array->descr, name_itemsize);
    if (itemsize < 0) return -1;
    __int128 nbytes = itemsize;
    for (int i = 0; i < array->nd; i++) nbytes *= array->dimensions[i];
    __int128 start = (__int128)(uintptr_t)array->data;
    if (start < first || start > (__int128)first + extent - nbytes) return 0;
    PyObject *shape = PyTuple_New(array->nd), *strides = PyTuple_New(array->nd);
    PyObject *address = PyLong_FromVoidPtr(array->data);
    if (shape == NULL || strides == NULL || address == NULL) goto failed;
    for (int i = 0; i < array->nd; i++) {
        PyObject *dim = PyLong_FromSsize_t(array->dimensions[i]);
        if (dim == NULL) goto failed;
        PyTuple_SET_ITEM(shape, i, dim);
        PyObject *stride = PyLong_FromSsize_t(array->strides[i]);
        if (stride == NULL) goto failed;
        PyTuple_SET_ITEM(strides, i, stride);
    }
    facts[0] = address;
    facts[1] = shape;
    facts[2] = strides;
    facts[3] = Py_NewRef(array->descr);
    return 1;
failed:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    Py_XDECREF(address);
    return -1;
}

/* call_key(kind, group_id, values, target, source, ndarray, memory) */
PyObject *coll_call_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyTuple_Check(args[2]) || !PyType_Check(args[5]) || !PyType_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "call_key(kind, group_id, values: tuple, target, source, ndarray: type, "
                        "memory: type)");
        return NULL;
    }
    PyObject *values = args[2];
    Py_ssize_t n_values = PyTuple_GET_SIZE(values);
    for (Py_ssize_t i = 0; i < n_values; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i);
        if (v != Py_None && !PyLong_CheckExact(v) && !PyUnicode_Check(v)) Py_RETURN_NONE;
    }
    PyTypeObject *ndarray = (PyTypeObject *)args[5], *memory = (PyTypeObject *)args[6];
    /* the fields are read only from NumPy's own array type (by name and size) */
    if (strcmp(ndarray->tp_name, "numpy.ndarray") != 0
            || ndarray->tp_basicsize < (Py_ssize_t)sizeof(numpy_array)) {
        PyErr_Format(PyExc_TypeError, "call_key: ndarray must be numpy.ndarray, got %s",
                     ndarray->tp_name);
        return NULL;
    }
    PyObject *target[4], *source[4];
    int got = array_facts(args[3], ndarray, memory, target);
    if (got != 1) {
        if (got < 0) return NULL;
        Py_RETURN_NONE;
    }
    got = array_facts(args[4], ndarray, memory, source);
    PyObject *key = got == 1 ? PyTuple_New(11 + n_values) : NULL;
    if (key == NULL) {
        for (int i = 0; i < 4; i++) Py_DECREF(target[i]);
        if (got == 1) for (int i = 0; i < 4; i++) Py_DECREF(source[i]);
        if (got < 0 || PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    /* collectives.plan_key's order: (kind, group_id, target's address, shape, strides,
     * dtype, writeable, source's address, shape, strides, dtype, *values) */
    PyTuple_SET_ITEM(key, 0, Py_NewRef(args[0]));
    PyTuple_SET_ITEM(key, 1, Py_NewRef(args[1]));
    for (int i = 0; i < 4; i++) PyTuple_SET_ITEM(key, 2 + i, target[i]);
    PyTuple_SET_ITEM(key, 6, PyBool_FromLong(((numpy_array *)args[3])->flags & NUMPY_WRITEABLE));
    for (int i = 0; i < 4; i++) PyTuple_SET_ITEM(key, 7 + i, source[i]);
    for (Py_ssize_t i = 0; i < n_values; i++)
        PyTuple_SET_ITEM(key, 11 + i, Py_NewRef(PyTuple_GET_ITEM(values, i)));
    return key;
}

int collective_data_exec(PyObject *module) {
    if (name_address == NULL) {   /* (immortal once interned: a second module object shares them) */
        name_address = PyUnicode_InternFromString("address");
        name_nbytes = PyUnicode_InternFromString("nbytes");
        name_itemsize = PyUnicode_InternFromString("itemsize");
        if (name_address == NULL || name_nbytes == NULL || name_itemsize == NULL) return -1;
    }
    if (add_numbering(module, "KINDS", kind_codes, K_COUNT) < 0) return -1;
    return add_numbering(module, "REDUCE_OPS", op_names, O_COUNT);
}
