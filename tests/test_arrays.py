"""ArrayDataset: .npy files mapped read-only, gathered into batches in C.

The reference is torch itself: fastloader.DataLoader(ArrayDataset(files))
gives what torch.utils.data.DataLoader(TensorDataset(tensors)) gives for
the same arrays (type, dtype, shape, values, order); with a transform, the
image rows give what ImageFolder / ImageList give for the same pixels saved
as PNG (lossless), and what torchvision gives on PIL images.
"""
import functools
import gc
import os
import pickle
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import TensorDataset  # noqa: E402

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
from helpers_datasets import assert_same_batches  # noqa: E402
from helpers_distributed import torchrun  # noqa: E402
from helpers_pipelines import train_tf  # noqa: E402

pytestmark = pytest.mark.fastloader_only
HERE = os.path.dirname(os.path.abspath(__file__))
N = 300


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    """Token ids (N, 128) int64, features (N, 7) float32, labels (N,) int64,
    as .npy files and as the arrays themselves."""
    d = tmp_path_factory.mktemp("arrays")
    rng = np.random.default_rng(7)
    arrs = {
        "tokens": rng.integers(0, 50_000, size=(N, 128), dtype=np.int64),
        "features": rng.standard_normal((N, 7)).astype(np.float32),
        "labels": rng.integers(0, 10, size=N).astype(np.int64),
    }
    paths = {}
    for name, a in arrs.items():
        paths[name] = str(d / f"{name}.npy")
        np.save(paths[name], a)
    return paths, arrs


def _tensors(arrs, names):
    return TensorDataset(*(torch.from_numpy(arrs[n]) for n in names))


# ---- the gather path: TensorDataset semantics ---------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2, "auto"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_equal_torch_tensordataset(arrays, num_workers, drop_last):
    paths, arrs = arrays
    names = ["tokens", "features", "labels"]
    ds = fastloader.ArrayDataset(*(paths[n] for n in names))
    kw = dict(batch_size=64, shuffle=True, drop_last=drop_last)
    dl = fastloader.DataLoader(ds, num_workers=num_workers, generator=torch.Generator().manual_seed(3), **kw)
    got = list(dl)
    ref = list(torch.utils.data.DataLoader(_tensors(arrs, names), generator=torch.Generator().manual_seed(3), **kw))
    assert len(got) == (4 if drop_last else 5)
    assert_same_batches(got, ref)
    st = dl.stats()
    assert st["path"] == "batch" and st["pipeline"].startswith("ArrayDataset: tokens.npy int64 (128,)")


@pytest.mark.parametrize("which", [["tokens"], ["labels"], ["features", "labels"]])
def test_one_or_two_arrays_and_arrays_in_memory(arrays, which):
    paths, arrs = arrays
    ref = list(torch.utils.data.DataLoader(_tensors(arrs, which), batch_size=50))
    got = list(fastloader.DataLoader(fastloader.ArrayDataset(*(paths[n] for n in which)), batch_size=50, num_workers=2))
    assert_same_batches(got, ref)
    # arrays already in memory (and a memmap) gather the same way
    inmem = [arrs[n] if k else np.load(paths[n], mmap_mode="r") for k, n in enumerate(which)]
    assert_same_batches(list(fastloader.DataLoader(fastloader.ArrayDataset(*inmem), batch_size=50)), ref)


def test_every_numeric_dtype_and_row_shape(tmp_path):
    rng = np.random.default_rng(1)
    arrs = [rng.integers(0, 2, size=40).astype(bool), rng.integers(0, 255, size=(40, 2, 3), dtype=np.uint8),
            rng.integers(-9, 9, size=(40, 5), dtype=np.int8), rng.integers(-9, 9, size=40, dtype=np.int16),
            rng.integers(-9, 9, size=(40, 1), dtype=np.int32), rng.standard_normal((40, 3)).astype(np.float16),
            rng.standard_normal(40), (rng.standard_normal((40, 2)) + 1j).astype(np.complex64),
            np.zeros((40, 0), np.float32)]
    paths = []
    for k, a in enumerate(arrs):
        paths.append(str(tmp_path / f"a{k}.npy"))
        np.save(paths[-1], a)
    ref = list(torch.utils.data.DataLoader(TensorDataset(*map(torch.from_numpy, arrs)), batch_size=16, shuffle=True,
                                           generator=torch.Generator().manual_seed(0)))
    got = list(fastloader.DataLoader(fastloader.ArrayDataset(*paths), batch_size=16, shuffle=True, num_workers=2,
                                     generator=torch.Generator().manual_seed(0)))
    assert_same_batches(got, ref)


