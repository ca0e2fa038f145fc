"""timm's RandAugment (``timm.data.auto_augment``, the ``rand-*`` policy
strings of ``create_transform``) in the native pipeline.

- Per op: augment.c's timm ops (SolarizeAdd, the affine shear/translate with
  Pillow's coefficients, the enhance ops by factor) and the bicubic affine
  filter, bit for bit against timm's own op functions on PIL images (Pillow
  13) over hundreds of arguments drawn by timm's own level functions, on real
  photographs, RGB and L, bilinear and bicubic, with timm's fills.
- Distributions: the ops chosen per sample (uniform with replacement, or
  weighted without replacement), each applied with its prob, the magnitude
  noise (``mstd``, clipped to [0, mmax]), the signs, the filter drawn per op
  for ``interpolation="random"``: against timm's own draws at a fixed seed.
- Pipeline: a plan's crop, flip and ops replayed through timm's functions on
  the PIL image equal what the C pipeline renders, for create_transform's
  objects passed unchanged.
"""
from __future__ import annotations

import math
import random
import sys

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
from fastloader.transforms import _TIMM_OPS, compile_transform  # noqa: E402

BILINEAR, BICUBIC = Image.Resampling.BILINEAR, Image.Resampling.BICUBIC
PIL_FILTER = {0: Image.Resampling.NEAREST, 1: BILINEAR, 2: BICUBIC}   # augment.h FL_AUG_* -> Pillow
GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}
HPARAMS = dict(translate_const=100, translate_pct=0.45, img_mean=(124, 116, 104))
SIZES = [(224, 224), (97, 61), (31, 200), (3, 3), (2, 5), (1, 1)]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# timm's op function for each augment.h code (several names share one function)
CODE_FN = {12: timm_aa.auto_contrast, 13: timm_aa.equalize, 14: timm_aa.invert, 5: timm_aa.rotate,
           10: timm_aa.posterize, 11: timm_aa.solarize, 15: timm_aa.solarize_add, 20: timm_aa.brightness,
           21: timm_aa.color, 22: timm_aa.contrast, 23: timm_aa.sharpness, 16: timm_aa.shear_x,
           17: timm_aa.shear_y, 18: timm_aa.translate_x_abs, 19: timm_aa.translate_y_abs,
           46: timm_aa.gaussian_blur}


def timm_apply(im, code, arg, interp, fill):
    """timm's result for augment.h op `code` with argument arg (translate:
    pixels) on PIL image im, as AugmentOp hands it over."""
    if code == 10 and int(arg) == 0:   # Pillow >= 13 refuses 0 bits; timm means "keep none"
        return Image.new(im.mode, im.size, 0)
    if code in (10, 11, 15):   # bits, threshold, addend: ints in timm (the plan holds them as doubles)
        assert arg == int(arg)
        arg = int(arg)
    args = () if code in (12, 13, 14) else (arg,)   # AutoContrast, Equalize, Invert take none
    return CODE_FN[code](im, *args, fillcolor=fill, resample=PIL_FILTER[interp])


def ours_apply(arr, code, arg, interp, fill):
    return _C._augment_op(code, arg, arr, interp=interp, fill=None if fill is None else list(fill))


