/* py_native.h: what py_native.c (NativeDataset) lends py_native_engine.c
 * (NativeEngine), so that the engine kind does not reach into the dataset
 * object, and its index parsing, which py_array.c's gather shares.  Binding
 * files only; every function needs the GIL.
 */
#ifndef FL_PY_NATIVE_H
#define FL_PY_NATIVE_H

#include "binding/binding.h"
#include "native/native.h"
#include "core/pool.h"

/* The C description of NativeDataset `dataset` (the caller checked its
 * type), borrowed: it lives as long as the object. */
const fl_native_ds *fl_py_native_ds(PyObject *dataset);

/* The batch buffer pool of NativeDataset `dataset`, replaced by a larger one
 * first when its buffers hold fewer than `count` samples.  Borrowed (a
 * caller that keeps it takes fl_pool_ref); NULL with MemoryError.  May
 * release the GIL (dropping the old pool), so other threads may run. */
fl_pool *fl_py_native_pool_for(PyObject *dataset, int count);

/* A sequence of ints as a malloc'd int64 array (the caller frees it), its
 * length in *count; NULL with an exception (TypeError, OverflowError,
 * MemoryError).  Runs the items' __index__: any Python code may run.  An
 * index i with -n <= i < 0 becomes i + n, counted from the end of n rows;
 * one below -n is left for the core's IndexError.  Also py_array.c's
 * (gather). */
int64_t *fl_py_parse_row_indices(PyObject *obj, int64_t n, Py_ssize_t *count);
/* The same with no index wrapped, the length as an int. */
int64_t *fl_py_parse_indices(PyObject *obj, int *count);

/* A finished batch as (images, labels, events, failed): Buffers over its
 * memory (the images' buffer goes back to its pool when the last consumer
 * drops it), the events as tuples, failed as a bool.  Consumes b, also on
 * failure (NULL with an exception; MemoryError for b == NULL).  `module`
 * is fastloader._C (borrowed), `ds` the dataset the batch is of. */
PyObject *fl_py_native_batch(PyObject *module, const fl_native_ds *ds, fl_native_batch *b);

#endif
