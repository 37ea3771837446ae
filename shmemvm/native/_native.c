/* shmemvm.native._native: the few things Python cannot do fast enough on
 * memory the node's PEs share (measured: docs/performance.md).
 *
 *   atomic(address, word, op, value, cond)  one atomic read-modify-write, with
 *       the CPU's atomic instructions (sequentially consistent), on a word of
 *       1, 2, 4 or 8 bytes (signed, unsigned) or a float32/float64 (fetch,
 *       set, swap only); returns the value before.
 *   load(address, word)                     an atomic read (acquire).
 *   copy(dst, src, nbytes)                  memmove between addresses (from 64 KiB
 *       on, one `rep movsb` where the CPU has FSRM and they do not overlap).
 *   address(buffer)                         where a C-contiguous buffer (a
 *       NumPy array) starts: 0.1 us, against 0.8 for __array_interface__.
 *   copy_from(dst, buffer, nbytes), copy_into(buffer, src, nbytes)
 *                                           memmove from/into a buffer's
 *       first nbytes (checked against its length): a small put or get of
 *       the NumPy face in one call.
 *   board_write(slot, vector, seq), board_read(slot, words, seq, seq_word,
 *       spins, out)                         write this PE's slot of a step of
 *       the agreement's shared-memory board, poll another's (agreement/
 *       board.py has the layout and protocol).
 *   HeapMemory(tensor)                      the NumPy face's buffer over an
 *       allocation's bytes (views.c).
 *   CachedBlocks(engine, buddy, ...)        the allocator's cached branch (a
 *       small block of a size freed lately, taken or given back) in one call
 *       (blocks.c).
 *   DeadBlocks(core, cached)                the core's dead blocks taken into
 *       the pending set and released, in one call each (dead.c).
 *   FaceFree(core, cached, ...)             the faces' frees (the NumPy face's
 *       memory, a torch tensor) in one call each, where the quick step is kept
 *       (face_free.c).
 *
 * Every function takes plain integers (addresses) and keeps no state: the
 * Python side checks every argument first (bounds, alignment, the live block)
 * and decides when to call. What C can check cheaply it checks too, so that a
 * wrong call is a ValueError, not a crash: a negative length, a null address
 * or one below the lowest page a process can map (vm.mmap_min_addr, 64 KiB),
 * a range that runs past the highest user address. What C cannot know is
 * whether an address lies inside a mapping: each is reached only through
 * shmemvm.native's wrappers, from code that checked that first: the torch and
 * NumPy faces' atomics and copies (openshmem/atomics.py, openshmem/rma.py,
 * shmem/rma.py: the live block, its generation, the PE, alignment and length,
 * before any address is formed) and agreement/board.py (slots of its own
 * mapping). A buffer argument's length C checks itself. The GIL is released
 * around board polls and large copies.
 *
 * The module exports its numbering of word kinds and operations (WORDS,
 * OPERATIONS: dicts added by the exec slot, multi-phase initialisation, PEP
 * 489); shmemvm/native/__init__.py compares them with its own table at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "shared.h"
#include "views.h"
#include "blocks.h"
#include "dead.h"
#include "face_free.h"
#include <stdint.h>
#include <string.h>
#include <sched.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* word kinds, exported as WORDS by the array/struct typecode of their bits */
enum { W_I8, W_U8, W_I16, W_U16, W_I32, W_U32, W_I64, W_U64, W_F32, W_F64, W_COUNT };
static const char *const word_codes[W_COUNT] = {"b", "B", "h", "H", "i", "I", "q", "Q", "f", "d"};
/* operations of atomic(), exported as OPERATIONS by name */
enum { OP_FETCH, OP_SET, OP_ADD, OP_AND, OP_OR, OP_XOR, OP_CAS, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"fetch", "set", "add", "and", "or", "xor", "cas"};

#define SEQ_CST __ATOMIC_SEQ_CST

