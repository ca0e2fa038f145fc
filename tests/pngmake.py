"""A small PNG writer for the decoder tests: every colour type and bit depth,
Adam7 interlacing, PLTE/tRNS, and the chunk-level damage the corruption tests
need (a wrong CRC, a cut IDAT, a missing IEND), none of which Pillow's
writer can make.  The pixels come in as NumPy arrays of the PNG's own sample
values (not scaled): gray (H, W), gray+alpha (H, W, 2), RGB (H, W, 3),
RGBA (H, W, 4), palette indices (H, W); uint8, or uint16 for 16-bit."""
from __future__ import annotations

import struct
import zlib

import numpy as np

SIG = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# Adam7: (x0, y0, dx, dy) of each pass
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    """One chunk; `crc` overrides the right CRC (to damage it)."""
    if crc is None:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def _row_bytes(row: np.ndarray, depth: int, channels: int) -> bytes:
    """One row of samples packed as the PNG stores them (MSB first below 8 bits, big-endian 16)."""
    flat = row.reshape(-1).astype(np.uint32)
    if depth == 16:
        return flat.astype(">u2").tobytes()
    if depth == 8:
        return flat.astype(np.uint8).tobytes()
    per = 8 // depth
    n = len(flat)
    padded = np.zeros(((n + per - 1) // per) * per, dtype=np.uint32)
    padded[:n] = flat
    padded = padded.reshape(-1, per)
    out = np.zeros(len(padded), dtype=np.uint32)
    for k in range(per):
        out |= padded[:, k] << (8 - depth * (k + 1))
    return out.astype(np.uint8).tobytes()


def _filter(ft: int, line: bytes, prev: bytes | None, bpp: int) -> bytes:
    """One row filtered with PNG filter type ft (0 None, 1 Sub, 2 Up, 3 Average,
    4 Paeth); prev is the row above unfiltered (None for the first row: zeros)."""
    up = prev if prev is not None else bytes(len(line))
    out = bytearray(len(line))
    for i, x in enumerate(line):
        a = line[i - bpp] if i >= bpp else 0
        b = up[i]
        c = up[i - bpp] if i >= bpp else 0
        if ft == 0:
            pred = 0
        elif ft == 1:
            pred = a
        elif ft == 2:
            pred = b
        elif ft == 3:
            pred = (a + b) >> 1
        else:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
        out[i] = (x - pred) & 0xFF
    return bytes(out)


def _scanlines(img: np.ndarray, depth: int, channels: int, filt: int) -> bytes:
    """The filtered rows: every row with filter type filt (0-4), or with
    filt=5 the row's type cycling through all five (row y: y % 5)."""
    raw = bytearray()
    bpp = max(1, depth * channels // 8)
    prev = None
    for y in range(img.shape[0]):
        line = _row_bytes(img[y], depth, channels)
        ft = y % 5 if filt == 5 else filt
        raw.append(ft)
        raw += _filter(ft, line, prev, bpp)
        prev = line
    return bytes(raw)


def encode(img: np.ndarray, color_type: int, depth: int, *, interlace: bool = False,
           palette: np.ndarray | None = None, trns: bytes | None = None, filt: int = 0,
           idat_chunks: int = 1, extra_before: bytes = b"", extra_after: bytes = b"",
           level: int = 6) -> bytes:
    """A whole PNG file of `img` (see the module docstring for its layout)."""
    h, w = img.shape[:2]
    channels = CHANNELS[color_type]
    img = img.reshape(h, w, channels) if channels > 1 else img.reshape(h, w)
    if interlace:
        raw = bytearray()
        for x0, y0, dx, dy in ADAM7:
            sub = img[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += _scanlines(sub, depth, channels, filt)
        raw = bytes(raw)
    else:
        raw = _scanlines(img, depth, channels, filt)
    data = zlib.compress(raw, level)
    out = SIG + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace)))
    out += extra_before
    if palette is not None:
        out += chunk(b"PLTE", np.asarray(palette, dtype=np.uint8).reshape(-1).tobytes())
    if trns is not None:
        out += chunk(b"tRNS", trns)
    step = max(1, -(-len(data) // idat_chunks))
    for i in range(0, len(data), step):
        out += chunk(b"IDAT", data[i:i + step])
    out += extra_after
    return out + chunk(b"IEND", b"")


def chunks(png: bytes):
    """(offset, kind, length) of each chunk of a PNG file."""
    pos = len(SIG)
    while pos + 8 <= len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        yield pos, kind, n
        pos += 12 + n


def random_image(rng: np.random.Generator, h: int, w: int, color_type: int, depth: int,
                 n_palette: int = 0) -> np.ndarray:
    """Random samples valid for the colour type and depth (palette indices below n_palette)."""
    hi = n_palette if color_type == 3 else (1 << depth)
    shape = (h, w) if CHANNELS[color_type] == 1 else (h, w, CHANNELS[color_type])
    return rng.integers(0, hi, size=shape, dtype=np.uint32).astype(np.uint16 if depth == 16 else np.uint8)
