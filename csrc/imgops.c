/* imgops.c: sample planning (torchvision's random/geometric rules) and the
 * fused render pass (crop, antialiased resize, window, flip, channel/dtype
 * conversion, Normalize, layout).
 *
 * Design notes
 * - Exactness.  torchvision on PIL images resizes with Pillow's separable
 *   fixed-point resampler: horizontal pass into a uint8 intermediate, then a
 *   vertical pass; triangle filter whose support grows with the downscale
 *   factor; per-output weights normalised in double and rounded to 22-bit
 *   fixed point; accumulator starting at 1 << 21; clip to uint8.  We do the
 *   same arithmetic in the same order, so at full scale the uint8 output is
 *   bit-identical.  Each intermediate value depends only on its own source
 *   row, so computing only the rows and columns the output window needs
 *   changes nothing.  The vertical pass runs taps-outer / pixels-inner (a
 *   sum of non-negative integers, so the order does not change the result)
 *   which the compiler vectorises.
 * - Crop then resize (RandomResizedCrop) means the filter sees only the box;
 *   Resize + CenterCrop means the box is the whole image and the window is
 *   cut afterwards.  Both are "resample the box, then take a window".
 * - Scaled views (libjpeg DCT scaling, region decode): the box is mapped into
 *   buffer coordinates, possibly fractional; the same code then resamples
 *   the mapped interval with the filter clipped at the pixels it touches.
 * - Dtype conversion and Normalize go through a per-channel 256-entry table
 *   built with torch's own float32 operations, so every output is one load.
 * - Memory: everything per call comes from the caller's fl_scratch, grown
 *   with malloc/free only (no GIL needed, nothing Python).
 */
#include "imgops.h"
#include "rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FL_PREC 22   /* Pillow's PRECISION_BITS (32 - 8 - 2) */

/* Hot loops are also compiled for AVX2 (32-bit vector multiplies; baseline
 * x86-64 has none) and picked at load time by the dynamic loader.  Integer
 * arithmetic only, so every clone gives identical results. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define FL_HOT __attribute__((target_clones("avx2", "default")))
#else
#define FL_HOT
#endif

/* Format an error message into msg (may be NULL / 0). */
static void
fl_set_msg(char *msg, size_t msglen, const char *fmt, ...)
{
    if (msg == NULL || msglen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msglen, fmt, ap);
    va_end(ap);
}

/* Python's round() on a double: half to even. */
static double
fl_round_half_even(double x)
{
    double r = floor(x);
    double d = x - r;
    if (d > 0.5 || (d == 0.5 && fmod(r, 2.0) != 0.0))
        r += 1.0;
    return r;
}

static int
fl_finite(double x)
{
    return x == x && x - x == 0.0;
}

/* ------------------------------------------------------------------------ */
/* Spec checks                                                              */
/* ------------------------------------------------------------------------ */

