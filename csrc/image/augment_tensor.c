/* augment_tensor.c: torchvision's tensor kernels on uint8 images
 * (augment.h FL_AUG_T_*), the ops AugMix applies: it turns the PIL image
 * into a uint8 tensor and calls _apply_op on that, so its ops are
 * torchvision.transforms._functional_tensor's (v1) or
 * torchvision.transforms.v2.functional's (v2), not Pillow's.
 *
 * Reference arithmetic, as torch 2.x computes it on the CPU:
 *   - a Python float times a uint8 tensor is float32: the byte as float
 *     times the scalar rounded to float; each tensor operation rounds once;
 *     .to(uint8) truncates toward zero.
 *   - v1 writes its blends as `ratio * img1 + (1 - ratio) * img2`: two
 *     rounded products and a rounded sum.  v2 writes
 *     `img1.mul(ratio).add_(img2, alpha=1 - ratio)`, and ATen's add with
 *     alpha is one fused multiply-add (vec::fmadd): fmaf(img2, 1 - ratio,
 *     img1 * ratio).  The grayscale of v2 is the same kind of chain.
 *   - torch.mean of a float32 tensor is its sum divided by the count; the
 *     sum of whole numbers below 2^24 is exact in any order.
 *   - `number / tensor` is `tensor.reciprocal() * number`.
 *   - the 3 x 3 blur of adjust_sharpness is a float conv2d rounded half to
 *     even; its exact value is k / 13 for a whole k, never within float
 *     error of a half, so the rounded integer is computed exactly here.
 *   - the geometric ops sample on the grid of _gen_affine_grid /
 *     _affine_grid with grid_sample(align_corners=False, zeros padding):
 *     see fl_tgrid below; nearest rounds half to even, bilinear sums its
 *     four taps in fused multiply-adds (ATen's vector kernel) and rounds
 *     half to even.
 * FMA: this file is built with -std=c11 (no contraction); the fused
 * operations are explicit fmaf() calls, compiled to one instruction in the
 * "fma" clones of the hot loops and to glibc's exact fmaf in the default
 * ones, so both give torch's bytes.
 *
 * Fidelity is tested op by op against torchvision in tests/test_augmix.py
 * and stated in docs/recipes.md.
 */
#include "image/augment_internal.h"

#include <math.h>
#include <string.h>

#include "image/augment.h"
#include "image/imgops_internal.h" /* fl_use_avx2 */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define FL_HOT_FMA __attribute__((target_clones("fma", "default")))
#else
#define FL_HOT_FMA
#endif

/* float32 -> uint8 as torch's clamp(0, 255) then .to(uint8) */
static inline uint8_t
fl_t_clamp_u8(float v)
{
    v = v > 0.0f ? v : 0.0f;   /* negatives, -0 and NaN: 0 (selects, so loops vectorize) */
    v = v < 255.0f ? v : 255.0f;
    return (uint8_t)(int)v;
}

/* ------------------------------------------------------------------------ */
/* Colour                                                                   */

/* adjust_saturation, RGB: v1 blends with the truncated gray, two products
 * and a sum; v2 with the floored fused gray, fused.  The grays: v1's
 * rgb_to_grayscale is (0.2989 r + 0.587 g) + 0.114 b in float32, each
 * product and sum rounded, truncated to uint8; v2's
 * _rgb_to_grayscale_image(preserve_dtype=False) then floor_ is
 * r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114), two fused
 * multiply-adds, floored.  A run of pixels at a
 * time through planar float rows, so the arithmetic runs in vector lanes. */
#define FL_T_RUN_PX 256
FL_HOT_FMA static void
fl_t_color(uint8_t *img, size_t npix, float rf, float qf, int v2)
{
    float r[FL_T_RUN_PX], g[FL_T_RUN_PX], b[FL_T_RUN_PX], l[FL_T_RUN_PX];
    for (size_t i0 = 0; i0 < npix; i0 += FL_T_RUN_PX) {
        const size_t n = npix - i0 < FL_T_RUN_PX ? npix - i0 : FL_T_RUN_PX;
        uint8_t *p = img + 3 * i0;
        for (size_t k = 0; k < n; k++) {
            r[k] = (float)p[3 * k];
            g[k] = (float)p[3 * k + 1];
            b[k] = (float)p[3 * k + 2];
        }
        if (v2) {
            for (size_t k = 0; k < n; k++)
                l[k] = floorf(fmaf(b[k], 0.114f, fmaf(g[k], 0.587f, r[k] * 0.2989f)));
            for (size_t k = 0; k < n; k++) {
                r[k] = fmaf(l[k], qf, r[k] * rf);
                g[k] = fmaf(l[k], qf, g[k] * rf);
                b[k] = fmaf(l[k], qf, b[k] * rf);
            }
        } else {
            for (size_t k = 0; k < n; k++)
                l[k] = (float)(int)((0.2989f * r[k] + 0.587f * g[k]) + 0.114f * b[k]);
            for (size_t k = 0; k < n; k++) {
                const float m = l[k] * qf;
                r[k] = r[k] * rf + m;
                g[k] = g[k] * rf + m;
                b[k] = b[k] * rf + m;
            }
        }
        for (size_t k = 0; k < n; k++) {
            p[3 * k] = fl_t_clamp_u8(r[k]);
            p[3 * k + 1] = fl_t_clamp_u8(g[k]);
            p[3 * k + 2] = fl_t_clamp_u8(b[k]);
        }
    }
}

/* The mean torch.mean gives of the image's gray (v1: truncated, v2:
 * floored fused; an L image itself): the exact sum (whole numbers) as
 * float32 divided by the count as float32.  Exact for sums below 2^24
 * (every image up to 65,793 pixels); above, torch's float32 summation
 * rounds and the last bit may differ. */
FL_HOT_FMA static float
fl_t_gray_mean(const uint8_t *img, size_t npix, int channels, int v2)
{
    uint64_t sum = 0;
    if (channels == 1) {
        for (size_t i = 0; i < npix; i++)
            sum += img[i];
    } else {   /* a run at a time through planar float rows, as fl_t_color */
        float r[FL_T_RUN_PX], g[FL_T_RUN_PX], b[FL_T_RUN_PX];
        for (size_t i0 = 0; i0 < npix; i0 += FL_T_RUN_PX) {
            const size_t n = npix - i0 < FL_T_RUN_PX ? npix - i0 : FL_T_RUN_PX;
            const uint8_t *p = img + 3 * i0;
            for (size_t k = 0; k < n; k++) {
                r[k] = (float)p[3 * k];
                g[k] = (float)p[3 * k + 1];
                b[k] = (float)p[3 * k + 2];
            }
            uint32_t part = 0;   /* at most 256 grays of at most 255 */
            if (v2) {
                for (size_t k = 0; k < n; k++)
                    part += (uint32_t)(int)floorf(fmaf(b[k], 0.114f, fmaf(g[k], 0.587f, r[k] * 0.2989f)));
            } else {
                for (size_t k = 0; k < n; k++)
                    part += (uint32_t)(int)((0.2989f * r[k] + 0.587f * g[k]) + 0.114f * b[k]);
            }
            sum += part;
        }
    }
    return (float)sum / (float)npix;
}

/* adjust_sharpness: the interior takes the blend with the rounded blur
 * (1 1 1 / 1 5 1 / 1 1 1) / 13; v1 blends the border with itself (two
 * rounded products need not give the byte back), v2 leaves it.  src: a copy
 * of img.  Needs w, h >= 3.  The blur's sum k is a whole number up to
 * 3315, and k / 13 is never within 1/26 of a half, so rounding the float
 * quotient (off by an ulp or two) gives round(k / 13) exactly. */
static inline uint8_t
fl_t_sharp_px(int x, int blur, float rf, float qf, int v2)
{
    return fl_t_clamp_u8(v2 ? fmaf((float)(blur - x), qf, (float)x) : (float)x * rf + (float)blur * qf);
}

FL_HOT_FMA static void
fl_t_sharpness_row(const uint8_t *restrict up, const uint8_t *restrict md, const uint8_t *restrict dn,
                   uint8_t *restrict out, size_t lo, size_t hi, const int C, float rf, float qf, int v2)
{
#define FL_T_SHARP_LOOP(V2)                                                                                   \
    for (size_t i = lo; i < hi; i++) {                                                                        \
        int k = up[i - C] + up[i] + up[i + C] + md[i - C] + 5 * md[i] + md[i + C] + dn[i - C] + dn[i] + dn[i + C]; \
        int blur = (int)nearbyintf((float)k * (1.0f / 13.0f));                                                \
        out[i] = fl_t_sharp_px(md[i], blur, rf, qf, V2);                                                      \
    }
    if (v2) {
        FL_T_SHARP_LOOP(1)
    } else {
        FL_T_SHARP_LOOP(0)
    }
#undef FL_T_SHARP_LOOP
}

