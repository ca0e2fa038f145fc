/* engine.c: worker pool, job queue, in-order hand-off (see engine.h).
 *
 * Design notes
 * - Jobs live in one singly linked list per state: `pending` (FIFO) and
 *   `done`.  Windows are small (prefetch_factor x num_workers jobs), so a
 *   linear scan to find a job by seq or a pinned job is cheaper than any index.
 * - A running job is referenced only by its worker; when it finishes the
 *   worker re-takes the lock and either appends it to `done` (current
 *   generation) or destroys it outside the lock (abandoned generation).
 * - Every exit path of a worker wakes the waiters, so a consumer never
 *   sleeps on a job that nobody will finish.
 */
#include "core/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct fl_job {
    struct fl_job *next;
    uint64_t gen;       /* generation it belongs to */
    int64_t seq;        /* delivery order within the generation */
    int worker;         /* pinned worker, or -1 */
    int ran_on;         /* worker that ran it */
    void *payload;      /* owned by the job until run; destroyed via ops */
    void *result;       /* owned by the job once done, until collected */
    atomic_int cancelled; /* set under mu, polled by run() without it */
} fl_job;

typedef struct {
    fl_engine *e;
    int id;
    pthread_t thread;
    int started;
    /* Written only by this worker, read by fl_engine_worker_stats on any
     * thread without the lock: atomics, relaxed because a reader only needs
     * each value whole, not ordered with anything else. */
    _Atomic uint64_t busy_ns;
    _Atomic uint64_t jobs;
    fl_job *current;    /* job being run (guarded by mu), for cancellation */
} fl_worker;

struct fl_engine {
    pid_t pid;                /* the process that started the workers (see fl_engine_free_timed) */
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* workers wait here for jobs */
    pthread_cond_t done_cv;   /* the consumer waits here for results */
    fl_job *pending_head, *pending_tail;
    fl_job *done_head;
    int nrunning_cur;         /* running jobs of the current generation */
    uint64_t gen;
    int stopping;
    int nready;               /* workers past thread_start */
    int nactive;              /* workers with id >= nactive take no jobs (autotune) */
    int holds;                /* callers inside fl_engine_hold/release (e.g. waiting):
                                 fl_engine_free waits for them before freeing */
    int nworkers;
    fl_worker *workers;
    fl_engine_ops ops;
    void *ctx;
};

uint64_t
fl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t
fl_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The CLOCK_REALTIME instant timeout_ms from now (for timed waits/joins). */
static void
deadline_in(int timeout_ms, struct timespec *ts)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Take the first pending job this worker may run.  Caller holds mu. */
static fl_job *
take_job_locked(fl_engine *e, int worker_id)
{
    if (worker_id >= e->nactive)
        return NULL; /* parked by fl_engine_set_active */
    fl_job *prev = NULL;
    for (fl_job *j = e->pending_head; j; prev = j, j = j->next) {
        if (j->worker >= 0 && j->worker != worker_id)
            continue;
        if (prev)
            prev->next = j->next;
        else
            e->pending_head = j->next;
        if (e->pending_tail == j)
            e->pending_tail = prev;
        j->next = NULL;
        return j;
    }
    return NULL;
}

static void
destroy_job(fl_engine *e, fl_job *j)
{
    if (j->payload && e->ops.destroy_payload)
        e->ops.destroy_payload(e->ctx, j->payload);
    if (j->result && e->ops.destroy_result)
        e->ops.destroy_result(e->ctx, j->result);
    free(j);
}

/* Destroy a detached list of jobs (no lock held: callbacks may take the GIL). */
static void
destroy_jobs(fl_engine *e, fl_job *j)
{
    while (j) {
        fl_job *n = j->next;
        destroy_job(e, j);
        j = n;
    }
}

