"""Memory-mapped arrays: ArrayDataset.

One or more arrays with the same first dimension -- `.npy` files (mapped
read-only, never read whole), or arrays already in memory -- indexed like
torch's TensorDataset: `ds[i]` is the tuple of row i of every array.

Two ways a batch is made:

* Without a transform (token ids, features, pre-decoded images as they
  are), with fastloader.DataLoader and the default collate_fn, a worker
  thread makes one call per batch, `_fl_load_batch`: the rows the sampler
  chose are copied in C, without the GIL, straight from the map into the
  batch buffers (csrc/sources/gather.c; page-locked pooled buffers when pinning).
  The batch is a list of stacked tensors, as torch's default_collate makes
  of TensorDataset's tuples.  With a custom collate_fn, or batch_size=None,
  the loader falls back to `ds[i]` and collate_fn per sample, as torch does
  (correct, slower).  stats()["path"] says which ran.
* With `transform=` (fastloader or torchvision transforms that compile to
  C, as ImageFolder takes), the image array (N x H x W x C uint8, C 1 or 3,
  or N x H x W) goes through the native image pipeline: each row is handed
  to the workers as decoded pixels viewed in the map (no copy, no decode),
  cropped, resized, flipped and normalized into the batch.  A batch is
  (images, labels), labels from an integer array when there is one, as
  with ImageFolder, with its on_error, determinism, stats and device=.

The .npy header is read with numpy.lib.format; Fortran order, object and
other non-numeric dtypes, and a byte order other than the machine's are
refused with a ValueError naming the file.  A file truncated or rewritten
while mapped is the caller's to avoid (as with np.memmap: reading a page
past a shrunk file's end kills the process with SIGBUS).
"""
from __future__ import annotations

import operator
import os

import numpy as np

from . import _C
from .datasets import LazySamples, NativeImageDataset, to_output

try:
    import torch
    from torch.utils.data import Dataset as _Dataset
except ImportError:  # pragma: no cover
    torch = None
    _Dataset = object

__all__ = ["ArrayDataset"]

_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def _read_npy_header(path):
    """(shape, dtype, offset of the data) of the .npy file at `path`;
    ValueError naming the file for anything ArrayDataset cannot map."""
    fmt = np.lib.format
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
            else:
                shape, fortran, dtype = fmt._read_array_header(f, version)
        except (ValueError, SyntaxError, EOFError, TypeError) as e:
            raise ValueError(f"{path}: not a valid .npy file ({e})") from None
        offset = f.tell()
    if fortran and len(shape) > 1:
        raise ValueError(f"{path}: the array is stored in Fortran order; ArrayDataset maps C-order rows "
                         "(save it with np.save(path, np.ascontiguousarray(a)))")
    _check_dtype(dtype, path)
    if len(shape) == 0:
        raise ValueError(f"{path}: a 0-d array has no rows")
    return tuple(int(s) for s in shape), dtype, offset


def _check_dtype(dtype, name):
    if dtype.hasobject:
        raise ValueError(f"{name}: an object array (dtype {dtype}) cannot be mapped; ArrayDataset takes "
                         "numeric arrays")
    if dtype.kind not in _KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"{name}: dtype {dtype} is not supported (booleans, integers, floats and complex "
                         "numbers only)")
    if not dtype.isnative:
        raise ValueError(f"{name}: dtype {dtype.str} is not in this machine's byte order; convert it with "
                         "a.astype(a.dtype.newbyteorder('='))")


class _Array:
    """One array of the dataset: its name for messages, shape, dtype and
    the C source over its rows."""

    __slots__ = ("name", "path", "offset", "shape", "dtype", "data", "source")

    def __init__(self, data, k, image=False):
        if isinstance(data, (str, bytes, os.PathLike)):
            self.path = os.fsdecode(os.fspath(data))
            self.name = self.path
            self.shape, self.dtype, self.offset = _read_npy_header(self.path)
            self.data = None
            ref = self.path
        else:
            self.path = None
            self.name = f"array {k}"
            self.offset = 0
            if torch is not None and isinstance(data, torch.Tensor):
                data = data.detach().cpu().numpy()
            if not isinstance(data, np.ndarray):
                raise TypeError(f"ArrayDataset takes .npy paths or arrays; argument {k} is "
                                f"{type(data).__name__}")
            _check_dtype(data.dtype, self.name)
            if data.ndim == 0:
                raise ValueError(f"{self.name}: a 0-d array has no rows")
            data = np.ascontiguousarray(data)  # no copy when it is already (a memmap stays a memmap)
            self.shape, self.dtype, self.data = data.shape, data.dtype, data
            ref = data
        self.source = _C.array_source(ref, self.offset, self.shape, self.dtype.str, image=image)

    def numpy(self):
        """A read-only NumPy view of the whole array (a second map for a file)."""
        if self.data is not None:
            v = self.data.view()
            v.flags.writeable = False
            return v
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)

    def describe(self):
        return f"{os.path.basename(self.name)} {self.dtype.name} {tuple(self.shape[1:])}"


