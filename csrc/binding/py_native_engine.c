/* py_native_engine.c: fastloader._C.NativeEngine, the engine kind that
 * drives native datasets.  Everything it shares with Engine (waiting,
 * reset, close, the life cycle) is the one engine binding,
 * py_engine_common.c; this file says what a job is and how its result
 * becomes a Python object.
 *
 *   NativeEngine(num_workers, dataset, post=None, post_always=False)
 *   submit(seq, indices, epoch, seed)   one batch of a NativeDataset
 *   wait(...) -> (seq, worker, result)
 *
 * The workers load whole batches without the GIL (native_engine.c runs
 * them; native.c is the C work).  With `post`, the worker that built a batch
 * that needs Python afterwards (every batch with post_always, else those
 * with fix-ups) calls post(batch, epoch, seed, seq, worker, native_s)
 * itself, with the GIL (native_engine.h says when and in which order).
 * wait()'s result is the batch as (images, labels, events, failed)
 * (py_native.c, fl_py_native_batch), or what post returned, or the
 * exception post raised (an exception instance: the consumer raises it at
 * that batch's turn).
 *
 * Shutting down: a worker inside post finishes that call before it is
 * joined.  tp_finalize waits 10 s at most for the workers, then leaves them
 * detached: without a hook they run only C, where the one thing that does
 * not return is a read of a hung network file system.  Workers never take
 * the GIL once the interpreter is finalizing: the batch then stays raw, and
 * results are leaked rather than released.
 */
#define NO_IMPORT_ARRAY
#include "binding/py_engine_common.h"
#include "native/native.h"
#include "native/native_engine.h"
#include "binding/py_native.h"

#include <stdlib.h>

/* The kind's state (kctx), shared by the NativeEngine object and its
 * workers: heap-allocated (malloc: workers read it without the GIL), so
 * that a close that leaves threads running can leak it
 * (py_engine_common.h). */
typedef struct {
    fl_native_ctx *ctx;      /* the workers' state (native_engine.h; owned); borrows ds */
    PyObject *dataset;       /* the NativeDataset (strong ref): keeps ds alive */
    const fl_native_ds *ds;  /* borrowed from dataset */
    PyObject *module;        /* fastloader._C, for Buffers (strong ref) */
    PyObject *post;          /* the hook (strong ref), or NULL */
} neng_ctx;

/* ---- the post hook (worker threads; takes the GIL itself) ------------------ */

/* fl_native_post.run: the batch as Python objects, then post(...).  Returns
 * a new reference (post's result, or the exception it raised), or NULL
 * without touching b when the interpreter is finalizing.  GIL not held on
 * entry; taken here, with a thread state that lives for this call only. */
static void *
post_run(void *arg, int worker_id, fl_native_batch *b, const fl_native_job_info *job, uint64_t *gil_wait_ns)
{
    neng_ctx *k = arg;
    if (FL_IS_FINALIZING())
        return NULL; /* never take the GIL of a dying interpreter */
    uint64_t t0 = fl_now_ns();
    PyGILState_STATE g = PyGILState_Ensure();
    *gil_wait_ns += fl_now_ns() - t0;
    PyObject *res = NULL;
    PyObject *batch = fl_py_native_batch(k->module, k->ds, b); /* consumes b */
    if (batch) {
        res = PyObject_CallFunction(k->post, "OKKLid", batch, (unsigned long long)job->epoch,
                                    (unsigned long long)job->seed, (long long)job->seq, worker_id,
                                    job->native_ns * 1e-9);
        Py_DECREF(batch);
    }
    if (!res)
        res = fl_py_take_exception();
    PyGILState_Release(g);
    return res;
}

/* ---- the kind (GIL held) --------------------------------------------------- */

/* Free k (NULL ok): the workers' context first (its hook points to k),
 * then the references.  Only once no worker uses it. */
static void
kind_free(void *kctx)
{
    neng_ctx *k = kctx;
    if (!k)
        return;
    fl_native_ctx_free(k->ctx);
    Py_XDECREF(k->post);
    Py_XDECREF(k->module);
    Py_XDECREF(k->dataset);
    free(k);
}

/* An engine result as what wait() hands out: (images, labels, events,
 * failed), or post's result; consumes result.  NULL with an exception. */
static PyObject *
kind_result(void *kctx, void *result)
{
    neng_ctx *k = kctx;
    fl_native_result *r = result;
    if (r == NULL)
        return PyErr_NoMemory(); /* the run op ran out of memory */
    PyObject *out;
    if (r->post)
        out = r->post; /* the reference passes to the caller */
    else
        out = fl_py_native_batch(k->module, k->ds, r->batch); /* consumes the batch */
    free(r);
    return out;
}

/* The stage counters and the post hook's (zeros once the context is gone). */
static PyObject *
kind_worker_stats(void *kctx, int worker)
{
    neng_ctx *k = kctx;
    fl_native_stats s;
    fl_native_ctx_stats(k ? k->ctx : NULL, worker, &s);
    return Py_BuildValue("{s:d,s:d,s:d,s:K,s:K,s:d,s:d,s:d,s:K}", "read_s", s.read_ns * 1e-9, "decode_s",
                         s.decode_ns * 1e-9, "transform_s", s.render_ns * 1e-9, "bytes_read",
                         (unsigned long long)s.bytes_read, "samples", (unsigned long long)s.samples, "python_s",
                         s.post_ns * 1e-9, "gil_wait_s", s.post_gil_ns * 1e-9, "turn_wait_s",
                         s.post_turn_ns * 1e-9, "python_batches", (unsigned long long)s.post_batches);
}

