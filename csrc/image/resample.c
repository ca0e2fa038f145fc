/* resample.c: Pillow's antialiased resample in fixed point (its BILINEAR
 * and BICUBIC filters), the one responsibility of this unit: per-axis coefficients and the horizontal
 * and vertical passes, portable and AVX2.  Interface: resample.h.
 *
 * No Python, no GIL: caller-owned memory only, nothing allocated here.
 *
 * - Exactness.  torchvision on PIL images resizes with Pillow's separable
 *   fixed-point resampler: horizontal pass into a uint8 intermediate, then a
 *   vertical pass; triangle (support 1) or cubic (a = -0.5, support 2)
 *   filter whose support grows with the downscale factor; per-output
 *   weights normalised in double and rounded to 22-bit fixed point (away
 *   from zero: the cubic's negative lobes give negative weights);
 *   accumulator starting at 1 << 21, signed 32-bit; arithmetic shift and
 *   clip to uint8 (a sum can fall below 0 or above 255 << 22 with negative
 *   weights).  We do the same arithmetic in the same order, so at full
 *   scale the uint8 output is bit-identical.  The filters' double
 *   expressions are Pillow's, term for term; the build is ISO C (-std=c11),
 *   so GCC contracts nothing into FMAs that Pillow's build would not.  Each intermediate value depends only on its own source
 *   row, so computing only the rows and columns the output window needs
 *   changes nothing, and the order of the terms of each (integer) sum is
 *   free.
 * - Speed.  Rows between the passes are planar (one plane per channel), so
 *   both passes run on runs of single-channel bytes and the result is
 *   CHW-shaped.  With AVX2 (checked at run time; FASTLOADER_NO_AVX2=1 forces
 *   the portable kernels, which give the same bytes) the horizontal pass
 *   computes 8 outputs per 32-bit vector: per block a byte shuffle picks
 *   each output's tap pixel out of 16 loaded bytes, then a 32-bit multiply
 *   by that tap's weights and an add; the vertical pass keeps 32 outputs of
 *   accumulators in registers over the taps.  The flip is folded into the
 *   horizontal coefficients (outputs computed in reversed order).
 */
#include "image/resample.h"
#include "image/imgops.h"
#include "image/imgops_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FL_PREC 22   /* Pillow's PRECISION_BITS (32 - 8 - 2) */

/* ------------------------------------------------------------------------ */
/* Resampling coefficients (Pillow's precompute_coeffs + fixed point)       */
/* ------------------------------------------------------------------------ */

/* Pillow's bilinear (triangle) filter, support 1.  Pure. */
static double
fl_triangle(double x)
{
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return 1.0 - x;
    return 0.0;
}

/* Pillow's bicubic filter (cubic convolution, a = -0.5), support 2: the
 * same double operations in the same order as Pillow's bicubic_filter
 * (a + 2 = 1.5 and a + 3 = 2.5 are exact, so are the products by a).
 * Pure. */
static double
fl_cubic(double x)
{
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return ((1.5 * x - 2.5) * x) * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * -0.5;
    return 0.0;
}

/* The filter's support at scale 1, by FL_INTERP_* (bilinear, bicubic). */
static const double fl_filter_support[2] = {1.0, 2.0};

/* Pillow's per-output bounds: first input (relative to base) and count. */
static void
fl_axis_bounds(const fl_axis *a, int xx, double *center, int *xmin_out, int *n_out)
{
    double c = a->in0 + (xx + 0.5) * a->scale;
    int xmin = (int)(c - a->support + 0.5);
    if (xmin < 0)
        xmin = 0;
    int xmax = (int)(c + a->support + 0.5);
    if (xmax > a->insize)
        xmax = a->insize;
    int n = xmax - xmin;
    if (n < 0)
        n = 0;
    if (n > a->ksize)
        n = a->ksize;
    *center = c;
    *xmin_out = xmin;
    *n_out = n;
}

/* Filter parameters and the read span [in_lo, in_hi) (buffer coordinates)
 * of an axis whose base/insize/in0/in1/out_size/o0/o1 are set. */
static void
fl_axis_span(fl_axis *a)
{
    a->need = !(a->out_size == a->insize && a->in0 == 0.0 && a->in1 == (double)a->out_size);
    if (!a->need) {
        a->ksize = 1;
        a->in_lo = a->base + a->o0;
        a->in_hi = a->base + a->o1;
        return;
    }
    a->scale = (a->in1 - a->in0) / a->out_size;
    a->filterscale = a->scale < 1.0 ? 1.0 : a->scale;
    a->support = fl_filter_support[a->interp] * a->filterscale;
    a->ksize = (int)ceil(a->support) * 2 + 1;
    double c;
    int xmin0, n0, xmin1, n1;
    fl_axis_bounds(a, a->o0, &c, &xmin0, &n0);
    fl_axis_bounds(a, a->o1 - 1, &c, &xmin1, &n1);
    /* Bounds are monotonic in the output index, so the ends bound the union. */
    a->in_lo = a->base + xmin0;
    a->in_hi = a->base + (xmin1 + n1 > xmin0 ? xmin1 + n1 : xmin0);
}

