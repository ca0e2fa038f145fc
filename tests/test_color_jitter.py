"""ColorJitter in the native pipeline (spec jitter, augment.h FL_AUG_HUE and
the enhance factor ops): torchvision's adjust_hue / adjust_brightness /
adjust_contrast / adjust_saturation on PIL images, bit for bit, for each
plan's order and factors; RandomApply around it; its place among the flips,
RandomRotation and a policy; the distribution of its draws; timm's default
training transform compiling with no Python tail."""
from __future__ import annotations

import collections
import itertools
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

from imgutil import PHOTOS, chw, photo, photo_image, plan_on_pil  # noqa: E402

HUE, BRIGHTNESS, CONTRAST, COLOR = 43, 20, 22, 21   # augment.h FL_AUG_HUE, FL_AUG_*_FACTOR
ADJUST = {BRIGHTNESS: TF.adjust_brightness, CONTRAST: TF.adjust_contrast, COLOR: TF.adjust_saturation,
          HUE: TF.adjust_hue}


def _replay(pil: Image.Image, plan: dict) -> np.ndarray:
    """torchvision on PIL for a plan whose ops are all ColorJitter's: the
    crop, flips and gray of imgutil.plan_on_pil with the ops in between."""
    img = plan_on_pil(pil, dict(plan, gray=False))
    for op, mag in plan["aug"]:
        img = ADJUST[op](img, mag)
    if plan.get("gray") and img.mode == "RGB":
        img = img.convert("L").convert("RGB")
    return chw(img)


