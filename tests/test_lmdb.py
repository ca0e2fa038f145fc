"""LMDBDataset, pack_lmdb and the LMDB source (csrc/sources/lmdb_source.c): the same
batches as ImageFolder over the same folder, interoperability with the
`lmdb` package both ways, bad values and bad paths, stats, device=."""
import json
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
lmdb = pytest.importorskip("lmdb")

import fastloader  # noqa: E402
from fastloader import _C  # noqa: E402
from fastloader.lmdb_dataset import sample_key  # noqa: E402
from fastloader.tools.pack_lmdb import pack_lmdb  # noqa: E402
from helpers_compare import assert_same_epochs, seeded_epochs  # noqa: E402
from helpers_formats import (CLASSES, PER_CLASS, check_batches_equal_imagefolder, check_on_error_raise,  # noqa: E402
                             check_on_error_skip_and_replace, make_class_folder, make_png_folder,
                             OTHER_FORMATS)
from helpers_pipelines import train_tf, val_tf  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_class_folder(tmp_path_factory.mktemp("lmdb") / "train")


@pytest.fixture(scope="module")
def packed(folder, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("packed") / "train.lmdb")
    pack_lmdb(folder, out)
    return out


def _write_layout(env, images, labels, classes=None, names=None, count=None, skip=()):
    """Write the documented layout with the `lmdb` package, reserved keys
    first (the key order of a write does not matter)."""
    with env.begin(write=True) as txn:
        meta = {"format": "fastloader-lmdb", "version": 1, "count": len(images) if count is None else count}
        txn.put(b"__fastloader__", json.dumps(meta).encode())
        txn.put(b"__labels__", np.asarray(labels, "<i8").tobytes())
        if classes is not None:
            txn.put(b"__classes__", json.dumps(classes).encode())
        if names is not None:
            txn.put(b"__names__", json.dumps(names).encode())
        for i in reversed(range(len(images))):
            if i not in skip:
                txn.put(b"%010d" % i, images[i])


# ---- the same dataset as ImageFolder ------------------------------------------------

def test_metadata_equals_imagefolder(folder, packed):
    ref = fastloader.ImageFolder(folder, transform=val_tf())
    ds = fastloader.LMDBDataset(packed, transform=val_tf())
    assert len(ds) == len(ref) == 3 * PER_CLASS
    assert ds.classes == ref.classes == CLASSES and ds.class_to_idx == ref.class_to_idx
    assert ds.targets == ref.targets
    for i, ((name, label), (path, ref_label)) in enumerate(zip(ds.samples, ref.samples)):
        rel = os.path.relpath(path, folder)
        assert name == f"{packed}[{i}] ({rel})" and label == ref_label
    assert ds._source.kind == "lmdb" and len(ds._source) == len(ref)
    assert ds._source.read(3) == open(ref.samples[3][0], "rb").read()


@pytest.mark.parametrize("num_workers", [0, 2, "auto"])
@pytest.mark.parametrize("pipeline", ["train", "val"])
def test_batches_equal_imagefolder(folder, packed, pipeline, num_workers):
    """Pixels, labels, batch order and augmentation over two epochs equal
    ImageFolder's with the same generator and seed, whatever num_workers."""
    check_batches_equal_imagefolder(folder, lambda tf: fastloader.LMDBDataset(packed, transform=tf), pipeline,
                                    num_workers)


def test_getitem_and_torch_dataloader(packed, folder):
    ds = fastloader.LMDBDataset(packed, transform=val_tf())
    ref = fastloader.ImageFolder(folder, transform=val_tf())
    x, y = ds[4]
    assert torch.equal(x, ref[4][0]) and y == ref[4][1]
    xb, yb = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert xb.shape == (4, 3, 32, 32) and yb.tolist() == ref.targets[:4]


# ---- interoperability with the `lmdb` package --------------------------------------

