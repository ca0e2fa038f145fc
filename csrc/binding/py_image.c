/* py_image.c: Python binding of the decoders (jpeg.h, codecs.h).
 *
 * Module-level functions, registered by fl_register_image:
 *   decode_jpeg(src, *, mode="RGB", apply_exif_orientation=False) -> ndarray
 *   decode_image(src, *, mode="RGB") -> ndarray   (JPEG, PNG, WebP by magic bytes)
 *   read_jpeg_header(src) -> dict
 *   read_image_header(src) -> dict
 *   _decode_region(src, scale_num, x, y, w, h, channels) -> ndarray  (tests)
 * src is bytes or any contiguous buffer (held with PyObject_GetBuffer for the
 * whole call, so it stays valid while the GIL is released), or a path (str /
 * os.PathLike), read without the GIL.
 *
 * Each call uses its own fl_jpeg (created and freed without the GIL: plain
 * malloc).  The GIL is released only around the jpeg.h calls and the file
 * read.  Decoder errors raise fastloader.DecodeError("<path or '<bytes>'>:
 * <reason>") (MemoryError, OSError for the others) through the one
 * translator in py_errors.c.
 */
#define NO_IMPORT_ARRAY
#include "binding/binding.h"
#include <numpy/arrayobject.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/codecs.h"
#include "image/jpeg.h"
#include "sources/source.h"

/* The bytes of one `src` argument. */
typedef struct {
    Py_buffer view;        /* valid when have_view; released by fl_src_release */
    int have_view;
    fl_bytes file;         /* file contents (owned; empty for buffers) */
    const uint8_t *data;   /* the bytes to decode (view.buf or file) */
    size_t len;
    PyObject *name;        /* str for messages: the path or "<bytes>" (owned) */
} fl_src;

/* ------------------------------------------------------------------------ */
/* helpers */

/* Raise err for source s through the one translator (py_errors.c): the
 * message is prefixed with the path or "<bytes>", which is also OSError's
 * filename.  Always returns NULL. */
static PyObject *
fl_image_raise(PyObject *m, const fl_src *s, const fl_err *e)
{
    fl_err named = *e;
    /* backslashreplace: a non-UTF-8 file name still gives a message */
    PyObject *utf8 = PyUnicode_AsEncodedString(s->name, "utf-8", "backslashreplace");
    if (utf8 == NULL)
        return NULL;
    /* the path is cut first, then the reason, so both fit */
    snprintf(named.msg, sizeof named.msg, "%.150s: %.160s", PyBytes_AS_STRING(utf8), e->msg);
    Py_DECREF(utf8);
    return fl_py_raise(m, &named, s->name, NULL);
}

/* Fill *s from obj.  Returns 0, or -1 with an exception set (TypeError for
 * unsupported objects, OSError subclasses such as FileNotFoundError). */
