"""Where a Python dataset's workers run: `choose_worker_mode(loader)`
gives "thread" or "process" and the reason, once per iterator
(loader.py _Iter._make_backend picks PythonBackend or ProcessBackend from
it; state.py asks whether per-worker dataset states are kept).  Native
batches (NativeBackend) are always C threads and never come here."""
from __future__ import annotations

try:
    import torch
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

__all__ = ["choose_worker_mode", "threads_suit"]


def _own_code(ds, iterable):
    """A dataset of fastloader's own whose per-sample code is fastloader's:
    made for worker threads (no per-worker state, the work in C without
    the GIL).  A subclass that brings its own __getitem__ / __iter__ is
    user code again."""
    if not getattr(type(ds), "_fl_thread_safe", False):
        return False
    names = ("__iter__",) if iterable else ("__getitem__", "__getitems__")
    for name in names:
        fn = getattr(type(ds), name, None)
        if fn is not None and not getattr(fn, "__module__", "").startswith("fastloader."):
            return False
    return True


def threads_suit(ds, iterable):
    """True when `ds` runs on worker threads as well as on processes:
    fastloader's own datasets, and torch's Subset / ConcatDataset of them."""
    if _own_code(ds, iterable):
        return True
    if torch is not None:
        from torch.utils.data import ConcatDataset, Subset

        if type(ds) is Subset:
            return threads_suit(ds.dataset, iterable)
        if type(ds) is ConcatDataset:
            return all(threads_suit(d, iterable) for d in ds.datasets)
    return False


def choose_worker_mode(loader):
    """("thread" | "process", why) for a loader's Python dataset.

    "thread" / "process" as asked.  "auto": threads for fastloader's own
    datasets (their work is C without the GIL, and they keep no per-worker
    state), processes for any other dataset, as torch's DataLoader runs it.
    A dataset written for torch's loader assumes processes: its Python may
    hold the GIL (on threads a pure-Python dataset ran at 0.84-0.91x torch,
    benchmarks/RESULTS.md section 18), it may keep per-worker state on
    self (a lazily opened file), and it draws from the global random /
    NumPy / torch generators that torch seeds per worker.  Processes give
    torch's semantics exactly; their speed is torch's within 10% (section
    18), batches written into shared memory rather than pickled."""
    mode = getattr(loader, "worker_mode", "auto")
    if mode != "auto":
        return mode, f"worker_mode={mode!r} was asked for"
    iterable = loader._dataset_kind_iterable
    name = type(loader.dataset).__name__
    if threads_suit(loader.dataset, iterable):
        return "thread", (f"{name} is one of fastloader's own datasets: its work runs in C without the GIL, "
                          "so worker threads load it in parallel with nothing copied")
    return "process", (f"{name} is a Python dataset: worker processes run it as torch's DataLoader does "
                       "(its own GIL, its own copy of the dataset and seeded generators per worker); "
                       "pass worker_mode='thread' for a dataset whose work releases the GIL")