int
fl_tspec_check(const fl_tspec *t, char *msg, size_t msglen)
{
#define FAIL(...) do { fl_set_msg(msg, msglen, __VA_ARGS__); return -1; } while (0)
    if (t->geom < FL_GEOM_NONE || t->geom > FL_GEOM_RESIZE_CROP)
        FAIL("geom: unknown geometry %d", t->geom);
    if (t->out_channels != 1 && t->out_channels != 3)
        FAIL("out_channels: must be 1 or 3, not %d", t->out_channels);
    if (t->dtype < FL_DT_U8 || t->dtype > FL_DT_F32)
        FAIL("dtype: unknown dtype %d", t->dtype);
    if (t->layout != FL_LAYOUT_CHW && t->layout != FL_LAYOUT_HWC)
        FAIL("layout: unknown layout %d", t->layout);
    if (t->scale_to_unit < FL_SCALE_NONE || t->scale_to_unit > FL_SCALE_MUL)
        FAIL("scale_to_unit: must be 0, 1 (x / 255) or 2 (x * (1 / 255)), not %d", t->scale_to_unit);
    if (t->out_h < 0 || t->out_w < 0 || t->out_h > FL_MAX_DIM || t->out_w > FL_MAX_DIM
        || ((t->out_h == 0) != (t->out_w == 0)))
        FAIL("out_h/out_w: %d x %d is not a valid size", t->out_h, t->out_w);
    int has_resize = t->resize_short || t->resize_h || t->resize_w || t->max_size;
    int has_crop = t->crop_h || t->crop_w;
    if (t->geom == FL_GEOM_RRC) {
        if (t->out_h <= 0 || t->out_w <= 0)
            FAIL("out_h/out_w: RandomResizedCrop needs an output size");
        if (!fl_finite(t->scale_lo) || !fl_finite(t->scale_hi) || t->scale_lo < 0 || t->scale_hi <= 0)
            FAIL("scale_lo/scale_hi: invalid RandomResizedCrop scale (%g, %g)", t->scale_lo, t->scale_hi);
        if (!fl_finite(t->ratio_lo) || !fl_finite(t->ratio_hi) || t->ratio_lo <= 0 || t->ratio_hi <= 0)
            FAIL("ratio_lo/ratio_hi: invalid RandomResizedCrop ratio (%g, %g)", t->ratio_lo, t->ratio_hi);
        if (has_resize || has_crop)
            FAIL("resize_*/crop_*: not used with geom rrc (set them to 0)");
    }
    if (t->geom == FL_GEOM_NONE && (has_resize || has_crop))
        FAIL("resize_*/crop_*: not used with geom none (use resize_crop)");
    if (t->resize_short < 0 || t->resize_short > FL_MAX_DIM)
        FAIL("resize_short: %d out of range", t->resize_short);
    if (t->resize_h < 0 || t->resize_w < 0 || t->resize_h > FL_MAX_DIM || t->resize_w > FL_MAX_DIM
        || ((t->resize_h == 0) != (t->resize_w == 0)))
        FAIL("resize_h/resize_w: %d x %d is not a valid size", t->resize_h, t->resize_w);
    if (t->resize_short && t->resize_h)
        FAIL("resize_short: give either resize_short or resize_h/resize_w");
    if (t->max_size < 0 || t->max_size > FL_MAX_DIM)
        FAIL("max_size: %d out of range", t->max_size);
    if (t->max_size && t->resize_h)
        FAIL("max_size: only allowed with a shorter-side resize (resize_short)");
    if (t->max_size && t->resize_short && t->max_size <= t->resize_short)
        FAIL("max_size: %d must be strictly greater than the requested size %d", t->max_size, t->resize_short);
    if (t->crop_h < 0 || t->crop_w < 0 || t->crop_h > FL_MAX_DIM || t->crop_w > FL_MAX_DIM
        || ((t->crop_h == 0) != (t->crop_w == 0)))
        FAIL("crop_h/crop_w: %d x %d is not a valid size", t->crop_h, t->crop_w);
    if (t->geom == FL_GEOM_RESIZE_CROP && t->out_w) {
        if (has_crop && (t->out_w != t->crop_w || t->out_h != t->crop_h))
            FAIL("out_h/out_w: %d x %d differs from the crop %d x %d", t->out_h, t->out_w, t->crop_h, t->crop_w);
        if (!has_crop && t->resize_h && (t->out_w != t->resize_w || t->out_h != t->resize_h))
            FAIL("out_h/out_w: %d x %d differs from the resize %d x %d", t->out_h, t->out_w, t->resize_h,
                 t->resize_w);
    }
    if (!fl_finite(t->flip_p) || t->flip_p < 0 || t->flip_p > 1)
        FAIL("flip_p: %g is not a probability", t->flip_p);
    if (t->normalize) {
        if (t->dtype == FL_DT_U8)
            FAIL("normalize: needs a floating-point dtype (Normalize rejects uint8 tensors)");
        for (int c = 0; c < t->out_channels; c++) {
            if (!fl_finite(t->mean[c]) || !fl_finite(t->std[c]))
                FAIL("mean/std: channel %d is not finite", c);
            if (t->std[c] == 0.0f)
                FAIL("std: channel %d is zero (division by zero)", c);
        }
    }
    return 0;
#undef FAIL
}

size_t
fl_tspec_sample_bytes(const fl_tspec *t)
{
    static const size_t elsize[4] = {1, 2, 2, 4};
    size_t es = (t->dtype >= FL_DT_U8 && t->dtype <= FL_DT_F32) ? elsize[t->dtype] : 0;
    if (t->out_h <= 0 || t->out_w <= 0 || (t->out_channels != 1 && t->out_channels != 3))
        return 0;
    return (size_t)t->out_h * (size_t)t->out_w * (size_t)t->out_channels * es;
}

/* ------------------------------------------------------------------------ */
/* Planning                                                                 */
/* ------------------------------------------------------------------------ */

/* torchvision RandomResizedCrop.get_params on a W x H image.  Writes the box
 * (x, y, w, h); always a valid non-empty box inside the image. */