/* Map the box [b0, b1) (buffer coordinates) of one axis onto a buffer of
 * `len` pixels, resized to out_size with the filter interp, outputs
 * [o0, o1) wanted (o0 < o1).  Sets everything but lo/cnt/k/kmax.  Returns
 * 0, or -1 when the box misses the buffer or interp is unknown (contract:
 * resample.h).
 *
 * An integral box (always the case at full scale) is resampled exactly as
 * Pillow resamples the cropped image: the filter is clipped at the box, in
 * box coordinates, whatever part of the box the buffer holds; that is exact
 * as long as the buffer holds every pixel the wanted outputs read (the
 * window fl_plan_source_window reports).  Otherwise (a fractional box from
 * a DCT-scaled view, or a buffer lacking some of those pixels) the filter
 * is clipped to the buffer's pixels, and for bicubic the box too (below);
 * a box inside the buffer, as every view fl_native makes, is kept. */
int
fl_axis_setup(fl_axis *a, int interp, double b0, double b1, int len, int out_size, int o0, int o1)
{
    if (interp != FL_INTERP_BILINEAR && interp != FL_INTERP_BICUBIC)
        return -1;
    a->interp = interp;
    a->out_size = out_size;
    a->o0 = o0;
    a->o1 = o1;
    a->lo = a->cnt = NULL;
    a->k = NULL;
    a->fixed = 0;
    a->kmax = 0;
    double r0 = floor(b0 + 0.5), r1 = floor(b1 + 0.5);
    if (fabs(b0 - r0) < 1e-9 && fabs(b1 - r1) < 1e-9 && r1 > r0 && r0 > -4.0 * FL_MAX_DIM
        && r1 < 4.0 * FL_MAX_DIM) {
        a->base = (int)r0;
        a->insize = (int)(r1 - r0);
        a->in0 = 0.0;
        a->in1 = (double)a->insize;
        fl_axis_span(a);
        if (a->in_lo >= 0 && a->in_hi <= len && a->in_hi > a->in_lo)
            return 0;
    }
    if (!(b0 > -4.0 * FL_MAX_DIM && b1 < 4.0 * FL_MAX_DIM && b0 < b1))   /* NaN fails too */
        return -1;
    int lo = (int)floor(b0 + 1e-6), hi = (int)ceil(b1 - 1e-6);
    if (lo < 0)
        lo = 0;
    if (hi > len)
        hi = len;
    if (hi <= lo)
        return -1;
    a->base = lo;
    a->insize = hi - lo;
    a->in0 = b0 - lo;
    a->in1 = b1 - lo;
    /* Bicubic: the box too is clipped to the buffer, so that every output's
     * centre lies in it.  A centre outside would keep only the filter's
     * tail, whose (negative-lobe) sum can be near 0, and its normalised
     * weights would overflow the 32-bit sums; with the centre inside, the
     * weights' magnitudes sum to less than 1.5. */
    if (interp == FL_INTERP_BICUBIC) {
        if (a->in0 < 0.0)
            a->in0 = 0.0;
        if (a->in1 > (double)a->insize)
            a->in1 = (double)a->insize;
    }
    fl_axis_span(a);
    if (a->in_lo < 0 || a->in_hi > len || a->in_hi <= a->in_lo)
        return -1;
    return 0;
}

/* Contract: resample.h. */
void
fl_axis_fill(fl_axis *a, double *w)
{
    double ss = 1.0 / a->filterscale;
    a->kmax = 0;
    for (int xx = a->o0; xx < a->o1; xx++) {
        int i = xx - a->o0, xmin, n;
        double center;
        fl_axis_bounds(a, xx, &center, &xmin, &n);
        double ww = 0.0;
        if (a->interp == FL_INTERP_BICUBIC) {
            for (int x = 0; x < n; x++) {
                w[x] = fl_cubic((x + xmin - center + 0.5) * ss);
                ww += w[x];
            }
        } else {
            for (int x = 0; x < n; x++) {
                w[x] = fl_triangle((x + xmin - center + 0.5) * ss);
                ww += w[x];
            }
        }
        int32_t *k = a->k + (size_t)i * a->ksize;
        for (int x = 0; x < n; x++) {
            double v = ww != 0.0 ? w[x] / ww : w[x];
            k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << FL_PREC)) : (int32_t)(0.5 + v * (1 << FL_PREC));
        }
        for (int x = n; x < a->ksize; x++)
            k[x] = 0;
        a->lo[i] = a->base + xmin - a->in_lo;
        a->cnt[i] = n;
        if (n > a->kmax)
            a->kmax = n;
    }
}

