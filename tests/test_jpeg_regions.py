"""Region decoding at the edges of what libjpeg-turbo's crop handles: a region
equals the same window of a full decode also for the narrowest crops, and for
a progressive file whose scans leave coefficients unknown (decoded with
libjpeg's block smoothing)."""
from __future__ import annotations

import numpy as np
import pytest

import fastloader._C as _C
import imgutil as U

SIZE = (61, 37)


def _scaled(n, s):
    return (n * s + 7) // 8


KINDS = {
    "420": lambda: U.make_jpeg("chelsea", SIZE),
    "422": lambda: U.make_jpeg("chelsea", SIZE, subsampling="4:2:2"),
    "440": lambda: U.cjpeg("coffee", SIZE, "-sample", "1x2"),
    "411": lambda: U.cjpeg("coffee", SIZE, "-sample", "4x1"),
    "progressive-420": lambda: U.make_jpeg("rocket", SIZE, progressive=True),
}


@pytest.mark.parametrize("scale", [8, 4])
@pytest.mark.parametrize("name", sorted(KINDS))
def test_narrow_regions_equal_the_full_decode(name, scale):
    # A 1-pixel region at x=0 used to crop 2 columns, leaving the 4:2:0 chroma
    # a one-sample row that libjpeg-turbo upsampled differently.
    data = KINDS[name]()
    if data is None:
        pytest.skip("cjpeg (libjpeg-turbo-progs) not installed")
    W, H = _scaled(SIZE[0], scale), _scaled(SIZE[1], scale)
    full = _C._decode_region(data, scale, 0, 0, W, H, 3)
    for x in range(W):
        for w in (1, 2, 3):
            if x + w <= W:
                got = _C._decode_region(data, scale, x, 2, w, H - 2, 3)
                np.testing.assert_array_equal(got, full[2:, x:x + w], err_msg=f"x={x} w={w}")


def _first_scans(data, k):
    """A progressive JPEG cut after its k-th scan, with EOI: valid, but some
    coefficients are never sent, so libjpeg smooths blocks."""
    starts = [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xDA]
    return data[:starts[k]] + b"\xff\xd9"


@pytest.mark.parametrize("k", [1, 3, 6])
def test_incomplete_progressive_regions_equal_the_full_decode(k):
    # libjpeg-turbo's block smoothing takes a crop's first block column for
    # the image edge; the region must not come out different for it.
    data = _first_scans(U.make_jpeg("coffee", (97, 41), progressive=True), k)
    # (Pillow's libjpeg-turbo 3 smooths some of these blocks differently
    # from 2.1: the reference here is our own full decode.)
    full = _C.decode_jpeg(data)
    H, W = full.shape[:2]
    for x in range(0, W - 5, 3):
        got = _C._decode_region(data, 8, x, 4, 5, H - 8, 3)
        np.testing.assert_array_equal(got, full[4:H - 4, x:x + 5], err_msg=f"x={x}")
