/* face_free.c's entry point in shmemvm.native._native (face_free.c says what it does). */
#ifndef SHMEMVM_NATIVE_FACE_FREE_H
#define SHMEMVM_NATIVE_FACE_FREE_H

#include <Python.h>

int add_face_free(PyObject *module);   /* adds the FaceFree type */

#endif
