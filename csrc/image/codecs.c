/* codecs.c: format sniffing, the fl_imgdec object and the dispatch to
 * png.c / webp.c (see codecs.h).  No GIL; pure C. */
#include "image/codecs_internal.h"

#include <libdeflate.h>
#include <spng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <webp/decode.h>

#include "image/jpeg.h"

int
fl_img_format(const uint8_t *d, size_t n)
{
    if (n >= 2 && d[0] == 0xFF && d[1] == 0xD8)
        return FL_IMG_JPEG;
    if (n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0)
        return FL_IMG_PNG;
    if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0)
        return FL_IMG_WEBP;
    return FL_IMG_UNKNOWN;
}

fl_imgdec *
fl_imgdec_new(void)
{
    fl_imgdec *d = calloc(1, sizeof *d);
    if (d)
        d->max_pixels = FL_JPEG_DEFAULT_MAX_PIXELS;
    return d;
}

void
fl_imgdec_free(fl_imgdec *d)
{
    if (!d)
        return;
    free(d->scratch);
    free(d->idat);
    libdeflate_free_decompressor(d->inflater);
    free(d);
}

void
fl_imgdec_set_max_pixels(fl_imgdec *d, uint64_t max_pixels)
{
    d->max_pixels = max_pixels;
}

void
fl_imgdec_trim(fl_imgdec *d, size_t keep)
{
    if (d->scratch_cap > keep) {
        free(d->scratch);
        d->scratch = NULL;
        d->scratch_cap = 0;
    }
    if (d->idat_cap > keep) {
        free(d->idat);
        d->idat = NULL;
        d->idat_cap = 0;
    }
}

uint8_t *
fl_imgdec_grow(uint8_t **buf, size_t *cap, size_t n, fl_err *err)
{
    if (n <= *cap)
        return *buf;
    free(*buf);
    *buf = malloc(n);
    *cap = *buf ? n : 0;
    if (!*buf)
        fl_err_set(err, FL_ERR_NOMEM, 0, "out of memory for a %zu-byte decode buffer", n);
    return *buf;
}

uint8_t *
fl_imgdec_scratch(fl_imgdec *d, size_t n, fl_err *err)
{
    return fl_imgdec_grow(&d->scratch, &d->scratch_cap, n, err);
}

int
fl_imgdec_check_limit(const fl_imgdec *d, const fl_img_info *info, fl_err *err)
{
    uint64_t px = (uint64_t)info->width * (uint64_t)info->height;
    if (d->max_pixels && px > d->max_pixels) {
        fl_err_set(err, FL_ERR_LIMIT, 0, "image of %dx%d = %llu pixels exceeds the limit of %llu pixels",
                   info->width, info->height, (unsigned long long)px, (unsigned long long)d->max_pixels);
        return -1;
    }
    return 0;
}

int
fl_imgdec_info(fl_imgdec *d, const uint8_t *data, size_t len, fl_img_info *info, fl_err *err)
{
    (void)d;
    memset(info, 0, sizeof *info);
    switch (fl_img_format(data, len)) {
    case FL_IMG_PNG:
        return fl_png_info(data, len, info, err);
    case FL_IMG_WEBP:
        return fl_webp_info(data, len, info, err);
    case FL_IMG_JPEG:
        fl_err_set(err, FL_ERR_DECODE, 0, "a JPEG file: decode it with the JPEG decoder");
        return -1;
    default:
        fl_err_set(err, FL_ERR_DECODE, 0, "not a PNG or WebP file (starts with 0x%02x 0x%02x)",
                   len > 0 ? data[0] : 0, len > 1 ? data[1] : 0);
        return -1;
    }
}

size_t
fl_img_row_bytes(const fl_img_info *info, int mode)
{
    size_t w = (size_t)info->width;
    if (mode == FL_IMG_NATIVE)
        return w * (size_t)info->channels * (size_t)info->bytes;
    return w * (size_t)mode;
}

int
fl_imgdec_decode(fl_imgdec *d, const uint8_t *data, size_t len, int mode, uint8_t *out, size_t stride,
                 fl_err *err)
{
    if (mode != FL_IMG_NATIVE && mode != FL_IMG_L && mode != FL_IMG_RGB && mode != FL_IMG_RGBA) {
        fl_err_set(err, FL_ERR_INVALID, 0, "unknown output mode %d", mode);
        return -1;
    }
    switch (fl_img_format(data, len)) {
    case FL_IMG_PNG:
        return fl_png_decode(d, data, len, mode, out, stride, err);
    case FL_IMG_WEBP:
        return fl_webp_decode(d, data, len, mode, out, stride, err);
    default: {
        fl_img_info info; /* not a PNG or WebP: fl_imgdec_info says what it is */
        fl_imgdec_info(d, data, len, &info, err);
        return -1;
    }
    }
}

const char *
fl_codecs_spng_version(void)
{
    return spng_version_string();
}

const char *
fl_codecs_deflate_version(void)
{
    return LIBDEFLATE_VERSION_STRING;
}

const char *
fl_codecs_webp_version(void)
{
    static char buf[16];
    int v = WebPGetDecoderVersion();
    snprintf(buf, sizeof buf, "%d.%d.%d", (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff);
    return buf;
}
