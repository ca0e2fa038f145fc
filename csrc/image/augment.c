/* augment.c: the image ops of torchvision's AutoAugment / RandAugment /
 * TrivialAugmentWide and timm's RandAugment (augment.h), computed as Pillow
 * 13 computes them on the PIL image torchvision's _apply_op (or timm's op
 * function) hands it.
 *
 * Reference, op by op (Pillow's C in src/libImaging, Python in PIL/):
 *   geometric   Image.transform(AFFINE) -> ImagingTransformAffine
 *               (Geometry.c): NEAREST takes ImagingScaleAffine when the
 *               matrix has no cross terms, else the 16.16 fixed-point loop
 *               when the four corners map inside +-32768, else the double
 *               loop; BILINEAR and BICUBIC take the generic transform with
 *               the bilinear or bicubic (a = -1) filter; timm's affine ops
 *               give Image.transform their coefficients directly.  Shear/Translate get torchvision's inverse matrix
 *               (_get_inverse_affine_matrix); Rotate gets Image.rotate's own
 *               (angle % 360, the 0/90/180/270 transposes, round(..., 15)).
 *   enhance     ImageEnhance: Image.blend(degenerate, image, factor) with
 *               ImagingBlend's float arithmetic (Blend.c); the degenerate is
 *               black (Brightness), the luma mean (Contrast), the luma
 *               (Color), ImageFilter.SMOOTH (Sharpness, Filter.c's 3x3 float
 *               kernel with its border rows and columns copied).
 *   LUT ops     ImageOps.posterize / solarize / autocontrast(cutoff=0) /
 *               equalize / invert: a 256-entry table per channel, applied as
 *               Image.point does (entries clipped to 0..255); the tables of
 *               invert, posterize and solarize as the arithmetic they are.
 * Every op is bit-exact with Pillow (tests/test_augment_ops.py,
 * docs/recipes.md).  Floating point stays IEEE as Pillow's: no FMA (-std=c11
 * turns contraction off; the AVX2 clones do not enable FMA), no
 * reassociation, the same operation order, float where Pillow uses float.
 *
 * Layout: each op reads img (and, for the geometric ops and Sharpness, a copy
 * of it in tmp) and writes img; the hot loops are one pass each, compiled
 * also for AVX2 (elementwise integer and float arithmetic only, so both
 * clones give identical bytes).
 */
#include "image/augment.h"
#include "image/augment_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/imgops.h"          /* FL_MAX_DIM */
#include "image/imgops_internal.h" /* FL_HOT, fl_use_avx2 */

/* Hand-written AVX2 (the nearest affine's gathers), picked at run time. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define FL_AUG_X86 1
#include <immintrin.h>
#endif

/* Py_MATH_PI, and math.radians / math.degrees' factors as CPython computes them. */
#define FL_AUG_PI 3.14159265358979323846
const double fl_aug_deg2rad = FL_AUG_PI / 180.0;
const double fl_aug_rad2deg = 180.0 / FL_AUG_PI;

/* ------------------------------------------------------------------------ */
/* Python float semantics                                                   */

/* x % m for m > 0, as CPython's float_rem: fmod, moved into [0, m), and a
 * zero result takes the sign of m. */
double
fl_aug_py_mod(double x, double m)
{
    double r = fmod(x, m);
    if (r != 0.0) {
        if ((m < 0) != (r < 0))
            r += m;
    } else {
        r = copysign(0.0, m);
    }
    return r;
}

/* round(x, 15) for |x| <= 1: CPython rounds through the correctly rounded
 * decimal string (round half to even on the exact binary value) and parses
 * it back; glibc's printf and strtod are exact too.  Both follow the same
 * LC_NUMERIC, so the round trip holds whatever the locale's decimal point. */
static double
fl_py_round15(double x)
{
    char buf[64];
    if (!isfinite(x))
        return x;
    snprintf(buf, sizeof buf, "%.15f", x);
    return strtod(buf, NULL);
}

/* ------------------------------------------------------------------------ */
/* Tables and per-pixel passes                                              */

/* fl_lut_apply1's body, cloned for AVX2; static, as every target_clones function
 * here (augment_tensor.c fl_gb_kernel1d says why). */
FL_HOT static void
fl_lut_apply1_clone(uint8_t *p, size_t n, const uint8_t *lut)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint8_t a0 = lut[p[i]], a1 = lut[p[i + 1]], a2 = lut[p[i + 2]], a3 = lut[p[i + 3]];
        uint8_t a4 = lut[p[i + 4]], a5 = lut[p[i + 5]], a6 = lut[p[i + 6]], a7 = lut[p[i + 7]];
        p[i] = a0; p[i + 1] = a1; p[i + 2] = a2; p[i + 3] = a3;
        p[i + 4] = a4; p[i + 5] = a5; p[i + 6] = a6; p[i + 7] = a7;
    }
    for (; i < n; i++)
        p[i] = lut[p[i]];
}

/* Contract: augment_internal.h. */
void
fl_lut_apply1(uint8_t *p, size_t n, const uint8_t *lut)
{
    fl_lut_apply1_clone(p, n, lut);
}

/* The table ops that are plain arithmetic, as vector loops: Invert
 * (255 - v), Posterize (v & mask) and Solarize (v < k ? v : 255 - v, k the
 * number of bytes below the threshold: those are a prefix of 0..255). */
FL_HOT static void
fl_invert_bytes(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(255 - p[i]);
}

FL_HOT static void
fl_mask_bytes(uint8_t *p, size_t n, uint8_t mask)
{
    for (size_t i = 0; i < n; i++)
        p[i] &= mask;
}

/* k in 1..255 (0 inverts everything, 256 changes nothing) */
FL_HOT static void
fl_solarize_bytes(uint8_t *p, size_t n, uint8_t k)
{
    for (size_t i = 0; i < n; i++)
        p[i] = p[i] < k ? p[i] : (uint8_t)(255 - p[i]);
}

/* fl_lut_apply3's body, cloned for AVX2; static, as every target_clones function
 * here (augment_tensor.c fl_gb_kernel1d says why). */
FL_HOT static void
fl_lut_apply3_clone(uint8_t *p, size_t npix, const uint8_t *lut)
{
    const uint8_t *l0 = lut, *l1 = lut + 256, *l2 = lut + 512;
    size_t i = 0;
    for (; i + 2 <= npix; i += 2, p += 6) {
        uint8_t a0 = l0[p[0]], a1 = l1[p[1]], a2 = l2[p[2]];
        uint8_t a3 = l0[p[3]], a4 = l1[p[4]], a5 = l2[p[5]];
        p[0] = a0; p[1] = a1; p[2] = a2; p[3] = a3; p[4] = a4; p[5] = a5;
    }
    for (; i < npix; i++, p += 3) {
        p[0] = l0[p[0]];
        p[1] = l1[p[1]];
        p[2] = l2[p[2]];
    }
}

/* Contract: augment_internal.h. */
void
fl_lut_apply3(uint8_t *p, size_t npix, const uint8_t *lut)
{
    fl_lut_apply3_clone(p, npix, lut);
}

/* Per-channel histograms (Image.histogram): hist[c * 256 + v].  Counted in
 * 32-bit sub-histograms (two per channel of RGB, four of a gray image, so
 * that runs of equal bytes do not wait on each other), flushed into the
 * 64-bit totals every FL_HIST_BLOCK pixels. */
#define FL_HIST_BLOCK ((size_t)1 << 30)

FL_HOT static void
fl_histogram(const uint8_t *p, size_t npix, int channels, uint64_t *hist)
{
    uint32_t sub[4][3][256];
    memset(hist, 0, sizeof(uint64_t) * 256 * (size_t)channels);
    size_t i = 0;
    while (i < npix) {
        size_t end = npix - i > FL_HIST_BLOCK ? i + FL_HIST_BLOCK : npix;
        memset(sub, 0, sizeof sub);
        if (channels == 3) {
            const uint8_t *q = p + i * 3;
            for (; i + 2 <= end; i += 2, q += 6) {
                sub[0][0][q[0]]++;
                sub[0][1][q[1]]++;
                sub[0][2][q[2]]++;
                sub[1][0][q[3]]++;
                sub[1][1][q[4]]++;
                sub[1][2][q[5]]++;
            }
            for (; i < end; i++, q += 3) {
                sub[0][0][q[0]]++;
                sub[0][1][q[1]]++;
                sub[0][2][q[2]]++;
            }
            for (int c = 0; c < 3; c++)
                for (int v = 0; v < 256; v++)
                    hist[c * 256 + v] += (uint64_t)sub[0][c][v] + sub[1][c][v];
        } else {
            for (; i + 4 <= end; i += 4) {
                sub[0][0][p[i]]++;
                sub[1][0][p[i + 1]]++;
                sub[2][0][p[i + 2]]++;
                sub[3][0][p[i + 3]]++;
            }
            for (; i < end; i++)
                sub[0][0][p[i]]++;
            for (int v = 0; v < 256; v++)
                hist[v] += (uint64_t)sub[0][0][v] + sub[1][0][v] + sub[2][0][v] + sub[3][0][v];
        }
    }
}

/* Sum of Pillow's convert("L") over RGB pixels ((r*19595 + g*38470 +
 * b*7471 + 0x8000) >> 16), or of the bytes of a gray image. */
FL_HOT static uint64_t
fl_luma_sum(const uint8_t *p, size_t npix, int channels)
{
    uint64_t total = 0;
    if (channels == 3) {
        /* blocks of at most 2^16 pixels keep the 32-bit partial sums exact */
        size_t i = 0;
        while (i < npix) {
            size_t end = npix - i > 65536 ? i + 65536 : npix;
            uint32_t s = 0;
            for (; i < end; i++) {
                const uint8_t *q = p + i * 3;
                s += ((uint32_t)q[0] * 19595u + (uint32_t)q[1] * 38470u + (uint32_t)q[2] * 7471u + 0x8000u) >> 16;
            }
            total += s;
        }
    } else {
        size_t i = 0;
        while (i < npix) {
            size_t end = npix - i > 65536 ? i + 65536 : npix;
            uint32_t s = 0;
            for (; i < end; i++)
                s += p[i];
            total += s;
        }
    }
    return total;
}

/* The blend's clip, done after the truncation: for |t| < 2^31 truncating
 * then clamping to 0..255 gives the byte that clamping then truncating
 * gives, and integer min/max vectorize better than NaN-exact float
 * compares.  fl_aug_apply keeps |alpha| <= FL_BLEND_ALPHA_MAX, so |t| <
 * 2^29 here. */
#define FL_BLEND_ALPHA_MAX 1048576.0f

static inline uint8_t
fl_clip_int(int32_t i)
{
    i = i < 0 ? 0 : i;
    i = i > 255 ? 255 : i;
    return (uint8_t)i;
}

/* img[i] = blend(deg[i], img[i]) for n bytes (ImagingBlend over a row). */
FL_HOT static void
fl_blend_row(const uint8_t *restrict deg, uint8_t *restrict img, size_t n, float alpha)
{
    for (size_t i = 0; i < n; i++) {
        float t = (float)deg[i] + alpha * (float)((int)img[i] - (int)deg[i]);
        img[i] = fl_clip_int((int32_t)t);
    }
}

/* Contract: augment.h.  The clip of fl_blend_row: |alpha| is clamped to
 * FL_BLEND_ALPHA_MAX as fl_aug_apply does (the same bytes past it). */
void
fl_aug_blend(uint8_t *img, const uint8_t *other, size_t n, float alpha)
{
    alpha = alpha > FL_BLEND_ALPHA_MAX ? FL_BLEND_ALPHA_MAX : alpha < -FL_BLEND_ALPHA_MAX ? -FL_BLEND_ALPHA_MAX : alpha;
    for (size_t i = 0; i < n; i++) {
        float t = (float)img[i] + alpha * (float)((int)other[i] - (int)img[i]);
        img[i] = fl_clip_int((int32_t)t);
    }
}

/* img[i] = blend(d, img[i]) for n bytes with one degenerate value d
 * (Brightness: 0, Contrast: the mean): ImagingBlend's float arithmetic,
 * (uint8)(d + alpha * (v - d)) clipped, which the compiler vectorizes (a
 * table lookup per byte, what this replaces, it could not). */
FL_HOT static void
fl_blend_const(uint8_t *img, size_t n, int d, float alpha)
{
    const float fd = (float)d;
    for (size_t i = 0; i < n; i++) {
        float t = fd + alpha * (float)((int)img[i] - d);
        img[i] = fl_clip_int((int32_t)t);
    }
}

/* ImageEnhance.Color on RGB pixels: the degenerate is convert("L") then
 * convert("RGB"), i.e. (l, l, l); blended row by row through a row of
 * (l, l, l) in deg (3 * w bytes). */
FL_HOT static void
fl_color_rows(uint8_t *img, int w, int h, float alpha, uint8_t *deg)
{
    size_t rs = (size_t)w * 3;
    for (int y = 0; y < h; y++) {
        uint8_t *row = img + (size_t)y * rs;
        for (int x = 0; x < w; x++) {
            const uint8_t *q = row + (size_t)x * 3;
            uint8_t l = (uint8_t)(((uint32_t)q[0] * 19595u + (uint32_t)q[1] * 38470u + (uint32_t)q[2] * 7471u
                                   + 0x8000u) >> 16);
            deg[(size_t)x * 3] = l;
            deg[(size_t)x * 3 + 1] = l;
            deg[(size_t)x * 3 + 2] = l;
        }
        fl_blend_row(deg, row, rs, alpha);
    }
}

/* Hue (torchvision's adjust_hue on a PIL image): convert("HSV"), the H
 * band shifted as uint8, then convert("RGB").  Pillow's two conversions
 * (Convert.c, colorsys's formulas) mix float and double steps; each is
 * reproduced here in its precision and order, so the bytes are Pillow's:
 *   to HSV   span = max - min; s = span / max and the three (max - c) / span
 *            in float; the hue sum in float (red max) or double (2 or 4 +
 *            ..., stored as float); h = fmod(h / 6 + 1, 1) in double, stored
 *            as float; H and S = (int)(x * 255.0), V = max.
 *   to RGB   i = floor(H * 6 / 255), f = H * 6 / 255 - i (double, stored as
 *            float), fs = S / 255 (double, stored as float); p, q, t =
 *            round(V * (1 - fs), V * (1 - fs * f), V * (1 - fs * (1 - f))),
 *            fs * f a float product, the rest double; a gray (S 0) keeps V.
 * The round trip is not the identity even for a shift of 0 (H and S are
 * truncated to bytes), which is why it always runs.  The per-H and per-S
 * factors are tables made once per call. */
typedef struct {
    int i[256];          /* floor(H * 6 / 255): the sextant, 0..6 */
    float f[256];        /* its remainder */
    float fs[256];       /* S / 255 */
} fl_hsv_tables;

static void
fl_hsv_tables_init(fl_hsv_tables *T)
{
    for (int k = 0; k < 256; k++) {
        double x = (double)(float)k * 6.0 / 255.0;
        T->i[k] = (int)floor(x);
        T->f[k] = (float)(x - (double)(float)T->i[k]);
        T->fs[k] = (float)((double)(float)k / 255.0);
    }
}

/* One pixel's H and S as Pillow's rgb2hsv gives them (V is the max).
 * Needs max > min.  Pure. */
static inline void
fl_pil_hue_sat(int r, int g, int b, int mx, int mn, int *hue, int *sat)
{
    const float span = (float)(mx - mn);
    const float s = span / (float)mx;
    const float rc = (float)(mx - r) / span, gc = (float)(mx - g) / span, bc = (float)(mx - b) / span;
    float h;
    if (r == mx)
        h = bc - gc;
    else if (g == mx)
        h = (float)(2.0 + rc - bc);
    else
        h = (float)(4.0 + gc - rc);
    /* fmod(h / 6 + 1, 1): the sum lies in [5/6, 11/6], where fmod is x or x - 1, both exact */
    const double x = h / 6.0 + 1.0;
    h = (float)(x >= 1.0 ? x - 1.0 : x);
    const int hi = (int)(h * 255.0), si = (int)(s * 255.0);
    *hue = hi < 0 ? 0 : hi > 255 ? 255 : hi;
    *sat = si < 0 ? 0 : si > 255 ? 255 : si;
}

