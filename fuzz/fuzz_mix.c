/* fuzz_mix.c: libFuzzer target "mix" -- the batch stage (image/mix.h): timm's
 * Mixup (fl_timm_mix_draw / _images_f32 / _labels) and torchvision's MixUp /
 * CutMix (fl_mix_draw / _images_f32 / _labels) over their parameter space:
 * the spec (alphas from realistic to NaN, infinite and beyond the limit,
 * cutmix_minmax valid or not, prob and switch_prob, the mode, correct_lam,
 * enabled, label smoothing; torchvision's choices and weights), the batch
 * shape (odd, empty and zero sizes included; rows wider than the chunk the
 * pair loop copies aside), the labels (some out of range) and the pixels
 * (small values, or raw float bit patterns: NaN, infinities, subnormals).
 *
 * Input: FZ_MIX_PARAMS (32, fuzz_common.h) parameter bytes, laid out below in
 * LLVMFuzzerTestOneInput; the rest are pixel bytes (repeated to fill the batch;
 * zeros when there are none).  scripts/make_fuzz_corpus.py writes its seeds
 * in this layout.
 *
 * Contracts checked (besides ASan/UBSan):
 * - every call returns 0 or -1, and -1 comes with FL_ERR_INVALID and a
 *   message; a spec or batch the checks below call invalid fails, a valid one
 *   succeeds (timm: unless cutmix_minmax leaves no box side, which only a
 *   CutMix draw may report); the images are unchanged after a failure;
 * - the draws are deterministic (the same call twice gives the same records)
 *   and within timm's ranges: lam in [0, 1], 1 exactly when nothing mixes, a
 *   float32 value in 'pair' / 'elem', CutMix only when its alpha is > 0, the
 *   box's integers inside the ranges timm's randint calls ask for and the
 *   box derived from them again here (rand_bbox / rand_bbox_minmax written
 *   again), lam from the box's area when corrected; torchvision's box inside
 *   the image and its lam from the area;
 * - the mixed images and soft labels equal, bit for bit (or both NaN), an
 *   oracle written here from the formulas of mix.h with a full copy of the
 *   originals (timm: sample i with N - 1 - i; torchvision: with i - 1);
 * - nothing is written past the images or the labels (guard bytes).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "image/mix.h"

#define FZ_MIX_MAX_FLOATS ((size_t)1 << 20)

static double
alpha_for(uint8_t b)
{
    static const double special[] = {0.0, -1.0, 1e-3, 1e-6, 1e5, NAN, INFINITY, 2e6, 0.004, 0.02, 1.0, 0.2,
                                     -INFINITY, 999999.0, 1e-300, 0.5};
    return b < 240 ? b / 40.0 : special[b - 240];
}

static double
prob_for(uint8_t b)
{
    static const double special[] = {0.0, 1.0, NAN, INFINITY, -1.0, 0.5, 1e-9, 0.999999};
    return b < 248 ? b / 200.0 : special[b - 248];
}

static int
dim_of(uint8_t b)
{
    static const int special[] = {0, 1, 513, 1000, -1, 2};
    return b < 250 ? b % 41 : special[b - 250];
}

/* Both bit patterns equal, or both NaN. */
static int
same_float(float a, float b)
{
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub || (isnan(a) && isnan(b));
}

static void
check_floats(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t k = 0; k < n; k++)
        if (!same_float(got[k], want[k]))
            FZ_FAIL("%s: element %zu is %a, the oracle says %a", what, k, (double)got[k], (double)want[k]);
}

static int
timm_spec_valid(const fl_timm_mix_spec *s)
{
    if (s->mode < 0 || s->mode > 2 || s->num_classes <= 0)
        return 0;
    if (!(fabs(s->mixup_alpha) < 1e6) || !(fabs(s->cutmix_alpha) < 1e6) || !isfinite(s->smoothing))
        return 0;
    if (s->minmax && !(s->minmax_lo >= 0.0 && s->minmax_lo < s->minmax_hi && s->minmax_hi <= 1.0))
        return 0;
    if (s->enabled && !(s->mixup_alpha > 0.0) && !(s->cutmix_alpha > 0.0))
        return 0;
    return 1;
}

static int
clip(int v, int hi)
{
    return v < 0 ? 0 : v > hi ? hi : v;
}

