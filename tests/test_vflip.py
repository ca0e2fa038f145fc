"""RandomVerticalFlip in the native pipeline (spec vflip_p, plan vflip):
pixels against torchvision's functional ops on PIL images for the plan's
decisions, the flip's place (after the geometry and the horizontal flip,
before the policy ops and erasing), its distribution, and the unchanged
objects of torchvision and timm compiling with no Python tail."""
from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from fastloader import _C
from fastloader import transforms as T

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("skimage.data")
import torchvision.transforms as v1  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402
import torchvision.transforms.v2 as v2  # noqa: E402

from imgutil import chw, photo_image, plan_on_pil  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def photos() -> dict[str, Image.Image]:
    return {
        "land_500x375": photo_image("astronaut", (500, 375)),
        "odd_333x251": photo_image("chelsea").crop((17, 9, 350, 260)),
        "small_97x131": photo_image("rocket", (97, 131)),
    }


def _ref(pil, plan, out_channels=3):
    """torchvision on PIL for the plan's decisions (imgutil.plan_on_pil: TF.hflip
    and TF.vflip are PIL's transposes)."""
    return chw(plan_on_pil(pil, plan, out_channels))


@pytest.mark.parametrize("name", ["land_500x375", "odd_333x251", "small_97x131"])
def test_vflip_bit_exact_against_torchvision(photos, name):
    """RandomResizedCrop, Resize + CenterCrop (padded where the crop is larger
    than the image), RGB and gray, with both flips drawn: uint8 output equals
    PIL's crop/resize then TF.hflip / TF.vflip, bit for bit."""
    pil = photos[name]
    a = np.asarray(pil)
    specs = [dict(geom="rrc", out_h=96, out_w=80, flip_p=0.5, vflip_p=0.5),
             dict(geom="resize_crop", resize_short=120, crop_h=112, crop_w=150, out_h=112, out_w=150, vflip_p=0.5),
             dict(geom="rrc", out_h=64, out_w=64, out_channels=1, flip_p=0.5, vflip_p=0.5)]
    for spec in specs:
        seen = set()
        for i in range(40):
            p = _C._plan_sample(spec, pil.width, pil.height, 5, 1, i)
            seen.add((p["flip"], p["vflip"]))
            out = _C._render(spec, a, p)
            ref = _ref(pil, p, spec.get("out_channels", 3))
            assert np.array_equal(out, ref), (name, spec, p, np.abs(out.astype(int) - ref).max())
        assert any(v for _, v in seen) and any(not v for _, v in seen), seen   # both outcomes rendered


def test_compiled_torchvision_pipelines_in_either_flip_order(photos):
    """The unchanged v1 and v2 objects, flips in either order, to normalized
    float32: native with no Python tail, and equal to torchvision's
    functional ops for each sample's decisions."""
    pil = photos["land_500x375"]
    a = np.asarray(pil)
    for lib in (v1, v2):
        for order in ("hv", "vh"):
            flips = {"h": lib.RandomHorizontalFlip(), "v": lib.RandomVerticalFlip(0.4)}
            tail = [lib.ToTensor()] if lib is v1 else [lib.ToImage(), lib.ToDtype(torch.float32, scale=True)]
            tf = lib.Compose([lib.RandomResizedCrop(72)] + [flips[c] for c in order] + tail +
                             [lib.Normalize(MEAN, STD)])
            spec, rest, desc = T.compile_transform(tf)
            assert rest is None, desc
            assert spec["flip_p"] == 0.5 and spec["vflip_p"] == 0.4, spec
            for i in range(12):
                p = _C._plan_sample(spec, pil.width, pil.height, 3, 0, i)
                x, y, w, h = p["box"]
                ref = TF.resized_crop(pil, y, x, h, w, [72, 72], antialias=True)
                ref = TF.hflip(ref) if p["flip"] else ref
                ref = TF.vflip(ref) if p["vflip"] else ref
                if lib is v1:
                    ref = TF.to_tensor(ref)
                else:   # v2's ToDtype(scale=True) multiplies by 1/255 where v1 divides
                    ref = v2.functional.to_dtype(v2.functional.pil_to_tensor(ref), torch.float32, scale=True)
                ref = TF.normalize(ref, MEAN, STD)
                assert torch.equal(torch.from_numpy(_C._render(spec, a, p)), ref), (lib.__name__, order, p)


