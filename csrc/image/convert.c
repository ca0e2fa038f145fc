/* convert.c: pixel value conversion, the one responsibility of this unit:
 * Pillow's convert("L") of RGB rows, and the last step of fl_render, which
 * turns finished uint8 rows into output rows of the spec's dtype (uint8,
 * float16, bfloat16, float32), with ToTensor / ToDtype scaling and
 * Normalize, in CHW or HWC layout.  Interface: imgops_internal.h.
 *
 * Dtype conversion and Normalize go through a per-channel 256-entry table
 * built with torch's own float32 operations, so every output is one load.
 *
 * No Python, no GIL: caller-owned memory only, nothing allocated here.
 */
#include "image/imgops.h"
#include "image/imgops_internal.h"
#include "image/resample.h"   /* fl_merge3_avx2 */

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Channel conversion                                                       */
/* ------------------------------------------------------------------------ */

/* Contract: imgops_internal.h. */
void
fl_rgb_to_luma(const uint8_t *src, size_t stride, int w, int h, uint8_t *dst)
{
    for (int y = 0; y < h; y++) {
        const uint8_t *s = src + (size_t)y * stride;
        uint8_t *d = dst + (size_t)y * w;
        for (int x = 0; x < w; x++, s += 3)   /* Pillow's convert("L"): ITU-R 601-2 luma, 16-bit fixed point */
            d[x] = (uint8_t)((s[0] * 19595u + s[1] * 38470u + s[2] * 7471u + 0x8000u) >> 16);
    }
}

/* ------------------------------------------------------------------------ */
/* Output tables and dtype conversion                                       */
/* ------------------------------------------------------------------------ */

/* The IEEE bits of a float (no aliasing games).  Pure. */
static uint32_t
fl_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* float32 -> IEEE binary16 bits, round to nearest even (as torch's .to). */
static uint16_t
fl_f32_to_f16(float f)
{
    uint32_t x = fl_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)
        return sign | 0x7e00u;                   /* NaN */
    if (x >= 0x477ff000u)
        return sign | 0x7c00u;                   /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {                       /* below 2^-14: subnormal half */
        /* value * 2^24 is exact in float; rint is round-half-even */
        float m = rintf(fabsf(f) * 16777216.0f);
        return sign | (uint16_t)m;               /* m == 1024 is the smallest normal: right bits */
    }
    uint32_t h = (x >> 13) - ((uint32_t)(127 - 15) << 10);
    uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return sign | (uint16_t)h;
}

