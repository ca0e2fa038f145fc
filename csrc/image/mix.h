/* mix.h: the batch stage of the training recipes: torchvision v2's MixUp and
 * CutMix (and RandomChoice between them), on a finished batch in its buffer.
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

#endif
