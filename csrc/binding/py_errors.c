/* py_errors.c: the one translator from a core error record to a Python
 * exception.
 *
 * Workers never raise: they fill an fl_err (code, errno, message).  Whoever
 * hands the result to Python -- decode_jpeg, NativeDataset.load_batch's
 * events through datasets.py, the device copier -- turns it into an
 * exception here, so every path gives the same type for the same failure:
 *
 *   FL_ERR_IO with an errno  OSError(errno, strerror + where, filename): CPython
 *                            picks the subclass (FileNotFoundError,
 *                            PermissionError, IsADirectoryError, ...); with
 *                            no filename (a stream), the message + where
 *                            in place of strerror
 *   FL_ERR_IO without one    OSError("<msg><where>")
 *   FL_ERR_NOMEM             MemoryError
 *   FL_ERR_INDEX             IndexError
 *   FL_ERR_DECODE, _LIMIT    fastloader.DecodeError (a ValueError): the bytes
 *                            are not a valid image, or exceed a limit
 *   FL_ERR_INVALID           ValueError
 *   FL_ERR_RUNTIME           RuntimeError
 *   FL_ERR_EXPORT            BufferError (DLPack: memory that cannot be
 *                            exported as asked)
 *   anything else            SystemError saying this is a bug
 *
 * `where` is appended to the message (" [sample index 3 (batch 0)]"), so the
 * note naming the sample travels with every type.  All functions here run
 * with the GIL held.
 */
#include "binding/binding.h"

#include <string.h>

#include "core/err.h"

/* The translator proper: `text` (a str, borrowed) is the message without
 * `where`.  Returns a new exception instance, or NULL with an exception set. */
static PyObject *
error_from_text(PyObject *module, int code, int errnum, PyObject *text, PyObject *filename, const char *where)
{
    PyObject *type;
    if (where == NULL)
        where = "";
    switch (code) {
    case FL_ERR_IO:
        if (errnum > 0) {
            /* OSError.__new__ maps errno to its subclass; with a filename
             * str(e) reads "[Errno 2] No such file or directory ...: 'path'" */
            /* without a filename (a shard URL, a stream) the message is
             * the only place that names what failed: keep it whole */
            PyObject *why = (filename != NULL && filename != Py_None) || PyUnicode_GetLength(text) == 0
                                ? PyUnicode_FromFormat("%s%s", strerror(errnum), where)
                                : PyUnicode_FromFormat("%U%s", text, where);
            if (why == NULL)
                return NULL;
            PyObject *e = PyObject_CallFunction(PyExc_OSError, "iOO", errnum, why,
                                                filename != NULL ? filename : Py_None);
            Py_DECREF(why);
            return e;
        }
        /* no errno (a FIFO, a file that shrank): OSError(message); the
         * message names the file (setting .filename without an errno would
         * make str() read "[Errno None] None: ...") */
        type = PyExc_OSError;
        break;
    case FL_ERR_NOMEM:
        type = PyExc_MemoryError;
        break;
    case FL_ERR_INDEX:
        type = PyExc_IndexError;
        break;
    case FL_ERR_DECODE:
    case FL_ERR_LIMIT:
        type = fl_get_state(module)->DecodeError;
        break;
    case FL_ERR_INVALID:
        type = PyExc_ValueError;
        break;
    case FL_ERR_RUNTIME:
        type = PyExc_RuntimeError;
        break;
    case FL_ERR_EXPORT:
        type = PyExc_BufferError;
        break;
    default:
        return PyObject_CallFunction(PyExc_SystemError, "N",
                                     PyUnicode_FromFormat("unexpected error code %d (this is a bug): %U%s",
                                                          code, text, where));
    }
    return PyObject_CallFunction(type, "N", PyUnicode_FromFormat("%U%s", text, where));
}

PyObject *
fl_py_error_new(PyObject *module, int code, int errnum, const char *msg, PyObject *filename, const char *where)
{
    /* "replace": a message cut inside a multi-byte character still reads */
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (text == NULL)
        return NULL;
    PyObject *e = error_from_text(module, code, errnum, text, filename, where);
    Py_DECREF(text);
    return e;
}

PyObject *
fl_py_raise(PyObject *module, const fl_err *err, PyObject *filename, const char *where)
{
    PyObject *e = fl_py_error_new(module, err->code, err->errnum, err->msg, filename, where);
    if (e != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

/* _error(code, errnum, msg, filename=None, where="") -> exception instance */
static PyObject *
fl_error_py(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"code", "errnum", "msg", "filename", "where", NULL};
    int code, errnum;
    const char *where = "";
    PyObject *msg, *filename = Py_None;
    /* msg is any str, also one with the surrogates of a non-UTF-8 file name */
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiU|Os:_error", kwlist, &code, &errnum, &msg, &filename, &where))
        return NULL;
    return error_from_text(m, code, errnum, msg, filename, where);
}

static PyMethodDef fl_error_methods[] = {
    {"_error", (PyCFunction)(void (*)(void))fl_error_py, METH_VARARGS | METH_KEYWORDS,
     "_error(code, errnum, msg, filename=None, where='') -> exception: the exception a core error record "
     "becomes (the one translator, shared with the C paths)"},
    {NULL, NULL, 0, NULL},
};

int
fl_register_errors(PyObject *m)
{
    if (PyModule_AddFunctions(m, fl_error_methods) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "ERR_DECODE", FL_ERR_DECODE) < 0 ||
        PyModule_AddIntConstant(m, "ERR_NOMEM", FL_ERR_NOMEM) < 0 ||
        PyModule_AddIntConstant(m, "ERR_LIMIT", FL_ERR_LIMIT) < 0 ||
        PyModule_AddIntConstant(m, "ERR_IO", FL_ERR_IO) < 0 ||
        PyModule_AddIntConstant(m, "ERR_INDEX", FL_ERR_INDEX) < 0 ||
        PyModule_AddIntConstant(m, "ERR_INVALID", FL_ERR_INVALID) < 0 ||
        PyModule_AddIntConstant(m, "ERR_RUNTIME", FL_ERR_RUNTIME) < 0 ||
        PyModule_AddIntConstant(m, "ERR_EXPORT", FL_ERR_EXPORT) < 0)
        return -1;
    return 0;
}
