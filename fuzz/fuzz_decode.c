/* fuzz_decode.c: libFuzzer target "decode" -- fl_jpeg_read_header and a full
 * fl_jpeg_decode (out_channels 3 and 1, lenient and strict), then
 * fl_apply_orientation, as fastloader.decode_jpeg does.
 *
 * Input: the whole input is the JPEG file (see fuzz_common.h).
 *
 * Contracts checked (besides ASan/UBSan):
 * - every -1 comes with a known FL_ERR_* code and a non-empty message;
 * - a header that fl_jpeg_read_header refuses is refused by fl_jpeg_decode;
 * - a header over the pixel limit is refused by fl_jpeg_check_limits and by
 *   fl_jpeg_decode with FL_ERR_LIMIT;
 * - header fields are in range (size >= 1, orientation 1..8, flags 0/1);
 * - the 1-channel decode equals Pillow's rgb2l of the 3-channel decode, and
 *   both succeed or fail together (same bytes, same libjpeg work);
 * - strict mode fails exactly when the lenient decode saw a warning;
 * - decoder reuse: a decoder that has just decoded another JPEG (primer.h,
 *   with its own quantization and Huffman tables) gives the same result for
 *   the input as a fresh one, as a native worker reuses its decoder for every
 *   file it reads.
 * Everything else uses a fresh decoder per input, so a crash reproduces from
 * its input alone.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "image/jpeg.h"
#include "primer.h"

static fl_jpeg *reused;   /* lives across inputs, as a worker's decoder does */

