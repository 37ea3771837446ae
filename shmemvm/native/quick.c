/* shmemvm.native._collective's Quick: a collective call that is one agreed
 * step of a fixed call, whole in one native call where nothing is unusual
 * (a barrier; a fused collective's repeated call; an allocation and a free).
 * Its step is _collective.c's Stepper's (run_step); its contract below. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "collective.h"
#include <string.h>

/* the module's Stepper type (quick_exec), which Quick checks its stepper against */
static PyTypeObject *stepper_type;

/* Quick(stepper, template, counted, prompt, budget_ns, lock, agreement, board, guards,
 *       settle[, carry, deliver[, before[, answer[, dead]]]])
 * One collective call that is a single agreed step of a fixed call (a barrier;
 * a fused collective's repeated call with its payload), taken whole in one
 * call where nothing is unusual:
 *
 *   quick() -> None, or what the step ended with
 *       None (nothing done) where `lock` (the heap's RLock, or a team's) is
 *       held by another thread or one of `guards` (a tuple of (object,
 *       attribute name) pairs) names a true value: a pending release, a
 *       recorded operation, an unfinished step, a staged payload, a finalized
 *       or broken heap, a destroyed team; the caller then takes its general
 *       path, which deals with it. Else, holding `lock`: the agreement's `seq`
 *       + 1 (and `calls` + 1 where `counted`), its `_sub` 0, and the Stepper's
 *       step of `template` (a copy, made here) with the flag set, `prompt` and
 *       `budget_ns` as step()'s, carrying `carry`'s payload (board.stage()'s
 *       tuple, checked here once; none without it), after `before`'s callable
 *       was called with its args (where given: collect's payload filled
 *       again; its exception raised, nothing stepped). Where the step is agreed,
 *       the flag everywhere (0): the agreement's `_entered` from the step's
 *       MAX, the board's `carried` None, `deliver`'s callable called with its
 *       args (the result written from scratch), and 0. Otherwise the board's
 *       `_waiting` is `carry` where PEs are left (its finish() reads their
 *       payloads as after step()), and what `settle(code)` returns
 *       (agreement.py: the rest of the general path from the same point, and
 *       the delivery), or its exception. `lock` is released either way.
 *
 *   quick(flag) -> the same, with the step's flag `flag` (truth) in place of
 *       set: a step whose flag is not everywhere ends with -2, and returns -2
 *       as a plain step returns 0 where it delivers nothing and carries no
 *       dead blocks (a free's, where a PE's block is still viewed); it
 *       settles otherwise.
 *
 * With `dead` (callable, args, word, guards): where one of its `guards` (as
 * Quick's) names a true value (something is dead here, or pending), the
 * callable is called under the lock after Quick's guards and `before`, and
 * returns the digest (an int >= 0) of the dead blocks this PE's step
 * carries, 0 for none; where none does, the step carries none. A step that carries some
 * has words `word` and `word` + 1 of its vector set to -digest and digest (the
 * agreement's _set_dead) and settles: the agreement releases them there, or
 * learns that the PEs' dead blocks differ. (Its guards then leave out the
 * pending releases that the callable deals with.) With a fifth item, `release`
 * (dead = (callable, args, word, guards, release)), a step that would be plain
 * but for the blocks it carried, and whose MAX says every PE carried the same
 * ones (-min digest == max digest), calls release() (after the agreement's
 * `_entered`) in place of settling, and ends as a plain step: what settle's
 * path does in that case (agreement.py's _board_outcome), without its frames.
 *
 * `deliver` may come without a carry (a step that moves no data, whose
 * caller's work follows it: an allocation's block and tensor), and with
 * `answer` true a plain step returns what deliver's callable returned, not 0
 * (settle is then made to return it too: agreement.py).
 *
 * So Python sees one call where agreement.collective() would have made the
 * same step after the same checks (the guards are those checks' state, each
 * named by the part that owns it). */
