"""PNG and WebP decoding (csrc/image/png.c, webp.c through
fastloader.decode_image) against Pillow: every PNG colour type and bit depth,
interlaced or not, with and without tRNS, lossy / lossless / alpha WebP, in
each output mode; damaged files whose outcome (error or pixels) follows
Pillow's; the pixel limit before any allocation."""
from __future__ import annotations

import io
import os
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

import fastloader
import pngmake as P

MODES = ["RGB", "L", "RGBA", None]

pytestmark = pytest.mark.filterwarnings("ignore:Palette images with Transparency:UserWarning")

# (colour type, bit depth) that PNG allows
COMBOS = [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16), (3, 1), (3, 2), (3, 4), (3, 8),
          (4, 8), (4, 16), (6, 8), (6, 16)]


def pillow(data: bytes, mode):
    im = Image.open(io.BytesIO(data))
    if mode is not None:
        im = im.convert(mode)
    a = np.array(im)
    if mode is not None and a.ndim == 2:
        a = a[:, :, None]   # decode_image's converted modes are H x W x C, as decode_jpeg's
    return a


def ours(data: bytes, mode):
    return fastloader.decode_image(data, mode=mode)


def assert_same(data: bytes, mode, what: str):
    want = pillow(data, mode)
    got = ours(data, mode)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, mode, got.dtype, got.shape, want.dtype,
                                                                  want.shape)
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)[:5]
        raise AssertionError(f"{what} mode={mode}: {len(np.argwhere(got != want))} values differ, first at "
                             f"{bad.tolist()}: ours {[got[tuple(b)] for b in bad]} Pillow "
                             f"{[want[tuple(b)] for b in bad]}")


