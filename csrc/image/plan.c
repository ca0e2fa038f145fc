/* plan.c: one sample's random and geometric decisions (imgops.h's planning
 * half): spec checks, torchvision's RandomResizedCrop.get_params, Resize's
 * output size (max_size included) and CenterCrop's offsets, with Python's
 * round-half-even, drawn from rng.h keyed by (seed, epoch, index).  Also the
 * message helper the other imgops units share (imgops_internal.h).
 *
 * No Python, no GIL: plain C on caller-owned memory, re-entrant.
 */
#include "image/imgops.h"
#include "image/imgops_internal.h"
#include "image/augment.h"
#include "core/rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Contract: imgops_internal.h. */
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

/* 1 when x is neither NaN nor infinite.  Pure. */
static int
fl_finite(double x)
{
    return x == x && x - x == 0.0;
}

/* ------------------------------------------------------------------------ */
/* Spec checks                                                              */
/* ------------------------------------------------------------------------ */

/* Whether op (augment.h) takes magnitude m, and its negation when
 * is_signed, in an AugMix policy: the tensor ops, Posterize, Solarize and
 * Equalize, each with an argument fl_aug_apply accepts (a factor 1 + m >= 0,
 * Posterize's bits in 0..8, a translation within int range), so that a
 * checked spec never fails to render. */
static int
fl_augmix_op_ok(int op, double m, int is_signed)
{
    for (int k = 0; k <= is_signed; k++, m = -m) {
        if (op >= FL_AUG_T_BRIGHTNESS && op <= FL_AUG_T_SHARPNESS_V2) {
            double f = 1.0 + m;
            if (!(f >= 0.0) || !(f < 3.4e38))
                return 0;
        } else if (op == FL_AUG_POSTERIZE) {
            if (!(trunc(m) >= 0.0 && trunc(m) <= 8.0))
                return 0;
        } else if ((op >= FL_AUG_T_TRANSLATE_X && op <= FL_AUG_T_TRANSLATE_Y)
                   || (op >= FL_AUG_T_TRANSLATE_X_V2 && op <= FL_AUG_T_TRANSLATE_Y_V2)) {
            if (!(fabs(trunc(m)) < 2147483648.0))
                return 0;
        } else if (!(op >= FL_AUG_T_SHEAR_X && op <= FL_AUG_T_AUTOCONTRAST_V2) && op != FL_AUG_SOLARIZE && op != FL_AUG_EQUALIZE) {
            return 0;
        }
    }
    return 1;
}

/* The policy half of fl_tspec_check.  Returns 0, or -1 with err filled
 * (FL_ERR_INVALID, naming the field). */