/* round(v * k) (half away from zero) for Pillow's p, q, t; 0 <= k <= 1
 * here, so 0 <= v * k <= 255: the truncation is the floor, and the
 * remainder y - floor(y) is exact. */
static inline uint8_t
fl_hsv_round(int v, double k)
{
    const double y = (double)(float)v * k;
    const int fl = (int)y;
    return (uint8_t)(fl + (y - (double)fl >= 0.5));
}

#ifdef FL_AUG_X86
/* fl_hue_pixels' arithmetic 8 pixels at a time: the same float and double
 * operations per lane (AVX2 without FMA, so no contraction: the compiler
 * may only emit what is written), the tables gathered, the sextant's
 * outputs blended.  Returns the pixels done (a multiple of 8); the caller
 * does the rest. */
__attribute__((target("avx2"))) static size_t
fl_hue_pixels_avx2(uint8_t *img, size_t npix, int shift, const fl_hsv_tables *T)
{
#define FL_LO_PD(x) _mm256_cvtps_pd(_mm256_castps256_ps128(x))
#define FL_HI_PD(x) _mm256_cvtps_pd(_mm256_extractf128_ps((x), 1))
#define FL_JOIN_PS(lo, hi) _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo))
#define FL_JOIN_TRUNC(lo, hi) _mm256_set_m128i(_mm256_cvttpd_epi32(hi), _mm256_cvttpd_epi32(lo))
    const __m256d one = _mm256_set1_pd(1.0), d255 = _mm256_set1_pd(255.0), half = _mm256_set1_pd(0.5);
    const __m256i zero = _mm256_setzero_si256(), c255 = _mm256_set1_epi32(255), vshift = _mm256_set1_epi32(shift);
    int32_t R[8], G[8], B[8];
    size_t k = 0;
    for (; k + 8 <= npix; k += 8) {
        uint8_t *q = img + 3 * k;
        for (int j = 0; j < 8; j++) {
            R[j] = q[3 * j];
            G[j] = q[3 * j + 1];
            B[j] = q[3 * j + 2];
        }
        const __m256i r = _mm256_loadu_si256((const __m256i *)R), g = _mm256_loadu_si256((const __m256i *)G),
                      b = _mm256_loadu_si256((const __m256i *)B);
        const __m256i mx = _mm256_max_epi32(_mm256_max_epi32(r, g), b);
        const __m256i mn = _mm256_min_epi32(_mm256_min_epi32(r, g), b);
        /* to HSV (gray lanes, max == min, divide by zero here and are replaced below) */
        const __m256 span = _mm256_cvtepi32_ps(_mm256_sub_epi32(mx, mn));
        const __m256 sat = _mm256_div_ps(span, _mm256_cvtepi32_ps(mx));
        const __m256 rc = _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(mx, r)), span);
        const __m256 gc = _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(mx, g)), span);
        const __m256 bc = _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(mx, b)), span);
        const __m256 hr = _mm256_sub_ps(bc, gc);
        const __m256d two = _mm256_set1_pd(2.0), four = _mm256_set1_pd(4.0);
        const __m256 hg = FL_JOIN_PS(_mm256_sub_pd(_mm256_add_pd(two, FL_LO_PD(rc)), FL_LO_PD(bc)),
                                     _mm256_sub_pd(_mm256_add_pd(two, FL_HI_PD(rc)), FL_HI_PD(bc)));
        const __m256 hb = FL_JOIN_PS(_mm256_sub_pd(_mm256_add_pd(four, FL_LO_PD(gc)), FL_LO_PD(rc)),
                                     _mm256_sub_pd(_mm256_add_pd(four, FL_HI_PD(gc)), FL_HI_PD(rc)));
        const __m256i rmax = _mm256_cmpeq_epi32(r, mx), gmax = _mm256_andnot_si256(rmax, _mm256_cmpeq_epi32(g, mx));
        __m256 h = _mm256_blendv_ps(hb, hg, _mm256_castsi256_ps(gmax));
        h = _mm256_blendv_ps(h, hr, _mm256_castsi256_ps(rmax));
        /* h / 6 + 1 in double, fmod'd into [0, 1) by one subtraction, stored as float, then * 255 */
        __m256d xl = _mm256_add_pd(_mm256_div_pd(FL_LO_PD(h), _mm256_set1_pd(6.0)), one);
        __m256d xh = _mm256_add_pd(_mm256_div_pd(FL_HI_PD(h), _mm256_set1_pd(6.0)), one);
        xl = _mm256_blendv_pd(xl, _mm256_sub_pd(xl, one), _mm256_cmp_pd(xl, one, _CMP_GE_OQ));
        xh = _mm256_blendv_pd(xh, _mm256_sub_pd(xh, one), _mm256_cmp_pd(xh, one, _CMP_GE_OQ));
        const __m256 hf = FL_JOIN_PS(xl, xh);
        __m256i uh = FL_JOIN_TRUNC(_mm256_mul_pd(FL_LO_PD(hf), d255), _mm256_mul_pd(FL_HI_PD(hf), d255));
        __m256i us = FL_JOIN_TRUNC(_mm256_mul_pd(FL_LO_PD(sat), d255), _mm256_mul_pd(FL_HI_PD(sat), d255));
        uh = _mm256_min_epi32(_mm256_max_epi32(uh, zero), c255);
        us = _mm256_min_epi32(_mm256_max_epi32(us, zero), c255);
        const __m256i flat = _mm256_or_si256(_mm256_cmpeq_epi32(mx, mn), _mm256_cmpeq_epi32(us, zero));
        us = _mm256_andnot_si256(flat, us);   /* a valid table index in the flat lanes too */
        /* back to RGB with H shifted */
        const __m256i h2 = _mm256_and_si256(_mm256_add_epi32(_mm256_andnot_si256(flat, uh), vshift), c255);
        const __m256i sext = _mm256_i32gather_epi32(T->i, h2, 4);
        const __m256 f = _mm256_i32gather_ps(T->f, h2, 4), fs = _mm256_i32gather_ps(T->fs, us, 4);
        const __m256 fsf = _mm256_mul_ps(fs, f);   /* fs * f: a float product */
        __m256i out3[3];
        {
            const __m256d vl = _mm256_cvtepi32_pd(_mm256_castsi256_si128(mx));
            const __m256d vh = _mm256_cvtepi32_pd(_mm256_extracti128_si256(mx, 1));
            __m256d kl[3], kh[3];
            kl[0] = _mm256_sub_pd(one, FL_LO_PD(fs));   /* p */
            kh[0] = _mm256_sub_pd(one, FL_HI_PD(fs));
            kl[1] = _mm256_sub_pd(one, FL_LO_PD(fsf));   /* q */
            kh[1] = _mm256_sub_pd(one, FL_HI_PD(fsf));
            kl[2] = _mm256_sub_pd(one, _mm256_mul_pd(FL_LO_PD(fs), _mm256_sub_pd(one, FL_LO_PD(f))));   /* t */
            kh[2] = _mm256_sub_pd(one, _mm256_mul_pd(FL_HI_PD(fs), _mm256_sub_pd(one, FL_HI_PD(f))));
            for (int m = 0; m < 3; m++) {   /* round half away from zero of a value in [0, 255] */
                const __m256d yl = _mm256_mul_pd(vl, kl[m]), yh = _mm256_mul_pd(vh, kh[m]);
                const __m256d tl = _mm256_round_pd(yl, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                const __m256d th = _mm256_round_pd(yh, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                const __m256d ul = _mm256_add_pd(tl, _mm256_and_pd(_mm256_cmp_pd(_mm256_sub_pd(yl, tl), half, _CMP_GE_OQ), one));
                const __m256d uh2 = _mm256_add_pd(th, _mm256_and_pd(_mm256_cmp_pd(_mm256_sub_pd(yh, th), half, _CMP_GE_OQ), one));
                out3[m] = FL_JOIN_TRUNC(ul, uh2);
            }
        }
        const __m256i p = out3[0], qq = out3[1], t = out3[2];
        /* i % 6 for i in 0..6 */
        const __m256i sx = _mm256_andnot_si256(_mm256_cmpeq_epi32(sext, _mm256_set1_epi32(6)), sext);
#define FL_IS(n) _mm256_cmpeq_epi32(sx, _mm256_set1_epi32(n))
#define FL_SEL(a, bb, m) _mm256_blendv_epi8((a), (bb), (m))
        /* R: v (0, 5), q (1), p (2, 3), t (4); G: t (0), v (1, 2), q (3), p (4, 5); B: p (0, 1), t (2), v (3, 4), q (5) */
        __m256i ro = FL_SEL(FL_SEL(FL_SEL(mx, qq, FL_IS(1)), p, _mm256_or_si256(FL_IS(2), FL_IS(3))), t, FL_IS(4));
        __m256i go = FL_SEL(FL_SEL(FL_SEL(p, t, FL_IS(0)), mx, _mm256_or_si256(FL_IS(1), FL_IS(2))), qq, FL_IS(3));
        __m256i bo = FL_SEL(FL_SEL(FL_SEL(p, t, FL_IS(2)), mx, _mm256_or_si256(FL_IS(3), FL_IS(4))), qq, FL_IS(5));
#undef FL_IS
#undef FL_SEL
        ro = _mm256_blendv_epi8(ro, mx, flat);
        go = _mm256_blendv_epi8(go, mx, flat);
        bo = _mm256_blendv_epi8(bo, mx, flat);
        _mm256_storeu_si256((__m256i *)R, ro);
        _mm256_storeu_si256((__m256i *)G, go);
        _mm256_storeu_si256((__m256i *)B, bo);
        for (int j = 0; j < 8; j++) {
            q[3 * j] = (uint8_t)R[j];
            q[3 * j + 1] = (uint8_t)G[j];
            q[3 * j + 2] = (uint8_t)B[j];
        }
    }
#undef FL_LO_PD
#undef FL_HI_PD
#undef FL_JOIN_PS
#undef FL_JOIN_TRUNC
    return k;
}
#endif

/* adjust_hue on npix packed RGB pixels with H shifted by `shift` (mod 256). */
static void
fl_hue_pixels(uint8_t *img, size_t npix, int shift, const fl_hsv_tables *T)
{
    for (size_t k = 0; k < npix; k++) {
        uint8_t *q = img + 3 * k;
        const int r = q[0], g = q[1], b = q[2];
        const int mx = r > g ? (r > b ? r : b) : (g > b ? g : b);
        const int mn = r < g ? (r < b ? r : b) : (g < b ? g : b);
        if (mx == mn)   /* H = S = 0: back to (v, v, v), the pixel itself */
            continue;
        int hue, sat;
        fl_pil_hue_sat(r, g, b, mx, mn, &hue, &sat);
        if (sat == 0) {
            q[0] = q[1] = q[2] = (uint8_t)mx;
            continue;
        }
        hue = (hue + shift) & 255;
        const float fs = T->fs[sat], f = T->f[hue];
        const uint8_t v = (uint8_t)mx;
        const uint8_t p8 = fl_hsv_round(mx, 1.0 - fs);
        const uint8_t q8 = fl_hsv_round(mx, 1.0 - fs * f);
        const uint8_t t8 = fl_hsv_round(mx, 1.0 - fs * (1.0 - f));
        switch (T->i[hue] % 6) {
        case 0: q[0] = v, q[1] = t8, q[2] = p8; break;
        case 1: q[0] = q8, q[1] = v, q[2] = p8; break;
        case 2: q[0] = p8, q[1] = v, q[2] = t8; break;
        case 3: q[0] = p8, q[1] = q8, q[2] = v; break;
        case 4: q[0] = t8, q[1] = p8, q[2] = v; break;
        default: q[0] = v, q[1] = p8, q[2] = q8; break;
        }
    }
}

/* GaussianBlur: Pillow's ImageFilter.GaussianBlur(radius), BoxBlur.c:
 * three passes of an "extended" box blur (a box of fractional radius) along
 * x, then three along y, each in 8.24 fixed point with the edge pixel
 * repeated.  The box radius comes from _gaussian_blur_radius's float and
 * double steps; every pass is integer arithmetic, so the bytes are
 * Pillow's.  Pillow blurs y by transposing the image and blurring its
 * rows; here a pass runs along the rows of an image whose columns are its
 * independent lines (the x passes on a transposed copy), which is the same
 * arithmetic per line and keeps the inner loop on contiguous bytes. */

/* _gaussian_blur_radius: the box radius of `passes` boxes for a Gaussian
 * of standard deviation `radius`.  Pure. */
static float
fl_pil_box_radius(float radius, int passes)
{
    const float sigma2 = radius * radius / passes;
    const float L = (float)sqrt(12.0 * sigma2 + 1.0);   /* the box length */
    const float l = (float)floor((L - 1.0) / 2.0);      /* its integer radius */
    float a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2);
    a /= 6 * (sigma2 - (l + 1) * (l + 1));
    return l + a;
}

/* One box pass of radius fradius (> 0) along the len rows of src, each row
 * `lines` bytes of independent lines, into dst (not aliasing src), as
 * ImagingHorizontalBoxBlur computes each line.  acc: room for `cap`
 * accumulators; the lines go in chunks of cap. */
FL_HOT static void
fl_box_pass(const uint8_t *restrict src, uint8_t *restrict dst, int len, size_t lines, float fradius,
            uint32_t *restrict acc, size_t cap)
{
    const int r = (int)fradius;
    const uint32_t ww = (uint32_t)((float)(1u << 24) / (fradius * 2 + 1));
    const uint32_t fw = ((1u << 24) - (uint32_t)(r * 2 + 1) * ww) / 2;
    const int last = len - 1;
    const int edgeA = r + 1 < len ? r + 1 : len, edgeB = len - r - 1 > 0 ? len - r - 1 : 0;
    for (size_t j0 = 0; j0 < lines; j0 += cap) {
        const size_t nl = lines - j0 < cap ? lines - j0 : cap;
        const uint8_t *in = src + j0;
        uint8_t *out = dst + j0;
#define FL_IN(i) (in + (size_t)(i) * lines)
#define FL_OUT(i) (out + (size_t)(i) * lines)
        if (r == 0) {   /* ImagingLineBoxBlurZero8: the pixel at weight ww, its two neighbours at fw */
            for (int x = 0; x <= last; x++) {
                const uint8_t *c = FL_IN(x < edgeA ? 0 : x < edgeB ? x : last);
                const uint8_t *lft = FL_IN(x < edgeA ? 0 : x - 1), *rgt = FL_IN(x < edgeB ? x + 1 : last);
                uint8_t *o = FL_OUT(x);
                for (size_t k = 0; k < nl; k++)
                    o[k] = (uint8_t)((c[k] * ww + (uint32_t)(lft[k] + rgt[k]) * fw + (1u << 23)) >> 24);
            }
            continue;
        }
        /* the window of pixel -1: the first pixel r + 1 times, then pixels 0..r - 1 (the last one repeated
           when the line is shorter) */
        for (size_t k = 0; k < nl; k++)
            acc[k] = (uint32_t)in[k] * (uint32_t)(r + 1);
        int x;
        for (x = 0; x < edgeA - 1; x++) {
            const uint8_t *p = FL_IN(x);
            for (size_t k = 0; k < nl; k++)
                acc[k] += p[k];
        }
        for (size_t k = 0; k < nl; k++)
            acc[k] += (uint32_t)FL_IN(last)[k] * (uint32_t)(r - edgeA + 1);
        /* pixel x: the window moves by one (sub, add), and the fractional ends (far_l, far_r) weigh fw */
        for (x = 0; x <= last; x++) {
            /* Pillow's three loops of either branch (edgeA <= edgeB or not) in one rule */
            const int sub = x < edgeA ? 0 : x - r - 1, add = x < edgeB ? x + r : last;
            const int far_r = x < edgeB ? x + r + 1 : last;
            const uint8_t *ps = FL_IN(sub), *pa = FL_IN(add), *pl = FL_IN(sub), *pr = FL_IN(far_r);
            uint8_t *o = FL_OUT(x);
            for (size_t k = 0; k < nl; k++) {
                acc[k] += (uint32_t)pa[k] - (uint32_t)ps[k];
                const uint32_t bulk = acc[k] * ww + (uint32_t)(pl[k] + pr[k]) * fw;
                o[k] = (uint8_t)((bulk + (1u << 23)) >> 24);
            }
        }
#undef FL_IN
#undef FL_OUT
    }
}

