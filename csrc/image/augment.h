/* augment.h: the augmentation policies' image ops, one function per op.
 *
 * The ops of torchvision's AutoAugment / RandAugment / TrivialAugmentWide
 * (torchvision.transforms.autoaugment._apply_op) and of timm's RandAugment
 * (timm.data.auto_augment's op functions), run on the uint8 image a
 * worker has already cropped, resized and flipped, before the dtype
 * conversion.  Reference semantics: Pillow (what torchvision's transforms do
 * to the PIL images of the reference recipes): Image.transform(AFFINE) and
 * Image.rotate with NEAREST, BILINEAR or BICUBIC resampling, Image.blend for
 * the ImageEnhance factors, ImageFilter.SMOOTH for Sharpness, the ImageOps
 * LUTs.  Each op's fidelity against Pillow is stated in docs/recipes.md and
 * tested in tests/test_augment_ops.py and tests/test_timm_augment.py.
 *
 * Images are h rows of w pixels of `channels` (1 or 3) interleaved uint8
 * channels, rows packed (stride w * channels).  Nothing here touches Python;
 * every function runs without the GIL, re-entrant on distinct buffers.
 */
#ifndef FL_AUGMENT_H
#define FL_AUGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* The ops, with what `magnitude` means for each (torchvision's _apply_op). */
enum {
    FL_AUG_IDENTITY = 0,
    FL_AUG_SHEAR_X = 1,       /* affine shear of degrees(atan(magnitude)) along x, centre (0, 0) */
    FL_AUG_SHEAR_Y = 2,       /* the same along y */
    FL_AUG_TRANSLATE_X = 3,   /* translate by int(magnitude) pixels (truncated toward zero) */
    FL_AUG_TRANSLATE_Y = 4,
    FL_AUG_ROTATE = 5,        /* rotate by magnitude degrees counter-clockwise about the centre, no expand */
    FL_AUG_BRIGHTNESS = 6,    /* ImageEnhance.Brightness(1 + magnitude) */
    FL_AUG_COLOR = 7,         /* ImageEnhance.Color(1 + magnitude) */
    FL_AUG_CONTRAST = 8,      /* ImageEnhance.Contrast(1 + magnitude) */
    FL_AUG_SHARPNESS = 9,     /* ImageEnhance.Sharpness(1 + magnitude) */
    FL_AUG_POSTERIZE = 10,    /* ImageOps.posterize(int(magnitude) bits), bits in 0..8 */
    FL_AUG_SOLARIZE = 11,     /* ImageOps.solarize(threshold = magnitude): v < threshold ? v : 255 - v */
    FL_AUG_AUTOCONTRAST = 12, /* ImageOps.autocontrast(cutoff 0), per channel */
    FL_AUG_EQUALIZE = 13,     /* ImageOps.equalize, per channel */
    FL_AUG_INVERT = 14,       /* ImageOps.invert */
    /* timm's ops (timm.data.auto_augment), whose arguments are Pillow's own: */
    FL_AUG_SOLARIZE_ADD = 15, /* solarize_add(add = int(magnitude), thresh 128): v < 128 ? min(255, v + add) : v */
    FL_AUG_AFFINE_SHEAR_X = 16,     /* Image.transform(AFFINE, (1, magnitude, 0, 0, 1, 0)) */
    FL_AUG_AFFINE_SHEAR_Y = 17,     /* Image.transform(AFFINE, (1, 0, 0, magnitude, 1, 0)) */
    FL_AUG_AFFINE_TRANSLATE_X = 18, /* Image.transform(AFFINE, (1, 0, magnitude, 0, 1, 0)): magnitude pixels */
    FL_AUG_AFFINE_TRANSLATE_Y = 19, /* Image.transform(AFFINE, (1, 0, 0, 0, 1, magnitude)) */
    FL_AUG_BRIGHTNESS_FACTOR = 20,  /* ImageEnhance.Brightness(magnitude): the factor itself, not 1 + it */
    FL_AUG_COLOR_FACTOR = 21,
    FL_AUG_CONTRAST_FACTOR = 22,
    FL_AUG_SHARPNESS_FACTOR = 23,
    /* torchvision's tensor kernels (what AugMix applies: it turns the PIL
     * image into a uint8 tensor first), v1 = torchvision.transforms.
     * _functional_tensor, v2 = torchvision.transforms.v2.functional; the
     * magnitude means what _apply_op's does.  augment_tensor.c. */
    FL_AUG_T_SHEAR_X = 24,      /* v1 F.affine(shear=[degrees(atan(magnitude)), 0], center=[0, 0]) on the tensor */
    FL_AUG_T_SHEAR_Y = 25,
    FL_AUG_T_TRANSLATE_X = 26,  /* v1 F.affine(translate=[int(magnitude), 0]) */
    FL_AUG_T_TRANSLATE_Y = 27,
    FL_AUG_T_ROTATE = 28,       /* v1 F.rotate(magnitude degrees): always the sampling grid */
    FL_AUG_T_SHEAR_X_V2 = 29,   /* the same five in v2 (its matrix's operation order differs) */
    FL_AUG_T_SHEAR_Y_V2 = 30,
    FL_AUG_T_TRANSLATE_X_V2 = 31,
    FL_AUG_T_TRANSLATE_Y_V2 = 32,
    FL_AUG_T_ROTATE_V2 = 33,    /* v2 rotate_image: angle % 360, then 0 copies, 180 (and 90 / 270 on a
                                   square image) rotate exactly, anything else the sampling grid */
    FL_AUG_T_BRIGHTNESS = 34,   /* adjust_brightness(1 + magnitude), v1 and v2 alike */
    FL_AUG_T_COLOR = 35,        /* v1 adjust_saturation(1 + magnitude) */
    FL_AUG_T_COLOR_V2 = 36,
    FL_AUG_T_CONTRAST = 37,     /* v1 adjust_contrast(1 + magnitude) */
    FL_AUG_T_CONTRAST_V2 = 38,
    FL_AUG_T_SHARPNESS = 39,    /* v1 adjust_sharpness(1 + magnitude) */
    FL_AUG_T_SHARPNESS_V2 = 40,
    FL_AUG_T_AUTOCONTRAST = 41, /* v1 autocontrast */
    FL_AUG_T_AUTOCONTRAST_V2 = 42,
    /* (the tensor Posterize, Solarize, Equalize and Invert give Pillow's
     * bytes: FL_AUG_POSTERIZE etc. serve both) */
    FL_AUG_HUE = 43,            /* torchvision's adjust_hue(pil, magnitude), magnitude in [-0.5, 0.5]: Pillow's
                                   convert("HSV"), H += int(magnitude * 255) mod 256, convert("RGB"); an L image
                                   is returned as it is */
    FL_AUG_TV_AFFINE = 44,      /* torchvision's F.affine(pil, angle, translate, scale, shear, center)
                                   (RandomAffine), v1's inverse matrix: through fl_aug_affine, whose
                                   parameters one magnitude cannot hold; fl_aug_apply refuses it */
    FL_AUG_TV_AFFINE_V2 = 45,   /* the same with v2's matrix (its operation order) */
    FL_AUG_GAUSSIAN_BLUR = 46,  /* image.filter(ImageFilter.GaussianBlur(magnitude)): Pillow's three extended box
                                   blurs each way (timm's GaussianBlur / GaussianBlurRand ops; 0: unchanged) */
    FL_AUG_NOPS = 47
};

