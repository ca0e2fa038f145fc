"""Test JPEGs made at test time from real photographs shipped with scikit-image.

Everything is encoded in memory with Pillow (and with libjpeg-turbo's cjpeg /
jpegtran for what Pillow cannot write: restart markers, arithmetic coding,
4:4:0 and 4:1:1 subsampling; the helpers return None when the tool is absent
so that tests can skip cleanly).  Images are small (<= 512 px) to keep the
tests fast.
"""

from __future__ import annotations

import functools
import io
import shutil
import struct
import subprocess

import numpy as np
from PIL import Image

# skimage.data loaders for photographs shipped inside the wheel (no download).
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


@functools.lru_cache(maxsize=None)
def photo(name: str = "astronaut") -> np.ndarray:
    """An RGB uint8 photograph (H x W x 3) from skimage.data; read-only."""
    import skimage.data

    arr = np.ascontiguousarray(getattr(skimage.data, name)()[..., :3])
    arr.setflags(write=False)
    return arr


def photo_image(name: str = "astronaut", size: tuple[int, int] | None = None) -> Image.Image:
    """The photograph as a Pillow RGB image, resized to size=(w, h) if given."""
    im = Image.fromarray(photo(name), "RGB")
    if size is not None and im.size != tuple(size):
        im = im.resize(size, Image.Resampling.BILINEAR)
    return im


def plan_on_pil(pil: Image.Image, plan: dict, out_channels: int = 3) -> Image.Image:
    """What torchvision does to a PIL image for one native plan's decisions
    (``_C._plan_sample``), without its policy ops: convert("L") for one
    output channel, crop + resize (bilinear, antialiased: PIL's own resize),
    the window (zero padded, as CenterCrop pads), then the horizontal flip,
    the vertical flip and RandomGrayscale where the plan says so."""
    img = pil.convert("L") if out_channels == 1 else pil
    x, y, w, h = plan["box"]
    out = img.crop((x, y, x + w, y + h)).resize(tuple(plan["resized"]), Image.BILINEAR)
    wx, wy = plan["window"]
    ow, oh = plan["out"]
    if (wx, wy) != (0, 0) or (ow, oh) != out.size:
        out = out.crop((wx, wy, wx + ow, wy + oh))
    if plan.get("flip"):
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    if plan.get("vflip"):
        out = out.transpose(Image.FLIP_TOP_BOTTOM)
    if plan.get("gray") and out.mode == "RGB":
        out = out.convert("L").convert("RGB")
    return out


def crop_resize_flip(pil: Image.Image, plan: dict, out_h: int, out_w: int) -> Image.Image:
    """torchvision's resized_crop of the plan's box to out_h x out_w with the
    plan's filter (1 bicubic, else bilinear), then its horizontal flip: the
    geometry of a RandomResizedCrop(AndInterpolation) + flip plan, on PIL."""
    from torchvision.transforms import functional as TF

    x, y, w, h = plan["box"]
    interp = TF.InterpolationMode.BICUBIC if plan["interp"] == 1 else TF.InterpolationMode.BILINEAR
    out = TF.resized_crop(pil, y, x, h, w, [out_h, out_w], interpolation=interp)
    return TF.hflip(out) if plan["flip"] else out


def chw(pil: Image.Image) -> np.ndarray:
    """A PIL image as the native uint8 CHW array."""
    a = np.asarray(pil)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def make_jpeg(
    name: str = "astronaut",
    size: tuple[int, int] | None = (301, 203),
    *,
    mode: str = "RGB",
    quality: int = 90,
    subsampling: str | int = "4:2:0",
    progressive: bool = False,
    exif: bytes | Image.Exif | None = None,
    xmp: bytes | None = None,
) -> bytes:
    """Encode a photograph as JPEG with Pillow.

    mode "RGB" (YCbCr in the file), "L" (grayscale) or "CMYK" (Adobe inverted
    CMYK, as Pillow and Photoshop write it).  Odd default sizes exercise the
    partial iMCUs at the right and bottom edges.
    """
    im = photo_image(name, size)
    if mode != "RGB":
        im = im.convert(mode)
    kw = dict(quality=quality, progressive=progressive)
    if mode == "RGB":
        kw["subsampling"] = subsampling
    if exif is not None:
        kw["exif"] = exif
    if xmp is not None:
        kw["xmp"] = xmp
    buf = io.BytesIO()
    im.save(buf, "JPEG", **kw)
    return buf.getvalue()


def exif_orientation(k: int) -> Image.Exif:
    """An Exif block (written little-endian by Pillow) with Orientation = k."""
    exif = Image.Exif()
    exif[0x0112] = k
    return exif


def exif_orientation_be(k: int) -> bytes:
    """A hand-made big-endian ("MM") Exif block with IFD0 = {Orientation: k}."""
    ifd = struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, k, 0) + struct.pack(">I", 0)
    return b"Exif\0\0" + b"MM\0\x2a" + struct.pack(">I", 8) + ifd


def xmp_orientation(k: int) -> bytes:
    """An XMP packet carrying tiff:Orientation = k (Pillow's getexif() fallback)."""
    return (
        b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        b'<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="%d"/>'
        b"</rdf:RDF></x:xmpmeta>" % k
    )


# --- libjpeg-turbo command-line tools (optional) ---------------------------------


def have_tool(tool: str) -> bool:
    return shutil.which(tool) is not None


def _run(cmd: list[str], data: bytes) -> bytes:
    return subprocess.run(cmd, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True).stdout


