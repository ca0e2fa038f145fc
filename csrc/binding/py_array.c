/* py_array.c: arrays as Sources, and the batch gather.
 *
 *   array_source(data, offset, shape, dtype, image=False) -> Source
 *       The rows of one array (kind "array", csrc/sources/array_source.h).  `data`
 *       is a path (str or os.PathLike: the file is mapped read-only and the
 *       array starts at byte `offset`, as in an .npy) or an object with
 *       the buffer protocol, C-contiguous (a NumPy array or np.memmap:
 *       held, never copied; offset must be 0).  `shape` is the whole
 *       array's shape (rows first), `dtype` NumPy's type string ("<i8",
 *       "|u1", "<f4", "|b1", ...) in native byte order.  image=True: the
 *       rows are HWC uint8 images the native pipeline renders as pixels.
 *   gather(sources, indices, pool=None) -> tuple of Buffers
 *       For each array source, the rows `indices` (negative ones count
 *       from the end, as in Python) copied into a [len(indices), *row
 *       shape] Buffer of its dtype: one of `pool`'s buffers (a BatchPool,
 *       page-locked when it pins) or a fresh one.  Allocation and copies
 *       run without the GIL.  IndexError names the first index out of
 *       range, before anything is copied.
 *
 * Ownership: a Source of an in-memory array holds a buffer export of it in
 * its region (gather.h); the region's release takes the GIL to give the
 * export back, on whichever thread drops the last reference (a worker
 * closing, a Source's dealloc), and leaks it rather than touch an
 * interpreter that is finalizing.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "sources/array_source.h"
#include "sources/gather.h"
#include "core/pool.h"
#include "binding/py_buffer.h"
#include "binding/py_native.h"

#include <stdlib.h>
#include <string.h>

/* ---- in-memory arrays ------------------------------------------------------- */

/* The export a lent region holds (malloc'd: freed by release, whatever
 * thread that runs on). */
typedef struct {
    Py_buffer view;
} lent_view;

/* A lent region's release: give the export back.  Any thread, GIL or not. */
static void
lent_release(void *ctx)
{
    lent_view *lv = ctx;
    if (Py_IsInitialized() && !FL_IS_FINALIZING()) {
        PyGILState_STATE g = PyGILState_Ensure();
        PyBuffer_Release(&lv->view);
        PyGILState_Release(g);
    }
    free(lv);
}

/* A region over obj's memory (C-contiguous buffer), or NULL with an
 * exception. */
static fl_region *
region_from_buffer(PyObject *obj)
{
    lent_view *lv = malloc(sizeof *lv);
    if (!lv)
        return (fl_region *)PyErr_NoMemory();
    if (PyObject_GetBuffer(obj, &lv->view, PyBUF_C_CONTIGUOUS) < 0) {
        free(lv);
        return NULL;
    }
    fl_region *r = fl_region_wrap(lv->view.buf, (size_t)lv->view.len, lent_release, lv);
    if (!r) {
        PyBuffer_Release(&lv->view);
        free(lv);
        return (fl_region *)PyErr_NoMemory();
    }
    return r;
}

/* ---- array_source ------------------------------------------------------------ */

/* NumPy's type string -> DLPack.  0, or -1 with ValueError. */
static int
parse_dtype(const char *s, DLDataType *dt)
{
    const char *t = s;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const char foreign = '>';
#else
    const char foreign = '<';
#endif
    if (*t == foreign) {
        PyErr_Format(PyExc_ValueError, "dtype %s is not in this machine's byte order", s);
        return -1;
    }
    if (*t == '<' || *t == '>' || *t == '|' || *t == '=')
        t++;
    char kind = *t ? *t++ : '\0';
    char *end;
    long size = strtol(t, &end, 10);
    if (*end != '\0' || t == end || size < 1 || size > 16)
        goto bad;
    dt->lanes = 1;
    dt->bits = (uint8_t)(size * 8);
    switch (kind) {
    case 'b': dt->code = kDLBool; return size == 1 ? 0 : -1;
    case 'i': dt->code = kDLInt; break;
    case 'u': dt->code = kDLUInt; break;
    case 'f': dt->code = kDLFloat; break;
    case 'c': dt->code = kDLComplex; break;
    default: goto bad;
    }
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "unsupported dtype %s (booleans, integers, floats and complex numbers only)", s);
    return -1;
}

