/* native_engine.h: the engine ops that run native batches on worker threads
 * (no Python in here).
 *
 * The binding (py_native.c) owns the fl_engine and starts it with
 * fl_native_ops and a context made here; each job is one batch of sample
 * indices, and each result an fl_native_batch (native.h).  The worker
 * callbacks never take the GIL.
 *
 * Per-worker stage counters: each worker copies its fl_native_worker totals
 * into the context after every batch, and fl_native_ctx_stats reads them on
 * any thread without a lock (C11 atomics, see native_engine.c).
 */
#ifndef FL_NATIVE_ENGINE_H
#define FL_NATIVE_ENGINE_H

#include <stdint.h>

#include "engine.h"
#include "native.h"
#include "pool.h"

typedef struct fl_native_ctx fl_native_ctx;

/* The ops to hand to fl_engine_new with an fl_native_ctx.  Payloads are
 * jobs from fl_native_job_new; results are fl_native_batch (the run op
 * returns NULL only when out of memory). */
extern const fl_engine_ops fl_native_ops;

/* A context for `nworkers` workers loading batches of `ds`.  `ds` is
 * borrowed: it must outlive the context (and the engine using it).  NULL
 * when out of memory.  No GIL needed. */
fl_native_ctx *fl_native_ctx_new(const fl_native_ds *ds, int nworkers);

/* Free a context made by fl_native_ctx_new (NULL ok).  Only once no worker
 * uses it any more: after fl_engine_free returned 0. */
void fl_native_ctx_free(fl_native_ctx *ctx);

/* One worker's stage counters, in nanoseconds and bytes. */
typedef struct {
    uint64_t read_ns, decode_ns, render_ns, bytes_read, samples;
} fl_native_stats;

/* Copy worker `worker`'s counters (as of its last finished batch) to *out;
 * zeros for a worker out of range.  Any thread, no lock: each value is read
 * whole, but the five need not come from the same batch. */
void fl_native_ctx_stats(const fl_native_ctx *ctx, int worker, fl_native_stats *out);

/* A job: load samples idx[0, count) of epoch `epoch` with `seed` into a
 * buffer of `pool`.  The indices are copied; the job takes its own reference
 * to `pool` (dropped when the job has run or is destroyed).  Hand it to
 * fl_engine_submit, which owns it from then on.  NULL when out of memory
 * (no reference taken).  No GIL needed. */
void *fl_native_job_new(fl_pool *pool, const int64_t *idx, int count, uint64_t epoch, uint64_t seed);

#endif