/* An attribute of one object, read and written through the object's own
 * __dict__ where it has one and its type gives the name no meaning of its own
 * (no property, no slot, no class attribute: _PyType_Lookup finds nothing at
 * Quick's making): one dict lookup instead of the attribute protocol's, about
 * a third of a barrier's Python-side cost. Else through PyObject_GetAttr and
 * PyObject_SetAttr. (Our parts never replace an instance's __dict__.) */
typedef struct {
    PyObject *obj, *name, *dict;
} Attr;

static int attr_init(Attr *a, PyObject *obj, PyObject *name) {
    a->obj = Py_NewRef(obj);
    a->name = Py_NewRef(name);
    a->dict = NULL;
    PyTypeObject *type = Py_TYPE(obj);
    if (type->tp_dictoffset != 0 && PyUnicode_CheckExact(name)
        && _PyType_Lookup(type, name) == NULL) {
        a->dict = PyObject_GenericGetDict(obj, NULL);
        if (a->dict == NULL) return -1;
    }
    return 0;
}

static void attr_clear(Attr *a) {
    Py_CLEAR(a->obj);
    Py_CLEAR(a->name);
    Py_CLEAR(a->dict);
}

/* the attribute's value (a new reference), or NULL with an error set */
static PyObject *attr_get(Attr *a) {
    if (a->dict != NULL) {
        PyObject *value = PyDict_GetItemWithError(a->dict, a->name);
        if (value != NULL) return Py_NewRef(value);
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_GetAttr(a->obj, a->name);   /* (not in the dict: as Python would say) */
}

static int attr_set(Attr *a, PyObject *value) {
    if (a->dict != NULL) return PyDict_SetItem(a->dict, a->name, value);
    return PyObject_SetAttr(a->obj, a->name, value);
}

/* the agreement's and the board's attributes a quick step reads and writes */
enum { SEQ, CALLS, SUB, ENTERED, CARRIED, WAITING, N_STATE };

typedef struct {
    PyObject_HEAD
    PyObject *stepper, *settle;
    /* lock.acquire and lock.release */
    PyObject *acquire, *release;
    Attr state[N_STATE];
    Attr *guards, *dead_guards;
    Py_ssize_t n_guards, n_dead_guards;
    /* a fused collective's: the payload its step carries (`carry`, board.stage()'s
     * tuple, parsed once into `payload`, which is empty without one) and the
     * delivery after a plain step */
    PyObject *carry, *deliver, *deliver_args, *before, *before_args, *dead, *dead_args,
        *release_dead;
    Py_ssize_t dead_word;
    Payload payload;
    int counted, answer;
    long long prompt, budget;
    int64_t template[MAX_WORDS];
} Quick;

static PyObject *name_acquire, *name_release, *name_seq, *name_calls, *name_sub,
    *name_entered, *name_carried, *name_waiting;

/* guards (a tuple) checked to be (object, name) pairs; 0, or -1 with a TypeError */
static int check_guards(PyObject *guards, const char *what) {
    if (!PyTuple_Check(guards)) {
        PyErr_Format(PyExc_TypeError, "Quick: %s must be a tuple of (object, name) pairs", what);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(guards); i++) {
        PyObject *g = PyTuple_GET_ITEM(guards, i);
        if (!PyTuple_Check(g) || PyTuple_GET_SIZE(g) != 2
            || !PyUnicode_Check(PyTuple_GET_ITEM(g, 1))) {
            PyErr_Format(PyExc_TypeError, "Quick: %s %zd is not an (object, name) pair", what, i);
            return -1;
        }
    }
    return 0;
}

/* the checked `guards` as Attrs in *out (*n of them made, even on a failure) */
static int make_guards(PyObject *guards, Attr **out, Py_ssize_t *n) {
    Py_ssize_t count = PyTuple_GET_SIZE(guards);
    *out = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Attr));
    if (*out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *g = PyTuple_GET_ITEM(guards, i);
        *n = i + 1;
        if (attr_init(&(*out)[i], PyTuple_GET_ITEM(g, 0), PyTuple_GET_ITEM(g, 1)) < 0)
            return -1;
    }
    return 0;
}

