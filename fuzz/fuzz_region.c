/* fuzz_region.c: libFuzzer target "region" -- the region / DCT-scaled decode
 * (fl_jpeg_decode with a region and scale_num taken from the input), as the
 * native pipeline and fastloader._C._decode_region call it.
 *
 * Input: FZ_REGION_PARAMS (16) parameter bytes, then the JPEG file:
 *   p[0]   bit 0: out_channels 1 (else 3); bit 1: strict mode;
 *          bits 2-3 == 0: make the request invalid, kind p[0] >> 4 (below)
 *   p[1]   scale_num = 1 + p[1] % 16
 *   p[2]   scan limit: 1..15 as given, else the default (500)
 *   p[3..10] x, y, w, h as 16-bit fractions of the scaled size (always a
 *          valid non-empty region inside the scaled image)
 *   p[11]  extra bytes of row stride (p[11] % 17)
 * Invalid kinds (each must be refused with -1 and an error, never crash or
 * write outside the buffer): 0 scale 0, 1 scale 17, 2 scale -5,
 * 3 out_channels 2, 4 out_channels 0, 5 x = -1, 6 y = -1, 7 w = 0, 8 h = 0,
 * 9 x + w = scaled width + 1, 10 y + h = scaled height + 1, 11 x = INT_MAX,
 * 12 w = INT_MAX, 13 x = scaled width, 14 stride one byte short of a row,
 * 15 h = INT_MIN.
 *
 * Contracts checked (besides ASan/UBSan): errors carry a known code and a
 * message; a valid region (computed with fl_jpeg_scaled_size from the header)
 * is never refused as outside the image; an invalid one is never accepted;
 * and a region decoded without warnings equals the same window of a full
 * decode at the same scale (jpeg.h's promise), when that full decode succeeds;
 * fl_jpeg_decode_wide gives the same outcome and, at the column it reports,
 * the same bytes.
 * Each input gets fresh decoders (one for the header and the region, one for
 * the full decode), so nothing carries over between inputs or decodes.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "image/jpeg.h"

/* v in [0, 65536) scaled into [0, n) */
static int
frac(uint16_t v, int n)
{
    return (int)(((uint64_t)v * (uint64_t)n) >> 16);
}

static void region_checks(fl_jpeg *dec, const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fl_jpeg *dec = fl_jpeg_new();
    if (!dec)
        abort();
    region_checks(dec, data, size);
    fl_jpeg_free(dec);
    return 0;
}

