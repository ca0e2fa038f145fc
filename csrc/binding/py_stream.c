/* py_stream.c: test-only bindings of stream.c and tar.c.
 *
 * Module-level functions, registered by fl_register_stream:
 *   _stream_read(url, *, retries=5, backoff_ms=200, stall_timeout_ms=30000,
 *                chunk=65536, cancel_after_ms=-1, buffer_bytes=0,
 *                connect_timeout_ms=30000, ca_file=None) -> (bytes, stats)
 *   _tar_samples(url, *, the same stream options, max_member_bytes=1 GiB,
 *                max_fields=1024, with_stats=False)
 *       -> [(key, {ext: bytes})]   (or (that list, stats) with with_stats)
 * stats is a dict of the stream's counters (fl_stream_stats).  They read a
 * whole shard and return it: for tests of the core units, not for loading.
 *
 * The GIL is released around each fl_stream_read / fl_tar_next_sample call
 * (one chunk or one sample at a time) and signals are checked in between.
 * cancel_after_ms >= 0 starts a helper thread that sets the stream's cancel
 * flag after that many ms (how the tests cancel a blocked read).  Errors go
 * through the one translator (fl_py_raise) with the URL as OSError's
 * filename: I/O failures are OSError, a bad shard fastloader.DecodeError (a
 * ValueError).
 */
#include "binding/binding.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sources/stream.h"
#include "sources/tar.h"

/* Sets `flag` after `after_ms` unless stopped first. */
typedef struct {
    atomic_int flag;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int after_ms;
    int started;
    pthread_t th;
} fl_canceller;

static void *
canceller_main(void *arg)
{
    fl_canceller *c = arg;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += c->after_ms / 1000;
    dl.tv_nsec += (long)(c->after_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    while (!c->stop && rc == 0)
        rc = pthread_cond_timedwait(&c->cv, &c->mu, &dl);
    if (!c->stop)
        atomic_store(&c->flag, 1);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Start the helper when after_ms >= 0.  0, or -1 with RuntimeError set. */
static int
canceller_start(fl_canceller *c, int after_ms)
{
    atomic_init(&c->flag, 0);
    c->stop = 0;
    c->started = 0;
    c->after_ms = after_ms;
    if (after_ms < 0)
        return 0;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&c->th, NULL, canceller_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        PyErr_SetString(PyExc_RuntimeError, "cannot start the cancel thread");
        return -1;
    }
    c->started = 1;
    return 0;
}

/* Stop and join the helper (GIL released by the caller or not: it returns
 * promptly). */
static void
canceller_stop(fl_canceller *c)
{
    if (!c->started)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->th, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    c->started = 0;
}

static PyObject *
stats_dict(const fl_stream *s)
{
    fl_stream_stats st;
    fl_stream_get_stats(s, &st);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K}", "bytes", (unsigned long long)st.bytes, "wait_ns",
                         (unsigned long long)st.wait_ns, "retries", (unsigned long long)st.retries,
                         "range_resumes", (unsigned long long)st.range_resumes, "skipped_bytes",
                         (unsigned long long)st.skipped_bytes);
}

static PyObject *
raise_for(PyObject *m, const fl_err *err, const char *url)
{
    PyObject *name = PyUnicode_DecodeFSDefault(url);
    if (name == NULL)
        return NULL;
    fl_py_raise(m, err, name, NULL);
    Py_DECREF(name);
    return NULL;
}

/* What both test bindings do after parsing: the buffer size, and the
 * canceller thread (cancel_after_ms) wired to o->cancel.  0, or -1 with an
 * exception set and urlobj released.  GIL held. */
static int
call_setup(PyObject *urlobj, Py_ssize_t bufbytes, int cancel_after, fl_stream_opts *o, fl_canceller *c)
{
    if (bufbytes > 0)
        o->buffer_bytes = (size_t)bufbytes;
    if (canceller_start(c, cancel_after) < 0) {
        Py_DECREF(urlobj);
        return -1;
    }
    o->cancel = &c->flag;
    return 0;
}

