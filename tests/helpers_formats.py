"""What the tests of a packed or converted image format (LMDB, Hugging
Face datasets) share to check it against fastloader.ImageFolder over the
same files: small deterministic images of varying sizes, class folders of
them, and the on_error checks over a copy with two bad samples."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

import fastloader
from helpers_compare import assert_same_epochs, seeded_epochs
from helpers_pipelines import train_tf, val_tf

CLASSES = ["cat", "dog", "eel"]
PER_CLASS = 7  # 21 images: batches of 5 leave a short last one


def varied_image(i):
    """A deterministic photo-like image of a varying size; every 5th is grayscale."""
    rng = np.random.default_rng(i)
    h, w = 40 + 7 * (i % 5), 52 + 5 * (i % 7)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (3 + i % 4)) % 256, (y * 5 + 30 * i) % 256, ((x + y) * 2) % 256], -1)
    arr = np.clip(base + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)
    im = Image.fromarray(arr)
    return im.convert("L") if i % 5 == 4 else im


def make_class_folder(root):
    """root/<class>/<class>_NN.jpg: PER_CLASS JPEGs of each of CLASSES; returns str(root)."""
    i = 0
    for c in CLASSES:
        os.makedirs(root / c)
        for k in range(PER_CLASS):
            varied_image(i).save(root / c / f"{c}_{k:02d}.jpg", quality=90)
            i += 1
    return str(root)


def make_png_folder(root, ext="png"):
    """root/a/x.<ext> and root/a/y.jpg: another format beside a JPEG.  png and
    webp (lossless) are decoded natively; bmp is a format the native decoder
    leaves to Pillow."""
    os.makedirs(root / "a")
    kw = {"lossless": True} if ext == "webp" else {}
    varied_image(1).save(root / "a" / f"x.{ext}", **kw)
    varied_image(2).save(root / "a" / "y.jpg", quality=90)
    return root


# the other formats of the source tests: (extension, decoded natively?)
OTHER_FORMATS = [("png", True), ("webp", True), ("bmp", False)]


def check_batches_equal_imagefolder(folder, make, pipeline, num_workers):
    """make(transform) -> the format's dataset of `folder`'s images: its
    batches (pipeline "train": shuffled, augmented; "val": in order) over
    two epochs equal ImageFolder's, pixels, labels and order."""
    tf = train_tf if pipeline == "train" else val_tf
    shuffle = pipeline == "train"
    want = seeded_epochs(fastloader.ImageFolder(folder, transform=tf()), 0, shuffle)
    got = seeded_epochs(make(tf()), num_workers, shuffle)
    assert_same_epochs(got, want)
    assert len(got[0]) == 5 and len(got[0][-1][1]) == 1
    if shuffle:  # a new order and new crops in the second epoch
        assert not torch.equal(got[0][0][0], got[1][0][0])


# The corrupt copies: sample 3 cut short, sample 8 not an image.
BAD = (3, 8)


def check_on_error_raise(ds, name3):
    """on_error="raise" (the default), 0 and 2 workers: a DecodeError that
    names sample 3 (`name3`, the format's way) and its index."""
    for nw in (0, 2):
        with pytest.raises(fastloader.DecodeError) as e:
            list(fastloader.DataLoader(ds, batch_size=5, num_workers=nw))
        msg = str(e.value)
        assert name3 in msg and "sample index 3" in msg, msg


def check_on_error_skip_and_replace(make, targets, names):
    """make(on_error) -> the dataset over the corrupt copy; `targets`: the
    intact folder's labels; `names`: the bad samples' names, in BAD's order.
    skip drops them (and records why), replace keeps every batch full.
    Returns the "replace" dataset."""
    ds = make("skip")
    labels = torch.cat([y for _, y in fastloader.DataLoader(ds, batch_size=5, num_workers=2)]).tolist()
    assert labels == [t for i, t in enumerate(targets) if i not in BAD]
    assert sorted(p for p, _ in ds.skipped) == list(names)
    assert "not a JPEG" in dict(ds.skipped)[names[1]]

    ds = make("replace")
    batches = list(fastloader.DataLoader(ds, batch_size=5, num_workers=2, seed=1))
    assert [len(y) for _, y in batches] == [5, 5, 5, 5, 1]
    assert sorted(bad for bad, _, _ in ds.replaced) == list(names)
    return ds
