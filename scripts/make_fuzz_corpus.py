#!/usr/bin/env python3
"""Write the seed corpus of the libFuzzer targets in fuzz/ (see scripts/fuzz.sh).

usage: python scripts/make_fuzz_corpus.py OUTDIR

Writes
  OUTDIR/decode/*.jpg   small JPEGs: baseline 4:2:0 / 4:2:2 / 4:4:4, grayscale,
                        CMYK (Adobe), RGB (no colour transform), progressive,
                        arithmetic, restart markers, EXIF (both byte orders) and
                        XMP orientation, 1x1 and odd sizes, optimized Huffman
                        tables, a truncated file, junk before a marker and after EOI
  OUTDIR/region/*.bin   16 parameter bytes + one of those JPEGs (fuzz/fuzz_region.c)
  OUTDIR/render/*.bin   64 parameter bytes + one of those JPEGs (fuzz/fuzz_render.c)
  OUTDIR/augment/*.bin  17 parameter bytes + raw pixels (fuzz/fuzz_augment.c): every
                        op, both interpolations of the geometric ones, 1 and 3
                        channels, realistic and special magnitudes; torchvision's
                        GaussianBlur's kernels and versions
  OUTDIR/mix/*.bin      32 parameter bytes + pixel bytes (fuzz/fuzz_mix.c): timm's
                        Mixup in each mode (MixUp, CutMix, both, cutmix_minmax,
                        smoothing, disabled, odd batch) and torchvision's MixUp,
                        CutMix and RandomChoice, small and wide batches
  OUTDIR/tar/*.bin      a mode byte + a small shard (fuzz/fuzz_tar.c)
Everything is deterministic (fixed seeds), so the corpus is the same on every
machine.  Needs Pillow, and cjpeg / jpegtran from libjpeg-turbo-progs for the
arithmetic, restart-marker and RGB seeds (skipped with a note when missing).
"""
from __future__ import annotations

import io
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

from PIL import Image

REGION_PARAMS = 16   # fuzz/fuzz_common.h FZ_REGION_PARAMS
RENDER_PARAMS = 64   # fuzz/fuzz_common.h FZ_RENDER_PARAMS
AUGMENT_PARAMS = 17  # fuzz/fuzz_common.h FZ_AUGMENT_PARAMS


