/* py_cuda.c: the Python face of cuda.c.
 *
 *   cuda_info(search_paths=())  -> dict; never raises because CUDA is absent
 *   cuda_require(device_index, search_paths=()) -> None, or RuntimeError
 *                                  saying which piece is missing
 *   _cuda_pinned_roundtrip(data, device=0, register=False)       (tests)
 *   _cuda_device_roundtrip(data, device=0, two_streams=False,
 *                          register=False)                       (tests)
 *
 * Loading.  cuda.c loads libcudart once per process (fl_cuda_probe): on
 * the first call this file turns the caller's search_paths and the str
 * entries of sys.path into C strings, and cuda.c tries those files, then
 * the nvidia-* wheels' copies under each sys.path entry.  Later calls get
 * the first outcome whatever search_paths they pass.
 *
 * GIL.  Directory scans, dlopen and every CUDA call run with the GIL
 * released (the first cudaGetDeviceCount initialises the driver and may
 * take seconds).  Memory used there comes from malloc, not PyMem_Malloc.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include "cuda/cuda.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- errors ---------------------------------------------------------------- */

/* Raise RuntimeError (FL_ERR_RUNTIME) through the one translator with the
 * message PyUnicode_FromFormat(fmt, ...) makes, as PyErr_Format would: of
 * any length, since cuda_require adds to a core message (the tried list, a
 * library path) and an fl_err's msg would cut it.  Returns NULL. */
static PyObject *
raise_runtime(PyObject *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *text = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!text)
        return NULL;
    const char *msg = PyUnicode_AsUTF8(text);
    PyObject *e = msg ? fl_py_error_new(m, FL_ERR_RUNTIME, 0, msg, NULL, NULL) : NULL;
    Py_DECREF(text);
    if (e) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

/* ---- Python paths -> C strings --------------------------------------------- */

/* C strings borrowed from bytes objects that `keep` holds: valid, and
 * readable without the GIL, while keep lives.  The array comes from malloc
 * because it is read without the GIL. */
typedef struct {
    PyObject *keep;   /* list of bytes (owned) */
    const char **v;   /* n pointers into keep's items (malloc) */
    size_t n;
} cstrs;

static void
cstrs_clear(cstrs *c)
{
    Py_CLEAR(c->keep);
    free(c->v);
    c->v = NULL;
    c->n = 0;
}

