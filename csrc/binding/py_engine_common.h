/* py_engine_common.h: the one engine binding (binding files only).
 *
 * fastloader._C._EngineBase (py_engine_common.c) is a worker pool as a
 * Python object: its life cycle (workers joined in tp_finalize, GC,
 * weakrefs), the closed check, and every method the two kinds share:
 * wait, reset, outstanding, close(timeout=None) -> bool, worker_stats,
 * consumer_gil_wait, set_active, closed, num_workers.  Two thin subclasses
 * say what differs, and nothing else:
 *
 *   Engine        (py_engine.c)         Python datasets: a job is any object,
 *                                       fetch(worker, job) runs it with the GIL
 *   NativeEngine  (py_native_engine.c)  native datasets: a job is a batch of
 *                                       indices, built in C without the GIL
 *
 * Each subclass has its own tp_new (fl_py_engine_alloc, its state, then
 * fl_py_engine_open to start the workers) and its own submit (what a job is
 * differs), and hands the shared methods an fl_py_engine_kind: how a result
 * becomes a Python object, which per-worker counters it adds, and how its
 * state is traversed and freed.
 *
 * The kind's state (`kctx`) is everything the worker threads use.  It is
 * heap-allocated (malloc, not PyMem: workers read it without the GIL) and
 * separate from the object, so that when close() has to leave a worker
 * behind (a dataset call or a read that does not return in time, or a
 * close from one of the workers) it can be leaked with the engine instead
 * of being freed under a running thread.
 *
 * All functions here need the GIL, unless stated otherwise.
 */
#ifndef FL_PY_ENGINE_COMMON_H
#define FL_PY_ENGINE_COMMON_H

#include "binding/binding.h"
#include "core/engine.h"

/* How long the consumer spent taking the GIL back after waiting without it
 * (a direct measure of how much other threads hold it). */
typedef struct {
    uint64_t wait_ns; /* total time spent re-taking the GIL */
    uint64_t waits;   /* number of times */
} fl_gil_probe;

/* What one kind of engine adds to the shared binding.  Static tables; every
 * function is called with the GIL held. */
typedef struct {
    /* A finished job's result (owned; NULL when the run op failed) as what
     * wait() hands out: a new reference, or NULL with an exception.  Consumes
     * `result` either way.  `kctx` is the state the job ran with: still
     * valid, even if close() left workers behind meanwhile (then leaked). */
    PyObject *(*result)(void *kctx, void *result);
    /* Worker `worker`'s own counters, as a new dict that worker_stats()
     * merges after busy_s and jobs; NULL with an exception.  kctx is NULL
     * once it was leaked with detached workers: zeros then. */
    PyObject *(*worker_stats)(void *kctx, int worker);
    /* Called by reset() before the engine starts a new generation; NULL:
     * nothing to do. */
    void (*reset)(void *kctx);
    /* Visit the Python objects kctx holds (tp_traverse). */
    int (*traverse)(void *kctx, visitproc visit, void *arg);
    /* Free kctx and drop its references.  Only once no worker uses it: the
     * engine was freed with every thread joined. */
    void (*free)(void *kctx);
    /* How long tp_finalize (and tp_clear) waits for the workers, in ms
     * (< 0: no limit) before leaving them to finish detached. */
    int finalize_timeout_ms;
} fl_py_engine_kind;

/* The object, shared by every kind (their tp_basicsize). */
typedef struct {
    PyObject_HEAD
    fl_engine *engine;              /* owned; NULL before the workers started and once closed */
    const fl_py_engine_kind *kind;  /* static; set by fl_py_engine_alloc, never NULL */
    void *kctx;                     /* the kind's worker state (owned); NULL once freed, or once
                                       leaked because close() left workers running */
    int nworkers;
    int detached;                   /* 1 once a close() left workers running (kctx leaked) */
    fl_gil_probe consumer_gil;      /* GIL re-acquisition by the consumer in wait() */
    PyObject *weakreflist;
} fl_py_engine;

/* A new object of `type` (a kind's subclass) for `kind`, with no workers
 * and no state yet: the kind's tp_new then sets self->kctx and calls
 * fl_py_engine_open.  NULL with ValueError (nworkers not in 1..1024) or
 * MemoryError. */
fl_py_engine *fl_py_engine_alloc(PyTypeObject *type, int nworkers, const fl_py_engine_kind *kind);

/* Start self->nworkers threads running `ops` with `engine_ctx` (which the
 * kind keeps alive through self->kctx), the GIL released while they start
 * (their thread_start may take it).  0, or -1 with RuntimeError (no thread
 * left running); on failure the caller drops self, which frees kctx. */
int fl_py_engine_open(fl_py_engine *self, const fl_engine_ops *ops, void *engine_ctx);

/* 0 when self's workers are running, else -1 with RuntimeError("the worker
 * pool is closed").  Every method that needs the engine calls it after
 * parsing its arguments (parsing may run Python code that closes it). */
int fl_py_engine_check_open(fl_py_engine *self);

/* The pending exception as an instance carrying its traceback; clears it.
 * A new reference, never NULL (None when even that fails). */
PyObject *fl_py_take_exception(void);

/* Drop a reference to a Python object from any thread, GIL held or not (an
 * fl_engine_ops destroy op; `unused` is its ctx).  Does nothing once the
 * interpreter is finalizing: a dying interpreter is never touched, and the
 * OS reclaims the object. */
void fl_py_release_object(void *unused, void *obj);

/* The subclasses' specs, for fl_register_engine (py_engine_common.c). */
extern PyType_Spec fl_py_engine_spec;     /* py_engine.c: Engine */
extern PyType_Spec fl_native_engine_spec; /* py_native_engine.c: NativeEngine */

#endif