/* One atomic operation on an integer word of type T; old value in *old. */
#define APPLY_INT(T, ptr, op, v, c, old)                                           \
    do {                                                                            \
        T *p_ = (T *)(ptr), v_ = (T)(v), c_ = (T)(c);                                \
        switch (op) {                                                               \
        case OP_FETCH: *(old) = __atomic_load_n(p_, SEQ_CST); break;                \
        case OP_SET:   *(old) = __atomic_exchange_n(p_, v_, SEQ_CST); break;        \
        case OP_ADD:   *(old) = __atomic_fetch_add(p_, v_, SEQ_CST); break;         \
        case OP_AND:   *(old) = __atomic_fetch_and(p_, v_, SEQ_CST); break;         \
        case OP_OR:    *(old) = __atomic_fetch_or(p_, v_, SEQ_CST); break;          \
        case OP_XOR:   *(old) = __atomic_fetch_xor(p_, v_, SEQ_CST); break;         \
        default: {     /* OP_CAS: the old value whether or not it swapped */        \
            T expected_ = c_;                                                       \
            __atomic_compare_exchange_n(p_, &expected_, v_, 0, SEQ_CST, SEQ_CST);    \
            *(old) = expected_;                                                     \
        }                                                                           \
        }                                                                           \
    } while (0)

static int word_size(int word) {
    static const int sizes[W_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 4, 8};
    return (word >= 0 && word < W_COUNT) ? sizes[word] : 0;
}

static int is_signed(int word) {
    return word == W_I8 || word == W_I16 || word == W_I32 || word == W_I64;
}

/* A Python int as the bit pattern of a `word` (the caller checked the range). */
static int to_bits(PyObject *value, int word, uint64_t *bits) {
    if (word == W_F32 || word == W_F64) {
        double d = PyFloat_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        if (word == W_F32) { float f = (float)d; uint32_t u; memcpy(&u, &f, 4); *bits = u; }
        else { memcpy(bits, &d, 8); }
        return 0;
    }
    if (is_signed(word)) {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred()) return -1;
        *bits = (uint64_t)v;
    } else {
        unsigned long long v = PyLong_AsUnsignedLongLong(value);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        *bits = (uint64_t)v;
    }
    return 0;
}

/* The bit pattern of a `word` as a Python number. */
static PyObject *from_bits(uint64_t bits, int word) {
    switch (word) {
    case W_I8:  return PyLong_FromLong((int8_t)bits);
    case W_U8:  return PyLong_FromUnsignedLong((uint8_t)bits);
    case W_I16: return PyLong_FromLong((int16_t)bits);
    case W_U16: return PyLong_FromUnsignedLong((uint16_t)bits);
    case W_I32: return PyLong_FromLong((int32_t)bits);
    case W_U32: return PyLong_FromUnsignedLong((uint32_t)bits);
    case W_I64: return PyLong_FromLongLong((int64_t)bits);
    case W_U64: return PyLong_FromUnsignedLongLong(bits);
    case W_F32: { uint32_t u = (uint32_t)bits; float f; memcpy(&f, &u, 4); return PyFloat_FromDouble(f); }
    default:    { double d; memcpy(&d, &bits, 8); return PyFloat_FromDouble(d); }
    }
}

/* The operation on the word at `address`; 0, or -1 with a Python error set. */
static int apply(uintptr_t address, int word, int op, uint64_t v, uint64_t c, uint64_t *old) {
    void *ptr = (void *)address;
    switch (word) {
    case W_I8: case W_U8:   { uint8_t o;  APPLY_INT(uint8_t, ptr, op, v, c, &o);  *old = o; return 0; }
    case W_I16: case W_U16: { uint16_t o; APPLY_INT(uint16_t, ptr, op, v, c, &o); *old = o; return 0; }
    case W_I32: case W_U32: { uint32_t o; APPLY_INT(uint32_t, ptr, op, v, c, &o); *old = o; return 0; }
    case W_I64: case W_U64: { uint64_t o; APPLY_INT(uint64_t, ptr, op, v, c, &o); *old = o; return 0; }
    case W_F32:
        if (op == OP_FETCH) { *old = __atomic_load_n((uint32_t *)ptr, SEQ_CST); return 0; }
        if (op == OP_SET) { *old = __atomic_exchange_n((uint32_t *)ptr, (uint32_t)v, SEQ_CST); return 0; }
        break;
    case W_F64:
        if (op == OP_FETCH) { *old = __atomic_load_n((uint64_t *)ptr, SEQ_CST); return 0; }
        if (op == OP_SET) { *old = __atomic_exchange_n((uint64_t *)ptr, v, SEQ_CST); return 0; }
        break;
    }
    PyErr_Format(PyExc_ValueError, "atomic: operation %d does not apply to word kind %d", op, word);
    return -1;
}

