/* fuzz_augment.c: libFuzzer target "augment" -- fl_aug_apply (image/augment.h)
 * over its whole parameter space: the op (valid codes mostly, sometimes not),
 * the magnitude (each op's realistic range, special values, or any 64-bit
 * pattern: NaN, infinities, huge values), the interpolation, the fill, the
 * image size and channel count (1 and 3 mostly, sometimes 0, 2 or 4), and the
 * pixels.
 *
 * Input: FZ_AUGMENT_PARAMS (17, fuzz_common.h) parameter bytes: op (1),
 * magnitude (a kind byte and 8 bytes), interpolation (1), channels (1), width
 * and height (1 each), fill (3; 0xEE first: no fill, zeros); the rest are the
 * pixels (repeated to fill the image; zeros when there are none).
 * scripts/make_fuzz_corpus.py writes its seeds in this layout.
 *
 * Contracts checked (besides ASan/UBSan):
 * - -1 comes with FL_ERR_INVALID and a message, and leaves the image as it
 *   was; fl_aug_tmp_bytes is positive for every size fl_aug_apply accepts;
 *   neither the image nor the scratch is written past its end (guard bytes);
 * - the geometric ops give exactly the bytes of an independent oracle: the
 *   matrix derived here again from torchvision's and Pillow's formulas, then
 *   Pillow's loops transcribed pixel by pixel (ImagingScaleAffine, affine_fixed,
 *   the double loop, the generic transform's bilinear and bicubic filters,
 *   the latter with Pillow's row replication as written), so the fast paths
 *   (the covered run solved per row, the AVX2 gathers, 4-byte moves, the
 *   chunked bilinear and bicubic) are held to the plain ones; timm's affine
 *   ops (Pillow's coefficients given directly) the same way;
 * - Identity, Color on one channel, Rotate by a multiple of 360 and factor-1
 *   enhances leave the image as it is; Invert twice gives it back; the table
 *   ops (Brightness, Contrast, Posterize, Solarize, AutoContrast, Equalize,
 *   Invert) map equal bytes of a channel to equal bytes; Posterize keeps only
 *   its high bits; SolarizeAdd is its table; Sharpness leaves the border
 *   rows and columns alone;
 * - the same call twice gives the same bytes;
 * - for the GaussianBlur op's inputs, torchvision's GaussianBlur
 *   (fl_gblur_apply) on the same pixels too: check_gblur's contracts.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "image/augment.h"
#include "image/imgops.h" /* FL_MAX_DIM */

/* ---- the oracle's matrix (torchvision / Pillow formulas, written again) ---- */

static const double fz_pi = 3.14159265358979323846;

static double
py_mod360(double x)
{
    double r = fmod(x, 360.0);
    if (r != 0.0) {
        if (r < 0)
            r += 360.0;
    } else {
        r = 0.0;
    }
    return r;
}

static double
py_round15(double x)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.15f", x);
    return strtod(buf, NULL);
}

/* torchvision's _get_inverse_affine_matrix, scale 1 */
static void
tv_matrix(double cx, double cy, double tx, double ty, double shx, double shy, double m[6])
{
    const double d2r = fz_pi / 180.0;
    double rot = 0.0 * d2r, sx = shx * d2r, sy = shy * d2r;
    double a = cos(rot - sy) / cos(sy);
    double b = -cos(rot - sy) * tan(sx) / cos(sy) - sin(rot);
    double c = sin(rot - sy) / cos(sy);
    double d = -sin(rot - sy) * tan(sx) / cos(sy) + cos(rot);
    m[0] = d, m[1] = -b, m[2] = 0.0, m[3] = -c, m[4] = a, m[5] = 0.0;
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
}

/* ---- Pillow's loops, pixel by pixel ---- */

typedef struct {
    const uint8_t *src;
    uint8_t *out;
    int w, h, c;
    const uint8_t *fill;
} fz_geo;

static int
pil_coord(double v)   /* COORD(), with out-of-int values sent outside */
{
    if (v < 0.0)
        return -1;
    if (!(v < 2147483647.0))
        return INT_MAX;
    return (int)v;
}

static int
pil_floor(double v)
{
    double f = v < 0.0 ? floor(v) : v;
    if (!(f > -2147483649.0 && f < 2147483648.0))
        return INT_MIN;
    return (int)f;
}

static void
put(const fz_geo *g, int x, int y, int sx, int sy)
{
    uint8_t *o = g->out + ((size_t)y * g->w + x) * g->c;
    if (sx >= 0 && sx < g->w && sy >= 0 && sy < g->h)
        memcpy(o, g->src + ((size_t)sy * g->w + sx) * g->c, (size_t)g->c);
    else
        memcpy(o, g->fill, (size_t)g->c);
}