static PyObject *
fl_stream_read_py(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"url", "retries", "backoff_ms", "stall_timeout_ms", "chunk", "cancel_after_ms",
                             "buffer_bytes", "connect_timeout_ms", "ca_file", NULL};
    PyObject *urlobj;
    fl_stream_opts o;
    fl_stream_opts_init(&o);
    Py_ssize_t chunk = 65536, bufbytes = 0;
    int cancel_after = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|$iiininiz:_stream_read", kwlist, PyUnicode_FSConverter,
                                     &urlobj, &o.retries, &o.backoff_ms, &o.stall_timeout_ms, &chunk,
                                     &cancel_after, &bufbytes, &o.connect_timeout_ms, &o.ca_file))
        return NULL;
    if (chunk <= 0 || bufbytes < 0) {
        Py_DECREF(urlobj);
        PyErr_SetString(PyExc_ValueError, "chunk must be > 0 and buffer_bytes >= 0");
        return NULL;
    }
    const char *url = PyBytes_AS_STRING(urlobj);
    fl_canceller c;
    if (call_setup(urlobj, bufbytes, cancel_after, &o, &c) < 0)
        return NULL;
    fl_err err = {0, "", 0};
    fl_stream *s;
    /* the data gathers in malloc'd memory (taken without the GIL) */
    uint8_t *data = NULL;
    size_t len = 0, cap = 0;
    long long r = 0;
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    s = fl_stream_open(url, &o, &err);
    Py_END_ALLOW_THREADS
    if (s == NULL) {
        canceller_stop(&c);
        raise_for(m, &err, url);
        Py_DECREF(urlobj);
        return NULL;
    }
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        if (cap - len < (size_t)chunk) {
            size_t ncap = cap ? cap : (size_t)chunk;
            while (ncap - len < (size_t)chunk)
                ncap *= 2;
            uint8_t *nd = realloc(data, ncap);
            if (nd == NULL) {
                nomem = 1;
            } else {
                data = nd;
                cap = ncap;
            }
        }
        if (!nomem)
            r = fl_stream_read(s, data + len, (size_t)chunk, &err);
        Py_END_ALLOW_THREADS
        if (nomem || r <= 0)
            break;
        len += (size_t)r;
        if (PyErr_CheckSignals() < 0) {
            r = -2;
            break;
        }
    }
    PyObject *res = NULL;
    if (nomem) {
        PyErr_NoMemory();
    } else if (r == -1) {
        raise_for(m, &err, url);
    } else if (r == 0) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)len);
        PyObject *st = b != NULL ? stats_dict(s) : NULL;
        if (st != NULL)
            res = PyTuple_Pack(2, b, st);
        Py_XDECREF(b);
        Py_XDECREF(st);
    }
    Py_BEGIN_ALLOW_THREADS
    fl_stream_close(s);
    canceller_stop(&c);
    Py_END_ALLOW_THREADS
    free(data);
    Py_DECREF(urlobj);
    return res;
}

/* (key, {ext: bytes}) for one sample; NULL with an exception set. */
static PyObject *
sample_tuple(const fl_wds_sample *smp)
{
    PyObject *d = PyDict_New(), *key = NULL, *res = NULL;
    if (d == NULL)
        return NULL;
    for (int i = 0; i < smp->nfields; i++) {
        const fl_wds_field *f = &smp->fields[i];
        PyObject *v = PyBytes_FromStringAndSize((const char *)f->data, (Py_ssize_t)f->size);
        PyObject *k = v != NULL ? PyUnicode_DecodeUTF8(f->ext, (Py_ssize_t)strlen(f->ext), "surrogateescape") : NULL;
        int rc = k != NULL ? PyDict_SetItem(d, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0)
            goto done;
    }
    /* tarfile decodes names as UTF-8 with surrogateescape; so does this */
    key = PyUnicode_DecodeUTF8(smp->key, (Py_ssize_t)strlen(smp->key), "surrogateescape");
    if (key != NULL)
        res = PyTuple_Pack(2, key, d);
done:
    Py_XDECREF(key);
    Py_DECREF(d);
    return res;
}