static void clear_guards(Attr *guards, Py_ssize_t n) {
    if (guards == NULL) return;
    for (Py_ssize_t i = 0; i < n; i++) attr_clear(&guards[i]);
    PyMem_Free(guards);
}

/* 1 where every guard names a false value, 0 where one does not, -1 on an error */
static int all_false(Attr *guards, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = attr_get(&guards[i]);
        if (value == NULL) return -1;
        int busy = value == Py_None || value == Py_False ? 0 : PyObject_IsTrue(value);
        Py_DECREF(value);
        if (busy) return busy < 0 ? -1 : 0;
    }
    return 1;
}

static void quick_dealloc(Quick *self) {
    Py_XDECREF(self->stepper);
    Py_XDECREF(self->settle);
    Py_XDECREF(self->acquire);
    Py_XDECREF(self->release);
    Py_XDECREF(self->carry);
    Py_XDECREF(self->deliver);
    Py_XDECREF(self->deliver_args);
    Py_XDECREF(self->before);
    Py_XDECREF(self->before_args);
    Py_XDECREF(self->dead);
    Py_XDECREF(self->dead_args);
    Py_XDECREF(self->release_dead);
    release_payload(&self->payload);
    for (int i = 0; i < N_STATE; i++) attr_clear(&self->state[i]);
    clear_guards(self->guards, self->n_guards);
    clear_guards(self->dead_guards, self->n_dead_guards);
    free_instance((PyObject *)self);
}

/* None, or a (callable, args tuple) pair: Quick's deliver and before */
static int is_call(PyObject *obj) {
    return obj == Py_None || (PyTuple_Check(obj) && PyTuple_GET_SIZE(obj) == 2
                              && PyCallable_Check(PyTuple_GET_ITEM(obj, 0))
                              && PyTuple_Check(PyTuple_GET_ITEM(obj, 1)));
}

