"""timm's AugMix (``auto_augment="augmix-..."``: timm.data.auto_augment's
AugMixAugment of AugmentOps, not blended) in the native pipeline.

- Pixels: each plan (its chains' ops and arguments, the chain weights, m)
  replayed through timm's own ``AugMixAugment._apply_basic`` (its float32
  mix, ``np.clip``, ``astype(uint8)`` and ``Image.blend``), with numpy's
  random calls answered from the plan and timm's op functions applying
  the plan's arguments, equals the native render bit for bit.
- Draws: chain depths, op choices, the Dirichlet weights and Beta's m
  against their distributions at a fixed seed.
- The unchanged create_transform object through ImageFolder and the
  DataLoader, and what stays in Python.
"""
from __future__ import annotations

import collections
import math
import types

import numpy as np
import pytest
from PIL import Image

from imgutil import PHOTOS, crop_resize_flip, photo_image

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
timm_aa = pytest.importorskip("timm.data.auto_augment")
timm_data = pytest.importorskip("timm.data")

from torchvision.transforms import functional as TF  # noqa: E402

from fastloader import _C  # noqa: E402
from fastloader.transforms import compile_transform  # noqa: E402
from test_timm_augment import timm_apply  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _train(aa="augmix-m5-w4-d2", size=64, interpolation="bilinear"):
    return timm_data.create_transform(size, is_training=True, auto_augment=aa, interpolation=interpolation)


def _augmix_of(tf):
    return next(t for t in tf.transforms if type(t).__name__ == "AugMixAugment")


def _timm_mix(aug, img, plan, fill):
    """timm's own _apply_basic on img for the plan's draws: numpy's
    randint / choice inside it answer with the plan's chain lengths and
    ops, each op timm's function with the plan's argument."""
    mix = plan["mix"]
    chained = sum(mix["len"])
    ops = list(zip(plan["aug"], plan["aug_interp"]))[len(plan["aug"]) - chained:]
    chains, at = [], 0
    for n in mix["len"]:
        chains.append(ops[at:at + n])
        at += n
    it = iter(chains)
    current = []

    def randint(lo, hi):
        current[:] = next(it)
        return len(current)

    def choice(seq, n, replace=True):
        assert n == len(current)
        return [lambda im, c=c, a=a, i=i: timm_apply(im, c, a, i, fill) for (c, a), i in current]

    fake = types.SimpleNamespace(**{k: getattr(np, k) for k in ("zeros_like", "asarray", "float32", "clip", "uint8")})
    fake.random = types.SimpleNamespace(randint=randint, choice=choice)
    real = timm_aa.np
    timm_aa.np = fake
    depth = aug.depth
    try:
        aug.depth = -1   # every chain asks randint for its length, which the plan answers
        return aug._apply_basic(img, np.array(mix["w"], dtype=np.float32), np.float32(mix["w0"]))
    finally:
        timm_aa.np = real
        aug.depth = depth


def _replay(im, tf, spec, plan):
    out = crop_resize_flip(im, plan, spec["out_h"], spec["out_w"])
    out = _timm_mix(_augmix_of(tf), out, plan, tuple(spec["policy"]["fill"]))
    return TF.normalize(TF.to_tensor(out), MEAN, STD)


@pytest.mark.parametrize("aa,interpolation", [("augmix-m5-w4-d2", "bilinear"), ("augmix-m3-w3", "bicubic"),
                                              ("augmix-m9-w2-d1-mstd0.5", "random")])
def test_pixels_equal_timm_augmix_for_the_plan(aa, interpolation):
    tf = _train(aa, size=72, interpolation=interpolation)
    spec, rest, desc = compile_transform(tf)
    assert rest is None and spec["policy"]["kind"] == "timm_augmix", desc
    seen = set()
    for name in PHOTOS[:3]:
        im = photo_image(name, (241, 187))
        arr = np.asarray(im)
        for i in range(12):
            plan = _C._plan_sample(spec, im.width, im.height, seed=5, epoch=2, index=i)
            assert plan["mix"]["timm"] and len(plan["mix"]["w"]) == spec["policy"]["rounds"]
            seen.update(c for c, _ in plan["aug"])
            ours = torch.from_numpy(_C._render(spec, arr, plan))
            ref = _replay(im, tf, spec, plan)
            assert torch.equal(ours, ref), (name, i, plan, (ours - ref).abs().max())
    assert len(seen) >= 9, seen


