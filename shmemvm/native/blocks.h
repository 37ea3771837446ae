/* blocks.c's entry point in shmemvm.native._native (blocks.c says what it does). */
#ifndef SHMEMVM_NATIVE_BLOCKS_H
#define SHMEMVM_NATIVE_BLOCKS_H

#include <Python.h>

int add_blocks(PyObject *module);   /* adds the CachedBlocks type */

#endif
