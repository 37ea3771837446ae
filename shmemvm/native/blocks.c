/* The allocator's cached branch in one call (issue 30): a small allocation
 * that takes a block of its size freed lately, and the release of a small
 * block back onto its quick list.
 *
 * memory/buddy.py's Pow2Allocator keeps a quick list per size class below the
 * chunk size; memory/vmm.py's allocator makes a block's tensor and records it.
 * A cached malloc and a free of the symmetric heap are that branch and little
 * else, and its Python frames (allocation, engine, backend, record: about ten)
 * cost more than the work. CachedBlocks does the same steps on the same
 * objects, in the same order:
 *
 *   take(nbytes, dims, dtype[, fallback, *args]): Pow2Allocator.allocate's
 *     quick branch, then VMemPow2Allocator._tensor_for, under the engine's
 *     lock: the tensor. Where the request is not that branch's (not a plain
 *     int >= 0, not below the chunk size, no block on its quick list, segments
 *     released and not yet unmapped), nothing is done: fallback(*args) where
 *     given, else None.
 *   release(offset): VMemPow2Allocator._release of a small block (not
 *     imported memory, its quick list not full): the record dropped, the block
 *     back on its quick list. True where done; False where nothing was done
 *     (the Python path then does it, or raises what it raises).
 *   take_dead(): VMemPow2Allocator._take_dead: the watches' reports (storages
 *     that died) applied to the records, then the offsets of the blocks nothing
 *     views any more, sorted; the engine's set of them starts again.
 *
 * dead.c's DeadBlocks reaches take_dead and release without a Python call
 * (blocks.h), and face_free.c's FaceFree the engine's parts of a face's free
 * (blocks.h: cached_live, cached_release, cached_defer).
 *
 * Every check comes before the first change, so a call either does the whole
 * branch or nothing. The objects' attributes are read and written in their
 * instance dicts (the names below; CachedBlocks() refuses objects whose type
 * gives any of them a meaning of its own: a property, a slot). The Python
 * paths stay, and tests/unit/native/test_blocks.py holds the two equal. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "blocks.h"

typedef struct {
    PyObject_HEAD
    PyObject *engine_dict, *buddy_dict;
    /* backend.tensor(va, dims, dtype), ownership.record(storage, died, block), the
     * engine's watch callback, buddy.Block, the engine lock's acquire and release */
    PyObject *tensor, *record, *died, *block_type, *acquire, *release;
    PyObject *events;   /* the engine's mailbox's deque of the watches that reported */
    long long base, min_block, chunk, budget, quick_limit;
} CachedBlocks;

enum {
    B_QUICK, B_QUICK_BLOCKS, B_IDLE, B_SMALL_USERS, B_SEGMENTS, B_SERIAL, B_BLOCKS,
    B_BLOCK_BYTES, B_REQUESTED, B_CACHED, B_RELEASED, B_EXTERNAL, N_BUDDY
};
enum { E_RECORDS, E_DEAD, E_IMPORTED, E_STORAGE_AT, N_ENGINE };
static const char *buddy_names[N_BUDDY] = {
    "_quick", "_quick_blocks", "_idle", "_small_users", "_segments", "_serial", "_blocks",
    "block_bytes", "requested_bytes", "cached_bytes", "released", "_external"};
static const char *engine_names[N_ENGINE] = {"_records", "_dead", "_imported", "_storage_at"};
static PyObject *buddy_keys[N_BUDDY], *engine_keys[N_ENGINE], *name_untyped_storage,
    *name_offset, *name_serial, *name_kind, *name_block, *name_own_alive, *name_views,
    *name_popleft, *name_discard, *name_freed, *own_kind;
static PyTypeObject *blocks_type;   /* CachedBlocks (for dead.c's check) */

/* dict[key] (borrowed), or NULL with AttributeError naming it */
static PyObject *field(PyObject *dict, PyObject *key) {
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_AttributeError, "CachedBlocks: the allocator has no %R", key);
    return value;
}

/* an int field, or -1 with an error set (the fields are never negative) */
static long long int_field(PyObject *dict, PyObject *key) {
    PyObject *value = field(dict, key);
    if (value == NULL) return -1;
    if (!PyLong_CheckExact(value)) {
        PyErr_Format(PyExc_TypeError, "CachedBlocks: %R is not an int", key);
        return -1;
    }
    return PyLong_AsLongLong(value);
}