/* Point c->v at the items of c->keep.  0, or -1 with MemoryError. */
static int
cstrs_finish(cstrs *c)
{
    Py_ssize_t n = PyList_GET_SIZE(c->keep);
    c->v = malloc(sizeof *c->v * (size_t)(n ? n : 1));
    if (!c->v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        c->v[i] = PyBytes_AS_STRING(PyList_GET_ITEM(c->keep, i));
    c->n = (size_t)n;
    return 0;
}

/* Each entry of the iterable `paths` (str, bytes or os.PathLike) as a file
 * system path.  GIL held.  Returns 0, or -1 with an exception set. */
static int
collect_paths(PyObject *paths, cstrs *out)
{
    if (PyUnicode_Check(paths) || PyBytes_Check(paths) || PyObject_HasAttrString(paths, "__fspath__")) {
        PyErr_SetString(PyExc_TypeError,
                        "search_paths must be an iterable of paths, not a single path");
        return -1;
    }
    PyObject *it = PyObject_GetIter(paths);
    if (!it)
        return -1;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        PyObject *b = NULL;
        int ok = PyUnicode_FSConverter(item, &b);
        Py_DECREF(item);
        if (!ok || PyList_Append(out->keep, b) < 0) {
            Py_XDECREF(b);
            Py_DECREF(it);
            return -1;
        }
        Py_DECREF(b);
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

/* The sys.path entries that are str (others, e.g. None or path hooks, are
 * ignored, and so are entries the file system encoding cannot express:
 * they cannot hold the library).  GIL held.  0, or -1 with an exception. */
static int
collect_sys_path(cstrs *out)
{
    PyObject *path = PySys_GetObject("path"); /* borrowed */
    if (!path || !PyList_Check(path))
        return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(path); i++) {
        PyObject *entry = PyList_GET_ITEM(path, i);
        if (!PyUnicode_Check(entry))
            continue;
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(entry, &b)) {
            PyErr_Clear();
            continue;
        }
        int rc = PyList_Append(out->keep, b);
        Py_DECREF(b);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* fl_cuda_probe (cuda.h) with search_paths (may be NULL) and sys.path.  GIL
 * held on entry and exit, released inside.  Returns 0 (p filled, whatever
 * CUDA's state), or -1 with an exception set (bad search_paths, out of
 * memory). */
static int
probe(PyObject *search_paths, fl_cuda_probe_result *p)
{
    cstrs files = {0}, roots = {0};
    int rc = -1;
    if (!(files.keep = PyList_New(0)) || !(roots.keep = PyList_New(0)))
        goto done;
    /* search_paths is checked on every call, so a bad argument fails the
     * same way before and after the first load. */
    if (search_paths && collect_paths(search_paths, &files) < 0)
        goto done;
    if (!fl_cuda_get_api() && collect_sys_path(&roots) < 0)
        goto done;
    if (cstrs_finish(&files) < 0 || cstrs_finish(&roots) < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_cuda_probe(files.v, files.n, roots.v, roots.n, p);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        PyErr_NoMemory();
done:
    cstrs_clear(&files);
    cstrs_clear(&roots);
    return rc;
}

/* Load libcudart if needed; RuntimeError when it cannot be found. */
static int
require_loaded(PyObject *m)
{
    fl_cuda_probe_result p;
    if (fl_cuda_get_api())
        return 0;
    if (probe(NULL, &p) < 0)
        return -1;
    if (!p.loaded) {
        fl_py_raise(m, &p.load_err, NULL, NULL);
        return -1;
    }
    return 0;
}

/* ---- cuda_info / cuda_require ------------------------------------------- */

static PyObject *
fl_cuda_info(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"search_paths", NULL};
    PyObject *search_paths = NULL;
    fl_cuda_probe_result p;
    (void)m;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:cuda_info", kwlist, &search_paths))
        return NULL;
    if (probe(search_paths, &p) < 0)
        return NULL;
    if (!p.loaded)
        return Py_BuildValue("{s:O,s:O,s:O,s:O,s:i,s:s}", "found", Py_False, "library", Py_None,
                             "runtime_version", Py_None, "driver_version", Py_None, "devices", 0,
                             "error", p.load_err.msg);

    PyObject *library = PyUnicode_DecodeFSDefault(fl_cuda_library_path());
    if (!library)
        return NULL;
    const char *error = NULL;
    char none_msg[] = "no CUDA device (cudaGetDeviceCount returned 0)";
    if (p.count_rc != FL_CUDA_OK)
        error = p.count_err.msg;
    else if (p.vers_rc != FL_CUDA_OK)
        error = p.vers_err.msg;
    else if (p.count == 0)
        error = none_msg;
    PyObject *runtime = p.vers_rc == FL_CUDA_OK ? PyLong_FromLong(p.runtime) : Py_NewRef(Py_None);
    PyObject *driver = p.vers_rc == FL_CUDA_OK ? PyLong_FromLong(p.driver) : Py_NewRef(Py_None);
    PyObject *res = NULL;
    if (runtime && driver)
        res = Py_BuildValue("{s:O,s:O,s:O,s:O,s:i,s:z}", "found", Py_True, "library", library,
                            "runtime_version", runtime, "driver_version", driver, "devices",
                            p.count, "error", error);
    Py_DECREF(library);
    Py_XDECREF(runtime);
    Py_XDECREF(driver);
    return res;
}

static PyObject *
fl_cuda_require(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"device_index", "search_paths", NULL};
    int index;
    PyObject *search_paths = NULL;
    fl_cuda_probe_result p;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|O:cuda_require", kwlist, &index,
                                     &search_paths))
        return NULL;
    if (index < 0)
        return PyErr_Format(PyExc_ValueError, "CUDA device index must be >= 0, got %d", index);
    if (probe(search_paths, &p) < 0)
        return NULL;
    if (!p.loaded)
        return raise_runtime(m,
                             "%s; install the CUDA runtime (it comes with torch's CUDA wheels) or "
                             "set FASTLOADER_CUDART to the path of libcudart.so",
                             p.load_err.msg);

    const fl_cuda_api *api = fl_cuda_get_api();
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    char visible[256] = "";
    if (vis)
        snprintf(visible, sizeof visible, "; CUDA_VISIBLE_DEVICES=\"%.200s\"", vis);
    switch (p.count_rc) {
    case FL_CUDA_OK:
        break;
    case FL_CUDA_ERR_INSUFFICIENT_DRIVER:
    case FL_CUDA_ERR_STUB_LIBRARY:
    case FL_CUDA_ERR_SYSTEM_DRIVER_MISMATCH: {
        char drv[64];
        if (p.vers_rc == FL_CUDA_OK && p.driver > 0)
            snprintf(drv, sizeof drv, "driver supports CUDA %d.%d", p.driver / 1000,
                     (p.driver % 1000) / 10);
        else
            snprintf(drv, sizeof drv, "no driver found");
        return raise_runtime(m,
                             "CUDA driver missing or too old (%s: %s); the CUDA runtime %d.%d at "
                             "%s needs an NVIDIA driver for CUDA %d.%d or newer, %s",
                             api->GetErrorName(p.count_rc), api->GetErrorString(p.count_rc),
                             p.runtime / 1000, (p.runtime % 1000) / 10, fl_cuda_library_path(),
                             p.runtime / 1000, (p.runtime % 1000) / 10, drv);
    }
    case FL_CUDA_ERR_NO_DEVICE:
        return raise_runtime(m, "no CUDA device (%s: %s)%s", api->GetErrorName(p.count_rc),
                             api->GetErrorString(p.count_rc), visible);
    default:
        return raise_runtime(m, "CUDA is not usable: %s", p.count_err.msg);
    }
    if (p.count == 0)
        return raise_runtime(m, "no CUDA device (cudaGetDeviceCount returned 0)%s", visible);
    if (index >= p.count)
        return raise_runtime(m, "CUDA device %d requested but only %d present%s", index, p.count,
                             visible);
    Py_RETURN_NONE;
}

