/* mix.c: MixUp and CutMix on a finished batch (interface and reference
 * semantics: mix.h).
 *
 * No Python, no GIL: caller-owned memory only, nothing allocated here.
 * Compiled in ISO C mode (-std=c11), so the float products and sums below
 * are not contracted into fused multiply-adds: each rounds to float32, as
 * torch's separate mul_ and add_ do.
 */
#include "image/mix.h"
#include "core/rng.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* A Gamma(a, 1) draw and its logarithm, from the same numbers as
 * fl_rng_gamma(r, a) draws (for a < 1 the boost U^(1/a) first, then a
 * Gamma(a + 1) draw), so the value is fl_rng_gamma's.  a > 0. */
static double
mix_gamma(fl_rng *r, double a, double *logx)
{
    if (a < 1.0) {
        double u = 1.0 - fl_rng_uniform(r, 0.0, 1.0);   /* (0, 1] */
        double g = fl_rng_gamma(r, a + 1.0);
        *logx = log(g) + log(u) / a;
        return g * pow(u, 1.0 / a);
    }
    double g = fl_rng_gamma(r, a);
    *logx = log(g);
    return g;
}

/* A Beta(a, a) draw, a > 0: x / (x + y) of two Gamma(a) draws; when a boost
 * underflows (alpha far below 0.01: U^(1/a) under DBL_MIN) the same ratio from
 * the logarithms, so a tiny alpha still gives lambdas near 0 or 1 as it
 * should, not 0.5 or a NaN.  In [0, 1]. */
static double
mix_beta(fl_rng *r, double a)
{
    double lx, ly;
    double x = mix_gamma(r, a, &lx), y = mix_gamma(r, a, &ly);
    if (x >= DBL_MIN && y >= DBL_MIN)
        return x / (x + y);
    return 1.0 / (1.0 + exp(ly - lx));
}

/* Contract: mix.h. */
int
fl_mix_draw(const fl_mix_spec *s, int H, int W, uint64_t seed, uint64_t epoch, uint64_t batch,
            fl_mix_params *out, fl_err *err)
{
    if (s == NULL || s->n < 1 || s->n > FL_MIX_MAX_CHOICES || H <= 0 || W <= 0) {
        fl_err_set(err, FL_ERR_INVALID, 0, "mix: invalid spec or batch size %d x %d", H, W);
        return -1;
    }
    double total = 0.0;
    for (int i = 0; i < s->n; i++) {
        if ((s->kind[i] != FL_MIX_MIXUP && s->kind[i] != FL_MIX_CUTMIX) || !(s->alpha[i] > 0.0)
            || !(s->alpha[i] < 1e6) || !(s->p[i] >= 0.0) || !(s->p[i] < 1e300)) {
            fl_err_set(err, FL_ERR_INVALID, 0, "mix: choice %d has an invalid kind, alpha or weight", i);
            return -1;
        }
        total += s->p[i];
    }
    if (!(total > 0.0)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "mix: the choices' weights sum to zero");
        return -1;
    }
    /* a stream of its own: the samples' streams are keyed by the seed itself */
    fl_rng r;
    fl_rng_init(&r, fl_mix64(seed ^ 0x6D69785F62617463ULL), epoch, batch);
    int pick = 0;
    if (s->n > 1) {
        double u = fl_rng_uniform(&r, 0.0, total), acc = 0.0;
        for (pick = 0; pick < s->n - 1; pick++) {
            acc += s->p[pick];
            if (u < acc)
                break;
        }
    }
    double lam = mix_beta(&r, s->alpha[pick]);
    memset(out, 0, sizeof *out);
    out->kind = s->kind[pick];
    out->lam = lam;
    if (out->kind == FL_MIX_CUTMIX) {
        int rx = (int)fl_rng_below(&r, (uint64_t)W), ry = (int)fl_rng_below(&r, (uint64_t)H);
        double rr = 0.5 * sqrt(1.0 - lam);
        int rw = (int)(rr * W), rh = (int)(rr * H);
        out->x1 = rx - rw < 0 ? 0 : rx - rw;
        out->y1 = ry - rh < 0 ? 0 : ry - rh;
        out->x2 = rx + rw > W ? W : rx + rw;
        out->y2 = ry + rh > H ? H : ry + rh;
        out->lam = 1.0 - (double)(out->x2 - out->x1) * (double)(out->y2 - out->y1) / ((double)W * (double)H);
    }
    return 0;
}

