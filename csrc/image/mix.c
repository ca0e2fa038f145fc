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

#include <math.h>
#include <string.h>

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
    double a = s->alpha[pick];
    double x = fl_rng_gamma(&r, a), y = fl_rng_gamma(&r, a);
    double lam = x + y > 0.0 ? x / (x + y) : 0.5;
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