/* Contract: resample.h. */
void
fl_axis_reverse(fl_axis *a)
{
    const int n = a->o1 - a->o0, ks = a->ksize;
    for (int i = 0, j = n - 1; i < j; i++, j--) {
        int t = a->lo[i];
        a->lo[i] = a->lo[j];
        a->lo[j] = t;
        t = a->cnt[i];
        a->cnt[i] = a->cnt[j];
        a->cnt[j] = t;
        int32_t *ki = a->k + (size_t)i * ks, *kj = a->k + (size_t)j * ks;
        for (int x = 0; x < ks; x++) {
            int32_t v = ki[x];
            ki[x] = kj[x];
            kj[x] = v;
        }
    }
}

/* Give every output exactly ksize taps, so the portable horizontal pass can
 * run a fixed-length, fully unrolled loop: windows near the right edge slide
 * left and the weights move with them; the added taps weigh 0, so sums (and
 * results) are unchanged.  Needs the read span (in_hi - in_lo) >= ksize;
 * otherwise the axis stays variable-length. */
static void
fl_axis_make_fixed(fl_axis *a)
{
    const int span = a->in_hi - a->in_lo, ks = a->ksize;
    a->fixed = 0;
    if (span < ks)
        return;
    for (int i = 0; i < a->o1 - a->o0; i++) {
        int lo = a->lo[i], shift = lo + ks > span ? lo + ks - span : 0;
        int32_t *k = a->k + (size_t)i * ks;
        if (shift) {
            memmove(k + shift, k, (size_t)(ks - shift) * sizeof *k);
            memset(k, 0, (size_t)shift * sizeof *k);
            a->lo[i] = lo - shift;
        }
        a->cnt[i] = ks;
    }
    a->fixed = 1;
}

/* A fixed-point sum back to a pixel: drop the fraction, clip to 0..255. */
static inline uint8_t
fl_clip8(int32_t v)
{
    v >>= FL_PREC;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* ------------------------------------------------------------------------ */
/* Resample kernels                                                         */
/*                                                                          */
/* Rows between the passes are planar: a row of n pixels with wc channels   */
/* is wc planes of n bytes at a plane stride.  The horizontal pass reads    */
/* planes (source rows are split first), so both passes work on runs of     */
/* single-channel bytes; the output is CHW-shaped already.                  */
/*                                                                          */
/* Each kernel has a portable C version and an AVX2 version (picked at run  */
/* time); both compute exactly Pillow's integer sums (signed 32-bit        */
/* weights, negative for bicubic's lobes, and 32-bit accumulators starting  */
/* at 1 << 21; no sum overflows: |weights| sum to < 1.5 << 22), then shift  */
/* arithmetically and clip to 0..255 on both sides, so the results are      */
/* identical.                                                               */
/* ------------------------------------------------------------------------ */

#ifdef FL_X86_SIMD
#include <immintrin.h>
#endif

/* Contract: imgops_internal.h. */
int
fl_use_avx2(void)
{
#ifdef FL_X86_SIMD
    static int level = -1;
    int v = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("FASTLOADER_NO_AVX2");
        v = __builtin_cpu_supports("avx2") && !(e != NULL && e[0] != '\0' && strcmp(e, "0") != 0);
        __atomic_store_n(&level, v, __ATOMIC_RELAXED);
    }
    return v;
#else
    return 0;
#endif
}

/* Split n interleaved RGB pixels into three planes (stride ps). */
FL_HOT static void
fl_split3_c(const uint8_t *s, int n, uint8_t *d, size_t ps)
{
    uint8_t *r = d, *g = d + ps, *b = d + 2 * ps;
    for (int x = 0; x < n; x++, s += 3) {
        r[x] = s[0];
        g[x] = s[1];
        b[x] = s[2];
    }
}

/* Portable horizontal pass over wc planes: planes (stride ips, pixels from
 * the axis' in_lo) -> out planes (stride ops), nh outputs each.  KS > 0 is a
 * compile-time tap count (fixed axes), KS == 0 reads the per-output count. */
#define FL_DEFINE_HPASS(KS)                                                                \
    FL_HOT static void fl_hpass_c##KS(const fl_axis *ax, const uint8_t *planes, size_t ips, int wc, \
                                      uint8_t *out, size_t ops, int nh)                    \
    {                                                                                      \
        const int ks = ax->ksize;                                                          \
        for (int i = 0; i < nh; i++) {                                                     \
            const int32_t *k = ax->k + (size_t)i * ks;                                     \
            const uint8_t *p = planes + ax->lo[i];                                         \
            const int n = (KS) ? (KS) : ax->cnt[i];                                        \
            int32_t a0 = 1 << (FL_PREC - 1), a1 = a0, a2 = a0;                             \
            if (wc == 3) {                                                                 \
                for (int j = 0; j < n; j++) {                                              \
                    a0 += p[j] * k[j];                                                     \
                    a1 += p[ips + j] * k[j];                                               \
                    a2 += p[2 * ips + j] * k[j];                                           \
                }                                                                          \
                out[ops + i] = fl_clip8(a1);                                               \
                out[2 * ops + i] = fl_clip8(a2);                                           \
            } else {                                                                       \
                for (int j = 0; j < n; j++)                                                \
                    a0 += p[j] * k[j];                                                     \
            }                                                                              \
            out[i] = fl_clip8(a0);                                                         \
        }                                                                                  \
    }

