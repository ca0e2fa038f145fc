/* py_mix.c: Python binding of the batch stage (image/mix.h), registered by
 * fl_register_mix:
 *   _mix_batch(images, labels, spec, seed, epoch, batch, num_classes) -> (soft_labels, params)
 *       images: a writable C-contiguous float32 ndarray N x C x H x W,
 *       mixed in place; labels: int64 ndarray (N,); spec: dict(kinds=[0|1,
 *       ...], alphas=[...], p=[...]) (0 MixUp, 1 CutMix); returns the
 *       N x num_classes float32 soft labels and dict(kind, lam, box).
 * fastloader/batch.py calls it on each batch of a loader with a native
 * batch_transform.  Runs with the GIL held except around the mixing, while
 * this call holds references to both arrays.
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

static PyMethodDef fl_mix_methods[] = {
    {"_mix_batch", (PyCFunction)fl_py_mix_batch, METH_VARARGS,
     "_mix_batch(images, labels, spec, seed, epoch, batch, num_classes) -> (soft_labels, params)\n\n"
     "MixUp / CutMix of a float32 N x C x H x W batch in place (csrc/image/mix.h)."},
    {NULL, NULL, 0, NULL},
};

int
fl_register_mix(PyObject *m)
{
    return PyModule_AddFunctions(m, fl_mix_methods);
}
