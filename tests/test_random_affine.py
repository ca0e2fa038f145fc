"""RandomAffine in the native pipeline (spec rotate 2 / 3 and aff_*, op
FL_AUG_TV_AFFINE(_V2) with the plan's ``affine`` parameters): torchvision's
F.affine on PIL images (Pillow's transform of v1's or v2's inverse matrix),
bit for bit for each plan's draw, nearest / bilinear / bicubic, fills and a
centre; its draws against get_params' distributions; what stays in Python."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fastloader import _C
from fastloader import transforms as T

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("skimage.data")
import torchvision.transforms as v1  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402
import torchvision.transforms.v2 as v2  # noqa: E402
import torchvision.transforms.v2.functional as F2  # noqa: E402
from torchvision.transforms import InterpolationMode as IM  # noqa: E402

from imgutil import PHOTOS, chw, photo_image, plan_on_pil  # noqa: E402


def _replay(pil, plan, lib, interp, fill):
    """The plan's crop and flips, then torchvision's affine with the plan's
    parameters (F.affine for v1, v2.functional.affine for v2) on the PIL image."""
    img = plan_on_pil(pil, plan)
    angle, tx, ty, scale, shx, shy, cx, cy = plan["affine"]
    fn = TF.affine if lib is v1 else F2.affine
    out = fn(img, angle=angle, translate=[int(tx), int(ty)], scale=scale, shear=[shx, shy], interpolation=interp,
             fill=fill, center=[cx, cy])
    return chw(out)


CASES = [
    (dict(degrees=30), IM.NEAREST, 0),
    (dict(degrees=(-10, 40), translate=(0.2, 0.1), scale=(0.7, 1.3)), IM.BILINEAR, 128),
    (dict(degrees=0, shear=(-20, 20, -10, 10), scale=(0.9, 1.1)), IM.BICUBIC, [10, 200, 30]),
    (dict(degrees=15, translate=(0.1, 0.1), shear=12, center=(10, 50)), IM.NEAREST, 7),
]


@pytest.mark.parametrize("lib", [v1, v2], ids=["v1", "v2"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_random_affine_bit_exact_against_torchvision(lib, case):
    kw, interp, fill = CASES[case]
    tf = lib.Compose([lib.RandomResizedCrop((60, 80)), lib.RandomHorizontalFlip(),
                      lib.RandomAffine(interpolation=interp, fill=fill, **kw), lib.PILToTensor()])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None and spec["rotate"] == (3 if lib is v2 else 2), desc
    for name in PHOTOS[:2]:
        pil = photo_image(name, (231, 170))
        a = np.asarray(pil)
        for i in range(25):
            p = _C._plan_sample(spec, pil.width, pil.height, 4, 1, i)
            assert p["aug"][0][0] == (45 if lib is v2 else 44) and p["affine"] is not None
            assert np.array_equal(_C._render(spec, a, p), _replay(pil, p, lib, interp, fill)), (name, i, p)


def test_any_parameters_against_each_version():
    """Angles all round, scales 0.5..2, both shears, translations, for
    nearest and bilinear: the v1 op against F.affine, the v2 op against
    v2.functional.affine (each computes the inverse matrix in its own
    operation order; the last bits they differ by moved no pixel in these
    draws, so this holds each op to its version's formula, not the two
    apart)."""
    pil = photo_image("coffee", (97, 61))
    a = np.asarray(pil)
    rng = np.random.default_rng(3)
    for k in range(120):
        angle, scale = float(rng.uniform(-180, 180)), float(rng.uniform(0.5, 2))
        shx, shy = (float(v) for v in rng.uniform(-40, 40, 2))
        tx, ty = (int(v) for v in rng.integers(-20, 20, 2))
        interp = (IM.NEAREST, IM.BILINEAR)[k % 2]
        plan = dict(box=(0, 0, 97, 61), resized=(97, 61), window=(0, 0), out=(97, 61), flip=False,
                    affine=(angle, tx, ty, scale, shx, shy, 48.5, 30.5))
        for lib, rotate, op in ((v1, 2, 44), (v2, 3, 45)):
            spec = dict(geom="none", out_h=61, out_w=97, rotate=rotate, rot_lo=0.0, rot_hi=0.0, rot_interp=k % 2)
            got = _C._render(spec, a, dict(plan, aug=[(op, 0.0)], aug_interp=[k % 2]))
            assert np.array_equal(got, _replay(pil, plan, lib, interp, 0)), (lib.__name__, plan)


def test_draws_follow_get_params():
    """angle, scale and shears uniform over their ranges as float32 values;
    translations round(U(-f w, f w)) half to even, so the end values are
    half as likely; the shear's y range only with four values."""
    spec = dict(geom="rrc", out_h=50, out_w=40, rotate=2, rot_lo=-20.0, rot_hi=10.0, rot_interp=1, aff_tx=0.1,
                aff_ty=0.05, aff_scale_lo=0.8, aff_scale_hi=1.2, aff_shear=[-6.0, 6.0])
    n = 4000
    d = np.array([_C._plan_sample(spec, 200, 150, 2, 0, i)["affine"] for i in range(n)])
    for col, (lo, hi) in {0: (-20, 10), 3: (0.8, 1.2), 4: (-6, 6)}.items():
        x = d[:, col]
        assert np.array_equal(x, x.astype(np.float32).astype(np.float64)), col
        assert x.min() >= lo and x.max() <= hi
        u = (x - lo) / (hi - lo)
        assert abs(u.mean() - 0.5) < 4 * math.sqrt(1 / 12 / n) and np.histogram(u, 4, (0, 1))[0].min() > 0.2 * n
    tx, ty = d[:, 1], d[:, 2]
    assert set(np.unique(tx)) <= set(range(-4, 5)) and set(np.unique(ty)) <= {-2.0, -1.0, 0.0, 1.0, 2.0}
    counts = {v: int((tx == v).sum()) for v in range(-4, 5)}
    assert abs(counts[4] - n / 16) < 4 * math.sqrt(n / 16) and abs(counts[0] - n / 8) < 4 * math.sqrt(n / 8), counts
    assert not d[:, 5].any() and (d[:, 6] == 20).all() and (d[:, 7] == 25).all()   # no y shear; the centre


