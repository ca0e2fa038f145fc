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

#include "core/engine.h"
#include "core/err.h"

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
    PyTypeObject *EngineBaseType; /* fastloader._C._EngineBase, what the two engines share */
    PyTypeObject *EngineType;  /* fastloader._C.Engine */
    PyTypeObject *BufferType;  /* fastloader._C.Buffer */
    PyTypeObject *BatchPoolType; /* fastloader._C.BatchPool */
    PyTypeObject *NativeDatasetType;  /* fastloader._C.NativeDataset */
    PyTypeObject *NativeEngineType;   /* fastloader._C.NativeEngine */
    PyTypeObject *DeviceCopierType;   /* fastloader._C.DeviceCopier */
    PyTypeObject *DeviceTensorType;   /* fastloader._C.DeviceTensor */
    PyTypeObject *SourceType;         /* fastloader._C.Source */
    PyTypeObject *LMDBWriterType;     /* fastloader._C.LMDBWriter */
    PyTypeObject *ShmRingType;        /* fastloader._C.ShmRing */
    /* What _C.stack(items, pool=X) may allocate from: each type that lends
     * batch memory registers its allocator (fl_py_register_allocator,
     * py_buffer.h), so stack checks no type by name.  Types borrowed from
     * the fields above. */
    struct fl_py_allocator_entry {
        PyTypeObject *type;
        const struct fl_py_allocator *ops;
    } allocators[4];
    int nallocators;
} fl_module_state;

/* The module state of the fastloader._C module object `m` (borrowed).  Static
 * inline, as CPython's own modules keep theirs: every binding file reads the
 * state, and a function in module.c would make module.c and each of them call
 * one another. */
static inline fl_module_state *
fl_get_state(PyObject *m)
{
    return (fl_module_state *)PyModule_GetState(m);
}

/* Registration hooks, called once from module.c's exec slot. */
int fl_register_engine(PyObject *m);     /* py_engine_common.c: _EngineBase, Engine, NativeEngine */
int fl_register_buffer(PyObject *m);     /* py_buffer.c: Buffer, BatchPool, stack */
int fl_register_image(PyObject *m);      /* py_image.c: decode_jpeg, DecodeError helpers */
int fl_register_transform(PyObject *m);  /* py_transform.c: transform plans for tests/inspection */
int fl_register_augment(PyObject *m);    /* py_augment.c: _augment_op, the augmentation ops for tests */
int fl_register_mix(PyObject *m);        /* py_mix.c: _mix_batch, _timm_mix_batch (MixUp / CutMix on a batch) */

int fl_register_native(PyObject *m);   /* py_native.c: NativeDataset */
int fl_register_native_call(PyObject *m);  /* py_native_call.c: NativeCall (the native call of a custom dataset) */
int fl_register_source(PyObject *m);   /* py_source.c: Source, file_source */
int fl_register_shards(PyObject *m);   /* py_shards.c: shard_source, shards_* (tar shards as a stream source) */
int fl_register_array(PyObject *m);    /* py_array.c: array_source, gather */
int fl_register_lmdb(PyObject *m);     /* py_lmdb.c: lmdb_source, lmdb_get, LMDBWriter */
int fl_register_arrow(PyObject *m);    /* py_arrow.c: arrow_source (Arrow image columns, Hugging Face datasets) */
int fl_register_shmring(PyObject *m);  /* py_shmring.c: ShmRing (process workers' shared-memory batch slots) */

/* py_source.c.  fl_py_source_wrap: a new Source owning the reference `src`
 * (consumed, also on failure; NULL src -> MemoryError), or NULL with an
 * exception.  fl_py_source_get: the core source of a Source object
 * (borrowed), or NULL (no exception set) when obj is not a Source.  GIL. */
struct fl_source;
PyObject *fl_py_source_wrap(PyObject *module, struct fl_source *src);
struct fl_source *fl_py_source_get(PyObject *module, PyObject *obj);
int fl_register_errors(PyObject *m);   /* py_errors.c: _error and the ERR_* codes */
int fl_register_stream(PyObject *m);   /* py_stream.c: _stream_read, _tar_samples (tests of stream.c, tar.c) */

/* The one translator from a core error record (code FL_ERR_*, errno, message)
 * to a Python exception (py_errors.c; the table of types is at its top).
 * `filename` (borrowed, may be NULL) becomes OSError.filename; `where` (may
 * be NULL) is appended to the message.  GIL held.
 * fl_py_error_new returns a new exception instance, or NULL with an
 * exception set; fl_py_raise sets it as the current exception and always
 * returns NULL. */
PyObject *fl_py_error_new(PyObject *module, int code, int errnum, const char *msg, PyObject *filename,
                          const char *where);
PyObject *fl_py_raise(PyObject *module, const fl_err *err, PyObject *filename, const char *where);

int fl_register_cuda(PyObject *m);     /* py_cuda.c: cuda_info, cuda_require (CUDA loaded with dlopen) */
int fl_register_devcopy(PyObject *m);  /* py_devcopy.c: DeviceCopier, DeviceTensor */

/* Load libcudart if needed and check that `device` can be used: 0, or -1
 * with a RuntimeError saying whether the library, the driver or the device
 * is missing (py_cuda.c, the same checks as _C.cuda_require). */
int fl_py_cuda_require(PyObject *module, int device);

#endif
