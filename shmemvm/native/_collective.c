/* shmemvm.native._collective: a whole agreed step of a collective on the
 * node's shared-memory board in one call, and the combining of a reduction
 * (issue 30). The board's layout and protocol are agreement/board.py's.
 *
 *   exchange(board, nbytes, size, rank, slot_words, words, seq_word, spins,
 *            volatile, seq, vector, out, done, payload, payload_len, scratch,
 *            part, src_offset, dst_stride, only) -> the number of PEs not read yet
 *       With `vector` (not None): write this PE's slot of step `seq` (the
 *       vector and its summary: see Head; `volatile` is the bit mask of the
 *       words that may differ between PEs in a step every PE agrees on,
 *       `payload_len` bytes at address `payload` (0 where
 *       payload_len is 0) into the slot's payload area, the step
 *       word last with release order), copy `vector` into `out` and mark this
 *       PE in `done`. Then, at most `spins` times (all but the first few
 *       without the GIL: HOT_SPINS), read every
 *       other PE's slot of step `seq` that is not `done` yet: once it holds the
 *       step (the step word, acquire; the step number inside the vector) fold
 *       its vector into `out` with MAX word by word (only its volatile words,
 *       from its summary, where its summary's hash is this PE's) and copy
 *       `part` bytes of its payload from `src_offset` into `scratch` at
 *       pe * dst_stride (only PE `only`'s where only >= 0). So one call per
 *       spin budget, not one per PE, and the caller's wait checks the deadline
 *       and the PEs' liveness between calls.
 *   Stepper(...).step(...)
 *       a whole agreed step in one call, its constant arguments checked once
 *       (below, where it is defined).
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
 *   call_key(kind, group_id, values, target, source, ndarray, memory)
 *       the NumPy face's memo key of a collective call on arrays target and
 *       source (shmem/collectives.py's python_key, the same tuple), read from
 *       NumPy's array struct in one call; None where either is not exactly an
 *       ndarray over the face's HeapMemory (`memory`) with its bytes inside it,
 *       or a value is not None, an int or a str (Python decides those).
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

/* The board and this PE's place on it (exchange()'s first 8 arguments), checked. */
typedef struct {
    int64_t *board;
    Py_ssize_t nbytes, size, rank, slot_words, words, seq_word;
    long long spins;
    unsigned long long volatile_words;   /* bit mask: the words a summary carries */
} Head;

/* A slot: its first cache line is the step word and the summary (the hash of
 * the vector's words but the volatile ones, then those, in word order), then
 * the vector, the check word and the payload area. A reader whose summary hash
 * equals its own folds only the volatile words: one cache line a PE instead of
 * the vector's four, where every PE makes the same call (the common case). */
#define SUMMARY 8                       /* words: the step word and 7 more */
#define MAX_VOLATILE (SUMMARY - 2)
#define VECTOR_AT SUMMARY               /* the vector's first word in a slot */

/* splitmix64's finalizer: the hash mixes each word in with its position */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The hash of `vector`'s words but the volatile ones: equal vectors (in those
 * words) hash alike; unequal ones collide with a chance of about 2**-64. Each
 * word is mixed with its position on its own and the results summed: the
 * words' mixes do not wait for each other (half the time of a chain of them,
 * 45 against 92 ns for the agreement's 30 words) */
static int64_t summary_hash(const int64_t *vector, Py_ssize_t words, unsigned long long vol) {
    uint64_t h = mix64((uint64_t)words);
    for (Py_ssize_t w = 0; w < words; w++)
        if (!(w < 64 && (vol >> w) & 1))
            h += mix64((uint64_t)vector[w] + 0x9e3779b97f4a7c15ULL * (uint64_t)(w + 1));
    return (int64_t)mix64(h);
}

