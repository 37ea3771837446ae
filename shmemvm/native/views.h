/* views.c's entry points in shmemvm.native._native (views.c says what they do). */
#ifndef SHMEMVM_NATIVE_VIEWS_H
#define SHMEMVM_NATIVE_VIEWS_H

#include <Python.h>

int add_views(PyObject *module);   /* adds the HeapMemory type */

/* for face_free.c: where `obj` is a HeapMemory (that type, not a subclass's), 1
 * with its tensor (borrowed) and address; else 0 */
int heap_memory_parts(PyObject *obj, PyObject **tensor, unsigned long long *address);

#endif
