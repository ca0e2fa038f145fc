/* py_transform.h: the transform-spec parser shared by the binding files.
 *
 * Include after binding.h (needs Python.h).  Used by py_transform.c and by
 * the engine binding, so both read spec dicts the same way.
 */
#ifndef FL_PY_TRANSFORM_H
#define FL_PY_TRANSFORM_H

#include "image/imgops.h"

/* Fill *out from a spec dict whose keys are fl_tspec's field names:
 *   geom "none" | "rrc" | "resize_crop"; out_h, out_w; scale_lo, scale_hi,
 *   ratio_lo, ratio_hi; resize_short; resize_h, resize_w; max_size;
 *   crop_h, crop_w; flip_p; vflip_p; gray_p; rotate, rot_lo, rot_hi, rot_interp, rot_fill (3 ints); interp 0 (bilinear) | 1 (bicubic) | 2 (random);
 *   out_channels 1 | 3;
 *   dtype "uint8" | "float16" | "bfloat16" | "float32";
 *   scale_to_unit 0 | 1 (x / 255, ToTensor) | 2 (x * (1/255), v2 ToDtype) (bools: True = 1);
 *   normalize (bool; defaults to True when mean or std is given);
 *   mean, std: sequences of out_channels floats (or one, broadcast);
 *   layout "CHW" | "HWC";
 *   policy, erase, jitter (dicts, see the parser);
 *   blur: dict(p, pos 0 | 1 (imgops.h FL_BLUR_*), sigma (lo, hi), kernel (kx, ky), v2 (bool), lanes 8 | 16,
 *         exp "mkl" | "sleef" (v1 only: torch.exp's, fl_py_blur_exp)).
 *   (and the rest of fl_tspec's fields by name)
 * Missing keys take defaults (geom none, RRC scale (0.08, 1), ratio (3/4, 4/3),
 * 3 channels, uint8, CHW, bilinear, no resize/crop/flip/normalize).  The result is
 * checked with fl_tspec_check (its error raised through the translator of
 * `module`, fastloader._C).  GIL held.  Returns 0, or -1 with ValueError
 * (naming the key; also for unknown keys) or TypeError set.  Borrows d. */
int fl_tspec_from_pydict(PyObject *module, PyObject *d, fl_tspec *out);

/* torch.exp for GaussianBlur v1 into g->vexp / g->vexp_ctx: "mkl" is
 * MKL's vmsExp as torch calls it, resolved in the already loaded
 * libtorch_cpu.so (never loads it; ValueError when torch is not imported or
 * has no vmsExp); "sleef" is NULL (fl_gblur's own SLEEF exp, torch.exp in a
 * build without MKL).  GIL held.  Returns 0, or -1 with ValueError. */
int fl_py_blur_exp(const char *name, fl_gblur *g);

/* A plan as the dict _plan_sample returns: box, resized, window, flip, out,
 * interp (0 bilinear, 1 bicubic), aug [(op, magnitude), ...], erase
 * ((x, y, w, h, key) or None), mix, affine and blur (GaussianBlur's sigma
 * or None).  New reference, or NULL with an exception.
 * GIL held. */
PyObject *fl_plan_to_dict(const fl_plan *p);

#endif
