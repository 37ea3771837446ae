/* shmemvm.native._collective: a whole agreed step of a collective on the
 * node's shared-memory board in one call, and the combining of a reduction
 * (issue 30). The board's layout and protocol are agreement/board.py's.
 *
 *   exchange(board, nbytes, size, rank, slot_words, words, seq_word, spins,
 *            seq, vector, out, done, payload, payload_len, scratch, part,
 *            src_offset, dst_stride, only) -> the number of PEs not read yet
 *       With `vector` (not None): write this PE's slot of step `seq` (the
 *       vector, `payload_len` bytes at address `payload` (0 where
 *       payload_len is 0) into the slot's payload area, the step
 *       word last with release order), copy `vector` into `out` and mark this
 *       PE in `done`. Then, at most `spins` times without the GIL, read every
 *       other PE's slot of step `seq` that is not `done` yet: once it holds the
 *       step (the step word, acquire; the step number inside the vector) fold
 *       its vector into `out` with MAX word by word and copy
 *       `part` bytes of its payload from `src_offset` into `scratch` at
 *       pe * dst_stride (only PE `only`'s where only >= 0). So one call per
 *       spin budget, not one per PE, and the caller's wait checks the deadline
 *       and the PEs' liveness between calls.
 *   combine(dst, nbytes, scratch, n, kind, op)
 *       dst[j] <- scratch[0][j] op scratch[1][j] op ... op scratch[n-1][j],
 *       folded left in that order (team PE order) in the element type `kind`,
 *       as the Python combiners fold (torch or NumPy: acc <- acc op other):
 *       integers wrap; floats are IEEE in their own precision (sum, prod
 *       only: min and max of floats stay with the Python combiners, whose NaN
 *       and signed-zero rules differ between torch and NumPy).
 *   combine_from(dst, nbytes, sources, kind, op)
 *       the same from a tuple of addresses (each PE's source through the
 *       node's mappings, in team PE order): a larger reduce on the node.
 *   deliver(dst, scratch, offset, nbytes)   memmove scratch[offset:+nbytes] to dst.
 *
 * Checks: every argument is checked here (C cannot tell a mapped address,
 * so the addresses come from Python code that does: the board's own window,
 * a live symmetric block of the heap's CPU memory): lengths and counts >= 0,
 * buffers at least as long as what is read from or written to them, the
 * ranges inside the board (its `nbytes`) and below the highest user address,
 * no null or low address. A wrong call is a ValueError, never a crash.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "shared.h"
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>

/* the longest vector a step compares (the agreement's is 30 words) */
#define MAX_WORDS 64

static int parse_address(PyObject *obj, uintptr_t *address, unsigned long long nbytes,
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

static int get_ssize(PyObject *obj, Py_ssize_t *out, Py_ssize_t least, const char *name) {
    Py_ssize_t v = PyLong_AsSsize_t(obj);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < least) {
        PyErr_Format(PyExc_ValueError, "%s must be >= %zd, got %zd", name, least, v);
        return -1;
    }
    *out = v;
    return 0;
}

