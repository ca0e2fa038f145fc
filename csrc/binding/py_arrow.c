/* py_arrow.c: the Python face of arrow_source.h (translation only).
 *
 *   arrow_source(chunks, rows=None) -> Source
 *       The image column of an Arrow table (kind "arrow").  `chunks` is a
 *       sequence with one tuple per chunk of the column:
 *           (length, validity, validity_offset, bytes_field, path_field)
 *       and each field a tuple
 *           (validity, offset, offsets, offset_width, data)
 *       (path_field None for a plain binary column).  validity, offsets and
 *       data are objects with the buffer protocol (pyarrow.Buffer), or None
 *       (validity: no nulls; data: no bytes).  `rows`: None (sample i is
 *       row i), or a C-contiguous int64 buffer of row numbers (a NumPy
 *       array), copied.  fastloader/hf_datasets.py builds the tuples from
 *       pyarrow arrays; this file only borrows memory and checks types.
 *
 * Ownership: the Source holds a buffer export of every buffer it was given
 * (so pyarrow keeps the memory -- a memory-mapped Arrow file or memory of
 * its own -- alive and unmoved) until the core source's last reference
 * goes; the release takes the GIL to give the exports back, on whichever
 * thread that is (a worker closing, the Source's dealloc), and leaks them
 * rather than touch an interpreter that is finalizing (as py_array.c's
 * lent regions do).
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "sources/arrow_source.h"

#include <stdlib.h>
#include <string.h>

/* The exports one source holds (malloc'd: released by owner_release,
 * whatever thread that runs on). */
typedef struct {
    Py_ssize_t n, cap;
    Py_buffer views[];
} owner;

/* The source's release: give every export back.  Any thread, GIL or not. */
static void
owner_release(void *ctx)
{
    owner *o = ctx;
    if (o == NULL)
        return;
    if (Py_IsInitialized() && !FL_IS_FINALIZING()) {
        PyGILState_STATE g = PyGILState_Ensure();
        for (Py_ssize_t i = 0; i < o->n; i++)
            PyBuffer_Release(&o->views[i]);
        PyGILState_Release(g);
    }
    free(o);
}

/* Export obj's memory into the owner (None: *data NULL, *len 0).  0, or -1
 * with an exception.  GIL. */
static int
lend(owner *o, PyObject *obj, const char *what, const uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    if (obj == Py_None)
        return 0;
    if (o->n == o->cap) {  /* sized by the caller: 8 per chunk is always enough */
        PyErr_SetString(PyExc_SystemError, "arrow_source: too many buffers (this is a bug)");
        return -1;
    }
    Py_buffer *v = &o->views[o->n];
    if (PyObject_GetBuffer(obj, v, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "arrow_source: the %s buffer must support the buffer protocol, not %.100s",
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    o->n++;
    *data = v->buf;
    *len = (size_t)v->len;
    return 0;
}

/* One field tuple -> f.  0, or -1 with an exception. */
static int
parse_field(owner *o, PyObject *t, const char *what, fl_arrow_binary *f)
{
    memset(f, 0, sizeof *f);
    if (t == Py_None)
        return 0;
    PyObject *validity, *offsets, *data;
    long long offset;
    int width;
    if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "OLOiO", &validity, &offset, &offsets, &width, &data)) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "arrow_source: the %s field must be a tuple (validity, offset, offsets, "
                         "offset_width, data)", what);
        }
        return -1;
    }
    const uint8_t *off_data;
    if (offsets == Py_None) {
        PyErr_Format(PyExc_ValueError, "arrow_source: the %s field has no offsets buffer", what);
        return -1;
    }
    if (lend(o, validity, what, &f->validity, &f->validity_len) < 0 ||
        lend(o, offsets, what, &off_data, &f->offsets_len) < 0 || lend(o, data, what, &f->data, &f->data_len) < 0)
        return -1;
    f->offsets = off_data;
    f->offset = (int64_t)offset;
    f->offset_width = width;
    return 0;
}

