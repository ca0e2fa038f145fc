/* fuzz_codecs.c: libFuzzer target "codecs" -- the PNG (libspng) and WebP
 * (libwebp) decoders of csrc/image/codecs.h: fl_imgdec_info, then
 * fl_imgdec_decode in every mode (RGB, L, RGBA, the file's own), as
 * fastloader.decode_image and the native workers call them.
 *
 * Input: the whole input is the PNG or WebP file.
 *
 * Contracts checked (besides ASan/UBSan):
 * - every -1 comes with a known FL_ERR_* code and a non-empty message;
 * - a header that fl_imgdec_info refuses is refused by fl_imgdec_decode;
 * - header fields are in range (size >= 1, channels 1..4, bytes 1 or 2);
 * - an image over the pixel limit is refused with FL_ERR_LIMIT;
 * - no mode writes past its rows (guard bytes after each output);
 * - the modes agree: all succeed or all fail (same bytes, same decode);
 *   RGBA's first three channels are the RGB decode; L is rgb2l of RGB for
 *   colour files and RGB's first channel for gray ones (PNG colour types 0
 *   and 4, where Pillow's L is the gray value);
 * - decoder reuse: the long-lived decoder (its scratch grown by earlier
 *   inputs) gives the same RGB pixels as a fresh one;
 * - png.c's two paths agree: a decoder told to use libspng alone
 *   (png_libspng_only) succeeds or fails where the default one does, with
 *   the same pixels.
 *
 * Each PNG input runs twice: as it is, and with every chunk's CRC
 * recomputed, so that mutations inside the IDAT data reach the zlib stream
 * and the unfiltering (a wrong IDAT CRC turns the fast path off, and most
 * mutations make one).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "image/codecs.h"
#include "image/codecs_internal.h"

#include <zlib.h>

static fl_imgdec *reused;

static int
decode_mode(fl_imgdec *d, const uint8_t *data, size_t size, const fl_img_info *info, int mode, uint8_t **out,
            size_t *n, fl_err *err)
{
    size_t row = fl_img_row_bytes(info, mode);
    *n = row * (size_t)info->height;
    *out = fz_guarded_alloc(*n);
    memset(*out, 0x5C, *n);
    fl_err_clear(err);
    int rc = fl_imgdec_decode(d, data, size, mode, *out, row, err);
    fz_guard_check(*out, *n, "fl_imgdec_decode");
    if (rc < 0)
        fz_check_err(err, "fl_imgdec_decode");
    else if (rc != 0)
        FZ_FAIL("fl_imgdec_decode returned %d", rc);
    return rc;
}

/* The RGB decode by libspng alone (png.c's reference path) agrees with the
 * default decoder's outcome r1 and pixels rgb (n bytes). */
static void
check_reference(const uint8_t *data, size_t size, const fl_img_info *info, int r1, const uint8_t *rgb, size_t n)
{
    fl_imgdec *ref = fl_imgdec_new();
    if (!ref)
        abort();
    fl_imgdec_set_max_pixels(ref, FZ_MAX_PIXELS);
    ref->png_libspng_only = 1;
    uint8_t *out;
    size_t m;
    fl_err e;
    int r = decode_mode(ref, data, size, info, FL_IMG_RGB, &out, &m, &e);
    if (r != r1)
        FZ_FAIL("libspng alone %s where the default path %s (%s)", r ? "fails" : "succeeds",
                r1 ? "fails" : "succeeds", r ? e.msg : "");
    if (r == 0 && (m != n || memcmp(out, rgb, n) != 0))
        FZ_FAIL("libspng alone gives other pixels than the default path");
    free(out);
    fl_imgdec_free(ref);
}

static int check_one(const uint8_t *data, size_t size);

/* data with every whole chunk's CRC made right (a copy, the caller frees
 * it), or NULL when it is not a PNG or already had them right. */
static uint8_t *
fixed_crcs(const uint8_t *data, size_t size)
{
    if (size < 8 || memcmp(data, "\x89PNG\r\n\x1a\n", 8) != 0)
        return NULL;
    uint8_t *c = malloc(size);
    if (!c)
        abort();
    memcpy(c, data, size);
    int changed = 0;
    for (size_t pos = 8; pos + 12 <= size;) {
        uint32_t len = (uint32_t)c[pos] << 24 | (uint32_t)c[pos + 1] << 16 | (uint32_t)c[pos + 2] << 8 | c[pos + 3];
        if (len > size - pos - 12)
            break;
        uint32_t crc = (uint32_t)crc32(0L, c + pos + 4, 4 + len);
        uint8_t *q = c + pos + 8 + len;
        uint8_t want[4] = {(uint8_t)(crc >> 24), (uint8_t)(crc >> 16), (uint8_t)(crc >> 8), (uint8_t)crc};
        if (memcmp(q, want, 4) != 0) {
            memcpy(q, want, 4);
            changed = 1;
        }
        pos += 12 + (size_t)len;
    }
    if (!changed) {
        free(c);
        return NULL;
    }
    return c;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_one(data, size);
    uint8_t *c = fixed_crcs(data, size);
    if (c) {
        check_one(c, size);
        free(c);
    }
    return 0;
}