static int set_int(PyObject *dict, PyObject *key, long long value) {
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) return -1;
    int failed = PyDict_SetItem(dict, key, number);
    Py_DECREF(number);
    return failed;
}

static int bit_length(unsigned long long n) {
    return n == 0 ? 0 : 64 - __builtin_clzll(n);
}

/* the object's instance dict, where its type gives none of `names` a meaning */
static PyObject *instance_dict(PyObject *obj, PyObject **keys, int n, const char *what) {
    if (Py_TYPE(obj)->tp_dictoffset == 0) {
        PyErr_Format(PyExc_TypeError, "CachedBlocks: the %s has no instance dict", what);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        int has = PyObject_HasAttr((PyObject *)Py_TYPE(obj), keys[i]);
        if (has) {
            PyErr_Format(PyExc_TypeError, "CachedBlocks: the %s's type defines %R", what,
                         keys[i]);
            return NULL;
        }
    }
    return PyObject_GenericGetDict(obj, NULL);
}

static long long int_attr(PyObject *obj, const char *name) {
    PyObject *value = PyObject_GetAttrString(obj, name);
    if (value == NULL) return -1;
    long long v = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return v;
}

static int blocks_init(CachedBlocks *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"engine", "buddy", "tensor", "record", "block_type",
                            "quick_limit", NULL};
    PyObject *engine, *buddy, *tensor, *record, *block_type;
    long long quick_limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOL:CachedBlocks", names, &engine, &buddy,
                                     &tensor, &record, &block_type, &quick_limit))
        return -1;
    if (!PyCallable_Check(tensor) || !PyCallable_Check(record) || !PyType_Check(block_type)
        || !PyType_IsSubtype((PyTypeObject *)block_type, &PyTuple_Type) || quick_limit < 0) {
        PyErr_SetString(PyExc_TypeError, "CachedBlocks(engine, buddy, tensor, record, "
                        "block_type, quick_limit): tensor and record callables, block_type a "
                        "tuple type, quick_limit >= 0");
        return -1;
    }
    PyObject *engine_dict = instance_dict(engine, engine_keys, N_ENGINE, "engine");
    if (engine_dict == NULL) return -1;
    PyObject *buddy_dict = instance_dict(buddy, buddy_keys, N_BUDDY, "allocator");
    if (buddy_dict == NULL) {
        Py_DECREF(engine_dict);
        return -1;
    }
    PyObject *lock = PyObject_GetAttrString(engine, "_lock");
    PyObject *died = PyObject_GetAttrString(engine, "_died");
    PyObject *mailbox = PyObject_GetAttrString(engine, "_mailbox");
    PyObject *events = mailbox ? PyObject_GetAttrString(mailbox, "events") : NULL;
    Py_XDECREF(mailbox);
    PyObject *acquire = lock ? PyObject_GetAttrString(lock, "acquire") : NULL;
    PyObject *release = lock ? PyObject_GetAttrString(lock, "release") : NULL;
    Py_XDECREF(lock);
    long long base = int_attr(engine, "base"), min_block = int_attr(buddy, "min_block");
    long long chunk = int_attr(buddy, "chunk"), budget = int_attr(buddy, "budget");
    if (PyErr_Occurred() || died == NULL || acquire == NULL || release == NULL
        || events == NULL) {
        Py_XDECREF(events);
        Py_XDECREF(died);
        Py_XDECREF(acquire);
        Py_XDECREF(release);
        Py_DECREF(engine_dict);
        Py_DECREF(buddy_dict);
        return -1;
    }
    if (min_block <= 0 || chunk <= 0 || (chunk & (chunk - 1)) || budget <= 0 || base < 0) {
        PyErr_SetString(PyExc_ValueError, "CachedBlocks: an allocator with a non-positive "
                        "minimum block, budget or base, or a chunk size not a power of two");
        Py_DECREF(events);
        Py_DECREF(died);
        Py_DECREF(acquire);
        Py_DECREF(release);
        Py_DECREF(engine_dict);
        Py_DECREF(buddy_dict);
        return -1;
    }
    Py_XSETREF(self->engine_dict, engine_dict);
    Py_XSETREF(self->buddy_dict, buddy_dict);
    Py_XSETREF(self->tensor, Py_NewRef(tensor));
    Py_XSETREF(self->record, Py_NewRef(record));
    Py_XSETREF(self->block_type, Py_NewRef(block_type));
    Py_XSETREF(self->died, died);
    Py_XSETREF(self->acquire, acquire);
    Py_XSETREF(self->release, release);
    Py_XSETREF(self->events, events);
    self->base = base;
    self->min_block = min_block;
    self->chunk = chunk;
    self->budget = budget;
    self->quick_limit = quick_limit;
    return 0;
}

