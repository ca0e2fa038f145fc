"""Collation: torch's default_collate with arrays and tensors stacked in C
without the GIL (`_C.stack`), a NumPy version when torch is absent, and the
sizes of collated batches.

Inside a loader the stacks go straight into the loader's pooled batch
buffers (`_C.BatchPool`, page-locked when pinning): the worker runs
collate_fn under `collate_into(pool, ...)`, which this thread's stacks read
(a thread-local, so a user's collate_fn that calls fast_default_collate
gets it too).  Called anywhere else, fast_default_collate allocates fresh
buffers, as torch does.
"""
from __future__ import annotations

import collections.abc
import threading

import numpy as np

from . import _C

try:
    import torch
    import torch.utils.data as _tud
    from torch.utils.data._utils import collate as _torch_collate
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

__all__ = ["fast_default_collate", "DEFAULT_COLLATES", "DictCollate", "default_fields", "batch_nbytes", "batch_len",
           "collate_into"]


class CollateTarget:
    """Where this thread's stacks go while a loader collates one batch: the
    pool, and the page-locked buffers written so far.  Holding them keeps
    their addresses unique until the worker has pinned the rest of the
    batch (see cuda_delivery.pin_batch)."""

    __slots__ = ("pool", "pinned", "rows")

    def __init__(self, pool, rows=None):
        self.pool = pool
        self.pinned = []
        # RowWriter's written columns, by their first row's id (_written_rows)
        self.rows = rows.written() if rows is not None else None
        if rows is not None:
            self.pinned.extend(b for b in rows.buffers if b.pinned)

    def pinned_ptrs(self):
        """Addresses of the page-locked buffers the batch was stacked into."""
        return frozenset(b.ptr for b in self.pinned)


_target = threading.local()


def collate_into(pool, collate_fn, data, rows=None):
    """collate_fn(data) with fast_default_collate stacking into `pool` (a
    _C.BatchPool) on this thread, taking the columns `rows` (a RowWriter
    that `data` went through) as they are.  Returns (batch, CollateTarget)."""
    target = CollateTarget(pool, rows)
    prev = getattr(_target, "t", None)
    _target.t = target
    try:
        return collate_fn(data), target
    finally:
        _target.t = prev


class _Column:
    """One array/tensor field of the samples, written row by row into a
    batch buffer (RowWriter)."""

    __slots__ = ("kind", "dtype", "shape", "out", "rows", "dead")

    def __init__(self, kind, dtype, shape, out):
        self.kind = kind      # "t": torch.Tensor, "n": np.ndarray
        self.dtype = dtype
        self.shape = shape
        self.out = out        # [nrows, *shape], a view of the batch buffer (tensor or array, as the samples)
        self.rows = []        # out[0], out[1], ...: what the samples carry instead of their own arrays
        self.dead = False     # a sample did not fit: collation stacks the rows and the rest as usual