static void
fl_t_sharpness(const uint8_t *src, uint8_t *img, int w, int h, int C, float rf, float qf, int v2)
{
    const size_t rs = (size_t)w * (size_t)C, c = (size_t)C;
    for (int y = 0; y < h; y++) {
        const uint8_t *md = src + (size_t)y * rs;
        uint8_t *out = img + (size_t)y * rs;
        if (y == 0 || y == h - 1) {   /* border rows */
            if (!v2)
                for (size_t i = 0; i < rs; i++)
                    out[i] = fl_t_sharp_px(md[i], md[i], rf, qf, 0);
            continue;
        }
        if (!v2)   /* the first and last pixel of the row */
            for (size_t i = 0; i < c; i++) {
                out[i] = fl_t_sharp_px(md[i], md[i], rf, qf, 0);
                out[rs - c + i] = fl_t_sharp_px(md[rs - c + i], md[rs - c + i], rf, qf, 0);
            }
        if (C == 3)
            fl_t_sharpness_row(md - rs, md, md + rs, out, 3, rs - 3, 3, rf, qf, v2);
        else
            fl_t_sharpness_row(md - rs, md, md + rs, out, 1, rs - 1, 1, rf, qf, v2);
    }
}

/* autocontrast, per channel: v1 (x - min) * (reciprocal(max - min) * 255),
 * v2 (x - min) / ((max - min) * (1 / 255)); a flat channel is left as it is
 * (min 0, scale 1). */
static void
fl_t_autocontrast(uint8_t *img, size_t npix, int C, int v2)
{
    uint8_t lut[3][256];
    for (int c = 0; c < C; c++) {
        int lo = 255, hi = 0;
        for (size_t i = 0; i < npix; i++) {
            int v = img[i * (size_t)C + (size_t)c];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        for (int v = 0; v < 256; v++) {
            if (hi == lo) {
                lut[c][v] = (uint8_t)v;
                continue;
            }
            float d = (float)v - (float)lo;
            float out = v2 ? d / ((float)(hi - lo) * (float)(1.0 / 255.0)) : d * ((1.0f / (float)(hi - lo)) * 255.0f);
            lut[c][v] = fl_t_clamp_u8(out);
        }
    }
    if (C == 3)
        fl_lut_apply3(img, npix, &lut[0][0]);
    else
        fl_lut_apply1(img, npix, lut[0]);
}

/* ------------------------------------------------------------------------ */
/* Geometry: F.affine / F.rotate on the tensor                              */

/* _gen_affine_grid's base coordinates, torch.linspace(-n / 2 + 0.5,
 * n / 2 - 0.5, n): steps of exactly 1 from a whole or half number, so
 * every element is exact in float32 whichever way ATen's kernel forms it
 * (start + step * i, end - step * (n - 1 - i), its vector ramps):
 * -(n - 1) / 2 + i. */
static inline float
fl_t_base(int n, int i)
{
    return (float)(-0.5 * (n - 1)) + (float)i;
}

/* The sampling grid of a run of n output pixels from column x0 of a row:
 * the base point (xb, yb, 1) of _gen_affine_grid times the rescaled theta
 * (theta^T / (w / 2, h / 2)) as the float32 bmm gives it ((x r0 + y r1) +
 * r2, each step rounded; y r1 is the row's, ry), then grid_sample's
 * unnormalisation, (g + 1) * size / 2 - 0.5 as ATen's vector kernel
 * computes it: one fused multiply-add.  Found, and checked, against torch
 * 2.14's CPU kernels (tests/test_augmix.py).  r: the 6 rescaled
 * coefficients (x row r[0..2], y row r[3..5]); sw, sh: w / 2 and h / 2 as
 * float.  One loop of lane arithmetic: the "fma" clone vectorizes it. */
FL_HOT_FMA static void
fl_tgrid_run(const float r[6], int w, int x0, int n, float ry0, float ry1, float sw, float sh, float *ix,
             float *iy)
{
    for (int k = 0; k < n; k++) {
        const float xb = fl_t_base(w, x0 + k);
        const float gx = (xb * r[0] + ry0) + r[2];
        const float gy = (xb * r[3] + ry1) + r[5];
        ix[k] = fmaf(gx + 1.0f, sw, -0.5f);
        iy[k] = fmaf(gy + 1.0f, sh, -0.5f);
    }
}

/* One output pixel o (C channels) sampled at (ix, iy) of src (w x h, row
 * stride rs): nearest (round half to even) or bilinear (the four taps'
 * weights from the floor, summed in fused multiply-adds, rounded half to
 * even), zeros outside; C is a constant in each caller. */
static inline __attribute__((always_inline)) void
fl_t_sample(const uint8_t *src, size_t rs, int w, int h, const int C, int bilinear, float ix, float iy,
            uint8_t *o)
{
    if (!bilinear) {
        const float rx = nearbyintf(ix), ry = nearbyintf(iy);
        if (rx >= 0.0f && rx < (float)w && ry >= 0.0f && ry < (float)h) {
            const uint8_t *p = src + (size_t)ry * rs + (size_t)rx * (size_t)C;
            for (int c = 0; c < C; c++)
                o[c] = p[c];
        } else {
            for (int c = 0; c < C; c++)
                o[c] = 0;
        }
        return;
    }
    const float fx = floorf(ix), fy = floorf(iy);
    const float we = ix - fx, wn = iy - fy;   /* distances from the west and north taps */
    const float e = 1.0f - we, s = 1.0f - wn;
    const float wnw = s * e, wne = s * we, wsw = wn * e, wse = wn * we;
    if (fx >= 0.0f && fx < (float)(w - 1) && fy >= 0.0f && fy < (float)(h - 1)) {   /* all four taps inside */
        const uint8_t *p = src + (size_t)fy * rs + (size_t)fx * (size_t)C, *q = p + rs;
        for (int c = 0; c < C; c++) {
            float v = fmaf((float)p[C + c], wne, (float)p[c] * wnw);
            v = fmaf((float)q[c], wsw, v);
            v = fmaf((float)q[C + c], wse, v);
            o[c] = (uint8_t)(int)nearbyintf(v);   /* in [0, 255]: a convex sum of bytes */
        }
        return;
    }
    /* far outside (or NaN, from an overflowing grid): any index whose four neighbours miss */
    const int xw = !(fx >= -2.0f) ? -2 : fx > (float)w ? w : (int)fx;
    const int yn = !(fy >= -2.0f) ? -2 : fy > (float)h ? h : (int)fy;
    const int in_w = xw >= 0 && xw < w, in_e = xw + 1 >= 0 && xw + 1 < w;
    const int in_n = yn >= 0 && yn < h, in_s = yn + 1 >= 0 && yn + 1 < h;
    for (int c = 0; c < C; c++) {
        const float vnw = in_n && in_w ? (float)src[(size_t)yn * rs + (size_t)xw * C + c] : 0.0f;
        const float vne = in_n && in_e ? (float)src[(size_t)yn * rs + (size_t)(xw + 1) * C + c] : 0.0f;
        const float vsw = in_s && in_w ? (float)src[(size_t)(yn + 1) * rs + (size_t)xw * C + c] : 0.0f;
        const float vse = in_s && in_e ? (float)src[(size_t)(yn + 1) * rs + (size_t)(xw + 1) * C + c] : 0.0f;
        float v = fmaf(vne, wne, vnw * wnw);
        v = fmaf(vsw, wsw, v);
        v = fmaf(vse, wse, v);
        o[c] = fl_t_clamp_u8(nearbyintf(v));
    }
}

#define FL_T_RUN 256

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#include <immintrin.h>

/* The bilinear samples of a run of n RGB output pixels, 8 at a time: the
 * lane arithmetic of fl_t_sample's inside branch (the same float
 * operations in the same order, _mm256_fmadd_ps being fmaf and the
 * conversion rounding half to even), each tap one 32-bit gather of its 3
 * bytes and the next one.  A group with a lane whose taps are not all
 * inside goes through fl_t_sample.  Reads at most one byte past the last
 * pixel of src (fl_aug_tmp_bytes' slack); needs rs * h < 2^31. */
__attribute__((target("avx2,fma"))) static void
fl_t_bilinear3_avx2(const uint8_t *src, size_t rs, int w, int h, const float *ix, const float *iy, int n,
                    uint8_t *o)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 xlim = _mm256_set1_ps((float)(w - 1)), ylim = _mm256_set1_ps((float)(h - 1));
    const __m256i vrs = _mm256_set1_epi32((int)rs), three = _mm256_set1_epi32(3), byte = _mm256_set1_epi32(0xFF);
    const int *base = (const int *)(const void *)src;
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 x = _mm256_loadu_ps(ix + k), y = _mm256_loadu_ps(iy + k);
        const __m256 fx = _mm256_floor_ps(x), fy = _mm256_floor_ps(y);
        const __m256 in = _mm256_and_ps(_mm256_and_ps(_mm256_cmp_ps(fx, zero, _CMP_GE_OQ), _mm256_cmp_ps(fx, xlim, _CMP_LT_OQ)),
                                        _mm256_and_ps(_mm256_cmp_ps(fy, zero, _CMP_GE_OQ), _mm256_cmp_ps(fy, ylim, _CMP_LT_OQ)));
        if (_mm256_movemask_ps(in) != 0xFF) {
            for (int j = k; j < k + 8; j++)
                fl_t_sample(src, rs, w, h, 3, 1, ix[j], iy[j], o + 3 * (size_t)j);
            continue;
        }
        const __m256 we = _mm256_sub_ps(x, fx), wn = _mm256_sub_ps(y, fy);
        const __m256 e = _mm256_sub_ps(one, we), s = _mm256_sub_ps(one, wn);
        const __m256 wnw = _mm256_mul_ps(s, e), wne = _mm256_mul_ps(s, we);
        const __m256 wsw = _mm256_mul_ps(wn, e), wse = _mm256_mul_ps(wn, we);
        const __m256i off = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_cvttps_epi32(fy), vrs),
                                             _mm256_mullo_epi32(_mm256_cvttps_epi32(fx), three));
        const __m256i tnw = _mm256_i32gather_epi32(base, off, 1);
        const __m256i tne = _mm256_i32gather_epi32(base, _mm256_add_epi32(off, three), 1);
        const __m256i tsw = _mm256_i32gather_epi32(base, _mm256_add_epi32(off, vrs), 1);
        const __m256i tse = _mm256_i32gather_epi32(base, _mm256_add_epi32(_mm256_add_epi32(off, vrs), three), 1);
        __m256i px = _mm256_setzero_si256();
        for (int c = 0; c < 3; c++) {
            const __m256 a = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(tnw, 8 * c), byte));
            const __m256 b = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(tne, 8 * c), byte));
            const __m256 cc = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(tsw, 8 * c), byte));
            const __m256 d = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(tse, 8 * c), byte));
            __m256 v = _mm256_fmadd_ps(b, wne, _mm256_mul_ps(a, wnw));
            v = _mm256_fmadd_ps(cc, wsw, v);
            v = _mm256_fmadd_ps(d, wse, v);
            const __m256i r = _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            px = _mm256_or_si256(px, _mm256_slli_epi32(r, 8 * c));   /* r in 0..255 */
        }
        uint32_t lanes[8];
        _mm256_storeu_si256((__m256i *)(void *)lanes, px);
        uint8_t *q = o + 3 * (size_t)k;
        for (int j = 0; j < 8; j++) {
            q[3 * j] = (uint8_t)lanes[j];
            q[3 * j + 1] = (uint8_t)(lanes[j] >> 8);
            q[3 * j + 2] = (uint8_t)(lanes[j] >> 16);
        }
    }
    for (; k < n; k++)
        fl_t_sample(src, rs, w, h, 3, 1, ix[k], iy[k], o + 3 * (size_t)k);
}
#define FL_T_HAVE_AVX2 1
#endif