FL_DEFINE_HPASS(0)
FL_DEFINE_HPASS(3)
FL_DEFINE_HPASS(5)
FL_DEFINE_HPASS(7)
FL_DEFINE_HPASS(9)
FL_DEFINE_HPASS(11)
FL_DEFINE_HPASS(13)

/* The portable horizontal kernel for an axis (after fl_axis_make_fixed). */
static fl_hpass_fn
fl_hpass_pick(const fl_axis *ax)
{
    if (ax->fixed) {
        switch (ax->ksize) {
        case 3: return fl_hpass_c3;
        case 5: return fl_hpass_c5;
        case 7: return fl_hpass_c7;
        case 9: return fl_hpass_c9;
        case 11: return fl_hpass_c11;   /* bicubic, downscales in (2, 2.5] */
        case 13: return fl_hpass_c13;   /* bicubic, (2.5, 3] */
        default: break;
        }
    }
    return fl_hpass_c0;
}

/* Portable vertical pass for one output row: n taps (weights k) of the rows
 * rows[0..n) (len bytes each) -> d; acc is len int32 of scratch. */
FL_HOT static void
fl_vpass_c(const int32_t *k, int n, const uint8_t *const *rows, int32_t *acc, uint8_t *d, int len)
{
    for (int x = 0; x < len; x++)
        acc[x] = 1 << (FL_PREC - 1);
    for (int j = 0; j < n; j++) {
        const uint8_t *s = rows[j];
        const int32_t kj = k[j];
        for (int x = 0; x < len; x++)
            acc[x] += s[x] * kj;
    }
    for (int x = 0; x < len; x++)
        d[x] = fl_clip8(acc[x]);
}

#ifdef FL_X86_SIMD
/* AVX2 horizontal pass.  Outputs go in blocks of 8; lane l (outputs 4l..4l+3
 * of the block) works on 16 loaded plane bytes and, for taps j and j + 1,
 * one byte shuffle puts each output's two tap pixels, zero extended to 16
 * bits, side by side; vpmaddwd multiplies them by the taps' weights and
 * adds the pair into the output's 32-bit slot.  The weights are Pillow's
 * 22-bit fixed-point ones, split w = wh * 2^11 + wl (wl in 0..2047, wh
 * signed: bicubic's are negative near its lobes), so two vpmaddwd give
 * sum(p wh) and sum(p wl), and (sum(p wh) << 11) + sum(p wl) is sum(p w)
 * exactly: the same integers as one 32-bit multiply a tap (vpmulld, half
 * the rate of vpmaddwd on AMD Zen 1, and one shuffle a tap).  The taps go
 * in groups of gs (taps [g * gs, (g + 1) * gs) of every output), paired
 * within each group: each group of each lane loads its own 16 bytes, from
 * off[2 * (b * ng + g) + l].  tab holds per block and tap pair
 * FL_HTAB_TAP bytes: 32 shuffle bytes, 16 wh and 16 wl (int16; 0 for
 * missing taps, whose shuffle bytes are 0x80 = zero).  One group (ng = 1)
 * when the 4 outputs' taps fit 16 bytes, as they do for bilinear up to a
 * 3x and bicubic up to a 2x downscale; more (wider downscales) otherwise. */
#define FL_HSPLIT 11

/* The tap group size for a filled axis: the largest gs <= kb such that
 * every lane's outputs, taps [g * gs, (g + 1) * gs) each, lie within 16
 * bytes from the group's first pixel: 16 - (the widest spread of the 4
 * outputs' first pixels), at most kb.  Returns it, or 0 when even one tap
 * per group does not fit (a spread of 16 or more: the portable kernel
 * runs).  Pure. */
static int
fl_htab_group(const fl_axis *a, int nh, int kb)
{
    int spread = 0;
    for (int i0 = 0; i0 < nh; i0 += 4) {
        int lo = -1, hi = -1;
        for (int i = i0; i < i0 + 4 && i < nh; i++) {
            if (a->cnt[i] <= 0)
                continue;
            if (lo < 0 || a->lo[i] < lo)
                lo = a->lo[i];
            if (a->lo[i] > hi)
                hi = a->lo[i];
        }
        if (lo >= 0 && hi - lo > spread)
            spread = hi - lo;
    }
    int gs = 16 - spread;
    return gs < 1 ? 0 : gs > kb ? kb : gs;
}

