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

__all__ = ["fast_default_collate", "DEFAULT_COLLATES", "batch_nbytes", "batch_len", "collate_into"]


class CollateTarget:
    """Where this thread's stacks go while a loader collates one batch: the
    pool, and the page-locked buffers written so far.  Holding them keeps
    their addresses unique until the worker has pinned the rest of the
    batch (see cuda_delivery.pin_batch)."""

    __slots__ = ("pool", "pinned")

    def __init__(self, pool):
        self.pool = pool
        self.pinned = []

    def pinned_ptrs(self):
        """Addresses of the page-locked buffers the batch was stacked into."""
        return frozenset(b.ptr for b in self.pinned)


_target = threading.local()


def collate_into(pool, collate_fn, data):
    """collate_fn(data) with fast_default_collate stacking into `pool` (a
    _C.BatchPool) on this thread.  Returns (batch, CollateTarget)."""
    target = CollateTarget(pool)
    prev = getattr(_target, "t", None)
    _target.t = target
    try:
        return collate_fn(data), target
    finally:
        _target.t = prev


def _stack(batch):
    """_C.stack into this thread's collate target, if any (None: not stackable)."""
    target = getattr(_target, "t", None)
    if target is None:
        return _C.stack(batch)
    buf = _C.stack(batch, pool=target.pool)
    if buf is not None and buf.pinned:
        target.pinned.append(buf)
    return buf


if torch is not None:

    def _fast_tensor_fn(batch, *, collate_fn_map=None):
        elem = batch[0]
        if type(elem) is torch.Tensor and elem.layout == torch.strided and not elem.is_nested:
            buf = _stack(batch)
            if buf is not None:
                return torch.from_dlpack(buf)
        if elem.is_nested or elem.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_bsr,
                                              torch.sparse_csc, torch.sparse_bsc):
            # torch's own checks and messages
            return _torch_collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
        # torch.stack directly: torch's collate_tensor_fn would put the batch in
        # shared memory (/dev/shm) because get_worker_info() is set in our threads
        return torch.stack(batch, 0)

    def _fast_numpy_fn(batch, *, collate_fn_map=None):
        elem = batch[0]
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
