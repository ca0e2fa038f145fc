/* imgops.h: per-sample image transforms for the native pipeline.
 *
 * A worker thread (no GIL) decodes a JPEG, asks fl_plan_sample for the
 * sample's random decisions (torchvision's algorithms, drawn from rng.h keyed
 * by (seed, epoch, index)), then fl_render turns the decoded pixels into one
 * output sample written straight into its batch slot: crop, antialiased
 * bilinear or bicubic resize (Pillow's fixed-point algorithm, bit-exact at
 * full scale),
 * window (CenterCrop, zero padded), flip, channel conversion, dtype
 * conversion, Normalize and layout, fused into one pass over the output.
 *
 * Reference semantics: torchvision.datasets.ImageFolder (PIL RGB images) +
 * torchvision.transforms(.v2) on PIL images + ToTensor / ToImage+ToDtype +
 * Normalize.
 *
 * Nothing here touches Python; every function is safe without the GIL and
 * re-entrant given distinct scratch objects.
 *
 * This is the stage's one public header.  Its units, one stage each:
 * plan.c (fl_tspec_check, fl_tspec_sample_bytes, fl_plan_sample),
 * render.c (fl_render, fl_plan_source_window, fl_scratch_free),
 * resample.c (the resampler fl_render drives; resample.h) and convert.c
 * (dtype conversion, Normalize, layout); imgops_internal.h declares what
 * they share.
 */
#ifndef FL_IMGOPS_H
#define FL_IMGOPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "image/augment.h"   /* fl_gblur, in fl_blur */

enum { FL_DT_U8 = 0, FL_DT_F16 = 1, FL_DT_BF16 = 2, FL_DT_F32 = 3 };
/* fl_tspec.rotate: the random geometric step after the flips */
enum { FL_ROT_NONE = 0, FL_ROT_ROTATION = 1, FL_ROT_AFFINE = 2, FL_ROT_AFFINE_V2 = 3 };
enum { FL_LAYOUT_CHW = 0, FL_LAYOUT_HWC = 1 };
enum { FL_GEOM_NONE = 0, FL_GEOM_RRC = 1, FL_GEOM_RESIZE_CROP = 2 };
/* fl_tspec.interp: the filter of the crop/resize (RandomResizedCrop,
 * Resize), Pillow's antialiased resample with that filter; fl_plan.interp:
 * the one a sample is resized with. */
enum {
    FL_INTERP_BILINEAR = 0,  /* Pillow's BILINEAR: triangle, support 1 (torchvision's default) */
    FL_INTERP_BICUBIC = 1,   /* Pillow's BICUBIC: cubic convolution with a = -0.5, support 2 */
    FL_INTERP_RANDOM = 2,    /* spec only: bilinear or bicubic, 1/2 each, drawn per sample (timm's
                                RandomResizedCropAndInterpolation(interpolation="random")) */
};
/* fl_tspec.scale_to_unit: how uint8 becomes float.  The two torchvision
 * spellings differ in the last bit for 126 of the 256 values. */
enum {
    FL_SCALE_NONE = 0,  /* x as float (ToDtype(float, scale=False)) */
    FL_SCALE_DIV = 1,   /* x / 255.0f: ToTensor, v1 ConvertImageDtype */
    FL_SCALE_MUL = 2,   /* x * (float)(1.0 / 255): v2 ToDtype(scale=True), v2 ConvertImageDtype */
};

/* Largest width/height accepted anywhere (source, resized, output). */
#define FL_MAX_DIM (1 << 20)

/* An augmentation policy (AutoAugment / RandAugment / TrivialAugmentWide),
 * applied to the uint8 sample after the flip and before the dtype
 * conversion.  The tables are the library's own: fastloader/transforms.py
 * fills them from the transform object's augmentation space, so the op
 * list, magnitude bins and signs are exactly torchvision's.
 * Per sample: `rounds` times, pick one sub-policy uniformly; for each of its
 * steps, apply it with probability p (drawn only when p < 1), with the
 * magnitude of bin `bin` of its op (uniform over the op's bins when -1; 0.0
 * when the op has none), negated with probability 1/2 when the op is
 * signed.  The op codes and what a magnitude means are augment.h's. */