def test_hue_equals_pillow_on_every_colour_for_a_few_shifts():
    """adjust_hue is a function of the pixel alone: every 7th of the 2^24
    colours, through Pillow's HSV round trip, for shifts of 0 (not the
    identity: H and S are truncated to bytes), the ends of the range and
    values between."""
    a = np.arange(0, 1 << 24, 7, dtype=np.uint32)
    a = a[: (len(a) // 1024) * 1024]
    rgb = np.stack([(a >> 16) & 255, (a >> 8) & 255, a & 255], -1).astype(np.uint8).reshape(-1, 1024, 3)
    im = Image.fromarray(rgb)
    for hue in (0.0, 0.5, -0.5, 0.1234, -0.0019):
        want = np.asarray(TF.adjust_hue(im, hue))
        got = _C._augment_op(HUE, hue, rgb.copy())
        assert np.array_equal(got, want), (hue, int((got != want).any(-1).sum()))


def test_hue_on_photographs_for_random_factors():
    rng = np.random.default_rng(5)
    for name in PHOTOS:
        arr = np.ascontiguousarray(photo(name)[::4, ::4])
        for hue in rng.uniform(-0.5, 0.5, 40):
            want = np.asarray(TF.adjust_hue(Image.fromarray(arr), float(hue)))
            assert np.array_equal(_C._augment_op(HUE, float(hue), arr.copy()), want), (name, hue)


def test_hue_leaves_gray_images_and_refuses_factors_outside_its_range():
    gray = np.ascontiguousarray(photo("coffee")[:50, :60, 0])
    assert np.array_equal(_C._augment_op(HUE, 0.3, gray.copy()), gray)   # adjust_hue returns an L image as it is
    for bad in (0.51, -0.7, float("nan")):
        with pytest.raises(ValueError, match="Hue|not finite"):
            _C._augment_op(HUE, bad, photo("coffee")[:8, :8].copy())


@pytest.mark.parametrize("lib", [v1, v2], ids=["v1", "v2"])
def test_color_jitter_bit_exact_against_torchvision(lib):
    """Every sample's order and factors (hue included), replayed through
    torchvision's functional ops on the PIL image, give the native bytes;
    uint8 and normalized float32."""
    pil = photo_image("astronaut", (300, 220))
    a = np.asarray(pil)
    tf = lib.Compose([lib.RandomResizedCrop(56), lib.RandomHorizontalFlip(), lib.ColorJitter(0.4, 0.4, 0.4, 0.1),
                      lib.PILToTensor()])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None and spec["jitter"]["hue"] == (-0.1, 0.1), desc
    orders = set()
    for i in range(60):
        p = _C._plan_sample(spec, pil.width, pil.height, 3, 0, i)
        assert sorted(op for op, _ in p["aug"]) == sorted(ADJUST), p["aug"]
        orders.add(tuple(op for op, _ in p["aug"]))
        assert np.array_equal(_C._render(spec, a, p), _replay(pil, p)), p
    assert len(orders) > 12, orders
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    fspec = dict(spec, dtype="float32", scale_to_unit=1, normalize=True, mean=mean, std=std)
    for i in range(8):
        p = _C._plan_sample(fspec, pil.width, pil.height, 3, 0, i)
        ref = TF.normalize(TF.to_tensor(Image.fromarray(_replay(pil, p).transpose(1, 2, 0))), mean, std)
        assert torch.equal(torch.from_numpy(_C._render(fspec, a, p)), ref), p


def test_random_apply_gray_and_one_channel():
    """RandomApply([ColorJitter], p) (SimCLR's colour distortion) with
    RandomGrayscale after it; and after Grayscale(1), where saturation and
    hue leave the L image and brightness and contrast still apply."""
    pil = photo_image("chelsea", (260, 200))
    a = np.asarray(pil)
    tf = v2.Compose([v2.RandomResizedCrop(48), v2.RandomApply([v2.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8),
                     v2.RandomGrayscale(0.2), v2.PILToTensor()])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None and spec["jitter"]["p"] == 0.8 and spec["gray_p"] == 0.2, desc
    applied = 0
    for i in range(50):
        p = _C._plan_sample(spec, pil.width, pil.height, 1, 2, i)
        applied += bool(p["aug"])
        assert np.array_equal(_C._render(spec, a, p), _replay(pil, p)), p
    assert 30 < applied < 50, applied
    spec, rest, desc = T.compile_transform(v1.Compose([v1.Grayscale(), v1.RandomResizedCrop(40),
                                                       v1.ColorJitter(0.5, 0.5, 0.5, 0.3), v1.PILToTensor()]))
    assert rest is None and spec["out_channels"] == 1, desc
    for i in range(20):
        p = _C._plan_sample(spec, pil.width, pil.height, 0, 0, i)
        img = plan_on_pil(pil, p, out_channels=1)
        for op, mag in p["aug"]:
            img = ADJUST[op](img, mag)
        assert np.array_equal(_C._render(spec, a, p), chw(img)), p


def test_place_among_rotation_and_policy():
    """A ColorJitter goes where the Compose puts it: before RandomRotation
    (its fill stays black), between it and a policy, or after the policy;
    after AugMix it stays in Python (AugMix's chains end the op list)."""
    cases = [
        ([v1.ColorJitter(0.5), v1.RandomRotation(20)], 0, lambda ops: ops[-1] == 5),
        ([v1.RandomRotation(20), v1.ColorJitter(0.5), v1.TrivialAugmentWide()], 1, lambda ops: ops[0] == 5),
        ([v1.TrivialAugmentWide(), v1.ColorJitter(0.5)], 2, lambda ops: ops[-1] == BRIGHTNESS),
    ]
    for steps, where, check in cases:
        spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomResizedCrop(32), *steps, v1.PILToTensor()]))
        assert rest is None and spec["jitter"]["pos"] == where, desc
        for i in range(20):
            ops = [op for op, _ in _C._plan_sample(spec, 120, 90, 0, 0, i)["aug"]]
            assert BRIGHTNESS in ops and check(ops), (where, ops)
    spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomResizedCrop(32), v1.AugMix(), v1.ColorJitter(0.5),
                                                       v1.PILToTensor()]))
    assert rest is not None and "jitter" not in spec and "ColorJitter" in desc.split("python")[1], desc


def test_draws_follow_torchvision_distribution():
    """Each of the 24 orders about equally often, RandomApply's rate, each
    factor uniform over its range and a float32 value (torch's uniform_ on
    a float tensor); a spec without a ColorJitter keeps its draws."""
    n = 4800
    spec = dict(geom="rrc", out_h=16, out_w=16, flip_p=0.5,
                jitter=dict(p=0.75, pos=0, brightness=(0.6, 1.4), contrast=(0.0, 2.0), saturation=(0.5, 0.5),
                            hue=(-0.2, 0.3)))
    orders = collections.Counter()
    factors = collections.defaultdict(list)
    applied = 0
    for i in range(n):
        aug = _C._plan_sample(spec, 200, 100, 9, 1, i)["aug"]
        if not aug:
            continue
        applied += 1
        orders[tuple(op for op, _ in aug)] += 1
        for op, mag in aug:
            factors[op].append(mag)
    assert abs(applied - 0.75 * n) < 4 * math.sqrt(n * 0.75 * 0.25), applied
    assert set(orders) == set(itertools.permutations(ADJUST)), len(orders)
    expect = applied / 24
    chi2 = sum((c - expect) ** 2 / expect for c in orders.values())
    assert chi2 < 60, chi2   # 23 degrees of freedom: p ~ 4e-5
    for op, (lo, hi) in {BRIGHTNESS: (0.6, 1.4), CONTRAST: (0.0, 2.0), COLOR: (0.5, 0.5), HUE: (-0.2, 0.3)}.items():
        x = np.array(factors[op])
        assert np.array_equal(x, x.astype(np.float32).astype(np.float64)), op
        assert x.min() >= np.float32(lo) and x.max() <= np.float32(hi), op
        if hi > lo:
            u = (x - lo) / (hi - lo)
            assert abs(u.mean() - 0.5) < 4 * math.sqrt(1 / 12 / len(u)), (op, u.mean())
            assert np.histogram(u, 4, (0, 1))[0].min() > 0.2 * len(u), op
    plain = dict(geom="rrc", out_h=16, out_w=16, flip_p=0.5)
    for i in range(40):
        a, b = _C._plan_sample(plain, 200, 100, 9, 1, i), _C._plan_sample(spec, 200, 100, 9, 1, i)
        assert (a["box"], a["flip"]) == (b["box"], b["flip"])