def _image(k, mode):
    im = photo_image(PHOTOS[k % len(PHOTOS)], SIZES[(k // len(PHOTOS)) % len(SIZES)])
    return im.convert("L") if mode == "L" else im


@pytest.mark.parametrize("name", sorted(_TIMM_OPS))
def test_timm_op_is_bit_exact_with_timm_on_pillow(name):
    code, _level = _TIMM_OPS[name]
    level_fn = timm_aa.LEVEL_TO_ARG[name]
    rng = random.Random(code * 100 + _level)
    random.seed(code)   # timm's level functions negate with the random module
    n = 0
    for k in range(120 if name in GEOMETRIC else 60):
        mode = "L" if k % 4 == 3 else "RGB"
        im = _image(k, mode)
        arr = np.ascontiguousarray(np.asarray(im))
        m = rng.uniform(0.0, 10.0) if k % 5 else rng.choice([0.0, 10.0, 5.0, 9.0])
        arg = level_fn(m, HPARAMS)[0] if level_fn is not None else 0.0
        if name.endswith("Rel"):   # timm's translate_*_rel: pct * img.size[0 or 1]
            arg = arg * (im.size[0] if name == "TranslateXRel" else im.size[1])
        interps = (1, 2) if name in GEOMETRIC else (1,)
        for interp in interps:
            fill = None
            if name in GEOMETRIC:
                fill = HPARAMS["img_mean"] if mode == "RGB" else (rng.randrange(256),)
            ref = np.asarray(timm_apply(im, code, arg, interp, fill if mode == "RGB" or fill is None else fill[0]))
            got = ours_apply(arr, code, arg, interp, fill)
            assert np.array_equal(got, ref), (name, k, mode, im.size, m, arg, interp,
                                              int(np.abs(got.astype(int) - ref).max()))
            n += 1
    assert n >= 60


@pytest.mark.parametrize("name", ["Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"])
def test_bicubic_affine_special_arguments(name):
    """Pillow's bicubic at the edges, past them and at the transposes."""
    code = _TIMM_OPS[name][0]
    args = {"Rotate": [0.0, 90.0, -90.0, 180.0, 270.0, 45.0, 30.0, -29.9, 1e-9, 720.0],
            "ShearX": [0.0, 0.3, -0.3, 1e-9, 2.0, -5.0], "ShearY": [0.0, 0.3, -0.3, 2.0, -5.0],
            "TranslateX": [0.0, 0.5, -0.5, 1.0, 0.25, 223.9, 224.0, 1e4, -13.37],
            "TranslateY": [0.0, 0.5, -0.75, 60.4, -61.0, 1e4]}[name]
    for k, arg in enumerate(args):
        for mode in ("RGB", "L"):
            im = _image(k, mode)
            fill = (1, 2, 3) if mode == "RGB" else (9,)
            ref = np.asarray(timm_apply(im, code, arg, 2, fill if mode == "RGB" else fill[0]))
            got = ours_apply(np.ascontiguousarray(np.asarray(im)), code, arg, 2, fill)
            assert np.array_equal(got, ref), (name, arg, mode, im.size)


@pytest.mark.parametrize("interp", [1, 2])
def test_rotations_bit_exact_at_every_width(interp):
    """Rotations move both fractions, so every covered pixel takes the full
    bilinear or bicubic sum: augment.c's 8-pixel AVX2 runs
    (fl_bilinear_run3_avx2, fl_bicubic_run3_avx2) and the scalar tail of
    each row, against Pillow's rotate, over widths that leave every tail
    length 0..7, random angles and fills."""
    rng = random.Random(20261205 + interp)
    n = 0
    for w in [8, 9, 10, 11, 12, 13, 14, 15, 16, 23, 57, 224]:
        for k in range(4):
            h = rng.choice([1, 2, 7, 33, 96])
            im = photo_image(PHOTOS[(w + k) % len(PHOTOS)], (w, h))
            angle = rng.uniform(-180.0, 180.0)
            fill = tuple(rng.randrange(256) for _ in range(3))
            ref = np.asarray(im.rotate(angle, resample=PIL_FILTER[interp], fillcolor=fill))
            got = ours_apply(np.ascontiguousarray(np.asarray(im)), 5, angle, interp, fill)
            assert np.array_equal(got, ref), (interp, (w, h), angle, fill)
            n += 1
    assert n == 48


def test_solarize_add_and_posterize_zero_bits():
    a = np.arange(256, dtype=np.uint8).reshape(16, 16)
    got = _C._augment_op(15, 100.0, a)
    assert np.array_equal(got, np.where(a < 128, np.minimum(255, a.astype(int) + 100), a).astype(np.uint8))
    assert not _C._augment_op(10, 0.0, a).any()   # timm's PosterizeIncreasing at m 10: keep 0 bits
    with pytest.raises(ValueError, match="SolarizeAdd"):
        _C._augment_op(15, 256.0, a)
    with pytest.raises(ValueError, match="SolarizeAdd"):
        _C._augment_op(15, -1.0, a)


# --------------------------------------------------------------------------
# the transform objects are recognised, and what is not is said


def _compose_with(ra, size=64):
    """timm's training pipeline around a RandAugment built by hand."""
    timm_t = pytest.importorskip("timm.data.transforms")
    from torchvision import transforms as T
    return T.Compose([timm_t.RandomResizedCropAndInterpolation(size, interpolation="bilinear"),
                      T.RandomHorizontalFlip(), ra, timm_t.MaybeToTensor(), T.Normalize(MEAN, STD)])


def _train(aa="rand-m9-mstd0.5-inc1", interpolation="bicubic", size=64, re_prob=0.0):
    return timm_data.create_transform(size, is_training=True, auto_augment=aa, re_prob=re_prob,
                                      interpolation=interpolation)


@pytest.mark.parametrize("aa", ["rand-m9-mstd0.5-inc1", "rand-m9-mstd0.5", "rand-m7-n3", "rand-m10-mstd101-inc1",
                                "rand-m9-mmax15-mstd1-inc1"])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear", "random"])
def test_create_transform_rand_runs_natively(aa, interpolation):
    tf = _train(aa, interpolation, re_prob=0.25)
    spec, rest, desc = compile_transform(tf)
    assert rest is None, desc
    pol = spec["policy"]
    assert pol["kind"] == "timm_ra" and pol["fill"] == (124, 116, 104)
    assert pol["interp"] == {"bicubic": 2, "bilinear": 1, "random": 3}[interpolation]
    assert len(pol["ops"]) == 15 and "erase" in spec


def test_unknown_timm_op_stays_in_python_and_is_named():
    """Every op name of timm's NAME_TO_OP runs natively now; an AugmentOp
    whose function is not timm's own for its name (a patched op) keeps the
    whole policy in Python."""
    assert set(timm_aa.NAME_TO_OP) <= set(_TIMM_OPS)
    ops = timm_aa.rand_augment_ops(9, hparams=dict(HPARAMS), transforms=["Rotate", "GaussianBlurRand"])
    ops[1].aug_fn = lambda img, *args, **kw: img
    ra = timm_aa.RandAugment(ops, 2)
    spec, rest, desc = compile_transform(_compose_with(ra))
    assert "policy" not in spec and rest is not None
    assert "RandAugment" in desc.split("python (per sample):")[1]


# --------------------------------------------------------------------------
# distributions


def _plans(spec, n, seed=11, W=300, H=200):
    return [_C._plan_sample(spec, W, H, seed=seed, epoch=0, index=i) for i in range(n)]


def _timm_draws(ra, n, img_size):
    """timm's own ops, chosen and applied by its own __call__ code paths
    (RandAugment's or AutoAugment's), with each op function replaced by a
    recorder of (name, argument, resample)."""
    seen = []
    saved = dict(timm_aa.NAME_TO_OP)
    all_ops = ra.ops if hasattr(ra, "ops") else [op for sub in ra.policy for op in sub]
    for op in all_ops:
        def rec(img, *args, _name=op.name, **kw):
            resample = timm_aa._interpolation(dict(kw)) if _name in GEOMETRIC else None
            seen[-1].append((_name, args[0] if args else None, resample))
            return img
        op.aug_fn = rec
    img = Image.new("RGB", img_size)
    random.seed(0)
    np.random.seed(0)
    try:
        for _ in range(n):
            seen.append([])
            ra(img)
    finally:
        for op in all_ops:
            op.aug_fn = saved[op.name]
    return seen


def test_rand_m9_mstd_inc1_draws_match_timm():
    tf = _train("rand-m9-mstd0.5-inc1", "random", size=64)
    ra = [t for t in tf.transforms if type(t).__name__ == "RandAugment"][0]
    spec, rest, _ = compile_transform(tf)
    assert rest is None
    n = 12000
    ours = [list(zip(p["aug"], p["aug_interp"])) for p in _plans(spec, n)]
    theirs = _timm_draws(ra, n, (64, 64))
    name_of = {}
    for op in ra.ops:
        name_of.setdefault(_TIMM_OPS[op.name][0], op.name)
    # how many ops apply per sample: 2 layers, prob 0.5 each -> Binomial(2, 0.5)
    for k in range(3):
        a = sum(len(s) == k for s in ours)
        b = sum(len(s) == k for s in theirs)
        assert abs(a - b) < 5 * math.sqrt(n * 0.5), (k, a, b)
    # each op as often as timm picks it (15 ops, ~800 each)
    ca = {}
    for s in ours:
        for (code, _), _i in s:
            ca[code] = ca.get(code, 0) + 1
    cb = {}
    for s in theirs:
        for nm, _, _ in s:
            cb[_TIMM_OPS[nm][0]] = cb.get(_TIMM_OPS[nm][0], 0) + 1
    assert set(ca) == set(cb)
    for code in cb:
        assert abs(ca[code] - cb[code]) < 5 * math.sqrt(cb[code]) + 5, (name_of[code], ca[code], cb[code])
    # the argument's distribution per op: mean, spread, sign balance (continuous levels) ...
    for code in (5, 16, 18, 21):
        a = np.array([m for s in ours for (c, m), _ in s if c == code])
        b = np.array([m for s in theirs for nm, m, _ in s if _TIMM_OPS[nm][0] == code], float)
        if code == 18:   # ours in pixels (pct * 64), timm's level in pct
            b = b * 64
        se = math.sqrt(a.var() / len(a) + b.var() / len(b)) + 1e-12
        assert abs(a.mean() - b.mean()) < 5 * se, (name_of[code], a.mean(), b.mean())
        assert abs(np.abs(a).mean() - np.abs(b).mean()) < 5 * se + 1e-9, name_of[code]
        assert abs(a.std() - b.std()) < 0.1 * b.std() + 1e-9, (name_of[code], a.std(), b.std())
    # ... and the integer ones value by value (bits 0 at m 10: P(N(9, 0.5) >= 10) ~ 2.3%)
    for code in (10, 11, 15):
        a = [m for s in ours for (c, m), _ in s if c == code]
        b = [m for s in theirs for nm, m, _ in s if _TIMM_OPS[nm][0] == code]
        for v in set(a) | set(b):
            na, nb = a.count(v) / len(a) * len(b), b.count(v)
            assert abs(na - nb) < 5 * math.sqrt(nb) + 5, (name_of[code], v, na, nb)
    geo_ours = [i for s in ours for (c, _), i in s if c in (5, 16, 17, 18, 19)]
    geo_theirs = [r for s in theirs for nm, _, r in s if nm in GEOMETRIC]
    frac_a = sum(i == 2 for i in geo_ours) / len(geo_ours)
    frac_b = sum(r == BICUBIC for r in geo_theirs) / len(geo_theirs)
    assert abs(frac_a - 0.5) < 5 * math.sqrt(0.25 / len(geo_ours)) and abs(frac_b - 0.5) < 0.05
    assert all(i == 1 for s in ours for (c, _), i in s if c not in (5, 16, 17, 18, 19))


@pytest.mark.parametrize("aa", ["rand-m14-mmax15-inc1", "rand-m25-mmax30", "rand-m12-mstd1-mmax15-inc1"])
def test_posterize_bits_past_timm_range_are_clamped_as_timm_and_pillow_mean(aa):
    """With an mmax over 10 timm's Posterize levels leave 0..8 (found by
    fuzz_render): PosterizeIncreasing past magnitude 12.5 asks for fewer than
    0 bits (Pillow's mask arithmetic keeps none: black, as for 0 bits), and
    Posterize / PosterizeOriginal past 22.5 / 12.5 for more than 8 (timm's
    posterize returns the image).  Natively the bits are clamped to 0..8 and
    every plan renders, where the unclamped value failed the sample; the
    values are timm's own draws, clamped."""
    tf = _train(aa, "bilinear", size=32)
    ra = [t for t in tf.transforms if type(t).__name__ == "RandAugment"][0]
    spec, rest, _ = compile_transform(tf)
    assert rest is None
    n = 3000
    plans = _plans(spec, n)
    ours = [m for p in plans for c, m in p["aug"] if c == 10]
    theirs = [m for s in _timm_draws(ra, n, (32, 32)) for nm, m, _ in s if nm.startswith("Posterize")]
    assert ours and all(0 <= m <= 8 for m in ours), sorted(set(ours))
    clamped = [min(8, max(0, int(m))) for m in theirs]
    assert any(m != c for m, c in zip(theirs, clamped)), "the policy never leaves 0..8: the test tests nothing"
    for v in set(ours) | set(clamped):   # the clamped distribution is timm's, value by value
        na, nb = ours.count(v) / len(ours) * len(clamped), clamped.count(v)
        assert abs(na - nb) < 5 * math.sqrt(nb) + 5, (v, na, nb)
    img = np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8)   # _plans' 300 x 200
    for p in plans[:300]:
        _C._render(spec, img, p)   # raised "Posterize: bits int(-2) outside 0..8" before the clamp
    a = np.arange(256, dtype=np.uint8).reshape(16, 16)
    assert np.array_equal(_C._augment_op(10, 8.0, a), a)   # 8 bits: the image


@pytest.mark.parametrize("policy", ["original", "v0r", "original-mstd0.5"])
def test_autoaugment_draws_match_timm(policy):
    tf = _train(policy, "random", size=64)
    aa = [t for t in tf.transforms if type(t).__name__ == "AutoAugment"][0]
    spec, rest, _ = compile_transform(tf)
    assert rest is None and spec["policy"]["kind"] == "timm_aa"
    n = 10000
    ours = [p["aug"] for p in _plans(spec, n)]
    theirs = _timm_draws(aa, n, (64, 64))
    for k in range(3):   # ops applied per sample
        a, b = sum(len(s) == k for s in ours), sum(len(s) == k for s in theirs)
        assert abs(a - b) < 5 * math.sqrt(max(b, 1)) + 10, (k, a, b)
    ca, cb = {}, {}
    for s in ours:
        for c, _ in s:
            ca[c] = ca.get(c, 0) + 1
    for s in theirs:
        for nm, _, _ in s:
            c = _TIMM_OPS[nm][0]
            cb[c] = cb.get(c, 0) + 1
    assert set(ca) == set(cb)
    for c in cb:
        assert abs(ca[c] - cb[c]) < 5 * math.sqrt(cb[c]) + 10, (c, ca[c], cb[c])
    # the arguments: per op, the mean of |arg| (fixed magnitudes, or noised with mstd)
    for c in cb:
        a = np.abs([m for s in ours for cc, m in s if cc == c])
        b = np.abs([m for s in theirs for nm, m, _ in s if _TIMM_OPS[nm][0] == c and m is not None], dtype=float)
        if c == 19:   # TranslateYRel: ours in pixels
            b = b * 64
        if len(b) and b.std() > 0:
            se = math.sqrt(a.var() / len(a) + b.var() / len(b))
            assert abs(a.mean() - b.mean()) < 5 * se + 1e-9 * abs(b.mean()), (c, a.mean(), b.mean())
        elif len(b):
            assert np.allclose(a, b[0]), c


@pytest.mark.parametrize("policy", ["original", "v0"])
def test_autoaugment_pixels_equal_timm_for_the_plan(policy):
    tf = _train(policy, "bicubic", size=80)
    spec, rest, _ = compile_transform(tf)
    assert rest is None
    seen = set()
    for name in PHOTOS[:2]:
        im = photo_image(name, (203, 150))
        arr = np.asarray(im)
        for i in range(50):
            plan = _C._plan_sample(spec, im.width, im.height, seed=5, epoch=0, index=i)
            seen.update(c for c, _ in plan["aug"])
            ours = torch.from_numpy(_C._render(spec, arr, plan))
            ref = _replay(im, spec, plan, spec["policy"]["fill"])
            assert torch.equal(ours, ref), (policy, name, i, plan)
    assert len(seen) >= 7


def test_weighted_choice_is_without_replacement_as_numpy():
    names = ["Rotate", "ShearX", "Invert", "Equalize", "SolarizeAdd"]
    w = np.array([5.0, 3.0, 1.0, 0.5, 0.5])
    w = w / w.sum()
    ops = timm_aa.rand_augment_ops(9, prob=1.0, hparams=dict(HPARAMS), transforms=names)
    ra = timm_aa.RandAugment(ops, 3, choice_weights=w)
    spec, rest, _ = compile_transform(_compose_with(ra))
    assert rest is None and spec["policy"]["weights"] is not None
    n = 8000
    ours = [[c for c, _ in p["aug"]] for p in _plans(spec, n)]
    assert all(len(s) == 3 and len(set(s)) == 3 for s in ours)
    np.random.seed(1)
    theirs = [[_TIMM_OPS[o.name][0] for o in np.random.choice(ops, 3, replace=False, p=w)] for _ in range(n)]
    for pos in range(3):   # the op at each position, as numpy draws it
        for code in {_TIMM_OPS[nm][0] for nm in names}:
            a = sum(s[pos] == code for s in ours)
            b = sum(s[pos] == code for s in theirs)
            assert abs(a - b) < 5 * math.sqrt(max(b, 1)) + 5, (pos, code, a, b)


def test_plans_do_not_depend_on_anything_but_seed_epoch_index():
    spec, _, _ = compile_transform(_train())
    a = _plans(spec, 50, seed=3)
    b = _plans(spec, 50, seed=3)
    c = _plans(spec, 50, seed=4)
    assert a == b and a != c


# --------------------------------------------------------------------------
# pixels: a plan replayed through timm's functions equals the C pipeline


def _replay(im, spec, plan, fill):
    out = crop_resize_flip(im, plan, spec["out_h"], spec["out_w"])
    for (code, arg), interp_code in zip(plan["aug"], plan["aug_interp"]):
        out = timm_apply(out, code, arg, interp_code, fill)
    return TF.normalize(TF.to_tensor(out), MEAN, STD)


@pytest.mark.parametrize("interpolation", ["bicubic", "random"])
def test_recipe_pixels_equal_timm_for_the_plan(interpolation):
    tf = _train("rand-m9-mstd0.5-inc1", interpolation, size=96)
    spec, rest, _ = compile_transform(tf)
    assert rest is None
    seen = set()
    for name in PHOTOS[:3]:
        im = photo_image(name, (257, 191))
        arr = np.asarray(im)
        for i in range(60):
            plan = _C._plan_sample(spec, im.width, im.height, seed=3, epoch=1, index=i)
            seen.update(c for c, _ in plan["aug"])
            ours = torch.from_numpy(_C._render(spec, arr, plan))
            ref = _replay(im, spec, plan, spec["policy"]["fill"])
            assert torch.equal(ours, ref), (name, i, plan, (ours - ref).abs().max())
    assert len(seen) >= 12   # most of the 15 ops went through the comparison


def test_imagefolder_runs_create_transform_unchanged_and_matches_the_replay(tmp_path):
    import fastloader
    from fastloader.tools.sample import make_sample

    root = tmp_path / "train"
    make_sample(str(root), n=24, classes=2, seed=1, progress=False, processes=1)
    ds = fastloader.ImageFolder(str(root), transform=_train(size=64))
    assert "python: nothing" in ds.pipeline_description
    seed = 17
    batches = [list(fastloader.DataLoader(ds, batch_size=8, num_workers=nw, seed=seed)) for nw in (0, 2)]
    for (xa, ya), (xb, yb) in zip(*batches):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)   # bit-identical for any num_workers
    images = torch.cat([x for x, _ in batches[0]])
    for i, (path, _label) in enumerate(ds.samples):
        with Image.open(path) as im:
            im = im.convert("RGB")
        plan = ds.plan(i, im.width, im.height, 0, seed)
        ref = _replay(im, dict(out_h=64, out_w=64), plan, (124, 116, 104))
        assert torch.equal(images[i], ref), (i, plan)


if __name__ == "__main__":   # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
