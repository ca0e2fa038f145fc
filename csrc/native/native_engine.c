/* native_engine.c: the worker side of native batches (see native_engine.h).
 *
 * Every callback here runs on an engine worker thread (or, for the destroy
 * ops, on whichever thread drops a job) and never touches Python itself: a
 * native batch is read, decoded and rendered by native.c with no GIL at all,
 * and only the binding's post hook, when a batch needs it, takes the GIL.
 *
 * Submission order (post.always).  fl_native_submit gives each job a ticket
 * 0, 1, 2, ... in the order jobs enter the engine's FIFO.
 * A ticket is "done" when its job has finished (run returned) or was
 * destroyed unrun (dropped by a reset, a failed submit or the engine's
 * free); each happens exactly once.  A job's hook waits until every ticket
 * from its generation's floor (the first ticket after the last
 * fl_native_reset) up to its own is done.  `done` is a window of flags for
 * tickets [low, next): low is the oldest ticket not done yet, and the window
 * slides as the oldest finish.  Waiters wake on `turn_cv`, and at least
 * every FL_TURN_POLL_MS to notice that their own job was cancelled (nobody
 * signals that: the engine only sets the flag).
 */
#include "native/native_engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FL_TURN_POLL_MS 20

/* One worker's counters as stats() sees them: the worker copies its totals
 * here after each batch, and fl_native_ctx_stats reads them on another
 * thread without any lock.  Atomics, relaxed: each value only has to be read
 * whole; they need not come from the same batch. */
typedef struct {
    _Atomic uint64_t read_ns, decode_ns, render_ns, bytes_read, samples;
    _Atomic uint64_t post_ns, post_gil_ns, post_turn_ns, post_batches;
} native_stats;

struct fl_native_ctx {
    const fl_native_ds *ds;   /* borrowed: the binding keeps its NativeDataset alive */
    int nworkers;
    native_stats *stats;      /* nworkers entries, each written by its worker only */
    fl_native_post post;      /* post.run NULL: no hook */
    /* submission order: submit_mu makes a ticket and a FIFO place one step
     * (held around fl_engine_submit); order_mu guards the fields below.
     * Lock order: submit_mu, then order_mu; never the other way round. */
    pthread_mutex_t submit_mu;
    pthread_mutex_t order_mu;
    pthread_cond_t turn_cv;   /* a ticket became done, or a reset happened */
    uint64_t next;            /* the next ticket to give */
    uint64_t floor;           /* first ticket of the current generation */
    uint64_t low;             /* oldest ticket not done; done[0] is its flag */
    unsigned char *done;      /* flags of tickets [low, next), malloc'ed */
    size_t cap;               /* entries allocated in done */
};

typedef struct {
    fl_pool *pool;            /* ref owned by the job */
    uint64_t epoch, seed;
    int64_t seq;
    uint64_t ticket, floor;   /* set by fl_native_submit */
    int ticketed;             /* 1 once fl_native_submit gave it a ticket */
    int count;
    int64_t idx[];
} native_job;

/* Per-thread state: the C worker and the counters it adds to. */
typedef struct {
    fl_native_worker *w;      /* NULL when it could not be allocated */
    uint64_t post_ns, post_gil_ns, post_turn_ns, post_batches;
} native_wstate;

fl_native_ctx *
fl_native_ctx_new(const fl_native_ds *ds, int nworkers, const fl_native_post *post)
{
    fl_native_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    ctx->stats = calloc((size_t)(nworkers > 0 ? nworkers : 1), sizeof *ctx->stats);
    ctx->cap = 64;
    ctx->done = calloc(ctx->cap, 1);
    if (!ctx->stats || !ctx->done)
        goto fail;
    if (pthread_mutex_init(&ctx->submit_mu, NULL) != 0)
        goto fail;
    if (pthread_mutex_init(&ctx->order_mu, NULL) != 0)
        goto fail_submit;
    if (pthread_cond_init(&ctx->turn_cv, NULL) != 0)
        goto fail_order;
    ctx->ds = ds;
    ctx->nworkers = nworkers;
    if (post)
        ctx->post = *post;
    return ctx;
fail_order:
    pthread_mutex_destroy(&ctx->order_mu);
fail_submit:
    pthread_mutex_destroy(&ctx->submit_mu);
fail:
    free(ctx->stats);
    free(ctx->done);
    free(ctx);
    return NULL;
}

void
fl_native_ctx_free(fl_native_ctx *ctx)
{
    if (!ctx)
        return;
    pthread_cond_destroy(&ctx->turn_cv);
    pthread_mutex_destroy(&ctx->order_mu);
    pthread_mutex_destroy(&ctx->submit_mu);
    free(ctx->done);
    free(ctx->stats);
    free(ctx);
}