/* Contract: mix.h. */
int
fl_mix_images_f32(const fl_mix_params *p, float *x, int N, int C, int H, int W, float *tmp, fl_err *err)
{
    if (N <= 0 || C <= 0 || H <= 0 || W <= 0 || (p->kind != FL_MIX_MIXUP && p->kind != FL_MIX_CUTMIX)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "mix: invalid batch %d x %d x %d x %d", N, C, H, W);
        return -1;
    }
    if (p->kind == FL_MIX_CUTMIX && (p->x1 < 0 || p->y1 < 0 || p->x2 > W || p->y2 > H)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "mix: CutMix box (%d, %d, %d, %d) outside %d x %d", p->x1, p->y1, p->x2,
                   p->y2, W, H);
        return -1;
    }
    const size_t plane = (size_t)H * W, n = (size_t)C * plane;
    memcpy(tmp, x + (size_t)(N - 1) * n, n * sizeof(float));   /* x[-1]'s original, for sample 0 */
    if (p->kind == FL_MIX_MIXUP) {
        const float a = (float)(1.0 - p->lam), b = (float)p->lam;
        for (int i = N - 1; i >= 0; i--) {   /* backwards: x[i - 1] is still the original */
            float *d = x + (size_t)i * n;
            const float *r = i ? d - n : tmp;
            for (size_t k = 0; k < n; k++) {
                float ra = r[k] * a, xb = d[k] * b;
                d[k] = ra + xb;
            }
        }
        return 0;
    }
    if (p->x2 <= p->x1 || p->y2 <= p->y1)
        return 0;
    const size_t run = (size_t)(p->x2 - p->x1) * sizeof(float);
    for (int i = N - 1; i >= 0; i--) {
        float *d = x + (size_t)i * n;
        const float *r = i ? d - n : tmp;
        for (int c = 0; c < C; c++)
            for (int y = p->y1; y < p->y2; y++) {
                size_t o = (size_t)c * plane + (size_t)y * W + p->x1;
                memcpy(d + o, r + o, run);
            }
    }
    return 0;
}

/* Contract: mix.h. */
int
fl_mix_labels(const fl_mix_params *p, const int64_t *labels, int N, int num_classes, float *out, fl_err *err)
{
    if (N <= 0 || num_classes <= 0) {
        fl_err_set(err, FL_ERR_INVALID, 0, "mix: invalid label shape %d x %d", N, num_classes);
        return -1;
    }
    for (int i = 0; i < N; i++) {
        if (labels[i] < 0 || labels[i] >= num_classes) {
            fl_err_set(err, FL_ERR_INVALID, 0, "mix: label %lld at position %d is not in 0..%d",
                       (long long)labels[i], i, num_classes - 1);
            return -1;
        }
    }
    const float a = (float)(1.0 - p->lam), b = (float)p->lam;
    memset(out, 0, (size_t)N * num_classes * sizeof(float));
    for (int i = 0; i < N; i++) {
        float *row = out + (size_t)i * num_classes;
        int own = (int)labels[i], prev = (int)labels[i ? i - 1 : N - 1];
        /* each entry is r * a + x * b with r, x in {0, 1}, as torch computes it */
        row[prev] = a;
        row[own] = own == prev ? a + b : b;
    }
    return 0;
}

/* ---- timm's Mixup ---------------------------------------------------------- */

/* Contract: mix.h. */
int
fl_timm_mix_count(const fl_timm_mix_spec *s, int N)
{
    if (s == NULL || N <= 0)
        return 0;
    switch (s->mode) {
    case FL_TIMM_MODE_BATCH: return 1;
    case FL_TIMM_MODE_PAIR: return N / 2;
    case FL_TIMM_MODE_ELEM: return N;
    default: return 0;
    }
}