/* Build the table (off: 2 * ng int32 per block, tab: kb * FL_HTAB_TAP bytes
 * per block, at most kb pairs used) for nh outputs of a filled axis, kb
 * taps in groups of gs, ng = ceil(kb / gs) groups, each group's taps in
 * pairs (the last one alone when the group's count is odd).  A lane's group
 * with no taps loads from 0 (its weights are 0).  Returns 0, or -1 when
 * some tap lies outside its group's 16 bytes (not for the gs fl_htab_group
 * picks) or a weight's high part does not fit 16 bits (weights are below
 * 2^23 in magnitude: not for Pillow's filters). */
static int
fl_htab_build(const fl_axis *a, int nh, int kb, int gs, int32_t *off, uint8_t *tab)
{
    const int nb = (nh + 7) / 8, ks = a->ksize, ng = (kb + gs - 1) / gs;
    for (int b = 0; b < nb; b++) {
        uint8_t *T = tab + (size_t)b * kb * FL_HTAB_TAP;
        for (int l = 0; l < 2; l++) {
            int pair = 0;
            for (int g = 0; g < ng; g++) {
                const int j0 = g * gs, j1 = j0 + gs < kb ? j0 + gs : kb;
                int base = -1;
                for (int q = 0; q < 4; q++) {
                    int i = 8 * b + 4 * l + q;
                    if (i < nh && a->cnt[i] > j0 && (base < 0 || a->lo[i] + j0 < base))
                        base = a->lo[i] + j0;
                }
                if (base < 0)
                    base = 0;
                off[2 * (b * ng + g) + l] = base;
                for (int jp = j0; jp < j1; jp += 2, pair++) {
                    uint8_t *P = T + (size_t)pair * FL_HTAB_TAP;
                    for (int q = 0; q < 4; q++) {
                        int i = 8 * b + 4 * l + q;
                        for (int t = 0; t < 2; t++) {
                            const int j = jp + t;
                            uint8_t *ix = P + 16 * l + 4 * q + 2 * t;
                            int32_t w = 0;
                            ix[0] = ix[1] = 0x80;
                            if (j < j1 && i < nh && j < a->cnt[i]) {
                                int p = a->lo[i] + j - base;
                                if (p < 0 || p > 15)
                                    return -1;
                                ix[0] = (uint8_t)p;
                                w = a->k[(size_t)i * ks + j];
                            }
                            const int32_t wh = w >> FL_HSPLIT;   /* arithmetic: floor */
                            if (wh < INT16_MIN || wh > INT16_MAX)
                                return -1;
                            const int16_t h16 = (int16_t)wh, l16 = (int16_t)(w - wh * (1 << FL_HSPLIT));
                            const size_t slot = (size_t)(8 * l + 2 * q + t) * sizeof(int16_t);
                            memcpy(P + 32 + slot, &h16, sizeof h16);
                            memcpy(P + 64 + slot, &l16, sizeof l16);
                        }
                    }
                }
            }
        }
    }
    return 0;
}

FL_AVX2 static inline __m256i
fl_load2x128(const uint8_t *p0, const uint8_t *p1)
{
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p0)),
                                   _mm_loadu_si128((const __m128i *)(const void *)p1), 1);
}

/* ah += pairs(d, pair P) . wh, al += pairs(d, pair P) . wl */
#define FL_HPAIR(ah, al, d, T, P)                                                                   \
    do {                                                                                            \
        const __m256i x_ = _mm256_shuffle_epi8(d, _mm256_loadu_si256((const __m256i *)(const void *)((T) + (P) * FL_HTAB_TAP)));  \
        ah = _mm256_add_epi32(ah, _mm256_madd_epi16(x_, _mm256_loadu_si256((const __m256i *)(const void *)((T) + (P) * FL_HTAB_TAP + 32)))); \
        al = _mm256_add_epi32(al, _mm256_madd_epi16(x_, _mm256_loadu_si256((const __m256i *)(const void *)((T) + (P) * FL_HTAB_TAP + 64)))); \
    } while (0)

/* (ah << FL_HSPLIT) + al, shifted down by FL_PREC (al holds the rounding). */
#define FL_HSUM(ah, al) _mm256_srai_epi32(_mm256_add_epi32(_mm256_slli_epi32(ah, FL_HSPLIT), al), FL_PREC)

/* The kernel for nb blocks; kb, ng and gs are compile-time constants in
 * the common cases (fl_hpass_avx2 below), which unrolls the pair loops. */