/* float32 -> bfloat16 bits, round to nearest even (as torch's .to). */
static uint16_t
fl_f32_to_bf16(float f)
{
    uint32_t x = fl_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0u;
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* The float32 value torch computes for uint8 v on channel c. */
static float
fl_value_f32(const fl_tspec *t, int c, int v)
{
    float x = (float)v;
    if (t->scale_to_unit == FL_SCALE_DIV)
        x = x / 255.0f;
    else if (t->scale_to_unit == FL_SCALE_MUL)
        x = x * (float)(1.0 / 255.0);
    if (t->normalize)
        x = (x - t->mean[c]) / t->std[c];
    return x;
}

/* ------------------------------------------------------------------------ */
/* Row emitters: one finished uint8 row in output order, planar (wc planes  */
/* of out_w bytes at stride ps) -> output row oy through the table.         */
/* ------------------------------------------------------------------------ */

/* Three planes of n bytes -> n interleaved pixels at d (d does not alias
 * them).  Pure. */
static void
fl_merge3(const uint8_t *restrict s0, const uint8_t *restrict s1, const uint8_t *restrict s2, uint8_t *restrict d,
          int n)
{
#ifdef FL_X86_SIMD
    if (fl_use_avx2()) {
        fl_merge3_avx2(s0, s1, s2, d, n);
        return;
    }
#endif
    for (int x = 0; x < n; x++) {
        d[3 * x] = s0[x];
        d[3 * x + 1] = s1[x];
        d[3 * x + 2] = s2[x];
    }
}

/* One row of channel c as float32 through its table l (256 floats, built
 * by fl_value_f32): d[x] = l[s[x]].  A table load per element beats the
 * vectorized arithmetic (two divisions an element) where division is slow
 * (2.9 vs 1.6 cycles an element on AMD Zen 1).  On AVX2 machines the
 * 32-byte aligned part of the row is written with non-temporal stores: a
 * batch of float samples is far larger than the caches, so the rows go
 * straight to memory without first reading the lines they replace; the
 * caller makes them visible with fl_convert_fence before publishing the
 * sample.  No GIL needed; pure apart from the weakly ordered stores. */
#ifdef FL_X86_SIMD
#include <immintrin.h>

FL_AVX2 static void
fl_f32_lut_row_avx2(const float *restrict l, const uint8_t *restrict s, float *restrict d, int n)
{
    int x = 0;
    for (; x < n && ((uintptr_t)(d + x) & 31); x++)
        d[x] = l[s[x]];
    for (; x + 8 <= n; x += 8)
        _mm256_stream_ps(d + x, _mm256_setr_ps(l[s[x]], l[s[x + 1]], l[s[x + 2]], l[s[x + 3]], l[s[x + 4]],
                                               l[s[x + 5]], l[s[x + 6]], l[s[x + 7]]));
    for (; x < n; x++)
        d[x] = l[s[x]];
}
#endif

/* Contract: imgops_internal.h. */
void
fl_convert_fence(void)
{
#ifdef FL_X86_SIMD
    _mm_sfence();
#endif
}

FL_HOT static void
fl_f32_lut_row(const float *restrict l, const uint8_t *restrict s, float *restrict d, int n)
{
#ifdef FL_X86_SIMD
    if (fl_use_avx2()) {
        fl_f32_lut_row_avx2(l, s, d, n);
        return;
    }
#endif
    for (int x = 0; x < n; x++)
        d[x] = l[s[x]];
}

#define FL_DEFINE_EMIT(NAME, T)                                                                     \
    FL_HOT static void NAME(const fl_tspec *t, const void *lutv, const uint8_t *row, size_t ps, int wc, \
                            int out_w, int out_h, int oy, void *outv)                                \
    {                                                                                                \
        const T(*lut)[256] = (const T(*)[256])lutv;                                                  \
        T *out = (T *)outv;                                                                          \
        const int C = t->out_channels;                                                               \
        const size_t cs = wc == 1 ? 0 : ps;    /* a gray row serves every channel */                 \
        if (t->layout == FL_LAYOUT_CHW) {                                                            \
            for (int c = 0; c < C; c++) {                                                            \
                const T *l = lut[c];                                                                 \
                const uint8_t *s = row + (size_t)c * cs;                                             \
                T *d = out + ((size_t)c * out_h + oy) * out_w;                                       \
                if (sizeof(T) == 1 && t->dtype == FL_DT_U8)                                          \
                    memcpy(d, s, (size_t)out_w);     /* the uint8 table is the identity */           \
                else if (sizeof(T) == 4)             /* float32: the table, streamed */          \
                    fl_f32_lut_row((const float *)(const void *)l, s, (float *)(void *)d, out_w);    \
                else                                                                                 \
                    for (int x = 0; x < out_w; x++)                                                  \
                        d[x] = l[s[x]];                                                              \
            }                                                                                        \
        } else {                                                                                     \
            T *d = out + (size_t)oy * out_w * C;                                                     \
            if (C == 1) {                                                                            \
                for (int x = 0; x < out_w; x++)                                                      \
                    d[x] = lut[0][row[x]];                                                           \
            } else if (sizeof(T) == 1 && t->dtype == FL_DT_U8) {   /* the identity: interleave only */ \
                fl_merge3(row, row + cs, row + 2 * cs, (uint8_t *)(void *)d, out_w);                  \
            } else {                                                                                 \
                const uint8_t *s0 = row, *s1 = row + cs, *s2 = row + 2 * cs;                         \
                for (int x = 0; x < out_w; x++) {                                                    \
                    d[3 * x] = lut[0][s0[x]];                                                        \
                    d[3 * x + 1] = lut[1][s1[x]];                                                    \
                    d[3 * x + 2] = lut[2][s2[x]];                                                    \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
    }

FL_DEFINE_EMIT(fl_emit_u8, uint8_t)
FL_DEFINE_EMIT(fl_emit_u16, uint16_t)
FL_DEFINE_EMIT(fl_emit_f32, float)

/* Contract: imgops_internal.h. */
void
fl_convert_store(const fl_tspec *t, float v, void *dst)
{
    if (t->dtype == FL_DT_F32)
        memcpy(dst, &v, sizeof v);
    else if (t->dtype == FL_DT_F16) {
        uint16_t h = fl_f32_to_f16(v);
        memcpy(dst, &h, sizeof h);
    } else if (t->dtype == FL_DT_BF16) {
        uint16_t h = fl_f32_to_bf16(v);
        memcpy(dst, &h, sizeof h);
    } else
        *(uint8_t *)dst = (uint8_t)v;
}

/* Contract: imgops_internal.h. */
size_t
fl_convert_elsize(const fl_tspec *t)
{
    return t->dtype == FL_DT_F32 ? 4 : t->dtype == FL_DT_U8 ? 1 : 2;
}

/* Contract: imgops_internal.h. */
fl_emit_fn
fl_convert_table(const fl_tspec *t, void *lut)
{
    const int C = t->out_channels;
    if (t->dtype == FL_DT_U8) {
        uint8_t(*l8)[256] = (uint8_t(*)[256])lut;
        for (int c = 0; c < 3; c++)
            for (int v = 0; v < 256; v++)
                l8[c][v] = (uint8_t)v;
        return fl_emit_u8;
    }
    if (t->dtype == FL_DT_F32) {
        float(*lf)[256] = (float(*)[256])lut;
        for (int c = 0; c < C; c++)
            for (int v = 0; v < 256; v++)
                lf[c][v] = fl_value_f32(t, c, v);
        return fl_emit_f32;
    }
    uint16_t(*lh)[256] = (uint16_t(*)[256])lut;
    for (int c = 0; c < C; c++)
        for (int v = 0; v < 256; v++) {
            float f = fl_value_f32(t, c, v);
            lh[c][v] = t->dtype == FL_DT_F16 ? fl_f32_to_f16(f) : fl_f32_to_bf16(f);
        }
    return fl_emit_u16;
}
