/* py_buffer.h: making Buffer objects from C (binding files only).
 *
 * All functions need the GIL unless stated otherwise.
 */
#ifndef FL_PYBUFFER_H
#define FL_PYBUFFER_H

#include "binding/binding.h"
#include "core/copy.h"   /* fl_aligned_alloc, fl_aligned_free */
#include "core/dlpack.h"

/* Releases `data`; called from Buffer's dealloc (GIL held, but it must not
 * need it). */
typedef void (*fl_buffer_free_fn)(void *ctx, void *data);

/* Wrap `data` (nbytes, compact row-major `shape`) in a new Buffer that owns
 * it: on success the Buffer frees it with free_fn(free_ctx, data); on
 * failure (NULL returned, exception set) the caller still owns it. */
PyObject *fl_buffer_new(PyObject *module, void *data, size_t nbytes, int ndim, const int64_t *shape,
                        DLDataType dtype, DLDevice device, fl_buffer_free_fn free_fn, void *free_ctx);

/* Give a pooled buffer back (an fl_buffer_free_fn; ctx is the fl_pool):
 * GIL held; released only around freeing page-locked memory, which
 * synchronises the device (pool.h). */
void fl_py_pool_put(void *pool, void *data);

/* The pool of BatchPool `pool` for buffers of `nbytes` (a new size class
 * while its table has room), counted in its stats as _C.stack's calls are.
 * 0 with *out borrowed (valid while the caller holds `pool`; NULL: the
 * table is full, allocate outside the pool), or -1 with TypeError (not a
 * BatchPool) or MemoryError. */
struct fl_pool;
int fl_py_batchpool_for(PyObject *module, PyObject *pool, size_t nbytes, struct fl_pool **out);

/* ---- allocators: where _C.stack(items, pool=X) puts a batch ---------------
 *
 * A type that lends batch memory (BatchPool here, ShmRing in py_shmring.c)
 * registers an fl_py_allocator for its objects; stack asks it through this
 * interface only, so neither file calls the other.  A lease is taken in two
 * steps, because getting pool memory may block (cudaHostAlloc): `lend` with
 * the GIL, then `take` (if set) without it. */
typedef struct fl_py_lease {
    void *data;                   /* the memory when lent at once (NULL: see take, else none) */
    void *(*take)(void *ctx, int *pinned); /* no GIL: get it; NULL when out of memory; *pinned 1 if page-locked */
    void *take_ctx;
    fl_buffer_free_fn free_fn;    /* how the Buffer gives it back (with the GIL) */
    void *free_ctx;
} fl_py_lease;

typedef struct fl_py_allocator {
    /* GIL held.  Lend nbytes from `owner` (an object of the registered type,
     * kept alive by the caller until the Buffer is made): 0 with *lease
     * filled (all NULL: nothing to lend, stack allocates a fresh buffer),
     * or -1 with an exception set. */
    int (*lend)(PyObject *owner, size_t nbytes, fl_py_lease *lease);
} fl_py_allocator;

/* Register `ops` (static, never freed) for objects of `type` (borrowed from
 * the module state).  From a register hook; 0, or -1 with RuntimeError
 * when the table is full. */
int fl_py_register_allocator(PyObject *module, PyTypeObject *type, const fl_py_allocator *ops);

/* Mark a Buffer made by fl_buffer_new as page-locked memory (its `pinned`
 * attribute), as _C.stack does for pinned pool buffers. */
void fl_buffer_set_pinned(PyObject *buffer, int pinned);

/* ---- DLPack export (py_dlpack.c) ----------------------------------------- */

/* What a __dlpack__ call asked for.  `stream` is borrowed from the call. */
typedef struct {
    PyObject *stream;  /* as passed (Py_None when absent) */
    int versioned;     /* max_version >= (1, 0): DLManagedTensorVersioned */
} fl_dlpack_request;

/* Parse __dlpack__(*, stream, max_version, dl_device, copy) for data living
 * on `where`: dl_device must name it (else BufferError), copy=True is refused
 * with BufferError(no_copy_msg).  0, or -1 with an exception. */
int fl_dlpack_parse(PyObject *args, PyObject *kwargs, DLDevice where, const char *no_copy_msg,
                    fl_dlpack_request *req);

/* Called once when the consumer is done with an export (or the capsule dies
 * unconsumed).  Any thread, GIL held or not: it must take the GIL itself if
 * it needs it. */
typedef void (*fl_dlpack_release_fn)(void *ctx);

/* A DLPack capsule ("dltensor", or "dltensor_versioned" when versioned) for
 * compact row-major data.  On success the capsule owns one use of `ctx`:
 * release(ctx) runs exactly once, from the consumer's deleter or the
 * capsule's destructor.  On failure (NULL, exception set) release is not
 * called and the caller keeps what it would have handed over. */
PyObject *fl_dlpack_capsule(void *data, DLDevice device, int ndim, const int64_t *shape,
                            DLDataType dtype, int versioned, fl_dlpack_release_fn release, void *ctx);

/* shape[0, ndim) as a tuple of ints (a new reference, or NULL). */
PyObject *fl_shape_tuple(int ndim, const int64_t *shape);

#endif