static int
fl_policy_check(const fl_tspec *t, fl_err *err)
{
#define FAIL(...) do { fl_err_set(err, FL_ERR_INVALID, 0, __VA_ARGS__); return -1; } while (0)
    const fl_policy *P = &t->policy;
    if (P->rounds == 0)
        return 0;
    if (P->rounds < 0 || P->rounds > FL_POLICY_MAX_ROUNDS)
        FAIL("policy.rounds: %d is not in 0..%d", P->rounds, FL_POLICY_MAX_ROUNDS);
    if (t->out_w <= 0 || t->out_h <= 0)
        FAIL("policy: needs a fixed output size (out_h/out_w)");
    if (P->kind != FL_POLICY_TV && P->kind != FL_POLICY_TIMM_RA && P->kind != FL_POLICY_TIMM_AA
        && P->kind != FL_POLICY_AUGMIX && P->kind != FL_POLICY_TIMM_AUGMIX)
        FAIL("policy.kind: unknown kind %d (0 torchvision, 1 timm RandAugment, 2 timm AutoAugment, 3 AugMix, "
             "4 timm AugMix)", P->kind);
    const int timm = P->kind == FL_POLICY_TIMM_RA || P->kind == FL_POLICY_TIMM_AA || P->kind == FL_POLICY_TIMM_AUGMIX;
    if (P->interp != FL_AUG_NEAREST && P->interp != FL_AUG_BILINEAR
        && !(timm && (P->interp == FL_AUG_BICUBIC || P->interp == FL_AUG_RANDOM)))
        FAIL("policy.interp: unknown resampling %d", P->interp);
    for (int c = 0; c < 3; c++)
        if (P->fill[c] < 0 || P->fill[c] > 255)
            FAIL("policy.fill: %d is not in 0..255", P->fill[c]);
    if (timm) {
        if (P->ntimm < 1 || P->ntimm > FL_POLICY_MAX_TIMM)
            FAIL("policy.ops: %d ops, not 1..%d", P->ntimm, FL_POLICY_MAX_TIMM);
        for (int i = 0; i < P->ntimm; i++) {
            const fl_timm_op *o = &P->timm[i];
            if (o->op < 0 || o->op >= FL_AUG_NOPS)
                FAIL("policy.ops[%d]: unknown op %d", i, o->op);
            if (o->level < 0 || o->level >= FL_LEVEL_COUNT)
                FAIL("policy.ops[%d]: unknown level function %d", i, o->level);
            if ((o->op == FL_AUG_POSTERIZE) != (o->level >= FL_LEVEL_POSTERIZE && o->level <= FL_LEVEL_POSTERIZE_ORIG)
                || (o->op == FL_AUG_SOLARIZE_ADD) != (o->level == FL_LEVEL_SOLARIZE_ADD)
                || (o->op == FL_AUG_GAUSSIAN_BLUR) != (o->level == FL_LEVEL_BLUR || o->level == FL_LEVEL_BLUR_RAND)
                || (o->level == FL_LEVEL_DESATURATE && o->op != FL_AUG_COLOR_FACTOR))
                FAIL("policy.ops[%d]: level function %d does not fit op %d", i, o->level, o->op);
            if (!fl_finite(o->prob) || o->prob < 0 || o->prob > 1)
                FAIL("policy.ops[%d]: prob %g is not a probability", i, o->prob);
            if (!fl_finite(o->m) || !(o->mstd >= 0) || !fl_finite(o->mmax) || o->mmax < 0 || !fl_finite(o->hparam))
                FAIL("policy.ops[%d]: magnitude %g, std %g, max %g or hparam %g out of range", i, o->m, o->mstd,
                     o->mmax, o->hparam);
        }
    }
    if (P->kind == FL_POLICY_TIMM_AUGMIX) {
        if (P->ntimm > FL_POLICY_MAX_OPS)
            FAIL("policy.ops: %d ops, not 1..%d", P->ntimm, FL_POLICY_MAX_OPS);
        const int deepest = P->depth > 0 ? P->depth : 3;
        if (deepest > FL_AUGMIX_MAX_OPS / P->rounds)
            FAIL("policy.depth: %d chains of up to %d ops exceed %d ops", P->rounds, deepest, FL_AUGMIX_MAX_OPS);
        if (!fl_finite(P->alpha) || !(P->alpha > 0) || !(P->alpha < 1e6))
            FAIL("policy.alpha: %g is not in (0, 1e6)", P->alpha);
        return 0;
    }
    if (P->kind == FL_POLICY_TIMM_RA) {
        if (P->nops != P->ntimm || P->nops > FL_POLICY_MAX_OPS)
            FAIL("policy.ops: %d ops, not 1..%d", P->ntimm, FL_POLICY_MAX_OPS);
        if (P->has_weights) {
            int positive = 0;
            for (int i = 0; i < P->nops; i++) {
                if (!fl_finite(P->weight[i]) || P->weight[i] < 0)
                    FAIL("policy.weights[%d]: %g is not a weight", i, P->weight[i]);
                positive += P->weight[i] > 0;
            }
            if (positive < P->rounds)   /* np.random.choice(replace=False) refuses it too */
                FAIL("policy.weights: %d ops with a positive weight, fewer than the %d to choose", positive,
                     P->rounds);
        }
        return 0;
    }
    if (P->kind == FL_POLICY_AUGMIX) {
        const int deepest = P->depth > 0 ? P->depth : 3;
        if (deepest > FL_AUGMIX_MAX_OPS / P->rounds)
            FAIL("policy.depth: %d chains of up to %d ops exceed %d ops", P->rounds, deepest, FL_AUGMIX_MAX_OPS);
        if (!fl_finite(P->alpha) || !(P->alpha > 0) || !(P->alpha < 1e6))
            FAIL("policy.alpha: %g is not in (0, 1e6)", P->alpha);
        if (P->fill[0] || P->fill[1] || P->fill[2])
            FAIL("policy.fill: AugMix's tensor kernels fill with zeros (fill None), not (%d, %d, %d)", P->fill[0],
                 P->fill[1], P->fill[2]);
    }
    if (P->kind == FL_POLICY_TV || P->kind == FL_POLICY_AUGMIX) {
        if (P->nops < 1 || P->nops > FL_POLICY_MAX_OPS)
            FAIL("policy.ops: %d ops, not 1..%d", P->nops, FL_POLICY_MAX_OPS);
        for (int i = 0; i < P->nops; i++) {
            const fl_policy_op *o = &P->ops[i];
            if (o->op < 0 || o->op >= FL_AUG_NOPS)
                FAIL("policy.ops[%d]: unknown op %d", i, o->op);
            if (o->nbins < 0 || o->nbins > FL_POLICY_MAX_BINS)
                FAIL("policy.ops[%d]: %d magnitude bins, not 0..%d", i, o->nbins, FL_POLICY_MAX_BINS);
            for (int b = 0; b < o->nbins; b++)
                if (!fl_finite(o->mag[b]))
                    FAIL("policy.ops[%d]: magnitude bin %d is not finite", i, b);
            if (P->kind == FL_POLICY_AUGMIX) {
                if (o->nbins == 0 && !fl_augmix_op_ok(o->op, 0.0, 0))
                    FAIL("policy.ops[%d]: op %d is not one of AugMix's tensor ops", i, o->op);
                for (int b = 0; b < o->nbins; b++)
                    if (!fl_augmix_op_ok(o->op, o->mag[b], o->is_signed))
                        FAIL("policy.ops[%d]: op %d does not take magnitude %g%s in AugMix", i, o->op, o->mag[b],
                             o->is_signed ? " (signed)" : "");
            }
        }
        if (P->kind == FL_POLICY_AUGMIX)
            return 0;
    } else if (P->rounds != 1) {
        FAIL("policy.rounds: timm's AutoAugment applies one sub-policy, not %d", P->rounds);
    }
    const int nref = P->kind == FL_POLICY_TV ? P->nops : P->ntimm;
    if (P->nsub < 1 || P->nsub > FL_POLICY_MAX_SUB)
        FAIL("policy.subs: %d sub-policies, not 1..%d", P->nsub, FL_POLICY_MAX_SUB);
    for (int s = 0; s < P->nsub; s++) {
        if (P->sub_len[s] < 1 || P->sub_len[s] > FL_POLICY_MAX_STEPS)
            FAIL("policy.subs[%d]: %d steps, not 1..%d", s, P->sub_len[s], FL_POLICY_MAX_STEPS);
        for (int k = 0; k < P->sub_len[s]; k++) {
            const fl_policy_step *st = &P->sub[s][k];
            if (st->op < 0 || st->op >= nref)
                FAIL("policy.subs[%d][%d]: op index %d is not in 0..%d", s, k, st->op, nref - 1);
            if (P->kind != FL_POLICY_TV)
                continue;
            if (st->bin < -1 || (P->ops[st->op].nbins > 0 && st->bin >= P->ops[st->op].nbins))
                FAIL("policy.subs[%d][%d]: magnitude bin %d out of range", s, k, st->bin);
            if (!fl_finite(st->p) || st->p < 0 || st->p > 1)
                FAIL("policy.subs[%d][%d]: %g is not a probability", s, k, st->p);
        }
    }
    return 0;
#undef FAIL
}

/* The RandomErasing half of fl_tspec_check.  Returns 0, or -1 with err
 * filled (FL_ERR_INVALID, naming the field). */