#define FL_POLICY_MAX_OPS 16
#define FL_POLICY_MAX_BINS 32
#define FL_POLICY_MAX_SUB 32
#define FL_POLICY_MAX_STEPS 2
#define FL_POLICY_MAX_ROUNDS 8
#define FL_AUGMIX_MAX_OPS 32    /* AugMix: ops over all chains (width x the deepest chain) */
#define FL_PLAN_MAX_AUG (FL_AUGMIX_MAX_OPS + 1 + 4)   /* the most of any policy, + RandomRotation's and
                                                         ColorJitter's */

/* fl_policy.kind */
enum {
    FL_POLICY_TV = 0,     /* torchvision's: magnitude bins and sub-policies, as above */
    FL_POLICY_TIMM_RA = 1,/* timm's RandAugment of AugmentOps (timm.data.auto_augment): per sample, `rounds`
                             of the nops ops timm[0..nops-1] chosen uniformly with replacement
                             (np.random.choice), or, when has_weights, by weight without replacement;
                             each then drawn as an AugmentOp (fl_timm_op); subs unused */
    FL_POLICY_TIMM_AA = 2,/* timm's AutoAugment (original, v0 and their r forms): per sample one of the nsub
                             sub-policies uniformly (random.choice), each of its steps the AugmentOp
                             timm[step.op] drawn as an AugmentOp; rounds 1 */
    FL_POLICY_AUGMIX = 3, /* torchvision's AugMix (v1 and v2): per sample the weights, m ~ Dirichlet(alpha,
                             alpha) and w ~ Dirichlet(alpha x rounds) * m[1]; then `rounds` chains
                             (mixture_width) of `depth` ops each (1..3 uniformly when depth <= 0), each op
                             one of ops[] uniformly, its magnitude one of its nbins (severity) bins
                             uniformly, negated with probability 1/2 when signed; the image is
                             m[0] * image + sum of w[i] * chain i's image, in float32, truncated.  The ops
                             are tensor ops (augment.h FL_AUG_T_*, and Posterize, Solarize, Equalize);
                             subs unused */
    FL_POLICY_TIMM_AUGMIX = 4 /* timm's AugMixAugment (augmix-*, not blended): per sample the chain weights
                             w ~ Dirichlet(alpha x rounds) and m ~ Beta(alpha, alpha), each in float32;
                             then `rounds` chains of `depth` ops (1..3 uniformly when depth <= 0), each
                             one of the AugmentOps timm[0..ntimm-1] uniformly with replacement, drawn as
                             an AugmentOp; the image is Image.blend(image, mix, m), mix the float32 sum
                             of w[i] * chain i clipped and truncated to uint8 */
};
#define FL_POLICY_MAX_TIMM 64

/* fl_policy_op.level (FL_POLICY_TIMM_RA): timm's *_level_to_arg, from the
 * clipped magnitude m (n: negated with probability 1/2, _randomly_negate). */
