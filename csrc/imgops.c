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
 *   horizontal coefficients (outputs computed in reversed order).  uint8
 *   CHW rows are stored with memcpy, other dtypes through the table.
 * - Crop then resize (RandomResizedCrop) means the filter sees only the box;
 *   Resize + CenterCrop means the box is the whole image and the window is
 *   cut afterwards.  Both are "resample the box, then take a window".
 * - Region views: at full scale the filter is set up on the box alone (as
 *   Pillow sees the cropped image), whatever part of it the buffer holds, so
 *   a buffer holding fl_plan_source_window's rectangle renders exactly as
 *   the whole image.  Scaled views (libjpeg DCT scaling): the box is mapped
 *   into buffer coordinates, possibly fractional; the same code then
 *   resamples the mapped interval with the filter clipped at the pixels it
 *   touches.
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
 * `base` (which may lie outside the buffer), `insize` pixels from base form
 * the filter's domain (Pillow's input size), resized to out_size; outputs
 * [o0, o1) are wanted. */
typedef struct {
    double in0, in1;
    int base, insize, out_size;
    int o0, o1;
    int need;                  /* 0: this axis is not resampled (identity) */
    double scale, support, filterscale;
    int ksize;                 /* taps stride in the coefficient table */
    int kmax;                  /* largest tap count of a wanted output */
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
    a->support = 1.0 * a->filterscale;    /* bilinear support is 1 */
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
 * `len` pixels, resized to out_size, outputs [o0, o1) wanted (o0 < o1).
 * Sets everything but lo/cnt/k/kmax.  Returns 0, or -1 when the box misses
 * the buffer.
 *
 * An integral box (always the case at full scale) is resampled exactly as
 * Pillow resamples the cropped image: the filter is clipped at the box, in
 * box coordinates, whatever part of the box the buffer holds; that is exact
 * as long as the buffer holds every pixel the wanted outputs read (the
 * window fl_plan_source_window reports).  Otherwise (a fractional box from
 * a DCT-scaled view, or a buffer lacking some of those pixels) the box is
 * clipped to the buffer and the filter to the pixels it covers. */
static int
fl_axis_setup(fl_axis *a, double b0, double b1, int len, int out_size, int o0, int o1)
{
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
    fl_axis_span(a);
    if (a->in_lo < 0 || a->in_hi > len || a->in_hi <= a->in_lo)
        return -1;
    return 0;
}

/* Fill lo/cnt/k (arrays of o1 - o0, and (o1 - o0) * ksize) exactly as
 * Pillow computes and rounds them, and kmax; w is ksize doubles of work
 * space. */
static void
fl_axis_fill(fl_axis *a, double *w)
{
    double ss = 1.0 / a->filterscale;
    a->kmax = 0;
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
        if (n > a->kmax)
            a->kmax = n;
    }
}

/* Reverse the order of the wanted outputs (a horizontal flip computed by
 * the resample itself: every output is independent of the others). */
static void
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
/* Resample kernels                                                         */
/*                                                                          */
/* Rows between the passes are planar: a row of n pixels with wc channels   */
/* is wc planes of n bytes at a plane stride.  The horizontal pass reads    */
/* planes (source rows are split first), so both passes work on runs of     */
/* single-channel bytes; the output is CHW-shaped already.                  */
/*                                                                          */
/* Each kernel has a portable C version and an AVX2 version (picked at run  */
/* time); both compute exactly Pillow's integer sums (non-negative weights, */
/* 32-bit accumulators starting at 1 << 21), so the results are identical.  */
/* ------------------------------------------------------------------------ */

#define FL_HTAB_TAP 64   /* AVX2 horizontal table: bytes per (block, tap) */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define FL_X86_SIMD 1
#include <immintrin.h>
#define FL_AVX2 __attribute__((target("avx2")))
#endif

/* 1 when the AVX2 kernels run: the CPU has AVX2 and FASTLOADER_NO_AVX2 is
 * unset (or "0"); the variable exists to test the portable kernels. */
static int
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

