/* py_shards.c: tar shards (csrc/sources/shards.h) as Python calls; translation only.
 *
 *   shard_source(nominal, *, shuffle=0, ring=1024, seed=0, skip_bad_shards=False,
 *                image_exts=("jpg", "jpeg", "png", "webp"), label_ext="cls", label_field="",
 *                retries=5, backoff_ms=200, stall_timeout_ms=30000, connect_timeout_ms=30000,
 *                ca_file=None, extra_exts=()) -> Source
 *   shards_take_fields(source, positions) -> [[bytes | None] | None]
 *   shards_begin(source, epoch, urls, skip=0, *, keep=None, nominal=0, ids=None)  start an epoch over the rank's
 *                                         shards, in order (positions below skip dropped unread by
 *                                         workers: a resume; keep: per url None | (mask bytes, nbits);
 *                                         nominal > 0: this epoch's length; ids: per url its
 *                                         shard id, FL_SHARDS_KEY's)
 *   shards_order(counts, keep, shuffle, seed, epoch, nominal, npos) -> (bytes int32, bytes int64)
 *                                         the stream's (shard, sample) per position, reading nothing
 *   shards_cancel(source)                 stop the reader, wake waiting workers
 *   shards_stats(source) -> dict
 *   shards_take_skipped(source) -> [(url, reason)]
 *
 * Every call that may wait (begin joins the previous reader) releases the
 * GIL.  Errors go through the one translator (fl_py_raise).
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "sources/shards.h"

#include <string.h>

static fl_source *
shard_arg(PyObject *module, PyObject *obj)
{
    fl_source *s = fl_py_source_get(module, obj);
    if (!s || !fl_shards_is(s)) {
        PyErr_SetString(PyExc_TypeError, "expected a Source made by shard_source()");
        return NULL;
    }
    return s;
}

static PyObject *
shard_source(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"nominal", "shuffle", "ring", "seed", "skip_bad_shards", "image_exts", "label_ext",
                             "label_field", "retries", "backoff_ms", "stall_timeout_ms", "connect_timeout_ms",
                             "ca_file", "extra_exts", "capacity", NULL};
    fl_shards_opts o;
    memset(&o, 0, sizeof o);
    fl_stream_opts_init(&o.stream);
    long long nominal, capacity = 0;
    unsigned long long seed = 0;
    int skip = 0;
    PyObject *exts = NULL, *extras = NULL;
    const char *label_ext = "cls", *label_field = "", *ca_file = NULL;
    o.ring = 1024;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|$iiKpOssiiiizOL:shard_source", kwlist, &nominal, &o.shuffle,
                                     &o.ring, &seed, &skip, &exts, &label_ext, &label_field, &o.stream.retries,
                                     &o.stream.backoff_ms, &o.stream.stall_timeout_ms,
                                     &o.stream.connect_timeout_ms, &ca_file, &extras, &capacity))
        return NULL;
    o.stream.ca_file = ca_file;   /* copied by fl_shards_new */
    o.nominal = nominal;
    o.capacity = capacity;
    o.seed = seed;
    o.on_shard_error = skip ? FL_SHARDS_SKIP : FL_SHARDS_RAISE;
    if (exts == NULL) {
        const char *def[] = {"jpg", "jpeg", "png", "webp"};
        for (int i = 0; i < 4; i++)
            snprintf(o.image_exts[i], sizeof o.image_exts[i], "%s", def[i]);
        o.nexts = 4;
    } else {
        PyObject *seq = PySequence_Fast(exts, "image_exts must be a sequence of str");
        if (!seq)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n < 1 || n > FL_SHARDS_MAX_EXTS) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "image_exts needs 1 to %d extensions, got %zd",
                                FL_SHARDS_MAX_EXTS, n);
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *e = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
            if (!e || strlen(e) >= sizeof o.image_exts[0]) {
                Py_DECREF(seq);
                if (e)
                    PyErr_Format(PyExc_ValueError, "image extension too long: %s", e);
                return NULL;
            }
            snprintf(o.image_exts[i], sizeof o.image_exts[i], "%s", e);
        }
        o.nexts = (int)n;
        Py_DECREF(seq);
    }
    if (extras != NULL && extras != Py_None) {
        PyObject *seq = PySequence_Fast(extras, "extra_exts must be a sequence of str");
        if (!seq)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > FL_SHARDS_MAX_EXTS) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "at most %d extra fields, got %zd", FL_SHARDS_MAX_EXTS, n);
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *e = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
            if (!e || strlen(e) >= sizeof o.extra_exts[0]) {
                Py_DECREF(seq);
                if (e)
                    PyErr_Format(PyExc_ValueError, "extra field extension too long: %s", e);
                return NULL;
            }
            snprintf(o.extra_exts[i], sizeof o.extra_exts[i], "%s", e);
        }
        o.nextras = (int)n;
        Py_DECREF(seq);
    }
    if (strlen(label_ext) >= sizeof o.label_ext || strlen(label_field) >= sizeof o.label_field)
        return PyErr_Format(PyExc_ValueError, "label extension or field name too long");
    snprintf(o.label_ext, sizeof o.label_ext, "%s", label_ext);
    snprintf(o.label_field, sizeof o.label_field, "%s", label_field);
    fl_err err = {0, "", 0};
    fl_source *s = fl_shards_new(&o, &err);
    if (!s)
        return fl_py_raise(module, &err, NULL, NULL);
    return fl_py_source_wrap(module, s);
}