static int
fl_erase_check(const fl_tspec *t, fl_err *err)
{
#define FAIL(...) do { fl_err_set(err, FL_ERR_INVALID, 0, __VA_ARGS__); return -1; } while (0)
    const fl_erase *E = &t->erase;
    if (E->p == 0)
        return 0;
    if (!fl_finite(E->p) || E->p < 0 || E->p > 1)
        FAIL("erase.p: %g is not a probability", E->p);
    if (!fl_finite(E->scale_lo) || !fl_finite(E->scale_hi) || E->scale_lo < 0 || E->scale_hi > 1
        || E->scale_lo > E->scale_hi)
        FAIL("erase.scale: (%g, %g) is not a range in [0, 1]", E->scale_lo, E->scale_hi);
    if (!fl_finite(E->ratio_lo) || !fl_finite(E->ratio_hi) || E->ratio_lo <= 0 || E->ratio_lo > E->ratio_hi)
        FAIL("erase.ratio: (%g, %g) is not a positive range", E->ratio_lo, E->ratio_hi);
    if (E->mode != FL_ERASE_CONST && E->mode != FL_ERASE_NORMAL && E->mode != FL_ERASE_CHANNEL)
        FAIL("erase.mode: unknown value mode %d", E->mode);
    if (E->min_count < 0 || E->max_count < 0 || E->min_count > FL_ERASE_MAX_BOXES
        || E->max_count > FL_ERASE_MAX_BOXES || (E->max_count && E->max_count < E->min_count))
        FAIL("erase.count: (%d, %d) is not a range in 1..%d", E->min_count, E->max_count, FL_ERASE_MAX_BOXES);
    for (int c = 0; c < t->out_channels && E->mode == FL_ERASE_CONST; c++) {
        float v = E->value[c];
        if (!fl_finite(v))
            FAIL("erase.value: channel %d is not finite", c);
        if (t->dtype == FL_DT_U8 && (v < 0 || v > 255 || v != floorf(v)))
            FAIL("erase.value: %g is not a whole number in 0..255 for uint8 output", (double)v);
    }
    if (E->mode != FL_ERASE_CONST && t->dtype == FL_DT_U8)
        FAIL("erase.mode: random values need a floating-point dtype");
    return 0;
#undef FAIL
}

/* The ColorJitter half of fl_tspec_check.  Returns 0, or -1 with err filled
 * (FL_ERR_INVALID, naming the field). */
static int
fl_jitter_check(const fl_tspec *t, fl_err *err)
{
#define FAIL(...) do { fl_err_set(err, FL_ERR_INVALID, 0, __VA_ARGS__); return -1; } while (0)
    static const char *const names[4] = {"brightness", "contrast", "saturation", "hue"};
    const fl_jitter *J = &t->jitter;
    if (J->p == 0.0)
        return 0;
    if (!fl_finite(J->p) || J->p < 0 || J->p > 1)
        FAIL("jitter.p: %g is not a probability", J->p);
    if (t->out_w <= 0 || t->out_h <= 0)
        FAIL("jitter: needs a fixed output size (out_h/out_w)");
    if (J->pos < FL_JITTER_AFTER_FLIPS || J->pos > FL_JITTER_AFTER_POLICY)
        FAIL("jitter.pos: unknown position %d (0 after the flips, 1 before the policy, 2 after it)", J->pos);
    if (J->pos == FL_JITTER_AFTER_POLICY && t->policy.rounds > 0
        && (t->policy.kind == FL_POLICY_AUGMIX || t->policy.kind == FL_POLICY_TIMM_AUGMIX))
        FAIL("jitter.pos: not after AugMix (its chains' ops end the op list)");
    for (int k = 0; k < 4; k++) {
        if (J->has[k] != 0 && J->has[k] != 1)
            FAIL("jitter.%s: presence %d is not 0 or 1", names[k], J->has[k]);
        if (!J->has[k])
            continue;
        const double lo = k == FL_JITTER_HUE ? -0.5 : 0.0, hi = k == FL_JITTER_HUE ? 0.5 : 1e30;
        if (!fl_finite(J->lo[k]) || !fl_finite(J->hi[k]) || J->lo[k] > J->hi[k] || J->lo[k] < lo || J->hi[k] > hi)
            FAIL("jitter.%s: [%g, %g] is not a range within [%g, %g]", names[k], J->lo[k], J->hi[k], lo, hi);
    }
    return 0;
#undef FAIL
}

/* The GaussianBlur half of fl_tspec_check: what fl_gblur_apply will take
 * on the fixed output size, so that a checked spec never fails to render.
 * Returns 0, or -1 with err filled (FL_ERR_INVALID, naming the field). */
static int
fl_blur_check(const fl_tspec *t, fl_err *err)
{
#define FAIL(...) do { fl_err_set(err, FL_ERR_INVALID, 0, __VA_ARGS__); return -1; } while (0)
    const fl_blur *B = &t->blur;
    if (B->p == 0.0)
        return 0;
    if (!fl_finite(B->p) || B->p < 0 || B->p > 1)
        FAIL("blur.p: %g is not a probability", B->p);
    if (t->out_w <= 0 || t->out_h <= 0)
        FAIL("blur: needs a fixed output size (out_h/out_w)");
    if (B->pos != FL_BLUR_BEFORE_GRAY && B->pos != FL_BLUR_AFTER_GRAY)
        FAIL("blur.pos: unknown position %d (0 before RandomGrayscale, 1 after it)", B->pos);
    if (!fl_finite(B->lo) || !fl_finite(B->hi) || !(B->lo >= 1e-6) || !(B->hi <= 1e6) || B->lo > B->hi)
        FAIL("blur.sigma: [%g, %g] is not a range within [1e-6, 1e6]", B->lo, B->hi);
    if (B->k.v2 != 0 && B->k.v2 != 1)
        FAIL("blur.v2: %d is not 0 or 1", B->k.v2);
    if (B->k.lanes != 8 && B->k.lanes != 16)
        FAIL("blur.lanes: %d is not 8 or 16", B->k.lanes);
    if (B->k.kx < 1 || B->k.ky < 1 || B->k.kx > FL_GBLUR_MAX_K || B->k.ky > FL_GBLUR_MAX_K || B->k.kx % 2 == 0
        || B->k.ky % 2 == 0)
        FAIL("blur.kernel: %d x %d is not odd sides in 1..%d", B->k.kx, B->k.ky, FL_GBLUR_MAX_K);
    if (B->k.kx / 2 >= t->out_w || B->k.ky / 2 >= t->out_h)   /* torch's reflect padding refuses it */
        FAIL("blur.kernel: %d x %d pads %d x %d, not below the %d x %d output", B->k.kx, B->k.ky, B->k.kx / 2,
             B->k.ky / 2, t->out_w, t->out_h);
    if (fl_gblur_torch_gemm(t->out_w, t->out_h, t->out_channels, B->k.kx, B->k.ky))
        FAIL("blur.kernel: %d x %d on a one-channel %d x %d output is summed by torch's GEMM convolution, whose "
             "order is not reproduced", B->k.kx, B->k.ky, t->out_w, t->out_h);
    return 0;
#undef FAIL
}

