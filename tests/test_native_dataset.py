"""fastloader.ImageFolder / ImageList through fastloader.DataLoader: pixels
against torchvision, determinism across num_workers and epochs, bad files."""
import functools
import io
import warnings
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import functional as TF  # noqa: E402

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
from fastloader.tools.sample import make_sample  # noqa: E402
from helpers_pipelines import MEAN, STD, train_tf, val_tf  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs") / "train"
    make_sample(str(root), n=48, classes=4, seed=3, progress=False, processes=1)
    return str(root)


_val_tf = functools.partial(val_tf, 256, 224, lib=T)  # torchvision's, at ImageNet's evaluation sizes


def test_imagefolder_matches_torchvision_metadata(folder):
    ours = fastloader.ImageFolder(folder, transform=_val_tf())
    ref = tv.datasets.ImageFolder(folder)
    assert ours.classes == ref.classes
    assert ours.class_to_idx == ref.class_to_idx
    assert ours.samples == ref.samples
    assert ours.targets == ref.targets


@pytest.mark.parametrize("num_workers", [0, 2])
def test_val_pipeline_bit_identical_to_torchvision(folder, num_workers):
    ours = fastloader.ImageFolder(folder, transform=_val_tf())
    ref = tv.datasets.ImageFolder(folder, transform=_val_tf())
    a = list(fastloader.DataLoader(ours, batch_size=16, num_workers=num_workers))
    b = list(torch.utils.data.DataLoader(ref, batch_size=16))
    assert len(a) == len(b) == 3
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.dtype == xb.dtype == torch.float32 and ya.dtype == yb.dtype == torch.int64
        assert xa.shape == xb.shape
        assert torch.equal(ya, yb)
        assert torch.equal(xa, xb), (xa - xb).abs().max()


def test_train_pipeline_equals_torchvision_with_the_same_parameters(folder):
    ds = fastloader.ImageFolder(folder, transform=train_tf(160))
    seed, epoch = 11, 0
    images, labels = next(iter(fastloader.DataLoader(ds, batch_size=48, num_workers=2, seed=seed)))
    flips = 0
    for i, (path, label) in enumerate(ds.samples):
        with Image.open(path) as im:
            im = im.convert("RGB")
        p = ds.plan(i, im.width, im.height, epoch, seed)
        x, y, w, h = p["box"]
        out = TF.resized_crop(im, y, x, h, w, [160, 160], interpolation=T.InterpolationMode.BILINEAR)
        if p["flip"]:
            out = TF.hflip(out)
            flips += 1
        ref = TF.normalize(TF.to_tensor(out), MEAN, STD)
        assert int(labels[i]) == label
        assert torch.equal(images[i], ref), (i, p)
    assert 0 < flips < 48


def test_batches_bit_identical_for_any_num_workers_and_differ_between_epochs(folder):
    ds = fastloader.ImageFolder(folder, transform=train_tf(160))
    runs = {}
    for nw in (0, 1, 2, 4):
        dl = fastloader.DataLoader(ds, batch_size=10, num_workers=nw, shuffle=True,
                                   generator=torch.Generator().manual_seed(4), seed=9)
        runs[nw] = [list(dl), list(dl)]  # two epochs
    for nw in (1, 2, 4):
        for ep in range(2):
            for (xa, ya), (xb, yb) in zip(runs[0][ep], runs[nw][ep]):
                assert torch.equal(xa, xb) and torch.equal(ya, yb)
    e0 = torch.cat([x for x, _ in runs[0][0]])
    e1 = torch.cat([x for x, _ in runs[0][1]])
    assert not torch.equal(e0, e1)


