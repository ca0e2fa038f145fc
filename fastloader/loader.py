"""fastloader.DataLoader: torch's DataLoader API on a pool of C worker threads.

Data flow (docs/architecture.md has the whole map):

    consumer thread (this module)              worker threads (csrc/core/engine.c)
    ----------------------------------        ---------------------------------
    sampler -> index lists                     take a job: a native batch in C
    backend.submit(seq, indices)  -------->      (no GIL), or dataset[i] /
    engine.wait(seq) (GIL released,              __getitems__ / next(it) and
      wakes every 50 ms for Ctrl-C)  <--         collate with the GIL
    backend.finish -> memory budget -> device copy -> yield, in sampler order

This module keeps what every kind of dataset shares, once: the sampler
order, the prefetch window, timeouts, the memory budget, device delivery,
the num_workers="auto" controller (autotune.py), statistics (stats.py) and
shutdown.  What a job is and how its result becomes a batch is the
backend's (backends.py); the worker side of Python datasets is _worker.py.

Objects and references (no cycles, so iterators die by refcount and their
threads are joined on the consumer thread):
    DataLoader -> _Iter (persistent workers only) -> backend -> engine -> _WorkerHost
    _Iter -> Epoch;  jobs carry (Epoch, seq, indices)
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Generic, TypeVar

import numpy as np

from . import _C, sysinfo
from . import sampling
from . import state as _state
from ._worker import Epoch
from .backends import AGAIN, END, NativeBackend, NativeProcessBackend, ProcessBackend, PythonBackend
from .collate import DictCollate, batch_nbytes, default_fields, fast_default_collate
from .stats import GilMonitor, PerformanceWarning, iterator_stats
from .worker_info import WorkerInfo, epoch_context, get_worker_info, patch_torch_worker_info, sample_rng

try:  # torch is optional: without it the loader yields NumPy arrays
    import torch
    import torch.utils.data as _tud
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

_log = logging.getLogger("fastloader")

__all__ = ["DataLoader", "get_worker_info", "sample_rng", "WorkerInfo", "PerformanceWarning", "epoch_context",
           "fast_default_collate", "auto_worker_limit", "resolve_max_memory"]


# --------------------------------------------------------------------------
# settings resolved at construction

def auto_worker_limit():
    """Threads num_workers='auto' may use: the usable CPUs (affinity and
    cgroup quota), shared among the ranks on this node (LOCAL_WORLD_SIZE)."""
    usable = sysinfo.usable_cpus()
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, usable // ranks)


def resolve_max_memory(value):
    """max_memory argument -> bytes or None.  "auto": a quarter of the memory
    limit (cgroup or physical)."""
    if value is None:
        return None
    if value == "auto":
        _, total = sysinfo.memory_limits()
        return int(total // 4) if total else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"max_memory must be a positive number of bytes, 'auto' or None, got {value!r}")
    return value


def _native_dataset(ds):
    """Whether `ds` is a NativeImageDataset (datasets.py) whose samples are
    fastloader's own: a subclass that brings its own __getitem__ or
    __getitems__ is user code, which torch's DataLoader would call, so it
    runs as a Python dataset (the native batch path would skip it).  Reads
    the module without importing it where nothing has: no instance exists
    before it is imported (fastloader/__init__.py imports the datasets on
    first use)."""
    mod = sys.modules.get("fastloader.datasets")
    return mod is not None and isinstance(ds, mod.NativeImageDataset) and _own_samples(ds)


def _own_samples(ds):
    """Whether `ds`'s sample methods (__getitem__, __getitems__) are fastloader's own."""
    for name in ("__getitem__", "__getitems__"):
        fn = getattr(type(ds), name, None)
        if fn is not None and not getattr(fn, "__module__", "").startswith("fastloader."):
            return False
    return True


def _tuple_samples(ds):
    """Whether every sample of `ds` is a tuple: fastloader's own image and
    array datasets, their sample methods their own (what
    collate.default_fields may look through transformers'
    RemoveColumnsCollator for: it passes samples that are not dicts as they
    are)."""
    if _native_dataset(ds):
        return True
    mod = sys.modules.get("fastloader.arrays")
    return mod is not None and isinstance(ds, mod.ArrayDataset) and _own_samples(ds)


def _native_workers(loader):
    """Whether the loader's iterators run the native pipeline (C worker
    threads): a native image dataset with default collation."""
    ds = loader.dataset
    if not _native_dataset(ds) or not loader._auto_collation:
        return False
    if not default_fields(loader.collate_fn, True)[0]:   # the default collation, or a DictCollate
        return False
    return getattr(ds, "_fl_stream", False) or not loader._dataset_kind_iterable


def worker_processes(loader):
    """Whether the next iterator of `loader` runs its workers in processes
    (worker_mode="process", or "auto" for a Python dataset, worker_mode.py)
    rather than in threads (False also with num_workers=0)."""
    if not loader.num_workers:
        return False
    from . import worker_mode

    choose = worker_mode.choose_native_mode if _native_workers(loader) else worker_mode.choose_worker_mode
    return choose(loader)[0] == "process"


def _usable_cpus_as_torch():
    """The CPU count torch's check_worker_number_rationality compares with
    (the affinity mask where there is one), and whether it is the mask."""
    if torch is not None and hasattr(torch._utils, "cpu_count"):
        return torch._utils.cpu_count(), hasattr(os, "sched_getaffinity")
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)), True
    return os.cpu_count(), False


def warn_excess_workers(num_workers, kind, stacklevel=2):
    """torch's warning when num_workers is more than the CPUs this process
    may use, with the same text; `kind` is "processes" or "threads", what the
    workers are."""
    cpus, affinity = _usable_cpus_as_torch()
    if cpus is not None and num_workers <= cpus:
        return
    if cpus is None:
        suggested = "DataLoader is not able to compute a suggested max number of worker in current system."
    else:
        where = "" if affinity else " (`cpuset` is not taken into account)"
        suggested = (f"Our suggested max number of worker in current system is {cpus}{where}, which is smaller "
                     "than what this DataLoader is going to create.")
    warnings.warn(
        f"This DataLoader will create {num_workers} worker {kind} in total. {suggested} Please be aware that "
        "excessive worker creation might get DataLoader running slow or even freeze, lower the worker number to "
        "avoid potential slowness/freeze if necessary.", UserWarning, stacklevel=stacklevel + 1)


class _NoRange:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_RANGE = _NoRange()


def _profile_range(name):
    """torch.profiler.record_function(name) while a profiler runs, else nothing
    (so a trace shows the time the training loop waits for data)."""
    if torch is not None and torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(name)
    return _NO_RANGE


# --------------------------------------------------------------------------
# the iterator

_live_iters: "weakref.WeakSet[_Iter]" = weakref.WeakSet()


@atexit.register
def _shutdown_all():
    """Interpreter exit: stop every worker at its next sample and join it."""
    for it in list(_live_iters):
        try:
            it._shutdown(timeout=1.0)
        except Exception:  # pragma: no cover - best effort at exit
            pass


class _Iter:
    """Iterator over one epoch (or, with persistent workers, reset per epoch)."""

    def __init__(self, loader):
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._in_order = getattr(loader, "in_order", True)
        self._ep = None
        self._loader_ref = weakref.ref(loader)
        self._persistent = loader.persistent_workers
        self._pid = os.getpid()
        self._next_lock = threading.Lock()
        self._backend = self._make_backend(loader)
        self._reset(loader, first_iter=True)
        _live_iters.add(self)

    def _make_backend(self, loader):
        """Native image datasets with default collation: workers build whole
        batches in C without the GIL (csrc/native/native.c), on C threads, or
        in worker processes when the batches need Python per sample
        (worker_mode.choose_native_mode); anything else runs the dataset's
        Python in worker threads or processes (choose_worker_mode)."""
        self._convert = None
        collate_fn = loader.collate_fn
        stream = getattr(loader.dataset, "_fl_stream", False)   # fastloader.WebDataset
        default = default_fields(collate_fn, _tuple_samples(loader.dataset))[0]
        if stream and not (default and loader._auto_collation):
            raise ValueError("fastloader.WebDataset builds whole batches natively: use the default collate_fn and a "
                             "batch_size (per-sample Python belongs in transform / target_transform)")
        if _native_workers(loader):
            ds = loader.dataset
            if (loader._fl_device is not None and loader._fl_convert_on_device
                    and loader._fl_batch_stage is None):   # a batch stage mixes the finished floats
                wire, conv = getattr(loader, "_fl_wire", (None, None))
                if wire is None:
                    wire, conv = loader._fl_wire = loader.dataset._wire_variant()
                if wire is not None:  # uint8 over the wire, float on the device
                    ds, self._convert = wire, conv
            self._mode_why = None
            if self._num_workers:
                from .worker_mode import choose_native_mode

                mode, why = choose_native_mode(loader)
                self._mode_why = why
                self._say_mode(loader, mode, why)
                if mode == "process":   # a transform tail: whole batches in worker processes (backends.py)
                    return NativeProcessBackend(self._num_workers, ds, loader.worker_init_fn,
                                                loader.multiprocessing_context, self._nslots(loader))
            backend = NativeBackend(self._num_workers, ds)
            backend.batch_size = loader.batch_size
            return backend
        if (_native_dataset(loader.dataset) and not default and loader._auto_collation
                and not getattr(loader, "_fl_collate_warned", False)):
            loader._fl_collate_warned = True
            warnings.warn(
                f"fastloader: the custom collate_fn {getattr(collate_fn, '__qualname__', collate_fn)!r} takes "
                f"{type(loader.dataset).__name__} off its native batch path: each sample is loaded alone and "
                "collated in Python. For MixUp / CutMix pass them as batch_transform= (docs/recipes.md); other "
                "per-batch work can run on the batches the default collate_fn gives.", PerformanceWarning,
                stacklevel=4)
        self._mode_why = None
        if not self._num_workers:
            return PythonBackend(0, loader.dataset, loader.worker_init_fn)
        from .worker_mode import choose_worker_mode   # workers only: a loop without them never loads it

        mode, why = choose_worker_mode(loader)
        self._mode_why = why
        self._say_mode(loader, mode, why)
        if mode == "process":  # worker processes (backends.py, _procworkers.py)
            return ProcessBackend(self._num_workers, loader.dataset, loader.worker_init_fn,
                                  loader.multiprocessing_context, self._nslots(loader))
        return PythonBackend(self._num_workers, loader.dataset, loader.worker_init_fn)

    def _nslots(self, loader):
        return loader.prefetch_factor * self._num_workers + 2  # in flight + the batches the loop holds

    def _say_mode(self, loader, mode, why):
        """The choice and its reason, once per loader (again only if it
        changes): INFO for "auto"'s choice, a warning where an explicit
        worker_mode does not apply."""
        if getattr(loader, "_fl_mode_said", None) == mode:
            return
        if why.startswith("worker_mode='process' does not apply"):
            loader._fl_mode_said = mode
            warnings.warn(f"fastloader: {why}", UserWarning, stacklevel=5)
        elif loader.worker_mode == "auto":
            loader._fl_mode_said = mode
            _log.info("fastloader: %d worker %s: %s", self._num_workers,
                      "processes" if mode == "process" else "threads", why)

    @property
    def _engine(self):
        return self._backend.engine

    # -- setup ------------------------------------------------------------------
    def _reset(self, loader, first_iter=False):
        if self._pid != os.getpid():
            # a persistent iterator inherited by a forked child: the workers
            # are the parent's (the C engine leaks itself there); start anew
            self._backend.forget()
            self._pid = os.getpid()
            self._next_lock = threading.Lock()
        if self._ep is not None:
            self._ep.cancelled = True
        self._index_sampler = loader._index_sampler
        if getattr(loader.dataset, "_fl_stream", False):
            # batch k of a stream is positions [k*B, (k+1)*B) of the rank's stream
            from torch.utils.data import BatchSampler

            self._index_sampler = BatchSampler(range(len(loader.dataset)), loader.batch_size, loader.drop_last)
        # the epoch's position (state.py); a loaded state puts back the
        # generators and says whether this set-up draws a base seed
        self._st = _state.tracker(loader)
        draw, seed = self._st.begin(self, loader, first_iter)
        self._sampler_iter = sampling.batches(self._index_sampler)   # iter(), without torch's index list
        # Same draw, in the same order, as torch's _BaseDataLoaderIter (once per
        # iterator: a persistent iterator keeps its seed across epochs), so a
        # seeded generator gives the same shuffle and seeds as torch's loader.
        if draw:
            if torch is not None:
                self._base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
            else:
                gen = loader.generator if loader.generator is not None else np.random.default_rng()
                self._base_seed = int(gen.integers(0, 2**63 - 1))
        elif seed is not None:
            self._base_seed = seed
        self._num_yielded = 0
        # torch's NOTE [ IterableDataset and __len__ ]: the len(dataset) that
        # len(loader) saw, checked against the batches handed out (__next__)
        self._len_called = getattr(loader, "_IterableDataset_len_called", None)
        self._fetched = self._st.num_yielded or 0
        epoch = loader._fl_epochs
        loader._fl_epochs += 1
        pin = loader._fl_check_pin_memory()
        # the default collation (also a DictCollate's: its names are put on the finished batch, _deliver)
        default, keys = default_fields(loader.collate_fn, _tuple_samples(loader.dataset))
        collate_fn = fast_default_collate if default else loader.collate_fn
        self._namer = DictCollate(*keys) if keys else None
        self._ep = Epoch(
            dataset=loader.dataset, iterable=loader._dataset_kind_iterable, auto_collation=loader._auto_collation,
            batch_size=loader.batch_size, drop_last=loader.drop_last, collate_fn=collate_fn,
            base_seed=self._base_seed, epoch=epoch, num_workers=self._num_workers,
        )
        if loader._fl_seed is not None:
            self._ep.native_seed = loader._fl_seed
        self._st.attach(self, loader, self._ep)
        self._batch_stage = getattr(loader, "_fl_batch_stage", None)
        self._copier = None
        if loader._fl_device is not None:
            from .cuda_delivery import DeviceCopier

            self._copier = loader._fl_copier = getattr(loader, "_fl_copier", None) or DeviceCopier(loader._fl_device)
        self._send = 0            # jobs submitted
        self._rcvd = 0            # next seq to hand out (in order)
        self._done = 0            # jobs collected
        if self._st.num_yielded:  # a resumed epoch: its batches keep their numbers (a stream's positions)
            self._send = self._rcvd = self._done = self._st.num_yielded
        self._sampler_done = False
        self._finished = False
        self._t_start = time.perf_counter()
        self._wait_s = 0.0
        self._first_wait_s = None  # _wait_s when the first batch was handed out
        self._h2d_s = 0.0
        self._samples = 0
        self._tuner = None
        self._gil = None
        self._max_memory = getattr(loader, "_fl_max_memory", None)
        self._batch_bytes = None
        self._mem_checked = 0.0
        self._mem_warned = False
        self._pressure_warned = False
        self._pin_warned = False
        if self._num_workers:
            patch_torch_worker_info()
        # decode / collate straight into page-locked buffers when pinning is on
        dev = loader._fl_device.index if loader._fl_device is not None else (
            torch.cuda.current_device() if pin else -1)
        if self._backend.native:
            self._backend.start_epoch(self._ep, self._ep.native_seed, dev if pin else -1)
        else:
            self._ep.pin = pin  # what collation did not stack into the pool is pinned in the worker
            # Collation stacks into the loader's pool of batch buffers (page-
            # locked when pinning, which saves pin_memory's second copy): a
            # batch is written into memory already faulted in, where a fresh
            # tensor of a large batch is a new mmap every time (pages faulted
            # in and zeroed, then unmapped: 1.5x the throughput of a native
            # call in __getitem__ with 38 MB batches, benchmarks/RESULTS.md
            # §9).  pool.c keeps glibc's mmap threshold adapting as without
            # the pool, which a NumPy __getitem__'s temporaries depend on.
            self._ep.pool = loader._fl_batch_pool(dev if pin else -1)
            stats0 = self._backend.start_epoch(self._ep, self._base_seed)
            if self._num_workers:
                self._gil = GilMonitor(self._t_start, stats0, **self._backend.gil_watch())
        if self._num_workers == 0:
            return
        self._prefetch_factor = loader.prefetch_factor
        self._window = loader.prefetch_factor * self._num_workers
        # num_workers="auto" (not for iterable datasets: their jobs are pinned to every worker)
        if getattr(loader, "_fl_auto", False) and not self._ep.iterable:
            from .autotune import AutoTuner

            self._tuner = AutoTuner(self._num_workers, self._t_start,
                                    active=self._engine.set_active(self._num_workers))
        if isinstance(self._backend, PythonBackend):   # processes too: torch's choice of worker per job
            self._backend.in_order = self._in_order
            self._backend.max_tasks = self._window
            # num_workers="auto" on threads: a free thread takes the next batch
            self._backend.free_worker = self._tuner is not None and not isinstance(self._backend, ProcessBackend)
        self._top_up()

    def _next_indices(self):
        """The sampler's next item, or END (an iterable dataset's sampler
        yields None forever)."""
        try:
            return next(self._sampler_iter)
        except StopIteration:
            return END

    def _top_up(self):
        while not self._sampler_done and self._send - self._done < self._window:
            if not self._backend.submit(self._send, self._next_indices):
                self._sampler_done = True
                break
            self._send += 1

    def _autotune(self):
        tuner = self._tuner
        now = time.perf_counter()
        if not tuner.due(now):
            return
        n = tuner.observe(now, self._wait_s, [w["busy_s"] for w in self._engine.worker_stats()])
        if n is not None:
            tuner.applied(now, self._engine.set_active(n))

    # -- iteration ----------------------------------------------------------------
    def __iter__(self):
        return self

    def __len__(self):
        return len(self._index_sampler)

    def __next__(self):
        if self._pid != os.getpid():
            raise RuntimeError(
                f"this DataLoader iterator was created in process {self._pid} and is used in process "
                f"{os.getpid()}, a child forked from it; its worker threads exist only in the parent. "
                "Create a new iterator in the child (for batch in loader: ...).")
        if not self._next_lock.acquire(blocking=False):
            raise RuntimeError(
                "this DataLoader iterator is already in next() on another thread: one iterator cannot be "
                "shared by threads (as with torch's DataLoader). Give each thread its own iterator "
                "(iter(loader)), or hold a lock around next().")
        try:
            batch = self._next_locked()
        finally:
            self._next_lock.release()
        if self._len_called is not None and self._ep.iterable:
            self._fetched += 1
            if self._fetched > self._len_called:
                self._warn_len_exceeded()
        return batch

    def _warn_len_exceeded(self):
        """torch's warning, at each batch beyond the length len(loader) was
        given (as torch, the count of batches against len(dataset))."""
        loader = self._loader_ref()
        ds = loader.dataset if loader is not None else self._ep.dataset
        msg = (f"Length of IterableDataset {ds} was reported to be {self._len_called}"
               f"(when accessing len(dataloader)), but {self._fetched} samples have been fetched. ")
        if self._num_workers > 0:
            msg += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                    "IterableDataset replica at each worker. Please see "
                    "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")
        warnings.warn(msg, UserWarning, stacklevel=3)

    def _next_locked(self):
        if self._finished:
            raise StopIteration
        try:
            if self._num_workers == 0:
                return self._next_inline()
            return self._next_threaded()
        except StopIteration:
            self._finish_epoch()
            raise
        except KeyboardInterrupt:
            # stop at once: workers stop at their next sample; they are
            # joined when the iterator goes away, not here, so Ctrl-C never
            # waits for a slow __getitem__
            self._save_stats()
            self._finished = True
            self._ep.cancelled = True
            eng = self._engine
            if eng is not None and not eng.closed:
                eng.reset()
            raise

    def _next_inline(self):
        # num_workers=0: the consumer loads the batch itself, so all of it
        # counts as time the training loop waits for data
        t0 = time.perf_counter()
        seq = self._send
        self._send += 1
        try:
            with _profile_range("fastloader: load batch (num_workers=0)"):
                batch = self._backend.load_inline(seq, self._next_indices)
        except StopIteration:
            raise
        except Exception:
            self._yielded(seq)  # a failed batch counts as handed out, as with workers
            raise
        finally:
            self._wait_s += time.perf_counter() - t0
        self._yielded(seq)
        self._samples += self._backend.count(batch)
        return self._deliver(batch, seq)

    def _next_threaded(self):
        while True:
            eng = self._engine
            if eng is None:  # shut down from another thread (interpreter exit)
                raise RuntimeError("the DataLoader's workers were shut down while this iterator was in use")
            self._top_up()
            if self._done >= self._send:
                raise StopIteration
            t0 = time.perf_counter()
            with _profile_range("fastloader: wait for batch"):
                r = eng.wait(self._rcvd if self._in_order else -1, self._timeout if self._timeout > 0 else None)
            self._wait_s += time.perf_counter() - t0
            if r is None:
                raise RuntimeError(
                    f"DataLoader timed out after {self._timeout} seconds waiting for batch {self._rcvd} "
                    f"(timeout={self._timeout})")
            seq, wid, result = r
            self._done += 1
            if self._in_order:
                self._rcvd += 1
            if self._tuner is not None:
                self._autotune()
            try:
                batch = self._backend.finish(seq, wid, result)
            except Exception:
                self._yielded(seq)
                self._watch_gil()
                raise
            if batch is AGAIN:
                self._st.again(self, self._ep, seq, wid)
                continue
            self._yielded(seq)
            self._watch_gil()
            self._samples += self._backend.count(batch)
            self._account_memory(batch)
            return self._deliver(batch, seq)

    def _yielded(self, seq):
        """Batch `seq` reached the training loop (or raised there): consumed."""
        self._num_yielded += 1
        if self._first_wait_s is None:
            self._first_wait_s = self._wait_s
        self._st.yielded(self, self._ep, seq)

    def _watch_gil(self):
        gil = self._gil
        if gil is not None and not gil.checked:
            gil.maybe_warn(self._wait_s, self._engine, self._loader_ref(), self._num_workers)

    def _deliver(self, batch, seq):
        """Hand a finished host batch (number seq of the epoch) to the
        consumer: through the loader's batch_transform, then copied to the
        GPU when the loader has a device, then its fields named (DictCollate)."""
        stage = self._batch_stage
        if stage is not None:
            with _profile_range("fastloader: batch_transform"):
                batch = stage(batch, self._ep.native_seed, self._ep.epoch, seq)
        if self._copier is None:
            return batch if self._namer is None else self._namer.name(batch)
        with _profile_range("fastloader: host-to-device copy"):
            t0 = time.perf_counter()
            out = self._copier.to_device(batch)
            if self._convert is not None:
                with torch.cuda.stream(torch.cuda.current_stream(self._copier.device)):
                    out = (self._convert(out[0]),) + tuple(out[1:])
            self._h2d_s += time.perf_counter() - t0
        return out if self._namer is None else self._namer.name(out)

    # -- memory budget (max_memory) ---------------------------------------------------------
    # Batches in flight cost batch_bytes each.  With a budget the prefetch
    # window is cut to what fits; when the machine itself runs short of memory
    # (MemAvailable or the cgroup limit), it shrinks to one batch instead of
    # letting the process be killed.  Both are rechecked every second.
    def _account_memory(self, batch):
        if self._batch_bytes is None:
            self._batch_bytes = batch_nbytes(batch)
        now = time.perf_counter()
        if now - self._mem_checked < 1.0 and self._mem_checked:
            return
        self._mem_checked = now
        window = self._prefetch_factor * self._num_workers
        if self._max_memory and self._batch_bytes:
            window = min(window, max(1, self._max_memory // self._batch_bytes))
            # buffers out of the pool beyond the largest prefetch window and
            # the two batches a loop holds (the current one and, while
            # next() runs, the previous) are batches the loop keeps alive
            out = self._backend.pool_bytes_out()
            kept = out - (self._prefetch_factor * self._num_workers + 2) * self._batch_bytes
            if out > self._max_memory and kept > 0 and not self._mem_warned:
                self._mem_warned = True
                warnings.warn(
                    f"fastloader: batch buffers use {out >> 20} MiB, over max_memory={self._max_memory >> 20} MiB: "
                    "the training loop is keeping batches alive (a list of outputs?). Nothing is freed until "
                    "it drops them.", PerformanceWarning, stacklevel=5)
        if not self._pin_warned:
            err = self._backend.pin_error()
            if err:
                self._pin_warned = True
                warnings.warn(f"fastloader: page-locked memory could not be allocated ({err}); batch buffers "
                              "use ordinary memory from now on, so host-to-device copies are not asynchronous",
                              PerformanceWarning, stacklevel=5)
        if sysinfo.memory_pressure():
            window = 1
            if not self._pressure_warned:
                self._pressure_warned = True
                warnings.warn("fastloader: the machine is short of memory; prefetching only one batch ahead "
                              "until it recovers", PerformanceWarning, stacklevel=5)
        self._window = window

    # -- statistics and shutdown ----------------------------------------------------------
    def stats(self):
        """A snapshot of this epoch's counters (see DataLoader.stats)."""
        return iterator_stats(self)

    def _save_stats(self):
        loader = self._loader_ref()
        if loader is not None and self._ep is not None:
            try:
                loader._fl_last_stats = self.stats()
            except Exception:  # pragma: no cover - statistics never break iteration
                pass

    def _finish_epoch(self):
        self._save_stats()
        self._st.finished_epoch(self)
        self._finished = True
        if self._ep is not None:
            self._ep.cancelled = True
        if not self._persistent:
            self._backend.close()

    def _shutdown(self, timeout=5.0):
        """Stop the workers at their next sample and join them; a worker still
        inside a dataset call after `timeout` s finishes it on its own."""
        if getattr(self, "_pid", os.getpid()) != os.getpid():
            # a forked child's copy: the workers are the parent's; dropping
            # the engine leaks it (fl_engine_free_timed touches nothing here)
            self._finished = True
            self._backend.forget()
            return
        if not self._finished:
            self._save_stats()
        self._finished = True
        if self._ep is not None:
            self._ep.cancelled = True
        self._backend.close(timeout)

    def __del__(self):
        try:
            self._shutdown()
        except Exception:  # pragma: no cover
            pass