static void
oracle_nearest(const fz_geo *g, const double a[6])
{
    int w = g->w, h = g->h;
    if (a[1] == 0 && a[3] == 0) {   /* ImagingScaleAffine */
        double yo = a[5] + a[4] * 0.5;
        for (int y = 0; y < h; y++, yo += a[4]) {
            double xo = a[2] + a[0] * 0.5;
            for (int x = 0; x < w; x++, xo += a[0])
                put(g, x, y, pil_coord(xo), pil_coord(yo));
        }
        return;
    }
    int fixed = 1;
    const int cx[4] = {0, w, 0, w}, cy[4] = {0, h, h, 0};
    for (int i = 0; i < 4; i++)
        if (!(fabs(cx[i] * a[0] + cy[i] * a[1] + a[2]) < 32768.0 && fabs(cx[i] * a[3] + cy[i] * a[4] + a[5]) < 32768.0))
            fixed = 0;
    if (fixed) {   /* affine_fixed, 32-bit wrapping as compiled */
        uint32_t a0 = (uint32_t)pil_floor(a[0] * 65536.0 + 0.5), a1 = (uint32_t)pil_floor(a[1] * 65536.0 + 0.5);
        uint32_t a3 = (uint32_t)pil_floor(a[3] * 65536.0 + 0.5), a4 = (uint32_t)pil_floor(a[4] * 65536.0 + 0.5);
        uint32_t a2 = (uint32_t)pil_floor((a[2] + a[0] * 0.5 + a[1] * 0.5) * 65536.0 + 0.5);
        uint32_t a5 = (uint32_t)pil_floor((a[5] + a[3] * 0.5 + a[4] * 0.5) * 65536.0 + 0.5);
        for (int y = 0; y < h; y++, a2 += a1, a5 += a4) {
            uint32_t xx = a2, yy = a5;
            for (int x = 0; x < w; x++, xx += a0, yy += a3)
                put(g, x, y, (int32_t)xx >> 16, (int32_t)yy >> 16);
        }
        return;
    }
    double xo = a[2] + a[1] * 0.5 + a[0] * 0.5, yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    for (int y = 0; y < h; y++, xo += a[1], yo += a[4]) {
        double xx = xo, yy = yo;
        for (int x = 0; x < w; x++, xx += a[0], yy += a[3])
            put(g, x, y, pil_coord(xx), pil_coord(yy));
    }
}

static void
oracle_bilinear(const fz_geo *g, const double a[6])
{
    int w = g->w, h = g->h, c = g->c;
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            double xin = x + 0.5, yin = y + 0.5;
            double xs = a[0] * xin + a[1] * yin + a[2], ys = a[3] * xin + a[4] * yin + a[5];
            uint8_t *o = g->out + ((size_t)y * w + x) * c;
            if (xs < 0.0 || xs >= w || ys < 0.0 || ys >= h) {
                memcpy(o, g->fill, (size_t)c);
                continue;
            }
            xs -= 0.5;
            ys -= 0.5;
            int xi = pil_floor(xs), yi = pil_floor(ys);
            double dx = xs - xi, dy = ys - yi;
#define XC(v) ((v) < 0 ? 0 : (v) < w ? (v) : w - 1)
#define YC(v) ((v) < 0 ? 0 : (v) < h ? (v) : h - 1)
            for (int b = 0; b < c; b++) {
                const uint8_t *in = g->src + (size_t)YC(yi) * w * c + b;
                int x0 = XC(xi) * c, x1 = XC(xi + 1) * c;
                double v1 = in[x0] + (in[x1] - in[x0]) * dx, v2;
                if (yi + 1 >= 0 && yi + 1 < h) {
                    in = g->src + (size_t)(yi + 1) * w * c + b;
                    v2 = in[x0] + (in[x1] - in[x0]) * dx;
                } else {
                    v2 = v1;
                }
                v1 = v1 + (v2 - v1) * dy;
                o[b] = (uint8_t)v1;
            }
#undef XC
#undef YC
        }
    }
}

/* Geometry.c's BICUBIC macro. */
static double
pil_cubic(double v1, double v2, double v3, double v4, double d)
{
    double p1 = v2;
    double p2 = -v1 + v3;
    double p3 = 2 * (v1 - v2) + v3 - v4;
    double p4 = -v1 + v2 - v3 + v4;
    return p1 + d * (p2 + d * (p3 + d * p4));
}

/* bicubic_filter8 / bicubic_filter32RGB as Pillow writes them: the first row
 * clamped, each later row read only when inside, else the previous row's
 * value (augment.c clamps every row instead). */