def test_seed_from_generator_when_no_seed_given(folder):
    ds = fastloader.ImageFolder(folder, transform=train_tf(160))

    def first(nw):
        dl = fastloader.DataLoader(ds, batch_size=8, num_workers=nw, generator=torch.Generator().manual_seed(1))
        return next(iter(dl))[0]

    assert torch.equal(first(0), first(2))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torchvision_compose_with_unsupported_tail_runs_rest_in_python(folder, num_workers):
    # the tail runs on the workers (tests/test_native_post.py); the warning
    # comes once its cost has been measured
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD),
                    T.Lambda(lambda t: t * 2)])
    ours = fastloader.ImageFolder(folder, transform=tf)
    ref = tv.datasets.ImageFolder(folder, transform=tf)
    with pytest.warns(UserWarning, match="runs in Python.*ms in its calls"):
        a = list(fastloader.DataLoader(ours, batch_size=8, num_workers=num_workers))
    b = list(torch.utils.data.DataLoader(ref, batch_size=8))
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_uint8_hwc_output(folder):
    tf = FT.Compose([FT.Resize((64, 80)), FT.PILToTensor()])
    ds = fastloader.ImageFolder(folder, transform=tf, layout="HWC")
    x, y = next(iter(fastloader.DataLoader(ds, batch_size=4)))
    assert x.dtype == torch.uint8 and x.shape == (4, 64, 80, 3)
    with Image.open(ds.samples[0][0]) as im:
        ref = np.asarray(im.convert("RGB").resize((80, 64), Image.BILINEAR))
    assert np.array_equal(x[0].numpy(), ref)


def test_imagelist_and_getitem(folder):
    ref = tv.datasets.ImageFolder(folder)
    paths = [p for p, _ in ref.samples[:6]]
    ds = fastloader.ImageList(paths, [7] * 6, transform=_val_tf())
    img, label = ds[2]
    assert label == 7 and img.shape == (3, 224, 224)
    x, y = next(iter(fastloader.DataLoader(ds, batch_size=6)))
    assert torch.equal(x[2], img) and y.tolist() == [7] * 6


# ---------------------------------------------------------------------------
# bad files


