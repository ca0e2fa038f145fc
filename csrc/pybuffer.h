/* pybuffer.h: making Buffer objects from C (binding files only).
 *
 * All functions need the GIL unless stated otherwise.
 */
#ifndef FL_PYBUFFER_H
#define FL_PYBUFFER_H

#include "binding.h"
#include "dlpack.h"

/* Releases `data`; called from Buffer's dealloc (GIL held, but it must not
 * need it). */
typedef void (*fl_buffer_free_fn)(void *ctx, void *data);

/* Wrap `data` (nbytes, compact row-major `shape`) in a new Buffer that owns
 * it: on success the Buffer frees it with free_fn(free_ctx, data); on
 * failure (NULL returned, exception set) the caller still owns it. */
PyObject *fl_buffer_new(PyObject *module, void *data, size_t nbytes, int ndim, const int64_t *shape,
                        DLDataType dtype, DLDevice device, fl_buffer_free_fn free_fn, void *free_ctx);

/* 64-byte aligned malloc / free; safe without the GIL.  NULL on failure. */
void *fl_aligned_alloc(size_t nbytes);
void fl_aligned_free(void *ctx, void *data);

#endif
