/* mix.h: the batch stage of the training recipes: torchvision v2's MixUp and
 * CutMix (and RandomChoice between them), and timm's Mixup (timm.data.Mixup:
 * MixUp / CutMix per batch, per pair or per element, with label smoothing),
 * on a finished batch in its buffer.
 *
 * Reference semantics: torchvision.transforms.v2.MixUp / CutMix called as
 * mixup_cutmix(images, labels) on a float32 N x C x H x W batch and int64
 * labels: the batch is paired with itself rolled by one (sample i with
 * sample i - 1, sample 0 with the last), the labels become one-hot rows
 * mixed with the same weights.  The draws (which transform, lambda from
 * Beta(alpha, alpha), CutMix's centre) come from rng.h keyed by
 * (seed, epoch, batch number), so they are the same for any num_workers;
 * the distributions are torchvision's.
 *
 * No Python, no GIL: caller-owned memory only; re-entrant.
 */
#ifndef FL_MIX_H
#define FL_MIX_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

enum { FL_MIX_MIXUP = 0, FL_MIX_CUTMIX = 1 };
#define FL_MIX_MAX_CHOICES 4

typedef struct {
    int n;                               /* choices: 1 (one transform) .. FL_MIX_MAX_CHOICES (RandomChoice) */
    int kind[FL_MIX_MAX_CHOICES];        /* FL_MIX_* */
    double alpha[FL_MIX_MAX_CHOICES];    /* Beta(alpha, alpha), alpha > 0 */
    double p[FL_MIX_MAX_CHOICES];        /* RandomChoice's weights (need not sum to 1) */
} fl_mix_spec;

typedef struct {
    int kind;                            /* FL_MIX_* */
    double lam;                          /* the images' weight (CutMix: 1 - box area / image area) */
    int x1, y1, x2, y2;                  /* CutMix's box, [x1, x2) x [y1, y2) */
} fl_mix_params;

/* One batch's draws for an H x W batch: the choice (weights p), lambda from
 * Beta(alpha, alpha) (two Gamma draws, Marsaglia-Tsang), and for CutMix
 * torchvision's box (centre uniform in the image, half-sides
 * int(0.5 * sqrt(1 - lambda) * W) and ... * H, clamped to the image) and
 * its adjusted lambda.  No GIL.  Returns 0, or -1 with err filled
 * (FL_ERR_INVALID: an invalid spec or size). */
int fl_mix_draw(const fl_mix_spec *s, int H, int W, uint64_t seed, uint64_t epoch, uint64_t batch,
                fl_mix_params *out, fl_err *err);

/* Mix the float32 batch x (N x C x H x W, contiguous) in place:
 * MixUp: x[i] = x[i - 1] * (float)(1 - lam) + x[i] * (float)lam, each
 * product rounded to float32 and then summed, as torch computes
 * roll(1, 0).mul_(1 - lam).add_(x.mul(lam)); CutMix: x[i]'s box takes
 * x[i - 1]'s (the originals; x[-1] is x[N - 1]).  tmp: caller-owned, at
 * least C * H * W floats (the last sample's original).  No GIL.  Returns 0,
 * or -1 with err filled (FL_ERR_INVALID: sizes, or a box outside the
 * image). */
int fl_mix_images_f32(const fl_mix_params *p, float *x, int N, int C, int H, int W, float *tmp, fl_err *err);

/* The mixed soft labels: out (N x num_classes float32, caller-owned) =
 * onehot(labels).roll(1, 0) * (float)(1 - lam) + onehot(labels) * (float)lam.
 * No GIL.  Returns 0, or -1 with err filled (FL_ERR_INVALID: a label
 * outside 0..num_classes - 1, naming its position). */
int fl_mix_labels(const fl_mix_params *p, const int64_t *labels, int N, int num_classes, float *out, fl_err *err);


/* ---- timm's Mixup (timm.data.mixup.Mixup, timm 1.0.x) --------------------
 *
 * Reference semantics: mixup_fn(x, target) on a float32 N x C x H x W batch
 * (N even) and int64 labels, with numpy >= 2 (NEP 50 promotion).  Sample i is
 * paired with sample N - 1 - i (x.flip(0)), never torchvision's roll.
 *
 * The draws, per batch ('batch': one draw) or per pair ('pair': N / 2, draw
 * k for samples k and N - 1 - k) or per element ('elem': N, draw i for
 * sample i), are those of timm's _params_per_batch / _params_per_elem and
 * cutmix_bbox_and_lam: mix at all with probability prob (only when enabled);
 * CutMix instead of MixUp with probability switch_prob when both alphas are
 * > 0 (else the one that is); lam ~ Beta(alpha, alpha) of the chosen kind,
 * rounded to float32 in 'pair' / 'elem' (timm keeps those lams in a float32
 * array); a lam of exactly 1 mixes nothing.  The CutMix box: rand_bbox
 * (ratio sqrt(1 - lam), cut sides int(H * ratio), int(W * ratio) -- in double
 * for 'batch', in float32 for 'pair' / 'elem' as numpy computes with a
 * float32 lam --, centre uniform in the image, clipped), lam then
 * 1 - area / (H * W) when correct_lam; or rand_bbox_minmax (sides uniform in
 * [int(H * lo), int(H * hi)) and [int(W * lo), int(W * hi)), corner uniform
 * where the box fits), lam always from the area.  The distributions are
 * timm's; the numbers come from rng.h keyed by (seed, epoch, batch number),
 * not numpy's global generator, so they are the same for any num_workers.
 */