/* rows (a C-contiguous int64 buffer) -> a malloc'd copy and its length.
 * 0, or -1 with an exception.  GIL. */
static int
copy_rows(PyObject *obj, int64_t **out, int64_t *n)
{
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *fmt = v.format ? v.format : "B";
    char last = fmt[strlen(fmt) - 1];
    if (v.itemsize != 8 || (last != 'q' && last != 'l') || fmt[0] == '>' || fmt[0] == '!') {
        PyBuffer_Release(&v);
        PyErr_Format(PyExc_TypeError, "arrow_source: rows must be int64 in native byte order, not format '%s'", fmt);
        return -1;
    }
    *n = (int64_t)(v.len / 8);
    *out = malloc((size_t)(v.len ? v.len : 8));
    if (*out == NULL) {
        PyBuffer_Release(&v);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*out, v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return 0;
}

static PyObject *
arrow_source_py(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"chunks", "rows", NULL};
    PyObject *chunks_obj, *rows_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:arrow_source", kwlist, &chunks_obj, &rows_obj))
        return NULL;
    PyObject *seq = PySequence_Fast(chunks_obj, "arrow_source: chunks must be a sequence of tuples");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nchunks = PySequence_Fast_GET_SIZE(seq);
    fl_arrow_chunk *chunks = calloc((size_t)(nchunks ? nchunks : 1), sizeof *chunks);
    /* 7 buffers per chunk at most: the row validity, 3 per field */
    size_t cap = 8 * (size_t)(nchunks ? nchunks : 1);
    owner *o = malloc(sizeof *o + cap * sizeof(Py_buffer));
    int64_t *rows = NULL, n = 0;
    if (chunks == NULL || o == NULL) {
        free(chunks);
        free(o);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    o->n = 0;
    o->cap = (Py_ssize_t)cap;
    for (Py_ssize_t c = 0; c < nchunks; c++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, c), *validity, *bytes_f, *path_f;
        long long length, voff;
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "LOLOO", &length, &validity, &voff, &bytes_f, &path_f)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "arrow_source: chunk %zd must be a tuple (length, validity, "
                             "validity_offset, bytes_field, path_field)", c);
            }
            goto error;
        }
        fl_arrow_chunk *k = &chunks[c];
        k->length = (int64_t)length;
        k->validity_offset = (int64_t)voff;
        if (lend(o, validity, "row", &k->validity, &k->validity_len) < 0)
            goto error;
        if (bytes_f == Py_None) {
            PyErr_Format(PyExc_ValueError, "arrow_source: chunk %zd has no bytes field", c);
            goto error;
        }
        if (parse_field(o, bytes_f, "bytes", &k->bytes) < 0 || parse_field(o, path_f, "path", &k->path) < 0)
            goto error;
    }
    if (rows_obj != Py_None && copy_rows(rows_obj, &rows, &n) < 0)
        goto error;
    if (rows_obj == Py_None)
        for (Py_ssize_t c = 0; c < nchunks; c++)
            n += chunks[c].length;  /* overflow or a bad length: the core refuses the chunk */
    Py_DECREF(seq);
    fl_err err = {0, "", 0};
    /* Ownership of o moves to the core here, also when it fails.  The GIL
     * stays held: this is a copy of n row numbers, once. */
    fl_source *src = fl_source_arrow_new(chunks, (int64_t)nchunks, rows, n, owner_release, o, &err);
    free(chunks);
    free(rows);
    if (src == NULL)
        return fl_py_raise(module, &err, NULL, NULL);
    return fl_py_source_wrap(module, src);
error:
    owner_release(o);
    free(chunks);
    free(rows);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"arrow_source", (PyCFunction)(void (*)(void))arrow_source_py, METH_VARARGS | METH_KEYWORDS,
     "arrow_source(chunks, rows=None) -> Source over an Arrow image column's rows (struct<bytes, path> or binary)"},
    {NULL, NULL, 0, NULL},
};

int
fl_register_arrow(PyObject *m)
{
    return PyModule_AddFunctions(m, module_methods);
}