static void
oracle_bicubic(const fz_geo *g, const double a[6])
{
    int w = g->w, h = g->h, c = g->c;
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            double xin = x + 0.5, yin = y + 0.5;
            double xs = a[0] * xin + a[1] * yin + a[2], ys = a[3] * xin + a[4] * yin + a[5];
            uint8_t *o = g->out + ((size_t)y * w + x) * c;
            if (xs < 0.0 || xs >= w || ys < 0.0 || ys >= h) {
                memcpy(o, g->fill, (size_t)c);
                continue;
            }
            xs -= 0.5;
            ys -= 0.5;
            int xi = pil_floor(xs), yi = pil_floor(ys);
            double dx = xs - xi, dy = ys - yi;
            xi--;
            yi--;
#define XC(v) ((v) < 0 ? 0 : (v) < w ? (v) : w - 1)
#define YC(v) ((v) < 0 ? 0 : (v) < h ? (v) : h - 1)
            for (int b = 0; b < c; b++) {
                int x0 = XC(xi) * c, x1 = XC(xi + 1) * c, x2 = XC(xi + 2) * c, x3 = XC(xi + 3) * c;
                double v[4];
                for (int k = 0; k < 4; k++) {
                    int row = k == 0 ? YC(yi) : yi + k;
                    if (k > 0 && !(row >= 0 && row < h)) {
                        v[k] = v[k - 1];
                        continue;
                    }
                    const uint8_t *in = g->src + (size_t)row * w * c + b;
                    v[k] = pil_cubic(in[x0], in[x1], in[x2], in[x3], dx);
                }
                double r = pil_cubic(v[0], v[1], v[2], v[3], dy);
                o[b] = r <= 0.0 ? 0 : r >= 255.0 ? 255 : (uint8_t)r;
            }
#undef XC
#undef YC
        }
    }
}

/* The oracle for one geometric op; 0 when it does not model the case. */
static int
oracle_geometric(int op, double mag, int interp, const fz_geo *g)
{
    double m[6];
    int w = g->w, h = g->h, c = g->c;
    if (op >= FL_AUG_AFFINE_SHEAR_X && op <= FL_AUG_AFFINE_TRANSLATE_Y) {   /* timm's coefficients */
        m[0] = 1.0, m[1] = 0.0, m[2] = 0.0, m[3] = 0.0, m[4] = 1.0, m[5] = 0.0;
        m[op == FL_AUG_AFFINE_SHEAR_X ? 1 : op == FL_AUG_AFFINE_SHEAR_Y ? 3 : op == FL_AUG_AFFINE_TRANSLATE_X ? 2 : 5] =
            mag;
    } else if (op == FL_AUG_SHEAR_X || op == FL_AUG_SHEAR_Y) {
        double deg = atan(mag) * (180.0 / fz_pi);
        tv_matrix(0.0, 0.0, 0.0, 0.0, op == FL_AUG_SHEAR_X ? deg : 0.0, op == FL_AUG_SHEAR_Y ? deg : 0.0, m);
    } else if (op == FL_AUG_TRANSLATE_X || op == FL_AUG_TRANSLATE_Y) {
        double t = trunc(mag);
        tv_matrix(w * 0.5, h * 0.5, op == FL_AUG_TRANSLATE_X ? t : 0.0, op == FL_AUG_TRANSLATE_Y ? t : 0.0, 0.0, 0.0,
                  m);
    } else {   /* Rotate: Image.rotate's special cases, then its matrix */
        double ang = py_mod360(mag);
        if (ang == 0) {
            memcpy(g->out, g->src, (size_t)w * h * c);
            return 1;
        }
        if (ang == 180 || ((ang == 90 || ang == 270) && w == h)) {
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++) {
                    int sx = ang == 180 ? w - 1 - x : ang == 90 ? w - 1 - y : y;
                    int sy = ang == 180 ? h - 1 - y : ang == 90 ? x : h - 1 - x;
                    put(g, x, y, sx, sy);
                }
            return 1;
        }
        double t = -(ang * (fz_pi / 180.0));
        m[0] = py_round15(cos(t)), m[1] = py_round15(sin(t)), m[2] = 0.0;
        m[3] = py_round15(-sin(t)), m[4] = py_round15(cos(t)), m[5] = 0.0;
        double cx = w / 2.0, cy = h / 2.0;
        double e = m[0] * -cx + m[1] * -cy + m[2], f = m[3] * -cx + m[4] * -cy + m[5];
        m[2] = e + cx;
        m[5] = f + cy;
    }
    if (interp == FL_AUG_BICUBIC)
        oracle_bicubic(g, m);
    else if (interp == FL_AUG_BILINEAR)
        oracle_bilinear(g, m);
    else
        oracle_nearest(g, m);
    return 1;
}

/* ---- parameters ---- */