def test_lmdb_package_reads_what_pack_wrote(folder, tmp_path):
    out = str(tmp_path / "o.lmdb")
    calls = []
    st = pack_lmdb(folder, out, progress=lambda *a: calls.append(a))
    ref = fastloader.ImageFolder(folder, transform=val_tf())
    files = [open(p, "rb").read() for p, _ in ref.samples]
    n = len(files)
    assert st["count"] == n and st["classes"] == 3 and st["bytes"] == sum(map(len, files))
    assert st["file_bytes"] == os.path.getsize(out)
    assert os.listdir(tmp_path) == ["o.lmdb"]  # one file: no lock file, no temporary left
    assert calls[0] == (0, n, 0) and len(calls) == n + 1
    assert [c[0] for c in calls] == list(range(n + 1)) and calls[-1] == (n, n, st["bytes"])
    env = lmdb.open(out, subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            keys = [k for k, _ in txn.cursor()]
            assert keys == [b"%010d" % i for i in range(n)] + [
                b"__classes__", b"__fastloader__", b"__labels__", b"__names__"]
            assert [txn.get(b"%010d" % i) for i in range(n)] == files
            assert json.loads(txn.get(b"__fastloader__")) == {"format": "fastloader-lmdb", "version": 1, "count": n}
            assert np.frombuffer(txn.get(b"__labels__"), "<i8").tolist() == ref.targets
            assert json.loads(txn.get(b"__classes__")) == ref.classes
            assert json.loads(txn.get(b"__names__")) == [os.path.relpath(p, folder) for p, _ in ref.samples]
    finally:
        env.close()


@pytest.mark.parametrize("lock", [False, True])
def test_reads_an_lmdb_written_by_the_lmdb_package(folder, tmp_path, lock):
    """A directory environment (the package's default, with its lock file)
    in the documented layout, written in reverse key order; the optional
    keys left out.  lock=True registers each of 4 workers' transactions in
    the lock file."""
    ref = fastloader.ImageFolder(folder, transform=train_tf())
    images = [open(p, "rb").read() for p, _ in ref.samples]
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 24)
    _write_layout(env, images, ref.targets)
    env.close()
    ds = fastloader.LMDBDataset(tmp_path / "env", transform=train_tf(), lock=lock)
    assert ds.classes == [] and ds.class_to_idx == {} and ds.targets == ref.targets
    assert ds.samples[2][0] == f"{tmp_path / 'env'}[2]"
    assert_same_epochs(seeded_epochs(ds, 4, True, epochs=1), seeded_epochs(ref, 0, True, epochs=1))


def test_writer_grows_its_map_and_overwrites(tmp_path):
    p = str(tmp_path / "w.lmdb")
    blobs = [bytes([i]) * (300_000 + i) for i in range(20)]  # 6 MB through a 1 MiB map
    with _C.LMDBWriter(p, map_size=1 << 20) as w:
        for i, b in enumerate(blobs):
            w.put(sample_key(i), b)
        w.flush()
        w.put(sample_key(3), b"again")   # not after the last key: an ordinary put, overwriting
        w.put("__s__", bytearray(b"str key, bytearray value"))
        assert w.map_size > 6 * 10**6
    assert w.closed and w.map_size is None
    env = lmdb.open(p, subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(b"0000000003") == b"again" and txn.get(b"0000000019") == blobs[19]
        assert txn.get(b"__s__") == b"str key, bytearray value" and txn.stat()["entries"] == 21
    env.close()
    assert _C.lmdb_get(p, [b"__s__", "0000000000", b"nope"]) == [b"str key, bytearray value", blobs[0], None]
    with pytest.raises(FileExistsError):
        _C.LMDBWriter(p)
    with pytest.raises(ValueError, match="closed"):
        w.put(b"k", b"v")
    with pytest.raises(TypeError):
        _C.LMDBWriter(str(tmp_path / "x")).put(1, b"v")


# ---- pack_lmdb's contract ------------------------------------------------------------

def test_pack_refuses_an_existing_output_unless_overwrite(folder, tmp_path):
    out = tmp_path / "o.lmdb"
    out.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="overwrite"):
        pack_lmdb(folder, out)
    assert out.read_bytes() == b"precious"

    def interrupt(done, total, nbytes):  # a failure half-way leaves the old file and no temporary
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack_lmdb(folder, out, progress=interrupt, overwrite=True)
    assert out.read_bytes() == b"precious" and os.listdir(tmp_path) == ["o.lmdb"]
    assert pack_lmdb(folder, out, overwrite=True)["count"] == 3 * PER_CLASS
    assert len(fastloader.LMDBDataset(out, transform=val_tf())) == 3 * PER_CLASS
    with pytest.raises(FileNotFoundError):
        pack_lmdb(folder, tmp_path / "no" / "such" / "dir.lmdb")
    with pytest.raises(FileNotFoundError):
        pack_lmdb(tmp_path / "nothing", tmp_path / "x.lmdb")


