"""Per-image cost of the native transform renderer (csrc/image/render.c: fl_render).

Two measurements, both single-threaded, on a realistic decode size (default a
470 x 386 RGB photo, ImageNet's typical size):

  * ``C``: a small C harness compiled here against the transform stage's
    units (csrc/image/plan.c, resample.c, render.c, convert.c, augment.c,
    augment_tensor.c; or the single imgops.c of older trees) with the
    extension's flags, calling
    fl_plan_sample + fl_render in a loop with one reused fl_scratch --
    exactly what a loader worker does per sample.  It also prints a
    checksum (FNV-1a over every output byte), so two versions of the stage
    can be compared bit for bit (``--src DIR``).
  * ``py``: fastloader._C._render in a loop (adds Python/numpy call overhead
    and a fresh scratch per call).

Pipelines:
  val:   Resize(256) + CenterCrop(224) + ToTensor + Normalize  (resize_crop)
  train: RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize
each with uint8 output (PILToTensor) and float32 CHW output.

Usage:
  python benchmarks/bench_render.py [--n 2000] [--size 470x386] [--src DIR] [--no-py]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

HARNESS = r"""
#include "imgops.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Trees with core/err.h report through one fl_err; older ones through a
 * message buffer and its length. */
#ifdef FL_ERR_MSG_MAX
static fl_err E;
#define ERR_ARGS &E
#define ERR_TEXT E.msg
#else
static char E[256];
#define ERR_ARGS E, sizeof E
#define ERR_TEXT E
#endif

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static uint8_t *make_image(int w, int h, int ch)
{
    /* a smooth "photo" with texture and noise: content does not change the
     * arithmetic cost, but keeps values spread over 0..255 */
    uint8_t *p = malloc((size_t)w * h * ch);
    uint32_t s = 12345;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) {
                s = s * 1664525u + 1013904223u;
                int v = (x * 255 / w + y * 255 / h * (c + 1)) / 2 + ((x ^ y) & 31) + (int)(s >> 28) - 8;
                p[((size_t)y * w + x) * ch + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    return p;
}

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}