# --------------------------------------------------------------------------
# DataLoader

if torch is not None:
    _Base = _tud.DataLoader
else:
    from ._nptorch import NumpyDataLoaderBase as _Base

# torch's DataLoader is Generic[T_co], so scripts annotate DataLoader[Batch];
# a subclass stays subscriptable only if it names the parameter again
_T_co = TypeVar("_T_co", covariant=True)


class DataLoader(_Base, Generic[_T_co]):
    """Drop-in replacement for torch.utils.data.DataLoader, with worker threads.

    Same signature, defaults, attributes and validation as torch's, plus
    `seed=`: the seed of the native pipeline's augmentation (by default drawn
    from `generator` each epoch, as torch draws its base seed);
    `num_workers="auto"`; `max_memory=` (bytes or "auto"), a cap on the
    batches prefetched ahead of the training loop; and `device="cuda[:N]"`:
    batches are copied to that GPU on the loader's own stream and arrive as
    CUDA tensors (`convert_on_device=True`: native datasets send uint8 and
    finish ToTensor/Normalize on the GPU, bit-identical); `batch_transform=`
    (MixUp / CutMix on each batch, docs/recipes.md).

    Where the workers run (`worker_mode`): fastloader's own datasets
    (ImageFolder, ImageList, WebDataset, LMDB, HF tables, ArrayDataset) build
    batches on C worker threads without the GIL, or, when their transform
    ends in Python, in worker processes (the C part, then the Python, whole
    batches in parallel).  Any other dataset runs, by
    default (`"auto"`), in worker processes with torch's semantics
    (per-worker seeds, a copy of the dataset per worker,
    `multiprocessing_context`), its batches written into shared memory
    rather than pickled.  `worker_mode="thread"` runs it on threads of this
    process instead (nothing copied, one GIL; right for a dataset whose work
    releases the GIL); `"process"` forces processes.  The choice and its
    reason are in stats()["worker_mode"] / ["worker_mode_why"] and logged
    once (logger "fastloader", INFO).  docs/process-workers.md has the
    trade-off, docs/migrating.md what differs from torch.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="", in_order=True,
                 seed=None, max_memory=None, device=None, convert_on_device=False, worker_mode="auto",
                 batch_transform=None):
        if worker_mode not in ("thread", "process", "auto"):
            raise ValueError(f"worker_mode must be 'thread', 'process' or 'auto', got {worker_mode!r}")
        self.worker_mode = worker_mode
        if multiprocessing_context is not None and worker_mode == "thread":
            warnings.warn(
                "fastloader.DataLoader ignores multiprocessing_context with worker_mode='thread': its workers "
                "are threads of this process, so there is no start method to choose.", UserWarning, stacklevel=2)
        auto = isinstance(num_workers, str)
        if auto:
            if num_workers != "auto":
                raise ValueError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}")
            num_workers = auto_worker_limit()
        self._fl_auto = auto  # before torch's __init__, which calls check_worker_number_rationality
        kwargs = dict(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                      pin_memory_device=pin_memory_device, in_order=in_order)
        super().__init__(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
                         pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context,
                         generator, **kwargs)
        if self.prefetch_factor is None and self.num_workers > 0:  # torch sets 2 itself; keep it explicit
            self.prefetch_factor = 2
        if self.num_workers > 0 and self.prefetch_factor < 1:
            # torch accepts 0 here and fails when its workers start; 0 would
            # otherwise mean no batch is ever requested: empty epochs
            raise ValueError(f"prefetch_factor must be >= 1 with num_workers > 0, got {self.prefetch_factor}")
        self._fl_auto = auto
        self._fl_max_memory = resolve_max_memory(max_memory)
        # device="cuda[:N]": batches arrive on the GPU, copied on the loader's
        # own stream; raises a clear error when CUDA is missing.  (torch's
        # pin_memory_device only says which device to pin for: batches stay
        # on the CPU, as with torch.)  cuda_delivery.py is imported only when
        # a device is named: a CPU loader never runs it.
        self._fl_device = None
        if device is not None and device != "":
            from .cuda_delivery import parse_device

            self._fl_device = parse_device(device)
        self._fl_convert_on_device = bool(convert_on_device)
        self._fl_seed = None if seed is None else int(seed)
        # fastloader's own arguments as public attributes too, as torch keeps
        # its own: code that rebuilds a loader from them (Lightning, adding a
        # DistributedSampler under DDP) then keeps them
        self.seed, self.max_memory, self.device, self.convert_on_device = (
            self._fl_seed, max_memory, self._fl_device, self._fl_convert_on_device)
        self._fl_epochs = 0
        # batch_transform: MixUp / CutMix (fastloader/batch.py), on each batch before it is yielded
        self.batch_transform = batch_transform
        self._fl_batch_stage = None
        if batch_transform is not None:
            from .batch import BatchStage

            self._fl_batch_stage = BatchStage(batch_transform)
            self._fl_batch_stage.check_loader(self)   # timm's Mixup and an odd batch size: said now
        self._fl_gil_warned = False
        self._fl_pin_warned = False

    @property
    def _dataset_kind_iterable(self):
        if torch is not None:
            return isinstance(self.dataset, _tud.IterableDataset)
        return self._is_iterable

    def _fl_check_pin_memory(self):
        """Whether batches go to page-locked memory (pin_memory or device=
        with a usable CUDA device); warns once, as torch does, when
        pin_memory is asked for without one."""
        want = bool(self.pin_memory) or self._fl_device is not None
        if not want:
            return False
        from .cuda_delivery import cuda_available

        if not cuda_available():
            if not self._fl_pin_warned:
                self._fl_pin_warned = True
                warnings.warn(
                    "'pin_memory' argument is set as true but no accelerator is found, then device pinned "
                    "memory won't be used.", UserWarning, stacklevel=4)
            return False
        return want

    def _fl_batch_pool(self, pin_device):
        """The buffers Python datasets' default collation stacks into
        (_C.BatchPool), page-locked for `pin_device` (-1: not).  Cached on
        the loader, as the native datasets' pool is on the dataset, so
        epochs reuse them; each buffer keeps its own pool alive, so batches
        may outlive the loader."""
        pool = getattr(self, "_fl_pool", None)
        if pool is None or self._fl_pool_pin != pin_device:
            self._fl_pool_pin = pin_device
            try:
                pool = _C.BatchPool(pin_device)
            except RuntimeError:
                # torch sees a GPU but fastloader cannot load the CUDA
                # runtime itself: the worker pins with torch's copy, as before
                pool = _C.BatchPool(-1)
            self._fl_pool = pool
        return pool

    def _get_iterator(self):
        if self.num_workers:
            self.check_worker_number_rationality()  # as torch's _get_iterator, before the workers start
        it = _Iter(self)
        self._fl_last_iter = weakref.ref(it)
        return it

    def stats(self) -> dict:
        """Counters of the current (or last) epoch, cheap to read at any time.

        Keys: epoch, num_workers, batches, samples, elapsed_s, consumer_wait_s,
        first_batch_wait_s (the part of consumer_wait_s spent on the first
        batch, which includes starting the workers),
        data_starved_fraction (share of wall time the training loop spent
        waiting in next(), the first batch included), batches_per_s, samples_per_s, queue_depth,
        workers (per-worker counters), worker_busy_fraction, path ("native":
        C workers; "batch": the dataset's batch hook, one call per batch,
        as ArrayDataset's gather in C; "python": __getitem__ + collate_fn),
        pipeline (the dataset's pipeline_description, if any); for native
        datasets stages_s (read/decode/transform seconds summed over
        workers; python_s too when a Python tail, target_transform or a
        Pillow fix-up ran on the workers), bytes_read, pool_bytes, skipped,
        replaced; for Python
        datasets stages_s (dataset/collate/pin seconds), pool_bytes (the
        buffers default collation stacks into) and, with workers,
        gil (see docs/process-workers.md, "The GIL trade-off"); with device=, device,
        h2d_enqueue_s, h2d_gpu_s (the copies' time on the GPU), h2d_bytes,
        h2d_copies_in_flight, device_pool_bytes, device_pool_buffers.
        Returns {} before the first epoch.
        """
        ref = getattr(self, "_fl_last_iter", None)
        it = ref() if ref is not None else None
        if it is not None and not it._finished:
            return it.stats()
        return dict(getattr(self, "_fl_last_stats", {}))

    def state_dict(self) -> dict:
        """The loader's position after the last batch the training loop
        received (batches prefetched but not received are not consumed), as
        torchdata's StatefulDataLoader.state_dict(): a small dict of plain
        types that survives torch.save and JSON.  Cheap enough for every step
        and safe while batches are in flight.  fastloader/state.py says what
        it holds; docs/resume.md what is exact."""
        return _state.tracker(self).state_dict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume from `state_dict` (from state_dict(), maybe of another
        process): the next iteration yields exactly the batches that would
        have come next, then the following epochs go on as an uninterrupted
        run's.  An empty dict does nothing (as with torchdata).

        A list of states (every rank's, as all_gather_object collects them)
        is fastloader.resume_state(list): with torch's DistributedSampler the
        state resumes on any number of ranks, num_workers, worker_mode and
        batch_size (docs/resume.md)."""
        if isinstance(state_dict, (list, tuple)):
            from .elastic import merge

            state_dict = merge(state_dict)
        _state.tracker(self).load(self, state_dict)

    def check_worker_number_rationality(self):
        """torch's warning when num_workers is more than the usable CPUs,
        given where torch gives it (at construction, and as each iterator
        with workers starts), naming what the workers will be: "worker
        processes" or "worker threads".  num_workers="auto" stays within the
        CPUs, so it never warns."""
        if not self.num_workers or getattr(self, "_fl_auto", False):
            return
        warn_excess_workers(self.num_workers, "processes" if worker_processes(self) else "threads", stacklevel=2)