/* The warp of src into img (w x h, C channels) for the inverse matrix m
 * (output pixel centre -> input), nearest or bilinear, zeros outside. */
FL_HOT_FMA static void
fl_t_warp(const uint8_t *src, uint8_t *img, int w, int h, int C, const double m[6], int interp)
{
    const float t[6] = {(float)m[0], (float)m[1], (float)m[2], (float)m[3], (float)m[4], (float)m[5]};
    const float hw = 0.5f * (float)w, hh = 0.5f * (float)h;   /* torch.tensor([0.5 * w, 0.5 * h]) */
    const float r[6] = {t[0] / hw, t[1] / hw, t[2] / hw, t[3] / hh, t[4] / hh, t[5] / hh};
    const float sw = (float)w / 2.0f, sh = (float)h / 2.0f;
    const size_t rs = (size_t)w * (size_t)C;
    const int bil = interp == FL_AUG_BILINEAR;
#ifdef FL_T_HAVE_AVX2
    const int simd = bil && C == 3 && fl_use_avx2() && __builtin_cpu_supports("fma")
                     && (uint64_t)rs * (uint64_t)h < ((uint64_t)1 << 31);
#else
    const int simd = 0;
#endif
    float ix[FL_T_RUN], iy[FL_T_RUN];
    for (int oy = 0; oy < h; oy++) {
        const float yb = fl_t_base(h, oy);
        uint8_t *out = img + (size_t)oy * rs;
        for (int x0 = 0; x0 < w; x0 += FL_T_RUN) {
            const int n = w - x0 < FL_T_RUN ? w - x0 : FL_T_RUN;
            fl_tgrid_run(r, w, x0, n, yb * r[1], yb * r[4], sw, sh, ix, iy);
            uint8_t *o = out + (size_t)x0 * (size_t)C;
            if (simd) {
#ifdef FL_T_HAVE_AVX2
                fl_t_bilinear3_avx2(src, rs, w, h, ix, iy, n, o);
#endif
            } else if (C == 3) {
                for (int k = 0; k < n; k++)
                    fl_t_sample(src, rs, w, h, 3, bil, ix[k], iy[k], o + 3 * k);
            } else {
                for (int k = 0; k < n; k++)
                    fl_t_sample(src, rs, w, h, 1, bil, ix[k], iy[k], o + k);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */

/* Contract: augment_tensor.h. */
int
fl_aug_tensor_apply(int op, double magnitude, int interp, uint8_t *img, int w, int h, int channels, uint8_t *tmp,
                    fl_err *err)
{
    const size_t npix = (size_t)w * (size_t)h, n = npix * (size_t)channels;
    switch (op) {
    case FL_AUG_T_SHEAR_X:
    case FL_AUG_T_SHEAR_Y:
    case FL_AUG_T_TRANSLATE_X:
    case FL_AUG_T_TRANSLATE_Y:
    case FL_AUG_T_ROTATE:
    case FL_AUG_T_SHEAR_X_V2:
    case FL_AUG_T_SHEAR_Y_V2:
    case FL_AUG_T_TRANSLATE_X_V2:
    case FL_AUG_T_TRANSLATE_Y_V2:
    case FL_AUG_T_ROTATE_V2: {
        if (interp != FL_AUG_NEAREST && interp != FL_AUG_BILINEAR) {
            fl_err_set(err, FL_ERR_INVALID, 0, "augment: tensor op %d: interpolation %d (the tensor kernels take "
                       "0 nearest or 1 bilinear)", op, interp);
            return -1;
        }
        const int v2 = op >= FL_AUG_T_SHEAR_X_V2;
        const int kind = v2 ? op - FL_AUG_T_SHEAR_X_V2 : op - FL_AUG_T_SHEAR_X;   /* 0..4: shx shy tx ty rot */
        void (*inverse)(double, double, double, double, double, double, double, double, double *) =
            v2 ? fl_aug_tv2_inverse_affine : fl_aug_tv_inverse_affine;
        double m[6];
        if (kind <= 1) {
            /* center=[0, 0] on a tensor: the centre offset (0 - w / 2, 0 - h / 2) */
            double deg = atan(magnitude) * fl_aug_rad2deg;
            inverse(0.0 - w * 0.5, 0.0 - h * 0.5, 0.0, 0.0, 0.0, 1.0, kind == 0 ? deg : 0.0, kind == 1 ? deg : 0.0,
                    m);
        } else if (kind <= 3) {
            double t = trunc(magnitude);   /* int(magnitude) */
            if (!(fabs(t) < 2147483648.0)) {
                fl_err_set(err, FL_ERR_INVALID, 0, "augment: tensor translate by %g pixels", magnitude);
                return -1;
            }
            inverse(0.0, 0.0, 0.0, kind == 2 ? t : 0.0, kind == 3 ? t : 0.0, 1.0, 0.0, 0.0, m);
        } else if (!v2) {
            inverse(0.0, 0.0, -magnitude, 0.0, 0.0, 1.0, 0.0, 0.0, m);
        } else {
            double ang = fl_aug_py_mod(magnitude, 360.0);
            if (ang == 0.0)
                return 0;
            const size_t rs = (size_t)w * (size_t)channels, C = (size_t)channels;
            if (ang == 180.0 || ((ang == 90.0 || ang == 270.0) && w == h)) {   /* torch.rot90, exact */
                memcpy(tmp, img, n);
                for (int y = 0; y < h; y++)
                    for (int x = 0; x < w; x++) {
                        /* rot90(k=1, dims=(-2, -1)): out[y][x] = in[x][w-1-y]; k=3: in[h-1-x][y] */
                        const uint8_t *s = ang == 180.0 ? tmp + (size_t)(h - 1 - y) * rs + (size_t)(w - 1 - x) * C
                                           : ang == 90.0 ? tmp + (size_t)x * rs + (size_t)(w - 1 - y) * C
                                                         : tmp + (size_t)(h - 1 - x) * rs + (size_t)y * C;
                        memcpy(img + (size_t)y * rs + (size_t)x * C, s, C);
                    }
                return 0;
            }
            inverse(0.0, 0.0, -ang, 0.0, 0.0, 1.0, 0.0, 0.0, m);
        }
        memcpy(tmp, img, n);
        fl_t_warp(tmp, img, w, h, channels, m, interp);
        return 0;
    }

    case FL_AUG_T_BRIGHTNESS:
    case FL_AUG_T_COLOR:
    case FL_AUG_T_COLOR_V2:
    case FL_AUG_T_CONTRAST:
    case FL_AUG_T_CONTRAST_V2:
    case FL_AUG_T_SHARPNESS:
    case FL_AUG_T_SHARPNESS_V2: {
        const double ratio = 1.0 + magnitude;
        if (!(ratio >= 0.0) || !isfinite((float)ratio) || !isfinite((float)(1.0 - ratio))) {
            fl_err_set(err, FL_ERR_INVALID, 0, "augment: tensor op %d: factor 1 + %g is negative or beyond float "
                       "range", op, magnitude);
            return -1;
        }
        const float rf = (float)ratio, qf = (float)(1.0 - ratio);
        const int v2 = op == FL_AUG_T_COLOR_V2 || op == FL_AUG_T_CONTRAST_V2 || op == FL_AUG_T_SHARPNESS_V2;
        if (op == FL_AUG_T_BRIGHTNESS) {   /* blend with black: x * ratio */
            uint8_t lut[256];
            for (int v = 0; v < 256; v++)
                lut[v] = fl_t_clamp_u8((float)v * rf);
            fl_lut_apply1(img, n, lut);
        } else if (op == FL_AUG_T_COLOR || op == FL_AUG_T_COLOR_V2) {
            if (channels == 3)   /* an L image is returned as it is */
                fl_t_color(img, npix, rf, qf, v2);
        } else if (op == FL_AUG_T_CONTRAST || op == FL_AUG_T_CONTRAST_V2) {
            const float mean = fl_t_gray_mean(img, npix, channels, v2);
            uint8_t lut[256];
            for (int v = 0; v < 256; v++)
                lut[v] = fl_t_clamp_u8(v2 ? fmaf(mean, qf, (float)v * rf) : (float)v * rf + mean * qf);
            fl_lut_apply1(img, n, lut);
        } else if (w > 2 && h > 2) {   /* smaller images are returned as they are */
            memcpy(tmp, img, n);
            fl_t_sharpness(tmp, img, w, h, channels, rf, qf, v2);
        }
        return 0;
    }

    case FL_AUG_T_AUTOCONTRAST:
    case FL_AUG_T_AUTOCONTRAST_V2:
        fl_t_autocontrast(img, npix, channels, op == FL_AUG_T_AUTOCONTRAST_V2);
        return 0;
    }
    fl_err_set(err, FL_ERR_INVALID, 0, "augment: %d is not a tensor op", op);
    return -1;
}

/* Contract: augment.h. */
void
fl_augmix_accumulate(float *acc, const uint8_t *img, size_t n, float w, int first)
{
    if (first) {
        for (size_t i = 0; i < n; i++)
            acc[i] = w * (float)img[i];
    } else {
        for (size_t i = 0; i < n; i++)
            acc[i] = acc[i] + w * (float)img[i];
    }
}

/* Contract: augment.h. */
void
fl_augmix_store(const float *acc, uint8_t *img, size_t n)
{
    for (size_t i = 0; i < n; i++)
        img[i] = fl_t_clamp_u8(acc[i]);
}

/* ------------------------------------------------------------------------ */
/* GaussianBlur (augment.h fl_gblur_*): torchvision's tensor kernel         */
/*
 * The weights follow torch 2.14's CPU kernels operation by operation (each
 * step one rounding, as the tensor ops round):
 *   torch.linspace   ATen's linspace kernel in its vectorised builds: step
 *                    = (end - start) / (steps - 1), then start + step * i for
 *                    the first half and end - step * (steps - 1 - i) for the
 *                    rest, each contracted to one fused multiply-add (the
 *                    AVX2 / AVX512 kernels are built with FMA); steps 1: start
 *   x / sigma, .pow(2), -0.5 * t, .neg()
 *                    one rounded division, product (pow 2 is x * x), product
 *   torch.exp (v1)   at::vml::vexp: MKL's vmsExp (HA) in torch's MKL builds,
 *                    handed over as fl_gblur.vexp; else SLEEF's expf_u10
 *   pdf.sum() (v1)   cascade_sum (SumKernel.cpp) on lanes-wide vectors:
 *                    fl_gb_cascade_sum
 *   pdf / sum (v1)   one rounded division per weight
 *   softmax (v2)     _vec_softmax_lastdim: the max, exp(x - max) by
 *                    Vectorized<float>::exp (SLEEF's expf_u10), the sum by
 *                    vec::reduce_all (fl_gb_reduce_add), 1 / sum, then one
 *                    rounded product per weight
 *   the 2-D kernel   k_y[a] * k_x[b], one rounded product (v1's torch.mm of
 *                    a column and a row, v2's broadcast product)
 * and the conv2d sums each output as one chain of fused multiply-adds from 0
 * over the taps, kernel rows outer, columns inner (oneDNN's depthwise
 * kernel, and its 1-channel conv; not torch's GEMM path, which it takes for
 * some small 1-channel blurs: fl_gblur_torch_gemm).  Found and checked against
 * torch 2.14.1 (tests/test_gaussian_blur.py; docs/recipes.md has the
 * counts of the exhaustive runs).
 */

/* 2^q as a float, for q in -126..127. */
static inline float
fl_gb_pow2i(int q)
{
    const uint32_t u = (uint32_t)(q + 0x7f) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* SLEEF's expf_u10 (xexpf: ATen's Vectorized<float>::exp in its AVX2 and
 * AVX512 builds, Sleef_expf8_u10 / Sleef_expf16_u10), transcribed from its
 * algorithm and constants: q = rint(d / ln 2), the reduced argument in two
 * fused steps (ln 2 split in two), a degree-6 polynomial in fused
 * multiply-adds, and the scaling by 2^q in two halves.  Equal to libtorch
 * 2.14.1's Sleef_expf8_u10avx2 on every float in [-110, 90] (checked once,
 * all 2.24e9 of them).  0 below -104 and NaN (SLEEF gives NaN for NaN; no
 * caller here passes one), infinity above 100. */
static inline float
fl_gb_sleef_expf(float d)
{
    if (!(d >= -104.0f))
        return 0.0f;
    if (d > 100.0f)
        return INFINITY;
    const int q = (int)nearbyintf(d * 1.442695040888963407359924681001892137426645954152985934135449406931f);
    float s = fmaf((float)q, -0.693145751953125f, d);
    s = fmaf((float)q, -1.428606765330187045e-06f, s);
    float u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    u = 1.0f + fmaf(s * s, u, s);
    const int q1 = (q - (q & 1)) / 2;   /* q >> 1 rounded toward minus infinity, as SLEEF's arithmetic shift */
    return u * fl_gb_pow2i(q1) * fl_gb_pow2i(q - q1);
}

/* torch.linspace(start, end, k) in float32 (the comment above). */
static void
fl_gb_linspace(double start_d, double end_d, int k, float *x)
{
    const float start = (float)start_d, end = (float)end_d;
    if (k == 1) {
        x[0] = start;
        return;
    }
    const float step = (end - start) / (float)(k - 1);
    const int half = k / 2;
    for (int i = 0; i < k; i++)
        x[i] = i < half ? fmaf(step, (float)i, start) : fmaf(-step, (float)(k - 1 - i), end);
}

/* pdf.sum(): ATen's cascade_sum of n contiguous floats on lanes-wide
 * vectors.  Fewer than `lanes` elements: row_sum of scalars (four partial
 * sums over rows of four, the leftovers into the first, then the first plus
 * the others in order).  Otherwise vectorized_inner_sum: the n / lanes
 * vectors summed the same way lane by lane (row_sum over vectors), the
 * scalar leftovers summed from 0, then the lanes added to that in order.
 * multi_row_sum's level cascade starts only after 16 rows of four vectors
 * (n >= 64 lanes), past FL_GBLUR_MAX_K, so its plain running sums are all
 * there is.  Pure. */
static float
fl_gb_cascade_sum(const float *x, int n, int lanes)
{
    if (n < lanes) {
        const int rows = n / 4;
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int i = 0; i < rows; i++)
            for (int k = 0; k < 4; k++)
                p[k] += x[4 * i + k];
        for (int i = 4 * rows; i < n; i++)
            p[0] += x[i];
        return ((p[0] + p[1]) + p[2]) + p[3];
    }
    const int nvec = n / lanes, rows = nvec / 4;
    float p[4][16];
    memset(p, 0, sizeof p);
    for (int i = 0; i < rows; i++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < lanes; l++)
                p[k][l] += x[(4 * i + k) * lanes + l];
    for (int i = 4 * rows; i < nvec; i++)
        for (int l = 0; l < lanes; l++)
            p[0][l] += x[i * lanes + l];
    for (int k = 1; k < 4; k++)
        for (int l = 0; l < lanes; l++)
            p[0][l] += p[k][l];
    float f = 0.0f;
    for (int i = nvec * lanes; i < n; i++)
        f += x[i];
    for (int l = 0; l < lanes; l++)
        f += p[0][l];
    return f;
}

/* The softmax's sum: vec::reduce_all with + on lanes-wide vectors.  Fewer
 * than `lanes` elements: lane 0 takes each in order.  Otherwise the first
 * vector, plus each further whole vector, plus the leftovers in the first
 * lanes, then the halving tree of VecReduceAllSIMD (lane i += lane i + half,
 * half = lanes / 2 .. 1).  Pure. */
static float
fl_gb_reduce_add(const float *e, int n, int lanes)
{
    if (n < lanes) {
        float a = e[0];
        for (int i = 1; i < n; i++)
            a = a + e[i];
        return a;
    }
    float v[16];
    memcpy(v, e, (size_t)lanes * sizeof(float));
    int d = lanes;
    for (; d < n - n % lanes; d += lanes)
        for (int l = 0; l < lanes; l++)
            v[l] = v[l] + e[d + l];
    for (int l = 0; l < n - d; l++)
        v[l] = v[l] + e[d + l];
    for (int half = lanes / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++)
            v[l] = v[l] + v[l + half];
    return v[0];
}

/* The checks fl_gblur_kernel1d shares with the op.  Returns 0, or -1 with
 * err filled. */
static int
fl_gb_check(const fl_gblur *g, int k, float sigma, fl_err *err)
{
    if (g == NULL || (g->lanes != 8 && g->lanes != 16)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "gaussian blur: lanes %d (torch's vector width: 8 or 16)",
                   g ? g->lanes : 0);
        return -1;
    }
    if (k < 1 || k > FL_GBLUR_MAX_K || k % 2 == 0) {
        fl_err_set(err, FL_ERR_INVALID, 0, "gaussian blur: kernel side %d is not odd in 1..%d", k, FL_GBLUR_MAX_K);
        return -1;
    }
    if (!(sigma >= 1e-6f && sigma <= 1e6f)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "gaussian blur: sigma %g is not in [1e-6, 1e6]", (double)sigma);
        return -1;
    }
    return 0;
}

