"""timm's Mixup (``timm.data.Mixup``) handed to fastloader.DataLoader as
``batch_transform=`` and run in C (csrc/image/mix.c fl_timm_mix_*).

For the parameters a batch drew (``_C._timm_mix_batch``'s params: lam as
timm's ``_params_per_batch`` / ``_params_per_elem`` return it, use_cutmix,
and the integers the box drew), the images and soft labels equal what
timm's own ``Mixup.__call__`` computes from those draws, bit for bit: the
test replays them through timm's code, with only the random calls replaced
(``_params_per_*`` returns the draws; ``np.random.randint`` hands out the
box's integers and checks each against the range timm asks for).  The
draws' distributions are checked against timm's own at fixed seeds."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mixup_mod = pytest.importorskip("timm.data.mixup")
from timm.data import FastCollateMixup, Mixup  # noqa: E402

import fastloader  # noqa: E402
from fastloader import _C  # noqa: E402
from fastloader.batch import BatchStage, compile_batch_transform, compile_timm_mixup  # noqa: E402
from fastloader.stats import PerformanceWarning  # noqa: E402


def _batch(n=8, c=3, h=13, w=17, classes=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, h, w, generator=g), torch.randint(0, classes, (n,), generator=g)


def _spec(m):
    spec, why = compile_timm_mixup(m)
    assert spec is not None, why
    return spec


def _replay(m, x, y, params, monkeypatch):
    """timm's own m(x, y) with its random draws replaced by params'."""
    ints = [v for mixed, cut, r in zip(params["mixed"], params["use_cutmix"], params["randint"]) if mixed and cut
            for v in r]
    asked = []

    def randint(low, high=None, size=None):
        assert size is None and high is not None
        v = ints.pop(0)
        asked.append((low, v, high))
        assert low <= v < high, (low, v, high)
        return v

    with monkeypatch.context() as mp:
        mp.setattr(np.random, "randint", randint)
        if params["mode"] == "batch":
            mp.setattr(m, "_params_per_batch", lambda: (float(params["lam_draw"][0]), bool(params["use_cutmix"][0])),
                       raising=False)
        else:
            mp.setattr(m, "_params_per_elem", lambda n: (np.array(params["lam_draw"], np.float32),
                                                         np.array(params["use_cutmix"], bool)), raising=False)
        out = m(x, y)
    assert not ints, "timm drew fewer box integers than the native draws"
    assert "_params_per_batch" not in vars(m) and "_params_per_elem" not in vars(m)
    return out


CONFIGS = {
    "mixup+cutmix": dict(mixup_alpha=0.8, cutmix_alpha=1.0),
    "mixup only, no smoothing": dict(mixup_alpha=0.2, cutmix_alpha=0.0, label_smoothing=0.0),
    "cutmix only, uncorrected": dict(mixup_alpha=0.0, cutmix_alpha=0.5, correct_lam=False),
    "cutmix_minmax": dict(mixup_alpha=0.3, cutmix_minmax=(0.2, 0.8)),
    "prob, switch_prob, smoothing": dict(mixup_alpha=0.1, cutmix_alpha=0.1, prob=0.6, switch_prob=0.3,
                                         label_smoothing=0.3),
    "tiny alphas": dict(mixup_alpha=0.004, cutmix_alpha=0.02, label_smoothing=0.05),
}
SHAPES = [(8, 3, 13, 17), (2, 1, 1, 5), (10, 2, 32, 24), (4, 3, 7, 1)]


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_native_equals_timm_for_the_drawn_parameters(mode, config, monkeypatch):
    m = Mixup(mode=mode, num_classes=7, **CONFIGS[config])
    spec = _spec(m)
    seen = dict(mixup=0, cutmix=0, unmixed=0)
    lo, hi = m.cutmix_minmax or (0, 1)
    shapes = [s for s in SHAPES if int(s[2] * lo) < int(s[2] * hi) and int(s[3] * lo) < int(s[3] * hi)]
    for b in range(32):
        x, y = _batch(*shapes[b % len(shapes)], seed=b)
        ref = x.clone()
        soft, params = _C._timm_mix_batch(x.numpy(), y.numpy(), spec, 11, 2, b)
        assert params["mode"] == mode
        assert len(params["lam"]) == {"batch": 1, "pair": len(y) // 2, "elem": len(y)}[mode]
        for mixed, cut in zip(params["mixed"], params["use_cutmix"]):
            seen["unmixed" if not mixed else "cutmix" if cut else "mixup"] += 1
        x_t, y_t = _replay(m, ref, y, params, monkeypatch)
        assert torch.equal(x, x_t), (b, params)
        assert y_t.dtype == torch.float32 and torch.equal(torch.from_numpy(soft), y_t), (b, params)
    kinds = {k for k, v in seen.items() if v}
    want = {"mixup+cutmix": {"mixup", "cutmix"}, "mixup only, no smoothing": {"mixup"},
            "cutmix only, uncorrected": {"cutmix"}, "cutmix_minmax": {"mixup", "cutmix"},
            "prob, switch_prob, smoothing": {"mixup", "cutmix", "unmixed"}, "tiny alphas": {"mixup", "cutmix"}}
    assert want[config] <= kinds, seen


def test_batch_mode_pairs_sample_i_with_n_minus_1_minus_i():
    """timm's x.flip(0), not torchvision's roll: with lam drawn, sample 0 is
    mixed from samples 0 and N - 1 only."""
    m = Mixup(mixup_alpha=1.0, cutmix_alpha=0.0, num_classes=5, label_smoothing=0.0)
    x = torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1).repeat(1, 1, 2, 2)
    y = torch.arange(6) % 5
    soft, params = _C._timm_mix_batch(x.numpy(), y.numpy(), _spec(m), 0, 0, 0)
    lam = np.float32(params["lam"][0])
    assert params["mixed"] == [True] and 0 < lam < 1
    for i in range(6):
        j = 5 - i
        want = np.float32(i) * lam + np.float32(j) * np.float32(1.0 - params["lam"][0])
        assert float(x[i, 0, 0, 0]) == float(want)
    # row 1: its own label 1 with lam, sample 4's label 4 with 1 - lam (no smoothing)
    assert soft[1, 1] == lam and soft[1, 4] == np.float32(1.0 - params["lam"][0]) and soft[1].sum() == soft[1, [1, 4]].sum()


def test_label_smoothing_and_mixup_enabled_off_read_on_every_batch():
    """timm's train.py sets mixup_enabled = False after mixup_off_epoch: the
    stage reads the object on every batch, so the next batch is only
    smoothed, as timm's own call makes it."""
    m = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=6, mode="elem")
    stage = BatchStage(m)
    assert stage.spec is not None and stage.description.startswith("native")
    x, y = _batch(classes=6)
    xs, ys = stage((x.clone(), y), 3, 0, 0)
    assert not torch.equal(xs, x)
    m.mixup_enabled = False
    xs, ys = stage((x.clone(), y), 3, 0, 1)
    x_t, y_t = m(x.clone(), y)
    assert torch.equal(xs, x) and torch.equal(x_t, x)
    assert torch.equal(ys, y_t)
    assert float(ys[0, y[0]]) == float(np.float32(1 - 0.1 + 0.1 / 6))
    assert stage.native_batches == 2 and stage.python_batches == 0


