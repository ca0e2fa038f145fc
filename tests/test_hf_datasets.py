"""HFImageDataset and the Arrow source (csrc/sources/arrow_source.c): Hugging Face
`datasets` image columns read in place, compared with fastloader.ImageFolder
over the same files (pixels, labels, augmentation), through save_to_disk,
Parquet, paths, indices mappings, Arrow layouts (chunks, slices,
large_binary, plain binary), bad rows, and device delivery.

Everything but the last test needs the `datasets` package (pip install
fastloader[datasets]) and skips with that reason without it.
"""
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from helpers_compare import assert_same_epochs, seeded_epochs  # noqa: E402
from helpers_formats import (CLASSES, PER_CLASS, check_batches_equal_imagefolder, check_on_error_raise,  # noqa: E402
                             check_on_error_skip_and_replace, make_class_folder, make_png_folder,
                             OTHER_FORMATS)
from helpers_pipelines import train_tf, val_tf  # noqa: E402

try:
    import datasets as hfds
    import pyarrow as pa
    hfds.disable_progress_bars()
except ImportError:
    hfds = pa = None

needs_datasets = pytest.mark.skipif(hfds is None, reason="the `datasets` package is not installed "
                                                         "(pip install fastloader[datasets])")

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_class_folder(tmp_path_factory.mktemp("hf") / "train")


@pytest.fixture(scope="module")
def ref(folder):
    return fastloader.ImageFolder(folder, transform=val_tf())


def _features():
    return hfds.Features({"image": hfds.Image(), "label": hfds.ClassLabel(names=CLASSES)})


def _from_paths(ref):
    """A Dataset as Dataset.from_dict stores local files: paths, bytes null."""
    return hfds.Dataset.from_dict({"image": [p for p, _ in ref.samples], "label": ref.targets},
                                  features=_features())


@pytest.fixture(scope="module")
def saved(ref, tmp_path_factory):
    """save_to_disk in 3 shards (the images embedded as bytes), the folder."""
    out = str(tmp_path_factory.mktemp("saved") / "ds")
    _from_paths(ref).save_to_disk(out, num_shards=3)
    return out


def _table(ds):
    return ds.data.column("image")


# ---- the same dataset as ImageFolder ------------------------------------------------

@needs_datasets
def test_metadata_and_bytes_in_place(saved, ref):
    hf = hfds.load_from_disk(saved)
    col = _table(hf)
    assert col.num_chunks == 3 and col.chunk(0).field("bytes").null_count == 0  # embedded, several chunks
    ds = fastloader.HFImageDataset(hf, transform=val_tf())
    assert len(ds) == len(ref) == 3 * PER_CLASS
    assert ds.classes == CLASSES and ds.class_to_idx == ref.class_to_idx and ds.targets == ref.targets
    assert ds.name == saved and ds._source.kind == "arrow"
    name, label = ds.samples[9]
    assert name == f"{saved} row 9 ({os.path.basename(ref.samples[9][0])})" and label == ref.targets[9]
    assert [ds._source.read(i) for i in range(len(ds))] == [open(p, "rb").read() for p, _ in ref.samples]
    x, y = ds[4]
    assert torch.equal(x, ref[4][0]) and y == ref.targets[4]


@needs_datasets
@pytest.mark.parametrize("num_workers", [0, 2, "auto"])
@pytest.mark.parametrize("pipeline", ["train", "val"])
def test_batches_equal_imagefolder(folder, saved, pipeline, num_workers):
    """Pixels, labels, batch order and augmentation over two epochs equal
    ImageFolder's with the same generator and seed, whatever num_workers."""
    check_batches_equal_imagefolder(
        folder, lambda tf: fastloader.HFImageDataset(hfds.load_from_disk(saved), transform=tf), pipeline, num_workers)


@needs_datasets
def test_parquet_through_load_dataset(saved, folder, ref, tmp_path):
    pq = str(tmp_path / "train.parquet")
    hfds.load_from_disk(saved).to_parquet(pq)
    hf = hfds.load_dataset("parquet", data_files=pq, split="train", cache_dir=str(tmp_path / "cache"))
    assert type(hf.features["image"]).__name__ == "Image"
    ds = fastloader.HFImageDataset(hf, transform=train_tf())
    assert ds.name == "parquet:train"
    assert ds.samples[2][0] == f"parquet:train row 2 ({os.path.basename(ref.samples[2][0])})"
    assert ds.targets == ref.targets
    assert_same_epochs(seeded_epochs(ds, 2, True, epochs=1),
                       seeded_epochs(fastloader.ImageFolder(folder, transform=train_tf()), 0, True, epochs=1))


