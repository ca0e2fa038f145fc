"""The real training recipes in the native pipeline: torchvision's reference
preset objects (v1 and v2) with TrivialAugmentWide / RandAugment /
AutoAugment and RandomErasing, recognised unchanged, drawn with
torchvision's distributions, and rendered with torchvision's pixels for the
same parameters.

The per-op pixel tests are tests/test_augment_ops.py; here the ops are
checked in the pipeline: a plan's crop, flip, policy ops and erase box,
replayed through torchvision on the PIL image, must give the tensor the C
pipeline gives.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")

from PIL import Image  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import autoaugment as tv_aa  # noqa: E402
from torchvision.transforms import functional as TF  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import fastloader  # noqa: E402
from fastloader import _C  # noqa: E402
from fastloader.transforms import _AUG_OPS, compile_transform  # noqa: E402
from imgutil import photo_image  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
OP_NAMES = {code: name for name, code in _AUG_OPS.items()}


class PresetTrain:
    """torchvision's references/classification ClassificationPresetTrain,
    written from its public definition (PIL backend): an object that holds a
    Compose in ``.transforms`` and calls it."""

    def __init__(self, *, crop_size=224, interpolation=T.InterpolationMode.BILINEAR, hflip_prob=0.5,
                 auto_augment_policy=None, ra_magnitude=9, random_erase_prob=0.0, use_v2=False):
        M = v2 if use_v2 else T
        tl = [M.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True)]
        if hflip_prob > 0:
            tl.append(M.RandomHorizontalFlip(hflip_prob))
        if auto_augment_policy == "ra":
            tl.append(M.RandAugment(interpolation=interpolation, magnitude=ra_magnitude))
        elif auto_augment_policy == "ta_wide":
            tl.append(M.TrivialAugmentWide(interpolation=interpolation))
        elif auto_augment_policy is not None:
            tl.append(M.AutoAugment(policy=T.AutoAugmentPolicy(auto_augment_policy), interpolation=interpolation))
        tl.append(M.PILToTensor())
        tl += [M.ToDtype(torch.float, scale=True) if use_v2 else M.ConvertImageDtype(torch.float),
               M.Normalize(mean=MEAN, std=STD)]
        if random_erase_prob > 0:
            tl.append(M.RandomErasing(p=random_erase_prob))
        if use_v2:
            tl.append(v2.ToPureTensor())
        self.transforms = M.Compose(tl)

    def __call__(self, img):
        return self.transforms(img)


# --------------------------------------------------------------------------
# recognition


@pytest.mark.parametrize("use_v2", [False, True])
@pytest.mark.parametrize("policy", [None, "ta_wide", "ra", "imagenet", "cifar10", "svhn"])
def test_preset_objects_compile_whole(policy, use_v2):
    preset = PresetTrain(auto_augment_policy=policy, random_erase_prob=0.1, use_v2=use_v2)
    spec, rest, desc = compile_transform(preset)
    assert rest is None, desc
    assert "python: nothing" in desc
    assert spec["dtype"] == "float32" and spec["normalize"]
    assert ("policy" in spec) == (policy is not None)
    assert spec["erase"]["p"] == 0.1 and spec["erase"]["value"] == [0.0] and spec["erase"]["mode"] == 0


def test_policy_tables_are_the_transforms_own():
    """The magnitudes are read from each transform's augmentation space, so
    v1 and v2 keep their own float32 rounding (v2 scales linspace(1, 0) by
    255; v1 has linspace(255, 0))."""
    s1, _, _ = compile_transform(PresetTrain(auto_augment_policy="ta_wide"))
    s2, _, _ = compile_transform(PresetTrain(auto_augment_policy="ta_wide", use_v2=True))
    names1 = list(T.TrivialAugmentWide()._augmentation_space(31))
    assert [OP_NAMES[o[0]] for o in s1["policy"]["ops"]] == names1
    sol1 = s1["policy"]["ops"][names1.index("Solarize")][2]
    sol2 = s2["policy"]["ops"][names1.index("Solarize")][2]
    assert sol1 == [float(x) for x in torch.linspace(255.0, 0.0, 31)]
    assert sol2 == [255.0 * float(x) for x in torch.linspace(1.0, 0.0, 31)]
    assert sol1 != sol2
    ra, _, _ = compile_transform(T.Compose([T.RandomResizedCrop(96), T.RandAugment(num_ops=3, magnitude=7)]))
    p = ra["policy"]
    assert p["rounds"] == 3 and all(sub[0][1] == 7 for sub in p["subs"])
    tx = p["ops"][list(T.RandAugment()._augmentation_space(31, (96, 96))).index("TranslateX")][2]
    assert tx[-1] == pytest.approx(150.0 / 331.0 * 96, rel=1e-6)   # sized by the sample


def test_autoaugment_subpolicies_carry_probabilities_and_bins():
    aa = T.AutoAugment(T.AutoAugmentPolicy.IMAGENET)
    spec, _, _ = compile_transform(T.Compose([T.RandomResizedCrop(64), aa]))
    names = list(aa._augmentation_space(10, (64, 64)))
    subs = spec["policy"]["subs"]
    assert len(subs) == len(aa.policies) == 25
    for ours, theirs in zip(subs, aa.policies):
        for (i, b, p), (name, prob, mag_id) in zip(ours, theirs):
            assert names[i] == name and p == prob and b == (-1 if mag_id is None else mag_id)


def test_unsupported_policy_settings_stay_in_python():
    # bicubic geometric ops, and a fill that is not uint8, are not native
    for aug in (T.TrivialAugmentWide(interpolation=T.InterpolationMode.BICUBIC), T.TrivialAugmentWide(fill=[300])):
        spec, rest, desc = compile_transform(T.Compose([T.RandomResizedCrop(64), aug, T.PILToTensor()]))
        assert "policy" not in spec and rest is not None
        assert "TrivialAugmentWide" in repr(rest)
    # a policy without a fixed sample size (no crop) runs in Python too
    spec, rest, _ = compile_transform(T.Compose([T.Resize(64), T.TrivialAugmentWide(), T.PILToTensor()]))
    assert "policy" not in spec and rest is not None


def test_trailing_to_pure_tensor_is_an_identity():
    spec, rest, desc = compile_transform(v2.Compose([v2.RandomResizedCrop(64), v2.PILToTensor(), v2.ToPureTensor()]))
    assert rest is None and "python: nothing" in desc


def test_random_erasing_before_normalize_keeps_torchvisions_order():
    """Erasing first, then normalizing changes the erased value: the erase
    is the last native step and Normalize runs after it, on its output."""
    tf = T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.RandomErasing(p=1.0, value=0.5),
                    T.Normalize(MEAN, STD)])
    spec, rest, _ = compile_transform(tf)
    assert spec["erase"]["value"] == [0.5] and not spec["normalize"]
    assert "Normalize" in repr(rest)
    arr = np.asarray(photo_image("chelsea", (120, 90)))
    plan = _C._plan_sample(spec, 120, 90, seed=1, epoch=0, index=0)
    ours = rest(torch.from_numpy(_C._render(spec, arr, plan)))
    x, y, w, h = plan["box"]
    ref = TF.to_tensor(TF.resized_crop(Image.fromarray(arr), y, x, h, w, [64, 64], antialias=True))
    (ex, ey, ew, eh), = plan["erase"]
    ref = TF.normalize(TF.erase(ref, ey, ex, eh, ew, torch.tensor([0.5])[:, None, None]), MEAN, STD)
    assert torch.equal(ours, ref)


def test_a_holder_with_more_state_is_not_unwrapped():
    class Holder:
        def __init__(self):
            self.transforms = T.Compose([T.RandomResizedCrop(64), T.PILToTensor()])
            self.other = 1

        def __call__(self, img):
            return self.transforms(img)

    spec, rest, desc = compile_transform(Holder())
    assert spec["geom"] == "none" and rest is not None


def test_timm_train_pieces_are_recognised():
    timm_t = pytest.importorskip("timm.data.transforms")
    rrc = timm_t.RandomResizedCropAndInterpolation(96, interpolation="bilinear")
    tf = T.Compose([rrc, T.RandomHorizontalFlip(), timm_t.MaybeToTensor(), T.Normalize(MEAN, STD)])
    spec, rest, desc = compile_transform(tf)
    assert rest is None and spec["geom"] == "rrc" and spec["out_h"] == 96 and spec["normalize"]
    # bicubic and "random" (bilinear or bicubic per sample) are native too (tests/test_bicubic.py)
    for interp, code in (("bicubic", 1), ("random", 2)):
        rnd = timm_t.RandomResizedCropAndInterpolation(96, interpolation=interp)
        spec, rest, desc = compile_transform(T.Compose([rnd, timm_t.MaybeToTensor()]))
        assert rest is None and spec["geom"] == "rrc" and spec["interp"] == code
    # another mode is not native: it stays in Python, named
    other = timm_t.RandomResizedCropAndInterpolation(96, interpolation="lanczos")
    spec, rest, desc = compile_transform(T.Compose([other, timm_t.MaybeToTensor()]))
    assert spec["geom"] == "none" and "RandomResizedCropAndInterpolation" in repr(rest)


# --------------------------------------------------------------------------
# distributions


def _plans(spec, n, W=320, H=240, seed=5):
    return [_C._plan_sample(spec, W, H, seed=seed, epoch=0, index=i) for i in range(n)]


def test_trivial_augment_draws_ops_bins_and_signs_uniformly():
    spec, _, _ = compile_transform(PresetTrain(crop_size=64, auto_augment_policy="ta_wide"))
    ops = spec["policy"]["ops"]
    n = 14000
    plans = _plans(spec, n)
    counts = {code: 0 for code, _, _ in ops}
    shear = []
    for p in plans:
        assert len(p["aug"]) <= 1
        code, mag = p["aug"][0] if p["aug"] else (0, 0.0)
        counts[code] += 1
        if code == _AUG_OPS["ShearX"]:
            shear.append(mag)
    expected = n / len(ops)
    for code, c in counts.items():   # 14 ops, ~1000 each: 5 sigma ~ 150
        assert abs(c - expected) < 5 * math.sqrt(expected), (OP_NAMES[code], c)
    bins = ops[[o[0] for o in ops].index(_AUG_OPS["ShearX"])][2]
    idx = [int(np.argmin([abs(abs(m) - b) for b in bins])) for m in shear]
    assert len(set(idx)) == 31
    hist = np.bincount(idx, minlength=31)
    assert hist.max() < 3 * hist.mean()
    neg = sum(m < 0 for m in shear if m != 0)
    pos = sum(m > 0 for m in shear if m != 0)
    assert abs(neg - pos) < 5 * math.sqrt(neg + pos)


def test_autoaugment_step_probabilities():
    aa = T.AutoAugment(T.AutoAugmentPolicy.IMAGENET)
    spec, _, _ = compile_transform(T.Compose([T.RandomResizedCrop(64), aa]))
    n = 20000
    plans = _plans(spec, n)
    # expected count of each op over all samples: sum over sub-policies of p / 25
    exp = {}
    for sub in aa.policies:
        for name, prob, _ in sub:
            exp[name] = exp.get(name, 0.0) + prob / len(aa.policies) * n
    got = {}
    for p in plans:
        for code, _ in p["aug"]:
            got[OP_NAMES[code]] = got.get(OP_NAMES[code], 0) + 1
    for name, e in exp.items():
        if name == "Identity":
            continue
        assert abs(got.get(name, 0) - e) < 5 * math.sqrt(e) + 5, (name, got.get(name), e)


def test_erase_box_distribution_matches_torchvision():
    spec, _, _ = compile_transform(PresetTrain(crop_size=64, random_erase_prob=0.5))
    n = 6000
    ours = [p["erase"] for p in _plans(spec, n)]
    assert all(e is None or len(e) == 1 for e in ours)
    hit = [e[0] for e in ours if e is not None]
    assert abs(len(hit) - n * 0.5) < 5 * math.sqrt(n * 0.25)
    torch.manual_seed(0)
    img = torch.zeros(3, 64, 64)
    theirs = []
    for _ in range(len(hit)):
        i, j, h, w, _v = T.RandomErasing.get_params(img, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=[0.0])
        if h < 64:   # get_params returns the whole image when all 10 tries fail: no erase
            theirs.append((j, i, w, h))
    for k in range(4):   # x, y, w, h: means within 4 standard errors
        a = np.array([e[k] for e in hit], float)
        b = np.array([e[k] for e in theirs], float)
        se = math.sqrt(a.var() / len(a) + b.var() / len(b))
        assert abs(a.mean() - b.mean()) < 4 * se, (k, a.mean(), b.mean())
    for x, y, w, h in hit:
        assert 0 <= x <= 64 - w and 0 <= y <= 64 - h and 0 < w < 64 and 0 < h < 64


# --------------------------------------------------------------------------
# pixels: a plan replayed through torchvision equals the C pipeline


def _replay(im, spec, plan, policy_obj, erase_value=None, use_v2=False):
    """torchvision's result for this plan on PIL image im (the preset's
    steps, with the plan's parameters; v2's ToDtype(scale=True) multiplies
    by 1/255 where v1's ConvertImageDtype divides)."""
    x, y, w, h = plan["box"]
    out = TF.resized_crop(im, y, x, h, w, [spec["out_h"], spec["out_w"]],
                          interpolation=T.InterpolationMode.BILINEAR, antialias=True)
    if plan["flip"]:
        out = TF.hflip(out)
    if policy_obj is not None:
        interp = policy_obj.interpolation
        fill = policy_obj.fill
        for code, mag in plan["aug"]:
            out = tv_aa._apply_op(out, OP_NAMES[code], mag, interpolation=interp, fill=fill)
    u8 = TF.pil_to_tensor(out)
    f = v2.functional.to_dtype(u8, torch.float32, scale=True) if use_v2 else TF.convert_image_dtype(u8, torch.float)
    t = TF.normalize(f, MEAN, STD)
    for ex, ey, ew, eh in plan["erase"] or ():
        t = TF.erase(t, ey, ex, eh, ew, torch.tensor(erase_value)[:, None, None])
    return t


