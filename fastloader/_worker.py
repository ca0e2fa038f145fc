"""The worker side of Python datasets: what one worker thread runs for a
batch (`fetch`: __getitem__ / __getitems__ / next(iterator), then
collate_fn, stacking into the loader's pooled buffers, then pinning what is
not page-locked yet; or, for a dataset with a batch hook and default
collation, one `_fl_load_batch(indices, pool)` call), and the engine's view
of Python (`WorkerHost`: init / fetch / finish on each worker thread).  Nothing here raises: results
are (status, value) pairs, and an exception travels as the value with a note
naming the sample, batch and worker.
"""
from __future__ import annotations

import copy
import numbers
import sys
import time
import types
from dataclasses import replace

from .collate import RowWriter, collate_into, fast_default_collate
from .worker_info import WorkerInfo, tls

def annotate(exc, where):
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


OK, ERR, CANCELLED, EXHAUSTED = 0, 1, 2, 3


class Epoch:
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
        self.pool = None      # _C.BatchPool that collation stacks into (page-locked when pinning)
        self.iters = {}       # worker id -> iterator over an IterableDataset
        self.ended = set()    # worker ids whose iterator is exhausted
        # resume (fastloader/state.py): snapshot(ep, wid, seq) after each
        # batch of a Python dataset with a place to save, into snaps; resume
        # puts a resumed epoch's iterators back; stream_start is a stream's
        # (positions to skip, shard-order epoch)
        self.snapshot = None
        self.snaps = {}
        self.resume = None
        self.ds_resume = None  # worker processes: wid -> the dataset state each loads first
        self.stream_start = (0, None)
        # seconds per worker (last slot: the main thread) in the dataset,
        # in collate_fn and in pinning; each thread writes only its own slot
        self.stage_s = [[0.0, 0.0, 0.0] for _ in range(num_workers + 1)]
        getitems = getattr(dataset, "__getitems__", None) if not iterable else None
        self.getitems = getitems if getitems else None
        # a dataset that makes whole batches itself (ArrayDataset: rows
        # gathered in C), called once per batch instead of __getitem__ per
        # sample + collate_fn; only with default collation, which it matches
        hook = getattr(dataset, "_fl_load_batch", None) if not iterable and auto_collation else None
        self.batch_hook = hook if hook is not None and collate_fn is fast_default_collate else None


def fetch(ep: Epoch, wid, seq, indices, dataset=None):
    """Load and collate one batch from `dataset` (the worker's own copy;
    None: ep.dataset).  Returns (status, value); never raises."""
    res = _fetch_in_context(ep, wid, seq, indices, dataset)
    if ep.snapshot is not None:   # resume (fastloader/state.py): the place after this batch
        ep.snapshot(ep, wid, seq)
    return res


def _fetch_in_context(ep: Epoch, wid, seq, indices, dataset=None):
    if wid >= 0:
        tls.epoch_ctx = (ep.base_seed, ep.epoch, ep.native_seed)
        try:
            return _fetch_body(ep, wid, seq, indices, dataset)
        finally:
            tls.index = tls.calls = None
    # the main thread (num_workers=0): the context holds only while the
    # loader calls the dataset, so sample_rng() and ImageFolder's
    # __getitem__ outside a loader do not see a stale one
    prev = getattr(tls, "epoch_ctx", None), getattr(tls, "index", None), getattr(tls, "calls", None)
    tls.epoch_ctx = (ep.base_seed, ep.epoch, ep.native_seed)
    try:
        return _fetch_body(ep, wid, seq, indices)
    finally:
        tls.epoch_ctx, tls.index, tls.calls = prev


def _at_sample(index):
    """Say which sample this thread loads next (None: unknown, as for
    __getitems__ or an IterableDataset), for the native call's
    (seed, epoch, index) key (transforms.NativeTransform); `calls` counts
    its calls per index within the sample."""
    tls.index = index
    tls.calls = None