/* Batches queued after a reset no longer wait for the hooks of earlier ones. */
static void
kind_reset(void *kctx)
{
    fl_native_reset(((neng_ctx *)kctx)->ctx);
}

static int
kind_traverse(void *kctx, visitproc visit, void *arg)
{
    neng_ctx *k = kctx;
    Py_VISIT(k->dataset);
    Py_VISIT(k->module);
    Py_VISIT(k->post);
    return 0;
}

static const fl_py_engine_kind native_kind = {
    .result = kind_result,
    .worker_stats = kind_worker_stats,
    .reset = kind_reset,
    .traverse = kind_traverse,
    .free = kind_free,
    .finalize_timeout_ms = 10000, /* see the top of this file */
};

/* ---- NativeEngine ------------------------------------------------------------ */

static PyObject *
neng_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"num_workers", "dataset", "post", "post_always", NULL};
    int n, always = 0;
    PyObject *dataset, *post = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO|Op:NativeEngine", kwlist, &n, &dataset, &post, &always))
        return NULL;
    PyObject *module = PyType_GetModule(type);
    fl_module_state *st = fl_get_state(module);
    if (!st || !PyObject_TypeCheck(dataset, st->NativeDatasetType))
        return PyErr_Format(PyExc_TypeError, "dataset must be a NativeDataset");
    if (post != Py_None && !PyCallable_Check(post))
        return PyErr_Format(PyExc_TypeError, "post must be callable or None");
    fl_py_engine *self = fl_py_engine_alloc(type, n, &native_kind);
    if (!self)
        return NULL;
    neng_ctx *k = calloc(1, sizeof *k);
    if (!k) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    k->dataset = Py_NewRef(dataset);
    k->ds = fl_py_native_ds(dataset);
    k->module = Py_NewRef(module);
    k->post = post != Py_None ? Py_NewRef(post) : NULL;
    self->kctx = k; /* freed with self from here on */
    fl_native_post hook = {post_run, fl_py_release_object, k, always};
    k->ctx = fl_native_ctx_new(k->ds, n, k->post ? &hook : NULL);
    if (!k->ctx) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (fl_py_engine_open(self, &fl_native_ops, k->ctx) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* submit(seq, indices, epoch, seed): queue batch `seq`, samples `indices`
 * of `epoch` drawn with `seed`. */
static PyObject *
neng_submit(fl_py_engine *self, PyObject *args)
{
    long long seq;
    PyObject *ind;
    unsigned long long epoch, seed;
    if (!PyArg_ParseTuple(args, "LOKK:submit", &seq, &ind, &epoch, &seed))
        return NULL;
    int count;
    int64_t *idx = fl_py_parse_indices(ind, &count);
    if (!idx)
        return NULL;
    /* checked after parsing: an index's __index__ may have closed us */
    if (fl_py_engine_check_open(self) < 0) {
        free(idx);
        return NULL;
    }
    neng_ctx *k = self->kctx;
    fl_pool *pool = fl_py_native_pool_for(k->dataset, count);
    /* checked again: growing the pool releases the GIL, and another thread
     * may have closed us meanwhile (k is still valid: closing leaks it or
     * keeps it) */
    if (!pool || fl_py_engine_check_open(self) < 0) {
        free(idx);
        return NULL;
    }
    void *job = fl_native_job_new(pool, idx, count, epoch, seed); /* takes its own pool ref */
    free(idx);
    if (!job)
        return PyErr_NoMemory();
    /* the engine owns the job from here, and destroys it if it cannot queue it */
    if (fl_native_submit(k->ctx, self->engine, seq, job) < 0)
        return PyErr_Format(PyExc_RuntimeError, "could not queue batch %lld", seq);
    Py_RETURN_NONE;
}

static PyMethodDef neng_methods[] = {
    {"submit", (PyCFunction)neng_submit, METH_VARARGS, "submit(seq, indices, epoch, seed): queue one batch"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot neng_slots[] = {
    {Py_tp_new, neng_new},
    {Py_tp_methods, neng_methods},
    {Py_tp_doc, "NativeEngine(num_workers, dataset, post=None, post_always=False): threads that load native\n"
                "batches without the GIL, and finish them with post(batch, epoch, seed, seq, worker, native_s)\n"
                "when they need Python.  wait()'s result is (images, labels, events, failed), or what post\n"
                "returned, or the exception it raised.  worker_stats() adds read_s, decode_s, transform_s,\n"
                "bytes_read, samples, and for the post hook python_s (GIL held), gil_wait_s, turn_wait_s\n"
                "(earlier batches' hooks) and python_batches."},
    {0, NULL},
};

/* A subclass of _EngineBase (fl_register_engine), which gives it every
 * other slot. */
PyType_Spec fl_native_engine_spec = {
    .name = "fastloader._C.NativeEngine",
    .basicsize = sizeof(fl_py_engine),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, /* GC: inherited, with traverse and clear */
    .slots = neng_slots,
};
