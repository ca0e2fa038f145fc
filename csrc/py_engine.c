/* py_engine.c: fastloader._C.Engine, the worker pool driving Python
 * datasets.
 *
 *   Engine(num_workers, fetch, init=None, finish=None)
 *
 * Each worker thread gets one Python thread state for its whole life
 * (created in thread_start with PyGILState_Ensure and parked with
 * PyEval_SaveThread), so thread-locals such as get_worker_info() persist
 * between jobs.  A worker holds the GIL only while it calls `fetch`
 * (which calls the dataset and collates; the copies inside _C.stack release
 * it again).  Waiting, queueing and joining never hold the GIL.
 *
 * Per-worker counters (GIL wait, wall and CPU time spent in Python) feed
 * stats() and the GIL-bound warning in fastloader/loader.py.
 *
 * Shutting down: the workers call Python (fetch, finish), so they are joined
 * in tp_finalize, not tp_clear.  The garbage collector finalizes every object
 * of a dead cycle before it clears any of them (PEP 442); by tp_clear, other
 * objects of the cycle may already be cleared, and a worker calling into
 * them then (a function without its globals) would crash.
 */
#define NO_IMPORT_ARRAY
#include "binding.h"
#include "engine.h"

#include <structmember.h>

#include <stdlib.h>
#include <string.h>

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

/* Shared by the Engine object and its threads.  Heap-allocated (not the
 * object itself) so a deferred close (fl_engine_free returning 1) can leak
 * it safely while detached threads still run. */
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

typedef struct {
    PyObject_HEAD
    fl_engine *engine;  /* NULL once closed */
    py_ctx *ctx;        /* owned; NULL once freed */
    int nworkers;
    fl_gil_probe consumer_gil; /* GIL re-acquisition by the consumer in wait() */
    PyObject *weakreflist;
} EngineObject;

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
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb && value)
            PyException_SetTraceback(value, tb);
        r = Py_BuildValue("(iO)", 1, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
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

static void
op_destroy(void *vctx, void *obj)
{
    (void)vctx;
    if (FL_IS_FINALIZING())
        return; /* never touch a dying interpreter; the OS reclaims it */
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF((PyObject *)obj);
    PyGILState_Release(g);
}

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
    .destroy_payload = op_destroy,
    .destroy_result = op_destroy,
    .thread_exit = op_thread_exit,
};

/* ---- helpers shared with py_native.c (declared in binding.h) ------------ */

