"""fastloader's JPEG decoder (csrc/image/jpeg.c via csrc/binding/py_image.c) against Pillow.

The reference is Pillow 13, whose bundled libjpeg-turbo uses the same accurate
integer IDCT and fancy upsampling: full-size decodes must be bit-identical to
Image.open(f).convert("RGB") / .convert("L"), and EXIF orientation identical
to ImageOps.exif_transpose.  Region and scaled decodes must equal the same
window of a full decode at that scale.
"""

from __future__ import annotations

import io
import pathlib
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

import fastloader._C as _C
import imgutil as U

DecodeError = _C.DecodeError
decode_jpeg = _C.decode_jpeg

SIZE = (301, 203)   # odd: partial iMCUs at the right and bottom edges
SCALES = (8, 7, 6, 5, 4, 3, 2, 1)


def _need(data):
    if data is None:
        pytest.skip("libjpeg-turbo tools (cjpeg/jpegtran) not installed: apt-get install libjpeg-turbo-progs")
    return data


def _base(**kw):
    return U.make_jpeg("astronaut", SIZE, **kw)


# Every kind of JPEG we claim to decode exactly: name -> (bytes factory, header checks).
KINDS = {
    "baseline-444": (lambda: _base(subsampling="4:4:4"), {}),
    "baseline-422": (lambda: _base(subsampling="4:2:2"), {}),
    "baseline-420": (lambda: _base(subsampling="4:2:0"), {}),
    "baseline-420-q100": (lambda: _base(quality=100), {}),
    "baseline-420-q30-chelsea": (lambda: U.make_jpeg("chelsea", (257, 171), quality=30), {}),
    "progressive-444": (lambda: _base(subsampling="4:4:4", progressive=True), {"progressive": True}),
    "progressive-420": (lambda: _base(progressive=True), {"progressive": True}),
    "gray": (lambda: _base(mode="L"), {"components": 1}),
    "gray-progressive": (lambda: _base(mode="L", progressive=True), {"components": 1, "progressive": True}),
    "cmyk": (lambda: _base(mode="CMYK"), {"components": 4}),
    "cmyk-progressive": (lambda: _base(mode="CMYK", progressive=True), {"components": 4, "progressive": True}),
    "tiny-1x1": (lambda: U.make_jpeg("coffee", (1, 1)), {}),
    "small-17x9": (lambda: U.make_jpeg("rocket", (17, 9)), {}),
    "restart-rows": (lambda: U.jpegtran(_base(), "-restart", "1"), {}),
    "restart-blocks": (lambda: U.jpegtran(_base(), "-progressive", "-restart", "3B"), {"progressive": True}),
    "arithmetic": (lambda: U.jpegtran(_base(), "-arithmetic"), {"arithmetic": True}),
    "arithmetic-progressive": (lambda: U.jpegtran(_base(), "-arithmetic", "-progressive"),
                               {"arithmetic": True, "progressive": True}),
    "subsample-440": (lambda: U.cjpeg("coffee", SIZE, "-sample", "1x2"), {}),
    "subsample-411": (lambda: U.cjpeg("coffee", SIZE, "-sample", "4x1"), {}),
    "rgb-colorspace": (lambda: U.cjpeg("chelsea", SIZE, "-rgb"), {"colorspace": 2}),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request):
    make, checks = KINDS[request.param]
    return request.param, _need(make()), checks


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_full_decode_equals_pillow(kind, mode):
    name, data, _ = kind
    got = decode_jpeg(data, mode=mode)
    want = U.pil_decode(data, mode)
    assert got.dtype == np.uint8 and got.ndim == 3 and got.flags.c_contiguous
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want, err_msg=name)


def test_header(kind):
    name, data, checks = kind
    h = _C.read_jpeg_header(data)
    with Image.open(io.BytesIO(data)) as im:
        assert (h["width"], h["height"]) == im.size
        assert h["components"] == len(im.getbands())
    assert h["progressive"] == checks.get("progressive", False)
    assert h["arithmetic"] == checks.get("arithmetic", False)
    assert h["components"] == checks.get("components", 3)
    if "colorspace" in checks:
        assert h["colorspace"] == checks["colorspace"]
    assert h["orientation"] == 1