static PyObject *
array_source(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"data", "offset", "shape", "dtype", "image", NULL};
    PyObject *data, *shape_obj;
    unsigned long long offset;
    const char *dtype;
    int image = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OKOs|p:array_source", kwlist, &data, &offset, &shape_obj,
                                     &dtype, &image))
        return NULL;
    fl_array_info info;
    memset(&info, 0, sizeof info);
    if (parse_dtype(dtype, &info.dtype) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(shape_obj, "shape must be a sequence of ints");
    if (!seq)
        return NULL;
    Py_ssize_t ndim = PySequence_Fast_GET_SIZE(seq);
    if (ndim < 1 || ndim > FL_MAX_NDIM - 1) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "an array of %zd dimensions: 1 to %d are supported", ndim,
                            FL_MAX_NDIM - 1);
    }
    uint64_t total = info.dtype.bits / 8;
    for (Py_ssize_t i = 0; i < ndim; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if (v < 0 || (v && total > (UINT64_MAX >> 1) / (uint64_t)v)) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "bad dimension %lld in the shape", v);
        }
        total *= (uint64_t)v;
        if (i == 0)
            info.n = v;
        else
            info.row_shape[i - 1] = v;
    }
    Py_DECREF(seq);
    info.row_ndim = (int)ndim - 1;
    info.row_bytes = (size_t)(info.dtype.bits / 8);
    for (int i = 0; i < info.row_ndim; i++)
        info.row_bytes *= (size_t)info.row_shape[i];

    fl_err err = {0, "", 0};
    fl_region *region = NULL;
    PyObject *fs = NULL;
    if (PyUnicode_Check(data) || PyBytes_Check(data) || PyObject_HasAttrString(data, "__fspath__")) {
        if (!PyUnicode_FSConverter(data, &fs))
            return NULL;
        const char *path = PyBytes_AS_STRING(fs);
        Py_BEGIN_ALLOW_THREADS
        region = fl_region_map_file(path, offset, total, &err);
        Py_END_ALLOW_THREADS
        if (!region) {
            PyObject *fname = PyUnicode_DecodeFSDefault(path);
            if (fname && (err.code != FL_ERR_IO || err.errnum == 0)) {
                /* no errno: the message names the file itself */
                PyObject *text = PyUnicode_FromFormat("%U: %s", fname, err.msg);
                const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
                if (utf8) {
                    PyObject *exc = fl_py_error_new(module, err.code, 0, utf8, NULL, NULL);
                    if (exc) {
                        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                        Py_DECREF(exc);
                    }
                } else { /* a name that is not UTF-8: the reason alone */
                    PyErr_Clear();
                    fl_py_raise(module, &err, NULL, NULL);
                }
                Py_XDECREF(text);
            } else if (fname) {
                fl_py_raise(module, &err, fname, NULL);
            }
            Py_XDECREF(fname);
            Py_DECREF(fs);
            return NULL;
        }
        Py_DECREF(fs);
    } else {
        if (offset != 0)
            return PyErr_Format(PyExc_ValueError, "offset must be 0 for an array in memory");
        region = region_from_buffer(data);
        if (!region)
            return NULL;
        size_t have = fl_region_size(region);
        if (have != total) {
            fl_region_unref(region);
            return PyErr_Format(PyExc_ValueError, "the buffer holds %zu bytes, the shape and dtype need %llu",
                                have, (unsigned long long)total);
        }
    }
    info.base = fl_region_data(region);
    fl_source *src = fl_source_array_new(region, &info, image, &err);
    fl_region_unref(region); /* the source holds its own reference */
    if (!src)
        return fl_py_raise(module, &err, NULL, NULL);
    return fl_py_source_wrap(module, src);
}

/* ---- gather ------------------------------------------------------------------- */

/* One output of a gather while it is built. */
typedef struct {
    fl_array_info info;
    fl_pool *pool;   /* borrowed from the BatchPool (NULL: fl_aligned_alloc) */
    size_t nbytes;
    void *data;      /* owned until handed to a Buffer */
    int pinned;
} gather_out;

static void
gather_free(gather_out *o)
{
    if (!o->data)
        return;
    if (o->pool)
        fl_py_pool_put(o->pool, o->data);
    else
        free(o->data);
    o->data = NULL;
}

