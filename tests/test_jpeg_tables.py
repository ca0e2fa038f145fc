"""A native worker reuses one libjpeg decoder for every file it decodes, and
libjpeg keeps quantization and Huffman tables in its decompress struct from
one image to the next.  These tests pin that every file starts from a clean
table state: a file whose DQT is missing fails even right after a good file,
a file whose DHT is missing decodes with libjpeg-turbo's standard tables (as
in a fresh decoder, and as Pillow does) whatever came before, and no file's
outcome or pixels depend on the order in which one worker decodes them."""
from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
import fastloader._C as _C  # noqa: E402

import imgutil as U  # noqa: E402

W, H = 48, 32


def _jpeg(name, quality=75, optimize=False, subsampling="4:2:0", mode="RGB"):
    """A small JPEG; optimize=True gives it image-specific (non-standard)
    Huffman tables, so that they differ from the ones a stale decoder holds."""
    im = U.photo_image(name, (W, H))
    if mode != "RGB":
        im = im.convert(mode)
    buf = io.BytesIO()
    kw = {"subsampling": subsampling} if mode == "RGB" else {}
    im.save(buf, "JPEG", quality=quality, optimize=optimize, **kw)
    return buf.getvalue()


def _strip(data, marker, which=None):
    """data without its `marker` segments before the first SOS (all of them,
    or only the which-th one, counting from 0)."""
    out, pos, k = bytearray(data[:2]), 2, 0
    for m, p, length in U.segments(data):
        if m == marker and (which is None or which == k):
            out += data[pos:p]
        else:
            out += data[pos:p + 2 + length]
        k += m == marker
        pos = p + 2 + length
        if m == 0xDA:
            out += data[pos:]
    assert len(out) < len(data), "nothing stripped"
    return bytes(out)


def _loader(paths, order=None, on_error="raise"):
    """(DataLoader over ImageList(paths) with one worker and batches of one,
    the dataset).  Labels are the file positions; the full-size CenterCrop
    keeps the decoded pixels unchanged (uint8, HWC)."""
    tf = FT.Compose([FT.CenterCrop((H, W)), FT.PILToTensor()])
    ds = fastloader.ImageList([str(p) for p in paths], list(range(len(paths))), transform=tf, layout="HWC",
                              on_error=on_error)
    dl = fastloader.DataLoader(ds, batch_size=1, num_workers=1, sampler=order)
    return dl, ds


def _write(tmp_path, files):
    paths = []
    for i, data in enumerate(files):
        p = tmp_path / f"f{i:03d}.jpg"
        p.write_bytes(data)
        paths.append(p)
    return paths


@pytest.mark.parametrize("which, table", [(None, 0), (0, 0), (1, 1)])
def test_missing_dqt_fails_even_after_a_good_file(tmp_path, which, table):
    good = _jpeg("chelsea", quality=50)
    bad = _strip(_jpeg("coffee"), 0xDB, which)
    # A fresh decoder (decode_jpeg, _decode_region) and Pillow refuse it.
    reason = f"Quantization table 0x{table:02x} was not defined"
    with pytest.raises(_C.DecodeError, match=reason):
        _C.decode_jpeg(bad)
    with pytest.raises(_C.DecodeError, match=reason):
        _C._decode_region(bad, 8, 0, 0, W, H, 3)
    with pytest.raises(OSError):
        U.pil_decode(bad)
    # One worker decodes good, bad, good, bad: the first batch arrives, the
    # second raises, naming the file (before the fix it decoded with the
    # good file's tables).
    paths = _write(tmp_path, [good, bad, good, bad])
    dl, _ = _loader(paths)
    it = iter(dl)
    x, y = next(it)
    assert y.tolist() == [0]
    assert np.array_equal(x[0].numpy(), U.pil_decode(good))
    with pytest.raises(fastloader.DecodeError, match=rf"f001\.jpg: {reason}"):
        next(it)
    # on_error="skip" drops exactly the bad files, the good ones keep their pixels.
    dl, ds = _loader(paths, on_error="skip")
    got = {int(t): x[k].numpy() for x, y in dl for k, t in enumerate(y)}
    assert sorted(got) == [0, 2]
    assert [p for p, _ in ds.skipped] == [str(paths[1]), str(paths[3])]