def test_cmyk_matches_pillow_exactly():
    # Pillow reads every 4-component JPEG as Adobe-inverted CMYK ("CMYK;I") and
    # converts with cmyk2rgb; jpeg.c does the same arithmetic, so there is no
    # difference to bound: the result is bit-identical (asserted above too).
    data = _base(mode="CMYK")
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "CMYK"
        np.testing.assert_array_equal(decode_jpeg(data), np.asarray(im.convert("RGB")))


# --- sources ----------------------------------------------------------------------


def test_sources_bytes_buffers_and_paths(tmp_path):
    data = _base()
    want = decode_jpeg(data)
    p = tmp_path / "a.jpg"
    p.write_bytes(data)
    for src in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8), str(p), p):
        np.testing.assert_array_equal(decode_jpeg(src), want)


def test_buffer_is_released_on_success_and_error():
    good = bytearray(_base())
    decode_jpeg(good)
    good += b"x"   # a bytearray with an exported buffer cannot be resized
    bad = bytearray(b"not a jpeg")
    with pytest.raises(DecodeError):
        decode_jpeg(bad)
    bad += b"x"


def test_argument_errors(tmp_path):
    data = _base()
    with pytest.raises(ValueError, match="mode"):
        decode_jpeg(data, mode="CMYK")
    with pytest.raises(TypeError):
        decode_jpeg(12345)
    with pytest.raises(TypeError):
        decode_jpeg(data, "RGB")  # mode is keyword-only
    with pytest.raises(FileNotFoundError):
        decode_jpeg(str(tmp_path / "missing.jpg"))
    with pytest.raises(IsADirectoryError):
        decode_jpeg(tmp_path)
    with pytest.raises(ValueError, match="outside"):
        _C._decode_region(data, 8, 300, 0, 2, 1, 3)
    with pytest.raises(ValueError, match="outside"):
        _C._decode_region(data, 4, 0, 0, 152, 1, 3)   # 301 * 4/8 -> 151 columns


def test_decodes_concurrently_without_the_gil():
    datas = [U.make_jpeg(n, SIZE, progressive=(i % 2 == 1)) for i, n in enumerate(U.PHOTOS)] * 4
    want = [decode_jpeg(d) for d in datas]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(decode_jpeg, datas))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


# --- bad input --------------------------------------------------------------------

