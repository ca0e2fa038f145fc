"""fastloader.DataLoader: torch's DataLoader API on a pool of C worker threads.

Data flow (see ../shared/ARCHITECTURE.md):

    consumer thread (this module)              worker threads (csrc/engine.c)
    ----------------------------------        ---------------------------------
    sampler -> index lists                     take a job, GIL only for Python:
    Engine.submit(seq, (epoch, seq, idx)) -->    dataset[i] / __getitems__ / next(it)
    Engine.wait(seq) (GIL released,             collate (_C.stack copies without
      wakes every 50 ms for Ctrl-C)  <--         the GIL), result -> done list
    yield batches in sampler order

Nothing here runs per sample on the consumer side.  Worker threads share one
dataset object (no pickling, no copies) and hold the GIL only inside
`_WorkerHost.fetch`.

Objects and references (no cycles, so iterators die by refcount and their
threads are joined on the consumer thread):
    DataLoader -> _Iter (persistent workers only) -> Engine -> _WorkerHost
    _Iter -> _Epoch;  jobs carry (_Epoch, seq, indices)
"""
from __future__ import annotations

import atexit
import collections.abc
import itertools
import os
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from . import _C
from .datasets import NativeImageDataset

try:  # torch is optional: without it the loader yields NumPy arrays
    import torch
    import torch.utils.data as _tud
    from torch.utils.data import _utils as _tud_utils
    from torch.utils.data._utils import collate as _torch_collate
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

__all__ = ["DataLoader", "get_worker_info", "sample_rng", "WorkerInfo", "PerformanceWarning"]


class PerformanceWarning(UserWarning):
    """Loading is slower than it could be, and the message says why and what to do."""


# --------------------------------------------------------------------------
# worker info and reproducible per-sample randomness

_tls = threading.local()


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
    return getattr(_tls, "info", None)


def sample_rng(index) -> np.random.Generator:
    """A NumPy Generator for this sample, keyed by (seed, epoch, index).

    Works in worker threads and, with num_workers=0, in the main thread while
    the loader calls the dataset.  Outside a loader it raises RuntimeError.
    """
    ctx = getattr(_tls, "epoch_ctx", None)
    if ctx is None:
        raise RuntimeError("fastloader.sample_rng() is only available while a fastloader.DataLoader loads a sample")
    return _make_rng(ctx[0], ctx[1], index)


def _patched_get_worker_info():  # pragma: no cover - its code runs inside torch's module
    info = _fastloader_get_worker_info()  # noqa: F821  (a global of torch's worker module)
    if info is not None:
        return info
    return _worker_info  # noqa: F821


_patch_lock = threading.Lock()


def _patch_torch_worker_info():
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


# --------------------------------------------------------------------------
# collation

def _annotate(exc, where):
    note = f"fastloader: raised while loading {where}"
    if sys.version_info >= (3, 11):
        if note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        return exc
    try:  # Python 3.10: chain a copy that carries the note
        new = type(exc)(f"{exc} ({note})")
    except Exception:
        new = RuntimeError(note)
    new.__cause__ = exc
    return new


if torch is not None:

    def _fast_tensor_fn(batch, *, collate_fn_map=None):
        elem = batch[0]
        if type(elem) is torch.Tensor and elem.layout == torch.strided and not elem.is_nested:
            buf = _C.stack(batch)
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
            buf = _C.stack(batch)
            if buf is not None:
                return torch.from_dlpack(buf)
        return _torch_collate.collate_numpy_array_fn(batch, collate_fn_map=collate_fn_map)

    _FAST_MAP = dict(_torch_collate.default_collate_fn_map)
    _FAST_MAP[torch.Tensor] = _fast_tensor_fn
    _FAST_MAP[np.ndarray] = _fast_numpy_fn

    def fast_default_collate(batch):
        """torch.utils.data.default_collate with arrays and tensors stacked in C without the GIL."""
        return _torch_collate.collate(batch, collate_fn_map=_FAST_MAP)

    _DEFAULT_COLLATES = (_torch_collate.default_collate, _tud.default_collate)
else:

    def fast_default_collate(batch):
        """default_collate's rules, producing NumPy arrays (torch is not installed)."""
        elem = batch[0]
        if isinstance(elem, np.ndarray):
            if elem.dtype.kind in "SaUOV":
                raise TypeError(f"default_collate: batch must contain numbers, dicts or lists; found {elem.dtype}")
            buf = _C.stack(batch)
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

    def _default_convert(data):
        return data

    _DEFAULT_COLLATES = ()


# --------------------------------------------------------------------------
# worker side

_OK, _ERR, _CANCELLED, _EXHAUSTED = 0, 1, 2, 3