/* fl_gblur_kernel1d's body, cloned for FMA (fmaf inline; the same values
 * either way).  Static: an exported function with target_clones is an ifunc
 * that other units reach through the GOT, and under TSan the dynamic loader
 * then jumps to an unrelocated address while loading the module. */
FL_HOT_FMA static int
fl_gb_kernel1d(const fl_gblur *g, int k, float sigma, float *out, fl_err *err)
{
    if (fl_gb_check(g, k, sigma, err) < 0)
        return -1;
    if (out == NULL) {
        fl_err_set(err, FL_ERR_INVALID, 0, "gaussian blur: no output");
        return -1;
    }
    /* 64-byte aligned, as torch's tensors: an exp that peels to alignment sees what torch's sees */
    _Alignas(64) float x[FL_GBLUR_MAX_K + 1];
    _Alignas(64) float e[FL_GBLUR_MAX_K + 1];
    if (!g->v2) {
        fl_gb_linspace(-(k - 1) * 0.5, (k - 1) * 0.5, k, x);
        for (int i = 0; i < k; i++) {
            const float t = x[i] / sigma;
            x[i] = -0.5f * (t * t);
        }
        if (g->vexp != NULL) {
            g->vexp(g->vexp_ctx, x, e, k);
        } else {
            for (int i = 0; i < k; i++)
                e[i] = fl_gb_sleef_expf(x[i]);
        }
        const float sum = fl_gb_cascade_sum(e, k, g->lanes);
        for (int i = 0; i < k; i++)
            out[i] = e[i] / sum;
        return 0;
    }
    const double lim = (k - 1) / (2.0 * sqrt(2.0));
    fl_gb_linspace(-lim, lim, k, x);
    for (int i = 0; i < k; i++) {
        const float t = x[i] / sigma;
        x[i] = -(t * t);
    }
    float m = x[0];
    for (int i = 1; i < k; i++)
        m = x[i] > m ? x[i] : m;
    for (int i = 0; i < k; i++)
        e[i] = fl_gb_sleef_expf(x[i] - m);
    const float r = 1.0f / fl_gb_reduce_add(e, k, g->lanes);
    for (int i = 0; i < k; i++)
        out[i] = e[i] * r;
    return 0;
}