/* img (h x w pixels of c bytes) -> t (w x h pixels): the pixel transpose.  Pure. */
static void
fl_transpose_px(const uint8_t *restrict img, uint8_t *restrict t, int w, int h, int c)
{
    if (c == 1) {
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                t[(size_t)x * h + y] = img[(size_t)y * w + x];
        return;
    }
    for (int y = 0; y < h; y++) {
        const uint8_t *s = img + (size_t)y * w * 3;
        for (int x = 0; x < w; x++) {
            uint8_t *d = t + ((size_t)x * h + y) * 3;
            d[0] = s[3 * x];
            d[1] = s[3 * x + 1];
            d[2] = s[3 * x + 2];
        }
    }
}

/* ImageFilter.GaussianBlur(radius) on img in place (3 passes each way).
 * tmp: n bytes and acc: cap accumulators, caller-owned. */
static void
fl_gaussian_blur(uint8_t *img, uint8_t *tmp, int w, int h, int c, float radius, uint32_t *acc, size_t cap)
{
    const float box = fl_pil_box_radius(radius, 3);
    if (box == 0.0f)
        return;
    /* x: transpose, three passes along what were the columns, transpose back */
    fl_transpose_px(img, tmp, w, h, c);
    fl_box_pass(tmp, img, w, (size_t)h * c, box, acc, cap);
    fl_box_pass(img, tmp, w, (size_t)h * c, box, acc, cap);
    fl_box_pass(tmp, img, w, (size_t)h * c, box, acc, cap);
    fl_transpose_px(img, tmp, h, w, c);
    /* y: three passes along the rows */
    fl_box_pass(tmp, img, h, (size_t)w * c, box, acc, cap);
    fl_box_pass(img, tmp, h, (size_t)w * c, box, acc, cap);
    fl_box_pass(tmp, img, h, (size_t)w * c, box, acc, cap);
}

/* ImageEnhance.Sharpness: ImageFilter.SMOOTH (ImagingFilter3x3, kernel
 * (1 1 1 / 1 5 1 / 1 1 1) / 13 in float, +0.5 before truncation, rows y+1,
 * y, y-1 summed in that order, each as (left + centre) + right) blended with
 * the original.  src is a copy of img; the border rows and columns are the
 * original there (Filter.c copies them), where the blend gives the original
 * byte back, so they are left as they are.  Needs w >= 3 and h >= 3.
 * Filter.c clips the smoothed sum to 0..255 before truncating; the sum of
 * bytes under a positive kernel of weight 1 lies in [0.5, 256), where the
 * truncation alone gives the same byte, so the clip is left out (and the
 * loop vectorizes).  One row: output bytes [c, n - c) of the row md, with
 * up / dn the rows above and below; c is the channel count (the
 * neighbour's distance), a constant in each caller. */
#define FL_SMOOTH_BODY(C)                                                                              \
    do {                                                                                               \
        const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f; /* _imaging.c: kernel[i] /= divisor, float */ \
        for (size_t i = (C); i + (C) < n; i++) {                                                       \
            float ss = 0.5f;                                                                           \
            ss += ((float)dn[i - (C)] * k1 + (float)dn[i] * k1) + (float)dn[i + (C)] * k1;             \
            ss += ((float)md[i - (C)] * k1 + (float)md[i] * k5) + (float)md[i + (C)] * k1;             \
            ss += ((float)up[i - (C)] * k1 + (float)up[i] * k1) + (float)up[i + (C)] * k1;             \
            int s = (int)ss;                                                                           \
            float t = (float)s + alpha * (float)((int)md[i] - s);                                      \
            out[i] = fl_clip_int((int32_t)t); /* |alpha| <= FL_BLEND_ALPHA_MAX */                     \
        }                                                                                              \
    } while (0)

FL_HOT static void
fl_sharpness_row3(const uint8_t *restrict up, const uint8_t *restrict md, const uint8_t *restrict dn,
                  uint8_t *restrict out, size_t n, float alpha)
{
    FL_SMOOTH_BODY(3);
}

FL_HOT static void
fl_sharpness_row1(const uint8_t *restrict up, const uint8_t *restrict md, const uint8_t *restrict dn,
                  uint8_t *restrict out, size_t n, float alpha)
{
    FL_SMOOTH_BODY(1);
}
#undef FL_SMOOTH_BODY

static void
fl_sharpness_rows(const uint8_t *src, uint8_t *img, int w, int h, int channels, float alpha)
{
    size_t n = (size_t)w * (size_t)channels;
    for (int y = 1; y < h - 1; y++) {
        const uint8_t *up = src + (size_t)(y - 1) * n, *md = src + (size_t)y * n, *dn = src + (size_t)(y + 1) * n;
        if (channels == 3)
            fl_sharpness_row3(up, md, dn, img + (size_t)y * n, n, alpha);
        else
            fl_sharpness_row1(up, md, dn, img + (size_t)y * n, n, alpha);
    }
}

/* ------------------------------------------------------------------------ */
/* Geometry                                                                 */

#ifdef FL_AUG_X86
/* The covered run of one affine_fixed row, 8 pixels per step: n pixels from
 * (xx, yy), stepping (a0, a3) in 16.16 fixed point (every value of the run
 * fits int32, so lanes that wrap in the multiplies still land on it), each
 * source pixel one 32-bit gather at yi * rs + xi * 3 (rs * h < 2^31), packed
 * to 3 bytes.  Each step stores 28 bytes for 24, so it stops with at least 3
 * pixels left for the scalar loop; the gather reads 1 byte past a pixel (tmp
 * has slack past the image).  Returns the pixels done. */
__attribute__((target("avx2"))) static int
fl_fixed_run3_avx2(const uint8_t *src, int32_t rs, uint8_t *o, int n, int32_t xx, int32_t yy, int32_t a0,
                   int32_t a3)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                          0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    __m256i vx = _mm256_add_epi32(_mm256_set1_epi32(xx), _mm256_mullo_epi32(lane, _mm256_set1_epi32(a0)));
    __m256i vy = _mm256_add_epi32(_mm256_set1_epi32(yy), _mm256_mullo_epi32(lane, _mm256_set1_epi32(a3)));
    const __m256i sx = _mm256_set1_epi32((int32_t)((uint32_t)a0 * 8u));
    const __m256i sy = _mm256_set1_epi32((int32_t)((uint32_t)a3 * 8u));
    const __m256i vrs = _mm256_set1_epi32(rs);
    int k = 0;
    for (; k + 11 <= n; k += 8) {
        __m256i xi = _mm256_srai_epi32(vx, 16), yi = _mm256_srai_epi32(vy, 16);
        __m256i idx = _mm256_add_epi32(_mm256_mullo_epi32(yi, vrs), _mm256_add_epi32(xi, _mm256_slli_epi32(xi, 1)));
        __m256i px = _mm256_shuffle_epi8(_mm256_i32gather_epi32((const int *)(const void *)src, idx, 1), pack);
        _mm_storeu_si128((__m128i *)(void *)(o + (size_t)k * 3), _mm256_castsi256_si128(px));
        _mm_storeu_si128((__m128i *)(void *)(o + (size_t)k * 3 + 12), _mm256_extracti128_si256(px, 1));
        vx = _mm256_add_epi32(vx, sx);
        vy = _mm256_add_epi32(vy, sy);
    }
    return k;
}

/* The same for one channel: gathers at yi * rs + xi (3 bytes read past a
 * pixel), the low bytes packed to 8. */
__attribute__((target("avx2"))) static int
fl_fixed_run1_avx2(const uint8_t *src, int32_t rs, uint8_t *o, int n, int32_t xx, int32_t yy, int32_t a0,
                   int32_t a3)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i pack = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    __m256i vx = _mm256_add_epi32(_mm256_set1_epi32(xx), _mm256_mullo_epi32(lane, _mm256_set1_epi32(a0)));
    __m256i vy = _mm256_add_epi32(_mm256_set1_epi32(yy), _mm256_mullo_epi32(lane, _mm256_set1_epi32(a3)));
    const __m256i sx = _mm256_set1_epi32((int32_t)((uint32_t)a0 * 8u));
    const __m256i sy = _mm256_set1_epi32((int32_t)((uint32_t)a3 * 8u));
    const __m256i vrs = _mm256_set1_epi32(rs);
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256i xi = _mm256_srai_epi32(vx, 16), yi = _mm256_srai_epi32(vy, 16);
        __m256i idx = _mm256_add_epi32(_mm256_mullo_epi32(yi, vrs), xi);
        __m256i px = _mm256_shuffle_epi8(_mm256_i32gather_epi32((const int *)(const void *)src, idx, 1), pack);
        px = _mm256_permutevar8x32_epi32(px, join);
        _mm_storel_epi64((__m128i *)(void *)(o + k), _mm256_castsi256_si128(px));
        vx = _mm256_add_epi32(vx, sx);
        vy = _mm256_add_epi32(vy, sy);
    }
    return k;
}
#endif

/* Fill n pixels of `channels` bytes with fill. */
static void
fl_fill_px(uint8_t *out, size_t n, int channels, const uint8_t *fill)
{
    if (channels == 1) {
        memset(out, fill[0], n);
        return;
    }
    if (fill[0] == fill[1] && fill[1] == fill[2]) {
        memset(out, fill[0], n * 3);
        return;
    }
    for (size_t i = 0; i < n; i++, out += 3) {
        out[0] = fill[0];
        out[1] = fill[1];
        out[2] = fill[2];
    }
}

/* Floor division of int64 by a non-zero int64. */
static int64_t
fl_floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q--;
    return q;
}

static int64_t
fl_ceildiv(int64_t a, int64_t b)
{
    return -fl_floordiv(-a, b);
}

/* The x in [*lo, *hi) (clipped to [*lo, *hi) on entry) for which
 * 0 <= base + x * step < lim, in exact integer arithmetic. */
static void
fl_linear_range(int64_t base, int64_t step, int64_t lim, int *lo, int *hi)
{
    int64_t a, b;
    if (step == 0) {
        if (!(base >= 0 && base < lim))
            *hi = *lo;
        return;
    }
    if (step > 0) {
        a = fl_ceildiv(-base, step);
        b = fl_floordiv(lim - 1 - base, step);
    } else {
        a = fl_ceildiv(lim - 1 - base, step);
        b = fl_floordiv(-base, step);
    }
    if (a > *lo)
        *lo = a > *hi ? *hi : (int)a;
    if (b + 1 < *hi)
        *hi = b + 1 < *lo ? *lo : (int)(b + 1);
}

/* Pillow's FLOOR: (int)floor(v) below 0, else a truncation.  A double
 * outside int's range converts (cvttsd2si) to INT_MIN, as Pillow's compiled
 * conversions do on x86-64. */
static int
fl_pil_floor(double v)
{
    double f = v < 0.0 ? floor(v) : v;
    if (!(f > -2147483649.0 && f < 2147483648.0))
        return INT_MIN;
    return (int)f;
}

/* Pillow's COORD() range test: is the pixel index of v (-1 below 0, else
 * truncated) inside [0, n)?  NaN and huge values are outside. */
static inline int
fl_coord_in(double v, int n)
{
    return v >= 0.0 && v < (double)n;
}

/* ImagingScaleAffine (a[1] == 0 and a[3] == 0): per-column source index
 * table, accumulated in double as Pillow does; rows through COORD(yo). */
static void
fl_affine_scale(const uint8_t *src, uint8_t *img, int w, int h, int c, const double a[6], const uint8_t *fill,
                int *xintab)
{
    size_t rs = (size_t)w * (size_t)c;
    int xmin = w, xmax = 0, contiguous = 1;
    double xo = a[2] + a[0] * 0.5, yo = a[5] + a[4] * 0.5;
    for (int x = 0; x < w; x++) {
        xintab[x] = 0;
        if (fl_coord_in(xo, w)) {
            xmax = x + 1;
            if (x < xmin)
                xmin = x;
            xintab[x] = (int)xo;
        }
        xo += a[0];
    }
    /* Pillow copies x in [xmin, xmax) through the table (invalid entries, if
     * any, hold 0: its calloc) */
    for (int x = xmin + 1; x < xmax; x++)
        if (xintab[x] != xintab[x - 1] + 1)
            contiguous = 0;
    for (int y = 0; y < h; y++) {
        uint8_t *out = img + (size_t)y * rs;
        if (!fl_coord_in(yo, h) || xmin >= xmax) {
            fl_fill_px(out, (size_t)w, c, fill);
        } else {
            const uint8_t *in = src + (size_t)(int)yo * rs;
            fl_fill_px(out, (size_t)xmin, c, fill);
            if (contiguous) {
                memcpy(out + (size_t)xmin * c, in + (size_t)xintab[xmin] * c, (size_t)(xmax - xmin) * c);
            } else if (c == 3) {
                for (int x = xmin; x < xmax; x++)
                    memcpy(out + (size_t)x * 3, in + (size_t)xintab[x] * 3, 3);
            } else {
                for (int x = xmin; x < xmax; x++)
                    out[x] = in[xintab[x]];
            }
            fl_fill_px(out + (size_t)xmax * c, (size_t)(w - xmax), c, fill);
        }
        yo += a[4];
    }
}

