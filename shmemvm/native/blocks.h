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

/* for face_free.c, the engine's parts of a face's free (the engine's lock taken in
 * each): cached_live is _record_of's check where `storage` starts its block at
 * `address` (not imported memory): 1 with the block's offset and its live record
 * (new references) in *offset_out and *record_out where a live record of this
 * heap's holds `storage`, 0 where not (nothing done: the Python path then raises
 * what it raises), -1 with an error set; cached_defer is _finish_free with
 * release_now false: the record marked freed, the watches' reports applied (0,
 * or -1 with an error set) */
int cached_live(PyObject *cached, PyObject *storage, unsigned long long address,
                PyObject **offset_out, PyObject **record_out);
int cached_defer(PyObject *cached, PyObject *offset);

#endif