/* Contract: augment.h. */
int
fl_gblur_kernel1d(const fl_gblur *g, int k, float sigma, float *out, fl_err *err)
{
    return fl_gb_kernel1d(g, k, sigma, out, err);
}

/* Floats in one padded row of the ring: the reflect-padded row (w + 2 (kx /
 * 2)) and room for the last block of 32 outputs (64 in the estimate's
 * horizontal pass) to read past it (zeros). */
static size_t
fl_gb_rowlen(int w, int kx)
{
    return ((((size_t)w + 63) & ~(size_t)63) + (size_t)kx + 7) & ~(size_t)7;
}

/* A block of 8 outputs the estimate could not decide: output row y,
 * columns xb.. */
typedef struct {
    int y, xb;
} fl_gb_pend;

/* Rows the ring of the estimate's path holds beyond the ky an output row
 * needs: undecided blocks wait up to that many rows for a group to fill. */
#define FL_GB_DEFER 8
/* Blocks summed side by side by fl_gb_exact_avx2. */
#define FL_GB_GROUP 8

/* Floats in one row of the separable estimate's ring (fl_gb_fast_channel):
 * w rounded up to the 64 outputs its blocks take. */
static size_t
fl_gb_hrowlen(int w)
{
    return ((size_t)w + 63) & ~(size_t)63;
}

/* Offsets in the op's scratch: the image copy at 0, then (64-byte steps)
 * the 2-D kernel and the ring of ky + FL_GB_DEFER padded rows (the direct
 * sum uses ky + 1 of them: two output rows' worth), then the estimate's ky
 * rows of its horizontal pass (fl_gb_hrowlen floats each) and its list of
 * undecided blocks (FL_GB_GROUP + w / 8 + 1 of them).  Returns the total,
 * or 0 on overflow. */
