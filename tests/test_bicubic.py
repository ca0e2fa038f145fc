"""Bicubic resampling (spec interp=1; interp=2, timm's "random": bilinear or
bicubic per sample) against Pillow's BICUBIC on photographs.

The reference is what torchvision does on PIL images:
``img.crop(box).resize((w, h), Image.BICUBIC)`` (TF.resized_crop / TF.resize
with InterpolationMode.BICUBIC and antialias, which on PIL images is that
call), then the window (CenterCrop, zero padded) and the flip.  uint8 and
float32 results must be bit-identical at full decode scale, with the AVX2
kernels and the portable ones (FASTLOADER_NO_AVX2=1) alike; bicubic's
negative lobes push sums below 0 and above 255, so the clip is exercised on
every photograph with edges.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from fastloader import _C
from fastloader import transforms as T

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")
pytest.importorskip("skimage.data")
import torchvision.transforms as v1  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402
import torchvision.transforms.v2 as v2  # noqa: E402

from imgutil import photo_image  # noqa: E402

BICUBIC = v2.InterpolationMode.BICUBIC
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
PIL_FILTER = {0: Image.BILINEAR, 1: Image.BICUBIC}


@pytest.fixture(scope="module")
def photos() -> dict[str, Image.Image]:
    """Photographs at varied sizes: landscape, portrait, odd, small, gray."""
    return {
        "land_500x375": photo_image("astronaut", (500, 375)),
        "port_301x447": photo_image("coffee").crop((100, 0, 500, 400)).resize((301, 447), Image.BICUBIC),
        "odd_333x251": photo_image("chelsea").crop((17, 9, 350, 260)),
        "small_97x131": photo_image("rocket", (97, 131)),
        "gray_287x193": photo_image("chelsea").convert("L").resize((287, 193), Image.BICUBIC),
    }


def _chw(pil: Image.Image) -> np.ndarray:
    a = np.asarray(pil)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def _ref(pil, plan, interp=1):
    """PIL's crop -> resize (the plan's filter) -> window (zero fill) -> flip."""
    x, y, w, h = plan["box"]
    out = pil.crop((x, y, x + w, y + h)).resize(tuple(plan["resized"]), PIL_FILTER[interp])
    wx, wy = plan["window"]
    ow, oh = plan["out"]
    if (wx, wy) != (0, 0) or (ow, oh) != out.size:
        out = out.crop((wx, wy, wx + ow, wy + oh))
    return _chw(out.transpose(Image.FLIP_LEFT_RIGHT) if plan["flip"] else out)


# ---------------------------------------------------------------- RandomResizedCrop

@pytest.mark.parametrize("name", ["land_500x375", "port_301x447", "odd_333x251", "small_97x131", "gray_287x193"])
def test_rrc_bicubic_bit_exact(photos, name):
    """Many random RandomResizedCrop plans, downscaling to 224 x 224 and
    upscaling small boxes, against PIL's BICUBIC; RGB, gray and RGB -> L."""
    pil = photos[name]
    a = np.asarray(pil)
    gray = a.ndim == 2
    specs = [dict(geom="rrc", out_h=224, out_w=224, flip_p=0.5, interp=1),                     # mostly down
             dict(geom="rrc", out_h=160, out_w=96, scale_lo=0.005, scale_hi=0.05, flip_p=0.5, interp=1),   # up
             dict(geom="rrc", out_h=37, out_w=53, scale_lo=0.5, scale_hi=1.0, interp=1)]           # strong down
    if not gray:
        specs.append(dict(geom="rrc", out_h=96, out_w=96, out_channels=1, flip_p=0.5, interp=1))
    for spec in specs:
        src = pil.convert("L") if spec.get("out_channels") == 1 else pil
        for i in range(40):
            p = _C._plan_sample(spec, pil.width, pil.height, 21, 3, i)
            assert p["interp"] == 1
            out = _C._render(spec, a, p)
            ref = _ref(src, p)
            if gray and spec.get("out_channels", 3) == 3:
                ref = np.repeat(ref, 3, axis=0)   # ImageFolder's convert("RGB") of a gray image
            assert np.array_equal(out, ref), (name, spec, p, np.abs(out.astype(int) - ref).max())