def test_getitem_like_tensordataset(arrays):
    paths, arrs = arrays
    ds = fastloader.ArrayDataset(paths["tokens"], paths["labels"])
    ref = _tensors(arrs, ["tokens", "labels"])
    assert len(ds) == N and ds.shapes == [(N, 128), (N,)] and ds.dtypes == [np.int64, np.int64]
    for i in (0, 17, N - 1, -1, -N, np.int64(5), torch.tensor(6)):
        got = ds[i]
        assert isinstance(got, tuple) and len(got) == 2
        for u, v in zip(got, ref[int(i)]):
            assert u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v)
    got = ds[0]
    got[0][0] = -5  # rows are copies: writable, and the map is untouched
    assert int(ds[0][0][0]) == arrs["tokens"][0, 0]
    # a list of indices or a slice: stacked rows, as tensor indexing gives
    for idx in ([3, 1, 3], np.array([9, 0]), torch.tensor([2, 4]), slice(10, 20, 3), slice(None, None, -50)):
        rows = ds[idx]
        np_idx = idx.numpy() if isinstance(idx, torch.Tensor) else idx
        exp = (torch.from_numpy(np.ascontiguousarray(arrs[k][np_idx])) for k in ("tokens", "labels"))
        assert all(torch.equal(u, v) for u, v in zip(rows, exp))
    for bad in (N, -N - 1, 10**12):
        with pytest.raises(IndexError, match=f"index {bad} is out of range for {N} rows"):
            ds[bad]


def test_out_of_range_index_in_a_batch_is_an_index_error(arrays):
    paths, _ = arrays
    ds = fastloader.ArrayDataset(paths["tokens"], paths["labels"])
    for nw in (0, 2):
        dl = fastloader.DataLoader(ds, batch_sampler=[[0, 1], [2, N + 4, 3]], num_workers=nw)
        it = iter(dl)
        next(it)
        with pytest.raises(IndexError, match=f"index {N + 4} is out of range") as ei:
            next(it)
        assert "batch 1" in "".join(getattr(ei.value, "__notes__", [])) or "batch 1" in str(ei.value)


def test_custom_collate_and_unbatched_fall_back_to_getitem(arrays):
    paths, arrs = arrays
    names = ["features", "labels"]
    ds = fastloader.ArrayDataset(*(paths[n] for n in names))
    ref_ds = _tensors(arrs, names)

    def collate(batch):  # a user's own: must see per-sample tuples, as with torch
        return torch.stack([f for f, _ in batch]), [int(lab) for _, lab in batch]

    dl = fastloader.DataLoader(ds, batch_size=32, num_workers=2, collate_fn=collate)
    got = list(dl)
    assert dl.stats()["path"] == "python"
    ref = list(torch.utils.data.DataLoader(ref_ds, batch_size=32, collate_fn=collate))
    assert len(got) == len(ref)
    for (a, la), (b, lb) in zip(got, ref):
        assert torch.equal(a, b) and la == lb
    # batch_size=None: one sample at a time, default_convert
    got = list(fastloader.DataLoader(ds, batch_size=None, num_workers=2))
    ref = list(torch.utils.data.DataLoader(ref_ds, batch_size=None))
    assert_same_batches(got, ref)


def test_a_subclass_with_its_own_getitem_is_called(arrays):
    paths, arrs = arrays

    class Shifted(fastloader.ArrayDataset):
        def __getitem__(self, i):
            tok, lab = super().__getitem__(i)
            return tok + 1, lab

    dl = fastloader.DataLoader(Shifted(paths["tokens"], paths["labels"]), batch_size=100, num_workers=2)
    got = list(dl)
    assert dl.stats()["path"] == "python"
    assert torch.equal(got[1][0], torch.from_numpy(arrs["tokens"][100:200]) + 1)


class Tagged(fastloader.ArrayDataset):
    def __init__(self, path, tag):
        super().__init__(path)
        self.tag = tag


