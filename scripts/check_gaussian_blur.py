"""The long check behind the native GaussianBlur's "bit for bit" (docs/recipes.md).

    python scripts/check_gaussian_blur.py [--sigmas N] [--ops N]

Compares, on this machine's torch, bit for bit:
  * the 1-D kernel weights of fastloader._C._gaussian_kernel with
    torchvision's own _get_gaussian_kernel1d (v1: transforms._functional_tensor,
    v2: transforms.v2.functional._misc), for every odd side 1..31 with N
    float32 sigmas each (half uniform in [0.1, 2], GaussianBlur's default
    range, the rest log-uniform over [1e-6, 1e6], the range the native op
    takes), and every odd side 33..127 with N / 20;
  * the 2-D kernels of _get_gaussian_kernel2d (torch.mm / the broadcast
    product) with the outer product of the native 1-D ones, square and not;
  * the whole op, fastloader._C._gaussian_blur against torchvision's
    F.gaussian_blur / v2.functional.gaussian_blur on PIL photographs
    (scikit-image's) for --ops random configurations: sizes from 1 x 1 to
    300 x 224, RGB and L, kernels up to 31 (non-square too), sigmas
    log-uniform in [0.01, 20]; the one-channel blurs torch sums with its
    GEMM convolution (augment.h fl_gblur_torch_gemm, kept in Python) are
    counted apart.
Prints the counts; exits 1 on any difference.  Takes minutes (torch's
per-call overhead), so it is not part of the test suite; tests/
test_gaussian_blur.py runs a sample of each part.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from fastloader import _C  # noqa: E402
from fastloader.transforms import _blur_check  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sigmas", type=int, default=100_000)
    ap.add_argument("--ops", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import torchvision.transforms.functional as TF
    import torchvision.transforms.v2.functional as TF2
    from torchvision.transforms import _functional_tensor as F_t
    from torchvision.transforms.v2.functional import _misc as F_misc

    lanes = {}   # by version: the sums' widths differ on AVX512 (transforms._blur_check)
    for v2_ in (False, True):
        verdict = _blur_check(3, 3, 0.1, 2.0, v2_, 16, 16, 3)
        if isinstance(verdict, str):
            print(verdict)
            return 1
        lanes[v2_], exp_ = verdict
        if not v2_:
            exp = exp_   # v1's exp (v2's is always SLEEF's)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}: lanes v1 "
          f"{lanes[False]}, v2 {lanes[True]}, v1 exp {exp}")
    rng = np.random.default_rng(2024)
    bad = 0

    def sigmas(n: int) -> np.ndarray:
        half = n // 2
        s = np.concatenate([rng.uniform(0.1, 2.0, half), np.exp(rng.uniform(np.log(1e-6), np.log(1e6), n - half))])
        return np.clip(s.astype(np.float32), np.float32(1e-6), np.float32(1e6))

    t0 = time.time()
    for v2, ref in ((False, F_t._get_gaussian_kernel1d), (True, F_misc._get_gaussian_kernel1d)):
        n = 0
        for k in range(1, 128, 2):
            for s in map(float, sigmas(args.sigmas if k <= 31 else max(1, args.sigmas // 20))):
                want = ref(k, s, dtype=torch.float32, device=torch.device("cpu")).numpy()
                got = _C._gaussian_kernel(k, s, v2, lanes=lanes[v2], exp=exp)
                n += 1
                if not np.array_equal(want.view(np.int32), got.view(np.int32)):
                    bad += 1
                    if bad <= 10:
                        print("  1-D differs:", "v2" if v2 else "v1", k, repr(s))
        print(f"1-D kernels {'v2' if v2 else 'v1'}: {n} (side, sigma) pairs compared, {time.time() - t0:.0f} s")

    n = 0
    for v2, ref in ((False, F_t._get_gaussian_kernel2d), (True, F_misc._get_gaussian_kernel2d)):
        for kx in range(1, 32, 2):
            for ky in (kx, int(rng.choice(np.arange(1, 32, 2)))):
                for s in map(float, sigmas(max(2, args.sigmas // 1000))):
                    want = ref([kx, ky], [s, s], dtype=torch.float32, device=torch.device("cpu")).numpy()
                    gx = _C._gaussian_kernel(kx, s, v2, lanes=lanes[v2], exp=exp)
                    gy = _C._gaussian_kernel(ky, s, v2, lanes=lanes[v2], exp=exp)
                    got = np.outer(gy, gx).astype(np.float32)   # one rounded float32 product each
                    n += 1
                    if not np.array_equal(want.view(np.int32), got.view(np.int32)):
                        bad += 1
                        if bad <= 10:
                            print("  2-D differs:", "v2" if v2 else "v1", kx, ky, repr(s))
    print(f"2-D kernels: {n} compared, {time.time() - t0:.0f} s")

    from imgutil import PHOTOS, photo_image
    sizes = [(224, 224), (300, 224), (97, 61), (31, 200), (64, 64), (40, 7), (12, 12), (5, 4), (3, 3), (2, 5),
             (1, 1), (16, 1)]
    n = gemm_n = gemm_bad = 0
    for i in range(args.ops):
        w, h = sizes[i % len(sizes)]
        mode = "L" if i % 4 == 3 else "RGB"
        pil = photo_image(PHOTOS[i % len(PHOTOS)], (w, h)).convert(mode)
        kx = int(rng.choice(np.arange(1, 32, 2)))
        ky = kx if i % 3 else int(rng.choice(np.arange(1, 32, 2)))
        kx, ky = min(kx, 2 * w - 1), min(ky, 2 * h - 1)   # torch's reflect padding needs k // 2 < side
        s = float(np.float32(np.exp(rng.uniform(np.log(0.01), np.log(20.0)))))
        v2 = bool(i % 2)
        want = np.asarray((TF2 if v2 else TF).gaussian_blur(pil, [kx, ky], [s, s]))
        got = _C._gaussian_blur(np.asarray(pil), (kx, ky), s, v2, lanes=lanes[v2], exp=exp)
        if mode == "L" and (kx, ky) != (1, 1) and (kx <= 3 or ky <= 3) and (w + kx // 2 * 2) * (h + ky // 2 * 2) <= 20480:
            # torch's GEMM convolution (augment.h fl_gblur_torch_gemm): not native, counted apart
            gemm_n += 1
            gemm_bad += not np.array_equal(want, got)
            continue
        n += 1
        if not np.array_equal(want, got):
            bad += 1
            print("  op differs:", "v2" if v2 else "v1", mode, w, h, kx, ky, repr(s), int((want != got).sum()))
    print(f"whole op: {n} blurs compared on photographs, {time.time() - t0:.0f} s; and {gemm_n} one-channel "
          f"blurs torch sums by GEMM (kept in Python), {gemm_bad} of them differing from the native order")
    print("differences:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