static double
magnitude_for(int op, fz_bytes *p)
{
    uint8_t kind = fz_u8(p);
    uint64_t bits = (uint64_t)fz_u32(p) << 32 | fz_u32(p);
    double u = (double)(bits >> 11) / 9007199254740992.0;   /* [0, 1) */
    static const double special[16] = {0.0, -0.0, 1.0, -1.0, 90.0, 180.0, 270.0, 360.0, -90.0, 8.0, 0.5,
                                       255.0, 1e-300, 1e300, 32767.5, -1e6};
    switch (kind % 4) {
    case 0: {
        double d;
        memcpy(&d, &bits, sizeof d);   /* any double: NaN, inf, subnormals, huge */
        return d;
    }
    case 1:
        return special[bits % 16];
    default:
        switch (op) {
        case FL_AUG_SHEAR_X: case FL_AUG_SHEAR_Y: return -1.5 + 3.0 * u;
        case FL_AUG_TRANSLATE_X: case FL_AUG_TRANSLATE_Y: return -80.0 + 160.0 * u;
        case FL_AUG_ROTATE: return -720.0 + 1440.0 * u;
        case FL_AUG_POSTERIZE: return -1.0 + 10.0 * u;
        case FL_AUG_SOLARIZE: return -10.0 + 280.0 * u;
        case FL_AUG_SOLARIZE_ADD: return -5.0 + 270.0 * u;
        case FL_AUG_AFFINE_SHEAR_X: case FL_AUG_AFFINE_SHEAR_Y: return -1.5 + 3.0 * u;
        case FL_AUG_AFFINE_TRANSLATE_X: case FL_AUG_AFFINE_TRANSLATE_Y: return -80.0 + 160.0 * u;
        case FL_AUG_BRIGHTNESS_FACTOR: case FL_AUG_COLOR_FACTOR: case FL_AUG_CONTRAST_FACTOR:
        case FL_AUG_SHARPNESS_FACTOR: return -0.2 + 2.4 * u;
        case FL_AUG_HUE: return -0.6 + 1.2 * u;
        case FL_AUG_GAUSSIAN_BLUR: return -1.0 + 9.0 * u;
        default: return -1.2 + 2.4 * u;
        }
    }
}

static int
dim_for(fz_bytes *p)
{
    uint8_t v = fz_u8(p);
    if (v < 224)
        return 1 + v % 40;
    if (v < 250)
        return 1 + (v - 224) * 12;   /* up to 301 */
    return (int[]){0, -1, INT_MAX, 1 << 21, 1 << 20, 3}[v - 250];
}

static void
check_table_op(const uint8_t *in, const uint8_t *out, size_t npix, int c, const char *what)
{
    int map[3][256];
    memset(map, 0xff, sizeof map);
    for (size_t i = 0; i < npix; i++)
        for (int b = 0; b < c; b++) {
            uint8_t v = in[i * c + b], o = out[i * c + b];
            if (map[b][v] < 0)
                map[b][v] = o;
            else if (map[b][v] != o)
                FZ_FAIL("%s: channel %d maps byte %d to both %d and %d", what, b, v, map[b][v], o);
        }
}

/* Hue against a plain transcription of Pillow's rgb2hsv / hsv2rgb (libm's
 * fmod and round, the divisions per pixel), which the op's shortcuts (the
 * fmod as a subtraction, its own rounding, the per-call tables) must equal;
 * and what HSV promises: V, the largest channel, unchanged. */
static void
check_hue(const uint8_t *orig, const uint8_t *img, size_t npix, double factor)
{
    const int shift = (int)trunc(factor * 255.0) & 255;
    for (size_t k = 0; k < npix; k++) {
        const uint8_t *o = orig + 3 * k, *q = img + 3 * k;
        int r = o[0], g = o[1], b = o[2];
        int mx = r > g ? (r > b ? r : b) : (g > b ? g : b), mn = r < g ? (r < b ? r : b) : (g < b ? g : b);
        int uh = 0, us = 0;
        if (mx != mn) {
            float cr = (float)(mx - mn), s = cr / (float)mx;
            float rc = (float)(mx - r) / cr, gc = (float)(mx - g) / cr, bc = (float)(mx - b) / cr, h;
            if (r == mx)
                h = bc - gc;
            else if (g == mx)
                h = 2.0 + rc - bc;
            else
                h = 4.0 + gc - rc;
            h = fmod(h / 6.0 + 1.0, 1.0);
            uh = (int)(h * 255.0);
            us = (int)(s * 255.0);
            uh = uh < 0 ? 0 : uh > 255 ? 255 : uh;
            us = us < 0 ? 0 : us > 255 ? 255 : us;
        }
        uh = (uh + shift) & 255;
        int want[3] = {mx, mx, mx};
        if (us != 0) {
            int i = (int)floor((float)uh * 6.0 / 255.0);
            float f = (float)uh * 6.0 / 255.0 - (float)i, fs = (float)us / 255.0;
            int p = (int)round((float)mx * (1.0 - fs)), qq = (int)round((float)mx * (1.0 - fs * f));
            int t = (int)round((float)mx * (1.0 - fs * (1.0 - f)));
            static const int pick[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3}, {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};
            const int vals[4] = {mx, p, qq, t};   /* v, p, q, t */
            for (int c = 0; c < 3; c++)
                want[c] = vals[pick[i % 6][c]];
        }
        for (int c = 0; c < 3; c++)
            if (q[c] != want[c])
                FZ_FAIL("Hue %.17g on (%d, %d, %d): (%d, %d, %d), the transcription's (%d, %d, %d)", factor, r, g, b,
                        q[0], q[1], q[2], want[0], want[1], want[2]);
        int omx = q[0] > q[1] ? (q[0] > q[2] ? q[0] : q[2]) : (q[1] > q[2] ? q[1] : q[2]);
        if (omx != mx)
            FZ_FAIL("Hue changed V: (%d, %d, %d) -> (%d, %d, %d)", r, g, b, q[0], q[1], q[2]);
    }
}