enum {
    FL_LEVEL_NONE = 0,          /* no argument (AutoContrast, Equalize, Invert) */
    FL_LEVEL_ROTATE = 1,        /* n(m / 10 * 30) degrees */
    FL_LEVEL_ENHANCE = 2,       /* m / 10 * 1.8 + 0.1, a factor */
    FL_LEVEL_ENHANCE_INC = 3,   /* max(0.1, 1 + n(m / 10 * 0.9)), a factor */
    FL_LEVEL_SHEAR = 4,         /* n(m / 10 * 0.3) */
    FL_LEVEL_TRANSLATE_ABS = 5, /* n(m / 10 * hparam) pixels (hparam: translate_const) */
    FL_LEVEL_TRANSLATE_REL = 6, /* n(m / 10 * hparam) * image width (X ops) or height (Y ops) pixels (translate_pct) */
    FL_LEVEL_POSTERIZE = 7,     /* int(m / 10 * 4) bits */
    FL_LEVEL_POSTERIZE_INC = 8, /* 4 - int(m / 10 * 4) bits */
    FL_LEVEL_POSTERIZE_ORIG = 9,/* int(m / 10 * 4) + 4 bits */
    FL_LEVEL_SOLARIZE = 10,     /* min(256, int(m / 10 * 256)), the threshold */
    FL_LEVEL_SOLARIZE_INC = 11, /* 256 - min(256, int(m / 10 * 256)) */
    FL_LEVEL_SOLARIZE_ADD = 12, /* min(128, int(m / 10 * 110)), the addend */
    FL_LEVEL_DESATURATE = 13,   /* Desaturate: the Color factor min(1, max(0, 1 - clip(0.5 + 0.5 * m / 10,
                                   0.5, 1))) */
    FL_LEVEL_BLUR = 14,         /* GaussianBlur: the radius clip(0.1 + 1.9 * m / 10, 0.1, 2) */
    FL_LEVEL_BLUR_RAND = 15,    /* GaussianBlurRand: the radius U(0.1, 2 * clip(m / 10, 0, 1)), drawn as
                                   random.uniform draws it */
    FL_LEVEL_COUNT = 16
};

typedef struct {
    int op;                          /* augment.h FL_AUG_* */
    int is_signed;                   /* negate the magnitude with probability 1/2 */
    int nbins;                       /* 0: no magnitude (0.0 is passed) */
    double mag[FL_POLICY_MAX_BINS];  /* the magnitudes _apply_op receives, in bin order */
} fl_policy_op;

/* One of timm's AugmentOps: applied with probability prob (random() > prob
 * skips it); its magnitude m, or N(m, mstd) (U(0, m) when mstd is
 * infinite), clipped to [0, mmax (10 when 0)], turned into the op's
 * argument by its level function. */
typedef struct {
    int op;                          /* augment.h FL_AUG_* */
    int level;                       /* FL_LEVEL_* */
    double prob;
    double m, mstd, mmax;            /* magnitude, its noise (0 none, INFINITY uniform), its bound (0: 10) */
    double hparam;                   /* translate_const or translate_pct for the translate levels */
} fl_timm_op;

typedef struct {
    int op;                          /* index into fl_policy.ops */
    int bin;                         /* magnitude bin, or -1: uniform over the op's bins */
    double p;                        /* probability the step applies (1: always, no draw) */
} fl_policy_step;

typedef struct {
    int kind;                        /* FL_POLICY_TV, _TIMM_RA, _TIMM_AA or _AUGMIX */
    int rounds;                      /* sub-policies (TIMM_RA: ops; AUGMIX: chains) per sample; 0 = no policy */
    int depth;                       /* AUGMIX: ops per chain, or <= 0 for 1..3 drawn per chain */
    double alpha;                    /* AUGMIX: the Dirichlet parameter, > 0 */
    int interp;                      /* augment.h FL_AUG_NEAREST / BILINEAR; timm's also BICUBIC or RANDOM */
    int has_weights;                 /* TIMM_RA: choose by weight[] (without replacement) */
    double weight[FL_POLICY_MAX_OPS];
    int ntimm;                       /* TIMM_RA / TIMM_AA: the AugmentOps (TIMM_RA: ntimm == nops) */
    fl_timm_op timm[FL_POLICY_MAX_TIMM];
    int fill[3];                     /* 0..255 per channel, for pixels a geometric op uncovers */
    int nops;
    fl_policy_op ops[FL_POLICY_MAX_OPS];
    int nsub;
    int sub_len[FL_POLICY_MAX_SUB];  /* 1 or 2 */
    fl_policy_step sub[FL_POLICY_MAX_SUB][FL_POLICY_MAX_STEPS];
} fl_policy;

/* RandomErasing (torchvision v1/v2, timm) on the finished sample, in its
 * slot: with probability p, count boxes (uniform in min_count..max_count),
 * each of area U(scale) * area / count and aspect exp(U(log ratio)), up to
 * 10 tries each. */
