/* py_mix.c: Python binding of the batch stage (image/mix.h), registered by
 * fl_register_mix:
 *   _mix_batch(images, labels, spec, seed, epoch, batch, num_classes) -> (soft_labels, params)
 *       images: a writable C-contiguous float32 ndarray N x C x H x W,
 *       mixed in place; labels: int64 ndarray (N,); spec: dict(kinds=[0|1,
 *       ...], alphas=[...], p=[...]) (0 MixUp, 1 CutMix); returns the
 *       N x num_classes float32 soft labels and dict(kind, lam, box).
 *   _timm_mix_batch(images, labels, spec, seed, epoch, batch) -> (soft_labels, params)
 *       timm's Mixup (image/mix.h fl_timm_mix_*) on the same arrays; spec:
 *       dict(mixup_alpha, cutmix_alpha, cutmix_minmax (None or (lo, hi)),
 *       prob, switch_prob, mode (0 batch, 1 pair, 2 elem), correct_lam,
 *       enabled, label_smoothing, num_classes); returns the
 *       N x num_classes float32 soft labels and dict(mode, mixed, use_cutmix,
 *       lam_draw, lam, randint, box), one list entry per draw (1, N / 2 or N).
 * fastloader/batch.py calls them on each batch of a loader with a native
 * batch_transform.  Each runs with the GIL held except around the draws and
 * the mixing, while the call holds references to both arrays.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include <numpy/arrayobject.h>

#include <stdlib.h>
#include <string.h>

#include "image/mix.h"

/* spec dict -> fl_mix_spec.  Returns 0 or -1 with ValueError/TypeError. */
static int
fl_mix_spec_from_pydict(PyObject *d, fl_mix_spec *s)
{
    memset(s, 0, sizeof *s);
    PyObject *kinds = PyDict_Check(d) ? PyDict_GetItemString(d, "kinds") : NULL;
    PyObject *alphas = PyDict_Check(d) ? PyDict_GetItemString(d, "alphas") : NULL;
    PyObject *ps = PyDict_Check(d) ? PyDict_GetItemString(d, "p") : NULL;
    if (kinds == NULL || alphas == NULL || ps == NULL) {
        PyErr_SetString(PyExc_ValueError, "mix spec: a dict with 'kinds', 'alphas' and 'p'");
        return -1;
    }
    PyObject *k = PySequence_Fast(kinds, "mix spec: 'kinds' must be a sequence");
    PyObject *a = k ? PySequence_Fast(alphas, "mix spec: 'alphas' must be a sequence") : NULL;
    PyObject *p = a ? PySequence_Fast(ps, "mix spec: 'p' must be a sequence") : NULL;
    int rc = -1;
    if (p == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(k);
    if (n < 1 || n > FL_MIX_MAX_CHOICES || PySequence_Fast_GET_SIZE(a) != n || PySequence_Fast_GET_SIZE(p) != n) {
        PyErr_Format(PyExc_ValueError, "mix spec: 1..%d choices, with as many alphas and weights", FL_MIX_MAX_CHOICES);
        goto done;
    }
    s->n = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        long kind = PyLong_AsLong(PySequence_Fast_GET_ITEM(k, i));
        double alpha = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(a, i));
        double w = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(p, i));
        if (PyErr_Occurred())
            goto done;
        s->kind[i] = (int)kind;
        s->alpha[i] = alpha;
        s->p[i] = w;
    }
    rc = 0;
done:
    Py_XDECREF(k);
    Py_XDECREF(a);
    Py_XDECREF(p);
    return rc;
}

