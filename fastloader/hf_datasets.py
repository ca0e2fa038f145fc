"""HFImageDataset: a Hugging Face `datasets` image column through the native pipeline.

`datasets` keeps an Image column as Arrow `struct<bytes: binary, path:
string>`, in files it memory-maps (save_to_disk, the cache of
load_dataset).  The usual recipe decodes every sample in Python: the row
is turned into a dict, Pillow decodes the bytes, torchvision transforms the
PIL image.  Here the column's Arrow buffers (validity bitmaps, offsets,
data: every chunk's) are handed to C once (`_C.arrow_source`,
csrc/sources/arrow_source.h) and the worker threads read each image's bytes in
place, decode and transform them as ImageFolder does: the same transforms,
on_error, determinism, stats() and device delivery.  Rows whose bytes are
null are read from their `path` (what datasets stores for local image
files it did not embed).

Indices mappings (select, shuffle, filter, train_test_split, sort...) are
applied, not materialised: the mapping's row numbers are copied to C once
(8 bytes a sample) and sample i reads row mapping[i] of the table, as
`hf_dataset[i]` would.  Nothing is rewritten (flatten_indices() would copy
every image into a new cache file first); a dataset that was flattened
already has no mapping and is read as it is.

pyarrow and `datasets` are imported only when an HFImageDataset is made:
fastloader imports and works without them (`pip install
fastloader[datasets]`).
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from . import _C
from .datasets import LazySamples, NativeImageDataset, user_stacklevel

INSTALL_HINT = "pip install 'fastloader[datasets]' (or pip install datasets)"


class _Rows(LazySamples):
    """The (name, label) pairs NativeImageDataset keeps as `samples`, made on
    demand -- "NAME row 17 (cat.jpg)", with the row's `path` when it has
    one -- so a dataset of millions of rows holds no million tuples (the
    names are only needed for messages)."""

    __slots__ = ("_name", "_rows", "_targets", "_paths")

    def __init__(self, name, rows, targets, paths):
        self._name = name
        self._rows = rows          # int64 array of table rows, or None (sample i is row i)
        self._targets = targets
        self._paths = paths        # the column's `path` field (a ChunkedArray) or None

    def _pair(self, i):
        row = int(self._rows[i]) if self._rows is not None else i
        name = f"{self._name} row {row}"
        if self._paths is not None:
            path = self._paths[row].as_py()
            if path:
                name += f" ({path})"
        return (name, self._targets[i])


def _import_pyarrow():
    try:
        import pyarrow
    except ImportError:
        raise ImportError(f"fastloader.HFImageDataset needs pyarrow and datasets: {INSTALL_HINT}") from None
    return pyarrow


def _check_dataset(ds):
    """Refuse what is not a map-style datasets.Dataset, with the fix."""
    kind = type(ds).__name__
    module = type(ds).__module__ or ""
    if module.startswith("datasets"):
        if kind in ("IterableDataset", "IterableDatasetDict"):
            raise TypeError(
                "fastloader.HFImageDataset reads rows by index from the Arrow table, which a streaming "
                f"dataset ({kind}, load_dataset(..., streaming=True)) does not have. Load it without "
                "streaming=True (the files are downloaded and memory-mapped once), or write it to tar shards "
                "and read them with fastloader.WebDataset.")
        if kind == "DatasetDict":
            raise TypeError(f"fastloader.HFImageDataset takes one split, not a DatasetDict of {list(ds)}: "
                            "pass ds['train'], for example")
    if not (hasattr(ds, "data") and hasattr(ds, "features") and hasattr(ds, "_indices")):
        raise TypeError(f"fastloader.HFImageDataset takes a datasets.Dataset, not {kind}")


def _default_name(ds):
    """What messages call the dataset: the folder save_to_disk wrote (it
    holds state.json), else the builder and split of load_dataset
    ("parquet:train": its cache folder is a hash), else its first Arrow
    file, else "Dataset(in memory)"."""
    files = [f.get("filename") for f in getattr(ds, "cache_files", None) or [] if f.get("filename")]
    if files and os.path.exists(os.path.join(os.path.dirname(files[0]), "state.json")):
        return os.path.dirname(files[0])
    info = getattr(ds, "info", None)
    builder = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    if builder:
        split = getattr(ds, "split", None)
        return f"{builder}:{split}" if split else builder
    return files[0] if files else "Dataset(in memory)"


def _binary_field(pa, arr, what, column):
    """(validity, offset, offsets, offset_width, data) of a binary or string
    array, for _C.arrow_source."""
    t = arr.type
    if pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        width = 8
    elif pa.types.is_binary(t) or pa.types.is_string(t):
        width = 4
    else:
        raise TypeError(f"column {column!r}: the {what} field is {t}; binary, large_binary, string or "
                        "large_string is read natively (cast the column to one of them)")
    validity, offsets, data = arr.buffers()
    for b in (validity, offsets, data):
        if b is not None and not b.is_cpu:
            raise TypeError(f"column {column!r}: its {what} buffers are not in CPU memory")
    return (validity if arr.null_count else None, arr.offset, offsets, width, data)


def _image_chunks(pa, col, column):
    """The chunk tuples of _C.arrow_source for an image column (a
    ChunkedArray), and its `path` field as a ChunkedArray (None without)."""
    t = col.type
    if pa.types.is_struct(t):
        names = [t.field(k).name for k in range(t.num_fields)]
        if "bytes" not in names:
            raise TypeError(f"column {column!r} is {t}: an image column has a 'bytes' field "
                            "(datasets.Image: struct<bytes: binary, path: string>)")
        has_path = "path" in names
        chunks = []
        for chunk in col.chunks:
            validity = chunk.buffers()[0] if chunk.null_count else None
            path = _binary_field(pa, chunk.field("path"), "path", column) if has_path else None
            chunks.append((len(chunk), validity, chunk.offset, _binary_field(pa, chunk.field("bytes"), "bytes", column),
                           path))
        paths = pa.chunked_array([c.field("path") for c in col.chunks], t.field("path").type) if has_path else None
        return chunks, paths
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return [(len(c), None, 0, _binary_field(pa, c, "bytes", column), None) for c in col.chunks], None
    raise TypeError(f"column {column!r} is {t}, not an image column: datasets.Image (struct<bytes: binary, "
                    "path: string>) or encoded images as binary are read natively")


class HFImageDataset(NativeImageDataset):
    """A Hugging Face `datasets.Dataset`'s image column, decoded and
    transformed natively (JPEG, PNG and WebP in C; other formats through
    Pillow, as ImageFolder does for such files).

    Args:
        hf_dataset: a map-style `datasets.Dataset` (load_dataset(...,
            split=...), load_from_disk, Dataset.from_dict/from_parquet...,
            with any select/shuffle/filter applied).  A streaming
            IterableDataset is refused with a TypeError (it has no table to
            index: load without streaming, or use fastloader.WebDataset).
        image_column: the column of images: datasets.Image (struct<bytes:
            binary, path: string>; rows with null bytes are read from their
            local path), or encoded images as binary / large_binary.
        label_column: an integer column (ClassLabel or int) giving each
            sample's label, or None for no labels (-1).
        transform, target_transform: as ImageFolder (fastloader.transforms
            or torchvision; what does not compile to C runs after the native
            part on the worker threads).  The Dataset's own format and
            with_transform / set_transform function are not used: the
            native pipeline reads the Arrow table (a warning says so when
            one is set).
        name: what error messages call the dataset (default: the folder
            save_to_disk wrote, else load_dataset's builder and split, such
            as "parquet:train", else its Arrow file, else "Dataset(in
            memory)").
        **native_options: layout, on_error, dct_scaling, max_pixels (see
            NativeImageDataset).

    `classes` and `class_to_idx` come from a ClassLabel column (empty for a
    plain int column); `targets` are the labels in sample order; `samples`
    holds ("NAME row R (path)", label) pairs made on demand, so every error
    names the dataset, the table row and the image's original file.

    Errors per sample, following on_error: bytes that are not a valid image
    are a DecodeError; a row with no image (null, or null bytes and a path
    that cannot be read, or a remote path) an OSError.
    """

    def __init__(self, hf_dataset, image_column="image", label_column="label", transform=None,
                 target_transform=None, *, name=None, **native_options):
        pa = _import_pyarrow()
        _check_dataset(hf_dataset)
        table = hf_dataset.data          # datasets.table.Table: the memory-mapped (or in-memory) Arrow table
        columns = list(table.column_names)
        features = hf_dataset.features
        if image_column not in columns:
            images = [c for c, f in features.items() if type(f).__name__ == "Image"]
            raise KeyError(f"no column {image_column!r} in the dataset (columns: {columns}; image columns: "
                           f"{images}): pass image_column=")
        if label_column is not None and label_column not in columns:
            raise KeyError(f"no column {label_column!r} in the dataset (columns: {columns}): pass "
                           "label_column=NAME, or label_column=None for a dataset without labels")
        fmt = getattr(hf_dataset, "format", None) or {}
        if fmt.get("type") == "custom":
            warnings.warn("fastloader.HFImageDataset: the dataset's with_transform / set_transform function is not "
                          "run (the native pipeline reads the Arrow table); pass transform= instead", UserWarning,
                          stacklevel=user_stacklevel())
        self.hf_dataset = hf_dataset
        self.image_column = image_column
        self.label_column = label_column
        self.name = name if name is not None else _default_name(hf_dataset)

        mapping = hf_dataset._indices     # select/shuffle/filter: table rows in sample order, or None
        rows = None
        if mapping is not None:
            rows = np.ascontiguousarray(mapping.column(0).to_numpy(), dtype=np.int64)
        n = len(rows) if rows is not None else table.num_rows

        if label_column is not None:
            labels = table.column(label_column)
            if not pa.types.is_integer(labels.type):
                raise TypeError(f"label column {label_column!r} is {labels.type}, not integers (ClassLabel or int)")
            if labels.null_count:
                raise ValueError(f"label column {label_column!r} has {labels.null_count} null labels: fill them "
                                 "(-1 is 'no label') or pass label_column=None")
            values = labels.to_numpy()
            targets = (values[rows] if rows is not None else values).astype(np.int64).tolist()
            feature = features.get(label_column)
            self.classes = list(getattr(feature, "names", None) or [])
        else:
            targets = [-1] * n
            self.classes = []
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

        source, paths = _arrow_source(hf_dataset, image_column, rows)
        super().__init__(_Rows(self.name, rows, targets, paths), transform, target_transform, source=source,
                         targets=targets, **native_options)

    def _source_recipe(self):
        # the Dataset pickles by its Arrow files (or its in-memory table)
        return _reopen, (self.hf_dataset, self.image_column)


def _arrow_source(hf_dataset, image_column, rows):
    """(the image column as a _C arrow source, the rows' local paths)."""
    chunks, paths = _image_chunks(_import_pyarrow(), hf_dataset.data.column(image_column), image_column)
    return _C.arrow_source(chunks, rows), paths


def _reopen(hf_dataset, image_column):
    """The source again, in a spawned worker process."""
    mapping = hf_dataset._indices
    rows = None if mapping is None else np.ascontiguousarray(mapping.column(0).to_numpy(), dtype=np.int64)
    return _arrow_source(hf_dataset, image_column, rows)[0]