def test_pickle_maps_the_files_again(arrays, images):
    paths, arrs = arrays
    ds = fastloader.ArrayDataset(paths["tokens"], arrs["labels"])
    ds2 = pickle.loads(pickle.dumps(ds))
    assert type(ds2) is fastloader.ArrayDataset and len(ds2) == N
    assert all(torch.equal(u, v) for u, v in zip(ds[7], ds2[7]))
    t = pickle.loads(pickle.dumps(Tagged(paths["labels"], "x")))  # a subclass keeps its type and attributes
    assert type(t) is Tagged and t.tag == "x" and int(t[3][0]) == arrs["labels"][3]
    im = fastloader.ArrayDataset(images["images"], images["labels"], transform=_train())
    im2 = pickle.loads(pickle.dumps(im))
    assert isinstance(im2, fastloader.ArrayDataset) and im2.samples[2] == im.samples[2]
    assert torch.equal(im2.load_batch([1, 2], 0, 5)[0], im.load_batch([1, 2], 0, 5)[0])


def test_in_memory_array_is_held_not_copied_and_released():
    a = np.arange(60, dtype=np.int64).reshape(20, 3)
    before = sys.getrefcount(a)
    ds = fastloader.ArrayDataset(a)
    assert sys.getrefcount(a) > before  # the export holds it
    a[4, 1] = 99                        # no copy: the dataset sees it
    assert int(ds[4][0][1]) == 99
    dl = fastloader.DataLoader(ds, batch_size=8, num_workers=2)
    assert int(next(iter(dl))[0][4, 1]) == 99
    del ds, dl
    gc.collect()
    assert sys.getrefcount(a) == before


def test_gather_into_a_pool_and_its_refusals(arrays):
    from fastloader import _C

    paths, arrs = arrays
    ds = fastloader.ArrayDataset(paths["tokens"], paths["labels"])
    pool = _C.BatchPool(-1)
    toks, labs = _C.gather(ds._sources, [5, 2], pool)
    assert toks.shape == (2, 128) and labs.shape == (2,) and not toks.pinned
    ptr = toks.ptr
    assert torch.equal(torch.from_dlpack(toks), torch.from_numpy(arrs["tokens"][[5, 2]]))
    del toks, labs
    toks, _ = _C.gather(ds._sources, [1, 0], pool)  # the same buffer back from the pool
    assert toks.ptr == ptr and pool.stats()["pooled"] == 4
    # a loader (which pools its collation) gives the same batches
    dl = fastloader.DataLoader(ds, batch_size=64, num_workers=2)
    assert_same_batches(list(dl),
                        list(torch.utils.data.DataLoader(_tensors(arrs, ["tokens", "labels"]), batch_size=64)))
    assert dl._fl_pool.stats()["pooled"] > 0
    with pytest.raises(TypeError, match="array Sources"):
        _C.gather([_C.file_source([paths["tokens"]])], [0])
    other = _C.array_source(np.zeros(3), 0, (3,), "<f8")
    with pytest.raises(ValueError, match="arrays of 300 and 3 rows"):
        _C.gather([ds._sources[0], other], [0])
    with pytest.raises(ValueError, match="byte order"):
        _C.array_source(np.zeros(3, ">f8"), 0, (3,), ">f8")
    with pytest.raises(ValueError, match="holds 24 bytes"):
        _C.array_source(np.zeros(3), 0, (4,), "<f8")
    assert ds._sources[1].kind == "array" and ds._sources[1].read(7) == arrs["labels"][7].tobytes()