/* keep: None, or a list (one per url) of None | (bytes mask or None, nbits)
 * | (bytes mask or None, nbits, count) (a None mask: every sample; count:
 * the samples the shard must hold, shards.h) -> a PyMem array of
 * fl_shards_keep pointing into the bytes, which *hold (a new reference to
 * a private copy of the list, whose tuples and bytes cannot change) keeps
 * alive until the caller drops it, also while the GIL is released; or NULL
 * with *bad set and an exception (*hold NULL then). */
static fl_shards_keep *
keep_arg(PyObject *keep, Py_ssize_t n, int *bad, PyObject **hold)
{
    *bad = 0;
    *hold = NULL;
    if (keep == NULL || keep == Py_None)
        return NULL;
    if (!PyList_Check(keep) || PyList_GET_SIZE(keep) != n) {
        PyErr_SetString(PyExc_TypeError, "keep must be a list with one entry per url");
        *bad = 1;
        return NULL;
    }
    PyObject *mine = PyList_GetSlice(keep, 0, n);
    fl_shards_keep *k = mine ? PyMem_Calloc((size_t)(n ? n : 1), sizeof *k) : NULL;
    if (!k) {
        if (mine)
            PyErr_NoMemory();
        Py_XDECREF(mine);
        *bad = 1;
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(mine, i);
        k[i].count = -1;
        if (e == Py_None)
            continue;
        if (!PyTuple_Check(e)) {
            PyErr_Format(PyExc_TypeError, "keep[%zd] must be None or a tuple (mask, nbits[, count])", i);
            goto fail;
        }
        PyObject *mask;
        long long nbits, count = -1;
        if (!PyArg_ParseTuple(e, "OL|L:keep entry", &mask, &nbits, &count))
            goto fail;
        if (count < -1) {
            PyErr_Format(PyExc_ValueError, "keep[%zd]: a count of %lld samples", i, count);
            goto fail;
        }
        k[i].count = count;
        if (mask == Py_None)
            continue;
        char *bits;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(mask, &bits, &len) < 0)
            goto fail;
        if (nbits < 0 || nbits > (long long)len * 8) {
            PyErr_Format(PyExc_ValueError, "keep[%zd]: %lld bits in a mask of %zd bytes", i, nbits, len);
            goto fail;
        }
        k[i].bits = (const uint8_t *)bits;
        k[i].nbits = nbits;
    }
    *hold = mine;
    return k;
fail:
    PyMem_Free(k);
    Py_DECREF(mine);
    *bad = 1;
    return NULL;
}