def png_case(ct, depth, *, interlace, trns, h=13, w=11, seed=0):
    rng = np.random.default_rng(seed * 1000 + ct * 100 + depth)
    n_pal = min(1 << depth, 200) if ct == 3 else 0
    img = P.random_image(rng, h, w, ct, depth, n_palette=max(n_pal, 1))
    pal = t = None
    if ct == 3:
        pal = rng.integers(0, 256, (n_pal, 3))
        if trns:
            t = bytes(rng.integers(0, 256, max(1, n_pal // 2)).astype(np.uint8))
    elif trns and ct == 0:
        v = int(img.reshape(-1)[0])
        t = struct.pack(">H", v)
    elif trns and ct == 2:
        r, g, b = (int(x) for x in img[0, 0])
        t = struct.pack(">HHH", r, g, b)
    return P.encode(img, ct, depth, interlace=interlace, palette=pal, trns=t, filt=seed % 3)


@pytest.mark.parametrize("interlace", [False, True], ids=["plain", "adam7"])
@pytest.mark.parametrize("ct,depth", COMBOS, ids=[f"ct{c}-{d}bit" for c, d in COMBOS])
def test_png_equals_pillow_in_every_mode(ct, depth, interlace):
    for trns in ([False, True] if ct in (0, 2, 3) else [False]):
        for seed, (h, w) in enumerate([(13, 11), (1, 1), (3, 17), (9, 8)]):
            data = png_case(ct, depth, interlace=interlace, trns=trns, h=h, w=w, seed=seed)
            for mode in MODES:
                assert_same(data, mode, f"ct={ct} depth={depth} interlace={interlace} trns={trns} {h}x{w}")


@pytest.mark.parametrize("filt", [0, 1, 2, 3, 4, 5], ids=["none", "sub", "up", "average", "paeth", "each"])
@pytest.mark.parametrize("ct,depth", COMBOS, ids=[f"ct{c}-{d}bit" for c, d in COMBOS])
def test_png_filters_equal_pillow(ct, depth, filt):
    """Each filter type on its own and all five mixed row by row, for every
    colour type and depth, plain and interlaced, in one IDAT and in several
    (a plain file of <= 8 bits goes through png.c's libdeflate path, the
    rest through libspng: both must give Pillow's pixels)."""
    rng = np.random.default_rng(ct * 100 + depth * 10 + filt)
    n_pal = min(1 << depth, 200) if ct == 3 else 0
    for (h, w) in [(12, 9), (1, 5), (7, 1), (6, 33)]:
        img = P.random_image(rng, h, w, ct, depth, n_palette=max(n_pal, 1))
        pal = rng.integers(0, 256, (n_pal, 3)) if ct == 3 else None
        for interlace in (False, True):
            for chunks in (1, 3):
                data = P.encode(img, ct, depth, interlace=interlace, palette=pal, filt=filt, idat_chunks=chunks)
                for mode in MODES:
                    assert_same(data, mode, f"ct={ct} depth={depth} filter={filt} {h}x{w} "
                                            f"interlace={interlace} idat_chunks={chunks}")


def test_png_photograph_sized_rows_with_pillow_filters_equal_pillow(tmp_path):
    """A photograph-like image (smooth gradients and noise: Pillow's adaptive
    filter choice picks Paeth, Sub, Up and Average across its rows), written
    by Pillow as RGB, RGBA, L and LA, decoded in every mode, in place and
    straight into the output."""
    rng = np.random.default_rng(11)
    y, x = np.mgrid[0:67, 0:301]
    base = np.stack([(x * 3 + y) % 256, (y * 4) % 256, (x + y * 2) % 256], -1)
    rgb = np.clip(base + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
    alpha = ((x * 5 + y * 3) % 256).astype(np.uint8)[..., None]
    for mode, arr in [("RGB", rgb), ("RGBA", np.concatenate([rgb, alpha], -1)), ("L", rgb[..., 0]),
                      ("LA", np.concatenate([rgb[..., :1], alpha], -1))]:
        buf = io.BytesIO()
        Image.fromarray(arr, mode).save(buf, format="PNG")
        for m in MODES:
            assert_same(buf.getvalue(), m, f"Pillow-written {mode} 67x301")


def test_png_native_modes_are_what_numpy_of_pillow_gives():
    """mode=None is the file's own mode: palette indices, 16-bit gray as
    uint16, 1-bit as bool (a segmentation mask is read untouched)."""
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 21, (6, 5)).astype(np.uint8)
    mask = P.encode(idx, 3, 8, palette=rng.integers(0, 256, (21, 3)))
    assert np.array_equal(fastloader.decode_image(mask, mode=None), idx)
    g16 = rng.integers(0, 65536, (4, 3)).astype(np.uint16)
    got = fastloader.decode_image(P.encode(g16, 0, 16), mode=None)
    assert got.dtype == np.uint16 and np.array_equal(got, g16)
    bits = rng.integers(0, 2, (3, 9)).astype(np.uint8)
    got = fastloader.decode_image(P.encode(bits, 0, 1), mode=None)
    assert got.dtype == np.bool_ and np.array_equal(got, bits.astype(bool))
    h = fastloader.read_image_header(mask)
    assert (h["format"], h["width"], h["height"], h["mode"], h["bit_depth"]) == ("PNG", 5, 6, "P", 8)


def test_palette_index_past_the_palette_and_missing_trns_entries():
    pal = np.array([[10, 20, 30], [200, 100, 50]])
    idx = np.array([[0, 1, 5, 255]], dtype=np.uint8)
    data = P.encode(idx, 3, 8, palette=pal, trns=bytes([0]))
    for mode in MODES:
        assert_same(data, mode, "short palette")


def test_png_from_pillow_and_from_a_path(tmp_path):
    rng = np.random.default_rng(2)
    for mode, shape in [("RGB", (40, 31, 3)), ("RGBA", (40, 31, 4)), ("L", (40, 31)), ("LA", (7, 9, 2))]:
        im = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)
        p = tmp_path / f"x_{mode}.png"
        im.save(p, optimize=True)
        for m in MODES:
            assert_same(p.read_bytes(), m, f"Pillow-written {mode}")
        assert np.array_equal(fastloader.decode_image(str(p)), pillow(p.read_bytes(), "RGB"))
    im = Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).quantize(37)
    im.save(tmp_path / "q.png")
    for m in MODES:
        assert_same((tmp_path / "q.png").read_bytes(), m, "quantized")


def webp_bytes(arr, **kw):
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="WEBP", **kw)
    return buf.getvalue()