static inline int
fl_check_fixed(const double a[6], int x, int y)
{
    return fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

/* Pillow's FIX: 16.16 fixed point, FLOOR(v * 65536 + 0.5). */
static int32_t
fl_fix16(double v)
{
    return (int32_t)fl_pil_floor(v * 65536.0 + 0.5);
}

/* affine_fixed (Geometry.c): per row, xx = a2 + x * a0 and yy = a5 + x * a3
 * in 32-bit integers, the source pixel (xx >> 16, yy >> 16).  The covered
 * run of each row is solved for exactly instead of testing every pixel; a
 * row whose values would leave int32 (where Pillow's int arithmetic wraps)
 * takes the per-pixel loop with wrapping arithmetic. */
FL_HOT static void
fl_affine_fixed(const uint8_t *src, uint8_t *img, int w, int h, int c, const double a[6], const uint8_t *fill)
{
    size_t rs = (size_t)w * (size_t)c;
    int32_t a0 = fl_fix16(a[0]), a1 = fl_fix16(a[1]), a3 = fl_fix16(a[3]), a4 = fl_fix16(a[4]);
    uint32_t r2 = (uint32_t)fl_fix16(a[2] + a[0] * 0.5 + a[1] * 0.5);
    uint32_t r5 = (uint32_t)fl_fix16(a[5] + a[3] * 0.5 + a[4] * 0.5);
    int64_t xlim = (int64_t)w << 16, ylim = (int64_t)h << 16;
#ifdef FL_AUG_X86
    const int simd = fl_use_avx2() && (uint64_t)rs * (uint64_t)h < ((uint64_t)1 << 31);
#endif
    for (int y = 0; y < h; y++, r2 += (uint32_t)a1, r5 += (uint32_t)a4) {
        uint8_t *out = img + (size_t)y * rs;
        int64_t xx0 = (int32_t)r2, yy0 = (int32_t)r5;
        int64_t xe = xx0 + (int64_t)(w - 1) * a0, ye = yy0 + (int64_t)(w - 1) * a3;
        if (xe < INT32_MIN || xe > INT32_MAX || ye < INT32_MIN || ye > INT32_MAX) {
            uint32_t xx = (uint32_t)xx0, yy = (uint32_t)yy0;
            for (int x = 0; x < w; x++, xx += (uint32_t)a0, yy += (uint32_t)a3) {
                int32_t xi = (int32_t)xx >> 16, yi = (int32_t)yy >> 16;
                if (xi >= 0 && xi < w && yi >= 0 && yi < h)
                    memcpy(out + (size_t)x * c, src + (size_t)yi * rs + (size_t)xi * c, (size_t)c);
                else
                    memcpy(out + (size_t)x * c, fill, (size_t)c);
            }
            continue;
        }
        int lo = 0, hi = w;
        fl_linear_range(xx0, a0, xlim, &lo, &hi);
        fl_linear_range(yy0, a3, ylim, &lo, &hi);
        if (lo >= hi) {
            fl_fill_px(out, (size_t)w, c, fill);
            continue;
        }
        fl_fill_px(out, (size_t)lo, c, fill);
        int32_t xx = (int32_t)(xx0 + (int64_t)lo * a0), yy = (int32_t)(yy0 + (int64_t)lo * a3);
#ifdef FL_AUG_X86
        if (simd) {
            int done = (c == 3 ? fl_fixed_run3_avx2 : fl_fixed_run1_avx2)(src, (int32_t)rs, out + (size_t)lo * c,
                                                                         hi - lo, xx, yy, a0, a3);
            lo += done;
            xx = (int32_t)((uint32_t)xx + (uint32_t)done * (uint32_t)a0);
            yy = (int32_t)((uint32_t)yy + (uint32_t)done * (uint32_t)a3);
        }
#endif
        if (c == 3) {
            /* 4-byte moves: the 4th byte lands on the next output pixel,
             * which is written after (the run's last pixel, or the fill);
             * reading 1 byte past the source image stays inside tmp (the
             * column table follows it). */
            uint8_t *o = out + (size_t)lo * 3;
            for (int x = lo; x < hi - 1; x++, o += 3, xx += a0, yy += a3) {
                uint32_t v;
                memcpy(&v, src + (size_t)(yy >> 16) * rs + (size_t)(xx >> 16) * 3, 4);
                memcpy(o, &v, 4);
            }
            memcpy(o, src + (size_t)(yy >> 16) * rs + (size_t)(xx >> 16) * 3, 3);
        } else {
            for (int x = lo; x < hi; x++, xx += a0, yy += a3)
                out[x] = src[(size_t)(yy >> 16) * rs + (size_t)(xx >> 16)];
        }
        fl_fill_px(out + (size_t)hi * c, (size_t)(w - hi), c, fill);
    }
}

/* ImagingTransformAffine's double loop (corners beyond the fixed-point
 * range): xx, yy accumulated in double along the row, COORD() tests. */
static void
fl_affine_float(const uint8_t *src, uint8_t *img, int w, int h, int c, const double a[6], const uint8_t *fill)
{
    size_t rs = (size_t)w * (size_t)c;
    double xo = a[2] + a[1] * 0.5 + a[0] * 0.5;
    double yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    for (int y = 0; y < h; y++) {
        uint8_t *out = img + (size_t)y * rs;
        double xx = xo, yy = yo;
        for (int x = 0; x < w; x++, out += c) {
            if (fl_coord_in(xx, w) && fl_coord_in(yy, h))
                memcpy(out, src + (size_t)(int)yy * rs + (size_t)(int)xx * c, (size_t)c);
            else
                memcpy(out, fill, (size_t)c);
            xx += a[0];
            yy += a[3];
        }
        xo += a[1];
        yo += a[4];
    }
}

/* ImagingGenericTransform with affine_transform and bilinear_filter8 /
 * bilinear_filter32RGB (Geometry.c), in double: the pixel centre
 * (x + 0.5, y + 0.5) mapped by a, outside [0, w) x [0, h) -> fill; else
 * shifted by -0.5, floored, the four neighbours (clamped to the image; below
 * the last row Pillow's second row value is the first one, which reading the
 * same row twice gives) interpolated along x then y, truncated.
 * In chunks of FL_BL_CHUNK pixels of a row: the coordinates of the chunk
 * (vectorizable), its neighbours (scalar loads, one 32-bit load per
 * neighbour pixel: the bytes past the pixel are not used, and past the
 * image they are tmp's slack), the interpolation of every byte
 * (vectorizable), the stores.  Each value goes through Pillow's double
 * operations in Pillow's order.  C: the channel count, a constant in each
 * caller. */
/* Whether dy (*dy0) or dx (*dx0) is exactly 0 on every covered pixel
 * (ok[k]) of a chunk of n: the warps that keep an axis (ShearX and
 * TranslateX keep each row's y, ShearY and TranslateY keep x), where
 * Pillow's interpolation reduces exactly to its one term along the other
 * axis (v + 0 * finite = v).  Uncovered pixels are dropped, whatever their
 * fraction.  Pure. */
static inline __attribute__((always_inline)) void
fl_zero_fractions(const double *dxs, const double *dys, const int32_t *ok, int n, int *dx0, int *dy0)
{
    int x = 1, y = 1;
    for (int k = 0; k < n; k++) {
        y &= (dys[k] == 0.0) | !ok[k];
        x &= (dxs[k] == 0.0) | !ok[k];
    }
    *dx0 = x;
    *dy0 = y;
}

/* The scalar loops' coordinates of output pixel x of a row (py = a1 (y +
 * 0.5), qy = a4 (y + 0.5)) in Pillow's double operations: returns whether
 * the centre maps inside [0, w) x [0, h) (W, Hd); the position, clamped to
 * the image (a no-op on the covered pixels, so that the uncovered ones,
 * whose bytes are dropped, index inside), shifted by -0.5 and floored (FLOOR()
 * for values >= -0.5: the truncation, minus 1 below 0) in *xi, *yi, its
 * fractions in *dx, *dy.  Pure. */
static inline __attribute__((always_inline)) int32_t
fl_warp_coord(const double a[6], double py, double qy, double W, double Hd, int x, int32_t *xi, int32_t *yi,
              double *dx, double *dy)
{
    double xin = x + 0.5;
    double xs = a[0] * xin + py + a[2];
    double ys = a[3] * xin + qy + a[5];
    int32_t ok = (xs >= 0.0) & (xs < W) & (ys >= 0.0) & (ys < Hd);
    xs = xs < 0.0 ? 0.0 : xs;
    xs = xs > W ? W : xs;
    ys = ys < 0.0 ? 0.0 : ys;
    ys = ys > Hd ? Hd : ys;
    xs -= 0.5;
    ys -= 0.5;
    *xi = (int32_t)xs - (xs < 0.0);
    *yi = (int32_t)ys - (ys < 0.0);
    *dx = xs - *xi;
    *dy = ys - *yi;
    return ok;
}

#define FL_BL_CHUNK 64

#ifdef FL_AUG_X86
/* The coordinates of output pixels x .. x + 7 of a row (centre y + 0.5: py =
 * a1 (y + 0.5), qy = a4 (y + 0.5)) as fl_warp_coord computes them for the
 * scalar loops, the same double operations in the same order per pixel (no contraction; the floor of a value >= -0.5
 * is roundpd's): the fractions dx, dy (4 pixels a vector), the floors xi, yi
 * and the covered mask ok (all ones or 0, 8 lanes).  max/min clamp a NaN
 * coordinate to 0 where the scalar clamp leaves it (no such matrix reaches
 * here; a gather must never take one).  Pure. */
typedef struct {
    __m256d dx[2], dy[2];
    __m256i xi, yi, ok;
} fl_warp8;

__attribute__((target("avx2"))) static inline void
fl_warp8_coords(const double a[6], double py, double qy, int w, int h, int x, fl_warp8 *o)
{
    const __m256d W = _mm256_set1_pd((double)w), Hd = _mm256_set1_pd((double)h), zero = _mm256_setzero_pd();
    const __m256d half = _mm256_set1_pd(0.5);
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m128i xi4[2], yi4[2], ok4[2];
    for (int hf = 0; hf < 2; hf++) {
        __m256d xin = _mm256_add_pd(_mm256_set1_pd((double)(x + 4 * hf)), _mm256_setr_pd(0.5, 1.5, 2.5, 3.5));
        __m256d xs = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(a[0]), xin), _mm256_set1_pd(py)),
                                   _mm256_set1_pd(a[2]));
        __m256d ys = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(a[3]), xin), _mm256_set1_pd(qy)),
                                   _mm256_set1_pd(a[5]));
        __m256d ok = _mm256_and_pd(_mm256_and_pd(_mm256_cmp_pd(xs, zero, _CMP_GE_OQ), _mm256_cmp_pd(xs, W, _CMP_LT_OQ)),
                                   _mm256_and_pd(_mm256_cmp_pd(ys, zero, _CMP_GE_OQ), _mm256_cmp_pd(ys, Hd, _CMP_LT_OQ)));
        xs = _mm256_sub_pd(_mm256_min_pd(_mm256_max_pd(xs, zero), W), half);
        ys = _mm256_sub_pd(_mm256_min_pd(_mm256_max_pd(ys, zero), Hd), half);
        __m256d xf = _mm256_floor_pd(xs), yf = _mm256_floor_pd(ys);
        o->dx[hf] = _mm256_sub_pd(xs, xf);
        o->dy[hf] = _mm256_sub_pd(ys, yf);
        xi4[hf] = _mm256_cvttpd_epi32(xf);
        yi4[hf] = _mm256_cvttpd_epi32(yf);
        /* the 4 all-ones / zero 64-bit masks as 4 32-bit ones */
        ok4[hf] = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(ok), even));
    }
    o->xi = _mm256_set_m128i(xi4[1], xi4[0]);
    o->yi = _mm256_set_m128i(yi4[1], yi4[0]);
    o->ok = _mm256_set_m128i(ok4[1], ok4[0]);
}

/* Whether dy (bit 0) or dx (bit 1) is exactly 0 on every covered pixel of
 * the 8 (fl_zero_fractions).  Pure. */
__attribute__((target("avx2"))) static inline int
fl_warp8_zero(const fl_warp8 *c)
{
    const __m256d zero = _mm256_setzero_pd();
    int zy = 0, zx = 0;
    for (int hf = 0; hf < 2; hf++) {
        __m128i ok4 = hf ? _mm256_extracti128_si256(c->ok, 1) : _mm256_castsi256_si128(c->ok);
        __m256d unc = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_xor_si128(ok4, _mm_set1_epi32(-1))));
        zy |= _mm256_movemask_pd(_mm256_or_pd(_mm256_cmp_pd(c->dy[hf], zero, _CMP_EQ_OQ), unc)) << (4 * hf);
        zx |= _mm256_movemask_pd(_mm256_or_pd(_mm256_cmp_pd(c->dx[hf], zero, _CMP_EQ_OQ), unc)) << (4 * hf);
    }
    return (zy == 0xff) | (zx == 0xff) << 1;
}

/* 8 pixels' 3 channels (bits 8c of each 32-bit lane, 0..255) with the fill
 * where ok is 0, as 24 bytes at out.  Writes only out[0, 24). */
__attribute__((target("avx2"))) static inline void
fl_warp8_store3(__m256i px, __m256i ok, const uint8_t *fill, uint8_t *out)
{
    const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                          0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m256i fillpx = _mm256_set1_epi32((int32_t)((uint32_t)fill[0] | (uint32_t)fill[1] << 8
                                                       | (uint32_t)fill[2] << 16));
    px = _mm256_shuffle_epi8(_mm256_blendv_epi8(fillpx, px, ok), pack);
    _mm_storeu_si128((__m128i *)(void *)out, _mm256_castsi256_si128(px));
    /* bytes 12..15 of the first store are overwritten by the second */
    uint8_t hi[16];
    _mm_storeu_si128((__m128i *)(void *)hi, _mm256_extracti128_si256(px, 1));
    memcpy(out + 12, hi, 12);
}

/* Channel c (bits 8c..8c+7) of each 32-bit lane of g, as 0..255: one byte
 * shuffle (byte c of each lane, the other three zeroed), where a shift and
 * a mask took two operations.  Pure. */
__attribute__((target("avx2"))) static inline __m256i
fl_chan8(__m256i g, int c)
{
    const char z = (char)0x80, a = (char)c, b = (char)(c + 4), d = (char)(c + 8), e = (char)(c + 12);
    return _mm256_shuffle_epi8(g, _mm256_setr_epi8(a, z, z, z, b, z, z, z, d, z, z, z, e, z, z, z,
                                                   a, z, z, z, b, z, z, z, d, z, z, z, e, z, z, z));
}

/* The 32-bit values at src + idx[l] for the 8 lanes (unaligned; the caller
 * keeps each inside src's buffer).  Scalar loads, not vpgatherdd: 5-9%
 * faster in the bicubic kernel on the AMD EPYC machines here (the bilinear
 * one's fewer loads measured faster as gathers).  Pure. */
__attribute__((target("avx2"))) static inline __m256i
fl_load8(const uint8_t *src, __m256i idx)
{
    int32_t ix[8], v[8];
    _mm256_storeu_si256((__m256i *)(void *)ix, idx);
    for (int l = 0; l < 8; l++)
        memcpy(&v[l], src + ix[l], 4);
    return _mm256_loadu_si256((const __m256i *)(const void *)v);
}

/* Pillow's cubic (fl_pil_cubic below) of 4 bytes' neighbours at the
 * fraction d, from the neighbours' int16 differences (p2 = v3 - v1, p3 = 2 (v1 - v2) + v3 - v4,
 * p4 = -v1 + v2 - v3 + v4 and v2 itself, in lanes 4k .. 4k + 3 of the four
 * 8-lane int16 vectors; exact, as Pillow's int arithmetic), Horner in
 * double in Pillow's order, clipped to 0..255 and truncated: 4 int32
 * lanes.  Pure. */
__attribute__((target("avx2"))) static inline __m128i
fl_cubic4_i16(__m128i v2, __m128i p2, __m128i p3, __m128i p4, int k, __m256d d)
{
    const __m256d zero = _mm256_setzero_pd(), top = _mm256_set1_pd(255.0);
#define FL_Q4(v) _mm256_cvtepi32_pd(k ? _mm_cvtepi16_epi32(_mm_unpackhi_epi64((v), (v))) : _mm_cvtepi16_epi32(v))
    __m256d q = _mm256_add_pd(FL_Q4(p3), _mm256_mul_pd(d, FL_Q4(p4)));
    q = _mm256_add_pd(FL_Q4(p2), _mm256_mul_pd(d, q));
    q = _mm256_add_pd(FL_Q4(v2), _mm256_mul_pd(d, q));
#undef FL_Q4
    return _mm256_cvttpd_epi32(_mm256_min_pd(_mm256_max_pd(q, zero), top));
}

/* Pillow's one cubic of 8 bytes: tap k at s + k * stride + 0..7 (the 4
 * neighbours of each byte along the kept axis's other one), fraction d,
 * into out[0, 8).  Reads exactly 8 bytes a tap.  Pure but for the store. */
__attribute__((target("avx2"))) static inline void
fl_cubic_bytes8(const uint8_t *s, ptrdiff_t stride, __m256d d, uint8_t *out)
{
    __m128i v1 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)s));
    __m128i v2 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(s + stride)));
    __m128i v3 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(s + 2 * stride)));
    __m128i v4 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(s + 3 * stride)));
    __m128i p2 = _mm_sub_epi16(v3, v1);
    __m128i t = _mm_sub_epi16(v1, v2);
    __m128i p3 = _mm_sub_epi16(_mm_add_epi16(_mm_add_epi16(t, t), v3), v4);
    __m128i p4 = _mm_add_epi16(_mm_sub_epi16(_mm_sub_epi16(v2, v1), v3), v4);
    __m128i lo = fl_cubic4_i16(v2, p2, p3, p4, 0, d), hi = fl_cubic4_i16(v2, p2, p3, p4, 1, d);
    __m128i b = _mm_packus_epi16(_mm_packs_epi32(lo, hi), _mm_setzero_si128());
    _mm_storel_epi64((__m128i *)(void *)out, b);
}

/* Pillow's lerp of 8 bytes (bilinear with one fraction 0): a + (b - a) * d
 * with a at s + 0..7 and b at s + stride + 0..7, the difference in int (as
 * Pillow's), the product and sum in double, truncated, into out[0, 8).
 * Reads exactly 8 bytes a tap.  Pure but for the store. */
