"""Regression tests for what the libFuzzer harnesses (fuzz/, scripts/fuzz.sh) found.

Each file in tests/data/fuzz-regressions/ is an input of one harness, named
<target>-<finding>.<ext>: decode-* is a JPEG; region-* is 16 parameter bytes
(fuzz/fuzz_region.c) and a JPEG; render-* is 64 parameter bytes
(fuzz/fuzz_render.c) and a JPEG; tar-* is a mode byte (fuzz/fuzz_tar.c) and a
tar shard.  scripts/fuzz.sh replays them through the
harnesses; here the JPEGs go through the Python API, which must return a
result or raise DecodeError, and the finding behind each file is tested
directly.  docs/hardening.md ("Fuzzing") describes the findings and their fixes;
tests/test_jpeg_tables.py and tests/test_jpeg_regions.py cover the decoder
ones more widely.
"""
import io
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import fastloader
from fastloader import _C

DATA = os.path.join(os.path.dirname(__file__), "data", "fuzz-regressions")
FILES = sorted(os.listdir(DATA))
PARAMS = {"decode": 0, "region": 16, "render": 64, "tar": 1}   # fuzz/fuzz_common.h, fuzz_tar.c
JPEG_FILES = [f for f in FILES if not f.startswith("tar-")]


def _read(name: str) -> bytes:
    with open(os.path.join(DATA, name), "rb") as f:
        return f.read()


def _jpeg(name: str) -> bytes:
    return _read(name)[PARAMS[name.split("-")[0]]:]


def _region(name: str) -> tuple[int, int, int, int, int, int]:
    """(scale_num, x, y, w, h, channels) that fuzz_region.c derives from a valid
    region-* parameter block (the header gives the scaled size)."""
    p = _read(name)[:16]
    flags, scale = p[0], 1 + p[1] % 16
    assert (flags >> 2) & 3, "an invalid-request input"
    fx, fy, fw, fh = struct.unpack(">4H", p[3:11])
    h = _C.read_jpeg_header(_jpeg(name))
    sw, sh = -(-h["width"] * scale // 8), -(-h["height"] * scale // 8)
    x, y = fx * sw >> 16, fy * sh >> 16
    return scale, x, y, 1 + (fw * (sw - x) >> 16), 1 + (fh * (sh - y) >> 16), 1 if flags & 1 else 3


def test_every_file_names_a_target():
    assert FILES
    assert all(f.split("-")[0] in PARAMS for f in FILES), FILES


@pytest.mark.parametrize("name", [f for f in FILES if f.startswith("tar-")])
def test_tar_regression_input_reads_or_raises_decode_error(name, tmp_path):
    """tar-duplicate-ext-case: "k.jpg" then "k.JPG" was returned as one sample
    with "jpg" twice; webdataset refuses it (csrc/sources/tar.c compares lower-cased)."""
    data = bytearray(_read(name))
    mode, shard = data[0], data[1:]
    if mode & 1:  # the harness rewrites every block's checksum
        for off in range(0, len(shard) - 511, 512):
            shard[off + 148:off + 156] = b" " * 8
            shard[off + 148:off + 156] = b"%06o\0 " % (sum(shard[off:off + 512]) & 0o777777)
    p = tmp_path / "shard.tar"
    p.write_bytes(bytes(shard))
    try:
        samples = _C._tar_samples(str(p))
    except fastloader.DecodeError:
        return
    for key, fields in samples:
        assert key and fields


@pytest.mark.parametrize("name", JPEG_FILES)
def test_regression_input_decodes_or_raises_decode_error(name):
    src = _jpeg(name)
    try:
        info = _C.read_jpeg_header(src)
    except fastloader.DecodeError:
        info = None
    for mode, ch in (("RGB", 3), ("L", 1)):
        try:
            a = fastloader.decode_jpeg(src, mode=mode, apply_exif_orientation=True)
        except fastloader.DecodeError:
            continue
        assert info is not None
        assert a.dtype == np.uint8 and a.shape[2] == ch
        assert sorted(a.shape[:2]) == sorted((info["height"], info["width"]))
    if name.startswith("region-"):
        scale, x, y, w, h, ch = _region(name)
        try:
            a = _C._decode_region(src, scale, x, y, w, h, ch)
        except fastloader.DecodeError:
            return
        assert a.shape == (h, w, ch)


# -- decoder reuse: tables left over from the previous image ----------------

def _own_tables_jpeg() -> bytes:
    """A JPEG with its own quantization (quality 37) and optimized Huffman tables."""
    img = Image.new("RGB", (32, 24))
    img.putdata([((i * 37) & 255, (i * 7) & 255, (i * 3) & 255) for i in range(32 * 24)])
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=37, optimize=True)
    return buf.getvalue()


def _list(tmp_path, *files):
    from fastloader import transforms as FT
    paths = []
    for i, data in enumerate(files):
        p = tmp_path / f"{i}.jpg"
        p.write_bytes(data)
        paths.append(str(p))
    return fastloader.ImageList(paths, transform=FT.Compose([FT.Resize((24, 32))]))


def test_missing_dqt_is_refused_like_pillow():
    src = _read("decode-table-carryover-nodqt.jpg")
    with pytest.raises(OSError):
        Image.open(io.BytesIO(src)).load()
    with pytest.raises(fastloader.DecodeError, match="Quantization table 0x00 was not defined"):
        fastloader.decode_jpeg(src)


def test_missing_dqt_is_refused_after_another_image_too(tmp_path):
    ds = _list(tmp_path, _own_tables_jpeg(), _read("decode-table-carryover-nodqt.jpg"))
    with pytest.raises(fastloader.DecodeError):
        ds.load_batch([1], 0, 0)          # a fresh worker decoder refuses it
    with pytest.raises(fastloader.DecodeError):
        ds.load_batch([0, 1], 0, 0)       # ... and so must one that just decoded file 0


