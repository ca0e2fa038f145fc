/* py_engine.c: fastloader._C.Engine, the engine kind that drives Python
 * datasets.  Everything it shares with NativeEngine (waiting, reset, close,
 * the life cycle) is the one engine binding, py_engine_common.c; this file
 * says what a job is and what its workers do.
 *
 *   Engine(num_workers, fetch, init=None, finish=None)
 *   submit(seq, payload, worker=-1)   any object; worker >= 0 pins the job
 *   wait(...) -> (seq, worker, fetch(worker, payload))
 *
 * Each worker thread gets one Python thread state for its whole life
 * (created in thread_start with PyGILState_Ensure and parked with
 * PyEval_SaveThread), so thread-locals such as get_worker_info() persist
 * between jobs.  A worker holds the GIL only while it calls `fetch`
 * (which calls the dataset and collates; the copies inside _C.stack release
 * it again).  Waiting, queueing and joining never hold the GIL.
 *
 * Per-worker counters (GIL wait, wall and CPU time spent in Python) extend
 * worker_stats() and feed the GIL-bound warning in fastloader/stats.py.
 *
 * Workers call Python (fetch, finish) until they are joined: tp_finalize
 * joins them with no time limit (py_engine_common.c says why there).
 */
#define NO_IMPORT_ARRAY
#include "binding/py_engine_common.h"

#include <stdlib.h>

typedef struct {
    uint64_t gil_wait_ns; /* blocked in PyEval_RestoreThread */
    uint64_t py_wall_ns;  /* wall time with the GIL taken, inside fetch */
    uint64_t py_cpu_ns;   /* thread CPU time inside fetch */
    uint64_t jobs;
} py_worker_stats;

/* One worker thread's Python thread state, kept for the thread's life. */
typedef struct {
    PyThreadState *tstate;
    PyGILState_STATE gstate;
} py_wstate;

/* The kind's state (kctx), shared by the Engine object and its threads:
 * heap-allocated, so that a close that leaves threads running can leak it
 * (py_engine_common.h). */
typedef struct {
    PyObject *fetch;   /* strong refs */
    PyObject *init;
    PyObject *finish;
    int nworkers;
    py_worker_stats *stats; /* nworkers entries, each written by its worker only,
                               always with the GIL held (op_run), and read
                               with it (worker_stats): the GIL orders them */
    py_wstate *wstates;     /* nworkers entries, one per thread; allocated
                               before the threads start, so starting one
                               cannot fail half-way */
} py_ctx;

/* ---- ops (run on worker threads, GIL not held on entry) ---------------- */

/* Create this thread's Python thread state (kept until op_thread_exit, so
 * thread-locals such as get_worker_info() last between jobs) and run init. */
static void *
op_thread_start(void *vctx, int worker_id)
{
    py_ctx *ctx = vctx;
    py_wstate *ws = &ctx->wstates[worker_id];
    ws->gstate = PyGILState_Ensure();
    if (ctx->init && ctx->init != Py_None) {
        PyObject *r = PyObject_CallFunction(ctx->init, "i", worker_id);
        if (r == NULL)
            PyErr_WriteUnraisable(ctx->init); /* init reports its own errors; this is a bug */
        Py_XDECREF(r);
    }
    ws->tstate = PyEval_SaveThread();
    return ws;
}

/* Run one job: fetch(worker_id, payload) with this thread's state, the GIL
 * taken for the call only.  Returns fetch's result (a new reference; never
 * NULL: what escapes fetch becomes (1, exception)); consumes the payload. */
static void *
op_run(void *vctx, int worker_id, void *vws, void *payload, const atomic_int *cancelled)
{
    py_ctx *ctx = vctx;
    py_wstate *ws = vws;
    (void)cancelled; /* Python jobs poll their own cancel flag between samples */
    py_worker_stats *st = &ctx->stats[worker_id];
    uint64_t t0 = fl_now_ns();
    PyEval_RestoreThread(ws->tstate);
    uint64_t t1 = fl_now_ns();
    uint64_t c1 = fl_thread_cpu_ns();
    PyObject *r = PyObject_CallFunction(ctx->fetch, "iO", worker_id, (PyObject *)payload);
    if (r == NULL) {
        /* fetch catches dataset errors itself; anything escaping is passed
         * to the consumer as (1, exception) all the same. */
        PyObject *exc = fl_py_take_exception();
        r = Py_BuildValue("(iO)", 1, exc);
        Py_DECREF(exc);
        if (r == NULL) {
            PyErr_Clear();
            r = Py_NewRef(Py_None);
        }
    }
    Py_DECREF((PyObject *)payload);
    uint64_t c2 = fl_thread_cpu_ns();
    uint64_t t2 = fl_now_ns();
    st->gil_wait_ns += t1 - t0;
    st->py_wall_ns += t2 - t1;
    st->py_cpu_ns += c2 - c1;
    st->jobs++;
    PyEval_SaveThread();
    return r;
}

/* Run finish(worker_id) and drop this thread's Python thread state. */
static void
op_thread_exit(void *vctx, int worker_id, void *vws)
{
    py_ctx *ctx = vctx;
    py_wstate *ws = vws;
    PyEval_RestoreThread(ws->tstate);
    if (ctx->finish && ctx->finish != Py_None) {
        PyObject *r = PyObject_CallFunction(ctx->finish, "i", worker_id);
        if (r == NULL)
            PyErr_WriteUnraisable(ctx->finish);
        Py_XDECREF(r);
    }
    PyGILState_Release(ws->gstate);
}

