"""GaussianBlur in the native pipeline (spec blur, augment.h fl_gblur_*):
torchvision's v1 and v2 GaussianBlur on PIL images (the uint8 tensor
kernel), bit for bit.  Its kernel weights against torchvision's own
_get_gaussian_kernel1d / _get_gaussian_kernel2d (torch's float32 arithmetic:
MKL's exp for v1, the softmax for v2, their sums' order); the op against
F.gaussian_blur / v2.functional.gaussian_blur on photographs down to 1 x 1
and what torch refuses; whole pipelines (SimCLR's) replayed; the draws;
the spec checks; ImageFolder with num_workers 0 and 2.  The long version of
the first two parts is scripts/check_gaussian_blur.py (docs/recipes.md has
its counts)."""
from __future__ import annotations

import hashlib
import json
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
pytest.importorskip("torchvision")
pytest.importorskip("skimage.data")
import torchvision.transforms as v1  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402
import torchvision.transforms.v2 as v2  # noqa: E402
import torchvision.transforms.v2.functional as TF2  # noqa: E402
from torchvision.transforms import _functional_tensor as F_t  # noqa: E402
from torchvision.transforms.v2.functional import _misc as F_misc  # noqa: E402

from imgutil import PHOTOS, chw, photo_image, plan_on_pil  # noqa: E402

CPU = torch.device("cpu")
ADJUST = {20: TF.adjust_brightness, 22: TF.adjust_contrast, 21: TF.adjust_saturation, 43: TF.adjust_hue}


@pytest.fixture(scope="module")
def native():
    """native(v2) -> dict(lanes, exp) of this machine's torch for that
    version, as compile_transform finds them (the sums' widths differ on
    AVX512: 8 lanes for v1's sum, 16 for v2's softmax); the module is
    skipped where torch's arithmetic is not the native op's (another CPU
    capability: the blur then stays in Python)."""
    found = {}
    for v2 in (False, True):
        verdict = T._blur_check(3, 5, 0.1, 2.0, v2, 16, 16, 3)
        if isinstance(verdict, str):
            pytest.skip(verdict)
        found[v2] = dict(lanes=verdict[0], exp=verdict[1])
    return lambda v2: found[bool(v2)]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.int32)