/* ---- torchvision's GaussianBlur (fl_gblur_*) ---- */

/* A stand-in for torch's exp (v1's fl_gblur.vexp; torch is not here):
 * libm's, which is all the contracts below need. */
static void
fz_vexp(void *ctx, const float *in, float *out, int n)
{
    (void)ctx;
    for (int i = 0; i < n; i++)
        out[i] = expf(in[i]);
}

static int
fz_reflect(int i, int n)
{
    return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i;
}

/* fl_gblur_apply on the same pixels, with the kernel, version, torch's
 * vector width and exp from the fill bytes and the sigma from the
 * magnitude (a realistic one, or the raw magnitude as a float: NaN,
 * infinities, out of range).  Checks: a refusal exactly where the contract
 * says (sizes, an even or oversized kernel, a padding not below the side,
 * lanes, sigma), FL_ERR_INVALID and the image untouched; fl_gblur_tmp_bytes
 * positive exactly for the sizes it takes; nothing written past the image
 * or the scratch; the 1-D kernels symmetric, in [0, 1], summing to 1 within
 * float error; each output between its channel's minimum and maximum (a
 * convex sum; a constant image stays); on small cases the same bytes as a
 * plain loop (reflect indexing, one fmaf chain per output over the 2-D
 * kernel rows outer), which holds the ring of padded rows and the AVX2
 * blocks to it; the same call twice gives the same bytes. */
