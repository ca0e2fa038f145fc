"""Native transforms (csrc/image/imgops.h and its units, csrc/binding/py_transform.c, fastloader/transforms.py)
against PIL / torchvision on real photos.

The reference is what torchvision does on PIL images (ImageFolder loads PIL
RGB): crop + resize with Pillow's BILINEAR (antialiased) filter, CenterCrop
with zero padding, ToTensor / ToDtype, Normalize.  uint8 and float32 results
must be bit-identical at full decode scale.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from fastloader import _C
from fastloader import transforms as T

tv = pytest.importorskip("torchvision")
import torchvision.transforms as v1  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402
import torchvision.transforms.v2 as v2  # noqa: E402

skdata = pytest.importorskip("skimage.data")

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


# ---------------------------------------------------------------- test images

@pytest.fixture(scope="module")
def photos() -> dict[str, Image.Image]:
    """Real photos at varied sizes: landscape, portrait, odd, small, gray."""
    astro = Image.fromarray(skdata.astronaut())            # 512 x 512
    cat = Image.fromarray(skdata.chelsea())                # 451 x 300
    coffee = Image.fromarray(skdata.coffee())              # 600 x 400
    return {
        "land_500x375": astro.resize((500, 375), Image.BILINEAR),
        "port_301x447": coffee.crop((100, 0, 500, 400)).resize((301, 447), Image.BILINEAR),
        "odd_333x251": cat.crop((17, 9, 350, 260)),
        "small_97x131": coffee.resize((97, 131), Image.BILINEAR),
        "gray_287x193": cat.convert("L").resize((287, 193), Image.BILINEAR),
    }


def _chw(pil: Image.Image) -> np.ndarray:
    a = np.asarray(pil)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def _rgb_array(pil: Image.Image) -> np.ndarray:
    return np.asarray(pil.convert("RGB"))


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _ref_rrc(pil, plan, size):
    """torchvision's resized_crop on PIL (crop, then resize), then the flip."""
    x, y, w, h = plan["box"]
    out = TF.resized_crop(pil, y, x, h, w, list(size), antialias=True)
    return TF.hflip(out) if plan["flip"] else out


RRC = dict(geom="rrc", out_h=224, out_w=224, flip_p=0.5)


# ---------------------------------------------------------------- planning

def test_plan_is_deterministic_and_keyed():
    a = [_C._plan_sample(RRC, 500, 375, 7, 3, i) for i in range(50)]
    b = [_C._plan_sample(RRC, 500, 375, 7, 3, i) for i in range(50)]
    assert a == b
    other_epoch = [_C._plan_sample(RRC, 500, 375, 7, 4, i) for i in range(50)]
    other_seed = [_C._plan_sample(RRC, 500, 375, 8, 3, i) for i in range(50)]
    assert sum(p != q for p, q in zip(a, other_epoch)) > 45
    assert sum(p != q for p, q in zip(a, other_seed)) > 45
    assert len({p["box"] for p in a}) > 45