int
fl_py_cuda_require(PyObject *module, int device)
{
    PyObject *args = Py_BuildValue("(i)", device);
    if (!args)
        return -1;
    PyObject *r = fl_cuda_require(module, args, NULL);
    Py_DECREF(args);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ---- test helpers (the round trips themselves are cuda_roundtrip.c's) ------ */

/* The body of both round trips: data copied through page-locked host
 * memory (device_trip: and `device`'s memory, two_streams as
 * fl_cuda_device_roundtrip takes it) back into a new bytes object.  GIL
 * held; released around the copy.  Releases *data whatever happens.
 * Returns the bytes, or NULL with ValueError (empty data), the
 * require_loaded error, or the core's error through the translator
 * (RuntimeError with the CUDA message). */
static PyObject *
roundtrip_bytes(PyObject *m, Py_buffer *data, int device, int device_trip, int two_streams, int reg)
{
    fl_err err = {0};
    size_t n = (size_t)data->len;
    PyObject *out = NULL;
    int rc;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "data must not be empty");
        goto done;
    }
    if (require_loaded(m) < 0)
        goto done;
    /* A fresh bytes object that no other thread can see yet: filled below
     * without the GIL. */
    out = PyBytes_FromStringAndSize(NULL, data->len);
    if (!out)
        goto done;
    char *dst = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    if (device_trip)
        rc = fl_cuda_device_roundtrip(device, data->buf, dst, n, two_streams, reg, &err);
    else
        rc = fl_cuda_pinned_roundtrip(device, data->buf, dst, n, reg, &err);
    Py_END_ALLOW_THREADS
    if (rc != FL_CUDA_OK) {
        fl_py_raise(m, &err, NULL, NULL);
        Py_CLEAR(out);
    }
done:
    PyBuffer_Release(data);
    return out;
}

static PyObject *
py_cuda_pinned_roundtrip(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"data", "device", "register", NULL};
    Py_buffer data;
    int device = 0, reg = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|ip:_cuda_pinned_roundtrip", kwlist, &data,
                                     &device, &reg))
        return NULL;
    return roundtrip_bytes(m, &data, device, 0, 0, reg);
}

static PyObject *
py_cuda_device_roundtrip(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"data", "device", "two_streams", "register", NULL};
    Py_buffer data;
    int device = 0, two = 0, reg = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|ipp:_cuda_device_roundtrip", kwlist, &data,
                                     &device, &two, &reg))
        return NULL;
    return roundtrip_bytes(m, &data, device, 1, two, reg);
}

/* ---- registration -------------------------------------------------------- */

static PyMethodDef fl_cuda_methods[] = {
    {"cuda_info", (PyCFunction)(void (*)(void))fl_cuda_info, METH_VARARGS | METH_KEYWORDS,
     "cuda_info(search_paths=()) -> dict(found, library, runtime_version, driver_version,\n"
     "devices, error)\n\n"
     "Load the CUDA runtime (first call only; FASTLOADER_CUDART overrides the search, then a\n"
     "libcudart already loaded, search_paths, the nvidia-* wheels on sys.path, CUDA_HOME,\n"
     "/usr/local/cuda, the system) and describe it.  Never raises because CUDA is missing:\n"
     "`error` says why CUDA is unusable (None when at least one device is usable)."},
    {"cuda_require", (PyCFunction)(void (*)(void))fl_cuda_require, METH_VARARGS | METH_KEYWORDS,
     "cuda_require(device_index, search_paths=()) -> None\n\n"
     "Raise RuntimeError naming what is missing: the CUDA runtime library, the driver, any\n"
     "device, or device `device_index`."},
    {"_cuda_pinned_roundtrip", (PyCFunction)(void (*)(void))py_cuda_pinned_roundtrip,
     METH_VARARGS | METH_KEYWORDS,
     "_cuda_pinned_roundtrip(data, device=0, register=False) -> bytes\n\n"
     "Private, for tests: copy data through page-locked host memory (cudaHostAlloc, or\n"
     "cudaHostRegister of aligned memory) and back."},
    {"_cuda_device_roundtrip", (PyCFunction)(void (*)(void))py_cuda_device_roundtrip,
     METH_VARARGS | METH_KEYWORDS,
     "_cuda_device_roundtrip(data, device=0, two_streams=False, register=False) -> bytes\n\n"
     "Private, for tests: pinned host -> device (cudaMemcpyAsync on a non-blocking stream,\n"
     "then an event) -> host, returning what came back.  two_streams: the copy back runs on\n"
     "a second stream that waits on the first one's event."},
    {NULL, NULL, 0, NULL},
};

int
fl_register_cuda(PyObject *m)
{
    return PyModule_AddFunctions(m, fl_cuda_methods);
}
