/* blocks.c's entry point in shmemvm.native._native (blocks.c says what it does). */
#ifndef SHMEMVM_NATIVE_BLOCKS_H
#define SHMEMVM_NATIVE_BLOCKS_H

#include <Python.h>

int add_blocks(PyObject *module);   /* adds the CachedBlocks type */

/* for dead.c: whether `obj` is a CachedBlocks; its take_dead() (a new list, or
 * NULL with an error set); its release of a small block (1 done, 0 not that
 * case and nothing done, -1 an error set) */
int is_cached_blocks(PyObject *obj);
PyObject *cached_take_dead(PyObject *cached);
int cached_release(PyObject *cached, PyObject *offset);

/* for face_free.c, the engine's halves of a free of a face's own tensor (the
 * engine's lock taken in each): cached_retire_own is _retire's check of `tensor`
 * (its bytes at `address`) where its storage starts its block: 1 and the block's
 * offset (a new reference) in *offset_out where a live record of this heap's
 * holds tensor's storage, 0 where not (nothing done: the Python path then
 * raises what it raises), -1 with an error set; cached_defer is
 * _finish_free(release_now=False): the record marked freed, the watches'
 * reports applied (0, or -1 with an error set) */
int cached_retire_own(PyObject *cached, PyObject *tensor, unsigned long long address,
                      PyObject **offset_out);
int cached_defer(PyObject *cached, PyObject *offset);

#endif