/* A draw record against timm's ranges, its box derived again from its integers. */
static void
check_timm_draw(const fl_timm_mix_spec *s, const fl_timm_mix_params *q, int H, int W, int k)
{
    int f32 = s->mode != FL_TIMM_MODE_BATCH;
    if (!(q->lam_draw >= 0.0 && q->lam_draw <= 1.0 && q->lam >= 0.0 && q->lam <= 1.0))
        FZ_FAIL("timm draw %d: lam_draw %g / lam %g outside [0, 1]", k, q->lam_draw, q->lam);
    if (f32 && (q->lam_draw != (double)(float)q->lam_draw || q->lam != (double)(float)q->lam))
        FZ_FAIL("timm draw %d: a lam that is not a float32 value in mode %d", k, s->mode);
    if (!q->mixed) {
        if (q->lam_draw != 1.0 || q->lam != 1.0 || q->nrandint || q->yl || q->yh || q->xl || q->xh)
            FZ_FAIL("timm draw %d: unmixed with lam %g / %g, %d box integers", k, q->lam_draw, q->lam, q->nrandint);
        return;
    }
    if (!s->enabled || q->lam_draw == 1.0)
        FZ_FAIL("timm draw %d: mixed with enabled %d, lam_draw %g", k, s->enabled, q->lam_draw);
    if (q->cutmix ? !(s->cutmix_alpha > 0.0) : !(s->mixup_alpha > 0.0))
        FZ_FAIL("timm draw %d: %s drawn with its alpha at %g", k, q->cutmix ? "CutMix" : "MixUp",
                q->cutmix ? s->cutmix_alpha : s->mixup_alpha);
    if (!q->cutmix) {
        if (q->nrandint || q->lam != q->lam_draw)
            FZ_FAIL("timm draw %d: MixUp with box integers or a changed lam", k);
        return;
    }
    int yl, yh, xl, xh;
    double lam = q->lam_draw;
    const int *r = q->randint;
    if (s->minmax) {
        int lh = (int)(H * s->minmax_lo), hh = (int)(H * s->minmax_hi);
        int lw = (int)(W * s->minmax_lo), hw = (int)(W * s->minmax_hi);
        if (q->nrandint != 4 || r[0] < lh || r[0] >= hh || r[1] < lw || r[1] >= hw || r[2] < 0
            || r[2] >= H - r[0] + 1 || r[3] < 0 || r[3] >= W - r[1] + 1)
            FZ_FAIL("timm draw %d: minmax integers (%d, %d, %d, %d) outside timm's randint ranges", k, r[0], r[1],
                    r[2], r[3]);
        yl = r[2], yh = r[2] + r[0], xl = r[3], xh = r[3] + r[1];
        lam = 1.0 - (double)(yh - yl) * (xh - xl) / ((double)H * W);
    } else {
        if (q->nrandint != 2 || r[0] < 0 || r[0] >= H || r[1] < 0 || r[1] >= W)
            FZ_FAIL("timm draw %d: centre (%d, %d) outside %d x %d", k, r[0], r[1], H, W);
        int ch, cw;
        if (f32) {
            float one_minus = 1.0f - (float)q->lam_draw;
            float ratio = sqrtf(one_minus);
            float fh = (float)H * ratio, fw = (float)W * ratio;
            ch = (int)fh, cw = (int)fw;
        } else {
            double ratio = sqrt(1.0 - q->lam_draw);
            ch = (int)(H * ratio), cw = (int)(W * ratio);
        }
        yl = clip(r[0] - ch / 2, H), yh = clip(r[0] + (ch + 1) / 2, H);
        xl = clip(r[1] - cw / 2, W), xh = clip(r[1] + (cw + 1) / 2, W);
        if (s->correct_lam)
            lam = 1.0 - (double)(yh - yl) * (xh - xl) / ((double)H * W);
    }
    if (f32)
        lam = (double)(float)lam;
    if (yl != q->yl || yh != q->yh || xl != q->xl || xh != q->xh || lam != q->lam)
        FZ_FAIL("timm draw %d: box (%d, %d, %d, %d) lam %a, derived again (%d, %d, %d, %d) lam %a", k, q->yl, q->yh,
                q->xl, q->xh, q->lam, yl, yh, xl, xh, lam);
}