/* Pow2Allocator.allocate's quick branch, then _tensor_for (the lock held): 1 and
 * the tensor in *out, 0 where the request is not that branch's (nothing done),
 * -1 with an error set */
static int take_locked(CachedBlocks *self, PyObject *nbytes_obj, PyObject *dims,
                       PyObject *dtype, PyObject **out) {
    PyObject *b = self->buddy_dict;
    if (!PyLong_CheckExact(nbytes_obj)) return 0;
    int overflow;
    long long nbytes = PyLong_AsLongLongAndOverflow(nbytes_obj, &overflow);
    if (overflow || nbytes < 0 || nbytes > self->budget) return 0;
    long long size = nbytes <= self->min_block ? self->min_block
                                               : 1LL << bit_length((unsigned long long)nbytes - 1);
    if (size > self->budget || size >= self->chunk) return 0;
    PyObject *released = field(b, buddy_keys[B_RELEASED]);
    if (released == NULL) return -1;
    Py_ssize_t pending = PyObject_Length(released);
    if (pending != 0) return pending < 0 ? -1 : 0;
    PyObject *lists = field(b, buddy_keys[B_QUICK]);
    if (lists == NULL) return -1;
    int order = bit_length((unsigned long long)size) - 1;
    if (!PyList_CheckExact(lists) || order >= PyList_GET_SIZE(lists)) return 0;
    PyObject *quick = PyList_GET_ITEM(lists, order);
    if (!PyList_CheckExact(quick) || PyList_GET_SIZE(quick) == 0) return 0;
    PyObject *idle = field(b, buddy_keys[B_IDLE]), *users = field(b, buddy_keys[B_SMALL_USERS]);
    PyObject *segments = field(b, buddy_keys[B_SEGMENTS]), *blocks = field(b, buddy_keys[B_BLOCKS]);
    PyObject *records = field(self->engine_dict, engine_keys[E_RECORDS]);
    if (!idle || !users || !segments || !blocks || !records) return -1;
    if (!PyDict_CheckExact(idle) || !PyDict_CheckExact(users) || !PyDict_CheckExact(segments)
        || !PyDict_CheckExact(blocks) || !PyDict_CheckExact(records))
        return 0;
    long long quick_blocks = int_field(b, buddy_keys[B_QUICK_BLOCKS]);
    long long serial = quick_blocks < 0 ? -1 : int_field(b, buddy_keys[B_SERIAL]);
    long long block_bytes = serial < 0 ? -1 : int_field(b, buddy_keys[B_BLOCK_BYTES]);
    long long requested = block_bytes < 0 ? -1 : int_field(b, buddy_keys[B_REQUESTED]);
    long long cached = requested < 0 ? -1 : int_field(b, buddy_keys[B_CACHED]);
    if (cached < 0) return -1;
    Py_ssize_t last = PyList_GET_SIZE(quick) - 1;
    PyObject *offset_obj = PyList_GET_ITEM(quick, last);
    long long offset = PyLong_AsLongLong(offset_obj);
    if (offset == -1 && PyErr_Occurred()) return -1;
    PyObject *chunk_key = PyLong_FromLongLong(offset & -self->chunk);
    if (chunk_key == NULL) return -1;
    PyObject *segment = PyDict_GetItemWithError(segments, chunk_key);   /* borrowed */
    PyObject *user_count = segment ? PyDict_GetItemWithError(users, chunk_key) : NULL;
    if (segment == NULL || user_count == NULL || !PyLong_CheckExact(user_count)) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, chunk_key);
        Py_DECREF(chunk_key);
        return -1;
    }
    long long in_use = PyLong_AsLongLong(user_count);
    int was_idle = PyDict_GET_SIZE(idle) ? PyDict_Contains(idle, chunk_key) : 0;
    /* tuple.__new__(Block, fields): buddy.py's _new_block */
    PyObject *fields = Py_BuildValue("((OLLOL))", offset_obj, size, nbytes, segment, serial + 1);
    PyObject *block = fields ? PyTuple_Type.tp_new((PyTypeObject *)self->block_type, fields, NULL)
                             : NULL;
    Py_XDECREF(fields);
    if (block == NULL || was_idle < 0 || (in_use == -1 && PyErr_Occurred())) {
        Py_XDECREF(block);
        Py_DECREF(chunk_key);
        return -1;
    }
    /* -- every check done: the allocation is made (as buddy.py's branch, in its order) -- */
    Py_INCREF(offset_obj);
    int failed = PyList_SetSlice(quick, last, last + 1, NULL) < 0
        || set_int(b, buddy_keys[B_QUICK_BLOCKS], quick_blocks - 1) < 0
        || (was_idle && (PyDict_DelItem(idle, chunk_key) < 0
                         || set_int(b, buddy_keys[B_CACHED], cached - self->chunk) < 0))
        || set_int(users, chunk_key, in_use + 1) < 0
        || set_int(b, buddy_keys[B_SERIAL], serial + 1) < 0
        || PyDict_SetItem(blocks, offset_obj, block) < 0
        || set_int(b, buddy_keys[B_BLOCK_BYTES], block_bytes + size) < 0
        || set_int(b, buddy_keys[B_REQUESTED], requested + nbytes) < 0;
    Py_DECREF(chunk_key);
    /* the block's tensor and its record (vmm's _tensor_for) */
    PyObject *tensor = NULL, *storage = NULL, *record = NULL;
    if (!failed) {
        PyObject *va = PyLong_FromLongLong(self->base + offset);
        tensor = va ? PyObject_CallFunctionObjArgs(self->tensor, va, dims, dtype, NULL) : NULL;
        Py_XDECREF(va);
        storage = tensor ? PyObject_CallMethodNoArgs(tensor, name_untyped_storage) : NULL;
        record = storage ? PyObject_CallFunctionObjArgs(self->record, storage, self->died,
                                                        block, NULL)
                         : NULL;
        failed = record == NULL || PyDict_SetItem(records, offset_obj, record) < 0;
    }
    Py_DECREF(offset_obj);
    Py_DECREF(block);
    Py_XDECREF(storage);
    Py_XDECREF(record);
    if (failed) {
        Py_XDECREF(tensor);
        return -1;
    }
    *out = tensor;
    return 1;
}