static const fl_engine_ops py_ops = {
    .thread_start = op_thread_start,
    .run = op_run,
    .destroy_payload = fl_py_release_object,
    .destroy_result = fl_py_release_object,
    .thread_exit = op_thread_exit,
};

/* ---- the kind (GIL held) --------------------------------------------------- */

/* Free the state (NULL ok) and drop its references; only once no worker
 * uses it. */
static void
kind_free(void *kctx)
{
    py_ctx *ctx = kctx;
    if (!ctx)
        return;
    Py_CLEAR(ctx->fetch);
    Py_CLEAR(ctx->init);
    Py_CLEAR(ctx->finish);
    free(ctx->stats);
    free(ctx->wstates);
    free(ctx);
}

/* A job's result is fetch's return value: the reference passes on. */
static PyObject *
kind_result(void *kctx, void *result)
{
    (void)kctx;
    if (result == NULL) /* op_run always returns an object */
        return PyErr_Format(PyExc_RuntimeError, "a job came back without a result (this is a bug)");
    return (PyObject *)result;
}

/* gil_wait_s, python_s, python_cpu_s: read with the GIL, which orders them
 * after the worker's writes (op_run writes them holding it). */
static PyObject *
kind_worker_stats(void *kctx, int worker)
{
    py_ctx *ctx = kctx;
    py_worker_stats s = {0, 0, 0, 0};
    if (ctx)
        s = ctx->stats[worker];
    return Py_BuildValue("{s:d,s:d,s:d}", "gil_wait_s", (double)s.gil_wait_ns * 1e-9, "python_s",
                         (double)s.py_wall_ns * 1e-9, "python_cpu_s", (double)s.py_cpu_ns * 1e-9);
}

static int
kind_traverse(void *kctx, visitproc visit, void *arg)
{
    py_ctx *ctx = kctx;
    Py_VISIT(ctx->fetch);
    Py_VISIT(ctx->init);
    Py_VISIT(ctx->finish);
    return 0;
}

static const fl_py_engine_kind py_kind = {
    .result = kind_result,
    .worker_stats = kind_worker_stats,
    .reset = NULL,
    .traverse = kind_traverse,
    .free = kind_free,
    /* the workers stop at their next job; one inside a dataset call is
     * waited for (the loader closes with a timeout before it gets here) */
    .finalize_timeout_ms = -1,
};

/* ---- Engine -------------------------------------------------------------------- */

static PyObject *
engine_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"num_workers", "fetch", "init", "finish", NULL};
    int n;
    PyObject *fetch, *init = Py_None, *finish = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO|OO:Engine", kwlist, &n, &fetch, &init, &finish))
        return NULL;
    if (!PyCallable_Check(fetch))
        return PyErr_Format(PyExc_TypeError, "fetch must be callable");
    fl_py_engine *self = fl_py_engine_alloc(type, n, &py_kind);
    if (!self)
        return NULL;
    /* malloc, not PyMem: worker threads read it without the GIL */
    py_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx || !(ctx->stats = calloc((size_t)n, sizeof *ctx->stats)) ||
        !(ctx->wstates = calloc((size_t)n, sizeof *ctx->wstates))) {
        kind_free(ctx);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    ctx->fetch = Py_NewRef(fetch);
    ctx->init = Py_NewRef(init);
    ctx->finish = Py_NewRef(finish);
    ctx->nworkers = n;
    self->kctx = ctx;
    if (fl_py_engine_open(self, &py_ops, ctx) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* submit(seq, payload, worker=-1): queue a job; the engine keeps a
 * reference to payload until it has run or is dropped. */
static PyObject *
engine_submit(fl_py_engine *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"seq", "payload", "worker", NULL};
    long long seq;
    PyObject *payload;
    int worker = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LO|i:submit", kwlist, &seq, &payload, &worker))
        return NULL;
    if (fl_py_engine_check_open(self) < 0)
        return NULL;
    if (worker < -1 || worker >= self->nworkers)
        return PyErr_Format(PyExc_ValueError, "worker %d out of range", worker);
    Py_INCREF(payload); /* owned by the job from here (released by fl_py_release_object) */
    if (fl_engine_submit(self->engine, seq, worker, payload) < 0)
        return PyErr_Format(PyExc_RuntimeError, "could not queue batch %lld", seq);
    Py_RETURN_NONE;
}

static PyMethodDef engine_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))engine_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(seq, payload, worker=-1): queue a job; worker pins it to one thread."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_new, engine_new},
    {Py_tp_methods, engine_methods},
    {Py_tp_doc, "Engine(num_workers, fetch, init=None, finish=None): worker threads that run\n"
                "fetch(worker, payload) for each submitted payload, with the GIL; wait() hands out what it\n"
                "returned.  worker_stats() adds gil_wait_s, python_s and python_cpu_s."},
    {0, NULL},
};

/* A subclass of _EngineBase (fl_register_engine), which gives it every
 * other slot. */
PyType_Spec fl_py_engine_spec = {
    .name = "fastloader._C.Engine",
    .basicsize = sizeof(fl_py_engine),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, /* GC: inherited, with traverse and clear */
    .slots = engine_slots,
};