static void
fl_rrc_box(const fl_tspec *t, int W, int H, fl_rng *rng, fl_plan *p)
{
    double area = (double)W * (double)H;
    double log_lo = log(t->ratio_lo), log_hi = log(t->ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target_area = area * fl_rng_uniform(rng, t->scale_lo, t->scale_hi);
        double aspect = exp(fl_rng_uniform(rng, log_lo, log_hi));
        double wd = fl_round_half_even(sqrt(target_area * aspect));
        double hd = fl_round_half_even(sqrt(target_area / aspect));
        if (wd > 0 && wd <= W && hd > 0 && hd <= H) {
            int w = (int)wd, h = (int)hd;
            p->box_y = (int)fl_rng_below(rng, (uint64_t)(H - h + 1));
            p->box_x = (int)fl_rng_below(rng, (uint64_t)(W - w + 1));
            p->box_w = w;
            p->box_h = h;
            return;
        }
    }
    /* Central fallback. */
    double rmin = fmin(t->ratio_lo, t->ratio_hi), rmax = fmax(t->ratio_lo, t->ratio_hi);
    double in_ratio = (double)W / (double)H;
    int w = W, h = H;
    if (in_ratio < rmin) {
        h = (int)fl_round_half_even((double)w / rmin);
    } else if (in_ratio > rmax) {
        w = (int)fl_round_half_even((double)h * rmax);
    }
    /* torchvision can produce an empty box here for 1-pixel-wide images;
     * keep at least one pixel (and never more than the image). */
    if (h < 1) h = 1;
    if (w < 1) w = 1;
    if (h > H) h = H;
    if (w > W) w = W;
    p->box_x = (W - w) / 2;
    p->box_y = (H - h) / 2;
    p->box_w = w;
    p->box_h = h;
}

/* torchvision's _compute_resized_output_size for a W x H image.  Returns 0
 * with *rw x *rh, or -1 with msg (empty or oversized result). */
static int
fl_resize_size(const fl_tspec *t, int W, int H, int *rw, int *rh, char *msg, size_t msglen)
{
    double new_w, new_h;
    if (t->resize_h) {
        new_w = t->resize_w;
        new_h = t->resize_h;
    } else if (t->resize_short || t->max_size) {
        int w_is_short = W <= H;
        double shrt = w_is_short ? W : H, lng = w_is_short ? H : W;
        double new_short, new_long;
        if (t->resize_short) {
            new_short = t->resize_short;
            /* int(requested * long / short): exact product, one rounded division, truncation */
            new_long = trunc((double)t->resize_short * lng / shrt);
            if (t->max_size && new_long > t->max_size) {
                new_short = trunc((double)t->max_size * new_short / new_long);
                new_long = t->max_size;
            }
        } else {   /* Resize(size=None, max_size=m) */
            new_short = trunc((double)t->max_size * shrt / lng);
            new_long = t->max_size;
        }
        new_w = w_is_short ? new_short : new_long;
        new_h = w_is_short ? new_long : new_short;
    } else {
        new_w = W;
        new_h = H;
    }
    if (!(new_w >= 1 && new_h >= 1 && new_w <= FL_MAX_DIM && new_h <= FL_MAX_DIM)) {
        fl_set_msg(msg, msglen, "image %d x %d resizes to an invalid size %.0f x %.0f", W, H, new_w, new_h);
        return -1;
    }
    *rw = (int)new_w;
    *rh = (int)new_h;
    return 0;
}

/* CenterCrop's offset along one axis of length n for a crop of length c,
 * including torchvision's padding (left pad = (c - n) // 2). */
static int
fl_center_offset(int n, int c)
{
    if (c > n)
        return -((c - n) / 2);
    return (int)fl_round_half_even((double)(n - c) / 2.0);
}