fl_engine *
fl_py_engine_start(int nworkers, const fl_engine_ops *ops, void *ctx)
{
    char msg[256] = "";
    fl_engine *e;
    Py_BEGIN_ALLOW_THREADS
    e = fl_engine_new(nworkers, ops, ctx, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (!e)
        PyErr_Format(PyExc_RuntimeError, "could not start worker threads: %s", msg);
    return e;
}

int
fl_py_engine_stop(fl_engine **pe, int timeout_ms)
{
    fl_engine *e = *pe;
    if (e == NULL)
        return 0;
    *pe = NULL;
    int deferred;
    Py_BEGIN_ALLOW_THREADS
    deferred = fl_engine_free_timed(e, timeout_ms);
    Py_END_ALLOW_THREADS
    return deferred;
}

int
fl_py_timeout(PyObject *obj, double *out)
{
    *out = -1.0;
    if (obj == Py_None)
        return 0;
    *out = PyFloat_AsDouble(obj);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* ---- helpers -------------------------------------------------------------- */

static void
ctx_free(py_ctx *ctx)
{
    if (!ctx)
        return;
    Py_CLEAR(ctx->fetch);
    Py_CLEAR(ctx->init);
    Py_CLEAR(ctx->finish);
    free(ctx->stats);
    free(ctx->wstates);
    free(ctx);
}

/* Stop and join the workers (GIL released while joining).  Idempotent. */
static void
engine_close(EngineObject *self, int timeout_ms)
{
    if (fl_py_engine_stop(&self->engine, timeout_ms)) {
        /* closed from one of its own workers, or workers still busy in
         * user code after the timeout: those threads still use ctx */
        self->ctx = NULL;
        return;
    }
}

static int
check_open(EngineObject *self)
{
    if (self->engine == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the worker pool is closed");
        return -1;
    }
    return 0;
}

/* ---- methods ---------------------------------------------------------------- */

static PyObject *
engine_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"num_workers", "fetch", "init", "finish", NULL};
    int n;
    PyObject *fetch, *init = Py_None, *finish = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO|OO:Engine", kwlist, &n, &fetch, &init, &finish))
        return NULL;
    if (n < 1 || n > 1024)
        return PyErr_Format(PyExc_ValueError, "num_workers must be in 1..1024, got %d", n);
    if (!PyCallable_Check(fetch))
        return PyErr_Format(PyExc_TypeError, "fetch must be callable");
    EngineObject *self = (EngineObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    py_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx || !(ctx->stats = calloc((size_t)n, sizeof *ctx->stats)) ||
        !(ctx->wstates = calloc((size_t)n, sizeof *ctx->wstates))) {
        if (ctx)
            free(ctx->stats);
        free(ctx);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    ctx->fetch = Py_NewRef(fetch);
    ctx->init = Py_NewRef(init);
    ctx->finish = Py_NewRef(finish);
    ctx->nworkers = n;
    self->ctx = ctx;
    self->nworkers = n;
    self->engine = fl_py_engine_start(n, &py_ops, ctx);
    if (!self->engine) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
engine_submit(EngineObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"seq", "payload", "worker", NULL};
    long long seq;
    PyObject *payload;
    int worker = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LO|i:submit", kwlist, &seq, &payload, &worker))
        return NULL;
    if (check_open(self) < 0)
        return NULL;
    if (worker < -1 || worker >= self->nworkers)
        return PyErr_Format(PyExc_ValueError, "worker %d out of range", worker);
    Py_INCREF(payload); /* owned by the job from here (destroyed via op_destroy) */
    if (fl_engine_submit(self->engine, seq, worker, payload) < 0)
        return PyErr_Format(PyExc_RuntimeError, "could not queue batch %lld", seq);
    Py_RETURN_NONE;
}

int
fl_py_wait(fl_engine *const *engine, long long seq, double timeout, void **result, int64_t *seq_out,
           int *worker_out, fl_gil_probe *gil)
{
    uint64_t start = fl_now_ns();
    for (;;) {
        int slice_ms = 50;
        if (timeout > 0) {
            double left = timeout - (double)(fl_now_ns() - start) * 1e-9;
            if (left <= 0)
                return 0;
            if (left * 1000.0 < slice_ms)
                slice_ms = (int)(left * 1000.0) + 1;
        }
        fl_engine *e = *engine;
        if (e == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "the worker pool was closed while waiting");
            return -1;
        }
        int rc;
        fl_engine_hold(e); /* another thread may close the pool while we wait */
        PyThreadState *ts = PyEval_SaveThread();
        rc = fl_engine_wait(e, seq, slice_ms, result, seq_out, worker_out);
        uint64_t t0 = fl_now_ns();
        PyEval_RestoreThread(ts);
        fl_engine_release(e); /* e may be freed from here on if rc is CLOSED */
        if (rc == FL_WAIT_CLOSED) {
            PyErr_SetString(PyExc_RuntimeError, "the worker pool was closed while waiting");
            return -1;
        }
        if (gil) {
            /* how long taking the GIL back took: ~the switch interval when
             * worker threads run pure Python, ~0 when their work releases it */
            gil->wait_ns += fl_now_ns() - t0;
            gil->waits++;
        }
        if (rc == FL_WAIT_DONE)
            return 1;
        if (rc == FL_WAIT_NONE) {
            PyErr_Format(PyExc_LookupError, "no batch %lld is queued or running", seq);
            return -1;
        }
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

/* wait(seq, timeout=None) -> (seq, worker, result) | None on timeout
 * seq = -1 takes the earliest finished job. */
static PyObject *
engine_wait(EngineObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"seq", "timeout", NULL};
    long long seq;
    PyObject *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|O:wait", kwlist, &seq, &timeout_obj))
        return NULL;
    double timeout;
    if (fl_py_timeout(timeout_obj, &timeout) < 0 || check_open(self) < 0)
        return NULL;
    void *res = NULL;
    int64_t got_seq = -1;
    int worker = -1;
    int rc = fl_py_wait(&self->engine, seq, timeout, &res, &got_seq, &worker, &self->consumer_gil);
    if (rc < 0)
        return NULL;
    if (rc == 0)
        Py_RETURN_NONE;
    PyObject *r = (PyObject *)res;
    PyObject *out = Py_BuildValue("(LiO)", (long long)got_seq, worker, r);
    Py_DECREF(r);
    return out;
}

static PyObject *
engine_reset(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
    if (check_open(self) < 0)
        return NULL;
    uint64_t gen;
    fl_engine *e = self->engine;
    /* destroying dropped payloads takes the GIL through op_destroy: it is
     * re-entrant for this thread, so keep it */
    gen = fl_engine_reset(e);
    return PyLong_FromUnsignedLongLong(gen);
}

static PyObject *
engine_outstanding(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
    if (check_open(self) < 0)
        return NULL;
    return PyLong_FromLong(fl_engine_outstanding(self->engine));
}

/* close(timeout=None): stop and join the workers; with a timeout, workers
 * still inside a dataset call after `timeout` seconds are left to finish on
 * their own (detached).  Returns True when every thread was joined. */
static PyObject *
engine_close_meth(EngineObject *self, PyObject *args)
{
    PyObject *timeout_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|O:close", &timeout_obj))
        return NULL;
    int ms = -1;
    if (timeout_obj != Py_None) {
        double t = PyFloat_AsDouble(timeout_obj);
        if (t == -1.0 && PyErr_Occurred())
            return NULL;
        ms = t < 0 ? 0 : (int)(t * 1000.0);
    }
    engine_close(self, ms);
    return PyBool_FromLong(self->ctx != NULL);
}

/* worker_stats() -> list of dicts, one per worker */
static PyObject *
engine_worker_stats(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
    int n = self->nworkers;
    uint64_t busy[1024], jobs[1024];
    memset(busy, 0, sizeof busy);
    memset(jobs, 0, sizeof jobs);
    if (self->engine)
        fl_engine_worker_stats(self->engine, busy, jobs, n);
    PyObject *list = PyList_New(n);
    if (!list)
        return NULL;
    for (int i = 0; i < n; i++) {
        py_worker_stats s = {0, 0, 0, 0};
        if (self->ctx)
            s = self->ctx->stats[i];
        PyObject *d = Py_BuildValue("{s:d,s:K,s:d,s:d,s:d}", "busy_s", (double)busy[i] * 1e-9, "jobs",
                                    (unsigned long long)jobs[i], "gil_wait_s", (double)s.gil_wait_ns * 1e-9,
                                    "python_s", (double)s.py_wall_ns * 1e-9, "python_cpu_s",
                                    (double)s.py_cpu_ns * 1e-9);
        if (!d) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, d);
    }
    return list;
}

