"""One backend per kind of dataset: what a job is, which engine runs it, and
how its result becomes a batch.  The iterator (loader.py) keeps everything
the kinds share exactly once: sampler order, the prefetch window, timeouts,
the memory budget, delivery to a device, statistics and shutdown.

    NativeBackend   fastloader.ImageFolder / ImageList with default collation:
                    a job is (seq, indices, epoch, seed); worker threads
                    build whole batches in C without the GIL (csrc/native.c),
                    then, for batches that need it, run the dataset's Python
                    part themselves (datasets.py _post), so the consumer
                    only files the finished batch
    PythonBackend   any other dataset: a job is (_Epoch, seq, indices); the
                    worker threads run __getitem__ / __getitems__ / next(it)
                    and collate_fn with the GIL (fastloader/_worker.py)

A backend owns its engine (`engine`, None with num_workers=0 or once closed).
"""
from __future__ import annotations

import itertools

from . import _C
from ._worker import _CANCELLED, _ERR, _EXHAUSTED, _WorkerHost, _fetch
from .collate import batch_len

try:
    import torch
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

AGAIN = object()   # finish(): this result gives no batch (an iterable worker ended); wait for the next
END = object()     # next_indices(): the sampler is exhausted


class _Backend:
    native = False
    # close()'s wait for the workers when the caller gives no timeout
    # (None: for ever): a Python dataset's worker is in user code, which is
    # waited for; a native worker runs C, where the one call that may never
    # return is a read of a hung network file system
    close_timeout = None

    def __init__(self, num_workers):
        self.num_workers = num_workers
        self.engine = None

    def _engine_ready(self):
        """True when the engine can be reused (reset for a new epoch)."""
        if self.engine is None or self.engine.closed:
            return False
        self.engine.reset()
        return True

    def close(self, timeout=None):
        """Stop and join the workers.  A worker still busy after `timeout`
        seconds (user code that does not return, a hung read) finishes on
        its own, detached.  timeout=None: the backend's close_timeout."""
        eng, self.engine = self.engine, None
        if eng is not None:
            eng.close(self.close_timeout if timeout is None else timeout)

    def forget(self):
        """A forked child's copy: drop the parent's engine without touching it
        (its threads exist only in the parent; the C engine leaks itself)."""
        self.engine = None


class NativeBackend(_Backend):
    native = True
    close_timeout = 10.0

    def __init__(self, num_workers, dataset):
        super().__init__(num_workers)
        self.dataset = dataset      # a NativeImageDataset (maybe the uint8 "wire" variant)
        self.epoch = 0
        self.seed = 0
        self.stream = getattr(dataset, "_fl_stream", False)   # a WebDataset: a reader thread to stop
        self.batch_size = None      # the loader's (a stream's batch k is positions [k*B, (k+1)*B))

    def close(self, timeout=None):
        super().close(timeout)
        if self.stream:
            self.dataset._end_stream()

    def start_epoch(self, ep, seed, pin_device):
        """Epoch `ep` with the native seed `seed`; batch buffers page-locked
        for CUDA device `pin_device` (-1: not)."""
        self.ep = ep
        self.epoch = ep.epoch
        self.seed = seed
        if pin_device >= 0:
            # cudaHostAlloc needs fastloader's own handle on the CUDA runtime,
            # which nothing else may have loaded yet (torch's does not count)
            try:
                _C.cuda_require(pin_device)
            except RuntimeError:
                pass  # set_pinned's allocations then fail: pin_error, and the loader warns once
        self.dataset._native.set_pinned(pin_device)
        if self.stream:
            # the rank's shard stream for this epoch (the jobs carry the same epoch)
            self.dataset._begin_epoch(self.epoch, self.batch_size, *ep.stream_start)
        if self.num_workers and not self._engine_ready():
            ds = self.dataset
            self.engine = _C.NativeEngine(self.num_workers, ds._native, post=ds._post, post_always=ds._post_always)
        return None

    def submit(self, seq, next_indices):
        indices = next_indices()
        if indices is END:
            return False
        self.engine.submit(seq, indices, self.epoch, self.seed)
        return True

    def load_inline(self, seq, next_indices):
        indices = next_indices()
        if indices is END:
            raise StopIteration
        return self.dataset.load_batch(indices, self.epoch, self.seed, seq=seq)

    def finish(self, seq, wid, result):
        if isinstance(result, tuple):  # no Python ran on the worker: a raw (images, labels, events, failed)
            return self.dataset._finish(result, self.epoch, self.seed, seq)
        if isinstance(result, BaseException):  # what the worker's _post raised, raised at this batch's turn
            raise result
        if result is None:  # pragma: no cover - the engine always hands something back
            raise RuntimeError(f"fastloader: batch {seq} came back empty from worker {wid} (this is a bug)")
        return self.dataset._take(result)

    @staticmethod
    def count(batch):
        return len(batch[1])

    def pool_bytes_out(self):
        return self.dataset._native.pool_bytes_out

    def pin_error(self):
        return self.dataset._native.pin_error

    def add_stats(self, out, workers, eng):
        out["stages_s"] = {k: sum(w.get(k, 0.0) for w in workers) for k in ("read_s", "decode_s", "transform_s")}
        if any(w.get("python_batches", 0) for w in workers):
            # the dataset's Python part on the workers (datasets.py _post), GIL held
            out["stages_s"]["python_s"] = sum(w["python_s"] for w in workers)
        out["bytes_read"] = sum(w.get("bytes_read", 0) for w in workers)
        out["pool_bytes"] = self.dataset._native.pool_bytes
        out["skipped"] = list(self.dataset.skipped)
        out["replaced"] = list(self.dataset.replaced)
        if self.stream:
            st = self.dataset.stream_stats()
            wall = out.get("elapsed_s") or 0.0
            st["bytes_per_s"] = st["bytes"] / wall if wall > 0 else 0.0
            st["network_wait_s"] = st.pop("wait_s")
            st["skipped_shards"] = list(self.dataset.skipped_shards)
            out["stream"] = st