class RowWriter:
    """Default collation a sample at a time, so that a worker never holds a
    batch's worth of samples.

    take(sample) copies each array or tensor of the sample of at least
    MIN_BYTES (in a tuple / list / dict, the exact types, nested) into its
    row of a batch buffer taken from `pool` at the first sample
    (_C.batch_buffer: a BatchPool's buffer, the slot a process worker is
    filling, or fresh memory), and returns the sample with those rows in place of
    its own arrays; the sample's arrays are then free.  Collation, run under
    collate_into(..., rows=this writer), recognises a column whose rows are
    the batch's items, in order, and returns the buffer itself instead of
    stacking: the same values, dtype and shape as torch's stack.  A sample
    whose array does not match the first one's type, dtype or shape is left
    as it is, and that column is stacked as usual (with torch's checks and
    messages).  One difference from collation at the end: each sample's
    values are taken when it is returned, so a dataset that returns one
    array and overwrites it in place for the next sample gets each sample's
    own values, where a stack at the end would repeat the last one."""

    # Smaller fields are stacked at the end: writing a row costs ~4 us of
    # Python a sample (1-2% of a 32 KiB spectrogram's 0.3 ms), and a batch
    # of them is a few MiB, not worth that
    MIN_BYTES = 64 << 10

    def __init__(self, pool, nrows):
        self.pool = pool
        self.nrows = nrows
        self.buffers = []     # the batch buffers taken (CollateTarget keeps the page-locked ones)
        self.cols = {}        # field path -> _Column (None: not written by rows)
        self.i = 0
        self.off = False

    def take(self, sample):
        """`sample`, with its large arrays' values moved into their rows."""
        if self.off:
            return sample
        i = self.i
        if i >= self.nrows:
            self.off = True
            return sample
        self.i = i + 1
        out = self._swap(sample, (), i, 0)
        if i == 0 and not any(c is not None for c in self.cols.values()):
            self.off = True
        return out

    def written(self):
        """{id(first row): column} of the columns that hold rows."""
        return {id(c.rows[0]): c for c in self.cols.values() if c is not None and c.rows}

    def _swap(self, obj, path, i, depth):
        tp = type(obj)
        if tp is tuple or tp is list:
            if depth >= 4:
                return obj
            items = [self._swap(x, path + (k,), i, depth + 1) for k, x in enumerate(obj)]
            return tuple(items) if tp is tuple else items
        if tp is dict:
            if depth >= 4:
                return obj
            return {k: self._swap(v, path + (k,), i, depth + 1) for k, v in obj.items()}
        if tp is np.ndarray:
            kind = "n"
        elif torch is not None and tp is torch.Tensor:
            kind = "t"
        else:
            return obj
        if i == 0:
            col = self.cols[path] = self._column(obj, kind)
        else:
            col = self.cols.get(path)
        if col is None or col.dead:
            return obj
        if (kind != col.kind or obj.dtype != col.dtype or tuple(obj.shape) != col.shape or len(col.rows) != i
                or (kind == "t" and not _plain_tensor(obj))):
            col.dead = True
            return obj
        row = col.out[i]
        if kind == "t":
            row.copy_(obj)
        else:
            np.copyto(row, obj, casting="no")
        col.rows.append(row)
        return row

    def _column(self, obj, kind):
        """A column for `obj`'s field (None: left to collation)."""
        if kind == "t":
            if not _plain_tensor(obj):
                return None
            nbytes = obj.numel() * obj.element_size()
        else:
            if obj.dtype.hasobject or obj.dtype.kind in "SaUOVMm":
                return None
            nbytes = obj.nbytes
        if nbytes < self.MIN_BYTES:
            return None
        buf = _C.batch_buffer(nbytes * self.nrows, pool=self.pool)
        self.buffers.append(buf)
        shape = tuple(obj.shape)
        if kind == "t":
            out = torch.from_dlpack(buf).view(obj.dtype).view((self.nrows,) + shape)
        else:
            out = np.from_dlpack(buf).view(obj.dtype).reshape((self.nrows,) + shape)
            if not out.flags.writeable:  # NumPy < 2 reads DLPack as read-only: collation stacks this one
                return None
        return _Column(kind, obj.dtype, shape, out)


def _plain_tensor(t):
    return (t.device.type == "cpu" and t.layout == torch.strided and not t.requires_grad and not t.is_nested
            and not t.is_quantized and not t.is_conj() and not t.is_neg())


def _written_rows(batch):
    """The batch buffer when `batch` is exactly a RowWriter column's rows,
    in order (a view of its first len(batch) rows), else None."""
    target = getattr(_target, "t", None)
    if target is None or not target.rows:
        return None
    col = target.rows.get(id(batch[0]))
    if col is None or len(batch) != len(col.rows):
        return None
    for a, b in zip(batch, col.rows):
        if a is not b:
            return None
    return col.out[:len(batch)]


def _stack(batch):
    """_C.stack into this thread's collate target, if any (None: not stackable)."""
    target = getattr(_target, "t", None)
    if target is None:
        return _C.stack(batch)
    buf = _C.stack(batch, pool=target.pool)
    if buf is not None and buf.pinned:
        target.pinned.append(buf)
    return buf


# A tensor column (one field's batch) of fewer bytes than this is stacked by a
# plain torch.stack, not into an unpinned pool (_stack_tensors)
SMALL_COLUMN = 256 << 10