/* lock.release(), keeping the exception in flight (if any) */
static int unlock(CachedBlocks *self) {
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
    return type == NULL ? 0 : -1;
}

/* 0 where CachedBlocks() made it; -1 with ValueError where not (a bare __new__) */
static int initialised(CachedBlocks *self) {
    if (self->engine_dict != NULL && self->buddy_dict != NULL) return 0;
    PyErr_SetString(PyExc_ValueError, "CachedBlocks: not initialised");
    return -1;
}

static int lock(CachedBlocks *self) {
    PyObject *got = PyObject_CallNoArgs(self->acquire);
    Py_XDECREF(got);
    return got == NULL ? -1 : 0;
}

static PyObject *blocks_take(CachedBlocks *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3) {
        PyErr_SetString(PyExc_TypeError, "take(nbytes, dims, dtype[, fallback, *args])");
        return NULL;
    }
    if (initialised(self) < 0) return NULL;
    if (lock(self) < 0) return NULL;
    PyObject *tensor = NULL;
    int taken = take_locked(self, args[0], args[1], args[2], &tensor);
    if (unlock(self) < 0) {
        Py_XDECREF(tensor);
        return NULL;
    }
    if (taken != 0) return taken > 0 ? tensor : NULL;
    if (nargs == 3) Py_RETURN_NONE;
    return PyObject_Vectorcall(args[3], args + 4, (size_t)(nargs - 4), NULL);
}

/* VMemPow2Allocator._release of a small block (the lock held): 1 done, 0 not that
 * branch's (nothing done), -1 with an error set */