@pytest.mark.parametrize("W,H", [(500, 375), (97, 131), (1000, 40)])
def test_rrc_distribution_matches_torchvision(W, H):
    n = 3000
    ours = [_C._plan_sample(RRC, W, H, 1, 0, i) for i in range(n)]
    for p in ours:
        x, y, w, h = p["box"]
        assert 0 < w <= W and 0 < h <= H and 0 <= x <= W - w and 0 <= y <= H - h
        assert p["resized"] == (224, 224) and p["window"] == (0, 0)
    torch.manual_seed(0)
    dummy = torch.empty(1, H, W)
    ref = [v1.RandomResizedCrop.get_params(dummy, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(n)]
    area = lambda ws, hs: np.mean(np.asarray(ws) * np.asarray(hs)) / (W * H)  # noqa: E731
    o_w = [p["box"][2] for p in ours]
    o_h = [p["box"][3] for p in ours]
    r_w = [r[3] for r in ref]
    r_h = [r[2] for r in ref]
    assert abs(area(o_w, o_h) - area(r_w, r_h)) < 0.03
    assert abs(np.mean(np.log(np.divide(o_w, o_h))) - np.mean(np.log(np.divide(r_w, r_h)))) < 0.03
    # centre of the box: uniform placement
    o_cx = np.mean([(p["box"][0] + p["box"][2] / 2) / W for p in ours])
    r_cx = np.mean([(r[1] + r[3] / 2) / W for r in ref])
    assert abs(o_cx - r_cx) < 0.02
    flips = np.mean([p["flip"] for p in ours])
    assert abs(flips - 0.5) < 0.04


def test_rrc_fallback_is_torchvision_central_crop():
    spec = dict(geom="rrc", out_h=64, out_w=64, ratio_lo=10.0, ratio_hi=20.0)
    W, H = 200, 180
    # torchvision fallback for in_ratio < min(ratio): w = W, h = round(W / 10)
    fallback = (0, (H - 20) // 2, 200, 20)
    boxes = [_C._plan_sample(spec, W, H, 0, 0, i)["box"] for i in range(300)]
    hits = sum(b == fallback for b in boxes)
    assert hits > 150, hits
    torch.manual_seed(0)
    ref = [v1.RandomResizedCrop.get_params(torch.empty(1, H, W), [0.08, 1.0], [10.0, 20.0]) for _ in range(300)]
    ref_hits = sum((r[1], r[0], r[3], r[2]) == fallback for r in ref)
    assert abs(hits - ref_hits) < 45
    # in_ratio > max(ratio): h = H, w = round(H * max)
    spec2 = dict(geom="rrc", out_h=64, out_w=64, ratio_lo=0.05, ratio_hi=0.1)
    b = [_C._plan_sample(spec2, 300, 100, 0, 0, i)["box"] for i in range(200)]
    assert (145, 0, 10, 100) in b


@pytest.mark.parametrize("size,max_size", [(256, None), (224, None), (100, 300), ([200], 210), ((120, 90), None)])
@pytest.mark.parametrize("W,H", [(500, 375), (301, 447), (97, 131), (256, 256), (333, 251)])
def test_resize_plan_matches_torchvision(size, max_size, W, H):
    spec, _, _ = T.compile_transform(v2.Resize(size, max_size=max_size))
    p = _C._plan_sample(spec, W, H)
    rh, rw = v2.functional._geometry._compute_resized_output_size((H, W), size=size if not isinstance(size, int) else [size], max_size=max_size)
    assert p["resized"] == (rw, rh)
    assert p["box"] == (0, 0, W, H)


@pytest.mark.parametrize("crop", [(224, 224), (100, 57), (400, 300), (131, 500)])
def test_center_crop_window_matches_torchvision(photos, crop):
    pil = photos["small_97x131"].resize((181, 143), Image.BILINEAR)
    spec = dict(geom="resize_crop", crop_h=crop[0], crop_w=crop[1], out_h=crop[0], out_w=crop[1])
    out = _C._render(spec, np.asarray(pil))
    ref = _chw(TF.center_crop(pil, list(crop)))
    assert out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)   # incl. zero padding where the crop is larger


# ---------------------------------------------------------------- rendering, uint8

@pytest.mark.parametrize("name", ["land_500x375", "port_301x447", "odd_333x251", "small_97x131"])
def test_rrc_uint8_bit_exact(photos, name):
    pil = photos[name]
    a = np.asarray(pil)
    for i in range(40):
        p = _C._plan_sample(RRC, pil.width, pil.height, 123, 0, i)
        out = _C._render(RRC, a, p)
        ref = _chw(_ref_rrc(pil, p, (224, 224)))
        assert np.array_equal(out, ref), (name, p, np.abs(out.astype(int) - ref).max())


def test_rrc_nonsquare_and_upscale(photos):
    pil = photos["small_97x131"]
    spec = dict(geom="rrc", out_h=300, out_w=160, scale_lo=0.02, scale_hi=0.5)
    for i in range(20):
        p = _C._plan_sample(spec, pil.width, pil.height, 5, 1, i)
        out = _C._render(spec, np.asarray(pil), p)
        np.testing.assert_array_equal(out, _chw(_ref_rrc(pil, p, (300, 160))))


@pytest.mark.parametrize("name", ["land_500x375", "port_301x447", "odd_333x251", "small_97x131"])
@pytest.mark.parametrize("pipe", ["r256_c224", "r_hw", "r_max", "r_up"])
def test_resize_crop_uint8_bit_exact(photos, name, pipe):
    pil = photos[name]
    tf = {
        "r256_c224": v1.Compose([v1.Resize(256), v1.CenterCrop(224), v1.PILToTensor()]),
        "r_hw": v2.Compose([v2.Resize((150, 211)), v2.PILToTensor()]),
        "r_max": v2.Compose([v2.Resize(120, max_size=150), v2.CenterCrop((110, 140)), v2.PILToTensor()]),
        "r_up": v2.Compose([v2.Resize(640), v2.CenterCrop(600), v2.PILToTensor()]),
    }[pipe]
    spec, rest, _ = T.compile_transform(tf)
    assert rest is None and spec["dtype"] == "uint8"
    out = _C._render(spec, np.asarray(pil))
    ref = tf(pil).numpy()
    np.testing.assert_array_equal(out, ref)


def test_flip_and_pass_order_cases(photos):
    """Boxes that make Pillow run the vertical pass first (height shrinks by
    more than twice the width's shrink), horizontal first, or one pass only."""
    pil = photos["land_500x375"]
    a = np.asarray(pil)
    spec = dict(geom="none", flip_p=0.0)
    for box, rs in [((10, 5, 258, 317), (224, 224)), ((0, 0, 429, 329), (265, 149)),
                    ((3, 4, 300, 200), (300, 77)), ((3, 4, 300, 200), (91, 200)),
                    ((1, 2, 160, 300), (342, 21)), ((50, 60, 200, 100), (200, 100))]:
        for flip in (False, True):
            plan = dict(box=box, resized=rs, window=(0, 0), flip=flip, out=rs)
            out = _C._render(spec, a, plan)
            x, y, w, h = box
            ref = pil.crop((x, y, x + w, y + h)).resize(rs, Image.BILINEAR)
            if flip:
                ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
            np.testing.assert_array_equal(out, _chw(ref))


def test_gray_source_and_gray_output(photos):
    gray = photos["gray_287x193"]
    rgb = photos["odd_333x251"]
    # gray JPEG, 3 channels out: ImageFolder converts to RGB (replicated)
    for i in range(10):
        p = _C._plan_sample(RRC, gray.width, gray.height, 0, 0, i)
        out = _C._render(RRC, np.asarray(gray), p)
        np.testing.assert_array_equal(out, _chw(_ref_rrc(gray.convert("RGB"), p, (224, 224))))
        out2 = _C._render(RRC, np.asarray(gray)[:, :, None], p)
        np.testing.assert_array_equal(out2, out)
    # RGB source, 1 channel out: Grayscale first (convert("L")), then the geometry
    tf = v2.Compose([v2.Grayscale(1), v2.Resize(100), v2.CenterCrop(90), v2.PILToTensor()])
    spec, rest, _ = T.compile_transform(tf)
    assert rest is None and spec["out_channels"] == 1
    np.testing.assert_array_equal(_C._render(spec, np.asarray(rgb)), tf(rgb).numpy())
    spec1 = dict(RRC, out_channels=1)
    for i in range(10):
        p = _C._plan_sample(spec1, rgb.width, rgb.height, 0, 0, i)
        out = _C._render(spec1, np.asarray(rgb), p)
        np.testing.assert_array_equal(out, _chw(_ref_rrc(rgb.convert("L"), p, (224, 224))))


# ---------------------------------------------------------------- dtypes and layout

def test_float32_totensor_normalize_bit_exact(photos):
    pil = photos["land_500x375"]
    tf = v1.Compose([v1.Resize(256), v1.CenterCrop(224), v1.ToTensor(), v1.Normalize(MEAN, STD)])
    spec, rest, _ = T.compile_transform(tf)
    assert rest is None
    out = _C._render(spec, np.asarray(pil))
    ref = tf(pil)
    assert out.dtype == np.float32
    assert torch.equal(torch.from_numpy(out), ref)
    # RRC path: same sample through torchvision's functional API
    spec = dict(RRC, dtype="float32", scale_to_unit=1, normalize=True, mean=MEAN, std=STD)
    for i in range(10):
        p = _C._plan_sample(spec, pil.width, pil.height, 9, 0, i)
        ref = TF.normalize(TF.to_tensor(_ref_rrc(pil, p, (224, 224))), MEAN, STD)
        assert torch.equal(torch.from_numpy(_C._render(spec, np.asarray(pil), p)), ref)


def test_float32_v2_todtype_scale_bit_exact(photos):
    pil = photos["odd_333x251"]
    tf = v2.Compose([v2.Resize(128), v2.CenterCrop(112), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                     v2.Normalize(MEAN, STD)])
    spec, rest, _ = T.compile_transform(tf)
    assert rest is None and spec["scale_to_unit"] == 2
    assert torch.equal(torch.from_numpy(_C._render(spec, np.asarray(pil))), tf(pil).as_subclass(torch.Tensor))
    # unnormalised, unscaled float
    tf = v2.Compose([v2.CenterCrop(64), v2.ToImage(), v2.ToDtype(torch.float32)])
    spec, rest, _ = T.compile_transform(tf)
    assert torch.equal(torch.from_numpy(_C._render(spec, np.asarray(pil))), tf(pil).as_subclass(torch.Tensor))


def test_all_256_values_through_the_table():
    """Every uint8 value, every channel: float32 / float16 / bfloat16 vs torch."""
    img = np.arange(256, dtype=np.uint8).reshape(16, 16)
    img = np.stack([img, img[::-1], img.T], axis=2)
    ref32 = v1.Normalize(MEAN, STD)(v1.ToTensor()(img))
    base = dict(geom="none", scale_to_unit=1, normalize=True, mean=MEAN, std=STD)
    out32 = _C._render(dict(base, dtype="float32"), img)
    assert torch.equal(torch.from_numpy(out32), ref32)
    out16 = _C._render(dict(base, dtype="float16"), img)
    assert out16.dtype == np.float16
    assert torch.equal(torch.from_numpy(out16), ref32.to(torch.float16))
    outbf = _C._render(dict(base, dtype="bfloat16"), img)
    assert outbf.dtype == np.uint16
    assert torch.equal(torch.from_numpy(outbf.view(np.int16)), ref32.to(torch.bfloat16).view(torch.int16))
    # unnormalised 0..255 floats in half precision, and tiny values (subnormal halves)
    raw = _C._render(dict(geom="none", dtype="float16"), img)
    assert torch.equal(torch.from_numpy(raw), torch.from_numpy(img.transpose(2, 0, 1).copy()).to(torch.float16))
    tiny = dict(base, mean=[0.0] * 3, std=[3.0e3, 4.1e4, 6.5e4], dtype="float16")
    ref_tiny = v1.Normalize([0.0] * 3, tiny["std"])(v1.ToTensor()(img)).to(torch.float16)
    assert torch.equal(torch.from_numpy(_C._render(tiny, img)), ref_tiny)


def test_hwc_equals_chw(photos):
    pil = photos["port_301x447"]
    for dtype in ("uint8", "float32", "float16", "bfloat16"):
        spec = dict(RRC, dtype=dtype, scale_to_unit=1 if dtype != "uint8" else 0,
                    normalize=dtype != "uint8", mean=MEAN, std=STD)
        for i in range(3):
            chw = _C._render(dict(spec, layout="CHW"), np.asarray(pil), None, 1, 2, i)
            hwc = _C._render(dict(spec, layout="HWC"), np.asarray(pil), None, 1, 2, i)
            assert hwc.shape == (224, 224, 3) and chw.shape == (3, 224, 224)
            np.testing.assert_array_equal(hwc, chw.transpose(1, 2, 0))
    g = _C._render(dict(RRC, out_channels=1, layout="HWC"), np.asarray(pil), None, 0, 0, 0)
    assert g.shape == (224, 224, 1)


def test_scaled_view_is_close(photos):
    """A DCT-scaled decode (here: PIL's 2x reduce) mapped into the same plan."""
    pil = photos["land_500x375"].crop((0, 0, 500, 374))
    half = pil.reduce(2)                       # 250 x 187, scale 0.5
    spec = dict(geom="rrc", out_h=96, out_w=96)
    worst = 99.0
    for i in range(10):
        p = _C._plan_sample(spec, pil.width, pil.height, 0, 0, i)
        full = _C._render(spec, np.asarray(pil), p)
        scaled = _C._render(spec, np.asarray(half), p, view_scale=(0.5, 0.5))
        worst = min(worst, _psnr(full, scaled))
    assert worst > 28, worst
    # region decode: origin shifts the buffer; an exact sub-buffer gives exact output
    p = dict(box=(100, 80, 200, 150), resized=(96, 96), window=(0, 0), flip=False)
    a = np.asarray(pil)
    sub = np.ascontiguousarray(a[70:300, 90:400])
    np.testing.assert_array_equal(_C._render(spec, sub, p, view_origin=(90.0, 70.0)), _C._render(spec, a, p))


# ---------------------------------------------------------------- errors

def test_spec_validation_names_the_key():
    img = np.zeros((10, 10, 3), np.uint8)
    with pytest.raises(ValueError, match="geom"):
        _C._render(dict(geom="rotate"), img)
    with pytest.raises(ValueError, match="unknown key 'sizee'"):
        _C._render(dict(geom="none", sizee=3), img)
    with pytest.raises(ValueError, match="normalize"):
        _C._render(dict(geom="none", normalize=True, mean=MEAN, std=STD), img)
    with pytest.raises(ValueError, match="std"):
        _C._render(dict(geom="none", dtype="float32", mean=MEAN, std=[1, 0, 1]), img)
    with pytest.raises(ValueError, match="max_size"):
        _C._plan_sample(dict(geom="resize_crop", resize_short=256, max_size=200), 10, 10)
    with pytest.raises(ValueError, match="source size"):
        _C._plan_sample(RRC, 0, 10)
    with pytest.raises(ValueError, match="batch"):
        _C._plan_sample(dict(geom="resize_crop", resize_short=32, out_h=32, out_w=32), 64, 48)
    with pytest.raises(TypeError, match="uint8"):
        _C._render(RRC, img.astype(np.float32))


# ---------------------------------------------------------------- compile_transform

def test_compile_torchvision_v1_train():
    tf = v1.Compose([v1.RandomResizedCrop(224), v1.RandomHorizontalFlip(), v1.ToTensor(), v1.Normalize(MEAN, STD)])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None
    assert spec == dict(geom="rrc", out_h=224, out_w=224, scale_lo=0.08, scale_hi=1.0, ratio_lo=0.75,
                        ratio_hi=4 / 3, flip_p=0.5, out_channels=3, dtype="float32", scale_to_unit=1,
                        normalize=True, mean=MEAN, std=STD, layout="CHW")
    assert "native" in desc and "python: nothing" in desc


def test_compile_torchvision_v2_with_rest(photos):
    jitter = v2.ColorJitter(0.4, 0.4, 0.4)
    tf = v2.Compose([v2.RandomResizedCrop((192, 160), scale=(0.2, 1.0)), v2.RandomHorizontalFlip(0.3),
                     v2.ToImage(), v2.ToDtype(torch.float32, scale=True), jitter, v2.Normalize(MEAN, STD)])
    spec, rest, desc = T.compile_transform(tf, layout="HWC")
    assert spec["geom"] == "rrc" and (spec["out_h"], spec["out_w"]) == (192, 160)
    assert spec["scale_lo"] == 0.2 and spec["flip_p"] == 0.3
    assert spec["dtype"] == "float32" and spec["scale_to_unit"] == 2 and spec["normalize"] is False
    assert spec["layout"] == "HWC"
    assert rest is not None and rest.transforms == [jitter, tf.transforms[-1]]
    assert "ColorJitter" in desc


def test_steps_after_a_to_tensor_step_stay_in_python_with_a_note_saying_why(photos):
    """torchvision v2's documented order, ToImage() first: every later step
    runs on a tensor with torchvision's tensor kernels, which the native
    path does not replicate, so it stays in Python and the description's
    note says which step and what to do; the same steps with the to-tensor
    step after them are native.  The note's claim holds on real photographs:
    torch's antialiased uint8 resize is not Pillow's bilinear (within 1)."""
    crop, flip = v2.RandomResizedCrop(160), v2.RandomHorizontalFlip()
    tf = v2.Compose([v2.ToImage(), crop, flip, v2.ToDtype(torch.float32, scale=True)])
    spec, rest, desc = T.compile_transform(tf)
    assert spec["geom"] == "none" and rest is not None and rest.transforms[:2] == [crop, flip]
    assert "note: RandomResizedCrop comes after the to-tensor step" in desc
    assert "with the to-tensor step after the image steps" in desc
    tf = v2.Compose([crop, v2.ToImage(), v2.ColorJitter(0.4), v2.ToDtype(torch.float32, scale=True)])
    assert "note: ColorJitter comes after the to-tensor step" in T.compile_transform(tf)[2]
    tf = v2.Compose([crop, flip, v2.ColorJitter(0.4), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None and "note" not in desc
    # the tensor kernel's pixels differ from Pillow's, by at most 1 for bilinear
    from torchvision.transforms.v2 import functional as F
    differ = 0
    for name in ("land_500x375", "port_301x447", "odd_333x251"):
        pil = photos[name]
        img = np.asarray(pil)
        t = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous()
        h, w = img.shape[:2]
        for top, left in ((0, 0), (h // 5, w // 7)):
            a = np.asarray(F.resized_crop(pil, top, left, h // 2, w // 2, [160, 160]), dtype=np.int16)
            b = F.resized_crop(t, top, left, h // 2, w // 2, [160, 160], antialias=True).permute(1, 2, 0).numpy()
            d = np.abs(a - b.astype(np.int16))
            assert d.max() <= 1
            differ += int(d.max() == 1)
    assert differ > 0


def test_compile_partial_prefix_runs_rest_on_pil(photos):
    pil = photos["land_500x375"]
    # RandomPerspective is not native (GaussianBlur, the example here before, is since
    # tests/test_gaussian_blur.py): the rest runs on the PIL image, drawing from torch's generator
    tf = v1.Compose([v1.Resize(256), v1.CenterCrop(224), v1.RandomPerspective(0.4, p=1.0), v1.ToTensor()])
    spec, rest, desc = T.compile_transform(tf)
    assert spec["geom"] == "resize_crop" and spec["dtype"] == "uint8"
    torch.manual_seed(3)
    out = rest(torch.from_numpy(_C._render(spec, np.asarray(pil))))
    torch.manual_seed(3)
    assert torch.equal(out, tf(pil))
    assert "to_pil_image" in desc and "RandomPerspective" in desc
    # nothing native at all
    spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomPerspective(), v1.ToTensor()]))
    assert spec["geom"] == "none" and rest is not None and "decode only" in desc
    # RandomRotation, once the example here, is native since tests/test_random_rotation.py
    tf = v1.Compose([v1.Resize(256), v1.CenterCrop(224), v1.RandomRotation(0), v1.ToTensor()])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None and spec["rotate"] == 1, desc
    assert torch.equal(torch.from_numpy(_C._render(spec, np.asarray(pil), None, 0, 0, 0)), tf(pil))


def test_compile_our_transforms_and_call(photos):
    pil = photos["odd_333x251"]
    ours = T.Compose([T.Resize(144), T.CenterCrop(128), T.ToImage(), T.ToDtype("float16", scale=True),
                      T.Normalize(MEAN, STD)])
    spec, rest, desc = T.compile_transform(ours)
    assert rest is None and spec["dtype"] == "float16" and spec["resize_short"] == 144
    assert "rounded to float16" in desc
    ref32 = v2.Compose([v2.Resize(144), v2.CenterCrop(128), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                        v2.Normalize(MEAN, STD)])(pil).as_subclass(torch.Tensor)
    assert torch.equal(torch.from_numpy(_C._render(spec, np.asarray(pil))), ref32.to(torch.float16))
    # __call__ delegates to torchvision
    out = T.Compose([T.Resize(144), T.CenterCrop(128), T.PILToTensor()])(pil)
    np.testing.assert_array_equal(np.asarray(out), _C._render(T.compile_transform(
        T.Compose([T.Resize(144), T.CenterCrop(128), T.PILToTensor()]))[0], np.asarray(pil)))
    assert T.compile_transform(T.Resize((32, 48)))[0]["out_h"] == 32
    assert "RandomResizedCrop" in repr(T.RandomResizedCrop(224))


def test_compile_rejects_other_interpolations():
    """Bilinear and bicubic run natively (tests/test_bicubic.py); any other
    mode leaves the resize, and what follows, to Python."""
    for mode in (v2.InterpolationMode.NEAREST, v2.InterpolationMode.LANCZOS, v2.InterpolationMode.BOX):
        spec, rest, _ = T.compile_transform(v2.Compose([v2.Resize(64, interpolation=mode), v2.PILToTensor()]))
        assert spec["geom"] == "none" and len(rest.transforms) == 2


def test_random_plans_match_pil(photos):
    """Random boxes, resized sizes (up and down), windows partly outside the
    image and flips, against PIL's crop -> resize -> crop (zero fill) -> flip;
    plus random fractional views (no reference: memory safety under ASan)."""
    rng = np.random.default_rng(1234)
    for name in ("odd_333x251", "gray_287x193"):
        pil = photos[name]
        a = np.asarray(pil)
        W, H = pil.size
        for _ in range(60):
            bw, bh = int(rng.integers(1, W + 1)), int(rng.integers(1, H + 1))
            bx, by = int(rng.integers(0, W - bw + 1)), int(rng.integers(0, H - bh + 1))
            rw, rh = int(rng.integers(1, 160)), int(rng.integers(1, 160))
            ow, oh = int(rng.integers(1, 120)), int(rng.integers(1, 120))
            wx, wy = int(rng.integers(-40, rw + 10)), int(rng.integers(-40, rh + 10))
            flip = bool(rng.integers(0, 2))
            plan = dict(box=(bx, by, bw, bh), resized=(rw, rh), window=(wx, wy), flip=flip, out=(ow, oh))
            spec = dict(geom="none", out_channels=1 if a.ndim == 2 else 3)
            out = _C._render(spec, a, plan)
            ref = pil.crop((bx, by, bx + bw, by + bh)).resize((rw, rh), Image.BILINEAR)
            ref = ref.crop((wx, wy, wx + ow, wy + oh))
            if flip:
                ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
            np.testing.assert_array_equal(out, _chw(ref), err_msg=str(plan))
            s = float(rng.choice([0.125, 0.25, 0.5, 1.0]))
            small = np.ascontiguousarray(a[::int(1 / s), ::int(1 / s)])
            _C._render(spec, small, plan, view_scale=(s, s), view_origin=(float(rng.random()), 0.0))


# ---------------------------------------------------------------- source window (decode less)

def _axis_window(b0, n, rs, o0, o1, interp=0):
    """Mirror of resample.c's tap bounds (Pillow's precompute_coeffs): the source
    pixels [lo, hi) that resized outputs [o0, o1) of a box [b0, b0 + n) read,
    with the bilinear (interp 0, support 1) or bicubic (1, support 2) filter."""
    if rs == n:
        return b0 + o0, b0 + o1
    scale = n / rs
    support = (1.0, 2.0)[interp] * max(scale, 1.0)
    ks = math.ceil(support) * 2 + 1

    def bounds(xx):
        c = (xx + 0.5) * scale
        xmin = max(int(c - support + 0.5), 0)
        xmax = min(int(c + support + 0.5), n)
        return xmin, min(max(xmax - xmin, 0), ks)

    xmin0, _ = bounds(o0)
    xmin1, n1 = bounds(o1 - 1)
    return b0 + xmin0, b0 + max(xmin1 + n1, xmin0)


def _source_window(spec, plan, W, H):
    """fl_plan_source_window: (x0, y0, x1, y1), from _C when it is bound."""
    fn = getattr(_C, "plan_source_window", None)
    bx, by, bw, bh = plan["box"]
    rw, rh = plan["resized"]
    ow, oh = (spec["out_w"], spec["out_h"]) if spec.get("out_w") else plan["out"]
    wx, wy = plan["window"]
    cx0, cx1 = max(wx, 0), min(wx + ow, rw)
    cy0, cy1 = max(wy, 0), min(wy + oh, rh)
    if cx1 <= cx0 or cy1 <= cy0:
        x0, y0 = min(max(bx, 0), W - 1), min(max(by, 0), H - 1)
        ref = (x0, y0, x0 + 1, y0 + 1)
    else:
        interp = plan.get("interp", 0) if spec.get("interp", 0) == 2 else spec.get("interp", 0)
        x0, x1 = _axis_window(bx, bw, rw, cx0, cx1, interp)
        y0, y1 = _axis_window(by, bh, rh, cy0, cy1, interp)
        ref = (x0, y0, x1, y1)
    if fn is not None:
        assert tuple(fn(spec, plan, W, H)) == ref, (plan, ref)
    return ref


def _render_cropped(spec, a, plan, win):
    x0, y0, x1, y1 = win
    sub = np.ascontiguousarray(a[y0:y1, x0:x1])
    return _C._render(spec, sub, plan, view_origin=(float(x0), float(y0)))


@pytest.mark.parametrize("interp", [0, 1, 2], ids=["bilinear", "bicubic", "random"])
def test_source_window_renders_bit_identically(photos, interp):
    """Rendering from a view holding only fl_plan_source_window's rectangle
    (origin = its corner, scale 1) equals rendering from the whole image, bit
    for bit: RandomResizedCrop (window = box), Resize + CenterCrop (window =
    taps of the centre crop), zero padding, flips, gray and float32; with
    each filter (bicubic reads twice as far; random: each plan's draw)."""
    rng = np.random.default_rng(77 + interp)
    checked = 0
    for name in ("land_500x375", "port_301x447", "odd_333x251", "small_97x131", "gray_287x193"):
        pil = photos[name]
        a = np.asarray(pil)
        W, H = pil.size
        ch = 1 if a.ndim == 2 else 3
        specs = [
            dict(geom="rrc", out_h=224, out_w=224, flip_p=0.5),
            dict(geom="rrc", out_h=64, out_w=96, scale_lo=0.01, scale_hi=0.3, flip_p=0.5),      # upscales too
            dict(geom="rrc", out_h=56, out_w=56, scale_lo=0.5, scale_hi=1.0, dtype="float32",
                 normalize=True, mean=MEAN, std=STD),
            dict(geom="resize_crop", resize_short=256, crop_h=224, crop_w=224, out_h=224, out_w=224),
            dict(geom="resize_crop", resize_short=80, crop_h=64, crop_w=48, out_h=64, out_w=48, flip_p=0.5,
                 dtype="float32", normalize=True, mean=MEAN, std=STD),
            dict(geom="resize_crop", resize_short=60, crop_h=100, crop_w=90, out_h=100, out_w=90),  # padding
            dict(geom="resize_crop", resize_h=150, resize_w=40, crop_h=120, crop_w=60, out_h=120, out_w=60),
            dict(geom="resize_crop", resize_short=400, crop_h=160, crop_w=200, out_h=160, out_w=200),  # upscale
            dict(geom="resize_crop", resize_short=min(W, H), crop_h=50, crop_w=70, out_h=50, out_w=70),  # no resize
        ]
        if ch == 3:
            specs.append(dict(geom="rrc", out_h=48, out_w=48, out_channels=1, flip_p=0.5))      # convert("L")
            specs.append(dict(geom="resize_crop", resize_short=72, crop_h=64, crop_w=64, out_h=64, out_w=64,
                              out_channels=1))
        for spec in specs:
            if interp:
                spec["interp"] = interp
            for i in range(12):
                plan = _C._plan_sample(spec, W, H, 3, 1, i)
                win = _source_window(spec, plan, W, H)
                x0, y0, x1, y1 = win
                bx, by, bw, bh = plan["box"]
                assert 0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H, (plan, win)
                assert bx <= x0 and by <= y0 and x1 <= bx + bw and y1 <= by + bh, (plan, win)
                if spec["geom"] == "rrc":
                    assert win == (bx, by, bx + bw, by + bh)
                full = _C._render(spec, a, plan)
                np.testing.assert_array_equal(_render_cropped(spec, a, plan, win), full, err_msg=str((spec, plan)))
                checked += 1
        # arbitrary plans: random boxes, sizes and windows partly (or wholly) outside the image
        spec = dict(geom="none", out_channels=ch, interp=interp)
        for _ in range(60):
            bw, bh = int(rng.integers(1, W + 1)), int(rng.integers(1, H + 1))
            bx, by = int(rng.integers(0, W - bw + 1)), int(rng.integers(0, H - bh + 1))
            rw, rh = int(rng.integers(1, 300)), int(rng.integers(1, 300))
            ow, oh = int(rng.integers(1, 200)), int(rng.integers(1, 200))
            wx, wy = int(rng.integers(-60, rw + 10)), int(rng.integers(-60, rh + 10))
            plan = dict(box=(bx, by, bw, bh), resized=(rw, rh), window=(wx, wy), flip=bool(rng.integers(0, 2)),
                        out=(ow, oh), interp=int(rng.integers(0, 2)))
            win = _source_window(spec, plan, W, H)
            full = _C._render(spec, a, plan)
            np.testing.assert_array_equal(_render_cropped(spec, a, plan, win), full, err_msg=str(plan))
            # any larger full-scale rectangle works too
            x0, y0, x1, y1 = win
            big = (max(x0 - int(rng.integers(0, 9)), 0), max(y0 - int(rng.integers(0, 9)), 0),
                   min(x1 + int(rng.integers(0, 9)), W), min(y1 + int(rng.integers(0, 9)), H))
            np.testing.assert_array_equal(_render_cropped(spec, a, plan, big), full, err_msg=str(plan))
            checked += 1
    assert checked > 500


_PORTABLE_SCRIPT = r"""
import hashlib, json, sys
import numpy as np
from fastloader import _C
rng = np.random.default_rng(5)
img = rng.integers(0, 256, (173, 211, 3), dtype=np.uint8)
img[40:120, 30:150] = np.add.outer(np.arange(80), np.arange(120))[:, :, None].astype(np.uint8)
gray = np.ascontiguousarray(img[:, :, 1])
h = hashlib.sha256()
for a, ch in ((img, 3), (img, 1), (gray, 3)):
    for spec in (dict(geom="rrc", out_h=64, out_w=80, flip_p=0.5, out_channels=ch, scale_lo=0.02),
                 dict(geom="resize_crop", resize_short=96, crop_h=88, crop_w=100, out_h=88, out_w=100,
                      out_channels=ch, flip_p=0.5, dtype="float32", layout="HWC"),
                 dict(geom="resize_crop", resize_h=30, resize_w=300, out_channels=ch)):
        for i in range(25):
            h.update(_C._render(spec, a, None, 9, 0, i).tobytes())
    for i in range(60):
        W, H = a.shape[1], a.shape[0]
        bw, bh = int(rng.integers(1, W + 1)), int(rng.integers(1, H + 1))
        bx, by = int(rng.integers(0, W - bw + 1)), int(rng.integers(0, H - bh + 1))
        rw, rh = int(rng.integers(1, 400)), int(rng.integers(1, 400))
        plan = dict(box=(bx, by, bw, bh), resized=(rw, rh), window=(int(rng.integers(-9, rw)), int(rng.integers(-9, rh))),
                    flip=bool(i & 1), out=(int(rng.integers(1, 150)), int(rng.integers(1, 150))))
        h.update(_C._render(dict(geom="none", out_channels=ch), a, plan).tobytes())
print(h.hexdigest())
"""


def test_portable_kernels_match_simd():
    """The portable C kernels (forced with FASTLOADER_NO_AVX2=1) and the AVX2
    kernels give the same bytes: widths that are not multiples of the vector
    size, 1 and 3 channels, flips, vertical-first order, wide downscales."""
    import os
    import subprocess
    import sys

    def run(env_extra):
        env = dict(os.environ, **env_extra)
        return subprocess.run([sys.executable, "-c", _PORTABLE_SCRIPT], env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    assert run({"FASTLOADER_NO_AVX2": "1"}) == run({"FASTLOADER_NO_AVX2": "0"})