static int parse_head(PyObject *const *args, Head *h) {
    h->spins = PyLong_AsLongLong(args[7]);
    if (h->spins == -1 && PyErr_Occurred()) return -1;
    h->volatile_words = PyLong_AsUnsignedLongLong(args[8]);
    if (h->volatile_words == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (get_ssize(args[1], &h->nbytes, 0, "exchange: nbytes") < 0
        || get_ssize(args[2], &h->size, 1, "exchange: size") < 0
        || get_ssize(args[3], &h->rank, 0, "exchange: rank") < 0
        || get_ssize(args[4], &h->slot_words, 0, "exchange: slot_words") < 0
        || get_ssize(args[5], &h->words, 1, "exchange: words") < 0
        || get_ssize(args[6], &h->seq_word, 0, "exchange: seq_word") < 0)
        return -1;
    if (h->rank >= h->size || h->words > MAX_WORDS || h->seq_word >= h->words
        || h->slot_words < VECTOR_AT + h->words + 1 || h->slot_words % 8
        || __builtin_popcountll(h->volatile_words) > MAX_VOLATILE
        || (h->words < 64 && h->volatile_words >> h->words)
        || (h->volatile_words >> h->seq_word) & 1) {
        PyErr_Format(PyExc_ValueError, "exchange: rank %zd of %zd PEs, %zd words (at most %d) "
                     "with the step number at %zd, slots of %zd words (a multiple of 8, at "
                     "least %zd), volatile words %#llx (at most %d of the vector's, not the "
                     "step number): out of range", h->rank, h->size, h->words, MAX_WORDS,
                     h->seq_word, h->slot_words, VECTOR_AT + h->words + 1,
                     h->volatile_words, MAX_VOLATILE);
        return -1;
    }
    if (h->size > PY_SSIZE_T_MAX / 2 / 8 / h->slot_words
        || 2 * h->size * h->slot_words * 8 > h->nbytes) {
        PyErr_Format(PyExc_ValueError, "exchange: %zd PEs with slots of %zd words do not fit "
                     "a board of %zd bytes", h->size, h->slot_words, h->nbytes);
        return -1;
    }
    uintptr_t board;
    if (parse_address(args[0], &board, (unsigned long long)h->nbytes, 8, "exchange: board") < 0)
        return -1;
    h->board = (int64_t *)board;
    return 0;
}

/* A step's payload (exchange()'s last 7 arguments: payload, payload_len, scratch,
 * part, src_offset, dst_stride, only), checked against the head; it holds
 * scratch's buffer until release_payload(). */
typedef struct {
    uintptr_t payload;
    Py_ssize_t payload_len, part, src_offset, dst_stride;
    long only;
    Py_buffer scratch;   /* .obj NULL: none */
} Payload;

static void release_payload(Payload *p) {
    if (p->scratch.obj) PyBuffer_Release(&p->scratch);
}

static int parse_payload(const Head *h, PyObject *const *args, int writing, Payload *p) {
    memset(p, 0, sizeof *p);
    p->only = PyLong_AsLong(args[6]);
    if (p->only == -1 && PyErr_Occurred()) return -1;
    if (get_ssize(args[1], &p->payload_len, 0, "exchange: payload_len") < 0
        || get_ssize(args[3], &p->part, 0, "exchange: part") < 0
        || get_ssize(args[4], &p->src_offset, 0, "exchange: src_offset") < 0
        || get_ssize(args[5], &p->dst_stride, 0, "exchange: dst_stride") < 0)
        return -1;
    if (p->only < -1 || p->only >= h->size) {
        PyErr_Format(PyExc_ValueError, "exchange: only %ld of %zd PEs: out of range", p->only,
                     h->size);
        return -1;
    }
    Py_ssize_t capacity = (h->slot_words - VECTOR_AT - h->words - 1) * 8;   /* payload area */
    if (p->part > capacity || p->src_offset > capacity - p->part) {
        PyErr_Format(PyExc_ValueError, "exchange: %zd bytes at %zd of a payload area of %zd",
                     p->part, p->src_offset, capacity);
        return -1;
    }
    if (p->payload_len > capacity) {
        PyErr_Format(PyExc_ValueError, "exchange: a payload of %zd bytes does not fit a "
                     "slot's %zd", p->payload_len, capacity);
        return -1;
    }
    if (writing && p->payload_len
        && parse_address(args[0], &p->payload, (unsigned long long)p->payload_len, 0,
                         "exchange: payload") < 0)
        return -1;
    if (args[2] == Py_None) {
        if (p->part) {
            PyErr_SetString(PyExc_ValueError, "exchange: part > 0 needs a scratch buffer");
            return -1;
        }
        return 0;
    }
    if (PyObject_GetBuffer(args[2], &p->scratch, PyBUF_WRITABLE) < 0) return -1;
    /* the last byte written: at last * dst_stride + part */
    Py_ssize_t reach, last = p->only < 0 ? h->size - 1 : p->only;
    if (last && p->dst_stride > (PY_SSIZE_T_MAX - p->part) / last) reach = -1;
    else reach = last * p->dst_stride + p->part;
    if (reach < 0 || p->scratch.len < reach) {
        PyErr_Format(PyExc_ValueError, "exchange: scratch has %zd bytes, too few for %zd "
                     "PEs' %zd bytes %zd apart", p->scratch.len, h->size, p->part,
                     p->dst_stride);
        release_payload(p);
        return -1;
    }
    return 0;
}

/* reads of the others' slots that a step makes before it lets other threads run */
#define HOT_SPINS 32

/* The exchange itself on checked arguments (see the top of the file): `vector`
 * (NULL: read only) written into this PE's slot of step `seq`, then the others'
 * read for at most `spins` rounds (after HOT_SPINS without the GIL). `acc` (the MAX vector) and
 * `flags` (the PEs read) have `words` words and `size` bytes. The PEs left. */
static Py_ssize_t run_exchange(const Head *h, long long seq, const int64_t *vector,
                               int64_t *acc, unsigned char *flags, const Payload *p) {
    Py_ssize_t size = h->size, words = h->words, slot_words = h->slot_words;
    int64_t *bank = h->board + (seq & 1) * size * slot_words;
    unsigned char *gather = (unsigned char *)p->scratch.buf;
    Py_ssize_t part = p->part, src_offset = p->src_offset, dst_stride = p->dst_stride;
    long only = p->only;
    unsigned long long vol = h->volatile_words;
    int64_t *mine = bank + h->rank * slot_words;
    if (vector) {
        /* (no CRC in the check word: every reader of this board is this code, see
         * the reader below; a CRC of 240 bytes was a third of a step's own cost) */
        memcpy(mine + VECTOR_AT, vector, (size_t)words * 8);
        mine[1] = summary_hash(vector, words, vol);
        int k = 2;
        for (Py_ssize_t w = 0; w < words && w < 64; w++)
            if ((vol >> w) & 1) mine[k++] = vector[w];
        if (p->payload_len)
            memcpy(mine + VECTOR_AT + words + 1, (const void *)p->payload,
                   (size_t)p->payload_len);
        /* last, with release order: a reader that sees the step sees all of the above */
        __atomic_store_n(mine, (int64_t)seq, __ATOMIC_RELEASE);
        if (acc != vector) memcpy(acc, vector, (size_t)words * 8);
        flags[h->rank] = 1;
        if (part && (only < 0 || only == h->rank))
            memcpy(gather + (only < 0 ? h->rank : only) * dst_stride,
                   (unsigned char *)(mine + VECTOR_AT + words + 1) + src_offset, (size_t)part);
    }
    Py_ssize_t left = 0;
    for (Py_ssize_t pe = 0; pe < size; pe++) left += !flags[pe];
    if (!left) return 0;
    const int64_t my_hash = mine[1];   /* (this step's: this PE wrote its slot first) */
    int64_t theirs[MAX_WORDS];
    /* The first HOT_SPINS reads keep the GIL: a step whose PEs arrive together
     * (a barrier in a loop) ends in them, and releasing and taking the GIL again
     * cost about as much as the wait itself there. The rest go without it. */
    PyThreadState *released = NULL;
    for (long long i = 0; i < h->spins && left; i++) {
        if (i == HOT_SPINS) released = PyEval_SaveThread();
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
            if (slot[1] == my_hash) {
                /* the same words as this PE's but the volatile ones (summary_hash):
                 * those alone can raise the MAX, and they are on this cache line */
                int k = 2;
                for (Py_ssize_t w = 0; w < words && w < 64; w++)
                    if ((vol >> w) & 1) {
                        if (slot[k] > acc[w]) acc[w] = slot[k];
                        k++;
                    }
            } else {
                memcpy(theirs, slot + VECTOR_AT, (size_t)words * 8);
                if (theirs[h->seq_word] != seq)
                    continue;   /* not this step's (never seen: a sanity check) */
                for (Py_ssize_t w = 0; w < words; w++)
                    if (theirs[w] > acc[w]) acc[w] = theirs[w];
            }
            if (part && (only < 0 || only == pe))
                memcpy(gather + (only < 0 ? pe : only) * dst_stride,
                       (unsigned char *)(slot + VECTOR_AT + words + 1) + src_offset,
                       (size_t)part);
            flags[pe] = 1;
            left--;
        }
        if (left && i >= 64) sched_yield();
    }
    if (released) PyEval_RestoreThread(released);
    return left;
}

