"""fastloader.tools.pack: `python -m fastloader pack shards` -- ImageFolder to tar
shards in the WebDataset layout, checked against torchvision's ImageFolder
scan and read back with the webdataset library."""
from __future__ import annotations

import json
import os
import random
import re
import tarfile

import numpy as np
import pytest
from PIL import Image

from fastloader import __main__ as cli
from fastloader.tools.pack import pack_shards
from fastloader.tools.sizes import parse_size

pytestmark = pytest.mark.fastloader_only


def _img(path, rng, fmt):
    h, w = rng.integers(8, 40, size=2)
    arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, format=fmt)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """36 tiny images in 3 classes, with what a folder scan can get wrong:
    class names that sort by code point ("Zebra" < "ant"), upper-case
    extensions, dots in a file name, two files with one stem, a nested
    folder, and a file that is not an image."""
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(7)
    for c in ("ant", "Zebra", "bee"):
        os.makedirs(root / c / "nested")
        for i in range(10):
            fmt, ext = [("JPEG", "jpg"), ("PNG", "png"), ("JPEG", "JPEG")][i % 3]
            _img(root / c / f"{c}_{i}.{ext}", rng, fmt)
        _img(root / c / "photo.v2.final.png", rng, "PNG")
        _img(root / c / "same.jpg", rng, "JPEG")
        _img(root / c / "nested" / "deep.jpg", rng, "JPEG")
        (root / c / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def reference(src):
    """(classes, [(path, label)]) as torchvision's ImageFolder sees `src`."""
    datasets = pytest.importorskip("torchvision.datasets")
    ds = datasets.ImageFolder(str(src))
    return ds.classes, ds.samples


def _members(shard):
    with tarfile.open(shard) as t:
        return [(m, t.extractfile(m).read()) for m in t.getmembers()]


def _index(out):
    return json.loads((out / "index.json").read_text())


def _shards(out):
    return [out / n for n in _index(out)["shards"]]


def _wds_samples(pattern, decode=None):
    wds = pytest.importorskip("webdataset")
    ds = wds.WebDataset(pattern, shardshuffle=False, empty_check=False)
    if decode:
        ds = ds.decode(decode)
    return list(ds)


# ----------------------------------------------------------------------------
# interoperability with the webdataset library


def test_webdataset_reads_the_same_keys_bytes_and_labels(src, reference, tmp_path):
    classes, samples = reference
    st = pack_shards(src, tmp_path / "out", shard_size="8kB", progress=False)
    assert st["samples"] == len(samples) == 39 and st["classes"] == 3 and st["shards"] > 3
    got = _wds_samples(st["pattern"])
    assert len(got) == len(samples)
    order = list(range(len(samples)))
    random.Random(0).shuffle(order)  # the documented default: shuffled with seed 0
    assert [s["__key__"] for s in got] == [f"{i:06d}" for i in order]
    for s in got:
        path, label = samples[int(s["__key__"])]
        ext = os.path.splitext(path)[1][1:].lower()
        assert {k for k in s if not k.startswith("__")} == {"cls", ext}, s.keys()
        with open(path, "rb") as f:
            assert s[ext] == f.read(), path
        assert s["cls"] == str(label).encode() and int(s["cls"]) == label
    index = _index(tmp_path / "out")
    assert index["classes"] == classes == ["Zebra", "ant", "bee"]
    assert index["total"] == len(samples) and index["shuffle_seed"] == 0


def test_webdataset_decode_pil_gives_the_source_pixels(src, reference, tmp_path):
    _, samples = reference
    st = pack_shards(src, tmp_path / "out", progress=False)
    got = _wds_samples(st["pattern"], decode="pil")
    seen = set()
    for s in got:
        path, _ = samples[int(s["__key__"])]
        ext = os.path.splitext(path)[1][1:].lower()
        if ext in seen:
            continue
        seen.add(ext)  # one sample per kind: jpg, jpeg, png
        with Image.open(path) as im:
            want = np.asarray(im.convert("RGB"))
        assert np.array_equal(np.asarray(s[ext]), want), path
    assert seen == {"jpg", "jpeg", "png"}


# ----------------------------------------------------------------------------
# the files themselves


def test_tar_headers_are_deterministic_and_samples_grouped(src, tmp_path):
    pack_shards(src, tmp_path / "out", shard_size="8kB", progress=False)
    keys = []
    for shard in _shards(tmp_path / "out"):
        raw = shard.read_bytes()
        assert len(raw) % 512 == 0 and raw[-1024:] == bytes(1024)  # the two end blocks
        members = _members(shard)
        for m, _ in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode, m.type) == (0, 0, 0, "", "", 0o444,
                                                                                 tarfile.REGTYPE), m.name
            assert re.fullmatch(r"\d{6}\.(cls|jpg|jpeg|png)", m.name), m.name
        # two members per sample, .cls first, then the image, with one key
        for (a, _), (b, _) in zip(members[::2], members[1::2]):
            ka, ea = a.name.split(".")
            kb, eb = b.name.split(".")
            assert ka == kb and ea == "cls" and eb != "cls"
            keys.append(ka)
    assert len(keys) == len(set(keys)) == 39


