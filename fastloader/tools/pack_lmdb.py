"""pack_lmdb: an ImageFolder into one LMDB file in fastloader's layout.

    from fastloader.tools.pack_lmdb import pack_lmdb
    pack_lmdb("train/", "train.lmdb")      # python -m fastloader pack lmdb train/ train.lmdb

The class order and the file set are exactly ImageFolder's (the same
find_classes / make_dataset), so LMDBDataset(out) yields the same samples,
labels and, with the same transform and seed, the same batches as
ImageFolder(src).  Image bytes are copied unchanged.  The layout is in
fastloader/lmdb_dataset.py.  No `lmdb` package is needed: the writer is the
extension's (_C.LMDBWriter, liblmdb).

The output is one file (LMDB's single-file form, no lock file).  It is
written under a temporary name next to OUT and renamed at the end, so OUT
never holds a half-written dataset, and an interrupted run leaves nothing.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
import uuid

import numpy as np

from .. import _C
from ..datasets import IMG_EXTENSIONS, find_classes, make_dataset
from ..lmdb_dataset import CLASSES_KEY, FORMAT, LABELS_KEY, META_KEY, NAMES_KEY, VERSION, sample_key


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - file systems that refuse it
        pass
    finally:
        os.close(fd)


def pack_lmdb(src_dir, out_path, progress=None, overwrite=False) -> dict:
    """Write the ImageFolder at `src_dir` into a new LMDB file `out_path`.

    Args:
        src_dir: an ImageFolder root (class folders holding images).
        out_path: the LMDB file to write.  An existing one is refused unless
            overwrite=True (then replaced only once the new one is complete).
        progress: None, or a callable(done, total, nbytes) called once
            before the first image (done=0) and after each image (nbytes:
            image bytes written so far).
        overwrite: replace an existing out_path.

    Returns a dict: path, count, classes (how many), bytes (image bytes),
    file_bytes (size of the LMDB file), seconds.
    """
    t0 = time.perf_counter()
    src = os.fspath(src_dir)
    out = os.path.abspath(os.fspath(out_path))
    if os.path.lexists(out) and not overwrite:
        raise FileExistsError(errno.EEXIST, f"{os.strerror(errno.EEXIST)} (pass overwrite=True, or --overwrite, "
                                            "to replace it)", out)
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, f"{os.strerror(errno.ENOENT)} (the output's folder)", parent)
    classes, class_to_idx = find_classes(src)
    samples = make_dataset(src, class_to_idx, IMG_EXTENSIONS)
    total = len(samples)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    nbytes = 0
    writer = _C.LMDBWriter(tmp)
    try:
        if progress is not None:
            progress(0, total, 0)
        for i, (path, _label) in enumerate(samples):
            with open(path, "rb") as f:
                data = f.read()
            writer.put(sample_key(i), data)
            nbytes += len(data)
            if progress is not None:
                progress(i + 1, total, nbytes)
        labels = np.asarray([label for _, label in samples], dtype="<i8").tobytes()
        names = [os.path.relpath(path, src).replace(os.sep, "/") for path, _ in samples]
        meta = {"format": FORMAT, "version": VERSION, "count": total}
        # reserved keys in key order (they then append, as the samples do)
        writer.put(CLASSES_KEY, json.dumps(classes).encode())
        writer.put(META_KEY, json.dumps(meta).encode())
        writer.put(LABELS_KEY, labels)
        writer.put(NAMES_KEY, json.dumps(names).encode())
        writer.close()
        if os.path.isdir(out) and not os.path.islink(out):
            shutil.rmtree(out)  # overwrite=True over an LMDB directory: not atomic, but never half-written
        os.replace(tmp, out)
    except BaseException:
        writer.abandon()
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(parent)
    return {"path": out, "count": total, "classes": len(classes), "bytes": nbytes,
            "file_bytes": os.path.getsize(out), "seconds": time.perf_counter() - t0}