enum {
    FL_ERASE_CONST = 0,    /* a per-channel constant (torchvision's value; timm's mode "const": 0) */
    FL_ERASE_NORMAL = 1,   /* N(0, 1) per element (torchvision's value="random"; timm's mode "pixel") */
    FL_ERASE_CHANNEL = 2   /* N(0, 1) per channel and box (timm's mode "rand") */
};
#define FL_ERASE_MAX_BOXES 8
typedef struct {
    double p;                        /* 0 = off */
    double scale_lo, scale_hi, ratio_lo, ratio_hi;
    int mode;                        /* FL_ERASE_* */
    float value[3];                  /* FL_ERASE_CONST: the value per channel, in the output's units */
    int min_count, max_count;        /* boxes per erased sample; 0 means 1 */
} fl_erase;

/* ColorJitter (torchvision v1 and v2 on the PIL image; timm's color jitter
 * is torchvision's), maybe inside RandomApply(p).  Per sample: with
 * probability p (no draw when p is 1), a uniformly random order of the four
 * adjustments (torch.randperm(4)), then each present factor uniform in
 * [lo, hi], rounded to float32 as torch's uniform_ on a float tensor gives
 * it, drawn in the order brightness, contrast, saturation, hue; applied in
 * the drawn order as augment.h's FL_AUG_BRIGHTNESS_FACTOR,
 * FL_AUG_CONTRAST_FACTOR, FL_AUG_COLOR_FACTOR and FL_AUG_HUE.  `pos` is
 * where it stands among the other uint8 steps (one ColorJitter a spec). */
enum { FL_JITTER_BRIGHTNESS = 0, FL_JITTER_CONTRAST = 1, FL_JITTER_SATURATION = 2, FL_JITTER_HUE = 3 };
enum {
    FL_JITTER_AFTER_FLIPS = 0,    /* right after the flips, before RandomRotation and the policy */
    FL_JITTER_BEFORE_POLICY = 1,  /* after RandomRotation, before the policy */
    FL_JITTER_AFTER_POLICY = 2    /* after the policy (not AugMix), before RandomGrayscale */
};
typedef struct {
    double p;                 /* RandomApply's probability; 0 = no ColorJitter */
    int has[4];               /* FL_JITTER_*: the adjustment is present (torchvision's None otherwise) */
    double lo[4], hi[4];      /* its factor's range: >= 0 for the first three, within [-0.5, 0.5] for hue */
    int pos;                  /* FL_JITTER_AFTER_FLIPS, _BEFORE_POLICY or _AFTER_POLICY */
} fl_jitter;

/* GaussianBlur (torchvision v1 and v2 on the PIL image, as SimCLR, BYOL and
 * timm's gaussian_blur_prob use it), maybe inside RandomApply(p).  Per
 * sample: with probability p (no draw when p is 1), sigma uniform in [lo,
 * hi] rounded to float32 (torch's uniform_ on a float tensor, then
 * .item()), applied by augment.h fl_gblur_apply with k's kernel.  `pos` is
 * where it stands among the last uint8 steps. */
enum {
    FL_BLUR_BEFORE_GRAY = 0,  /* after the policy and a ColorJitter after it, before RandomGrayscale */
    FL_BLUR_AFTER_GRAY = 1    /* after RandomGrayscale (SimCLR's, BYOL's and timm's order) */
};
typedef struct {
    double p;                 /* RandomApply's probability; 0 = no GaussianBlur */
    double lo, hi;            /* sigma's range, within [1e-6, 1e6] (fl_gblur_kernel1d's) */
    int pos;                  /* FL_BLUR_* */
    fl_gblur k;               /* the kernel: sides (odd, each at most the output's side * 2 - 1: torch's
                                 reflect padding), version, torch's vector width and exp */
} fl_blur;