static PyObject *
shards_begin(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"source", "epoch", "urls", "skip", "keep", "nominal", "ids", NULL};
    PyObject *src_obj, *urls, *keep = NULL, *ids_obj = NULL;
    unsigned long long epoch;
    long long skip = 0, nominal = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OKO|L$OLO:shards_begin", kwlist, &src_obj, &epoch, &urls, &skip,
                                     &keep, &nominal, &ids_obj))
        return NULL;
    fl_source *s = shard_arg(module, src_obj);
    if (!s)
        return NULL;
    PyObject *seq = PySequence_Fast(urls, "urls must be a sequence of str");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **u = PyMem_Calloc((size_t)(n ? n : 1), sizeof *u);
    if (!u) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        u[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (!u[i]) {
            PyMem_Free(u);
            Py_DECREF(seq);
            return NULL;
        }
    }
    int64_t *ids = NULL;
    if (ids_obj && ids_obj != Py_None) {
        PyObject *iseq = PySequence_Fast(ids_obj, "ids must be a sequence of int");
        ids = iseq ? PyMem_Calloc((size_t)(n ? n : 1), sizeof *ids) : NULL;
        int ok = ids != NULL;
        if (iseq && !ids)
            PyErr_NoMemory();
        if (ok && PySequence_Fast_GET_SIZE(iseq) != n) {
            PyErr_Format(PyExc_ValueError, "shards_begin: %zd ids for %zd urls", PySequence_Fast_GET_SIZE(iseq), n);
            ok = 0;
        }
        for (Py_ssize_t i = 0; ok && i < n; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(iseq, i));
            if (v == -1 && PyErr_Occurred())
                ok = 0;
            ids[i] = (int64_t)v;
        }
        Py_XDECREF(iseq);
        if (!ok) {
            PyMem_Free(ids);
            PyMem_Free(u);
            Py_DECREF(seq);
            return NULL;
        }
    }
    int bad;
    PyObject *hold;
    fl_shards_keep *k = keep_arg(keep, n, &bad, &hold);
    if (bad) {
        PyMem_Free(ids);
        PyMem_Free(u);
        Py_DECREF(seq);
        return NULL;
    }
    fl_err err = {0, "", 0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_shards_begin_keep(s, epoch, (int64_t)skip, u, ids, k, (int)n, (int64_t)nominal, &err);
    Py_END_ALLOW_THREADS
    PyMem_Free(ids);
    PyMem_Free(k);
    Py_XDECREF(hold);
    PyMem_Free(u);
    Py_DECREF(seq);
    if (rc < 0)
        return fl_py_raise(module, &err, NULL, NULL);
    Py_RETURN_NONE;
}