def jpegtran(data: bytes, *args: str) -> bytes | None:
    """Losslessly transcode data with jpegtran args (e.g. "-restart", "1", or
    "-arithmetic"); None when jpegtran is not installed."""
    if not have_tool("jpegtran"):
        return None
    return _run(["jpegtran", *args], data)


def cjpeg(name: str = "astronaut", size: tuple[int, int] | None = (301, 203), *args: str) -> bytes | None:
    """Encode a photograph with cjpeg args (e.g. "-sample", "1x2"); None when
    cjpeg is not installed."""
    if not have_tool("cjpeg"):
        return None
    buf = io.BytesIO()
    photo_image(name, size).save(buf, "PPM")
    return _run(["cjpeg", *args], buf.getvalue())


# --- byte-level surgery for broken files ------------------------------------------


def segments(data: bytes):
    """Yield (marker, offset, length) of each marker segment up to and
    including the first SOS (length counts the 2 length bytes, not the marker)."""
    pos = 2
    while pos + 4 <= len(data):
        assert data[pos] == 0xFF, f"expected a marker at {pos}"
        marker = data[pos + 1]
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        yield marker, pos, length
        if marker == 0xDA:
            return
        pos += 2 + length


def sof_offset(data: bytes) -> int:
    """Offset of the SOFn marker (0xFFC0..0xFFC3, 0xFFC9..0xFFCB)."""
    for marker, pos, _ in segments(data):
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC9, 0xCA, 0xCB):
            return pos
    raise ValueError("no SOF marker")


def entropy_range(data: bytes) -> tuple[int, int]:
    """[start, end) of the first scan's entropy-coded data."""
    for marker, pos, length in segments(data):
        if marker == 0xDA:
            start = pos + 2 + length
            end = start
            while not (data[end] == 0xFF and data[end + 1] not in (0x00,) and not 0xD0 <= data[end + 1] <= 0xD7):
                end += 1
            return start, end
    raise ValueError("no SOS marker")


def with_dimensions(data: bytes, width: int, height: int) -> bytes:
    """Patch the SOF frame size (the header then lies about the image size)."""
    p = sof_offset(data)
    return data[: p + 5] + struct.pack(">HH", height, width) + data[p + 9 :]


def with_precision(data: bytes, bits: int) -> bytes:
    """Patch the SOF sample precision byte (12 makes a '12-bit' JPEG header)."""
    p = sof_offset(data)
    return data[: p + 4] + bytes([bits]) + data[p + 5 :]


def corrupt_entropy(data: bytes, where: float = 0.5, n: int = 8) -> bytes:
    """Overwrite entropy-coded data at fraction `where` of the first scan with
    n stuffed 0xFF bytes (FF 00 pairs): a run of 8n one-bits is not a valid
    Huffman code, so libjpeg warns 'Corrupt JPEG data: bad Huffman code' and
    decodes the rest of the scan as garbage.  No marker is created."""
    start, end = entropy_range(data)
    p = start + int((end - start) * where)
    while data[p - 1] == 0xFF or data[p] == 0xFF:
        p += 1
    return data[:p] + b"\xff\x00" * n + data[p + 2 * n :]


def repeat_last_scan(data: bytes, times: int) -> bytes:
    """Repeat the last scan (SOS segment + entropy data) of a progressive JPEG.

    libjpeg accepts the repeats with a 'bogus progression' warning and decodes
    every one of them, which is how a hostile file makes decoding slow."""
    assert data.endswith(b"\xff\xd9")
    last = data.rfind(b"\xff\xda")
    scan = data[last:-2]
    return data[:-2] + scan * times + b"\xff\xd9"


def extraneous_before_eoi(data: bytes, n: int = 16) -> bytes:
    """Insert n garbage bytes before EOI ('Corrupt JPEG data: n extraneous bytes
    before marker 0xd9', a warning that Pillow ignores)."""
    assert data.endswith(b"\xff\xd9")
    return data[:-2] + bytes(range(1, n + 1)) + b"\xff\xd9"


def extraneous_before_last_scan(data: bytes, n: int = 16) -> bytes:
    """Insert n garbage bytes before the last SOS marker of a multi-scan
    (progressive) JPEG: libjpeg reads them while it absorbs the scans and warns
    'Corrupt JPEG data: n extraneous bytes before marker 0xda'."""
    last = data.rfind(b"\xff\xda")
    return data[:last] + bytes(range(1, n + 1)) + data[last:]


def other_format(fmt: str) -> bytes:
    """A small PNG or GIF image (to be named .jpg)."""
    buf = io.BytesIO()
    photo_image("chelsea", (64, 48)).save(buf, fmt)
    return buf.getvalue()


# --- Pillow references ----------------------------------------------------------


def pil_decode(data: bytes, mode: str = "RGB") -> np.ndarray:
    """Pillow's Image.open(data).convert(mode) as an H x W x C array."""
    with Image.open(io.BytesIO(data)) as im:
        arr = np.asarray(im.convert(mode))
    return arr[..., None] if arr.ndim == 2 else arr


def pil_decode_transposed(data: bytes, mode: str = "RGB") -> np.ndarray:
    """Pillow's exif_transpose(Image.open(data)).convert(mode)."""
    from PIL import ImageOps

    with Image.open(io.BytesIO(data)) as im:
        arr = np.asarray(ImageOps.exif_transpose(im).convert(mode))
    return arr[..., None] if arr.ndim == 2 else arr
