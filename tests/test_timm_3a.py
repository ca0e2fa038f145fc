"""timm's "3a" augmentation (DeiT III's three augmentations:
``auto_augment="3a"``, an AutoAugment of Solarize / Desaturate /
GaussianBlurRand, and RandAugment's ``t3a`` op set), natively.

- GaussianBlur: augment.c's Pillow ImageFilter.GaussianBlur (three extended
  box blurs each way, 8.24 fixed point) against Pillow over radii from 0.05
  to 40 (box radius 0, the fractional boxes, boxes longer than the image),
  sizes down to 1 x 1, RGB and L.
- The level functions (Desaturate's factor, GaussianBlur's radius,
  GaussianBlurRand's uniform radius) against timm's own.
- create_transform(auto_augment="3a"), ColorJitter after it as timm puts
  it: every sample replayed through timm's op functions and torchvision's
  adjust_* on the PIL image equals the native render; the sub-policy and
  radius distributions.
"""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from PIL import Image, ImageFilter

from imgutil import PHOTOS, crop_resize_flip, photo_image

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
timm_aa = pytest.importorskip("timm.data.auto_augment")
timm_data = pytest.importorskip("timm.data")

from torchvision.transforms import functional as TF  # noqa: E402

from fastloader import _C  # noqa: E402
from fastloader.transforms import compile_transform  # noqa: E402

BLUR, COLOR, SOLARIZE = 46, 21, 11   # augment.h FL_AUG_GAUSSIAN_BLUR, FL_AUG_COLOR_FACTOR, FL_AUG_SOLARIZE
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_gaussian_blur_equals_pillow():
    rng = np.random.default_rng(1)
    radii = [0.05, 0.1, 0.5, 1.0, 1.4, 1.5, 2.0, 3.3, 7.0, 40.0, -1.2] + list(rng.uniform(0.0, 3.0, 12))
    n = 0
    for k, (w, h) in enumerate([(224, 224), (97, 61), (31, 200), (5, 4), (2, 3), (1, 7), (7, 1), (1, 1)]):
        for mode in ("RGB", "L"):
            im = photo_image(PHOTOS[k % len(PHOTOS)], (w, h)).convert(mode)
            a = np.ascontiguousarray(np.asarray(im))
            for r in radii[k % 3::2] if w * h > 1000 else radii:
                want = np.asarray(im.filter(ImageFilter.GaussianBlur(float(r))))
                got = _C._augment_op(BLUR, float(r), a.copy())
                assert np.array_equal(got, want), (w, h, mode, r, int(np.abs(got.astype(int) - want).max()))
                n += 1
    assert n > 150
    a = np.asarray(photo_image("coffee", (20, 10))).copy()
    assert np.array_equal(_C._augment_op(BLUR, 0.0, a), a)   # GaussianBlur(0) is a copy
    with pytest.raises(ValueError, match="GaussianBlur"):
        _C._augment_op(BLUR, 1e6, a)


def _one_op_policy(name, m):
    ops = timm_aa.rand_augment_ops(m, prob=1.0, hparams=dict(timm_aa._HPARAMS_DEFAULT), transforms=[name])
    tf = timm_data.create_transform(32, is_training=True, auto_augment="rand-m9", color_jitter=None)
    ra = next(t for t in tf.transforms if type(t).__name__ == "RandAugment")
    ra.ops, ra.num_layers, ra.choice_weights = ops, 1, None
    spec, rest, desc = compile_transform(tf)
    assert rest is None and spec["policy"]["kind"] == "timm_ra", desc
    return spec