static PyObject *quick_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if ((kwargs && PyDict_GET_SIZE(kwargs)) || nargs < 10 || nargs > 15 || nargs == 11) {
        PyErr_SetString(PyExc_TypeError, "Quick(stepper, template, counted, prompt, budget_ns, "
                        "lock, agreement, board, guards, settle[, carry, deliver[, before[, "
                        "answer[, dead]]]])");
        return NULL;
    }
    PyObject *const *a = &PyTuple_GET_ITEM(args, 0);
    if (!PyObject_TypeCheck(a[0], stepper_type)) {
        PyErr_Format(PyExc_TypeError, "Quick: the stepper must be a Stepper, not %s",
                     Py_TYPE(a[0])->tp_name);
        return NULL;
    }
    Stepper *stepper = (Stepper *)a[0];
    PyObject *guards = a[8];
    if (check_guards(guards, "guard") < 0) return NULL;
    if (!PyCallable_Check(a[9])) {
        PyErr_SetString(PyExc_TypeError, "Quick: settle must be callable");
        return NULL;
    }
    PyObject *carry = nargs >= 12 ? a[10] : Py_None, *deliver = nargs >= 12 ? a[11] : Py_None;
    PyObject *before = nargs >= 13 ? a[12] : Py_None;
    int answer = nargs >= 14 ? PyObject_IsTrue(a[13]) : 0;
    if (answer < 0) return NULL;
    PyObject *dead = nargs == 15 ? a[14] : Py_None;
    Py_ssize_t dead_word = -1;
    if (dead != Py_None) {
        if (!PyTuple_Check(dead) || PyTuple_GET_SIZE(dead) < 4 || PyTuple_GET_SIZE(dead) > 5
            || !PyCallable_Check(PyTuple_GET_ITEM(dead, 0))
            || !PyTuple_Check(PyTuple_GET_ITEM(dead, 1))
            || (PyTuple_GET_SIZE(dead) == 5 && !PyCallable_Check(PyTuple_GET_ITEM(dead, 4)))) {
            PyErr_SetString(PyExc_TypeError, "Quick: dead is None or (callable, args tuple, "
                            "word, guards[, release callable])");
            return NULL;
        }
        if (check_guards(PyTuple_GET_ITEM(dead, 3), "dead guard") < 0) return NULL;
        dead_word = PyLong_AsSsize_t(PyTuple_GET_ITEM(dead, 2));
        if (dead_word == -1 && PyErr_Occurred()) return NULL;
        Py_ssize_t flag_word = stepper->flag_word, time_word = stepper->time_word;
        if (dead_word < 0 || dead_word + 1 >= stepper->h.words || dead_word > 62
            || ((stepper->h.volatile_words >> dead_word) & 3) != 3
            || dead_word == flag_word || dead_word + 1 == flag_word
            || dead_word == time_word || dead_word + 1 == time_word) {
            PyErr_Format(PyExc_ValueError, "Quick: dead word %zd is not a pair of volatile "
                         "words of the %zd-word vector apart from its flag and time words",
                         dead_word, stepper->h.words);
            return NULL;
        }
    }
    if ((carry != Py_None && (deliver == Py_None || !PyTuple_Check(carry)
                              || PyTuple_GET_SIZE(carry) != 7))
        || !is_call(deliver) || !is_call(before) || (before != Py_None && carry == Py_None)
        || (answer && deliver == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "Quick: carry is None or board.stage()'s 7-tuple, "
                        "deliver None or (callable, args tuple), given with a carry; before None "
                        "or (callable, args tuple), with a carry; answer with a deliver");
        return NULL;
    }
    int counted = PyObject_IsTrue(a[2]);
    long long prompt = PyLong_AsLongLong(a[3]), budget = PyLong_AsLongLong(a[4]);
    if (counted < 0 || PyErr_Occurred()) return NULL;
    if (budget < 0 || prompt < -1) {
        PyErr_Format(PyExc_ValueError, "Quick: a prompt of %lld ticks, a budget of %lld ns",
                     prompt, budget);
        return NULL;
    }
    Py_buffer template;
    if (PyObject_GetBuffer(a[1], &template, PyBUF_SIMPLE) < 0) return NULL;
    if (template.len != stepper->h.words * 8) {
        PyErr_Format(PyExc_ValueError, "Quick: the template has %zd bytes, not %zd",
                     template.len, stepper->h.words * 8);
        PyBuffer_Release(&template);
        return NULL;
    }
    Quick *self = (Quick *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyBuffer_Release(&template);
        return NULL;
    }
    memcpy(self->template, template.buf, (size_t)template.len);
    PyBuffer_Release(&template);
    self->payload.only = -1;   /* (none, where no carry is parsed into it below) */
    self->stepper = Py_NewRef(a[0]);
    self->settle = Py_NewRef(a[9]);
    self->acquire = PyObject_GetAttr(a[5], name_acquire);
    self->release = PyObject_GetAttr(a[5], name_release);
    if (self->acquire == NULL || self->release == NULL) goto failed;
    if (carry != Py_None) {
        if (parse_payload(&stepper->h, &PyTuple_GET_ITEM(carry, 0), 1, &self->payload) < 0)
            goto failed;
        self->carry = Py_NewRef(carry);
        if (before != Py_None) {
            self->before = Py_NewRef(PyTuple_GET_ITEM(before, 0));
            self->before_args = Py_NewRef(PyTuple_GET_ITEM(before, 1));
        }
    }
    if (deliver != Py_None) {
        self->deliver = Py_NewRef(PyTuple_GET_ITEM(deliver, 0));
        self->deliver_args = Py_NewRef(PyTuple_GET_ITEM(deliver, 1));
    }
    self->answer = answer;
    if (dead != Py_None) {
        self->dead = Py_NewRef(PyTuple_GET_ITEM(dead, 0));
        self->dead_args = Py_NewRef(PyTuple_GET_ITEM(dead, 1));
        self->dead_word = dead_word;
        if (PyTuple_GET_SIZE(dead) == 5) self->release_dead = Py_NewRef(PyTuple_GET_ITEM(dead, 4));
        if (make_guards(PyTuple_GET_ITEM(dead, 3), &self->dead_guards, &self->n_dead_guards) < 0)
            goto failed;
    }
    PyObject *owners[N_STATE] = {a[6], a[6], a[6], a[6], a[7], a[7]};
    PyObject *names[N_STATE] = {name_seq, name_calls, name_sub, name_entered, name_carried,
                                name_waiting};
    for (int i = 0; i < N_STATE; i++)
        if (attr_init(&self->state[i], owners[i], names[i]) < 0) goto failed;
    if (make_guards(guards, &self->guards, &self->n_guards) < 0) goto failed;
    self->counted = counted;
    self->prompt = prompt;
    self->budget = budget;
    return (PyObject *)self;
