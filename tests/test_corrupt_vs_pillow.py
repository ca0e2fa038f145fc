"""Corrupt data: fastloader's outcome is Pillow's.

Pillow is the reference: Image.open(BytesIO(b)).convert("RGB") with default
settings.  A seeded mutator damages small JPEGs of each kind (baseline 4:2:0
and 4:4:4, grayscale, progressive, two restart-interval layouts) with bit
flips, byte overwrites, truncations at many points, garbage after the image, a
removed or damaged EOI, removed and duplicated segments, markers between the
scan and EOI, and a damaged signature.  For every input:

- the same outcome: both decode, or Pillow raises and decode_jpeg raises
  DecodeError (never another exception);
- when both decode, the same pixels;
- the outcome of a region (_decode_region of a seeded random window, which
  decodes only the rows it needs and stops) is the whole image's, and its
  pixels are the window of the whole image: an outcome never depends on the
  crop.

A mismatch we accept on purpose is listed in EXCEPTIONS with its reason and
counted exactly, so that a change in either decoder shows up here.  Before
the corrupt-data rule (jpeg.c, "Corrupt data") this corpus gave 116 inputs
that decode_jpeg decoded and Pillow refused (65 damaged signatures, 45
markers after the scan, 6 other damage after the scan) and 59 regions that
decoded while the whole image failed (truncated or unterminated scans).
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from PIL import Image

import fastloader._C as _C
import imgutil as U

DecodeError = _C.DecodeError
SIZE = (67, 45)   # odd: partial MCUs on both edges
N_PER_SEED = 110
KINDS = ["bitflip", "overwrite", "truncate", "truncate-tail", "tail-garbage", "no-eoi", "damaged-eoi",
         "remove-segment", "duplicate-segment", "tail-marker", "signature"]


def _seeds():
    base = U.make_jpeg("chelsea", SIZE)
    seeds = {
        "baseline-420": base,
        "baseline-444": U.make_jpeg("coffee", SIZE, subsampling="4:4:4"),
        "gray": U.make_jpeg("astronaut", SIZE, mode="L"),
        "progressive": U.make_jpeg("rocket", SIZE, progressive=True),
    }
    for name, args in [("restart-rows", ("-restart", "1")), ("restart-2mcu", ("-restart", "2B"))]:
        data = U.jpegtran(base, *args)
        if data is not None:
            seeds[name] = data
    return seeds


def _mutate(data, rng):
    """One seeded mutation of data (which ends with EOI): (kind, bytes)."""
    d = bytearray(data)
    n = len(d)
    scan_end = n - 2
    segs = [(p, 2 + length) for _, p, length in U.segments(data)]   # header segments and the SOS
    kind = KINDS[int(rng.integers(len(KINDS)))]
    if kind == "signature":            # the third byte (the first marker's 0xFF) changed
        d[2] = int(rng.integers(255))
    elif kind == "bitflip":
        for _ in range(int(rng.integers(1, 4))):
            d[int(rng.integers(n))] ^= 1 << int(rng.integers(8))
    elif kind == "overwrite":
        for _ in range(int(rng.integers(1, 4))):
            d[int(rng.integers(n))] = int(rng.integers(256))
    elif kind == "truncate":
        del d[int(rng.integers(2, n)):]
    elif kind == "truncate-tail":      # cut in the last 32 bytes
        del d[n - int(rng.integers(1, 33)):]
    elif kind == "tail-garbage":       # bytes after EOI, or before it
        junk = rng.bytes(int(rng.integers(1, 40)))
        if rng.integers(2):
            d += junk
        else:
            d[scan_end:scan_end] = junk
    elif kind == "no-eoi":
        del d[scan_end:]
    elif kind == "damaged-eoi":        # EOI's 0xFF overwritten: the scan runs to the end of the file
        d[scan_end] = int(rng.integers(255))
    elif kind == "remove-segment":
        p, ln = segs[int(rng.integers(len(segs)))]
        del d[p:p + ln]
    elif kind == "duplicate-segment":
        p, ln = segs[int(rng.integers(len(segs)))]
        where = [p, p + ln, scan_end][int(rng.integers(3))]
        d[where:where] = data[p:p + ln]
    else:                              # a marker or segment between the scan and EOI
        body = bytes([0xFF, int(rng.integers(1, 255))])
        if rng.integers(2):
            ln = int(rng.integers(0, 12))
            body += ln.to_bytes(2, "big") + rng.bytes(max(0, ln - 2))
        if rng.integers(4) == 0:       # and the file ends inside it
            d[scan_end:] = body[:int(rng.integers(1, len(body) + 1))]
        else:
            d[scan_end:scan_end] = body
    return kind, bytes(d)


def _corpus():
    rng = np.random.default_rng(20241130)
    for name, data in _seeds().items():
        for i in range(N_PER_SEED):
            kind, mutated = _mutate(data, rng)
            yield f"{name}/{i}/{kind}", mutated


def _pillow(data):
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB")), None
    except Exception as e:   # noqa: BLE001 - any Pillow failure is an error outcome
        return None, f"{type(e).__name__}: {e}"


def _ours(data):
    try:
        return _C.decode_jpeg(data), None
    except DecodeError as e:
        return None, str(e)


def _region(data, rng):
    """((x, y, w, h), pixels, None) for a random window decoded with
    _decode_region, ((x, y, w, h), None, reason) when that fails, or
    (None, None, reason) when the header cannot be read."""
    try:
        h = _C.read_jpeg_header(data)
    except DecodeError as e:
        return None, None, str(e)
    W, H = h["width"], h["height"]
    x, y = int(rng.integers(W)), int(rng.integers(H))
    box = x, y, int(rng.integers(1, W - x + 1)), int(rng.integers(1, H - y + 1))
    try:
        return box, _C._decode_region(data, 8, *box, 3), None
    except DecodeError as e:
        return box, None, str(e)


def _scan_unterminated(data):
    """True when no marker follows the entropy-coded data of the first scan
    (bytes FF xx with xx other than 00, FF and RST0-7): the scan runs to the
    end of the file."""
    for marker, p, length in U.segments(data):
        if marker == 0xDA:
            i = p + 2 + length
            while (i := data.find(b"\xff", i) + 1) > 0:
                while i < len(data) and data[i] == 0xFF:
                    i += 1
                if i < len(data) and data[i] != 0 and not 0xD0 <= data[i] <= 0xD7:
                    return False
            return True
    return False


# Mismatches we accept on purpose: class -> (count in this corpus, reason).
EXCEPTIONS = {
    "unterminated-scan-pillow-ok": (13, """\