/* shards_order(counts, keep, shuffle, seed, epoch, nominal, npos) -> (bytes int32 shard, bytes int64 sample) */
static PyObject *
shards_order(PyObject *module, PyObject *args)
{
    PyObject *counts, *keep;
    int shuffle;
    unsigned long long seed, epoch;
    long long nominal, npos;
    if (!PyArg_ParseTuple(args, "OOiKKLL:shards_order", &counts, &keep, &shuffle, &seed, &epoch, &nominal, &npos))
        return NULL;
    if (shuffle < 0 || nominal < 0 || npos < 0) {
        PyErr_SetString(PyExc_ValueError, "shards_order: negative shuffle, nominal or npos");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(counts, "counts must be a sequence of int");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *c = PyMem_Calloc((size_t)(n ? n : 1), sizeof *c);
    if (!c) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        c[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (c[i] < 0 && !PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "shards_order: counts[%zd] is negative", i);
        if (c[i] < 0) {
            PyMem_Free(c);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    int bad;
    PyObject *hold;
    fl_shards_keep *k = keep_arg(keep, n, &bad, &hold);
    int64_t m = npos < nominal ? npos : nominal;
    PyObject *so = bad ? NULL : PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(m * (int64_t)sizeof(int32_t)));
    PyObject *ko = so ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(m * (int64_t)sizeof(int64_t))) : NULL;
    if (!ko) {
        Py_XDECREF(so);
        PyMem_Free(k);
        Py_XDECREF(hold);
        PyMem_Free(c);
        return NULL;
    }
    fl_err err = {0, "", 0};
    int64_t got;
    int32_t *sp = (int32_t *)PyBytes_AS_STRING(so);
    int64_t *kp = (int64_t *)PyBytes_AS_STRING(ko);
    Py_BEGIN_ALLOW_THREADS
    got = fl_shards_order(c, k, (int)n, shuffle, seed, epoch, nominal, npos, sp, kp, &err);
    Py_END_ALLOW_THREADS
    PyMem_Free(k);
    Py_XDECREF(hold);
    PyMem_Free(c);
    if (got < 0) {
        Py_DECREF(so);
        Py_DECREF(ko);
        return fl_py_raise(module, &err, NULL, NULL);
    }
    return Py_BuildValue("(NN)", so, ko);
}

static PyObject *
shards_cancel(PyObject *module, PyObject *src_obj)
{
    fl_source *s = shard_arg(module, src_obj);
    if (!s)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    fl_shards_cancel(s);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *
shards_stats(PyObject *module, PyObject *src_obj)
{
    fl_source *s = shard_arg(module, src_obj);
    if (!s)
        return NULL;
    fl_shards_stats st;
    fl_shards_stats_get(s, &st);
    return Py_BuildValue("{s:K,s:d,s:K,s:K,s:K,s:K,s:K}", "bytes", (unsigned long long)st.bytes, "wait_s",
                         st.wait_ns / 1e9, "retries", (unsigned long long)st.retries, "samples",
                         (unsigned long long)st.samples, "shards", (unsigned long long)st.shards,
                         "shards_skipped", (unsigned long long)st.shards_skipped, "passes",
                         (unsigned long long)st.passes);
}

static PyObject *
shards_take_skipped(PyObject *module, PyObject *src_obj)
{
    fl_source *s = shard_arg(module, src_obj);
    if (!s)
        return NULL;
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    static char urls[16][512], reasons[16][320];  /* GIL held: one caller at a time */
    int n;
    while ((n = fl_shards_take_skipped(s, urls, reasons, 16)) > 0) {
        for (int i = 0; i < n; i++) {
            PyObject *t = Py_BuildValue("(ss)", urls[i], reasons[i]);
            if (!t || PyList_Append(out, t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(t);
        }
    }
    return out;
}

/* shards_take_fields(source, positions) -> list, one entry per position: a
 * list of bytes (None where the sample lacks that member) in extra_exts'
 * order, or None when nothing is kept for that position. */
static PyObject *
shards_take_fields(PyObject *module, PyObject *args)
{
    PyObject *src_obj, *positions;
    if (!PyArg_ParseTuple(args, "OO:shards_take_fields", &src_obj, &positions))
        return NULL;
    fl_source *s = shard_arg(module, src_obj);
    if (!s)
        return NULL;
    PyObject *seq = PySequence_Fast(positions, "positions must be a sequence of int");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        long long pos = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (pos == -1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        uint8_t *data[FL_SHARDS_MAX_EXTS];
        size_t len[FL_SHARDS_MAX_EXTS];
        int k = fl_shards_take_fields(s, pos, data, len);
        PyObject *item;
        if (k < 0) {
            item = Py_NewRef(Py_None);
        } else {
            item = PyList_New(k);
            for (int j = 0; j < k; j++) {
                PyObject *b = !item ? NULL
                              : data[j] ? PyBytes_FromStringAndSize((const char *)data[j], (Py_ssize_t)len[j])
                                        : Py_NewRef(Py_None);
                free(data[j]);
                if (item && !b)
                    Py_CLEAR(item);
                if (item)
                    PyList_SET_ITEM(item, j, b);
            }
        }
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, item);
    }
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"shard_source", (PyCFunction)(void (*)(void))shard_source, METH_VARARGS | METH_KEYWORDS,
     "shard_source(nominal, *, shuffle, ring, seed, skip_bad_shards, image_exts, label_ext, label_field, retries, "
     "backoff_ms, stall_timeout_ms, connect_timeout_ms, ca_file, extra_exts, capacity) -> Source over tar shards (csrc/sources/shards.h)"},
    {"shards_begin", (PyCFunction)(void (*)(void))shards_begin, METH_VARARGS | METH_KEYWORDS,
     "shards_begin(source, epoch, urls, skip=0, *, keep=None, nominal=0, ids=None): start an epoch (positions "
     "below skip are dropped when made; keep: per url None | (mask bytes, nbits); nominal > 0: this epoch's "
     "length; ids: per url its index in the dataset's shard list, which keys its samples' augmentation)"},
    {"shards_order", shards_order, METH_VARARGS,
     "shards_order(counts, keep, shuffle, seed, epoch, nominal, npos) -> (int32 bytes, int64 bytes): the shard "
     "and sample of each position, reading nothing"},
    {"shards_take_fields", shards_take_fields, METH_VARARGS,
     "shards_take_fields(source, positions) -> [[bytes | None] | None]: the extra members workers kept"},
    {"shards_cancel", shards_cancel, METH_O, "shards_cancel(source): stop the reader, wake waiting workers"},
    {"shards_stats", shards_stats, METH_O, "shards_stats(source) -> dict of counters"},
    {"shards_take_skipped", shards_take_skipped, METH_O,
     "shards_take_skipped(source) -> [(url, reason)] of shards skipped since the last call"},
    {NULL, NULL, 0, NULL},
};

int
fl_register_shards(PyObject *m)
{
    return PyModule_AddFunctions(m, methods);
}