/* 0, or -1 with a ValueError where [address, address + nbytes) is not a range
 * of user addresses (it runs past MAX_ADDRESS, or wraps). */
static int check_range(uintptr_t address, unsigned long long nbytes, const char *what) {
    if (nbytes > MAX_ADDRESS || (unsigned long long)address > MAX_ADDRESS - nbytes) {
        PyErr_Format(PyExc_ValueError, "%s: %llu bytes at %p run past the highest user "
                     "address; not memory of this process", what, nbytes, (void *)address);
        return -1;
    }
    return 0;
}

/* A length argument: a Py_ssize_t >= 0, or -1 with an error set. */
static Py_ssize_t parse_length(PyObject *obj, const char *what) {
    Py_ssize_t n = PyLong_AsSsize_t(obj);
    if (n < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: nbytes must be >= 0, got %zd", what, n);
    return n < 0 ? -1 : n;
}

static int parse_address(PyObject *obj, uintptr_t *address, int size) {
    unsigned long long a = PyLong_AsUnsignedLongLong(obj);
    if (a == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (a == 0) {
        PyErr_SetString(PyExc_ValueError, "address is null");
        return -1;
    }
    if (a < MIN_ADDRESS) {   /* (%p: PyErr_Format has no %llx) */
        PyErr_Format(PyExc_ValueError, "address %p is below the lowest address a process "
                     "can map (64 KiB): not memory of this process", (void *)(uintptr_t)a);
        return -1;
    }
    if (check_range((uintptr_t)a, (unsigned long long)(size ? size : 1), "address") < 0)
        return -1;
    if (size && a % (unsigned long long)size) {   /* (%p: PyErr_Format has no %#llx) */
        PyErr_Format(PyExc_ValueError, "address %p is not aligned to %d bytes",
                     (void *)(uintptr_t)a, size);
        return -1;
    }
    *address = (uintptr_t)a;
    return 0;
}

/* atomic(address, word, op, value, cond) -> the value before */
static PyObject *native_atomic(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "atomic(address, word, op, value, cond)");
        return NULL;
    }
    int word = (int)PyLong_AsLong(args[1]), op = (int)PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    int size = word_size(word);
    if (!size || op < 0 || op >= OP_COUNT) {
        PyErr_Format(PyExc_ValueError, "atomic: bad word kind %d or operation %d", word, op);
        return NULL;
    }
    uintptr_t address;
    uint64_t v = 0, c = 0, old = 0;
    if (parse_address(args[0], &address, size) < 0) return NULL;
    if (op != OP_FETCH && to_bits(args[3], word, &v) < 0) return NULL;
    if (op == OP_CAS && to_bits(args[4], word, &c) < 0) return NULL;
    if (apply(address, word, op, v, c, &old) < 0) return NULL;
    return from_bits(old, word);
}

static uint64_t load_bits(uintptr_t address, int size) {
    switch (size) {
    case 1: return __atomic_load_n((uint8_t *)address, __ATOMIC_ACQUIRE);
    case 2: return __atomic_load_n((uint16_t *)address, __ATOMIC_ACQUIRE);
    case 4: return __atomic_load_n((uint32_t *)address, __ATOMIC_ACQUIRE);
    default: return __atomic_load_n((uint64_t *)address, __ATOMIC_ACQUIRE);
    }
}

/* load(address, word) -> the value, read atomically (acquire) */
static PyObject *native_load(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "load(address, word)");
        return NULL;
    }
    int word = (int)PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    int size = word_size(word);
    uintptr_t address;
    if (!size) { PyErr_Format(PyExc_ValueError, "load: bad word kind %d", word); return NULL; }
    if (parse_address(args[0], &address, size) < 0) return NULL;
    return from_bits(load_bits(address, size), word);
}

/* The GIL is let go around copies from this size on: other threads run meanwhile. */
#define COPY_WITHOUT_GIL (64 * 1024)

/* Whether the CPU has fast short `rep movsb` (FSRM, x86-64: CPUID leaf 7, EDX bit
 * 4), where a copy of COPY_WITHOUT_GIL bytes and more is one `rep movsb`: on the
 * 2-core AMD EPYC machine, a put of 1, 4 and 16 MiB to a node peer went from 42, 45-50
 * and 27 GB/s (glibc's memmove, which stops using `rep movsb` past the L2 size on
 * AMD) to 46-49, 48 and 32-40 (docs/performance.md). Where glibc keeps `rep movsb`
 * (Intel) this is what it does anyway. Set at the module's exec (exported as
 * FAST_STRINGS). */