static size_t
fl_gb_layout(int w, int h, int channels, int kx, int ky, size_t *kern_off, size_t *ring_off)
{
    const size_t uw = (size_t)w, uh = (size_t)h, uc = (size_t)channels;
    if (uw > SIZE_MAX / uh || uw * uh > SIZE_MAX / uc)
        return 0;
    const size_t img = uw * uh * uc;
    if (img > SIZE_MAX - 64)
        return 0;
    const size_t koff = (img + 63) & ~(size_t)63;
    const size_t kbytes = (size_t)kx * (size_t)ky * sizeof(float);
    if (koff > SIZE_MAX - kbytes - 64)
        return 0;
    const size_t roff = (koff + kbytes + 63) & ~(size_t)63;
    const size_t rl = fl_gb_rowlen(w, kx), nrows = (size_t)ky + FL_GB_DEFER, hl = fl_gb_hrowlen(w);
    const size_t pend = ((size_t)FL_GB_GROUP + uw / 8 + 1) * sizeof(fl_gb_pend);
    if (rl + hl > (SIZE_MAX - roff - pend) / sizeof(float) / nrows)
        return 0;
    *kern_off = koff;
    *ring_off = roff;
    return roff + (rl * nrows + hl * (size_t)ky) * sizeof(float) + pend;
}

/* Whether w x h x channels and kx x ky are sizes the op takes. */
static int
fl_gb_sizes_ok(int w, int h, int channels, int kx, int ky)
{
    return w >= 1 && h >= 1 && w <= FL_MAX_DIM && h <= FL_MAX_DIM && (channels == 1 || channels == 3) && kx >= 1
           && ky >= 1 && kx <= FL_GBLUR_MAX_K && ky <= FL_GBLUR_MAX_K && kx % 2 == 1 && ky % 2 == 1 && kx / 2 < w
           && ky / 2 < h;
}

/* Contract: augment.h.  ConvParams::use_mkldnn for a float CPU input of
 * one image: groups > 1, or both kernel sides over 3, or more than 20480
 * input elements (the padded image), when the kernel is not 1 x 1 (a 1 x 1
 * kernel single-threaded also goes to the GEMM path, but a single tap's
 * product is the same either way). */
int
fl_gblur_torch_gemm(int w, int h, int channels, int kx, int ky)
{
    if (channels != 1 || (kx == 1 && ky == 1) || (kx > 3 && ky > 3))
        return 0;
    const double padded = ((double)w + 2.0 * (kx / 2)) * ((double)h + 2.0 * (ky / 2));
    return padded <= 20480.0;
}

/* Contract: augment.h. */
size_t
fl_gblur_tmp_bytes(int w, int h, int channels, int kx, int ky)
{
    size_t koff, roff;
    if (!fl_gb_sizes_ok(w, h, channels, kx, ky))
        return 0;
    return fl_gb_layout(w, h, channels, kx, ky, &koff, &roff);
}

/* torch's reflect padding: the source index of padded index i (i - pad in
 * -n < i < 2n - 1). */
static inline int
fl_gb_reflect(int i, int n)
{
    return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i;
}

/* Padded row j of channel c of src (w x h x C) as floats into fr: source
 * row reflect(j - py), columns reflected px each side, then zeros to rowlen. */
static void
fl_gb_fill_row(const uint8_t *src, int w, int h, int C, int c, int px, int py, int j, float *fr, size_t rowlen)
{
    const size_t cs = (size_t)C;
    const uint8_t *s = src + (size_t)fl_gb_reflect(j - py, h) * (size_t)w * cs + (size_t)c;
    for (int i = 0; i < px; i++)
        fr[i] = (float)s[(size_t)(px - i) * cs];
    for (int x = 0; x < w; x++)
        fr[px + x] = (float)s[(size_t)x * cs];
    for (int x = 0; x < px; x++)
        fr[px + w + x] = (float)s[(size_t)(w - 2 - x) * cs];
    for (size_t i = (size_t)w + 2 * (size_t)px; i < rowlen; i++)
        fr[i] = 0.0f;
}

/* Output row of one channel: out[x * C] for x < w from the ky padded rows
 * rows[0..ky), each output the fused chain over K (ky x kx, rows outer),
 * rounded half to even.  Blocks of 8 outputs (the last may read past w into
 * the rows' zeros; only w are stored). */
FL_HOT_FMA static void
fl_gb_row(const float *const *rows, const float *K, int kx, int ky, int w, uint8_t *out, int C)
{
    for (int x0 = 0; x0 < w; x0 += 8) {
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int a = 0; a < ky; a++) {
            const float *r = rows[a] + x0, *ka = K + (size_t)a * (size_t)kx;
            for (int b = 0; b < kx; b++) {
                const float wv = ka[b];
                for (int l = 0; l < 8; l++)
                    acc[l] = fmaf(r[b + l], wv, acc[l]);
            }
        }
        const int n = w - x0 < 8 ? w - x0 : 8;
        for (int l = 0; l < n; l++)
            out[(size_t)(x0 + l) * (size_t)C] = fl_t_clamp_u8(nearbyintf(acc[l]));
    }
}

#ifdef FL_T_HAVE_AVX2
/* fl_gb_row for two output rows at once (out0: row y, out1: row y + 1),
 * from the ky + 1 padded rows rows[0..ky] (row y's taps are rows[0..ky),
 * row y + 1's rows[1..ky]): each vector loaded from padded row r feeds both
 * outputs, row y with kernel row r and row y + 1 with kernel row r - 1, so
 * every output still takes its taps in torchvision's order (kernel rows
 * outer, columns inner) as one fused chain from 0 (_mm256_fmadd_ps is fmaf
 * lane by lane), and a load serves two FMAs.  N (8 or 32) outputs a row at
 * a time from column x0: 2 N / 8 accumulators; rounded half to even
 * (cvtps_epi32 under the default rounding mode, as nearbyintf), clamped as
 * fl_t_clamp_u8; only outputs below w are stored.  Reads up to N - 1
 * floats past x0 + kx - 1 in each row (fl_gb_rowlen's room). */
#define FL_GB_BLOCK2(N)                                                                                           \
    do {                                                                                                          \
        __m256 a0[(N) / 8], a1[(N) / 8];                                                                          \
        for (int j = 0; j < (N) / 8; j++)                                                                         \
            a0[j] = a1[j] = _mm256_setzero_ps();                                                                  \
        for (int b = 0; b < kx; b++) {   /* padded row 0: row y's kernel row 0 alone */                           \
            const __m256 w0 = _mm256_broadcast_ss(K + b);                                                         \
            for (int j = 0; j < (N) / 8; j++)                                                                     \
                a0[j] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[0] + x0 + b + 8 * j), w0, a0[j]);                    \
        }                                                                                                         \
        for (int r = 1; r < ky; r++) {                                                                            \
            const float *q = rows[r] + x0, *k0 = K + (size_t)r * (size_t)kx, *k1 = k0 - kx;                       \
            for (int b = 0; b < kx; b++) {                                                                        \
                const __m256 w0 = _mm256_broadcast_ss(k0 + b), w1 = _mm256_broadcast_ss(k1 + b);                  \
                for (int j = 0; j < (N) / 8; j++) {                                                               \
                    const __m256 x = _mm256_loadu_ps(q + b + 8 * j);                                              \
                    a0[j] = _mm256_fmadd_ps(x, w0, a0[j]);                                                        \
                    a1[j] = _mm256_fmadd_ps(x, w1, a1[j]);                                                        \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        {   /* padded row ky: row y + 1's last kernel row alone */                                                \
            const float *k1 = K + (size_t)(ky - 1) * (size_t)kx;                                                  \
            for (int b = 0; b < kx; b++) {                                                                        \
                const __m256 w1 = _mm256_broadcast_ss(k1 + b);                                                    \
                for (int j = 0; j < (N) / 8; j++)                                                                 \
                    a1[j] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[ky] + x0 + b + 8 * j), w1, a1[j]);               \
            }                                                                                                     \
        }                                                                                                         \
        int32_t v0[N], v1[N];                                                                                     \
        for (int j = 0; j < (N) / 8; j++) {                                                                       \
            _mm256_storeu_si256((__m256i *)(void *)(v0 + 8 * j), _mm256_cvtps_epi32(a0[j]));                      \
            _mm256_storeu_si256((__m256i *)(void *)(v1 + 8 * j), _mm256_cvtps_epi32(a1[j]));                      \
        }                                                                                                         \
        const int n = w - x0 < (N) ? w - x0 : (N);                                                                \
        for (int l = 0; l < n; l++) {                                                                             \
            out0[(size_t)(x0 + l) * (size_t)C] = (uint8_t)(v0[l] < 0 ? 0 : v0[l] > 255 ? 255 : v0[l]);            \
            out1[(size_t)(x0 + l) * (size_t)C] = (uint8_t)(v1[l] < 0 ? 0 : v1[l] > 255 ? 255 : v1[l]);            \
        }                                                                                                         \
    } while (0)

