/* py_cuda.c: the Python face of cuda.c.
 *
 *   cuda_info(search_paths=())  -> dict; never raises because CUDA is absent
 *   cuda_require(device_index, search_paths=()) -> None, or RuntimeError
 *                                  saying which piece is missing
 *   _cuda_pinned_roundtrip(data, device=0, register=False)       (tests)
 *   _cuda_device_roundtrip(data, device=0, two_streams=False,
 *                          register=False)                       (tests)
 *
 * Loading.  cuda.c loads libcudart once per process.  On the first call we
 * hand it the caller's search_paths, then the copies the nvidia-* wheels
 * (installed with torch) keep under every sys.path entry:
 * nvidia/cu13/lib/libcudart.so* (CUDA 13 wheels) and
 * nvidia/cuda_runtime/lib/libcudart.so* (CUDA 12 wheels), newest first.
 * Later calls get the first outcome whatever search_paths they pass.
 *
 * GIL.  Directory scans, dlopen and every CUDA call run with the GIL
 * released (the first cudaGetDeviceCount initialises the driver and may
 * take seconds).  Memory used there comes from malloc, not PyMem_Malloc.
 */
#define NO_IMPORT_ARRAY
#include "binding.h"
#include "cuda.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FL_CUDA_ERRLEN 4096

/* ---- a growable list of malloc'ed C strings (usable without the GIL) ---- */

typedef struct {
    char **v;
    size_t n, cap;
} strv;

static int
strv_push(strv *s, const char *str)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        char **v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    char *d = strdup(str);
    if (!d)
        return -1;
    s->v[s->n++] = d;
    return 0;
}

static void
strv_free(strv *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static int
cmp_desc(const void *a, const void *b)
{
    return strcmp(*(char *const *)b, *(char *const *)a);
}

/* Append dir/libcudart.so* to out, newest version first ("libcudart.so.13"
 * sorts after "libcudart.so.12" and "libcudart.so").  A missing directory
 * adds nothing.  Returns -1 on out of memory.  No GIL needed. */
static int
scan_dir(const char *dir, strv *out)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    strv names = {0};
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (strncmp(nm, "libcudart.so", 12) == 0 && (nm[12] == '\0' || nm[12] == '.'))
            if (strv_push(&names, nm) < 0) {
                rc = -1;
                break;
            }
    }
    closedir(d);
    if (names.n > 1)
        qsort(names.v, names.n, sizeof *names.v, cmp_desc);
    for (size_t i = 0; rc == 0 && i < names.n; i++) {
        size_t len = strlen(dir) + 1 + strlen(names.v[i]) + 1;
        char *p = malloc(len);
        if (!p) {
            rc = -1;
            break;
        }
        snprintf(p, len, "%s/%s", dir, names.v[i]);
        rc = strv_push(out, p);
        free(p);
    }
    strv_free(&names);
    return rc;
}

/* ---- probing ------------------------------------------------------------- */

typedef struct {
    int loaded;      /* libcudart is loaded */
    int vers_rc;     /* fl_cuda_versions result */
    int runtime, driver;
    int count_rc;    /* fl_cuda_device_count result */
    int count;
    char load_err[FL_CUDA_ERRLEN];
    char vers_err[FL_CUDA_ERRLEN];
    char count_err[FL_CUDA_ERRLEN];
} cuda_probe;

/* Append each entry of the iterable `paths` (str, bytes or os.PathLike) to
 * out.  GIL held.  Returns 0, or -1 with an exception set. */