FL_AVX2 static inline __attribute__((always_inline)) void
fl_hpass_avx2_body(const uint8_t *planes, size_t ips, int wc, int nb, const int kb, const int ng, const int gs,
                   const int32_t *off, const uint8_t *tab, uint8_t *out, size_t ops)
{
    const __m256i rnd = _mm256_set1_epi32(1 << (FL_PREC - 1)), zero = _mm256_setzero_si256();
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    if (wc == 3) {
        for (int b = 0; b < nb; b++) {
            const uint8_t *T = tab + (size_t)b * kb * FL_HTAB_TAP;
            const int32_t *o = off + 2 * (size_t)b * ng;
            __m256i h0 = zero, h1 = zero, h2 = zero, l0 = rnd, l1 = rnd, l2 = rnd;
            int P = 0;
            for (int g = 0; g < ng; g++) {
                const uint8_t *p0 = planes + o[2 * g], *p1 = planes + o[2 * g + 1];
                const __m256i d0 = fl_load2x128(p0, p1);
                const __m256i d1 = fl_load2x128(p0 + ips, p1 + ips);
                const __m256i d2 = fl_load2x128(p0 + 2 * ips, p1 + 2 * ips);
                const int j1 = (g + 1) * gs < kb ? (g + 1) * gs : kb;
                for (int j = g * gs; j < j1; j += 2, P++) {
                    FL_HPAIR(h0, l0, d0, T, P);
                    FL_HPAIR(h1, l1, d1, T, P);
                    FL_HPAIR(h2, l2, d2, T, P);
                }
            }
            const __m256i a0 = FL_HSUM(h0, l0), a1 = FL_HSUM(h1, l1), a2 = FL_HSUM(h2, l2);
            /* saturating packs clip to 0..255: below 0 (negative lobes) to 0,
             * above 255 to 255 (a shifted sum is within -512..511) */
            /* lane 0 bytes: a0[0..3] a1[0..3] a2[0..3] a2[0..3]; lane 1 the same for [4..7] */
            __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(a0, a1), _mm256_packus_epi32(a2, a2));
            p = _mm256_permutevar8x32_epi32(p, perm);   /* a0[0..7] a1[0..7] a2[0..7] a2[0..7] */
            __m128i lo = _mm256_castsi256_si128(p);
            uint8_t *d = out + 8 * (size_t)b;
            _mm_storel_epi64((__m128i *)(void *)d, lo);
            _mm_storel_epi64((__m128i *)(void *)(d + ops), _mm_unpackhi_epi64(lo, lo));
            _mm_storel_epi64((__m128i *)(void *)(d + 2 * ops), _mm256_extracti128_si256(p, 1));
        }
    } else {
        for (int b = 0; b < nb; b++) {
            const uint8_t *T = tab + (size_t)b * kb * FL_HTAB_TAP;
            const int32_t *o = off + 2 * (size_t)b * ng;
            __m256i h0 = zero, l0 = rnd;
            int P = 0;
            for (int g = 0; g < ng; g++) {
                const __m256i d0 = fl_load2x128(planes + o[2 * g], planes + o[2 * g + 1]);
                const int j1 = (g + 1) * gs < kb ? (g + 1) * gs : kb;
                for (int j = g * gs; j < j1; j += 2, P++)
                    FL_HPAIR(h0, l0, d0, T, P);
            }
            const __m256i a0 = FL_HSUM(h0, l0);
            __m256i p = _mm256_packus_epi32(a0, a0);
            p = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p, p), perm);
            _mm_storel_epi64((__m128i *)(void *)(out + 8 * (size_t)b), _mm256_castsi256_si128(p));
        }
    }
}

/* Contract: resample.h. */
FL_AVX2 void
fl_hpass_avx2(const uint8_t *planes, size_t ips, int wc, int nh, int kb, int gs, const int32_t *off,
              const uint8_t *tab, uint8_t *out, size_t ops)
{
    const int nb = (nh + 7) / 8;
    if (gs >= kb) {   /* one group; constant tap counts unroll the tap loop */
        switch (kb) {
        case 2: fl_hpass_avx2_body(planes, ips, wc, nb, 2, 1, 2, off, tab, out, ops); return;
        case 3: fl_hpass_avx2_body(planes, ips, wc, nb, 3, 1, 3, off, tab, out, ops); return;
        case 4: fl_hpass_avx2_body(planes, ips, wc, nb, 4, 1, 4, off, tab, out, ops); return;
        case 5: fl_hpass_avx2_body(planes, ips, wc, nb, 5, 1, 5, off, tab, out, ops); return;
        case 6: fl_hpass_avx2_body(planes, ips, wc, nb, 6, 1, 6, off, tab, out, ops); return;
        case 7: fl_hpass_avx2_body(planes, ips, wc, nb, 7, 1, 7, off, tab, out, ops); return;
        case 8: fl_hpass_avx2_body(planes, ips, wc, nb, 8, 1, 8, off, tab, out, ops); return;
        case 9: fl_hpass_avx2_body(planes, ips, wc, nb, 9, 1, 9, off, tab, out, ops); return;
        default: fl_hpass_avx2_body(planes, ips, wc, nb, kb, 1, kb, off, tab, out, ops); return;
        }
    }
    fl_hpass_avx2_body(planes, ips, wc, nb, kb, (kb + gs - 1) / gs, gs, off, tab, out, ops);
}