static int fast_strings = 0;

static int cpu_has_fsrm(void) {
#if defined(__x86_64__)
    unsigned int a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (d >> 4) & 1;
#else
    return 0;
#endif
}

/* memmove of n bytes (>= COPY_WITHOUT_GIL): one `rep movsb` where the CPU has FSRM
 * and the two ranges do not overlap (it copies forward), else memmove */
static void copy_large(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
    if (fast_strings && ((char *)dst + n <= (const char *)src
                         || (const char *)src + n <= (char *)dst)) {
        __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
        return;
    }
#endif
    memmove(dst, src, n);
}

static void copy_bytes(void *dst, const void *src, size_t n) {
    if (n >= COPY_WITHOUT_GIL) {
        Py_BEGIN_ALLOW_THREADS
        copy_large(dst, src, n);
        Py_END_ALLOW_THREADS
    } else if (n > 0) {
        memmove(dst, src, n);
    }
}

/* copy(dst, src, nbytes) */
static PyObject *native_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "copy(dst, src, nbytes)");
        return NULL;
    }
    uintptr_t dst, src;
    Py_ssize_t n = parse_length(args[2], "copy");
    if (n < 0) return NULL;
    if (parse_address(args[0], &dst, 0) < 0 || parse_address(args[1], &src, 0) < 0
        || check_range(dst, (unsigned long long)n, "copy") < 0
        || check_range(src, (unsigned long long)n, "copy") < 0)
        return NULL;
    copy_bytes((void *)dst, (const void *)src, (size_t)n);
    Py_RETURN_NONE;
}

/* address(buffer) -> int */
static PyObject *native_address(PyObject *self, PyObject *buffer) {
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = PyLong_FromVoidPtr(view.buf);
    PyBuffer_Release(&view);
    return result;
}

/* copy_from(dst, buffer, nbytes) and copy_into(buffer, src, nbytes) */
static PyObject *buffer_copy(PyObject *const *args, Py_ssize_t nargs, int into) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, into ? "copy_into(buffer, src, nbytes)"
                                              : "copy_from(dst, buffer, nbytes)");
        return NULL;
    }
    uintptr_t address;
    Py_buffer view;
    const char *what = into ? "copy_into" : "copy_from";
    Py_ssize_t n = parse_length(args[2], what);
    if (n < 0) return NULL;
    if (parse_address(args[into ? 1 : 0], &address, 0) < 0
        || check_range(address, (unsigned long long)n, what) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[into ? 0 : 1], &view, into ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return NULL;
    if (n > view.len) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "%zd bytes asked of a buffer of %zd", n, view.len);
        return NULL;
    }
    if (into) copy_bytes(view.buf, (const void *)address, (size_t)n);
    else copy_bytes((void *)address, view.buf, (size_t)n);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *native_copy_from(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return buffer_copy(args, nargs, 0);
}

static PyObject *native_copy_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return buffer_copy(args, nargs, 1);
}

/* -- the agreement's board ------------------------------------------------------------
 * Layout (agreement/board.py): two banks of one slot per PE; a slot is the
 * step number (one int64 word), the vector (`words` int64), then its CRC-32
 * (one word). A writer stores the vector and the CRC, then the step number
 * last with release order; a reader takes a slot once its step word is the
 * step it waits for (acquire) and the CRC and the step number inside the
 * vector match: the same test the Python board makes, so PEs may mix the two.
 */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_of(const unsigned char *data, size_t n) {   /* zlib's crc32 */
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* board_write(slot_address, vector_bytes, seq): this PE's slot of a step */
static PyObject *native_board_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "board_write(slot, vector, seq)");
        return NULL;
    }
    uintptr_t slot;
    Py_buffer vector;
    long long seq = PyLong_AsLongLong(args[2]);
    if (seq == -1 && PyErr_Occurred()) return NULL;
    if (parse_address(args[0], &slot, 8) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &vector, PyBUF_SIMPLE) < 0) return NULL;
    int64_t *words = (int64_t *)slot;
    size_t n = (size_t)vector.len / 8;
    if (check_range(slot, (unsigned long long)(n + 2) * 8, "board_write") < 0) {
        PyBuffer_Release(&vector);
        return NULL;
    }
    memcpy(words + 1, vector.buf, n * 8);
    __atomic_store_n(words + 1 + n, (int64_t)crc32_of(vector.buf, n * 8), __ATOMIC_RELAXED);
    __atomic_store_n(words, (int64_t)seq, __ATOMIC_RELEASE);   /* last: readers poll it */
    PyBuffer_Release(&vector);
    Py_RETURN_NONE;
}