def test_rrc_through_torchvision_functional(photos):
    """The same samples through TF.resized_crop(..., BICUBIC) + hflip +
    to_tensor + normalize, as v1/v2 RandomResizedCrop(interpolation=BICUBIC)
    compute them: float32, bit for bit."""
    pil = photos["land_500x375"]
    spec = dict(geom="rrc", out_h=224, out_w=224, flip_p=0.5, interp=1, dtype="float32", scale_to_unit=1,
                normalize=True, mean=MEAN, std=STD)
    for i in range(20):
        p = _C._plan_sample(spec, pil.width, pil.height, 4, 0, i)
        x, y, w, h = p["box"]
        ref = TF.resized_crop(pil, y, x, h, w, [224, 224], interpolation=BICUBIC, antialias=True)
        ref = TF.normalize(TF.to_tensor(TF.hflip(ref) if p["flip"] else ref), MEAN, STD)
        assert torch.equal(torch.from_numpy(_C._render(spec, np.asarray(pil), p)), ref), p


def test_plans_do_not_depend_on_the_filter(photos):
    """A fixed filter draws nothing: bilinear and bicubic specs give the same
    boxes and flips (the plans of existing specs are unchanged)."""
    for i in range(50):
        base = dict(geom="rrc", out_h=64, out_w=64, flip_p=0.5)
        p0 = _C._plan_sample(base, 500, 375, 8, 1, i)
        p1 = _C._plan_sample(dict(base, interp=1), 500, 375, 8, 1, i)
        assert p0["interp"] == 0 and p1["interp"] == 1
        p1["interp"] = 0
        assert p0 == p1


# ---------------------------------------------------------------- arbitrary plans

def test_random_plans_match_pil(photos):
    """Random boxes, resized sizes (up and down, 1 pixel, unchanged axes),
    windows partly outside the image, flips, against PIL's BICUBIC; plus
    random fractional views (no reference: memory safety under ASan)."""
    rng = np.random.default_rng(4321)
    for name in ("odd_333x251", "gray_287x193", "small_97x131"):
        pil = photos[name]
        a = np.asarray(pil)
        W, H = pil.size
        spec = dict(geom="none", out_channels=1 if a.ndim == 2 else 3, interp=1)
        for k in range(80):
            bw, bh = int(rng.integers(1, W + 1)), int(rng.integers(1, H + 1))
            bx, by = int(rng.integers(0, W - bw + 1)), int(rng.integers(0, H - bh + 1))
            rw, rh = int(rng.integers(1, 260)), int(rng.integers(1, 260))
            if k % 4 == 1:
                rw = bw            # the horizontal pass is skipped (Pillow skips it too)
            elif k % 4 == 2:
                rh = bh            # the vertical one
            ow, oh = int(rng.integers(1, 160)), int(rng.integers(1, 160))
            wx, wy = int(rng.integers(-40, rw + 10)), int(rng.integers(-40, rh + 10))
            plan = dict(box=(bx, by, bw, bh), resized=(rw, rh), window=(wx, wy), flip=bool(rng.integers(0, 2)),
                        out=(ow, oh))
            np.testing.assert_array_equal(_C._render(spec, a, plan), _ref(pil, plan), err_msg=str(plan))
            s = float(rng.choice([0.125, 0.25, 0.5, 1.0]))
            small = np.ascontiguousarray(a[::int(1 / s), ::int(1 / s)])
            _C._render(spec, small, plan, view_scale=(s, s), view_origin=(float(rng.random()), 0.0))