static int
collect_paths(PyObject *paths, strv *out)
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
        if (!ok) {
            Py_DECREF(it);
            return -1;
        }
        int rc = strv_push(out, PyBytes_AS_STRING(b));
        Py_DECREF(b);
        if (rc < 0) {
            Py_DECREF(it);
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

/* sys.path entries that are str (others, e.g. None or path hooks, are
 * ignored), each followed by the two wheel library directories. */
static int
collect_wheel_dirs(strv *out)
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
            PyErr_Clear(); /* an unencodable entry cannot hold the library */
            continue;
        }
        const char *base = PyBytes_AS_STRING(b);
        const char *subs[] = {"nvidia/cu13/lib", "nvidia/cuda_runtime/lib"};
        int rc = 0;
        for (size_t k = 0; rc == 0 && k < 2; k++) {
            size_t len = strlen(base) + 1 + strlen(subs[k]) + 1;
            char *p = malloc(len);
            if (!p) {
                rc = -1;
                break;
            }
            snprintf(p, len, "%s/%s", base[0] ? base : ".", subs[k]);
            rc = strv_push(out, p);
            free(p);
        }
        Py_DECREF(b);
        if (rc < 0) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* Load libcudart (first call only) and query versions and device count.
 * search_paths may be NULL.  GIL held on entry and exit, released inside.
 * Returns 0 (p filled, whatever CUDA's state), or -1 with an exception set
 * (bad search_paths, out of memory). */
static int
probe(PyObject *search_paths, cuda_probe *p)
{
    strv files = {0}, dirs = {0};
    int oom = 0;
    memset(p, 0, sizeof *p);
    /* search_paths is checked on every call, so a bad argument fails the
     * same way before and after the first load. */
    if (search_paths && collect_paths(search_paths, &files) < 0)
        goto error;
    if (!fl_cuda_get_api() && collect_wheel_dirs(&dirs) < 0)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < dirs.n && !oom; i++)
        oom = scan_dir(dirs.v[i], &files) < 0;
    if (!oom) {
        p->loaded = fl_cuda_load((const char *const *)files.v, files.n, p->load_err,
                                 sizeof p->load_err) == FL_CUDA_OK;
        if (p->loaded) {
            p->vers_rc = fl_cuda_versions(&p->runtime, &p->driver, p->vers_err, sizeof p->vers_err);
            p->count_rc = fl_cuda_device_count(&p->count, p->count_err, sizeof p->count_err);
        }
    }
    Py_END_ALLOW_THREADS
    strv_free(&files);
    strv_free(&dirs);
    if (oom) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
error:
    strv_free(&files);
    strv_free(&dirs);
    return -1;
}

/* Load libcudart if needed; RuntimeError when it cannot be found. */
static int
require_loaded(void)
{
    cuda_probe p;
    if (fl_cuda_get_api())
        return 0;
    if (probe(NULL, &p) < 0)
        return -1;
    if (!p.loaded) {
        PyErr_SetString(PyExc_RuntimeError, p.load_err);
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
    cuda_probe p;
    (void)m;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:cuda_info", kwlist, &search_paths))
        return NULL;
    if (probe(search_paths, &p) < 0)
        return NULL;
    if (!p.loaded)
        return Py_BuildValue("{s:O,s:O,s:O,s:O,s:i,s:s}", "found", Py_False, "library", Py_None,
                             "runtime_version", Py_None, "driver_version", Py_None, "devices", 0,
                             "error", p.load_err);

    PyObject *library = PyUnicode_DecodeFSDefault(fl_cuda_library_path());
    if (!library)
        return NULL;
    const char *error = NULL;
    char none_msg[] = "no CUDA device (cudaGetDeviceCount returned 0)";
    if (p.count_rc != FL_CUDA_OK)
        error = p.count_err;
    else if (p.vers_rc != FL_CUDA_OK)
        error = p.vers_err;
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
    cuda_probe p;
    (void)m;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|O:cuda_require", kwlist, &index,
                                     &search_paths))
        return NULL;
    if (index < 0)
        return PyErr_Format(PyExc_ValueError, "CUDA device index must be >= 0, got %d", index);
    if (probe(search_paths, &p) < 0)
        return NULL;
    if (!p.loaded)
        return PyErr_Format(PyExc_RuntimeError,
                            "%s; install the CUDA runtime (it comes with torch's CUDA wheels) or "
                            "set FASTLOADER_CUDART to the path of libcudart.so",
                            p.load_err);

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
        return PyErr_Format(PyExc_RuntimeError,
                            "CUDA driver missing or too old (%s: %s); the CUDA runtime %d.%d at "
                            "%s needs an NVIDIA driver for CUDA %d.%d or newer, %s",
                            api->GetErrorName(p.count_rc), api->GetErrorString(p.count_rc),
                            p.runtime / 1000, (p.runtime % 1000) / 10, fl_cuda_library_path(),
                            p.runtime / 1000, (p.runtime % 1000) / 10, drv);
    }
    case FL_CUDA_ERR_NO_DEVICE:
        return PyErr_Format(PyExc_RuntimeError, "no CUDA device (%s: %s)%s",
                            api->GetErrorName(p.count_rc), api->GetErrorString(p.count_rc),
                            visible);
    default:
        return PyErr_Format(PyExc_RuntimeError, "CUDA is not usable: %s", p.count_err);
    }
    if (p.count == 0)
        return PyErr_Format(PyExc_RuntimeError, "no CUDA device (cudaGetDeviceCount returned 0)%s",
                            visible);
    if (index >= p.count)
        return PyErr_Format(PyExc_RuntimeError, "CUDA device %d requested but only %d present%s",
                            index, p.count, visible);
    Py_RETURN_NONE;
}