/* board_read(slot_address, words, seq, seq_word, spins, out) -> whether `out`
 * (a writable buffer of `words` int64) now holds the slot's vector of step
 * `seq`; polls at most `spins` times without the GIL */
static PyObject *native_board_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "board_read(slot, words, seq, seq_word, spins, out)");
        return NULL;
    }
    uintptr_t slot;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]), seq_word = PyLong_AsSsize_t(args[3]);
    long long seq = PyLong_AsLongLong(args[2]), spins = PyLong_AsLongLong(args[4]);
    Py_buffer out;
    int ok = 0;
    if (PyErr_Occurred()) return NULL;
    if (n < 0 || n > (Py_ssize_t)(MAX_ADDRESS / 8)) {
        PyErr_Format(PyExc_ValueError, "board_read: words must be >= 0, got %zd", n);
        return NULL;
    }
    if (parse_address(args[0], &slot, 8) < 0
        || check_range(slot, (unsigned long long)(n + 2) * 8, "board_read") < 0)
        return NULL;
    if (PyObject_GetBuffer(args[5], &out, PyBUF_WRITABLE) < 0) return NULL;
    if (out.len < n * 8 || seq_word < 0 || seq_word >= n) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "board_read: buffer or seq_word out of range");
        return NULL;
    }
    int64_t *words = (int64_t *)slot, *dst = (int64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (long long i = 0; i < spins && !ok; i++) {
        if (__atomic_load_n(words, __ATOMIC_ACQUIRE) == seq) {
            memcpy(dst, words + 1, (size_t)n * 8);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            int64_t check = __atomic_load_n(words + 1 + n, __ATOMIC_RELAXED);
            ok = dst[seq_word] == seq && check == (int64_t)crc32_of((unsigned char *)dst, (size_t)n * 8);
        }
        if (!ok) wait_between_reads(i);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"atomic", (PyCFunction)(void (*)(void))native_atomic, METH_FASTCALL,
     "atomic(address, word, op, value, cond) -> the value before"},
    {"load", (PyCFunction)(void (*)(void))native_load, METH_FASTCALL,
     "load(address, word) -> the value (an atomic read)"},
    {"copy", (PyCFunction)(void (*)(void))native_copy, METH_FASTCALL,
     "copy(dst, src, nbytes)"},
    {"address", (PyCFunction)native_address, METH_O, "address(buffer) -> where it starts"},
    {"copy_from", (PyCFunction)(void (*)(void))native_copy_from, METH_FASTCALL,
     "copy_from(dst, buffer, nbytes)"},
    {"copy_into", (PyCFunction)(void (*)(void))native_copy_into, METH_FASTCALL,
     "copy_into(buffer, src, nbytes)"},
    {"board_write", (PyCFunction)(void (*)(void))native_board_write, METH_FASTCALL,
     "board_write(slot, vector, seq)"},
    {"board_read", (PyCFunction)(void (*)(void))native_board_read, METH_FASTCALL,
     "board_read(slot, words, seq, seq_word, spins, out) -> bool"},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    crc_init();   /* the same table every time: a second module object may redo it */
    fast_strings = cpu_has_fsrm();
    if (PyModule_AddObjectRef(module, "FAST_STRINGS", fast_strings ? Py_True : Py_False) < 0)
        return -1;
    if (add_numbering(module, "WORDS", word_codes, W_COUNT) < 0) return -1;
    if (add_views(module) < 0 || add_blocks(module) < 0 || add_dead(module) < 0
        || add_face_free(module) < 0)
        return -1;
    return add_numbering(module, "OPERATIONS", op_names, OP_COUNT);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "CPU atomics, atomic loads, copies and the board's steps on shared memory (see the source).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    return PyModuleDef_Init(&module);
}