__attribute__((target("avx2"))) static inline void
fl_lerp_bytes8(const uint8_t *s, ptrdiff_t stride, __m256d d, uint8_t *out)
{
    __m128i a = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)s));
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(s + stride)));
    __m128i df = _mm_sub_epi16(b, a);
    __m128i r[2];
    for (int k = 0; k < 2; k++) {
        __m128i a4 = _mm_cvtepi16_epi32(k ? _mm_unpackhi_epi64(a, a) : a);
        __m128i d4 = _mm_cvtepi16_epi32(k ? _mm_unpackhi_epi64(df, df) : df);
        r[k] = _mm256_cvttpd_epi32(_mm256_add_pd(_mm256_cvtepi32_pd(a4), _mm256_mul_pd(_mm256_cvtepi32_pd(d4), d)));
    }
    _mm_storel_epi64((__m128i *)(void *)out, _mm_packus_epi16(_mm_packs_epi32(r[0], r[1]), _mm_setzero_si128()));
}

/* Whether every lane of v lies in [lo, hi].  Pure. */
__attribute__((target("avx2"))) static inline int
fl_all_in(__m256i v, int32_t lo, int32_t hi)
{
    const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(v, _mm256_set1_epi32(lo - 1)),
                                        _mm256_cmpgt_epi32(_mm256_set1_epi32(hi + 1), v));
    return _mm256_movemask_epi8(in) == -1;
}

/* The interiors' transpose: y[p] holds pixel p's channel-major words (word
 * c: channel c's neighbour bytes) in its low lane and pixel p + 4's in its
 * high lane; wc[c] gets word c of pixels 0..7, one a 32-bit lane.  Pure. */
__attribute__((target("avx2"))) static inline void
fl_cmajor_words(const __m256i y[4], __m256i wc[3])
{
    __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpacklo_epi32(y[2], y[3]);
    __m256i t2 = _mm256_unpackhi_epi32(y[0], y[1]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    wc[0] = _mm256_unpacklo_epi64(t0, t1);
    wc[1] = _mm256_unpackhi_epi64(t0, t1);
    wc[2] = _mm256_unpacklo_epi64(t2, t3);
}

/* The 8 pixels of cw (C = 3) where they are one straight run: one fraction
 * 0 on all of them (z, fl_warp8_zero), every one covered and the floors
 * consecutive along x on one row (the caller's preconditions,
 * fl_warp8_shortcut, fl_warp8_one_row), the other fraction the
 * same on all 8, and no neighbour clamped.  TranslateX, ShearX and
 * TranslateY give such runs nearly everywhere (a0 = 1, a3 = 0: the
 * fraction only changes where the coordinate crosses a power of two).
 * There every output byte is Pillow's one cubic (taps = 4) or lerp (taps =
 * 2) of source bytes a fixed step apart (3 along x, the row stride along
 * y) at one fraction, so the 24 bytes come from contiguous 24-byte runs
 * rather than from 32-bit gathers and channel shuffles; the arithmetic is
 * that of the one-fraction paths of fl_bicubic_run3_avx2 and
 * fl_bilinear_run3_avx2, value for value.  Returns 1 with out[0, 24)
 * written, or 0 (nothing written) where the 8 are not such a run.  Reads
 * only inside the image (rs * h bytes at src).  No GIL. */
__attribute__((target("avx2"))) static int
fl_run8_straight(const uint8_t *src, int32_t rs, int w, int h, const fl_warp8 *cw, int z, int taps, uint8_t *out)
{
    const int32_t xi0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(cw->xi));
    const int32_t yi0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(cw->yi));
    const int along_x = z & 1;
    const __m256d *f = along_x ? cw->dx : cw->dy;
    const __m256d d = _mm256_permute4x64_pd(f[0], 0x00);
    if ((_mm256_movemask_pd(_mm256_and_pd(_mm256_cmp_pd(f[0], d, _CMP_EQ_OQ), _mm256_cmp_pd(f[1], d, _CMP_EQ_OQ)))
         != 0xf))
        return 0;
    /* the neighbours: before (1 for the cubic) and after (2 or 1) the floor */
    const int before = taps == 4, after = taps == 4 ? 2 : 1;
    const uint8_t *s;
    ptrdiff_t stride;
    if (along_x) {
        if (xi0 - before < 0 || xi0 + 7 + after > w - 1 || yi0 < 0 || yi0 > h - 1)
            return 0;
        s = src + (size_t)yi0 * (size_t)rs + (size_t)(xi0 - before) * 3;
        stride = 3;
    } else {
        if (yi0 - before < 0 || yi0 + after > h - 1 || xi0 < 0 || xi0 + 7 > w - 1)
            return 0;
        s = src + (size_t)(yi0 - before) * (size_t)rs + (size_t)xi0 * 3;
        stride = rs;
    }
    for (int o = 0; o < 24; o += 8) {
        if (taps == 4)
            fl_cubic_bytes8(s + o, stride, d, out + o);
        else
            fl_lerp_bytes8(s + o, stride, d, out + o);
    }
    return 1;
}

/* The 8 pixels of cw (C = 3), every one covered (the caller's
 * precondition, fl_warp8_shortcut), when its 2 x 2
 * neighbours need no clamping (xi >= 0 and xi <= w - 3, so that an 8-byte
 * load from column xi stays in the row; yi >= 0 and yi + 1 <= h - 1): a
 * rotation's interior.  Each pixel's two neighbour rows are two 8-byte
 * loads, shuffled to channel-major (channel c's p00 p01 p10 p11 in 32-bit
 * word c) and transposed so that word c of the 8 pixels fills one vector;
 * Pillow's integer differences p01 - p00 and p11 - p10 come from byte
 * multiply-adds, and the doubles are fl_bilinear_run3_avx2's, value for
 * value.  Returns 1 with out[0, 24) written, or 0 (nothing written) where
 * the 8 are not all interior.  Reads only inside the image.  No GIL. */
__attribute__((target("avx2"))) static int
fl_bilinear_run8_interior(const uint8_t *src, int32_t rs, int w, int h, const fl_warp8 *cw, uint8_t *out)
{
    if (!fl_all_in(cw->xi, 0, w - 3) || !fl_all_in(cw->yi, 0, h - 2))
        return 0;
    __m256i base = _mm256_add_epi32(_mm256_mullo_epi32(cw->yi, _mm256_set1_epi32(rs)),
                                    _mm256_add_epi32(cw->xi, _mm256_slli_epi32(cw->xi, 1)));
    int32_t off[8];
    _mm256_storeu_si256((__m256i *)(void *)off, base);
    /* a: n0c0 n0c1 n0c2 n1c0 n1c1 n1c2 . . | b: the same -> c0: a0 a1 b0 b1 | c1 | c2 | 0 */
    const __m256i cmajor = _mm256_setr_epi8(0, 3, 8, 11, 1, 4, 9, 12, 2, 5, 10, 13, -1, -1, -1, -1,
                                            0, 3, 8, 11, 1, 4, 9, 12, 2, 5, 10, 13, -1, -1, -1, -1);
    const __m256i c_d0 = _mm256_set1_epi32((int32_t)(0xffu | 0x01u << 8));          /* -1, 1, 0, 0 */
    const __m256i c_d1 = _mm256_set1_epi32((int32_t)(0xffu << 16 | 0x01u << 24));   /* 0, 0, -1, 1 */
    const __m256i ones16 = _mm256_set1_epi16(1);
    const char z = (char)0x80;
    const __m256i tap0 = _mm256_setr_epi8(0, z, z, z, 4, z, z, z, 8, z, z, z, 12, z, z, z,
                                          0, z, z, z, 4, z, z, z, 8, z, z, z, 12, z, z, z);
    const __m256i tap2 = _mm256_setr_epi8(2, z, z, z, 6, z, z, z, 10, z, z, z, 14, z, z, z,
                                          2, z, z, z, 6, z, z, z, 10, z, z, z, 14, z, z, z);
    __m256i y[4];
    for (int p = 0; p < 4; p++) {
        const uint8_t *a = src + off[p], *b = src + off[p + 4];
        __m128i lo = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(const void *)a),
                                        _mm_loadl_epi64((const __m128i *)(const void *)(a + rs)));
        __m128i hi = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(const void *)b),
                                        _mm_loadl_epi64((const __m128i *)(const void *)(b + rs)));
        y[p] = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), cmajor);
    }
    __m256i wc[3];
    fl_cmajor_words(y, wc);
    __m256i px = _mm256_setzero_si256();
    for (int c = 0; c < 3; c++) {
        __m256i p00 = _mm256_shuffle_epi8(wc[c], tap0), p10 = _mm256_shuffle_epi8(wc[c], tap2);
        __m256i d0 = _mm256_madd_epi16(_mm256_maddubs_epi16(wc[c], c_d0), ones16);
        __m256i d1 = _mm256_madd_epi16(_mm256_maddubs_epi16(wc[c], c_d1), ones16);
        __m128i r4[2];
        for (int hf = 0; hf < 2; hf++) {
#define FL_HALF(v) (hf ? _mm256_extracti128_si256((v), 1) : _mm256_castsi256_si128(v))
            __m256d v1 = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(p00)),
                                       _mm256_mul_pd(_mm256_cvtepi32_pd(FL_HALF(d0)), cw->dx[hf]));
            __m256d v2 = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(p10)),
                                       _mm256_mul_pd(_mm256_cvtepi32_pd(FL_HALF(d1)), cw->dx[hf]));
#undef FL_HALF
            v1 = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), cw->dy[hf]));
            r4[hf] = _mm256_cvttpd_epi32(v1);
        }
        px = _mm256_or_si256(px, _mm256_slli_epi32(_mm256_set_m128i(r4[1], r4[0]), 8 * c));
    }
    fl_warp8_store3(px, cw->ok, (const uint8_t[3]){0, 0, 0}, out);
    return 1;
}

__attribute__((target("avx2"))) static int
fl_bicubic_run8_interior(const uint8_t *src, int32_t rs, int w, int h, const fl_warp8 *cw, uint8_t *out);

/* Whether the 8 floors of cw are consecutive along x (xi0 + lane) on one row
 * (yi): inline, so that the warps whose rows move per pixel (ShearY) reject
 * a straight run without a call, which would spill the loop's vectors.
 * Pure. */
__attribute__((target("avx2"))) static inline int
fl_warp8_one_row(const fl_warp8 *cw)
{
    const __m256i x0 = _mm256_permutevar8x32_epi32(cw->xi, _mm256_setzero_si256());
    const __m256i y0 = _mm256_permutevar8x32_epi32(cw->yi, _mm256_setzero_si256());
    const __m256i same = _mm256_and_si256(
        _mm256_cmpeq_epi32(cw->xi, _mm256_add_epi32(x0, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))),
        _mm256_cmpeq_epi32(cw->yi, y0));
    return _mm256_movemask_epi8(same) == -1;
}

/* The two warp loops' cheap cases for 8 pixels of cw (C = 3; z from
 * fl_warp8_zero; taps 2 for bilinear, 4 for bicubic): none covered -> the
 * fill; all covered -> a straight run (fl_run8_straight) where a fraction
 * is 0 and the floors are one row's (fl_warp8_one_row), else a rotation's interior (fl_bilinear_run8_interior,
 * fl_bicubic_run8_interior).  Returns 1 with out[0, 24) written, or 0
 * (nothing written) for the general path.  No GIL. */
__attribute__((target("avx2"))) static inline int
fl_warp8_shortcut(const uint8_t *src, int32_t rs, int w, int h, const fl_warp8 *cw, int z, int taps,
                  const uint8_t *fill, uint8_t *out)
{
    if (_mm256_testz_si256(cw->ok, cw->ok)) {
        fl_warp8_store3(_mm256_setzero_si256(), cw->ok, fill, out);
        return 1;
    }
    if (_mm256_movemask_epi8(cw->ok) != -1)
        return 0;
    if (z)
        return fl_warp8_one_row(cw) && fl_run8_straight(src, rs, w, h, cw, z, taps, out);
    return taps == 4 ? fl_bicubic_run8_interior(src, rs, w, h, cw, out)
                     : fl_bilinear_run8_interior(src, rs, w, h, cw, out);
}

/* The first (w / 8) * 8 pixels of output row `out` of fl_bilinear_chunked
 * with C = 3, 8 pixels a step (fl_warp8_coords, 4 in each double vector):
 * the 4 neighbours as 32-bit gathers at row * rs + col * 3 (rs * h < 2^31,
 * checked by the caller; 1 byte read past a pixel: tmp's slack), each
 * channel's two lerps along x and one along y, or the one lerp where a
 * fraction is 0 on all 8, in the scalar loop's double operations; the
 * fill, straight runs and interiors by fl_warp8_shortcut.  Returns
 * the pixels done.  No GIL; writes only out[0, 3 * return). */
__attribute__((target("avx2"))) static int
fl_bilinear_run3_avx2(const uint8_t *src, int32_t rs, int w, int h, const double a[6], double py, double qy,
                      const uint8_t *fill, uint8_t *out)
{
    const __m256i one = _mm256_set1_epi32(1), izero = _mm256_setzero_si256();
    const __m256i wm1 = _mm256_set1_epi32(w - 1), hv = _mm256_set1_epi32(h), vrs = _mm256_set1_epi32(rs);
    int x = 0;
    for (; x + 8 <= w; x += 8) {
        fl_warp8 cw;
        fl_warp8_coords(a, py, qy, w, h, x, &cw);
        const int z = fl_warp8_zero(&cw);
        if (fl_warp8_shortcut(src, rs, w, h, &cw, z, 2, fill, out + (size_t)x * 3))
            continue;
        const __m256d *dx = cw.dx, *dy = cw.dy;
        __m256i xa = _mm256_max_epi32(cw.xi, izero), xb = _mm256_min_epi32(_mm256_add_epi32(cw.xi, one), wm1);
        __m256i ya = _mm256_max_epi32(cw.yi, izero), y1 = _mm256_add_epi32(cw.yi, one);
        __m256i yb = _mm256_blendv_epi8(ya, y1, _mm256_cmpgt_epi32(hv, y1));
        __m256i ra = _mm256_mullo_epi32(ya, vrs), rb = _mm256_mullo_epi32(yb, vrs);
        __m256i ca = _mm256_add_epi32(xa, _mm256_slli_epi32(xa, 1)), cb = _mm256_add_epi32(xb, _mm256_slli_epi32(xb, 1));
        const int *s32 = (const int *)(const void *)src;
        __m256i g00 = _mm256_i32gather_epi32(s32, _mm256_add_epi32(ra, ca), 1);
        __m256i px = _mm256_setzero_si256();
        if (z) {
            const int along_x = z & 1;
            __m256i g1 = _mm256_i32gather_epi32(s32, along_x ? _mm256_add_epi32(ra, cb) : _mm256_add_epi32(rb, ca), 1);
            for (int c = 0; c < 3; c++) {
                const int sh = 8 * c;
                __m256i p0 = fl_chan8(g00, c);
                __m256i d0 = _mm256_sub_epi32(fl_chan8(g1, c), p0);
                __m128i r4[2];
                for (int hf = 0; hf < 2; hf++) {
                    __m128i lo = hf ? _mm256_extracti128_si256(p0, 1) : _mm256_castsi256_si128(p0);
                    __m128i dd = hf ? _mm256_extracti128_si256(d0, 1) : _mm256_castsi256_si128(d0);
                    __m256d v = _mm256_add_pd(_mm256_cvtepi32_pd(lo),
                                              _mm256_mul_pd(_mm256_cvtepi32_pd(dd), along_x ? dx[hf] : dy[hf]));
                    r4[hf] = _mm256_cvttpd_epi32(v);
                }
                px = _mm256_or_si256(px, _mm256_slli_epi32(_mm256_set_m128i(r4[1], r4[0]), sh));
            }
        } else {
            __m256i g01 = _mm256_i32gather_epi32(s32, _mm256_add_epi32(ra, cb), 1);
            __m256i g10 = _mm256_i32gather_epi32(s32, _mm256_add_epi32(rb, ca), 1);
            __m256i g11 = _mm256_i32gather_epi32(s32, _mm256_add_epi32(rb, cb), 1);
            for (int c = 0; c < 3; c++) {
                const int sh = 8 * c;
                __m256i p00 = fl_chan8(g00, c);
                __m256i p10 = fl_chan8(g10, c);
                __m256i d0 = _mm256_sub_epi32(fl_chan8(g01, c), p00);
                __m256i d1 = _mm256_sub_epi32(fl_chan8(g11, c), p10);
                __m128i r4[2];
                for (int hf = 0; hf < 2; hf++) {
#define FL_HALF(v) (hf ? _mm256_extracti128_si256((v), 1) : _mm256_castsi256_si128(v))
                    __m256d v1 = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(p00)),
                                               _mm256_mul_pd(_mm256_cvtepi32_pd(FL_HALF(d0)), dx[hf]));
                    __m256d v2 = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(p10)),
                                               _mm256_mul_pd(_mm256_cvtepi32_pd(FL_HALF(d1)), dx[hf]));
#undef FL_HALF
                    v1 = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), dy[hf]));
                    r4[hf] = _mm256_cvttpd_epi32(v1);
                }
                px = _mm256_or_si256(px, _mm256_slli_epi32(_mm256_set_m128i(r4[1], r4[0]), sh));
            }
        }
        fl_warp8_store3(px, cw.ok, fill, out + (size_t)x * 3);
    }
    return x;
}
#endif