failed:
    Py_DECREF(self);
    return NULL;
}

/* the int attribute `a` plus `add`, stored back; -1 (an error set) or 0 */
static int bump(Attr *a, long long add, long long *now) {
    PyObject *value = attr_get(a);
    if (value == NULL) return -1;
    long long v = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    PyObject *next = PyLong_FromLongLong(v + add);
    if (next == NULL) return -1;
    int failed = attr_set(a, next);
    Py_DECREF(next);
    *now = v + add;
    return failed;
}

/* the agreement's `_entered`: when the step's earliest PE entered it (its MAX) */
static int note_entered(Quick *self, Stepper *stepper) {
    PyObject *entered = PyLong_FromLongLong(-((int64_t *)stepper->out.buf)[stepper->time_word]);
    if (entered == NULL) return -1;
    int failed = attr_set(&self->state[ENTERED], entered);
    Py_DECREF(entered);
    return failed;
}

static PyObject *quick_call(Quick *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t nargs = args ? PyTuple_GET_SIZE(args) : 0;
    if (nargs > 1 || (kwargs && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "quick() takes at most one argument, the flag");
        return NULL;
    }
    int flag = nargs ? PyObject_IsTrue(PyTuple_GET_ITEM(args, 0)) : 1;
    if (flag < 0) return NULL;
    PyObject *got = PyObject_CallOneArg(self->acquire, Py_False);   /* (do not block) */
    if (got == NULL) return NULL;
    int held = PyObject_IsTrue(got);
    Py_DECREF(got);
    if (held <= 0) return held < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = NULL;
    int idle = all_false(self->guards, self->n_guards);
    if (idle <= 0) {
        if (idle == 0) result = Py_NewRef(Py_None);
        goto release;
    }
    if (self->before != NULL) {   /* the payload made anew from its source (collect's) */
        PyObject *done = PyObject_Call(self->before, self->before_args, NULL);
        if (done == NULL) goto release;
        Py_DECREF(done);
    }
    Stepper *stepper = (Stepper *)self->stepper;
    const int64_t *vector = self->template;
    int64_t with_dead[MAX_WORDS];
    long long digest = 0;
    int nothing_dead = self->dead == NULL ? 1 : all_false(self->dead_guards, self->n_dead_guards);
    if (nothing_dead < 0) goto release;
    if (!nothing_dead) {   /* the dead blocks this step carries, if any */
        PyObject *got_digest = PyObject_Call(self->dead, self->dead_args, NULL);
        if (got_digest == NULL) goto release;
        digest = PyLong_AsLongLong(got_digest);
        Py_DECREF(got_digest);
        if (digest == -1 && PyErr_Occurred()) goto release;
        if (digest < 0) {
            PyErr_Format(PyExc_ValueError, "Quick: a dead-block digest of %lld", digest);
            goto release;
        }
        if (digest) {
            memcpy(with_dead, self->template, (size_t)stepper->h.words * 8);
            with_dead[self->dead_word] = -digest;
            with_dead[self->dead_word + 1] = digest;
            vector = with_dead;
        }
    }
    long long seq, calls;
    PyObject *zero_obj = PyLong_FromLong(0);   /* (a cached small int) */
    int failed = attr_set(&self->state[SUB], zero_obj);
    Py_DECREF(zero_obj);
    if (failed || bump(&self->state[SEQ], 1, &seq) < 0
        || (self->counted && bump(&self->state[CALLS], 1, &calls) < 0))
        goto release;
    Py_ssize_t code = run_step(stepper, self->prompt, self->budget, seq, vector, flag,
                               &self->payload);
    if (attr_set(&self->state[CARRIED], Py_None) < 0) goto release;
    int plain = code == 0 || (code == -2 && self->deliver == NULL);
    const int64_t *reduced = (const int64_t *)stepper->out.buf;   /* the MAX */
    int noted = 0;
    if (plain && digest && self->release_dead != NULL
        && -reduced[self->dead_word] == reduced[self->dead_word + 1]) {
        /* every PE carried these same dead blocks: released, and the step is plain
         * (its entry noted first, as _board_outcome does before it releases) */
        if (note_entered(self, stepper) < 0) goto release;
        noted = 1;
        PyObject *released = PyObject_CallNoArgs(self->release_dead);
        if (released == NULL) goto release;
        Py_DECREF(released);
        digest = 0;
    }
    if (plain && !digest) {
        if (!noted && note_entered(self, stepper) < 0) goto release;
        if (self->deliver != NULL) {   /* every PE's payload is in scratch: the result */
            PyObject *done = PyObject_Call(self->deliver, self->deliver_args, NULL);
            if (done == NULL) goto release;
            if (self->answer) {
                result = done;
                goto release;
            }
            Py_DECREF(done);
        }
        result = PyLong_FromSsize_t(code);
        goto release;
    }
    /* the PEs left are read by the board's finish() with the same payload (as step()
     * leaves it in _waiting); settle delivers where it is given a carry */
    if (code > 0 && self->carry != NULL && attr_set(&self->state[WAITING], self->carry) < 0)
        goto release;
    PyObject *code_obj = PyLong_FromSsize_t(code);
    if (code_obj == NULL) goto release;
    result = PyObject_CallOneArg(self->settle, code_obj);
    Py_DECREF(code_obj);
release:;
    /* (the lock is released whatever happened, the exception kept) */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *released = PyObject_CallNoArgs(self->release);
    if (released == NULL) {
        if (type == NULL) {
            Py_XDECREF(result);
            return NULL;
        }
        PyErr_Clear();
    } else {
        Py_DECREF(released);
    }
    PyErr_Restore(type, value, traceback);
    return result;
}