/* exchange(...): see the top of the file */
static PyObject *coll_exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 19) {
        PyErr_SetString(PyExc_TypeError, "exchange(board, nbytes, size, rank, slot_words, "
                        "words, seq_word, spins, seq, vector, out, done, payload, payload_len, "
                        "scratch, part, src_offset, dst_stride, only)");
        return NULL;
    }
    Py_ssize_t nbytes, size, rank, slot_words, words, seq_word, payload_len, part, src_offset,
        dst_stride;
    long long spins = PyLong_AsLongLong(args[7]), seq = PyLong_AsLongLong(args[8]);
    long only = PyLong_AsLong(args[18]);
    if (PyErr_Occurred()) return NULL;
    if (get_ssize(args[1], &nbytes, 0, "exchange: nbytes") < 0
        || get_ssize(args[2], &size, 1, "exchange: size") < 0
        || get_ssize(args[3], &rank, 0, "exchange: rank") < 0
        || get_ssize(args[4], &slot_words, 0, "exchange: slot_words") < 0
        || get_ssize(args[5], &words, 1, "exchange: words") < 0
        || get_ssize(args[6], &seq_word, 0, "exchange: seq_word") < 0
        || get_ssize(args[13], &payload_len, 0, "exchange: payload_len") < 0
        || get_ssize(args[15], &part, 0, "exchange: part") < 0
        || get_ssize(args[16], &src_offset, 0, "exchange: src_offset") < 0
        || get_ssize(args[17], &dst_stride, 0, "exchange: dst_stride") < 0)
        return NULL;
    if (rank >= size || words > MAX_WORDS || seq_word >= words || slot_words < words + 2
        || only < -1 || only >= size) {
        PyErr_Format(PyExc_ValueError, "exchange: rank %zd of %zd PEs, %zd words (at most %d) "
                     "with the step number at %zd, slots of %zd words, only %ld: out of range",
                     rank, size, words, MAX_WORDS, seq_word, slot_words, only);
        return NULL;
    }
    Py_ssize_t capacity = (slot_words - words - 2) * 8;   /* a slot's payload area */
    if (part > capacity || src_offset > capacity - part) {
        PyErr_Format(PyExc_ValueError, "exchange: %zd bytes at %zd of a payload area of %zd",
                     part, src_offset, capacity);
        return NULL;
    }
    if (size > PY_SSIZE_T_MAX / 2 / 8 / slot_words || 2 * size * slot_words * 8 > nbytes) {
        PyErr_Format(PyExc_ValueError, "exchange: %zd PEs with slots of %zd words do not fit "
                     "a board of %zd bytes", size, slot_words, nbytes);
        return NULL;
    }
    uintptr_t board;
    if (parse_address(args[0], &board, (unsigned long long)nbytes, 8, "exchange: board") < 0)
        return NULL;
    Py_buffer vector = {0}, out = {0}, done = {0}, scratch = {0};
    PyObject *result = NULL;
    int writing = args[9] != Py_None;
    uintptr_t payload = 0;
    if (payload_len > capacity) {
        PyErr_Format(PyExc_ValueError, "exchange: a payload of %zd bytes does not fit a "
                     "slot's %zd", payload_len, capacity);
        return NULL;
    }
    if (writing && payload_len
        && parse_address(args[12], &payload, (unsigned long long)payload_len, 0,
                         "exchange: payload") < 0)
        return NULL;
    if (PyObject_GetBuffer(args[10], &out, PyBUF_WRITABLE) < 0) goto end;
    if (PyObject_GetBuffer(args[11], &done, PyBUF_WRITABLE) < 0) goto end;
    if (out.len < words * 8 || done.len < size) {
        PyErr_Format(PyExc_ValueError, "exchange: out has %zd bytes (%zd needed), done %zd "
                     "(%zd needed)", out.len, words * 8, done.len, size);
        goto end;
    }
    if (args[14] != Py_None) {
        if (PyObject_GetBuffer(args[14], &scratch, PyBUF_WRITABLE) < 0) goto end;
        Py_ssize_t reach = part;   /* the last byte written: at (size - 1) * dst_stride + part */
        if (only < 0 && size > 1) {
            if (dst_stride > (PY_SSIZE_T_MAX - part) / (size - 1)) reach = -1;
            else reach = (size - 1) * dst_stride + part;
        } else if (only >= 0) {
            reach = dst_stride > (PY_SSIZE_T_MAX - part) / (size) ? -1 : only * dst_stride + part;
        }
        if (reach < 0 || scratch.len < reach) {
            PyErr_Format(PyExc_ValueError, "exchange: scratch has %zd bytes, too few for %zd "
                         "PEs' %zd bytes %zd apart", scratch.len, size, part, dst_stride);
            goto end;
        }
    } else if (part) {
        PyErr_SetString(PyExc_ValueError, "exchange: part > 0 needs a scratch buffer");
        goto end;
    }
    unsigned char *flags = (unsigned char *)done.buf;
    int64_t *bank = (int64_t *)board + (seq & 1) * size * slot_words;
    unsigned char *gather = (unsigned char *)scratch.buf;
    if (writing) {
        if (PyObject_GetBuffer(args[9], &vector, PyBUF_SIMPLE) < 0) goto end;
        if (vector.len != words * 8) {
            PyErr_Format(PyExc_ValueError, "exchange: the vector has %zd bytes, not %zd",
                         vector.len, words * 8);
            goto end;
        }
        int64_t *mine = bank + rank * slot_words;
        /* (no CRC in the check word: every reader of this board is this code, see
         * the reader below; a CRC of 240 bytes was a third of a step's own cost) */
        memcpy(mine + 1, vector.buf, (size_t)words * 8);
        if (payload_len) memcpy(mine + 2 + words, (const void *)payload, (size_t)payload_len);
        /* last, with release order: a reader that sees the step sees all of the above */
        __atomic_store_n(mine, (int64_t)seq, __ATOMIC_RELEASE);
        memcpy(out.buf, vector.buf, (size_t)words * 8);
        flags[rank] = 1;
        if (part && (only < 0 || only == rank))
            memcpy(gather + (only < 0 ? rank : only) * dst_stride,
                   (unsigned char *)(mine + 2 + words) + src_offset, (size_t)part);
    }
    Py_ssize_t left = 0;
    for (Py_ssize_t pe = 0; pe < size; pe++) left += !flags[pe];
    int64_t *acc = (int64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    int64_t theirs[MAX_WORDS];
    for (long long i = 0; i < spins && left; i++) {
        for (Py_ssize_t pe = 0; pe < size; pe++) {
            if (flags[pe]) continue;
            int64_t *slot = bank + pe * slot_words;
            if (__atomic_load_n(slot, __ATOMIC_ACQUIRE) != seq) continue;
            /* The step word read with acquire, written last with release by this
             * same code on every PE (the board runs in C on all of them or none:
             * the heap votes on it, and the PEs of one node run one installation),
             * so the slot is whole: no CRC (the Python board's readers need one;
             * it cost 0.1-0.5 us a slot). The bank argument (board.py) keeps it
             * from being rewritten meanwhile. */
            memcpy(theirs, slot + 1, (size_t)words * 8);
            if (theirs[seq_word] != seq)
                continue;   /* not this step's (never seen: a sanity check) */
            for (Py_ssize_t w = 0; w < words; w++)
                if (theirs[w] > acc[w]) acc[w] = theirs[w];
            if (part && (only < 0 || only == pe))
                memcpy(gather + (only < 0 ? pe : only) * dst_stride,
                       (unsigned char *)(slot + 2 + words) + src_offset, (size_t)part);
            flags[pe] = 1;
            left--;
        }
        if (left && i >= 64) sched_yield();
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(left);
end:
    if (vector.obj) PyBuffer_Release(&vector);
    if (scratch.obj) PyBuffer_Release(&scratch);
    if (done.obj) PyBuffer_Release(&done);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

/* step(board, nbytes, size, rank, slot_words, words, seq_word, spins, neg_seq_word,
 *      flag_word, time_word, skip, tick_ns, prompt, budget_ns,
 *      seq, template, flag, send, out, done, payload, payload_len, scratch, part,
 *      src_offset, dst_stride, only) -> int
 * A whole agreed step (agreement.py's collective()) where nothing is unusual:
 * `send` <- `template` (the call's vector) with the step number at seq_word,
 * its negation at neg_seq_word, -1 at flag_word where `flag`, and minus this
 * PE's entry time in ticks of `tick_ns` (CLOCK_REALTIME, as time.time_ns())
 * at time_word; then exchange() as above, its spins repeated while PEs are
 * left, for at most `budget_ns`. Returns the PEs left (> 0: the caller waits
 * with the deadline and the liveness checks, as for exchange()), or once
 * every slot is read: 0 where every word is equal to this PE's but those in
 * the bit mask `skip` (the flag, dead-block and time words), no PE entered
 * more than `prompt` ticks ago (prompt < 0: never late) and the flag is on
 * every PE; -2 where all that holds but the flag is not on every PE; else -1
 * (the caller then decides the outcome from `send` and `out` itself: a
 * mismatch, a late step). Dead blocks are the caller's to look at in `out`
 * either way. */
static PyObject *coll_exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static PyObject *coll_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 28) {
        PyErr_SetString(PyExc_TypeError, "step(board, nbytes, size, rank, slot_words, words, "
                        "seq_word, spins, neg_seq_word, flag_word, time_word, skip, tick_ns, "
                        "prompt, budget_ns, seq, template, flag, send, out, done, payload, "
                        "payload_len, scratch, part, src_offset, dst_stride, only)");
        return NULL;
    }
    Py_ssize_t words, seq_word, neg_word, flag_word, time_word;
    long long tick = PyLong_AsLongLong(args[12]), prompt = PyLong_AsLongLong(args[13]);
    long long budget = PyLong_AsLongLong(args[14]), seq = PyLong_AsLongLong(args[15]);
    unsigned long long skip = PyLong_AsUnsignedLongLong(args[11]);
    int flag = PyObject_IsTrue(args[17]);
    if (PyErr_Occurred() || flag < 0) return NULL;
    if (get_ssize(args[5], &words, 1, "step: words") < 0
        || get_ssize(args[6], &seq_word, 0, "step: seq_word") < 0
        || get_ssize(args[8], &neg_word, 0, "step: neg_seq_word") < 0
        || get_ssize(args[9], &flag_word, 0, "step: flag_word") < 0
        || get_ssize(args[10], &time_word, 0, "step: time_word") < 0)
        return NULL;
    if (words > MAX_WORDS || seq_word >= words || neg_word >= words || flag_word >= words
        || time_word >= words || tick < 1 || budget < 0) {
        PyErr_Format(PyExc_ValueError, "step: %zd words (at most %d) with the step number at "
                     "%zd, %zd, the flag at %zd and the time at %zd, ticks of %lld ns, a "
                     "budget of %lld ns: out of range", words, MAX_WORDS, seq_word, neg_word,
                     flag_word, time_word, tick, budget);
        return NULL;
    }
    Py_buffer template = {0}, send = {0}, out = {0};
    PyObject *result = NULL, *left_obj = NULL;
    if (PyObject_GetBuffer(args[16], &template, PyBUF_SIMPLE) < 0) goto end;
    if (PyObject_GetBuffer(args[18], &send, PyBUF_WRITABLE) < 0) goto end;
    if (PyObject_GetBuffer(args[19], &out, PyBUF_WRITABLE) < 0) goto end;
    if (template.len != words * 8 || send.len != words * 8 || out.len < words * 8) {
        PyErr_Format(PyExc_ValueError, "step: the template has %zd bytes, send %zd, out %zd: "
                     "%zd each needed", template.len, send.len, out.len, words * 8);
        goto end;
    }
    Py_buffer done;
    if (PyObject_GetBuffer(args[20], &done, PyBUF_WRITABLE) < 0) goto end;
    memset(done.buf, 0, (size_t)done.len);    /* no PE read yet (exchange() checks its length) */
    PyBuffer_Release(&done);
    int64_t *mine = (int64_t *)send.buf, *acc = (int64_t *)out.buf;
    memcpy(mine, template.buf, (size_t)words * 8);
    mine[seq_word] = seq;
    mine[neg_word] = -seq;
    if (flag) mine[flag_word] = -1;
    mine[time_word] = -(now_ns() / tick);
    /* exchange()'s arguments: the first 8, then seq, send, out, done and the payload's */
    PyObject *call[19];
    for (int i = 0; i < 8; i++) call[i] = args[i];
    call[8] = args[15];
    call[9] = args[18];
    call[10] = args[19];
    call[11] = args[20];
    for (int i = 0; i < 7; i++) call[12 + i] = args[21 + i];
    left_obj = coll_exchange(self, call, 19);
    if (left_obj == NULL) goto end;
    Py_ssize_t left = PyLong_AsSsize_t(left_obj);
    if (left > 0 && budget > 0) {
        /* go on reading (no write: the vector is None) until the budget is spent */
        call[9] = Py_None;
        long long until = monotonic_ns() + budget;
        while (left > 0 && monotonic_ns() < until) {
            Py_DECREF(left_obj);
            left_obj = coll_exchange(self, call, 19);
            if (left_obj == NULL) goto end;
            left = PyLong_AsSsize_t(left_obj);
        }
    }
    if (left > 0) {
        result = PyLong_FromSsize_t(left);
        goto end;
    }
    int agreed = 1;
    for (Py_ssize_t w = 0; w < words && agreed; w++)
        if (!(w < 64 && (skip >> w) & 1) && acc[w] != mine[w]) agreed = 0;
    if (agreed && prompt >= 0 && now_ns() / tick + acc[time_word] > prompt) agreed = 0;
    result = PyLong_FromLong(!agreed ? -1 : acc[flag_word] == -1 ? 0 : -2);
end:
    Py_XDECREF(left_obj);
    if (template.obj) PyBuffer_Release(&template);
    if (send.obj) PyBuffer_Release(&send);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

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
static PyObject *coll_combine(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
static PyObject *coll_combine_from(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
static PyObject *coll_deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

static PyMethodDef methods[] = {
    {"exchange", (PyCFunction)(void (*)(void))coll_exchange, METH_FASTCALL,
     "exchange(board, nbytes, size, rank, slot_words, words, seq_word, spins, seq, vector, "
     "out, done, payload, payload_len, scratch, part, src_offset, dst_stride, only) -> PEs left"},
    {"step", (PyCFunction)(void (*)(void))coll_step, METH_FASTCALL,
     "step(board, nbytes, size, rank, slot_words, words, seq_word, spins, neg_seq_word, "
     "flag_word, time_word, skip, tick_ns, prompt, budget_ns, seq, template, flag, send, out, "
     "done, payload, payload_len, scratch, part, src_offset, dst_stride, only) -> PEs left, "
     "0 (agreed, the flag everywhere), -2 (agreed, the flag not everywhere) or -1"},
    {"combine", (PyCFunction)(void (*)(void))coll_combine, METH_FASTCALL,
     "combine(dst, nbytes, scratch, n, kind, op)"},
    {"combine_from", (PyCFunction)(void (*)(void))coll_combine_from, METH_FASTCALL,
     "combine_from(dst, nbytes, sources, kind, op)"},
    {"deliver", (PyCFunction)(void (*)(void))coll_deliver, METH_FASTCALL,
     "deliver(dst, scratch, offset, nbytes)"},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    if (add_numbering(module, "KINDS", kind_codes, K_COUNT) < 0) return -1;
    return add_numbering(module, "REDUCE_OPS", op_names, O_COUNT);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_collective",
    "A collective's agreed step on the node's board in one call, and reductions (see the source).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__collective(void) {
    return PyModuleDef_Init(&module);
}