@pytest.mark.parametrize("m", [0.0, 2.5, 5.0, 7.3, 9.0, 10.0, 12.0])
def test_level_functions_equal_timm(m):
    """Desaturate: Color(min(1, max(0, 1 - level))); GaussianBlur: the
    level itself as the radius; GaussianBlurRand: U(0.1, 2 * level)."""
    spec = _one_op_policy("Desaturate", m)
    arg = _C._plan_sample(spec, 100, 80, 0, 0, 0)["aug"][0]
    level = timm_aa.LEVEL_TO_ARG["Desaturate"](min(m, 10.0), {})[0]
    assert arg == (COLOR, min(1.0, max(0.0, 1.0 - level)))
    spec = _one_op_policy("GaussianBlur", m)
    assert _C._plan_sample(spec, 100, 80, 0, 0, 0)["aug"][0] == (
        BLUR, timm_aa.LEVEL_TO_ARG["GaussianBlur"](min(m, 10.0), {})[0])
    spec = _one_op_policy("GaussianBlurRand", m)
    factor = timm_aa.LEVEL_TO_ARG["GaussianBlurRand"](min(m, 10.0), {})[0]
    radii = np.array([_C._plan_sample(spec, 100, 80, 0, 0, i)["aug"][0][1] for i in range(400)])
    lo, hi = sorted((0.1, 2.0 * factor))
    assert radii.min() >= lo and radii.max() <= hi
    if hi - lo > 0.1:
        assert abs(radii.mean() - (lo + hi) / 2) < 4 * (hi - lo) / math.sqrt(12 * 400)


def _replay(im, spec, plan, fill):
    out = crop_resize_flip(im, plan, spec["out_h"], spec["out_w"])
    for op, arg in plan["aug"]:
        if op == SOLARIZE:
            out = timm_aa.solarize(out, int(arg))
        elif op == BLUR:
            out = timm_aa.gaussian_blur(out, arg)   # what gaussian_blur_rand ends with, for its drawn radius
        elif op == COLOR:
            out = TF.adjust_saturation(out, arg)   # desaturate's and ColorJitter's ImageEnhance.Color
        elif op == 20:
            out = TF.adjust_brightness(out, arg)
        elif op == 22:
            out = TF.adjust_contrast(out, arg)
        else:
            raise AssertionError(f"unexpected op {op}")
    return TF.normalize(TF.to_tensor(out), MEAN, STD)


def test_create_transform_3a_pixels_and_draws():
    tf = timm_data.create_transform(64, is_training=True, auto_augment="3a")
    spec, rest, desc = compile_transform(tf)
    assert rest is None and spec["policy"]["kind"] == "timm_aa" and spec["jitter"]["pos"] == 2, desc
    for name in PHOTOS[:2]:
        im = photo_image(name, (211, 173))
        arr = np.asarray(im)
        for i in range(24):
            plan = _C._plan_sample(spec, im.width, im.height, 8, 0, i)
            ours = torch.from_numpy(_C._render(spec, arr, plan))
            assert torch.equal(ours, _replay(im, spec, plan, None)), (name, i, plan)
    n = 3000
    firsts = collections.Counter()
    radii = []
    for i in range(n):
        op, arg = _C._plan_sample(spec, 200, 150, 8, 1, i)["aug"][0]
        firsts[op] += 1
        if op == BLUR:
            radii.append(arg)
        if op == COLOR:   # Desaturate at magnitude 10: gray
            assert arg == 0.0
        if op == SOLARIZE:
            assert arg == 128.0
    assert set(firsts) == {SOLARIZE, COLOR, BLUR}
    assert all(abs(c - n / 3) < 4 * math.sqrt(n * 2 / 9) for c in firsts.values()), firsts
    r = np.array(radii)
    assert r.min() >= 0.1 and r.max() <= 2.0 and abs(r.mean() - 1.05) < 4 * 1.9 / math.sqrt(12 * len(r))


def test_imagefolder_runs_3a(tmp_path):
    import fastloader
    from fastloader.tools.sample import make_sample

    root = tmp_path / "train"
    make_sample(str(root), n=8, classes=2, seed=5, progress=False, processes=1)
    tf = timm_data.create_transform(48, is_training=True, auto_augment="3a")
    ds = fastloader.ImageFolder(str(root), transform=tf)
    assert ds.pipeline_description.endswith("python: nothing"), ds.pipeline_description
    runs = [list(fastloader.DataLoader(ds, batch_size=4, num_workers=nw, seed=2)) for nw in (0, 2)]
    for (xa, ya), (xb, yb) in zip(*runs):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    images = torch.cat([x for x, _ in runs[0]])
    spec = dict(out_h=48, out_w=48)
    for i, (path, _label) in enumerate(ds.samples[:4]):
        with Image.open(path) as im:
            im = im.convert("RGB")
        assert torch.equal(images[i], _replay(im, spec, ds.plan(i, im.width, im.height, 0, 2), None)), i
