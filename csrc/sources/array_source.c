/* array_source.c: rows of an array as a source (contracts in
 * array_source.h). */
#include "sources/array_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_source head;
    fl_region *region;    /* one reference, owned */
    fl_array_info info;
    int image;            /* rows are HWC uint8 pixels */
    int width, height, channels;
} array_source;

static int
array_get(fl_source *s, void *tls, int64_t index, uint64_t epoch, fl_bytes *buf, size_t max_bytes,
          fl_sample_bytes *out, fl_err *err)
{
    (void)tls;
    (void)epoch;
    (void)buf;
    (void)max_bytes; /* a view: nothing is read into memory of ours */
    (void)err;
    const array_source *a = (const array_source *)s;
    memset(out, 0, sizeof *out);
    out->data = a->info.base + a->info.row_bytes * (size_t)index;
    out->len = a->info.row_bytes;
    if (a->image) {
        out->pixels = 1;
        out->width = a->width;
        out->height = a->height;
        out->channels = a->channels;
    }
    return 0;
}

static void
array_destroy(fl_source *s)
{
    array_source *a = (array_source *)s;
    fl_region_unref(a->region);
    free(a);
}

static const fl_source_ops array_ops = {.kind = "array", .get = array_get, .destroy = array_destroy};

static fl_source *
invalid(fl_err *err, const char *msg)
{
    err->code = FL_ERR_INVALID;
    err->errnum = 0;
    snprintf(err->msg, sizeof err->msg, "%s", msg);
    return NULL;
}

fl_source *
fl_source_array_new(fl_region *region, const fl_array_info *info, int image, fl_err *err)
{
    if (info->n < 0 || info->row_ndim < 0 || info->row_ndim >= FL_MAX_NDIM)
        return invalid(err, "array source: bad row count or too many dimensions");
    size_t row = (size_t)(info->dtype.bits / 8);
    for (int i = 0; i < info->row_ndim; i++) {
        if (info->row_shape[i] < 0)
            return invalid(err, "array source: negative dimension");
        if (info->row_shape[i] && row > SIZE_MAX / (size_t)info->row_shape[i])
            return invalid(err, "array source: rows too large");
        row *= (size_t)info->row_shape[i];
    }
    if (row != info->row_bytes)
        return invalid(err, "array source: row_bytes does not match the row shape and element type");
    const uint8_t *start = fl_region_data(region), *end = start + fl_region_size(region);
    int fits = info->base >= start && info->base <= end &&
               (row == 0 || (uint64_t)info->n <= (uint64_t)((size_t)(end - info->base) / row));
    if (info->n > 0 && !fits)
        return invalid(err, "array source: the rows do not fit in the region");
    int w = 0, h = 0, c = 0;
    if (image) {
        const int64_t *d = info->row_shape;
        int ok = info->dtype.code == kDLUInt && info->dtype.bits == 8 &&
                 (info->row_ndim == 2 || (info->row_ndim == 3 && (d[2] == 1 || d[2] == 3)));
        if (ok && (d[0] < 1 || d[1] < 1 || d[0] > INT32_MAX || d[1] > INT32_MAX))
            ok = 0;
        if (!ok)
            return invalid(err, "array source: images must be uint8 rows of H x W x C (C 1 or 3) or H x W");
        h = (int)d[0];
        w = (int)d[1];
        c = info->row_ndim == 3 ? (int)d[2] : 1;
    }
    array_source *a = calloc(1, sizeof *a);
    if (!a) {
        err->code = FL_ERR_NOMEM;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    fl_source_init(&a->head, &array_ops, info->n);
    a->region = fl_region_ref(region);
    a->info = *info;
    a->image = image;
    a->width = w;
    a->height = h;
    a->channels = c;
    return &a->head;
}

int
fl_source_array_info(const fl_source *s, fl_array_info *out)
{
    if (!s || s->ops != &array_ops)
        return -1;
    *out = ((const array_source *)s)->info;
    return 0;
}