static int
fl_src_load(PyObject *m, PyObject *obj, fl_src *s)
{
    memset(s, 0, sizeof(*s));
    if (PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &s->view, PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        s->have_view = 1;
        s->data = s->view.buf;
        s->len = (size_t)s->view.len;
        s->name = PyUnicode_FromString("<bytes>");
        return s->name == NULL ? -1 : 0;
    }
    if (PyUnicode_Check(obj) || PyObject_HasAttrString(obj, "__fspath__")) {
        PyObject *fs = PyOS_FSPath(obj), *enc = NULL;
        const char *path;
        if (fs == NULL)
            return -1;
        s->name = PyUnicode_Check(fs) ? Py_NewRef(fs) : PyUnicode_DecodeFSDefaultAndSize(
                      PyBytes_AS_STRING(fs), PyBytes_GET_SIZE(fs));
        if (s->name == NULL || !PyUnicode_FSConverter(fs, &enc)) {
            Py_DECREF(fs);
            return -1;
        }
        path = PyBytes_AS_STRING(enc);
        fl_err err = {0, "", 0};
        long long len;
        Py_BEGIN_ALLOW_THREADS
        len = fl_source_read_file(path, &s->file, FL_SOURCE_MAX_FILE_BYTES, &err);
        Py_END_ALLOW_THREADS
        Py_DECREF(enc);
        Py_DECREF(fs);
        if (len < 0) {
            fl_image_raise(m, s, &err);
            return -1;
        }
        s->data = s->file.data;
        s->len = (size_t)len;
        return 0;
    }
    PyErr_Format(PyExc_TypeError,
                 "src must be bytes, a buffer or a path (str or os.PathLike), not %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

static void
fl_src_release(fl_src *s)
{
    if (s->have_view)
        PyBuffer_Release(&s->view);
    s->have_view = 0;
    fl_bytes_free(&s->file);
    Py_CLEAR(s->name);
}

/* Create a decoder and read the header of s into *info.  Returns the decoder
 * (owned by the caller), or NULL with an exception set. */
static fl_jpeg *
fl_open(PyObject *m, const fl_src *s, fl_jpeg_info *info, int check_limits)
{
    fl_jpeg *j;
    fl_err err = {0, ""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    j = fl_jpeg_new();
    rc = j == NULL ? -2 : fl_jpeg_read_header(j, s->data, s->len, info, &err);
    if (rc == 0 && check_limits)
        rc = fl_jpeg_check_limits(j, info, &err);
    Py_END_ALLOW_THREADS
    if (rc == -2) {
        PyErr_NoMemory();
        return NULL;
    }
    if (rc < 0) {
        fl_jpeg_free(j);
        fl_image_raise(m, s, &err);
        return NULL;
    }
    return j;
}

/* Decode *reg of s with j (its header already read) into a new
 * reg->h x reg->w x reg->out_channels uint8 array, turned by the EXIF
 * orientation `orient` as ImageOps.exif_transpose does (1: as stored; 5..8
 * swap the axes).  GIL held; released around the decode, and a turned image
 * goes through a malloc'ed temporary (no GIL), freed here.  Returns the
 * array (new reference), or NULL with an exception set (fl_image_raise,
 * or numpy's MemoryError). */
static PyObject *
fl_decode_array(PyObject *m, fl_jpeg *j, const fl_src *s, const fl_jpeg_region *reg, int orient)
{
    size_t stride = (size_t)reg->w * (size_t)reg->out_channels;
    npy_intp dims[3];
    fl_err err = {0, ""};
    uint8_t *out, *tmp = NULL;
    PyObject *arr;
    int rc;

    dims[0] = orient >= 5 ? reg->w : reg->h;
    dims[1] = orient >= 5 ? reg->h : reg->w;
    dims[2] = reg->out_channels;
    arr = PyArray_SimpleNew(3, dims, NPY_UINT8);
    if (arr == NULL)
        return NULL;
    out = (uint8_t *)PyArray_DATA((PyArrayObject *)arr);
    Py_BEGIN_ALLOW_THREADS
    if (orient == 1) {
        rc = fl_jpeg_decode(j, s->data, s->len, reg, out, stride, &err);
    } else {
        /* Decode into a temporary (malloc: no GIL) and transpose into arr. */
        size_t n = stride * (size_t)reg->h;
        tmp = malloc(n);
        if (tmp == NULL) {
            err.code = FL_ERR_NOMEM;
            snprintf(err.msg, sizeof(err.msg), "out of memory for a %zu-byte image", n);
            rc = -1;
        } else {
            rc = fl_jpeg_decode(j, s->data, s->len, reg, tmp, stride, &err);
            if (rc == 0)
                fl_apply_orientation(tmp, reg->w, reg->h, reg->out_channels, orient, out);
        }
    }
    Py_END_ALLOW_THREADS
    free(tmp);
    if (rc < 0) {
        fl_image_raise(m, s, &err);
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* ------------------------------------------------------------------------ */
/* methods */

static PyObject *
fl_decode_jpeg(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"src", "mode", "apply_exif_orientation", NULL};
    PyObject *srcobj, *arr = NULL;
    const char *mode = "RGB";
    int apply = 0, channels;
    fl_src s;
    fl_jpeg *j;
    fl_jpeg_info info;
    fl_jpeg_region reg;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$sp:decode_jpeg", kwlist, &srcobj, &mode, &apply))
        return NULL;
    if (strcmp(mode, "RGB") == 0)
        channels = 3;
    else if (strcmp(mode, "L") == 0)
        channels = 1;
    else
        return PyErr_Format(PyExc_ValueError, "mode must be 'RGB' or 'L', not '%s'", mode);
    if (fl_src_load(m, srcobj, &s) < 0)
        return NULL;
    if ((j = fl_open(m, &s, &info, 1)) != NULL) {
        reg.out_channels = channels;
        reg.scale_num = 8;
        reg.x = reg.y = 0;
        reg.w = info.width;
        reg.h = info.height;
        arr = fl_decode_array(m, j, &s, &reg, apply ? info.orientation : 1);
    }
    fl_jpeg_free(j);
    fl_src_release(&s);
    return arr;
}

static PyObject *
fl_decode_region(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"src", "scale_num", "x", "y", "w", "h", "channels",
                             "max_pixels", "max_scans", "strict", NULL};
    PyObject *srcobj, *arr = NULL;
    long long max_pixels = -1;   /* -1: keep the default */
    int max_scans = -1, strict = 0;
    fl_src s;
    fl_jpeg *j = NULL;
    fl_jpeg_info info;
    fl_jpeg_region reg;
    fl_err err = {0, ""};
    int sw, sh;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oiiiiii|$Lip:_decode_region", kwlist, &srcobj,
                                     &reg.scale_num, &reg.x, &reg.y, &reg.w, &reg.h, &reg.out_channels,
                                     &max_pixels, &max_scans, &strict))
        return NULL;
    if (reg.out_channels != 1 && reg.out_channels != 3)
        return PyErr_Format(PyExc_ValueError, "channels must be 1 or 3");
    if (reg.scale_num < 1 || reg.scale_num > 16)
        return PyErr_Format(PyExc_ValueError, "scale_num must be in 1..16");
    if (fl_src_load(m, srcobj, &s) < 0)
        return NULL;
    if ((j = fl_open(m, &s, &info, 0)) == NULL)
        goto done;
    fl_jpeg_set_limits(j, max_pixels < 0 ? FL_JPEG_DEFAULT_MAX_PIXELS : (uint64_t)max_pixels,
                       max_scans < 0 ? FL_JPEG_DEFAULT_MAX_SCANS : max_scans);
    fl_jpeg_set_strict(j, strict);
    if (fl_jpeg_check_limits(j, &info, &err) < 0) {
        fl_image_raise(m, &s, &err);
        goto done;
    }
    fl_jpeg_scaled_size(&info, reg.scale_num, &sw, &sh);
    /* Validate before allocating so that bad arguments cannot ask for a huge array. */
    if (reg.x < 0 || reg.y < 0 || reg.w < 1 || reg.h < 1 || reg.x > sw - reg.w || reg.y > sh - reg.h) {
        PyErr_Format(PyExc_ValueError, "region x=%d y=%d w=%d h=%d is outside the %dx%d image at scale %d/8",
                     reg.x, reg.y, reg.w, reg.h, sw, sh, reg.scale_num);
        goto done;
    }
    arr = fl_decode_array(m, j, &s, &reg, 1);
done:
    fl_jpeg_free(j);
    fl_src_release(&s);
    return arr;
}

static PyObject *
fl_read_jpeg_header(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"src", NULL};
    PyObject *srcobj, *res;
    fl_src s;
    fl_jpeg *j;
    fl_jpeg_info info;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:read_jpeg_header", kwlist, &srcobj))
        return NULL;
    if (fl_src_load(m, srcobj, &s) < 0)
        return NULL;
    j = fl_open(m, &s, &info, 0);
    fl_jpeg_free(j);
    fl_src_release(&s);
    if (j == NULL)
        return NULL;
    res = Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:O,s:O}", "width", info.width, "height", info.height,
                        "components", info.components, "colorspace", info.colorspace,
                        "orientation", info.orientation,
                        "progressive", info.progressive ? Py_True : Py_False,
                        "arithmetic", info.arithmetic ? Py_True : Py_False);
    return res;
}