def picture(w: int, h: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Gradients with a little noise: compresses to a few hundred bytes and has edges."""
    rnd = random.Random(seed)
    img = Image.new("RGB", (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            px[x, y] = ((x * 255) // max(w - 1, 1), (y * 255) // max(h - 1, 1),
                        ((x ^ y) * 16 + rnd.randrange(32)) & 255)
    return img.convert(mode) if mode != "RGB" else img


def jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


def exif_orientation(value: int, big_endian: bool) -> bytes:
    """An Exif block (without the APP1 framing) with IFD0 holding one Orientation SHORT."""
    e = ">" if big_endian else "<"
    tiff = (b"MM" if big_endian else b"II") + struct.pack(e + "HI", 42, 8)
    tiff += struct.pack(e + "H", 1) + struct.pack(e + "HHI", 0x0112, 3, 1)
    tiff += struct.pack(e + "H", value) + b"\0\0" + struct.pack(e + "I", 0)
    return b"Exif\0\0" + tiff


def with_app1(data: bytes, payload: bytes) -> bytes:
    """Insert an APP1 segment right after SOI."""
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:]


def segments(data: bytes):
    """(offset, marker, length) of each marker segment up to and including the first SOS."""
    i = 2
    while i + 4 <= len(data):
        marker, n = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
        yield i, marker, n
        if marker == 0xDA:
            return
        i += 2 + n


def sof_patch(data: bytes, precision: int | None = None, marker: int | None = None) -> bytes:
    out = bytearray(data)
    for i, m, _ in segments(data):
        if m in (0xC0, 0xC1, 0xC2):
            if precision is not None:
                out[i + 4] = precision
            if marker is not None:
                out[i + 1] = marker
            break
    return bytes(out)


def adobe_transform(data: bytes, transform: int) -> bytes:
    out = bytearray(data)
    for i, m, n in segments(data):
        if m == 0xEE and data[i + 4:i + 9] == b"Adobe":
            out[i + 2 + n - 1] = transform
    return bytes(out)


def drop_third_component(data: bytes) -> bytes:
    """SOF and SOS with the first two of three components (the scan data no longer matches)."""
    out = bytearray(data[:2])
    for i, m, n in segments(data):
        seg = bytearray(data[i:i + 2 + n])
        if m in (0xC0, 0xC1, 0xC2) and seg[9] == 3:
            seg = seg[:-3]
            seg[9] = 2
            seg[2:4] = struct.pack(">H", len(seg) - 2)
        elif m == 0xDA and seg[4] == 3:
            seg = seg[:9] + seg[11:]
            seg[4] = 2
            seg[2:4] = struct.pack(">H", len(seg) - 2)
            out += seg + data[i + 2 + n:]
            return bytes(out)
        out += seg
    return bytes(out)


def tool(args: list[str], data: bytes) -> bytes | None:
    """Run cjpeg / jpegtran on data (stdin -> stdout); None when unavailable."""
    if shutil.which(args[0]) is None:
        return None
    return subprocess.run(args, input=data, stdout=subprocess.PIPE, check=True).stdout


def ppm(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PPM")
    return buf.getvalue()


def make_jpegs() -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    base = picture(33, 17, seed=1)
    out["baseline_420_33x17.jpg"] = jpeg(base, quality=75, subsampling=2)
    out["baseline_422_33x17.jpg"] = jpeg(base, quality=80, subsampling=1)
    out["baseline_444_33x17.jpg"] = jpeg(base, quality=90, subsampling=0)
    out["baseline_420_48x40.jpg"] = jpeg(picture(48, 40, seed=2), quality=60)
    out["gray_31x23.jpg"] = jpeg(picture(31, 23, "L", seed=3), quality=80)
    out["gray_1x1.jpg"] = jpeg(picture(1, 1, "L"), quality=90)
    out["rgb_1x1.jpg"] = jpeg(picture(1, 1), quality=90)
    out["odd_7x5.jpg"] = jpeg(picture(7, 5, seed=4), quality=85)
    out["odd_3x64.jpg"] = jpeg(picture(3, 64, seed=5), quality=70)
    out["odd_64x3.jpg"] = jpeg(picture(64, 3, seed=6), quality=70)
    out["mcu_16x16.jpg"] = jpeg(picture(16, 16, seed=7), quality=75)
    out["cmyk_adobe_19x13.jpg"] = jpeg(picture(19, 13, "CMYK", seed=8), quality=85)
    out["progressive_420_40x24.jpg"] = jpeg(picture(40, 24, seed=9), quality=75, progressive=True)
    out["progressive_gray_21x17.jpg"] = jpeg(picture(21, 17, "L", seed=10), quality=75, progressive=True)
    out["optimized_25x19.jpg"] = jpeg(picture(25, 19, seed=11), quality=75, optimize=True)
    for o in (2, 3, 5, 6, 8):
        payload = exif_orientation(o, big_endian=o % 2 == 0)
        out[f"exif_orientation{o}_{'be' if o % 2 == 0 else 'le'}_13x7.jpg"] = with_app1(
            jpeg(picture(13, 7, seed=12), quality=80), payload)
    xmp = (b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta><rdf:Description "
           b"tiff:Orientation=\"6\"/></x:xmpmeta>")
    out["xmp_orientation6_11x9.jpg"] = with_app1(jpeg(picture(11, 9, seed=13), quality=80), xmp)
    good = out["baseline_420_33x17.jpg"]
    out["truncated_33x17.jpg"] = good[: len(good) * 2 // 3]
    out["trailing_junk_33x17.jpg"] = good + b"\0junk after EOI\xff\xd9"
    # junk bytes before the first DQT marker: a libjpeg warning, not an error
    out["junk_before_marker_33x17.jpg"] = good[:2] + b"\x00\x11\x22" + good[2:]

    # header variants libjpeg parses but jpeg.c must refuse or convert:
    # 2 components (JCS_UNKNOWN), Adobe transform 2 (YCCK), 12-bit samples, lossless SOF3
    out["two_components_33x17.jpg"] = drop_third_component(out["baseline_444_33x17.jpg"])
    out["ycck_adobe_19x13.jpg"] = adobe_transform(out["cmyk_adobe_19x13.jpg"], 2)
    out["precision12_33x17.jpg"] = sof_patch(good, precision=12)
    out["lossless_sof3_33x17.jpg"] = sof_patch(good, marker=0xC3)

    src = ppm(picture(37, 29, seed=14))
    made = {
        "arithmetic_37x29.jpg": tool(["jpegtran", "-arithmetic"], out["baseline_420_48x40.jpg"]),
        "arithmetic_progressive_40x24.jpg": tool(["jpegtran", "-arithmetic", "-progressive"],
                                                 out["baseline_444_33x17.jpg"]),
        "restart_rows1_37x29.jpg": tool(["cjpeg", "-quality", "80", "-restart", "1"], src),
        "restart_blocks2_37x29.jpg": tool(["cjpeg", "-quality", "80", "-restart", "2B"], src),
        "progressive_restart_37x29.jpg": tool(["cjpeg", "-progressive", "-restart", "1B"], src),
        "rgb_colorspace_37x29.jpg": tool(["cjpeg", "-rgb", "-quality", "85"], src),
        "gray_cjpeg_37x29.jpg": tool(["cjpeg", "-grayscale", "-sample", "1x1"], src),
        "h1v2_37x29.jpg": tool(["cjpeg", "-sample", "1x2,1x1,1x1"], src),
        "h4v1_37x29.jpg": tool(["cjpeg", "-sample", "4x1,1x1,1x1"], src),
    }
    missing = [k for k, v in made.items() if v is None]
    if missing:
        print(f"make_fuzz_corpus: cjpeg/jpegtran missing (apt-get install libjpeg-turbo-progs); "
              f"skipped {len(missing)} seeds", file=sys.stderr)
    out.update({k: v for k, v in made.items() if v is not None})
    return out


def u16(v: int) -> bytes:
    return struct.pack(">H", v & 0xFFFF)


def dim(n: int) -> bytes:
    """fuzz_render.c fz_dim encoding of a size n (1..8192)."""
    if n <= 32:
        return u16(n - 1)
    if n <= 128:
        return u16((4 << 13) | (n - 1))
    if n <= 512:
        return u16((6 << 13) | (n - 1))
    return u16((7 << 13) | (n - 1))


def region_params(ch: int, strict: int, invalid: int | None, scale: int, x: float, y: float,
                  w: float, h: float, pad: int = 0, scans: int = 0) -> bytes:
    flags = (1 if ch == 1 else 0) | (strict << 1)
    flags |= (invalid << 4) if invalid is not None else 0b0100
    p = bytes([flags, (scale - 1) % 16, scans])
    p += b"".join(u16(int(f * 65535)) for f in (x, y, w, h)) + bytes([pad])
    return p.ljust(REGION_PARAMS, b"\0")


def spec_bytes(form: int, ch: int = 3, hwc: int = 0, crop: int = 0, custom_rrc: int = 0,
               a: int = 8, b: int = 8, c: int = 6, d: int = 6, flip: int = 0, dtype: int = 0,
               scale_to_unit: int = 0, normalize: int = 0, corrupt: int = 0xFF, field: int = 0) -> bytes:
    """build_spec()'s 24 bytes (fuzz_render.c)."""
    opts = (1 if ch == 1 else 0) | (hwc << 1) | (crop << 2) | (custom_rrc << 3)
    dt = dtype | (scale_to_unit << 2) | (normalize << 4)
    return (bytes([form, opts]) + dim(a) + dim(b) + dim(c) + dim(d)
            + u16(3000) + u16(60000) + u16(20000) + u16(45000)
            + bytes([flip, dt, 0b100110, 0b011011, corrupt, field]))


def render_params(mode: int, spec: bytes, rest: bytes) -> bytes:
    return (bytes([mode]) + spec + rest).ljust(RENDER_PARAMS, b"\0")


def augment_params(op: int, interp: int, channels: int, w: int, h: int, *, u: float | None = None,
                   special: int | None = None, fill=(0, 0, 0)) -> bytes:
    """fuzz/fuzz_augment.c's parameter block: op, magnitude (kind 2: the op's
    realistic range at fraction u; kind 1: entry `special` of its table),
    interpolation, channels (1 or 3), width and height (1..40), fill."""
    if u is not None:
        kind, bits = 2, int(u * (1 << 53)) << 11
    else:
        kind, bits = 1, special
    out = bytes([op, kind]) + struct.pack(">Q", bits) + bytes([interp, 1 if channels == 3 else 0, w - 1, h - 1])
    out += bytes(fill)
    assert len(out) == AUGMENT_PARAMS
    return out


def make_augment() -> dict[str, bytes]:
    names = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
             "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert",
             # timm's (augment.h FL_AUG_SOLARIZE_ADD ..)
             "SolarizeAdd", "AffineShearX", "AffineShearY", "AffineTranslateX", "AffineTranslateY",
             "BrightnessFactor", "ColorFactor", "ContrastFactor", "SharpnessFactor"]
    out = {}
    for op, name in enumerate(names):
        geometric = 1 <= op <= 5 or 16 <= op <= 19
        for j, (w, h, ch) in enumerate([(17, 11, 3), (8, 8, 1), (23, 5, 3), (3, 3, 1)]):
            px = picture(w, h, "RGB" if ch == 3 else "L", seed=op * 7 + j).tobytes()
            interp = (j % 3 if op == 5 or op >= 16 else j % 2) if geometric else 0   # bicubic: timm's
            fill = (200, 30, 90) if j % 2 else (0xEE, 0, 0)
            out[f"{name}_{w}x{h}x{ch}_u{j}"] = augment_params(op, interp, ch, w, h, u=(0.13 + 0.29 * j) % 1.0,
                                                              fill=fill) + px
        # the special values: rotations by multiples of 90 (square), 1e300, 0, 1 ...
        px = picture(8, 8, seed=op).tobytes()
        for sp in (4, 5, 6, 13, 0, 2):
            out[f"{name}_special{sp}"] = augment_params(op, sp % 2 if geometric else 0, 3, 8, 8, special=sp) + px
    # torchvision's GaussianBlur (check_gblur), on the inputs of Pillow's GaussianBlur op (46): the fill bytes
    # pick the kernel sides (1 + 2 (b % 16); 0x80: square, 0xFF: even), v2 (bit 0), 16 lanes (bit 1), the
    # stand-in exp (bit 3); the interpolation byte's bit 0 passes the raw magnitude as sigma
    for j, (w, h, ch, fill, interp) in enumerate([(17, 11, 3, (11, 0x80, 0), 0), (23, 5, 3, (1, 2, 1), 0),
                                                   (8, 8, 1, (3, 0x80, 3), 0), (3, 3, 1, (1, 1, 8), 1),
                                                   (40, 31, 3, (15, 9, 2), 0), (5, 4, 3, (0xFF, 0x80, 0), 0),
                                                   (2, 9, 1, (0, 4, 9), 1)]):
        px = picture(w, h, "RGB" if ch == 3 else "L", seed=460 + j).tobytes()
        out[f"TorchvisionGaussianBlur_{w}x{h}x{ch}_{j}"] = augment_params(46, interp, ch, w, h, u=(0.2 + 0.37 * j) % 1.0,
                                                                           fill=fill) + px
    return out