static uint8_t *
xmalloc(size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

/* Decode the primer, then data, on the long-lived decoder; the result must
 * equal the fresh decoder's (rc3, rgb). */
static void
check_reuse(const uint8_t *data, size_t size, const fl_jpeg_info *info, int rc3, const uint8_t *rgb)
{
    if (!reused) {
        reused = fl_jpeg_new();
        if (!reused)
            abort();
        fl_jpeg_set_limits(reused, FZ_MAX_PIXELS, FL_JPEG_DEFAULT_MAX_SCANS);
    }
    uint8_t px[16 * 16 * 3];
    fl_jpeg_region pr = {3, 8, 0, 0, 16, 16};
    fl_err err = {0, ""};
    if (fl_jpeg_decode(reused, fz_primer_jpeg, sizeof fz_primer_jpeg, &pr, px, 16 * 3, &err) < 0)
        FZ_FAIL("the primer JPEG does not decode: %s", err.msg);
    const size_t n = (size_t)info->width * (size_t)info->height * 3;
    uint8_t *again = fz_guarded_alloc(n);
    fl_jpeg_region r3 = {3, 8, 0, 0, info->width, info->height};
    int rc = fl_jpeg_decode(reused, data, size, &r3, again, (size_t)info->width * 3, &err);
    fz_guard_check(again, n, "fl_jpeg_decode(reused decoder)");
    if (rc != rc3)
        FZ_FAIL("decoder reuse: a fresh decoder gives %d, one that decoded another JPEG first gives %d (%s): "
                "tables or state carried over from the previous image",
                rc3, rc, rc ? err.msg : "ok");
    if (rc == 0 && memcmp(again, rgb, n) != 0)
        FZ_FAIL("decoder reuse: pixels differ from a fresh decoder's after decoding another JPEG first "
                "(tables carried over from the previous image)");
    free(again);
}

/* fl_jpeg_decode on a decoder of its own (created and freed here): no
 * state from any other call.  Returns its result; *warnings gets
 * fl_jpeg_last_warnings. */
static int
decode_fresh(const uint8_t *data, size_t size, const fl_jpeg_region *r, uint8_t *out, size_t stride, int strict,
             fl_err *err, int *warnings)
{
    fl_jpeg *j = fl_jpeg_new();
    if (!j)
        abort();
    fl_jpeg_set_limits(j, FZ_MAX_PIXELS, FL_JPEG_DEFAULT_MAX_SCANS);
    fl_jpeg_set_strict(j, strict);
    int rc = fl_jpeg_decode(j, data, size, r, out, stride, err);
    *warnings = fl_jpeg_last_warnings(j);
    fl_jpeg_free(j);
    return rc;
}

/* Decode a 1x1 region into a guarded 3-byte buffer, for inputs that must
 * be refused before anything is written; `what` names the check.  Returns
 * fl_jpeg_decode's result (a refusal must carry a known error). */
static int
decode_1x1(fl_jpeg *dec, const uint8_t *data, size_t size, const char *what)
{
    uint8_t *px = fz_guarded_alloc(3);
    fl_jpeg_region r = {3, 8, 0, 0, 1, 1};
    fl_err e = {0, ""};
    int rc = fl_jpeg_decode(dec, data, size, &r, px, 3, &e);
    fz_guard_check(px, 3, what);
    free(px);
    if (rc != 0)
        fz_check_err(&e, what);
    return rc;
}

/* All the checks on one input; dec is fresh.  Returns 0. */
static int
fz_decode_checks(fl_jpeg *dec, const uint8_t *data, size_t size)
{
    fl_jpeg_info info;
    fl_err err = {0, ""};
    if (fl_jpeg_read_header(dec, data, size, &info, &err) < 0) {
        fz_check_err(&err, "fl_jpeg_read_header");
        FZ_LOG("header refused: %s", err.msg);
        /* decode parses the same header: it must refuse too */
        if (decode_1x1(dec, data, size, "fl_jpeg_decode after a refused header") == 0)
            FZ_FAIL("fl_jpeg_read_header refused (%s) but fl_jpeg_decode accepted", err.msg);
        return 0;
    }
    if (info.width < 1 || info.height < 1 || info.components < 1 || info.components > 10)
        FZ_FAIL("header: size %d x %d, %d components", info.width, info.height, info.components);
    if (info.orientation < 1 || info.orientation > 8)
        FZ_FAIL("header: orientation %d", info.orientation);
    if ((info.progressive != 0 && info.progressive != 1) || (info.arithmetic != 0 && info.arithmetic != 1))
        FZ_FAIL("header: flags progressive=%d arithmetic=%d", info.progressive, info.arithmetic);

    const size_t w = (size_t)info.width, h = (size_t)info.height;
    fl_jpeg_region r3 = {3, 8, 0, 0, info.width, info.height};
    fl_jpeg_region r1 = {1, 8, 0, 0, info.width, info.height};
    if (fl_jpeg_check_limits(dec, &info, &err) < 0) {
        fz_check_err(&err, "fl_jpeg_check_limits");
        if (err.code != FL_ERR_LIMIT)
            FZ_FAIL("fl_jpeg_check_limits: code %d, not FL_ERR_LIMIT", err.code);
        /* decode must refuse before touching the (too small) buffer */
        if (decode_1x1(dec, data, size, "fl_jpeg_decode over the limit") == 0)
            FZ_FAIL("%zu x %zu is over the pixel limit but fl_jpeg_decode accepted it", w, h);
        return 0;
    }
    if (w * h * 3 > FZ_MAX_OUT_BYTES)
        return 0;   /* unreachable with FZ_MAX_PIXELS; kept as a guard */

    /* exact-size buffers, so ASan sees any write past the last row */
    uint8_t *rgb = fz_guarded_alloc(w * h * 3), *gray = fz_guarded_alloc(w * h);
    fl_err e3 = {0, ""}, e1 = {0, ""};
    int warn3, warn1, warns;
    int rc3 = decode_fresh(data, size, &r3, rgb, w * 3, 0, &e3, &warn3);
    fz_guard_check(rgb, w * h * 3, "fl_jpeg_decode(out_channels=3)");
    if (rc3 < 0)
        fz_check_err(&e3, "fl_jpeg_decode(out_channels=3)");
    int rc1 = decode_fresh(data, size, &r1, gray, w, 0, &e1, &warn1);
    fz_guard_check(gray, w * h, "fl_jpeg_decode(out_channels=1)");
    if (rc1 < 0)
        fz_check_err(&e1, "fl_jpeg_decode(out_channels=1)");
    if ((rc1 == 0) != (rc3 == 0))
        FZ_FAIL("out_channels 3 gave %d (%s), out_channels 1 gave %d (%s)", rc3, rc3 ? e3.msg : "ok", rc1,
                rc1 ? e1.msg : "ok");
    FZ_LOG("decode %dx%d comp %d prog %d arith %d orient %d: rgb rc %d (%d warnings) L rc %d%s%s", info.width,
           info.height, info.components, info.progressive, info.arithmetic, info.orientation, rc3, warn3, rc1,
           rc3 ? ": " : "", rc3 ? e3.msg : "");
    if (rc1 == 0 && rc3 == 0) {
        if (warn1 != warn3)
            FZ_FAIL("warnings differ: %d with 3 channels, %d with 1", warn3, warn1);
        for (size_t i = 0; i < w * h; i++)
            if (gray[i] != fz_luma(rgb + 3 * i))
                FZ_FAIL("pixel %zu: L %u != rgb2l(%u, %u, %u)", i, gray[i], rgb[3 * i], rgb[3 * i + 1],
                        rgb[3 * i + 2]);
        /* decode_jpeg(apply_exif_orientation=True); also an out-of-range
         * orientation picked by the data, which must copy */
        uint8_t *rot = xmalloc(w * h * 3);
        fl_apply_orientation(rgb, info.width, info.height, 3, info.orientation, rot);
        fl_apply_orientation(gray, info.width, info.height, 1, (int)(data[size - 1] % 10), rot);
        free(rot);
    }

    check_reuse(data, size, &info, rc3, rgb);

    /* strict: fails exactly when the lenient decode saw a warning */
    fl_err es = {0, ""};
    int rcs = decode_fresh(data, size, &r3, rgb, w * 3, 1, &es, &warns);
    fz_guard_check(rgb, w * h * 3, "fl_jpeg_decode(strict)");
    if (rcs < 0)
        fz_check_err(&es, "fl_jpeg_decode(strict)");
    if (rc3 == 0 && warn3 == 0 && rcs != 0)
        FZ_FAIL("clean lenient decode but strict decode failed: %s", es.msg);
    if (rc3 == 0 && warn3 > 0 && rcs == 0)
        FZ_FAIL("lenient decode saw %d warnings but strict decode succeeded", warn3);
    free(rgb);
    free(gray);
    return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fl_jpeg *dec = fl_jpeg_new();
    if (!dec)
        abort();
    fl_jpeg_set_limits(dec, FZ_MAX_PIXELS, FL_JPEG_DEFAULT_MAX_SCANS);
    int rc = fz_decode_checks(dec, data, size);
    fl_jpeg_free(dec);
    return rc;
}