def test_pass_order_and_edge_cases(photos):
    """Boxes that make Pillow run the vertical pass first, horizontal first
    or one pass only; 1-pixel boxes and outputs; upscales by 50x; the whole
    image at its own size (no pass at all)."""
    pil = photos["land_500x375"]
    a = np.asarray(pil)
    spec = dict(geom="none", interp=1)
    cases = [((10, 5, 258, 317), (224, 224)), ((0, 0, 429, 329), (265, 149)), ((3, 4, 300, 200), (300, 77)),
             ((3, 4, 300, 200), (91, 200)), ((1, 2, 160, 300), (342, 21)), ((50, 60, 200, 100), (200, 100)),
             ((0, 0, 500, 375), (500, 375)), ((7, 9, 1, 1), (5, 3)), ((7, 9, 3, 2), (150, 100)),
             ((0, 0, 500, 375), (1, 1)), ((0, 0, 500, 375), (7, 375)), ((100, 0, 2, 375), (64, 20)),
             ((0, 0, 500, 375), (64, 64)), ((0, 0, 500, 1), (31, 1))]
    for box, rs in cases:
        for flip in (False, True):
            plan = dict(box=box, resized=rs, window=(0, 0), flip=flip, out=rs)
            np.testing.assert_array_equal(_C._render(spec, a, plan), _ref(pil, plan), err_msg=str(plan))


# ---------------------------------------------------------------- Resize (+ CenterCrop) via compile_transform

@pytest.mark.parametrize("name", ["land_500x375", "port_301x447", "odd_333x251", "small_97x131", "gray_287x193"])
@pytest.mark.parametrize("pipe", ["v1_r256_c224", "v2_hw", "v2_max", "v2_up", "v1_pil_code", "ours"])
def test_resize_crop_bicubic_bit_exact(photos, name, pipe):
    pil = photos[name]
    tf = {
        "v1_r256_c224": v1.Compose([v1.Resize(256, interpolation=BICUBIC), v1.CenterCrop(224), v1.PILToTensor()]),
        "v2_hw": v2.Compose([v2.Resize((150, 211), interpolation=BICUBIC), v2.PILToTensor()]),
        "v2_max": v2.Compose([v2.Resize(120, interpolation=BICUBIC, max_size=150), v2.CenterCrop((110, 140)),
                              v2.PILToTensor()]),
        "v2_up": v2.Compose([v2.Resize(640, interpolation=BICUBIC), v2.CenterCrop(600), v2.PILToTensor()]),
        "v1_pil_code": v1.Compose([v1.Resize(100, interpolation=Image.BICUBIC), v1.CenterCrop(96),
                                   v1.PILToTensor()]),
        "ours": T.Compose([T.Resize(144, interpolation="bicubic"), T.CenterCrop(128), T.PILToTensor()]),
    }[pipe]
    spec, rest, _ = T.compile_transform(tf)
    assert rest is None and spec["dtype"] == "uint8" and spec["interp"] == 1
    out = _C._render(spec, np.asarray(pil))
    ref = np.asarray(tf(pil))
    if ref.shape[0] == 1 and out.shape[0] == 3:
        ref = np.repeat(ref, 3, axis=0)
    np.testing.assert_array_equal(out, ref)


def test_eval_float32_bit_exact(photos):
    """timm's / torchvision's evaluation pipeline with BICUBIC, float32."""
    pil = photos["port_301x447"]
    for tf in (v1.Compose([v1.Resize(256, interpolation=BICUBIC), v1.CenterCrop(224), v1.ToTensor(),
                           v1.Normalize(MEAN, STD)]),
               v2.Compose([v2.Resize(235, interpolation=BICUBIC), v2.CenterCrop(224), v2.ToImage(),
                           v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])):
        spec, rest, _ = T.compile_transform(tf)
        assert rest is None and spec["interp"] == 1
        ref = tf(pil).as_subclass(torch.Tensor)
        assert torch.equal(torch.from_numpy(_C._render(spec, np.asarray(pil))), ref)


# ---------------------------------------------------------------- compile_transform

