"""Per-op cost of the augmentation ops (csrc/image/augment.c and
augment_tensor.c: fl_aug_apply) against Pillow and torchvision's v2 tensor
ops, one thread, one image.  The "AugMix" rows are the tensor kernels
AugMix runs (bit-exact with the v2 column's ops); "TV GaussianBlur k23" is
torchvision's GaussianBlur(23) (fl_gblur_apply: bit-exact with both
columns, whose PIL column is v1's F.gaussian_blur on the PIL image, its
tensor conversions included); the others are the Pillow ones (bit-exact
with the PIL column's).

Columns, each the best of --repeats timings of --n calls (the minimum: on a
shared machine other load only ever adds time), in microseconds per image
(224 x 224 RGB photograph by default); each op's four columns are measured
one after the other, so that they see the same load:

  * ``C``: a small C harness compiled here against csrc/image/augment.c with
    the extension's flags, calling fl_aug_apply on a reused scratch, as a
    worker would.  The op works in place, so every call starts from a fresh
    copy of the photo; the copy's own time (measured alone) is subtracted.
  * ``_C``: fastloader._C._augment_op (adds the Python call, a new array,
    the copy into it and a fresh scratch per call).
  * ``PIL``: torchvision.transforms.autoaugment._apply_op on a PIL image
    (Pillow: the reference the C ops are bit-exact with).
  * ``v2``: torchvision.transforms.v2.functional on a uint8 CHW tensor
    (torch.set_num_threads(1)), what v2's RandAugment runs per op.

Ratios are PIL / C and v2 / C (above 1: the C op is faster).

Usage:
  python benchmarks/bench_augment_ops.py [--n 200] [--repeats 7] [--size 224x224] [--photo astronaut]
                                         [--only NAME ...]
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

# name, FL_AUG_* code, magnitude, interpolation (0 nearest, 1 bilinear, 2 bicubic: timm's RandAugment and
# AutoAugment warp with bilinear or bicubic; a shear or translation keeps one axis, a rotation neither)
OPS = [
    ("Identity", 0, 0.0, 0),
    ("ShearX", 1, 0.3, 0),
    ("ShearX/bilinear", 1, 0.3, 1),
    ("ShearX/bicubic", 1, 0.3, 2),
    ("ShearY", 2, -0.3, 0),
    ("ShearY/bilinear", 2, -0.3, 1),
    ("ShearY/bicubic", 2, -0.3, 2),
    ("TranslateX", 3, 45.0, 0),
    ("TranslateX/bilinear", 3, 45.0, 1),
    ("TranslateX/bicubic", 3, 45.0, 2),
    ("TranslateY", 4, -45.0, 0),
    ("Rotate", 5, 30.0, 0),
    ("Rotate/bilinear", 5, 30.0, 1),
    ("Rotate/bicubic", 5, 30.0, 2),
    ("Brightness", 6, 0.5, 0),
    ("Color", 7, 0.5, 0),
    ("Contrast", 8, -0.5, 0),
    ("Sharpness", 9, 0.5, 0),
    ("Posterize", 10, 4.0, 0),
    ("Solarize", 11, 128.0, 0),
    ("AutoContrast", 12, 0.0, 0),
    ("Equalize", 13, 0.0, 0),
    ("Invert", 14, 0.0, 0),
    # AugMix's: torchvision's v2 tensor kernels (csrc/image/augment_tensor.c), whose reference is the v2 column
    ("AugMix ShearX", 29, 0.3, 0),
    ("AugMix ShearX/bilinear", 29, 0.3, 1),
    ("AugMix TranslateX/bilinear", 31, 45.0, 1),
    ("AugMix Rotate/bilinear", 33, 30.0, 1),
    ("AugMix Brightness", 34, 0.5, 0),
    ("AugMix Color", 36, 0.5, 0),
    ("AugMix Contrast", 38, -0.5, 0),
    ("AugMix Sharpness", 40, 0.5, 0),
    ("AugMix AutoContrast", 42, 0.0, 0),
    # ColorJitter's hue and timm's 3a blur: Pillow's references (torchvision's adjust_hue on PIL; ImageFilter.GaussianBlur)
    ("Hue", 43, 0.1, 0),
    ("GaussianBlur", 46, 1.5, 0),
    # torchvision's GaussianBlur (SimCLR's, timm's gaussian_blur_prob): the tensor kernel on the PIL image's
    # uint8 tensor (fl_gblur_apply, bit-exact with both columns' torchvision); code -1, the magnitude is
    # sigma, the last field the kernel side
    ("TV GaussianBlur k23", -1, 1.0, 23),
]

HARNESS = r"""
#include "image/augment.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