static void
check_gblur(const uint8_t *orig, int w, int h, int channels, double mag, uint8_t kb, const uint8_t fill[3])
{
    fl_gblur g;
    memset(&g, 0, sizeof g);
    g.kx = fill[0] == 0xFF ? 4 : fill[0] == 0xFE ? FL_GBLUR_MAX_K + 2 : 1 + 2 * (fill[0] % 16);
    g.ky = (fill[1] & 0x80) ? g.kx : fill[1] == 0x7F ? -1 : 1 + 2 * (fill[1] % 16);
    g.v2 = fill[2] & 1;
    g.lanes = (fill[2] & 6) == 6 ? 4 : (fill[2] & 2) ? 16 : 8;
    g.vexp = !g.v2 && (fill[2] & 8) ? fz_vexp : NULL;
    const float sigma = (kb & 1) ? (float)mag : (float)(0.05 + fabs(fmod(mag, 6.0)));
    const int size_ok = w >= 1 && h >= 1 && w <= FL_MAX_DIM && h <= FL_MAX_DIM && (channels == 1 || channels == 3)
                        && g.kx >= 1 && g.ky >= 1 && g.kx <= FL_GBLUR_MAX_K && g.ky <= FL_GBLUR_MAX_K
                        && g.kx % 2 == 1 && g.ky % 2 == 1 && g.kx / 2 < w && g.ky / 2 < h;
    const int ok = size_ok && (g.lanes == 8 || g.lanes == 16) && sigma >= 1e-6f && sigma <= 1e6f;
    size_t tb = fl_gblur_tmp_bytes(w, h, channels, g.kx, g.ky), n = 64;
    if ((tb > 0) != size_ok)
        FZ_FAIL("fl_gblur_tmp_bytes(%d, %d, %d, %d, %d) = %zu", w, h, channels, g.kx, g.ky, tb);
    if (size_ok) {
        n = (size_t)w * h * channels;
        if ((double)n * g.kx * g.ky > 3e7)
            return;   /* too slow for a fuzz run, and nothing new */
    } else {
        tb = 64;
    }
    uint8_t *img = fz_guarded_alloc(n), *tmp = fz_guarded_alloc(tb);
    if (size_ok)
        memcpy(img, orig, n);
    else
        memset(img, 0x5A, n);
    uint8_t *before = malloc(n);
    if (!before)
        abort();
    memcpy(before, img, n);
    fl_err err;
    memset(&err, 0, sizeof err);
    int rc = fl_gblur_apply(&g, sigma, img, w, h, channels, tmp, &err);
    fz_guard_check(img, n, "fl_gblur_apply (image)");
    fz_guard_check(tmp, tb, "fl_gblur_apply (scratch)");
    FZ_LOG("gblur %dx%d v2 %d lanes %d sigma %g on %dx%dx%d -> %d %s", g.kx, g.ky, g.v2, g.lanes, (double)sigma, w, h,
           channels, rc, rc ? err.msg : "");
    if (rc != 0 && rc != -1)
        FZ_FAIL("fl_gblur_apply returned %d", rc);
    if (rc < 0) {
        fz_check_err(&err, "fl_gblur_apply");
        if (err.code != FL_ERR_INVALID)
            FZ_FAIL("fl_gblur_apply failed with code %d: %s", err.code, err.msg);
        if (ok)
            FZ_FAIL("fl_gblur_apply refused %dx%d sigma %g on %dx%dx%d: %s", g.kx, g.ky, (double)sigma, w, h,
                    channels, err.msg);
        if (memcmp(img, before, n) != 0)
            FZ_FAIL("fl_gblur_apply changed the image and failed: %s", err.msg);
        goto done;
    }
    if (!ok)
        FZ_FAIL("fl_gblur_apply accepted %dx%d lanes %d sigma %g on %dx%dx%d", g.kx, g.ky, g.lanes, (double)sigma, w, h,
                channels);
    float kx1[FL_GBLUR_MAX_K], ky1[FL_GBLUR_MAX_K];
    if (fl_gblur_kernel1d(&g, g.kx, sigma, kx1, &err) < 0 || fl_gblur_kernel1d(&g, g.ky, sigma, ky1, &err) < 0)
        FZ_FAIL("fl_gblur_kernel1d failed where the op did not: %s", err.msg);
    for (int pass = 0; pass < 2; pass++) {
        const float *k1 = pass ? ky1 : kx1;
        const int k = pass ? g.ky : g.kx;
        double sum = 0.0;
        for (int i = 0; i < k; i++) {
            if (!(k1[i] >= 0.0f && k1[i] <= 1.0f) || k1[i] != k1[k - 1 - i])
                FZ_FAIL("kernel %d (v2 %d, sigma %g): weight %d is %g, its mirror %g", k, g.v2, (double)sigma, i,
                        (double)k1[i], (double)k1[k - 1 - i]);
            sum += k1[i];
        }
        if (!(fabs(sum - 1.0) <= k * 2.4e-7))
            FZ_FAIL("kernel %d (v2 %d, sigma %g) sums to %.9g", k, g.v2, (double)sigma, sum);
    }
    const size_t npix = (size_t)w * h;
    for (int c = 0; c < channels; c++) {
        int lo = 255, hi = 0;
        for (size_t i = 0; i < npix; i++) {
            int v = orig[i * channels + c];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        for (size_t i = 0; i < npix; i++)
            if (img[i * channels + c] < lo || img[i * channels + c] > hi)
                FZ_FAIL("blur output %d at pixel %zu channel %d outside the channel's [%d, %d]", img[i * channels + c],
                        i, c, lo, hi);
    }
    if ((double)n * g.kx * g.ky <= 4e6) {   /* the plain loop */
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int c = 0; c < channels; c++) {
                    float acc = 0.0f;
                    for (int a = 0; a < g.ky; a++)
                        for (int b = 0; b < g.kx; b++) {
                            const int sy = fz_reflect(y + a - g.ky / 2, h), sx = fz_reflect(x + b - g.kx / 2, w);
                            acc = fmaf((float)orig[((size_t)sy * w + sx) * channels + c], ky1[a] * kx1[b], acc);
                        }
                    const float r = nearbyintf(acc);
                    const int want = r < 0.0f ? 0 : r > 255.0f ? 255 : (int)r;
                    const int got = img[((size_t)y * w + x) * channels + c];
                    if (got != want)
                        FZ_FAIL("blur %dx%d sigma %g on %dx%dx%d: (%d, %d, %d) is %d, the plain loop's %d", g.kx,
                                g.ky, (double)sigma, w, h, channels, x, y, c, got, want);
                }
    }
    {   /* the same call again gives the same bytes */
        uint8_t *again = fz_guarded_alloc(n);
        memcpy(again, orig, n);
        if (fl_gblur_apply(&g, sigma, again, w, h, channels, tmp, &err) != 0)
            FZ_FAIL("fl_gblur_apply failed the second time: %s", err.msg);
        fz_guard_check(again, n, "fl_gblur_apply (second image)");
        if (memcmp(again, img, n) != 0)
            FZ_FAIL("fl_gblur_apply is not deterministic");
        free(again);
    }
done:
    free(img);
    free(tmp);
    free(before);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_bytes p;
    const uint8_t *px;
    size_t npx;
    fz_split(data, size, FZ_AUGMENT_PARAMS, &p, &px, &npx);

    uint8_t opb = fz_u8(&p);
    int op = opb < 240 ? opb % FL_AUG_NOPS : (int[]){-1, FL_AUG_NOPS, 100, INT_MIN, INT_MAX, -15, 16, 255,
                                                     0, 1, 2, 3, 4, 5, 6, 7}[opb - 240];
    double mag = magnitude_for(op, &p);   /* 9 bytes */
    uint8_t ib = fz_u8(&p);
    int interp = ib < 250 ? ib % 3 : (int[]){2, -1, 3, 100, INT_MIN, 1}[ib - 250];
    uint8_t cb = fz_u8(&p);
    int channels = cb < 240 ? (cb % 2 ? 3 : 1) : (int[]){0, 2, 4, -1, 1, 3, 3, 1, 5, 255, 1, 3, 3, 1, 2, 3}[cb - 240];
    int w = dim_for(&p), h = dim_for(&p);
    uint8_t fill[3];
    fill[0] = fz_u8(&p);
    fill[1] = fz_u8(&p);
    fill[2] = fz_u8(&p);
    const uint8_t *fillp = (fill[0] == 0xEE) ? NULL : fill;   /* NULL: zeros */
    const uint8_t zeros[3] = {0, 0, 0};

    /* a size fl_aug_apply must accept gets its buffers (or is skipped when
     * they would be too large); any other gets token ones it must not touch */
    int valid_size = w >= 1 && h >= 1 && w <= FL_MAX_DIM && h <= FL_MAX_DIM && (channels == 1 || channels == 3);
    size_t tb = fl_aug_tmp_bytes(w, h, channels), n = 64;
    if (valid_size) {
        if (tb == 0)
            FZ_FAIL("fl_aug_tmp_bytes(%d, %d, %d) is 0", w, h, channels);
        n = (size_t)w * h * channels;
        if (n > FZ_MAX_OUT_BYTES / 4)
            return 0;
        if (tb < n + (size_t)w * sizeof(int))
            FZ_FAIL("fl_aug_tmp_bytes(%d, %d, %d) = %zu is below the image and its table", w, h, channels, tb);
    } else {
        tb = 64;
    }
    uint8_t *img = fz_guarded_alloc(n), *orig = malloc(n ? n : 1), *tmp = fz_guarded_alloc(tb);
    if (!orig)
        abort();
    for (size_t i = 0; i < n; i++)
        img[i] = npx ? px[i % npx] : 0;
    memcpy(orig, img, n);
    if (op == FL_AUG_GAUSSIAN_BLUR)   /* Pillow's blur op's inputs also drive torchvision's */
        check_gblur(orig, w, h, channels, mag, ib, fill);

    fl_err err;
    memset(&err, 0, sizeof err);
    int rc = fl_aug_apply(op, mag, interp, fillp, img, w, h, channels, tmp, &err);
    fz_guard_check(img, n, "fl_aug_apply (image)");
    fz_guard_check(tmp, tb, "fl_aug_apply (scratch)");
    FZ_LOG("op %d mag %g interp %d %dx%dx%d -> %d %s", op, mag, interp, w, h, channels, rc, rc ? err.msg : "");
    if (rc != 0 && rc != -1)
        FZ_FAIL("fl_aug_apply returned %d", rc);
    if (rc < 0) {
        fz_check_err(&err, "fl_aug_apply");
        if (err.code != FL_ERR_INVALID)
            FZ_FAIL("fl_aug_apply failed with code %d, not FL_ERR_INVALID: %s", err.code, err.msg);
        if (memcmp(img, orig, n) != 0)
            FZ_FAIL("fl_aug_apply changed the image and failed: %s", err.msg);
        goto done;
    }
    if (!valid_size)
        FZ_FAIL("fl_aug_apply accepted %d x %d x %d", w, h, channels);
    if (isnan(mag) || isinf(mag))
        FZ_FAIL("fl_aug_apply accepted magnitude %g", mag);

    size_t npix = (size_t)w * h;
    const uint8_t *fl = fillp ? fillp : zeros;
    switch (op) {
    case FL_AUG_SHEAR_X: case FL_AUG_SHEAR_Y: case FL_AUG_TRANSLATE_X: case FL_AUG_TRANSLATE_Y:
    case FL_AUG_ROTATE: case FL_AUG_AFFINE_SHEAR_X: case FL_AUG_AFFINE_SHEAR_Y: case FL_AUG_AFFINE_TRANSLATE_X:
    case FL_AUG_AFFINE_TRANSLATE_Y: {
        uint8_t *ref = malloc(n);
        if (!ref)
            abort();
        fz_geo g = {orig, ref, w, h, channels, fl};
        if (oracle_geometric(op, mag, interp, &g) && memcmp(ref, img, n) != 0) {
            size_t i = 0;
            while (ref[i] == img[i])
                i++;
            FZ_FAIL("op %d magnitude %.17g interp %d on %dx%dx%d: byte %zu (pixel %zu, %zu) is %d, the oracle's %d",
                    op, mag, interp, w, h, channels, i, (i / channels) % w, (i / channels) / w, img[i], ref[i]);
        }
        free(ref);
        break;
    }
    case FL_AUG_IDENTITY:
        if (memcmp(img, orig, n) != 0)
            FZ_FAIL("Identity changed the image");
        break;
    case FL_AUG_COLOR:
        if (channels == 1 && memcmp(img, orig, n) != 0)
            FZ_FAIL("Color changed a one-channel image");
        break;
    case FL_AUG_SHARPNESS:
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                if ((y == 0 || y == h - 1 || x == 0 || x == w - 1 || w < 3 || h < 3)
                    && memcmp(img + ((size_t)y * w + x) * channels, orig + ((size_t)y * w + x) * channels,
                              (size_t)channels) != 0)
                    FZ_FAIL("Sharpness changed the border pixel (%d, %d) of %dx%d", x, y, w, h);
        break;
    case FL_AUG_INVERT:
        check_table_op(orig, img, npix, channels, "Invert");
        if (fl_aug_apply(op, mag, interp, fillp, img, w, h, channels, tmp, &err) != 0 || memcmp(img, orig, n) != 0)
            FZ_FAIL("Invert twice is not the image");
        break;
    case FL_AUG_POSTERIZE: {
        int bits = (int)trunc(mag);
        uint8_t low = (uint8_t)~(0xFFu << (8 - bits));
        for (size_t i = 0; i < n; i++)
            if (img[i] & low || (img[i] != (orig[i] & (uint8_t)~low)))
                FZ_FAIL("Posterize %d bits: %d -> %d", bits, orig[i], img[i]);
        break;
    }
    case FL_AUG_SOLARIZE_ADD: {
        int add = (int)trunc(mag);
        for (size_t i = 0; i < n; i++) {
            int want = orig[i] < 128 ? (orig[i] + add > 255 ? 255 : orig[i] + add) : orig[i];
            if (img[i] != want)
                FZ_FAIL("SolarizeAdd %d: %d -> %d, not %d", add, orig[i], img[i], want);
        }
        break;
    }
    case FL_AUG_COLOR_FACTOR:
        if (channels == 1 && memcmp(img, orig, n) != 0)
            FZ_FAIL("Color (factor) changed a one-channel image");
        break;
    case FL_AUG_GAUSSIAN_BLUR: {   /* a weighted mean: a constant image stays as it is */
        int constant = 1;
        for (size_t i = channels; i < n && constant; i++)
            constant = orig[i] == orig[i % channels];
        if (constant && memcmp(img, orig, n) != 0)
            FZ_FAIL("GaussianBlur %g changed a constant %dx%dx%d image", mag, w, h, channels);
        break;
    }
    case FL_AUG_HUE:
        if (channels == 1 && memcmp(img, orig, n) != 0)
            FZ_FAIL("Hue changed a one-channel image");
        if (channels == 3)
            check_hue(orig, img, npix, mag);
        break;
    case FL_AUG_BRIGHTNESS: case FL_AUG_CONTRAST: case FL_AUG_SOLARIZE: case FL_AUG_AUTOCONTRAST:
    case FL_AUG_EQUALIZE: case FL_AUG_BRIGHTNESS_FACTOR: case FL_AUG_CONTRAST_FACTOR:
        check_table_op(orig, img, npix, channels, "a table op");
        break;
    }
    if (op >= FL_AUG_BRIGHTNESS && op <= FL_AUG_SHARPNESS && (float)(1.0 + mag) == 1.0f && memcmp(img, orig, n) != 0)
        FZ_FAIL("op %d with factor 1 changed the image", op);
    if (op >= FL_AUG_BRIGHTNESS_FACTOR && op <= FL_AUG_SHARPNESS_FACTOR && (float)mag == 1.0f
        && memcmp(img, orig, n) != 0)
        FZ_FAIL("op %d with factor 1 changed the image", op);

    {   /* the same call again gives the same bytes */
        uint8_t *again = fz_guarded_alloc(n);
        memcpy(again, orig, n);
        if (fl_aug_apply(op, mag, interp, fillp, again, w, h, channels, tmp, &err) != 0)
            FZ_FAIL("fl_aug_apply failed the second time: %s", err.msg);
        fz_guard_check(again, n, "fl_aug_apply (second image)");
        if (op != FL_AUG_INVERT) {
            if (memcmp(again, img, n) != 0)
                FZ_FAIL("op %d is not deterministic", op);
        }
        free(again);
    }

done:
    free(img);
    free(orig);
    free(tmp);
    return 0;
}