def test_webp_equals_pillow():
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:45, 0:61]
    smooth = np.stack([(x * 4) % 256, (y * 5) % 256, ((x + y) * 3) % 256], -1).astype(np.uint8)
    noise = rng.integers(0, 256, (45, 61, 3), dtype=np.uint8)
    alpha = ((x * 7 + y) % 256).astype(np.uint8)[..., None]
    cases = {
        "lossy": webp_bytes(smooth, quality=80),
        "lossy-noise": webp_bytes(noise, quality=50),
        "lossless": webp_bytes(noise, lossless=True),
        "lossy-alpha": webp_bytes(np.concatenate([smooth, alpha], -1), quality=70),
        "lossless-alpha": webp_bytes(np.concatenate([noise, alpha], -1), lossless=True),
        "odd-1x1": webp_bytes(noise[:1, :1], quality=90),
    }
    for name, data in cases.items():
        for mode in MODES:
            assert_same(data, mode, f"webp {name}")
    assert np.array_equal(fastloader.decode_image(cases["lossless"], mode="RGB"), noise)
    h = fastloader.read_image_header(cases["lossless-alpha"])
    assert (h["format"], h["mode"], h["lossless"], h["has_alpha"]) == ("WEBP", "RGBA", True, True)


def test_animated_webp_is_refused_with_a_clear_error():
    frames = [Image.fromarray(np.full((8, 8, 3), v, np.uint8)) for v in (10, 200)]
    buf = io.BytesIO()
    frames[0].save(buf, format="WEBP", save_all=True, append_images=frames[1:], duration=50)
    assert fastloader.read_image_header(buf.getvalue())["animated"] is True
    with pytest.raises(fastloader.DecodeError, match="animated"):
        fastloader.decode_image(buf.getvalue())


def test_jpeg_through_decode_image():
    rng = np.random.default_rng(4)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
    for mode in MODES:
        assert_same(buf.getvalue(), mode, "jpeg")
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (16, 24), dtype=np.uint8)).save(buf, format="JPEG")
    assert_same(buf.getvalue(), None, "gray jpeg")


def test_bad_mode_and_unknown_format():
    with pytest.raises(ValueError, match="mode must be"):
        fastloader.decode_image(b"\x89PNG\r\n\x1a\n", mode="CMYK")
    with pytest.raises(fastloader.DecodeError, match="not a PNG or WebP"):
        fastloader.decode_image(b"GIF89a" + b"\0" * 20)
    with pytest.raises(fastloader.DecodeError, match="<bytes>"):
        fastloader.decode_image(b"")


def test_pixel_limit_is_checked_before_anything_is_allocated():
    """A 100,000 x 100,000 header over a few bytes of data fails at once with
    the limit, never tries to allocate 30 GB."""
    ihdr = P.chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
    data = P.SIG + ihdr + P.chunk(b"IDAT", zlib.compress(b"\0" * 100)) + P.chunk(b"IEND", b"")
    with pytest.raises(fastloader.DecodeError, match="exceeds the limit"):
        fastloader.decode_image(data)


# ---------------------------------------------------------------------------
# damaged files: the outcome (error, or the same pixels) follows Pillow's


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - any failure is an outcome
        return ("error", type(e).__name__)


def _flip_crc(data, k):
    off, kind, n = list(P.chunks(data))[k]
    p = off + 8 + n
    return data[:p] + bytes([data[p] ^ 1]) + data[p + 1:]


