/* views.c's entry points in shmemvm.native._native (views.c says what they do). */
#ifndef SHMEMVM_NATIVE_VIEWS_H
#define SHMEMVM_NATIVE_VIEWS_H

#include <Python.h>

int add_views(PyObject *module);   /* adds the HeapMemory type */

#endif