enum { FL_TIMM_MODE_BATCH = 0, FL_TIMM_MODE_PAIR = 1, FL_TIMM_MODE_ELEM = 2 };

typedef struct {
    double mixup_alpha;     /* MixUp is active when > 0 (finite, < 1e6) */
    double cutmix_alpha;    /* CutMix is active when > 0 (finite, < 1e6) */
    int minmax;             /* cutmix_minmax given: rand_bbox_minmax's box */
    double minmax_lo, minmax_hi;   /* with minmax: 0 <= lo < hi <= 1 */
    double prob;            /* mix_prob: mix when a uniform [0, 1) draw is below it */
    double switch_prob;     /* CutMix when a uniform draw is below it (both kinds active) */
    int mode;               /* FL_TIMM_MODE_* */
    int correct_lam;        /* lam from the clipped box's area (rand_bbox) */
    int enabled;            /* mixup_enabled: 0 draws nothing, lam 1 (labels smoothed only) */
    double smoothing;       /* label_smoothing, finite */
    int num_classes;        /* > 0 */
} fl_timm_mix_spec;

typedef struct {
    int mixed;              /* 0: lam is 1, nothing mixed (disabled, the prob draw missed, or lam drew 1) */
    int cutmix;             /* use_cutmix as timm's _params_* return it (only meaningful when mixed) */
    double lam_draw;        /* lam as _params_* return it: 1, or the Beta draw ('pair' / 'elem': a float32 value) */
    double lam;             /* the lam the labels take: lam_draw, or from the box (a float32 value in 'pair' / 'elem') */
    int nrandint;           /* the box's integer draws in timm's call order: */
    int randint[4];         /*   rand_bbox: cy, cx; rand_bbox_minmax: cut_h, cut_w, yl, xl */
    int yl, yh, xl, xh;     /* the box [yl, yh) x [xl, xh) when mixed and cutmix; else 0 */
} fl_timm_mix_params;

/* The draws a batch of N takes: 1 ('batch'), N / 2 ('pair'), N ('elem');
 * 0 for an invalid mode or N.  Pure. */
int fl_timm_mix_count(const fl_timm_mix_spec *s, int N);

/* One batch's draws for N samples of H x W into out[0 .. fl_timm_mix_count)
 * (caller-owned).  No GIL.  Returns 0, or -1 with err filled
 * (FL_ERR_INVALID: an invalid spec, an odd or empty batch, a size, or
 * cutmix_minmax leaving no box side for this H or W -- where numpy's
 * randint raises a ValueError). */
int fl_timm_mix_draw(const fl_timm_mix_spec *s, int N, int H, int W, uint64_t seed, uint64_t epoch,
                     uint64_t batch, fl_timm_mix_params *out, fl_err *err);

/* Mix the float32 batch x (N x C x H x W, contiguous) in place with the
 * draws p (fl_timm_mix_draw's, fl_timm_mix_count(s, N) of them), as timm
 * computes it: 'batch' MixUp x[i] = x[i] * (float)lam + x[N-1-i] * (float)(1 - lam)
 * (x.mul_(lam).add_(x.flip(0).mul_(1 - lam))), 'pair' / 'elem' MixUp with the
 * float32 lam L and 1 - L rounded to float32 (x[i] * lam + x_orig[j] * (1 - lam));
 * each product rounded to float32, then the sum; CutMix: the box of x[i]
 * takes x[N-1-i]'s.  Every sample reads the originals.  No scratch, no GIL.
 * Returns 0, or -1 with err filled (FL_ERR_INVALID: sizes, an odd batch, a
 * box outside the image); x is unchanged on error. */
int fl_timm_mix_images_f32(const fl_timm_mix_spec *s, const fl_timm_mix_params *p, float *x, int N, int C, int H,
                           int W, fl_err *err);

/* timm's mixup_target: out (N x num_classes float32, caller-owned) =
 * y1 * lam + y2 * (1 - lam), y1 the one-hot rows of labels with
 * off = (float)(smoothing / num_classes) and on = (float)(1 - smoothing + off),
 * y2 = y1.flip(0); lam per row (the batch's, the pair's, the element's), as
 * torch computes it: 'batch' with (float)lam and (float)(1 - lam) (a Python
 * float), 'pair' / 'elem' with the float32 L and 1 - L rounded to float32
 * (a float32 tensor); products rounded, then the sum.  No GIL.  Returns 0,
 * or -1 with err filled (FL_ERR_INVALID: a label outside
 * 0..num_classes - 1, naming its position; sizes). */
int fl_timm_mix_labels(const fl_timm_mix_spec *s, const fl_timm_mix_params *p, const int64_t *labels, int N,
                       float *out, fl_err *err);

#endif