if torch is not None:

    def _fast_tensor_fn(batch, *, collate_fn_map=None):
        elem = batch[0]
        done = _written_rows(batch)
        if done is not None:
            return done
        if type(elem) is torch.Tensor and elem.layout == torch.strided and not elem.is_nested:
            out = _stack_tensors(batch)
            if out is not None:
                return out
        if elem.is_nested or elem.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_bsr,
                                              torch.sparse_csc, torch.sparse_bsc):
            # torch's own checks and messages
            return _torch_collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
        # torch.stack directly: torch's collate_tensor_fn would put the batch in
        # shared memory (/dev/shm) because get_worker_info() is set in our threads
        return torch.stack(batch, 0)

    def _stack_tensors(batch):
        """The batch's tensors stacked by torch.stack(out=) into this
        thread's collate target (a pool buffer; in a worker process its
        slot); None where no loader collates, where the column is under
        SMALL_COLUMN bytes, or where the tensors are not alike (another
        type, dtype, shape, device or layout, or autograd): the caller's
        plain torch.stack then, with torch's promotion and messages.

        torch.stack, not _C.stack: reading a tensor through __dlpack__ costs
        ~3.5 us of Python (torch/_tensor.py), 0.5 ms a batch of 64 samples
        with three 1 KiB fields, 13x torch's own collation; torch.stack
        copies in C++ with the GIL released, as _C.stack does.  A small
        column is left to the plain torch.stack (what torch's collation
        does at num_workers=0) unless the pool is page-locked (pin_memory:
        the pool spares pin_batch a copy): checking each item costs ~0.4 us,
        more than the pool saves there (a copy of a few KiB into a worker's
        slot, or nothing)."""
        target = getattr(_target, "t", None)
        if target is None:
            return None
        elem = batch[0]
        if not _plain_tensor(elem):
            return None
        nbytes = elem.numel() * elem.element_size() * len(batch)
        if nbytes < SMALL_COLUMN and getattr(target.pool, "pin_device", -1) < 0:
            return None
        dtype, shape, device, strided, tensor = elem.dtype, elem.shape, elem.device, torch.strided, torch.Tensor
        try:
            for t in batch:
                if (type(t) is not tensor or t.dtype != dtype or t.layout != strided or t.shape != shape
                        or t.device != device or t.requires_grad):
                    return None
        except RuntimeError:  # a nested tensor has no shape
            return None
        buf = _C.batch_buffer(nbytes, pool=target.pool)
        if buf.pinned:
            target.pinned.append(buf)
        out = torch.from_dlpack(buf).view(dtype).view((len(batch),) + tuple(shape))
        torch.stack(batch, 0, out=out)
        return out

    def _fast_numpy_fn(batch, *, collate_fn_map=None):
        elem = batch[0]
        done = _written_rows(batch)
        if done is not None:
            return torch.as_tensor(done)
        if elem.dtype.kind not in "SaUOV":
            buf = _stack(batch)
            if buf is not None:
                return torch.from_dlpack(buf)
        return _torch_collate.collate_numpy_array_fn(batch, collate_fn_map=collate_fn_map)

    _FAST_MAP = dict(_torch_collate.default_collate_fn_map)
    _FAST_MAP[torch.Tensor] = _fast_tensor_fn
    _FAST_MAP[np.ndarray] = _fast_numpy_fn

    def fast_default_collate(batch):
        """torch.utils.data.default_collate with arrays and tensors stacked in C without the GIL."""
        return _torch_collate.collate(batch, collate_fn_map=_FAST_MAP)

    DEFAULT_COLLATES = (_torch_collate.default_collate, _tud.default_collate)
else:

    def fast_default_collate(batch):
        """default_collate's rules, producing NumPy arrays (torch is not installed)."""
        elem = batch[0]
        if isinstance(elem, np.ndarray):
            if elem.dtype.kind in "SaUOV":
                raise TypeError(f"default_collate: batch must contain numbers, dicts or lists; found {elem.dtype}")
            done = _written_rows(batch)
            if done is not None:
                return done
            buf = _stack(batch)
            return np.from_dlpack(buf) if buf is not None else np.stack(batch)
        if isinstance(elem, np.generic):
            return np.array(batch)
        if isinstance(elem, bool):
            return np.array(batch, dtype=np.bool_)
        if isinstance(elem, int):
            return np.array(batch, dtype=np.int64)
        if isinstance(elem, float):
            return np.array(batch, dtype=np.float64)
        if isinstance(elem, (str, bytes)):
            return batch
        if isinstance(elem, collections.abc.Mapping):
            out = {key: fast_default_collate([d[key] for d in batch]) for key in elem}
            try:
                return type(elem)(out)
            except TypeError:
                return out
        if isinstance(elem, tuple) and hasattr(elem, "_fields"):
            return type(elem)(*(fast_default_collate(list(s)) for s in zip(*batch)))
        if isinstance(elem, collections.abc.Sequence):
            if any(len(e) != len(elem) for e in batch):
                raise RuntimeError("each element in list of batch should be of equal size")
            cols = [fast_default_collate(list(s)) for s in zip(*batch)]
            if isinstance(elem, tuple):
                return cols
            try:
                return type(elem)(cols)
            except TypeError:
                return cols
        raise TypeError(f"default_collate: batch must contain arrays, numbers, dicts or lists; found {type(elem)}")

    DEFAULT_COLLATES = ()