/* timm's Mixup on a copy of the originals, written straight from mix.h. */
static void
timm_oracle(const fl_timm_mix_spec *s, const fl_timm_mix_params *p, const float *orig, float *want, int N, int C,
            int H, int W)
{
    size_t plane = (size_t)C * H * W;
    memcpy(want, orig, plane * N * sizeof(float));
    for (int i = 0; i < N; i++) {
        int j = N - 1 - i;
        const fl_timm_mix_params *q = s->mode == FL_TIMM_MODE_BATCH ? p
                                      : s->mode == FL_TIMM_MODE_PAIR ? p + (i < N / 2 ? i : j) : p + i;
        if (!q->mixed)
            continue;
        const float *a = orig + (size_t)i * plane, *b = orig + (size_t)j * plane;
        float *d = want + (size_t)i * plane;
        if (q->cutmix) {
            for (int c = 0; c < C; c++)
                for (int y = q->yl; y < q->yh; y++)
                    for (int x = q->xl; x < q->xh; x++) {
                        size_t o = ((size_t)c * H + y) * W + x;
                        d[o] = b[o];
                    }
            continue;
        }
        float l = (float)q->lam;
        float m = s->mode == FL_TIMM_MODE_BATCH ? (float)(1.0 - q->lam) : 1.0f - l;
        for (size_t o = 0; o < plane; o++) {
            float u = a[o] * l;
            float v = b[o] * m;
            d[o] = u + v;
        }
    }
}

static void
timm_labels_oracle(const fl_timm_mix_spec *s, const fl_timm_mix_params *p, const int64_t *lab, int N, float *want)
{
    int nc = s->num_classes;
    double offd = s->smoothing / nc;
    float off = (float)offd, on = (float)(1.0 - s->smoothing + offd);
    for (int i = 0; i < N; i++) {
        int j = N - 1 - i;
        const fl_timm_mix_params *q = s->mode == FL_TIMM_MODE_BATCH ? p
                                      : s->mode == FL_TIMM_MODE_PAIR ? p + (i < N / 2 ? i : j) : p + i;
        float l = (float)q->lam;
        float m = s->mode == FL_TIMM_MODE_BATCH ? (float)(1.0 - q->lam) : 1.0f - l;
        for (int k = 0; k < nc; k++) {
            float y1 = k == lab[i] ? on : off, y2 = k == lab[j] ? on : off;
            float u = y1 * l;
            float v = y2 * m;
            want[(size_t)i * nc + k] = u + v;
        }
    }
}