int
fl_py_cuda_require(int device)
{
    PyObject *args = Py_BuildValue("(i)", device);
    if (!args)
        return -1;
    PyObject *r = fl_cuda_require(NULL, args, NULL);
    Py_DECREF(args);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ---- test helpers -------------------------------------------------------- */

/* Host memory that is page-locked either by cudaHostAlloc or by
 * cudaHostRegister of page-aligned malloc memory. */
typedef struct {
    void *ptr;
    int registered;
} pinned;

static int
pinned_alloc(pinned *h, int device, size_t n, int reg, char *err, size_t errlen)
{
    h->ptr = NULL;
    h->registered = 0;
    if (!reg)
        return fl_cuda_host_alloc(device, n, &h->ptr, err, errlen);
    long page = sysconf(_SC_PAGESIZE);
    size_t align = page > 0 ? (size_t)page : 4096;
    size_t len = (n + align - 1) / align * align;
    void *p = NULL;
    if (posix_memalign(&p, align, len) != 0) {
        snprintf(err, errlen, "out of memory (%zu bytes)", len);
        return -1;
    }
    int rc = fl_cuda_host_register(device, p, len, err, errlen);
    if (rc != FL_CUDA_OK) {
        free(p);
        return rc;
    }
    h->ptr = p;
    h->registered = 1;
    return FL_CUDA_OK;
}

/* Release h; keeps the first error in err (when *rc is still 0). */
static void
pinned_free(pinned *h, int *rc, char *err, size_t errlen)
{
    if (!h->ptr)
        return;
    int r;
    if (h->registered) {
        r = fl_cuda_host_unregister(-1, h->ptr, *rc ? NULL : err, errlen);
        free(h->ptr);
    } else {
        r = fl_cuda_host_free(-1, h->ptr, *rc ? NULL : err, errlen);
    }
    if (!*rc)
        *rc = r;
    h->ptr = NULL;
}

static PyObject *
fl_cuda_pinned_roundtrip(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"data", "device", "register", NULL};
    Py_buffer data;
    int device = 0, reg = 0, rc;
    char err[FL_CUDA_ERRLEN] = "";
    (void)m;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|ip:_cuda_pinned_roundtrip", kwlist, &data,
                                     &device, &reg))
        return NULL;
    size_t n = (size_t)data.len;
    PyObject *out = NULL;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "data must not be empty");
        goto done;
    }
    if (require_loaded() < 0)
        goto done;
    /* A fresh bytes object that no other thread can see yet: filled below
     * without the GIL. */
    out = PyBytes_FromStringAndSize(NULL, data.len);
    if (!out)
        goto done;
    char *dst = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    pinned h;
    rc = pinned_alloc(&h, device, n, reg, err, sizeof err);
    if (rc == FL_CUDA_OK) {
        memcpy(h.ptr, data.buf, n);
        memcpy(dst, h.ptr, n);
    }
    pinned_free(&h, &rc, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != FL_CUDA_OK) {
        PyErr_SetString(PyExc_RuntimeError, err);
        Py_CLEAR(out);
    }
done:
    PyBuffer_Release(&data);
    return out;
}

/* Copy src (n bytes) to `device` and back; the result lands in dst.  The
 * device buffer is first filled with the complement of src, so a D2H that
 * does not wait for the H2D returns wrong bytes.  two_streams: the H2D runs
 * on stream A, stream B waits on A's event and runs the D2H.  No GIL. */