__attribute__((target("avx2,fma"))) static void
fl_gb_row2_avx2(const float *const *rows, const float *K, int kx, int ky, int w, uint8_t *out0, uint8_t *out1,
                int C)
{
    int x0 = 0;
    for (; w - x0 >= 24; x0 += 32)   /* 32 a row at a time while at least 24 of them are stored */
        FL_GB_BLOCK2(32);
    for (; x0 < w; x0 += 8)
        FL_GB_BLOCK2(8);
}
#undef FL_GB_BLOCK2
#endif

/* The separable estimate and where it decides the byte.
 *
 * torch's value T of an output is the fused chain over the kx * ky taps
 * (fl_gb_row).  The estimate E is the same blur done separably, also in
 * float fused chains: each padded row through the 1-D kernel k_x (kx taps),
 * then those rows through k_y (ky taps): kx + ky taps an output instead of
 * kx * ky.  Every partial sum of either is below 256 (bytes <= 255 times
 * non-negative weights summing to 1 within a few float ulps), where a
 * float's half ulp is at most 2^-17; torch's partial sums only grow (each
 * adds a non-negative product; rounding is monotone), so each of its
 * roundings is at most a half ulp of T's binade, 2^(e-24) for T in
 * [2^e, 2^(e+1)).  So:
 *   |T - S| <= kx ky 2^(e-24)     S: the exact sum with the 2-D weights
 *   |E - S'| <= (kx + ky) 2^-17   S': the exact sum with k_y[a] k_x[b]
 *                                 unrounded (k_y's rows carry k_x's error)
 *   |S - S'| <= 255 2^-24 (sum of the weights) < 2^-16
 * so |T - E| <= kx ky 2^(e-24) + (kx + ky) 2^-17 + 2^-16 =: B, with 2^e
 * taken as the binade of E + 1/16 (T <= E + B < E + 1/16).  When E is
 * farther than 2B from every half-integer, no half-integer lies between E
 * and T and both round to the same integer (and the same byte after the
 * clamp): E's byte is torch's.  The blocks of 8 outputs with any value
 * nearer than that are summed as torch sums them (fl_gb_exact_avx2).  For
 * 23 x 23 and T in [64, 128), 2B = 0.0048; on a photograph 8% of the
 * blocks go to the exact sum.  Kernels whose 2B at the top binade would
 * pass FL_GB_FAST_MAX_MARGIN (about 50 x 50 taps) keep the direct sum for
 * every output. */
#define FL_GB_FAST_MAX_MARGIN 0.04

/* The margin's two parts: *mk, the factor of the kx ky term (2 kx ky
 * 2^-24 times the binade's power of two 2^e of T: a float's half ulp below
 * 2^(e+1) is 2^(e-24)), and *mfix, 2 ((kx + ky) 2^-17 + 2^-16).  Returns
 * 0, or -1 when the whole margin at the top binade (2^7) would pass
 * FL_GB_FAST_MAX_MARGIN: the estimate is not worth it. */
static int
fl_gb_margin(int kx, int ky, float *mk, float *mfix)
{
    const double k2 = 2.0 * (double)kx * (double)ky * 0x1p-24;
    const double fix = 2.0 * (((double)kx + (double)ky) * 0x1p-17 + 0x1p-16);
    if (k2 * 128.0 + fix > FL_GB_FAST_MAX_MARGIN)
        return -1;
    *mk = (float)k2;
    *mfix = (float)fix;
    return 0;
}

#ifdef FL_T_HAVE_AVX2
/* The horizontal pass of the estimate: out[x] for x < n (a multiple of 64)
 * = the fused chain over b of p[x + b] * k[b], eight chains side by side
 * (the FMA latency).  Reads p[0 .. n + kx - 1). */
__attribute__((target("avx2,fma"))) static void
fl_gb_hpass_avx2(const float *p, const float *k, int kx, int n, float *out)
{
    for (int x0 = 0; x0 < n; x0 += 64) {
        __m256 a[8];
        for (int j = 0; j < 8; j++)
            a[j] = _mm256_setzero_ps();
        const float *q = p + x0;
        for (int b = 0; b < kx; b++) {
            const __m256 wv = _mm256_broadcast_ss(k + b);
            for (int j = 0; j < 8; j++)
                a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + b + 8 * j), wv, a[j]);
        }
        for (int j = 0; j < 8; j++)
            _mm256_storeu_ps(out + x0 + 8 * j, a[j]);
    }
}

/* Rounded, clamped bytes of v's first n (<= 8) lanes into out[l * C]. */
__attribute__((target("avx2,fma"))) static inline void
fl_gb_store8(__m256i r, int n, uint8_t *out, int C)
{
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)(void *)v, r);
    for (int l = 0; l < n; l++)
        out[(size_t)l * (size_t)C] = (uint8_t)(v[l] < 0 ? 0 : v[l] > 255 ? 255 : v[l]);
}

/* The FL_GB_GROUP blocks pd[] (a block may repeat: it is stored twice, the
 * same bytes) of channel c as torch sums them (fl_gb_row's chain; eight
 * independent chains side by side cover the FMA latency), from the padded
 * rows in ring (row j in slot j % slots, rowlen floats each: rows pd[i].y
 * .. pd[i].y + ky - 1 must be there); into img (w x h x C); lanes past w
 * are not stored. */
__attribute__((target("avx2,fma"))) static void
fl_gb_exact_avx2(const float *ring, size_t rowlen, int slots, const float *K, int kx, int ky, const fl_gb_pend *pd,
                 int w, uint8_t *img, int C, int c)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int a = 0; a < ky; a++) {
        const float *ka = K + (size_t)a * (size_t)kx, *r[FL_GB_GROUP];
        for (int i = 0; i < FL_GB_GROUP; i++)
            r[i] = ring + (size_t)((pd[i].y + a) % slots) * rowlen + pd[i].xb;
        for (int b = 0; b < kx; b++) {
            const __m256 wv = _mm256_broadcast_ss(ka + b);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(r[0] + b), wv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(r[1] + b), wv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(r[2] + b), wv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(r[3] + b), wv, a3);
            a4 = _mm256_fmadd_ps(_mm256_loadu_ps(r[4] + b), wv, a4);
            a5 = _mm256_fmadd_ps(_mm256_loadu_ps(r[5] + b), wv, a5);
            a6 = _mm256_fmadd_ps(_mm256_loadu_ps(r[6] + b), wv, a6);
            a7 = _mm256_fmadd_ps(_mm256_loadu_ps(r[7] + b), wv, a7);
        }
    }
    const __m256 acc[FL_GB_GROUP] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int i = 0; i < FL_GB_GROUP; i++)
        fl_gb_store8(_mm256_cvtps_epi32(acc[i]), w - pd[i].xb < 8 ? w - pd[i].xb : 8,
                     img + ((size_t)pd[i].y * (size_t)w + (size_t)pd[i].xb) * (size_t)C + (size_t)c, C);
}

/* Output row y of channel c from the estimate: hrows[a] the horizontal pass
 * of padded row y + a (fl_gb_hrowlen(w) floats: every 32-output block
 * below w is there).  Each value's margin is fl_gb_margin's 2B with the
 * kx ky term's 2^-17 made the half ulp of the binade of E + 1/16, which
 * holds T (mk times that binade's power of two), plus mfix.  Decided blocks are stored into img; the others are
 * appended to pd[*np] (room for w / 8 + 1 more). */