void
fl_native_result_free(fl_native_ctx *ctx, fl_native_result *r)
{
    if (!r)
        return;
    if (r->post && ctx && ctx->post.free_result)
        ctx->post.free_result(ctx->post.arg, r->post);
    fl_native_batch_free(r->batch);
    free(r);
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
    out->post_ns = atomic_load_explicit(&s->post_ns, memory_order_relaxed);
    out->post_gil_ns = atomic_load_explicit(&s->post_gil_ns, memory_order_relaxed);
    out->post_turn_ns = atomic_load_explicit(&s->post_turn_ns, memory_order_relaxed);
    out->post_batches = atomic_load_explicit(&s->post_batches, memory_order_relaxed);
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
    job->seq = -1;
    job->ticket = job->floor = 0;
    job->ticketed = 0;
    fl_pool_ref(pool);
    job->pool = pool;
    return job;
}

/* ---- submission order ------------------------------------------------------- */

/* Mark `ticket` done and slide the window past the oldest done tickets.
 * Takes order_mu. */
static void
ticket_done(fl_native_ctx *ctx, uint64_t ticket)
{
    pthread_mutex_lock(&ctx->order_mu);
    if (ticket >= ctx->low && ticket < ctx->next) {
        ctx->done[ticket - ctx->low] = 1;
        size_t k = 0, n = (size_t)(ctx->next - ctx->low);
        while (k < n && ctx->done[k])
            k++;
        if (k) {
            memmove(ctx->done, ctx->done + k, n - k);
            memset(ctx->done + (n - k), 0, k);
            ctx->low += k;
        }
        pthread_cond_broadcast(&ctx->turn_cv);
    }
    pthread_mutex_unlock(&ctx->order_mu);
}

/* Every ticket in [from, to) done?  Caller holds order_mu. */
static int
all_done_locked(const fl_native_ctx *ctx, uint64_t from, uint64_t to)
{
    if (from < ctx->low)
        from = ctx->low;
    for (uint64_t t = from; t < to; t++)
        if (!ctx->done[t - ctx->low])
            return 0;
    return 1;
}

/* Wait until the tickets before `job`'s, from its generation's floor, are
 * done.  Returns 0 when it is the job's turn, -1 when the job was cancelled
 * meanwhile (or a reset made the wait pointless). */
