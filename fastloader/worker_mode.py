"""Where a loader's workers run, "thread" or "process" and the reason,
decided once per iterator (loader.py _Iter._make_backend picks the backend
from it):

  choose_worker_mode(loader)   a Python dataset (PythonBackend or
                               ProcessBackend; state.py asks whether
                               per-worker dataset states are kept)
  choose_native_mode(loader)   a native dataset on its batch path
                               (NativeBackend's C threads, or
                               NativeProcessBackend when its batches need
                               Python that would otherwise run one batch at
                               a time)"""
from __future__ import annotations

try:
    import torch
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

__all__ = ["choose_worker_mode", "choose_native_mode", "threads_suit"]


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


def choose_native_mode(loader):
    """("thread" | "process", why) for a native dataset whose batches the
    native pipeline builds (fastloader.ImageFolder and the other
    NativeImageDatasets with default collation).

    Batches with no Python per sample stay on C threads, whatever is asked:
    their work is C without the GIL.  Python per sample (a transform tail, a
    target_transform) on the C threads runs one batch at a time, in batch
    order, with the GIL (csrc/native/native_engine.h), so that its draws
    from torch's generator are num_workers=0's; in worker processes each
    batch runs whole in one process (the C part, then the Python), batches
    in parallel, the draws seeded per worker as torch seeds them.  "auto"
    takes processes for a transform tail: on threads the tail never gets
    more than one core, whatever the machine has, and it gives torch's
    per-worker draws.  On 2 busy cores, where threads fill both already (the
    tail on one, the C part on the other), processes measured 0.96-1.11x
    threads on two user-tail recipes at 1, 2 and 4 workers, and 1.4-2.1x
    torch's DataLoader (docs/process-workers.md).  A target_transform alone
    (a label mapping: microseconds) stays on threads, which measured
    1.16-1.27x processes at 1 and 2 workers (no copy of each batch between
    processes), level at 4.  A shard stream (WebDataset) is read by a
    reader thread of this process, so its batches stay on threads."""
    ds = loader.dataset
    mode = getattr(loader, "worker_mode", "auto")
    name = type(ds).__name__
    rest = getattr(ds, "_rest", None)
    if rest is None and getattr(ds, "target_transform", None) is None:
        why = (f"{name}'s batches are made in C without the GIL and need no Python per sample, so worker "
               "threads build them in parallel with nothing copied")
        return "thread", (f"worker_mode='process' does not apply: {why}" if mode == "process" else why)
    python = f"the transform's Python part ({rest!r})" if rest is not None else "target_transform"
    if getattr(ds, "_fl_stream", False):
        why = (f"{name} reads its shard stream on a reader thread of this process, so its batches are built on "
               f"worker threads, and {python} runs there one batch at a time, in batch order")
        return "thread", (f"worker_mode='process' does not apply: {why}" if mode == "process" else why)
    if mode == "thread":
        return "thread", (f"worker_mode='thread' was asked for: {python} runs on the C worker threads after the "
                          "native part, one batch at a time in batch order, with the GIL")
    if mode == "process":
        return "process", (f"worker_mode='process' was asked for: each worker process builds whole batches, the "
                           f"native part and then {python}, batches in parallel")
    if rest is not None:
        return "process", (f"{name}'s transform ends in Python ({rest!r}): worker processes run the native part "
                           "and that Python for whole batches in parallel, its draws from torch's generator seeded "
                           "per worker as torch's DataLoader seeds them (on worker threads it would run one batch "
                           "at a time, with the GIL); pass worker_mode='thread' for num_workers=0's draws at any "
                           "num_workers")
    return "thread", (f"{name}'s only Python is target_transform, which costs microseconds per label: worker "
                      "threads build the batches in C and run it after them, one batch at a time in batch order, "
                      "sparing each batch the copy into worker processes' shared memory")
