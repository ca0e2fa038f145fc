"""RandomGrayscale in the native pipeline (spec gray_p, plan gray): the
finished uint8 window made gray with Pillow's convert("L") in all three
channels, after the geometry, the flips and a policy's ops, before the dtype
conversion; against torchvision's RandomGrayscale on PIL images for the
plan's decisions, its distribution, and the unchanged objects compiling
with no Python tail."""
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
def photo() -> Image.Image:
    return photo_image("astronaut", (500, 375))


def _ref(pil, plan):
    """torchvision on PIL for the plan's decisions (imgutil.plan_on_pil;
    TF.rgb_to_grayscale(..., 3) of a PIL image is convert("L") in three
    channels)."""
    return chw(plan_on_pil(pil, plan))


def test_random_grayscale_bit_exact_against_torchvision(photo):
    """RandomResizedCrop and Resize + CenterCrop (padded), with both flips:
    uint8 and normalized float32 equal torchvision's for every sample."""
    a = np.asarray(photo)
    specs = [dict(geom="rrc", out_h=72, out_w=96, flip_p=0.5, vflip_p=0.3, gray_p=0.5),
             dict(geom="resize_crop", resize_short=90, crop_h=100, crop_w=130, out_h=100, out_w=130, gray_p=0.5)]
    for spec in specs:
        grays = 0
        for i in range(40):
            p = _C._plan_sample(spec, photo.width, photo.height, 8, 1, i)
            grays += p["gray"]
            out = _C._render(spec, a, p)
            assert np.array_equal(out, _ref(photo, p)), (spec, p)
        assert 5 < grays < 35, grays
    spec = dict(specs[0], dtype="float32", scale_to_unit=1, normalize=True, mean=MEAN, std=STD)
    for i in range(10):
        p = _C._plan_sample(spec, photo.width, photo.height, 8, 1, i)
        ref = TF.normalize(TF.to_tensor(Image.fromarray(_ref(photo, p).transpose(1, 2, 0))), MEAN, STD)
        assert torch.equal(torch.from_numpy(_C._render(spec, a, p)), ref), p


def test_random_grayscale_after_the_policy_ops(photo):
    """With a policy before it, the ops run on colour and the gray comes
    last: the render equals Pillow's convert("L") of the same plan rendered
    without the gray."""
    a = np.asarray(photo)
    for lib in (v1, v2):
        spec, rest, desc = T.compile_transform(lib.Compose([lib.RandomResizedCrop(64), lib.TrivialAugmentWide(),
                                                            lib.RandomGrayscale(0.5), lib.PILToTensor()]))
        assert rest is None and "policy" in spec and spec["gray_p"] == 0.5, desc
        both = 0
        for i in range(40):
            p = _C._plan_sample(spec, photo.width, photo.height, 2, 0, i)
            out = _C._render(spec, a, p)
            colour = _C._render(spec, a, dict(p, gray=False))
            want = colour
            if p["gray"]:
                lum = np.asarray(Image.fromarray(colour.transpose(1, 2, 0)).convert("L"))
                want = np.stack([lum] * 3)
                both += bool(p["aug"])
            assert np.array_equal(out, want), (lib.__name__, p)
        assert both > 3, both


def test_random_grayscale_distribution_and_spec_checks():
    n = 4000
    spec = dict(geom="rrc", out_h=16, out_w=16, flip_p=0.5, gray_p=0.3)
    g = sum(_C._plan_sample(spec, 200, 100, 1, 0, i)["gray"] for i in range(n))
    assert abs(g - 0.3 * n) < 4 * math.sqrt(n * 0.21), g
    plain = dict(geom="rrc", out_h=16, out_w=16, flip_p=0.5)
    assert not any(_C._plan_sample(plain, 200, 100, 1, 0, i)["gray"] for i in range(200))
    # a spec without RandomGrayscale draws as before: the same crops and flips
    assert all(_C._plan_sample(plain, 200, 100, 1, 0, i)["box"] == _C._plan_sample(spec, 200, 100, 1, 0, i)["box"]
               for i in range(50))
    with pytest.raises(ValueError, match="gray_p"):
        _C._plan_sample(dict(plain, gray_p=-0.1), 200, 100, 1, 0, 0)


def test_objects_compile_and_a_gray_output_is_unchanged(photo):
    for tf in (v1.Compose([v1.RandomResizedCrop(32), v1.RandomHorizontalFlip(), v1.RandomGrayscale(), v1.ToTensor()]),
               v2.Compose([v2.RandomResizedCrop(32), v2.RandomGrayscale(0.2), v2.ToImage(),
                           v2.ToDtype(torch.float32, scale=True)]),
               T.Compose([T.RandomResizedCrop(32), T.RandomGrayscale(0.2), T.ToTensor()])):
        spec, rest, desc = T.compile_transform(tf)
        assert rest is None and spec["gray_p"] in (0.1, 0.2), desc
    with pytest.raises(ValueError, match="RandomGrayscale"):
        T.RandomGrayscale(1.5)
    # after Grayscale(1) the image is gray already: RandomGrayscale changes nothing
    spec, rest, _ = T.compile_transform(v1.Compose([v1.Grayscale(), v1.RandomResizedCrop(40),
                                                    v1.RandomGrayscale(1.0), v1.PILToTensor()]))
    assert rest is None and spec["out_channels"] == 1
    a = np.asarray(photo)
    for i in range(5):
        p = _C._plan_sample(spec, photo.width, photo.height, 0, 0, i)
        assert p["gray"]
        assert np.array_equal(_C._render(spec, a, p), _C._render(spec, a, dict(p, gray=False)))
