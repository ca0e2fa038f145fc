/* codecs_internal.h: what codecs.c, png.c and webp.c share (not part of the
 * image layer's interface; see codecs.h).  No GIL anywhere. */
#ifndef FL_CODECS_INTERNAL_H
#define FL_CODECS_INTERNAL_H

#include "image/codecs.h"

struct libdeflate_decompressor;

struct fl_imgdec {
    uint64_t max_pixels; /* 0: no limit */
    uint8_t *scratch;    /* conversion buffer, grown by fl_imgdec_scratch */
    size_t scratch_cap;
    uint8_t *idat;       /* a PNG's IDAT chunks joined (png.c), grown by fl_imgdec_grow */
    size_t idat_cap;
    struct libdeflate_decompressor *inflater; /* png.c's, made on first use */
    int png_libspng_only; /* tests and fuzz/fuzz_codecs.c: skip png.c's fast path (the reference) */
};

/* *buf grown to at least n bytes (*cap its size; the old contents are not
 * kept), or NULL with err filled (FL_ERR_NOMEM).  Pure C. */
uint8_t *fl_imgdec_grow(uint8_t **buf, size_t *cap, size_t n, fl_err *err);

/* The decoder's scratch with at least n bytes, or NULL with err filled
 * (FL_ERR_NOMEM).  Owned by d; valid until the next call on d. */
uint8_t *fl_imgdec_scratch(fl_imgdec *d, size_t n, fl_err *err);

/* Pillow's rgb2l (L24): (R*19595 + G*38470 + B*7471 + 0x8000) >> 16.  Pure. */
static inline uint8_t
fl_img_luma(uint8_t r, uint8_t g, uint8_t b)
{
    return (uint8_t)(((uint32_t)r * 19595u + (uint32_t)g * 38470u + (uint32_t)b * 7471u + 0x8000u) >> 16);
}

int fl_png_info(const uint8_t *data, size_t len, fl_img_info *info, fl_err *err);
int fl_png_decode(fl_imgdec *d, const uint8_t *data, size_t len, int mode, uint8_t *out, size_t stride,
                  fl_err *err);
int fl_webp_info(const uint8_t *data, size_t len, fl_img_info *info, fl_err *err);
int fl_webp_decode(fl_imgdec *d, const uint8_t *data, size_t len, int mode, uint8_t *out, size_t stride,
                   fl_err *err);

#endif