static int release_locked(CachedBlocks *self, PyObject *offset_obj) {
    PyObject *b = self->buddy_dict, *e = self->engine_dict;
    if (!PyLong_CheckExact(offset_obj)) return 0;
    PyObject *imported = field(e, engine_keys[E_IMPORTED]), *records = field(e, engine_keys[E_RECORDS]);
    PyObject *dead = field(e, engine_keys[E_DEAD]), *blocks = field(b, buddy_keys[B_BLOCKS]);
    PyObject *external = field(b, buddy_keys[B_EXTERNAL]), *lists = field(b, buddy_keys[B_QUICK]);
    PyObject *users = field(b, buddy_keys[B_SMALL_USERS]), *idle = field(b, buddy_keys[B_IDLE]);
    if (!imported || !records || !dead || !blocks || !external || !lists || !users || !idle)
        return -1;
    if (!PyDict_CheckExact(imported) || !PyDict_CheckExact(records) || !PySet_CheckExact(dead)
        || !PyDict_CheckExact(blocks) || !PyDict_CheckExact(external) || !PyList_CheckExact(lists)
        || !PyDict_CheckExact(users) || !PyDict_CheckExact(idle))
        return 0;
    int in_imported = PyDict_Contains(imported, offset_obj);
    int in_external = in_imported ? 0 : PyDict_Contains(external, offset_obj);
    int recorded = in_imported || in_external ? 0 : PyDict_Contains(records, offset_obj);
    if (in_imported < 0 || in_external < 0 || recorded < 0) return -1;
    if (in_imported || in_external || !recorded) return 0;
    PyObject *block = PyDict_GetItemWithError(blocks, offset_obj);   /* borrowed */
    if (block == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_Check(block) || PyTuple_GET_SIZE(block) != 5) return 0;
    long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(block, 1));
    long long nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(block, 2));
    if (PyErr_Occurred()) return -1;
    if (size >= self->chunk || size <= 0) return 0;
    int order = bit_length((unsigned long long)size) - 1;
    if (order >= PyList_GET_SIZE(lists) || !PyList_CheckExact(PyList_GET_ITEM(lists, order)))
        return 0;
    PyObject *quick = PyList_GET_ITEM(lists, order);
    long long quick_blocks = int_field(b, buddy_keys[B_QUICK_BLOCKS]);
    if (quick_blocks < 0) return -1;
    if (quick_blocks + 1 > self->quick_limit) return 0;   /* the Python path merges them */
    long long block_bytes = int_field(b, buddy_keys[B_BLOCK_BYTES]);
    long long requested = block_bytes < 0 ? -1 : int_field(b, buddy_keys[B_REQUESTED]);
    long long cached = requested < 0 ? -1 : int_field(b, buddy_keys[B_CACHED]);
    if (cached < 0) return -1;
    PyObject *chunk_key = PyObject_GetAttr(PyTuple_GET_ITEM(block, 3), name_offset);
    if (chunk_key == NULL) return -1;
    PyObject *user_count = PyDict_GetItemWithError(users, chunk_key);
    if (user_count == NULL || !PyLong_CheckExact(user_count)) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, chunk_key);
        Py_DECREF(chunk_key);
        return -1;
    }
    long long in_use = PyLong_AsLongLong(user_count) - 1;
    /* -- every check done: the block is released (as vmm.py's and buddy.py's, in order) -- */
    Py_INCREF(block);
    int failed = PyDict_DelItem(records, offset_obj) < 0
        || PySet_Discard(dead, offset_obj) < 0
        || PyDict_DelItem(blocks, offset_obj) < 0
        || set_int(b, buddy_keys[B_BLOCK_BYTES], block_bytes - size) < 0
        || set_int(b, buddy_keys[B_REQUESTED], requested - nbytes) < 0
        || PyList_Append(quick, offset_obj) < 0
        || set_int(b, buddy_keys[B_QUICK_BLOCKS], quick_blocks + 1) < 0
        || set_int(users, chunk_key, in_use) < 0
        || (in_use == 0 && (PyDict_SetItem(idle, chunk_key, Py_None) < 0
                            || set_int(b, buddy_keys[B_CACHED], cached + self->chunk) < 0));
    Py_DECREF(block);
    Py_DECREF(chunk_key);
    return failed ? -1 : 1;
}