/* The spec's own checks (not the batch's).  Returns 0, or -1 with err filled. */
static int
timm_check_spec(const fl_timm_mix_spec *s, fl_err *err)
{
    if (s == NULL || s->mode < FL_TIMM_MODE_BATCH || s->mode > FL_TIMM_MODE_ELEM || s->num_classes <= 0) {
        fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: invalid mode or num_classes");
        return -1;
    }
    if (!(fabs(s->mixup_alpha) < 1e6) || !(fabs(s->cutmix_alpha) < 1e6) || !isfinite(s->smoothing)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: alphas must be finite and below 1e6, label_smoothing "
                   "finite");
        return -1;
    }
    if (s->minmax && !(s->minmax_lo >= 0.0 && s->minmax_lo < s->minmax_hi && s->minmax_hi <= 1.0)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: cutmix_minmax (%g, %g) must satisfy 0 <= min < max <= 1",
                   s->minmax_lo, s->minmax_hi);
        return -1;
    }
    if (s->enabled && !(s->mixup_alpha > 0.0) && !(s->cutmix_alpha > 0.0)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: one of mixup_alpha > 0, cutmix_alpha > 0 must hold");
        return -1;
    }
    return 0;
}

/* One draw of timm's _params_per_batch (f32 = 0) or of one element of
 * _params_per_elem (f32 = 1: lam rounded to float32), then its box by
 * cutmix_bbox_and_lam.  Returns 0, or -1 with err filled (cutmix_minmax
 * leaves no side for H or W). */
static int
timm_draw_one(const fl_timm_mix_spec *s, fl_rng *r, int f32, int H, int W, fl_timm_mix_params *o, fl_err *err)
{
    memset(o, 0, sizeof *o);
    o->lam_draw = o->lam = 1.0;
    if (!s->enabled || !(fl_rng_uniform(r, 0.0, 1.0) < s->prob))
        return 0;
    int cut;
    if (s->mixup_alpha > 0.0 && s->cutmix_alpha > 0.0)
        cut = fl_rng_uniform(r, 0.0, 1.0) < s->switch_prob;
    else
        cut = !(s->mixup_alpha > 0.0);
    double lam = mix_beta(r, cut ? s->cutmix_alpha : s->mixup_alpha);
    if (f32)
        lam = (double)(float)lam;   /* lam_mix.astype(np.float32) */
    o->cutmix = cut;
    o->lam_draw = o->lam = lam;
    if (lam == 1.0)                 /* timm: `if lam == 1.: return` / `if lam != 1.:` */
        return 0;
    o->mixed = 1;
    if (!cut)
        return 0;
    const double area = (double)H * (double)W;
    if (s->minmax) {
        /* rand_bbox_minmax: randint(int(H * lo), int(H * hi)), the same for W, then the corner */
        int lh = (int)(H * s->minmax_lo), hh = (int)(H * s->minmax_hi);
        int lw = (int)(W * s->minmax_lo), hw = (int)(W * s->minmax_hi);
        if (lh >= hh || lw >= hw) {
            fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: cutmix_minmax (%g, %g) leaves no CutMix box size for "
                       "a %d x %d image: int(side * min) >= int(side * max), where timm's np.random.randint "
                       "raises a ValueError", s->minmax_lo, s->minmax_hi, H, W);
            return -1;
        }
        int ch = lh + (int)fl_rng_below(r, (uint64_t)(hh - lh));
        int cw = lw + (int)fl_rng_below(r, (uint64_t)(hw - lw));
        int yl = (int)fl_rng_below(r, (uint64_t)(H - ch + 1));
        int xl = (int)fl_rng_below(r, (uint64_t)(W - cw + 1));
        o->nrandint = 4;
        o->randint[0] = ch; o->randint[1] = cw; o->randint[2] = yl; o->randint[3] = xl;
        o->yl = yl; o->yh = yl + ch; o->xl = xl; o->xh = xl + cw;
        o->lam = 1.0 - (double)ch * (double)cw / area;
    } else {
        /* rand_bbox: ratio sqrt(1 - lam); with a float32 lam numpy stays in float32 */
        int ch, cw;
        if (f32) {
            float ratio = sqrtf(1.0f - (float)lam);
            ch = (int)((float)H * ratio);
            cw = (int)((float)W * ratio);
        } else {
            double ratio = sqrt(1.0 - lam);
            ch = (int)(H * ratio);
            cw = (int)(W * ratio);
        }
        int cy = (int)fl_rng_below(r, (uint64_t)H), cx = (int)fl_rng_below(r, (uint64_t)W);
        o->nrandint = 2;
        o->randint[0] = cy; o->randint[1] = cx;
        int yl = cy - ch / 2, yh = cy + (ch + 1) / 2, xl = cx - cw / 2, xh = cx + (cw + 1) / 2;
        o->yl = yl < 0 ? 0 : yl > H ? H : yl;
        o->yh = yh < 0 ? 0 : yh > H ? H : yh;
        o->xl = xl < 0 ? 0 : xl > W ? W : xl;
        o->xh = xh < 0 ? 0 : xh > W ? W : xh;
        if (s->correct_lam)
            o->lam = 1.0 - (double)(o->yh - o->yl) * (double)(o->xh - o->xl) / area;
    }
    if (f32)
        o->lam = (double)(float)o->lam;   /* lam_batch[i] = lam: stored in a float32 array */
    return 0;
}