static int
wait_turn(fl_native_ctx *ctx, const native_job *job, const atomic_int *cancelled)
{
    int rc = 0;
    pthread_mutex_lock(&ctx->order_mu);
    while (!all_done_locked(ctx, job->floor, job->ticket)) {
        if ((cancelled && atomic_load_explicit(cancelled, memory_order_relaxed)) || ctx->floor > job->ticket) {
            rc = -1;
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += FL_TURN_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        int e = pthread_cond_timedwait(&ctx->turn_cv, &ctx->order_mu, &ts);
        (void)e; /* ETIMEDOUT: poll the cancel flag */
    }
    pthread_mutex_unlock(&ctx->order_mu);
    return rc;
}

int
fl_native_submit(fl_native_ctx *ctx, fl_engine *e, int64_t seq, void *vjob)
{
    native_job *job = vjob;
    job->seq = seq;
    /* The ticket and the FIFO place must agree: submit_mu covers both.  A
     * failed fl_engine_submit destroys the job on this thread
     * (nop_destroy_payload), which marks its ticket done under order_mu: so
     * order_mu is not held across the call. */
    pthread_mutex_lock(&ctx->submit_mu);
    pthread_mutex_lock(&ctx->order_mu);
    int room = 1;
    if ((size_t)(ctx->next - ctx->low) == ctx->cap) {
        unsigned char *d = realloc(ctx->done, ctx->cap * 2);
        if (d) {
            memset(d + ctx->cap, 0, ctx->cap);
            ctx->done = d;
            ctx->cap *= 2;
        } else {
            room = 0;
        }
    }
    if (room) {
        job->ticket = ctx->next++;
        job->floor = ctx->floor;
        job->ticketed = 1;
    }
    pthread_mutex_unlock(&ctx->order_mu);
    int rc;
    if (room) {
        rc = fl_engine_submit(e, seq, -1, job); /* owns the job from here, also on failure */
    } else {
        fl_native_ops.destroy_payload(ctx, job);
        rc = -1;
    }
    pthread_mutex_unlock(&ctx->submit_mu);
    return rc;
}

void
fl_native_reset(fl_native_ctx *ctx)
{
    pthread_mutex_lock(&ctx->order_mu);
    ctx->floor = ctx->next;
    pthread_cond_broadcast(&ctx->turn_cv);
    pthread_mutex_unlock(&ctx->order_mu);
}

/* ---- engine ops: worker threads ----------------------------------------------- */

static void *
nop_thread_start(void *vctx, int worker_id)
{
    (void)worker_id;
    fl_native_ctx *ctx = vctx;
    native_wstate *ws = calloc(1, sizeof *ws);
    if (ws)
        ws->w = fl_native_worker_new(ctx->ds);
    return ws;
}

static int
has_fixups(const fl_native_batch *b)
{
    for (int i = 0; i < b->nevents; i++)
        if (b->event_kind[i] == FL_EV_FIXUP)
            return 1;
    return 0;
}

/* Publish this worker's totals for fl_native_ctx_stats. */
static void
publish_stats(fl_native_ctx *ctx, int worker_id, const native_wstate *ws)
{
    native_stats *s = &ctx->stats[worker_id];
    const fl_native_worker *w = ws->w;
    atomic_store_explicit(&s->read_ns, w->read_ns, memory_order_relaxed);
    atomic_store_explicit(&s->decode_ns, w->decode_ns, memory_order_relaxed);
    atomic_store_explicit(&s->render_ns, w->render_ns, memory_order_relaxed);
    atomic_store_explicit(&s->bytes_read, w->bytes_read, memory_order_relaxed);
    atomic_store_explicit(&s->samples, w->samples, memory_order_relaxed);
    atomic_store_explicit(&s->post_ns, ws->post_ns, memory_order_relaxed);
    atomic_store_explicit(&s->post_gil_ns, ws->post_gil_ns, memory_order_relaxed);
    atomic_store_explicit(&s->post_turn_ns, ws->post_turn_ns, memory_order_relaxed);
    atomic_store_explicit(&s->post_batches, ws->post_batches, memory_order_relaxed);
}

static void *
nop_run(void *vctx, int worker_id, void *vws, void *payload, const atomic_int *cancelled)
{
    fl_native_ctx *ctx = vctx;
    native_wstate *ws = vws;
    native_job *job = payload;
    fl_native_batch *b;
    void *post = NULL;
    if (ws == NULL || ws->w == NULL) {
        /* the worker's state could not be allocated (out of memory at
         * thread start): its batches fail with no event recorded */
        b = calloc(1, sizeof *b);
        if (b)
            b->failed = 1;
    } else {
        uint64_t t0 = fl_now_ns();
        b = fl_native_load_batch(ws->w, ctx->ds, job->pool, job->idx, job->count, job->seed, job->epoch,
                                 cancelled);
        uint64_t t1 = fl_now_ns();
        int stop = cancelled && atomic_load_explicit(cancelled, memory_order_relaxed);
        if (b && ctx->post.run && !b->failed && !b->cancelled && !stop && (ctx->post.always || has_fixups(b))) {
            if (!ctx->post.always || wait_turn(ctx, job, cancelled) == 0) {
                uint64_t t2 = fl_now_ns(), gil = 0;
                fl_native_job_info info = {job->seq, job->epoch, job->seed, t1 - t0};
                post = ctx->post.run(ctx->post.arg, worker_id, b, &info, &gil);
                if (post) {
                    b = NULL; /* consumed by the hook */
                    uint64_t spent = fl_now_ns() - t2;
                    ws->post_turn_ns += t2 - t1;
                    ws->post_gil_ns += gil;
                    ws->post_ns += spent > gil ? spent - gil : 0;
                    ws->post_batches++;
                }
            }
        }
        publish_stats(ctx, worker_id, ws);
    }
    uint64_t ticket = job->ticket;
    int ticketed = job->ticketed;
    fl_pool_unref(job->pool);
    free(job);
    fl_native_result *r = NULL;
    if (b || post) {
        r = malloc(sizeof *r);
        if (r) {
            r->batch = b;
            r->post = post;
        } else {
            fl_native_batch_free(b);
            if (post && ctx->post.free_result)
                ctx->post.free_result(ctx->post.arg, post);
        }
    }
    /* after the hook: the next batch's hook may start */
    if (ticketed)
        ticket_done(ctx, ticket);
    return r;
}

static void
nop_destroy_payload(void *vctx, void *payload)
{
    fl_native_ctx *ctx = vctx;
    native_job *job = payload;
    uint64_t ticket = job->ticket;
    int ticketed = job->ticketed;
    fl_pool_unref(job->pool);
    free(job);
    if (ticketed)
        ticket_done(ctx, ticket);
}

static void
nop_destroy_result(void *vctx, void *result)
{
    fl_native_result_free(vctx, result);
}

static void
nop_thread_exit(void *vctx, int worker_id, void *vws)
{
    (void)vctx;
    (void)worker_id;
    native_wstate *ws = vws;
    if (ws) {
        fl_native_worker_free(ws->w);
        free(ws);
    }
}

const fl_engine_ops fl_native_ops = {
    .thread_start = nop_thread_start,
    .run = nop_run,
    .destroy_payload = nop_destroy_payload,
    .destroy_result = nop_destroy_result,
    .thread_exit = nop_thread_exit,
};
