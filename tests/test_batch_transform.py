"""The batch stage: torchvision v2 MixUp / CutMix / RandomChoice handed to
fastloader.DataLoader(batch_transform=...), run in C on each batch.

For the parameters a batch drew, the result equals what torchvision's own
transform computes with those parameters (its ``transform(inpt, params)``),
bit for bit; the parameters' distributions are torchvision's (Beta(alpha,
alpha), the choice's weights, CutMix's box)."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
from torchvision.transforms import v2  # noqa: E402

import fastloader  # noqa: E402
from fastloader import _C  # noqa: E402
from fastloader.batch import BatchStage, compile_batch_transform  # noqa: E402


def _batch(n=8, c=3, h=24, w=20, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, h, w, generator=g), torch.randint(0, classes, (n,), generator=g)


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_mix_equals_torchvision_for_the_drawn_parameters(kind):
    t = (v2.MixUp if kind == "mixup" else v2.CutMix)(alpha=0.8, num_classes=5)
    spec = compile_batch_transform(t)
    assert spec is not None
    for b in range(40):
        x, y = _batch(seed=b)
        ref_in = x.clone()
        soft, params = _C._mix_batch(x.numpy(), y.numpy(), spec, 7, 1, b, 5)
        assert params["kind"] == kind and 0.0 <= params["lam"] <= 1.0
        if kind == "mixup":
            p = dict(lam=params["lam"], labels=y, batch_size=len(y))
        else:
            x1, y1, x2, y2 = params["box"]
            p = dict(box=(x1, y1, x2, y2), lam_adjusted=params["lam"], labels=y, batch_size=len(y))
        assert torch.equal(x, t.transform(ref_in, p))
        assert torch.equal(torch.from_numpy(soft), t.transform(y, p))


def test_lambda_is_beta_distributed():
    from scipy import stats

    for alpha in (0.2, 1.0, 2.5):
        spec = compile_batch_transform(v2.MixUp(alpha=alpha, num_classes=3))
        x, y = _batch(n=2, h=2, w=2, classes=3)
        lams = [_C._mix_batch(x.clone().numpy(), y.numpy(), spec, 1, 0, b, 3)[1]["lam"] for b in range(3000)]
        ks = stats.kstest(lams, stats.beta(alpha, alpha).cdf)
        assert ks.pvalue > 1e-3, (alpha, ks)


def test_random_choice_weights_and_cutmix_box_follow_torchvision():
    t = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=4), v2.CutMix(alpha=1.0, num_classes=4)], p=[0.3, 0.7])
    spec = compile_batch_transform(t)
    assert spec["kinds"] == [0, 1] and spec["p"] == pytest.approx([0.3, 0.7])
    x, y = _batch(n=2, h=32, w=48, classes=4)
    n = 4000
    draws = [_C._mix_batch(x.clone().numpy(), y.numpy(), spec, 3, 0, b, 4)[1] for b in range(n)]
    cut = [d for d in draws if d["kind"] == "cutmix"]
    assert abs(len(cut) - 0.7 * n) < 5 * math.sqrt(n * 0.21)
    torch.manual_seed(0)
    cm = v2.CutMix(alpha=1.0, num_classes=4)
    theirs = [cm.make_params([torch.zeros(2, 3, 32, 48)]) for _ in range(len(cut))]
    for field in ("lam", "w", "h"):
        if field == "lam":
            a = np.array([d["lam"] for d in cut])
            b = np.array([p["lam_adjusted"] for p in theirs])
        else:
            k = 0 if field == "w" else 1
            a = np.array([d["box"][2 + k] - d["box"][k] for d in cut], float)
            b = np.array([p["box"][2 + k] - p["box"][k] for p in theirs], float)
        se = math.sqrt(a.var() / len(a) + b.var() / len(b))
        assert abs(a.mean() - b.mean()) < 4 * se, (field, a.mean(), b.mean())


def test_unrecognised_batch_transforms_run_in_python():
    assert compile_batch_transform(v2.MixUp(alpha=1.0)) is None   # no num_classes: torchvision's error, in Python
    calls = []

    def mine(images, labels):
        calls.append(len(labels))
        return images * 2, labels

    stage = BatchStage(mine)
    assert stage.spec is None and stage.description.startswith("python")
    x, y = _batch()
    out = stage((x, y), 0, 0, 0)
    assert torch.equal(out[0], x * 2) and calls == [8]
    with pytest.raises(TypeError, match="batch_transform must be callable"):
        fastloader.DataLoader(list(range(4)), batch_transform=3)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from fastloader.tools.sample import make_sample

    root = tmp_path_factory.mktemp("mix") / "train"
    make_sample(str(root), n=32, classes=4, seed=2, progress=False, processes=1)
    return str(root)


def test_loader_batches_are_mixed_and_the_same_for_any_num_workers(folder):
    from torchvision import transforms as T

    tf = T.Compose([T.RandomResizedCrop(32), T.ToTensor()])
    ds = fastloader.ImageFolder(folder, transform=tf)
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=4), v2.CutMix(alpha=1.0, num_classes=4)])
    runs = []
    for nw in (0, 2):
        dl = fastloader.DataLoader(ds, batch_size=8, shuffle=True, num_workers=nw, seed=5,
                                   generator=torch.Generator().manual_seed(1), batch_transform=mix)
        runs.append(list(dl))
    plain = list(fastloader.DataLoader(ds, batch_size=8, shuffle=True, num_workers=0, seed=5,
                                       generator=torch.Generator().manual_seed(1)))
    for (xa, ya), (xb, yb), (xp, yp) in zip(*runs, plain):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert ya.shape == (8, 4) and ya.dtype == torch.float32
        assert torch.allclose(ya.sum(1), torch.ones(8))
        # each row mixes its own label with the previous sample's, with one weight per batch
        own = torch.nn.functional.one_hot(yp, 4).float()
        diff = [i for i in range(8) if yp[i] != yp[i - 1]]
        lam = float(ya[diff[0], yp[diff[0]]])
        assert torch.allclose(ya, own * lam + own.roll(1, 0) * (1 - lam), atol=1e-6)
        assert not torch.equal(xa, xp)


def test_a_custom_collate_fn_on_a_native_dataset_says_what_it_costs(folder):
    from torch.utils.data import default_collate
    from torchvision import transforms as T

    ds = fastloader.ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(32), T.ToTensor()]))
    mix = v2.MixUp(alpha=0.2, num_classes=4)

    def collate(batch):
        return mix(*default_collate(batch))

    dl = fastloader.DataLoader(ds, batch_size=8, collate_fn=collate)
    with pytest.warns(fastloader.PerformanceWarning, match="off its native batch path.*batch_transform="):
        x, y = next(iter(dl))
    assert y.shape == (8, 4)
    assert dl.stats()["path"] == "python"