static void *
worker_main(void *arg)
{
    fl_worker *w = (fl_worker *)arg;
    fl_engine *e = w->e;
    char name[32];
    snprintf(name, sizeof name, "fl-worker-%d", w->id % 100000);
    name[15] = '\0';
    pthread_setname_np(pthread_self(), name);

    void *wstate = e->ops.thread_start ? e->ops.thread_start(e->ctx, w->id) : NULL;

    pthread_mutex_lock(&e->mu);
    e->nready++;
    pthread_cond_broadcast(&e->done_cv);
    for (;;) {
        fl_job *j = NULL;
        while (!e->stopping && (j = take_job_locked(e, w->id)) == NULL)
            pthread_cond_wait(&e->work_cv, &e->mu);
        if (e->stopping) {
            if (j) { /* put it back so fl_engine_free destroys it */
                j->next = e->pending_head;
                e->pending_head = j;
                if (!e->pending_tail)
                    e->pending_tail = j;
            }
            break;
        }
        if (j->gen != e->gen) {
            /* left over from an abandoned generation: never run it */
            pthread_mutex_unlock(&e->mu);
            destroy_job(e, j);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        e->nrunning_cur++;
        w->current = j;
        pthread_mutex_unlock(&e->mu);

        uint64_t t0 = fl_now_ns();
        void *payload = j->payload;
        j->payload = NULL;  /* ownership passes to run() */
        j->result = e->ops.run(e->ctx, w->id, wstate, payload, &j->cancelled);
        j->ran_on = w->id;
        atomic_fetch_add_explicit(&w->busy_ns, fl_now_ns() - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->jobs, 1, memory_order_relaxed);

        pthread_mutex_lock(&e->mu);
        w->current = NULL;
        if (j->gen == e->gen) {
            e->nrunning_cur--;
            j->next = e->done_head;
            e->done_head = j;
            pthread_cond_broadcast(&e->done_cv);
        } else {
            /* abandoned generation (reset already zeroed nrunning_cur):
             * destroy the result outside the lock */
            pthread_mutex_unlock(&e->mu);
            destroy_job(e, j);
            pthread_mutex_lock(&e->mu);
        }
    }
    pthread_mutex_unlock(&e->mu);
    if (e->ops.thread_exit)
        e->ops.thread_exit(e->ctx, w->id, wstate);
    /* wake a consumer that might wait on a job only this worker could run */
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

fl_engine *
fl_engine_new(int nworkers, const fl_engine_ops *ops, void *ctx, fl_err *err)
{
    if (nworkers < 1 || !ops || !ops->run) {
        fl_err_set(err, FL_ERR_INVALID, 0, "could not start worker threads: invalid engine arguments (nworkers=%d)",
                   nworkers);
        return NULL;
    }
    fl_engine *e = calloc(1, sizeof *e);
    if (e)
        e->pid = getpid();
    if (!e) {
        fl_err_set(err, FL_ERR_NOMEM, 0, "out of memory for a pool of %d worker threads", nworkers);
        return NULL;
    }
    e->workers = calloc((size_t)nworkers, sizeof *e->workers);
    if (!e->workers) {
        free(e);
        fl_err_set(err, FL_ERR_NOMEM, 0, "out of memory for a pool of %d worker threads", nworkers);
        return NULL;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    e->ops = *ops;
    e->ctx = ctx;
    e->nworkers = nworkers;
    e->nactive = nworkers;
    for (int i = 0; i < nworkers; i++) {
        fl_worker *w = &e->workers[i];
        w->e = e;
        w->id = i;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            fl_err_set(err, FL_ERR_RUNTIME, rc, "could not start worker threads: pthread_create failed for worker %d: %s",
                       i, strerror(rc));
            fl_engine_free(e);
            return NULL;
        }
        w->started = 1;
        /* name it from here too, so it carries its name before it first runs */
        char name[32];
        snprintf(name, sizeof name, "fl-worker-%d", i % 100000);
        name[15] = '\0'; /* the kernel's limit */
        pthread_setname_np(w->thread, name);
    }
    /* Wait until every worker has run thread_start (worker_init_fn), as
     * torch's workers are initialised before they load anything. */
    pthread_mutex_lock(&e->mu);
    while (e->nready < nworkers)
        pthread_cond_wait(&e->done_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return e;
}

int
fl_engine_submit(fl_engine *e, int64_t seq, int worker, void *payload)
{
    fl_job *j = calloc(1, sizeof *j);
    if (!j) {
        if (payload && e->ops.destroy_payload)
            e->ops.destroy_payload(e->ctx, payload);
        return -1;
    }
    j->seq = seq;
    j->worker = worker;
    j->payload = payload;
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        destroy_job(e, j);
        return -1;
    }
    j->gen = e->gen;
    if (e->pending_tail)
        e->pending_tail->next = j;
    else
        e->pending_head = j;
    e->pending_tail = j;
    /* a pinned job must reach its worker, and a signal could wake a parked
     * worker that cannot take the job: wake everyone then */
    if (worker >= 0 || e->nactive < e->nworkers)
        pthread_cond_broadcast(&e->work_cv);
    else
        pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* Find (and unlink) a done job of the current generation.  Caller holds mu. */
static fl_job *
take_done_locked(fl_engine *e, int64_t seq)
{
    fl_job *best = NULL, *best_prev = NULL, *prev = NULL;
    for (fl_job *j = e->done_head; j; prev = j, j = j->next) {
        if (seq >= 0 ? j->seq == seq : (!best || j->seq < best->seq)) {
            best = j;
            best_prev = prev;
            if (seq >= 0)
                break;
        }
    }
    if (best) {
        if (best_prev)
            best_prev->next = best->next;
        else
            e->done_head = best->next;
    }
    return best;
}

static int
exists_locked(fl_engine *e, int64_t seq)
{
    for (fl_job *j = e->pending_head; j; j = j->next)
        if (j->gen == e->gen && (seq < 0 || j->seq == seq))
            return 1;
    for (int i = 0; i < e->nworkers; i++) {
        fl_job *j = e->workers[i].current;
        if (j && j->gen == e->gen && (seq < 0 || j->seq == seq))
            return 1;
    }
    return 0;
}

int
fl_engine_wait(fl_engine *e, int64_t seq, int timeout_ms, void **result,
               int64_t *seq_out, int *worker_out)
{
    struct timespec deadline;
    deadline_in(timeout_ms, &deadline);
    int rc = FL_WAIT_TIMEOUT, timed_out = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (e->stopping) {
            rc = FL_WAIT_CLOSED;
            break;
        }
        fl_job *j = take_done_locked(e, seq);
        if (j) {
            *result = j->result;
            if (seq_out)
                *seq_out = j->seq;
            if (worker_out)
                *worker_out = j->ran_on;
            free(j);
            rc = FL_WAIT_DONE;
            break;
        }
        if (timed_out)
            break; /* one last look above after the deadline, then FL_WAIT_TIMEOUT */
        if (!exists_locked(e, seq)) {
            rc = FL_WAIT_NONE;
            break;
        }
        if (pthread_cond_timedwait(&e->done_cv, &e->mu, &deadline) == ETIMEDOUT)
            timed_out = 1;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

uint64_t
fl_engine_reset(fl_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->gen++;
    uint64_t gen = e->gen;
    fl_job *pending = e->pending_head, *done = e->done_head;
    e->pending_head = e->pending_tail = NULL;
    e->done_head = NULL;
    e->nrunning_cur = 0;
    for (int i = 0; i < e->nworkers; i++)
        if (e->workers[i].current)
            atomic_store_explicit(&e->workers[i].current->cancelled, 1, memory_order_relaxed);
    pthread_mutex_unlock(&e->mu);
    destroy_jobs(e, pending);
    destroy_jobs(e, done);
    return gen;
}

int
fl_engine_outstanding(fl_engine *e)
{
    int n = 0;
    pthread_mutex_lock(&e->mu);
    for (fl_job *j = e->pending_head; j; j = j->next)
        n += j->gen == e->gen;
    for (fl_job *j = e->done_head; j; j = j->next)
        n++;
    n += e->nrunning_cur;
    pthread_mutex_unlock(&e->mu);
    return n;
}

void
fl_engine_hold(fl_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->holds++;
    pthread_mutex_unlock(&e->mu);
}

void
fl_engine_release(fl_engine *e)
{
    pthread_mutex_lock(&e->mu);
    if (--e->holds == 0)
        pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
}

int
fl_engine_set_active(fl_engine *e, int n)
{
    if (n < 1)
        n = 1;
    if (n > e->nworkers)
        n = e->nworkers;
    pthread_mutex_lock(&e->mu);
    e->nactive = n;
    pthread_cond_broadcast(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    return n;
}

int
fl_engine_nworkers(const fl_engine *e)
{
    return e->nworkers;
}

int
fl_engine_worker_stats(fl_engine *e, uint64_t *busy_ns, uint64_t *jobs, int n)
{
    for (int i = 0; i < e->nworkers && i < n; i++) {
        busy_ns[i] = atomic_load_explicit(&e->workers[i].busy_ns, memory_order_relaxed);
        jobs[i] = atomic_load_explicit(&e->workers[i].jobs, memory_order_relaxed);
    }
    return e->nworkers;
}

int
fl_engine_free(fl_engine *e)
{
    return fl_engine_free_timed(e, -1);
}

int
fl_engine_free_timed(fl_engine *e, int timeout_ms)
{
    if (!e)
        return 0;
    /* In a child forked from the process that started the workers, the
     * threads do not exist and the mutex may have been copied locked:
     * touch nothing, and have the caller leak the engine and its ctx. */
    if (getpid() != e->pid)
        return 1;
    pthread_t self = pthread_self();
    int on_worker = 0;
    for (int i = 0; i < e->nworkers; i++)
        if (e->workers[i].started && pthread_equal(e->workers[i].thread, self))
            on_worker = 1;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    for (int i = 0; i < e->nworkers; i++)
        if (e->workers[i].current)
            atomic_store_explicit(&e->workers[i].current->cancelled, 1, memory_order_relaxed);
    pthread_cond_broadcast(&e->work_cv);
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
    if (on_worker) {
        /* A worker cannot join itself.  The threads stop at their next job
         * boundary and exit detached; the engine (a few hundred bytes) is
         * deliberately leaked because they still reference it. */
        for (int i = 0; i < e->nworkers; i++)
            if (e->workers[i].started)
                pthread_detach(e->workers[i].thread);
        return 1;
    }
    struct timespec deadline;
    if (timeout_ms >= 0)
        deadline_in(timeout_ms, &deadline);
    int stragglers = 0;
    for (int i = 0; i < e->nworkers; i++) {
        if (!e->workers[i].started)
            continue;
        if (timeout_ms < 0) {
            pthread_join(e->workers[i].thread, NULL);
            continue;
        }
        if (pthread_timedjoin_np(e->workers[i].thread, NULL, &deadline) == 0)
            continue;
        /* still inside user code (a dataset call that does not return):
         * let it finish on its own; it exits at its next job boundary */
        pthread_detach(e->workers[i].thread);
        stragglers++;
    }
    if (stragglers) {
        /* The engine stays allocated for the detached threads.  Free what no
         * thread will touch again: queued and finished jobs (their payloads
         * and results hold user objects); the stragglers' own jobs belong to
         * a dead generation now, so they destroy those when they finish. */
        pthread_mutex_lock(&e->mu);
        e->gen++;
        fl_job *pending = e->pending_head, *done = e->done_head;
        e->pending_head = e->pending_tail = NULL;
        e->done_head = NULL;
        pthread_mutex_unlock(&e->mu);
        destroy_jobs(e, pending);
        destroy_jobs(e, done);
        return 1;
    }
    /* callers still inside wait()/reset() on other threads: they see
     * `stopping` and leave; free only after the last one has */
    pthread_mutex_lock(&e->mu);
    while (e->holds > 0)
        pthread_cond_wait(&e->done_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    /* all threads are gone: no lock needed from here */
    destroy_jobs(e, e->pending_head);
    destroy_jobs(e, e->done_head);
    pthread_cond_destroy(&e->work_cv);
    pthread_cond_destroy(&e->done_cv);
    pthread_mutex_destroy(&e->mu);
    free(e->workers);
    free(e);
    return 0;
}
