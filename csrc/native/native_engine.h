/* native_engine.h: the engine ops that run native batches on worker threads
 * (no Python in here).
 *
 * The binding (py_native_engine.c) owns the fl_engine: it starts it with
 * fl_native_ops and a context made here, and queues batches with
 * fl_native_submit.  Each job is one batch of sample indices; each result
 * an fl_native_result.  The C work of a batch (native.c) never takes the
 * GIL.
 *
 * Post-processing.  A dataset whose batches need Python afterwards (a
 * transform tail, a target_transform, Pillow for non-JPEG files) gives the
 * context a post hook.  The worker that built a batch calls it right after
 * the C work, on the same thread, so the consumer only waits.  The hook is
 * the binding's (it takes the GIL); this file only decides when to call it:
 *   - never for a batch that failed or was cancelled (the consumer raises
 *     the failure; nobody takes a cancelled batch);
 *   - with post.always, for every other batch, in submission order: a
 *     batch's hook starts only once every batch submitted before it (since
 *     the last fl_native_reset) has finished, so Python code that draws from
 *     a shared generator (torch's) sees the batches in the same order
 *     whatever num_workers is.  FIFO queues make this deadlock-free: a job
 *     runs only after every job submitted before it was taken by a worker.
 *     A worker waiting for its turn holds no lock and no GIL and gives up
 *     when its job is cancelled;
 *   - without post.always, only for batches with fix-up events, in any
 *     order (a fix-up gives the same pixels on any thread).
 * A batch that needs no hook is never handed to Python at all.
 *
 * Counters: each worker publishes its stage totals (fl_native_worker's, plus
 * the hook's time) into the context after every batch, and
 * fl_native_ctx_stats reads them on any thread without a lock (C11 atomics,
 * see native_engine.c).
 */
#ifndef FL_NATIVE_ENGINE_H
#define FL_NATIVE_ENGINE_H

#include <stdint.h>

#include "core/engine.h"
#include "native/native.h"
#include "core/pool.h"

typedef struct fl_native_ctx fl_native_ctx;

/* What the post hook learns about the batch it finishes. */
typedef struct {
    int64_t seq;          /* as given to fl_native_submit */
    uint64_t epoch, seed;
    uint64_t native_ns;   /* wall time of the batch's C work on this worker */
} fl_native_job_info;

typedef struct {
    /* Finish batch `b` on worker `worker_id` (see the top of this file for
     * when it is called).  Returns the result the consumer gets (owned by
     * the caller, released with free_result), having consumed b; or NULL
     * when it did nothing and b is still the caller's (the interpreter is
     * shutting down).  Adds the time it waited for the GIL to *gil_wait_ns.
     * Called without any lock held. */
    void *(*run)(void *arg, int worker_id, fl_native_batch *b, const fl_native_job_info *job,
                 uint64_t *gil_wait_ns);
    /* Release a result of run() that nobody will take (any thread). */
    void (*free_result)(void *arg, void *result);
    void *arg;            /* passed to both; must outlive the context */
    int always;           /* 1: every batch, in submission order; 0: fix-up batches only */
} fl_native_post;

/* A finished job.  Exactly one of the two is set, unless the run op ran out
 * of memory (then the engine's result is NULL, not an fl_native_result). */
typedef struct {
    fl_native_batch *batch;  /* the C batch (owned), when no hook ran */
    void *post;              /* what post.run returned (owned), when it ran */
} fl_native_result;

/* The ops to hand to fl_engine_new with an fl_native_ctx.  Payloads are
 * jobs from fl_native_job_new; results are fl_native_result (malloc'ed),
 * or NULL when out of memory. */
extern const fl_engine_ops fl_native_ops;

/* A context for `nworkers` workers loading batches of `ds`, with an
 * optional post hook (copied; NULL: none).  `ds` is borrowed: it must
 * outlive the context (and the engine using it).  NULL when out of memory.
 * No GIL needed. */
fl_native_ctx *fl_native_ctx_new(const fl_native_ds *ds, int nworkers, const fl_native_post *post);

/* Free a context made by fl_native_ctx_new (NULL ok).  Only once no worker
 * uses it any more: after fl_engine_free returned 0. */
void fl_native_ctx_free(fl_native_ctx *ctx);

/* Release a result of the engine's (NULL ok): its batch, or its post
 * result through post.free_result.  No lock held; the hook's free_result
 * may take the GIL. */
void fl_native_result_free(fl_native_ctx *ctx, fl_native_result *r);

/* One worker's counters, in nanoseconds, bytes and batches. */
typedef struct {
    uint64_t read_ns, decode_ns, render_ns, bytes_read, samples;
    uint64_t post_ns;        /* inside the post hook, GIL wait excluded */
    uint64_t post_gil_ns;    /* waiting for the GIL to run the hook */
    uint64_t post_turn_ns;   /* waiting for earlier batches' hooks (post.always) */
    uint64_t post_batches;   /* batches the hook finished */
} fl_native_stats;

/* Copy worker `worker`'s counters (as of its last finished batch) to *out;
 * zeros for a worker out of range or a NULL ctx.  Any thread, no lock: each
 * value is read whole, but they need not come from the same batch. */
void fl_native_ctx_stats(const fl_native_ctx *ctx, int worker, fl_native_stats *out);

/* A job: load samples idx[0, count) of epoch `epoch` with `seed` into a
 * buffer of `pool`.  The indices are copied; the job takes its own reference
 * to `pool` (dropped when the job has run or is destroyed).  NULL when out
 * of memory (no reference taken).  No GIL needed. */
void *fl_native_job_new(fl_pool *pool, const int64_t *idx, int count, uint64_t epoch, uint64_t seed);

/* Queue `job` as batch `seq` of engine `e` (which runs ctx's ops): its place
 * in the submission order, then fl_engine_submit.  The engine owns the job
 * from here, also on failure.  Returns fl_engine_submit's result.  Any
 * thread; concurrent callers are ordered by a lock of the context. */
int fl_native_submit(fl_native_ctx *ctx, fl_engine *e, int64_t seq, void *job);

/* A new generation (call with fl_engine_reset): batches submitted from now
 * on no longer wait for the hooks of earlier ones. */
void fl_native_reset(fl_native_ctx *ctx);

#endif
