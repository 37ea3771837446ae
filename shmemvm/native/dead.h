/* dead.c's entry point in shmemvm.native._native (dead.c says what it does). */
#ifndef SHMEMVM_NATIVE_DEAD_H
#define SHMEMVM_NATIVE_DEAD_H

#include <Python.h>

int add_dead(PyObject *module);   /* adds the DeadBlocks type */

#endif