static PyType_Slot quick_slots[] = {
    {Py_tp_new, quick_new},
    {Py_tp_dealloc, quick_dealloc},
    {Py_tp_call, quick_call},
    {Py_tp_doc, "Quick(stepper, template, counted, prompt, budget_ns, lock, agreement, board, "
                "guards, settle[, carry, deliver[, before[, answer]]])([flag]): a collective "
                "call of one agreed step (with a fused collective's payload and delivery, or "
                "an allocation's work after it), whole, where nothing is unusual; see the "
                "source"},
    {0, NULL},
};

static PyType_Spec quick_spec = {
    "shmemvm.native._collective.Quick", sizeof(Quick), 0, Py_TPFLAGS_DEFAULT, quick_slots,
};

/* the Quick type, added to `module`; `stepper` is the module's Stepper type */
int quick_exec(PyObject *module, PyTypeObject *stepper) {
    if (name_acquire == NULL) {   /* (immortal once interned: a second module object shares them) */
        name_acquire = PyUnicode_InternFromString("acquire");
        name_release = PyUnicode_InternFromString("release");
        name_seq = PyUnicode_InternFromString("seq");
        name_calls = PyUnicode_InternFromString("calls");
        name_sub = PyUnicode_InternFromString("_sub");
        name_entered = PyUnicode_InternFromString("_entered");
        name_carried = PyUnicode_InternFromString("carried");
        name_waiting = PyUnicode_InternFromString("_waiting");
        if (!name_acquire || !name_release || !name_seq || !name_calls || !name_sub
            || !name_entered || !name_carried || !name_waiting)
            return -1;
    }
    stepper_type = stepper;
    PyObject *quick = PyType_FromSpec(&quick_spec);
    if (quick == NULL) return -1;
    int failed = PyModule_AddObjectRef(module, "Quick", quick) < 0;
    Py_DECREF(quick);
    return failed ? -1 : 0;
}
