/* shmemvm.native._collective: a whole agreed step of a collective on the
 * node's shared-memory board in one call, a barrier's whole call in one, and
 * the combining of a reduction (issue 30). The board's layout and protocol are
 * agreement/board.py's. This file holds the steps (exchange, Stepper, Quick)
 * and the module; collective_data.c the data side (combine, combine_from,
 * deliver, call_key), whose contracts are said here too.
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
 *   Quick(...)()
 *       a collective call that is one fixed step (barrier_all, sync_all, a
 *       fused collective's repeated call with its payload and delivery), whole
 *       in one call where nothing is unusual, else nothing done (quick.c).
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
 *   deliver_collected(dst, scratch, n, stride, d, s, dest_count, size) -> bool
 *       a collect's delivery (transport/nodecoll.py's Collected): the n PEs'
 *       payloads lie `stride` bytes apart in scratch, each a byte count (int64)
 *       then that many bytes. Where the counts pass collect's check (their
 *       elements of `size` bytes fit dest's `dest_count` at heap offset d, and
 *       dest's part written overlaps no source, the widest count at heap
 *       offset s), the bytes are written to dst one PE after the other and
 *       True returned; else False, nothing written: the Python check raises
 *       collect's own error there.
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
#include "collective.h"
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>



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


void release_payload(Payload *p) {
    if (p->scratch.obj) PyBuffer_Release(&p->scratch);
}

int parse_payload(const Head *h, PyObject *const *args, int writing, Payload *p) {
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

static long long monotonic_ns(void);

/* a step's waiting: its hot time (ns) and the monotonic time of its first
 * clock read, at the HOT_SPINS-th read of the slots (0: not yet) */
typedef struct {
    long long hot_ns, since;
} Spin;

/* The exchange itself on checked arguments (see the top of the file): `vector`
 * (NULL: read only) written into this PE's slot of step `seq`, then the others'
 * read for at most `spins` rounds (the hot ones with the GIL: below). `acc` (the MAX
 * vector) and `flags` (the PEs read) have `words` words and `size` bytes. The
 * PEs left. */