typedef void (*fl_hpass_fn)(const fl_axis *, const uint8_t *, size_t, int, uint8_t *, size_t, int);

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
 * of the block) loads the 16 plane bytes from off[2 * block + l] and, for
 * tap j, one byte shuffle puts each output's tap pixel, zero extended, in
 * its 32-bit slot; a 32-bit multiply by the tap weights and an add follow.
 * tab holds per block and tap the 32 shuffle bytes and the 8 weights (0 for
 * missing taps, whose shuffle byte is 0x80 = zero).  Needs every output's
 * taps within its lane's 16 bytes (fl_htab_build checks). */

static int
fl_htab_build(const fl_axis *a, int nh, int kb, int32_t *off, uint8_t *tab)
{
    const int nb = (nh + 7) / 8, ks = a->ksize;
    for (int b = 0; b < nb; b++) {
        uint8_t *T = tab + (size_t)b * kb * FL_HTAB_TAP;
        for (int l = 0; l < 2; l++) {
            int base = -1;
            for (int q = 0; q < 4; q++) {
                int i = 8 * b + 4 * l + q;
                if (i < nh && a->cnt[i] > 0 && (base < 0 || a->lo[i] < base))
                    base = a->lo[i];
            }
            if (base < 0)
                base = 0;
            off[2 * b + l] = base;
            for (int q = 0; q < 4; q++) {
                int i = 8 * b + 4 * l + q;
                for (int j = 0; j < kb; j++) {
                    uint8_t *ix = T + (size_t)j * FL_HTAB_TAP + 16 * l + 4 * q;
                    int32_t w = 0;
                    ix[0] = ix[1] = ix[2] = ix[3] = 0x80;
                    if (i < nh && j < a->cnt[i]) {
                        int p = a->lo[i] + j - base;
                        if (p > 15)
                            return -1;
                        ix[0] = (uint8_t)p;
                        w = a->k[(size_t)i * ks + j];
                    }
                    memcpy(T + (size_t)j * FL_HTAB_TAP + 32 + 4 * (4 * l + q), &w, sizeof w);
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

/* acc += shuffle(d, tap j's bytes) * tap j's weights */
#define FL_HTAP(acc, d, T, j)                                                                       \
    acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(                                                  \
        _mm256_shuffle_epi8(d, _mm256_loadu_si256((const __m256i *)(const void *)((T) + (j) * FL_HTAB_TAP))), \
        _mm256_loadu_si256((const __m256i *)(const void *)((T) + (j) * FL_HTAB_TAP + 32))))

FL_AVX2 static inline __attribute__((always_inline)) void
fl_hpass_avx2_body(const uint8_t *planes, size_t ips, int wc, int nb, const int kb, const int32_t *off,
                   const uint8_t *tab, uint8_t *out, size_t ops)
{
    const __m256i rnd = _mm256_set1_epi32(1 << (FL_PREC - 1));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    if (wc == 3) {
        for (int b = 0; b < nb; b++) {
            const uint8_t *T = tab + (size_t)b * kb * FL_HTAB_TAP;
            const uint8_t *p0 = planes + off[2 * b], *p1 = planes + off[2 * b + 1];
            const __m256i d0 = fl_load2x128(p0, p1);
            const __m256i d1 = fl_load2x128(p0 + ips, p1 + ips);
            const __m256i d2 = fl_load2x128(p0 + 2 * ips, p1 + 2 * ips);
            __m256i a0 = rnd, a1 = rnd, a2 = rnd;
            for (int j = 0; j < kb; j++) {
                FL_HTAP(a0, d0, T, j);
                FL_HTAP(a1, d1, T, j);
                FL_HTAP(a2, d2, T, j);
            }
            a0 = _mm256_srai_epi32(a0, FL_PREC);
            a1 = _mm256_srai_epi32(a1, FL_PREC);
            a2 = _mm256_srai_epi32(a2, FL_PREC);
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
            const __m256i d0 = fl_load2x128(planes + off[2 * b], planes + off[2 * b + 1]);
            __m256i a0 = rnd;
            for (int j = 0; j < kb; j++)
                FL_HTAP(a0, d0, T, j);
            a0 = _mm256_srai_epi32(a0, FL_PREC);
            __m256i p = _mm256_packus_epi32(a0, a0);
            p = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p, p), perm);
            _mm_storel_epi64((__m128i *)(void *)(out + 8 * (size_t)b), _mm256_castsi256_si128(p));
        }
    }
}

/* Writes 8 * ceil(nh / 8) bytes per output plane. */
FL_AVX2 static void
fl_hpass_avx2(const uint8_t *planes, size_t ips, int wc, int nh, int kb, const int32_t *off, const uint8_t *tab,
              uint8_t *out, size_t ops)
{
    const int nb = (nh + 7) / 8;
    switch (kb) {   /* constant tap counts unroll the tap loop */
    case 2: fl_hpass_avx2_body(planes, ips, wc, nb, 2, off, tab, out, ops); break;
    case 3: fl_hpass_avx2_body(planes, ips, wc, nb, 3, off, tab, out, ops); break;
    case 4: fl_hpass_avx2_body(planes, ips, wc, nb, 4, off, tab, out, ops); break;
    case 5: fl_hpass_avx2_body(planes, ips, wc, nb, 5, off, tab, out, ops); break;
    case 6: fl_hpass_avx2_body(planes, ips, wc, nb, 6, off, tab, out, ops); break;
    case 7: fl_hpass_avx2_body(planes, ips, wc, nb, 7, off, tab, out, ops); break;
    default: fl_hpass_avx2_body(planes, ips, wc, nb, kb, off, tab, out, ops); break;
    }
}

/* AVX2 vertical pass for one output row (see fl_vpass_c); accumulators stay
 * in registers, 32 bytes at a time. */
FL_AVX2 static void
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

/* Split n interleaved RGB pixels into three planes (stride ps), 16 at a time. */
FL_AVX2 static void
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
#endif /* FL_X86_SIMD */


/* ------------------------------------------------------------------------ */
/* Row emitters: one finished uint8 row in output order, planar (wc planes  */
/* of out_w bytes at stride ps) -> output row oy through the table.         */
/* ------------------------------------------------------------------------ */

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
                else                                                                                 \
                    for (int x = 0; x < out_w; x++)                                                  \
                        d[x] = l[s[x]];                                                              \
            }                                                                                        \
        } else {                                                                                     \
            T *d = out + (size_t)oy * out_w * C;                                                     \
            if (C == 1) {                                                                            \
                for (int x = 0; x < out_w; x++)                                                      \
                    d[x] = lut[0][row[x]];                                                           \
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

typedef void (*fl_emit_fn)(const fl_tspec *, const void *, const uint8_t *, size_t, int, int, int, int, void *);

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

/* ------------------------------------------------------------------------ */
/* Geometry: the plan mapped onto a buffer                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    int out_w, out_h;
    int cx0, cx1, cy0, cy1;    /* output window ∩ resized image, resized coordinates */
    int empty;                 /* the window misses the image */
    fl_axis ax, ay;
} fl_geom;

/* Check the plan and map it onto a vw x vh buffer at origin (ox, oy) and
 * scale (sx, sy).  Returns 0, -1 for an invalid plan, -2 when the box
 * misses the buffer. */
static int
fl_geom_setup(const fl_tspec *t, const fl_plan *plan, int vw, int vh, double ox, double oy, double sx, double sy,
              fl_geom *g)
{
    memset(g, 0, sizeof *g);
    g->out_w = t->out_w ? t->out_w : plan->out_w;
    g->out_h = t->out_w ? t->out_h : plan->out_h;
    const int out_w = g->out_w, out_h = g->out_h;
    if (plan->box_w <= 0 || plan->box_h <= 0 || plan->rs_w <= 0 || plan->rs_h <= 0 || plan->rs_w > FL_MAX_DIM
        || plan->rs_h > FL_MAX_DIM || out_w <= 0 || out_h <= 0 || out_w > FL_MAX_DIM || out_h > FL_MAX_DIM
        || plan->box_w > FL_MAX_DIM || plan->box_h > FL_MAX_DIM || plan->box_x < -FL_MAX_DIM
        || plan->box_x > FL_MAX_DIM || plan->box_y < -FL_MAX_DIM || plan->box_y > FL_MAX_DIM
        || plan->win_x < -FL_MAX_DIM || plan->win_x > FL_MAX_DIM || plan->win_y < -FL_MAX_DIM
        || plan->win_y > FL_MAX_DIM)
        return -1;
    g->cx0 = plan->win_x > 0 ? plan->win_x : 0;
    g->cx1 = plan->win_x + out_w < plan->rs_w ? plan->win_x + out_w : plan->rs_w;
    g->cy0 = plan->win_y > 0 ? plan->win_y : 0;
    g->cy1 = plan->win_y + out_h < plan->rs_h ? plan->win_y + out_h : plan->rs_h;
    g->empty = g->cx1 <= g->cx0 || g->cy1 <= g->cy0;
    if (g->empty)
        return 0;
    double bx0 = plan->box_x * sx - ox;
    double bx1 = (plan->box_x + (double)plan->box_w) * sx - ox;
    double by0 = plan->box_y * sy - oy;
    double by1 = (plan->box_y + (double)plan->box_h) * sy - oy;
    if (fl_axis_setup(&g->ax, bx0, bx1, vw, plan->rs_w, g->cx0, g->cx1) < 0
        || fl_axis_setup(&g->ay, by0, by1, vh, plan->rs_h, g->cy0, g->cy1) < 0)
        return -2;
    return 0;
}

void
fl_plan_source_window(const fl_tspec *t, const fl_plan *plan, int src_w, int src_h, int *x0, int *y0, int *x1,
                      int *y1)
{
    fl_geom g;
    int rc = src_w > 0 && src_h > 0 ? fl_geom_setup(t, plan, src_w, src_h, 0.0, 0.0, 1.0, 1.0, &g) : -1;
    if (rc < 0) {   /* nothing to narrow down: fl_render reports the error */
        *x0 = *y0 = 0;
        *x1 = src_w > 0 ? src_w : 0;
        *y1 = src_h > 0 ? src_h : 0;
    } else if (g.empty) {   /* all padding: any one pixel will do */
        *x0 = plan->box_x < 0 ? 0 : plan->box_x >= src_w ? src_w - 1 : plan->box_x;
        *y0 = plan->box_y < 0 ? 0 : plan->box_y >= src_h ? src_h - 1 : plan->box_y;
        *x1 = *x0 + 1;
        *y1 = *y0 + 1;
    } else {
        *x0 = g.ax.in_lo;
        *x1 = g.ax.in_hi;
        *y0 = g.ay.in_lo;
        *y1 = g.ay.in_hi;
    }
}

/* ------------------------------------------------------------------------ */
/* Render                                                                   */
/* ------------------------------------------------------------------------ */

static void
fl_reverse_bytes(uint8_t *d, const uint8_t *s, int n)
{
    for (int x = 0; x < n; x++)
        d[x] = s[n - 1 - x];
}

int
fl_render(const fl_tspec *t, const fl_plan *plan, const fl_view *src, void *out, fl_scratch *scratch,
          char *msg, size_t msglen)
{
    if (src == NULL || src->data == NULL || src->w <= 0 || src->h <= 0
        || (src->channels != 1 && src->channels != 3) || src->stride < (size_t)src->w * src->channels
        || !(src->scale_x > 0) || !(src->scale_y > 0)) {
        fl_set_msg(msg, msglen, "render: invalid source view");
        return -1;
    }
    fl_geom g;
    int grc = fl_geom_setup(t, plan, src->w, src->h, src->origin_x, src->origin_y, src->scale_x, src->scale_y, &g);
    if (grc == -1) {
        fl_set_msg(msg, msglen, "render: invalid plan (box %d x %d, resized %d x %d, out %d x %d)", plan->box_w,
                   plan->box_h, plan->rs_w, plan->rs_h, g.out_w, g.out_h);
        return -1;
    }
    if (grc == -2) {
        fl_set_msg(msg, msglen, "render: crop box (%d, %d, %d, %d) lies outside the decoded %d x %d buffer",
                   plan->box_x, plan->box_y, plan->box_w, plan->box_h, src->w, src->h);
        return -1;
    }
    const int out_w = g.out_w, out_h = g.out_h;
    const int C = t->out_channels;
    const int gray_in = src->channels == 1;
    const int to_gray = src->channels == 3 && C == 1;   /* convert("L") before resizing */
    const int wc = gray_in || to_gray ? 1 : 3;          /* working channels */
    const int empty = g.empty;
    const int cx0 = g.cx0, cx1 = g.cx1, cy0 = g.cy0, cy1 = g.cy1;
    fl_axis *ax = &g.ax, *ay = &g.ay;
    const int simd = fl_use_avx2();

    const int nh = empty ? 0 : cx1 - cx0;              /* resized columns computed */
    const int nv = empty ? 0 : cy1 - cy0;              /* resized rows computed */
    const int sx0 = ax->in_lo, sw = empty ? 0 : ax->in_hi - ax->in_lo;   /* source columns read */
    const int sy0 = ay->in_lo, sh = empty ? 0 : ay->in_hi - ay->in_lo;   /* source rows read */

    /* Pass order, as Pillow >= 12 chooses it: vertical first when the height
     * shrinks by more than twice as many pixels as the width (older Pillow
     * always ran horizontal first).  Only matters when both axes resample. */
    const int both = !empty && ax->need && ay->need;
    const int vfirst = both && (ay->insize - plan->rs_h) > 0
                       && (ay->insize - plan->rs_h) > (ax->insize - plan->rs_w) * 2;
    const int hneed = !empty && ax->need;
    const int htmp = hneed && !vfirst;   /* horizontal pass over all rows up front */
    /* Plane stride of horizontally resampled rows (the AVX2 kernel writes
     * whole blocks of 8); every byte of it is written. */
    const int nhp = hneed && simd ? (nh + 7) & ~7 : nh;
    const size_t ips = ((size_t)sw + 31) / 32 * 32 + 32;   /* split source planes, 16+ bytes of slack */
    /* Width in bytes of the rows the vertical pass combines. */
    const int vlen = hneed ? (vfirst ? sw * wc : nhp * wc) : nh * wc;

    /* Scratch layout. */
    fl_layout L = {0, 0};
    size_t o_hk = 0, o_hlo = 0, o_hcnt = 0, o_vk = 0, o_vlo = 0, o_vcnt = 0, o_htab = 0, o_hoff = 0;
    size_t o_gray = 0, o_work = 0, o_tmp = 0, o_rows = 0, o_acc = 0, o_vrow = 0, o_hrow = 0, o_planes = 0;
    size_t o_prow = 0;
    size_t o_line = fl_reserve(&L, (size_t)out_w * wc, 1);
    size_t lut_es = t->dtype == FL_DT_F32 ? 4 : t->dtype == FL_DT_U8 ? 1 : 2;
    size_t o_lut = fl_reserve(&L, 3 * 256, lut_es);
    if (!empty) {
        if (ax->need) {
            o_hk = fl_reserve(&L, (size_t)nh * ax->ksize, sizeof(int32_t));
            o_hlo = fl_reserve(&L, (size_t)nh, sizeof(int));
            o_hcnt = fl_reserve(&L, (size_t)nh, sizeof(int));
            if (simd) {
                o_htab = fl_reserve(&L, (size_t)nhp / 8 * ax->ksize, FL_HTAB_TAP);
                o_hoff = fl_reserve(&L, (size_t)nhp / 8 * 2, sizeof(int32_t));
            }
            o_planes = fl_reserve(&L, ips * wc, 1);
            if (htmp)
                o_tmp = fl_reserve(&L, (size_t)sh * nhp * wc, 1);
            else
                o_hrow = fl_reserve(&L, (size_t)nhp * wc, 1);
        } else {
            o_prow = fl_reserve(&L, (size_t)nh * wc, 1);
        }
        if (ay->need) {
            o_vk = fl_reserve(&L, (size_t)nv * ay->ksize, sizeof(int32_t));
            o_vlo = fl_reserve(&L, (size_t)nv, sizeof(int));
            o_vcnt = fl_reserve(&L, (size_t)nv, sizeof(int));
            if (!simd)
                o_acc = fl_reserve(&L, (size_t)vlen, sizeof(int32_t));
            o_vrow = fl_reserve(&L, (size_t)vlen, 1);
        }
        o_work = fl_reserve(&L, (size_t)(ax->ksize > ay->ksize ? ax->ksize : ay->ksize), sizeof(double));
        if (to_gray)
            o_gray = fl_reserve(&L, (size_t)sh * sw, 1);
        o_rows = fl_reserve(&L, (size_t)sh, sizeof(uint8_t *));
    }
    if (L.overflow) {
        fl_set_msg(msg, msglen, "render: scratch size overflows");
        return -2;
    }
    if (scratch->cap < L.total) {
        free(scratch->p);   /* contents need not survive: plain malloc, no copy */
        scratch->p = malloc(L.total);
        scratch->cap = scratch->p ? L.total : 0;
        if (scratch->p == NULL) {
            fl_set_msg(msg, msglen, "render: out of memory (%zu bytes of scratch)", L.total);
            return -2;
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
            emit(t, lut, line, (size_t)out_w, wc, out_w, out_h, oy, out);
        return 0;
    }

    /* Working source: rows sy0.., columns sx0.., wc channels interleaved. */
    const uint8_t *wsrc;
    size_t wstride;
    if (to_gray) {
        uint8_t *gr = S + o_gray;
        for (int y = 0; y < sh; y++) {
            const uint8_t *s = src->data + (size_t)(sy0 + y) * src->stride + (size_t)sx0 * 3;
            uint8_t *d = gr + (size_t)y * sw;
            for (int x = 0; x < sw; x++, s += 3)   /* Pillow's convert("L"): ITU-R 601-2 luma, 16-bit fixed point */
                d[x] = (uint8_t)((s[0] * 19595u + s[1] * 38470u + s[2] * 7471u + 0x8000u) >> 16);
        }
        wsrc = gr;
        wstride = (size_t)sw;
    } else {
        wsrc = src->data + (size_t)sy0 * src->stride + (size_t)sx0 * wc;
        wstride = src->stride;
    }

    /* Coefficients (once per call), horizontal ones in output order. */
    double *work = (double *)(void *)(S + o_work);
    int hsimd = 0;
    fl_hpass_fn hpass_c = NULL;
    int32_t *hoff = NULL;
    uint8_t *htab = NULL;
    if (ax->need) {
        ax->k = (int32_t *)(void *)(S + o_hk);
        ax->lo = (int *)(void *)(S + o_hlo);
        ax->cnt = (int *)(void *)(S + o_hcnt);
        fl_axis_fill(ax, work);
        if (plan->flip)
            fl_axis_reverse(ax);
#ifdef FL_X86_SIMD
        if (simd) {
            hoff = (int32_t *)(void *)(S + o_hoff);
            htab = S + o_htab;
            hsimd = fl_htab_build(ax, nh, ax->kmax, hoff, htab) == 0;
        }
#endif
        if (!hsimd) {
            fl_axis_make_fixed(ax);
            hpass_c = fl_hpass_pick(ax);
        }
    }
    if (ay->need) {
        ay->k = (int32_t *)(void *)(S + o_vk);
        ay->lo = (int *)(void *)(S + o_vlo);
        ay->cnt = (int *)(void *)(S + o_vcnt);
        fl_axis_fill(ay, work);
    }
    uint8_t *planes = S + o_planes;
    if (ax->need)   /* the AVX2 loads may reach into the slack: keep it defined */
        for (int c = 0; c < wc; c++)
            memset(planes + (size_t)c * ips + sw, 0, ips - (size_t)sw);

/* Horizontal pass of one interleaved row s (sw pixels) into d (planes of nhp). */
#ifdef FL_X86_SIMD
#define FL_HROW(s, d)                                                                      \
    do {                                                                                   \
        if (hsimd) {                                                                       \
            if (wc == 3)                                                                   \
                fl_split3_avx2((s), sw, planes, ips);                                      \
            else                                                                           \
                memcpy(planes, (s), (size_t)sw);                                           \
            fl_hpass_avx2(planes, ips, wc, nh, ax->kmax, hoff, htab, (d), (size_t)nhp);    \
        } else if (wc == 3) {                                                              \
            fl_split3_c((s), sw, planes, ips);                                             \
            hpass_c(ax, planes, ips, wc, (d), (size_t)nhp, nh);                            \
        } else {                                                                           \
            hpass_c(ax, (s), ips, wc, (d), (size_t)nhp, nh);                               \
        }                                                                                  \
    } while (0)
#else
#define FL_HROW(s, d)                                                                      \
    do {                                                                                   \
        if (wc == 3) {                                                                     \
            fl_split3_c((s), sw, planes, ips);                                             \
            hpass_c(ax, planes, ips, wc, (d), (size_t)nhp, nh);                            \
        } else {                                                                           \
            hpass_c(ax, (s), ips, wc, (d), (size_t)nhp, nh);                               \
        }                                                                                  \
    } while (0)
#endif

    /* rows[y]: the vertical pass's input row for source row sy0 + y, either
     * the horizontally resampled row (planar; horizontal first) or the
     * source row (interleaved). */
    const uint8_t **rows = (const uint8_t **)(void *)(S + o_rows);
    for (int y = 0; y < sh; y++) {
        if (htmp) {
            uint8_t *d = S + o_tmp + (size_t)y * nhp * wc;
            FL_HROW(wsrc + (size_t)y * wstride, d);
            rows[y] = d;
        } else {
            rows[y] = wsrc + (size_t)y * wstride;
        }
    }

    int32_t *acc = (int32_t *)(void *)(S + o_acc);
    uint8_t *vrow = S + o_vrow, *hrow = S + o_hrow, *prow = S + o_prow;
    /* Output columns that come from the image (the rest is padding). */
    const int ox_lo = plan->flip ? out_w - (cx1 - plan->win_x) : cx0 - plan->win_x;

    for (int oy = 0; oy < out_h; oy++) {
        int ry = plan->win_y + oy;
        if (ry < cy0 || ry >= cy1) {
            memset(line, 0, (size_t)out_w * wc);
            emit(t, lut, line, (size_t)out_w, wc, out_w, out_h, oy, out);
            continue;
        }
        const uint8_t *r;     /* the finished row: planar, nh pixels in output order */
        size_t ps;            /* its plane stride */
        if (ay->need) {
            const int i = ry - cy0;
            const int32_t *k = ay->k + (size_t)i * ay->ksize;
            const uint8_t *const *rr = rows + ay->lo[i];
#ifdef FL_X86_SIMD
            if (simd)
                fl_vpass_avx2(k, ay->cnt[i], rr, vrow, vlen);
            else
#endif
                fl_vpass_c(k, ay->cnt[i], rr, acc, vrow, vlen);
            r = vrow;
        } else {
            r = rows[ry - cy0];
        }
        if (hneed) {
            if (!htmp) {   /* vertical first: now the horizontal pass */
                FL_HROW(r, hrow);
                r = hrow;
            }
            ps = (size_t)nhp;
        } else {           /* no horizontal resample: split and flip here */
            if (wc == 3) {
#ifdef FL_X86_SIMD
                if (simd)
                    fl_split3_avx2(r, nh, prow, (size_t)nh);
                else
#endif
                    fl_split3_c(r, nh, prow, (size_t)nh);
                if (plan->flip)
                    for (int c = 0; c < 3; c++) {
                        uint8_t *p = prow + (size_t)c * nh;
                        for (int a = 0, b = nh - 1; a < b; a++, b--) {
                            uint8_t v = p[a];
                            p[a] = p[b];
                            p[b] = v;
                        }
                    }
                r = prow;
            } else if (plan->flip) {
                fl_reverse_bytes(prow, r, nh);
                r = prow;
            }
            ps = (size_t)nh;
        }
        if (ox_lo == 0 && nh == out_w) {   /* no horizontal padding: emit straight from the row */
            emit(t, lut, r, ps, wc, out_w, out_h, oy, out);
            continue;
        }
        /* Window into output order, zero padding outside the image. */
        for (int c = 0; c < wc; c++) {
            uint8_t *d = line + (size_t)c * out_w;
            if (ox_lo > 0)
                memset(d, 0, (size_t)ox_lo);
            if (ox_lo + nh < out_w)
                memset(d + ox_lo + nh, 0, (size_t)(out_w - ox_lo - nh));
            memcpy(d + ox_lo, r + (size_t)c * ps, (size_t)nh);
        }
        emit(t, lut, line, (size_t)out_w, wc, out_w, out_h, oy, out);
    }
#undef FL_HROW
    return 0;
}
