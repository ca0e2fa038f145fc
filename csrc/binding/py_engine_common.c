/* py_engine_common.c: fastloader._C._EngineBase, the one engine binding:
 * what Engine (py_engine.c) and NativeEngine (py_native_engine.c) share.
 * py_engine_common.h says how a kind plugs in.
 *
 *   wait(seq, timeout=None) -> (seq, worker, result) | None on timeout
 *   reset() -> generation      outstanding() -> int
 *   close(timeout=None) -> bool (True when every worker was joined)
 *   worker_stats() -> [dict]   consumer_gil_wait() -> (seconds, count)
 *   set_active(n) -> int       closed, num_workers
 *
 * GIL: the methods hold it, except while they wait for the workers: wait()
 * (in slices, fl_py_wait), reset() (dropping queued jobs may take it again
 * on this thread, through the kind's destroy op), close() and the join in
 * tp_finalize; starting the workers releases it too (their thread_start may
 * take it).  A method that still uses the engine after releasing the GIL
 * takes a hold on it first (fl_engine_hold), so that a close() on another
 * thread meanwhile waits for it instead of freeing the engine under it.
 *
 * Shutting down: workers may call Python (fetch, init and finish, the
 * native post hook), so they are joined in tp_finalize, not tp_clear.  The
 * garbage collector finalizes every object of a dead cycle before it clears
 * any of them (PEP 442); by tp_clear, other objects of the cycle may already
 * be cleared, and a worker calling into them then (a function without its
 * globals) would crash.  Workers still busy after the kind's timeout finish
 * detached, and the kind's state is leaked for them.
 */
#define NO_IMPORT_ARRAY
#include "binding/py_engine_common.h"

#include <structmember.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define FL_PY_MAX_WORKERS 1024
#define FL_PY_WAIT_SLICE_MS 50 /* longest wait without a signal check */

/* ---- helpers shared with the kinds (py_engine_common.h) ------------------ */

