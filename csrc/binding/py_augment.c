/* py_augment.c: test binding of the augmentation ops (image/augment.h).
 *
 * Module-level functions for tests and benchmarks (fastloader/ itself does
 * not call them, hence the underscore), registered by fl_register_augment:
 *   _augment_op(op, magnitude, image, *, interp=0, fill=None) -> ndarray
 *       op: an FL_AUG_* code (0 Identity .. 14 Invert: torchvision's; 15
 *       SolarizeAdd .. 23: timm's, augment.h); magnitude: a float (what
 *       torchvision's _apply_op receives, or the argument timm's op takes);
 *       image: a C-contiguous uint8 [H, W], [H, W, 1] or [H, W, 3] array,
 *       left as it is; interp: 0 nearest, 1 bilinear, 2 bicubic; fill: None (zeros) or a sequence of one int per
 *       channel (0..255) for the pixels a geometric op uncovers.
 *       Returns a new uint8 array of the image's shape.
 *   _gaussian_kernel(k, sigma, v2, *, lanes=8, exp="mkl") -> float32 ndarray
 *       torchvision's 1-D GaussianBlur kernel as the native op computes it
 *       (augment.h fl_gblur_kernel1d).
 *   _gaussian_blur(image, (kx, ky), sigma, v2, *, lanes=8, exp="mkl") -> ndarray
 *       the native GaussianBlur (fl_gblur_apply) on a copy of image.
 * Core errors (unknown op, magnitude out of range, ...) come through the
 * one translator (fl_py_raise: FL_ERR_INVALID -> ValueError).
 *
 * Runs with the GIL held; it is released only around fl_aug_apply (and
 * fl_gblur_apply), while
 * this call holds its references to the input and the result.  The scratch
 * is plain malloc memory.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include <numpy/arrayobject.h>

#include <stdlib.h>
#include <string.h>

#include "image/augment.h"
#include "binding/py_transform.h"

/* fill (None or a sequence of `channels` ints in 0..255) -> out.  Returns 0,
 * or -1 with TypeError / ValueError. */
static int
fl_aug_fill_from_py(PyObject *obj, int channels, uint8_t out[3])
{
    memset(out, 0, 3);
    if (obj == NULL || obj == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(obj, "");
    if (seq == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "_augment_op: fill must be None or a sequence of ints");
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != channels) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "_augment_op: fill has %zd values for %d channels", n, channels);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(seq, i);
        long x;
        if (!PyLong_Check(v)) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_TypeError, "_augment_op: fill values must be ints, not %.100s", Py_TYPE(v)->tp_name);
            return -1;
        }
        x = PyLong_AsLong(v);
        if (x == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (x < 0 || x > 255) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "_augment_op: fill value %ld outside 0..255", x);
            return -1;
        }
        out[i] = (uint8_t)x;
    }
    Py_DECREF(seq);
    return 0;
}

/* image must be a C-contiguous uint8 [H, W] or [H, W, C] numpy array
 * (TypeError / ValueError naming fn otherwise); its sides into *h, *w,
 * *channels.  Returns 0, or -1 with an exception.  GIL held. */
static int
fl_u8_image_arg(const char *fn, PyObject *image, int *h, int *w, int *channels)
{
    if (!PyArray_Check(image)) {
        PyErr_Format(PyExc_TypeError, "%s: image must be a numpy array", fn);
        return -1;
    }
    PyArrayObject *arr = (PyArrayObject *)image;
    if (PyArray_TYPE(arr) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(arr)) {
        PyErr_Format(PyExc_TypeError, "%s: image must be a C-contiguous uint8 array", fn);
        return -1;
    }
    if (!(PyArray_NDIM(arr) == 2 || PyArray_NDIM(arr) == 3) || PyArray_DIM(arr, 0) > INT_MAX
        || PyArray_DIM(arr, 1) > INT_MAX || (PyArray_NDIM(arr) == 3 && PyArray_DIM(arr, 2) > INT_MAX)) {
        PyErr_Format(PyExc_ValueError, "%s: image must be an [H, W] or [H, W, C] array", fn);
        return -1;
    }
    *h = (int)PyArray_DIM(arr, 0);
    *w = (int)PyArray_DIM(arr, 1);
    *channels = PyArray_NDIM(arr) == 3 ? (int)PyArray_DIM(arr, 2) : 1;
    return 0;
}