class _Epoch:
    """Everything a worker needs for one pass over the data.  Holds no
    reference to the iterator or the engine."""

    def __init__(self, *, dataset, iterable, auto_collation, batch_size, drop_last, collate_fn,
                 base_seed, epoch, num_workers):
        self.dataset = dataset
        self.iterable = iterable
        self.auto_collation = auto_collation
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.base_seed = base_seed
        self.native_seed = base_seed  # the native pipeline's seed (the loader's seed= when given)
        self.epoch = epoch
        self.num_workers = num_workers
        self.cancelled = False
        self.pin = False      # page-lock batches in the worker (Python datasets)
        self.iters = {}       # worker id -> iterator over an IterableDataset
        self.ended = set()    # worker ids whose iterator is exhausted
        # seconds per worker (last slot: the main thread) in the dataset,
        # in collate_fn and in pinning; each thread writes only its own slot
        self.stage_s = [[0.0, 0.0, 0.0] for _ in range(num_workers + 1)]
        getitems = getattr(dataset, "__getitems__", None) if not iterable else None
        self.getitems = getitems if getitems else None


def _fetch(ep: _Epoch, wid, seq, indices):
    """Load and collate one batch.  Returns (status, value); never raises."""
    if wid >= 0:
        _tls.epoch_ctx = (ep.base_seed, ep.epoch, ep.native_seed)
        return _fetch_body(ep, wid, seq, indices)
    # the main thread (num_workers=0): the context holds only while the
    # loader calls the dataset, so sample_rng() and ImageFolder's
    # __getitem__ outside a loader do not see a stale one
    prev = getattr(_tls, "epoch_ctx", None)
    _tls.epoch_ctx = (ep.base_seed, ep.epoch, ep.native_seed)
    try:
        return _fetch_body(ep, wid, seq, indices)
    finally:
        _tls.epoch_ctx = prev


def epoch_context():
    """(base_seed, epoch, native_seed) while a fastloader.DataLoader loads a
    sample on this thread (a worker thread, or the main thread with
    num_workers=0); None elsewhere."""
    return getattr(_tls, "epoch_ctx", None)


def _fetch_body(ep: _Epoch, wid, seq, indices):
    where_worker = f"worker {wid}" if wid >= 0 else "the main thread (num_workers=0)"
    t0 = time.perf_counter()
    try:
        if ep.iterable:
            if wid in ep.ended:
                return (_EXHAUSTED, None)
            it = ep.iters.get(wid)
            if it is None:
                it = ep.iters[wid] = iter(ep.dataset)
            if ep.auto_collation:
                data = []
                for _ in range(ep.batch_size):
                    if ep.cancelled:
                        return (_CANCELLED, None)
                    try:
                        data.append(next(it))
                    except StopIteration:
                        ep.ended.add(wid)
                        break
                if not data or (ep.drop_last and len(data) < ep.batch_size):
                    return (_EXHAUSTED, None)
            else:
                try:
                    data = next(it)
                except StopIteration:
                    ep.ended.add(wid)
                    return (_EXHAUSTED, None)
        elif ep.auto_collation:
            if ep.getitems is not None:
                try:
                    data = ep.getitems(indices)
                except Exception as e:
                    return (_ERR, _annotate(e, f"batch {seq} (indices {_short(indices)}) via __getitems__ in {where_worker}"))
            else:
                data = []
                dataset = ep.dataset
                for idx in indices:
                    if ep.cancelled:
                        return (_CANCELLED, None)
                    try:
                        data.append(dataset[idx])
                    except Exception as e:
                        return (_ERR, _annotate(e, f"sample index {idx} (batch {seq}) in {where_worker}"))
        else:
            try:
                data = ep.dataset[indices]
            except Exception as e:
                return (_ERR, _annotate(e, f"sample index {indices} (batch {seq}) in {where_worker}"))
        t1 = time.perf_counter()
        try:
            batch = ep.collate_fn(data)
        except Exception as e:
            return (_ERR, _annotate(e, f"batch {seq} in collate_fn, {where_worker}"))
        t2 = time.perf_counter()
        if ep.pin:
            from .cuda_delivery import pin_batch

            batch = pin_batch(batch)  # torch's pin_memory copy, here in the worker thread
        slot = ep.stage_s[wid]  # wid -1 (main thread) is the last slot
        slot[0] += t1 - t0
        slot[1] += t2 - t1
        slot[2] += time.perf_counter() - t2
        return (_OK, batch)
    except Exception as e:
        return (_ERR, _annotate(e, f"batch {seq} in {where_worker}"))


def _short(indices):
    s = list(indices)
    return s if len(s) <= 8 else f"{s[:8]}..."