# ---- bad values, bad paths ---------------------------------------------------------

@pytest.fixture
def corrupt(folder, tmp_path):
    """A packed copy whose sample 3 is cut short and sample 8 is not an image."""
    out = str(tmp_path / "bad.lmdb")
    pack_lmdb(folder, out)
    env = lmdb.open(out, subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"0000000003", txn.get(b"0000000003")[:200])
        txn.put(b"0000000008", b"this is not an image")
    env.close()
    return out


def test_on_error_raise_names_the_lmdb_and_the_index(corrupt):
    check_on_error_raise(fastloader.LMDBDataset(corrupt, transform=val_tf()), f"{corrupt}[3] (cat/cat_03.jpg)")


def test_on_error_skip_and_replace(corrupt, folder):
    ref = fastloader.ImageFolder(folder, transform=val_tf())

    def make(on_error):
        return fastloader.LMDBDataset(corrupt, transform=val_tf(), on_error=on_error)

    ds = check_on_error_skip_and_replace(make, ref.targets,
                                         [f"{corrupt}[3] (cat/cat_03.jpg)", f"{corrupt}[8] (dog/dog_01.jpg)"])
    assert all(repl.startswith(f"{corrupt}[") for _, repl, _ in ds.replaced)


def test_a_missing_sample_key(folder, tmp_path):
    """The metadata says 6 samples, key 2 is missing: an OSError naming the
    key, the LMDB and the index; on_error applies to it."""
    images = [open(p, "rb").read() for p, _ in fastloader.ImageFolder(folder, transform=val_tf()).samples[:6]]
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 22)
    _write_layout(env, images, [0] * 6, skip={2})
    env.close()
    ds = fastloader.LMDBDataset(tmp_path / "env", transform=val_tf())
    with pytest.raises(OSError, match=r"env\[2\]: no value under key '0000000002'.*sample index 2"):
        list(fastloader.DataLoader(ds, batch_size=3))
    with pytest.raises(OSError, match="no value under key"):
        ds._source.read(2)
    ds = fastloader.LMDBDataset(tmp_path / "env", transform=val_tf(), on_error="skip")
    assert [len(y) for _, y in fastloader.DataLoader(ds, batch_size=3)] == [2, 3]


def test_paths_that_are_not_an_lmdb(tmp_path, folder):
    with pytest.raises(FileNotFoundError, match="pack lmdb") as e:
        fastloader.LMDBDataset(tmp_path / "missing.lmdb")
    assert e.value.filename == str(tmp_path / "missing.lmdb")
    with pytest.raises(OSError, match="without data.mdb, not an LMDB"):
        fastloader.LMDBDataset(tmp_path)
    (tmp_path / "junk").write_bytes(os.urandom(20000))
    with pytest.raises(OSError, match="junk: .*not an LMDB"):
        fastloader.LMDBDataset(tmp_path / "junk")
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(OSError, match="empty file, not an LMDB"):
        fastloader.LMDBDataset(tmp_path / "empty")