/* argv: image.raw w h n repeats, then (op magnitude interp) triples */
int main(int argc, char **argv)
{
    if (argc < 6) return 2;
    int W = atoi(argv[2]), H = atoi(argv[3]), N = atoi(argv[4]), R = atoi(argv[5]);
    size_t nb = (size_t)W * H * 3, tb = fl_aug_tmp_bytes(W, H, 3), gb = fl_gblur_tmp_bytes(W, H, 3, 23, 23);
    uint8_t *orig = malloc(nb), *img = malloc(nb), *tmp = malloc(tb > gb ? tb : gb);
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(orig, 1, nb, f) != nb) return 3;
    fclose(f);
    static const uint8_t fill[3] = {0, 0, 0};
    fl_err err;
    double *t = malloc(sizeof(double) * R);
    /* the copy alone, warmed as the ops are below (the first copies into the new buffer fault its pages in:
       timed cold, with few calls, the copy outweighed the cheapest ops and their difference came out negative) */
    for (int i = 0; i < 16; i++) { memcpy(img, orig, nb); __asm__ __volatile__("" ::: "memory"); }
    for (int r = 0; r < R; r++) {
        double t0 = now();
        for (int i = 0; i < N; i++) { memcpy(img, orig, nb); __asm__ __volatile__("" ::: "memory"); }
        t[r] = (now() - t0) / N;
    }
    qsort(t, R, sizeof *t, cmp);
    double copy = t[0];
    printf("copy %.3f\n", copy * 1e6);
    for (int a = 6; a + 2 < argc; a += 3) {
        int op = atoi(argv[a]), interp = atoi(argv[a + 2]);
        double mag = atof(argv[a + 1]);
        /* op -1: torchvision's GaussianBlur, kernel side `interp` (at most 23: tmp), sigma `mag`; v2's weights
           (v1's differ only by torch's exp over 23 values, which needs torch loaded) */
        const fl_gblur g = {interp, interp, 1, 8, NULL, NULL};
#define APPLY() (op == -1 ? fl_gblur_apply(&g, (float)mag, img, W, H, 3, tmp, &err) \
                          : fl_aug_apply(op, mag, interp, fill, img, W, H, 3, tmp, &err))
        for (int i = 0; i < 16; i++) {
            memcpy(img, orig, nb);
            if (APPLY() < 0) { fprintf(stderr, "%s\n", err.msg); return 1; }
        }
        for (int r = 0; r < R; r++) {
            double t0 = now();
            for (int i = 0; i < N; i++) {
                memcpy(img, orig, nb);
                APPLY();
            }
            t[r] = (now() - t0) / N;
        }
        qsort(t, R, sizeof *t, cmp);
        double v = t[0] - copy;
        printf("%d %d %.3f\n", op, interp, v * 1e6);   /* as measured: <= 0 says the timing failed */
    }
    return 0;
}
"""


def build_c(d: str, raw: bytes) -> tuple[str, str]:
    """Compile the harness in d and write the image there: (exe, image path)."""
    c = os.path.join(d, "harness.c")
    with open(c, "w") as f:
        f.write(HARNESS)
    img = os.path.join(d, "image.raw")
    with open(img, "wb") as f:
        f.write(raw)
    exe = os.path.join(d, "harness")
    csrc = os.path.join(REPO, "csrc")
    cmd = [os.environ.get("CC", "gcc"), "-O3", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
           "-std=c11", "-D_GNU_SOURCE", "-fwrapv", "-I", csrc, c, os.path.join(csrc, "image", "augment.c"),
           os.path.join(csrc, "image", "augment_tensor.c"), os.path.join(csrc, "image", "resample.c"),
           "-o", exe, "-lm"]
    subprocess.run(cmd, check=True)
    return exe, img


def run_c(exe: str, img: str, w: int, h: int, n: int, repeats: int, ops) -> dict:
    """{(code, interp): us, "copy": us} for ops [(code, magnitude, interp)]."""
    args = [exe, img, str(w), str(h), str(n), str(repeats)]
    for code, mag, interp in ops:
        args += [str(code), repr(mag), str(interp)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "copy":
            res["copy"] = float(parts[1])
        else:
            res[(int(parts[0]), int(parts[1]))] = float(parts[2])
    return res


def timed(fn, n: int, repeats: int) -> float:
    """The best over `repeats` of the mean time of n calls, in microseconds."""
    for _ in range(min(n, 10)):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n)
    return min(ts) * 1e6


def v2_op(F, InterpolationMode, t, name, mag, interp):
    """torchvision v2's per-op call (what v2.RandAugment's
    _apply_image_or_video_transform does for each op name)."""
    im = (InterpolationMode.NEAREST, InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)[interp] \
        if name != "k23" else None   # k23's interp field is the kernel side
    fill = None
    if name == "Identity":
        return t
    if name == "ShearX":
        return F.affine(t, angle=0.0, translate=[0, 0], scale=1.0, shear=[math.degrees(math.atan(mag)), 0.0],
                        interpolation=im, fill=fill, center=[0, 0])
    if name == "ShearY":
        return F.affine(t, angle=0.0, translate=[0, 0], scale=1.0, shear=[0.0, math.degrees(math.atan(mag))],
                        interpolation=im, fill=fill, center=[0, 0])
    if name == "TranslateX":
        return F.affine(t, angle=0.0, translate=[int(mag), 0], scale=1.0, shear=[0.0, 0.0], interpolation=im,
                        fill=fill)
    if name == "TranslateY":
        return F.affine(t, angle=0.0, translate=[0, int(mag)], scale=1.0, shear=[0.0, 0.0], interpolation=im,
                        fill=fill)
    if name == "Rotate":
        return F.rotate(t, angle=mag, interpolation=im, fill=fill)
    if name == "Brightness":
        return F.adjust_brightness(t, 1.0 + mag)
    if name == "Color":
        return F.adjust_saturation(t, 1.0 + mag)
    if name == "Contrast":
        return F.adjust_contrast(t, 1.0 + mag)
    if name == "Sharpness":
        return F.adjust_sharpness(t, 1.0 + mag)
    if name == "Posterize":
        return F.posterize(t, int(mag))
    if name == "Solarize":
        return F.solarize(t, mag)
    if name == "AutoContrast":
        return F.autocontrast(t)
    if name == "Equalize":
        return F.equalize(t)
    if name == "Invert":
        return F.invert(t)
    if name == "Hue":
        return F.adjust_hue(t, mag)
    if name == "GaussianBlur":   # v2's is another algorithm (a float convolution), not this op's reference
        return None
    if name == "k23":            # torchvision's GaussianBlur: v2's kernel on the uint8 tensor
        return F.gaussian_blur(t, [23, 23], [mag, mag])
    raise ValueError(name)


def pil_op(aa, pil, name, mag, interp):
    """The Pillow reference of an op: _apply_op for the policies' ops,
    torchvision's adjust_hue and Pillow's GaussianBlur filter for the others."""
    if name == "Hue":
        from torchvision.transforms import functional as TF

        return TF.adjust_hue(pil, mag)
    if name == "GaussianBlur":
        from PIL import ImageFilter

        return pil.filter(ImageFilter.GaussianBlur(mag))
    if name == "k23":   # torchvision's GaussianBlur, v1 on the PIL image (pil_to_tensor, the kernel, to_pil_image)
        from torchvision.transforms import functional as TF

        return TF.gaussian_blur(pil, [23, 23], [mag, mag])
    return aa._apply_op(pil, name, mag, interp, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="calls per timing")
    ap.add_argument("--repeats", type=int, default=7, help="timings per op (the best is reported)")
    ap.add_argument("--size", default="224x224", help="image WxH")
    ap.add_argument("--photo", default="astronaut", help="skimage.data photograph")
    ap.add_argument("--only", nargs="*", default=None, help="the rows whose name contains one of these")
    a = ap.parse_args()
    w, h = (int(x) for x in a.size.lower().split("x"))

    import numpy as np
    import torch
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import autoaugment as aa
    from torchvision.transforms.v2 import functional as F

    from imgutil import photo_image

    torch.set_num_threads(1)
    pil = photo_image(a.photo, (w, h))
    arr = np.array(pil)   # a writable, C-contiguous copy
    tens = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
    tmpdir = tempfile.TemporaryDirectory()
    exe, img = build_c(tmpdir.name, arr.tobytes())
    copy = run_c(exe, img, w, h, a.n, a.repeats, [])["copy"]
    try:
        from fastloader import _C
    except ImportError:
        _C = None

    print(f"augmentation ops, one thread, {w}x{h} RGB ({a.photo}), best of {a.repeats} x {a.n} calls, "
          f"us per image ({sysconfig.get_platform()}; C: the copy-in, {copy:.1f} us, subtracted)")
    print(f"| {'op':<26} | {'C':>7} | {'_C':>7} | {'PIL':>7} | {'v2':>7} | {'PIL/C':>6} | {'v2/C':>6} |")
    print(f"|{'-' * 28}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 8}|{'-' * 8}|")
    for name, code, mag, interp in OPS:
        if a.only is not None and not any(k in name for k in a.only):
            continue
        base = name.split("/")[0].split()[-1]
        pil_interp = ((InterpolationMode.NEAREST, InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)[interp]
                      if code >= 0 else InterpolationMode.NEAREST)
        c = run_c(exe, img, w, h, a.n, a.repeats, [(code, mag, interp)])[(code, interp)]
        if code == -1:   # torchvision's GaussianBlur: v1's weights (torch's exp) in _C
            py = timed(lambda: _C._gaussian_blur(arr, (interp, interp), mag, False), a.n, a.repeats) if _C else float("nan")
        else:
            py = timed(lambda: _C._augment_op(code, mag, arr, interp=interp), a.n, a.repeats) if _C else float("nan")
        p = timed(lambda: pil_op(aa, pil, base, mag, pil_interp), a.n, a.repeats)
        try:   # v2 refuses some (bicubic warps of tensors): nan
            v = (timed(lambda: v2_op(F, InterpolationMode, tens, base, mag, interp), a.n, a.repeats)
                 if base != "GaussianBlur" else float("nan"))
        except (ValueError, NotImplementedError):
            v = float("nan")
        r1 = p / c if c > 0 else float("inf")
        r2 = v / c if c > 0 else float("inf")
        print(f"| {name:<26} | {c:7.1f} | {py:7.1f} | {p:7.1f} | {v:7.1f} | {r1:6.1f} | {r2:6.1f} |")
    tmpdir.cleanup()


if __name__ == "__main__":
    main()