typedef struct {
    int geom;                 /* FL_GEOM_* */
    int out_h, out_w;         /* final sample size (RRC size; or crop size; or resize size if no crop).
                                 For FL_GEOM_NONE out size = source size.  0 x 0 = "each sample's
                                 natural size" (fl_plan.out_w/out_h; single-sample use only). */
    double scale_lo, scale_hi, ratio_lo, ratio_hi;  /* RandomResizedCrop(scale, ratio) */
    int resize_short;         /* Resize(int): shorter side -> resize_short (torchvision rule incl. max_size); 0 = none */
    int resize_h, resize_w;   /* Resize((h, w)) exact; 0 = none */
    int max_size;             /* Resize(max_size=...) or 0; alone (no size) = Resize(None, max_size) */
    int crop_h, crop_w;       /* CenterCrop after the resize; 0 = none (pads with zeros as torchvision does if larger) */
    double flip_p;            /* RandomHorizontalFlip(p); 0 = none */
    double vflip_p;           /* RandomVerticalFlip(p), after the horizontal one (flips commute); 0 = none */
    double gray_p;            /* RandomGrayscale(p) after the geometry, flips and policy (3 channels: Pillow's
                                 convert("L") copied to all three); 0 = none */
    int rotate;               /* after the flips, before the policy (needs a fixed output size), with
                                 rot_interp and rot_fill (equal to policy.fill when there is a policy too):
                                 FL_ROT_ROTATION: RandomRotation, the angle uniform in [rot_lo, rot_hi]
                                 degrees, applied as augment.h FL_AUG_ROTATE (nearest or bilinear);
                                 FL_ROT_AFFINE / FL_ROT_AFFINE_V2: RandomAffine, its parameters drawn as its
                                 get_params draws them (each a float32 value; the angle in [rot_lo, rot_hi],
                                 tx = round(U(-aff_tx * w, aff_tx * w)), ty likewise, the scale and shears
                                 when given), applied by augment.h fl_aug_affine (nearest, bilinear or
                                 bicubic) about (w / 2, h / 2) or the given centre */
    double rot_lo, rot_hi;
    int rot_interp;
    int rot_fill[3];
    double aff_tx, aff_ty;    /* RandomAffine's translate: fractions of the width and height (0: none) */
    double aff_scale_lo, aff_scale_hi;   /* its scale range, or 0, 0: scale 1 */
    int aff_nshear;           /* 0 (no shear), 2 (x only: aff_shear[0..1]) or 4 (x, then y) */
    double aff_shear[4];
    int aff_center;           /* 1: about (aff_cx, aff_cy) instead of the image's centre */
    double aff_cx, aff_cy;
    int interp;               /* FL_INTERP_*: the resize's filter (0, bilinear, by default) */
    int out_channels;         /* 1 or 3 */
    int dtype;                /* FL_DT_* */
    int scale_to_unit;        /* FL_SCALE_* (ignored for FL_DT_U8) */
    int normalize; float mean[3], std[3];   /* (x - mean) / std in float32; float dtypes only */
    int layout;               /* FL_LAYOUT_* */
    fl_policy policy;         /* policy.rounds 0 = none; needs a fixed output size */
    fl_jitter jitter;         /* jitter.p 0 = none; needs a fixed output size */
    fl_blur blur;             /* blur.p 0 = none; needs a fixed output size */
    fl_erase erase;           /* erase.p 0 = none; float dtypes, or uint8 with whole values in 0..255 */
} fl_tspec;