def test_gather_survives_an_index_that_empties_the_list():
    """__index__ may run any code: one that empties the indices list while
    gather reads it must not leave gather reading freed memory; the indices
    as they were when the call began are used."""
    from fastloader import _C

    a = np.arange(20, dtype=np.float32).reshape(10, 2)
    src = _C.array_source(a, 0, (10, 2), "<f4")

    class Emptier:
        def __index__(self):
            indices.clear()
            junk = [[0.5] * 4 for _ in range(2000)]  # reuse the freed item array
            del junk
            return 1

    indices = [Emptier()] + [3, -1] * 500
    (out,) = _C.gather([src], indices)
    assert np.array_equal(np.from_dlpack(out), a[[1] + [3, 9] * 500])


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_opening_a_big_file_reads_nothing(tmp_path):
    path = str(tmp_path / "big.npy")
    rows = 200 * (1 << 20) // (256 * 4)
    big = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, 256))  # sparse: nothing written
    big[rows // 2, :3] = (1, 2, 3)
    big.flush()
    del big
    gc.collect()
    r0 = _rss()
    ds = fastloader.ArrayDataset(path)
    row = ds[rows // 2][0]
    batch = next(iter(fastloader.DataLoader(ds, batch_size=64, sampler=range(rows // 2, rows // 2 + 64))))[0]
    grown = _rss() - r0
    assert row[:3].tolist() == [1, 2, 3] and torch.equal(batch[0], row) and float(batch[1:].abs().sum()) == 0
    assert grown < 16 << 20, f"RSS grew by {grown >> 20} MiB after opening a 200 MB array"


# ---- refusals that name the file ------------------------------------------------------------------

def _save(tmp_path, name, a, **kw):
    p = str(tmp_path / name)
    np.save(p, a, **kw)
    return p


def test_bad_files_are_refused_naming_the_file(tmp_path):
    good = _save(tmp_path, "good.npy", np.zeros((4, 2), np.float32))
    cases = {
        "not_npy.npy": (None, "not a valid .npy file"),
        "fortran.npy": (np.asfortranarray(np.zeros((4, 3), np.float32)), "Fortran order"),
        "object.npy": (np.array([1, "x", None, 2.0], dtype=object), "object array"),
        "bigendian.npy": (np.zeros(4, ">i4"), "byte order"),
        "strings.npy": (np.array(["a", "b", "c", "d"]), "not supported"),
        "scalar.npy": (np.float32(3), "no rows"),
        "short.npy": (np.zeros(5, np.float32), "rows"),  # mismatched length with good.npy
    }
    for name, (arr, why) in cases.items():
        p = str(tmp_path / name)
        if arr is None:
            with open(p, "wb") as f:
                f.write(b"just text, not an array\n")
        else:
            np.save(p, arr, allow_pickle=True)
        with pytest.raises(ValueError, match=why) as ei:
            fastloader.ArrayDataset(good, p)
        assert p in str(ei.value) or name in str(ei.value), str(ei.value)
    # data shorter than the header says
    trunc = _save(tmp_path, "trunc.npy", np.zeros((4, 2), np.float32))
    with open(trunc, "r+b") as f:
        f.truncate(os.path.getsize(trunc) - 5)
    with pytest.raises(ValueError, match="truncated") as ei:
        fastloader.ArrayDataset(trunc)
    assert trunc in str(ei.value)
    with pytest.raises(FileNotFoundError):
        fastloader.ArrayDataset(str(tmp_path / "missing.npy"))
    # an array in memory in Fortran order is copied to C order (as torch.from_numpy would see it)
    f = np.asfortranarray(np.arange(12.0).reshape(4, 3))
    assert torch.equal(fastloader.ArrayDataset(f)[[0, 3]][0], torch.from_numpy(f)[[0, 3]])
    with pytest.raises(TypeError, match="with transform="):
        fastloader.ArrayDataset(good, target=1)


# ---- the image path ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """30 RGB images of 40 x 52 and labels, as .npy files and as PNG files (lossless)."""
    from PIL import Image

    d = tmp_path_factory.mktemp("imgarr")
    rng = np.random.default_rng(3)
    imgs = rng.integers(0, 256, size=(30, 40, 52, 3), dtype=np.uint8)
    imgs[:, 10:30, 10:40] //= 3  # some structure, so resampling has edges to show
    labels = rng.integers(0, 4, size=30).astype(np.int64)
    np.save(d / "images.npy", imgs)
    np.save(d / "labels.npy", labels)
    gray = imgs[..., 1].copy()
    np.save(d / "gray.npy", gray)
    png, gpng = [], []
    for i in range(30):
        png.append(str(d / f"{i:03d}.png"))
        Image.fromarray(imgs[i]).save(png[-1])
        gpng.append(str(d / f"g{i:03d}.png"))
        Image.fromarray(gray[i]).save(gpng[-1])
    return {"images": str(d / "images.npy"), "labels": str(d / "labels.npy"), "gray": str(d / "gray.npy"),
            "png": png, "gray_png": gpng, "arr": imgs, "lab": labels, "garr": gray}


_train = functools.partial(train_tf, 32, norm=([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]))


@pytest.mark.filterwarnings("ignore:fastloader.*not a JPEG")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_images_equal_imagelist_over_png_files(images, num_workers):
    ds = fastloader.ArrayDataset(images["images"], images["labels"], transform=_train())
    assert isinstance(ds, fastloader.ArrayDataset) and len(ds) == 30
    ref = fastloader.ImageList(images["png"], images["lab"].tolist(), transform=_train())
    for epoch_seed in (4, 5):
        kw = dict(batch_size=8, shuffle=True, seed=epoch_seed)
        dl = fastloader.DataLoader(ds, num_workers=num_workers, generator=torch.Generator().manual_seed(1), **kw)
        got = list(dl)
        exp = list(fastloader.DataLoader(ref, generator=torch.Generator().manual_seed(1), **kw))
        assert len(got) == len(exp) == 4
        for (x, y), (u, v) in zip(got, exp):
            assert x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32) and y.dtype == torch.int64
            assert torch.equal(y, v) and torch.equal(x, u), (x - u).abs().max()
        st = dl.stats()
        assert st["path"] == "native" and st["stages_s"]["decode_s"] == 0.0 and "RandomResizedCrop" in st["pipeline"]


def test_images_in_memory_equal_the_files_and_are_released(images):
    arr, lab = images["arr"].copy(), images["lab"].copy()
    before = sys.getrefcount(arr)
    ds = fastloader.ArrayDataset(arr, lab, transform=_train())
    files = fastloader.ArrayDataset(images["images"], images["labels"], transform=_train())
    kw = dict(batch_size=8, seed=2)
    for (x, y), (u, v) in zip(fastloader.DataLoader(ds, num_workers=2, **kw), fastloader.DataLoader(files, **kw)):
        assert torch.equal(x, u) and torch.equal(y, v)
    del ds, x, y
    gc.collect()
    assert sys.getrefcount(arr) == before  # the workers' views of it are gone with the dataset


@pytest.mark.filterwarnings("ignore:fastloader.*not a JPEG")
@pytest.mark.parametrize("tf,ch", [("rgb", 3), ("gray", 1)])
def test_gray_and_rgb_arrays_convert_as_pillow_does(images, tf, ch):
    """A gray array under an RGB transform (and RGB under Grayscale) gives
    what ImageList gives for the same PNGs, which Pillow converts."""
    t = FT.Compose(([FT.Grayscale()] if tf == "gray" else []) + [FT.Resize(20), FT.CenterCrop(16), FT.PILToTensor()])
    src, png = ("gray", "gray_png") if tf == "rgb" else ("images", "png")
    got = next(iter(fastloader.DataLoader(fastloader.ArrayDataset(images[src], transform=t), batch_size=30)))
    exp = next(iter(fastloader.DataLoader(fastloader.ImageList(images[png], transform=t), batch_size=30)))
    assert got[0].shape == (30, ch, 16, 16) and torch.equal(got[0], exp[0])
    assert got[1].tolist() == [-1] * 30  # no label array


def test_images_equal_torchvision_on_pil_images(images):
    tv = pytest.importorskip("torchvision")
    from PIL import Image
    from torchvision.transforms import v2

    T = tv.transforms
    tf = T.Compose([T.Resize(36), T.CenterCrop(32), T.PILToTensor()])
    ds = fastloader.ArrayDataset(images["images"], images["labels"], transform=tf)
    x, y = next(iter(fastloader.DataLoader(ds, batch_size=30, num_workers=2)))
    assert torch.equal(y, torch.from_numpy(images["lab"]))
    for i in range(0, 30, 7):
        ref = tf(Image.fromarray(images["arr"][i]))   # torchvision on PIL: exact
        assert torch.equal(x[i], ref), i
        # torchvision v2 on the uint8 tensor: its antialiased resize rounds
        # differently from Pillow's fixed-point one, by at most 1
        t = torch.from_numpy(images["arr"][i]).permute(2, 0, 1)
        ref2 = v2.Compose([v2.Resize(36, antialias=True), v2.CenterCrop(32)])(t)
        assert (x[i].int() - ref2.int()).abs().max() <= 1, i


def test_image_getitem_and_errors(images, tmp_path):
    ds = fastloader.ArrayDataset(images["images"], images["labels"], transform=_train())
    img, label = ds[3]
    assert img.shape == (3, 32, 32) and label == int(images["lab"][3])
    assert ds.samples[3] == (images["images"] + "[3]", label) and ds.targets[:5] == images["lab"][:5].tolist()
    with pytest.raises(IndexError):
        next(iter(fastloader.DataLoader(ds, batch_sampler=[[0, 30]])))
    p = _save(tmp_path, "float.npy", np.zeros((30, 8, 8, 3), np.float32))
    with pytest.raises(ValueError, match="float.npy: with transform=, the image array must be uint8"):
        fastloader.ArrayDataset(p, transform=_train())
    p = _save(tmp_path, "labels_f.npy", np.zeros(30, np.float32))
    with pytest.raises(ValueError, match="labels_f.npy: labels must be a 1-D integer array"):
        fastloader.ArrayDataset(images["images"], p, transform=_train())
    with pytest.raises(ValueError, match="at most one label array"):
        fastloader.ArrayDataset(images["images"], images["labels"], images["labels"], transform=_train())
    # image= and target= pick the arrays
    ds2 = fastloader.ArrayDataset(images["labels"], images["images"], transform=_train(), image=1)
    assert torch.equal(ds2.load_batch([0, 5], 0, 9)[0], ds.load_batch([0, 5], 0, 9)[0])


# ---- device= against the stand-in CUDA runtime ----------------------------------------------------

def _fake_child():
    """Runs with FASTLOADER_CUDART = the fake runtime: DataLoader(ArrayDataset,
    device="cuda") equals the CPU path, batches are gathered straight into
    page-locked pool buffers (no second copy to pin them)."""
    import json
    import tempfile

    sys.path.insert(0, os.path.join(HERE, "fakecuda"))
    import scenarios as S

    S.stub_torch_cuda(S.new_stream())
    copied = []
    torch.Tensor.pin_memory = lambda self, *a, **k: copied.append(tuple(self.shape)) or self.clone()
    torch.Tensor.is_pinned = lambda self, *a, **k: False
    d = tempfile.mkdtemp(prefix="fl-arr-")
    rng = np.random.default_rng(0)
    tok = rng.integers(0, 1000, size=(40, 16), dtype=np.int64)
    feat = rng.standard_normal((40, 5)).astype(np.float32)
    np.save(os.path.join(d, "t.npy"), tok)
    np.save(os.path.join(d, "f.npy"), feat)
    ds = fastloader.ArrayDataset(os.path.join(d, "t.npy"), os.path.join(d, "f.npy"))
    out = {}
    for nw in (0, 2):
        allocs = S.lib.fakecuda_counter(S.HOST_ALLOCS)
        dev = list(fastloader.DataLoader(ds, batch_size=8, num_workers=nw, device="cuda"))
        cpu = list(fastloader.DataLoader(ds, batch_size=8, num_workers=nw))
        out[f"nw{nw}_equal"] = len(dev) == len(cpu) == 5 and all(
            type(a) is list and all(torch.equal(u, v) for u, v in zip(a, b)) for a, b in zip(dev, cpu))
        out[f"nw{nw}_host_allocs"] = S.lib.fakecuda_counter(S.HOST_ALLOCS) - allocs
    out["pin_copies"] = len(copied)
    print("FAKECUDA-ARRAYS " + json.dumps(out), flush=True)


def test_device_delivery_on_the_fake_cuda_runtime(tmp_path_factory):
    from helpers_fakecuda import run_test_function

    r = run_test_function(tmp_path_factory, "test_arrays", "_fake_child", marker="FAKECUDA-ARRAYS")
    assert r["nw0_equal"] and r["nw2_equal"], r
    assert r["nw0_host_allocs"] > 0 and r["nw2_host_allocs"] > 0, r  # page-locked pool buffers
    assert r["pin_copies"] == 0, r                                    # gathered into them: nothing pinned twice


# ---- two ranks under torchrun ---------------------------------------------------------------------

RANKS = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    import fastloader
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tokens, labels, out = sys.argv[1], sys.argv[2], sys.argv[3]
    ds = fastloader.ArrayDataset(tokens, labels)
    sampler = torch.utils.data.DistributedSampler(ds, shuffle=True, seed=3)
    dl = fastloader.DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2)
    result = {}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        result[epoch] = (list(sampler), [b for b in dl])
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
""")


def test_two_ranks_with_distributed_sampler(arrays, tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    paths, arrs = arrays
    script = tmp_path / "run.py"
    script.write_text(RANKS)
    torchrun(script, paths["tokens"], paths["labels"], tmp_path, timeout=240)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for epoch in range(2):
        (i0, b0), (i1, b1) = ranks[0][epoch], ranks[1][epoch]
        assert not set(i0) & set(i1) and set(i0) | set(i1) == set(range(N))  # disjoint, covering
        assert len(b0) == len(b1)                                              # equal batch counts
        for idx, batches in ((i0, b0), (i1, b1)):
            toks = torch.cat([t for t, _ in batches])
            labs = torch.cat([lab for _, lab in batches])
            assert torch.equal(toks, torch.from_numpy(arrs["tokens"][idx]))
            assert torch.equal(labs, torch.from_numpy(arrs["labels"][idx]))
    assert ranks[0][0][0] != ranks[0][1][0]  # set_epoch reshuffles