static Py_ssize_t run_exchange(const Head *h, long long seq, const int64_t *vector,
                               int64_t *acc, unsigned char *flags, const Payload *p,
                               Spin *spin) {
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
    /* The first HOT_SPINS reads keep the GIL, and so do those of the next
     * `spin->hot_ns` (the clock read every 16th): a step whose PEs arrive
     * together (a barrier in a loop) ends in them, and releasing and taking
     * the GIL again cost about as much as the wait itself there. The rest go
     * without it, and wait between reads as every waiting loop here does
     * (shared.h: wait_between_reads). The monotonic clock is
     * first read at the HOT_SPINS-th read (spin->since): a step that does not
     * wait reads no clock here (a clock read is a tenth of a barrier). */
    PyThreadState *released = NULL;
    for (long long i = 0; i < h->spins && left; i++) {
        if (!released && i >= HOT_SPINS) {
            if (!spin->since) spin->since = monotonic_ns();
            else if (!spin->hot_ns
                     || ((i & 15) == 0 && monotonic_ns() >= spin->since + spin->hot_ns))
                released = PyEval_SaveThread();
        }
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
        if (left && released) wait_between_reads(i);
        else if (left) spin_pause();
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
    Spin spin = {0, 0};   /* (no hot reads past the first HOT_SPINS) */
    result = PyLong_FromSsize_t(run_exchange(&h, seq, writing ? (int64_t *)vector.buf : NULL,
                                             (int64_t *)out.buf, (unsigned char *)done.buf, &p,
                                             &spin));
end:
    release_payload(&p);
    if (vector.obj) PyBuffer_Release(&vector);
    if (done.obj) PyBuffer_Release(&done);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

/* Stepper(board, nbytes, size, rank, slot_words, words, seq_word, spins,
 *         volatile, neg_seq_word, flag_word, time_word, tick_ns, send, out, done,
 *         hot_ns)
 * A whole agreed step (agreement.py's collective()) where nothing is unusual,
 * its arguments that never change checked once (the board's, and the vectors'
 * buffers, held while the Stepper lives):
 *
 *   step(prompt, budget_ns, seq, template, flag, payload, payload_len, scratch,
 *        part, src_offset, dst_stride, only) -> int
 *       `send` <- `template` (the call's vector) with the step number at
 *       seq_word, its negation at neg_seq_word, -1 at flag_word where `flag`,
 *       and minus this PE's entry time in ticks of `tick_ns` (CLOCK_REALTIME,
 *       as time.time_ns(); its coarse form where a tick is at least 8 of its
 *       resolution) at time_word; then exchange() as above (`out` the
 *       MAX vector, `done` the PEs read), its spins repeated while PEs are
 *       left, for at most `budget_ns`; its reads keep the GIL and do not yield
 *       the core for its first `hot_ns` (board.py: where every PE of the
 *       board has a core of its own). Returns the PEs left (> 0: the caller
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

/* CLOCK_REALTIME (as time.time_ns()), or its coarse form where `coarse`: a
 * read of the last timer tick, a tenth of the fine clock's cost, for a
 * Stepper whose ticks are at least 8 of the coarse clock's resolution (the
 * entry times it stamps are ticks; stepper_new decides) */
static long long wall_ns(int coarse) {
    struct timespec t;
    clock_gettime(coarse ? CLOCK_REALTIME_COARSE : CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* the end of a dealloc of an instance of a heap type (PyType_FromSpec's) */
void free_instance(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static void stepper_dealloc(Stepper *self) {
    if (self->send.obj) PyBuffer_Release(&self->send);
    if (self->out.obj) PyBuffer_Release(&self->out);
    if (self->done.obj) PyBuffer_Release(&self->done);
    free_instance((PyObject *)self);
}

static PyObject *stepper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if ((kwargs && PyDict_GET_SIZE(kwargs)) || PyTuple_GET_SIZE(args) != 17) {
        PyErr_SetString(PyExc_TypeError, "Stepper(board, nbytes, size, rank, slot_words, "
                        "words, seq_word, spins, volatile, neg_seq_word, flag_word, time_word, "
                        "tick_ns, send, out, done, hot_ns)");
        return NULL;
    }
    PyObject *const *a = &PyTuple_GET_ITEM(args, 0);
    Stepper *self = (Stepper *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if (parse_head(a, &self->h) < 0) goto fail;
    self->tick = PyLong_AsLongLong(a[12]);
    self->hot_ns = PyLong_AsLongLong(a[16]);
    if (PyErr_Occurred()) goto fail;
    Py_ssize_t words = self->h.words;
    if (get_ssize(a[9], &self->neg_word, 0, "Stepper: neg_seq_word") < 0
        || get_ssize(a[10], &self->flag_word, 0, "Stepper: flag_word") < 0
        || get_ssize(a[11], &self->time_word, 0, "Stepper: time_word") < 0)
        goto fail;
    if (self->neg_word >= words || self->flag_word >= words || self->time_word >= words
        || self->tick < 1 || self->hot_ns < 0 || self->hot_ns > 1000000) {
        PyErr_Format(PyExc_ValueError, "Stepper: %zd words with the step number negated at "
                     "%zd, the flag at %zd and the time at %zd, ticks of %lld ns, %lld ns hot "
                     "(at most 1 ms): out of range", words, self->neg_word, self->flag_word,
                     self->time_word, self->tick, self->hot_ns);
        goto fail;
    }
    struct timespec res;
    self->coarse = clock_getres(CLOCK_REALTIME_COARSE, &res) == 0 && res.tv_sec == 0
                   && res.tv_nsec * 8 <= self->tick;
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

/* A whole step on checked arguments (see Stepper above): the PEs left (> 0), or
 * 0, -2 or -1 once every slot is read. */
Py_ssize_t run_step(Stepper *self, long long prompt, long long budget, long long seq,
                           const int64_t *template, int flag, const Payload *p) {
    const Head *h = &self->h;
    int64_t *mine = (int64_t *)self->send.buf, *acc = (int64_t *)self->out.buf;
    unsigned char *flags = (unsigned char *)self->done.buf;
    memcpy(mine, template, (size_t)h->words * 8);
    memset(flags, 0, (size_t)h->size);    /* no PE read yet */
    mine[h->seq_word] = seq;
    mine[self->neg_word] = -seq;
    if (flag) mine[self->flag_word] = -1;
    mine[self->time_word] = -(wall_ns(self->coarse) / self->tick);
    Spin spin = {self->hot_ns, 0};
    Py_ssize_t left = run_exchange(h, seq, mine, acc, flags, p, &spin);
    if (left > 0 && budget > 0) {
        /* go on reading (no write) until the budget is spent, counted from the
         * first clock read (where the step began to wait) */
        long long until = (spin.since ? spin.since : monotonic_ns()) + budget;
        while (left > 0 && monotonic_ns() < until)
            left = run_exchange(h, seq, NULL, acc, flags, p, &spin);
    }
    if (left > 0) return left;
    int agreed = 1;
    for (Py_ssize_t w = 0; w < h->words && agreed; w++)
        if (!(w < 64 && (h->volatile_words >> w) & 1) && acc[w] != mine[w]) agreed = 0;
    if (agreed && prompt >= 0
        && wall_ns(self->coarse) / self->tick + acc[self->time_word] > prompt)
        agreed = 0;
    return !agreed ? -1 : acc[self->flag_word] == -1 ? 0 : -2;
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
    Py_ssize_t code = run_step(self, prompt, budget, seq, (const int64_t *)template.buf, flag, &p);
    PyBuffer_Release(&template);
    release_payload(&p);
    return PyLong_FromSsize_t(code);
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
                "volatile, neg_seq_word, flag_word, time_word, tick_ns, send, out, done, "
                "hot_ns): a whole agreed step in one call (step()); see the source"},
    {0, NULL},
};

static PyType_Spec stepper_spec = {
    "shmemvm.native._collective.Stepper", sizeof(Stepper), 0, Py_TPFLAGS_DEFAULT, stepper_slots,
};

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
    {"deliver_collected", (PyCFunction)(void (*)(void))coll_deliver_collected, METH_FASTCALL,
     "deliver_collected(dst, scratch, n, stride, d, s, dest_count, size) -> bool"},
    {"call_key", (PyCFunction)(void (*)(void))coll_call_key, METH_FASTCALL,
     "call_key(kind, group_id, values, target, source, ndarray, memory) -> key or None"},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    if (collective_data_exec(module) < 0) return -1;
    PyObject *stepper = PyType_FromSpec(&stepper_spec);
    if (stepper == NULL) return -1;
    int failed = PyModule_AddObjectRef(module, "Stepper", stepper) < 0;
    if (failed) {
        Py_DECREF(stepper);
        return -1;
    }
    /* (the type is held for Quick's check; one module per process in practice) */
    return quick_exec(module, (PyTypeObject *)stepper);
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