static PyObject *blocks_release(CachedBlocks *self, PyObject *offset) {
    int done = cached_release((PyObject *)self, offset);   /* (blocks.h: dead.c's too) */
    return done < 0 ? NULL : PyBool_FromLong(done);
}

/* one watch's report applied (VMemPow2Allocator._absorb_events' loop body) */
static int absorb(PyObject *watch, PyObject *records, PyObject *dead) {
    PyObject *offset = PyObject_GetAttr(watch, name_offset);
    if (offset == NULL) return -1;
    PyObject *record = PyDict_GetItemWithError(records, offset);   /* borrowed */
    if (record == NULL) {
        Py_DECREF(offset);
        return PyErr_Occurred() ? -1 : 0;   /* a block released since */
    }
    Py_INCREF(record);
    int failed = 1, same = -1;
    PyObject *block = PyObject_GetAttr(record, name_block);
    PyObject *serial = PyObject_GetAttr(watch, name_serial);
    PyObject *block_serial = block ? PyObject_GetAttr(block, name_serial) : NULL;
    if (serial && block_serial) same = PyObject_RichCompareBool(block_serial, serial, Py_EQ);
    Py_XDECREF(block);
    Py_XDECREF(serial);
    Py_XDECREF(block_serial);
    if (same == 0) failed = 0;   /* an older block's watch */
    if (same == 1) {
        PyObject *kind = PyObject_GetAttr(watch, name_kind);
        int own = kind ? PyObject_RichCompareBool(kind, own_kind, Py_EQ) : -1;
        Py_XDECREF(kind);
        PyObject *views = NULL;
        if (own == 1) {
            failed = PyObject_SetAttr(record, name_own_alive, Py_False) < 0;
        } else if (own == 0) {
            views = PyObject_GetAttr(record, name_views);
            failed = views == NULL;
            if (views != NULL && views != Py_None) {
                PyObject *gone = PyObject_CallMethodOneArg(views, name_discard, watch);
                failed = gone == NULL;
                Py_XDECREF(gone);
            }
            Py_XDECREF(views);
        }
        if (!failed) {   /* not (record.own_alive or record.views): nothing views it */
            PyObject *alive = PyObject_GetAttr(record, name_own_alive);
            int viewed = alive ? PyObject_IsTrue(alive) : -1;
            Py_XDECREF(alive);
            if (viewed == 0) {
                views = PyObject_GetAttr(record, name_views);
                viewed = views ? PyObject_IsTrue(views) : -1;
                Py_XDECREF(views);
            }
            failed = viewed < 0 || (viewed == 0 && PySet_Add(dead, offset) < 0);
        }
    }
    Py_DECREF(record);
    Py_DECREF(offset);
    return failed ? -1 : 0;
}

/* the absorbing loop of VMemPow2Allocator._absorb_events (the lock held) */
static int absorb_all(CachedBlocks *self, PyObject *records, PyObject *dead) {
    Py_ssize_t left;
    while ((left = PyObject_Length(self->events)) != 0) {
        PyObject *watch = left < 0 ? NULL : PyObject_CallMethodNoArgs(self->events, name_popleft);
        int failed = watch == NULL || absorb(watch, records, dead) < 0;
        Py_XDECREF(watch);
        if (failed) return -1;
    }
    return 0;
}