static PyObject *
gather(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"sources", "indices", "pool", NULL};
    PyObject *sources, *indices, *pool = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:gather", kwlist, &sources, &indices, &pool))
        return NULL;
    PyObject *seq = PySequence_Fast(sources, "sources must be a sequence of array Sources");
    if (!seq)
        return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    int64_t *idx = NULL;
    gather_out *outs = PyMem_Calloc((size_t)(m ? m : 1), sizeof *outs);
    if (!outs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        fl_source *s = fl_py_source_get(module, PySequence_Fast_GET_ITEM(seq, j));
        if (!s || fl_source_array_info(s, &outs[j].info) < 0) {
            PyErr_SetString(PyExc_TypeError, "gather(): sources must be array Sources (from array_source())");
            goto done;
        }
        if (outs[j].info.n != outs[0].info.n) {
            PyErr_Format(PyExc_ValueError, "gather(): arrays of %lld and %lld rows", (long long)outs[0].info.n,
                         (long long)outs[j].info.n);
            goto done;
        }
    }
    Py_ssize_t count = 0;
    idx = fl_py_parse_row_indices(indices, m ? outs[0].info.n : 0, &count);
    if (!idx)
        goto done;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (outs[j].info.row_bytes && (size_t)count > SIZE_MAX / outs[j].info.row_bytes) {
            PyErr_NoMemory();
            goto done;
        }
        outs[j].nbytes = outs[j].info.row_bytes * (size_t)count;
        if (pool == Py_None || outs[j].nbytes == 0)
            continue; /* an empty batch allocates nothing worth pooling */
        if (fl_py_batchpool_for(module, pool, outs[j].nbytes, &outs[j].pool) < 0)
            goto done;
    }
    /* The Sources in `seq` keep the arrays mapped, and the caller's `pool`
     * its size classes, until this returns. */
    fl_err err = {0, "", 0};
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < m && rc == 0; j++) {
        gather_out *o = &outs[j];
        o->data = o->pool ? fl_pool_get(o->pool) : fl_aligned_alloc(o->nbytes);
        if (!o->data) {
            err.code = FL_ERR_NOMEM;
            snprintf(err.msg, sizeof err.msg, "out of memory for a batch of %zu bytes", o->nbytes);
            rc = -1;
            break;
        }
        o->pinned = o->pool ? fl_pool_is_pinned(o->data) : 0;
        rc = fl_gather_rows(o->info.base, o->info.n, o->info.row_bytes, idx, count, o->data, &err);
    }
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        fl_py_raise(module, &err, NULL, NULL);
        goto done;
    }
    result = PyTuple_New(m);
    if (!result)
        goto done;
    DLDevice cpu = {kDLCPU, 0};
    for (Py_ssize_t j = 0; j < m; j++) {
        gather_out *o = &outs[j];
        int64_t shape[FL_MAX_NDIM];
        shape[0] = count;
        for (int i = 0; i < o->info.row_ndim; i++)
            shape[i + 1] = o->info.row_shape[i];
        PyObject *b = fl_buffer_new(module, o->data, o->nbytes, o->info.row_ndim + 1, shape, o->info.dtype, cpu,
                                    o->pool ? fl_py_pool_put : fl_aligned_free, o->pool);
        if (!b) {
            Py_CLEAR(result);
            goto done;
        }
        fl_buffer_set_pinned(b, o->pinned);
        o->data = NULL; /* owned by the Buffer now */
        PyTuple_SET_ITEM(result, j, b);
    }
done:
    for (Py_ssize_t j = 0; outs && j < m; j++)
        gather_free(&outs[j]);
    PyMem_Free(outs);
    free(idx);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef array_functions[] = {
    {"array_source", (PyCFunction)(void (*)(void))array_source, METH_VARARGS | METH_KEYWORDS,
     "array_source(data, offset, shape, dtype, image=False) -> Source over the rows of an array: a file mapped "
     "read-only from byte `offset` (data a path), or an object with the buffer protocol (held, not copied)"},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_VARARGS | METH_KEYWORDS,
     "gather(sources, indices, pool=None) -> tuple of Buffers [len(indices), *row shape]: the rows of each "
     "array source, copied without the GIL into `pool`'s buffers (a BatchPool) or fresh ones"},
    {NULL, NULL, 0, NULL},
};

int
fl_register_array(PyObject *m)
{
    return PyModule_AddFunctions(m, array_functions);
}