int
fl_plan_sample(const fl_tspec *t, int src_w, int src_h, uint64_t seed, uint64_t epoch, uint64_t index,
               fl_plan *out, char *msg, size_t msglen)
{
    if (fl_tspec_check(t, msg, msglen) < 0)
        return -1;
    if (src_w <= 0 || src_h <= 0 || src_w > FL_MAX_DIM || src_h > FL_MAX_DIM) {
        fl_set_msg(msg, msglen, "invalid source size %d x %d", src_w, src_h);
        return -1;
    }
    fl_rng rng;
    fl_rng_init(&rng, seed, epoch, index);
    fl_plan p;
    memset(&p, 0, sizeof p);
    p.box_w = src_w;
    p.box_h = src_h;
    p.rs_w = src_w;
    p.rs_h = src_h;
    p.out_w = src_w;
    p.out_h = src_h;
    if (t->geom == FL_GEOM_RRC) {
        fl_rrc_box(t, src_w, src_h, &rng, &p);
        p.rs_w = p.out_w = t->out_w;
        p.rs_h = p.out_h = t->out_h;
    } else if (t->geom == FL_GEOM_RESIZE_CROP) {
        if (fl_resize_size(t, src_w, src_h, &p.rs_w, &p.rs_h, msg, msglen) < 0)
            return -1;
        p.out_w = p.rs_w;
        p.out_h = p.rs_h;
        if (t->crop_w) {
            p.win_x = fl_center_offset(p.rs_w, t->crop_w);
            p.win_y = fl_center_offset(p.rs_h, t->crop_h);
            p.out_w = t->crop_w;
            p.out_h = t->crop_h;
        }
    }
    if (t->out_w && (p.out_w != t->out_w || p.out_h != t->out_h)) {
        fl_set_msg(msg, msglen,
                   "image %d x %d gives a %d x %d sample, not the batch's %d x %d "
                   "(add a CenterCrop or resize to a fixed (h, w))",
                   src_w, src_h, p.out_w, p.out_h, t->out_w, t->out_h);
        return -1;
    }
    if (t->flip_p > 0)
        p.flip = fl_rng_uniform(&rng, 0.0, 1.0) < t->flip_p;
    *out = p;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Resampling coefficients (Pillow's precompute_coeffs + fixed point)       */
/* ------------------------------------------------------------------------ */

/* One axis of the resample: the box [in0, in1) relative to buffer index
 * `base`, `insize` buffer pixels available from base, resized to out_size;
 * outputs [o0, o1) are wanted. */
typedef struct {
    double in0, in1;
    int base, insize, out_size;
    int o0, o1;
    int need;                  /* 0: this axis is not resampled (identity) */
    double scale, support, filterscale;
    int ksize;                 /* taps stride in the coefficient table */
    int fixed;                 /* every output has exactly ksize taps (see fl_axis_make_fixed) */
    int in_lo, in_hi;          /* buffer pixels read by outputs [o0, o1) */
    int *lo, *cnt;             /* per wanted output: first buffer pixel (relative to in_lo), taps */
    int32_t *k;                /* per wanted output: ksize fixed-point weights */
} fl_axis;

static double
fl_triangle(double x)
{
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return 1.0 - x;
    return 0.0;
}

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

/* Map the box [b0, b1) (buffer coordinates) of one axis onto a buffer of
 * `len` pixels, resized to out_size, outputs [o0, o1) wanted (o0 < o1).
 * Sets everything but lo/cnt/k.  Returns 0, or -1 when the box misses the
 * buffer. */
static int
fl_axis_setup(fl_axis *a, double b0, double b1, int len, int out_size, int o0, int o1)
{
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
    a->out_size = out_size;
    a->o0 = o0;
    a->o1 = o1;
    a->need = !(out_size == a->insize && a->in0 == 0.0 && a->in1 == (double)out_size);
    a->lo = a->cnt = NULL;
    a->k = NULL;
    if (!a->need) {
        a->ksize = 1;
        a->in_lo = lo + o0;
        a->in_hi = lo + o1;
        return 0;
    }
    a->scale = (a->in1 - a->in0) / out_size;
    a->filterscale = a->scale < 1.0 ? 1.0 : a->scale;
    a->support = 1.0 * a->filterscale;    /* bilinear support is 1 */
    a->ksize = (int)ceil(a->support) * 2 + 1;
    double c;
    int xmin0, n0, xmin1, n1;
    fl_axis_bounds(a, o0, &c, &xmin0, &n0);
    fl_axis_bounds(a, o1 - 1, &c, &xmin1, &n1);
    /* Bounds are monotonic in the output index, so the ends bound the union. */
    a->in_lo = lo + xmin0;
    a->in_hi = lo + (xmin1 + n1 > xmin0 ? xmin1 + n1 : xmin0);
    return 0;
}

/* Fill lo/cnt/k (arrays of o1 - o0, and (o1 - o0) * ksize) exactly as
 * Pillow computes and rounds them; w is ksize doubles of work space. */
static void
fl_axis_fill(fl_axis *a, double *w)
{
    double ss = 1.0 / a->filterscale;
    for (int xx = a->o0; xx < a->o1; xx++) {
        int i = xx - a->o0, xmin, n;
        double center;
        fl_axis_bounds(a, xx, &center, &xmin, &n);
        double ww = 0.0;
        for (int x = 0; x < n; x++) {
            w[x] = fl_triangle((x + xmin - center + 0.5) * ss);
            ww += w[x];
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
    }
}

/* Give every output exactly ksize taps, so the horizontal pass can run a
 * fixed-length, fully unrolled loop: windows near the right edge slide left
 * and the weights move with them; the added taps weigh 0, so sums (and
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

static inline uint8_t
fl_clip8(int32_t v)
{
    v >>= FL_PREC;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* ------------------------------------------------------------------------ */
/* Output tables and dtype conversion                                       */
/* ------------------------------------------------------------------------ */

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
/* Row emitters: one finished uint8 row (out_w pixels, wc channels, in       */
/* output order) -> output row oy through the table.                        */
/* ------------------------------------------------------------------------ */

#define FL_DEFINE_EMIT(NAME, T)                                                            \
    FL_HOT static void NAME(const fl_tspec *t, const void *lutv, const uint8_t *line, int wc,      \
                     int out_w, int out_h, int oy, void *outv)                               \
    {                                                                                        \
        const T(*lut)[256] = (const T(*)[256])lutv;                                          \
        T *out = (T *)outv;                                                                  \
        int C = t->out_channels;                                                             \
        if (t->layout == FL_LAYOUT_CHW) {                                                    \
            for (int c = 0; c < C; c++) {                                                    \
                const T *l = lut[c];                                                         \
                T *d = out + ((size_t)c * out_h + oy) * out_w;                               \
                if (wc == 1) {                                                               \
                    for (int x = 0; x < out_w; x++)                                          \
                        d[x] = l[line[x]];                                                   \
                } else {                                                                     \
                    const uint8_t *s = line + c;                                             \
                    for (int x = 0; x < out_w; x++)                                          \
                        d[x] = l[s[3 * x]];                                                  \
                }                                                                            \
            }                                                                                \
        } else {                                                                             \
            T *d = out + (size_t)oy * out_w * C;                                             \
            if (C == 1) {                                                                    \
                for (int x = 0; x < out_w; x++)                                              \
                    d[x] = lut[0][line[x]];                                                  \
            } else if (wc == 1) {                                                            \
                for (int x = 0; x < out_w; x++) {                                            \
                    uint8_t v = line[x];                                                     \
                    d[3 * x] = lut[0][v];                                                    \
                    d[3 * x + 1] = lut[1][v];                                                \
                    d[3 * x + 2] = lut[2][v];                                                \
                }                                                                            \
            } else {                                                                         \
                for (int x = 0; x < out_w; x++) {                                            \
                    d[3 * x] = lut[0][line[3 * x]];                                          \
                    d[3 * x + 1] = lut[1][line[3 * x + 1]];                                  \
                    d[3 * x + 2] = lut[2][line[3 * x + 2]];                                  \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

FL_DEFINE_EMIT(fl_emit_u8, uint8_t)
FL_DEFINE_EMIT(fl_emit_u16, uint16_t)
FL_DEFINE_EMIT(fl_emit_f32, float)

typedef void (*fl_emit_fn)(const fl_tspec *, const void *, const uint8_t *, int, int, int, int, void *);

/* ------------------------------------------------------------------------ */
/* Scratch                                                                  */
/* ------------------------------------------------------------------------ */

void
fl_scratch_free(fl_scratch *s)
{
    if (s == NULL)
        return;
    free(s->p);
    s->p = NULL;
    s->cap = 0;
}

/* Bump allocator over one scratch block; sizes are summed first (with
 * overflow checks), then the block is grown and carved. */
typedef struct {
    size_t total;
    int overflow;
} fl_layout;

static size_t
fl_reserve(fl_layout *L, size_t n, size_t elsize)
{
    size_t off = (L->total + 63) & ~(size_t)63;
    if (elsize && n > (SIZE_MAX - off - 64) / elsize) {
        L->overflow = 1;
        return 0;
    }
    L->total = off + n * elsize;
    return off;
}

/* Horizontal pass kernels: one row s (source pixels from the axis' in_lo,
 * wc channels) -> d (nh resized pixels).  KS > 0 is a compile-time tap count
 * (fixed axes), KS == 0 reads the per-output count. */
#define FL_HPASS_BODY(KS, WC)                                                             \
    for (int i = 0; i < nh; i++) {                                                        \
        const int32_t *k = ax->k + (size_t)i * ks;                                         \
        const uint8_t *p = s + (size_t)ax->lo[i] * (WC);                                   \
        const int n = (KS) ? (KS) : ax->cnt[i];                                            \
        int32_t a0 = 1 << (FL_PREC - 1), a1 = a0, a2 = a0;                                 \
        for (int j = 0; j < n; j++) {                                                      \
            a0 += p[(WC) * j] * k[j];                                                      \
            if ((WC) == 3) {                                                               \
                a1 += p[3 * j + 1] * k[j];                                                 \
                a2 += p[3 * j + 2] * k[j];                                                 \
            }                                                                              \
        }                                                                                  \
        d[(WC) * i] = fl_clip8(a0);                                                        \
        if ((WC) == 3) {                                                                   \
            d[3 * i + 1] = fl_clip8(a1);                                                   \
            d[3 * i + 2] = fl_clip8(a2);                                                   \
        }                                                                                  \
    }

#define FL_DEFINE_HPASS(KS)                                                                \
    FL_HOT static void fl_hpass_k##KS(const fl_axis *ax, const uint8_t *s, uint8_t *d, int nh, int wc) \
    {                                                                                      \
        const int ks = ax->ksize;                                                          \
        if (wc == 1) {                                                                     \
            FL_HPASS_BODY(KS, 1)                                                           \
        } else {                                                                           \
            FL_HPASS_BODY(KS, 3)                                                           \
        }                                                                                  \
    }

FL_DEFINE_HPASS(0)
FL_DEFINE_HPASS(3)
FL_DEFINE_HPASS(5)
FL_DEFINE_HPASS(7)
FL_DEFINE_HPASS(9)

typedef void (*fl_hpass_fn)(const fl_axis *, const uint8_t *, uint8_t *, int, int);

/* The horizontal kernel for an axis (after fl_axis_make_fixed). */
static fl_hpass_fn
fl_hpass_pick(const fl_axis *ax)
{
    if (ax->fixed) {
        switch (ax->ksize) {
        case 3: return fl_hpass_k3;
        case 5: return fl_hpass_k5;
        case 7: return fl_hpass_k7;
        case 9: return fl_hpass_k9;
        default: break;
        }
    }
    return fl_hpass_k0;
}

/* One vertical pass row: taps rows[lo + j] (len bytes each) -> d. */
FL_HOT static void
fl_vpass_row(const fl_axis *ay, int i, const uint8_t *const *rows, int32_t *acc, uint8_t *d, int len)
{
    const int32_t *k = ay->k + (size_t)i * ay->ksize;
    for (int x = 0; x < len; x++)
        acc[x] = 1 << (FL_PREC - 1);
    for (int j = 0; j < ay->cnt[i]; j++) {
        const uint8_t *s = rows[ay->lo[i] + j];
        const int32_t kj = k[j];
        for (int x = 0; x < len; x++)
            acc[x] += s[x] * kj;
    }
    for (int x = 0; x < len; x++)
        d[x] = fl_clip8(acc[x]);
}

/* ------------------------------------------------------------------------ */
/* Render                                                                   */
/* ------------------------------------------------------------------------ */

int
fl_render(const fl_tspec *t, const fl_plan *plan, const fl_view *src, void *out, fl_scratch *scratch,
          char *msg, size_t msglen)
{
    int out_w = t->out_w ? t->out_w : plan->out_w;
    int out_h = t->out_w ? t->out_h : plan->out_h;
    if (src == NULL || src->data == NULL || src->w <= 0 || src->h <= 0
        || (src->channels != 1 && src->channels != 3) || src->stride < (size_t)src->w * src->channels
        || !(src->scale_x > 0) || !(src->scale_y > 0)) {
        fl_set_msg(msg, msglen, "render: invalid source view");
        return -1;
    }
    if (plan->box_w <= 0 || plan->box_h <= 0 || plan->rs_w <= 0 || plan->rs_h <= 0 || plan->rs_w > FL_MAX_DIM
        || plan->rs_h > FL_MAX_DIM || out_w <= 0 || out_h <= 0 || out_w > FL_MAX_DIM || out_h > FL_MAX_DIM
        || plan->box_w > FL_MAX_DIM || plan->box_h > FL_MAX_DIM || plan->box_x < -FL_MAX_DIM
        || plan->box_x > FL_MAX_DIM || plan->box_y < -FL_MAX_DIM || plan->box_y > FL_MAX_DIM
        || plan->win_x < -FL_MAX_DIM || plan->win_x > FL_MAX_DIM || plan->win_y < -FL_MAX_DIM
        || plan->win_y > FL_MAX_DIM) {
        fl_set_msg(msg, msglen, "render: invalid plan (box %d x %d, resized %d x %d, out %d x %d)", plan->box_w,
                   plan->box_h, plan->rs_w, plan->rs_h, out_w, out_h);
        return -1;
    }
    const int C = t->out_channels;
    const int gray_in = src->channels == 1;
    const int to_gray = src->channels == 3 && C == 1;   /* convert("L") before resizing */
    const int wc = gray_in || to_gray ? 1 : 3;          /* working channels */

    /* Output window ∩ resized image, in resized coordinates. */
    int cx0 = plan->win_x > 0 ? plan->win_x : 0;
    int cx1 = plan->win_x + out_w < plan->rs_w ? plan->win_x + out_w : plan->rs_w;
    int cy0 = plan->win_y > 0 ? plan->win_y : 0;
    int cy1 = plan->win_y + out_h < plan->rs_h ? plan->win_y + out_h : plan->rs_h;
    int empty = cx1 <= cx0 || cy1 <= cy0;

    fl_axis ax, ay;
    memset(&ax, 0, sizeof ax);
    memset(&ay, 0, sizeof ay);
    if (!empty) {
        double bx0 = plan->box_x * src->scale_x - src->origin_x;
        double bx1 = (plan->box_x + (double)plan->box_w) * src->scale_x - src->origin_x;
        double by0 = plan->box_y * src->scale_y - src->origin_y;
        double by1 = (plan->box_y + (double)plan->box_h) * src->scale_y - src->origin_y;
        if (fl_axis_setup(&ax, bx0, bx1, src->w, plan->rs_w, cx0, cx1) < 0
            || fl_axis_setup(&ay, by0, by1, src->h, plan->rs_h, cy0, cy1) < 0) {
            fl_set_msg(msg, msglen, "render: crop box (%d, %d, %d, %d) lies outside the decoded %d x %d buffer",
                       plan->box_x, plan->box_y, plan->box_w, plan->box_h, src->w, src->h);
            return -1;
        }
    }
    const int nh = empty ? 0 : cx1 - cx0;              /* resized columns computed */
    const int nv = empty ? 0 : cy1 - cy0;              /* resized rows computed */
    const int sx0 = ax.in_lo, sw = empty ? 0 : ax.in_hi - ax.in_lo;   /* source columns read */
    const int sy0 = ay.in_lo, sh = empty ? 0 : ay.in_hi - ay.in_lo;   /* source rows read */

    /* Pass order, as Pillow >= 12 chooses it: vertical first when the height
     * shrinks by more than twice as many pixels as the width (older Pillow
     * always ran horizontal first).  Only matters when both axes resample. */
    const int both = !empty && ax.need && ay.need;
    const int vfirst = both && (ay.insize - plan->rs_h) > 0
                       && (ay.insize - plan->rs_h) > (ax.insize - plan->rs_w) * 2;
    const int htmp = !empty && ax.need && !vfirst;   /* horizontal pass over all rows up front */
    /* Width in bytes of the rows the vertical pass combines. */
    const int vlen = (ax.need && vfirst ? sw : nh) * wc;

    /* Scratch layout. */
    fl_layout L = {0, 0};
    size_t o_hk = 0, o_hlo = 0, o_hcnt = 0, o_vk = 0, o_vlo = 0, o_vcnt = 0;
    size_t o_gray = 0, o_work = 0, o_tmp = 0, o_rows = 0, o_acc = 0, o_vrow = 0, o_hrow = 0;
    size_t o_line = fl_reserve(&L, (size_t)out_w * wc, 1);
    size_t lut_es = t->dtype == FL_DT_F32 ? 4 : t->dtype == FL_DT_U8 ? 1 : 2;
    size_t o_lut = fl_reserve(&L, 3 * 256, lut_es);
    if (!empty) {
        if (ax.need) {
            o_hk = fl_reserve(&L, (size_t)nh * ax.ksize, sizeof(int32_t));
            o_hlo = fl_reserve(&L, (size_t)nh, sizeof(int));
            o_hcnt = fl_reserve(&L, (size_t)nh, sizeof(int));
            if (htmp)
                o_tmp = fl_reserve(&L, (size_t)sh * nh * wc, 1);
            else
                o_hrow = fl_reserve(&L, (size_t)nh * wc, 1);
        }
        if (ay.need) {
            o_vk = fl_reserve(&L, (size_t)nv * ay.ksize, sizeof(int32_t));
            o_vlo = fl_reserve(&L, (size_t)nv, sizeof(int));
            o_vcnt = fl_reserve(&L, (size_t)nv, sizeof(int));
            o_acc = fl_reserve(&L, (size_t)vlen, sizeof(int32_t));
            o_vrow = fl_reserve(&L, (size_t)vlen, 1);
        }
        o_work = fl_reserve(&L, (size_t)(ax.ksize > ay.ksize ? ax.ksize : ay.ksize), sizeof(double));
        if (to_gray)
            o_gray = fl_reserve(&L, (size_t)sh * sw, 1);
        o_rows = fl_reserve(&L, (size_t)sh, sizeof(uint8_t *));
    }
    if (L.overflow) {
        fl_set_msg(msg, msglen, "render: scratch size overflows");
        return -1;
    }
    if (scratch->cap < L.total) {
        free(scratch->p);   /* contents need not survive: plain malloc, no copy */
        scratch->p = malloc(L.total);
        scratch->cap = scratch->p ? L.total : 0;
        if (scratch->p == NULL) {
            fl_set_msg(msg, msglen, "render: out of memory (%zu bytes of scratch)", L.total);
            return -1;
        }
    }
    uint8_t *S = (uint8_t *)scratch->p;
    uint8_t *line = S + o_line;
    void *lut = S + o_lut;

    /* Conversion table. */
    fl_emit_fn emit;
    if (t->dtype == FL_DT_U8) {
        uint8_t(*l8)[256] = (uint8_t(*)[256])lut;
        for (int c = 0; c < 3; c++)
            for (int v = 0; v < 256; v++)
                l8[c][v] = (uint8_t)v;
        emit = fl_emit_u8;
    } else if (t->dtype == FL_DT_F32) {
        float(*lf)[256] = (float(*)[256])lut;
        for (int c = 0; c < C; c++)
            for (int v = 0; v < 256; v++)
                lf[c][v] = fl_value_f32(t, c, v);
        emit = fl_emit_f32;
    } else {
        uint16_t(*lh)[256] = (uint16_t(*)[256])lut;
        for (int c = 0; c < C; c++)
            for (int v = 0; v < 256; v++) {
                float f = fl_value_f32(t, c, v);
                lh[c][v] = t->dtype == FL_DT_F16 ? fl_f32_to_f16(f) : fl_f32_to_bf16(f);
            }
        emit = fl_emit_u16;
    }

    if (empty) {   /* the window misses the image: all padding */
        memset(line, 0, (size_t)out_w * wc);
        for (int oy = 0; oy < out_h; oy++)
            emit(t, lut, line, wc, out_w, out_h, oy, out);
        return 0;
    }

    /* Working source: rows sy0.., columns sx0.., wc channels. */
    const uint8_t *wsrc;
    size_t wstride;
    if (to_gray) {
        uint8_t *g = S + o_gray;
        for (int y = 0; y < sh; y++) {
            const uint8_t *s = src->data + (size_t)(sy0 + y) * src->stride + (size_t)sx0 * 3;
            uint8_t *d = g + (size_t)y * sw;
            for (int x = 0; x < sw; x++, s += 3)   /* Pillow's convert("L"): ITU-R 601-2 luma, 16-bit fixed point */
                d[x] = (uint8_t)((s[0] * 19595u + s[1] * 38470u + s[2] * 7471u + 0x8000u) >> 16);
        }
        wsrc = g;
        wstride = (size_t)sw;
    } else {
        wsrc = src->data + (size_t)sy0 * src->stride + (size_t)sx0 * wc;
        wstride = src->stride;
    }

    double *work = (double *)(void *)(S + o_work);
    if (ax.need) {
        ax.k = (int32_t *)(void *)(S + o_hk);
        ax.lo = (int *)(void *)(S + o_hlo);
        ax.cnt = (int *)(void *)(S + o_hcnt);
        fl_axis_fill(&ax, work);
        fl_axis_make_fixed(&ax);
    }
    fl_hpass_fn hpass = ax.need ? fl_hpass_pick(&ax) : NULL;
    if (ay.need) {
        ay.k = (int32_t *)(void *)(S + o_vk);
        ay.lo = (int *)(void *)(S + o_vlo);
        ay.cnt = (int *)(void *)(S + o_vcnt);
        fl_axis_fill(&ay, work);
    }

    /* rows[y]: the vertical pass's input row for source row sy0 + y, either
     * the horizontally resampled row (horizontal first) or the source row. */
    const uint8_t **rows = (const uint8_t **)(void *)(S + o_rows);
    for (int y = 0; y < sh; y++) {
        if (htmp) {
            uint8_t *d = S + o_tmp + (size_t)y * nh * wc;
            hpass(&ax, wsrc + (size_t)y * wstride, d, nh, wc);
            rows[y] = d;
        } else {
            rows[y] = wsrc + (size_t)y * wstride;
        }
    }

    int32_t *acc = (int32_t *)(void *)(S + o_acc);
    uint8_t *vrow = S + o_vrow, *hrow = S + o_hrow;
    const int rowlen = nh * wc;
    /* Output columns that come from the image (the rest is padding). */
    const int ox_lo = plan->flip ? out_w - (cx1 - plan->win_x) : cx0 - plan->win_x;

    for (int oy = 0; oy < out_h; oy++) {
        int ry = plan->win_y + oy;
        if (ry < cy0 || ry >= cy1) {
            memset(line, 0, (size_t)out_w * wc);
            emit(t, lut, line, wc, out_w, out_h, oy, out);
            continue;
        }
        const uint8_t *r;
        if (ay.need) {
            fl_vpass_row(&ay, ry - cy0, rows, acc, vrow, vlen);
            r = vrow;
        } else {
            r = rows[ry - cy0];
        }
        if (ax.need && !htmp) {   /* vertical first: now the horizontal pass */
            hpass(&ax, r, hrow, nh, wc);
            r = hrow;
        }
        /* Window + flip into output order, zero padding outside the image. */
        if (ox_lo > 0)
            memset(line, 0, (size_t)ox_lo * wc);
        if (ox_lo + nh < out_w)
            memset(line + (size_t)(ox_lo + nh) * wc, 0, (size_t)(out_w - ox_lo - nh) * wc);
        uint8_t *d = line + (size_t)ox_lo * wc;
        if (!plan->flip) {
            memcpy(d, r, (size_t)rowlen);
        } else if (wc == 1) {
            for (int x = 0; x < nh; x++)
                d[x] = r[nh - 1 - x];
        } else {
            for (int x = 0; x < nh; x++) {
                const uint8_t *p = r + 3 * (nh - 1 - x);
                d[3 * x] = p[0];
                d[3 * x + 1] = p[1];
                d[3 * x + 2] = p[2];
            }
        }
        emit(t, lut, line, wc, out_w, out_h, oy, out);
    }
    return 0;
}