/* The batch's checks shared by the three calls.  Returns 0, or -1 with err filled. */
static int
timm_check_batch(const fl_timm_mix_spec *s, int N, int C, int H, int W, fl_err *err)
{
    if (timm_check_spec(s, err) < 0)
        return -1;
    if (N <= 0 || C <= 0 || H <= 0 || W <= 0) {
        fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: invalid batch %d x %d x %d x %d", N, C, H, W);
        return -1;
    }
    if (N % 2) {
        fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: the batch size must be even (timm asserts 'Batch size "
                   "should be even when using this'), got %d", N);
        return -1;
    }
    return 0;
}

/* Contract: mix.h. */
int
fl_timm_mix_draw(const fl_timm_mix_spec *s, int N, int H, int W, uint64_t seed, uint64_t epoch, uint64_t batch,
                 fl_timm_mix_params *out, fl_err *err)
{
    if (timm_check_batch(s, N, 1, H, W, err) < 0)
        return -1;
    /* a stream of its own, apart from torchvision's MixUp / CutMix and the samples' */
    fl_rng r;
    fl_rng_init(&r, fl_mix64(seed ^ 0x74696D6D5F6D6978ULL), epoch, batch);
    int n = fl_timm_mix_count(s, N), f32 = s->mode != FL_TIMM_MODE_BATCH;
    for (int k = 0; k < n; k++)
        if (timm_draw_one(s, &r, f32, H, W, out + k, err) < 0)
            return -1;
    return 0;
}

/* What one sample becomes: 0 unchanged, 1 MixUp with (l, a), 2 its box from its partner. */
typedef struct {
    int op;
    float l, a;
    int yl, yh, xl, xh;
} timm_op;

static timm_op
timm_op_of(const fl_timm_mix_params *p, int f32)
{
    timm_op o = {0, 1.0f, 0.0f, 0, 0, 0, 0};
    if (!p->mixed)
        return o;
    if (p->cutmix) {
        o.op = 2;
        o.yl = p->yl; o.yh = p->yh; o.xl = p->xl; o.xh = p->xh;
        return o;
    }
    o.op = 1;
    o.l = (float)p->lam;
    /* 'batch': 1. - lam in double, then the scalar to float32; 'pair' / 'elem':
     * 1 - lam with lam a numpy float32, a float32 subtraction */
    o.a = f32 ? 1.0f - o.l : (float)(1.0 - p->lam);
    return o;
}

/* d[k] = own[k] * l + other[k] * a for k < n, each product rounded to
 * float32, then the sum; d may be own (the same pointer), never other. */