def damaged_pngs():
    rng = np.random.default_rng(5)
    img = P.random_image(rng, 16, 20, 2, 8)
    good = P.encode(img, 2, 8, idat_chunks=3)
    raw = b"".join(b"\0" + img[y].tobytes() for y in range(16))
    z = zlib.compress(raw)
    hdr = good[:8 + 25]
    text = P.chunk(b"tEXt", b"k\0v")
    with_text_before = P.encode(img, 2, 8, extra_before=text)
    with_text_after = P.encode(img, 2, 8, extra_after=text)
    cases = {
        "good": good,
        "IHDR CRC": _flip_crc(good, 0),
        "first IDAT CRC": _flip_crc(good, 1),
        "second IDAT CRC": _flip_crc(good, 2),
        "tEXt CRC before IDAT": _flip_crc(with_text_before, 1),
        "tEXt CRC after IDAT": _flip_crc(with_text_after, len(list(P.chunks(with_text_after))) - 2),
        "IEND CRC": _flip_crc(good, len(list(P.chunks(good))) - 1),
        "Adler-32": hdr + P.chunk(b"IDAT", z[:-1] + bytes([z[-1] ^ 1])) + P.chunk(b"IEND", b""),
        "Adler-32 and IDAT CRC": hdr + P.chunk(b"IDAT", z[:-1] + bytes([z[-1] ^ 1]), crc=0) + P.chunk(b"IEND", b""),
        "no IEND": hdr + P.chunk(b"IDAT", z),
        "garbage after IEND": good + b"xyz",
        "junk after the zlib stream": hdr + P.chunk(b"IDAT", z + b"junk") + P.chunk(b"IEND", b""),
        "bad filter type": hdr + P.chunk(b"IDAT", zlib.compress(b"".join(b"\x07" + img[y].tobytes()
                                                                         for y in range(16)))) + P.chunk(b"IEND", b""),
        "no IDAT": hdr + P.chunk(b"IEND", b""),
        # empty IDATs: no zlib stream at all (the libdeflate path once failed with no error set, fuzz_codecs)
        "two empty IDATs": hdr + P.chunk(b"IDAT", b"") + P.chunk(b"IDAT", b"") + P.chunk(b"IEND", b""),
        "one empty IDAT": hdr + P.chunk(b"IDAT", b"") + P.chunk(b"IEND", b""),
        "empty IDATs, no IEND": hdr + P.chunk(b"IDAT", b"") + P.chunk(b"IDAT", b""),
        "broken zlib": hdr + P.chunk(b"IDAT", b"\x78\x9c\xff\xff\xff") + P.chunk(b"IEND", b""),
        "unknown ancillary chunk": hdr + P.chunk(b"abcd", b"x") + P.chunk(b"IDAT", z) + P.chunk(b"IEND", b""),
        "signature only": P.SIG,
        "IHDR cut": good[:20],
        "bad bit depth": P.SIG + P.chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 3, 2, 0, 0, 0)) + good[33:],
        "zero width": P.SIG + P.chunk(b"IHDR", struct.pack(">IIBBBBB", 0, 4, 8, 2, 0, 0, 0)) + good[33:],
    }
    for cut in range(8, len(good), 37):
        cases[f"cut at {cut}"] = good[:cut]
    return cases


# Where fastloader's outcome differs from Pillow's, and why (docs/datasets.md lists them).
PNG_KNOWN = {
    # Pillow fills the rows a too-short zlib stream does not reach and returns
    # the image; libspng (and fastloader) call it truncated
    "zlib stream ends early",
    # Pillow reads a palette image without PLTE with an all-black palette
    "palette without PLTE",
    # Pillow skips an unknown critical chunk; libspng refuses it, as the PNG spec says a decoder must
    "unknown critical chunk",
}


def test_damaged_pngs_follow_pillow():
    rng = np.random.default_rng(6)
    img = P.random_image(rng, 16, 20, 2, 8)
    hdr = P.encode(img, 2, 8)[:33]
    short = zlib.compress(b"".join(b"\0" + img[y].tobytes() for y in range(15)))
    z = zlib.compress(b"".join(b"\0" + img[y].tobytes() for y in range(16)))
    known = {
        "zlib stream ends early": hdr + P.chunk(b"IDAT", short) + P.chunk(b"IEND", b""),
        "palette without PLTE": P.encode(rng.integers(0, 4, (4, 4)).astype(np.uint8), 3, 8),
        "unknown critical chunk": hdr + P.chunk(b"ABCD", b"x") + P.chunk(b"IDAT", z) + P.chunk(b"IEND", b""),
    }
    mismatched = []
    for name, data in damaged_pngs().items():
        want = _outcome(lambda: pillow(data, "RGB"))
        got = _outcome(lambda: ours(data, "RGB"))
        if want[0] != got[0] or (want[0] == "ok" and not np.array_equal(want[1], got[1])):
            mismatched.append((name, want[0], got[0]))
        if got[0] == "error":
            assert got[1] == "DecodeError", (name, got)
    assert not mismatched, mismatched
    for name, data in known.items():
        want = _outcome(lambda: pillow(data, "RGB"))
        got = _outcome(lambda: ours(data, "RGB"))
        assert (want[0], got[0]) == ("ok", "error"), (name, want, got)
        assert got[1] == "DecodeError"
    assert set(known) == PNG_KNOWN