int main(int argc, char **argv)
{
    if (argc < 4) return 2;
    int W = atoi(argv[1]), H = atoi(argv[2]), N = atoi(argv[3]);
    float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
    uint8_t *img = make_image(W, H, 3);
    fl_view v = {img, W, H, (size_t)W * 3, 3, 0.0, 0.0, 1.0, 1.0};
    const char *names[4] = {"val_u8", "val_f32", "train_u8", "train_f32"};
    for (int cfg = 0; cfg < 4; cfg++) {
        fl_tspec t;
        memset(&t, 0, sizeof t);
        t.out_h = t.out_w = 224;
        t.out_channels = 3;
        t.layout = FL_LAYOUT_CHW;
        if (cfg < 2) {
            t.geom = FL_GEOM_RESIZE_CROP;
            t.resize_short = 256;
            t.crop_h = t.crop_w = 224;
        } else {
            t.geom = FL_GEOM_RRC;
            t.scale_lo = 0.08; t.scale_hi = 1.0; t.ratio_lo = 3.0 / 4; t.ratio_hi = 4.0 / 3;
            t.flip_p = 0.5;
        }
        if (cfg & 1) {
            t.dtype = FL_DT_F32;
            t.scale_to_unit = FL_SCALE_DIV;
            t.normalize = 1;
            memcpy(t.mean, mean, sizeof mean);
            memcpy(t.std, stdv, sizeof stdv);
        } else {
            t.dtype = FL_DT_U8;
        }
        if (fl_tspec_check(&t, ERR_ARGS) < 0) { fprintf(stderr, "%s\n", ERR_TEXT); return 1; }
        size_t nb = fl_tspec_sample_bytes(&t);
        void *out = aligned_alloc(64, (nb + 63) / 64 * 64);
        fl_scratch sc = {NULL, 0};
        fl_plan *plans = malloc(sizeof(fl_plan) * (size_t)N);
        for (int i = 0; i < N; i++)
            if (fl_plan_sample(&t, W, H, 1, 0, (uint64_t)i, &plans[i], ERR_ARGS) < 0) { fprintf(stderr, "%s\n", ERR_TEXT); return 1; }
        uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < N && i < 64; i++) {       /* warm up + checksum */
            if (fl_render(&t, &plans[i], &v, out, &sc, ERR_ARGS) < 0) { fprintf(stderr, "%s\n", ERR_TEXT); return 1; }
            h = fnv(h, out, nb);
        }
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now();
            for (int i = 0; i < N; i++)
                fl_render(&t, &plans[i], &v, out, &sc, ERR_ARGS);
            double dt = (now() - t0) / N;
            if (dt < best) best = dt;
        }
        printf("%-10s %8.1f us/image  checksum %016llx\n", names[cfg], best * 1e6, (unsigned long long)h);
        fl_scratch_free(&sc);
        free(plans);
        free(out);
    }
    free(img);
    return 0;
}
"""


# The transform stage's C units (imgops.c: trees before the split by stage).
STAGE_UNITS = ["imgops.c", "plan.c", "resample.c", "render.c", "convert.c", "augment.c", "augment_tensor.c"]


def run_c(src_dir: str, w: int, h: int, n: int) -> str:
    with tempfile.TemporaryDirectory() as d:
        c = os.path.join(d, "harness.c")
        with open(c, "w") as f:
            f.write(HARNESS)
        exe = os.path.join(d, "harness")
        cc = os.environ.get("CC", "gcc")
        # csrc/image/ in trees laid out by layer, csrc/ itself in older ones
        stage = os.path.join(src_dir, "image") if os.path.isdir(os.path.join(src_dir, "image")) else src_dir
        units = [os.path.join(stage, u) for u in STAGE_UNITS if os.path.exists(os.path.join(stage, u))]
        cmd = [cc, "-O3", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-std=c11", "-D_GNU_SOURCE",
               "-I", src_dir, "-I", stage, c, *units, "-o", exe, "-lmvec", "-lm"]
        subprocess.run(cmd, check=True)
        return subprocess.run([exe, str(w), str(h), str(n)], check=True, capture_output=True, text=True).stdout


def run_py(w: int, h: int, n: int) -> None:
    import numpy as np
    from fastloader import _C

    rng = np.random.default_rng(0)
    img = np.clip(np.add.outer(np.arange(h), np.arange(w))[:, :, None] * 0.3
                  + rng.integers(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    specs = {
        "val_u8": dict(geom="resize_crop", resize_short=256, crop_h=224, crop_w=224, out_h=224, out_w=224),
        "train_u8": dict(geom="rrc", out_h=224, out_w=224, flip_p=0.5),
    }
    specs["val_f32"] = dict(specs["val_u8"], dtype="float32", normalize=True, mean=mean, std=std)
    specs["train_f32"] = dict(specs["train_u8"], dtype="float32", normalize=True, mean=mean, std=std)
    for name in ["val_u8", "val_f32", "train_u8", "train_f32"]:
        spec = specs[name]
        plans = [_C._plan_sample(spec, w, h, 1, 0, i) for i in range(n)]
        for p in plans[:32]:
            _C._render(spec, img, p)
        best = 1e30
        for _ in range(3):
            t0 = time.perf_counter()
            for p in plans:
                _C._render(spec, img, p)
            best = min(best, (time.perf_counter() - t0) / n)
        print(f"{name:<10} {best * 1e6:8.1f} us/image  (_C._render, incl. Python overhead)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="plans per configuration")
    ap.add_argument("--size", default="470x386", help="source WxH")
    ap.add_argument("--src", default=os.path.join(REPO, "csrc"), help="csrc/ of a checkout (its image/ layer, or the stage's units directly in older trees)")
    ap.add_argument("--no-py", action="store_true", help="skip the _C._render measurement")
    a = ap.parse_args()
    w, h = (int(x) for x in a.size.lower().split("x"))
    print(f"fl_render, one thread, {w}x{h} RGB source, {a.n} plans ({sysconfig.get_platform()})")
    print("-- C harness (reused scratch):")
    sys.stdout.write(run_c(a.src, w, h, a.n))
    if not a.no_py:
        print("-- python:")
        sys.stdout.flush()
        run_py(w, h, a.n)


if __name__ == "__main__":
    main()