def test_what_stays_in_python_and_spec_checks():
    for t in (v1.RandomAffine(10, interpolation=IM.BOX), v2.RandomAffine(10, fill=300)):
        spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomResizedCrop(32), t, v1.PILToTensor()]))
        assert "rotate" not in spec and rest is not None and "RandomAffine" in desc.split("python")[1], desc
    # a policy after it must share its fill (one fill for the augmented render)
    spec, rest, desc = T.compile_transform(v1.Compose([v1.RandomResizedCrop(32), v1.RandomAffine(10, fill=5),
                                                       v1.TrivialAugmentWide(), v1.PILToTensor()]))
    assert spec["rotate"] == 2 and "policy" not in spec and rest is not None, desc
    base = dict(geom="rrc", out_h=16, out_w=16, rotate=2, rot_lo=0.0, rot_hi=1.0)
    for bad, field in [(dict(aff_tx=1.5), "aff_tx"), (dict(aff_scale_lo=0.0, aff_scale_hi=1.0), "aff_scale"),
                       (dict(aff_shear=[5.0, -5.0]), "aff_shear"), (dict(aff_shear=[1.0, 2.0, 3.0]), "aff_shear"),
                       (dict(rot_interp=3), "rot_interp"), (dict(rotate=4), "rotate")]:
        with pytest.raises(ValueError, match=field):
            _C._plan_sample(dict(base, **bad), 50, 50, 0, 0, 0)
    with pytest.raises(ValueError, match="rot_interp"):   # RandomRotation keeps nearest / bilinear
        _C._plan_sample(dict(base, rotate=1, rot_interp=2), 50, 50, 0, 0, 0)
    with pytest.raises(ValueError, match="fl_aug_affine"):
        _C._augment_op(44, 0.0, np.zeros((4, 4, 3), np.uint8))


def test_imagefolder_runs_random_affine(tmp_path):
    import fastloader
    from PIL import Image
    from fastloader.tools.sample import make_sample

    root = tmp_path / "train"
    make_sample(str(root), n=8, classes=2, seed=6, progress=False, processes=1)
    tf = v2.Compose([v2.RandomResizedCrop(40), v2.RandomAffine(20, translate=(0.1, 0.1), scale=(0.8, 1.2),
                                                                interpolation=IM.BILINEAR), v2.PILToTensor()])
    ds = fastloader.ImageFolder(str(root), transform=tf)
    assert ds.pipeline_description.endswith("python: nothing"), ds.pipeline_description
    runs = [list(fastloader.DataLoader(ds, batch_size=4, num_workers=nw, seed=9)) for nw in (0, 2)]
    for (xa, ya), (xb, yb) in zip(*runs):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    images = torch.cat([x for x, _ in runs[0]])
    for i, (path, _label) in enumerate(ds.samples[:4]):
        with Image.open(path) as im:
            im = im.convert("RGB")
        p = ds.plan(i, im.width, im.height, 0, 9)
        assert np.array_equal(images[i].numpy(), _replay(im, p, v2, IM.BILINEAR, 0)), i