def test_compile_accepts_bicubic_everywhere():
    rrc = dict(geom="rrc", out_h=224, out_w=224, scale_lo=0.08, scale_hi=1.0, ratio_lo=0.75, ratio_hi=4.0 / 3.0)
    for t in (v2.RandomResizedCrop(224, interpolation=BICUBIC), v1.RandomResizedCrop(224, interpolation=BICUBIC),
              v1.RandomResizedCrop(224, interpolation=Image.BICUBIC), v2.RandomResizedCrop(224, interpolation=3),
              T.RandomResizedCrop(224, interpolation="bicubic"), T.RandomResizedCrop(224, interpolation=BICUBIC),
              T.RandomResizedCrop(224, interpolation=Image.BICUBIC)):
        spec, rest, _ = T.compile_transform(t)
        assert rest is None and {k: spec[k] for k in rrc} == rrc and spec["interp"] == 1, t
    for t in (v2.RandomResizedCrop(224), T.RandomResizedCrop(224), v1.Resize(64),
              v2.Resize(64, interpolation=Image.BILINEAR)):
        spec, _, _ = T.compile_transform(t)
        assert "interp" not in spec   # the default stays out of the spec
    for t in (v1.Resize(64, interpolation=BICUBIC), v2.Resize([64], interpolation=BICUBIC),
              v2.Resize((64, 80), interpolation=BICUBIC), v2.Resize(None, max_size=90, interpolation=BICUBIC),
              T.Resize(64, interpolation="bicubic")):
        spec, rest, _ = T.compile_transform(t)
        assert spec["geom"] == "resize_crop" and spec["interp"] == 1 and rest is None, t


def test_our_classes_run_torchvision_with_their_filter(photos):
    """Calling fastloader's own classes runs torchvision's equivalent, with
    the interpolation they were given."""
    pil = photos["odd_333x251"]
    ours = T.Compose([T.Resize(120, interpolation="bicubic"), T.CenterCrop(100), T.PILToTensor()])
    ref = v2.Compose([v2.Resize(120, interpolation=BICUBIC), v2.CenterCrop(100), v2.PILToTensor()])
    assert torch.equal(ours(pil), ref(pil))
    assert "bicubic" in repr(T.RandomResizedCrop(224, interpolation="bicubic"))
    assert "interpolation" not in repr(T.RandomResizedCrop(224))


def test_spec_and_plan_validation():
    with pytest.raises(ValueError, match="interp"):
        _C._plan_sample(dict(geom="rrc", out_h=8, out_w=8, interp=3), 20, 20)
    with pytest.raises(ValueError, match="interp"):
        _C._plan_sample(dict(geom="rrc", out_h=8, out_w=8, interp=-1), 20, 20)
    with pytest.raises(TypeError, match="interp"):
        _C._plan_sample(dict(geom="rrc", out_h=8, out_w=8, interp="bicubic"), 20, 20)
    a = np.zeros((20, 20, 3), np.uint8)
    plan = dict(box=(0, 0, 20, 20), resized=(8, 8), window=(0, 0), flip=False, out=(8, 8))
    with pytest.raises(ValueError, match="interp"):   # a random spec needs the sample's draw
        _C._render(dict(geom="none", interp=2), a, plan)
    with pytest.raises(ValueError, match="interp"):
        _C._render(dict(geom="none", interp=2), a, dict(plan, interp=2))
    # a fixed filter: the spec's, whatever the plan says
    np.testing.assert_array_equal(_C._render(dict(geom="none", interp=1), a, dict(plan, interp=0)),
                                  _C._render(dict(geom="none", interp=1), a, plan))


# ---------------------------------------------------------------- interp=2: random per sample

def test_random_filter_per_sample(photos):
    """interp=2 draws bilinear or bicubic per sample (1/2 each), after the
    crop box (the boxes are those of a fixed filter) and before the flip;
    each sample renders as PIL does with its draw."""
    pil = photos["land_500x375"]
    a = np.asarray(pil)
    spec = dict(geom="rrc", out_h=96, out_w=96, flip_p=0.5, interp=2)
    n, counts = 400, [0, 0]
    for i in range(n):
        p = _C._plan_sample(spec, 500, 375, 6, 2, i)
        counts[p["interp"]] += 1
        assert p["box"] == _C._plan_sample(dict(spec, interp=1), 500, 375, 6, 2, i)["box"]
        assert _C._plan_sample(spec, 500, 375, 6, 2, i) == p   # keyed, deterministic
        if i < 60:
            np.testing.assert_array_equal(_C._render(spec, a, p), _ref(pil, p, p["interp"]), err_msg=str(p))
            np.testing.assert_array_equal(_C._render(spec, a, None, 6, 2, i), _C._render(spec, a, p))
    assert abs(counts[1] - n / 2) < 4 * math.sqrt(n / 4), counts   # 4 sigma
    flips = [_C._plan_sample(spec, 500, 375, 6, 2, i)["flip"] for i in range(n)]
    assert abs(sum(flips) - n / 2) < 4 * math.sqrt(n / 4)