/* consumer_gil_wait() -> (seconds, count): time wait() spent taking the GIL back */
static PyObject *
engine_consumer_gil_wait(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(dK)", self->consumer_gil.wait_ns * 1e-9, (unsigned long long)self->consumer_gil.waits);
}

static PyObject *
engine_get_closed(EngineObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->engine == NULL);
}

static PyObject *
engine_get_num_workers(EngineObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->nworkers);
}

static int
engine_traverse(EngineObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    if (self->ctx) {
        Py_VISIT(self->ctx->fetch);
        Py_VISIT(self->ctx->init);
        Py_VISIT(self->ctx->finish);
    }
    return 0;
}

/* tp_finalize: stop and join the workers while everything they may call is
 * intact (see the top of this file).  GIL held; released while joining. */
static void
engine_finalize(EngineObject *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    engine_close(self, -1);
    PyErr_Restore(type, value, tb);
}

static int
engine_clear(EngineObject *self)
{
    /* already closed by engine_finalize, which the GC and engine_dealloc
     * run first; kept so that no path drops the references under running
     * workers */
    engine_close(self, -1);
    if (self->ctx) {
        ctx_free(self->ctx);
        self->ctx = NULL;
    }
    return 0;
}

static void
engine_dealloc(EngineObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return; /* resurrected while the workers were joined */
    PyObject_GC_UnTrack(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    engine_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* set_active(n) -> int: let only workers 0..n-1 take jobs (autotune). */
static PyObject *
engine_set_active(EngineObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (check_open(self) < 0)
        return NULL;
    return PyLong_FromLong(fl_engine_set_active(self->engine, (int)n));
}

static PyMethodDef engine_methods[] = {
    {"set_active", (PyCFunction)engine_set_active, METH_O, "set_active(n) -> int: workers 0..n-1 take jobs"},
    {"submit", (PyCFunction)(void (*)(void))engine_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(seq, payload, worker=-1): queue a job; worker pins it to one thread."},
    {"wait", (PyCFunction)(void (*)(void))engine_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(seq, timeout=None) -> (seq, worker, result) or None on timeout."},
    {"reset", (PyCFunction)engine_reset, METH_NOARGS, "Start a new generation, dropping queued jobs."},
    {"outstanding", (PyCFunction)engine_outstanding, METH_NOARGS, "Jobs queued, running or not yet collected."},
    {"close", (PyCFunction)engine_close_meth, METH_VARARGS,
     "close(timeout=None) -> bool: stop the workers and join them (True when all were joined)."},
    {"worker_stats", (PyCFunction)engine_worker_stats, METH_NOARGS, "Per-worker counters."},
    {"consumer_gil_wait", (PyCFunction)engine_consumer_gil_wait, METH_NOARGS,
     "(seconds, count) the consumer spent re-taking the GIL after waiting"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef engine_getset[] = {
    {"closed", (getter)engine_get_closed, NULL, "True once close() has run", NULL},
    {"num_workers", (getter)engine_get_num_workers, NULL, "number of worker threads", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef engine_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(EngineObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_new, engine_new},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_finalize, engine_finalize},
    {Py_tp_traverse, engine_traverse},
    {Py_tp_clear, engine_clear},
    {Py_tp_methods, engine_methods},
    {Py_tp_getset, engine_getset},
    {Py_tp_members, engine_members},
    {Py_tp_doc, "Engine(num_workers, fetch, init=None, finish=None): a pool of worker threads."},
    {0, NULL},
};

static PyType_Spec engine_spec = {
    .name = "fastloader._C.Engine",
    .basicsize = sizeof(EngineObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = engine_slots,
};

int
fl_register_engine(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    st->EngineType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &engine_spec, NULL);
    if (!st->EngineType)
        return -1;
    return PyModule_AddType(m, st->EngineType);
}