static void
timm_blend(float *d, const float *own, const float *restrict other, float l, float a, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        float ul = own[k] * l, va = other[k] * a;
        d[k] = ul + va;
    }
}

/* What sample o makes of the n columns x0 .. x0 + n - 1 of one row, from
 * its own original row segment and its partner's: d may be own, never
 * other. */
static void
timm_seg(const timm_op *o, float *d, const float *own, const float *restrict other, int x0, int n)
{
    if (o->op == 1) {
        timm_blend(d, own, other, o->l, o->a, (size_t)n);
        return;
    }
    if (own != d)
        memcpy(d, own, (size_t)n * sizeof(float));
    if (o->op == 2) {
        int lo = o->xl > x0 ? o->xl : x0, hi = o->xh < x0 + n ? o->xh : x0 + n;
        if (hi > lo)
            memcpy(d + (lo - x0), other + (lo - x0), (size_t)(hi - lo) * sizeof(float));
    }
}

/* Whether sample o changes row y of its planes. */
static int
timm_row_touched(const timm_op *o, int y)
{
    return o->op == 1 || (o->op == 2 && y >= o->yl && y < o->yh && o->xh > o->xl);
}

#define TIMM_CHUNK 512   /* columns copied aside at a time where both samples of a pair change a row */

/* Samples i and j = N - 1 - i, each from the originals of both (C planes of
 * H x W at xi and xj). */
static void
timm_mix_pair(const timm_op *oi, const timm_op *oj, float *xi, float *xj, int C, int H, int W)
{
    const size_t n = (size_t)C * H * W;
    if (oi->op != 2 && oj->op != 2) {
        if (oi->op == 1 && oj->op == 1) {
            /* both MixUp ('batch', 'pair', and 'elem' pairs that both mix): one pass */
            const float li = oi->l, ai = oi->a, lj = oj->l, aj = oj->a;
            float *restrict pi = xi, *restrict pj = xj;
            for (size_t k = 0; k < n; k++) {
                float u = pi[k], v = pj[k];
                float ul = u * li, va = v * ai, vl = v * lj, ua = u * aj;
                pi[k] = ul + va;
                pj[k] = vl + ua;
            }
        } else if (oi->op == 1) {
            timm_blend(xi, xi, xj, oi->l, oi->a, n);   /* j stays the original */
        } else if (oj->op == 1) {
            timm_blend(xj, xj, xi, oj->l, oj->a, n);
        }
        return;
    }
    if (oi->op == 2 && oj->op == 2 && oi->yl == oj->yl && oi->yh == oj->yh && oi->xl == oj->xl
        && oi->xh == oj->xh) {
        /* one box for both ('batch', 'pair'): the two samples swap it */
        for (int c = 0; c < C; c++)
            for (int y = oi->yl; y < oi->yh; y++) {
                float *restrict a = xi + ((size_t)c * H + y) * W, *restrict b = xj + ((size_t)c * H + y) * W;
                for (int k = oi->xl; k < oi->xh; k++) {
                    float t = a[k];
                    a[k] = b[k];
                    b[k] = t;
                }
            }
        return;
    }
    float ti[TIMM_CHUNK];
    /* the columns either sample changes in a row both change: all for MixUp, the box for CutMix */
    int c0 = oi->op == 1 || oj->op == 1 ? 0 : (oi->xl < oj->xl ? oi->xl : oj->xl);
    int c1 = oi->op == 1 || oj->op == 1 ? W : (oi->xh > oj->xh ? oi->xh : oj->xh);
    for (int c = 0; c < C; c++)
        for (int y = 0; y < H; y++) {
            int ui = timm_row_touched(oi, y), uj = timm_row_touched(oj, y);
            float *ri = xi + ((size_t)c * H + y) * W, *rj = xj + ((size_t)c * H + y) * W;
            if (ui && uj) {
                /* per chunk: i's originals aside, i in place from j's (still
                 * the originals here), then j in place from the copy */
                for (int x0 = c0; x0 < c1; x0 += TIMM_CHUNK) {
                    int m = c1 - x0 < TIMM_CHUNK ? c1 - x0 : TIMM_CHUNK;
                    memcpy(ti, ri + x0, (size_t)m * sizeof(float));
                    timm_seg(oi, ri + x0, ri + x0, rj + x0, x0, m);
                    timm_seg(oj, rj + x0, rj + x0, ti, x0, m);
                }
            } else if (ui) {
                timm_seg(oi, ri, ri, rj, 0, W);   /* j's row is unchanged: its original */
            } else if (uj) {
                timm_seg(oj, rj, rj, ri, 0, W);
            }
        }
}