static inline __attribute__((always_inline)) void
fl_bilinear_chunked(const uint8_t *restrict src, uint8_t *restrict img, int w, int h, const int C,
                    const double a[6], const uint8_t *fill)
{
    const size_t rs = (size_t)w * (size_t)C;
    double dxs[FL_BL_CHUNK], dys[FL_BL_CHUNK];
    int32_t r0[FL_BL_CHUNK], r1[FL_BL_CHUNK], c0[FL_BL_CHUNK], c1[FL_BL_CHUNK], ok[FL_BL_CHUNK];
    uint32_t u00[FL_BL_CHUNK], u01[FL_BL_CHUNK], u10[FL_BL_CHUNK], u11[FL_BL_CHUNK];
    uint8_t res[3][FL_BL_CHUNK];
    const double W = (double)w, Hd = (double)h;
#ifdef FL_AUG_X86
    const int simd = C == 3 && fl_use_avx2() && (uint64_t)rs * (uint64_t)h < ((uint64_t)1 << 31);
#endif
    for (int y = 0; y < h; y++) {
        uint8_t *restrict row = img + (size_t)y * rs;
        double yin = y + 0.5;
        double py = a[1] * yin, qy = a[4] * yin;
        int xbeg = 0;
#ifdef FL_AUG_X86
        if (simd)
            xbeg = fl_bilinear_run3_avx2(src, (int32_t)rs, w, h, a, py, qy, fill, row);
#endif
        for (int x0 = xbeg; x0 < w; x0 += FL_BL_CHUNK) {
            int n = w - x0 < FL_BL_CHUNK ? w - x0 : FL_BL_CHUNK;
            for (int k = 0; k < n; k++) {
                int32_t xi, yi;
                ok[k] = fl_warp_coord(a, py, qy, W, Hd, x0 + k, &xi, &yi, &dxs[k], &dys[k]);
                int32_t xa = xi < 0 ? 0 : xi, xb = xi + 1 < w ? xi + 1 : w - 1;
                int32_t ya = yi < 0 ? 0 : yi, yb = yi + 1 < h ? yi + 1 : ya;
                r0[k] = ya;
                r1[k] = yb;
                c0[k] = xa * C;
                c1[k] = xb * C;
            }
            /* dy = 0 (fl_zero_fractions): v1 + (v2 - v1) * 0 is v1 exactly,
             * one lerp along the row; dx = 0: each row's lerp is its first
             * neighbour, one lerp along the column */
            int dy0, dx0;
            fl_zero_fractions(dxs, dys, ok, n, &dx0, &dy0);
            if (dy0 || dx0) {
                for (int k = 0; k < n; k++) {
                    const uint8_t *s0 = src + (size_t)r0[k] * rs;
                    memcpy(&u00[k], s0 + c0[k], 4);
                    memcpy(&u01[k], dy0 ? s0 + c1[k] : src + (size_t)r1[k] * rs + c0[k], 4);
                }
                const double *dd = dy0 ? dxs : dys;
                for (int c = 0; c < C; c++) {
                    const int sh = 8 * c;
                    for (int k = 0; k < n; k++) {
                        int32_t p0 = (int32_t)((u00[k] >> sh) & 255u), p1 = (int32_t)((u01[k] >> sh) & 255u);
                        double v = p0 + (p1 - p0) * dd[k];
                        res[c][k] = (uint8_t)(int32_t)v;
                    }
                }
                goto store;
            }
            for (int k = 0; k < n; k++) {
                const uint8_t *s0 = src + (size_t)r0[k] * rs, *s1 = src + (size_t)r1[k] * rs;
                memcpy(&u00[k], s0 + c0[k], 4);
                memcpy(&u01[k], s0 + c1[k], 4);
                memcpy(&u10[k], s1 + c0[k], 4);
                memcpy(&u11[k], s1 + c1[k], 4);
            }
            for (int c = 0; c < C; c++) {
                const int sh = 8 * c;
                for (int k = 0; k < n; k++) {
                    int32_t p00 = (int32_t)((u00[k] >> sh) & 255u), p01 = (int32_t)((u01[k] >> sh) & 255u);
                    int32_t p10 = (int32_t)((u10[k] >> sh) & 255u), p11 = (int32_t)((u11[k] >> sh) & 255u);
                    double v1 = p00 + (p01 - p00) * dxs[k];
                    double v2 = p10 + (p11 - p10) * dxs[k];
                    v1 = v1 + (v2 - v1) * dys[k];
                    res[c][k] = (uint8_t)(int32_t)v1;
                }
            }
        store:;
            uint8_t *restrict out = row + (size_t)x0 * C;
            if (C == 3) {
                const uint8_t f0 = fill[0], f1 = fill[1], f2 = fill[2];
                for (int k = 0; k < n; k++) {
                    out[k * 3] = ok[k] ? res[0][k] : f0;
                    out[k * 3 + 1] = ok[k] ? res[1][k] : f1;
                    out[k * 3 + 2] = ok[k] ? res[2][k] : f2;
                }
            } else {
                const uint8_t f0 = fill[0];
                for (int k = 0; k < n; k++)
                    out[k] = ok[k] ? res[0][k] : f0;
            }
        }
    }
}

FL_HOT static void
fl_affine_bilinear3(const uint8_t *restrict src, uint8_t *restrict img, int w, int h, const double a[6],
                    const uint8_t *fill)
{
    fl_bilinear_chunked(src, img, w, h, 3, a, fill);
}

FL_HOT static void
fl_affine_bilinear1(const uint8_t *restrict src, uint8_t *restrict img, int w, int h, const double a[6],
                    const uint8_t *fill)
{
    fl_bilinear_chunked(src, img, w, h, 1, a, fill);
}

/* ImagingGenericTransform with affine_transform and bicubic_filter8 /
 * bicubic_filter32RGB (Geometry.c), in double: the pixel centre mapped by a,
 * outside [0, w) x [0, h) -> fill; else shifted by -0.5 and floored, the
 * 4 x 4 neighbours from one column and one row before to two after, each
 * index clamped to the image (Pillow clamps the first row and copies the
 * previous row's value past the last one, which clamping every row gives),
 * Pillow's BICUBIC (the a = -1 cubic) along x on each row, then along y,
 * clipped to 0..255 and truncated.  Chunked as fl_bilinear_chunked; each
 * value goes through Pillow's double operations in Pillow's order.  C: the
 * channel count, a constant in each caller. */
static inline __attribute__((always_inline)) double
fl_pil_cubic(double v1, double v2, double v3, double v4, double d)
{
    double p1 = v2;
    double p2 = -v1 + v3;
    double p3 = 2 * (v1 - v2) + v3 - v4;
    double p4 = -v1 + v2 - v3 + v4;
    return p1 + d * (p2 + d * (p3 + d * p4));
}

#ifdef FL_AUG_X86
/* fl_pil_cubic of 8 pixels' integer neighbours v1..v4 (0..255, 32-bit
 * lanes) at the fractions d (4 a vector): p1..p4 are exact integers in
 * Pillow's double arithmetic, so they are formed in integers, then its
 * Horner steps in double, in its order.  Pure. */
__attribute__((target("avx2"))) static inline void
fl_cubic8_int(__m256i v1, __m256i v2, __m256i v3, __m256i v4, const __m256d d[2], __m256d r[2])
{
    __m256i p2 = _mm256_sub_epi32(v3, v1);
    __m256i t = _mm256_sub_epi32(v1, v2);
    __m256i p3 = _mm256_sub_epi32(_mm256_add_epi32(_mm256_add_epi32(t, t), v3), v4);
    __m256i p4 = _mm256_add_epi32(_mm256_sub_epi32(_mm256_sub_epi32(v2, v1), v3), v4);
    for (int hf = 0; hf < 2; hf++) {
#define FL_HALF(v) (hf ? _mm256_extracti128_si256((v), 1) : _mm256_castsi256_si128(v))
        __m256d q = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(p3)), _mm256_mul_pd(d[hf], _mm256_cvtepi32_pd(FL_HALF(p4))));
        q = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(p2)), _mm256_mul_pd(d[hf], q));
        r[hf] = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(v2)), _mm256_mul_pd(d[hf], q));
#undef FL_HALF
    }
}

/* fl_cubic8_int from the differences already formed (v2, p2, p3, p4: 8
 * pixels' exact integers, 32-bit lanes): Pillow's Horner steps in double,
 * in its order.  Pure. */
__attribute__((target("avx2"))) static inline void
fl_cubic8_diffs(__m256i v2, __m256i p2, __m256i p3, __m256i p4, const __m256d d[2], __m256d r[2])
{
    for (int hf = 0; hf < 2; hf++) {
#define FL_HALF(v) (hf ? _mm256_extracti128_si256((v), 1) : _mm256_castsi256_si128(v))
        __m256d q = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(p3)),
                                  _mm256_mul_pd(d[hf], _mm256_cvtepi32_pd(FL_HALF(p4))));
        q = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(p2)), _mm256_mul_pd(d[hf], q));
        r[hf] = _mm256_add_pd(_mm256_cvtepi32_pd(FL_HALF(v2)), _mm256_mul_pd(d[hf], q));
#undef FL_HALF
    }
}

/* fl_pil_cubic of 4 pixels' double values r0..r3 at the fractions d, in its
 * operations and order (-a + b is b - a exactly).  Pure. */
__attribute__((target("avx2"))) static inline __m256d
fl_cubic4_pd(__m256d r0, __m256d r1, __m256d r2, __m256d r3, __m256d d)
{
    __m256d p2 = _mm256_sub_pd(r2, r0);
    __m256d t = _mm256_sub_pd(r0, r1);
    __m256d p3 = _mm256_sub_pd(_mm256_add_pd(_mm256_add_pd(t, t), r2), r3);
    __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(r1, r0), r2), r3);
    __m256d q = _mm256_add_pd(p3, _mm256_mul_pd(d, p4));
    q = _mm256_add_pd(p2, _mm256_mul_pd(d, q));
    return _mm256_add_pd(r1, _mm256_mul_pd(d, q));
}

/* Pillow's clip of the two halves' values to 0..255 (v <= 0 -> 0,
 * v >= 255 -> 255), truncated, as 8 32-bit lanes.  Pure. */
__attribute__((target("avx2"))) static inline __m256i
fl_clip_trunc8(const __m256d v[2])
{
    const __m256d zero = _mm256_setzero_pd(), top = _mm256_set1_pd(255.0);
    __m128i lo = _mm256_cvttpd_epi32(_mm256_min_pd(_mm256_max_pd(v[0], zero), top));
    __m128i hi = _mm256_cvttpd_epi32(_mm256_min_pd(_mm256_max_pd(v[1], zero), top));
    return _mm256_set_m128i(hi, lo);
}

/* The 8 pixels of cw (C = 3), every one covered (the caller's
 * precondition, fl_warp8_shortcut), when its 4 x 4
 * neighbours need no clamping (columns xi - 1 .. xi + 2 with xi <= w - 5,
 * so that a 16-byte load from column xi - 1 stays in the row; rows yi - 1
 * .. yi + 2): the rotations' interior.  Each pixel's neighbour row is one
 * 16-byte load (4 pixels x 3 channels), shuffled to channel-major (channel
 * c's 4 taps in 32-bit word c) and transposed so that word c of the 8
 * pixels fills one vector; Pillow's integer differences then come from
 * byte multiply-adds (p2 = -n0 + n2, p3 = 2 n0 - 2 n1 + n2 - n3, p4 = -n0 +
 * n1 - n2 + n3, exact in int16 before their pairs are summed in int32), and
 * the doubles are fl_bicubic_run3_avx2's (fl_cubic8_diffs, fl_cubic4_pd),
 * value for value.  Returns 1 with out[0, 24) written, or 0 (nothing
 * written) where the 8 are not all interior.  Reads only inside the image.
 * No GIL. */
__attribute__((target("avx2"))) static int
fl_bicubic_run8_interior(const uint8_t *src, int32_t rs, int w, int h, const fl_warp8 *cw, uint8_t *out)
{
    if (!fl_all_in(cw->xi, 1, w - 5) || !fl_all_in(cw->yi, 1, h - 3))
        return 0;
    /* each pixel's top-left neighbour: (yi - 1) * rs + (xi - 1) * 3 */
    const __m256i one = _mm256_set1_epi32(1);
    __m256i cx = _mm256_sub_epi32(cw->xi, one);
    __m256i base = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(cw->yi, one), _mm256_set1_epi32(rs)),
                                    _mm256_add_epi32(cx, _mm256_slli_epi32(cx, 1)));
    int32_t off[8];
    _mm256_storeu_si256((__m256i *)(void *)off, base);
    /* n0c0 n0c1 n0c2 n1c0 ... n3c2 -> c0: n0 n1 n2 n3 | c1: ... | c2: ... | 0 */
    const __m256i cmajor = _mm256_setr_epi8(0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11, -1, -1, -1, -1,
                                            0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11, -1, -1, -1, -1);
    /* signed byte coefficients of taps n0..n3 (little-endian words): p2 -1, 0, 1, 0;
     * p3 2, -2, 1, -1; p4 -1, 1, -1, 1 */
    const __m256i c_p2 = _mm256_set1_epi32((int32_t)(0xffu | 0x01u << 16));
    const __m256i c_p3 = _mm256_set1_epi32((int32_t)(0x02u | 0xfeu << 8 | 0x01u << 16 | 0xffu << 24));
    const __m256i c_p4 = _mm256_set1_epi32((int32_t)(0xffu | 0x01u << 8 | 0xffu << 16 | 0x01u << 24));
    const __m256i ones16 = _mm256_set1_epi16(1);
    const char z = (char)0x80;
    const __m256i tap1 = _mm256_setr_epi8(1, z, z, z, 5, z, z, z, 9, z, z, z, 13, z, z, z,
                                          1, z, z, z, 5, z, z, z, 9, z, z, z, 13, z, z, z);
    __m256d r[3][4][2];
    for (int j = 0; j < 4; j++) {
        const uint8_t *rowp = src + (size_t)j * (size_t)rs;
        __m256i y[4];
        for (int p = 0; p < 4; p++) {
            __m128i lo = _mm_loadu_si128((const __m128i *)(const void *)(rowp + off[p]));
            __m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(rowp + off[p + 4]));
            y[p] = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), cmajor);
        }
        __m256i wc[3];
        fl_cmajor_words(y, wc);
        for (int c = 0; c < 3; c++) {
            __m256i p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(wc[c], c_p2), ones16);
            __m256i p3 = _mm256_madd_epi16(_mm256_maddubs_epi16(wc[c], c_p3), ones16);
            __m256i p4 = _mm256_madd_epi16(_mm256_maddubs_epi16(wc[c], c_p4), ones16);
            __m256i v2 = _mm256_shuffle_epi8(wc[c], tap1);
            fl_cubic8_diffs(v2, p2, p3, p4, cw->dx, r[c][j]);
        }
    }
    __m256i px = _mm256_setzero_si256();
    for (int c = 0; c < 3; c++) {
        __m256d o[2];
        for (int hf = 0; hf < 2; hf++)
            o[hf] = fl_cubic4_pd(r[c][0][hf], r[c][1][hf], r[c][2][hf], r[c][3][hf], cw->dy[hf]);
        px = _mm256_or_si256(px, _mm256_slli_epi32(fl_clip_trunc8(o), 8 * c));
    }
    fl_warp8_store3(px, cw->ok, (const uint8_t[3]){0, 0, 0}, out);
    return 1;
}