static int
device_roundtrip(int device, const void *src, void *dst, size_t n, int two_streams, int reg,
                 char *err, size_t errlen)
{
    pinned hsrc = {0}, hdst = {0};
    void *dbuf = NULL;
    fl_cudaStream_t sa = NULL, sb = NULL;
    fl_cudaEvent_t ea = NULL, eb = NULL;
    int rc;

    if ((rc = pinned_alloc(&hsrc, device, n, reg, err, errlen)) ||
        (rc = pinned_alloc(&hdst, device, n, 0, err, errlen)) ||
        (rc = fl_cuda_malloc(device, n, &dbuf, err, errlen)) ||
        (rc = fl_cuda_stream_create(device, &sa, err, errlen)) ||
        (rc = fl_cuda_event_create(device, 0, &ea, err, errlen)) ||
        (rc = fl_cuda_event_create(device, 1, &eb, err, errlen)))
        goto done;
    if (two_streams && (rc = fl_cuda_stream_create(device, &sb, err, errlen)))
        goto done;
    memcpy(hsrc.ptr, src, n);
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)hdst.ptr)[i] = (unsigned char)~((const unsigned char *)src)[i];
    /* Prefill the device buffer with the complement and wait for it. */
    if ((rc = fl_cuda_memcpy_h2d_async(device, dbuf, hdst.ptr, n, sa, err, errlen)) ||
        (rc = fl_cuda_stream_synchronize(device, sa, err, errlen)))
        goto done;
    memset(hdst.ptr, 0, n);
    fl_cudaStream_t sd = two_streams ? sb : sa;
    if ((rc = fl_cuda_memcpy_h2d_async(device, dbuf, hsrc.ptr, n, sa, err, errlen)) ||
        (rc = fl_cuda_event_record(device, ea, sa, err, errlen)))
        goto done;
    if (two_streams && (rc = fl_cuda_stream_wait_event(device, sb, ea, err, errlen)))
        goto done;
    if ((rc = fl_cuda_memcpy_d2h_async(device, hdst.ptr, dbuf, n, sd, err, errlen)) ||
        (rc = fl_cuda_event_record(device, eb, sd, err, errlen)) ||
        (rc = fl_cuda_event_synchronize(device, eb, err, errlen)))
        goto done;
    /* Both events have completed now: a query must say so. */
    int qa = fl_cuda_event_query(device, ea, err, errlen), qb = fl_cuda_event_query(device, eb, err, errlen);
    if (qa != FL_CUDA_OK || qb != FL_CUDA_OK) {
        if (qa == FL_CUDA_ERR_NOT_READY || qb == FL_CUDA_ERR_NOT_READY)
            snprintf(err, errlen, "cudaEventQuery reported pending work after cudaEventSynchronize");
        rc = qa != FL_CUDA_OK ? qa : qb;
        goto done;
    }
    memcpy(dst, hdst.ptr, n);
done:;
    /* Release everything; keep the first error. */
    int r;
#define FL_KEEP(call)                                                                              \
    do {                                                                                           \
        r = (call);                                                                                \
        if (!rc)                                                                                   \
            rc = r;                                                                                \
    } while (0)
    if (sa)
        FL_KEEP(fl_cuda_stream_synchronize(device, sa, rc ? NULL : err, errlen));
    if (sb)
        FL_KEEP(fl_cuda_stream_synchronize(device, sb, rc ? NULL : err, errlen));
    FL_KEEP(fl_cuda_event_destroy(device, ea, rc ? NULL : err, errlen));
    FL_KEEP(fl_cuda_event_destroy(device, eb, rc ? NULL : err, errlen));
    FL_KEEP(fl_cuda_stream_destroy(device, sa, rc ? NULL : err, errlen));
    FL_KEEP(fl_cuda_stream_destroy(device, sb, rc ? NULL : err, errlen));
    FL_KEEP(fl_cuda_free(device, dbuf, rc ? NULL : err, errlen));
#undef FL_KEEP
    pinned_free(&hsrc, &rc, err, errlen);
    pinned_free(&hdst, &rc, err, errlen);
    return rc;
}

static PyObject *
fl_cuda_device_roundtrip(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"data", "device", "two_streams", "register", NULL};
    Py_buffer data;
    int device = 0, two = 0, reg = 0, rc;
    char err[FL_CUDA_ERRLEN] = "";
    (void)m;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|ipp:_cuda_device_roundtrip", kwlist, &data,
                                     &device, &two, &reg))
        return NULL;
    PyObject *out = NULL;
    if (data.len == 0) {
        PyErr_SetString(PyExc_ValueError, "data must not be empty");
        goto done;
    }
    if (require_loaded() < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, data.len); /* private until returned */
    if (!out)
        goto done;
    char *dst = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    rc = device_roundtrip(device, data.buf, dst, (size_t)data.len, two, reg, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != FL_CUDA_OK) {
        PyErr_SetString(PyExc_RuntimeError, err);
        Py_CLEAR(out);
    }
done:
    PyBuffer_Release(&data);
    return out;
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
    {"_cuda_pinned_roundtrip", (PyCFunction)(void (*)(void))fl_cuda_pinned_roundtrip,
     METH_VARARGS | METH_KEYWORDS,
     "_cuda_pinned_roundtrip(data, device=0, register=False) -> bytes\n\n"
     "Private, for tests: copy data through page-locked host memory (cudaHostAlloc, or\n"
     "cudaHostRegister of aligned memory) and back."},
    {"_cuda_device_roundtrip", (PyCFunction)(void (*)(void))fl_cuda_device_roundtrip,
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
