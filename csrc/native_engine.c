/* native_engine.c: the worker side of native batches (see native_engine.h).
 *
 * Every callback here runs on an engine worker thread (or, for the destroy
 * ops, on whichever thread drops a job) and never touches Python: a native
 * batch is read, decoded and rendered by native.c with no GIL at all.
 */
#include "native_engine.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* One worker's stage counters as stats() sees them: the worker copies its
 * fl_native_worker totals here after each batch, and fl_native_ctx_stats
 * reads them on another thread without any lock.  Atomics, relaxed: each
 * value only has to be read whole; the five need not come from the same
 * batch. */
typedef struct {
    _Atomic uint64_t read_ns, decode_ns, render_ns, bytes_read, samples;
} native_stats;

struct fl_native_ctx {
    const fl_native_ds *ds;   /* borrowed: the binding keeps its NativeDataset alive */
    int nworkers;
    native_stats *stats;      /* nworkers entries, each written by its worker only */
};

typedef struct {
    fl_pool *pool;            /* ref owned by the job */
    uint64_t epoch, seed;
    int count;
    int64_t idx[];
} native_job;

fl_native_ctx *
fl_native_ctx_new(const fl_native_ds *ds, int nworkers)
{
    fl_native_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    ctx->stats = calloc((size_t)(nworkers > 0 ? nworkers : 1), sizeof *ctx->stats);
    if (!ctx->stats) {
        free(ctx);
        return NULL;
    }
    ctx->ds = ds;
    ctx->nworkers = nworkers;
    return ctx;
}

void
fl_native_ctx_free(fl_native_ctx *ctx)
{
    if (!ctx)
        return;
    free(ctx->stats);
    free(ctx);
}

void
fl_native_ctx_stats(const fl_native_ctx *ctx, int worker, fl_native_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!ctx || worker < 0 || worker >= ctx->nworkers)
        return;
    native_stats *s = &ctx->stats[worker];
    out->read_ns = atomic_load_explicit(&s->read_ns, memory_order_relaxed);
    out->decode_ns = atomic_load_explicit(&s->decode_ns, memory_order_relaxed);
    out->render_ns = atomic_load_explicit(&s->render_ns, memory_order_relaxed);
    out->bytes_read = atomic_load_explicit(&s->bytes_read, memory_order_relaxed);
    out->samples = atomic_load_explicit(&s->samples, memory_order_relaxed);
}

void *
fl_native_job_new(fl_pool *pool, const int64_t *idx, int count, uint64_t epoch, uint64_t seed)
{
    native_job *job = malloc(sizeof *job + sizeof(int64_t) * (size_t)(count > 0 ? count : 1));
    if (!job)
        return NULL;
    if (count > 0)
        memcpy(job->idx, idx, sizeof(int64_t) * (size_t)count);
    job->count = count > 0 ? count : 0;
    job->epoch = epoch;
    job->seed = seed;
    fl_pool_ref(pool);
    job->pool = pool;
    return job;
}

/* ---- engine ops: worker threads, never the GIL ---------------------------- */

static void *
nop_thread_start(void *vctx, int worker_id)
{
    (void)worker_id;
    fl_native_ctx *ctx = vctx;
    return fl_native_worker_new(ctx->ds);
}

static void *
nop_run(void *vctx, int worker_id, void *vws, void *payload, const atomic_int *cancelled)
{
    fl_native_ctx *ctx = vctx;
    fl_native_worker *w = vws;
    native_job *job = payload;
    fl_native_batch *b;
    if (w == NULL) {
        /* the worker's state could not be allocated (out of memory at
         * thread start): its batches fail with no event recorded */
        b = calloc(1, sizeof *b);
        if (b) {
            b->failed = 1;
            b->nevents = 0;
        }
    } else {
        b = fl_native_load_batch(w, ctx->ds, job->pool, job->idx, job->count, job->seed, job->epoch, cancelled);
        /* w's own counters are touched only by this thread; publish them */
        native_stats *s = &ctx->stats[worker_id];
        atomic_store_explicit(&s->read_ns, w->read_ns, memory_order_relaxed);
        atomic_store_explicit(&s->decode_ns, w->decode_ns, memory_order_relaxed);
        atomic_store_explicit(&s->render_ns, w->render_ns, memory_order_relaxed);
        atomic_store_explicit(&s->bytes_read, w->bytes_read, memory_order_relaxed);
        atomic_store_explicit(&s->samples, w->samples, memory_order_relaxed);
    }
    fl_pool_unref(job->pool);
    free(job);
    return b;
}

static void
nop_destroy_payload(void *vctx, void *payload)
{
    (void)vctx;
    native_job *job = payload;
    fl_pool_unref(job->pool);
    free(job);
}

static void
nop_destroy_result(void *vctx, void *result)
{
    (void)vctx;
    fl_native_batch_free(result);
}

static void
nop_thread_exit(void *vctx, int worker_id, void *vws)
{
    (void)vctx;
    (void)worker_id;
    fl_native_worker_free(vws);
}

const fl_engine_ops fl_native_ops = {
    .thread_start = nop_thread_start,
    .run = nop_run,
    .destroy_payload = nop_destroy_payload,
    .destroy_result = nop_destroy_result,
    .thread_exit = nop_thread_exit,
};