MIX_PARAMS = 32   # fuzz/fuzz_common.h FZ_MIX_PARAMS


def mix_params(api: int, n: int, c: int, h: int, w: int, classes: int, spec: bytes, bad_label: int = 0) -> bytes:
    """fuzz/fuzz_mix.c's parameter block: api (bit 0 timm, bit 1 raw float
    pixels), N, C, H, W (as dim_of reads them: 0..40, 251 -> 1, 252 -> 513,
    253 -> 1000), classes - 1, seed, epoch, batch, the spec, the label byte."""
    out = bytes([api, n, c, h, w, classes - 1]) + struct.pack(">IBH", 12345 + n * 7 + h, 1, 3 + w) + spec
    out = out.ljust(MIX_PARAMS - 1, b"\0") + bytes([bad_label])
    assert len(out) == MIX_PARAMS
    return out


def timm_spec(mixup: int, cutmix: int, *, minmax: tuple[int, int] | None = None, prob: int = 200,
              switch: int = 100, mode: int = 0, correct: int = 1, enabled: int = 1, smoothing: int = 25) -> bytes:
    """timm's Mixup in fuzz_mix.c's bytes: alphas in 1/40, minmax in 1/200,
    probabilities in 1/200, smoothing in 1/250."""
    lo, hi = minmax or (0, 0)
    flags = (1 if correct else 0) | (0 if enabled else 2)
    return bytes([mixup, cutmix, 1 if minmax else 0, lo, hi, prob, switch, mode, flags, smoothing])


