/* webp.c: WebP decoding with libwebp, to Pillow's pixels (see codecs.h).
 *
 * Pillow's rules (Pillow 13, WebPImagePlugin): the file's mode is "RGBA"
 * when the bitstream has alpha, else "RGB"; Pillow decodes through
 * libwebp's animation decoder, whose first frame of a still image is
 * libwebp's plain decode (fancy upsampling, no dithering) written to a
 * blank canvas, which is what WebPDecode gives here.  convert("RGB") drops
 * alpha (no premultiplication), convert("L") is rgb2l of the RGB.
 * An animated file is refused here (FL_ERR_DECODE, "animated"): the native
 * datasets hand it to Pillow, which takes its first frame.
 *
 * Pure C, no GIL.  The input is borrowed.
 */
#include "image/codecs_internal.h"

#include <stdio.h>
#include <string.h>
#include <webp/decode.h>

static const char *
status_text(VP8StatusCode s)
{
    switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "corrupt bitstream";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "truncated";
    default: return "unknown error";
    }
}

static void
status_error(VP8StatusCode s, fl_err *err)
{
    fl_err_set(err, s == VP8_STATUS_OUT_OF_MEMORY ? FL_ERR_NOMEM : FL_ERR_DECODE, 0, "WebP: %s",
               status_text(s));
}

int
fl_webp_info(const uint8_t *data, size_t len, fl_img_info *info, fl_err *err)
{
    WebPBitstreamFeatures f;
    VP8StatusCode s = WebPGetFeatures(data, len, &f);
    if (s != VP8_STATUS_OK) {
        status_error(s, err);
        return -1;
    }
    memset(info, 0, sizeof *info);
    info->format = FL_IMG_WEBP;
    info->width = f.width;
    info->height = f.height;
    info->has_alpha = f.has_alpha;
    info->animated = f.has_animation;
    info->lossless = f.format == 2;
    info->bit_depth = 8;
    info->color_type = -1;
    info->bytes = 1;
    info->channels = f.has_alpha ? 4 : 3;
    snprintf(info->mode, sizeof info->mode, "%s", f.has_alpha ? "RGBA" : "RGB");
    return 0;
}

int
fl_webp_decode(fl_imgdec *d, const uint8_t *data, size_t len, int mode, uint8_t *out, size_t stride,
               fl_err *err)
{
    fl_img_info info;
    if (fl_webp_info(data, len, &info, err) < 0)
        return -1;
    if (info.animated) {
        fl_err_set(err, FL_ERR_DECODE, 0, "WebP: animated files are not decoded natively (Pillow takes the first frame)");
        return -1;
    }
    if (fl_imgdec_check_limit(d, &info, err) < 0)
        return -1;
    if (mode == FL_IMG_NATIVE)
        mode = info.channels;
    if (stride > (size_t)0x7fffffff) {
        fl_err_set(err, FL_ERR_INVALID, 0, "WebP: row stride %zu too large", stride);
        return -1;
    }
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg)) {
        fl_err_set(err, FL_ERR_RUNTIME, 0, "WebP: libwebp version mismatch");
        return -1;
    }
    size_t h = (size_t)info.height, w = (size_t)info.width;
    uint8_t *dst = out;
    size_t dst_stride = stride;
    if (mode == FL_IMG_L) {
        /* decoded as RGB into the scratch, then rgb2l row by row */
        dst_stride = w * 3;
        dst = fl_imgdec_scratch(d, dst_stride * h, err);
        if (!dst)
            return -1;
    }
    cfg.output.colorspace = mode == FL_IMG_RGBA ? MODE_RGBA : MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = dst;
    cfg.output.u.RGBA.stride = (int)dst_stride;
    cfg.output.u.RGBA.size = dst_stride * (h - 1) + w * (mode == FL_IMG_RGBA ? 4 : 3);
    VP8StatusCode s = WebPDecode(data, len, &cfg);
    WebPFreeDecBuffer(&cfg.output);
    if (s != VP8_STATUS_OK) {
        status_error(s, err);
        return -1;
    }
    if (mode == FL_IMG_L)
        for (size_t y = 0; y < h; y++) {
            const uint8_t *p = dst + y * dst_stride;
            uint8_t *q = out + y * stride;
            for (size_t x = 0; x < w; x++, p += 3)
                q[x] = fl_img_luma(p[0], p[1], p[2]);
        }
    return 0;
}