class DictCollate:
    """collate_fn=DictCollate("pixel_values", "labels"): the default
    collation, its fields named -- an (image, label) sample's batch becomes
    {"pixel_values": images, "labels": labels}, what a model called with
    keyword arguments (transformers' Trainer) takes.  fastloader.DataLoader
    treats it as the default collation (a native dataset stays on its batch
    path) and names the finished batch on the consumer thread; anywhere
    else it is a plain collate function."""

    __slots__ = ("keys",)

    def __init__(self, *keys):
        if not keys:
            raise ValueError("DictCollate needs the name of each field of a sample, e.g. "
                             "DictCollate('pixel_values', 'labels')")
        for k in keys:
            if not isinstance(k, str):
                raise TypeError(f"DictCollate: field names are strings, got {k!r}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"DictCollate: field names repeat: {keys!r}")
        self.keys = tuple(keys)

    def __call__(self, samples):
        return self.name(fast_default_collate(samples))

    def name(self, batch):
        """The collated batch (a tuple or list of fields) as a dict; raises
        ValueError when it has another number of fields."""
        if isinstance(batch, (tuple, list)) and len(batch) != len(self.keys):
            raise ValueError(f"{self!r} names {len(self.keys)} field(s), and the batch has {len(batch)}: give one "
                             "name for each field of the dataset's samples")
        if not isinstance(batch, (tuple, list)):
            raise ValueError(f"{self!r} names the fields of tuple samples, and the collated batch is a "
                             f"{type(batch).__name__}: samples that are dicts already carry their names (use the "
                             "default collate_fn)")
        return dict(zip(self.keys, batch))

    def __reduce__(self):
        return (type(self), self.keys)

    def __eq__(self, other):
        return type(other) is DictCollate and other.keys == self.keys

    def __hash__(self):
        return hash((DictCollate, self.keys))

    def __repr__(self):
        return f"DictCollate({', '.join(map(repr, self.keys))})"


_TRANSFORMERS_REMOVE = ("RemoveColumnsCollator", "transformers.trainer_utils")


def default_fields(collate_fn, tuple_samples):
    """How a loader collates with `collate_fn`: (True, None) for torch's
    default collation, (True, keys) for a DictCollate (the default, its
    fields named after), else (False, None).  transformers' Trainer wraps
    its collator in RemoveColumnsCollator, which drops the keys a model
    does not take from dict samples and passes any other sample as it is:
    around a DictCollate, over a dataset whose samples are tuples
    (`tuple_samples`: fastloader's image datasets), it changes nothing and
    is looked through."""
    if collate_fn in DEFAULT_COLLATES or collate_fn is fast_default_collate:
        return True, None
    if type(collate_fn) is DictCollate:
        return True, collate_fn.keys
    cls = type(collate_fn)
    call = cls.__dict__.get("__call__")
    if (tuple_samples and (cls.__name__, cls.__module__) == _TRANSFORMERS_REMOVE
            and getattr(call, "__qualname__", None) == "RemoveColumnsCollator.__call__"):
        inner = getattr(collate_fn, "data_collator", None)
        if type(inner) is DictCollate:
            return True, inner.keys
    return False, None


def batch_nbytes(batch):
    """Bytes of the arrays/tensors in a collated batch."""
    if hasattr(batch, "nbytes"):
        return int(batch.nbytes)
    if torch is not None and isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, collections.abc.Mapping):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v) for v in batch)
    return 0


def batch_len(batch):
    """Number of samples in a collated batch (first tensor/array/list found)."""
    for _ in range(8):
        if torch is not None and isinstance(batch, torch.Tensor) and batch.is_nested:
            return batch.size(0)   # a nested tensor has no .shape (it raises RuntimeError, not AttributeError)
        if hasattr(batch, "shape") and len(batch.shape):
            return int(batch.shape[0])
        if isinstance(batch, collections.abc.Mapping) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, (list, tuple)) and batch:
            first = batch[0]
            if (isinstance(first, (list, tuple, collections.abc.Mapping))
                    or (torch is not None and isinstance(first, torch.Tensor)) or hasattr(first, "shape")):
                batch = batch[0]
            else:
                return len(batch)
        else:
            return 1
    return 1
