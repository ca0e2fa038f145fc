"""RandomRotation in the native pipeline (spec rotate / rot_lo / rot_hi /
rot_interp / rot_fill): its angle drawn uniformly after the flips, applied
as the policy's Rotate op (augment.h FL_AUG_ROTATE, Pillow's rotate about the
centre, no expand) to the output window before a policy's ops; against
torchvision's functional rotate on PIL images for the plan's angle, its
distribution, and what stays in Python (expand, centre, bicubic, a policy
with another fill)."""
from __future__ import annotations

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

from imgutil import photo_image, plan_on_pil  # noqa: E402

ROTATE = 5   # augment.h FL_AUG_ROTATE
NEAREST, BILINEAR = TF.InterpolationMode.NEAREST, TF.InterpolationMode.BILINEAR


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    return photo_image("coffee", (400, 300))


@pytest.mark.parametrize("lib", [v1, v2], ids=["v1", "v2"])
@pytest.mark.parametrize("interp,fill", [(NEAREST, None), (BILINEAR, (10, 200, 30)), (BILINEAR, 77)])
def test_rotation_bit_exact_against_torchvision(photo, lib, interp, fill):
    """The unchanged object compiles natively; every sample equals
    TF.rotate of torchvision's crop and flip by the plan's angle."""
    tf = lib.Compose([lib.RandomResizedCrop((48, 64)), lib.RandomHorizontalFlip(),
                      lib.RandomRotation((-30, 45), interpolation=interp, fill=fill), lib.PILToTensor()])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None and spec["rotate"] == 1 and (spec["rot_lo"], spec["rot_hi"]) == (-30.0, 45.0), desc
    a = np.asarray(photo)
    f = [0, 0, 0] if fill is None else [fill] * 3 if isinstance(fill, int) else list(fill)
    for i in range(30):
        p = _C._plan_sample(spec, photo.width, photo.height, 4, 0, i)
        (op, angle), = p["aug"]
        assert op == ROTATE and -30 <= angle <= 45
        ref = TF.rotate(plan_on_pil(photo, p), angle, interpolation=interp, fill=f)
        got = _C._render(spec, a, p)
        assert np.array_equal(got, np.asarray(ref).transpose(2, 0, 1)), (p, angle)


def test_rotation_goes_before_the_policy_and_shares_its_fill(photo):
    spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomResizedCrop(40), v1.RandomRotation(20),
                                                       v1.TrivialAugmentWide(), v1.PILToTensor()]))
    assert rest is None and "policy" in spec and spec["rotate"] == 1, desc
    for i in range(50):
        p = _C._plan_sample(spec, photo.width, photo.height, 1, 0, i)
        assert p["aug"][0][0] == ROTATE and -20 <= p["aug"][0][1] <= 20, p   # first, then the policy's ops
        assert len(p["aug"]) <= 2
    # the augmented render has one fill: a policy with another one stays in Python, the rotation stays native
    spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomResizedCrop(40), v1.RandomRotation(20),
                                                       v1.TrivialAugmentWide(fill=[1, 2, 3]), v1.PILToTensor()]))
    assert spec["rotate"] == 1 and "policy" not in spec and rest is not None, desc
    bad = dict(spec, policy=T.compile_transform(v1.Compose([v1.RandomResizedCrop(40), v1.TrivialAugmentWide(
        fill=[1, 2, 3])]))[0]["policy"])
    with pytest.raises(ValueError, match="rot_fill"):
        _C._plan_sample(bad, 100, 100, 0, 0, 0)


def test_angle_is_uniform_over_the_range():
    spec = dict(geom="rrc", out_h=16, out_w=16, rotate=1, rot_lo=-10.0, rot_hi=30.0, rot_interp=0,
                rot_fill=(0, 0, 0))
    n = 4000
    ang = np.array([_C._plan_sample(spec, 200, 100, 3, 0, i)["aug"][0][1] for i in range(n)])
    assert ang.min() >= -10 and ang.max() <= 30
    counts, _ = np.histogram(ang, bins=8, range=(-10, 30))
    assert np.all(np.abs(counts - n / 8) < 5 * np.sqrt(n / 8)), counts
    assert _C._plan_sample(spec, 200, 100, 3, 0, 7) == _C._plan_sample(spec, 200, 100, 3, 0, 7)


def test_what_stays_in_python_and_spec_checks():
    for rr in (v1.RandomRotation(10, expand=True), v1.RandomRotation(10, center=(3, 4)),
               v1.RandomRotation(10, interpolation=TF.InterpolationMode.BICUBIC)):
        spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomResizedCrop(32), rr, v1.ToTensor()]))
        assert "rotate" not in spec and rest is not None, desc
    # a variable output size (no crop): the rotation needs a fixed one, so it stays in Python
    spec, rest, _ = T.compile_transform(v1.Compose([v1.Resize(40), v1.RandomRotation(10)]))
    assert "rotate" not in spec and rest is not None
    base = dict(geom="rrc", out_h=16, out_w=16, rotate=1, rot_lo=-1.0, rot_hi=1.0, rot_interp=0, rot_fill=(0, 0, 0))
    for key, val, msg in (("rot_lo", 5.0, "rot_lo"), ("rot_interp", 2, "rot_interp"), ("rot_fill", (0, 0, 300), "rot_fill"),
                          ("rotate", 4, "rotate")):
        with pytest.raises(ValueError, match=msg):
            _C._plan_sample(dict(base, **{key: val}), 100, 100, 0, 0, 0)
    with pytest.raises(ValueError, match="fixed output size"):
        _C._plan_sample(dict(base, geom="none", out_h=0, out_w=0), 100, 100, 0, 0, 0)