@needs_datasets
def test_rows_with_null_bytes_read_their_path(ref, folder):
    """Dataset.from_dict stores local files as paths (bytes null): read
    through the files path, batches as ImageFolder's."""
    hf = _from_paths(ref)
    assert _table(hf).chunk(0).field("bytes").null_count == len(ref)
    ds = fastloader.HFImageDataset(hf, transform=train_tf())
    assert ds.name == "Dataset(in memory)" and ds.samples[0][0] == f"Dataset(in memory) row 0 ({ref.samples[0][0]})"
    assert_same_epochs(seeded_epochs(ds, 2, True, epochs=1),
                       seeded_epochs(fastloader.ImageFolder(folder, transform=train_tf()), 0, True, epochs=1))


# ---- indices mappings ------------------------------------------------------------

@needs_datasets
@pytest.mark.parametrize("how", ["shuffle", "select", "filter", "shuffle+select"])
def test_indices_mappings_are_applied(saved, ref, how):
    """select/shuffle/filter leave an indices mapping: sample i is the row
    hf_dataset[i] reads, with that sample's augmentation (as an ImageList of
    the mapped files in the same order)."""
    hf = hfds.load_from_disk(saved)
    if how == "shuffle":
        hf = hf.shuffle(seed=3)
    elif how == "select":
        hf = hf.select([20, 0, 7, 7, 13, 2])
    elif how == "filter":
        hf = hf.filter(lambda e: e["label"] != 1)
    else:
        hf = hf.shuffle(seed=5).select(range(4, 16))
    assert hf._indices is not None
    rows = hf._indices.column(0).to_pylist()
    ds = fastloader.HFImageDataset(hf, transform=train_tf(), name="mapped")
    assert len(ds) == len(hf) == len(rows)
    assert ds.targets == hf["label"] == [ref.targets[r] for r in rows]
    assert ds.samples[1][0].startswith(f"mapped row {rows[1]} (")
    want = fastloader.ImageList([ref.samples[r][0] for r in rows], [ref.targets[r] for r in rows],
                                transform=train_tf())
    assert_same_epochs(seeded_epochs(ds, 2, True), seeded_epochs(want, 0, True))


# ---- Arrow layouts -----------------------------------------------------------------

def _bytes_of(ref):
    return [open(p, "rb").read() for p, _ in ref.samples]


@needs_datasets
@pytest.mark.parametrize("layout", ["large_binary", "binary_column", "sliced_chunks", "mixed"])
def test_arrow_layouts(ref, layout):
    """What the C side sees: int64 offsets (large_binary, large_string), a
    plain binary column, chunks that are slices of larger arrays (an array
    offset into every buffer), and rows mixing bytes and paths."""
    data, paths = _bytes_of(ref), [p for p, _ in ref.samples]
    n = len(data)
    if layout == "large_binary":
        t = pa.struct([("bytes", pa.large_binary()), ("path", pa.large_string())])
        col = pa.chunked_array([pa.array([{"bytes": b, "path": None} for b in data[:8]], t),
                                pa.array([{"bytes": b, "path": "x.jpg"} for b in data[8:]], t)])
    elif layout == "binary_column":
        col = pa.chunked_array([pa.array(data[:10], pa.binary()), pa.array([], pa.binary()),
                                pa.array(data[10:], pa.binary())])
    elif layout == "sliced_chunks":
        t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        pad = [{"bytes": b"pad", "path": "pad"}] * 3
        whole = pa.array(pad + [{"bytes": b, "path": p} for b, p in zip(data, paths)] + pad, t)
        col = pa.chunked_array([whole.slice(3, 5), whole.slice(8, n - 5)])
        assert col.chunk(1).offset == 8
    else:  # even rows embedded, odd rows paths only, one chunk with nulls in both fields
        t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        col = pa.chunked_array([pa.array([{"bytes": b if i % 2 == 0 else None, "path": None if i % 2 == 0 else p}
                                          for i, (b, p) in enumerate(zip(data, paths))], t)])
    table = pa.table({"image": col, "label": pa.array(ref.targets, pa.int64())})
    hf = hfds.Dataset(hfds.table.InMemoryTable(table))
    ds = fastloader.HFImageDataset(hf, transform=train_tf())
    assert ds.classes == [] and ds.targets == ref.targets
    assert [ds._source.read(i) for i in range(n)] == data
    want = fastloader.ImageFolder(os.path.dirname(os.path.dirname(ref.samples[0][0])), transform=train_tf())
    assert_same_epochs(seeded_epochs(ds, 2, True, epochs=1), seeded_epochs(want, 0, True, epochs=1))


