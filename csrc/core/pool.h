/* pool.h: a pool of equally sized batch buffers (no Python).
 *
 * Buffers are handed to consumers (as DLPack tensors) and come back when the
 * last tensor dies, possibly after the loader itself is gone, so the pool is
 * reference counted: the loader holds one reference and every buffer out of
 * the pool holds one.  At most `max_free` idle buffers are kept; the rest
 * are freed, so a consumer that keeps every batch costs memory only while it
 * keeps them.  Thread-safe; no GIL needed anywhere.
 *
 * Freeing page-locked memory (cudaFreeHost) synchronises the device and can
 * block for a long time, and buffers come back from Python's dealloc of the
 * last tensor, with the GIL held.  So a buffer is given back in two steps:
 * fl_pool_put_begin never blocks and says whether anything is left to free;
 * only then does the binding release the GIL, and only around
 * fl_pool_put_end, which does the freeing.  The common case (the pool keeps
 * the buffer) costs no GIL switch.  This is simpler than a thread that frees
 * in the background: nothing outlives the pool, and nothing is left to free
 * at exit or after fork.
 */
#ifndef FL_POOL_H
#define FL_POOL_H

#include <stddef.h>

#include "core/pin.h"

typedef struct fl_pool fl_pool;

/* New pool of `nbytes` buffers keeping at most max_free idle ones.  The
 * caller owns the returned reference.  NULL on out-of-memory. */
fl_pool *fl_pool_new(size_t nbytes, int max_free);

/* Take a buffer of the pool's size (64-byte aligned), reusing an idle one
 * when possible.  The buffer holds a pool reference until fl_pool_put.
 * NULL on out-of-memory. */
void *fl_pool_get(fl_pool *p);

/* Give a buffer back (signature fits fl_buffer_free_fn: ctx is the pool):
 * fl_pool_put_begin then, if needed, fl_pool_put_end.  May block (see
 * above): call it without locks that others wait on. */
void fl_pool_put(void *pool, void *data);

/* What fl_pool_put_begin left to fl_pool_put_end (bits). */
#define FL_POOL_FREE_BUF 1u  /* free the buffer: the pool has enough idle ones */
#define FL_POOL_FREE_POOL 2u /* it was the last reference: free the pool and its idle buffers */
#define FL_POOL_BLOCKS 4u    /* some of that memory is page-locked: freeing it may block */

/* Give `data` back without freeing anything: the pool keeps it, or the
 * returned bits say what fl_pool_put_end(p, data, todo) must free (0:
 * nothing; then do not call it).  Never blocks for long. */
unsigned fl_pool_put_begin(fl_pool *p, void *data);
/* Free what fl_pool_put_begin left; may block when todo has FL_POOL_BLOCKS.
 * Touches p only if todo has FL_POOL_FREE_POOL (otherwise another thread
 * may free the pool meanwhile). */
void fl_pool_put_end(fl_pool *p, void *data, unsigned todo);

size_t fl_pool_nbytes(const fl_pool *p);

/* Allocate future buffers page-locked for device `device` through `pinner`
 * (core/pin.h: the CUDA layer's, handed over by the binding; borrowed, it
 * must outlive the pool); -1 or a NULL pinner = ordinary memory.  Call it
 * before the first fl_pool_get.  If a pinned allocation fails the pool uses
 * ordinary memory from then on and fl_pool_pin_error returns the reason
 * (else NULL). */
void fl_pool_set_pinned(fl_pool *p, int device, const fl_pinner *pinner);
const char *fl_pool_pin_error(fl_pool *p);

/* Whether `data` (a buffer from fl_pool_get, not yet given back) is
 * page-locked: pinning may have failed for it (fl_pool_pin_error). */
int fl_pool_is_pinned(const void *data);

/* Bytes currently allocated by the pool (idle + handed out). */
size_t fl_pool_bytes_in_use(fl_pool *p);

/* Bytes of the buffers handed out and not yet returned. */
size_t fl_pool_bytes_out(fl_pool *p);

/* Take one more reference (for a queued job that will use the pool). */
void fl_pool_ref(fl_pool *p);

/* Drop the caller's reference; the pool is freed when the last buffer
 * comes back.  NULL is ignored. */
void fl_pool_unref(fl_pool *p);

#endif