def make_mix() -> dict[str, bytes]:
    out = {}
    shapes = [(8, 3, 13, 17), (2, 1, 1, 5), (6, 2, 3, 252), (4, 1, 2, 253), (5, 3, 4, 4), (0, 3, 4, 4)]
    timm = {
        "mixup_cutmix": timm_spec(32, 40),
        "mixup_only": timm_spec(8, 0, smoothing=0),
        "cutmix_uncorrected": timm_spec(0, 20, correct=0),
        "minmax": timm_spec(12, 40, minmax=(40, 160)),
        "prob_switch": timm_spec(4, 4, prob=120, switch=60, smoothing=75),
        "tiny_alpha": timm_spec(240 + 2, 240 + 9),
        "disabled": timm_spec(32, 40, enabled=0),
    }
    rnd = random.Random(99)
    for si, (n, c, h, w) in enumerate(shapes):
        px = bytes(rnd.randrange(256) for _ in range(257))
        for name, spec in timm.items():
            for mode in range(3):
                api = 1 | (2 if (si + mode) % 4 == 3 else 0)
                out[f"timm_{name}_mode{mode}_{n}x{c}x{h}x{w}"] = mix_params(
                    api, n, c, h, w, 5 + si, spec[:7] + bytes([mode]) + spec[8:]) + px
        for name, spec in {"mixup": bytes([0, 0, 32, 200]), "cutmix": bytes([0, 1, 40, 200]),
                           "choice": bytes([1, 0, 8, 60, 1, 40, 140])}.items():
            out[f"tv_{name}_{n}x{c}x{h}x{w}"] = mix_params(2 * (si % 2), n, c, h, w, 4, spec) + px
    out["timm_bad_label"] = mix_params(1, 4, 1, 5, 5, 3, timm["mixup_cutmix"], bad_label=0x81) + bytes(range(64))
    out["tv_bad_label"] = mix_params(0, 4, 1, 5, 5, 3, bytes([0, 0, 32, 200]), bad_label=0x82) + bytes(range(64))
    return out


