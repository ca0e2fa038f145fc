"""Worker info and reproducible per-sample randomness.

`WorkerInfo` (torch's, subclassed when torch is installed) and
`get_worker_info()` inside a worker thread or process (torch's own function
is patched to ask here first, since our workers are threads of one
process), `sample_rng(index)` and `epoch_context()` for the (seed, epoch) of
the sample being loaded on this thread.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Optional

import numpy as np

try:
    import torch
    from torch.utils.data import _utils as _tud_utils
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

__all__ = ["WorkerInfo", "get_worker_info", "sample_rng", "epoch_context"]

tls = threading.local()
# a worker process's WorkerInfo, seen from any of its threads (as torch's
# process global is); None in the loader's process
_process_info = None

_TORCH_FIELDS = ("id", "num_workers", "seed", "dataset", "rng", "worker_method")


if torch is not None and dataclasses.is_dataclass(_tud_utils.worker.WorkerInfo) and tuple(
        f.name for f in dataclasses.fields(_tud_utils.worker.WorkerInfo))[:6] == _TORCH_FIELDS:
    _Base = _tud_utils.worker.WorkerInfo
else:  # no torch (or a torch whose WorkerInfo is not 2.x's dataclass): the same fields, our own class
    @dataclasses.dataclass(frozen=True, slots=True)
    class _Base:
        id: int
        num_workers: int
        seed: int
        dataset: Any
        rng: Any = None
        worker_method: Optional[str] = "multiprocessing"


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerInfo(_Base):
    """What `get_worker_info()` returns inside a worker thread or process.

    torch's WorkerInfo (a subclass of it when torch is installed): frozen,
    with id, num_workers, seed, dataset, rng (None) and worker_method
    ("thread" in worker threads, "multiprocessing" in worker processes), plus
    `epoch` and `base_seed`, and `sample_rng(index)`: a NumPy Generator keyed
    by (base seed, epoch, sample index), the same numbers for a sample
    whatever num_workers or thread scheduling is.  Attributes cannot be
    assigned (as torch's); fastloader makes a new one for each epoch.
    """

    epoch: int = 0
    base_seed: Optional[int] = None

    def sample_rng(self, index) -> np.random.Generator:
        return _make_rng(self.base_seed, self.epoch, index)


def _make_rng(base_seed, epoch, index):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([base_seed, epoch, int(index)])))


def get_worker_info():
    """Like torch.utils.data.get_worker_info(): a WorkerInfo in a worker
    thread or worker process, else None."""
    info = getattr(tls, "info", None)
    return info if info is not None else _process_info


def set_process_info(info):
    """A worker process: `info` is what get_worker_info() (ours and torch's)
    returns on any of its threads, as torch's process global is."""
    global _process_info
    _process_info = info
    tls.info = info
    if torch is not None:
        _tud_utils.worker._worker_info = info


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