/* Contract: resample.h.  Accumulators stay in registers, 32 bytes at a
 * time. */
FL_AVX2 void
fl_vpass_avx2(const int32_t *k, int n, const uint8_t *const *rows, uint8_t *d, int len)
{
    const __m256i rnd = _mm256_set1_epi32(1 << (FL_PREC - 1));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int x = 0;
    for (; x + 32 <= len; x += 32) {
        __m256i a0 = rnd, a1 = rnd, a2 = rnd, a3 = rnd;
        for (int j = 0; j < n; j++) {
            const uint8_t *s = rows[j] + x;
            const __m256i kj = _mm256_set1_epi32(k[j]);
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)s)), kj));
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(s + 8))), kj));
            a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(s + 16))), kj));
            a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(s + 24))), kj));
        }
        a0 = _mm256_srai_epi32(a0, FL_PREC);
        a1 = _mm256_srai_epi32(a1, FL_PREC);
        a2 = _mm256_srai_epi32(a2, FL_PREC);
        a3 = _mm256_srai_epi32(a3, FL_PREC);
        __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(a0, a1), _mm256_packus_epi32(a2, a3));
        _mm256_storeu_si256((__m256i *)(void *)(d + x), _mm256_permutevar8x32_epi32(p, perm));
    }
    for (; x + 8 <= len; x += 8) {
        __m256i a0 = rnd;
        for (int j = 0; j < n; j++)
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(rows[j] + x))),
                                                         _mm256_set1_epi32(k[j])));
        a0 = _mm256_srai_epi32(a0, FL_PREC);
        __m256i p = _mm256_packus_epi32(a0, a0);
        p = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p, p), perm);
        _mm_storel_epi64((__m128i *)(void *)(d + x), _mm256_castsi256_si128(p));
    }
    for (; x < len; x++) {
        int32_t a = 1 << (FL_PREC - 1);
        for (int j = 0; j < n; j++)
            a += rows[j][x] * k[j];
        d[x] = fl_clip8(a);
    }
}

/* Contract: resample.h.  16 pixels at a time. */
FL_AVX2 void
fl_split3_avx2(const uint8_t *s, int n, uint8_t *d, size_t ps)
{
    uint8_t *r = d, *g = d + ps, *b = d + 2 * ps;
    const __m128i ra = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i rb = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
    const __m128i rc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
    const __m128i ga = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i gb = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
    const __m128i gc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
    const __m128i ba = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i bb = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
    const __m128i bc = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
    int x = 0;
    for (; x + 16 <= n; x += 16, s += 48) {
        __m128i A = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i B = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i C = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        _mm_storeu_si128((__m128i *)(void *)(r + x),
                         _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(A, ra), _mm_shuffle_epi8(B, rb)), _mm_shuffle_epi8(C, rc)));
        _mm_storeu_si128((__m128i *)(void *)(g + x),
                         _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(A, ga), _mm_shuffle_epi8(B, gb)), _mm_shuffle_epi8(C, gc)));
        _mm_storeu_si128((__m128i *)(void *)(b + x),
                         _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(A, ba), _mm_shuffle_epi8(B, bb)), _mm_shuffle_epi8(C, bc)));
    }
    for (; x < n; x++, s += 3) {
        r[x] = s[0];
        g[x] = s[1];
        b[x] = s[2];
    }
}

/* Contract: resample.h.  16 pixels at a time: three 16-byte rows of r, g
 * and b shuffled into the 48 interleaved bytes (the inverse of
 * fl_split3_avx2's masks: output byte k is pixel k / 3's channel k % 3). */
