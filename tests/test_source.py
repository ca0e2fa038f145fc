"""The source layer (csrc/sources/source.h) as Python sees it: _C.Source."""
import errno
import os

import numpy as np
import pytest

from fastloader import _C
import fastloader


def test_file_source_reads_bytes_and_names_its_kind(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"\x00\x01hello")
    b.write_bytes(b"")
    src = _C.file_source([str(a), b])
    assert len(src) == 2 and src.kind == "files"
    assert src.read(0) == b"\x00\x01hello"
    assert src.read(1) == b""
    with pytest.raises(IndexError, match="out of range"):
        src.read(2)
    with pytest.raises(IndexError):
        src.read(-1)


def test_file_source_errors_go_through_the_translator(tmp_path):
    src = _C.file_source([str(tmp_path / "missing.jpg"), str(tmp_path)])
    with pytest.raises(FileNotFoundError) as e:
        src.read(0)
    assert e.value.errno == errno.ENOENT
    with pytest.raises(IsADirectoryError):
        src.read(1)


def test_native_dataset_accepts_a_source_or_paths(tmp_path):
    from PIL import Image

    paths = []
    for i in range(3):
        p = tmp_path / f"{i}.jpg"
        Image.fromarray(np.full((40, 50, 3), 60 * i, np.uint8)).save(p, quality=95)
        paths.append(str(p))
    spec = fastloader.transforms.compile_transform(
        fastloader.transforms.Compose([fastloader.transforms.Resize((16, 16))]))[0]
    by_paths = _C.NativeDataset(paths, [0, 1, 2], spec)
    by_source = _C.NativeDataset(_C.file_source(paths), [0, 1, 2], spec)
    a = np.from_dlpack(by_paths.load_batch([0, 1, 2], 0, 0)[0])
    b = np.from_dlpack(by_source.load_batch([0, 1, 2], 0, 0)[0])
    assert a.shape == (3, 3, 16, 16) and np.array_equal(a, b)
    with pytest.raises(ValueError, match="labels for 3 samples"):
        _C.NativeDataset(_C.file_source(paths), [0, 1], spec)
    with pytest.raises(TypeError):
        _C.NativeDataset([1, 2], [0, 1], spec)


def test_dataset_keeps_the_source_alive(tmp_path):
    from PIL import Image

    p = tmp_path / "x.jpg"
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(p)
    spec = fastloader.transforms.compile_transform(
        fastloader.transforms.Compose([fastloader.transforms.Resize((8, 8))]))[0]
    ds = _C.NativeDataset(_C.file_source([os.fspath(p)]), [5], spec)
    import gc

    gc.collect()  # the Source object is gone; the dataset holds its own reference
    images, labels, events, failed = ds.load_batch([0], 0, 0)
    assert not failed and np.from_dlpack(labels).tolist() == [5]