class _WorkerHost:
    """The engine's view of Python: init / fetch / finish, run on worker threads."""

    def __init__(self, num_workers, dataset, seed_base, epoch, worker_init_fn):
        self.num_workers = num_workers
        self.dataset = dataset
        self.seed_base = seed_base
        self.epoch = epoch
        self.worker_init_fn = worker_init_fn
        self.init_errors = {}

    def init(self, wid):
        _tls.info = WorkerInfo(wid, self.num_workers, self.seed_base + wid, self.dataset, self.epoch, self.seed_base)
        if self.worker_init_fn is not None:
            try:
                self.worker_init_fn(wid)
            except Exception as e:
                self.init_errors[wid] = _annotate(e, f"worker_init_fn({wid}) in worker {wid}")

    def fetch(self, wid, payload):
        ep, seq, indices = payload
        err = self.init_errors.get(wid)
        if err is not None:
            return (_ERR, err)
        info = _tls.info
        info.epoch = ep.epoch
        info.base_seed = ep.base_seed
        return _fetch(ep, wid, seq, indices)

    def finish(self, wid):
        for attr in ("info", "epoch_ctx"):
            if hasattr(_tls, attr):
                delattr(_tls, attr)


# --------------------------------------------------------------------------
# consumer side

_live_iters: "weakref.WeakSet[_Iter]" = weakref.WeakSet()


@atexit.register
def _shutdown_all():
    """Interpreter exit: stop every worker at its next sample and join it."""
    for it in list(_live_iters):
        try:
            it._shutdown(timeout=1.0)
        except Exception:  # pragma: no cover - best effort at exit
            pass