FL_AVX2 void
fl_merge3_avx2(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2, uint8_t *d, int n)
{
    /* [output block * 3 + plane][k]: the pixel whose channel lands at output byte 16 * block + k, else 0x80 */
    static const uint8_t mask[9][16] = {
        {0x00, 0x80, 0x80, 0x01, 0x80, 0x80, 0x02, 0x80, 0x80, 0x03, 0x80, 0x80, 0x04, 0x80, 0x80, 0x05},
        {0x80, 0x00, 0x80, 0x80, 0x01, 0x80, 0x80, 0x02, 0x80, 0x80, 0x03, 0x80, 0x80, 0x04, 0x80, 0x80},
        {0x80, 0x80, 0x00, 0x80, 0x80, 0x01, 0x80, 0x80, 0x02, 0x80, 0x80, 0x03, 0x80, 0x80, 0x04, 0x80},
        {0x80, 0x80, 0x06, 0x80, 0x80, 0x07, 0x80, 0x80, 0x08, 0x80, 0x80, 0x09, 0x80, 0x80, 0x0a, 0x80},
        {0x05, 0x80, 0x80, 0x06, 0x80, 0x80, 0x07, 0x80, 0x80, 0x08, 0x80, 0x80, 0x09, 0x80, 0x80, 0x0a},
        {0x80, 0x05, 0x80, 0x80, 0x06, 0x80, 0x80, 0x07, 0x80, 0x80, 0x08, 0x80, 0x80, 0x09, 0x80, 0x80},
        {0x80, 0x0b, 0x80, 0x80, 0x0c, 0x80, 0x80, 0x0d, 0x80, 0x80, 0x0e, 0x80, 0x80, 0x0f, 0x80, 0x80},
        {0x80, 0x80, 0x0b, 0x80, 0x80, 0x0c, 0x80, 0x80, 0x0d, 0x80, 0x80, 0x0e, 0x80, 0x80, 0x0f, 0x80},
        {0x0a, 0x80, 0x80, 0x0b, 0x80, 0x80, 0x0c, 0x80, 0x80, 0x0d, 0x80, 0x80, 0x0e, 0x80, 0x80, 0x0f}};
    __m128i m[3][3];
    for (int j = 0; j < 3; j++)
        for (int c = 0; c < 3; c++)
            m[j][c] = _mm_loadu_si128((const __m128i *)(const void *)mask[3 * j + c]);
    int x = 0;
    for (; x + 16 <= n; x += 16, d += 48) {
        const __m128i r = _mm_loadu_si128((const __m128i *)(const void *)(s0 + x));
        const __m128i g = _mm_loadu_si128((const __m128i *)(const void *)(s1 + x));
        const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s2 + x));
        for (int j = 0; j < 3; j++)
            _mm_storeu_si128((__m128i *)(void *)(d + 16 * j),
                             _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(r, m[j][0]), _mm_shuffle_epi8(g, m[j][1])),
                                          _mm_shuffle_epi8(b, m[j][2])));
    }
    for (; x < n; x++, d += 3) {
        d[0] = s0[x];
        d[1] = s1[x];
        d[2] = s2[x];
    }
}
#endif /* FL_X86_SIMD */

/* ------------------------------------------------------------------------ */
/* Kernel choice and the row loop                                           */
/* ------------------------------------------------------------------------ */

/* Contract: resample.h. */
void
fl_hrow_prepare(fl_hrow_plan *h, fl_axis *ax, int simd)
{
    h->ax = ax;
    h->simd = 0;
    h->gs = 0;
    h->c = NULL;
#ifdef FL_X86_SIMD
    if (simd) {
        h->gs = fl_htab_group(ax, h->nh, ax->kmax);
        h->simd = h->gs > 0 && fl_htab_build(ax, h->nh, ax->kmax, h->gs, h->off, h->tab) == 0;
    }
#else
    (void)simd;
#endif
    if (!h->simd) {
        fl_axis_make_fixed(ax);
        h->c = fl_hpass_pick(ax);
    }
    /* the AVX2 loads may reach into the slack: keep it defined */
    for (int c = 0; c < h->wc; c++)
        memset(h->planes + (size_t)c * h->ips + h->sw, 0, h->ips - (size_t)h->sw);
}

/* Contract: resample.h.  One call for all rows keeps the per-row cost at
 * the kernel call (the loop's state stays in this frame). */
void
fl_hrows(const fl_hrow_plan *h, const uint8_t *src, size_t sstride, int n, uint8_t *dst, const uint8_t **rows)
{
    const size_t dstride = (size_t)h->nhp * h->wc;
    for (int y = 0; y < n; y++, src += sstride, dst += dstride) {
        fl_hrow(h, src, dst);
        rows[y] = dst;
    }
}

/* Contract: resample.h. */
void
fl_hrow_portable(const fl_hrow_plan *h, const uint8_t *s, uint8_t *d)
{
    if (h->wc == 3) {
        fl_split3_c(s, h->sw, h->planes, h->ips);
        h->c(h->ax, h->planes, h->ips, h->wc, d, (size_t)h->nhp, h->nh);
    } else {
        h->c(h->ax, s, h->ips, h->wc, d, (size_t)h->nhp, h->nh);
    }
}

/* Contract: resample.h. */
void
fl_vrow_portable(const int32_t *k, int n, const uint8_t *const *rows, int32_t *acc, uint8_t *d, int len)
{
    fl_vpass_c(k, n, rows, acc, d, len);
}

/* Contract: resample.h. */
void
fl_split3_portable(const uint8_t *s, int n, uint8_t *d, size_t ps)
{
    fl_split3_c(s, n, d, ps);
}