/* Contract: imgops.h. */
int
fl_tspec_check(const fl_tspec *t, fl_err *err)
{
#define FAIL(...) do { fl_err_set(err, FL_ERR_INVALID, 0, __VA_ARGS__); return -1; } while (0)
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
    if (!fl_finite(t->vflip_p) || t->vflip_p < 0 || t->vflip_p > 1)
        FAIL("vflip_p: %g is not a probability", t->vflip_p);
    if (!fl_finite(t->gray_p) || t->gray_p < 0 || t->gray_p > 1)
        FAIL("gray_p: %g is not a probability", t->gray_p);
    if (t->interp < FL_INTERP_BILINEAR || t->interp > FL_INTERP_RANDOM)
        FAIL("interp: unknown interpolation %d (0 bilinear, 1 bicubic, 2 random)", t->interp);
    if (t->rotate < FL_ROT_NONE || t->rotate > FL_ROT_AFFINE_V2)
        FAIL("rotate: %d is not 0 (none), 1 (RandomRotation), 2 or 3 (RandomAffine, v1 or v2)", t->rotate);
    if (t->rotate) {
        const int affine = t->rotate != FL_ROT_ROTATION;
        if (t->out_w <= 0 || t->out_h <= 0)
            FAIL("rotate: needs a fixed output size (out_h/out_w)");
        if (!fl_finite(t->rot_lo) || !fl_finite(t->rot_hi) || t->rot_lo > t->rot_hi || fabs(t->rot_lo) > 1e6
            || fabs(t->rot_hi) > 1e6)
            FAIL("rot_lo/rot_hi: [%g, %g] is not a range of degrees", t->rot_lo, t->rot_hi);
        if (t->rot_interp != FL_AUG_NEAREST && t->rot_interp != FL_AUG_BILINEAR
            && !(affine && t->rot_interp == FL_AUG_BICUBIC))
            FAIL("rot_interp: %d is not nearest (0) or bilinear (1)%s", t->rot_interp, affine ? " or bicubic (2)" : "");
        if (affine) {
            if (!fl_finite(t->aff_tx) || !fl_finite(t->aff_ty) || t->aff_tx < 0 || t->aff_tx > 1 || t->aff_ty < 0
                || t->aff_ty > 1)
                FAIL("aff_tx/aff_ty: (%g, %g) are not fractions in [0, 1]", t->aff_tx, t->aff_ty);
            if (!fl_finite(t->aff_scale_lo) || !fl_finite(t->aff_scale_hi) || t->aff_scale_lo > t->aff_scale_hi
                || (t->aff_scale_hi != 0.0 && !(t->aff_scale_lo > 0.0)) || t->aff_scale_hi > 1e6)
                FAIL("aff_scale_lo/aff_scale_hi: [%g, %g] is not a range of positive scales", t->aff_scale_lo,
                     t->aff_scale_hi);
            if (t->aff_nshear != 0 && t->aff_nshear != 2 && t->aff_nshear != 4)
                FAIL("aff_nshear: %d is not 0, 2 or 4", t->aff_nshear);
            for (int k = 0; k < t->aff_nshear; k += 2)
                if (!fl_finite(t->aff_shear[k]) || !fl_finite(t->aff_shear[k + 1])
                    || t->aff_shear[k] > t->aff_shear[k + 1] || fabs(t->aff_shear[k]) > 1e6
                    || fabs(t->aff_shear[k + 1]) > 1e6)
                    FAIL("aff_shear: [%g, %g] is not a range of degrees", t->aff_shear[k], t->aff_shear[k + 1]);
            if (t->aff_center != 0 && t->aff_center != 1)
                FAIL("aff_center: %d is not 0 or 1", t->aff_center);
            if (t->aff_center && (!fl_finite(t->aff_cx) || !fl_finite(t->aff_cy) || fabs(t->aff_cx) > 1e9
                                  || fabs(t->aff_cy) > 1e9))
                FAIL("aff_cx/aff_cy: (%g, %g) is not a centre", t->aff_cx, t->aff_cy);
        }
        for (int c = 0; c < 3; c++) {
            if (t->rot_fill[c] < 0 || t->rot_fill[c] > 255)
                FAIL("rot_fill: %d is not in 0..255", t->rot_fill[c]);
            if (t->policy.rounds > 0 && t->rot_fill[c] != t->policy.fill[c])
                FAIL("rot_fill: differs from policy.fill (the augmented render has one fill)");
        }
    }
    if (fl_policy_check(t, err) < 0 || fl_jitter_check(t, err) < 0 || fl_erase_check(t, err) < 0
        || fl_blur_check(t, err) < 0)
        return -1;
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

/* Contract: imgops.h. */
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

/* One sample's policy ops (imgops.h's fl_policy rules, the distribution of
 * torchvision's AutoAugment / RandAugment / TrivialAugmentWide forward),
 * appended to p->aug_op / aug_mag; identity ops are left out.  t checked. */
static void
fl_policy_draw(const fl_policy *P, fl_rng *rng, fl_plan *p)
{
    p->naug = 0;
    for (int r = 0; r < P->rounds; r++) {
        int s = (int)fl_rng_below(rng, (uint64_t)P->nsub);
        for (int k = 0; k < P->sub_len[s]; k++) {
            const fl_policy_step *st = &P->sub[s][k];
            if (st->p < 1.0 && !(fl_rng_uniform(rng, 0.0, 1.0) < st->p))
                continue;
            const fl_policy_op *o = &P->ops[st->op];
            double mag = 0.0;
            if (o->nbins > 0) {
                int bin = st->bin >= 0 ? st->bin : (int)fl_rng_below(rng, (uint64_t)o->nbins);
                mag = o->mag[bin];
                if (o->is_signed && fl_rng_below(rng, 2))
                    mag = -mag;
            }
            if (o->op == FL_AUG_IDENTITY)
                continue;
            p->aug_op[p->naug] = o->op;
            p->aug_mag[p->naug] = mag;
            p->aug_interp[p->naug] = P->interp;
            p->naug++;
        }
    }
}

/* One sample's AugMix (imgops.h FL_POLICY_AUGMIX, the distribution of
 * torchvision's AugMix.forward, drawn in its order: the two Dirichlet
 * draws, then chain by chain its depth and each op, bin and sign), the
 * chains' ops appended to p->aug_op / aug_mag.  t checked. */
static void
fl_augmix_draw(const fl_policy *P, fl_rng *rng, fl_plan *p)
{
    double g0 = fl_rng_gamma(rng, P->alpha), g1 = fl_rng_gamma(rng, P->alpha);
    double gs = g0 + g1;
    /* torch's _sample_dirichlet gives float32; a sum that underflows (tiny alpha) splits evenly */
    float m0 = gs > 0 ? (float)(g0 / gs) : 0.5f, m1 = gs > 0 ? (float)(g1 / gs) : 0.5f;
    double g[FL_POLICY_MAX_ROUNDS], total = 0.0;
    for (int i = 0; i < P->rounds; i++) {
        g[i] = fl_rng_gamma(rng, P->alpha);
        total += g[i];
    }
    p->mix_chains = P->rounds;
    p->mix_w0 = m0;
    for (int i = 0; i < P->rounds; i++)
        p->mix_w[i] = (total > 0 ? (float)(g[i] / total) : (float)(1.0 / P->rounds)) * m1;
    for (int i = 0; i < P->rounds; i++) {
        int depth = P->depth > 0 ? P->depth : 1 + (int)fl_rng_below(rng, 3);
        p->mix_len[i] = depth;
        for (int k = 0; k < depth; k++) {
            const fl_policy_op *o = &P->ops[fl_rng_below(rng, (uint64_t)P->nops)];
            double mag = 0.0;
            if (o->nbins > 0) {
                mag = o->mag[fl_rng_below(rng, (uint64_t)o->nbins)];
                if (o->is_signed && fl_rng_below(rng, 2))
                    mag = -mag;
            }
            p->aug_op[p->naug] = o->op;
            p->aug_mag[p->naug] = mag;
            p->aug_interp[p->naug] = P->interp;
            p->naug++;
        }
    }
}

/* RandomAffine's get_params (torchvision v1 and v2 alike) for a w x h
 * image, into prm (fl_aug_affine's order): each draw a float32 value, as
 * torch's uniform_ on a float tensor gives it; the translations
 * round(U(-f * w, f * w)) half to even (Python's round), drawn only when
 * the spec has them, as the scale and shears.  t checked. */
static void
fl_affine_draw(const fl_tspec *t, fl_rng *rng, int w, int h, double prm[8])
{
    prm[0] = (double)(float)fl_rng_uniform(rng, t->rot_lo, t->rot_hi);
    prm[1] = prm[2] = 0.0;
    if (t->aff_tx > 0 || t->aff_ty > 0) {
        const double mx = t->aff_tx * w, my = t->aff_ty * h;
        prm[1] = fl_round_half_even((double)(float)fl_rng_uniform(rng, -mx, mx));
        prm[2] = fl_round_half_even((double)(float)fl_rng_uniform(rng, -my, my));
    }
    prm[3] = t->aff_scale_hi > 0 ? (double)(float)fl_rng_uniform(rng, t->aff_scale_lo, t->aff_scale_hi) : 1.0;
    prm[4] = t->aff_nshear >= 2 ? (double)(float)fl_rng_uniform(rng, t->aff_shear[0], t->aff_shear[1]) : 0.0;
    prm[5] = t->aff_nshear == 4 ? (double)(float)fl_rng_uniform(rng, t->aff_shear[2], t->aff_shear[3]) : 0.0;
    prm[6] = t->aff_center ? t->aff_cx : w * 0.5;
    prm[7] = t->aff_center ? t->aff_cy : h * 0.5;
}

/* One sample's ColorJitter ops (imgops.h fl_jitter: RandomApply's draw,
 * the order, then the factors), written to op / mag (room for 4).  Returns
 * how many.  t checked. */
static int
fl_jitter_draw(const fl_jitter *J, fl_rng *rng, int *op, double *mag)
{
    static const int ops[4] = {FL_AUG_BRIGHTNESS_FACTOR, FL_AUG_CONTRAST_FACTOR, FL_AUG_COLOR_FACTOR, FL_AUG_HUE};
    if (J->p < 1.0 && !(fl_rng_uniform(rng, 0.0, 1.0) < J->p))
        return 0;
    int order[4] = {0, 1, 2, 3};
    for (int i = 3; i > 0; i--) {   /* Fisher-Yates: each of the 24 orders with probability 1/24 */
        int j = (int)fl_rng_below(rng, (uint64_t)i + 1);
        int tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    double factor[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; k++)
        if (J->has[k])
            factor[k] = (double)(float)fl_rng_uniform(rng, J->lo[k], J->hi[k]);
    int n = 0;
    for (int i = 0; i < 4; i++) {
        if (!J->has[order[i]])
            continue;
        op[n] = ops[order[i]];
        mag[n] = factor[order[i]];
        n++;
    }
    return n;
}

/* One sample's GaussianBlur (imgops.h fl_blur): RandomApply's draw (only
 * when p < 1), then sigma uniform in [lo, hi] rounded to float32, as
 * torch.empty(1).uniform_(lo, hi).item() gives it.  Returns sigma, or 0
 * when the sample is not blurred.  B checked (p > 0). */
static double
fl_blur_draw(const fl_blur *B, fl_rng *rng)
{
    if (B->p < 1.0 && !(fl_rng_uniform(rng, 0.0, 1.0) < B->p))
        return 0.0;
    return (double)(float)fl_rng_uniform(rng, B->lo, B->hi);
}

/* timm's _randomly_negate: -v with probability 1/2. */
static double
fl_negate_half(fl_rng *rng, double v)
{
    return fl_rng_below(rng, 2) ? -v : v;
}

/* Posterize's bits for fl_aug_apply (0..8) from timm's level: 8 and more
 * keep every bit (timm's posterize returns the image), less than 0 none.
 * Pure. */
static double
fl_clamp_bits(double bits)
{
    return bits > 8 ? 8 : bits < 0 ? 0 : bits;
}

/* The argument timm's level function (imgops.h FL_LEVEL_*) gives for the
 * clipped magnitude m, in Python's double arithmetic and order; w / h: the
 * image size the translate_rel levels scale by (X ops: w). */
static double
fl_timm_level(const fl_timm_op *o, double m, fl_rng *rng, int w, int h)
{
    double q = m / 10.0;   /* level / _LEVEL_DENOM */
    switch (o->level) {
    case FL_LEVEL_ROTATE:
        return fl_negate_half(rng, q * 30.0);
    case FL_LEVEL_ENHANCE:
        return q * 1.8 + 0.1;
    case FL_LEVEL_ENHANCE_INC: {
        double v = 1.0 + fl_negate_half(rng, q * 0.9);
        return v > 0.1 ? v : 0.1;   /* max(0.1, v) */
    }
    case FL_LEVEL_SHEAR:
        return fl_negate_half(rng, q * 0.3);
    case FL_LEVEL_TRANSLATE_ABS:
        return fl_negate_half(rng, q * o->hparam);
    case FL_LEVEL_TRANSLATE_REL:   /* pct * img.size[0] (X) or img.size[1] (Y) */
        return fl_negate_half(rng, q * o->hparam) * (o->op == FL_AUG_AFFINE_TRANSLATE_Y ? (double)h : (double)w);
    /* the bits to keep, clamped: timm's posterize returns the image for 8 or
     * more, and below 0 (PosterizeIncreasing past magnitude 12.5, with an
     * mmax over 10) Pillow's mask arithmetic keeps nothing, as for 0 bits
     * (Pillow 13 raises for both: docs/recipes.md) */
    case FL_LEVEL_POSTERIZE:
        return fl_clamp_bits(trunc(q * 4));
    case FL_LEVEL_POSTERIZE_INC:
        return fl_clamp_bits(4 - trunc(q * 4));
    case FL_LEVEL_POSTERIZE_ORIG:
        return fl_clamp_bits(trunc(q * 4) + 4);
    case FL_LEVEL_SOLARIZE:
    case FL_LEVEL_SOLARIZE_INC: {
        double v = trunc(q * 256);
        v = v < 256 ? v : 256;
        return o->level == FL_LEVEL_SOLARIZE ? v : 256 - v;
    }
    case FL_LEVEL_SOLARIZE_ADD: {
        double v = trunc(q * 110);
        return v < 128 ? v : 128;
    }
    /* _minmax_level_to_arg: min + (max - min) * q, clamped to [min, max] */
    case FL_LEVEL_DESATURATE: {
        double v = 0.5 + (1.0 - 0.5) * q;
        v = v > 1.0 ? 1.0 : v < 0.5 ? 0.5 : v;
        v = 1.0 - v;   /* desaturate's min(1., max(0., 1. - factor)) */
        return v < 0.0 ? 0.0 : v > 1.0 ? 1.0 : v;
    }
    case FL_LEVEL_BLUR: {
        double v = 0.1 + (2.0 - 0.1) * q;
        return v > 2.0 ? 2.0 : v < 0.1 ? 0.1 : v;
    }
    case FL_LEVEL_BLUR_RAND: {
        double f = 0.0 + (1.0 - 0.0) * q;
        f = f > 1.0 ? 1.0 : f < 0.0 ? 0.0 : f;
        return 0.1 + (2.0 * f - 0.1) * fl_rng_uniform(rng, 0.0, 1.0);   /* random.uniform(0.1, 2.0 * f) */
    }
    }
    return 0.0;   /* FL_LEVEL_NONE */
}

/* One timm AugmentOp (imgops.h fl_timm_op: AugmentOp.__call__), appended
 * to p->aug_* when it applies.  The draws: whether it applies, its
 * magnitude noise, its level function's sign, then (geometric ops, interp
 * FL_AUG_RANDOM) its filter. */
static void
fl_timm_op_draw(const fl_timm_op *o, int interp, fl_rng *rng, int w, int h, fl_plan *p)
{
    if (o->prob < 1.0 && fl_rng_uniform(rng, 0.0, 1.0) > o->prob)   /* random.random() > prob: skipped */
        return;
    double m = o->m;
    if (o->mstd > 0)
        m = isinf(o->mstd) ? fl_rng_uniform(rng, 0.0, m) : m + o->mstd * fl_rng_normal(rng);
    double upper = o->mmax > 0 ? o->mmax : 10.0;   /* magnitude_max or _LEVEL_DENOM */
    m = m < upper ? m : upper;
    m = m > 0.0 ? m : 0.0;
    double arg = fl_timm_level(o, m, rng, w, h);
    int geometric = o->op == FL_AUG_ROTATE || (o->op >= FL_AUG_AFFINE_SHEAR_X && o->op <= FL_AUG_AFFINE_TRANSLATE_Y);
    if (interp == FL_AUG_RANDOM)   /* random.choice((BILINEAR, BICUBIC)), in the geometric ops only */
        interp = geometric && fl_rng_below(rng, 2) ? FL_AUG_BICUBIC : FL_AUG_BILINEAR;
    p->aug_op[p->naug] = o->op;
    p->aug_mag[p->naug] = arg;
    p->aug_interp[p->naug] = interp;
    p->naug++;
}

/* One sample's ops of timm's RandAugment (FL_POLICY_TIMM_RA: the
 * distribution of RandAugment.__call__), appended to p->aug_*: the ops
 * first, then each drawn by fl_timm_op_draw.  t checked. */
static void
fl_timm_ra_draw(const fl_policy *P, fl_rng *rng, int w, int h, fl_plan *p)
{
    int chosen[FL_POLICY_MAX_ROUNDS];
    if (!P->has_weights) {
        for (int r = 0; r < P->rounds; r++)
            chosen[r] = (int)fl_rng_below(rng, (uint64_t)P->nops);
    } else {   /* successive draws by weight among the ops not yet chosen */
        double wt[FL_POLICY_MAX_OPS];
        memcpy(wt, P->weight, sizeof wt);
        for (int r = 0; r < P->rounds; r++) {
            double total = 0.0;
            int last = -1;
            for (int i = 0; i < P->nops; i++) {
                total += wt[i];
                if (wt[i] > 0)
                    last = i;
            }
            double u = fl_rng_uniform(rng, 0.0, total), acc = 0.0;
            int pick = last;
            for (int i = 0; i < P->nops; i++) {
                acc += wt[i];
                if (wt[i] > 0 && u < acc) {
                    pick = i;
                    break;
                }
            }
            chosen[r] = pick;
            wt[pick] = 0.0;
        }
    }
    p->naug = 0;
    for (int r = 0; r < P->rounds; r++)
        fl_timm_op_draw(&P->timm[chosen[r]], P->interp, rng, w, h, p);
}

/* One sample's ops of timm's AutoAugment (FL_POLICY_TIMM_AA:
 * AutoAugment.__call__): a sub-policy uniformly, then its AugmentOps in
 * order.  t checked. */
static void
fl_timm_aa_draw(const fl_policy *P, fl_rng *rng, int w, int h, fl_plan *p)
{
    int s = (int)fl_rng_below(rng, (uint64_t)P->nsub);
    p->naug = 0;
    for (int k = 0; k < P->sub_len[s]; k++)
        fl_timm_op_draw(&P->timm[P->sub[s][k].op], P->interp, rng, w, h, p);
}

/* One sample's timm AugMix (imgops.h FL_POLICY_TIMM_AUGMIX, in
 * AugMixAugment.__call__'s order: the Dirichlet weights, Beta's m, then
 * chain by chain its depth and each AugmentOp with its own draws), the
 * chains' ops appended to p->aug_op / aug_mag.  t checked. */
static void
fl_timm_augmix_draw(const fl_policy *P, fl_rng *rng, int w, int h, fl_plan *p)
{
    double g[FL_POLICY_MAX_ROUNDS], total = 0.0;
    for (int i = 0; i < P->rounds; i++) {
        g[i] = fl_rng_gamma(rng, P->alpha);
        total += g[i];
    }
    const double b0 = fl_rng_gamma(rng, P->alpha), b1 = fl_rng_gamma(rng, P->alpha);
    /* np.float32 of numpy's draws; sums that underflow (tiny alpha) split evenly */
    p->mix_w0 = b0 + b1 > 0 ? (float)(b0 / (b0 + b1)) : 0.5f;
    for (int i = 0; i < P->rounds; i++)
        p->mix_w[i] = total > 0 ? (float)(g[i] / total) : (float)(1.0 / P->rounds);
    p->mix_chains = P->rounds;
    p->mix_timm = 1;
    for (int i = 0; i < P->rounds; i++) {
        const int depth = P->depth > 0 ? P->depth : 1 + (int)fl_rng_below(rng, 3);   /* randint(1, 4) */
        const int before = p->naug;
        for (int k = 0; k < depth; k++)
            fl_timm_op_draw(&P->timm[fl_rng_below(rng, (uint64_t)P->ntimm)], P->interp, rng, w, h, p);
        p->mix_len[i] = p->naug - before;
    }
}

/* RandomErasing on the sample's out_w x out_h (torchvision's v1 get_params /
 * v2 make_params, and timm's RandomErasing._erase, which generalises it to
 * several boxes): apply with probability p; the box count uniform in
 * min_count..max_count (1 when both are 0); per box up to 10 tries of
 * area * U(scale) / count and exp(U(log ratio)), h = round(sqrt(area *
 * aspect)), w = round(sqrt(area / aspect)), kept when h < H and w < W, then
 * the offsets (row first); a box whose tries all fail is left out.  t
 * checked. */
static void
fl_erase_draw(const fl_erase *E, fl_rng *rng, fl_plan *p)
{
    p->nerase = 0;
    if (!(fl_rng_uniform(rng, 0.0, 1.0) < E->p))
        return;
    int lo = E->min_count ? E->min_count : 1, hi = E->max_count ? E->max_count : lo;
    int count = lo == hi ? lo : lo + (int)fl_rng_below(rng, (uint64_t)(hi - lo + 1));
    int H = p->out_h, W = p->out_w;
    double area = (double)H * (double)W;
    double log_lo = log(E->ratio_lo), log_hi = log(E->ratio_hi);
    for (int b = 0; b < count; b++) {
        for (int attempt = 0; attempt < 10; attempt++) {
            double erase_area = area * fl_rng_uniform(rng, E->scale_lo, E->scale_hi) / count;
            double aspect = exp(fl_rng_uniform(rng, log_lo, log_hi));
            double hd = fl_round_half_even(sqrt(erase_area * aspect));
            double wd = fl_round_half_even(sqrt(erase_area / aspect));
            if (!(hd < H && wd < W))
                continue;
            int h = (int)hd, w = (int)wd;
            int y = (int)fl_rng_below(rng, (uint64_t)(H - h + 1));
            int x = (int)fl_rng_below(rng, (uint64_t)(W - w + 1));
            if (h > 0 && w > 0) {
                int *box = p->erase_box[p->nerase++];
                box[0] = x;
                box[1] = y;
                box[2] = w;
                box[3] = h;
            }
            break;
        }
    }
    p->erase_key = fl_rng_next(rng);
}

/* torchvision's _compute_resized_output_size for a W x H image.  Returns 0
 * with *rw x *rh, or -1 with err filled (empty or oversized result). */
static int
fl_resize_size(const fl_tspec *t, int W, int H, int *rw, int *rh, fl_err *err)
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
        fl_err_set(err, FL_ERR_INVALID, 0, "image %d x %d resizes to an invalid size %.0f x %.0f", W, H, new_w, new_h);
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

/* Contract: imgops.h. */
int
fl_plan_sample(const fl_tspec *t, int src_w, int src_h, uint64_t seed, uint64_t epoch, uint64_t index,
               fl_plan *out, fl_err *err)
{
    if (fl_tspec_check(t, err) < 0)
        return -1;
    if (src_w <= 0 || src_h <= 0 || src_w > FL_MAX_DIM || src_h > FL_MAX_DIM) {
        fl_err_set(err, FL_ERR_INVALID, 0, "invalid source size %d x %d", src_w, src_h);
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
        if (fl_resize_size(t, src_w, src_h, &p.rs_w, &p.rs_h, err) < 0)
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
        fl_err_set(err, FL_ERR_INVALID, 0,
                   "image %d x %d gives a %d x %d sample, not the batch's %d x %d "
                   "(add a CenterCrop or resize to a fixed (h, w))",
                   src_w, src_h, p.out_w, p.out_h, t->out_w, t->out_h);
        return -1;
    }
    /* timm's random.choice((BILINEAR, BICUBIC)), after the crop box */
    p.interp = t->interp == FL_INTERP_RANDOM ? (fl_rng_below(&rng, 2) ? FL_INTERP_BICUBIC : FL_INTERP_BILINEAR)
                                             : t->interp;
    if (t->flip_p > 0)
        p.flip = fl_rng_uniform(&rng, 0.0, 1.0) < t->flip_p;
    /* drawn only when the spec has one, so specs without it keep their draws */
    if (t->vflip_p > 0)
        p.vflip = fl_rng_uniform(&rng, 0.0, 1.0) < t->vflip_p;
    /* In the Compose's order: a ColorJitter right after the flips,
     * RandomRotation's angle, a ColorJitter before the policy, the policy,
     * a ColorJitter after it.  The policy draws fill the op list from 0;
     * what comes before it is put in front of them afterwards. */
    const fl_jitter *J = &t->jitter;
    int pre_op[6], npre = 0, jit_op[4] = {0}, njit = 0;
    double pre_mag[6], jit_mag[4] = {0};
    if (J->p > 0 && J->pos == FL_JITTER_AFTER_FLIPS) {
        npre = fl_jitter_draw(J, &rng, pre_op, pre_mag);
    }
    if (t->rotate == FL_ROT_ROTATION) {
        pre_op[npre] = FL_AUG_ROTATE;
        pre_mag[npre] = fl_rng_uniform(&rng, t->rot_lo, t->rot_hi);
        npre++;
    } else if (t->rotate) {
        fl_affine_draw(t, &rng, p.out_w, p.out_h, p.aff);
        pre_op[npre] = t->rotate == FL_ROT_AFFINE_V2 ? FL_AUG_TV_AFFINE_V2 : FL_AUG_TV_AFFINE;
        pre_mag[npre] = 0.0;
        npre++;
    }
    if (J->p > 0 && J->pos == FL_JITTER_BEFORE_POLICY)
        npre += fl_jitter_draw(J, &rng, pre_op + npre, pre_mag + npre);
    if (t->policy.rounds > 0 && t->policy.kind == FL_POLICY_TIMM_RA)
        fl_timm_ra_draw(&t->policy, &rng, p.out_w, p.out_h, &p);
    else if (t->policy.rounds > 0 && t->policy.kind == FL_POLICY_TIMM_AA)
        fl_timm_aa_draw(&t->policy, &rng, p.out_w, p.out_h, &p);
    else if (t->policy.rounds > 0 && t->policy.kind == FL_POLICY_AUGMIX)
        fl_augmix_draw(&t->policy, &rng, &p);
    else if (t->policy.rounds > 0 && t->policy.kind == FL_POLICY_TIMM_AUGMIX)
        fl_timm_augmix_draw(&t->policy, &rng, p.out_w, p.out_h, &p);
    else if (t->policy.rounds > 0)
        fl_policy_draw(&t->policy, &rng, &p);
    if (J->p > 0 && J->pos == FL_JITTER_AFTER_POLICY)
        njit = fl_jitter_draw(J, &rng, jit_op, jit_mag);
    /* FL_PLAN_MAX_AUG has room for these past the policy's most: a rotation and one ColorJitter */
    if (npre > 0) {
        memmove(p.aug_op + npre, p.aug_op, (size_t)p.naug * sizeof p.aug_op[0]);
        memmove(p.aug_mag + npre, p.aug_mag, (size_t)p.naug * sizeof p.aug_mag[0]);
        memmove(p.aug_interp + npre, p.aug_interp, (size_t)p.naug * sizeof p.aug_interp[0]);
        for (int i = 0; i < npre; i++) {
            p.aug_op[i] = pre_op[i];
            p.aug_mag[i] = pre_mag[i];
            const int geometric = pre_op[i] == FL_AUG_ROTATE || pre_op[i] == FL_AUG_TV_AFFINE
                                  || pre_op[i] == FL_AUG_TV_AFFINE_V2;
            p.aug_interp[i] = geometric ? t->rot_interp : FL_AUG_NEAREST;
        }
        p.naug += npre;
    }
    if (J->p > 0 && J->pos == FL_JITTER_AFTER_POLICY) {
        for (int i = 0; i < njit; i++) {
            p.aug_op[p.naug] = jit_op[i];
            p.aug_mag[p.naug] = jit_mag[i];
            p.aug_interp[p.naug] = FL_AUG_NEAREST;
            p.naug++;
        }
    }
    /* after the policy's draws, in the Compose's order; each only when the spec has one */
    if (t->blur.p > 0 && t->blur.pos == FL_BLUR_BEFORE_GRAY)
        p.blur = fl_blur_draw(&t->blur, &rng);
    if (t->gray_p > 0)
        p.gray = fl_rng_uniform(&rng, 0.0, 1.0) < t->gray_p;
    if (t->blur.p > 0 && t->blur.pos == FL_BLUR_AFTER_GRAY)
        p.blur = fl_blur_draw(&t->blur, &rng);
    if (t->erase.p > 0)
        fl_erase_draw(&t->erase, &rng, &p);
    *out = p;
    return 0;
}