def test_timm_random_resized_crop_and_interpolation():
    timm_tf = pytest.importorskip("timm.data.transforms")
    R = timm_tf.RandomResizedCropAndInterpolation
    for interp, code in (("bilinear", None), ("bicubic", 1), ("random", 2)):
        spec, rest, _ = T.compile_transform(R(224, interpolation=interp))
        assert rest is None and spec["geom"] == "rrc" and spec.get("interp") == code, interp
    # a mode the native resample lacks stays in Python
    spec, rest, _ = T.compile_transform(R(224, interpolation="lanczos"))
    assert spec["geom"] == "none" and rest is not None


# ---------------------------------------------------------------- region decode

def _axis_window(b0, n, rs, o0, o1, support1):
    """resample.c's read span (Pillow's precompute_coeffs bounds) of outputs
    [o0, o1) of a box [b0, b0 + n) resized to rs, filter support support1."""
    if rs == n:
        return b0 + o0, b0 + o1
    scale = n / rs
    support = support1 * max(scale, 1.0)
    ks = math.ceil(support) * 2 + 1

    def bounds(xx):
        c = (xx + 0.5) * scale
        xmin = max(int(c - support + 0.5), 0)
        return xmin, min(max(min(int(c + support + 0.5), n) - xmin, 0), ks)

    xmin0, _ = bounds(o0)
    xmin1, n1 = bounds(o1 - 1)
    return b0 + xmin0, b0 + max(xmin1 + n1, xmin0)


def _window(spec, plan, support1):
    bx, by, bw, bh = plan["box"]
    rw, rh = plan["resized"]
    ow, oh = (spec["out_w"], spec["out_h"]) if spec.get("out_w") else plan["out"]
    wx, wy = plan["window"]
    x0, x1 = _axis_window(bx, bw, rw, max(wx, 0), min(wx + ow, rw), support1)
    y0, y1 = _axis_window(by, bh, rh, max(wy, 0), min(wy + oh, rh), support1)
    return x0, y0, x1, y1


def test_region_view_renders_bit_identically(photos):
    """A view holding only the bicubic read window (support 2) renders as the
    whole image; the bilinear window (support 1) is too small for bicubic
    whenever it is narrower, and the render then differs (the fallback clips
    the filter at the view), so the wider window is what makes it exact.
    (tests/test_transforms.py::test_source_window_renders_bit_identically
    covers more specs with both filters.)"""
    smaller = differs = 0
    for name in ("land_500x375", "port_301x447", "gray_287x193"):
        pil = photos[name]
        a = np.asarray(pil)
        W, H = pil.size
        for spec in (dict(geom="resize_crop", resize_short=256, crop_h=224, crop_w=224, out_h=224, out_w=224,
                          interp=1),
                     dict(geom="resize_crop", resize_short=64, crop_h=40, crop_w=48, out_h=40, out_w=48, interp=1),
                     dict(geom="resize_crop", resize_short=700, crop_h=96, crop_w=96, out_h=96, out_w=96, interp=1,
                          flip_p=0.5)):
            for i in range(4):
                plan = _C._plan_sample(spec, W, H, 2, 0, i)
                full = _C._render(spec, a, plan)
                for support1 in (2.0, 1.0):
                    x0, y0, x1, y1 = _window(spec, plan, support1)
                    assert 0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H
                    sub = np.ascontiguousarray(a[y0:y1, x0:x1])
                    got = _C._render(spec, sub, plan, view_origin=(float(x0), float(y0)))
                    if support1 == 2.0:
                        np.testing.assert_array_equal(got, full, err_msg=str((spec, plan)))
                        wide = (x0, y0, x1, y1)
                    elif (x0, y0, x1, y1) != wide:
                        smaller += 1
                        differs += not np.array_equal(got, full)
    assert smaller > 10 and differs == smaller