def make_tars() -> dict[str, bytes]:
    """Small shards in each tar dialect tar.c reads (trailing zero blocks cut:
    the reader accepts a clean end on a block boundary)."""
    import io
    import tarfile

    def tar(fmt, members, **kw):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt, **kw) as tf:
            for name, data, typ in members:
                ti = tarfile.TarInfo(name)
                ti.type = typ
                ti.mtime = 0
                if typ == tarfile.SYMTYPE:
                    ti.linkname = "x"
                if typ == tarfile.REGTYPE:
                    ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data) if typ == tarfile.REGTYPE else None)
        out = buf.getvalue().rstrip(b"\0")
        return out + b"\0" * (-len(out) % 512)

    reg, long = tarfile.REGTYPE, "d/" + "x" * 110 + ".seg.PNG"
    base = [("a/k1.jpg", b"\xff\xd8jpeg", reg), ("a/k1.cls", b"3", reg), ("a/k2.jpg", b"", reg),
            ("a/k2.json", b"{}", reg), ("__meta__", b"m", reg), (".x.txt", b"t", reg)]
    return {
        "gnu_long": tar(tarfile.GNU_FORMAT, base + [(long, b"L" * 600, reg)]),
        "pax_long_utf8": tar(tarfile.PAX_FORMAT, base + [(long, b"p", reg), ("\u00fcn/\u00ef.txt", b"u", reg)]),
        "ustar_prefix": tar(tarfile.USTAR_FORMAT, base + [("p" * 120 + "/n.jpg", b"u", reg)]),
        "pax_global": tar(tarfile.PAX_FORMAT, base, pax_headers={"comment": "abc"}),
        "types": tar(tarfile.GNU_FORMAT, [("dir", b"", tarfile.DIRTYPE), ("dir/l.jpg", b"", tarfile.SYMTYPE),
                                          ("dir/f.jpg", b"f", reg), ("fifo", b"", tarfile.FIFOTYPE)]),
        "duplicate": tar(tarfile.GNU_FORMAT, [("k.jpg", b"1", reg), ("k.JPG", b"2", reg)]),
    }