__attribute__((target("avx2,fma"))) static void
fl_gb_vrow_avx2(const float *const *hrows, const float *k1y, int ky, int w, float mk, float mfix, int y,
                uint8_t *img, int C, int c, fl_gb_pend *pd, int *np)
{
    const __m256 half = _mm256_set1_ps(0.5f), vmk = _mm256_set1_ps(mk), vfix = _mm256_set1_ps(mfix);
    const __m256 up = _mm256_set1_ps(0.0625f);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 expm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
    uint8_t *out = img + (size_t)y * (size_t)w * (size_t)C + (size_t)c;
    for (int x0 = 0; x0 < w; x0 += 32) {
        __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
        for (int a = 0; a < ky; a++) {
            const __m256 wv = _mm256_broadcast_ss(k1y + a);
            const float *hr = hrows[a] + x0;
            e0 = _mm256_fmadd_ps(_mm256_loadu_ps(hr), wv, e0);
            e1 = _mm256_fmadd_ps(_mm256_loadu_ps(hr + 8), wv, e1);
            e2 = _mm256_fmadd_ps(_mm256_loadu_ps(hr + 16), wv, e2);
            e3 = _mm256_fmadd_ps(_mm256_loadu_ps(hr + 24), wv, e3);
        }
        const __m256 e[4] = {e0, e1, e2, e3};
        for (int j = 0; j < 4; j++) {
            const int xb = x0 + 8 * j;
            if (xb >= w)
                break;
            const int n = w - xb < 8 ? w - xb : 8;
            const __m256i r = _mm256_cvtps_epi32(e[j]);   /* nearest, ties to even: nearbyintf */
            const __m256 d = _mm256_and_ps(_mm256_sub_ps(e[j], _mm256_cvtepi32_ps(r)), absm);
            /* the binade's power of two: |E| + 1/16 with its mantissa cleared */
            const __m256 p2 = _mm256_and_ps(_mm256_add_ps(_mm256_and_ps(e[j], absm), up), expm);
            const __m256 lim = _mm256_sub_ps(half, _mm256_fmadd_ps(p2, vmk, vfix));
            const int near = _mm256_movemask_ps(_mm256_cmp_ps(d, lim, _CMP_GT_OQ)) & ((1 << n) - 1);
            if (near) {
                pd[*np].y = y;
                pd[(*np)++].xb = xb;
            } else {
                fl_gb_store8(r, n, out + (size_t)xb * (size_t)C, C);
            }
        }
    }
}

/* The undecided blocks pd[0..np), in groups (the last one padded with
 * repeats of its first block). */
static void
fl_gb_flush(const float *ring, size_t rowlen, int slots, const float *K, int kx, int ky, fl_gb_pend *pd, int np,
            int w, uint8_t *img, int C, int c)
{
    for (int i = 0; i < np; i += FL_GB_GROUP) {
        fl_gb_pend g[FL_GB_GROUP];
        for (int k = 0; k < FL_GB_GROUP; k++)
            g[k] = pd[i + k < np ? i + k : i];
        fl_gb_exact_avx2(ring, rowlen, slots, K, kx, ky, g, w, img, C, c);
    }
}

/* Channel c of the blur by the estimate (the comment above): padded rows
 * into the ring (ky + FL_GB_DEFER slots) as fl_gblur_apply fills them, each
 * one's horizontal pass into hring (ky rows of hl floats), each output row
 * from those; the undecided blocks pend (pd: room for FL_GB_DEFER + 1 rows'
 * blocks) until a group is full or their rows would leave the ring. */
static void
fl_gb_fast_channel(const uint8_t *src, uint8_t *img, int w, int h, int C, int c, int kx, int ky,
                   const float *k1x, const float *k1y, const float *K, float *ring, size_t rowlen, float *hring,
                   float mk, float mfix, fl_gb_pend *pd)
{
    const int px = kx / 2, py = ky / 2, slots = ky + FL_GB_DEFER;
    const size_t hl = fl_gb_hrowlen(w);
    const float *hrows[FL_GBLUR_MAX_K];
    int filled = 0, np = 0;
    for (int y = 0; y < h; y++) {
        /* filling row y + ky - 1 overwrites row y + ky - 1 - slots = y - FL_GB_DEFER - 1: the blocks
           of output rows up to y - FL_GB_DEFER - 1 (and any full group) are summed before */
        if (np && pd[0].y < y - FL_GB_DEFER) {
            fl_gb_flush(ring, rowlen, slots, K, kx, ky, pd, np, w, img, C, c);
            np = 0;
        }
        for (; filled < y + ky; filled++) {
            float *pr = ring + (size_t)(filled % slots) * rowlen;
            fl_gb_fill_row(src, w, h, C, c, px, py, filled, pr, rowlen);
            fl_gb_hpass_avx2(pr, k1x, kx, (int)hl, hring + (size_t)(filled % ky) * hl);
        }
        for (int a = 0; a < ky; a++)
            hrows[a] = hring + (size_t)((y + a) % ky) * hl;
        fl_gb_vrow_avx2(hrows, k1y, ky, w, mk, mfix, y, img, C, c, pd, &np);
        if (np >= FL_GB_GROUP) {   /* the whole groups now, the rest waits */
            const int whole = np - np % FL_GB_GROUP;
            fl_gb_flush(ring, rowlen, slots, K, kx, ky, pd, whole, w, img, C, c);
            memmove(pd, pd + whole, (size_t)(np - whole) * sizeof *pd);
            np -= whole;
        }
    }
    if (np)
        fl_gb_flush(ring, rowlen, slots, K, kx, ky, pd, np, w, img, C, c);
}
#endif

/* Contract: augment.h. */
int
fl_gblur_apply(const fl_gblur *g, float sigma, uint8_t *img, int w, int h, int channels, uint8_t *tmp, fl_err *err)
{
    if (fl_gb_check(g, g ? g->kx : 0, sigma, err) < 0 || fl_gb_check(g, g->ky, sigma, err) < 0)
        return -1;
    if (img == NULL || tmp == NULL || !fl_gb_sizes_ok(w, h, channels, g->kx, g->ky)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "gaussian blur: a %d x %d kernel on a %d x %d image of %d channels "
                   "(the padding k / 2 must be below the side; channels 1 or 3)%s", g->kx, g->ky, w, h, channels,
                   img == NULL || tmp == NULL ? ", or no image / scratch" : "");
        return -1;
    }
    size_t koff, roff;
    if (fl_gb_layout(w, h, channels, g->kx, g->ky, &koff, &roff) == 0) {
        fl_err_set(err, FL_ERR_INVALID, 0, "gaussian blur: a %d x %d image's scratch overflows", w, h);
        return -1;
    }
    const int kx = g->kx, ky = g->ky, px = kx / 2, py = ky / 2, C = channels;
    float k1x[FL_GBLUR_MAX_K], k1y[FL_GBLUR_MAX_K];
    if (fl_gblur_kernel1d(g, kx, sigma, k1x, err) < 0)
        return -1;
    if (ky == kx)
        memcpy(k1y, k1x, (size_t)kx * sizeof(float));
    else if (fl_gblur_kernel1d(g, ky, sigma, k1y, err) < 0)
        return -1;
    float *K = (float *)(void *)(tmp + koff), *ring = (float *)(void *)(tmp + roff);
    for (int a = 0; a < ky; a++)
        for (int b = 0; b < kx; b++)
            K[(size_t)a * (size_t)kx + (size_t)b] = k1y[a] * k1x[b];
    const size_t n = (size_t)w * (size_t)h * (size_t)C, rowlen = fl_gb_rowlen(w, kx);
    memcpy(tmp, img, n);
#ifdef FL_T_HAVE_AVX2
    const int simd = fl_use_avx2() && __builtin_cpu_supports("fma");
#else
    const int simd = 0;
#endif
#ifdef FL_T_HAVE_AVX2
    float mk, mfix;
    if (simd && fl_gb_margin(kx, ky, &mk, &mfix) == 0) {
        float *hring = ring + (size_t)(ky + FL_GB_DEFER) * rowlen;
        for (int c = 0; c < C; c++)
            fl_gb_fast_channel(tmp, img, w, h, C, c, kx, ky, k1x, k1y, K, ring, rowlen, hring, mk, mfix,
                               (fl_gb_pend *)(void *)(hring + (size_t)ky * fl_gb_hrowlen(w)));
        return 0;
    }
#endif
    const float *rows[FL_GBLUR_MAX_K + 1];
    const int slots = ky + 1;
    for (int c = 0; c < C; c++) {
        int filled = 0;   /* padded rows 0..filled-1 have been converted; row j sits in ring slot j % slots */
        for (int y = 0; y < h;) {
            const int two = simd && y + 1 < h;   /* the AVX2 kernel takes two output rows a pass */
            for (; filled < y + ky + two; filled++)
                fl_gb_fill_row(tmp, w, h, C, c, px, py, filled, ring + (size_t)(filled % slots) * rowlen, rowlen);
            for (int a = 0; a < ky + two; a++)
                rows[a] = ring + (size_t)((y + a) % slots) * rowlen;
            uint8_t *out = img + (size_t)y * (size_t)w * (size_t)C + (size_t)c;
#ifdef FL_T_HAVE_AVX2
            if (two) {
                fl_gb_row2_avx2(rows, K, kx, ky, w, out, out + (size_t)w * (size_t)C, C);
                y += 2;
                continue;
            }
#endif
            fl_gb_row(rows, K, kx, ky, w, out, C);
            y++;
        }
    }
    return 0;
}