def _sigmas(rng, n: int) -> list[float]:
    """float32 sigmas: GaussianBlur's default range, and log-uniform over the native one."""
    s = np.concatenate([rng.uniform(0.1, 2.0, n - n // 3), np.exp(rng.uniform(np.log(1e-6), np.log(1e6), n // 3))])
    return [float(x) for x in np.clip(s.astype(np.float32), np.float32(1e-6), np.float32(1e6))]


@pytest.mark.parametrize("ver", ["v1", "v2"])
def test_kernel_weights_equal_torchvisions(native, ver):
    """Every odd side 1..31 with 40 sigmas, sides up to 127 with a few: the
    1-D weights bit for bit; and the 2-D kernels (torch.mm / the broadcast
    product) as the outer product of the native 1-D ones, square or not."""
    is_v2 = ver == "v2"
    ref1 = F_misc._get_gaussian_kernel1d if is_v2 else F_t._get_gaussian_kernel1d
    ref2 = F_misc._get_gaussian_kernel2d if is_v2 else F_t._get_gaussian_kernel2d
    rng = np.random.default_rng(7 + is_v2)
    n = 0
    for k in [*range(1, 32, 2), *range(33, 128, 6), 127]:
        for s in _sigmas(rng, 40 if k <= 31 else 4):
            want = ref1(k, s, dtype=torch.float32, device=CPU).numpy()
            got = _C._gaussian_kernel(k, s, is_v2, **native(is_v2))
            assert np.array_equal(_bits(want), _bits(got)), (k, s)
            n += 1
    assert n > 700
    for kx, ky in [(23, 23), (3, 9), (31, 1), (5, 17)]:
        for s in _sigmas(rng, 6):
            want = ref2([kx, ky], [s, s], dtype=torch.float32, device=CPU).numpy()
            gx, gy = (_C._gaussian_kernel(k, s, is_v2, **native(is_v2)) for k in (kx, ky))
            assert np.array_equal(_bits(want), _bits(np.outer(gy, gx))), (kx, ky, s)


def test_the_two_versions_differ_and_the_exp_matters(native):
    """v1's and v2's weights are other float32 numbers for most sigmas, and
    v1 with SLEEF's exp instead of torch's (MKL's) misses torch's in some:
    both choices are live, not decorative."""
    rng = np.random.default_rng(3)
    sig = _sigmas(rng, 60)
    assert sum(not np.array_equal(_C._gaussian_kernel(23, s, False, **native(False)),
                                             _C._gaussian_kernel(23, s, True, **native(True)))
               for s in sig) > 30
    if native(False)["exp"] == "mkl":
        other = dict(native(False), exp="sleef")
        misses = sum(not np.array_equal(_bits(F_t._get_gaussian_kernel1d(23, s, dtype=torch.float32, device=CPU).numpy()),
                                        _bits(_C._gaussian_kernel(23, s, False, **other))) for s in sig)
        assert misses > 5, misses


@pytest.mark.parametrize("ver", ["v1", "v2"])
def test_op_equals_torchvision_on_photographs(native, ver):
    """_C._gaussian_blur against F.gaussian_blur (v1) / v2.functional's on
    PIL photographs, RGB and L, from 224 x 224 down to 1 x 1, square and
    non-square kernels, the padding up to side - 1 (the most torch takes)."""
    is_v2 = ver == "v2"
    ref = TF2.gaussian_blur if is_v2 else TF.gaussian_blur
    rng = np.random.default_rng(11 + is_v2)
    cases = [((224, 224), (23, 23)), ((97, 61), (9, 15)), ((31, 200), (31, 3)), ((40, 7), (5, 13)),
             ((5, 4), (9, 7)), ((3, 3), (5, 5)), ((2, 5), (3, 9)), ((1, 1), (1, 1)), ((16, 1), (31, 1)),
             ((12, 12), (23, 23))]
    n = 0
    for i, ((w, h), (kx, ky)) in enumerate(cases):
        for mode in ("RGB", "L"):
            if mode == "L" and _torch_gemm(w, h, kx, ky):
                continue   # torch's other convolution: test_small_one_channel_blurs_stay_in_python
            pil = photo_image(PHOTOS[(i + (mode == "L")) % len(PHOTOS)], (w, h)).convert(mode)
            for s in (_sigmas(rng, 1)[0], float(np.float32(rng.uniform(0.1, 2.0))))[: 1 if w * h > 10000 else 2]:
                want = np.asarray(ref(pil, [kx, ky], [s, s]))
                got = _C._gaussian_blur(np.asarray(pil), (kx, ky), s, is_v2, **native(is_v2))
                assert np.array_equal(got, want), (w, h, mode, kx, ky, s, int((got != want).sum()))
                n += 1
            if w * h > 10000:
                break   # one mode of the big one is enough
    assert n >= 30


def _torch_gemm(w: int, h: int, kx: int, ky: int) -> bool:
    """augment.h fl_gblur_torch_gemm for one channel: torch's GEMM convolution."""
    return (kx, ky) != (1, 1) and (kx <= 3 or ky <= 3) and (w + kx // 2 * 2) * (h + ky // 2 * 2) <= 20480


def test_small_one_channel_blurs_stay_in_python(native):
    """A one-channel blur with a kernel side of 3 or less on a small image
    is summed by torch's GEMM convolution (im2col and MKL's sgemm), not
    oneDNN's: about 1 in 100 of them differs from the native op's order in a
    pixel (this one in one), so they stay in Python, the reason named; the
    same kernel on a larger image, or on three channels, is oneDNN's and
    native."""
    pil = photo_image("rocket", (31, 200)).convert("L")
    s = 2.115078926086426
    want = np.asarray(TF2.gaussian_blur(pil, [3, 9], [s, s]))
    got = _C._gaussian_blur(np.asarray(pil), (3, 9), s, True, **native(True))
    # found on an AVX2 machine; MKL picks its sgemm kernel by CPU, and on AVX512 this one sums in an order
    # that happens to agree here, so only AVX2 pins the difference
    diff = int((want != got).sum())
    assert diff == 1 if torch.backends.cpu.get_cpu_capability() == "AVX2" else diff <= 1, diff
    for size, channels, native_ok in [((31, 200), 1, False), ((150, 140), 1, True), ((31, 200), 3, True)]:
        steps = [v2.Grayscale()] if channels == 1 else []
        tf = v2.Compose([*steps, v2.CenterCrop(size[::-1]), v2.GaussianBlur((3, 9)), v2.PILToTensor()])
        spec, rest, desc = T.compile_transform(tf)
        assert ("blur" in spec) == native_ok and ("GEMM" in desc) != native_ok, desc
    bad = dict(p=1.0, pos=1, sigma=(0.1, 2.0), kernel=(3, 9), v2=True, lanes=native(True)["lanes"])
    with pytest.raises(ValueError, match="GEMM"):
        _C._plan_sample(dict(geom="rrc", out_h=200, out_w=31, out_channels=1, blur=bad), 50, 50, 0, 0, 0)


def test_padding_torch_refuses_is_refused_natively(native):
    """torch's reflect padding needs k // 2 < side: torchvision raises on
    such an image, the native op refuses it, and a pipeline whose output is
    that small keeps the blur in Python (where torch raises)."""
    pil = photo_image("rocket", (11, 5))
    for kx, ky in [(23, 3), (3, 11)]:
        with pytest.raises(RuntimeError, match="Padding size"):
            TF.gaussian_blur(pil, [kx, ky], [1.0, 1.0])
        with pytest.raises(ValueError, match="padding"):
            _C._gaussian_blur(np.asarray(pil), (kx, ky), 1.0, False, **native(False))
    tf = v1.Compose([v1.RandomResizedCrop(10), v1.GaussianBlur(23), v1.PILToTensor()])
    spec, rest, desc = T.compile_transform(tf)
    assert "blur" not in spec and rest is not None and "padding (11, 11) is not below" in desc, desc
    with pytest.raises(RuntimeError, match="Padding size"):
        rest(torch.from_numpy(_C._render(spec, np.asarray(photo_image("rocket", (40, 30))))))


def _replay(pil: Image.Image, plan: dict, spec: dict, ver: str) -> np.ndarray:
    """torchvision on PIL for a plan of crop, flips, ColorJitter ops,
    RandomGrayscale and GaussianBlur, in the spec's order of the last two."""
    img = plan_on_pil(pil, dict(plan, gray=False))
    for op, mag in plan["aug"]:
        img = ADJUST[op](img, mag)
    blur = (lambda im: (TF2 if ver == "v2" else TF).gaussian_blur(im, list(spec["blur"]["kernel"]),
                                                                  [plan["blur"]] * 2))
    if plan["blur"] is not None and spec["blur"]["pos"] == 0:
        img = blur(img)
    if plan["gray"] and img.mode == "RGB":
        img = img.convert("L").convert("RGB")
    if plan["blur"] is not None and spec["blur"]["pos"] == 1:
        img = blur(img)
    return chw(img)


@pytest.mark.parametrize("ver", ["v1", "v2"])
def test_simclr_pipeline_replayed(native, ver):
    """SimCLR's augmentation (crop, flip, RandomApply(ColorJitter, 0.8),
    RandomGrayscale(0.2), RandomApply(GaussianBlur(23), 0.5), ToTensor):
    every sample's draws replayed through torchvision's functional ops on
    PIL give the native float32 bytes; and a blur before RandomGrayscale
    runs there."""
    lib = v2 if ver == "v2" else v1
    pil = photo_image("chelsea", (300, 220))
    a = np.asarray(pil)
    to_tensor = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)] if ver == "v2" else [v1.ToTensor()]
    tf = lib.Compose([lib.RandomResizedCrop(48), lib.RandomHorizontalFlip(),
                      lib.RandomApply([lib.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8), lib.RandomGrayscale(p=0.2),
                      lib.RandomApply([lib.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.5), *to_tensor])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None, desc
    assert spec["blur"] == dict(p=0.5, pos=1, sigma=(0.1, 2.0), kernel=(23, 23), v2=ver == "v2",
                                lanes=native(ver == "v2")["lanes"],
                                **({} if ver == "v2" else dict(exp=native(False)["exp"])))
    blurred = gray = 0
    for i in range(16):
        p = _C._plan_sample(spec, pil.width, pil.height, 5, 0, i)
        blurred += p["blur"] is not None
        gray += p["gray"]
        u8 = torch.from_numpy(_replay(pil, p, spec, ver).copy())
        want = TF2.to_dtype(u8, torch.float32, scale=True) if ver == "v2" else u8.float() / 255.0   # as ToTensor
        assert torch.equal(torch.from_numpy(_C._render(spec, a, p)), want), p
    assert 2 < blurred < 14 and gray > 0, (blurred, gray)
    # before RandomGrayscale, alone (p = 1), a non-square kernel, one channel
    tf = lib.Compose([lib.Grayscale(), lib.RandomResizedCrop((40, 56)), lib.GaussianBlur((7, 31), sigma=(0.5, 5.0)),
                      lib.RandomGrayscale(0.5), lib.PILToTensor()])
    spec, rest, desc = T.compile_transform(tf)
    assert rest is None and spec["blur"]["pos"] == 0 and spec["blur"]["kernel"] == (7, 31), desc
    for i in range(6):
        p = _C._plan_sample(spec, pil.width, pil.height, 5, 0, i)
        assert p["blur"] is not None
        img = plan_on_pil(pil, dict(p, gray=False), out_channels=1)
        want = chw((TF2 if ver == "v2" else TF).gaussian_blur(img, [7, 31], [p["blur"]] * 2))
        assert np.array_equal(_C._render(spec, a, p), want), p


def test_draws_follow_torchvision_distribution(native):
    """sigma uniform over [lo, hi] and a float32 value (torch's uniform_ on
    a float tensor, then .item()); RandomApply's rate; a fixed sigma is
    float32(sigma); p 0 does nothing; the draws before the blur's, and a
    spec without one, are as before."""
    base = dict(geom="rrc", out_h=32, out_w=32, flip_p=0.5, gray_p=0.3)
    blur = dict(p=0.6, pos=1, sigma=(0.1, 2.0), kernel=(23, 23), v2=True, lanes=native(True)["lanes"])
    spec = dict(base, blur=blur)
    n = 3000
    sig = []
    for i in range(n):
        a, b = _C._plan_sample(base, 200, 100, 9, 1, i), _C._plan_sample(spec, 200, 100, 9, 1, i)
        assert (a["box"], a["flip"], a["gray"]) == (b["box"], b["flip"], b["gray"]) and a["blur"] is None
        if b["blur"] is not None:
            sig.append(b["blur"])
    x = np.array(sig)
    assert abs(len(x) - 0.6 * n) < 4 * math.sqrt(n * 0.6 * 0.4), len(x)
    assert np.array_equal(x, x.astype(np.float32).astype(np.float64))
    assert x.min() >= np.float32(0.1) and x.max() <= np.float32(2.0)
    u = (x - 0.1) / 1.9
    assert abs(u.mean() - 0.5) < 4 * math.sqrt(1 / 12 / len(u)), u.mean()
    assert np.histogram(u, 10, (0, 1))[0].min() > 0.07 * len(u)
    for lib in (v1, v2):
        spec, rest, _ = T.compile_transform(lib.Compose([lib.RandomResizedCrop(24), lib.GaussianBlur(5, sigma=1.3),
                                                         lib.PILToTensor()]))
        assert rest is None and spec["blur"]["p"] == 1.0
        assert {_C._plan_sample(spec, 50, 50, 0, 0, i)["blur"] for i in range(5)} == {float(np.float32(1.3))}
        spec, rest, _ = T.compile_transform(lib.Compose([lib.RandomResizedCrop(24),
                                                         lib.RandomApply([lib.GaussianBlur(5)], p=0.0),
                                                         lib.PILToTensor()]))
        assert rest is None and "blur" not in spec


def test_recognition_and_what_stays_in_python(native):
    """GaussianBlur alone and in v1/v2 RandomApply compiles; on a tensor
    (after ToTensor), with a kernel over 127, or from outside torchvision it
    stays in Python, the reason named."""
    for lib in (v1, v2):
        for step in (lib.GaussianBlur(9), lib.RandomApply([lib.GaussianBlur((3, 5), (0.2, 0.4))], p=0.3)):
            spec, rest, desc = T.compile_transform(lib.Compose([lib.CenterCrop(64), step, lib.PILToTensor()]))
            assert rest is None and spec["blur"]["v2"] == (lib is v2), desc
    spec, rest, desc = T.compile_transform(v1.Compose([v1.CenterCrop(64), v1.ToTensor(), v1.GaussianBlur(9)]))
    assert "blur" not in spec and "GaussianBlur" in desc.split("python")[1], desc
    spec, rest, desc = T.compile_transform(v1.Compose([v1.CenterCrop(300), v1.GaussianBlur(129), v1.ToTensor()]))
    assert "blur" not in spec and "kernel side over 127" in desc, desc

    class MyBlur(v1.GaussianBlur):
        pass
    MyBlur.__module__ = "mine"
    spec, rest, desc = T.compile_transform(v1.Compose([v1.CenterCrop(64), MyBlur(9), v1.ToTensor()]))
    assert "blur" not in spec and rest is not None, desc


def test_spec_checks_and_errors(native):
    base = dict(geom="rrc", out_h=16, out_w=16)
    good = dict(p=1.0, pos=1, sigma=(0.1, 2.0), kernel=(5, 5), v2=True, lanes=native(True)["lanes"])
    for bad, field in [(dict(good, p=1.5), "blur.p"), (dict(good, pos=2), "blur.pos"),
                       (dict(good, sigma=(2.0, 1.0)), "blur.sigma"), (dict(good, sigma=(0.0, 1.0)), "blur.sigma"),
                       (dict(good, kernel=(4, 5)), "blur.kernel"), (dict(good, kernel=(129, 5)), "blur.kernel"),
                       (dict(good, kernel=(33, 5)), "blur.kernel"), (dict(good, lanes=4), "blur.lanes"),
                       (dict(good, v2=False), "blur.*exp"), (dict(good, v2=False, exp="libm"), "blur.exp"),
                       (dict(good, extra=1), "blur")]:
        with pytest.raises(ValueError, match=field):
            _C._plan_sample(dict(base, blur=bad), 50, 50, 0, 0, 0)
    with pytest.raises(ValueError, match="fixed output size"):
        _C._plan_sample(dict(geom="none", blur=good), 50, 50, 0, 0, 0)
    img = np.asarray(photo_image("coffee", (30, 20)))
    with pytest.raises(ValueError, match="no GaussianBlur"):
        _C._render(dict(base), img, dict(box=(0, 0, 30, 20), resized=(16, 16), window=(0, 0), blur=1.0))
    for bad in (float("nan"), 1e7):
        with pytest.raises(ValueError, match="sigma"):
            _C._render(dict(base, blur=good), img, dict(box=(0, 0, 30, 20), resized=(16, 16), window=(0, 0), blur=bad))
    with pytest.raises(ValueError, match="kernel side"):
        _C._gaussian_kernel(4, 1.0, True)
    with pytest.raises(ValueError, match="channels"):
        _C._gaussian_blur(np.zeros((8, 8, 2), np.uint8), (3, 3), 1.0, True)


_PORTABLE = r"""
import hashlib, importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("fastloader._C", sys.argv[1])
C = importlib.util.module_from_spec(spec); spec.loader.exec_module(C)
out = []
for shape, k, s, v2, lanes, seed in json.loads(sys.stdin.read()):
    a = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    out.append(hashlib.sha256(C._gaussian_blur(a, tuple(k), s, v2, lanes=lanes, exp="sleef").tobytes()).hexdigest())
print(json.dumps(out))
"""


def test_portable_loop_matches_avx2(native):
    """FASTLOADER_NO_AVX2=1 (read once per process, hence the subprocess)
    runs the portable fmaf loop: the same bytes (the weights are the same
    code either way; SLEEF's exp for v1, so the subprocess needs no torch)."""
    jobs = [(shape, k, s, v2_, native(v2_)["lanes"], i)
            for i, (shape, k, s, v2_) in enumerate([((37, 45, 3), (23, 23), 1.1, False), ((33, 40), (5, 9), 0.4, True),
                                                     ((2, 3, 3), (5, 3), 7.0, True), ((40, 37, 3), (1, 31), 2.0, False)])]
    here = []
    for shape, k, s, v2_, lanes, seed in jobs:
        a = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
        here.append(hashlib.sha256(_C._gaussian_blur(a, tuple(k), s, v2_, lanes=lanes, exp="sleef").tobytes()).hexdigest())
    env = dict(os.environ, FASTLOADER_NO_AVX2="1")
    r = subprocess.run([sys.executable, "-c", _PORTABLE, _C.__file__], input=json.dumps(jobs), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == here


def test_image_folder_workers_and_timm(native, tmp_path):
    """timm's gaussian_blur_prob (RandomApply([GaussianBlur(23)], p)) after
    its ColorJitter and RandomGrayscale, through ImageFolder: no Python per
    sample, the same batches for num_workers 0 and 2, blurred samples among
    them."""
    timm_tf = pytest.importorskip("timm.data")
    import fastloader
    from fastloader.tools.sample import make_sample

    root = tmp_path / "train"
    make_sample(str(root), n=12, classes=2, seed=4, progress=False, processes=1)
    tf = timm_tf.create_transform(48, is_training=True, grayscale_prob=0.2, gaussian_blur_prob=0.5)
    ds = fastloader.ImageFolder(str(root), transform=tf)
    assert ds.pipeline_description.endswith("python: nothing"), ds.pipeline_description
    assert ds._spec["blur"]["p"] == 0.5 and ds._spec["blur"]["kernel"] == (23, 23)
    runs = [torch.cat([x for x, _ in fastloader.DataLoader(ds, batch_size=4, num_workers=nw, seed=11)])
            for nw in (0, 2)]
    assert torch.equal(runs[0], runs[1])
    # the same recipe without the blur draws the same before it: the blurred samples are the ones that differ
    plain = fastloader.ImageFolder(str(root), transform=timm_tf.create_transform(48, is_training=True,
                                                                                 grayscale_prob=0.2))
    ref = torch.cat([x for x, _ in fastloader.DataLoader(plain, batch_size=4, num_workers=2, seed=11)])
    same = [torch.equal(a, b) for a, b in zip(runs[0], ref)]
    assert 0 < sum(same) < len(same), same