/* exchange(...): see the top of the file */
static PyObject *coll_exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 20) {
        PyErr_SetString(PyExc_TypeError, "exchange(board, nbytes, size, rank, slot_words, "
                        "words, seq_word, spins, volatile, seq, vector, out, done, payload, "
                        "payload_len, scratch, part, src_offset, dst_stride, only)");
        return NULL;
    }
    Head h;
    Payload p;
    long long seq = PyLong_AsLongLong(args[9]);
    if ((seq == -1 && PyErr_Occurred()) || parse_head(args, &h) < 0) return NULL;
    int writing = args[10] != Py_None;
    if (parse_payload(&h, args + 13, writing, &p) < 0) return NULL;
    Py_buffer vector = {0}, out = {0}, done = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[11], &out, PyBUF_WRITABLE) < 0) goto end;
    if (PyObject_GetBuffer(args[12], &done, PyBUF_WRITABLE) < 0) goto end;
    if (out.len < h.words * 8 || done.len < h.size) {
        PyErr_Format(PyExc_ValueError, "exchange: out has %zd bytes (%zd needed), done %zd "
                     "(%zd needed)", out.len, h.words * 8, done.len, h.size);
        goto end;
    }
    if (writing) {
        if (PyObject_GetBuffer(args[10], &vector, PyBUF_SIMPLE) < 0) goto end;
        if (vector.len != h.words * 8) {
            PyErr_Format(PyExc_ValueError, "exchange: the vector has %zd bytes, not %zd",
                         vector.len, h.words * 8);
            goto end;
        }
    }
    result = PyLong_FromSsize_t(run_exchange(&h, seq, writing ? (int64_t *)vector.buf : NULL,
                                             (int64_t *)out.buf, (unsigned char *)done.buf, &p));