def _fetch_body(ep: Epoch, wid, seq, indices, own=None):
    dataset = ep.dataset if own is None else own
    where_worker = f"worker {wid}" if wid >= 0 else "the main thread (num_workers=0)"
    t0 = time.perf_counter()
    _at_sample(None)
    rows = None
    try:
        if ep.iterable:
            if wid in ep.ended:
                return (EXHAUSTED, None)
            it = ep.iters.get(wid)
            if it is None:
                it = ep.iters[wid] = iter(dataset)
                if ep.resume is not None:
                    it = ep.iters[wid] = ep.resume.restore_iter(ep, wid, it)
            if ep.auto_collation:
                data = []
                rows = _row_writer(ep, ep.batch_size)
                for _ in range(ep.batch_size):
                    if ep.cancelled:
                        return (CANCELLED, None)
                    try:
                        item = next(it)
                        if rows is not None:   # rebinding `item` lets the sample's own arrays go now
                            item = rows.take(item)
                        data.append(item)
                    except StopIteration:
                        ep.ended.add(wid)
                        break
                if not data or (ep.drop_last and len(data) < ep.batch_size):
                    return (EXHAUSTED, None)
            else:
                try:
                    data = next(it)
                except StopIteration:
                    ep.ended.add(wid)
                    return (EXHAUSTED, None)
        elif ep.batch_hook is not None:
            try:
                batch, pinned = ep.batch_hook(indices, ep.pool)
            except Exception as e:
                return (ERR, annotate(e, f"batch {seq} (indices {_short(indices)}) in {where_worker}"))
            t1 = time.perf_counter()
            if ep.pin:
                from .cuda_delivery import pin_batch

                batch = pin_batch(batch, pinned)
            slot = ep.stage_s[wid]
            slot[0] += t1 - t0
            slot[2] += time.perf_counter() - t1
            return (OK, batch)
        elif ep.auto_collation:
            if ep.getitems is not None:
                getitems = ep.getitems if own is None else own.__getitems__
                try:
                    data = getitems(indices)
                except Exception as e:
                    return (ERR, annotate(e, f"batch {seq} (indices {_short(indices)}) via __getitems__ in {where_worker}"))
            else:
                data = []
                rows = _row_writer(ep, len(indices))
                take = rows.take if rows is not None else None
                local = tls
                for idx in indices:
                    if ep.cancelled:
                        return (CANCELLED, None)
                    local.index = idx   # _at_sample(idx), inline: this loop runs once a sample
                    local.calls = None
                    try:
                        item = dataset[idx]
                    except Exception as e:
                        return (ERR, annotate(e, f"sample index {idx} (batch {seq}) in {where_worker}"))
                    if take is not None:   # rebinding `item` lets the sample's own arrays go now
                        item = take(item)
                        if rows.off:       # no field is written a row at a time: the rest as they come
                            take = None
                    data.append(item)
        else:
            # a key from a custom sampler may be anything; only an int is an index
            _at_sample(indices if isinstance(indices, numbers.Integral) else None)
            try:
                data = dataset[indices]
            except Exception as e:
                return (ERR, annotate(e, f"sample index {indices} (batch {seq}) in {where_worker}"))
        t1 = time.perf_counter()
        _at_sample(None)
        target = None
        try:
            if ep.pool is not None:
                batch, target = collate_into(ep.pool, ep.collate_fn, data, rows)
            else:
                batch = ep.collate_fn(data)
        except Exception as e:
            return (ERR, annotate(e, f"batch {seq} in collate_fn, {where_worker}"))
        t2 = time.perf_counter()
        if ep.pin:
            from .cuda_delivery import pin_batch

            # torch's pin_memory copy, here in the worker thread, for the
            # tensors not already stacked into page-locked pool buffers
            batch = pin_batch(batch, target.pinned_ptrs() if target is not None else ())
        slot = ep.stage_s[wid]  # wid -1 (main thread) is the last slot
        slot[0] += t1 - t0
        slot[1] += t2 - t1
        slot[2] += time.perf_counter() - t2
        return (OK, batch)
    except Exception as e:
        return (ERR, annotate(e, f"batch {seq} in {where_worker}"))


def _row_writer(ep, nrows):
    """With default collation into the loader's buffers, a RowWriter: each
    sample's arrays go into the batch as the sample comes, so a worker
    never holds a batch of samples beside the batch; else None."""
    if ep.pool is None or ep.collate_fn is not fast_default_collate or nrows <= 0:
        return None
    return RowWriter(ep.pool, nrows)


def _short(indices):
    s = list(indices)
    return s if len(s) <= 8 else f"{s[:8]}..."


def worker_copy(dataset):
    """(the copy of `dataset` one worker thread loads from, None) or
    (dataset, the exception copying raised).  A shallow copy, as cheap as
    copying its __dict__: what a worker (or worker_init_fn) sets on self
    (a lazily opened file, a worker id) stays that worker's, as in torch's
    worker processes, while the data it refers to is shared."""
    try:
        return copy.copy(dataset), None
    except Exception as e:  # an object that refuses copying: shared, and the loader says so
        return dataset, e


class WorkerHost:
    """The engine's view of Python: init / fetch / finish, run on worker
    threads.  copy_per_worker: each worker thread loads from its own
    shallow copy of the dataset, made when it starts (every epoch, or once
    with persistent_workers, as torch's worker processes copy it)."""

    def __init__(self, num_workers, dataset, seed_base, epoch, worker_init_fn, copy_per_worker=False):
        self.num_workers = num_workers
        self.dataset = dataset
        self.seed_base = seed_base
        self.epoch = epoch
        self.worker_init_fn = worker_init_fn
        self.init_errors = {}
        self.copy_per_worker = copy_per_worker
        self.datasets = [None] * num_workers   # each worker's copy (None: it loads the dataset itself)
        self.copy_error = None                 # what copy.copy raised (the dataset is then shared)

    def init(self, wid):
        ds = self.dataset
        if self.copy_per_worker:
            ds, err = worker_copy(self.dataset)
            if err is None:
                self.datasets[wid] = ds
            else:
                self.copy_error = err
        tls.info = WorkerInfo(id=wid, num_workers=self.num_workers, seed=self.seed_base + wid, dataset=ds,
                              worker_method="thread", epoch=self.epoch, base_seed=self.seed_base)
        fn = self.worker_init_fn
        if fn is not None and ds is not self.dataset and getattr(fn, "__self__", None) is self.dataset:
            # a method of the dataset acts on this worker's copy, as in a worker
            # process, where it was copied with the dataset
            fn = types.MethodType(fn.__func__, ds)
        if fn is not None:
            try:
                fn(wid)
            except Exception as e:
                self.init_errors[wid] = annotate(e, f"worker_init_fn({wid}) in worker {wid}")

    def fetch(self, wid, payload):
        ep, seq, indices = payload
        err = self.init_errors.get(wid)
        if err is not None:
            return (ERR, err)
        info = tls.info
        if info.epoch != ep.epoch or info.base_seed != ep.base_seed:  # frozen, as torch's: a new one per epoch
            tls.info = replace(info, epoch=ep.epoch, base_seed=ep.base_seed)
        return fetch(ep, wid, seq, indices, self.datasets[wid])

    def finish(self, wid):
        for attr in ("info", "epoch_ctx", "index", "calls"):
            if hasattr(tls, attr):
                delattr(tls, attr)