def test_spec_checks_and_fastloader_transform():
    base = dict(geom="rrc", out_h=16, out_w=16)
    for bad, field in [(dict(p=1.5, pos=0, brightness=(1, 2)), "jitter.p"),
                       (dict(p=1.0, pos=3, brightness=(1, 2)), "jitter.pos"),
                       (dict(p=1.0, pos=0, brightness=(2, 1)), "jitter.brightness"),
                       (dict(p=1.0, pos=0, contrast=(-0.1, 1)), "jitter.contrast"),
                       (dict(p=1.0, pos=0, hue=(-0.6, 0.1)), "jitter.hue"),
                       (dict(p=1.0, pos=0, gamma=(1, 2)), "jitter")]:
        with pytest.raises(ValueError, match=field):
            _C._plan_sample(dict(base, jitter=bad), 50, 50, 0, 0, 0)
    with pytest.raises(ValueError, match="fixed output size"):
        _C._plan_sample(dict(geom="none", jitter=dict(p=1.0, pos=0, brightness=(1, 2))), 50, 50, 0, 0, 0)
    ours = T.ColorJitter(brightness=0.3, hue=0.2)
    assert (ours.brightness, ours.contrast, ours.hue) == ((0.7, 1.3), None, (-0.2, 0.2))
    spec, rest, _ = T.compile_transform(T.Compose([T.RandomResizedCrop(24), ours, T.ToTensor()]))
    assert rest is None and set(spec["jitter"]) == {"p", "pos", "brightness", "hue"}
    spec, rest, _ = T.compile_transform(v1.Compose([v1.RandomResizedCrop(24), v1.ColorJitter(), v1.ToTensor()]))
    assert rest is None and "jitter" not in spec   # all None: nothing to do
    with pytest.raises(ValueError, match="hue"):
        T.ColorJitter(hue=0.7)
    out = ours(photo_image("rocket", (40, 30)))   # the torchvision equivalent runs
    assert out.size == (40, 30)


def test_timm_default_training_transform_runs_natively(tmp_path):
    """timm's create_transform(is_training=True): RandomResizedCropAndInterpolation,
    flip, ColorJitter(0.4, 0.4, 0.4), MaybeToTensor, Normalize; with
    color_jitter_prob, a RandomApply around it.  Through ImageFolder and the
    DataLoader: no Python per sample, the same batches for num_workers 0 and 2."""
    timm_tf = pytest.importorskip("timm.data")
    import fastloader
    from fastloader.tools.sample import make_sample

    for tf in (timm_tf.create_transform(48, is_training=True),
               timm_tf.create_transform(48, is_training=True, color_jitter=(0.3, 0.3, 0.3, 0.1),
                                        color_jitter_prob=0.5, grayscale_prob=0.1)):
        spec, rest, desc = T.compile_transform(tf)
        assert rest is None and "jitter" in spec, desc
    root = tmp_path / "train"
    make_sample(str(root), n=12, classes=2, seed=4, progress=False, processes=1)
    ds = fastloader.ImageFolder(str(root), transform=tf)
    assert ds.pipeline_description.endswith("python: nothing"), ds.pipeline_description
    runs = [list(fastloader.DataLoader(ds, batch_size=4, num_workers=nw, seed=11)) for nw in (0, 2)]
    for (xa, ya), (xb, yb) in zip(*runs):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