end:
    release_payload(&p);
    if (vector.obj) PyBuffer_Release(&vector);
    if (done.obj) PyBuffer_Release(&done);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

/* Stepper(board, nbytes, size, rank, slot_words, words, seq_word, spins,
 *         volatile, neg_seq_word, flag_word, time_word, tick_ns, send, out, done)
 * A whole agreed step (agreement.py's collective()) where nothing is unusual,
 * its arguments that never change checked once (the board's, and the vectors'
 * buffers, held while the Stepper lives):
 *
 *   step(prompt, budget_ns, seq, template, flag, payload, payload_len, scratch,
 *        part, src_offset, dst_stride, only) -> int
 *       `send` <- `template` (the call's vector) with the step number at
 *       seq_word, its negation at neg_seq_word, -1 at flag_word where `flag`,
 *       and minus this PE's entry time in ticks of `tick_ns` (CLOCK_REALTIME,
 *       as time.time_ns()) at time_word; then exchange() as above (`out` the
 *       MAX vector, `done` the PEs read), its spins repeated while PEs are
 *       left, for at most `budget_ns`. Returns the PEs left (> 0: the caller
 *       waits with the deadline and the liveness checks, through exchange()),
 *       or once every slot is read: 0 where every word is equal to this PE's
 *       but those in the bit mask `volatile` (the flag, dead-block and time
 *       words), no PE entered more than `prompt` ticks ago (prompt < 0: never
 *       late) and the flag is on every PE; -2 where all that holds but the
 *       flag is not on every PE; else -1 (the caller then decides the outcome
 *       from `send` and `out` itself: a mismatch, a late step). Dead blocks
 *       are the caller's to look at in `out` either way.
 *
 * The board's memory must outlive the Stepper's steps (board.py drops it first). */
typedef struct {
    PyObject_HEAD
    Head h;
    Py_ssize_t neg_word, flag_word, time_word;
    long long tick;
    Py_buffer send, out, done;
} Stepper;

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