The entropy-coded data of the scan runs to the end of the file (no marker
after it: EOI missing or damaged).  Pillow refuses such a file only when its
decoder asks for bytes past the end, which depends on the bit position where
the last MCU ends (libjpeg-turbo refills its bit buffer with up to 7 bytes
ahead): a file whose damaged EOI left two stray bytes often decodes.  We
refuse every such file ('Premature end of JPEG file'): the rule must hold
without Huffman-decoding the rows below a crop, and a scan that is not
terminated is a truncated or damaged file."""),
}


def _classify(data, pil_err, ours_err):
    if pil_err is None and ours_err.endswith("Premature end of JPEG file") and _scan_unterminated(data):
        return "unterminated-scan-pillow-ok"
    return None


def test_corrupt_outcomes_match_pillow():
    rng = np.random.default_rng(7)
    counts = {"both-ok": 0, "both-error": 0}
    mismatches: dict[str, list[str]] = {}
    crop_problems = []
    for label, data in _corpus():
        pil, pil_err = _pillow(data)
        ours, ours_err = _ours(data)
        if pil is not None and ours is not None:
            if np.array_equal(pil, ours):
                counts["both-ok"] += 1
            else:
                mismatches.setdefault("pixels differ", []).append(label)
        elif pil is None and ours is None:
            counts["both-error"] += 1
        else:
            cls = _classify(data, pil_err, ours_err)
            key = cls or ("unexplained: pillow-error/ours-ok" if ours is not None
                          else "unexplained: pillow-ok/ours-error")
            mismatches.setdefault(key, []).append(f"{label}: pillow={pil_err} ours={ours_err}")
        box, reg, reg_err = _region(data, rng)
        if box is not None:
            x, y, w, h = box
            if (reg is None) != (ours is None):
                crop_problems.append(f"{label}: region {box}: {reg_err}; whole image: {ours_err}")
            elif reg is not None and not np.array_equal(reg, ours[y:y + h, x:x + w]):
                crop_problems.append(f"{label}: region {box}: pixels differ from the whole image's")
    # printed on failure
    print(counts)
    for k, v in mismatches.items():
        print(k, *v, sep="\n  ")
    print("crop problems", *crop_problems, sep="\n  ")
    assert counts["both-ok"] > 200 and counts["both-error"] > 300, counts
    assert {k: len(v) for k, v in mismatches.items()} == {k: n for k, (n, _) in EXCEPTIONS.items() if n}
    assert not crop_problems


def test_exception_classes_are_real():
    """Each documented exception exists as described (a hand-made instance)."""
    data = _seeds()["baseline-420"]
    assert data.endswith(b"\xff\xd9")
    damaged = data[:-2] + b"\x7f\xd9"     # what the corpus' damaged EOI does
    assert _scan_unterminated(damaged)
    assert _pillow(damaged)[1] is None
    with pytest.raises(DecodeError, match="Premature end of JPEG file"):
        _C.decode_jpeg(damaged)
    # with EOI intact, or only missing, both agree
    assert _pillow(data)[1] is None and _ours(data)[1] is None
    assert _pillow(data[:-2])[1] is not None and _ours(data[:-2])[1] is not None


# Hand-made tails: what libjpeg reads after the only scan when it finishes.
TAILS = {
    "eoi": (b"\xff\xd9", True),
    "garbage then EOI": (b"junk\x00\xff\x00\xff\xd9", True),
    "RST then EOI": (b"\xff\xd3\xff\xd9", True),
    "COM then EOI": (b"\xff\xfe\x00\x05abc\xff\xd9", True),
    "APP1 cut by the end of the file": (b"\xff\xe1\x00\x10abc", True),
    "DHT after the scan": (b"\xff\xc4\x00\x14\x00" + bytes([1] + [0] * 15) + b"\x05\xff\xd9", True),
    "unknown marker": (b"\xff\x12\xff\xd9", False),
    "second SOI": (b"\xff\xd8\xff\xd9", False),
    "second SOF": (b"\xff\xc0\xff\xd9", False),
    "second scan": (b"\xff\xda\x00\x0c\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00\xff\xd9", False),
    "bad DQT index": (b"\xff\xdb\x00\x43\x09" + bytes(64) + b"\xff\xd9", False),
    "bad DRI length": (b"\xff\xdd\x00\x05\x00\x00\x00\xff\xd9", False),
    "bad DHT counts": (b"\xff\xc4\x00\x14\x00" + bytes([255] * 16) + b"\xff\xd9", False),
}


@pytest.mark.parametrize("name", sorted(TAILS))
@pytest.mark.parametrize("seed", ["baseline-420", "restart-rows"])
def test_tail_after_the_scan(name, seed):
    base = _seeds().get(seed)
    if base is None:
        pytest.skip("jpegtran (libjpeg-turbo-progs) not installed")
    tail, ok = TAILS[name]
    data = base[:-2] + tail
    assert (_pillow(data)[1] is None) == ok, _pillow(data)[1]
    W, H = SIZE
    for box in [(0, 0, W, H), (10, 3, 20, 9), (0, 0, 1, 1)]:   # whole, middle, top-left pixel
        if ok:
            np.testing.assert_array_equal(_C._decode_region(data, 8, *box, 3), U.pil_decode(data)[
                box[1]:box[1] + box[3], box[0]:box[0] + box[2]])
        else:
            with pytest.raises(DecodeError, match="Corrupt JPEG data after the image scan"):
                _C._decode_region(data, 8, *box, 3)


def test_signature_must_be_ff_d8_ff():
    data = _seeds()["baseline-420"]
    bad = data[:2] + b"\x00" + data[2:]   # libjpeg would skip the stray byte
    with pytest.raises(OSError):
        U.pil_decode(bad)
    with pytest.raises(DecodeError, match=r"Not a JPEG file: starts with 0xff 0xd8 0x00"):
        _C.decode_jpeg(bad)
    with pytest.raises(DecodeError, match=r"Not a JPEG file"):
        _C.read_jpeg_header(bad)


def test_native_path_agrees(tmp_path):
    """Through ImageList + DataLoader (random crops decoded region by region
    on one reused decoder), a file is skipped exactly when decode_jpeg
    refuses it."""
    torch = pytest.importorskip("torch")
    import fastloader
    from fastloader import transforms as FT

    files = [d for i, (_, d) in enumerate(_corpus()) if i % 11 == 0]
    paths = []
    for i, d in enumerate(files):
        p = tmp_path / f"m{i:03d}.jpg"
        p.write_bytes(d)
        paths.append(str(p))
    tf = FT.Compose([FT.RandomResizedCrop(8, scale=(0.05, 0.3)), FT.PILToTensor()])
    ds = fastloader.ImageList(paths, list(range(len(paths))), transform=tf, layout="HWC", on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # files whose SOI was hit go through Pillow, with a warning
        got = {int(t) for _, y in fastloader.DataLoader(ds, batch_size=4, num_workers=1,
                                                        generator=torch.Generator().manual_seed(3))
               for t in y}
    refused = {i for i, d in enumerate(files) if _ours(d)[1] is not None}
    assert got == set(range(len(files))) - refused
    assert len(refused) >= 10 and len(got) >= 10