class PythonBackend(_Backend):
    def __init__(self, num_workers, dataset, worker_init_fn):
        super().__init__(num_workers)
        self.dataset = dataset
        self.worker_init_fn = worker_init_fn
        self.host = None
        self.stats0 = None

    def start_epoch(self, ep, base_seed):
        """Epoch `ep`; returns the engine's worker_stats() at its start (the
        GIL report's baseline), or None with num_workers=0."""
        self.ep = ep
        if not self.num_workers:
            return None
        if not self._engine_ready():
            self.host = _WorkerHost(self.num_workers, self.dataset, base_seed, ep.epoch, self.worker_init_fn)
            self.engine = _C.Engine(self.num_workers, self.host.fetch, self.host.init, self.host.finish)
        self.active = [True] * self.num_workers  # iterable datasets: workers whose iterator has not ended
        self.cycle = itertools.cycle(range(self.num_workers))
        if ep.resume is not None:  # a resumed iterable: ended workers idle, the round robin where it was
            ep.resume.restore_workers(self)
        self.stats0 = self.engine.worker_stats()
        return self.stats0

    def _next_worker(self):
        for _ in range(self.num_workers):
            w = next(self.cycle)
            if self.active[w]:
                return w
        return None

    def submit(self, seq, next_indices):
        ep = self.ep
        if ep.iterable:  # each job pinned to a worker, which keeps its own iterator
            w = self._next_worker()
            if w is None:
                return False
            indices = next_indices()
            if indices is END:
                return False
            self.engine.submit(seq, (ep, seq, indices), w)
            return True
        indices = next_indices()
        if indices is END:
            return False
        self.engine.submit(seq, (ep, seq, indices))
        return True

    def load_inline(self, seq, next_indices):
        indices = next_indices()
        if indices is END:
            raise StopIteration
        status, value = _fetch(self.ep, -1, seq, indices)
        if status == _EXHAUSTED:
            raise StopIteration
        if status == _ERR:
            raise value
        return value

    def finish(self, seq, wid, result):
        status, value = result
        if status == _EXHAUSTED:
            self.active[wid] = False
            return AGAIN
        if status == _CANCELLED:  # pragma: no cover - only old generations are cancelled
            return AGAIN
        if status == _ERR:
            raise value
        return value

    @staticmethod
    def count(batch):
        return batch_len(batch)

    def pool_bytes_out(self):
        return self.ep.pool.bytes_out if self.ep.pool is not None else 0

    def pin_error(self):
        # what the pool could not page-lock, the worker pins with torch's
        # copy (pin_batch): batches are pinned all the same
        return None

    def add_stats(self, out, workers, eng):
        if self.ep.pool is not None:
            out["pool_bytes"] = self.ep.pool.bytes
        st = self.ep.stage_s
        out["stages_s"] = {k: sum(w[i] for w in st) for i, k in enumerate(("dataset_s", "collate_s", "pin_s"))}