/* The first (w / 8) * 8 pixels of output row `out` of fl_bicubic_chunked
 * with C = 3, 8 pixels a step (fl_warp8_coords): the 4 x 4 neighbours as
 * 32-bit loads (rows and columns clamped as the scalar loop clamps them;
 * rs * h < 2^31, checked by the caller; 1 byte read past a pixel: tmp's
 * slack), per channel the four row cubics along x (fl_cubic8_int) and the
 * column cubic along y (fl_cubic4_pd), or the one cubic where a fraction is
 * 0 on all 8 (fl_warp8_zero), clipped and truncated as Pillow does; the
 * fill, straight runs and interiors by fl_warp8_shortcut.  Returns
 * the pixels done.  No GIL; writes only out[0, 3 * return). */
__attribute__((target("avx2"))) static int
fl_bicubic_run3_avx2(const uint8_t *src, int32_t rs, int w, int h, const double a[6], double py, double qy,
                     const uint8_t *fill, uint8_t *out)
{
    const __m256i izero = _mm256_setzero_si256();
    const __m256i wm1 = _mm256_set1_epi32(w - 1), hm1 = _mm256_set1_epi32(h - 1), vrs = _mm256_set1_epi32(rs);
    int x = 0;
    for (; x + 8 <= w; x += 8) {
        fl_warp8 cw;
        fl_warp8_coords(a, py, qy, w, h, x, &cw);
        const int z = fl_warp8_zero(&cw);
        if (fl_warp8_shortcut(src, rs, w, h, &cw, z, 4, fill, out + (size_t)x * 3))
            continue;
        __m256i col[4], row[4];
        for (int j = 0; j < 4; j++) {
            __m256i cx = _mm256_add_epi32(cw.xi, _mm256_set1_epi32(j - 1));
            __m256i ry = _mm256_add_epi32(cw.yi, _mm256_set1_epi32(j - 1));
            cx = _mm256_min_epi32(_mm256_max_epi32(cx, izero), wm1);
            ry = _mm256_min_epi32(_mm256_max_epi32(ry, izero), hm1);
            col[j] = _mm256_add_epi32(cx, _mm256_slli_epi32(cx, 1));
            row[j] = _mm256_mullo_epi32(ry, vrs);
        }
        __m256i px = _mm256_setzero_si256();
        if (z) {
            /* dy = 0: row 1 along x; dx = 0: column 1 along y */
            const int along_x = z & 1;
            __m256i g[4];
            for (int j = 0; j < 4; j++)
                g[j] = fl_load8(src, along_x ? _mm256_add_epi32(row[1], col[j]) : _mm256_add_epi32(row[j], col[1]));
            for (int c = 0; c < 3; c++) {
                const int sh = 8 * c;
                __m256i v[4];
                for (int j = 0; j < 4; j++)
                    v[j] = fl_chan8(g[j], c);
                __m256d r[2];
                fl_cubic8_int(v[0], v[1], v[2], v[3], along_x ? cw.dx : cw.dy, r);
                px = _mm256_or_si256(px, _mm256_slli_epi32(fl_clip_trunc8(r), sh));
            }
        } else {
            __m256i g[16];
            for (int j = 0; j < 4; j++)
                for (int i = 0; i < 4; i++)
                    g[j * 4 + i] = fl_load8(src, _mm256_add_epi32(row[j], col[i]));
            for (int c = 0; c < 3; c++) {
                const int sh = 8 * c;
                __m256d r[4][2];
                for (int j = 0; j < 4; j++) {
                    __m256i v[4];
                    for (int i = 0; i < 4; i++)
                        v[i] = fl_chan8(g[j * 4 + i], c);
                    fl_cubic8_int(v[0], v[1], v[2], v[3], cw.dx, r[j]);
                }
                __m256d o[2];
                for (int hf = 0; hf < 2; hf++)
                    o[hf] = fl_cubic4_pd(r[0][hf], r[1][hf], r[2][hf], r[3][hf], cw.dy[hf]);
                px = _mm256_or_si256(px, _mm256_slli_epi32(fl_clip_trunc8(o), sh));
            }
        }
        fl_warp8_store3(px, cw.ok, fill, out + (size_t)x * 3);
    }
    return x;
}
#endif

static inline __attribute__((always_inline)) void
fl_bicubic_chunked(const uint8_t *restrict src, uint8_t *restrict img, int w, int h, const int C,
                   const double a[6], const uint8_t *fill)
{
    const size_t rs = (size_t)w * (size_t)C;
    double dxs[FL_BL_CHUNK], dys[FL_BL_CHUNK];
    int32_t rows[4][FL_BL_CHUNK], cols[4][FL_BL_CHUNK], ok[FL_BL_CHUNK];
    uint32_t nb[16][FL_BL_CHUNK];   /* the 4 x 4 neighbour pixels, row-major, pixel innermost: one 32-bit
                                       load each, channel c in bits 8c.. (the bytes past the pixel unused;
                                       past the image they are tmp's slack, as in fl_bilinear_chunked) */
    uint8_t res[3][FL_BL_CHUNK];
    const double W = (double)w, Hd = (double)h;
#ifdef FL_AUG_X86
    const int simd = C == 3 && fl_use_avx2() && (uint64_t)rs * (uint64_t)h < ((uint64_t)1 << 31);
#endif
    for (int y = 0; y < h; y++) {
        uint8_t *restrict row = img + (size_t)y * rs;
        double yin = y + 0.5;
        double py = a[1] * yin, qy = a[4] * yin;
        int xbeg = 0;
#ifdef FL_AUG_X86
        if (simd)
            xbeg = fl_bicubic_run3_avx2(src, (int32_t)rs, w, h, a, py, qy, fill, row);
#endif
        for (int x0 = xbeg; x0 < w; x0 += FL_BL_CHUNK) {
            int n = w - x0 < FL_BL_CHUNK ? w - x0 : FL_BL_CHUNK;
            for (int k = 0; k < n; k++) {
                int32_t xi, yi;
                ok[k] = fl_warp_coord(a, py, qy, W, Hd, x0 + k, &xi, &yi, &dxs[k], &dys[k]);
                for (int j = 0; j < 4; j++) {
                    int32_t cx = xi - 1 + j, ry = yi - 1 + j;
                    cols[j][k] = (cx < 0 ? 0 : cx >= w ? w - 1 : cx) * C;
                    rows[j][k] = ry < 0 ? 0 : ry >= h ? h - 1 : ry;
                }
            }
            /* A zero fraction (fl_zero_fractions) makes Pillow's result one
             * cubic: cubic(v1, v2, v3, v4, 0) = v2 + 0 * (finite) = v2
             * exactly, so the three other row cubics (dy = 0) or the row
             * cubics themselves (dx = 0, each is its column-1 neighbour)
             * need not be computed; the remaining one is Pillow's
             * operations in its order. */
            int dy0, dx0;
            fl_zero_fractions(dxs, dys, ok, n, &dx0, &dy0);
            if (dy0 || dx0) {
                for (int k = 0; k < n; k++)
                    for (int j = 0; j < 4; j++)
                        memcpy(&nb[j][k],
                               src + (size_t)(dy0 ? rows[1][k] : rows[j][k]) * rs + (dy0 ? cols[j][k] : cols[1][k]),
                               4);
                const double *dd = dy0 ? dxs : dys;
                for (int c = 0; c < C; c++) {
                    const int sh = 8 * c;
#define NB(q) ((int32_t)((nb[q][k] >> sh) & 255u))
                    for (int k = 0; k < n; k++) {
                        double v = fl_pil_cubic(NB(0), NB(1), NB(2), NB(3), dd[k]);
                        v = v <= 0.0 ? 0.0 : v >= 255.0 ? 255.0 : v;
                        res[c][k] = (uint8_t)(int32_t)v;
                    }
#undef NB
                }
                goto store;
            }
            /* the neighbours: scalar loads into planes the arithmetic reads contiguously */
            for (int k = 0; k < n; k++)
                for (int j = 0; j < 4; j++) {
                    const uint8_t *s = src + (size_t)rows[j][k] * rs;
                    for (int i = 0; i < 4; i++)
                        memcpy(&nb[j * 4 + i][k], s + cols[i][k], 4);
                }
            /* Pillow's arithmetic, a pixel per lane */
            for (int c = 0; c < C; c++) {
                const int sh = 8 * c;
#define NB(q) ((int32_t)((nb[q][k] >> sh) & 255u))
                for (int k = 0; k < n; k++) {
                    double d = dxs[k];
                    double r0 = fl_pil_cubic(NB(0), NB(1), NB(2), NB(3), d);
                    double r1 = fl_pil_cubic(NB(4), NB(5), NB(6), NB(7), d);
                    double r2 = fl_pil_cubic(NB(8), NB(9), NB(10), NB(11), d);
                    double r3 = fl_pil_cubic(NB(12), NB(13), NB(14), NB(15), d);
                    double v = fl_pil_cubic(r0, r1, r2, r3, dys[k]);
                    v = v <= 0.0 ? 0.0 : v >= 255.0 ? 255.0 : v;
                    res[c][k] = (uint8_t)(int32_t)v;
                }
#undef NB
            }
        store:;
            uint8_t *restrict out = row + (size_t)x0 * C;
            for (int k = 0; k < n; k++)
                for (int c = 0; c < C; c++)
                    out[k * C + c] = ok[k] ? res[c][k] : fill[c];
        }
    }
}

FL_HOT static void
fl_affine_bicubic3(const uint8_t *restrict src, uint8_t *restrict img, int w, int h, const double a[6],
                   const uint8_t *fill)
{
    fl_bicubic_chunked(src, img, w, h, 3, a, fill);
}

FL_HOT static void
fl_affine_bicubic1(const uint8_t *restrict src, uint8_t *restrict img, int w, int h, const double a[6],
                   const uint8_t *fill)
{
    fl_bicubic_chunked(src, img, w, h, 1, a, fill);
}

/* Image.transform((w, h), AFFINE, a, resample, fillcolor=fill) on the copy
 * src, into img: ImagingTransformAffine's choice of loop. */
static void
fl_affine(const uint8_t *src, uint8_t *img, int w, int h, int c, const double a[6], int interp,
          const uint8_t *fill, int *xintab)
{
    if (interp == FL_AUG_BICUBIC && c == 3)
        fl_affine_bicubic3(src, img, w, h, a, fill);
    else if (interp == FL_AUG_BICUBIC)
        fl_affine_bicubic1(src, img, w, h, a, fill);
    else if (interp == FL_AUG_BILINEAR && c == 3)
        fl_affine_bilinear3(src, img, w, h, a, fill);
    else if (interp == FL_AUG_BILINEAR)
        fl_affine_bilinear1(src, img, w, h, a, fill);
    else if (a[1] == 0 && a[3] == 0)
        fl_affine_scale(src, img, w, h, c, a, fill, xintab);
    else if (fl_check_fixed(a, 0, 0) && fl_check_fixed(a, w, h) && fl_check_fixed(a, 0, h)
             && fl_check_fixed(a, w, 0))
        fl_affine_fixed(src, img, w, h, c, a, fill);
    else
        fl_affine_float(src, img, w, h, c, a, fill);
}

/* Contract: augment_internal.h. */
void
fl_aug_tv_inverse_affine(double cx, double cy, double angle, double tx, double ty, double scale, double shx,
                         double shy, double m[6])
{
    double rot = angle * fl_aug_deg2rad, sx = shx * fl_aug_deg2rad, sy = shy * fl_aug_deg2rad;
    double a = cos(rot - sy) / cos(sy);
    double b = -cos(rot - sy) * tan(sx) / cos(sy) - sin(rot);
    double c = sin(rot - sy) / cos(sy);
    double d = -sin(rot - sy) * tan(sx) / cos(sy) + cos(rot);
    m[0] = d / scale;   /* [x / scale for x in matrix] (x / 1.0 is x) */
    m[1] = -b / scale;
    m[2] = 0.0 / scale;
    m[3] = -c / scale;
    m[4] = a / scale;
    m[5] = 0.0 / scale;
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
}

/* Contract: augment_internal.h. */
void
fl_aug_tv2_inverse_affine(double cx, double cy, double angle, double tx, double ty, double scale, double shx,
                          double shy, double m[6])
{
    double rot = angle * fl_aug_deg2rad, sx = shx * fl_aug_deg2rad, sy = shy * fl_aug_deg2rad;
    double cos_sy = cos(sy), tan_sx = tan(sx), rot_minus_sy = rot - sy;
    double cx_plus_tx = cx + tx, cy_plus_ty = cy + ty;
    double a = cos(rot_minus_sy) / cos_sy;
    double b = -(a * tan_sx + sin(rot));
    double c = sin(rot_minus_sy) / cos_sy;
    double d = cos(rot) - c * tan_sx;
    m[0] = d / scale;
    m[1] = -b / scale;
    m[2] = 0.0;
    m[3] = -c / scale;
    m[4] = a / scale;
    m[5] = 0.0;
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
}

/* Image.rotate(angle) without expand, centre or translate: the transposes
 * for 180 (and 90 / 270 on square images), else the rounded rotation
 * matrix about (w / 2, h / 2) through Image.transform.  Returns 1 when the
 * angle is 0 (the image is left as it is). */