# ---------------------------------------------------------------- kernels

_KERNEL_SCRIPT = r"""
import hashlib, sys
import numpy as np
from PIL import Image
from fastloader import _C
sys.path.insert(0, sys.argv[1])
from imgutil import photo_image
rng = np.random.default_rng(11)
pil = photo_image("coffee", (331, 217))
img = np.asarray(pil)
gray = np.ascontiguousarray(img[:, :, 1])
noise = rng.integers(0, 256, (173, 211, 3), dtype=np.uint8)   # worst case for the clip: every edge
h = hashlib.sha256()
bad = 0
for a, ch in ((img, 3), (img, 1), (gray, 3), (gray, 1), (noise, 3)):
    for spec in (dict(geom="rrc", out_h=64, out_w=80, flip_p=0.5, out_channels=ch, scale_lo=0.02, interp=1),
                 dict(geom="rrc", out_h=224, out_w=224, flip_p=0.5, out_channels=ch, interp=2),
                 dict(geom="resize_crop", resize_short=96, crop_h=88, crop_w=100, out_h=88, out_w=100,
                      out_channels=ch, flip_p=0.5, dtype="float32", layout="HWC", interp=1),
                 dict(geom="resize_crop", resize_h=30, resize_w=300, out_channels=ch, interp=1)):
        for i in range(25):
            h.update(_C._render(spec, a, None, 9, 0, i).tobytes())
    src = Image.fromarray(a if ch == 3 or a.ndim == 2 else np.ascontiguousarray(a[:, :, 0]))
    if a.ndim == 3 and ch == 1:
        src = Image.fromarray(a).convert("L")
    for i in range(60):
        W, H = a.shape[1], a.shape[0]
        bw, bh = int(rng.integers(1, W + 1)), int(rng.integers(1, H + 1))
        bx, by = int(rng.integers(0, W - bw + 1)), int(rng.integers(0, H - bh + 1))
        rw, rh = int(rng.integers(1, 400)), int(rng.integers(1, 400))
        if i % 5 == 0:
            rw = max(1, bw // int(rng.integers(2, 9)))   # wide downscales: many taps
        plan = dict(box=(bx, by, bw, bh), resized=(rw, rh), window=(0, 0), flip=bool(i & 1), out=(rw, rh))
        out = _C._render(dict(geom="none", out_channels=ch, interp=1), a, plan)
        h.update(out.tobytes())
        ref = src.crop((bx, by, bx + bw, by + bh)).resize((rw, rh), Image.BICUBIC)
        if plan["flip"]:
            ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
        ref = np.asarray(ref)
        ref = ref[None] if ref.ndim == 2 else ref.transpose(2, 0, 1)
        if ref.shape[0] != out.shape[0]:
            ref = np.repeat(ref, out.shape[0], axis=0)
        bad += not np.array_equal(out, ref)
print(bad, h.hexdigest())
"""


def test_portable_kernels_match_simd_and_pillow():
    """The portable C kernels (forced with FASTLOADER_NO_AVX2=1) and the AVX2
    kernels give the same bytes with bicubic weights, negative ones
    included, and both equal Pillow: widths that are not multiples of the
    vector size, 1 and 3 channels, flips, vertical-first order, wide
    downscales (more taps than the AVX2 table's window), noise."""
    here = os.path.dirname(os.path.abspath(__file__))

    def run(env_extra):
        env = dict(os.environ, **env_extra)
        out = subprocess.run([sys.executable, "-c", _KERNEL_SCRIPT, here], env=env, check=True,
                             capture_output=True, text=True).stdout.split()
        return int(out[0]), out[1]

    portable, simd = run({"FASTLOADER_NO_AVX2": "1"}), run({"FASTLOADER_NO_AVX2": "0"})
    assert portable[0] == 0 and simd[0] == 0, (portable, simd)
    assert portable[1] == simd[1]