/* decode_image for a JPEG: mode RGB / L as decode_jpeg (no EXIF turn, as
 * Image.open), RGBA as RGB with alpha 255 (Pillow's RGB -> RGBA), None as
 * the file's own mode ("L" for one component, "RGB" otherwise, "L" as
 * H x W).  CMYK files have no native mode here (ValueError). */
static PyObject *
fl_decode_image_jpeg(PyObject *m, const fl_src *s, int mode)
{
    fl_jpeg_info info;
    fl_jpeg *j = fl_open(m, s, &info, 1);
    PyObject *arr = NULL;
    if (j == NULL)
        return NULL;
    if (mode == FL_IMG_NATIVE && info.components == 4) {
        fl_jpeg_free(j);
        return PyErr_Format(PyExc_ValueError, "a CMYK JPEG has no mode=None decode here: ask for mode='RGB'");
    }
    int native_gray = mode == FL_IMG_NATIVE && info.components == 1;
    fl_jpeg_region reg = {mode == FL_IMG_L || native_gray ? 1 : 3, 8, 0, 0, info.width, info.height};
    arr = fl_decode_array(m, j, s, &reg, 1);
    fl_jpeg_free(j);
    if (arr == NULL)
        return NULL;
    if (native_gray) {
        PyObject *sq = PyArray_Squeeze((PyArrayObject *)arr);
        Py_DECREF(arr);
        return sq;
    }
    if (mode == FL_IMG_RGBA) {
        npy_intp dims[3] = {info.height, info.width, 4};
        PyObject *rgba = PyArray_SimpleNew(3, dims, NPY_UINT8);
        if (rgba != NULL) {
            const uint8_t *p = PyArray_DATA((PyArrayObject *)arr);
            uint8_t *q = PyArray_DATA((PyArrayObject *)rgba);
            size_t n = (size_t)info.width * (size_t)info.height;
            Py_BEGIN_ALLOW_THREADS
            for (size_t i = 0; i < n; i++, p += 3, q += 4)
                q[0] = p[0], q[1] = p[1], q[2] = p[2], q[3] = 255;
            Py_END_ALLOW_THREADS
        }
        Py_DECREF(arr);
        return rgba;
    }
    return arr;
}