@pytest.fixture()
def broken_folder(folder, tmp_path):
    root = tmp_path / "mixed"
    shutil.copytree(folder, root)
    cls = sorted(e.name for e in os.scandir(root) if e.is_dir())[0]
    d = root / cls
    good = sorted(os.listdir(d))[0]
    data = (d / good).read_bytes()
    (d / "zz_truncated.jpg").write_bytes(data[: len(data) // 3])
    (d / "zz_empty.jpg").write_bytes(b"")
    (d / "zz_random.jpg").write_bytes(np.random.default_rng(0).bytes(3000))
    for fmt in ("PNG", "BMP"):   # PNG: decoded natively; BMP: left to Pillow (a warning)
        buf = io.BytesIO()
        Image.open(d / good).convert("RGB").save(buf, format=fmt)
        (d / f"zz_really_{fmt.lower()}.jpg").write_bytes(buf.getvalue())
    return str(root)


BROKEN = {"zz_truncated.jpg", "zz_empty.jpg", "zz_random.jpg"}


def test_on_error_raise_names_the_file(broken_folder):
    ds = fastloader.ImageFolder(broken_folder, transform=_val_tf())
    with pytest.raises(fastloader.DecodeError) as ei:
        for _ in fastloader.DataLoader(ds, batch_size=8, num_workers=2):
            pass
    assert any(name in str(ei.value) for name in BROKEN)
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_error_skip_leaves_samples_out_and_lists_them(broken_folder, num_workers):
    ds = fastloader.ImageFolder(broken_folder, transform=_val_tf(), on_error="skip")
    with pytest.warns(UserWarning, match="not a JPEG"):
        batches = list(fastloader.DataLoader(ds, batch_size=8, num_workers=num_workers))
    total = sum(len(y) for _, y in batches)
    assert total == len(ds) - 3
    assert {os.path.basename(p) for p, _ in ds.skipped} == BROKEN
    assert all(os.path.basename(p) in msg or "empty" in msg or "JPEG" in msg for p, msg in ds.skipped)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_error_replace_keeps_batches_full_and_is_deterministic(broken_folder, num_workers):
    def run():
        ds = fastloader.ImageFolder(broken_folder, transform=_val_tf(), on_error="replace")
        dl = fastloader.DataLoader(ds, batch_size=8, num_workers=num_workers, seed=1)
        with pytest.warns(UserWarning, match="not a JPEG"):
            out = list(dl)
        return ds, dl, out

    ds, dl, out = run()
    full, rest = divmod(len(ds), 8)
    assert [len(y) for _, y in out] == [8] * full + ([rest] if rest else [])
    assert len(dl) == len(out)
    assert {os.path.basename(p) for p, _, _ in ds.replaced} == BROKEN
    _, _, out2 = run()
    for (xa, ya), (xb, yb) in zip(out, out2):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_png_named_jpg_decodes_natively_and_bmp_through_pillow(broken_folder):
    """The format comes from the first bytes, never the name: a PNG named
    .jpg is decoded in C, silently; a BMP named .jpg goes to Pillow with a
    warning; both give torchvision's tensor."""
    ds = fastloader.ImageFolder(broken_folder, transform=_val_tf(), on_error="skip")
    ref_ds = tv.datasets.ImageFolder(broken_folder, transform=_val_tf())
    for name, pillow in (("zz_really_png.jpg", False), ("zz_really_bmp.jpg", True)):
        idx = [i for i, (p, _) in enumerate(ds.samples) if p.endswith(name)][0]
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            x, _ = ds.load_batch([idx], epoch=0, seed=0)
        assert torch.equal(x[0], ref_ds[idx][0])
        assert any("Pillow" in str(m.message) for m in w) == pillow, (name, [str(m.message) for m in w])


def test_huge_header_is_refused_before_allocating(tmp_path, folder):
    src = tv.datasets.ImageFolder(folder).samples[0][0]
    data = bytearray(open(src, "rb").read())
    # patch the SOF dimensions to 65000 x 65000
    i = 2
    while i < len(data):
        marker = data[i + 1]
        seglen = data[i + 2] << 8 | data[i + 3]
        if marker in (0xC0, 0xC1, 0xC2):
            data[i + 5:i + 9] = (65000).to_bytes(2, "big") * 2
            break
        i += 2 + seglen
    p = tmp_path / "huge.jpg"
    p.write_bytes(bytes(data))
    ds = fastloader.ImageList([str(p)], transform=_val_tf())
    with pytest.raises(fastloader.DecodeError, match="huge.jpg"):
        ds.load_batch([0], 0, 0)


@pytest.mark.parametrize("magic", [b"\x89PNG\r\n\x1a\n", b"BM"], ids=["png-native", "bmp-pillow"])
def test_replaced_undecodable_non_jpeg_gets_the_replacements_label(tmp_path, folder, magic):
    # a file with PNG magic bytes (the native decoder's) or BMP magic bytes
    # (Pillow's fix-up) that neither can decode, in class "a"; its
    # replacement comes from class "b" and must carry b's label
    root = tmp_path / "lab"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "bad.png").write_bytes(magic + b"garbage" * 40)
    src = tv.datasets.ImageFolder(folder).samples
    for i in range(3):
        shutil.copy(src[i][0], root / "b" / f"ok{i}.jpg")
    ds = fastloader.ImageFolder(str(root), transform=_val_tf(), on_error="replace")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the BMP goes through Pillow, which warns
        x, y = ds.load_batch([0], epoch=0, seed=0)
    (bad, repl, _), = ds.replaced
    assert bad.endswith("bad.png")
    assert int(y[0]) == ds.class_to_idx["b"] == dict(ds.samples)[repl]


def test_loading_while_another_thread_replaces_the_pool(folder):
    import threading

    ds = fastloader.ImageFolder(folder, transform=FT.Compose([FT.RandomResizedCrop(32), FT.ToTensor()]))
    stop = threading.Event()
    errors = []

    def loader():
        try:
            while not stop.is_set():
                ds.load_batch([0, 1], 0, 0)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=loader)
    t.start()
    for i in range(200):
        ds._native.set_pinned(-1 if i % 2 else 0)  # replaces the pool each time
    stop.set()
    t.join(10)
    assert errors == []