/* Resampling of the geometric ops: Pillow's NEAREST, BILINEAR and BICUBIC
 * transform filters (Geometry.c; its bicubic is the a = -1 cubic, with no
 * antialiasing).  FL_AUG_RANDOM is a policy setting only (imgops.h): one of
 * bilinear and bicubic with probability 1/2 per geometric op, as timm's
 * random.choice((BILINEAR, BICUBIC)); fl_aug_apply never takes it. */
enum { FL_AUG_NEAREST = 0, FL_AUG_BILINEAR = 1, FL_AUG_BICUBIC = 2, FL_AUG_RANDOM = 3 };

/* Bytes of scratch fl_aug_apply needs for a w x h image of `channels`
 * channels: the image's w * h * channels bytes rounded up to 8, then w ints
 * (a column table; it is also the slack the geometric ops' 4-byte loads may
 * read past the image copy).  0 when w, h or channels is not positive or the
 * size overflows.  Pure; any thread. */
size_t fl_aug_tmp_bytes(int w, int h, int channels);

/* Apply op (FL_AUG_*) with `magnitude` to img in place: the bytes
 * torchvision's _apply_op(pil_image, op_name, magnitude, interpolation, fill)
 * gives with Pillow 13 on an "L" (channels 1) or "RGB" (channels 3) image.
 * interp: FL_AUG_NEAREST, FL_AUG_BILINEAR or FL_AUG_BICUBIC (checked for
 * every op, used by the geometric ones).  fill: `channels` bytes written where a geometric op
 * uncovers pixels (NULL: zeros, torchvision's fill=None); Pillow's fillcolor
 * after _parse_fill, i.e. the caller has already truncated and clipped the
 * user's values to 0..255.  img: h packed rows of w * channels bytes, owned
 * by the caller, not aliasing tmp.  tmp: caller-owned, 8-byte aligned scratch of
 * fl_aug_tmp_bytes(w, h, channels) bytes; its contents on return are
 * unspecified.  Nothing is allocated.
 * Magnitudes: any finite value; Hue within [-0.5, 0.5] (torchvision's
 * check); GaussianBlur's radius within 1e5 (its sign does not matter, as
 * in Pillow); Posterize needs int(magnitude) in 0..8 (0
 * gives zeros, as torchvision's tensor op; Pillow's ImageOps.posterize
 * refuses 0, so _apply_op on a PIL image raises there), SolarizeAdd
 * int(magnitude) in 0..255, the enhance ops a factor (1 + magnitude, or
 * magnitude for the *_FACTOR ops) within float range.
 * No GIL; re-entrant on distinct buffers.  Returns 0, or -1 with err filled
 * (FL_ERR_INVALID: unknown op or interp, w or h outside 1..FL_MAX_DIM (imgops.h),
 * channels not 1 or 3, img or tmp NULL, a magnitude that is NaN, infinite
 * or out of the op's range).  On error img is unchanged. */