def test_truncated_and_damaged_webp_follow_pillow():
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:40, 0:50]
    smooth = np.stack([(x * 4) % 256, (y * 5) % 256, ((x + y) * 3) % 256], -1).astype(np.uint8)
    alpha = ((x * 7 + y) % 256).astype(np.uint8)[..., None]
    for name, good in {"lossy": webp_bytes(smooth, quality=80),
                       "lossless": webp_bytes(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8), lossless=True),
                       "alpha": webp_bytes(np.concatenate([smooth, alpha], -1), quality=80)}.items():
        variants = {f"cut at {c}": good[:c] for c in range(0, len(good), max(1, len(good) // 23))}
        for k in range(30, len(good), max(1, len(good) // 11)):
            variants[f"byte {k} flipped"] = good[:k] + bytes([good[k] ^ 0x5A]) + good[k + 1:]
        mismatched = []
        for vname, data in variants.items():
            want = _outcome(lambda: pillow(data, "RGB"))
            got = _outcome(lambda: ours(data, "RGB"))
            if want[0] != got[0] or (want[0] == "ok" and not np.array_equal(want[1], got[1])):
                mismatched.append((vname, want[0], got[0]))
            if got[0] == "error":
                assert got[1] == "DecodeError", (name, vname, got)
        assert not mismatched, (name, mismatched)


# ---------------------------------------------------------------------------
# everywhere JPEG goes: the native datasets decode PNG and WebP in C, with
# the tensors torchvision's ImageFolder (Pillow) gives


def _mixed_folder(root):
    """One class of PNGs of every kind (RGB, RGBA, gray, palette with tRNS,
    16-bit, interlaced) and WebPs (lossy, lossless, alpha), 30-70 pixels."""
    rng = np.random.default_rng(8)
    d = root / "a"
    d.mkdir(parents=True)
    y, x = np.mgrid[0:57, 0:43]
    smooth = np.stack([(x * 5) % 256, (y * 4) % 256, ((x + 2 * y) * 3) % 256], -1).astype(np.uint8)
    files = {
        "rgb.png": P.encode(smooth, 2, 8),
        "rgba.png": P.encode(np.concatenate([smooth, smooth[..., :1]], -1), 6, 8),
        "gray16.png": P.encode((smooth[..., 0].astype(np.uint16) * 257), 0, 16),
        "gray4-adam7.png": P.encode(smooth[..., 1] >> 4, 0, 4, interlace=True),
        "palette.png": P.encode((smooth[..., 2] % 40), 3, 8, palette=rng.integers(0, 256, (40, 3)),
                                trns=bytes(range(0, 200, 10))),
        "rgb16-adam7.png": P.encode(smooth.astype(np.uint16) * 200, 2, 16, interlace=True),
        "lossy.webp": webp_bytes(smooth, quality=75),
        "lossless.webp": webp_bytes(smooth, lossless=True),
        "alpha.webp": webp_bytes(np.concatenate([smooth, smooth[..., 1:2]], -1), quality=75),
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    return root


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_imagefolder_of_png_and_webp_equals_torchvision(tmp_path, num_workers):
    torch = pytest.importorskip("torch")
    tv = pytest.importorskip("torchvision")
    from torchvision import transforms as T

    from helpers_pipelines import val_tf

    root = _mixed_folder(tmp_path / "mixed")
    for tf in (val_tf(40, 32, lib=T), T.Compose([T.Resize(36), T.CenterCrop(32), T.Grayscale(), T.PILToTensor()])):
        ours = fastloader.ImageFolder(str(root), transform=tf)
        ref = tv.datasets.ImageFolder(str(root), transform=tf)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            xs = torch.cat([x for x, _ in fastloader.DataLoader(ours, batch_size=4, num_workers=num_workers)])
        assert not [m for m in w if "Pillow" in str(m.message)], [str(m.message) for m in w]
        for i, (path, _) in enumerate(ref.samples):
            want = ref[i][0]
            assert torch.equal(xs[i], want), (os.path.basename(path), tf)


def test_png_bomb_text_chunk_and_pixel_limit_in_a_dataset(tmp_path):
    """A PNG over the dataset's pixel limit fails with the limit, naming the
    file, before its pixels are allocated; so does a zTXt chunk that would
    inflate past the ancillary-chunk limit."""
    torch = pytest.importorskip("torch")  # noqa: F841
    from torchvision import transforms as T

    d = tmp_path / "big" / "a"
    d.mkdir(parents=True)
    ihdr = P.chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 0, 0, 0, 0))
    (d / "huge.png").write_bytes(P.SIG + ihdr + P.chunk(b"IDAT", zlib.compress(b"\0" * 30001 * 4))
                                 + P.chunk(b"IEND", b""))
    ds = fastloader.ImageFolder(str(tmp_path / "big"), transform=T.Compose([T.Resize((8, 8)), T.PILToTensor()]))
    with pytest.raises(fastloader.DecodeError, match="huge.png.*exceeds the limit"):
        ds.load_batch([0], 0, 0)
    def with_text(n):
        return P.encode(np.zeros((4, 4), np.uint8), 0, 8,
                        extra_before=P.chunk(b"zTXt", b"comment\0\0" + zlib.compress(b"A" * n, 9)))

    for n, ok in ((1 << 20, True), ((1 << 20) + 10000, False), (40 << 20, False)):
        # the boundary is Pillow's MAX_TEXT_CHUNK
        assert _outcome(lambda: pillow(with_text(n), "RGB"))[0] == ("ok" if ok else "error")
        if ok:
            assert fastloader.decode_image(with_text(n)).shape == (4, 4, 3)
        else:
            with pytest.raises(fastloader.DecodeError, match="limits"):
                fastloader.decode_image(with_text(n))


@pytest.mark.parametrize("source", ["folder", "shards"])
def test_png_webp_and_an_animated_webp_in_a_folder_and_in_shards(tmp_path, source):
    """Still PNG/WebP decode in C silently; an animated WebP goes to Pillow
    (its first frame, one warning), in a folder and as tar-shard members
    (the shard reader keeps a copy only of what Pillow will read)."""
    torch = pytest.importorskip("torch")
    tv = pytest.importorskip("torchvision")
    from torchvision import transforms as T

    from fastloader.tools.pack import pack_shards

    root = _mixed_folder(tmp_path / "mixed")
    frames = [Image.fromarray(np.full((40, 30, 3), v, np.uint8)) for v in (30, 220)]
    frames[0].save(root / "a" / "zz_anim.webp", save_all=True, append_images=frames[1:], duration=50)
    tf = T.Compose([T.Resize((24, 24)), T.PILToTensor()])
    ref = tv.datasets.ImageFolder(str(root), transform=tf)
    want = torch.stack([ref[i][0] for i in range(len(ref))])
    if source == "folder":
        ds = fastloader.ImageFolder(str(root), transform=tf)
    else:
        pack_shards(str(root), str(tmp_path / "sh"), shard_size=1 << 20, shuffle_seed=None, progress=False)
        ds = fastloader.WebDataset(sorted(str(p) for p in (tmp_path / "sh").glob("*.tar")), transform=tf,
                                   shuffle=0, shardshuffle=False, image_exts=("png", "webp"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = torch.cat([x for x, _ in fastloader.DataLoader(ds, batch_size=4, num_workers=2)])
    pillow = [str(m.message) for m in w if "Pillow" in str(m.message)]
    assert len(pillow) == 1 and ("zz_anim.webp" if source == "folder" else "position 9") in pillow[0], pillow
    assert torch.equal(got, want)