def _timm_elems(m, n):
    """n of timm's own per-element draws: (mixed, use_cutmix, lam_draw, box area) from numpy's generator."""
    lam, cut = m._params_per_elem(n)
    area = np.zeros(n)
    for i in np.nonzero((lam != 1.0) & cut)[0]:
        (yl, yh, xl, xh), _ = mixup_mod.cutmix_bbox_and_lam((3, 16, 20), lam[i], ratio_minmax=m.cutmix_minmax,
                                                            correct_lam=m.correct_lam)
        area[i] = (yh - yl) * (xh - xl)
    return lam != 1.0, cut, lam, area


def _native_elems(m, batches, n=64):
    spec = _spec(m)
    x, y = _batch(n=n, c=1, h=16, w=20, classes=m.num_classes)
    out = [[], [], [], []]
    for b in range(batches):
        _, p = _C._timm_mix_batch(x.clone().numpy(), y.numpy(), spec, 5, 0, b)
        out[0] += p["mixed"]
        out[1] += p["use_cutmix"]
        out[2] += p["lam_draw"]
        out[3] += [(yh - yl) * (xh - xl) for yl, yh, xl, xh in p["box"]]
    return [np.array(v) for v in out]


def _close(a, b, what):
    """Two samples' means agree within 4.5 standard errors."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    se = math.sqrt(a.var() / len(a) + b.var() / len(b)) + 1e-12
    assert abs(a.mean() - b.mean()) < 4.5 * se, (what, a.mean(), b.mean(), se)


@pytest.mark.parametrize("kw", [dict(mixup_alpha=0.4, cutmix_alpha=1.0, prob=0.7, switch_prob=0.35),
                                dict(mixup_alpha=2.0, cutmix_alpha=0.0, prob=0.9),
                                dict(mixup_alpha=0.5, cutmix_minmax=(0.3, 0.9), switch_prob=0.6)])
def test_draws_follow_timms_distributions(kw):
    stats = pytest.importorskip("scipy.stats")
    m = Mixup(mode="elem", num_classes=3, **kw)
    np.random.seed(1234)
    t_mixed, t_cut, t_lam, t_area = _timm_elems(m, 4096)
    o_mixed, o_cut, o_lam, o_area = _native_elems(m, 64)   # 64 x 64 = 4096 element draws
    _close(o_mixed, t_mixed, "probability of mixing")
    _close(o_cut[o_mixed], t_cut[t_mixed], "switch probability")
    # (a lam that rounds to float32 1.0 mixes nothing, in timm too: hence the 0.002)
    assert abs(o_mixed.mean() - m.mix_prob) < 5 * math.sqrt(m.mix_prob * (1 - m.mix_prob) / 4096) + 0.002
    for kind in (False, True):
        a = o_lam[o_mixed & (o_cut == kind)]
        b = t_lam[t_mixed & (t_cut == kind)]
        if len(b) < 50:
            assert len(a) < 50 + 5 * math.sqrt(50)
            continue
        alpha = m.cutmix_alpha if kind else m.mixup_alpha
        assert stats.kstest(a, stats.beta(alpha, alpha).cdf).pvalue > 1e-3, (kind, alpha)
        assert stats.ks_2samp(a, b).pvalue > 1e-3, kind
        _close(a, b, "lam mean")
        _close((a - 0.5) ** 2, (b - 0.5) ** 2, "lam variance")
        if kind:
            _close(o_area[o_mixed & o_cut], t_area[t_mixed & t_cut], "box area")
            _close(o_area[o_mixed & o_cut] ** 2, t_area[t_mixed & t_cut] ** 2, "box area's second moment")


def test_batch_mode_draws_follow_timms_distributions():
    m = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.8, switch_prob=0.5, num_classes=3)
    spec = _spec(m)
    x, y = _batch(n=2, c=1, h=16, w=20, classes=3)
    np.random.seed(7)
    theirs = [m._params_per_batch() for _ in range(3000)]
    ours = [_C._timm_mix_batch(x.clone().numpy(), y.numpy(), spec, 9, 1, b)[1] for b in range(3000)]
    _close([p["mixed"][0] for p in ours], [lam != 1.0 for lam, _ in theirs], "probability of mixing")
    _close([p["use_cutmix"][0] for p in ours if p["mixed"][0]], [c for lam, c in theirs if lam != 1.0], "switch")
    for kind in (False, True):
        a = [p["lam_draw"][0] for p in ours if p["mixed"][0] and p["use_cutmix"][0] == kind]
        b = [lam for lam, c in theirs if lam != 1.0 and c == kind]
        stats = pytest.importorskip("scipy.stats")
        assert stats.ks_2samp(a, b).pvalue > 1e-3, kind
        if kind:   # the box from a double lam (rand_bbox), against timm's own on its own lams
            np.random.seed(8)
            t_area = [np.prod(np.diff(np.reshape(mixup_mod.cutmix_bbox_and_lam((2, 1, 16, 20), lam)[0], (2, 2)))
                              ) for lam in b]
            o_area = [(yh - yl) * (xh - xl) for p in ours if p["mixed"][0] and p["use_cutmix"][0]
                      for yl, yh, xl, xh in p["box"]]
            _close(o_area, t_area, "box area")


def test_a_tiny_alpha_gives_lambdas_near_0_or_1():
    """Beta(a, a) for a far below 0.01: both Gamma boosts underflow a double
    for a quarter of the draws; the ratio is then taken in logarithms (it
    used to come out 0.5)."""
    m = Mixup(mixup_alpha=1e-3, cutmix_alpha=0.0, num_classes=3, mode="elem")
    _, _, lam, _ = _native_elems(m, 8)
    mixed = lam[lam != 1.0]
    assert len(mixed) > 100 and not np.any(mixed == 0.5)
    assert np.mean((mixed > 0.01) & (mixed < 0.99)) < 0.05
    assert 0.3 < np.mean(lam < 0.5) < 0.7


def test_odd_batch_size_raises_as_timm_does_and_the_loader_warns_first():
    m = Mixup(num_classes=5)
    x, y = _batch(n=5, classes=5)
    with pytest.raises(AssertionError, match="Batch size should be even"):
        m(x.clone(), y)
    stage = BatchStage(m)
    with pytest.raises(AssertionError, match=r"even batch size.*batch 3 of epoch 1 has 5 samples.*drop_last=True"):
        stage((x.clone(), y), 0, 1, 3)
    with pytest.raises(ValueError, match="batch size must be even"):
        _C._timm_mix_batch(x.numpy(), y.numpy(), _spec(m), 0, 0, 0)
    data = [(torch.zeros(3, 4, 4), 0)] * 11
    with pytest.warns(UserWarning, match="last batch of each epoch has 3 samples"):
        fastloader.DataLoader(data, batch_size=4, batch_transform=m)
    with pytest.warns(UserWarning, match="batch_size=3 is odd"):
        fastloader.DataLoader(data, batch_size=3, drop_last=True, batch_transform=m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastloader.DataLoader(data, batch_size=4, drop_last=True, batch_transform=m)
        fastloader.DataLoader(data[:10], batch_size=4, batch_transform=m)   # last batch 2: even


class _Tensors(torch.utils.data.Dataset):
    def __init__(self, n, classes=5):
        g = torch.Generator().manual_seed(n)
        self.x = torch.randn(n, 3, 6, 8, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def test_the_last_partial_batch():
    """An even last batch is mixed as any other; an odd one is dropped with
    drop_last=True (timm's train.py), and raises timm's AssertionError without."""
    m = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=5, mode="pair")
    ds = _Tensors(22)
    kw = dict(batch_size=8, seed=3, generator=torch.Generator().manual_seed(0))
    mixed = list(fastloader.DataLoader(ds, batch_transform=m, **kw))
    plain = list(fastloader.DataLoader(ds, **kw))
    assert [len(b[1]) for b in mixed] == [8, 8, 6]
    for b, ((xm, ym), (xp, yp)) in enumerate(zip(mixed, plain)):
        soft, _ = _C._timm_mix_batch(xp.numpy(), yp.numpy(), _spec(m), 3, 0, b)
        assert torch.equal(xm, xp) and torch.equal(ym, torch.from_numpy(soft))
    ds = _Tensors(23)
    assert [len(b[1]) for b in fastloader.DataLoader(ds, batch_size=8, drop_last=True, batch_transform=m)] == [8, 8]
    with pytest.warns(UserWarning, match="7 samples"):
        dl = fastloader.DataLoader(ds, batch_size=8, batch_transform=m)
    it = iter(dl)
    next(it), next(it)
    with pytest.raises(AssertionError, match="has 7 samples"):
        next(it)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from fastloader.tools.sample import make_sample

    root = tmp_path_factory.mktemp("timm_mix") / "train"
    make_sample(str(root), n=32, classes=4, seed=3, progress=False, processes=1)
    return str(root)


@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_loader_batches_are_the_same_for_any_num_workers(folder, mode):
    from torchvision import transforms as T

    ds = fastloader.ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(24), T.ToTensor()]))
    m = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=4, mode=mode)
    runs, stages = [], []
    for nw in (0, 2):
        dl = fastloader.DataLoader(ds, batch_size=8, shuffle=True, num_workers=nw, seed=5,
                                   generator=torch.Generator().manual_seed(1), batch_transform=m)
        runs.append(list(dl))
        stages.append(dl._fl_batch_stage)
    plain = list(fastloader.DataLoader(ds, batch_size=8, shuffle=True, num_workers=0, seed=5,
                                       generator=torch.Generator().manual_seed(1)))
    assert [s.native_batches for s in stages] == [4, 4] and stages[0].python_batches == 0
    for b, ((xa, ya), (xb, yb), (xp, yp)) in enumerate(zip(*runs, plain)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        soft, _ = _C._timm_mix_batch(xp.clone().numpy(), yp.numpy(), _spec(m), 5, 0, b)
        assert torch.equal(ya, torch.from_numpy(soft))
        assert ya.shape == (8, 4) and torch.allclose(ya.sum(1), torch.ones(8), atol=1e-6)


class _MyMixup(Mixup):
    pass


@pytest.mark.parametrize("make, why", [
    (lambda: Mixup(num_classes=4, multi_label=True), "multi_label=True"),
    (lambda: Mixup(num_classes=4, mode="half"), "mode='half'"),
    (lambda: _MyMixup(num_classes=4), "subclass of timm's Mixup"),
    (lambda: Mixup(num_classes=4, label_smoothing=np.float32(0.1)), "label_smoothing="),
    (lambda: Mixup(num_classes=4, cutmix_minmax=(np.float32(0.2), np.float32(0.8))), "cutmix_minmax="),
])
def test_settings_that_cannot_run_natively_run_timm_itself_and_say_why(make, why):
    m = make()
    with pytest.warns(PerformanceWarning, match=why):
        stage = BatchStage(m)
    assert stage.spec is None and stage.description.startswith("python") and why in stage.description
    x, y = _batch(classes=4)
    if getattr(m, "multi_label", False):
        y = torch.nn.functional.one_hot(y, 4).float()
    np.random.seed(3)
    xs, ys = stage((x.clone(), y), 0, 0, 0)
    np.random.seed(3)
    x_t, y_t = m(x.clone(), y)
    assert torch.equal(xs, x_t) and torch.equal(ys, y_t)
    assert stage.python_batches == 1 and stage.native_batches == 0


def test_a_patched_instance_or_a_float16_batch_runs_in_python():
    m = Mixup(num_classes=4)
    m._params_per_batch = lambda: (0.25, False)
    with pytest.warns(PerformanceWarning, match="_params_per_batch"):
        stage = BatchStage(m)
    x, y = _batch(classes=4)
    xs, _ = stage((x.clone(), y), 0, 0, 0)
    assert torch.equal(xs, x.mul(0.25).add_(x.flip(0).mul_(0.75)))
    m = Mixup(num_classes=4)
    stage = BatchStage(m)
    with pytest.warns(PerformanceWarning, match="float16"):
        stage((x.half(), y), 0, 0, 0)
    assert stage.python_batches == 1 and compile_batch_transform(m)["kind"] == "timm"


def test_fast_collate_mixup_is_refused_as_a_batch_transform_and_works_as_a_collate_fn(folder):
    with pytest.raises(TypeError, match="FastCollateMixup is a collate_fn.*timm.data.Mixup"):
        fastloader.DataLoader([0, 1], batch_transform=FastCollateMixup(num_classes=4))
    from torchvision import transforms as T

    ds = fastloader.ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(16), T.PILToTensor()]))
    dl = fastloader.DataLoader(ds, batch_size=8, collate_fn=FastCollateMixup(num_classes=4))
    with pytest.warns(PerformanceWarning, match="off its native batch path"):
        batches = list(dl)
    assert len(batches) == 4 and dl.stats()["path"] == "python"
    for x, y in batches:   # timm's own: uint8 images, smoothed soft targets
        assert x.dtype == torch.uint8 and x.shape == (8, 3, 16, 16) and y.shape == (8, 4)
        assert torch.allclose(y.sum(1), torch.ones(8))


def test_bad_input_gets_clear_errors():
    m = Mixup(num_classes=4, cutmix_alpha=1.0, mixup_alpha=0.0, cutmix_minmax=(0.2, 0.25))
    spec = _spec(m)
    x, y = _batch(n=2, h=3, w=3, classes=4)
    with pytest.raises(ValueError):   # numpy's randint(0, 0) in timm: 'high <= 0'
        np.random.seed(0)
        m(x.clone(), y)
    with pytest.raises(ValueError, match=r"cutmix_minmax \(0.2, 0.25\) leaves no CutMix box size for a 3 x 3"):
        _C._timm_mix_batch(x.clone().numpy(), y.numpy(), spec, 0, 0, 0)
    spec = _spec(Mixup(num_classes=4))
    x, y = _batch(n=4, classes=4)
    before = x.clone()
    with pytest.raises(ValueError, match="label 4 at position 2 is not in 0..3"):
        _C._timm_mix_batch(x.numpy(), np.array([0, 1, 4, 2]), spec, 0, 0, 0)
    assert torch.equal(x, before)
    with pytest.raises(TypeError, match="writable C-contiguous float32"):
        _C._timm_mix_batch(x.double().numpy(), y.numpy(), spec, 0, 0, 0)
    with pytest.raises(ValueError, match=r"int64 array of shape \(4,\)"):
        _C._timm_mix_batch(x.numpy(), y[:3].numpy(), spec, 0, 0, 0)
    with pytest.raises(ValueError, match="missing 'prob'"):
        _C._timm_mix_batch(x.numpy(), y.numpy(), {k: v for k, v in spec.items() if k != "prob"}, 0, 0, 0)
    with pytest.raises(ValueError, match="cutmix_minmax.*0 <= min < max <= 1"):
        _C._timm_mix_batch(x.numpy(), y.numpy(), dict(spec, cutmix_minmax=(0.5, 0.4)), 0, 0, 0)