typedef struct {              /* one sample's decisions, all in full-resolution source pixel coordinates */
    int box_x, box_y, box_w, box_h;   /* crop box applied first (RRC box, or the full image for Resize+CenterCrop) */
    int rs_w, rs_h;                   /* the box is resized to rs_w x rs_h (== box size when no resize) */
    int win_x, win_y;                 /* output window of size out_w x out_h inside the resized image; may extend
                                         outside it (zero padding, as CenterCrop pads) */
    int interp;                       /* FL_INTERP_BILINEAR or FL_INTERP_BICUBIC: the resize's filter (the
                                         spec's; its per-sample draw when the spec says FL_INTERP_RANDOM) */
    int flip;                         /* horizontal flip after resize */
    int vflip;                        /* vertical flip of the output window (after the geometry, before the
                                         policy ops) */
    int gray;                         /* RandomGrayscale's draw: the finished uint8 window (after the policy
                                         ops, before the dtype conversion) made gray, luma in every channel */
    double blur;                      /* GaussianBlur's sigma (a float32 value) on the finished uint8 window,
                                         before or after the gray (the spec's blur.pos); 0: not blurred */
    int out_w, out_h;                 /* this sample's natural output size (crop, RRC or resized size) */
    double aff[8];                    /* RandomAffine's draw (the FL_AUG_TV_AFFINE* op of aug): angle, tx, ty,
                                         scale, shx, shy, and the centre cx, cy (fl_aug_affine's prm) */
    int naug;                         /* policy ops to apply, in order (identity ops are left out) */
    int aug_op[FL_PLAN_MAX_AUG];      /* augment.h FL_AUG_* */
    double aug_mag[FL_PLAN_MAX_AUG];
    int aug_interp[FL_PLAN_MAX_AUG];  /* FL_AUG_NEAREST / BILINEAR / BICUBIC: each op's resampling */
    int mix_chains;                   /* AugMix: its chains (0: none).  The last mix_len[0] + ... of the aug
                                         ops are the chains' ops, chain by chain, each applied to a copy of
                                         the image the ops before them give */
    int mix_timm;                     /* 0: torchvision's mix (mix_w0 the image's weight); 1: timm's
                                         (the chains' weighted sum alone, then blended into the image with
                                         alpha mix_w0); a timm chain may have 0 ops (an AugmentOp's prob) */
    int mix_len[FL_POLICY_MAX_ROUNDS];
    float mix_w0;                     /* the original's weight, m[0] */
    float mix_w[FL_POLICY_MAX_ROUNDS];/* chain i's weight, w[i] * m[1] in float32 */
    int nerase;                       /* boxes to erase, in order */
    int erase_box[FL_ERASE_MAX_BOXES][4];  /* x, y, w, h in output pixels */
    uint64_t erase_key;               /* the erase noise's stream (FL_ERASE_NORMAL / FL_ERASE_CHANNEL) */
} fl_plan;

/* Check a spec for consistency (ranges, a known interp, normalize only
 * with float dtypes, std != 0, max_size > resize_short, ...).  No GIL.
 * Returns 0, or -1 with err filled (FL_ERR_INVALID, the message naming the
 * offending field). */
int fl_tspec_check(const fl_tspec *t, fl_err *err);

/* Choose the sample's crop box/flip with torchvision's exact algorithms
 * (RandomResizedCrop.get_params incl. the central fallback; Resize's
 * _compute_resized_output_size incl. max_size; CenterCrop's
 * int(round((H - ch) / 2.0)) offsets and padding), Python's round-half-even
 * included, drawing from fl_rng keyed (seed, epoch, index): geometry first,
 * then the filter (one draw, only for FL_INTERP_RANDOM: bilinear or bicubic
 * with probability 1/2 each, as timm's random.choice; otherwise plan->interp
 * is the spec's), then the flips, then in the Compose's order a ColorJitter
 * (fl_jitter, at its pos), RandomRotation's angle and the policy's ops
 * (fl_policy), then RandomGrayscale and GaussianBlur (fl_blur, in its pos's
 * order), then RandomErasing's box on the
 * sample's output size; each only when the spec has it.  No GIL.  Returns 0, or -1 with err filled (FL_ERR_INVALID) for invalid input
 * (zero-size or oversized source, a spec that fails fl_tspec_check, or a
 * natural output size that differs from a nonzero t->out_w x t->out_h). */
int fl_plan_sample(const fl_tspec *t, int src_w, int src_h, uint64_t seed, uint64_t epoch, uint64_t index,
                   fl_plan *out, fl_err *err);

/* Bytes one output sample takes: out_h * out_w * out_channels * dtype size.
 * No GIL; pure. */
size_t fl_tspec_sample_bytes(const fl_tspec *t);

typedef struct {              /* a decoded buffer and where it sits in source coordinates */
    const uint8_t *data; int w, h; size_t stride; int channels;  /* packed uint8 rows, channels 1 or 3 */
    double origin_x, origin_y;  /* buffer pixel (0,0) is at this position in SCALED coordinates (region decode) */
    double scale_x, scale_y;    /* scaled size / full source size (1.0 when decoded at full size) */
} fl_view;