static PyObject *
fl_py_mix_batch(PyObject *m, PyObject *args)
{
    PyObject *images, *labels, *spec;
    unsigned long long seed, epoch, batch;
    int num_classes;
    if (!PyArg_ParseTuple(args, "OOOKKKi:_mix_batch", &images, &labels, &spec, &seed, &epoch, &batch, &num_classes))
        return NULL;
    fl_mix_spec s;
    if (fl_mix_spec_from_pydict(spec, &s) < 0)
        return NULL;
    if (!PyArray_Check(images) || PyArray_TYPE((PyArrayObject *)images) != NPY_FLOAT32
        || PyArray_NDIM((PyArrayObject *)images) != 4 || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)images)
        || !PyArray_ISWRITEABLE((PyArrayObject *)images)) {
        PyErr_SetString(PyExc_TypeError, "_mix_batch: images must be a writable C-contiguous float32 N x C x H x W "
                                         "array");
        return NULL;
    }
    PyArrayObject *lab = (PyArrayObject *)PyArray_FROM_OTF(labels, NPY_INT64, NPY_ARRAY_IN_ARRAY);
    if (lab == NULL)
        return NULL;
    PyArrayObject *img = (PyArrayObject *)images;
    npy_intp *sh = PyArray_DIMS(img);
    if (PyArray_NDIM(lab) != 1 || PyArray_DIM(lab, 0) != sh[0] || num_classes <= 0
        || sh[0] > INT32_MAX || sh[1] > INT32_MAX || sh[2] > INT32_MAX || sh[3] > INT32_MAX) {
        Py_DECREF(lab);
        PyErr_Format(PyExc_ValueError, "_mix_batch: labels must be (N,) int64 for a batch of %lld images and "
                     "num_classes > 0", (long long)sh[0]);
        return NULL;
    }
    int N = (int)sh[0], C = (int)sh[1], H = (int)sh[2], W = (int)sh[3];
    npy_intp lshape[2] = {N, num_classes};
    PyObject *soft = PyArray_SimpleNew(2, lshape, NPY_FLOAT32);
    float *tmp = malloc((size_t)C * H * W * sizeof(float) + 1);
    if (soft == NULL || tmp == NULL) {
        Py_DECREF(lab);
        Py_XDECREF(soft);
        free(tmp);
        return PyErr_NoMemory();
    }
    fl_mix_params p;
    fl_err err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_mix_draw(&s, H, W, seed, epoch, batch, &p, &err);
    if (rc == 0)
        rc = fl_mix_labels(&p, (const int64_t *)PyArray_DATA(lab), N, num_classes,
                           (float *)PyArray_DATA((PyArrayObject *)soft), &err);
    if (rc == 0)
        rc = fl_mix_images_f32(&p, (float *)PyArray_DATA(img), N, C, H, W, tmp, &err);
    Py_END_ALLOW_THREADS
    free(tmp);
    Py_DECREF(lab);
    if (rc < 0) {
        Py_DECREF(soft);
        return fl_py_raise(m, &err, NULL, NULL);
    }
    return Py_BuildValue("N{s:s,s:d,s:(iiii)}", soft, "kind", p.kind == FL_MIX_MIXUP ? "mixup" : "cutmix", "lam",
                         p.lam, "box", p.x1, p.y1, p.x2, p.y2);
}

/* A number from spec[key] as a double.  Returns 0 or -1 with ValueError/TypeError. */
static int
fl_spec_double(PyObject *d, const char *key, double *out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    if (v == NULL) {
        PyErr_Format(PyExc_ValueError, "timm mix spec: missing '%s'", key);
        return -1;
    }
    *out = PyFloat_AsDouble(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* spec dict -> fl_timm_mix_spec.  Returns 0 or -1 with ValueError/TypeError. */
static int
fl_timm_spec_from_pydict(PyObject *d, fl_timm_mix_spec *s)
{
    memset(s, 0, sizeof *s);
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "timm mix spec: a dict");
        return -1;
    }
    double mode, correct, enabled, nc;
    if (fl_spec_double(d, "mixup_alpha", &s->mixup_alpha) < 0 || fl_spec_double(d, "cutmix_alpha", &s->cutmix_alpha) < 0
        || fl_spec_double(d, "prob", &s->prob) < 0 || fl_spec_double(d, "switch_prob", &s->switch_prob) < 0
        || fl_spec_double(d, "mode", &mode) < 0 || fl_spec_double(d, "correct_lam", &correct) < 0
        || fl_spec_double(d, "enabled", &enabled) < 0 || fl_spec_double(d, "label_smoothing", &s->smoothing) < 0
        || fl_spec_double(d, "num_classes", &nc) < 0)
        return -1;
    if (!(mode >= 0 && mode <= 2) || !(nc >= 1 && nc <= INT32_MAX) || nc != (double)(int)nc) {
        PyErr_SetString(PyExc_ValueError, "timm mix spec: mode must be 0, 1 or 2 and num_classes an int >= 1");
        return -1;
    }
    s->mode = (int)mode;
    s->num_classes = (int)nc;
    s->correct_lam = correct != 0.0;
    s->enabled = enabled != 0.0;
    PyObject *mm = PyDict_GetItemString(d, "cutmix_minmax");
    if (mm != NULL && mm != Py_None) {
        if (!PyArg_ParseTuple(mm, "dd;timm mix spec: cutmix_minmax must be None or a (min, max) tuple",
                              &s->minmax_lo, &s->minmax_hi))
            return -1;
        s->minmax = 1;
    }
    return 0;
}