def test_two_runs_give_identical_bytes(src, tmp_path):
    a = pack_shards(src, tmp_path / "a", shard_size="8kB", progress=False)
    b = pack_shards(src, tmp_path / "b", shard_size="8kB", progress=False)
    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(tmp_path / "b")) and len(names) == a["shards"] + 1 == b["shards"] + 1
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n
    # another seed is another order; no shuffle is ImageFolder order
    c = pack_shards(src, tmp_path / "c", shuffle_seed=1, progress=False)
    d = pack_shards(src, tmp_path / "d", shuffle_seed=None, progress=False)
    keys_c = [m.name for m, _ in _members(c["pattern"])][::2]
    keys_d = [m.name for m, _ in _members(d["pattern"])][::2]
    assert keys_d == sorted(keys_d) and keys_c != keys_d and sorted(keys_c) == keys_d
    assert _index(tmp_path / "d")["shuffle_seed"] is None


def test_shard_size_splits_greedily_and_counts_match_the_index(src, tmp_path):
    limit = 6000
    st = pack_shards(src, tmp_path / "out", shard_size=limit, progress=False)
    index = _index(tmp_path / "out")
    shards = _shards(tmp_path / "out")
    assert st["shards"] == len(shards) == len(index["counts"]) > 5
    assert sorted(os.listdir(tmp_path / "out")) == sorted(index["shards"] + ["index.json"])  # no .tmp left
    first_sample = []  # tar bytes of each shard's first sample
    for shard, count in zip(shards, index["counts"]):
        members = _members(shard)
        assert len(members) == 2 * count
        first_sample.append(sum(512 + -(-len(d) // 512) * 512 for _, d in members[:2]))
        size = shard.stat().st_size
        assert size <= limit or count == 1, (shard, size, count)
    assert sum(index["counts"]) == index["total"] == st["samples"] == 39
    # closed only when the next sample would not fit
    for shard, nxt in zip(shards, first_sample[1:]):
        assert shard.stat().st_size + nxt > limit
    assert st["bytes"] == sum(s.stat().st_size for s in shards)

    # a sample larger than shard_size gets a shard of its own
    one = pack_shards(src, tmp_path / "one", shard_size=1, progress=False)
    assert one["shards"] == 39 and _index(tmp_path / "one")["counts"] == [1] * 39

    # max_count
    mc = pack_shards(src, tmp_path / "mc", max_count=5, progress=False)
    assert _index(tmp_path / "mc")["counts"] == [5] * 7 + [4] and mc["shards"] == 8
    assert mc["pattern"].endswith("shard-{000000..000007}.tar")


# ----------------------------------------------------------------------------
# command line


def test_cli_packs_and_prints_json(src, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(["pack", "shards", str(src), str(out), "--shard-size", "20kB", "--prefix", "train",
                   "--seed", "3", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert cap.err == ""  # stderr is not a terminal: no progress line unless --progress
    st = json.loads(cap.out)
    index = _index(out)
    assert st["samples"] == index["total"] == 39 and st["shuffle_seed"] == index["shuffle_seed"] == 3
    assert index["shards"][0] == "train-000000.tar" and st["shards"] == len(index["shards"]) > 1
    assert all((out / n).stat().st_size <= 20_000 for n in index["shards"])
    assert st["pattern"] == str(out / f"train-{{000000..{st['shards'] - 1:06d}}}.tar")
    got = _wds_samples(st["pattern"])
    assert sorted(s["__key__"] for s in got) == [f"{i:06d}" for i in range(39)]


def test_cli_progress_and_summary(src, tmp_path, capsys):
    rc = cli.main(["pack", "shards", str(src), str(tmp_path / "out"), "--no-shuffle", "--progress"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert re.search(r"fastloader pack shards: 39/39 images\s+100%\s+[\d.]+ MB/s\s+in 0:00:\d\d$", cap.err, re.M)
    assert "wrote 1 shard (39 images, 3 classes" in cap.out and "ImageFolder order" in cap.out
    # the same folder again is refused, then replaced with --overwrite
    assert cli.main(["pack", "shards", str(src), str(tmp_path / "out"), "-q"]) == 2
    assert "already holds shards (index.json, shard-000000.tar)" in capsys.readouterr().err
    assert cli.main(["pack", "shards", str(src), str(tmp_path / "out"), "-q", "--overwrite"]) == 0


def test_cli_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["pack", "shards", "a", "b", "--shard-size", "12 parsecs"])
    assert e.value.code == 2 and "not a size: '12 parsecs'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["pack", "shards", "a", "b", "--seed", "1", "--no-shuffle"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["pack"])
    assert e.value.code == 2 and "format" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["pack", "--help"])
    assert e.value.code == 0 and "shards" in capsys.readouterr().out


def test_parse_size():
    assert parse_size("256MB") == 256 * 10**6
    assert parse_size("256MiB") == parse_size("256M") == parse_size("256m") == 256 << 20
    assert parse_size("1GB") == 10**9 and parse_size("1gib") == 1 << 30
    assert parse_size("500kB") == parse_size("500KB") == 500_000 and parse_size("4KiB") == 4096
    assert parse_size("1.5GB") == 1_500_000_000 and parse_size(" 1048576 ") == parse_size(1 << 20) == 1 << 20
    for bad in ("", "MB", "-1MB", "0", "1 XB", "1e6", "0.1"):
        with pytest.raises(ValueError):
            parse_size(bad)


# ----------------------------------------------------------------------------
# errors name what is wrong


def test_source_errors_name_the_path(tmp_path, capsys):
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        pack_shards(missing, tmp_path / "o1", progress=False)
    assert cli.main(["pack", "shards", str(missing), str(tmp_path / "o1")]) == 2
    assert f"fastloader pack shards: source folder {missing} does not exist" in capsys.readouterr().err

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=re.escape(str(empty))):
        pack_shards(empty, tmp_path / "o2", progress=False)
    (empty / "cls").mkdir()  # a class folder with no image in it
    (empty / "cls" / "a.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=re.escape(str(empty)) + ".*no valid file.*cls"):
        pack_shards(empty, tmp_path / "o3", progress=False)

    afile = tmp_path / "file.jpg"
    afile.write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match=re.escape(str(afile))):
        pack_shards(afile, tmp_path / "o4", progress=False)
    assert not any((tmp_path / n).exists() for n in ("o1", "o2", "o3", "o4"))


def _small_src(root, n=6):
    rng = np.random.default_rng(1)
    os.makedirs(root / "c")
    for i in range(n):
        _img(root / "c" / f"{i}.png", rng, "PNG")
    return root


def test_unreadable_file_is_named_and_nothing_is_left(tmp_path):
    src = _small_src(tmp_path / "src")
    os.symlink(tmp_path / "nowhere.jpg", src / "c" / "5b.jpg")  # sorted last
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=re.escape(str(src / "c" / "5b.jpg"))):
        pack_shards(src, out, shard_size=1, shuffle_seed=None, progress=False)
    assert os.listdir(out) == []  # the shards written before it were removed again

    os.remove(src / "c" / "5b.jpg")
    os.mkfifo(src / "c" / "fifo.jpg")  # refused, not read (a FIFO would block)
    with pytest.raises(OSError, match=re.escape(str(src / "c" / "fifo.jpg")) + ".*not a regular file"):
        pack_shards(src, out, progress=False)
    assert os.listdir(out) == []


def test_existing_shards_refused_unless_overwrite(tmp_path):
    src = _small_src(tmp_path / "src")
    out = tmp_path / "out"
    assert pack_shards(src, out, shard_size=1, progress=False)["shards"] == 6
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=re.escape(str(out)) + ".*overwrite"):
        pack_shards(src, out, progress=False)
    st = pack_shards(src, out, progress=False, overwrite=True)  # one shard now: the 5 others go
    assert st["shards"] == 1
    assert sorted(os.listdir(out)) == ["index.json", "keep.txt", "shard-000000.tar"]
    # a folder with any .tar is refused too
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.tar").write_bytes(b"")
    with pytest.raises(FileExistsError, match="data.tar"):
        pack_shards(src, other, progress=False)
    with pytest.raises(ValueError, match="prefix"):
        pack_shards(src, tmp_path / "o", prefix="a/b", progress=False)
    with pytest.raises(ValueError, match="max_count"):
        pack_shards(src, tmp_path / "o", max_count=0, progress=False)
