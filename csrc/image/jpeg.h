/* jpeg.h: JPEG header parsing and region / scaled decoding with libjpeg-turbo.
 *
 * Pure C, no Python.  Every function here may be called from any thread
 * without the GIL.  An fl_jpeg decoder is not thread-safe: use one per thread
 * (the engine creates one per worker when the worker starts).
 *
 * Error convention: int functions return 0 on success and -1 on failure with
 * the fl_err record filled (code + a message without the file name; the
 * caller prepends the file name or sample index).
 */
#ifndef FL_JPEG_H
#define FL_JPEG_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* Default limits.  FL_JPEG_DEFAULT_MAX_PIXELS is 2x Pillow's MAX_IMAGE_PIXELS,
 * the size at which Pillow raises DecompressionBombError. */
#define FL_JPEG_DEFAULT_MAX_PIXELS ((uint64_t)178956970)
#define FL_JPEG_DEFAULT_MAX_SCANS 500

/* A decoder: a libjpeg decompress object, its setjmp error manager, limits and
 * scratch row buffers that grow as needed and are reused across calls. */
typedef struct fl_jpeg fl_jpeg;

/* Create a decoder with the default limits.  Returns NULL when out of memory.
 * The caller owns the result and frees it with fl_jpeg_free. */
fl_jpeg *fl_jpeg_new(void);

/* Free a decoder and its scratch buffers.  NULL is a no-op. */
void fl_jpeg_free(fl_jpeg *j);

/* Set the limits checked before any image-sized allocation: max_pixels bounds
 * width*height as stored in the file (0 = no limit), max_scans bounds the
 * number of scans of a progressive (or multi-scan) file (0 = no limit). */
void fl_jpeg_set_limits(fl_jpeg *j, uint64_t max_pixels, int max_scans);

/* Strict mode (off by default): when on, every libjpeg warning (corrupt data,
 * extraneous bytes before a marker, ...) fails the decode.  When off, only
 * "Premature end of JPEG file" does, and the other warnings are ignored as
 * Pillow ignores them (it still returns the image). */
void fl_jpeg_set_strict(fl_jpeg *j, int strict);

/* Number of libjpeg warnings seen by the last fl_jpeg_decode call (lets a
 * caller count "decoded with corrupt data" samples without failing them). */
int fl_jpeg_last_warnings(const fl_jpeg *j);

typedef struct {
    int width, height;      /* as stored in the file (before EXIF orientation) */
    int components;         /* as the file says (1..4); fl_jpeg_decode refuses what it cannot convert */
    int colorspace;         /* libjpeg J_COLOR_SPACE of the file (JCS_GRAYSCALE, JCS_YCbCr, JCS_RGB, JCS_CMYK, JCS_YCCK) */
    int orientation;        /* EXIF orientation 1..8, 1 if absent or invalid */
    int progressive, arithmetic;
} fl_jpeg_info;

/* Parse the headers of the JPEG in data[0..len) (borrowed; not kept after the
 * call) into *info.  Returns 0, or -1 with err filled (also for a file that
 * starts with FF D8 but not FF D8 FF, which Pillow refuses).  Limits are not checked
 * here (a caller may want the size of a huge image); fl_jpeg_decode checks
 * them.  Orientation follows Pillow's getexif(): tag 0x0112 of IFD0 of the
 * first APP1 "Exif" segment, else tiff:Orientation of the XMP packet. */
int fl_jpeg_read_header(fl_jpeg *j, const uint8_t *data, size_t len, fl_jpeg_info *info, fl_err *err);

/* libjpeg's output size at scale scale_num/8: ceil(dim*scale_num/8) for each
 * dimension.  scale_num is clamped to 1..16.  Pure arithmetic. */
void fl_jpeg_scaled_size(const fl_jpeg_info *info, int scale_num, int *w, int *h);

/* Check the decoder's limits against a parsed header (the pixel limit; the
 * scan limit is enforced while decoding).  Returns 0, or -1 with err filled
 * (FL_ERR_LIMIT).  Lets a caller refuse an image before allocating its
 * output; fl_jpeg_decode makes the same check itself. */
int fl_jpeg_check_limits(const fl_jpeg *j, const fl_jpeg_info *info, fl_err *err);

typedef struct {
    int out_channels;       /* 1 (gray, luma as Pillow's convert("L")) or 3 (RGB; grayscale replicated; CMYK/YCCK converted) */
    int scale_num;          /* decode at scale_num/8; 8 = full size; 1..16 */
    int x, y, w, h;         /* region to produce, in SCALED output coordinates; must lie inside the scaled image */
} fl_jpeg_region;

/* Decode `region` of the JPEG in data[0..len) (borrowed) into out: row r of the
 * region goes to out + r*out_stride, pixels packed, out_channels bytes each.
 * out is owned by the caller and must hold (h-1)*out_stride + w*out_channels
 * bytes; out_stride >= w*out_channels.
 *
 * Only what is needed is decoded: columns through jpeg_crop_scanline, rows
 * above the region through jpeg_skip_scanlines, and decoding stops after the
 * last needed row.  The pixels equal the same window of a full decode at the
 * same scale (and, at scale 8, Pillow's convert("RGB") / convert("L")).
 * Whether the call fails does not depend on the region: the rest of a
 * single-scan file is checked without decoding it (jpeg.c, "Corrupt data").
 * Every call starts from a clean decoder: no table of an earlier file is used.
 *
 * Returns 0, or -1 with err filled (FL_ERR_DECODE with libjpeg's reason or
 * ours, FL_ERR_LIMIT, FL_ERR_NOMEM).  On -1 the content of out is unspecified. */
int fl_jpeg_decode(fl_jpeg *j, const uint8_t *data, size_t len, const fl_jpeg_region *region,
                   uint8_t *out, size_t out_stride, fl_err *err);

/* As fl_jpeg_decode, without copying the region out of libjpeg's cropped
 * window: out's rows (out_stride bytes apart, out_stride at least the scaled
 * image's width * out_channels) receive the whole window, iMCU-aligned and
 * wider than the region, and the region's row r is out + r * out_stride +
 * *col * out_channels.  out must hold (h-1)*out_stride + the scaled width *
 * out_channels bytes.  Where the window cannot land as it is (a conversion
 * after libjpeg: RGB to L, CMYK) the region is copied to column 0 and *col
 * is 0.  Same pixels, errors and GIL-free contract as fl_jpeg_decode. */
int fl_jpeg_decode_wide(fl_jpeg *j, const uint8_t *data, size_t len, const fl_jpeg_region *region,
                        uint8_t *out, size_t out_stride, size_t *col, fl_err *err);

/* Apply EXIF orientation (1..8, as PIL.ImageOps.exif_transpose; anything
 * else copies) to a packed HWC image: src is w x h x c; dst must hold w*h*c
 * bytes and not alias src; the dst dims are h x w (swapped) for orientations
 * 5..8.  Both buffers are owned by the caller. */
void fl_apply_orientation(const uint8_t *src, int w, int h, int c, int orientation, uint8_t *dst);

#endif
