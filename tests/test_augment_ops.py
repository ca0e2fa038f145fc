"""The augmentation ops (csrc/image/augment.c, through _C._augment_op) against
torchvision's reference: ``torchvision.transforms.autoaugment._apply_op`` on
PIL images, i.e. Pillow 13.

Every op is compared bit for bit (np.array_equal) over hundreds of
magnitudes: every value of the magnitude tables of TrivialAugmentWide,
RandAugment and AutoAugment (``_augmentation_space``, both signs for the
signed ops), random values in between and beyond, and the special cases of
each op (Rotate's multiples of 90, shears past Pillow's fixed-point range,
translations off the image, enhance factors far outside [0, 1]).  Images:
real photographs (tests/imgutil.py) at 224x224 and at odd sizes (97x61,
31x200, 1x1, 2x3, 3x3, 5x4), RGB and L; geometric ops with both
interpolations and with fills (none, one value, one per channel).  The
portable loops (FASTLOADER_NO_AVX2=1, in a subprocess) give the same bytes
as the AVX2 ones.  docs/recipes.md ("Per-op fidelity") summarises the result.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from imgutil import PHOTOS, photo_image

torchvision = pytest.importorskip("torchvision")
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms import autoaugment as tv_aa  # noqa: E402

from fastloader import _C  # noqa: E402

# FL_AUG_* codes (csrc/image/augment.h)
CODES = {
    "Identity": 0, "ShearX": 1, "ShearY": 2, "TranslateX": 3, "TranslateY": 4, "Rotate": 5,
    "Brightness": 6, "Color": 7, "Contrast": 8, "Sharpness": 9, "Posterize": 10, "Solarize": 11,
    "AutoContrast": 12, "Equalize": 13, "Invert": 14,
}
GEOMETRIC = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}
SIZES = [(224, 224), (97, 61), (31, 200), (1, 1), (2, 3), (3, 3), (5, 4), (224, 224)]

# Random magnitudes "in between" (and a little beyond the tables), per op.
RANDOM_RANGE = {
    "ShearX": (-1.0, 1.0), "ShearY": (-1.0, 1.0),
    "TranslateX": (-160.0, 160.0), "TranslateY": (-160.0, 160.0),
    "Rotate": (-400.0, 400.0),
    "Brightness": (-1.0, 1.0), "Color": (-1.0, 1.0), "Contrast": (-1.0, 1.0), "Sharpness": (-1.0, 1.0),
    "Posterize": (1.0, 8.999), "Solarize": (-2.0, 258.0),
}
# The special cases of each op.
SPECIAL = {
    # past the fixed-point range (|corner| >= 32768: Pillow's double loop)
    "ShearX": [150.0, -150.0, 1e3, -1e6, 1e-12, 0.0, -0.0],
    "ShearY": [150.0, -150.0, 1e3, -1e6, 1e-12, 0.0],
    "TranslateX": [0.0, 0.9, -0.9, 1.0, -1.0, 223.0, 224.0, 1e4, -1e4, 1e300],
    "TranslateY": [0.0, 0.9, -1.5, 60.0, -61.0, 1e4, -1e300],
    "Rotate": [0.0, -0.0, 90.0, -90.0, 180.0, -180.0, 270.0, 360.0, 450.0, -270.0, 720.0, 1e-300, -1e-13,
               90.00000000000001, 179.99999999999997, 180.00000000000003, 45.0, 1e6, -12345.678],
    "Brightness": [-1.0, 0.0, 1e-9, -1e-9, 0.5, 1.0, 3.0, 254.0, -300.0, 1e7, -1e30],
    "Color": [-1.0, 0.0, 1e-9, 1.0, 2.0, -2.0, 300.0, -1e30],
    "Contrast": [-1.0, 0.0, 1e-9, 1.0, 2.0, -2.0, 300.0, 1e30],
    "Sharpness": [-1.0, 0.0, 1e-9, 1.0, 2.0, -2.0, 300.0, 1e7, -1e30],
    "Posterize": [1.0, 2.0, 4.0, 7.5, 8.0, 8.999],
    "Solarize": [-1.0, 0.0, 0.5, 1.0, 127.5, 128.0, 254.9, 255.0, 255.5, 256.0, 1e9, -1e9],
    "Identity": [0.0], "AutoContrast": [0.0], "Equalize": [0.0], "Invert": [0.0],
}
N_RANDOM = 400   # random magnitudes per op (on top of the tables and the special cases)


def table_magnitudes(name):
    """Every magnitude the three policies can draw for `name` (both signs when
    signed), for a 224 x 224 image."""
    spaces = [
        tv_aa.TrivialAugmentWide()._augmentation_space(31),
        tv_aa.RandAugment()._augmentation_space(31, (224, 224)),
        tv_aa.AutoAugment()._augmentation_space(10, (224, 224)),
    ]
    out = []
    for space in spaces:
        if name not in space:
            continue
        mags, signed = space[name]
        vals = [float(v) for v in mags.reshape(-1).tolist()]
        out += vals
        if signed:
            out += [-v for v in vals]
    return out


def all_magnitudes(name, rng):
    mags = table_magnitudes(name) + SPECIAL.get(name, [])
    if name in RANDOM_RANGE:
        lo, hi = RANDOM_RANGE[name]
        mags += [rng.uniform(lo, hi) for _ in range(N_RANDOM)]
    else:   # the magnitude is ignored: every image, with any magnitude
        mags += [rng.uniform(-10.0, 10.0) for _ in range(2 * len(PHOTOS) * len(SIZES))]
    return mags


_IMAGES = {}


def image(k, mode):
    """The k-th test image (photo and size cycling), as (PIL image, array)."""
    key = (k % (len(PHOTOS) * len(SIZES)), mode)
    if key not in _IMAGES:
        photo = PHOTOS[key[0] // len(SIZES)]
        size = SIZES[key[0] % len(SIZES)]
        im = photo_image(photo, size)
        if mode == "L":
            im = im.convert("L")
        _IMAGES[key] = (im, np.ascontiguousarray(np.asarray(im)))
    return _IMAGES[key]


def fill_for(mode, rng):
    """None, one value for all channels, or one per channel (ints, as
    torchvision's _parse_fill hands them to Pillow)."""
    nch = 3 if mode == "RGB" else 1
    kind = rng.randrange(3)
    if kind == 0:
        return None
    if kind == 1:
        return [rng.randrange(256)] * nch
    return [rng.randrange(256) for _ in range(nch)]


def reference(im, name, magnitude, interp, fill):
    return np.asarray(tv_aa._apply_op(im, name, magnitude, interp, fill))


def ours(arr, name, magnitude, interp, fill):
    return _C._augment_op(CODES[name], magnitude, arr, interp=0 if interp == InterpolationMode.NEAREST else 1,
                          fill=fill)


def cases(name, seed):
    """(k, mode, magnitude, interp, fill) for every draw of op `name`."""
    rng = random.Random(seed)
    out = []
    for k, m in enumerate(all_magnitudes(name, rng)):
        mode = "L" if rng.random() < 0.3 else "RGB"
        interps = [InterpolationMode.NEAREST, InterpolationMode.BILINEAR] if name in GEOMETRIC \
            else [InterpolationMode.NEAREST]
        for interp in interps:
            fill = fill_for(mode, rng) if name in GEOMETRIC else None
            out.append((k, mode, m, interp, fill))
    return out


@pytest.mark.parametrize("name", list(CODES))
def test_op_is_bit_exact_with_pillow(name):
    n = 0
    for k, mode, m, interp, fill in cases(name, seed=CODES[name]):
        im, arr = image(k, mode)
        ref = reference(im, name, m, interp, fill)
        got = ours(arr, name, m, interp, fill)
        assert got.shape == arr.shape and got.dtype == np.uint8
        if not np.array_equal(got, ref):
            d = np.abs(got.astype(int) - ref.astype(int))
            pytest.fail(f"{name} magnitude={m!r} interp={interp.value} fill={fill} size={im.size} mode={mode}: "
                        f"{int((d > 0).sum())} of {d.size} bytes differ, max {int(d.max())}")
        n += 1
    assert n >= 5   # (records how many draws: see docs/recipes.md)


def test_draw_counts():
    """Hundreds of draws for each op with a magnitude (the tables, the special
    cases, N_RANDOM random values)."""
    for name in CODES:
        n = len(cases(name, seed=CODES[name]))
        assert n >= (150 if name in RANDOM_RANGE else 64), (name, n)


def synthetic_images():
    """Crafted images for the table ops' edge branches: constant images
    (autocontrast's hi <= lo, equalize's single value), two values (equalize's
    step == 0, and entries past 255 that Image.point clips), narrow and full
    ranges, noise, one channel flat and the others not."""
    rng = np.random.default_rng(7)
    out = []
    for v in (0, 1, 128, 254, 255):
        out.append(np.full((9, 13, 3), v, np.uint8))
        out.append(np.full((5, 4), v, np.uint8))
    two = np.zeros((21, 15), np.uint8)
    two[0, 0] = 255
    out += [two, np.stack([two, 255 - two, two], axis=2)]
    big = np.zeros((1, 301), np.uint8)
    big[0, -1] = 255   # equalize: step 1, the last entry 300 -> clipped to 255
    out += [big, np.repeat(big[:, :, None], 3, axis=2)]
    for lo, hi in ((0, 2), (100, 103), (10, 250), (0, 256), (200, 256)):
        out.append(rng.integers(lo, hi, (31, 17, 3), dtype=np.uint8))
        out.append(rng.integers(lo, hi, (17, 31), dtype=np.uint8))
    flat = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
    flat[:, :, 1] = 77
    out.append(flat)
    ramp = np.tile(np.arange(256, dtype=np.uint8), (3, 1))
    out += [ramp, np.stack([ramp, ramp[:, ::-1], ramp // 2], axis=2)]
    return out


@pytest.mark.parametrize("name", ["AutoContrast", "Equalize", "Invert", "Posterize", "Solarize", "Brightness",
                                  "Contrast", "Color", "Sharpness"])
def test_table_and_enhance_ops_on_crafted_images(name):
    mags = {"Posterize": [1.0, 3.0, 7.0], "Solarize": [0.0, 1.0, 100.5, 255.0],
            "Brightness": [-0.9, 0.5, 2.0], "Contrast": [-0.9, 0.5, 2.0], "Color": [-0.9, 0.5, 2.0],
            "Sharpness": [-0.9, 0.5, 2.0]}.get(name, [0.0])
    for arr in synthetic_images():
        im = Image.fromarray(arr, "RGB" if arr.ndim == 3 else "L")
        for m in mags:
            ref = reference(im, name, m, InterpolationMode.NEAREST, None)
            got = ours(arr, name, m, InterpolationMode.NEAREST, None)
            assert np.array_equal(got, ref), (name, m, arr.shape, arr.min(), arr.max())


def test_hw1_and_hw_arrays_agree():
    im, arr = image(1, "L")
    for name in ("Rotate", "Equalize", "Sharpness", "Contrast"):
        a = ours(arr, name, 17.0 if name == "Rotate" else 0.4, InterpolationMode.NEAREST, [9])
        b = ours(arr[:, :, None].copy(), name, 17.0 if name == "Rotate" else 0.4, InterpolationMode.NEAREST, [9])
        assert b.shape == arr.shape + (1,)
        assert np.array_equal(a, b[:, :, 0])


def test_input_is_left_alone_and_identity_copies():
    im, arr = image(0, "RGB")
    before = arr.copy()
    out = _C._augment_op(CODES["Invert"], 0.0, arr)
    assert np.array_equal(arr, before) and np.array_equal(out, 255 - arr)
    ident = _C._augment_op(CODES["Identity"], 0.0, arr)
    assert np.array_equal(ident, arr) and ident is not arr


def test_posterize_zero_bits_gives_zeros():
    # torchvision's tensor posterize(0) masks everything; Pillow refuses 0 bits
    im, arr = image(0, "RGB")
    assert not _C._augment_op(CODES["Posterize"], 0.0, arr).any()
    assert not _C._augment_op(CODES["Posterize"], -0.5, arr).any()   # int(-0.5) == 0
    with pytest.raises(ValueError):
        tv_aa._apply_op(im, "Posterize", 0.0, InterpolationMode.NEAREST, None)


# ---- the portable loops -------------------------------------------------------------

_PORTABLE = r"""
import hashlib, importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("fastloader._C", sys.argv[1])
C = importlib.util.module_from_spec(spec); spec.loader.exec_module(C)
out = []
for code, mag, interp, fill, shape, seed in json.loads(sys.stdin.read()):
    a = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    out.append(hashlib.sha256(C._augment_op(code, mag, a, interp=interp, fill=fill).tobytes()).hexdigest())
print(json.dumps(out))
"""


def test_portable_loops_match_avx2():
    """FASTLOADER_NO_AVX2=1 (read once per process, hence the subprocess)
    runs the portable loops: the same bytes."""
    jobs = []
    for code in [*range(24), 43, 46]:   # the torchvision ops, timm's (FL_AUG_SOLARIZE_ADD on), Hue, GaussianBlur
        for shape in [(224, 224, 3), (61, 97, 3), (200, 31), (3, 3, 3), (40, 41)]:
            for interp in (0, 1, 2):
                mag = {1: 0.3, 2: -0.4, 3: 17.0, 4: -9.0, 5: 33.0, 6: 0.6, 7: -0.7, 8: 0.8, 9: 0.9, 10: 3.0,
                       11: 100.0, 15: 50.0, 16: 0.25, 17: -0.2, 18: 13.7, 19: -8.2, 20: 1.4, 21: 0.3, 22: 1.7,
                       23: 0.2, 43: -0.21, 46: 1.7}.get(code, 0.0)
                fill = [7, 8, 9][: shape[2] if len(shape) == 3 else 1]
                jobs.append((code, mag, interp, fill, shape, code * 31 + len(jobs)))
    here = []
    for code, mag, interp, fill, shape, seed in jobs:
        a = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
        here.append(hashlib.sha256(_C._augment_op(code, mag, a, interp=interp, fill=fill).tobytes()).hexdigest())
    env = dict(os.environ, FASTLOADER_NO_AVX2="1")
    r = subprocess.run([sys.executable, "-c", _PORTABLE, _C.__file__], input=json.dumps(jobs), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == here


# ---- errors -------------------------------------------------------------------------

def _img(shape=(8, 9, 3)):
    return np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)


@pytest.mark.parametrize("code", [-1, 47, 1000])   # 47: FL_AUG_NOPS
def test_unknown_op_is_a_value_error(code):
    with pytest.raises(ValueError, match="unknown op"):
        _C._augment_op(code, 0.0, _img())


@pytest.mark.parametrize("shape", [(8, 9, 2), (8, 9, 4), (8, 9, 0)])
def test_channels_other_than_1_or_3_are_refused(shape):
    with pytest.raises(ValueError, match="channels"):
        _C._augment_op(CODES["Invert"], 0.0, np.zeros(shape, np.uint8))


@pytest.mark.parametrize("shape", [(0, 5, 3), (5, 0), (0, 0)])
def test_empty_images_are_refused(shape):
    with pytest.raises(ValueError, match="size"):
        _C._augment_op(CODES["Invert"], 0.0, np.zeros(shape, np.uint8))


@pytest.mark.parametrize("mag", [9.0, 100.0, -1.0, -7.5, 1e300])
def test_posterize_bits_out_of_range(mag):
    with pytest.raises(ValueError, match="0..8"):
        _C._augment_op(CODES["Posterize"], mag, _img())


@pytest.mark.parametrize("name", list(CODES))
@pytest.mark.parametrize("mag", [math.nan, math.inf, -math.inf])
def test_non_finite_magnitudes_are_refused(name, mag):
    with pytest.raises(ValueError, match="not finite"):
        _C._augment_op(CODES[name], mag, _img())


@pytest.mark.parametrize("name", ["Brightness", "Color", "Contrast", "Sharpness"])
def test_enhance_factor_beyond_float_is_refused(name):
    with pytest.raises(ValueError, match="float range"):
        _C._augment_op(CODES[name], 1e39, _img())
    _C._augment_op(CODES[name], 1e38, _img())   # within float range


def test_bad_interp_is_refused():
    with pytest.raises(ValueError, match="interpolation"):
        _C._augment_op(CODES["Rotate"], 10.0, _img(), interp=3)   # FL_AUG_RANDOM: a policy setting only


def test_binding_argument_errors():
    with pytest.raises(TypeError):
        _C._augment_op(CODES["Invert"], 0.0, _img().astype(np.float32))
    with pytest.raises(TypeError):
        _C._augment_op(CODES["Invert"], 0.0, _img()[:, ::2])   # not C-contiguous
    with pytest.raises(TypeError):
        _C._augment_op(CODES["Invert"], 0.0, [[1, 2], [3, 4]])
    with pytest.raises(ValueError):
        _C._augment_op(CODES["Invert"], 0.0, np.zeros((2, 2, 3, 1), np.uint8))
    with pytest.raises(ValueError, match="fill"):
        _C._augment_op(CODES["Rotate"], 5.0, _img(), fill=[1, 2])
    with pytest.raises(ValueError, match="fill"):
        _C._augment_op(CODES["Rotate"], 5.0, _img(), fill=[1, 2, 256])
    with pytest.raises(TypeError, match="fill"):
        _C._augment_op(CODES["Rotate"], 5.0, _img(), fill=[1, 2, 3.5])
    with pytest.raises(TypeError):
        _C._augment_op(CODES["Rotate"], 5.0, _img(), 0)   # interp is keyword-only