@pytest.mark.parametrize("policy", ["ta_wide", "ra", "imagenet"])
def test_recipe_pixels_equal_torchvision_for_the_plan(policy):
    preset = PresetTrain(crop_size=96, auto_augment_policy=policy, random_erase_prob=0.3)
    spec, rest, _ = compile_transform(preset)
    assert rest is None
    pol = [t for t in preset.transforms.transforms if type(t).__name__ in
           ("TrivialAugmentWide", "RandAugment", "AutoAugment")][0]
    ops_seen = set()
    for name in ("astronaut", "chelsea", "coffee"):
        im = photo_image(name, (257, 191))
        arr = np.asarray(im)
        for i in range(40):
            plan = _C._plan_sample(spec, im.width, im.height, seed=3, epoch=1, index=i)
            ops_seen.update(c for c, _ in plan["aug"])
            ours = torch.from_numpy(_C._render(spec, arr, plan))
            ref = _replay(im, spec, plan, pol, [0.0])
            assert torch.equal(ours, ref), (name, i, plan, (ours - ref).abs().max())
    assert len(ops_seen) >= 8


def test_imagefolder_runs_the_preset_natively_and_matches_the_replay(tmp_path):
    from fastloader.tools.sample import make_sample

    root = tmp_path / "train"
    make_sample(str(root), n=24, classes=2, seed=1, progress=False, processes=1)
    preset = PresetTrain(crop_size=64, auto_augment_policy="ta_wide", random_erase_prob=0.5, use_v2=True)
    ds = fastloader.ImageFolder(str(root), transform=preset)
    assert "python: nothing" in ds.pipeline_description
    pol = preset.transforms.transforms[2]
    seed = 17
    batches = [list(fastloader.DataLoader(ds, batch_size=8, num_workers=nw, seed=seed)) for nw in (0, 2)]
    for (xa, ya), (xb, yb) in zip(*batches):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    images = torch.cat([x for x, _ in batches[0]])
    erased = 0
    for i, (path, _label) in enumerate(ds.samples):
        with Image.open(path) as im:
            im = im.convert("RGB")
        plan = ds.plan(i, im.width, im.height, 0, seed)
        erased += plan["erase"] is not None
        ref = _replay(im, dict(out_h=64, out_w=64), plan, pol, [0.0], use_v2=True)
        assert torch.equal(images[i], ref), (i, plan)
    assert 0 < erased < 24