def test_vflip_comes_before_the_policy_ops_and_erasing(photos):
    """A policy after the flips acts on the flipped crop: rendering with the
    policy equals rendering the flipped geometry first and then applying the
    same ops to it (the geometry an identity of its size)."""
    pil = photos["odd_333x251"]
    a = np.asarray(pil)
    spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomResizedCrop(64), v1.RandomVerticalFlip(),
                                                       v1.TrivialAugmentWide(), v1.PILToTensor()]))
    assert rest is None and "vflip_p" in spec and "policy" in spec, desc
    geom = {k: v for k, v in spec.items() if k != "policy"}
    ident = dict(spec, geom="none", vflip_p=0.0, flip_p=0.0)
    flipped_with_ops = 0
    for i in range(60):
        p = _C._plan_sample(spec, pil.width, pil.height, 9, 0, i)
        full = _C._render(spec, a, p)
        g = _C._render(geom, a, dict(p, aug=[], aug_interp=[]))
        hwc = np.ascontiguousarray(g.transpose(1, 2, 0))
        q = dict(box=(0, 0, 64, 64), resized=(64, 64), window=(0, 0), out=(64, 64), aug=p["aug"],
                 aug_interp=p["aug_interp"])
        assert np.array_equal(full, _C._render(ident, hwc, q)), p
        flipped_with_ops += bool(p["vflip"] and p["aug"])
    assert flipped_with_ops > 5


def test_vflip_distribution_and_independence():
    """P(vflip) is the spec's p, independent of the horizontal flip, keyed by
    (seed, epoch, index); a spec without vflip_p never flips vertically."""
    n = 4000
    spec = dict(geom="rrc", out_h=32, out_w=32, flip_p=0.5, vflip_p=0.3)
    plans = [_C._plan_sample(spec, 500, 375, 6, 2, i) for i in range(n)]
    v = np.array([p["vflip"] for p in plans])
    h = np.array([p["flip"] for p in plans])
    assert abs(v.sum() - 0.3 * n) < 4 * math.sqrt(n * 0.3 * 0.7), v.sum()
    both = (v & h).sum()
    assert abs(both - 0.15 * n) < 4 * math.sqrt(n * 0.15 * 0.85), both
    assert [_C._plan_sample(spec, 500, 375, 6, 2, i) for i in range(50)] == plans[:50]
    assert _C._plan_sample(spec, 500, 375, 6, 3, 0) != plans[0] or _C._plan_sample(spec, 500, 375, 7, 2, 1) != plans[1]
    plain = dict(geom="rrc", out_h=32, out_w=32, flip_p=0.5)
    assert not any(_C._plan_sample(plain, 500, 375, 6, 2, i)["vflip"] for i in range(200))
    with pytest.raises(ValueError, match="vflip_p"):
        _C._plan_sample(dict(plain, vflip_p=1.5), 500, 375, 6, 2, 0)


def test_ours_and_timm_objects_compile_natively():
    """fastloader.transforms.RandomVerticalFlip, and timm's training
    transform with vflip (its RandomVerticalFlip is torchvision's)."""
    spec, rest, _ = T.compile_transform(T.Compose([T.RandomResizedCrop(32), T.RandomVerticalFlip(0.25),
                                                   T.ToTensor()]))
    assert rest is None and spec["vflip_p"] == 0.25
    with pytest.raises(ValueError, match="RandomVerticalFlip"):
        T.RandomVerticalFlip(2.0)
    assert repr(T.RandomVerticalFlip(0.25)) == "RandomVerticalFlip(p=0.25)"
    timm_tf = pytest.importorskip("timm.data")
    tf = timm_tf.create_transform(64, is_training=True, vflip=0.5, color_jitter=None)
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None and spec["vflip_p"] == 0.5 and spec["flip_p"] == 0.5, desc
