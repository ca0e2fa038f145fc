"""torchvision's AugMix (v1 and v2) in the native pipeline.

AugMix turns the PIL image into a uint8 tensor and applies torchvision's
*tensor* kernels (``_functional_tensor`` for v1, ``v2.functional`` for v2),
so the native ops here are a second family (csrc/image/augment_tensor.c,
augment.h FL_AUG_T_*), held to those kernels bit for bit:

- each op alone (``_C._augment_op``) against ``autoaugment._apply_op`` (v1)
  and ``AugMix._apply_image_or_video_transform`` (v2) on the uint8 tensor,
  over the magnitudes of AugMix's own table at every severity, random ones
  in between and special values, on photographs at 224 x 224 and odd sizes,
  RGB and L, nearest and bilinear;
- whole samples: a plan's weights and chains replayed through torchvision's
  own ops and mixing arithmetic, and (for a few plans) through the real
  ``AugMix.forward`` with its random draws forced to the plan's;
- the draws' distributions (Dirichlet weights, chain depths, op, bin and
  sign) at a fixed seed;
- recognition of the unchanged objects, and what stays in Python.
"""
from __future__ import annotations

import math
import os
import random
import sys
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms import autoaugment as tv_aa  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from fastloader import _C  # noqa: E402
from fastloader.transforms import _AUGMIX_OPS, compile_transform  # noqa: E402
from imgutil import PHOTOS, photo_image  # noqa: E402

NAME_OF = {}
for _name, (_c1, _c2) in _AUGMIX_OPS.items():
    NAME_OF[_c1] = _name
    NAME_OF[_c2] = _name
GEOMETRIC = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}
SIZES = [(224, 224), (97, 61), (31, 200), (3, 3), (2, 5), (1, 1)]
NEAREST, BILINEAR = InterpolationMode.NEAREST, InterpolationMode.BILINEAR
V2_AUGMIX = v2.AugMix()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """torch's reference computed as a DataLoader worker computes it: one
    thread (ATen splits a loop among threads, and each piece's remainder
    rounds as the note in the Contrast v2 case below says)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tensor(arr):
    """HWC / HW uint8 array -> the [1, C, H, W] tensor AugMix works on."""
    a = arr if arr.ndim == 3 else arr[:, :, None]
    return torch.from_numpy(np.array(a)).permute(2, 0, 1).contiguous()[None]


def _array(t, like):
    """[1, C, H, W] uint8 tensor -> an array shaped like `like`."""
    return t[0].permute(1, 2, 0).numpy().reshape(like.shape)


def reference_op(t, name, magnitude, interp, use_v2):
    """What torchvision's AugMix does to the tensor t for one op (fill None)."""
    if use_v2:
        m = magnitude / 255 if name == "Solarize" else magnitude   # v2's table is [0, 1], scaled by the bound
        return V2_AUGMIX._apply_image_or_video_transform(t, name, m, interpolation=interp, fill=V2_AUGMIX._fill)
    return tv_aa._apply_op(t, name, magnitude, interpolation=interp, fill=None)


def ours_op(arr, name, magnitude, interp, use_v2):
    code = _AUGMIX_OPS[name][1 if use_v2 else 0]
    return _C._augment_op(code, magnitude, arr, interp=0 if interp == NEAREST else 1)


def _table(name, h, w):
    """Every magnitude of AugMix's table for op `name` (all severities), both signs where signed."""
    mags, signed = T.AugMix()._augmentation_space(10, (h, w))[name]
    vals = [float(m) for m in mags.reshape(-1).tolist()] if mags.ndim else [0.0]
    return vals + ([-v for v in vals] if signed else [])


RANDOM = {"ShearX": (-0.6, 0.6), "ShearY": (-0.6, 0.6), "TranslateX": (-120.0, 120.0),
          "TranslateY": (-120.0, 120.0), "Rotate": (-200.0, 200.0), "Brightness": (-1.0, 1.5),
          "Color": (-1.0, 1.5), "Contrast": (-1.0, 1.5), "Sharpness": (-1.0, 1.5), "Posterize": (0.0, 8.99),
          "Solarize": (0.0, 255.0)}