@needs_datasets
@pytest.mark.parametrize("ext,native", OTHER_FORMATS)
def test_png_rows_decode_natively_and_others_through_pillow(tmp_path, ext, native):
    """PNG images (MNIST- and CIFAR-like datasets store them) and WebP are
    decoded in C; a format the native decoders do not read (BMP) takes the
    Pillow fix-up with its bytes, as ImageFolder's files do."""
    root = make_png_folder(tmp_path / "png", ext)
    files = [str(root / "a" / f"x.{ext}"), str(root / "a" / "y.jpg")]
    hf = hfds.Dataset.from_dict({"image": [open(f, "rb").read() for f in files], "label": [0, 0]},
                                features=hfds.Features({"image": hfds.Value("binary"), "label": hfds.Value("int64")}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = seeded_epochs(fastloader.ImageFolder(root, transform=train_tf()), 0, True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = seeded_epochs(fastloader.HFImageDataset(hf, transform=train_tf(), name="pngs"), 2, True)
    assert_same_epochs(got, want)
    pillow = [str(x.message) for x in w if "pngs row 0 is not a JPEG" in str(x.message)]
    assert bool(pillow) == (not native), [str(x.message) for x in w]


# ---- bad rows ------------------------------------------------------------------------

@pytest.fixture
def corrupt(ref, tmp_path):
    """Saved to disk, with row 3 cut short and row 8 not an image."""
    data = _bytes_of(ref)
    data[3] = data[3][:200]
    data[8] = b"this is not an image"
    names = [os.path.basename(p) for p, _ in ref.samples]
    hf = hfds.Dataset.from_dict({"image": [{"bytes": b, "path": p} for b, p in zip(data, names)],
                                 "label": ref.targets}, features=_features())
    out = str(tmp_path / "bad")
    hf.save_to_disk(out)
    return out


@needs_datasets
def test_on_error_raise_names_the_dataset_and_the_row(corrupt):
    ds = fastloader.HFImageDataset(hfds.load_from_disk(corrupt), transform=val_tf())
    check_on_error_raise(ds, f"{corrupt} row 3 (cat_03.jpg)")


@needs_datasets
def test_on_error_skip_and_replace(corrupt, ref):
    hf = hfds.load_from_disk(corrupt)

    def make(on_error):
        return fastloader.HFImageDataset(hf, transform=val_tf(), on_error=on_error)

    check_on_error_skip_and_replace(make, ref.targets,
                                    [f"{corrupt} row 3 (cat_03.jpg)", f"{corrupt} row 8 (dog_01.jpg)"])


@needs_datasets
def test_rows_without_an_image(ref, tmp_path):
    """A null row, both fields null, a missing file and a remote path: an
    OSError naming the row (FileNotFoundError for the missing file), and
    on_error="skip" drops exactly those rows."""
    good = _bytes_of(ref)[0]
    t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [{"bytes": good, "path": "a.jpg"}, None, {"bytes": None, "path": None},
            {"bytes": None, "path": str(tmp_path / "gone.jpg")}, {"bytes": None, "path": "https://example.org/x.jpg"},
            {"bytes": good, "path": None}]
    table = pa.table({"image": pa.array(rows, t), "label": pa.array(range(6), pa.int64())})
    hf = hfds.Dataset(hfds.table.InMemoryTable(table))
    ds = fastloader.HFImageDataset(hf, transform=val_tf(), name="holes")
    for i, kind, pattern in [(1, OSError, "holes row 1: no image: the row's image is null"),
                             (2, OSError, "holes row 2: no image: bytes and path are both null"),
                             (3, FileNotFoundError, r"No such file.*'holes row 3 \(.*gone.jpg\)'"),
                             (4, OSError, "remote: only local files")]:
        with pytest.raises(kind, match=pattern):
            list(fastloader.DataLoader(torch.utils.data.Subset(ds, [0, i]), batch_size=2))
        with pytest.raises(kind):
            ds._source.read(i)
    skip = fastloader.HFImageDataset(hf, transform=val_tf(), on_error="skip")
    assert torch.cat([y for _, y in fastloader.DataLoader(skip, batch_size=3)]).tolist() == [0, 5]
    assert len(skip.skipped) == 4


# ---- what is refused -------------------------------------------------------------------

@needs_datasets
def test_refusals_say_what_to_do(saved, tmp_path):
    hf = hfds.load_from_disk(saved)
    with pytest.raises(KeyError, match=r"no column 'img'.*image columns: \['image'\]"):
        fastloader.HFImageDataset(hf, image_column="img")
    with pytest.raises(KeyError, match="label_column=None"):
        fastloader.HFImageDataset(hf, label_column="fine_label")
    with pytest.raises(TypeError, match="not an image column"):
        fastloader.HFImageDataset(hf, image_column="label")
    floats = hf.cast_column("label", hfds.Value("float32"))
    with pytest.raises(TypeError, match="not integers"):
        fastloader.HFImageDataset(floats)
    nolabels = fastloader.HFImageDataset(hf, label_column=None, transform=val_tf())
    assert nolabels.targets == [-1] * len(hf) and nolabels.classes == []
    with pytest.raises(TypeError, match="one split, not a DatasetDict"):
        fastloader.HFImageDataset(hfds.DatasetDict({"train": hf}))
    with pytest.warns(UserWarning, match="with_transform / set_transform function is not run"):
        fastloader.HFImageDataset(hf.with_transform(lambda b: b), transform=val_tf())


@needs_datasets
def test_streaming_datasets_are_refused_clearly(saved, tmp_path):
    pq = str(tmp_path / "s.parquet")
    hfds.load_from_disk(saved).to_parquet(pq)
    stream = hfds.load_dataset("parquet", data_files=pq, split="train", streaming=True)
    assert type(stream).__name__ == "IterableDataset"
    with pytest.raises(TypeError, match=r"streaming dataset \(IterableDataset.*without streaming=True"):
        fastloader.HFImageDataset(stream)


def test_fastloader_works_without_datasets():
    """fastloader imports without pyarrow/datasets; HFImageDataset then says
    what to install."""
    code = ("import sys; sys.modules['pyarrow'] = None; sys.modules['datasets'] = None\n"
            "import fastloader\n"
            "try:\n    fastloader.HFImageDataset(object())\n"
            "except ImportError as e:\n    print('HINT', e)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert "HINT" in out.stdout and "fastloader[datasets]" in out.stdout, out.stdout + out.stderr


# ---- stats and device ----------------------------------------------------------------

@needs_datasets
def test_stats_report_read_and_decode(saved, ref):
    ds = fastloader.HFImageDataset(hfds.load_from_disk(saved), transform=train_tf())
    dl = fastloader.DataLoader(ds, batch_size=5, num_workers=2, seed=3)
    for _ in dl:
        pass
    st = dl.stats()
    assert st["stages_s"]["read_s"] > 0 and st["stages_s"]["decode_s"] > 0 and st["stages_s"]["transform_s"] > 0
    assert st["bytes_read"] == sum(os.path.getsize(p) for p, _ in ref.samples)
    assert st["samples"] == len(ds)


@needs_datasets
def test_device_delivery_on_the_fake_cuda_runtime(saved, tmp_path, tmp_path_factory):
    """device="cuda" through the stand-in CUDA runtime (tests/fakecuda): a
    shuffled (index-mapped) dataset's batches arrive equal to the CPU
    path's (uint8 on the wire, normalized on the device)."""
    from helpers_fakecuda import device_vs_cpu

    res = device_vs_cpu(tmp_path, tmp_path_factory, saved, "fastloader.HFImageDataset(datasets.load_from_disk("
                        "sys.argv[1]).shuffle(seed=2), transform=tf)", marker="HF-DEVICE", imports="import datasets")
    assert res == {"0": [True] * 6, "2": [True] * 6}, res