static PyObject *
fl_py_timm_mix_batch(PyObject *m, PyObject *args)
{
    PyObject *images, *labels, *spec;
    unsigned long long seed, epoch, batch;
    if (!PyArg_ParseTuple(args, "OOOKKK:_timm_mix_batch", &images, &labels, &spec, &seed, &epoch, &batch))
        return NULL;
    fl_timm_mix_spec s;
    if (fl_timm_spec_from_pydict(spec, &s) < 0)
        return NULL;
    if (!PyArray_Check(images) || PyArray_TYPE((PyArrayObject *)images) != NPY_FLOAT32
        || PyArray_NDIM((PyArrayObject *)images) != 4 || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)images)
        || !PyArray_ISWRITEABLE((PyArrayObject *)images)) {
        PyErr_SetString(PyExc_TypeError, "_timm_mix_batch: images must be a writable C-contiguous float32 "
                                         "N x C x H x W array");
        return NULL;
    }
    PyArrayObject *img = (PyArrayObject *)images;
    npy_intp *sh = PyArray_DIMS(img);
    if (!PyArray_Check(labels) || PyArray_TYPE((PyArrayObject *)labels) != NPY_INT64
        || PyArray_NDIM((PyArrayObject *)labels) != 1 || PyArray_DIM((PyArrayObject *)labels, 0) != sh[0]) {
        PyErr_Format(PyExc_ValueError, "_timm_mix_batch: labels must be an int64 array of shape (%lld,)",
                     (long long)sh[0]);
        return NULL;
    }
    if (sh[0] > INT32_MAX || sh[1] > INT32_MAX || sh[2] > INT32_MAX || sh[3] > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_timm_mix_batch: batch dimensions beyond 2^31");
        return NULL;
    }
    PyArrayObject *lab = (PyArrayObject *)PyArray_FROM_OTF(labels, NPY_INT64, NPY_ARRAY_IN_ARRAY);
    if (lab == NULL)
        return NULL;
    int N = (int)sh[0], C = (int)sh[1], H = (int)sh[2], W = (int)sh[3];
    int n = fl_timm_mix_count(&s, N);
    npy_intp lshape[2] = {N, s.num_classes};
    PyObject *soft = PyArray_SimpleNew(2, lshape, NPY_FLOAT32);
    fl_timm_mix_params *p = calloc(n > 0 ? (size_t)n : 1, sizeof *p);
    if (soft == NULL || p == NULL) {
        Py_DECREF(lab);
        Py_XDECREF(soft);
        free(p);
        return PyErr_NoMemory();
    }
    fl_err err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_timm_mix_draw(&s, N, H, W, seed, epoch, batch, p, &err);
    if (rc == 0)
        rc = fl_timm_mix_labels(&s, p, (const int64_t *)PyArray_DATA(lab), N,
                                (float *)PyArray_DATA((PyArrayObject *)soft), &err);
    if (rc == 0)
        rc = fl_timm_mix_images_f32(&s, p, (float *)PyArray_DATA(img), N, C, H, W, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(lab);
    if (rc < 0) {
        free(p);
        Py_DECREF(soft);
        return fl_py_raise(m, &err, NULL, NULL);
    }
    static const char *modes[] = {"batch", "pair", "elem"};
    PyObject *mixed = PyList_New(n), *cut = PyList_New(n), *lam_draw = PyList_New(n), *lam = PyList_New(n);
    PyObject *ri = PyList_New(n), *box = PyList_New(n);
    PyObject *res = NULL;
    if (mixed == NULL || cut == NULL || lam_draw == NULL || lam == NULL || ri == NULL || box == NULL)
        goto done;
    for (int k = 0; k < n; k++) {
        const fl_timm_mix_params *q = p + k;
        PyObject *r = PyTuple_New(q->nrandint);
        if (r == NULL)
            goto done;
        for (int t = 0; t < q->nrandint; t++) {
            PyObject *v = PyLong_FromLong(q->randint[t]);
            if (v == NULL) {
                Py_DECREF(r);
                goto done;
            }
            PyTuple_SET_ITEM(r, t, v);
        }
        PyList_SET_ITEM(ri, k, r);
        PyObject *items[5] = {PyBool_FromLong(q->mixed), PyBool_FromLong(q->cutmix), PyFloat_FromDouble(q->lam_draw),
                              PyFloat_FromDouble(q->lam), Py_BuildValue("(iiii)", q->yl, q->yh, q->xl, q->xh)};
        PyObject *lists[5] = {mixed, cut, lam_draw, lam, box};
        for (int t = 0; t < 5; t++) {
            if (items[t] == NULL) {
                for (int u = t; u < 5; u++)
                    Py_XDECREF(items[u]);
                goto done;
            }
            PyList_SET_ITEM(lists[t], k, items[t]);
        }
    }
    res = Py_BuildValue("O{s:s,s:O,s:O,s:O,s:O,s:O,s:O}", soft, "mode", modes[s.mode], "mixed", mixed, "use_cutmix",
                        cut, "lam_draw", lam_draw, "lam", lam, "randint", ri, "box", box);
done:
    free(p);
    Py_DECREF(soft);
    Py_XDECREF(mixed);
    Py_XDECREF(cut);
    Py_XDECREF(lam_draw);
    Py_XDECREF(lam);
    Py_XDECREF(ri);
    Py_XDECREF(box);
    return res;
}

static PyMethodDef fl_mix_methods[] = {
    {"_mix_batch", (PyCFunction)fl_py_mix_batch, METH_VARARGS,
     "_mix_batch(images, labels, spec, seed, epoch, batch, num_classes) -> (soft_labels, params)\n\n"
     "MixUp / CutMix of a float32 N x C x H x W batch in place (csrc/image/mix.h)."},
    {"_timm_mix_batch", (PyCFunction)fl_py_timm_mix_batch, METH_VARARGS,
     "_timm_mix_batch(images, labels, spec, seed, epoch, batch) -> (soft_labels, params)\n\n"
     "timm's Mixup (mode batch / pair / elem, label smoothing) of a float32 N x C x H x W batch in place "
     "(csrc/image/mix.h)."},
    {NULL, NULL, 0, NULL},
};

int
fl_register_mix(PyObject *m)
{
    return PyModule_AddFunctions(m, fl_mix_methods);
}