SPECIAL = {"Rotate": [0.0, -0.0, 90.0, -90.0, 180.0, 270.0, 360.0, -180.0, 45.0, 1e-9],
           "ShearX": [0.0, -0.0, 1e-9, 0.3, -0.3], "ShearY": [0.0, 0.3, -0.3, 1e-9],
           "TranslateX": [0.0, 0.9, -1.0, 300.0, -300.0], "TranslateY": [0.0, -0.9, 1.0, 300.0],
           "Brightness": [-1.0, 0.0, 0.9, -0.9, 3.0], "Color": [-1.0, 0.0, 0.9, -0.9, 3.0],
           "Contrast": [-1.0, 0.0, 0.9, -0.9, 3.0], "Sharpness": [-1.0, 0.0, 0.9, -0.9, 3.0],
           "Posterize": [0.0, 1.0, 4.0, 8.0], "Solarize": [0.0, 0.5, 127.5, 128.0, 255.0]}


def _cases(name, seed):
    rng = random.Random(seed)
    out = []
    for k in range(len(PHOTOS) * len(SIZES) * 2):
        photo, (w, h) = PHOTOS[k % len(PHOTOS)], SIZES[(k // len(PHOTOS)) % len(SIZES)]
        mags = _table(name, h, w) if k < len(PHOTOS) * len(SIZES) else []
        mags += SPECIAL.get(name, [])
        if name in RANDOM:
            mags += [rng.uniform(*RANDOM[name]) for _ in range(6)]
        else:   # no magnitude: each image in both modes
            mags += [0.0]
        if name == "Solarize":   # AugMix's thresholds are float32 values
            mags = [float(np.float32(m)) for m in mags]
        for m in mags:
            mode = "L" if rng.random() < 0.25 else "RGB"
            interp = rng.choice([NEAREST, BILINEAR]) if name in GEOMETRIC else NEAREST
            out.append((photo, (w, h), mode, m, interp))
    return out


_IMAGES: dict = {}


def _image(photo, size, mode):
    key = (photo, size, mode)
    if key not in _IMAGES:
        im = photo_image(photo, size)
        _IMAGES[key] = np.ascontiguousarray(np.asarray(im.convert(mode) if mode == "L" else im))
    return _IMAGES[key]


@pytest.mark.parametrize("use_v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("name", list(_AUGMIX_OPS))
def test_tensor_op_is_bit_exact_with_torchvision(name, use_v2):
    n = 0
    for photo, size, mode, m, interp in _cases(name, seed=hash(name) % 1000 + use_v2):
        arr = _image(photo, size, mode)
        ref = _array(reference_op(_tensor(arr), name, m, interp, use_v2), arr)
        got = ours_op(arr, name, m, interp, use_v2)
        assert got.shape == arr.shape and got.dtype == np.uint8
        if name == "Contrast" and use_v2 and arr.size % 32:
            # v2 blends with the mean through add_(mean, alpha): fused (one rounding) in ATen's vector
            # loop, but its scalar remainder loop (the last arr.size % 32 elements, in CHW order, on
            # an AVX-512 build; % 16 on AVX2) rounds some of them twice.  Those may differ by 1.
            d = np.abs(got.astype(int) - ref.astype(int))
            tail = np.zeros(arr.size, bool)
            tail[arr.size - arr.size % 32:] = True
            tail = _array(torch.from_numpy(tail.reshape(_tensor(arr).shape[1:]))[None], arr)
            assert d.max() <= 1 and not d[~tail].any(), (m, size, mode)
            n += 1
            continue
        if not np.array_equal(got, ref):
            d = np.abs(got.astype(int) - ref.astype(int))
            pytest.fail(f"{name} v{1 + use_v2} magnitude={m!r} interp={interp.value} size={size} mode={mode}: "
                        f"{int((d > 0).sum())} of {d.size} bytes differ, max {int(d.max())}")
        n += 1
    assert n >= (150 if name in RANDOM else 48), n


def test_tensor_ops_refuse_what_torchvision_refuses():
    arr = _image("astronaut", (31, 200), "RGB")
    with pytest.raises(ValueError, match="interpolation"):   # the tensor kernels have no bicubic
        _C._augment_op(_AUGMIX_OPS["Rotate"][0], 10.0, arr, interp=2)
    for name in ("Brightness", "Color", "Contrast", "Sharpness"):   # a negative factor: torchvision raises too
        with pytest.raises(ValueError, match="negative"):
            _C._augment_op(_AUGMIX_OPS[name][0], -1.5, arr)
        with pytest.raises(ValueError):
            tv_aa._apply_op(_tensor(arr), name, -1.5, interpolation=NEAREST, fill=None)


# ---- whole samples ----------------------------------------------------------------

def _spec(aug, crop=T.CenterCrop(224)):
    spec, rest, desc = compile_transform([crop, aug])
    assert rest is None, desc
    return spec


def _replay(base, plan, aug, use_v2, interp):
    """torchvision's AugMix.forward arithmetic for the plan's weights and chains."""
    t = _tensor(base)
    mix = plan["mix"]
    out = torch.tensor([mix["w0"]], dtype=torch.float32).view(1, 1, 1, 1) * t
    k = 0
    for c, length in enumerate(mix["len"]):
        a = t
        for _ in range(length):
            code, mag = plan["aug"][k]
            k += 1
            a = reference_op(a, NAME_OF[code], mag, interp, use_v2)
        out.add_(torch.tensor([mix["w"][c]], dtype=torch.float32).view(1, 1, 1, 1) * a)
    return _array(out.to(torch.uint8), base)


def _ours(spec, arr, plan):
    out = _C._render(spec, arr, plan)
    return out.transpose(1, 2, 0) if out.ndim == 3 and out.shape[0] in (1, 3) else out


@pytest.mark.parametrize("use_v2,interp", [(False, NEAREST), (False, BILINEAR), (True, BILINEAR), (True, NEAREST)])
def test_augmix_samples_equal_torchvision_for_the_plan(use_v2, interp):
    aug = (v2 if use_v2 else T).AugMix(interpolation=interp)
    spec = _spec(aug)
    pil = photo_image("chelsea", (300, 260))
    arr = np.asarray(pil)
    base = np.asarray(T.CenterCrop(224)(pil))
    for i in range(40):
        plan = _C._plan_sample(spec, 300, 260, seed=5, epoch=0, index=i)
        assert plan["mix"] is not None and len(plan["mix"]["len"]) == 3
        ref = _replay(base, plan, aug, use_v2, interp)
        got = _ours(spec, arr, plan).reshape(ref.shape)
        assert np.array_equal(got, ref), f"sample {i}: {int((got != ref).sum())} bytes differ; plan {plan}"


def _forced_forward(aug, pil, plan, use_v2):
    """The real AugMix.forward with its draws forced to the plan's: the two
    Dirichlet samples, then per chain its depth, and per op its index in the
    augmentation space, its bin and its sign."""
    mix = plan["mix"]
    m1 = np.float32(1.0) - np.float32(mix["w0"])   # any m1 > 0: the chain weights are w / m1 below
    draws = []
    k = 0
    if use_v2:
        names = list(aug._AUGMENTATION_SPACE)
    else:
        names = list(aug._augmentation_space(10, (pil.height, pil.width)))
    for c, length in enumerate(mix["len"]):
        if aug.chain_depth <= 0:
            draws.append(("depth", length))
        for _ in range(length):
            code, mag = plan["aug"][k]
            k += 1
            name = NAME_OF[code]
            draws.append(("op", names.index(name)))
            if use_v2:
                fn, signed = aug._AUGMENTATION_SPACE[name]
                table = fn(10, pil.height, pil.width)
            else:
                table, signed = aug._augmentation_space(10, (pil.height, pil.width))[name]
                table = table if table.ndim else None
            if table is not None:
                vals = [float(v) for v in table.tolist()]
                if use_v2 and name == "Solarize":
                    vals = [255 * v for v in vals]
                draws.append(("bin", vals.index(abs(mag)) if abs(mag) in vals else vals.index(mag)))
                if signed:
                    draws.append(("sign", math.copysign(1.0, mag) < 0))
    queue = list(draws)
    weights = [torch.tensor([[mix["w0"], float(m1)]], dtype=torch.float32),
               torch.tensor([[float(np.float32(w) / m1) for w in mix["w"]]], dtype=torch.float32)]
    orig_randint, orig_rand = torch.randint, torch.rand

    def fake_randint(*args, **kwargs):
        kind, value = queue.pop(0)
        if kind == "depth":
            return torch.tensor([value])
        if kind == "sign":
            return torch.tensor([1 if value else 0])
        return torch.tensor([value]) if not use_v2 else torch.tensor(value)

    def fake_rand(*args, **kwargs):   # v2's sign: torch.rand(()) <= 0.5 negates
        kind, value = queue.pop(0)
        assert kind == "sign"
        return torch.tensor(0.25 if value else 0.75)

    with mock.patch.object(type(aug), "_sample_dirichlet", side_effect=lambda p: weights.pop(0)), \
            mock.patch.object(torch, "randint", side_effect=fake_randint), \
            mock.patch.object(torch, "rand", side_effect=fake_rand):
        out = aug(pil)
    assert not queue and not weights
    del orig_randint, orig_rand
    return np.asarray(out)


@pytest.mark.parametrize("use_v2", [False, True], ids=["v1", "v2"])
def test_forced_augmix_forward_equals_the_native_sample(use_v2):
    """The replay above is AugMix.forward itself: with the draws forced to a
    plan's (the weights recomputed from it in float32), forward's PIL result
    is the native sample, for plans whose chain weights survive the
    w / m1 * m1 round trip exactly."""
    aug = (v2 if use_v2 else T).AugMix(interpolation=BILINEAR)
    spec = _spec(aug)
    pil = photo_image("coffee", (280, 240))
    arr = np.asarray(pil)
    base_pil = T.CenterCrop(224)(pil)
    checked = 0
    for i in range(30):
        plan = _C._plan_sample(spec, 280, 240, seed=9, epoch=0, index=i)
        mix = plan["mix"]
        m1 = np.float32(1.0) - np.float32(mix["w0"])
        if not all(np.float32(np.float32(w) / m1) * m1 == np.float32(w) for w in mix["w"]):
            continue
        got = _ours(spec, arr, plan)
        ref = _forced_forward(aug, base_pil, plan, use_v2)
        assert np.array_equal(got.reshape(ref.shape), ref), f"sample {i}"
        checked += 1
    assert checked >= 5, checked


# ---- the draws ----------------------------------------------------------------------

def test_draws_follow_augmix_distributions():
    aug = T.AugMix(severity=3, alpha=1.0)
    spec = _spec(aug)
    n = 3000
    w0, w, depths, ops, bins, signs = [], [], [], [], [], []
    table = aug._augmentation_space(10, (224, 224))
    names = list(table)
    for i in range(n):
        plan = _C._plan_sample(spec, 300, 260, seed=11, epoch=0, index=i)
        mix = plan["mix"]
        w0.append(mix["w0"])
        w.append(mix["w"])
        depths += mix["len"]
        for code, mag in plan["aug"]:
            name = NAME_OF[code]
            ops.append(names.index(name))
            mags, signed = table[name]
            if mags.ndim:
                vals = [float(v) for v in mags.tolist()[:3]]
                if len(set(vals)) == 3:   # (Posterize's first bins are both 4 bits)
                    bins.append(vals.index(abs(mag)))
                if signed and abs(mag) > 0:
                    signs.append(mag < 0)
    w0 = np.array(w0)
    w = np.array(w)
    # m ~ Dirichlet(1, 1): m[0] uniform on [0, 1] (mean 1/2, variance 1/12)
    assert abs(w0.mean() - 0.5) < 0.02 and abs(w0.var() - 1 / 12) < 0.01
    # the weights sum to 1 (float32 rounding), each chain's share of m[1] Dirichlet(1, 1, 1): mean 1/3
    assert np.allclose(w0 + w.sum(axis=1), 1.0, atol=1e-5)
    share = w / w.sum(axis=1, keepdims=True)
    assert np.allclose(share.mean(axis=0), 1 / 3, atol=0.015)
    # depth uniform in 1..3; op uniform over the space; bin uniform over the severity's 3; sign 1/2
    for values, k in ((np.array(depths) - 1, 3), (np.array(ops), len(names)), (np.array(bins), 3)):
        freq = np.bincount(values, minlength=k) / len(values)
        assert np.all(np.abs(freq - 1 / k) < 0.02), freq
    assert abs(np.mean(signs) - 0.5) < 0.03


def test_fixed_depth_width_and_alpha():
    aug = T.AugMix(severity=10, mixture_width=5, chain_depth=2, alpha=0.3)
    spec = _spec(aug)
    assert spec["policy"]["rounds"] == 5 and spec["policy"]["depth"] == 2
    w0 = []
    for i in range(2000):
        plan = _C._plan_sample(spec, 300, 260, seed=2, epoch=0, index=i)
        assert plan["mix"]["len"] == [2] * 5 and len(plan["aug"]) == 10
        w0.append(plan["mix"]["w0"])
    # Beta(0.3, 0.3): mean 1/2, variance 1 / (4 (2 * 0.3 + 1))
    w0 = np.array(w0)
    assert abs(w0.mean() - 0.5) < 0.03 and abs(w0.var() - 1 / (4 * 1.6)) < 0.02


# ---- recognition ----------------------------------------------------------------------

@pytest.mark.parametrize("mod", [T, v2], ids=["v1", "v2"])
def test_reference_preset_with_augmix_compiles_whole(mod):
    tl = [mod.RandomResizedCrop(224, antialias=True), mod.RandomHorizontalFlip(0.5),
          mod.AugMix(interpolation=BILINEAR), mod.PILToTensor(),
          mod.ToDtype(torch.float, scale=True) if mod is v2 else mod.ConvertImageDtype(torch.float),
          mod.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), mod.RandomErasing(0.1)]
    if mod is v2:
        tl.append(v2.ToPureTensor())
    spec, rest, desc = compile_transform(mod.Compose(tl))
    assert rest is None and desc.endswith("python: nothing"), desc
    assert spec["policy"]["kind"] == "augmix" and spec["erase"]["p"] == 0.1


def test_augmix_settings_it_cannot_run_stay_in_python():
    for aug in (T.AugMix(fill=[128, 128, 128]), T.AugMix(mixture_width=20), v2.AugMix(fill=7)):
        spec, rest, desc = compile_transform([T.CenterCrop(224), aug, T.PILToTensor()])
        assert rest is not None and "AugMix" in desc.split("python")[1], desc
        assert "policy" not in spec


# ---- in the loader ----------------------------------------------------------------------

@pytest.mark.parametrize("mod", [T, v2], ids=["v1", "v2"])
def test_imagefolder_runs_augmix_natively_and_matches_the_replay(tmp_path, mod):
    """The preset's objects, unchanged, through fastloader.ImageFolder and its
    DataLoader: no Python per sample, the same batches for num_workers 0 and
    2, and each sample the replay of its plan through torchvision."""
    import fastloader
    from PIL import Image
    from fastloader.tools.sample import make_sample

    root = tmp_path / "train"
    make_sample(str(root), n=16, classes=2, seed=3, progress=False, processes=1)
    aug = mod.AugMix(interpolation=BILINEAR)
    crop = mod.RandomResizedCrop(64, antialias=True)
    tf = mod.Compose([crop, aug, mod.PILToTensor()])
    ds = fastloader.ImageFolder(str(root), transform=tf)
    assert ds.pipeline_description.endswith("python: nothing"), ds.pipeline_description
    seed = 23
    batches = [list(fastloader.DataLoader(ds, batch_size=8, num_workers=nw, seed=seed)) for nw in (0, 2)]
    for (xa, ya), (xb, yb) in zip(*batches):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    images = torch.cat([x for x, _ in batches[0]])
    for i, (path, _label) in enumerate(ds.samples):
        with Image.open(path) as im:
            im = im.convert("RGB")
        plan = ds.plan(i, im.width, im.height, 0, seed)
        x, y, w, h = plan["box"]
        base = np.asarray(im.crop((x, y, x + w, y + h)).resize((64, 64), Image.Resampling.BILINEAR))
        ref = _replay(base, plan, aug, mod is v2, BILINEAR)
        assert np.array_equal(images[i].permute(1, 2, 0).numpy(), ref), i