@pytest.mark.parametrize("which", [None, 0, 2])
def test_missing_dht_decodes_as_a_fresh_decoder_whatever_came_before(tmp_path, which):
    # x was written with the standard Huffman tables (Pillow's default), so a
    # fresh libjpeg-turbo decoder, which supplies the standard tables for empty
    # slots 0 and 1, decodes it exactly.  Its predecessor has optimized tables.
    x = _strip(_jpeg("coffee", quality=80), 0xC4, which)
    before = _jpeg("astronaut", quality=95, optimize=True)
    ref = U.pil_decode(x)
    assert np.array_equal(_C.decode_jpeg(x), ref)
    before_path, x_path = _write(tmp_path, [before, x])
    alone = [b[0].numpy() for b, _ in _loader([x_path])[0]]
    after = [b[0].numpy() for b, _ in _loader([before_path, x_path])[0]]
    assert np.array_equal(alone[0], ref)
    assert np.array_equal(after[0], U.pil_decode(before))
    assert np.array_equal(after[1], ref)


# --- order independence: a seeded batch of table-damaged files --------------------


def _mutants(n, seed):
    """n files: intact ones with varied tables, and ones whose DQT/DHT
    segments are removed, damaged, renumbered or duplicated."""
    rng = np.random.default_rng(seed)
    bases = [_jpeg(name, quality=q, optimize=opt, subsampling=ss, mode=mode)
             for name, q, opt, ss, mode in [("chelsea", 40, False, "4:2:0", "RGB"),
                                            ("coffee", 90, True, "4:2:0", "RGB"),
                                            ("astronaut", 70, True, "4:4:4", "RGB"),
                                            ("rocket", 60, False, "4:4:4", "L"),
                                            ("chelsea", 95, True, "4:2:0", "L")]]
    files = []
    for i in range(n):
        d = bases[int(rng.integers(len(bases)))]
        segs = [(m, p, ln) for m, p, ln in U.segments(d) if m in (0xDB, 0xC4)]
        op = int(rng.integers(6))
        m, p, ln = segs[int(rng.integers(len(segs)))]
        if op == 0:    # intact
            pass
        elif op == 1:  # one table segment removed
            d = d[:p] + d[p + 2 + ln:]
        elif op == 2:  # every segment of one kind removed
            d = _strip(d, m)
        elif op == 3:  # table ids renumbered (points at a slot this file never fills)
            b = bytearray(d)
            b[p + 4] = (b[p + 4] & 0xF0) | int(rng.integers(1, 4))
            d = bytes(b)
        elif op == 4:  # a byte of a table payload overwritten
            b = bytearray(d)
            b[p + 5 + int(rng.integers(ln - 3))] = int(rng.integers(256))
            d = bytes(b)
        else:          # a segment duplicated with another one's id
            seg = bytearray(d[p:p + 2 + ln])
            seg[4] ^= 1
            d = d[:p] + bytes(seg) + d[p:]
        files.append(d)
    return files


def test_outcome_never_depends_on_decode_order(tmp_path):
    files = _mutants(60, seed=9)
    paths = _write(tmp_path, files)

    def run(order):
        dl, ds = _loader(paths, order=order, on_error="skip")
        got = {int(t): x[k].numpy() for x, y in dl for k, t in enumerate(y)}
        return got, {p for p, _ in ds.skipped}

    order = list(range(len(files)))
    shuffled = list(np.random.default_rng(1).permutation(len(files)))
    a, skipped_a = run(order)
    b, skipped_b = run(shuffled[::-1])
    assert skipped_a == skipped_b
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), f"file {k} decodes differently in another order"
    # Each outcome is the one of a fresh decoder (decode_jpeg makes one per call).
    for k, data in enumerate(files):
        try:
            ref = _C.decode_jpeg(data)
        except _C.DecodeError:
            assert k not in a
        else:
            assert np.array_equal(a[k], ref)
    # The batch exercises both outcomes, and decodable files without any DHT.
    assert len(skipped_a) >= 5 and len(a) >= 30, (len(skipped_a), len(a))
    assert sum(b"\xff\xc4" not in files[k][:files[k].find(b"\xff\xda")] for k in a) >= 3