static void
run_timm(fz_bytes *pb, float *x, const float *orig, float *want, int N, int C, int H, int W, int nc,
         const int64_t *lab, uint64_t seed, uint64_t epoch, uint64_t batch, int labels_ok)
{
    fl_timm_mix_spec s;
    memset(&s, 0, sizeof s);
    s.mixup_alpha = alpha_for(fz_u8(pb));
    s.cutmix_alpha = alpha_for(fz_u8(pb));
    uint8_t mm = fz_u8(pb), lo = fz_u8(pb), hi = fz_u8(pb);
    s.minmax = mm & 1;
    s.minmax_lo = lo / 200.0 - (mm & 2 ? 0.1 : 0.0);
    s.minmax_hi = hi / 200.0;
    s.prob = prob_for(fz_u8(pb));
    s.switch_prob = prob_for(fz_u8(pb));
    uint8_t mb = fz_u8(pb);
    s.mode = mb < 250 ? mb % 3 : (int[]){-1, 3, 100, 0, 1, 2}[mb - 250];
    uint8_t flags = fz_u8(pb);
    s.correct_lam = flags & 1;
    s.enabled = !(flags & 2);
    uint8_t sm = fz_u8(pb);
    s.smoothing = sm < 250 ? sm / 250.0 : (double[]){NAN, INFINITY, -0.5, 1.0, 2.0, 0.1}[sm - 250];
    s.num_classes = nc;

    int count = fl_timm_mix_count(&s, N);
    int valid = timm_spec_valid(&s) && N > 0 && N % 2 == 0 && H > 0 && W > 0;   /* the draws take no C */
    if (valid && count != (s.mode == 0 ? 1 : s.mode == 1 ? N / 2 : N))
        FZ_FAIL("fl_timm_mix_count(mode %d, N %d) = %d", s.mode, N, count);
    fl_timm_mix_params *p = calloc(count > 0 ? count : 1, sizeof *p), *p2 = calloc(count > 0 ? count : 1, sizeof *p);
    if (p == NULL || p2 == NULL)
        abort();
    fl_err err;
    memset(&err, 0, sizeof err);
    int rc = fl_timm_mix_draw(&s, N, H, W, seed, epoch, batch, p, &err);
    FZ_LOG("timm mode %d N %d %dx%dx%d alphas %g %g minmax %d (%g, %g) prob %g switch %g -> %d %s", s.mode, N, C, H,
           W, s.mixup_alpha, s.cutmix_alpha, s.minmax, s.minmax_lo, s.minmax_hi, s.prob, s.switch_prob, rc,
           rc ? err.msg : "");
    if (rc != 0 && rc != -1)
        FZ_FAIL("fl_timm_mix_draw returned %d", rc);
    if (rc < 0) {
        fz_check_err(&err, "fl_timm_mix_draw");
        if (err.code != FL_ERR_INVALID)
            FZ_FAIL("fl_timm_mix_draw failed with code %d: %s", err.code, err.msg);
        if (valid && !(s.minmax && strstr(err.msg, "cutmix_minmax") != NULL))
            FZ_FAIL("fl_timm_mix_draw refused a valid spec and batch: %s", err.msg);
        goto done;
    }
    if (!valid)
        FZ_FAIL("fl_timm_mix_draw accepted an invalid spec or batch (mode %d, N %d, %d x %d)", s.mode, N, H, W);
    if (fl_timm_mix_draw(&s, N, H, W, seed, epoch, batch, p2, &err) != 0 || memcmp(p, p2, count * sizeof *p) != 0)
        FZ_FAIL("fl_timm_mix_draw is not deterministic");
    for (int k = 0; k < count; k++)
        check_timm_draw(&s, p + k, H, W, k);

    if (C <= 0) {
        if (fl_timm_mix_images_f32(&s, p, x, N, C, H, W, &err) != -1 || err.code != FL_ERR_INVALID)
            FZ_FAIL("fl_timm_mix_images_f32 accepted %d channels", C);
        goto done;
    }
    size_t nx = (size_t)N * C * H * W;
    timm_oracle(&s, p, orig, want, N, C, H, W);
    rc = fl_timm_mix_images_f32(&s, p, x, N, C, H, W, &err);
    fz_guard_check((const uint8_t *)x, nx * sizeof(float), "fl_timm_mix_images_f32");
    if (rc != 0)
        FZ_FAIL("fl_timm_mix_images_f32 refused its own draws: %s", err.msg);
    check_floats(x, want, nx, "fl_timm_mix_images_f32");

    size_t nl = (size_t)N * nc;
    float *soft = (float *)fz_guarded_alloc(nl * sizeof(float)), *lwant = malloc(nl * sizeof(float) + 1);
    if (lwant == NULL)
        abort();
    rc = fl_timm_mix_labels(&s, p, lab, N, soft, &err);
    fz_guard_check((const uint8_t *)soft, nl * sizeof(float), "fl_timm_mix_labels");
    if (rc != 0 && rc != -1)
        FZ_FAIL("fl_timm_mix_labels returned %d", rc);
    if (rc < 0) {
        fz_check_err(&err, "fl_timm_mix_labels");
        if (err.code != FL_ERR_INVALID || labels_ok)
            FZ_FAIL("fl_timm_mix_labels refused labels in range: %s", err.msg);
    } else {
        if (!labels_ok)
            FZ_FAIL("fl_timm_mix_labels accepted a label outside 0..%d", nc - 1);
        timm_labels_oracle(&s, p, lab, N, lwant);
        check_floats(soft, lwant, nl, "fl_timm_mix_labels");
    }
    free(soft);
    free(lwant);
done:
    free(p);
    free(p2);
}

