/* array_source.h: the "array" kind of fl_source (source.h): sample i is
 * row i of a row-major array held in a region (gather.h), such as an .npy
 * file mapped read-only.  No Python.
 *
 * The source knows its array's element type and row shape, so the batch
 * gather (fl_source_array_info + fl_gather_rows) can describe what it
 * copied, and an array of HWC uint8 images (N x H x W x C with C 1 or 3,
 * or N x H x W) can be an image source: its get hands each row out as
 * decoded pixels (pixels = 1) viewed in place, with no copy, and the
 * native pipeline renders them without a decode (native.c).  Any other
 * array hands out its rows' raw bytes (pixels = 0), also in place.
 *
 * Every function here runs without the GIL, on any thread.
 */
#ifndef FL_ARRAY_SOURCE_H
#define FL_ARRAY_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "core/copy.h"     /* FL_MAX_NDIM */
#include "core/dlpack.h"   /* DLDataType */
#include "sources/gather.h"
#include "sources/source.h"

/* What an array source holds: the first row, the row count and size, the
 * element type and the shape of one row (ndim - 1 dimensions of the array
 * after the first; ndim 1: each row is one element). */
typedef struct {
    const uint8_t *base;
    int64_t n;
    size_t row_bytes;
    DLDataType dtype;
    int row_ndim;
    int64_t row_shape[FL_MAX_NDIM];
} fl_array_info;

/* A source over `info->n` rows of `region` (a reference is taken; the
 * region holds at least n * row_bytes bytes from info->base, checked
 * here).  image = 1: the rows are uint8 images (row shape H x W x C, C 1
 * or 3, or H x W), handed out as pixels; checked here too.  Returns a
 * source with one reference; NULL with err (FL_ERR_INVALID with the reason,
 * FL_ERR_NOMEM). */
fl_source *fl_source_array_new(fl_region *region, const fl_array_info *info, int image, fl_err *err);

/* The array behind an array source (filled into *out), or -1 when `s` is
 * another kind.  The memory stays valid while the caller holds a reference
 * to s.  Pure. */
int fl_source_array_info(const fl_source *s, fl_array_info *out);

#endif
