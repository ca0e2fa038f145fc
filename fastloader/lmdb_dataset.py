"""LMDBDataset: images stored as values of an LMDB, through the native pipeline.

The layout (fastloader-lmdb, version 1), written by `fastloader.pack_lmdb`
(`python -m fastloader pack lmdb SRC_DIR OUT`) or by anyone with the `lmdb`
package:

    key b"0000000042"    sample 42's encoded image, unchanged (JPEG, PNG and WebP
                         natively; other formats Pillow reads through Pillow)
    key b"__fastloader__"  JSON {"format": "fastloader-lmdb", "version": 1, "count": N}
    key b"__labels__"      N little-endian int64, sample i's class index
    key b"__classes__"     JSON list of class names, index = label (optional)
    key b"__names__"       JSON list of the samples' original relative paths
                           (optional; error messages name them)

Sample keys are the index as ASCII decimal zero-padded to 10 digits; keys
starting with "__" are reserved.  Everything lives in the main (unnamed)
database; the environment is a directory (data.mdb) or a single file.

Worker threads read each value in place (a view into LMDB's memory map,
one read transaction per worker) and decode and transform it in C, as
ImageFolder does with files: the same transforms, on_error, determinism,
stats() and device delivery.  csrc/sources/lmdb_source.h says which LMDB flags are
used and why.
"""
from __future__ import annotations

import json
import os

import numpy as np

from . import _C
from .datasets import NativeImageDataset

FORMAT = "fastloader-lmdb"
VERSION = 1
KEY_DIGITS = 10
META_KEY = b"__fastloader__"
LABELS_KEY = b"__labels__"
CLASSES_KEY = b"__classes__"
NAMES_KEY = b"__names__"
PACK_HINT = "write one from an ImageFolder with: python -m fastloader pack lmdb SRC_DIR OUT"


def sample_key(index: int) -> bytes:
    """The key of sample `index`: b"0000000042"."""
    return b"%0*d" % (KEY_DIGITS, index)


def _json(path, key, raw):
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: the value of {key.decode()} is not valid JSON ({e})") from None


def read_layout(path, lock=False):
    """(count, labels, classes, names) of the LMDB at `path`: the reserved
    keys checked against the layout; classes and names None when absent.
    Raises OSError when the path is not an LMDB, ValueError when the
    metadata is missing or wrong."""
    path = os.fspath(path)
    meta_raw, labels_raw, classes_raw, names_raw = _C.lmdb_get(
        path, [META_KEY, LABELS_KEY, CLASSES_KEY, NAMES_KEY], lock=lock)
    if meta_raw is None:
        raise ValueError(f"{path}: an LMDB without the key {META_KEY.decode()}, so not in fastloader's layout "
                         f"(see fastloader.lmdb_dataset); {PACK_HINT}")
    meta = _json(path, META_KEY, meta_raw)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: {META_KEY.decode()} does not say format {FORMAT!r}: {meta!r}")
    version = meta.get("version")
    if version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        raise ValueError(f"{path}: layout version {version!r}, this fastloader reads version {VERSION}"
                         + (" (written by a newer fastloader)" if newer else ""))
    count = meta.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"{path}: {META_KEY.decode()} has no valid 'count': {meta!r}")
    if labels_raw is None:
        raise ValueError(f"{path}: an LMDB without the key {LABELS_KEY.decode()} ({count} little-endian int64 "
                         f"labels); {PACK_HINT}")
    if len(labels_raw) != 8 * count:
        raise ValueError(f"{path}: {LABELS_KEY.decode()} holds {len(labels_raw)} bytes, expected 8 x {count} "
                         "(little-endian int64 per sample)")
    labels = np.frombuffer(labels_raw, dtype="<i8").tolist()
    classes = None
    if classes_raw is not None:
        classes = _json(path, CLASSES_KEY, classes_raw)
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ValueError(f"{path}: {CLASSES_KEY.decode()} is not a JSON list of class names")
    names = None
    if names_raw is not None:
        names = _json(path, NAMES_KEY, names_raw)
        if not isinstance(names, list) or len(names) != count or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{path}: {NAMES_KEY.decode()} is not a JSON list of {count} names")
    return count, labels, classes, names


class LMDBDataset(NativeImageDataset):
    """Images in an LMDB (the layout above), decoded and transformed natively.

    Args:
        path: the LMDB: a single file (as pack_lmdb writes) or an
            environment directory holding data.mdb.
        transform, target_transform: as ImageFolder.
        lock: register readers in LMDB's lock file.  Off by default: a
            packed dataset is immutable, and without the lock nothing is
            written next to the data and there is no reader limit.  Turn it
            on only when another process may write to the LMDB while it is
            read.
        readahead: let the OS read around each page fault (default).  Off
            can help random access to a dataset much larger than RAM.
        **native_options: layout, on_error, dct_scaling, max_pixels (see
            NativeImageDataset).

    `classes`, `class_to_idx` and `targets` are ImageFolder's; `samples`
    holds ("PATH[i] (original/name.jpg)", label) pairs, so every error names
    the LMDB, the index and, when the LMDB lists them, the original file.

    Errors: a path that is missing or not an LMDB raises OSError (its errno
    subclass for an OS failure) when the dataset is built, an LMDB not in
    this layout ValueError.  Per sample, as for files: a value that is not
    a valid image is a DecodeError; a missing sample key or a failing LMDB
    read an OSError (the storage failed, not the image); both follow
    on_error.
    """

    def __init__(self, path, transform=None, target_transform=None, *, lock=False, readahead=True,
                 **native_options):
        self.path = os.fspath(path)
        count, labels, classes, names = read_layout(self.path, lock=lock)
        self.classes = classes if classes is not None else []
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._lmdb_args = (self.path, count, bool(lock), bool(readahead))
        source = _open_lmdb(*self._lmdb_args)
        if names is not None:
            samples = [(f"{self.path}[{i}] ({names[i]})", labels[i]) for i in range(count)]
        else:
            samples = [(f"{self.path}[{i}]", labels[i]) for i in range(count)]
        super().__init__(samples, transform, target_transform, source=source, **native_options)
        self.imgs = self.samples

    def _source_recipe(self):
        return _open_lmdb, self._lmdb_args

    def _reopen_source(self):
        # LMDB: an environment must not be used across fork(); a worker
        # process opens its own
        return _open_lmdb(*self._lmdb_args)


def _open_lmdb(path, count, lock, readahead):
    return _C.lmdb_source(path, count, lock=lock, readahead=readahead)