# ---------------------------------------------------------------- ImageFolder end to end

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from fastloader.tools.sample import make_sample
    root = tmp_path_factory.mktemp("bicubic_imgs") / "train"
    make_sample(str(root), n=32, classes=4, seed=5, progress=False, processes=1)
    return str(root)


def test_imagefolder_train_bicubic_equals_torchvision(folder):
    """torchvision's RandomResizedCrop(interpolation=BICUBIC) + flip +
    ToTensor + Normalize through fastloader.ImageFolder (region decode of
    the crop box): each sample equals TF.resized_crop(..., BICUBIC) of the
    PIL image with that sample's plan."""
    import fastloader
    tf = v1.Compose([v1.RandomResizedCrop(160, interpolation=BICUBIC), v1.RandomHorizontalFlip(), v1.ToTensor(),
                     v1.Normalize(MEAN, STD)])
    ds = fastloader.ImageFolder(folder, transform=tf)
    seed, epoch = 13, 0
    images, labels = next(iter(fastloader.DataLoader(ds, batch_size=32, num_workers=2, seed=seed)))
    for i, (path, label) in enumerate(ds.samples):
        with Image.open(path) as im:
            im = im.convert("RGB")
        p = ds.plan(i, im.width, im.height, epoch, seed)
        assert p["interp"] == 1
        x, y, w, h = p["box"]
        out = TF.resized_crop(im, y, x, h, w, [160, 160], interpolation=BICUBIC)
        ref = TF.normalize(TF.to_tensor(TF.hflip(out) if p["flip"] else out), MEAN, STD)
        assert int(labels[i]) == label
        assert torch.equal(images[i], ref), (i, p)


def test_imagefolder_eval_bicubic_equals_torchvision(folder):
    """Resize(256, BICUBIC) + CenterCrop(224): fastloader decodes only
    fl_plan_source_window's rectangle (the bicubic taps of the centre crop)
    and equals torchvision's ImageFolder bit for bit."""
    import fastloader
    tf = v1.Compose([v1.Resize(256, interpolation=BICUBIC), v1.CenterCrop(224), v1.ToTensor(),
                     v1.Normalize(MEAN, STD)])
    ours = list(fastloader.DataLoader(fastloader.ImageFolder(folder, transform=tf), batch_size=16, num_workers=2))
    ref = list(torch.utils.data.DataLoader(tv.datasets.ImageFolder(folder, transform=tf), batch_size=16))
    assert len(ours) == len(ref) == 2
    for (xa, ya), (xb, yb) in zip(ours, ref):
        assert torch.equal(ya, yb)
        assert torch.equal(xa, xb), (xa - xb).abs().max()


def test_imagefolder_timm_random_interpolation(folder):
    """timm's RandomResizedCropAndInterpolation(interpolation="random") runs
    natively; each sample is resized with its plan's filter."""
    timm_tf = pytest.importorskip("timm.data.transforms")
    import fastloader
    tf = v1.Compose([timm_tf.RandomResizedCropAndInterpolation(96, interpolation="random"),
                     v1.RandomHorizontalFlip(), v1.ToTensor()])
    ds = fastloader.ImageFolder(folder, transform=tf)
    assert "python: nothing" in ds.pipeline_description
    seed = 3
    images, _ = next(iter(fastloader.DataLoader(ds, batch_size=32, num_workers=2, seed=seed)))
    seen = set()
    for i, (path, _) in enumerate(ds.samples):
        with Image.open(path) as im:
            im = im.convert("RGB")
        p = ds.plan(i, im.width, im.height, 0, seed)
        seen.add(p["interp"])
        x, y, w, h = p["box"]
        mode = (v2.InterpolationMode.BILINEAR, BICUBIC)[p["interp"]]
        out = TF.resized_crop(im, y, x, h, w, [96, 96], interpolation=mode)
        ref = TF.to_tensor(TF.hflip(out) if p["flip"] else out)
        assert torch.equal(images[i], ref), (i, p)
    assert seen == {0, 1}