/* Per-worker scratch memory for fl_render, grown with realloc and reused
 * across calls.  The caller owns it: zero-initialise, then fl_scratch_free
 * when done.  Not shared between threads. */
typedef struct { void *p; size_t cap; void *aux; size_t aux_cap; } fl_scratch;   /* aux: the policy path's image */

/* Release a scratch's memory and reset it to empty.  No GIL.  NULL-safe. */
void fl_scratch_free(fl_scratch *s);

/* Render one sample into out (fl_tspec_sample_bytes(t) bytes, or, when
 * t->out_w/out_h are 0, the plan's out_w x out_h), caller-owned; the source
 * buffer is only read.
 * Steps: crop (plan box mapped into the view: bx = box_x * scale_x - origin_x
 * etc., exact integers at full scale; the filter is clipped at the box),
 * antialiased resize to rs_w x rs_h with the spec's filter (t->interp; the
 * plan's, plan->interp, when the spec says FL_INTERP_RANDOM; the plan's
 * value is ignored otherwise) computing only the rows/columns
 * that land in the output window (Pillow's separable fixed-point resample:
 * horizontal pass to uint8 first, then vertical; an axis whose size does not
 * change is skipped), window with zero padding, flip, channel conversion
 * (gray view -> replicated for 3 channels; RGB view -> Pillow's convert("L")
 * before resizing for 1 channel), dtype conversion via a per-channel
 * 256-entry table (float32 exactly as torch computes ToTensor/ToDtype then
 * Normalize; float16/bfloat16 rounded to nearest even from that float32),
 * layout.  When the plan has policy ops (naug > 0) or a blur, the geometry
 * is first rendered to a uint8 HWC image in scratch->aux, the ops
 * (augment.h) run on it in order, then RandomGrayscale and GaussianBlur (in
 * the spec's blur.pos order), and its rows then go through the same
 * conversion; a plan without them takes the fused single pass.  Last, a plan's erase box is
 * written with the spec's erase value (or N(0, 1) noise keyed by
 * erase_key).  At full scale (scale 1, origin 0) the uint8 result equals
 * PIL's img.crop(box).resize((rs_w, rs_h), BILINEAR or BICUBIC) cut to the
 * window; a full-scale view at an integer origin that holds at least the
 * rectangle fl_plan_source_window reports gives the same bytes as the whole
 * image.
 * No GIL.  Returns 0, or -1 with err filled: FL_ERR_INVALID for an invalid
 * plan (a plan->interp other than bilinear/bicubic under FL_INTERP_RANDOM
 * included) or view, FL_ERR_NOMEM when out of memory.  On error the
 * contents of out are unspecified. */
int fl_render(const fl_tspec *t, const fl_plan *plan, const fl_view *src, void *out, fl_scratch *scratch,
              fl_err *err);

/* The smallest rectangle [x0, x1) x [y0, y1) of full-resolution source
 * pixels (the source is src_w x src_h) that fl_render reads for this plan:
 * the union of the filter taps (the plan's filter, as fl_render picks it:
 * bicubic reads twice as far as bilinear) of the resized rows/columns that
 * land in the output window, clipped to the crop box (for RandomResizedCrop:
 * the box; for Resize + CenterCrop: the taps of the centre window).  A view holding
 * exactly that rectangle (w = x1 - x0, h = y1 - y0, origin_x = x0,
 * origin_y = y0, scale 1), or any larger full-scale rectangle, renders
 * bit-identically to the whole image.  Always within the image and
 * non-empty for a valid plan whose box lies inside the image (every plan
 * fl_plan_sample makes); a window that misses the image (all padding)
 * gives a 1 x 1 rectangle at the box origin; an invalid plan or size gives
 * the whole image (fl_render then reports the error).  No GIL; pure. */
void fl_plan_source_window(const fl_tspec *t, const fl_plan *plan, int src_w, int src_h, int *x0, int *y0, int *x1,
                           int *y1);

#endif
