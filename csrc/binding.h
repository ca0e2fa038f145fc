/* binding.h: what the binding files (the only files that include Python.h)
 * share with each other.
 *
 * Each binding file registers its own functions and types on the module from
 * module.c's exec slot through one `fl_register_*` function.  All of them run
 * with the GIL held, return 0 on success and -1 with a Python exception set.
 */
#ifndef FL_BINDING_H
#define FL_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* NumPy's C API table is shared by all binding files: module.c imports it,
 * the others declare NO_IMPORT_ARRAY before including this header. */
#define PY_ARRAY_UNIQUE_SYMBOL fastloader_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION

#if PY_VERSION_HEX >= 0x030D0000
#define FL_IS_FINALIZING() Py_IsFinalizing()
#else
#define FL_IS_FINALIZING() _Py_IsFinalizing()
#endif

/* Per-module state: heap types and exception objects (no C globals). */
typedef struct {
    PyObject *DecodeError;     /* fastloader.DecodeError, a ValueError subclass */
    PyTypeObject *EngineType;  /* fastloader._C.Engine */
    PyTypeObject *BufferType;  /* fastloader._C.Buffer */
} fl_module_state;

/* Return the module state of the fastloader._C module object `m`. */
fl_module_state *fl_get_state(PyObject *m);

/* Registration hooks, called once from module.c's exec slot. */
int fl_register_engine(PyObject *m);     /* py_engine.c: Engine */
int fl_register_buffer(PyObject *m);     /* py_buffer.c: Buffer, stack */
int fl_register_image(PyObject *m);      /* py_image.c: decode_jpeg, DecodeError helpers */
int fl_register_transform(PyObject *m);  /* py_transform.c: transform plans for tests/inspection */

#endif