def test_lmdbs_not_in_the_layout(tmp_path):
    def make(name, items):
        env = lmdb.open(str(tmp_path / name), map_size=1 << 20)
        with env.begin(write=True) as txn:
            for k, v in items.items():
                txn.put(k, v)
        env.close()
        return tmp_path / name

    plain = make("plain", {b"img-1": b"\xff\xd8"})
    with pytest.raises(ValueError, match="without the key __fastloader__.*pack lmdb"):
        fastloader.LMDBDataset(plain)
    meta = json.dumps({"format": "fastloader-lmdb", "version": 1, "count": 2}).encode()
    with pytest.raises(ValueError, match="without the key __labels__"):
        fastloader.LMDBDataset(make("nolabels", {b"__fastloader__": meta}))
    with pytest.raises(ValueError, match="holds 8 bytes, expected 8 x 2"):
        fastloader.LMDBDataset(make("short", {b"__fastloader__": meta, b"__labels__": bytes(8)}))
    with pytest.raises(OSError, match="says it holds 2 samples, but the last one's key '0000000001' is missing"):
        fastloader.LMDBDataset(make("nokeys", {b"__fastloader__": meta, b"__labels__": bytes(16)}))
    newer = json.dumps({"format": "fastloader-lmdb", "version": 2, "count": 0}).encode()
    with pytest.raises(ValueError, match="newer fastloader"):
        fastloader.LMDBDataset(make("newer", {b"__fastloader__": newer, b"__labels__": b""}))
    with pytest.raises(ValueError, match="not valid JSON"):
        fastloader.LMDBDataset(make("badjson", {b"__fastloader__": b"{", b"__labels__": b""}))


# ---- stats, Pillow fix-up, device ------------------------------------------------------

def test_stats_report_read_and_decode(packed, folder):
    ds = fastloader.LMDBDataset(packed, transform=train_tf())
    dl = fastloader.DataLoader(ds, batch_size=5, num_workers=2, seed=3)
    for _ in dl:
        pass
    st = dl.stats()
    assert st["stages_s"]["read_s"] > 0 and st["stages_s"]["decode_s"] > 0 and st["stages_s"]["transform_s"] > 0
    assert st["bytes_read"] == sum(os.path.getsize(p) for p, _ in fastloader.ImageFolder(folder, transform=val_tf()).samples)
    assert st["samples"] == len(ds)


@pytest.mark.parametrize("ext,native", OTHER_FORMATS)
def test_png_webp_values_decode_natively_and_others_through_pillow(tmp_path, ext, native):
    root = make_png_folder(tmp_path / "png", ext)
    pack_lmdb(root, tmp_path / "p.lmdb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = seeded_epochs(fastloader.ImageFolder(root, transform=train_tf()), 0, True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = seeded_epochs(fastloader.LMDBDataset(tmp_path / "p.lmdb", transform=train_tf()), 2, True)
    assert_same_epochs(got, ref)
    pillow = [str(x.message) for x in w if f"p.lmdb[0] (a/x.{ext}) is not a JPEG" in str(x.message)]
    assert bool(pillow) == (not native), [str(x.message) for x in w]


def test_device_delivery_on_the_fake_cuda_runtime(packed, tmp_path, tmp_path_factory):
    """device="cuda" through the stand-in CUDA runtime (tests/fakecuda):
    the LMDB's batches arrive equal to the CPU path's (uint8 on the wire,
    normalized on the device)."""
    from helpers_fakecuda import device_vs_cpu

    res = device_vs_cpu(tmp_path, tmp_path_factory, packed, "fastloader.LMDBDataset(sys.argv[1], transform=tf)",
                        marker="LMDB-DEVICE")
    assert res == {"0": [True] * 6, "2": [True] * 6}, res