static int
fl_parse_mode(PyObject *modeobj, int *mode)
{
    if (modeobj == Py_None) {
        *mode = FL_IMG_NATIVE;
        return 0;
    }
    const char *ms = PyUnicode_Check(modeobj) ? PyUnicode_AsUTF8(modeobj) : NULL;
    if (ms != NULL && strcmp(ms, "RGB") == 0)
        *mode = FL_IMG_RGB;
    else if (ms != NULL && strcmp(ms, "L") == 0)
        *mode = FL_IMG_L;
    else if (ms != NULL && strcmp(ms, "RGBA") == 0)
        *mode = FL_IMG_RGBA;
    else {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "mode must be 'RGB', 'L', 'RGBA' or None, not %R", modeobj);
        return -1;
    }
    return 0;
}

static PyObject *
fl_decode_image(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"src", "mode", NULL};
    PyObject *srcobj, *modeobj = NULL, *arr = NULL;
    int mode = FL_IMG_RGB;
    fl_src s;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O:decode_image", kwlist, &srcobj, &modeobj))
        return NULL;
    if (modeobj != NULL && fl_parse_mode(modeobj, &mode) < 0)
        return NULL;
    if (fl_src_load(m, srcobj, &s) < 0)
        return NULL;
    int fmt = fl_img_format(s.data, s.len);
    if (fmt == FL_IMG_JPEG) {
        arr = fl_decode_image_jpeg(m, &s, mode);
        fl_src_release(&s);
        return arr;
    }
    fl_err err = {0, "", 0};
    fl_img_info info;
    fl_imgdec *d = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    d = fl_imgdec_new();
    rc = d == NULL ? -2 : fl_imgdec_info(d, s.data, s.len, &info, &err);
    Py_END_ALLOW_THREADS
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc < 0) {
        fl_image_raise(m, &s, &err);
        goto done;
    }
    /* the pixel limit before the array is allocated */
    if (fl_imgdec_check_limit(d, &info, &err) < 0) {
        fl_image_raise(m, &s, &err);
        goto done;
    }
    {
        npy_intp dims[3] = {info.height, info.width, mode == FL_IMG_NATIVE ? info.channels : mode};
        int nd = mode == FL_IMG_NATIVE && info.channels == 1 ? 2 : 3;
        int type = NPY_UINT8;
        if (mode == FL_IMG_NATIVE && info.bytes == 2)
            type = NPY_UINT16;
        else if (mode == FL_IMG_NATIVE && strcmp(info.mode, "1") == 0)
            type = NPY_BOOL; /* 0/1 bytes, as np.array of a mode "1" image */
        arr = PyArray_SimpleNew(nd, dims, type);
        if (arr == NULL)
            goto done;
        uint8_t *out = PyArray_DATA((PyArrayObject *)arr);
        size_t stride = fl_img_row_bytes(&info, mode);
        Py_BEGIN_ALLOW_THREADS
        rc = fl_imgdec_decode(d, s.data, s.len, mode, out, stride, &err);
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            Py_CLEAR(arr);
            fl_image_raise(m, &s, &err);
        }
    }
done:
    fl_imgdec_free(d);
    fl_src_release(&s);
    return arr;
}