static int
fl_rotate(const uint8_t *src, uint8_t *img, int w, int h, int c, double angle, int interp, const uint8_t *fill,
          int *xintab)
{
    size_t rs = (size_t)w * (size_t)c;
    double ang = fl_aug_py_mod(angle, 360.0);
    if (ang == 0)
        return 1;
    if (ang == 180) {   /* ImagingRotate180: out[h-1-y][w-1-x] = in[y][x] */
        for (int y = 0; y < h; y++) {
            const uint8_t *in = src + (size_t)(h - 1 - y) * rs;
            uint8_t *out = img + (size_t)y * rs;
            for (int x = 0; x < w; x++)
                memcpy(out + (size_t)x * c, in + (size_t)(w - 1 - x) * c, (size_t)c);
        }
        return 0;
    }
    if ((ang == 90 || ang == 270) && w == h) {
        /* ImagingRotate90: out[w-1-x][y] = in[y][x]; ImagingRotate270: out[x][h-1-y] = in[y][x] */
        for (int y = 0; y < h; y++) {
            uint8_t *out = img + (size_t)y * rs;
            for (int x = 0; x < w; x++) {
                const uint8_t *s = ang == 90 ? src + (size_t)x * rs + (size_t)(w - 1 - y) * c
                                             : src + (size_t)(h - 1 - x) * rs + (size_t)y * c;
                memcpy(out + (size_t)x * c, s, (size_t)c);
            }
        }
        return 0;
    }
    double cx = w / 2.0, cy = h / 2.0;
    double t = -(ang * fl_aug_deg2rad);
    double m[6];
    m[0] = fl_py_round15(cos(t));
    m[1] = fl_py_round15(sin(t));
    m[2] = 0.0;
    m[3] = fl_py_round15(-sin(t));
    m[4] = fl_py_round15(cos(t));
    m[5] = 0.0;
    {
        double x = -cx, y = -cy;
        double e = m[0] * x + m[1] * y + m[2];
        double f = m[3] * x + m[4] * y + m[5];
        m[2] = e + cx;
        m[5] = f + cy;
    }
    fl_affine(src, img, w, h, c, m, interp, fill, xintab);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The LUTs of ImageOps                                                     */

/* ImageOps.equalize's table for one channel's histogram. */
static void
fl_equalize_lut(const uint64_t *hist, uint8_t *lut)
{
    uint64_t total = 0, last = 0;
    int nonzero = 0;
    for (int i = 0; i < 256; i++) {
        if (hist[i]) {
            nonzero++;
            total += hist[i];
            last = hist[i];
        }
    }
    uint64_t step = nonzero <= 1 ? 0 : (total - last) / 255;
    if (step == 0) {
        for (int i = 0; i < 256; i++)
            lut[i] = (uint8_t)i;
        return;
    }
    uint64_t n = step / 2;
    for (int i = 0; i < 256; i++) {
        uint64_t v = n / step;
        lut[i] = (uint8_t)(v > 255 ? 255 : v);   /* Image.point clips */
        n += hist[i];
    }
}

/* ImageOps.autocontrast(cutoff=0)'s table for one channel's histogram. */
static void
fl_autocontrast_lut(const uint64_t *hist, uint8_t *lut)
{
    int lo = 0, hi = 255;
    while (lo < 255 && hist[lo] == 0)
        lo++;
    while (hi > 0 && hist[hi] == 0)
        hi--;
    if (hi <= lo) {
        for (int i = 0; i < 256; i++)
            lut[i] = (uint8_t)i;
        return;
    }
    double scale = 255.0 / (hi - lo);
    double offset = -lo * scale;
    for (int i = 0; i < 256; i++) {
        double v = i * scale + offset;
        int ix = (int)v;   /* Python's int(): toward zero; |v| < 2^31 here */
        lut[i] = (uint8_t)(ix < 0 ? 0 : ix > 255 ? 255 : ix);
    }
}

/* ------------------------------------------------------------------------ */
/* Entry points                                                             */

/* Contract: augment.h.  The scratch holds the image copy, then (8-byte
 * aligned) the w ints of ImagingScaleAffine's column table. */
size_t
fl_aug_tmp_bytes(int w, int h, int channels)
{
    if (w <= 0 || h <= 0 || channels <= 0)
        return 0;
    size_t uw = (size_t)w, uh = (size_t)h, uc = (size_t)channels;
    if (uw > SIZE_MAX / uh || uw * uh > SIZE_MAX / uc)
        return 0;
    size_t img = uw * uh * uc;
    size_t off = (img + 7) & ~(size_t)7;
    if (off < img || uw > (SIZE_MAX - off) / sizeof(int))
        return 0;
    return off + uw * sizeof(int);
}

static const char *const fl_aug_names[FL_AUG_NOPS] = {
    "Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
    "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert",
    "SolarizeAdd", "ShearX (affine)", "ShearY (affine)", "TranslateX (pixels)", "TranslateY (pixels)",
    "Brightness (factor)", "Color (factor)", "Contrast (factor)", "Sharpness (factor)",
    "ShearX (tensor)", "ShearY (tensor)", "TranslateX (tensor)", "TranslateY (tensor)", "Rotate (tensor)",
    "ShearX (tensor, v2)", "ShearY (tensor, v2)", "TranslateX (tensor, v2)", "TranslateY (tensor, v2)",
    "Rotate (tensor, v2)", "Brightness (tensor)", "Color (tensor)", "Color (tensor, v2)", "Contrast (tensor)",
    "Contrast (tensor, v2)", "Sharpness (tensor)", "Sharpness (tensor, v2)", "AutoContrast (tensor)",
    "AutoContrast (tensor, v2)", "Hue", "RandomAffine", "RandomAffine (v2)", "GaussianBlur (Pillow)",
};

/* Contract: augment.h. */
int
fl_aug_affine(const double prm[8], int v2, int interp, const uint8_t *fill, uint8_t *img, int w, int h,
              int channels, uint8_t *tmp, fl_err *err)
{
    static const uint8_t zeros[3] = {0, 0, 0};
    if (interp != FL_AUG_NEAREST && interp != FL_AUG_BILINEAR && interp != FL_AUG_BICUBIC) {
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: RandomAffine: unknown interpolation %d", interp);
        return -1;
    }
    if (channels != 1 && channels != 3) {
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: RandomAffine: %d channels (1 or 3 supported)", channels);
        return -1;
    }
    if (w <= 0 || h <= 0 || w > FL_MAX_DIM || h > FL_MAX_DIM || img == NULL || tmp == NULL || prm == NULL) {
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: RandomAffine: image size %d x %d or no buffer", w, h);
        return -1;
    }
    for (int k = 0; k < 8; k++) {
        if (!isfinite(prm[k]) || (k == 3 && !(prm[k] > 0.0))) {
            fl_err_set(err, FL_ERR_INVALID, 0, "augment: RandomAffine: parameter %d is %g", k, prm[k]);
            return -1;
        }
    }
    double m[6];
    (v2 ? fl_aug_tv2_inverse_affine : fl_aug_tv_inverse_affine)(prm[6], prm[7], prm[0], prm[1], prm[2], prm[3],
                                                                 prm[4], prm[5], m);
    const size_t n = (size_t)w * (size_t)h * (size_t)channels;
    int *xintab = (int *)(void *)(tmp + ((n + 7) & ~(size_t)7));
    memcpy(tmp, img, n);
    fl_affine(tmp, img, w, h, channels, m, interp, fill ? fill : zeros, xintab);
    return 0;
}

/* Contract: augment.h. */
int
fl_aug_apply(int op, double magnitude, int interp, const uint8_t *fill, uint8_t *img, int w, int h, int channels,
             uint8_t *tmp, fl_err *err)
{
    static const uint8_t zeros[3] = {0, 0, 0};
    if (op < 0 || op >= FL_AUG_NOPS) {
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: unknown op %d (0..%d)", op, FL_AUG_NOPS - 1);
        return -1;
    }
    const char *name = fl_aug_names[op];
    if (interp != FL_AUG_NEAREST && interp != FL_AUG_BILINEAR && interp != FL_AUG_BICUBIC) {
        fl_err_set(err, FL_ERR_INVALID, 0,
                   "augment: %s: unknown interpolation %d (0 nearest, 1 bilinear, 2 bicubic)", name, interp);
        return -1;
    }
    if (channels != 1 && channels != 3) {
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: %s: %d channels (1 or 3 supported)", name, channels);
        return -1;
    }
    if (w <= 0 || h <= 0 || w > FL_MAX_DIM || h > FL_MAX_DIM) {
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: %s: image size %d x %d (1..%d each)", name, w, h, FL_MAX_DIM);
        return -1;
    }
    if (!isfinite(magnitude)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: %s: magnitude %g is not finite", name, magnitude);
        return -1;
    }
    if (img == NULL || tmp == NULL) {
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: %s: no image or scratch buffer", name);
        return -1;
    }
    if (fill == NULL)
        fill = zeros;
    if (op >= FL_AUG_T_SHEAR_X && op <= FL_AUG_T_AUTOCONTRAST_V2)   /* torchvision's tensor kernels: fill None, zeros */
        return fl_aug_tensor_apply(op, magnitude, interp, img, w, h, channels, tmp, err);

    size_t npix = (size_t)w * (size_t)h, n = npix * (size_t)channels;
    int *xintab = (int *)(void *)(tmp + ((n + 7) & ~(size_t)7));
    uint8_t lut[3 * 256];

    switch (op) {
    case FL_AUG_IDENTITY:
        return 0;

    case FL_AUG_SHEAR_X:
    case FL_AUG_SHEAR_Y:
    case FL_AUG_TRANSLATE_X:
    case FL_AUG_TRANSLATE_Y:
    case FL_AUG_ROTATE:
    case FL_AUG_AFFINE_SHEAR_X:
    case FL_AUG_AFFINE_SHEAR_Y:
    case FL_AUG_AFFINE_TRANSLATE_X:
    case FL_AUG_AFFINE_TRANSLATE_Y: {
        double m[6];
        memcpy(tmp, img, n);
        if (op >= FL_AUG_AFFINE_SHEAR_X) {   /* the coefficients timm hands Image.transform */
            m[0] = 1.0, m[1] = 0.0, m[2] = 0.0, m[3] = 0.0, m[4] = 1.0, m[5] = 0.0;
            m[op == FL_AUG_AFFINE_SHEAR_X ? 1 : op == FL_AUG_AFFINE_SHEAR_Y ? 3
              : op == FL_AUG_AFFINE_TRANSLATE_X ? 2 : 5] = magnitude;
            fl_affine(tmp, img, w, h, channels, m, interp, fill, xintab);
            return 0;
        }
        if (op == FL_AUG_ROTATE) {
            fl_rotate(tmp, img, w, h, channels, magnitude, interp, fill, xintab);
            return 0;
        }
        if (op == FL_AUG_SHEAR_X || op == FL_AUG_SHEAR_Y) {
            double deg = atan(magnitude) * fl_aug_rad2deg;   /* math.degrees(math.atan(magnitude)) */
            fl_aug_tv_inverse_affine(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, op == FL_AUG_SHEAR_X ? deg : 0.0,
                                 op == FL_AUG_SHEAR_Y ? deg : 0.0, m);
        } else {
            double t = trunc(magnitude);   /* int(magnitude) */
            fl_aug_tv_inverse_affine(w * 0.5, h * 0.5, 0.0, op == FL_AUG_TRANSLATE_X ? t : 0.0,
                                     op == FL_AUG_TRANSLATE_Y ? t : 0.0, 1.0, 0.0, 0.0, m);
        }
        fl_affine(tmp, img, w, h, channels, m, interp, fill, xintab);
        return 0;
    }

    case FL_AUG_BRIGHTNESS:
    case FL_AUG_COLOR:
    case FL_AUG_CONTRAST:
    case FL_AUG_SHARPNESS:
    case FL_AUG_BRIGHTNESS_FACTOR:
    case FL_AUG_COLOR_FACTOR:
    case FL_AUG_CONTRAST_FACTOR:
    case FL_AUG_SHARPNESS_FACTOR: {
        /* Image.blend's alpha is a C float */
        const int given = op >= FL_AUG_BRIGHTNESS_FACTOR;   /* the factor itself */
        float alpha = given ? (float)magnitude : (float)(1.0 + magnitude);
        if (given)
            op = FL_AUG_BRIGHTNESS + (op - FL_AUG_BRIGHTNESS_FACTOR);
        if (isinf(alpha)) {
            fl_err_set(err, FL_ERR_INVALID, 0, "augment: %s: factor %s%g is beyond float range", name,
                       given ? "" : "1 + ", magnitude);
            return -1;
        }
        if (alpha == 1.0f)
            return 0;
        /* From |alpha| >= 256 on, every byte is 0 or 255 by the sign of
         * alpha * (v - d), or d where v == d: the same with alpha clamped. */
        if (alpha > FL_BLEND_ALPHA_MAX)
            alpha = FL_BLEND_ALPHA_MAX;
        if (alpha < -FL_BLEND_ALPHA_MAX)
            alpha = -FL_BLEND_ALPHA_MAX;
        if (op == FL_AUG_BRIGHTNESS) {   /* degenerate: black */
            fl_blend_const(img, n, 0, alpha);
        } else if (op == FL_AUG_CONTRAST) {   /* degenerate: int(mean of the luma + 0.5) everywhere */
            double mean = (double)fl_luma_sum(img, npix, channels) / (double)npix;
            fl_blend_const(img, n, (int)(mean + 0.5), alpha);
        } else if (op == FL_AUG_COLOR) {
            if (channels == 1)   /* the degenerate of an L image is the image */
                return 0;
            fl_color_rows(img, w, h, alpha, tmp);
        } else {
            if (w < 3 || h < 3)   /* ImagingFilter copies images smaller than the kernel */
                return 0;
            memcpy(tmp, img, n);
            fl_sharpness_rows(tmp, img, w, h, channels, alpha);   /* alpha 0: the smoothed image */
        }
        return 0;
    }

    case FL_AUG_POSTERIZE: {
        double bits_d = trunc(magnitude);   /* int(magnitude) */
        if (!(bits_d >= 0.0 && bits_d <= 8.0)) {
            fl_err_set(err, FL_ERR_INVALID, 0, "augment: Posterize: bits int(%g) outside 0..8", magnitude);
            return -1;
        }
        int bits = (int)bits_d;
        if (bits == 8)
            return 0;
        fl_mask_bytes(img, n, (uint8_t)(0xFFu << (8 - bits)));   /* ~(2 ** (8 - bits) - 1) */
        return 0;
    }

    case FL_AUG_SOLARIZE: {   /* the table's `i < threshold`, an int against a float */
        int k = 0;
        while (k < 256 && (double)k < magnitude)
            k++;
        if (k == 0)
            fl_invert_bytes(img, n);
        else if (k < 256)
            fl_solarize_bytes(img, n, (uint8_t)k);
        return 0;
    }

    case FL_AUG_AUTOCONTRAST:
    case FL_AUG_EQUALIZE: {
        uint64_t hist[3 * 256];
        fl_histogram(img, npix, channels, hist);
        for (int ch = 0; ch < channels; ch++) {
            if (op == FL_AUG_EQUALIZE)
                fl_equalize_lut(hist + ch * 256, lut + ch * 256);
            else
                fl_autocontrast_lut(hist + ch * 256, lut + ch * 256);
        }
        if (channels == 3)
            fl_lut_apply3(img, npix, lut);
        else
            fl_lut_apply1(img, n, lut);
        return 0;
    }

    case FL_AUG_INVERT:
        fl_invert_bytes(img, n);
        return 0;

    case FL_AUG_TV_AFFINE:
    case FL_AUG_TV_AFFINE_V2:
        fl_err_set(err, FL_ERR_INVALID, 0, "augment: %s takes its parameters through fl_aug_affine", name);
        return -1;

    case FL_AUG_GAUSSIAN_BLUR: {   /* Pillow takes the radius as a C float */
        if (!(fabs(magnitude) <= 1e5)) {
            fl_err_set(err, FL_ERR_INVALID, 0, "augment: GaussianBlur: radius %g is not within 1e5", magnitude);
            return -1;
        }
        if (magnitude == 0.0)   /* ImageFilter.GaussianBlur(0) is a copy */
            return 0;
        fl_gaussian_blur(img, tmp, w, h, channels, (float)magnitude, (uint32_t *)(void *)xintab, (size_t)w);
        return 0;
    }

    case FL_AUG_HUE: {
        if (!(magnitude >= -0.5 && magnitude <= 0.5)) {   /* adjust_hue raises ValueError there */
            fl_err_set(err, FL_ERR_INVALID, 0, "augment: Hue: factor %g is not in [-0.5, 0.5]", magnitude);
            return -1;
        }
        if (channels == 1)   /* adjust_hue returns an L image as it is */
            return 0;
        fl_hsv_tables T;
        fl_hsv_tables_init(&T);
        /* np.int32(hue_factor * 255).astype(np.uint8): truncated toward zero, then mod 256 */
        const int shift = (int)trunc(magnitude * 255.0) & 255;
        size_t done = 0;
#ifdef FL_AUG_X86
        if (fl_use_avx2())
            done = fl_hue_pixels_avx2(img, npix, shift, &T);
#endif
        fl_hue_pixels(img + 3 * done, npix - done, shift, &T);
        return 0;
    }

    case FL_AUG_SOLARIZE_ADD: {   /* timm's table: i < 128 ? min(255, i + add) : i */
        double add_d = trunc(magnitude);
        if (!(add_d >= 0.0 && add_d <= 255.0)) {
            fl_err_set(err, FL_ERR_INVALID, 0, "augment: SolarizeAdd: add int(%g) outside 0..255", magnitude);
            return -1;
        }
        int add = (int)add_d;
        for (int v = 0; v < 256; v++)
            lut[v] = (uint8_t)(v < 128 ? (v + add > 255 ? 255 : v + add) : v);
        fl_lut_apply1(img, n, lut);
        return 0;
    }
    }
    return 0;
}