BAD = {
    "empty": (lambda: b"", "Empty input"),
    "png-named-jpg": (lambda: U.other_format("PNG"), "Not a JPEG file"),
    "gif-named-jpg": (lambda: U.other_format("GIF"), "Not a JPEG file"),
    "random-bytes": (lambda: np.random.default_rng(1).bytes(4096), "Not a JPEG file"),
    "soi-only": (lambda: b"\xff\xd8", "Premature end of JPEG file"),
    "no-image": (lambda: b"\xff\xd8\xff\xd9", "contains no image"),
    "truncated-header": (lambda: _base()[:120], "Premature end of JPEG file"),
    "truncated-baseline": (lambda: (lambda d: d[: len(d) * 2 // 3])(_base()), "Premature end of JPEG file"),
    "truncated-progressive": (lambda: (lambda d: d[: len(d) // 2])(_base(progressive=True)),
                              "Premature end of JPEG file"),
    "truncated-arithmetic": (lambda: (lambda d: d and d[: len(d) // 2])(U.jpegtran(_base(), "-arithmetic")),
                             "Premature end of JPEG file"),
    "65000x65000-header": (lambda: U.with_dimensions(_base(), 65000, 65000), "above the limit"),
    "zero-width": (lambda: U.with_dimensions(_base(), 0, 10), "Empty JPEG image"),
    "12-bit": (lambda: U.with_precision(_base(), 12), "Unsupported JPEG data precision 12"),
    "601-scans": (lambda: U.repeat_last_scan(U.make_jpeg("chelsea", (40, 30), progressive=True), 600),
                  "more than 500 scans"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_raises_decode_error_with_file_name(name, tmp_path):
    make, reason = BAD[name]
    data = _need(make())
    path = tmp_path / f"{name}.jpg"
    path.write_bytes(data)
    with pytest.raises(DecodeError) as ei:
        decode_jpeg(str(path))
    assert isinstance(ei.value, ValueError)
    assert str(ei.value).startswith(f"{path}: ")
    assert reason in str(ei.value)
    for mode in ("RGB", "L"):
        with pytest.raises(DecodeError, match="^<bytes>: .*" + re.escape(reason)):
            decode_jpeg(data, mode=mode)


@pytest.mark.parametrize("name", ["truncated-baseline", "truncated-progressive", "65000x65000-header"])
def test_pillow_also_refuses(name):
    # Parity check of the choices in jpeg.c: Pillow raises for these too
    # (OSError "image file is truncated"; DecompressionBombError).
    data = BAD[name][0]()
    with pytest.raises((OSError, Image.DecompressionBombError)):
        U.pil_decode(data)


def test_huge_header_is_readable_but_refused_before_allocation():
    data = U.with_dimensions(_base(), 65000, 65000)
    h = _C.read_jpeg_header(data)
    assert (h["width"], h["height"]) == (65000, 65000)
    with pytest.raises(DecodeError, match="4225000000 pixels"):
        _C._decode_region(data, 1, 0, 0, 1, 1, 3)   # even a 1-pixel region at 1/8


def test_pixel_limit_boundary():
    data = _base()
    n = SIZE[0] * SIZE[1]
    assert _C._decode_region(data, 8, 0, 0, 1, 1, 3, max_pixels=n).shape == (1, 1, 3)
    with pytest.raises(DecodeError, match="above the limit"):
        _C._decode_region(data, 8, 0, 0, 1, 1, 3, max_pixels=n - 1)


def test_scan_limit():
    prog = _base(progressive=True)   # libjpeg's default progression: 10 scans
    full = decode_jpeg(prog)
    np.testing.assert_array_equal(_C._decode_region(prog, 8, 0, 0, *SIZE, 3, max_scans=10), full)
    with pytest.raises(DecodeError, match="more than 9 scans"):
        _C._decode_region(prog, 8, 0, 0, *SIZE, 3, max_scans=9)
    # The hostile file decodes (as Pillow decodes it) once the limit is lifted.
    many = U.repeat_last_scan(U.make_jpeg("chelsea", (40, 30), progressive=True), 600)
    np.testing.assert_array_equal(_C._decode_region(many, 8, 0, 0, 40, 30, 3, max_scans=0), U.pil_decode(many))


# Corrupt-but-decodable files: libjpeg only warns, Pillow returns an image, and
# so do we (the same pixels); strict mode refuses the ones libjpeg reports.
LENIENT = {
    "corrupt-entropy-baseline": (lambda: U.corrupt_entropy(_base()), None),
    "corrupt-entropy-progressive": (lambda: U.corrupt_entropy(_base(progressive=True)), "bad Huffman code"),
    "extraneous-bytes-before-eoi": (lambda: U.extraneous_before_eoi(_base()), None),
    "extraneous-bytes-between-scans": (lambda: U.extraneous_before_last_scan(_base(progressive=True)),
                                       "16 extraneous bytes before marker 0xda"),
    "eoi-inside-scan": (lambda: (lambda d: d[: len(d) // 2] + b"\xff\xd9")(_base()),
                        "premature end of data segment"),
    "trailing-garbage": (lambda: _base() + b"\0garbage\xff\xd8" * 50, None),
}


@pytest.mark.parametrize("name", sorted(LENIENT))
def test_corrupt_but_decodable_matches_pillow(name):
    make, strict_reason = LENIENT[name]
    data = make()
    for mode in ("RGB", "L"):
        np.testing.assert_array_equal(decode_jpeg(data, mode=mode), U.pil_decode(data, mode))
    w, h = SIZE
    if strict_reason is None:
        # No warning from libjpeg: decoding stops after the last scanline, so
        # bytes before EOI and after it are never read, and libjpeg-turbo's
        # fast Huffman path zero-fills a bad code without a warning.
        _C._decode_region(data, 8, 0, 0, w, h, 3, strict=True)
    else:
        with pytest.raises(DecodeError, match="Corrupt JPEG data: .*" + strict_reason):
            _C._decode_region(data, 8, 0, 0, w, h, 3, strict=True)


def test_mutated_files_never_crash():
    """Deterministic mini-fuzz: random byte edits, bit flips, truncations and
    insertions of small JPEGs of every kind.  Each decode either returns the
    right shape or raises DecodeError (run it under ASan: see jpeg.c)."""
    seeds = [U.make_jpeg("chelsea", (67, 45)), U.make_jpeg("coffee", (67, 45), progressive=True),
             U.make_jpeg("rocket", (67, 45), mode="CMYK"), U.make_jpeg("astronaut", (67, 45), mode="L"),
             U.make_jpeg("coffee", (67, 45), exif=U.exif_orientation(6))]
    extra = U.jpegtran(seeds[0], "-arithmetic", "-progressive", "-restart", "1")
    seeds += [extra] if extra is not None else []
    rng = np.random.default_rng(20240601)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(600):
        d = bytearray(seeds[rng.integers(len(seeds))])
        op = rng.integers(4)
        for _ in range(rng.integers(1, 6)):
            p = int(rng.integers(len(d)))
            if op == 0:
                d[p] = int(rng.integers(256))
            elif op == 1:
                d[p] ^= 1 << int(rng.integers(8))
            elif op == 2:
                del d[p:]
                break
            else:
                d[p:p] = rng.bytes(int(rng.integers(1, 8)))
        d = bytes(d)
        try:
            h = _C.read_jpeg_header(d)
            s = int(rng.integers(1, 9))
            ch = int(rng.choice([1, 3]))
            W, H = _scaled(h["width"], s), _scaled(h["height"], s)
            if W * H > 1 << 20:   # a mutated size field: covered by the limit tests
                continue
            x, y = int(rng.integers(W)), int(rng.integers(H))
            w, hh = int(rng.integers(1, W - x + 1)), int(rng.integers(1, H - y + 1))
            assert _C._decode_region(d, s, x, y, w, hh, ch).shape == (hh, w, ch)
            got = decode_jpeg(d, mode="RGB" if ch == 3 else "L", apply_exif_orientation=True)
            assert got.ndim == 3 and got.shape[2] == ch
            outcomes["ok"] += 1
        except DecodeError:
            outcomes["error"] += 1
    assert outcomes["ok"] > 50 and outcomes["error"] > 50, outcomes


def test_corruption_changes_pixels():
    data = _base()
    assert not np.array_equal(decode_jpeg(U.corrupt_entropy(data)), decode_jpeg(data))


# --- EXIF orientation -------------------------------------------------------------

ORIENT_SIZE = (61, 37)


@pytest.mark.parametrize("carrier", ["exif-le", "exif-be", "xmp"])
@pytest.mark.parametrize("k", range(0, 10))
def test_exif_orientation_equals_exif_transpose(k, carrier):
    if carrier == "exif-le":
        data = U.make_jpeg("coffee", ORIENT_SIZE, exif=U.exif_orientation(k))
    elif carrier == "exif-be":
        data = U.make_jpeg("coffee", ORIENT_SIZE, exif=U.exif_orientation_be(k))
    else:
        data = U.make_jpeg("coffee", ORIENT_SIZE, xmp=U.xmp_orientation(k))
    assert _C.read_jpeg_header(data)["orientation"] == (k if 1 <= k <= 8 else 1)
    for mode in ("RGB", "L"):
        got = decode_jpeg(data, mode=mode, apply_exif_orientation=True)
        np.testing.assert_array_equal(got, U.pil_decode_transposed(data, mode))
        # Without the flag the orientation is ignored, as Image.open ignores it.
        np.testing.assert_array_equal(decode_jpeg(data, mode=mode), U.pil_decode(data, mode))


def test_exif_orientation_wins_over_xmp():
    data = U.make_jpeg("coffee", ORIENT_SIZE, exif=U.exif_orientation(3), xmp=U.xmp_orientation(6))
    assert _C.read_jpeg_header(data)["orientation"] == 3
    np.testing.assert_array_equal(decode_jpeg(data, apply_exif_orientation=True), U.pil_decode_transposed(data))


@pytest.mark.parametrize(
    "exif",
    [
        b"Exif\0\0II*\0\x08\0\0\0\x05\0\x12\x01\x03\0",   # IFD runs past the segment
        b"Exif\0\0II*\0\xff\xff\xff\x7f",                    # IFD offset past the end
        b"Exif\0\0XX*\0\x08\0\0\0",                          # bad byte order
        b"Exif\0\0MM\0*\0\0\0\x08\0\x01\x01\x12\0\x02\0\0\0\x02\0\0\0\x08",  # ASCII-typed
        b"Exif\0\0",
    ],
)
@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")
def test_malformed_exif_means_no_orientation(exif):
    data = U.make_jpeg("coffee", ORIENT_SIZE, exif=exif)
    assert _C.read_jpeg_header(data)["orientation"] == 1
    got = decode_jpeg(data, apply_exif_orientation=True)
    np.testing.assert_array_equal(got, U.pil_decode(data))
    np.testing.assert_array_equal(got, U.pil_decode_transposed(data))


# --- scaled and region decode -----------------------------------------------------

REGION_KINDS = ["baseline-420", "baseline-422", "progressive-444", "gray", "cmyk", "subsample-411",
                "subsample-440", "restart-rows", "restart-blocks", "arithmetic-progressive"]


def _scaled(n, s):
    return -(-n * s // 8)


def _regions(W, H):
    """Aligned and unaligned windows, edges, single pixels, full-width bands."""
    regs = [
        (0, 0, W, H), (1, 0, W - 1, H), (0, 1, W, H - 1), (W // 3, H // 3, W // 3, H // 3),
        (16, 5, W // 2, H // 2), (8, 8, W // 4, H // 4), (W - 1, H - 1, 1, 1), (3, 7, 1, 1),
        (0, H // 2, W, H - H // 2), (W // 2, 0, W - W // 2, 3), (5, 9, W - 5, H - 9), (17, 3, 2, H - 3),
    ]
    return [(x, y, w, h) for (x, y, w, h) in regs if w >= 1 and h >= 1 and x + w <= W and y + h <= H]


@pytest.mark.parametrize("name", REGION_KINDS)
def test_region_equals_window_of_scaled_full_decode(name):
    data = _need(KINDS[name][0]())
    w0, h0 = SIZE
    for s in SCALES:
        W, H = _scaled(w0, s), _scaled(h0, s)
        for ch in (3, 1):
            full = _C._decode_region(data, s, 0, 0, W, H, ch)
            assert full.shape == (H, W, ch)
            for x, y, w, h in _regions(W, H):
                got = _C._decode_region(data, s, x, y, w, h, ch)
                np.testing.assert_array_equal(got, full[y:y + h, x:x + w],
                                              err_msg=f"{name} scale {s}/8 ch {ch} region {(x, y, w, h)}")
    # Scale 8 is the plain full decode.
    np.testing.assert_array_equal(_C._decode_region(data, 8, 0, 0, w0, h0, 3), decode_jpeg(data))


def _rgb2l(rgb):
    """Pillow's rgb2l (libImaging/Convert.c, L24)."""
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)[..., None]


@pytest.mark.parametrize("name", ["baseline-420", "progressive-444", "gray", "cmyk"])
@pytest.mark.parametrize("s", [4, 2, 1])
def test_scaled_decode_equals_pillow_draft(name, s):
    data = KINDS[name][0]()
    w0, h0 = SIZE
    W, H = _scaled(w0, s), _scaled(h0, s)
    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (w0 * s // 8, h0 * s // 8))   # picks DCT scale 1/(8/s)
        assert im.size == (W, H)
        draft_rgb = np.asarray(im.convert("RGB"))
    np.testing.assert_array_equal(_C._decode_region(data, s, 0, 0, W, H, 3), draft_rgb)
    # Our "L" is Pillow's convert("L") of the RGB decode.  (Pillow's draft("L")
    # on a color file takes libjpeg's Y channel instead, which differs by a few
    # levels, so it is not the reference.)
    want_l = draft_rgb[..., :1] if name == "gray" else _rgb2l(draft_rgb)
    np.testing.assert_array_equal(_C._decode_region(data, s, 0, 0, W, H, 1), want_l)


def test_scaled_sizes_round_up():
    data = U.make_jpeg("rocket", (333, 100))
    for s in range(1, 9):
        W, H = _scaled(333, s), _scaled(100, s)
        assert _C._decode_region(data, s, 0, 0, W, H, 3).shape == (H, W, 3)
        with pytest.raises(ValueError):
            _C._decode_region(data, s, 0, 0, W + 1, H, 3)


def test_path_source_error_names_pathlike(tmp_path):
    p = pathlib.Path(tmp_path) / "dir with space" / "broken.jpg"
    p.parent.mkdir()
    p.write_bytes(b"\xff\xd8\xff")
    with pytest.raises(DecodeError, match="^" + re.escape(str(p)) + ": "):
        decode_jpeg(p)