int fl_aug_apply(int op, double magnitude, int interp, const uint8_t *fill, uint8_t *img, int w, int h,
                 int channels, uint8_t *tmp, fl_err *err);

/* torchvision's affine(pil_image, angle, [tx, ty], scale, [shx, shy],
 * interpolation, fill, center=[cx, cy]) in place: Image.transform(AFFINE)
 * of _get_inverse_affine_matrix (v1's operation order, or v2's when v2 is
 * set), with Pillow's NEAREST, BILINEAR or BICUBIC transform filter and
 * fill, as fl_aug_apply's geometric ops.  prm: angle (degrees), tx, ty
 * (pixels), scale (> 0), shx, shy (degrees), cx, cy (RandomAffine's
 * default centre is (w * 0.5, h * 0.5)).  img, tmp, fill, interp and the
 * error contract as fl_aug_apply (FL_ERR_INVALID also for a parameter that
 * is not finite or a scale that is not positive).  No GIL; re-entrant on
 * distinct buffers. */
int fl_aug_affine(const double prm[8], int v2, int interp, const uint8_t *fill, uint8_t *img, int w, int h,
                  int channels, uint8_t *tmp, fl_err *err);

/* AugMix's mix (torchvision's AugMix.forward), in float32 as torch computes
 * it: with first set, acc[i] = w * img[i]; otherwise acc[i] += w * img[i]
 * (the product rounded to float, then the sum).  n elements; acc and img
 * caller-owned.  No GIL; re-entrant. */
void fl_augmix_accumulate(float *acc, const uint8_t *img, size_t n, float w, int first);

/* The mix back to bytes: img[i] = acc[i] truncated toward zero (torch's
 * .to(uint8)), clipped to 0..255 (the weights sum to 1, so the sum of bytes
 * stays within them but for rounding).  No GIL; re-entrant. */
void fl_augmix_store(const float *acc, uint8_t *img, size_t n);

/* Image.blend(image, other, alpha) in place: img[i] = ImagingBlend's
 * (uint8)(img[i] + alpha * (other[i] - img[i])) in float, clipped to
 * 0..255 (outside [0, 1] alpha extrapolates, as Pillow's).  n bytes; img
 * and other caller-owned, not aliasing.  No GIL; re-entrant. */
void fl_aug_blend(uint8_t *img, const uint8_t *other, size_t n, float alpha);

/* ------------------------------------------------------------------------ */
/* torchvision's GaussianBlur on a PIL image (augment_tensor.c)             */
/*
 * v1 (torchvision.transforms.GaussianBlur) and v2 alike turn the PIL image
 * into a uint8 tensor and run the tensor kernel: the 2-D kernel in float32,
 * reflect padding of k // 2 each side, a depthwise conv2d, round half to
 * even, .to(uint8).  The kernel weights are torch's float32 arithmetic on
 * the CPU, which depends on torch's CPU capability (the vector width of
 * its reductions) and, for v1, on the exp behind torch.exp: fl_gblur says
 * which.  docs/recipes.md ("Per-op fidelity") says what was proven. */

/* torch.exp on n contiguous float32 values as ATen computes it on a float
 * tensor (at::vml::vexp: MKL's vmsExp in torch's x86-64 builds), in[i] ->
 * out[i]; ctx is fl_gblur.vexp_ctx.  Supplied from above (the binding
 * hands over torch's own); must run without the GIL and be re-entrant. */
