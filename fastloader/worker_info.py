"""Worker info and reproducible per-sample randomness.

`get_worker_info()` inside a worker thread (torch's own function is patched
to ask here first, since our workers are threads of one process),
`sample_rng(index)` and `epoch_context()` for the (seed, epoch) of the
sample being loaded on this thread.
"""
from __future__ import annotations

import threading

import numpy as np

try:
    import torch
    from torch.utils.data import _utils as _tud_utils
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

__all__ = ["WorkerInfo", "get_worker_info", "sample_rng", "epoch_context"]

tls = threading.local()


class WorkerInfo:
    """What `get_worker_info()` returns inside a worker thread.

    Attributes match torch's WorkerInfo (id, num_workers, seed, dataset),
    plus `epoch` and `rng(index)`, a NumPy Generator keyed by
    (base seed, epoch, sample index): the same numbers for a sample whatever
    num_workers or thread scheduling is.
    """

    __slots__ = ("id", "num_workers", "seed", "dataset", "epoch", "base_seed", "worker_method")

    def __init__(self, id, num_workers, seed, dataset, epoch, base_seed):
        self.id = id
        self.num_workers = num_workers
        self.seed = seed
        self.dataset = dataset
        self.epoch = epoch
        self.base_seed = base_seed
        self.worker_method = "thread"

    def rng(self, index) -> np.random.Generator:
        return _make_rng(self.base_seed, self.epoch, index)

    def __repr__(self):
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed}, epoch={self.epoch})"


def _make_rng(base_seed, epoch, index):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([base_seed, epoch, int(index)])))


def get_worker_info():
    """Like torch.utils.data.get_worker_info(): a WorkerInfo in a worker thread, else None."""
    return getattr(tls, "info", None)


def sample_rng(index) -> np.random.Generator:
    """A NumPy Generator for this sample, keyed by (seed, epoch, index).

    Works in worker threads and, with num_workers=0, in the main thread while
    the loader calls the dataset.  Outside a loader it raises RuntimeError.
    """
    ctx = getattr(tls, "epoch_ctx", None)
    if ctx is None:
        raise RuntimeError("fastloader.sample_rng() is only available while a fastloader.DataLoader loads a sample")
    return _make_rng(ctx[0], ctx[1], index)


def _patched_get_worker_info():  # pragma: no cover - its code runs inside torch's module
    info = _fastloader_get_worker_info()  # noqa: F821  (a global of torch's worker module)
    if info is not None:
        return info
    return _worker_info  # noqa: F821


_patch_lock = threading.Lock()


def patch_torch_worker_info():
    """Make torch.utils.data.get_worker_info() see fastloader's worker threads.

    torch keeps worker info in a process global; our workers are threads of
    one process, so we give torch's function a body that asks our
    thread-local first.  Replacing __code__ (not the attribute) also covers
    `from torch.utils.data import get_worker_info` done before fastloader was
    imported.  In torch's own worker processes our thread-local is empty, so
    their behaviour is unchanged.
    """
    if torch is None:
        return
    with _patch_lock:
        mod = _tud_utils.worker
        fn = mod.get_worker_info
        if getattr(mod, "_fastloader_get_worker_info", None) is get_worker_info:
            return
        mod._fastloader_get_worker_info = get_worker_info
        fn.__code__ = _patched_get_worker_info.__code__


def epoch_context():
    """(base_seed, epoch, native_seed) while a fastloader.DataLoader loads a
    sample on this thread (a worker thread, or the main thread with
    num_workers=0); None elsewhere."""
    return getattr(tls, "epoch_ctx", None)