static void
run_torchvision(fz_bytes *pb, float *x, const float *orig, float *want, int N, int C, int H, int W, int nc,
                const int64_t *lab, uint64_t seed, uint64_t epoch, uint64_t batch, int labels_ok)
{
    fl_mix_spec s;
    memset(&s, 0, sizeof s);
    uint8_t nb = fz_u8(pb);
    s.n = nb < 250 ? 1 + nb % FL_MIX_MAX_CHOICES : (int[]){0, 5, -1, 4, 1, 2}[nb - 250];
    int valid = s.n >= 1 && s.n <= FL_MIX_MAX_CHOICES;
    double total = 0.0;
    for (int i = 0; i < FL_MIX_MAX_CHOICES; i++) {
        uint8_t kb = fz_u8(pb);
        s.kind[i] = kb < 250 ? kb % 2 : (int[]){-1, 2, 7, 0, 1, 1}[kb - 250];
        s.alpha[i] = alpha_for(fz_u8(pb));
        s.p[i] = prob_for(fz_u8(pb));
        if (i < s.n) {
            valid = valid && (s.kind[i] == 0 || s.kind[i] == 1) && s.alpha[i] > 0.0 && s.alpha[i] < 1e6
                    && s.p[i] >= 0.0 && s.p[i] < 1e300;
            total += s.p[i];
        }
    }
    valid = valid && total > 0.0 && H > 0 && W > 0;
    fl_mix_params p, p2;
    fl_err err;
    memset(&err, 0, sizeof err);
    int rc = fl_mix_draw(&s, H, W, seed, epoch, batch, &p, &err);
    FZ_LOG("torchvision n %d N %d %dx%dx%d -> %d %s", s.n, N, C, H, W, rc, rc ? err.msg : "");
    if (rc != 0 && rc != -1)
        FZ_FAIL("fl_mix_draw returned %d", rc);
    if (rc < 0) {
        fz_check_err(&err, "fl_mix_draw");
        if (err.code != FL_ERR_INVALID || valid)
            FZ_FAIL("fl_mix_draw refused a valid spec: %s", err.msg);
        return;
    }
    if (!valid)
        FZ_FAIL("fl_mix_draw accepted an invalid spec (n %d, %d x %d)", s.n, H, W);
    if (fl_mix_draw(&s, H, W, seed, epoch, batch, &p2, &err) != 0 || memcmp(&p, &p2, sizeof p) != 0)
        FZ_FAIL("fl_mix_draw is not deterministic");
    if (!(p.lam >= 0.0 && p.lam <= 1.0))
        FZ_FAIL("fl_mix_draw: lam %g outside [0, 1]", p.lam);
    if (p.kind == FL_MIX_CUTMIX) {
        if (p.x1 < 0 || p.y1 < 0 || p.x2 > W || p.y2 > H || p.x1 > p.x2 || p.y1 > p.y2)
            FZ_FAIL("fl_mix_draw: box (%d, %d, %d, %d) outside %d x %d", p.x1, p.y1, p.x2, p.y2, W, H);
        if (p.lam != 1.0 - (double)(p.x2 - p.x1) * (double)(p.y2 - p.y1) / ((double)W * (double)H))
            FZ_FAIL("fl_mix_draw: CutMix lam %a is not the box's", p.lam);
    }
    if (N <= 0 || C <= 0)
        return;
    size_t plane = (size_t)C * H * W, nx = plane * N;
    memcpy(want, orig, nx * sizeof(float));
    for (int i = 0; i < N; i++) {
        const float *r = orig + (size_t)(i ? i - 1 : N - 1) * plane, *o = orig + (size_t)i * plane;
        float *d = want + (size_t)i * plane;
        if (p.kind == FL_MIX_MIXUP) {
            float a = (float)(1.0 - p.lam), b = (float)p.lam;
            for (size_t k = 0; k < plane; k++) {
                float u = r[k] * a;
                float v = o[k] * b;
                d[k] = u + v;
            }
        } else {
            for (int c = 0; c < C; c++)
                for (int y = p.y1; y < p.y2; y++)
                    for (int xx = p.x1; xx < p.x2; xx++) {
                        size_t k = ((size_t)c * H + y) * W + xx;
                        d[k] = r[k];
                    }
        }
    }
    float *tmp = (float *)fz_guarded_alloc(plane * sizeof(float));
    rc = fl_mix_images_f32(&p, x, N, C, H, W, tmp, &err);
    fz_guard_check((const uint8_t *)x, nx * sizeof(float), "fl_mix_images_f32 (images)");
    fz_guard_check((const uint8_t *)tmp, plane * sizeof(float), "fl_mix_images_f32 (tmp)");
    free(tmp);
    if (rc != 0)
        FZ_FAIL("fl_mix_images_f32 refused its own draw: %s", err.msg);
    check_floats(x, want, nx, "fl_mix_images_f32");
    size_t nl = nc > 0 ? (size_t)N * nc : 0;
    float *soft = (float *)fz_guarded_alloc(nl * sizeof(float));
    rc = fl_mix_labels(&p, lab, N, nc, soft, &err);
    fz_guard_check((const uint8_t *)soft, nl * sizeof(float), "fl_mix_labels");
    if (rc < 0) {
        fz_check_err(&err, "fl_mix_labels");
        if (err.code != FL_ERR_INVALID || labels_ok)
            FZ_FAIL("fl_mix_labels refused labels in range: %s", err.msg);
    } else {
        if (!labels_ok)
            FZ_FAIL("fl_mix_labels accepted a label outside 0..%d", nc - 1);
        float a = (float)(1.0 - p.lam), b = (float)p.lam;
        for (int i = 0; i < N; i++)
            for (int k = 0; k < nc; k++) {
                float r = k == lab[i ? i - 1 : N - 1] ? 1.0f : 0.0f, o = k == lab[i] ? 1.0f : 0.0f;
                float u = r * a;
                float v = o * b;
                float w = u + v;
                if (!same_float(soft[(size_t)i * nc + k], w))
                    FZ_FAIL("fl_mix_labels: row %d class %d is %a, the oracle says %a", i, k,
                            (double)soft[(size_t)i * nc + k], (double)w);
            }
    }
    free(soft);
}