static void
region_checks(fl_jpeg *dec, const uint8_t *data, size_t size)
{
    fz_bytes p;
    const uint8_t *file;
    size_t len;
    fz_split(data, size, FZ_REGION_PARAMS, &p, &file, &len);
    const uint8_t flags = fz_u8(&p);
    const int ch = (flags & 1) ? 1 : 3;
    const int strict = (flags >> 1) & 1;
    const int invalid = ((flags >> 2) & 3) == 0 ? flags >> 4 : -1;
    const int scale = 1 + fz_u8(&p) % 16;
    const uint8_t sl = fz_u8(&p);
    fl_jpeg_set_limits(dec, FZ_MAX_PIXELS, sl >= 1 && sl <= 15 ? sl : FL_JPEG_DEFAULT_MAX_SCANS);
    fl_jpeg_set_strict(dec, strict);
    const uint16_t fx = fz_u16(&p), fy = fz_u16(&p), fw = fz_u16(&p), fh = fz_u16(&p);
    const size_t pad = fz_u8(&p) % 17;

    fl_jpeg_info info;
    fl_err err = {0, ""};
    if (fl_jpeg_read_header(dec, file, len, &info, &err) < 0) {
        fz_check_err(&err, "fl_jpeg_read_header");
        FZ_LOG("header refused: %s", err.msg);
        return;
    }
    int sw, sh;
    fl_jpeg_scaled_size(&info, scale, &sw, &sh);
    if (sw < 1 || sh < 1)
        FZ_FAIL("fl_jpeg_scaled_size(%d x %d, %d) = %d x %d", info.width, info.height, scale, sw, sh);
    fl_jpeg_region r;
    r.out_channels = ch;
    r.scale_num = scale;
    r.x = frac(fx, sw);
    r.y = frac(fy, sh);
    r.w = 1 + frac(fw, sw - r.x);
    r.h = 1 + frac(fh, sh - r.y);
    /* keep the buffer bounded: fewer rows for a huge region */
    if ((size_t)r.w * (size_t)r.h * (size_t)ch > FZ_MAX_OUT_BYTES)
        r.h = (int)(FZ_MAX_OUT_BYTES / ((size_t)r.w * (size_t)ch));
    if (r.h < 1)
        return;
    size_t stride = (size_t)r.w * (size_t)ch + pad;
    /* exactly (h - 1) * stride + w * ch bytes, as jpeg.h requires */
    const size_t need = (size_t)(r.h - 1) * stride + (size_t)r.w * (size_t)ch;

    if (invalid >= 0) {
        switch (invalid) {
        case 0: r.scale_num = 0; break;
        case 1: r.scale_num = 17; break;
        case 2: r.scale_num = -5; break;
        case 3: r.out_channels = 2; break;
        case 4: r.out_channels = 0; break;
        case 5: r.x = -1; break;
        case 6: r.y = -1; break;
        case 7: r.w = 0; break;
        case 8: r.h = 0; break;
        case 9: r.w = sw - r.x + 1; break;
        case 10: r.h = sh - r.y + 1; break;
        case 11: r.x = INT_MAX; break;
        case 12: r.w = INT_MAX; break;
        case 13: r.x = sw; r.w = 1; break;
        case 14: stride = (size_t)r.w * (size_t)ch - 1; break;
        default: r.h = INT_MIN; break;
        }
        uint8_t *out = fz_guarded_alloc(need);
        int rc = fl_jpeg_decode(dec, file, len, &r, out, stride, &err);
        fz_guard_check(out, need, "fl_jpeg_decode(invalid request)");
        free(out);
        if (rc == 0)
            FZ_FAIL("invalid request %d accepted: scale %d ch %d region %d,%d %dx%d stride %zu in %dx%d", invalid,
                    r.scale_num, r.out_channels, r.x, r.y, r.w, r.h, stride, sw, sh);
        fz_check_err(&err, "fl_jpeg_decode(invalid request)");
        FZ_LOG("invalid request %d refused: %s", invalid, err.msg);
        return;
    }

    uint8_t *out = fz_guarded_alloc(need);
    /* the bytes between rows (stride > row) are not part of the output */
    memset(out, 0x5A, need);
    int rc = fl_jpeg_decode(dec, file, len, &r, out, stride, &err);
    int warnings = fl_jpeg_last_warnings(dec);
    fz_guard_check(out, need, "fl_jpeg_decode(region)");
    FZ_LOG("region %d,%d %dx%d ch %d scale %d of %dx%d (scaled %dx%d) strict %d: rc %d (%d warnings)%s%s", r.x, r.y,
           r.w, r.h, ch, scale, info.width, info.height, sw, sh, strict, rc, warnings, rc ? ": " : "",
           rc ? err.msg : "");
    for (int y = 0; y + 1 < r.h; y++)
        for (size_t i = (size_t)r.w * (size_t)ch; i < stride; i++)
            if (out[(size_t)y * stride + i] != 0x5A)
                FZ_FAIL("fl_jpeg_decode wrote into the stride padding after row %d (byte %zu of %zu)", y, i, stride);
    if (rc < 0) {
        fz_check_err(&err, "fl_jpeg_decode(region)");
        if (strstr(err.msg, "is outside the"))
            FZ_FAIL("valid region %d,%d %dx%d of the %dx%d image at scale %d refused: %s", r.x, r.y, r.w, r.h, sw,
                    sh, scale, err.msg);
    }
    /* region == window of the full decode at the same scale */
    if (rc == 0 && warnings == 0 && (size_t)sw * (size_t)sh * (size_t)ch <= ((size_t)4 << 20)
        && !(r.x == 0 && r.y == 0 && r.w == sw && r.h == sh)) {
        fl_jpeg_region full = {ch, scale, 0, 0, sw, sh};
        const size_t fstride = (size_t)sw * (size_t)ch;
        uint8_t *all = fz_guarded_alloc(fstride * (size_t)sh);
        fl_err e2 = {0, ""};
        fl_jpeg *dec2 = fl_jpeg_new();
        if (!dec2)
            abort();
        fl_jpeg_set_limits(dec2, FZ_MAX_PIXELS, FL_JPEG_DEFAULT_MAX_SCANS);
        int frc = fl_jpeg_decode(dec2, file, len, &full, all, fstride, &e2);
        fl_jpeg_free(dec2);
        fz_guard_check(all, fstride * (size_t)sh, "fl_jpeg_decode(full)");
        if (frc == 0) {
            for (int y = 0; y < r.h; y++) {
                const uint8_t *a = all + (size_t)(r.y + y) * fstride + (size_t)r.x * (size_t)ch;
                const uint8_t *b = out + (size_t)y * stride;
                if (memcmp(a, b, (size_t)r.w * (size_t)ch) != 0) {
                    int x = 0;
                    while (a[x] == b[x])
                        x++;
                    FZ_FAIL("region %d,%d %dx%d (ch %d, scale %d/8, image %dx%d -> %dx%d) differs from the full "
                            "decode at row %d byte %d: %u != %u",
                            r.x, r.y, r.w, r.h, ch, scale, info.width, info.height, sw, sh, y, x, b[x], a[x]);
                }
            }
        } else {
            fz_check_err(&e2, "fl_jpeg_decode(full, for comparison)");
        }
        free(all);
    }
    /* fl_jpeg_decode_wide (the native pipeline's call): the same outcome, and
     * the region's bytes at the column it reports in rows as wide as the
     * scaled image (when those rows fit the harness's output bound: a narrow
     * region of a very wide image would not) */
    const size_t wstride = (size_t)sw * (size_t)ch + pad;
    const size_t wneed = (size_t)(r.h - 1) * wstride + (size_t)sw * (size_t)ch;
    if (wneed <= FZ_MAX_OUT_BYTES) {
        uint8_t *wide = fz_guarded_alloc(wneed);
        size_t col = 0;
        fl_err e3 = {0, ""};
        int wrc = fl_jpeg_decode_wide(dec, file, len, &r, wide, wstride, &col, &e3);
        fz_guard_check(wide, wneed, "fl_jpeg_decode_wide");
        if (wrc != rc)
            FZ_FAIL("fl_jpeg_decode_wide returned %d where fl_jpeg_decode returned %d (%s)", wrc, rc, e3.msg);
        if (wrc < 0)
            fz_check_err(&e3, "fl_jpeg_decode_wide");
        else if (col + (size_t)r.w > (size_t)sw)
            FZ_FAIL("fl_jpeg_decode_wide: column %zu + width %d past the scaled width %d", col, r.w, sw);
        else if (fl_jpeg_last_warnings(dec) == 0 && warnings == 0)
            for (int y = 0; y < r.h; y++)
                if (memcmp(wide + (size_t)y * wstride + col * (size_t)ch, out + (size_t)y * stride,
                           (size_t)r.w * (size_t)ch) != 0)
                    FZ_FAIL("fl_jpeg_decode_wide: row %d of region %d,%d %dx%d (ch %d, scale %d/8) differs from "
                            "fl_jpeg_decode's", y, r.x, r.y, r.w, r.h, ch, scale);
        free(wide);
    }
    free(out);
    return;
}