def make_codecs() -> dict[str, bytes]:
    """PNG (every colour type and depth, interlaced, tRNS, several IDATs) and
    WebP (lossy, lossless, alpha, animated) seeds for fuzz/fuzz_codecs.c,
    small so that the mutator works on headers and chunk structure."""
    import io
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import pngmake as P

    rng = np.random.default_rng(99)
    out = {}
    combos = [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16), (3, 1), (3, 4), (3, 8), (4, 8), (4, 16),
              (6, 8), (6, 16)]
    for i, (ct, depth) in enumerate(combos):
        n_pal = min(1 << depth, 16) if ct == 3 else 0
        img = P.random_image(rng, 5 + i % 3, 6 + i % 4, ct, depth, n_palette=max(n_pal, 1))
        pal = rng.integers(0, 256, (n_pal, 3)) if ct == 3 else None
        trns = None
        if ct == 3:
            trns = bytes(range(0, 255, 40))
        elif ct == 0 and i % 2:
            trns = b"\x00\x01"
        elif ct == 2:
            trns = b"\x00\x01\x00\x02\x00\x03"
        out[f"ct{ct}_{depth}.png"] = P.encode(img, ct, depth, palette=pal, trns=trns, filt=i % 3)
        out[f"ct{ct}_{depth}_adam7.png"] = P.encode(img, ct, depth, interlace=True, palette=pal, trns=trns,
                                                    idat_chunks=2)
    text = P.chunk(b"zTXt", b"k\0\0" + __import__("zlib").compress(b"x" * 300))
    out["ztxt.png"] = P.encode(P.random_image(rng, 4, 4, 2, 8), 2, 8, extra_before=text)
    y, x = np.mgrid[0:12, 0:10]
    rgb = np.stack([x * 20, y * 20, (x + y) * 10], -1).astype(np.uint8)
    for name, arr, kw in [("lossy.webp", rgb, dict(quality=60)), ("lossless.webp", rgb, dict(lossless=True)),
                          ("alpha.webp", np.concatenate([rgb, rgb[..., :1]], -1), dict(quality=60)),
                          ("alpha_lossless.webp", np.concatenate([rgb, rgb[..., 1:2]], -1), dict(lossless=True))]:
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="WEBP", **kw)
        out[name] = buf.getvalue()
    buf = io.BytesIO()
    frames = [Image.fromarray(rgb), Image.fromarray(rgb[::-1].copy())]
    frames[0].save(buf, format="WEBP", save_all=True, append_images=frames[1:], duration=40)
    out["animated.webp"] = buf.getvalue()
    return out


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    jpegs = make_jpegs()
    tmp = tempfile.mkdtemp(prefix=".corpus-", dir=os.path.dirname(os.path.abspath(outdir)) or ".")
    for sub in ("decode", "region", "render"):
        os.makedirs(os.path.join(tmp, sub))

    def put(sub: str, name: str, data: bytes) -> None:
        with open(os.path.join(tmp, sub, name), "wb") as f:
            f.write(data)

    for name, data in jpegs.items():
        put("decode", name, data)

    rnd = random.Random(1234)
    names = sorted(jpegs)
    # region: whole image and sub-regions at every fast scale, both channel counts
    for i, name in enumerate(names):
        data = jpegs[name]
        scale = (8, 4, 2, 1, 16, 3)[i % 6]
        put("region", f"full_s8_{name}.bin", region_params(3, 0, None, 8, 0, 0, 1, 1) + data)
        put("region", f"sub_s{scale}_{name}.bin",
            region_params(1 + 2 * (i % 2), i % 3 == 0, None, scale, rnd.random(), rnd.random(),
                          rnd.random(), rnd.random(), pad=i % 5) + data)
    # every invalid kind once, on a baseline image
    for kind in range(16):
        put("region", f"invalid{kind}.bin",
            region_params(3, 0, kind, 8, 0.25, 0.25, 0.5, 0.5) + jpegs["baseline_420_48x40.jpg"])
    # scan limit hit by a progressive file
    put("region", "scan_limit.bin",
        region_params(3, 0, None, 8, 0, 0, 1, 1, scans=2) + jpegs["progressive_420_40x24.jpg"])

    # render: each pipeline shape through each mode
    shapes = [
        ("none", dict(form=0)),
        ("rrc", dict(form=1, a=12, b=10, flip=3)),
        ("rrc_custom_f32_norm", dict(form=1, a=16, b=16, custom_rrc=1, dtype=3, scale_to_unit=1, normalize=1)),
        ("resize_hw_gray", dict(form=2, ch=1, a=9, b=21)),
        ("resize_hw_crop_hwc", dict(form=2, hwc=1, crop=1, a=20, b=20, c=24, d=12)),
        ("resize_short_crop_f16", dict(form=3, crop=1, a=10, c=8, d=8, dtype=1, scale_to_unit=2)),
        ("resize_short_bf16_norm", dict(form=4, crop=1, a=40, c=32, d=30, dtype=2, scale_to_unit=1, normalize=1)),
        ("resize_max_size", dict(form=5, crop=1, a=10, b=4, c=9, d=9, flip=1 | (63 << 2))),
        ("max_size_only", dict(form=6, crop=1, a=16, c=12, d=12)),
        ("center_crop_only_pad", dict(form=7, c=50, d=7)),
        ("upscale", dict(form=2, a=300, b=200)),
        ("invalid_std0", dict(form=1, dtype=3, normalize=1, corrupt=0, field=19)),
        ("invalid_out_channels", dict(form=1, corrupt=0x2B, field=14)),
        ("invalid_nan_ratio", dict(form=1, corrupt=0x0C, field=5)),
    ]
    img_names = ["baseline_420_48x40.jpg", "gray_31x23.jpg", "cmyk_adobe_19x13.jpg",
                 "progressive_420_40x24.jpg", "odd_7x5.jpg", "exif_orientation6_be_13x7.jpg"]
    for si, (sname, kw) in enumerate(shapes):
        spec = spec_bytes(**kw)
        for mode in range(4):
            img = img_names[(si + mode) % len(img_names)]
            if mode <= 1:   # native: flags (dct_scaling, on_error, batch), seed, epoch
                flags = (mode & 1) | ((si % 3) << 1) | (8 if si % 4 == 3 else 0) | (16 if si % 8 == 7 else 0)
                rest = bytes([flags]) + struct.pack(">I", 1000 + si) + bytes([si % 5])
            elif mode == 2:  # render(): flags, view scale / origin (full view), seed, epoch, index
                rest = bytes([si % 2, 0, 0]) + struct.pack(">I", 7 * si) + bytes([1, si])
            else:            # render() with an explicit plan
                rest = bytes([si % 2, 1 | (3 << 2), 1 | (8 << 2)]) + struct.pack(">I", si) + bytes([0, 0])
                rest += bytes([0b10000000 | (si & 0x40), 3, 2, 20, 15]) + dim(11) + dim(7) + bytes([254, 1])
                rest += dim(9) + dim(6)
            put("render", f"{sname}_mode{mode}.bin", render_params(mode, spec, rest) + jpegs[img])
            if sname.startswith("rrc") and mode in (0, 2):   # with a GaussianBlur (build_blur), before and after the gray
                for k, (b1, b2, b3) in enumerate([(1 << 5 | 4, 0x80, 0), (3, 2, 0x18 | 2), (1 << 5 | 1, 0x80, 0x40 | 1)]):
                    blur = bytes([1 | (2 if k != 1 else 0x80), b1, b2, b3])
                    params = render_params(mode, spec, rest)
                    params = params[:RENDER_PARAMS - 24] + blur + params[RENDER_PARAMS - 20:]
                    put("render", f"{sname}_mode{mode}_blur{k}.bin", params + jpegs[img])
            if sname.startswith("rrc") and mode in (0, 2):   # with a timm policy (build_policy)
                for interp in range(4):
                    b0 = 1 | (2 << 1) | (interp << 3) | (0x80 if interp == 3 else 0)
                    if interp == 2:   # timm's AutoAugment: one sub-policy per sample (rounds 1)
                        b0 = 1 | (1 << 1) | (interp << 3) | 0x40
                    pol = bytes([b0, 14, 124, 116, 104,
                                 17 * interp + 3, 200, 31, 77, 146, 9, 250])
                    params = render_params(mode, spec, rest)[:RENDER_PARAMS - len(pol)] + pol
                    put("render", f"{sname}_mode{mode}_timm{interp}.bin", params + jpegs[img])

    # tar (fuzz/fuzz_tar.c): mode byte (bit 0: the harness fixes checksums), then a shard
    os.makedirs(os.path.join(tmp, "tar"))
    for name, data in make_tars().items():
        put("tar", name + ".bin", b"\x00" + data)
        put("tar", name + "_fixsum.bin", b"\x01" + data)

    # codecs (fuzz/fuzz_codecs.c): a PNG or WebP file
    os.makedirs(os.path.join(tmp, "codecs"))
    for name, data in make_codecs().items():
        put("codecs", name, data)

    # augment (fuzz/fuzz_augment.c): parameters, then raw pixels
    os.makedirs(os.path.join(tmp, "augment"))
    for name, data in make_augment().items():
        put("augment", name + ".bin", data)

    # mix (fuzz/fuzz_mix.c): parameters, then pixel bytes
    os.makedirs(os.path.join(tmp, "mix"))
    for name, data in make_mix().items():
        put("mix", name + ".bin", data)

    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.rename(tmp, outdir)
    counts = {s: len(os.listdir(os.path.join(outdir, s))) for s in ("decode", "region", "render", "augment", "mix", "tar",
                                                                 "codecs")}
    print(f"make_fuzz_corpus: wrote {outdir}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