static int
check_one(const uint8_t *data, size_t size)
{
    fl_imgdec *d = fl_imgdec_new();
    if (!d)
        abort();
    fl_imgdec_set_max_pixels(d, FZ_MAX_PIXELS);
    fl_img_info info;
    fl_err err;
    fl_err_clear(&err);
    if (fl_imgdec_info(d, data, size, &info, &err) < 0) {
        fz_check_err(&err, "fl_imgdec_info");
        uint8_t px[16];
        fl_err e2;
        fl_err_clear(&e2);
        if (fl_imgdec_decode(d, data, size, FL_IMG_RGB, px, 48, &e2) == 0)
            FZ_FAIL("fl_imgdec_decode accepted what fl_imgdec_info refused (%s)", err.msg);
        fz_check_err(&e2, "fl_imgdec_decode after a refused header");
        fl_imgdec_free(d);
        return 0;
    }
    if (info.width < 1 || info.height < 1 || info.channels < 1 || info.channels > 4 ||
        (info.bytes != 1 && info.bytes != 2) || info.mode[0] == '\0')
        FZ_FAIL("header out of range: %dx%d channels %d bytes %d mode '%s'", info.width, info.height,
                info.channels, info.bytes, info.mode);
    uint64_t px = (uint64_t)info.width * (uint64_t)info.height;
    if (px > FZ_MAX_PIXELS || px * 4 * 2 > FZ_MAX_OUT_BYTES) {
        uint8_t tiny[16];
        fl_err_clear(&err);
        int rc = fl_imgdec_decode(d, data, size, FL_IMG_RGB, tiny, (size_t)info.width * 3, &err);
        if (px > FZ_MAX_PIXELS && (rc == 0 || (err.code != FL_ERR_LIMIT && !info.animated)))
            FZ_FAIL("%llu pixels over the limit: rc %d code %d (%s)", (unsigned long long)px, rc, err.code, err.msg);
        FZ_LOG("skip %dx%d (limit or output size)", info.width, info.height);
        fl_imgdec_free(d);
        return 0;
    }
    uint8_t *rgb, *l, *rgba, *nat;
    size_t nrgb, nl, nrgba, nnat;
    fl_err e1, e2, e3, e4;
    int r1 = decode_mode(d, data, size, &info, FL_IMG_RGB, &rgb, &nrgb, &e1);
    int r2 = decode_mode(d, data, size, &info, FL_IMG_L, &l, &nl, &e2);
    int r3 = decode_mode(d, data, size, &info, FL_IMG_RGBA, &rgba, &nrgba, &e3);
    int r4 = decode_mode(d, data, size, &info, FL_IMG_NATIVE, &nat, &nnat, &e4);
    FZ_LOG("%s %dx%d mode %s: rc %d %d %d %d", info.format == FL_IMG_PNG ? "png" : "webp", info.width,
           info.height, info.mode, r1, r2, r3, r4);
    if (r1 != r2 || r1 != r3 || r1 != r4)
        FZ_FAIL("modes disagree: RGB %d L %d RGBA %d native %d (%s | %s | %s | %s)", r1, r2, r3, r4, e1.msg,
                e2.msg, e3.msg, e4.msg);
    if (r1 == 0) {
        int gray = info.format == FL_IMG_PNG && (info.color_type == 0 || info.color_type == 4);
        for (uint64_t i = 0; i < px; i++) {
            const uint8_t *p = rgb + 3 * i, *q = rgba + 4 * i;
            if (p[0] != q[0] || p[1] != q[1] || p[2] != q[2])
                FZ_FAIL("RGBA's RGB differs from the RGB decode at pixel %llu", (unsigned long long)i);
            uint8_t want = gray ? p[0] : fz_luma(p);
            if (l[i] != want)
                FZ_FAIL("L %u != %u at pixel %llu (%s)", l[i], want, (unsigned long long)i, info.mode);
        }
        if (!reused) {
            reused = fl_imgdec_new();
            if (!reused)
                abort();
            fl_imgdec_set_max_pixels(reused, FZ_MAX_PIXELS);
        }
        uint8_t *again = fz_guarded_alloc(nrgb);
        fl_err e5;
        fl_err_clear(&e5);
        if (fl_imgdec_decode(reused, data, size, FL_IMG_RGB, again, (size_t)info.width * 3, &e5) != 0)
            FZ_FAIL("the reused decoder failed where a fresh one did not: %s", e5.msg);
        fz_guard_check(again, nrgb, "fl_imgdec_decode (reused)");
        if (memcmp(again, rgb, nrgb) != 0)
            FZ_FAIL("the reused decoder's pixels differ from a fresh one's");
        free(again);
    }
    if (info.format == FL_IMG_PNG)
        check_reference(data, size, &info, r1, rgb, nrgb);
    free(rgb);
    free(l);
    free(rgba);
    free(nat);
    fl_imgdec_free(d);
    return 0;
}
