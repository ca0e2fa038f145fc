"""JPEG decode cost by DCT scale and by region, on ~500x400 q90 4:2:0 photos.

For each of four scikit-image photographs resized to 500x400 and saved by
Pillow at quality 90, 4:2:0, this times (single thread, min and median over
--repeat interleaved rounds of --number calls, per image):

  pillow      Image.open(...).convert("RGB")  (reference)
  full 8/8    fastloader._C.decode_jpeg / _decode_region at scale 8
  scale k/8   _decode_region of the whole image at scale k (k = 7..1)
  crop 50%    _decode_region at full scale of a 354x283 window (50% of the
              area) at an unaligned offset (x=73, y=61)
  crop 50% @4/8  the same window at half scale

libjpeg-turbo has SIMD IDCTs only for 8x8 (islow), 4x4 and 2x2 (and the 1x1
DC-only case is trivial), i.e. scales 8, 4, 2, 1; the other scales use C
IDCTs (jpeg_idct_7x7 etc.), and the chroma upsampling/color conversion path
may change with the scale too.

    python benchmarks/bench_decode_scale.py [--repeat 7] [--number 40]
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

import numpy as np
from PIL import Image


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastloader._C as _C  # noqa: E402

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
SIZE = (500, 400)


def make_photos():
    import skimage.data

    out = []
    for name in PHOTOS:
        im = Image.fromarray(np.ascontiguousarray(getattr(skimage.data, name)()[..., :3]), "RGB")
        im = im.resize(SIZE, Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90, subsampling="4:2:0")
        out.append(buf.getvalue())
    return out


def bench_all(rows, datas, repeat, number):
    """Seconds per image for each row: (min, median) over `repeat` rounds.
    Rows are interleaved within each round so that machine noise and
    frequency drift hit all of them alike."""
    times = {name: [] for name, _ in rows}
    for _ in range(repeat):
        for name, fn in rows:
            t0 = time.perf_counter()
            for _ in range(number):
                for d in datas:
                    fn(d)
            times[name].append((time.perf_counter() - t0) / (number * len(datas)))
    return {name: (min(t), statistics.median(t)) for name, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=40)
    args = ap.parse_args()
    datas = make_photos()
    w0, h0 = SIZE

    def pil(d):
        with Image.open(io.BytesIO(d)) as im:
            return im.convert("RGB")

    def scaled(k):
        W, H = -(-w0 * k // 8), -(-h0 * k // 8)
        return lambda d: _C._decode_region(d, k, 0, 0, W, H, 3)

    def crop(k):
        x, y, w, h = 73, 61, 354, 283
        x, y, w, h = x * k // 8, y * k // 8, w * k // 8, h * k // 8
        return lambda d: _C._decode_region(d, k, x, y, w, h, 3)

    rows = [("pillow convert('RGB')", pil), ("decode_jpeg RGB", _C.decode_jpeg),
            ("decode_jpeg L", lambda d: _C.decode_jpeg(d, mode="L")),
            ("read_jpeg_header", _C.read_jpeg_header)]
    rows += [(f"scale {k}/8", scaled(k)) for k in range(8, 0, -1)]
    rows += [("crop 50% area @8/8", crop(8)), ("crop 50% area @4/8", crop(4))]

    res = bench_all(rows, datas, args.repeat, args.number)
    base = res["scale 8/8"][0]
    print(f"{len(datas)} photos {w0}x{h0} q90 4:2:0, {sum(map(len, datas)) // len(datas)} bytes avg; "
          f"libjpeg-turbo {_C.libjpeg_turbo_version}; {args.repeat} rounds x {args.number} x {len(datas)} images")
    print(f"{'':24s} {'min ms':>8s} {'med ms':>8s} {'min/8/8':>8s} {'Mpx/s out':>10s}")
    for name, fn in rows:
        tmin, tmed = res[name]
        out = fn(datas[0])
        px = out.shape[0] * out.shape[1] if hasattr(out, "shape") else 0
        mpx = f"{px / tmin / 1e6:10.1f}" if px else ""
        print(f"{name:24s} {tmin * 1e3:8.3f} {tmed * 1e3:8.3f} {tmin / base:8.2f} {mpx:>10s}")


if __name__ == "__main__":
    main()