static PyObject *
fl_read_image_header(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"src", NULL};
    PyObject *srcobj, *res = NULL;
    fl_src s;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:read_image_header", kwlist, &srcobj))
        return NULL;
    if (fl_src_load(m, srcobj, &s) < 0)
        return NULL;
    if (fl_img_format(s.data, s.len) == FL_IMG_JPEG) {
        fl_jpeg_info ji;
        fl_jpeg *j = fl_open(m, &s, &ji, 0);
        if (j != NULL)
            res = Py_BuildValue("{s:s,s:i,s:i,s:s,s:i}", "format", "JPEG", "width", ji.width, "height", ji.height,
                                "mode", ji.components == 1 ? "L" : ji.components == 4 ? "CMYK" : "RGB",
                                "components", ji.components);
        fl_jpeg_free(j);
        fl_src_release(&s);
        return res;
    }
    fl_err err = {0, "", 0};
    fl_img_info info;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_imgdec_info(NULL, s.data, s.len, &info, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        fl_image_raise(m, &s, &err);
    else
        res = Py_BuildValue("{s:s,s:i,s:i,s:s,s:i,s:i,s:O,s:O,s:O,s:O}", "format",
                            info.format == FL_IMG_PNG ? "PNG" : "WEBP", "width", info.width, "height",
                            info.height, "mode", info.mode, "bit_depth", info.bit_depth, "color_type",
                            info.color_type, "interlaced", info.interlaced ? Py_True : Py_False,
                            "has_alpha", info.has_alpha ? Py_True : Py_False,
                            "animated", info.animated ? Py_True : Py_False,
                            "lossless", info.lossless ? Py_True : Py_False);
    fl_src_release(&s);
    return res;
}

static PyMethodDef fl_image_methods[] = {
    {"decode_image", (PyCFunction)(void (*)(void))fl_decode_image, METH_VARARGS | METH_KEYWORDS,
     "decode_image(src, *, mode='RGB') -> numpy.ndarray\\n\\n"
     "Decode a JPEG, PNG or WebP (bytes, a buffer, or a path; the format by its first bytes) to\\n"
     "what Pillow gives: mode 'RGB', 'L' or 'RGBA' as np.array(Image.open(src).convert(mode))\\n"
     "in H x W x C; mode None as np.array(Image.open(src)), the file's own mode: palette\\n"
     "indices, 8-bit gray, 16-bit gray (uint16), 1-bit (bool), LA, RGB, RGBA (segmentation\\n"
     "masks).  Raises fastloader.DecodeError for bad data or an image over the pixel limit."},
    {"read_image_header", (PyCFunction)(void (*)(void))fl_read_image_header, METH_VARARGS | METH_KEYWORDS,
     "read_image_header(src) -> dict(format, width, height, mode, ...): the header of a JPEG,\\n"
     "PNG or WebP, with Pillow's mode of the file."},
    {"decode_jpeg", (PyCFunction)(void (*)(void))fl_decode_jpeg, METH_VARARGS | METH_KEYWORDS,
     "decode_jpeg(src, *, mode='RGB', apply_exif_orientation=False) -> numpy.ndarray\n\n"
     "Decode a JPEG (bytes, a buffer, or a path) to an H x W x C uint8 array (C=3 for 'RGB',\n"
     "1 for 'L'), equal to Pillow's Image.open(src).convert(mode).  With\n"
     "apply_exif_orientation, the EXIF orientation is applied as ImageOps.exif_transpose.\n"
     "Raises fastloader.DecodeError for bad data."},
    {"read_jpeg_header", (PyCFunction)(void (*)(void))fl_read_jpeg_header, METH_VARARGS | METH_KEYWORDS,
     "read_jpeg_header(src) -> dict(width, height, components, colorspace, orientation,\n"
     "progressive, arithmetic)"},
    {"_decode_region", (PyCFunction)(void (*)(void))fl_decode_region, METH_VARARGS | METH_KEYWORDS,
     "_decode_region(src, scale_num, x, y, w, h, channels, *, max_pixels=-1, max_scans=-1,\n"
     "strict=False) -> numpy.ndarray\n\n"
     "Private, for tests: decode the region (x, y, w, h) of the image scaled by scale_num/8,\n"
     "with the decoder's limits (-1: default, 0: none) and strict mode."},
    {NULL, NULL, 0, NULL},
};

int
fl_register_image(PyObject *m)
{
    return PyModule_AddFunctions(m, fl_image_methods);
}