def test_draws_follow_timm_distributions():
    """depth -1: 1..3 ops a chain uniformly; ops uniform over the 13; the
    weights a Dirichlet(1, ...) (mean 1 / width, sum 1 in float32) and m a
    Beta(1, 1) (uniform), all float32 values."""
    spec, rest, _ = compile_transform(_train("augmix-m3-w3"))
    n = 3000
    lens, ops, ws, ms = collections.Counter(), collections.Counter(), [], []
    for i in range(n):
        p = _C._plan_sample(spec, 300, 200, 7, 0, i)
        lens.update(p["mix"]["len"])
        ops.update(c for c, _ in p["aug"])
        ws.append(p["mix"]["w"])
        ms.append(p["mix"]["w0"])
    chains = 3 * n
    for k in (1, 2, 3):
        assert abs(lens[k] - chains / 3) < 4 * math.sqrt(chains * 2 / 9), lens
    w = np.array(ws)
    assert np.array_equal(w, w.astype(np.float32)) and np.allclose(w.sum(1), 1, atol=1e-6)
    assert np.all(np.abs(w.mean(0) - 1 / 3) < 4 * math.sqrt(1 / 18 / n)), w.mean(0)   # var of Dir(1,1,1): 1/18
    m = np.array(ms)
    assert abs(m.mean() - 0.5) < 4 * math.sqrt(1 / 12 / n) and np.histogram(m, 4, (0, 1))[0].min() > 0.2 * n
    # 13 ops; Rotate, Shear and Translate share codes with their pairs (X/Y are separate codes except Rotate)
    total = sum(ops.values())
    assert len(ops) >= 11 and max(ops.values()) < 3.5 * total / 13, ops


def test_imagefolder_runs_timm_augmix_unchanged(tmp_path):
    import fastloader
    from fastloader.tools.sample import make_sample

    root = tmp_path / "train"
    make_sample(str(root), n=8, classes=2, seed=2, progress=False, processes=1)
    tf = _train("augmix-m5-w3-d2", size=48)
    ds = fastloader.ImageFolder(str(root), transform=tf)
    assert ds.pipeline_description.endswith("python: nothing"), ds.pipeline_description
    runs = [list(fastloader.DataLoader(ds, batch_size=4, num_workers=nw, seed=3)) for nw in (0, 2)]
    for (xa, ya), (xb, yb) in zip(*runs):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    images = torch.cat([x for x, _ in runs[0]])
    spec = dict(out_h=48, out_w=48, policy=dict(fill=(124, 116, 104)))
    for i, (path, _label) in enumerate(ds.samples[:4]):
        with Image.open(path) as im:
            im = im.convert("RGB")
        plan = ds.plan(i, im.width, im.height, 0, 3)
        assert torch.equal(images[i], _replay(im, tf, spec, plan)), i


def test_what_stays_in_python():
    aug = _augmix_of(_train("augmix-m3-w3-b1"))   # blended: timm's faster, different mix
    assert aug.blended
    spec, rest, desc = compile_transform(_train("augmix-m3-w3-b1"))
    assert rest is not None and "policy" not in spec and "AugMixAugment" in desc.split("python")[1], desc
    # after AugMix a ColorJitter stays in Python too (the chains end the op list)
    from torchvision import transforms as T
    tf = _train("augmix-m3-w3")
    tf.transforms.insert(3, T.ColorJitter(0.4))
    spec, rest, desc = compile_transform(tf)
    assert spec["policy"]["kind"] == "timm_augmix" and "jitter" not in spec and rest is not None, desc