static void stepper_dealloc(Stepper *self) {
    if (self->send.obj) PyBuffer_Release(&self->send);
    if (self->out.obj) PyBuffer_Release(&self->out);
    if (self->done.obj) PyBuffer_Release(&self->done);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *stepper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if ((kwargs && PyDict_GET_SIZE(kwargs)) || PyTuple_GET_SIZE(args) != 16) {
        PyErr_SetString(PyExc_TypeError, "Stepper(board, nbytes, size, rank, slot_words, "
                        "words, seq_word, spins, volatile, neg_seq_word, flag_word, time_word, "
                        "tick_ns, send, out, done)");
        return NULL;
    }
    PyObject *const *a = &PyTuple_GET_ITEM(args, 0);
    Stepper *self = (Stepper *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if (parse_head(a, &self->h) < 0) goto fail;
    self->tick = PyLong_AsLongLong(a[12]);
    if (PyErr_Occurred()) goto fail;
    Py_ssize_t words = self->h.words;
    if (get_ssize(a[9], &self->neg_word, 0, "Stepper: neg_seq_word") < 0
        || get_ssize(a[10], &self->flag_word, 0, "Stepper: flag_word") < 0
        || get_ssize(a[11], &self->time_word, 0, "Stepper: time_word") < 0)
        goto fail;
    if (self->neg_word >= words || self->flag_word >= words || self->time_word >= words
        || self->tick < 1) {
        PyErr_Format(PyExc_ValueError, "Stepper: %zd words with the step number negated at "
                     "%zd, the flag at %zd and the time at %zd, ticks of %lld ns: out of range",
                     words, self->neg_word, self->flag_word, self->time_word, self->tick);
        goto fail;
    }
    if (PyObject_GetBuffer(a[13], &self->send, PyBUF_WRITABLE) < 0
        || PyObject_GetBuffer(a[14], &self->out, PyBUF_WRITABLE) < 0
        || PyObject_GetBuffer(a[15], &self->done, PyBUF_WRITABLE) < 0)
        goto fail;
    if (self->send.len != words * 8 || self->out.len < words * 8
        || self->done.len < self->h.size) {
        PyErr_Format(PyExc_ValueError, "Stepper: send has %zd bytes, out %zd (%zd each "
                     "needed), done %zd (%zd needed)", self->send.len, self->out.len,
                     words * 8, self->done.len, self->h.size);
        goto fail;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static PyObject *stepper_step(Stepper *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "step(prompt, budget_ns, seq, template, flag, payload, "
                        "payload_len, scratch, part, src_offset, dst_stride, only)");
        return NULL;
    }
    const Head *h = &self->h;
    long long prompt = PyLong_AsLongLong(args[0]), budget = PyLong_AsLongLong(args[1]);
    long long seq = PyLong_AsLongLong(args[2]);
    int flag = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || flag < 0) return NULL;
    if (budget < 0) {
        PyErr_Format(PyExc_ValueError, "step: a budget of %lld ns", budget);
        return NULL;
    }
    Payload p;
    if (parse_payload(h, args + 5, 1, &p) < 0) return NULL;
    Py_buffer template;
    if (PyObject_GetBuffer(args[3], &template, PyBUF_SIMPLE) < 0) {
        release_payload(&p);
        return NULL;
    }
    if (template.len != h->words * 8) {
        PyErr_Format(PyExc_ValueError, "step: the template has %zd bytes, not %zd",
                     template.len, h->words * 8);
        PyBuffer_Release(&template);
        release_payload(&p);
        return NULL;
    }
    int64_t *mine = (int64_t *)self->send.buf, *acc = (int64_t *)self->out.buf;
    unsigned char *flags = (unsigned char *)self->done.buf;
    memcpy(mine, template.buf, (size_t)h->words * 8);
    PyBuffer_Release(&template);
    memset(flags, 0, (size_t)h->size);    /* no PE read yet */
    mine[h->seq_word] = seq;
    mine[self->neg_word] = -seq;
    if (flag) mine[self->flag_word] = -1;
    mine[self->time_word] = -(now_ns() / self->tick);
    Py_ssize_t left = run_exchange(h, seq, mine, acc, flags, &p);
    if (left > 0 && budget > 0) {
        /* go on reading (no write) until the budget is spent */
        long long until = monotonic_ns() + budget;
        while (left > 0 && monotonic_ns() < until)
            left = run_exchange(h, seq, NULL, acc, flags, &p);
    }
    release_payload(&p);
    if (left > 0) return PyLong_FromSsize_t(left);
    int agreed = 1;
    for (Py_ssize_t w = 0; w < h->words && agreed; w++)
        if (!(w < 64 && (h->volatile_words >> w) & 1) && acc[w] != mine[w]) agreed = 0;
    if (agreed && prompt >= 0 && now_ns() / self->tick + acc[self->time_word] > prompt)
        agreed = 0;
    return PyLong_FromLong(!agreed ? -1 : acc[self->flag_word] == -1 ? 0 : -2);
}