typedef void (*fl_vexp_fn)(void *ctx, const float *in, float *out, int n);

/* The largest kernel side: up to it a blurred value provably stays below
 * 255.5 (the weights' sum and the fused sum's rounding, 127^2 taps), so
 * the rounding to uint8 never meets torch's out-of-range conversion. */
#define FL_GBLUR_MAX_K 127

typedef struct {
    int kx, ky;          /* kernel width and height (torchvision's kernel_size[0], [1]): odd, 1..FL_GBLUR_MAX_K */
    int v2;              /* 0: v1's kernel (_functional_tensor: exp of -0.5 (x / sigma)^2 over linspace(-(k-1)/2,
                            (k-1)/2), divided by its sum, the 2-D kernel torch.mm's outer product); 1: v2's
                            (softmax of -(x / sigma)^2 over linspace(+-(k-1) / (2 sqrt 2)), outer product) */
    int lanes;           /* torch's float vector width on this CPU, which orders its sums: 8 (AVX2) or 16 (AVX512) */
    fl_vexp_fn vexp;     /* v1: torch.exp; NULL: SLEEF's expf_u10 (ATen's Vectorized<float>::exp, what torch.exp
                            is in a build without MKL).  v2 never uses it: its softmax calls Vectorized::exp */
    void *vexp_ctx;
} fl_gblur;

/* The 1-D kernel of side k (odd, 1..FL_GBLUR_MAX_K) for sigma (a float32
 * value, as GaussianBlur draws it; within [1e-6, 1e6]) into out[0..k), bit
 * for bit what torchvision's _get_gaussian_kernel1d(k, sigma, float32, cpu)
 * gives under torch 2.14 on a CPU of g->lanes lanes (g->kx, g->ky unused).
 * Pure but for g->vexp.  No GIL; re-entrant.  Returns 0, or -1 with err
 * filled (FL_ERR_INVALID: k, sigma, lanes out of range, out NULL). */
int fl_gblur_kernel1d(const fl_gblur *g, int k, float sigma, float *out, fl_err *err);

/* Bytes of scratch fl_gblur_apply needs for a w x h image of `channels`
 * channels and a kx x ky kernel: the image copy, the 2-D kernel, ky + 1
 * padded float rows and ky rows of the separable estimate.  0 when an argument is out of range (fl_gblur_apply's
 * checks) or the size overflows.  Pure; any thread. */
size_t fl_gblur_tmp_bytes(int w, int h, int channels, int kx, int ky);

/* Whether torch 2.14 sums this blur's conv2d with its GEMM path (im2col
 * and MKL's sgemm, ConvParams::use_mkldnn false) rather than oneDNN's
 * kernel, whose order fl_gblur_apply follows: one channel (groups 1), a
 * kernel side of 3 or less (not 1 x 1, a single tap: any order gives the
 * product), and at most 20480 pixels in the padded image.  Those blurs are
 * not reproduced (about 1 in 100 of them differs in a pixel): callers keep
 * them in Python.  Pure. */
int fl_gblur_torch_gemm(int w, int h, int channels, int kx, int ky);

/* GaussianBlur with g's kernel for sigma on img in place: the bytes
 * torchvision's F.gaussian_blur(pil, [kx, ky], [sigma, sigma]) (v1) or
 * v2.functional.gaussian_blur gives for an "L" (channels 1) or "RGB"
 * (channels 3) image, except where fl_gblur_torch_gemm says torch sums
 * otherwise: the conv2d as torch's oneDNN kernel sums it (each output a
 * chain of fused multiply-adds from 0 over the taps, kernel rows outer,
 * columns inner, of the reflect-padded image), rounded half to even.  With
 * AVX2 and FMA, a separable estimate decides every byte that a proven bound
 * on its distance from torch's sum leaves no doubt about, and only the
 * others are summed tap by tap (augment_tensor.c, fl_gb_margin).  Needs kx / 2 < w and ky / 2 < h (torch's reflect padding refuses
 * the rest).  img: h packed rows of w * channels bytes, caller-owned, not
 * aliasing tmp; tmp: caller-owned, 8-byte aligned, fl_gblur_tmp_bytes(w,
 * h, channels, kx, ky) bytes, contents unspecified on return.  Nothing is
 * allocated.  No GIL; re-entrant on distinct buffers.  Returns 0, or -1
 * with err filled (FL_ERR_INVALID: a size, channel count, kernel or sigma
 * out of range, img or tmp NULL); on error img is unchanged. */
int fl_gblur_apply(const fl_gblur *g, float sigma, uint8_t *img, int w, int h, int channels, uint8_t *tmp,
                   fl_err *err);

#endif