/* A new C-ordered array holding a copy of arr (the ops work in place on
 * it), or NULL with an exception.  GIL held. */
static PyArrayObject *
fl_u8_copy(PyArrayObject *arr)
{
    PyArrayObject *res = (PyArrayObject *)PyArray_NewLikeArray(arr, NPY_CORDER, NULL, 0);
    if (res != NULL)
        memcpy(PyArray_DATA(res), PyArray_DATA(arr), (size_t)PyArray_NBYTES(arr));
    return res;
}

static PyObject *
fl_py_augment_op(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"op", "magnitude", "image", "interp", "fill", NULL};
    int op, interp = FL_AUG_NEAREST, rc;
    double magnitude;
    PyObject *image, *fill_obj = Py_None;
    PyArrayObject *arr = NULL, *res = NULL;
    uint8_t fill[3];
    uint8_t *tmp = NULL;
    fl_err err = {0};

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "idO|$iO:_augment_op", kwlist, &op, &magnitude, &image,
                                     &interp, &fill_obj))
        return NULL;
    int h, w, channels;
    if (fl_u8_image_arg("_augment_op", image, &h, &w, &channels) < 0)
        return NULL;
    arr = (PyArrayObject *)image;
    /* the core checks channels and sizes; the fill needs a sane count first */
    if (fl_aug_fill_from_py(fill_obj, channels == 3 ? 3 : 1, fill) < 0)
        return NULL;

    size_t nb = fl_aug_tmp_bytes(w, h, channels);
    if (nb == 0 && w > 0 && h > 0 && channels > 0)
        return PyErr_NoMemory();
    tmp = (uint8_t *)malloc(nb ? nb : 1);
    if (tmp == NULL)
        return PyErr_NoMemory();
    res = fl_u8_copy(arr);
    if (res == NULL) {
        free(tmp);
        return NULL;
    }

    /* Only fl_aug_apply runs without the GIL; arr and res stay referenced. */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_aug_apply(op, magnitude, interp, fill, (uint8_t *)PyArray_DATA(res), w, h, channels, tmp, &err);
    Py_END_ALLOW_THREADS
    free(tmp);
    if (rc < 0) {
        Py_DECREF(res);
        return fl_py_raise(m, &err, NULL, NULL);
    }
    return (PyObject *)res;
}

/* kernel side(s), v2, lanes, exp -> g (the exp resolved as a spec's is,
 * py_transform.h fl_py_blur_exp).  Returns 0, or -1 with an exception. */
static int
fl_gblur_from_args(int kx, int ky, int v2, int lanes, const char *exp, fl_gblur *g)
{
    memset(g, 0, sizeof *g);
    g->kx = kx;
    g->ky = ky;
    g->v2 = v2 != 0;
    g->lanes = lanes;
    return g->v2 ? 0 : fl_py_blur_exp(exp, g);
}

static PyObject *
fl_py_gaussian_kernel(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"k", "sigma", "v2", "lanes", "exp", NULL};
    int k, v2, lanes = 8;
    float sigma;
    const char *exp = "mkl";
    fl_gblur g;
    fl_err err = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ifp|$is:_gaussian_kernel", kwlist, &k, &sigma, &v2, &lanes,
                                     &exp))
        return NULL;
    if (fl_gblur_from_args(k, k, v2, lanes, exp, &g) < 0)
        return NULL;
    float out[FL_GBLUR_MAX_K];
    if (fl_gblur_kernel1d(&g, k, sigma, out, &err) < 0)
        return fl_py_raise(m, &err, NULL, NULL);
    npy_intp dims[1] = {k};
    PyArrayObject *res = (PyArrayObject *)PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    if (res == NULL)
        return NULL;
    memcpy(PyArray_DATA(res), out, (size_t)k * sizeof(float));
    return (PyObject *)res;
}