PyObject *cached_take_dead(PyObject *cached) {
    CachedBlocks *self = (CachedBlocks *)cached;
    if (initialised(self) < 0) return NULL;
    PyObject *dead = field(self->engine_dict, engine_keys[E_DEAD]);
    if (dead == NULL) return NULL;
    int any = PyObject_IsTrue(dead);
    Py_ssize_t events = any ? 1 : PyObject_Length(self->events);
    if (any < 0 || events < 0) return NULL;
    if (!any && !events) return PyList_New(0);   /* the common case, without the lock */
    if (lock(self) < 0) return NULL;
    PyObject *taken = NULL;
    PyObject *records = field(self->engine_dict, engine_keys[E_RECORDS]);
    dead = records ? field(self->engine_dict, engine_keys[E_DEAD]) : NULL;
    if (dead != NULL && (!PyDict_CheckExact(records) || !PySet_CheckExact(dead)))
        PyErr_SetString(PyExc_TypeError, "CachedBlocks: the engine's records are not a dict "
                        "or its dead blocks not a set");
    else if (dead != NULL) {
        Py_INCREF(dead);
        int failed = absorb_all(self, records, dead) < 0;
        PyObject *fresh = failed ? NULL : PySet_New(NULL);
        taken = fresh ? PySequence_List(dead) : NULL;
        if (taken != NULL && (PyList_Sort(taken) < 0
                              || PyDict_SetItem(self->engine_dict, engine_keys[E_DEAD], fresh) < 0))
            Py_CLEAR(taken);
        Py_XDECREF(fresh);
        Py_DECREF(dead);
    }
    if (unlock(self) < 0) Py_CLEAR(taken);
    return taken;
}

int cached_release(PyObject *cached, PyObject *offset) {
    CachedBlocks *self = (CachedBlocks *)cached;
    if (initialised(self) < 0) return -1;
    if (lock(self) < 0) return -1;
    int done = release_locked(self, offset);
    return unlock(self) < 0 ? -1 : done;
}

int cached_live(PyObject *cached, PyObject *storage, unsigned long long address,
                PyObject **offset_out, PyObject **record_out) {
    CachedBlocks *self = (CachedBlocks *)cached;
    if (initialised(self) < 0) return -1;
    if (address < (unsigned long long)self->base) return 0;
    if (lock(self) < 0) return -1;
    int found = -1;
    PyObject *offset = NULL, *record = NULL, *freed = NULL;
    PyObject *records = field(self->engine_dict, engine_keys[E_RECORDS]);
    PyObject *imported = records ? field(self->engine_dict, engine_keys[E_IMPORTED]) : NULL;
    PyObject *storage_at = imported ? field(self->engine_dict, engine_keys[E_STORAGE_AT]) : NULL;
    if (storage_at == NULL) goto done;
    found = 0;
    /* (storages that start inside their block: imported memory, _record_of's other lookup) */
    if (!PyDict_CheckExact(records) || !PyDict_CheckExact(imported)
        || !PyDict_CheckExact(storage_at) || PyDict_GET_SIZE(storage_at))
        goto done;
    found = -1;
    offset = PyLong_FromUnsignedLongLong(address - (unsigned long long)self->base);
    int is_imported = offset ? PyDict_Contains(imported, offset) : -1;
    record = is_imported == 0 ? PyDict_GetItemWithError(records, offset) : NULL;   /* borrowed */
    if (record == NULL) {
        if (is_imported == 1 || (is_imported == 0 && !PyErr_Occurred())) found = 0;
        goto done;
    }
    Py_INCREF(record);
    freed = PyObject_GetAttr(record, name_freed);
    int is_freed = freed ? PyObject_IsTrue(freed) : -1;
    if (is_freed >= 0)   /* _record_of: a live record whose storage is this one (its target) */
        found = !is_freed && PyWeakref_Check(record) && PyWeakref_GET_OBJECT(record) == storage;
done:
    Py_XDECREF(freed);
    if (unlock(self) < 0) found = -1;
    if (found == 1) {
        *offset_out = offset;
        *record_out = record;
        return 1;
    }
    Py_XDECREF(offset);
    Py_XDECREF(record);
    return found;
}

int cached_defer(PyObject *cached, PyObject *offset) {
    CachedBlocks *self = (CachedBlocks *)cached;
    if (initialised(self) < 0) return -1;
    if (lock(self) < 0) return -1;
    int failed = 1;
    PyObject *records = field(self->engine_dict, engine_keys[E_RECORDS]);
    PyObject *dead = records ? field(self->engine_dict, engine_keys[E_DEAD]) : NULL;
    if (dead != NULL && (!PyDict_CheckExact(records) || !PySet_CheckExact(dead))) {
        PyErr_SetString(PyExc_TypeError, "CachedBlocks: the engine's records are not a dict "
                        "or its dead blocks not a set");
    } else if (dead != NULL) {
        PyObject *record = PyDict_GetItemWithError(records, offset);   /* borrowed */
        if (record == NULL && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, offset);
        Py_INCREF(dead);
        failed = record == NULL || PyObject_SetAttr(record, name_freed, Py_True) < 0
                 || absorb_all(self, records, dead) < 0;
        Py_DECREF(dead);
    }
    if (unlock(self) < 0) failed = 1;
    return failed ? -1 : 0;
}