def _system_idle_s():
    """Seconds all CPUs of the machine have been idle (from /proc/stat), or None."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


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


def _batch_nbytes(batch):
    """Bytes of the arrays/tensors in a collated batch."""
    if hasattr(batch, "nbytes"):
        return int(batch.nbytes)
    if torch is not None and isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, collections.abc.Mapping):
        return sum(_batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(_batch_nbytes(v) for v in batch)
    return 0


def _memory_limits():
    """(available bytes, limit bytes): the tighter of the cgroup limit and MemAvailable."""
    from .doctor import _meminfo, memory_limit

    info = _meminfo()
    avail, total = info.get("MemAvailable"), info.get("MemTotal")
    limit, _ = memory_limit()
    if limit is not None:
        try:
            with open("/sys/fs/cgroup/memory.current") as f:
                used = int(f.read())
            avail = min(avail or limit, max(0, limit - used))
        except (OSError, ValueError):
            pass
        total = min(total or limit, limit)
    return avail, total


def _memory_pressure():
    """True when less than 5% of the memory limit is left."""
    avail, total = _memory_limits()
    return bool(avail is not None and total and avail < 0.05 * total)


def resolve_max_memory(value):
    """max_memory argument -> bytes or None.  "auto": a quarter of the memory
    limit (cgroup or physical)."""
    if value is None:
        return None
    if value == "auto":
        _, total = _memory_limits()
        return int(total // 4) if total else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"max_memory must be a positive number of bytes, 'auto' or None, got {value!r}")
    return value


def _batch_len(batch):
    """Number of samples in a collated batch (first tensor/array/list found)."""
    for _ in range(8):
        if hasattr(batch, "shape") and len(batch.shape):
            return int(batch.shape[0])
        if isinstance(batch, collections.abc.Mapping) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, (list, tuple)) and batch:
            if isinstance(batch[0], (list, tuple, collections.abc.Mapping)) or hasattr(batch[0], "shape"):
                batch = batch[0]
            else:
                return len(batch)
        else:
            return 1
    return 1


def auto_worker_limit():
    """Threads num_workers='auto' may use: the usable CPUs (affinity and
    cgroup quota), shared among the ranks on this node (LOCAL_WORLD_SIZE)."""
    from .doctor import check_cpus

    usable = check_cpus()["usable_cpus"]
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, usable // ranks)


def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def _worker_stats(eng):
    """Per-worker counters of `eng`, or [] when there is none or it was closed
    meanwhile (safe from any thread)."""
    if eng is None or eng.closed:
        return []
    try:
        return eng.worker_stats()
    except RuntimeError:  # closed between the check and the call
        return []


class _Iter:
    """Iterator over one epoch (or, with persistent workers, reset per epoch)."""

    def __init__(self, loader):
        self._num_workers = loader.num_workers
        self._dataset = loader.dataset
        self._timeout = loader.timeout
        self._in_order = getattr(loader, "in_order", True)
        self._engine = None
        self._host = None
        self._ep = None
        self._loader_ref = weakref.ref(loader)
        self._persistent = loader.persistent_workers
        self._pid = os.getpid()
        self._next_lock = threading.Lock()
        self._reset(loader, first_iter=True)
        _live_iters.add(self)

    # -- setup ------------------------------------------------------------------
    def _reset(self, loader, first_iter=False):
        if self._pid != os.getpid():
            # a persistent iterator inherited by a forked child: the workers
            # are the parent's (the C engine leaks itself there); start anew
            self._engine = None
            self._host = None
            self._pid = os.getpid()
            self._next_lock = threading.Lock()
        if self._ep is not None:
            self._ep.cancelled = True
        self._index_sampler = loader._index_sampler
        self._sampler_iter = iter(self._index_sampler)
        # Same draw, in the same order, as torch's _BaseDataLoaderIter (once per
        # iterator: a persistent iterator keeps its seed across epochs), so a
        # seeded generator gives the same shuffle and seeds as torch's loader.
        if first_iter:
            if torch is not None:
                self._base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
            else:
                gen = loader.generator if loader.generator is not None else np.random.default_rng()
                self._base_seed = int(gen.integers(0, 2**63 - 1))
        self._num_yielded = 0
        epoch = loader._fl_epochs
        loader._fl_epochs += 1
        pin = loader._fl_check_pin_memory()
        collate_fn = loader.collate_fn
        if collate_fn in _DEFAULT_COLLATES:
            collate_fn = fast_default_collate
        iterable = loader._dataset_kind_iterable
        self._ep = _Epoch(
            dataset=loader.dataset, iterable=iterable, auto_collation=loader._auto_collation,
            batch_size=loader.batch_size, drop_last=loader.drop_last, collate_fn=collate_fn,
            base_seed=self._base_seed, epoch=epoch, num_workers=self._num_workers,
        )
        self._ep.pin = pin
        if loader._fl_seed is not None:
            self._ep.native_seed = loader._fl_seed
        self._copier = None
        self._convert = None
        if loader._fl_device is not None:
            from .cuda_delivery import DeviceCopier

            self._copier = loader._fl_copier = getattr(loader, "_fl_copier", None) or DeviceCopier(loader._fl_device)
        self._send = 0            # jobs submitted
        self._rcvd = 0            # next seq to hand out (in order)
        self._done = 0            # jobs collected
        self._sampler_done = False
        self._finished = False
        self._t_start = time.perf_counter()
        self._wait_s = 0.0
        self._h2d_s = 0.0
        self._samples = 0
        self._auto = False
        self._max_memory = getattr(loader, "_fl_max_memory", None)
        self._batch_bytes = None
        self._mem_checked = 0.0
        self._mem_warned = False
        self._pressure_warned = False
        self._pin_warned = False
        self._gil_checked = False
        # Native image datasets with default collation: workers build whole
        # batches in C without the GIL (csrc/native.c).
        self._native = None
        if (isinstance(loader.dataset, NativeImageDataset) and collate_fn is fast_default_collate
                and loader._auto_collation and not iterable):
            self._native = loader.dataset
            self._convert = None
            if loader._fl_device is not None and loader._fl_convert_on_device:
                wire, conv = getattr(loader, "_fl_wire", (None, None))
                if wire is None:
                    wire, conv = loader._fl_wire = loader.dataset._wire_variant()
                if wire is not None:  # uint8 over the wire, float on the device
                    self._native, self._convert = wire, conv
            self._native_seed = loader._fl_seed if loader._fl_seed is not None else self._base_seed
            # decode straight into page-locked buffers when pinning is on
            dev = loader._fl_device.index if loader._fl_device is not None else (
                torch.cuda.current_device() if pin else -1)
            self._native._native.set_pinned(dev if pin else -1)
            self._ep.pin = False
        if self._num_workers == 0:
            return
        _patch_torch_worker_info()
        self._prefetch_factor = loader.prefetch_factor
        if self._native is not None:
            if self._engine is None or self._engine.closed:
                self._engine = _C.NativeEngine(self._num_workers, self._native._native)
            else:
                self._engine.reset()
            self._stats0 = None
            self._window = loader.prefetch_factor * self._num_workers
            self._auto_start(loader)
            self._top_up()
            return
        if self._engine is None or self._engine.closed:
            self._host = _WorkerHost(self._num_workers, loader.dataset, self._base_seed, epoch, loader.worker_init_fn)
            self._engine = _C.Engine(self._num_workers, self._host.fetch, self._host.init, self._host.finish)
        else:
            self._engine.reset()
        self._stats0 = self._engine.worker_stats()
        self._window = loader.prefetch_factor * self._num_workers
        if not iterable:  # iterable datasets pin jobs to every worker
            self._auto_start(loader)
        self._active = [True] * self._num_workers
        self._cycle = itertools.cycle(range(self._num_workers))
        self._top_up()

    # -- num_workers="auto" ---------------------------------------------------------
    # The engine starts `num_workers` threads (the usable CPUs); the
    # controller lets only some take jobs (the prefetch window stays sized for
    # all of them, so parking a thread never drains the queue).  It starts
    # with all of them, so the first batches come as fast as the machine
    # allows; it parks one while the others have 15% to spare and the
    # consumer has not waited for three windows -- which frees a core for a
    # training loop that needs the CPU -- and adds one back while the
    # consumer waits for data.
    _AUTO_WINDOW_S = 0.25

    def _auto_start(self, loader):
        self._auto = bool(getattr(loader, "_fl_auto", False))
        if not self._auto:
            return
        self._auto_n = self._engine.set_active(self._num_workers)
        self._auto_snap = None
        self._auto_calm = 0
        self._auto_hungry = 0
        self._auto_history = [(0.0, self._auto_n)]

    def _autotune(self):
        now = time.perf_counter()
        snap = self._auto_snap
        if snap is None or now - snap[0] >= self._AUTO_WINDOW_S:
            busy = [w["busy_s"] for w in self._engine.worker_stats()]
            self._auto_snap = (now, self._wait_s, busy)
            if snap is None:
                return
            wall = now - snap[0]
            wait_frac = (self._wait_s - snap[1]) / wall
            used = sum(b1 - b0 for b1, b0 in zip(busy, snap[2])) / wall  # worker-seconds per second
            n = self._auto_n
            if wait_frac > 0.05 and n < self._num_workers:
                # two windows in a row, so one late batch does not add a thread
                self._auto_hungry += 1
                self._auto_calm = 0
                if self._auto_hungry >= 2 or wait_frac > 0.3:
                    n += 1
                    self._auto_hungry = 0
            elif wait_frac < 0.01 and n > 1:
                self._auto_hungry = 0
                self._auto_calm += 1
                # n - 1 workers could carry the load with 15% to spare
                if self._auto_calm >= 3 and used < (n - 1) * 0.85:
                    n -= 1
                    self._auto_calm = 0
            else:
                self._auto_calm = 0
                self._auto_hungry = 0
            if n != self._auto_n:
                self._auto_n = self._engine.set_active(n)
                self._auto_history.append((round(now - self._t_start, 3), self._auto_n))

    def _next_worker(self):
        for _ in range(self._num_workers):
            w = next(self._cycle)
            if self._active[w]:
                return w
        return None

    def _top_up(self):
        ep = self._ep
        while not self._sampler_done and self._send - self._done < self._window:
            if self._native is not None:
                try:
                    indices = next(self._sampler_iter)
                except StopIteration:
                    self._sampler_done = True
                    break
                self._engine.submit(self._send, indices, ep.epoch, self._native_seed)
            elif ep.iterable:
                w = self._next_worker()
                if w is None:
                    self._sampler_done = True
                    break
                try:
                    indices = next(self._sampler_iter)
                except StopIteration:
                    self._sampler_done = True
                    break
                self._engine.submit(self._send, (ep, self._send, indices), w)
            else:
                try:
                    indices = next(self._sampler_iter)
                except StopIteration:
                    self._sampler_done = True
                    break
                self._engine.submit(self._send, (ep, self._send, indices))
            self._send += 1

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
            return self._next_locked()
        finally:
            self._next_lock.release()

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
            if self._engine is not None and not self._engine.closed:
                self._engine.reset()
            raise

    def _next_inline(self):
        # num_workers=0: the consumer loads the batch itself, so all of it
        # counts as time the training loop waits for data
        t0 = time.perf_counter()
        try:
            with _profile_range("fastloader: load batch (num_workers=0)"):
                batch = self._load_inline()
        finally:
            self._wait_s += time.perf_counter() - t0
        return self._deliver(batch)

    def _load_inline(self):
        ep = self._ep
        indices = next(self._sampler_iter)
        seq = self._send
        self._send += 1
        if self._native is not None:
            self._num_yielded += 1
            out = self._native.load_batch(indices, ep.epoch, self._native_seed, seq=seq)
            self._samples += len(out[1])
            return out
        status, value = _fetch(ep, -1, seq, indices)
        if status == _EXHAUSTED:
            raise StopIteration
        self._num_yielded += 1
        if status == _ERR:
            raise value
        self._samples += _batch_len(value)
        return value

    def _next_threaded(self):
        while True:
            if self._engine is None:  # shut down from another thread (interpreter exit)
                raise RuntimeError("the DataLoader's workers were shut down while this iterator was in use")
            self._top_up()
            if self._done >= self._send:
                raise StopIteration
            t0 = time.perf_counter()
            with _profile_range("fastloader: wait for batch"):
                r = self._engine.wait(self._rcvd if self._in_order else -1,
                                      self._timeout if self._timeout > 0 else None)
            self._wait_s += time.perf_counter() - t0
            if r is None:
                raise RuntimeError(
                    f"DataLoader timed out after {self._timeout} seconds waiting for batch {self._rcvd} "
                    f"(timeout={self._timeout})")
            seq, wid, result = r
            self._done += 1
            if self._in_order:
                self._rcvd += 1
            if self._auto:
                self._autotune()
            if self._native is not None:
                self._num_yielded += 1
                out = self._native._finish(result, self._ep.epoch, self._native_seed, seq)
                self._samples += len(out[1])
                self._account_memory(out)
                return self._deliver(out)
            status, value = result
            if status == _EXHAUSTED:
                self._active[wid] = False
                continue
            if status == _CANCELLED:  # pragma: no cover - only old generations are cancelled
                continue
            self._num_yielded += 1
            if not self._gil_checked and self._native is None:
                self._maybe_warn_gil()
            if status == _ERR:
                raise value
            self._samples += _batch_len(value)
            self._account_memory(value)
            return self._deliver(value)

    def _deliver(self, batch):
        """Hand a finished host batch to the consumer (copied to the GPU
        first when the loader has a device)."""
        if self._copier is None:
            return batch
        with _profile_range("fastloader: host-to-device copy"):
            t0 = time.perf_counter()
            out = self._copier.to_device(batch)
            if self._convert is not None:
                with torch.cuda.stream(torch.cuda.current_stream(self._copier.device)):
                    out = (self._convert(out[0]),) + tuple(out[1:])
            self._h2d_s += time.perf_counter() - t0
        return out

    # -- memory budget (max_memory) ---------------------------------------------------------
    # Batches in flight cost batch_bytes each.  With a budget the prefetch
    # window is cut to what fits; when the machine itself runs short of memory
    # (MemAvailable or the cgroup limit), it shrinks to one batch instead of
    # letting the process be killed.  Both are rechecked every second.
    def _account_memory(self, batch):
        if self._batch_bytes is None:
            self._batch_bytes = _batch_nbytes(batch)
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
            out = self._native._native.pool_bytes_out if self._native is not None else 0
            kept = out - (self._prefetch_factor * self._num_workers + 2) * self._batch_bytes
            if out > self._max_memory and kept > 0 and not self._mem_warned:
                self._mem_warned = True
                warnings.warn(
                    f"fastloader: batch buffers use {out >> 20} MiB, over max_memory={self._max_memory >> 20} MiB: "
                    "the training loop is keeping batches alive (a list of outputs?). Nothing is freed until "
                    "it drops them.", PerformanceWarning, stacklevel=4)
        if self._native is not None and not self._pin_warned:
            err = self._native._native.pin_error
            if err:
                self._pin_warned = True
                warnings.warn(f"fastloader: page-locked memory could not be allocated ({err}); batch buffers "
                              "use ordinary memory from now on, so host-to-device copies are not asynchronous",
                              PerformanceWarning, stacklevel=4)
        if _memory_pressure():
            window = 1
            if not self._pressure_warned:
                self._pressure_warned = True
                warnings.warn("fastloader: the machine is short of memory; prefetching only one batch ahead "
                              "until it recovers", PerformanceWarning, stacklevel=4)
        self._window = window

    # -- statistics ---------------------------------------------------------------------
    def stats(self):
        """A snapshot of this epoch's counters (see DataLoader.stats)."""
        wall = max(time.perf_counter() - self._t_start, 1e-9)
        out = {
            "epoch": self._ep.epoch,
            "num_workers": self._num_workers,
            "batches": self._num_yielded,
            "samples": self._samples,
            "elapsed_s": wall,
            "consumer_wait_s": self._wait_s,
            "data_starved_fraction": min(1.0, self._wait_s / wall),
            "batches_per_s": self._num_yielded / wall,
            "samples_per_s": self._samples / wall,
            "queue_depth": max(0, self._send - self._done) if self._num_workers else 0,
            "prefetch_window": self._window if self._num_workers else 0,
            "batch_bytes": self._batch_bytes,
            "max_memory": self._max_memory,
            "native": self._native is not None,
        }
        if self._copier is not None:
            out["device"] = str(self._copier.device)
            out["h2d_enqueue_s"] = self._h2d_s          # consumer time spent enqueueing copies
            out["h2d_copies_in_flight"] = self._copier.inflight()
            out["h2d_bytes"] = self._copier.bytes            # since the loader's first epoch
            out["h2d_gpu_s"] = self._copier.copy_gpu_s       # the finished copies' time on the GPU
            pool = self._copier.pool_stats()
            out["device_pool_bytes"] = pool["device_bytes"]
            out["device_pool_buffers"] = pool["buffers"]
        if self._auto:
            out["num_workers_auto"] = self._auto_n
            out["autotune_history"] = list(self._auto_history)  # (seconds into the epoch, workers)
        # The consumer may close the engine and set it to None at any moment
        # (stats() is called from other threads too): read it once, and take
        # a pool closed under us as one with no workers.
        eng = self._engine
        workers = _worker_stats(eng)
        out["workers"] = workers
        if workers:
            out["worker_busy_fraction"] = [min(1.0, w["busy_s"] / wall) for w in workers]
        if self._native is not None:
            stages = {k: sum(w.get(k, 0.0) for w in workers) for k in ("read_s", "decode_s", "transform_s")}
            out["stages_s"] = stages
            out["bytes_read"] = sum(w.get("bytes_read", 0) for w in workers)
            out["pool_bytes"] = self._native._native.pool_bytes
            out["skipped"] = list(self._native.skipped)
            out["replaced"] = list(self._native.replaced)
        else:
            st = self._ep.stage_s
            out["stages_s"] = {k: sum(w[i] for w in st) for i, k in enumerate(("dataset_s", "collate_s", "pin_s"))}
            if workers:
                out["gil"] = self.gil_report(engine=eng)
        return out

    # -- GIL-bound detection ---------------------------------------------------------
    # Every _GIL_WINDOW_S of loading, compare the window's counters.  The
    # direct signal is how long the consumer takes to re-acquire the GIL after
    # each (<= 50 ms) wait: about the interpreter's switch interval (5 ms)
    # when worker threads run pure Python non-stop, about zero when their
    # work releases the GIL (NumPy, torch, I/O, sleeping) -- whatever else
    # the machine is doing.  Warn when that holds while the consumer starves,
    # the workers are busy in Python and they get < 1.3 cores of CPU.
    _GIL_WINDOW_S = 0.3

    def _gil_snapshot(self, engine=None):
        eng = engine if engine is not None else self._engine
        return (time.perf_counter(), self._wait_s, eng.worker_stats(), _system_idle_s(),
                eng.consumer_gil_wait())

    def gil_report(self, since=None, engine=None):
        """How the workers spent their time since `since` (a snapshot) or the start of the epoch."""
        eng = engine if engine is not None else self._engine
        if eng is None or self._native is not None or eng.closed:
            return None
        try:
            t1, wait1, now, idle1, (g1, n1) = self._gil_snapshot(eng)
        except RuntimeError:  # closed by the consumer meanwhile
            return None
        if since is None:
            since = (self._t_start, 0.0, self._stats0 or [dict.fromkeys(now[0], 0)] * len(now), None, (0.0, 0))
        t0, wait0, base, idle0, (g0, n0) = since
        wall = max(t1 - t0, 1e-9)
        py_cpu = sum(n["python_cpu_s"] - b["python_cpu_s"] for n, b in zip(now, base))
        py_wall = sum(n["python_s"] - b["python_s"] for n, b in zip(now, base))
        idle = None if idle0 is None or idle1 is None else (idle1 - idle0) / wall
        return {
            "elapsed_s": wall,
            "consumer_wait_fraction": (wait1 - wait0) / wall,
            "workers": len(now),
            "python_cpu_cores": py_cpu / wall,       # cores kept busy by Python code in workers
            "worker_busy_fraction": py_wall / (wall * len(now)),
            "gil_reacquire_ms": 1000.0 * (g1 - g0) / max(1, n1 - n0),  # consumer's average
            "idle_cores": idle,                      # idle CPUs of the whole machine, if known
        }

    def _maybe_warn_gil(self):
        now = time.perf_counter()
        snap = getattr(self, "_gil_snap", None)
        if snap is None:
            if now - self._t_start >= 0.1:  # skip start-up
                self._gil_snap = self._gil_snapshot()
            return
        if now - snap[0] < self._GIL_WINDOW_S:
            return
        loader = self._loader_ref()
        if loader is None or loader._fl_gil_warned or self._num_workers < 2 or _usable_cpus() < 2:
            self._gil_checked = True
            return
        rep = self.gil_report(since=snap)
        self._gil_snap = self._gil_snapshot()
        if (rep["consumer_wait_fraction"] > 0.5 and rep["worker_busy_fraction"] > 0.8
                and rep["python_cpu_cores"] < 1.3
                and rep["gil_reacquire_ms"] > 300.0 * sys.getswitchinterval()):
            loader._fl_gil_warned = True
            self._gil_checked = True
            warnings.warn(
                f"fastloader: the dataset's Python code holds the GIL, so its {self._num_workers} worker threads "
                f"run it one at a time ({rep['python_cpu_cores']:.2f} CPU cores busy; taking the GIL took "
                f"{rep['gil_reacquire_ms']:.1f} ms; the training loop waited "
                f"{100 * rep['consumer_wait_fraction']:.0f}% of the time). Remedies: do the per-sample work in "
                "NumPy/torch/PIL calls that release the GIL, use fastloader.ImageFolder/ImageList (native, no "
                "Python per sample), or use torch.utils.data.DataLoader, whose worker processes each have their "
                "own GIL.", PerformanceWarning, stacklevel=4)

    # -- shutdown -----------------------------------------------------------------
    def _save_stats(self):
        loader = self._loader_ref()
        if loader is not None and self._ep is not None:
            try:
                loader._fl_last_stats = self.stats()
            except Exception:  # pragma: no cover - statistics never break iteration
                pass

    def _finish_epoch(self):
        self._save_stats()
        self._finished = True
        if self._ep is not None:
            self._ep.cancelled = True
        if not self._persistent:
            self._close_engine()

    def _close_engine(self, timeout=None):
        eng, self._engine = self._engine, None
        if eng is not None:
            eng.close(timeout) if isinstance(eng, _C.Engine) else eng.close()

    def _shutdown(self, timeout=5.0):
        """Stop the workers at their next sample and join them; a worker still
        inside a dataset call after `timeout` s finishes it on its own."""
        if getattr(self, "_pid", os.getpid()) != os.getpid():
            # a forked child's copy: the workers are the parent's; dropping
            # the engine leaks it (fl_engine_free_timed touches nothing here)
            self._finished = True
            self._engine = None
            return
        if not self._finished:
            self._save_stats()
        self._finished = True
        if self._ep is not None:
            self._ep.cancelled = True
        self._close_engine(timeout)

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