static PyObject *
fl_py_gaussian_blur(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"image", "kernel", "sigma", "v2", "lanes", "exp", NULL};
    int kx, ky, v2, lanes = 8, rc;
    float sigma;
    const char *exp = "mkl";
    PyObject *image;
    fl_gblur g;
    fl_err err = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O(ii)fp|$is:_gaussian_blur", kwlist, &image, &kx, &ky, &sigma,
                                     &v2, &lanes, &exp))
        return NULL;
    if (fl_gblur_from_args(kx, ky, v2, lanes, exp, &g) < 0)
        return NULL;
    int h, w, channels;
    if (fl_u8_image_arg("_gaussian_blur", image, &h, &w, &channels) < 0)
        return NULL;
    PyArrayObject *arr = (PyArrayObject *)image;
    size_t nb = fl_gblur_tmp_bytes(w, h, channels, kx, ky);   /* 0: fl_gblur_apply names the problem */
    uint8_t *tmp = (uint8_t *)malloc(nb ? nb : 1);
    if (tmp == NULL)
        return PyErr_NoMemory();
    PyArrayObject *res = fl_u8_copy(arr);
    if (res == NULL) {
        free(tmp);
        return NULL;
    }
    /* Only fl_gblur_apply runs without the GIL; arr and res stay referenced. */
    Py_BEGIN_ALLOW_THREADS
    rc = fl_gblur_apply(&g, sigma, (uint8_t *)PyArray_DATA(res), w, h, channels, nb ? tmp : NULL, &err);
    Py_END_ALLOW_THREADS
    free(tmp);
    if (rc < 0) {
        Py_DECREF(res);
        return fl_py_raise(m, &err, NULL, NULL);
    }
    return (PyObject *)res;
}

static PyMethodDef fl_augment_methods[] = {
    {"_gaussian_kernel", (PyCFunction)(void (*)(void))fl_py_gaussian_kernel, METH_VARARGS | METH_KEYWORDS,
     "_gaussian_kernel(k, sigma, v2, *, lanes=8, exp='mkl') -> ndarray\n\n"
     "For tests and benchmarks.\n"
     "torchvision's 1-D Gaussian kernel of side k (odd) for the float32 sigma, float32, as torch\n"
     "2.14 computes it on a CPU of `lanes` float lanes (8 AVX2, 16 AVX512): v1's\n"
     "(_functional_tensor._get_gaussian_kernel1d, its exp torch's: 'mkl' (MKL's vmsExp, from the\n"
     "loaded torch) or 'sleef') or v2's (softmax)."},
    {"_gaussian_blur", (PyCFunction)(void (*)(void))fl_py_gaussian_blur, METH_VARARGS | METH_KEYWORDS,
     "_gaussian_blur(image, kernel, sigma, v2, *, lanes=8, exp='mkl') -> ndarray\n\n"
     "For tests and benchmarks.\n"
     "torchvision's gaussian_blur(pil, [kx, ky], [sigma, sigma]) (v1 or v2) on a C-contiguous uint8\n"
     "[H, W] / [H, W, 1|3] image; kernel (kx, ky). Returns a new array of the same shape."},
    {"_augment_op", (PyCFunction)(void (*)(void))fl_py_augment_op, METH_VARARGS | METH_KEYWORDS,
     "_augment_op(op, magnitude, image, *, interp=0, fill=None) -> ndarray\n\n"
     "For tests and benchmarks.\n"
     "One AutoAugment / RandAugment / TrivialAugmentWide op (an FL_AUG_* code, 0 Identity ..\n"
     "14 Invert; 15..23 timm's ops) on a C-contiguous uint8 [H, W] / [H, W, 1|3] image, as\n"
     "torchvision's _apply_op (or timm's op) does it to a PIL image with Pillow. interp: 0\n"
     "nearest, 1 bilinear, 2 bicubic; fill: None\n"
     "(zeros) or one int per channel. Returns a new array of the same shape."},
    {NULL, NULL, 0, NULL},
};

int
fl_register_augment(PyObject *m)
{
    return PyModule_AddFunctions(m, fl_augment_methods);
}