static PyObject *blocks_take_dead(CachedBlocks *self, PyObject *Py_UNUSED(ignored)) {
    return cached_take_dead((PyObject *)self);
}

int is_cached_blocks(PyObject *obj) {
    return blocks_type != NULL && PyObject_TypeCheck(obj, blocks_type);
}

static int blocks_traverse(CachedBlocks *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->engine_dict);
    Py_VISIT(self->buddy_dict);
    Py_VISIT(self->tensor);
    Py_VISIT(self->record);
    Py_VISIT(self->died);
    Py_VISIT(self->block_type);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->events);
    return 0;
}

static int blocks_clear(CachedBlocks *self) {
    Py_CLEAR(self->engine_dict);
    Py_CLEAR(self->buddy_dict);
    Py_CLEAR(self->tensor);
    Py_CLEAR(self->record);
    Py_CLEAR(self->died);
    Py_CLEAR(self->block_type);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->events);
    return 0;
}

static void blocks_dealloc(CachedBlocks *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    blocks_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMethodDef blocks_methods[] = {
    {"take", (PyCFunction)(void (*)(void))blocks_take, METH_FASTCALL,
     "take(nbytes, dims, dtype[, fallback, *args]) -> the tensor of a block taken from its "
     "quick list, else fallback(*args) (None without one), nothing done"},
    {"take_dead", (PyCFunction)blocks_take_dead, METH_NOARGS,
     "take_dead() -> VMemPow2Allocator._take_dead: the watches' reports applied, then the "
     "sorted offsets of the blocks nothing here views any more (the engine's set starts again)"},
    {"release", (PyCFunction)blocks_release, METH_O,
     "release(offset) -> True: the small block's record dropped and the block back on its "
     "quick list; False: not that case, nothing done"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot blocks_slots[] = {
    {Py_tp_doc, "CachedBlocks(engine, buddy, tensor, record, block_type, quick_limit): the "
                "allocator's cached branch in one call (blocks.c says what it does)."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, blocks_init},
    {Py_tp_dealloc, blocks_dealloc},
    {Py_tp_traverse, blocks_traverse},
    {Py_tp_clear, blocks_clear},
    {Py_tp_methods, blocks_methods},
    {0, NULL},
};

static PyType_Spec blocks_spec = {
    "shmemvm.native._native.CachedBlocks", sizeof(CachedBlocks), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, blocks_slots,
};

int add_blocks(PyObject *module) {
    for (int i = 0; i < N_BUDDY; i++)
        if ((buddy_keys[i] = PyUnicode_InternFromString(buddy_names[i])) == NULL) return -1;
    for (int i = 0; i < N_ENGINE; i++)
        if ((engine_keys[i] = PyUnicode_InternFromString(engine_names[i])) == NULL) return -1;
    if ((name_untyped_storage = PyUnicode_InternFromString("untyped_storage")) == NULL
        || (name_offset = PyUnicode_InternFromString("offset")) == NULL
        || (name_serial = PyUnicode_InternFromString("serial")) == NULL
        || (name_kind = PyUnicode_InternFromString("kind")) == NULL
        || (name_block = PyUnicode_InternFromString("block")) == NULL
        || (name_own_alive = PyUnicode_InternFromString("own_alive")) == NULL
        || (name_views = PyUnicode_InternFromString("views")) == NULL
        || (name_popleft = PyUnicode_InternFromString("popleft")) == NULL
        || (name_discard = PyUnicode_InternFromString("discard")) == NULL
        || (name_freed = PyUnicode_InternFromString("freed")) == NULL
        || (own_kind = PyLong_FromLong(0)) == NULL)   /* ownership.OWN */
        return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &blocks_spec, NULL);
    if (type == NULL) return -1;
    int failed = PyModule_AddObjectRef(module, "CachedBlocks", type);
    if (!failed) blocks_type = (PyTypeObject *)type;   /* (the module keeps it) */
    Py_DECREF(type);
    return failed;
}