fl_py_engine *
fl_py_engine_alloc(PyTypeObject *type, int nworkers, const fl_py_engine_kind *kind)
{
    if (nworkers < 1 || nworkers > FL_PY_MAX_WORKERS)
        return (fl_py_engine *)PyErr_Format(PyExc_ValueError, "num_workers must be in 1..%d, got %d",
                                            FL_PY_MAX_WORKERS, nworkers);
    fl_py_engine *self = (fl_py_engine *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->kind = kind;
    self->nworkers = nworkers;
    return self;
}

int
fl_py_engine_open(fl_py_engine *self, const fl_engine_ops *ops, void *engine_ctx)
{
    fl_err err = {0};
    fl_engine *e;
    int n = self->nworkers;
    Py_BEGIN_ALLOW_THREADS
    e = fl_engine_new(n, ops, engine_ctx, &err);
    Py_END_ALLOW_THREADS
    if (!e) {
        fl_py_raise(PyType_GetModule(Py_TYPE(self)), &err, NULL, NULL);
        return -1;
    }
    self->engine = e;
    return 0;
}

int
fl_py_engine_check_open(fl_py_engine *self)
{
    if (self->engine == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the worker pool is closed");
        return -1;
    }
    return 0;
}

PyObject *
fl_py_take_exception(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value ? value : Py_NewRef(Py_None);
}

void
fl_py_release_object(void *unused, void *obj)
{
    (void)unused;
    if (FL_IS_FINALIZING())
        return; /* never touch a dying interpreter; the OS reclaims it */
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF((PyObject *)obj);
    PyGILState_Release(g);
}

/* ---- static helpers ------------------------------------------------------ */

/* Parse a timeout in seconds: None -> -1.0 (no limit).  0, or -1 with an
 * exception. */
static int
parse_timeout(PyObject *obj, double *out)
{
    *out = -1.0;
    if (obj == Py_None)
        return 0;
    *out = PyFloat_AsDouble(obj);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* Stop the workers and join them, waiting at most timeout_ms (< 0: no
 * limit) with the GIL released.  Workers still busy then (inside a dataset
 * call, a hung read, or the caller itself when it is one of the workers)
 * are left to finish detached, and self->kctx is leaked for them.
 * Idempotent.  Returns 1 when no worker was ever left behind, else 0. */
static int
engine_close(fl_py_engine *self, int timeout_ms)
{
    fl_engine *e = self->engine;
    if (e != NULL) {
        self->engine = NULL; /* before the GIL goes: other threads see it closed */
        int deferred;
        Py_BEGIN_ALLOW_THREADS
        deferred = fl_engine_free_timed(e, timeout_ms);
        Py_END_ALLOW_THREADS
        if (deferred) {
            self->kctx = NULL; /* leaked on purpose: detached threads still use it */
            self->detached = 1;
        }
    }
    return !self->detached;
}

/* Wait for job `seq` of *engine (see fl_engine_wait) with the GIL released,
 * in slices of at most 50 ms, running PyErr_CheckSignals after each so that
 * Ctrl-C works.  timeout <= 0 waits forever.  Returns 1 when the job is done
 * (the caller owns *result; its seq and worker filled), 0 on timeout, -1 with
 * an exception set (a signal handler raised, the pool was closed, no such
 * job).  Reads *engine after every slice because a signal handler (or
 * another thread) may close it; holds it while the GIL is released.  Adds
 * the time taken to re-acquire the GIL after each slice to *gil. */
static int
fl_py_wait(fl_engine *const *engine, long long seq, double timeout, void **result, int64_t *seq_out,
           int *worker_out, fl_gil_probe *gil)
{
    uint64_t start = fl_now_ns();
    for (;;) {
        int slice_ms = FL_PY_WAIT_SLICE_MS;
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
        /* how long taking the GIL back took: ~the switch interval when
         * worker threads run pure Python, ~0 when their work releases it */
        gil->wait_ns += fl_now_ns() - t0;
        gil->waits++;
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

/* ---- methods -------------------------------------------------------------- */

/* wait(seq, timeout=None) -> (seq, worker, result) | None on timeout;
 * seq = -1 takes the earliest finished job.  The kind turns the result
 * into a Python object. */
static PyObject *
engine_wait(fl_py_engine *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"seq", "timeout", NULL};
    long long seq;
    PyObject *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|O:wait", kwlist, &seq, &timeout_obj))
        return NULL;
    double timeout;
    if (parse_timeout(timeout_obj, &timeout) < 0 || fl_py_engine_check_open(self) < 0)
        return NULL;
    /* the job's state: a close() while we wait may leak it, never free it
     * (only tp_clear does, and self is alive while this method runs) */
    void *kctx = self->kctx;
    void *res = NULL;
    int64_t got_seq = -1;
    int worker = -1;
    int rc = fl_py_wait(&self->engine, seq, timeout, &res, &got_seq, &worker, &self->consumer_gil);
    if (rc < 0)
        return NULL;
    if (rc == 0)
        Py_RETURN_NONE;
    PyObject *r = self->kind->result(kctx, res); /* consumes res */
    if (!r)
        return NULL;
    PyObject *out = Py_BuildValue("(LiO)", (long long)got_seq, worker, r);
    Py_DECREF(r);
    return out;
}

/* reset() -> int: a new generation; queued jobs are dropped, running ones
 * told to stop, and their results dropped when they finish. */
static PyObject *
engine_reset(fl_py_engine *self, PyObject *Py_UNUSED(ignored))
{
    if (fl_py_engine_check_open(self) < 0)
        return NULL;
    fl_engine *e = self->engine;
    if (self->kind->reset)
        self->kind->reset(self->kctx); /* first: jobs queued after this belong to the new generation */
    uint64_t gen;
    fl_engine_hold(e); /* a close() from another thread waits for us */
    Py_BEGIN_ALLOW_THREADS
    gen = fl_engine_reset(e); /* dropped payloads and results take the GIL to be released */
    Py_END_ALLOW_THREADS
    fl_engine_release(e);
    return PyLong_FromUnsignedLongLong(gen);
}

static PyObject *
engine_outstanding(fl_py_engine *self, PyObject *Py_UNUSED(ignored))
{
    if (fl_py_engine_check_open(self) < 0)
        return NULL;
    return PyLong_FromLong(fl_engine_outstanding(self->engine));
}

/* close(timeout=None) -> bool: stop and join the workers; with a timeout,
 * workers still busy after `timeout` seconds (inside a dataset call, a read
 * of a hung file system) are left to finish on their own, detached.  True
 * when every thread was joined (also when already closed, unless an earlier
 * close left some behind). */
static PyObject *
engine_close_meth(fl_py_engine *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:close", kwlist, &timeout_obj))
        return NULL;
    double t;
    if (parse_timeout(timeout_obj, &t) < 0)
        return NULL;
    int ms = -1;
    if (timeout_obj != Py_None) /* negative or NaN: do not wait; clamped to what an int holds */
        ms = !(t > 0) ? 0 : t * 1000.0 >= (double)INT_MAX ? INT_MAX : (int)(t * 1000.0);
    return PyBool_FromLong(engine_close(self, ms));
}

/* worker_stats() -> list of dicts, one per worker: busy_s and jobs, then
 * the kind's own counters (zeros once the workers are gone). */
static PyObject *
engine_worker_stats(fl_py_engine *self, PyObject *Py_UNUSED(ignored))
{
    int n = self->nworkers;
    uint64_t busy[FL_PY_MAX_WORKERS], jobs[FL_PY_MAX_WORKERS];
    memset(busy, 0, sizeof busy);
    memset(jobs, 0, sizeof jobs);
    if (self->engine)
        fl_engine_worker_stats(self->engine, busy, jobs, n);
    PyObject *list = PyList_New(n);
    if (!list)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *d = Py_BuildValue("{s:d,s:K}", "busy_s", (double)busy[i] * 1e-9, "jobs",
                                    (unsigned long long)jobs[i]);
        PyObject *own = d ? self->kind->worker_stats(self->kctx, i) : NULL;
        if (!own || PyDict_Update(d, own) < 0) {
            Py_XDECREF(own);
            Py_XDECREF(d);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(own);
        PyList_SET_ITEM(list, i, d);
    }
    return list;
}

/* consumer_gil_wait() -> (seconds, count): time wait() spent taking the GIL back */
static PyObject *
engine_consumer_gil_wait(fl_py_engine *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(dK)", self->consumer_gil.wait_ns * 1e-9, (unsigned long long)self->consumer_gil.waits);
}

/* set_active(n) -> int: let only workers 0..n-1 take jobs (autotune). */
static PyObject *
engine_set_active(fl_py_engine *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (fl_py_engine_check_open(self) < 0)
        return NULL;
    if (n > FL_PY_MAX_WORKERS)
        n = FL_PY_MAX_WORKERS; /* fl_engine_set_active clamps too; this keeps the cast to int exact */
    else if (n < 0)
        n = 0;
    return PyLong_FromLong(fl_engine_set_active(self->engine, (int)n));
}

static PyObject *
engine_get_closed(fl_py_engine *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->engine == NULL);
}

static PyObject *
engine_get_num_workers(fl_py_engine *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->nworkers);
}

/* ---- life cycle ------------------------------------------------------------ */

static int
engine_traverse(fl_py_engine *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    if (self->kctx)
        return self->kind->traverse(self->kctx, visit, arg);
    return 0;
}

/* tp_finalize: stop and join the workers while everything they may call is
 * intact (see the top of this file).  GIL held; released while joining. */
static void
engine_finalize(fl_py_engine *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    engine_close(self, self->kind->finalize_timeout_ms);
    PyErr_Restore(type, value, tb);
}

static int
engine_clear(fl_py_engine *self)
{
    /* closed by engine_finalize already, which the GC and engine_dealloc
     * run first; kept so that no path drops the references under running
     * workers */
    engine_close(self, self->kind->finalize_timeout_ms);
    if (self->kctx) {
        void *k = self->kctx;
        self->kctx = NULL;
        self->kind->free(k); /* every worker was joined: nobody else uses it */
    }
    return 0;
}

static void
engine_dealloc(fl_py_engine *self)
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

/* ---- the type ---------------------------------------------------------------- */

static PyMethodDef engine_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))engine_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(seq, timeout=None) -> (seq, worker, result) or None on timeout; seq=-1: the earliest finished job.\n"
     "What result is depends on the kind of engine (see its doc)."},
    {"reset", (PyCFunction)engine_reset, METH_NOARGS, "reset() -> int: start a new generation, dropping queued jobs."},
    {"outstanding", (PyCFunction)engine_outstanding, METH_NOARGS, "Jobs queued, running or not yet collected."},
    {"close", (PyCFunction)(void (*)(void))engine_close_meth, METH_VARARGS | METH_KEYWORDS,
     "close(timeout=None) -> bool: stop the workers and join them; after `timeout` seconds, workers still busy\n"
     "finish on their own, detached.  True when all were joined."},
    {"worker_stats", (PyCFunction)engine_worker_stats, METH_NOARGS,
     "Per-worker counters: busy_s and jobs, and the kind's own (see its doc)."},
    {"consumer_gil_wait", (PyCFunction)engine_consumer_gil_wait, METH_NOARGS,
     "(seconds, count) the consumer spent re-taking the GIL after waiting"},
    {"set_active", (PyCFunction)engine_set_active, METH_O, "set_active(n) -> int: workers 0..n-1 take jobs"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef engine_getset[] = {
    {"closed", (getter)engine_get_closed, NULL, "True once close() has run", NULL},
    {"num_workers", (getter)engine_get_num_workers, NULL, "number of worker threads", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef engine_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(fl_py_engine, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

/* The subclasses (Engine, NativeEngine) inherit every slot but tp_new. */
static PyType_Slot engine_slots[] = {
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_finalize, engine_finalize},
    {Py_tp_traverse, engine_traverse},
    {Py_tp_clear, engine_clear},
    {Py_tp_methods, engine_methods},
    {Py_tp_getset, engine_getset},
    {Py_tp_members, engine_members},
    {Py_tp_doc, "The worker pool Engine and NativeEngine share (not instantiable)."},
    {0, NULL},
};

static PyType_Spec engine_spec = {
    .name = "fastloader._C._EngineBase",
    .basicsize = sizeof(fl_py_engine),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = engine_slots,
};

int
fl_register_engine(PyObject *m)
{
    fl_module_state *st = fl_get_state(m);
    st->EngineBaseType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &engine_spec, NULL);
    if (!st->EngineBaseType || PyModule_AddType(m, st->EngineBaseType) < 0)
        return -1;
    PyObject *base = (PyObject *)st->EngineBaseType;
    st->EngineType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &fl_py_engine_spec, base);
    if (!st->EngineType || PyModule_AddType(m, st->EngineType) < 0)
        return -1;
    st->NativeEngineType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &fl_native_engine_spec, base);
    if (!st->NativeEngineType || PyModule_AddType(m, st->NativeEngineType) < 0)
        return -1;
    return 0;
}