static PyObject *
fl_tar_samples_py(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"url", "retries", "backoff_ms", "stall_timeout_ms", "cancel_after_ms",
                             "buffer_bytes", "connect_timeout_ms", "max_member_bytes", "max_fields",
                             "with_stats", NULL};
    PyObject *urlobj;
    fl_stream_opts o;
    fl_tar_opts to;
    fl_stream_opts_init(&o);
    fl_tar_opts_init(&to);
    Py_ssize_t bufbytes = 0, maxmember = (Py_ssize_t)to.max_member_bytes;
    int cancel_after = -1, with_stats = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|$iiiininip:_tar_samples", kwlist, PyUnicode_FSConverter,
                                     &urlobj, &o.retries, &o.backoff_ms, &o.stall_timeout_ms, &cancel_after,
                                     &bufbytes, &o.connect_timeout_ms, &maxmember, &to.max_fields, &with_stats))
        return NULL;
    if (bufbytes < 0 || maxmember < 0 || to.max_fields < 1) {
        Py_DECREF(urlobj);
        PyErr_SetString(PyExc_ValueError, "buffer_bytes and max_member_bytes must be >= 0, max_fields >= 1");
        return NULL;
    }
    to.max_member_bytes = (size_t)maxmember;
    const char *url = PyBytes_AS_STRING(urlobj);
    fl_canceller c;
    if (call_setup(urlobj, bufbytes, cancel_after, &o, &c) < 0)
        return NULL;
    fl_err err = {0, "", 0};
    fl_tar *t;
    Py_BEGIN_ALLOW_THREADS
    t = fl_tar_open(url, &o, &to, &err);
    Py_END_ALLOW_THREADS
    if (t == NULL) {
        canceller_stop(&c);
        raise_for(m, &err, url);
        Py_DECREF(urlobj);
        return NULL;
    }
    PyObject *list = PyList_New(0), *res = NULL;
    int ok = list != NULL;
    while (ok) {
        fl_wds_sample *smp;
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = fl_tar_next_sample(t, &smp, &err);
        Py_END_ALLOW_THREADS
        if (r < 0) {
            raise_for(m, &err, url);
            ok = 0;
            break;
        }
        if (r == 0)
            break;
        PyObject *item = sample_tuple(smp);
        fl_wds_sample_free(smp);
        ok = item != NULL && PyList_Append(list, item) == 0 && PyErr_CheckSignals() == 0;
        Py_XDECREF(item);
    }
    if (ok) {
        if (with_stats) {
            PyObject *st = stats_dict(fl_tar_stream(t));
            if (st != NULL)
                res = PyTuple_Pack(2, list, st);
            Py_XDECREF(st);
        } else {
            res = Py_NewRef(list);
        }
    }
    Py_XDECREF(list);
    Py_BEGIN_ALLOW_THREADS
    fl_tar_close(t);
    canceller_stop(&c);
    Py_END_ALLOW_THREADS
    Py_DECREF(urlobj);
    return res;
}

/* _wds_split(name) -> (key, ext) or None; _wds_skip(name) -> bool (tests of
 * the name rules against webdataset's own functions).  One body: the name
 * as bytes (os.fsencode), then the rule.  GIL held; NULL with an exception
 * on a bad argument. */
static PyObject *
name_rule(PyObject *arg, int split)
{
    PyObject *b;
    if (!PyUnicode_FSConverter(arg, &b))
        return NULL;
    const char *name = PyBytes_AS_STRING(b);
    size_t keylen;
    const char *ext;
    PyObject *res;
    if (!split) {
        res = PyBool_FromLong(fl_wds_skip_name(name));
    } else if (fl_wds_split(name, &keylen, &ext)) {
        PyObject *k = PyUnicode_DecodeUTF8(name, (Py_ssize_t)keylen, "surrogateescape");
        PyObject *e = k != NULL ? PyUnicode_DecodeUTF8(ext, (Py_ssize_t)strlen(ext), "surrogateescape") : NULL;
        res = e != NULL ? PyTuple_Pack(2, k, e) : NULL;
        Py_XDECREF(k);
        Py_XDECREF(e);
    } else {
        res = Py_NewRef(Py_None);
    }
    Py_DECREF(b);
    return res;
}

static PyObject *
fl_wds_split_py(PyObject *m, PyObject *arg)
{
    (void)m;
    return name_rule(arg, 1);
}

static PyObject *
fl_wds_skip_py(PyObject *m, PyObject *arg)
{
    (void)m;
    return name_rule(arg, 0);
}

static PyMethodDef fl_stream_methods[] = {
    {"_stream_read", (PyCFunction)(void (*)(void))fl_stream_read_py, METH_VARARGS | METH_KEYWORDS,
     "_stream_read(url, *, retries=5, backoff_ms=200, stall_timeout_ms=30000, chunk=65536, cancel_after_ms=-1, "
     "buffer_bytes=0, connect_timeout_ms=30000, ca_file=None) -> (bytes, stats): the whole stream (tests)"},
    {"_tar_samples", (PyCFunction)(void (*)(void))fl_tar_samples_py, METH_VARARGS | METH_KEYWORDS,
     "_tar_samples(url, *, stream options, max_member_bytes=2**30, max_fields=1024, with_stats=False) -> "
     "[(key, {ext: bytes})]: every WebDataset sample of one shard (tests)"},
    {"_wds_split", (PyCFunction)fl_wds_split_py, METH_O, "_wds_split(name) -> (key, ext) or None (tests)"},
    {"_wds_skip", (PyCFunction)fl_wds_skip_py, METH_O, "_wds_skip(name) -> bool (tests)"},
    {NULL, NULL, 0, NULL},
};

int
fl_register_stream(PyObject *m)
{
    return PyModule_AddFunctions(m, fl_stream_methods);
}