def _open_all(arrays, image=None):
    if not arrays:
        raise ValueError("ArrayDataset needs at least one array")
    out = [_Array(a, k, image=(k == image)) for k, a in enumerate(arrays)]
    n = out[0].shape[0]
    for a in out[1:]:
        if a.shape[0] != n:
            raise ValueError(f"size mismatch between arrays: {out[0].name} has {n} rows, {a.name} has "
                             f"{a.shape[0]}")
    return out


def _rebuild(cls, arrays, kwargs):
    return cls(*arrays, **kwargs)


class ArrayDataset(_Dataset):
    """Rows of `.npy` files (mapped read-only) or in-memory arrays, like torch's TensorDataset.

    Args:
        *arrays: paths of `.npy` files, or NumPy arrays / np.memmap / CPU
            tensors, all with the same first dimension (rows).
        transform: fastloader or torchvision transforms (as ImageFolder
            takes); the `image` array is then rendered through the native
            image pipeline, and the dataset gives (image, label) pairs.
        target_transform: with transform, called on each int label.
        image: which array holds the images (with transform): N x H x W x C
            uint8 (C 1 or 3) or N x H x W.
        target: which array holds the integer labels (with transform);
            default: the other array when there are two, none (labels -1)
            when there is one.
        **native_options: with transform, ImageFolder's layout, on_error,
            max_pixels.

    Without a transform, `ds[i]` is a tuple of tensors (row i of each
    array, a copy: the maps are read-only), `ds[[i, j, ...]]` a tuple of
    stacked rows, and fastloader.DataLoader with the default collate_fn
    gathers each batch in C with one call (see the module's docstring).
    """

    # worker_mode="auto" runs it on threads: its work is C without the GIL (backends.choose_worker_mode)
    _fl_thread_safe = True

    def __new__(cls, *arrays, transform=None, **kwargs):
        if cls is ArrayDataset and transform is not None:
            cls = _ArrayImageDataset
        return super().__new__(cls)

    def __init__(self, *arrays, transform=None, target_transform=None, image=0, target=None, **native_options):
        if target_transform is not None or target is not None or native_options:
            raise TypeError("target_transform, target and native options (" + ", ".join(native_options) +
                            ") apply to images, with transform=")
        self._init_args = (arrays, {})
        self._arrays = _open_all(arrays)
        self._sources = tuple(a.source for a in self._arrays)
        # what stats()["pipeline"] shows; stats()["path"] says whether the
        # gather ran ("batch") or __getitem__ + collate_fn ("python")
        self.pipeline_description = "ArrayDataset: " + ", ".join(a.describe() for a in self._arrays)

    # -- what the arrays are -------------------------------------------------------
    @property
    def names(self):
        """Each array's file path (or "array k" for one given in memory)."""
        return [a.name for a in self._arrays]

    @property
    def shapes(self):
        return [tuple(a.shape) for a in self._arrays]

    @property
    def dtypes(self):
        return [a.dtype for a in self._arrays]

    @property
    def arrays(self):
        """Read-only NumPy views of the arrays (files are mapped again for them)."""
        return [a.numpy() for a in self._arrays]

    def __len__(self):
        return self._arrays[0].shape[0]

    # A copy in another process (pickled for spawned workers) maps the files
    # again; arrays in memory are pickled with it.
    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_arrays"], state["_sources"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._arrays = _open_all(self._init_args[0])
        self._sources = tuple(a.source for a in self._arrays)

    # -- rows ------------------------------------------------------------------------
    def __getitem__(self, index):
        if isinstance(index, slice):
            rows = list(range(*index.indices(len(self))))
        elif _is_int(index):
            bufs = _C.gather(self._sources, [operator.index(index)])
            return tuple(to_output(b)[0] for b in bufs)
        else:
            rows = _as_index_list(index)
        return tuple(to_output(b) for b in _C.gather(self._sources, rows))

    @property
    def _fl_load_batch(self):
        """The loader's batch hook (fastloader/_worker.py), or None for a
        subclass with its own __getitem__: the loader must call that."""
        if type(self).__getitem__ is not ArrayDataset.__getitem__:
            return None
        return self._gather_batch

    def _gather_batch(self, indices, pool):
        """One call per batch on a worker thread, for default collation: the
        rows of every array gathered in C into `pool`'s buffers (a
        _C.BatchPool, page-locked when pinning; None: fresh ones).  Returns
        (batch, addresses of the page-locked buffers), the batch a list as
        default_collate makes of TensorDataset's tuples."""
        bufs = _C.gather(self._sources, indices, pool)
        return [to_output(b) for b in bufs], frozenset(b.ptr for b in bufs if b.pinned)


