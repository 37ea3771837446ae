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

#endif