class DataLoader(_Base):
    """Drop-in replacement for torch.utils.data.DataLoader, with worker threads.

    Same signature, defaults, attributes and validation as torch's, plus
    `seed=`: the seed of the native pipeline's augmentation (by default drawn
    from `generator` each epoch, as torch draws its base seed);
    `num_workers="auto"`; `max_memory=` (bytes or "auto"), a cap on the
    batches prefetched ahead of the training loop; and `device="cuda[:N]"`:
    batches are copied to that GPU on the loader's own stream and arrive as
    CUDA tensors (`convert_on_device=True`: native datasets send uint8 and
    finish ToTensor/Normalize on the GPU, bit-identical).  Differences:
    workers are threads of this process (nothing is pickled or copied; the
    dataset object is shared), `multiprocessing_context` is accepted and
    ignored, and batches of arrays/tensors are stacked in C without the GIL.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="", in_order=True,
                 seed=None, max_memory=None, device=None, convert_on_device=False):
        if multiprocessing_context is not None:
            warnings.warn(
                "fastloader.DataLoader ignores multiprocessing_context: its workers are threads of this "
                "process, so there is no start method to choose.", UserWarning, stacklevel=2)
        auto = isinstance(num_workers, str)
        if auto:
            if num_workers != "auto":
                raise ValueError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}")
            num_workers = auto_worker_limit()
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
        from .cuda_delivery import parse_device

        # device="cuda[:N]": batches arrive on the GPU, copied on the loader's
        # own stream; raises a clear error when CUDA is missing.  (torch's
        # pin_memory_device only says which device to pin for: batches stay
        # on the CPU, as with torch.)
        self._fl_device = parse_device(device)
        self._fl_convert_on_device = bool(convert_on_device)
        self._fl_seed = None if seed is None else int(seed)
        self._fl_epochs = 0
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
        from .cuda_delivery import cuda_available

        want = bool(self.pin_memory) or self._fl_device is not None
        if want and not cuda_available():
            if not self._fl_pin_warned:
                self._fl_pin_warned = True
                warnings.warn(
                    "'pin_memory' argument is set as true but no accelerator is found, then device pinned "
                    "memory won't be used.", UserWarning, stacklevel=4)
            return False
        return want

    def _get_iterator(self):
        it = _Iter(self)
        self._fl_last_iter = weakref.ref(it)
        return it

    def stats(self) -> dict:
        """Counters of the current (or last) epoch, cheap to read at any time.

        Keys: epoch, num_workers, batches, samples, elapsed_s, consumer_wait_s,
        data_starved_fraction (share of wall time the training loop spent
        waiting in next()), batches_per_s, samples_per_s, queue_depth,
        workers (per-worker counters), worker_busy_fraction; for native
        datasets stages_s (read/decode/transform seconds summed over
        workers), bytes_read, pool_bytes, skipped, replaced; for Python
        datasets stages_s (dataset/collate/pin seconds) and, with workers,
        gil (see README, "The GIL trade-off"); with device=, device,
        h2d_enqueue_s, h2d_gpu_s (the copies' time on the GPU), h2d_bytes,
        h2d_copies_in_flight, device_pool_bytes, device_pool_buffers.
        Returns {} before the first epoch.
        """
        ref = getattr(self, "_fl_last_iter", None)
        it = ref() if ref is not None else None
        if it is not None and not it._finished:
            return it.stats()
        return dict(getattr(self, "_fl_last_stats", {}))

    def check_worker_number_rationality(self):
        # torch warns about too many worker *processes*; threads share one
        # process and fastloader's own advice lives in stats()/doctor.
        return None
