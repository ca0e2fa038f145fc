/* augment_internal.h: what the two units of the augmentation ops share,
 * and nobody else includes: augment.c (Pillow's ops, and fl_aug_apply,
 * which checks the arguments and hands the tensor ops over) and
 * augment_tensor.c (torchvision's tensor kernels, augment.h FL_AUG_T_*).
 * Everything here is pure or works on caller-owned buffers, without the
 * GIL, re-entrant.
 */
#ifndef FL_AUGMENT_INTERNAL_H
#define FL_AUGMENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* Apply tensor op `op` (FL_AUG_T_SHEAR_X .. FL_AUG_T_AUTOCONTRAST_V2) with
 * `magnitude` to img in place: the bytes torchvision's _apply_op gives for
 * the uint8 tensor of img ([1, channels, h, w]) with fill None (uncovered
 * pixels are zeros).  interp: FL_AUG_NEAREST or FL_AUG_BILINEAR (the tensor
 * kernels have no other).  img, w, h, channels and tmp as fl_aug_apply's,
 * which has checked them and that magnitude is finite.  No GIL; re-entrant
 * on distinct buffers.  Returns 0, or -1 with err filled (FL_ERR_INVALID: a
 * bicubic interp, a factor 1 + magnitude that is negative (torchvision
 * raises) or beyond float range, a translation beyond int range).  On
 * error img is unchanged. */
int fl_aug_tensor_apply(int op, double magnitude, int interp, uint8_t *img, int w, int h, int channels,
                        uint8_t *tmp, fl_err *err);

/* augment.c: math.radians' and math.degrees' factors as CPython computes them. */
extern const double fl_aug_deg2rad, fl_aug_rad2deg;

/* augment.c: x % m for m > 0, as CPython's float_rem. */
double fl_aug_py_mod(double x, double m);

/* augment.c: torchvision.transforms.functional._get_inverse_affine_matrix
 * (v1) for center (cx, cy), angle and shears in degrees, the translation
 * and scale > 0, in CPython's double arithmetic and operation order, into m
 * (6 coefficients).  Pure. */
void fl_aug_tv_inverse_affine(double cx, double cy, double angle, double tx, double ty, double scale, double shx,
                              double shy, double m[6]);

/* augment.c: the same matrix as torchvision.transforms.v2.functional's
 * _get_inverse_affine_matrix computes it (its cached terms: another
 * operation order, so other last bits).  Pure. */
void fl_aug_tv2_inverse_affine(double cx, double cy, double angle, double tx, double ty, double scale, double shx,
                               double shy, double m[6]);

/* augment.c: p[i] = lut[p[i]] for n bytes. */
void fl_lut_apply1(uint8_t *p, size_t n, const uint8_t *lut);

/* augment.c: npix RGB pixels through three tables (lut: 3 x 256, channel-major). */
void fl_lut_apply3(uint8_t *p, size_t npix, const uint8_t *lut);

#endif
