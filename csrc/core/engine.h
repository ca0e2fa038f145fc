/* engine.h: the worker pool (no Python in here).
 *
 * An engine owns N pthreads and a FIFO of jobs.  The consumer submits jobs
 * tagged with a sequence number (delivery order) and waits for them by
 * sequence number; workers run a caller-supplied function on each job.  The
 * engine never looks inside a job's payload or result: the caller's ops
 * table creates, runs and destroys them.
 *
 * Generations: fl_engine_reset() starts a new generation (a new epoch or a
 * new iterator over persistent workers).  Jobs of older generations that are
 * still pending are dropped, and results of older generations that finish
 * later are destroyed as soon as they arrive, so an abandoned epoch never
 * blocks the next one.
 *
 * Locking: one mutex guards the queue and the done list.  Callbacks
 * (run, destroy, thread start/exit) are never called with that mutex held,
 * so they may take the GIL without any lock-order problem.  The two values
 * read without that mutex are C11 atomics: a job's `cancelled` flag (set
 * under the mutex, polled by the running job) and the per-worker counters
 * (written by their worker, read by fl_engine_worker_stats).
 *
 * None of these functions needs the GIL; fl_engine_wait() and
 * fl_engine_free() must be called WITHOUT it when the ops take the GIL
 * (the binding releases it around them).
 */
#ifndef FL_ENGINE_H
#define FL_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct fl_engine fl_engine;

typedef struct {
    /* Called once in each worker thread when it starts, before any job.
     * Returns the thread's private state (may be NULL).  May take the GIL. */
    void *(*thread_start)(void *ctx, int worker_id);
    /* Run one job on a worker thread; returns its result (opaque, may be
     * NULL).  `cancelled` points to a flag that turns non-zero when the job's
     * generation has been abandoned; long jobs should poll it between samples
     * (a relaxed load is enough: it is only a hint to stop early, and no
     * other data is published through it). */
    void *(*run)(void *ctx, int worker_id, void *wstate, void *payload,
                 const atomic_int *cancelled);
    /* Destroy a payload that will never run, or a result that will never be
     * collected (called on any thread, without the engine lock). */
    void (*destroy_payload)(void *ctx, void *payload);
    void (*destroy_result)(void *ctx, void *result);
    /* Called once in each worker thread just before it exits. */
    void (*thread_exit)(void *ctx, int worker_id, void *wstate);
} fl_engine_ops;

/* Start `nworkers` (>= 1) threads named "fl-worker-<i>" and wait until each
 * has run thread_start (call without the GIL when thread_start takes it).  `ctx` is passed to
 * every op and must outlive the engine.  Returns NULL on failure (threads
 * already started are stopped and joined), with err filled: FL_ERR_INVALID
 * for bad arguments, FL_ERR_NOMEM, or FL_ERR_RUNTIME (with the errno) when a
 * thread cannot be created. */
fl_engine *fl_engine_new(int nworkers, const fl_engine_ops *ops, void *ctx, fl_err *err);

/* Queue a job of the current generation.  worker = -1 lets any worker take
 * it; worker >= 0 pins it to that worker (iterable datasets keep one iterator
 * per worker).  The engine owns `payload` from now on.  Returns 0, or -1 if
 * the engine is stopping or out of memory (payload is destroyed then). */
int fl_engine_submit(fl_engine *e, int64_t seq, int worker, void *payload);

enum { FL_WAIT_DONE = 0, FL_WAIT_TIMEOUT = 1, FL_WAIT_NONE = 2, FL_WAIT_CLOSED = 3 };

/* A caller that uses the engine from another thread than the one that frees
 * it (a consumer waiting while another thread closes the loader) takes a
 * hold first; fl_engine_free waits until every hold is released, and
 * fl_engine_wait returns FL_WAIT_CLOSED once freeing has started.  Take the
 * hold while the engine is known to be alive (the binding does it with the
 * GIL held, before releasing the GIL to wait). */
void fl_engine_hold(fl_engine *e);
void fl_engine_release(fl_engine *e);

/* Wait up to timeout_ms for job `seq` of the current generation (seq = -1:
 * the finished job with the lowest seq).  On FL_WAIT_DONE the caller owns
 * *result and gets the job's seq and worker in *seq_out / *worker_out.
 * FL_WAIT_NONE: no job with that seq is queued, running or done (a caller
 * bug or an empty queue for seq = -1).  FL_WAIT_CLOSED: the engine is being
 * freed (only seen by callers holding a hold).  Call without the GIL. */
int fl_engine_wait(fl_engine *e, int64_t seq, int timeout_ms, void **result,
                   int64_t *seq_out, int *worker_out);

/* Start a new generation: pending jobs are destroyed, running ones are told
 * to cancel and their results destroyed when they finish.  Returns the new
 * generation number. */
uint64_t fl_engine_reset(fl_engine *e);

/* Number of jobs of the current generation queued, running or done but not
 * collected. */
int fl_engine_outstanding(fl_engine *e);

/* Counters for stats(): per-worker busy nanoseconds and jobs run.  Copies
 * at most `n` entries; returns the number of workers.  Takes no lock: each
 * counter is read atomically, but the set is not one consistent instant
 * (a job may be counted in `jobs` and not yet in `busy_ns`). */
int fl_engine_worker_stats(fl_engine *e, uint64_t *busy_ns, uint64_t *jobs, int n);
int fl_engine_nworkers(const fl_engine *e);

/* Let only workers 0..n-1 take jobs (clamped to 1..nworkers); the others
 * park at their next job boundary until raised again.  Jobs pinned to a
 * parked worker wait for it, so callers with pinned jobs keep all active.
 * Returns the value set.  Used by num_workers="auto". */
int fl_engine_set_active(fl_engine *e, int n);

/* Stop every worker at its next job boundary (running jobs see `cancelled`),
 * join them, destroy what is left, free the engine.  NULL is ignored.  Call
 * without the GIL when the ops take it.  Returns 0, or 1 when called from one
 * of the engine's own workers: then the threads are detached instead of
 * joined and the engine and its ctx must be leaked (they still use them). */
int fl_engine_free(fl_engine *e);

/* Like fl_engine_free, but wait at most timeout_ms (< 0: no limit) for the
 * workers; threads still busy then (inside a dataset call that has not
 * returned) are detached and finish on their own, and 1 is returned: the
 * engine and its ctx must then be leaked.  Used at interpreter exit and when
 * an iterator is dropped mid-epoch, where blocking on user code is worse.
 * In a child process forked after the engine started, it touches nothing
 * and returns 1 (the child has none of the threads). */
int fl_engine_free_timed(fl_engine *e, int timeout_ms);

/* CPU time consumed by the calling thread, in nanoseconds. */
uint64_t fl_thread_cpu_ns(void);

/* Monotonic clock in nanoseconds. */
uint64_t fl_now_ns(void);

#endif