def _is_int(x):
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return True
    return torch is not None and isinstance(x, torch.Tensor) and x.ndim == 0 and not x.is_floating_point()


def _as_index_list(index):
    if torch is not None and isinstance(index, torch.Tensor):
        index = index.numpy()
    arr = np.asarray(index)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(f"ArrayDataset indices must be an int, a slice or a 1-D sequence of ints, not {index!r}")
    return arr.tolist()


class _Rows(LazySamples):
    """The (name, label) pairs NativeImageDataset keeps as `samples`, made on
    demand ("images.npy[12]"), so a dataset of millions of rows holds no
    million tuples."""

    __slots__ = ("_name", "_targets")
    _noun = "row"

    def __init__(self, name, targets):
        self._name = name
        self._targets = targets

    def _pair(self, i):
        return (f"{self._name}[{i}]", self._targets[i])


class _ArrayImageDataset(NativeImageDataset, ArrayDataset):
    """ArrayDataset(..., transform=...): an array of images through the native
    pipeline, as ImageFolder renders decoded files."""

    _fl_load_batch = None  # batches come from the native engine, never the gather hook

    def __reduce__(self):
        # rebuilt from the arguments: the native dataset, its pool and lock are this process's
        arrays, kwargs = self._init_args
        return _rebuild, (type(self), arrays, kwargs)

    def __init__(self, *arrays, transform=None, target_transform=None, image=0, target=None, **native_options):
        self._init_args = (arrays, dict(transform=transform, target_transform=target_transform, image=image,
                                        target=target, **native_options))
        if not isinstance(image, int) or not 0 <= image < len(arrays):
            raise ValueError(f"image={image!r}: no such array (got {len(arrays)})")
        if target is None and len(arrays) == 2:
            target = 1 - image
        if target is not None and (not isinstance(target, int) or not 0 <= target < len(arrays) or target == image):
            raise ValueError(f"target={target!r}: not an array other than the images (got {len(arrays)})")
        extra = [k for k in range(len(arrays)) if k not in (image, target)]
        if extra:
            raise ValueError(f"with transform=, ArrayDataset takes the image array and at most one label array; "
                             f"arrays {extra} are neither (name them with image= and target=)")
        self._arrays = _open_image_arrays(arrays, image)
        self._sources = tuple(a.source for a in self._arrays)
        img = self._arrays[image]
        if target is not None:
            lab = self._arrays[target]
            if lab.dtype.kind not in "iu" or len(lab.shape) != 1:
                raise ValueError(f"{lab.name}: labels must be a 1-D integer array, got {lab.dtype} of shape "
                                 f"{lab.shape}")
            targets = lab.numpy().tolist()
        else:
            targets = [-1] * img.shape[0]
        self.image_index, self.target_index = image, target
        NativeImageDataset.__init__(self, _Rows(img.name, targets), transform, target_transform, source=img.source,
                                    targets=targets, **native_options)


def _open_image_arrays(arrays, image):
    try:
        return _open_all(arrays, image=image)
    except ValueError as e:
        if "images must be" not in str(e):
            raise
        name = os.fsdecode(arrays[image]) if isinstance(arrays[image], (str, bytes, os.PathLike)) else f"array {image}"
        raise ValueError(f"{name}: with transform=, the image array must be uint8 of N x H x W x C (C 1 or 3) "
                         f"or N x H x W") from None
