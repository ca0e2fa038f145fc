/* codecs.h: the image formats besides JPEG (PNG with libspng, WebP with
 * libwebp), decoded to the pixels Pillow gives.
 *
 * Pure C, no Python.  Every function may be called from any thread without
 * the GIL.  An fl_imgdec (its scratch buffer and limits) is not thread-safe:
 * one per thread, as fl_jpeg.
 *
 * Meaning: fl_imgdec_decode(..., mode) equals Pillow's
 * np.array(Image.open(f).convert(mode)) for FL_IMG_RGB, FL_IMG_L and
 * FL_IMG_RGBA, and np.array(Image.open(f)) (the file's own mode, no
 * conversion) for FL_IMG_NATIVE; the Pillow rules this follows, including
 * its quirks, are listed at the top of png.c and webp.c and tested in
 * tests/test_codecs.py.
 *
 * Error convention: int functions return 0 on success and -1 with err filled
 * (FL_ERR_DECODE: malformed, truncated or unsupported data; FL_ERR_LIMIT:
 * over the pixel limit, checked before anything image-sized is allocated;
 * FL_ERR_NOMEM).  The message has no file name: the caller adds it.
 */
#ifndef FL_CODECS_H
#define FL_CODECS_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* Formats, judged by the first bytes, never by a file name. */
#define FL_IMG_UNKNOWN 0
#define FL_IMG_JPEG 1
#define FL_IMG_PNG 2
#define FL_IMG_WEBP 3

/* Output modes: the value is the channel count of the converted modes. */
#define FL_IMG_NATIVE 0 /* the file's own mode (info.mode), as stored */
#define FL_IMG_L 1
#define FL_IMG_RGB 3
#define FL_IMG_RGBA 4

/* The format of data[0..n) by its magic bytes: FL_IMG_JPEG (FF D8),
 * FL_IMG_PNG (the 8-byte signature), FL_IMG_WEBP (RIFF....WEBP), else
 * FL_IMG_UNKNOWN.  Pure. */
int fl_img_format(const uint8_t *data, size_t n);

typedef struct {
    int format;          /* FL_IMG_PNG or FL_IMG_WEBP */
    int width, height;
    char mode[8];        /* Pillow's mode of the file: "1" "L" "P" "I;16" "LA" "RGB" "RGBA" */
    int channels;        /* of that mode as np.array gives it: 1 ("1" L P I;16), 2 (LA), 3, 4 */
    int bytes;           /* per channel of that mode: 1, or 2 for "I;16" (native-endian uint16) */
    int bit_depth;       /* PNG: 1, 2, 4, 8, 16; WebP: 8 */
    int color_type;      /* PNG's colour type (0 2 3 4 6); WebP: -1 */
    int interlaced;      /* PNG: Adam7 */
    int has_alpha;       /* an alpha channel or tRNS (PNG); ALPH or lossless alpha (WebP) */
    int animated;        /* WebP with ANIM: not decoded here (fl_imgdec_decode refuses it) */
    int lossless;        /* WebP: VP8L */
} fl_img_info;

typedef struct fl_imgdec fl_imgdec;

/* A decoder with the default pixel limit (FL_JPEG_DEFAULT_MAX_PIXELS, the
 * same as JPEG's).  NULL when out of memory.  The caller owns it and frees
 * it with fl_imgdec_free (NULL-safe). */
fl_imgdec *fl_imgdec_new(void);
void fl_imgdec_free(fl_imgdec *d);

/* width*height above max_pixels fails with FL_ERR_LIMIT (0: no limit). */
void fl_imgdec_set_max_pixels(fl_imgdec *d, uint64_t max_pixels);

/* Free the scratch buffer when it grew past keep bytes (one outsized image
 * does not hold memory for the decoder's life). */
void fl_imgdec_trim(fl_imgdec *d, size_t keep);

/* Parse the header of the PNG or WebP in data[0..len) (borrowed; d may be NULL) into
 * *info.  0, or -1 with err filled (FL_ERR_DECODE, also for another format).
 * The pixel limit is not checked here; fl_imgdec_decode checks it. */
int fl_imgdec_info(fl_imgdec *d, const uint8_t *data, size_t len, fl_img_info *info, fl_err *err);

/* Check a parsed header against d's pixel limit, so a caller can refuse an
 * image before allocating its output (fl_imgdec_decode checks it too).
 * 0, or -1 with err filled (FL_ERR_LIMIT).  Pure. */
int fl_imgdec_check_limit(const fl_imgdec *d, const fl_img_info *info, fl_err *err);

/* Bytes of one packed output row of `info`'s image in `mode`
 * (width * channels * bytes).  Pure. */
size_t fl_img_row_bytes(const fl_img_info *info, int mode);

/* Decode the whole image (data borrowed) into out: row r at out + r*stride,
 * stride >= fl_img_row_bytes(info, mode); out is the caller's and must hold
 * (height-1)*stride + row bytes.  Checks the pixel limit first.  Uses the
 * decoder's scratch for conversions (grown as needed).  0, or -1 with err
 * filled; on -1 out's content is unspecified. */
int fl_imgdec_decode(fl_imgdec *d, const uint8_t *data, size_t len, int mode, uint8_t *out, size_t stride,
                     fl_err *err);

/* Versions of the linked libraries ("0.7.3", "1.14", "1.2.4"), for build_info.  Pure. */
const char *fl_codecs_spng_version(void);
const char *fl_codecs_deflate_version(void);
const char *fl_codecs_webp_version(void);

#endif