def test_missing_dht_decodes_the_same_after_another_image(tmp_path):
    # without DHT, libjpeg-turbo uses the standard tables (as Pillow does) --
    # unless the decoder still holds another image's tables
    ds = _list(tmp_path, _own_tables_jpeg(), _read("decode-table-carryover-nodht.jpg"))
    alone, _ = ds.load_batch([1], 0, 0)
    after, _ = ds.load_batch([0, 1], 0, 0)
    np.testing.assert_array_equal(np.asarray(after)[1], np.asarray(alone)[0])


# -- region decode: a region must equal the same window of a full decode ----

def test_one_column_region_at_the_edges_of_a_420_image():
    src = _jpeg("region-narrow-crop-420.bin")
    assert _region("region-narrow-crop-420.bin") == (8, 0, 0, 1, 16, 3)
    full = fastloader.decode_jpeg(src)                 # 18 x 16, 4:2:0
    for x in (0, 17):                                  # 17: the iMCU column 16.. holds 2 pixels
        np.testing.assert_array_equal(_C._decode_region(src, 8, x, 0, 1, 16, 3), full[:, x:x + 1], err_msg=f"x={x}")


def test_region_of_an_incomplete_progressive_jpeg():
    # a valid progressive file holding only its first two scans; Pillow decodes it
    name = "region-progressive-smoothing.bin"
    src = _jpeg(name)
    scale, x, y, w, h, ch = _region(name)
    assert (scale, x, y, w, h, ch) == (8, 17, 0, 4, 24, 3)
    full = fastloader.decode_jpeg(src)
    np.testing.assert_array_equal(full, np.asarray(Image.open(io.BytesIO(src)).convert("RGB")))
    np.testing.assert_array_equal(_C._decode_region(src, scale, x, y, w, h, ch), full[y:y + h, x:x + w])


# -- render: non-finite or huge view geometry --------------------------------

_RENDER_CHILD = r"""
import math, sys
import numpy as np
from fastloader import _C
spec = dict(geom="resize_crop", resize_h=8, resize_w=8, out_h=8, out_w=8)
img = np.zeros((16, 16, 3), np.uint8)
plan = dict(box=(0, 0, 16, 16), resized=(8, 8), window=(0, 0))
cases = [dict(plan=plan, view_origin=(math.nan, 0.0)), dict(plan=plan, view_origin=(math.inf, 0.0)),
         dict(plan=plan, view_origin=(0.0, 1e300)), dict(plan=plan, view_scale=(math.inf, 1.0)),
         dict(plan=plan, view_scale=(1e300, 1e300)), dict(view_scale=(1e-300, 1e-300)),
         dict(view_origin=(math.nan, math.nan))]
for kw in cases:
    try:
        _C._render(spec, img, **kw)
    except ValueError:
        continue
    sys.exit(f"no ValueError for {kw}")
print("all refused")
"""


def test_render_refuses_non_finite_view_geometry():
    # Each call must raise ValueError.  They used to, in a normal build, by
    # luck: fl_render (resample.c fl_axis_setup) and _render()'s default
    # src_size (py_transform.c) converted NaN / infinite / huge doubles to int,
    # undefined behaviour that clang's UBSan reported (fuzz_render, F4 in
    # docs/hardening.md) and gcc's does with -fsanitize=float-cast-overflow, which
    # the ASan build now has.  A child process, so that a sanitizer abort
    # fails this test instead of ending the whole run.
    r = subprocess.run([sys.executable, "-c", _RENDER_CHILD], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "all refused" in r.stdout, r.stdout + r.stderr[-3000:]


# -- render: bicubic weights of outputs whose centre lies outside the view ----

def test_bicubic_outputs_centred_outside_the_view_keep_bounded_weights():
    # F8 (docs/hardening.md): a scaled view that misses the top of the box
    # (origin_y > 0) put the first outputs' centres above the buffer; the
    # bicubic taps left there are its negative tail, whose sum is near 0, and
    # the normalised weights overflowed the 32-bit sums (UBSan; garbage
    # pixels otherwise).  The box is now clipped to the buffer for bicubic:
    # the render is Pillow's bicubic resize of the mapped box, clipped, on
    # the pixels it covers.  Input render-bicubic-centre-outside-view.bin.
    import math
    img = np.zeros((26, 23, 3), np.uint8)
    img[::2] = 255                      # stripes: the negative lobes meet 0, the positive ones 255
    img[:, ::3] = 90
    plan = dict(box=(0, 0, 11, 17), resized=(11, 17), window=(0, 0))
    s = 1.635
    for ox, oy in ((-4.3333, 1.8571), (0.0, 3.9), (5.5, -6.25)):
        out = _C._render(dict(geom="none", interp=1), img, plan, view_scale=(s, s), view_origin=(ox, oy))
        b = (-ox, -oy, 11 * s - ox, 17 * s - oy)                  # the box in buffer coordinates
        x0, y0 = max(math.floor(b[0] + 1e-6), 0), max(math.floor(b[1] + 1e-6), 0)
        x1, y1 = min(math.ceil(b[2] - 1e-6), 23), min(math.ceil(b[3] - 1e-6), 26)
        box = (max(b[0] - x0, 0), max(b[1] - y0, 0), min(b[2] - x0, x1 - x0), min(b[3] - y0, y1 - y0))
        ref = Image.fromarray(img[y0:y1, x0:x1]).resize((11, 17), Image.BICUBIC, box=box)
        diff = np.abs(out.astype(int) - np.asarray(ref).transpose(2, 0, 1)).max()
        assert diff <= 1, ((ox, oy), diff)   # Pillow's box is float32, ours double