/* Contract: mix.h. */
int
fl_timm_mix_images_f32(const fl_timm_mix_spec *s, const fl_timm_mix_params *p, float *x, int N, int C, int H,
                       int W, fl_err *err)
{
    if (timm_check_batch(s, N, C, H, W, err) < 0)
        return -1;
    int n = fl_timm_mix_count(s, N);
    for (int k = 0; k < n; k++)
        if (p[k].mixed && p[k].cutmix
            && (p[k].yl < 0 || p[k].xl < 0 || p[k].yh > H || p[k].xh > W || p[k].yl > p[k].yh
                || p[k].xl > p[k].xh)) {
            fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: CutMix box (%d, %d, %d, %d) of draw %d outside %d x %d",
                       p[k].yl, p[k].yh, p[k].xl, p[k].xh, k, H, W);
            return -1;
        }
    const size_t plane = (size_t)C * H * W;
    const int f32 = s->mode != FL_TIMM_MODE_BATCH;
    for (int i = 0; i < N / 2; i++) {
        int j = N - 1 - i;
        /* 'batch': one draw for all; 'pair': draw i for both; 'elem': each its own */
        const fl_timm_mix_params *pi = s->mode == FL_TIMM_MODE_BATCH ? p : p + i;
        const fl_timm_mix_params *pj = s->mode == FL_TIMM_MODE_ELEM ? p + j : pi;
        timm_op oi = timm_op_of(pi, f32), oj = timm_op_of(pj, f32);
        timm_mix_pair(&oi, &oj, x + (size_t)i * plane, x + (size_t)j * plane, C, H, W);
    }
    return 0;
}

/* Contract: mix.h. */
int
fl_timm_mix_labels(const fl_timm_mix_spec *s, const fl_timm_mix_params *p, const int64_t *labels, int N,
                   float *out, fl_err *err)
{
    if (timm_check_batch(s, N, 1, 1, 1, err) < 0)
        return -1;
    const int nc = s->num_classes;
    for (int i = 0; i < N; i++) {
        if (labels[i] < 0 || labels[i] >= nc) {
            fl_err_set(err, FL_ERR_INVALID, 0, "timm mixup: label %lld at position %d is not in 0..%d",
                       (long long)labels[i], i, nc - 1);
            return -1;
        }
    }
    /* one_hot: torch.full(off_value) then scatter_(on_value), both stored as float32 */
    const double offd = s->smoothing / nc;
    const float off = (float)offd, on = (float)(1.0 - s->smoothing + offd);
    const int f32 = s->mode != FL_TIMM_MODE_BATCH;
    for (int i = 0; i < N; i++) {
        int j = N - 1 - i;
        const fl_timm_mix_params *q = s->mode == FL_TIMM_MODE_BATCH ? p
                                      : s->mode == FL_TIMM_MODE_PAIR ? p + (i < N / 2 ? i : j) : p + i;
        /* y1 * lam + y2 * (1 - lam): 'batch' a Python float (each scalar to
         * float32), 'pair' / 'elem' a float32 tensor (1 - lam in float32) */
        const float l = (float)q->lam, a = f32 ? 1.0f - l : (float)(1.0 - q->lam);
        const float offl = off * l, offa = off * a, onl = on * l, ona = on * a;
        float *row = out + (size_t)i * nc;
        const float bg = offl + offa;
        for (int k = 0; k < nc; k++)
            row[k] = bg;
        int own = (int)labels[i], other = (int)labels[j];
        row[other] = offl + ona;
        row[own] = own == other ? onl + ona : onl + offa;
    }
    return 0;
}