def test_random_erase_values_are_normal_and_keyed():
    tf = T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.RandomErasing(p=1.0, value="random")])
    spec, rest, _ = compile_transform(tf)
    assert rest is None and spec["erase"]["mode"] == 1
    arr = np.asarray(photo_image("coffee", (200, 150)))
    vals = []
    for i in range(30):
        plan = _C._plan_sample(spec, 200, 150, seed=2, epoch=0, index=i)
        out = _C._render(spec, arr, plan)
        assert np.array_equal(out, _C._render(spec, arr, plan))   # the noise is keyed, not fresh
        if plan["erase"] is None:
            continue
        (x, y, w, h), = plan["erase"]
        vals.append(out[:, y:y + h, x:x + w].ravel())
        plain = dict(plan, erase=None)
        rest_px = _C._render(spec, arr, plain)
        mask = np.ones(out.shape, bool)
        mask[:, y:y + h, x:x + w] = False
        assert np.array_equal(out[mask], rest_px[mask])   # nothing outside the box changes
    v = np.concatenate(vals)
    assert abs(v.mean()) < 0.02 and abs(v.std() - 1.0) < 0.02


def test_timm_random_erasing_modes_and_counts():
    re_mod = pytest.importorskip("timm.data.random_erasing")
    arr = np.asarray(photo_image("rocket", (180, 140)))
    for mode, code in (("const", 0), ("rand", 2), ("pixel", 1)):
        er = re_mod.RandomErasing(1.0, mode=mode, max_count=3, device="cpu")
        tf = T.Compose([T.RandomResizedCrop(48), T.ToTensor(), T.Normalize(MEAN, STD), er])
        spec, rest, _ = compile_transform(tf)
        assert rest is None and spec["erase"]["mode"] == code and spec["erase"]["count"] == (1, 3)
        counts = set()
        for i in range(40):
            plan = _C._plan_sample(spec, 180, 140, seed=4, epoch=0, index=i)
            boxes = plan["erase"] or []
            counts.add(len(boxes))
            out = _C._render(spec, arr, plan)
            ref = _C._render(spec, arr, dict(plan, erase=None))
            for x, y, w, h in boxes:
                region = out[:, y:y + h, x:x + w]
                if mode == "const":
                    assert not region.any()
                elif mode == "rand":   # one value per channel and box (unless a later box overlaps)
                    assert all(len(np.unique(region[c])) <= 3 for c in range(3))
            mask = np.ones(out.shape, bool)
            for x, y, w, h in boxes:
                mask[:, y:y + h, x:x + w] = False
            assert np.array_equal(out[mask], ref[mask])
        assert counts >= {1, 2, 3}


def test_nearest_policy_on_odd_sizes_equals_torchvision():
    """TrivialAugmentWide's default NEAREST on a 35 x 33 output: the policy
    scratch's int table must sit 8-byte aligned after odd-sized image and
    row buffers (UBSan flagged a misaligned store there, found by
    fuzz_render's policies); the pixels stay torchvision's."""
    pol = T.TrivialAugmentWide()
    tf = T.Compose([T.RandomResizedCrop((33, 35), antialias=True), pol, T.PILToTensor(),
                    T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)])
    spec, rest, _ = compile_transform(tf)
    assert rest is None and spec["policy"]["interp"] == 0
    im = photo_image("chelsea", (101, 77))
    arr = np.asarray(im)
    seen = set()
    for i in range(120):
        plan = _C._plan_sample(spec, im.width, im.height, seed=9, epoch=0, index=i)
        seen.update(c for c, _ in plan["aug"])
        ours = torch.from_numpy(_C._render(spec, arr, plan))
        ref = _replay(im, spec, plan, pol)
        assert torch.equal(ours, ref), (i, plan)
    assert _AUG_OPS["TranslateX"] in seen or _AUG_OPS["TranslateY"] in seen