static PyMethodDef stepper_methods[] = {
    {"step", (PyCFunction)(void (*)(void))stepper_step, METH_FASTCALL,
     "step(prompt, budget_ns, seq, template, flag, payload, payload_len, scratch, part, "
     "src_offset, dst_stride, only) -> PEs left, 0 (agreed, the flag everywhere), -2 (agreed, "
     "the flag not everywhere) or -1"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot stepper_slots[] = {
    {Py_tp_new, stepper_new},
    {Py_tp_dealloc, stepper_dealloc},
    {Py_tp_methods, stepper_methods},
    {Py_tp_doc, "Stepper(board, nbytes, size, rank, slot_words, words, seq_word, spins, "
                "volatile, neg_seq_word, flag_word, time_word, tick_ns, send, out, done): a whole "
                "agreed step in one call (step()); see the source"},
    {0, NULL},
};

static PyType_Spec stepper_spec = {
    "shmemvm.native._collective.Stepper", sizeof(Stepper), 0, Py_TPFLAGS_DEFAULT, stepper_slots,
};

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
 * exactly an ndarray whose base chain of exact ndarrays ends at an object of
 * exactly type `memory` (the face's HeapMemory) and whose bytes lie inside it
 * (its `address` and `nbytes`). 1 where they were made, 0 where `a` is
 * anything else (the caller's Python path decides then), -1 on an error. */
static int array_facts(PyObject *a, PyTypeObject *ndarray, PyTypeObject *memory,
                       PyObject *facts[4]) {
    if (Py_TYPE(a) != ndarray) return 0;
    numpy_array *array = (numpy_array *)a;
    PyObject *owner = array->base;
    while (owner != NULL && Py_TYPE(owner) == ndarray) owner = ((numpy_array *)owner)->base;
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
static PyObject *coll_call_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

static PyMethodDef methods[] = {
    {"exchange", (PyCFunction)(void (*)(void))coll_exchange, METH_FASTCALL,
     "exchange(board, nbytes, size, rank, slot_words, words, seq_word, spins, volatile, seq, "
     "vector, out, done, payload, payload_len, scratch, part, src_offset, dst_stride, only) -> "
     "PEs left"},
    {"combine", (PyCFunction)(void (*)(void))coll_combine, METH_FASTCALL,
     "combine(dst, nbytes, scratch, n, kind, op)"},
    {"combine_from", (PyCFunction)(void (*)(void))coll_combine_from, METH_FASTCALL,
     "combine_from(dst, nbytes, sources, kind, op)"},
    {"deliver", (PyCFunction)(void (*)(void))coll_deliver, METH_FASTCALL,
     "deliver(dst, scratch, offset, nbytes)"},
    {"call_key", (PyCFunction)(void (*)(void))coll_call_key, METH_FASTCALL,
     "call_key(kind, group_id, values, target, source, ndarray, memory) -> key or None"},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    if (name_address == NULL) {   /* (immortal once interned: a second module object shares them) */
        name_address = PyUnicode_InternFromString("address");
        name_nbytes = PyUnicode_InternFromString("nbytes");
        name_itemsize = PyUnicode_InternFromString("itemsize");
        if (name_address == NULL || name_nbytes == NULL || name_itemsize == NULL) return -1;
    }
    PyObject *stepper = PyType_FromSpec(&stepper_spec);
    if (stepper == NULL) return -1;
    int failed = PyModule_AddObjectRef(module, "Stepper", stepper) < 0;
    Py_DECREF(stepper);
    if (failed) return -1;
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