/* Parameter block (FZ_MIX_PARAMS bytes):
 *   0      api: bit 0 timm (else torchvision); bit 1 raw float pixels (else byte / 64 - 2)
 *   1..4   N (% 17), C (% 5), H, W (dim_of)
 *   5      num_classes: 1 + b % 24, or 0 / -1 for 254 / 255
 *   6..9   seed; 10 epoch; 11..12 batch number
 *   13..   timm: mixup_alpha, cutmix_alpha, minmax flags, lo, hi, prob, switch_prob, mode, flags,
 *          smoothing; torchvision: n, then kind, alpha, weight per choice
 *   31     labels: bit 7 set puts one label out of range (index b % N, value nc or -1)
 */
int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_bytes pb;
    const uint8_t *px;
    size_t npx;
    fz_split(data, size, FZ_MIX_PARAMS, &pb, &px, &npx);
    uint8_t api = fz_u8(&pb);
    int N = fz_u8(&pb) % 17, C = fz_u8(&pb) % 5, H = dim_of(fz_u8(&pb)), W = dim_of(fz_u8(&pb));
    uint8_t ncb = fz_u8(&pb);
    int nc = ncb < 254 ? 1 + ncb % 24 : (ncb == 254 ? 0 : -1);
    uint64_t seed = fz_u32(&pb), epoch = fz_u8(&pb), batch = fz_u16(&pb);
    uint8_t labb = pb.n == FZ_MIX_PARAMS ? pb.p[FZ_MIX_PARAMS - 1] : 0;
    size_t nx = N > 0 && C > 0 && H > 0 && W > 0 ? (size_t)N * C * H * W : 0;
    if (nx > FZ_MIX_MAX_FLOATS)
        return 0;
    float *x = (float *)fz_guarded_alloc(nx * sizeof(float)), *orig = malloc(nx * sizeof(float) + 1),
          *want = malloc(nx * sizeof(float) + 1);
    if (orig == NULL || want == NULL)
        abort();
    for (size_t k = 0; k < nx; k++) {
        if (api & 2) {
            uint8_t b4[4];
            for (int t = 0; t < 4; t++)
                b4[t] = npx ? px[(k * 4 + t) % npx] : 0;
            memcpy(x + k, b4, 4);
        } else {
            x[k] = npx ? px[k % npx] / 64.0f - 2.0f : 0.0f;
        }
    }
    memcpy(orig, x, nx * sizeof(float));
    int64_t lab[17];
    int labels_ok = 1;
    for (int i = 0; i < 17; i++)
        lab[i] = nc > 0 ? (int64_t)((npx ? px[(i * 7) % npx] : 0) % nc) : 0;
    if (nc <= 0)
        labels_ok = N <= 0;
    if ((labb & 0x80) && N > 0) {
        lab[(labb & 0x7F) % N] = (labb & 1) ? -1 : nc;
        labels_ok = 0;
    }
    if (api & 1)
        run_timm(&pb, x, orig, want, N, C, H, W, nc, lab, seed, epoch, batch, labels_ok);
    else
        run_torchvision(&pb, x, orig, want, N, C, H, W, nc, lab, seed, epoch, batch, labels_ok);
    fz_guard_check((const uint8_t *)x, nx * sizeof(float), "the batch");
    free(x);
    free(orig);
    free(want);
    return 0;
}
