"""One backend per kind of dataset: what a job is, which engine runs it, and
how its result becomes a batch.  The iterator (loader.py) keeps everything
the kinds share exactly once: sampler order, the prefetch window, timeouts,
the memory budget, delivery to a device, statistics and shutdown.

    NativeBackend   fastloader.ImageFolder / ImageList with default collation:
                    a job is (seq, indices, epoch, seed); worker threads
                    build whole batches in C without the GIL (csrc/native/native.c),
                    then, for batches that need it, run the dataset's Python
                    part themselves (datasets.py _post), so the consumer
                    only files the finished batch
    PythonBackend   any other dataset: a job is (_Epoch, seq, indices); the
                    worker threads run __getitem__ / __getitems__ / next(it)
                    and collate_fn with the GIL (fastloader/_worker.py)
    ProcessBackend  worker_mode="process": the same jobs run in worker
                    processes, batches written into shared-memory slots
                    (fastloader/_procworkers.py)
    NativeProcessBackend  a native dataset whose batches need Python (a
                    transform tail): worker processes build whole batches,
                    C work then the Python part, into the slots

worker_mode="auto" (the default) picks PythonBackend or ProcessBackend for
a Python dataset once, from what the dataset is, and NativeBackend or
NativeProcessBackend for a native one, from whether its batches need
Python (worker_mode.py).

A backend owns its engine (`engine`, None with num_workers=0 or once closed).
"""
from __future__ import annotations

import itertools

from . import _C
from ._worker import CANCELLED as _CANCELLED, ERR as _ERR, EXHAUSTED as _EXHAUSTED, WorkerHost as _WorkerHost, \
    fetch as _fetch
from .collate import batch_len

try:
    import torch
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None

AGAIN = object()   # finish(): this result gives no batch (an iterable worker ended); wait for the next
END = object()     # next_indices(): the sampler is exhausted
ANY_WORKER = -1    # _pick_worker(): whichever worker is free (the engines' worker=-1)


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

    def gil_watch(self):
        """Keyword arguments of the iterator's GilMonitor (stats.py)."""
        return {}

    def submit(self, seq, next_indices):
        """Hand batch `seq` to a worker; False when nothing is left to load
        (the sampler is exhausted, or every worker's iterator has ended)."""
        w = self._pick_worker(seq)  # first: indices drawn with no worker to take them would be lost
        if w is None:
            return False
        indices = next_indices()
        if indices is END:
            return False
        self._send(seq, indices, w)
        return True

    def _pick_worker(self, seq):
        """The worker for batch `seq`, ANY_WORKER, or None: none is left."""
        return ANY_WORKER

    def load_inline(self, seq, next_indices):
        """num_workers=0: batch `seq` loaded here; StopIteration at the end."""
        indices = next_indices()
        if indices is END:
            raise StopIteration
        return self._load(seq, indices)


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

    def _send(self, seq, indices, w):  # w is ANY_WORKER: the native engine deals jobs out itself
        self.engine.submit(seq, indices, self.epoch, self.seed)

    def _load(self, seq, indices):
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
        if self.num_workers:
            out["worker_mode"] = "thread"
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
            self.host = _WorkerHost(self.num_workers, self.dataset, base_seed, ep.epoch, self.worker_init_fn,
                                    copy_per_worker=self._copies(ep))
            self.engine = _C.Engine(self.num_workers, self.host.fetch, self.host.init, self.host.finish)
        self._start_turns(ep)
        self.stats0 = self.engine.worker_stats()
        return self.stats0

    def _copies(self, ep):
        """Does each worker thread load from its own copy of the dataset?
        Yes for a user's dataset, as in torch's worker processes; not for
        fastloader's own (their shared counters are the loader's report) nor
        for a Stateful one (its state is the loader's checkpoint)."""
        from .state import stateful
        from .worker_mode import threads_suit

        return not threads_suit(self.dataset, ep.iterable) and not stateful(self.dataset)

    def _start_turns(self, ep):
        self.active = [True] * self.num_workers  # iterable datasets: workers whose iterator has not ended
        self.cycle = itertools.cycle(range(self.num_workers))
        self.sent_to = {}   # seq -> the worker it was sent to, until finish() hands it back
        self.tasks = [0] * self.num_workers   # torch's _workers_num_tasks
        if ep.resume is not None:  # a resumed iterable: ended workers idle, the round robin where it was
            ep.resume.restore_workers(self)

    # Which worker takes a job is torch's _try_put_index, so that each
    # worker's copy of the dataset sees the batches it would see under torch:
    # map-style batch k on worker k mod N, an iterable's next job on the next
    # worker in turn whose iterator has not ended, and with in_order=False
    # the next in turn with fewer than its share of the prefetch window
    # outstanding.  The iterator sets these three per epoch.
    in_order = True
    free_worker = False   # num_workers="auto" on threads: a free thread takes the next map-style batch
    max_tasks = 0         # prefetch_factor x num_workers, torch's max_tasks

    def _usable(self, w):
        return self.active[w]

    def _all_usable(self):
        return True

    def _pick_worker(self, seq):
        if not self.ep.iterable:
            if self.free_worker:
                return ANY_WORKER
            if self.in_order and self._all_usable():
                # also from the middle of a resumed epoch, whose batches keep their numbers
                return seq % self.num_workers
        return self._next_worker()

    def _next_worker(self):
        """The next usable worker in turn (with in_order=False: the next one
        below its share of the window, or the least loaded should every share
        be full); None when no worker is left (every iterator ended)."""
        live = [w for w in range(self.num_workers) if self._usable(w)]
        if not live:
            return None
        share = self.max_tasks // len(live)
        for _ in range(self.num_workers):
            w = next(self.cycle)
            if self._usable(w) and (self.in_order or self.tasks[w] < share):
                return w
        return min(live, key=self.tasks.__getitem__)

    def _assigned(self, seq, w):
        if w >= 0:
            self.sent_to[seq] = w
            self.tasks[w] += 1

    def _returned(self, seq):
        w = self.sent_to.pop(seq, None)
        if w is not None:
            self.tasks[w] -= 1

    def _send(self, seq, indices, w):
        self.engine.submit(seq, (self.ep, seq, indices), w)
        self._assigned(seq, w)

    def _load(self, seq, indices):
        status, value = _fetch(self.ep, -1, seq, indices)
        if status == _EXHAUSTED:
            raise StopIteration
        if status == _ERR:
            raise value
        return value

    def finish(self, seq, wid, result):
        host = self.host
        if host is not None and host.copy_error is not None and not getattr(self, "copy_warned", False):
            self.copy_warned = True
            import warnings

            err = host.copy_error
            warnings.warn(f"fastloader: {type(self.dataset).__name__} cannot be copied ({type(err).__name__}: {err}), "
                          f"so its {self.num_workers} worker threads share the one object: what a worker sets on "
                          "the dataset (a file it opens, worker_init_fn's state) is seen by all of them. "
                          "worker_mode='process' gives each worker its own, as torch's DataLoader does.",
                          UserWarning, stacklevel=5)
        self._returned(seq)
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
        out["worker_mode"] = "thread"


class ProcessBackend(PythonBackend):
    """worker_mode="process": the jobs of PythonBackend run in worker
    processes (fastloader/_procworkers.py, the engine is its ProcPool), each
    batch's arrays written into a shared-memory slot and handed over as
    views of it.  As torch does: job k goes to the next worker in turn whose
    iterable has not ended (so the draws from the global generators match
    torch's), persistent_workers keeps the processes (and their copy of the
    dataset) across epochs, and page-locking (pin_memory) happens here, in
    the loader's process: the slots once, anything else per batch."""

    def __init__(self, num_workers, dataset, worker_init_fn, mp_context, nslots):
        super().__init__(num_workers, dataset, worker_init_fn)
        self.mp_context = mp_context
        self.nslots = nslots

    def _spec(self, ep):
        return dict(dataset=self.dataset, iterable=ep.iterable, auto_collation=ep.auto_collation,
                    batch_size=ep.batch_size, drop_last=ep.drop_last, collate_fn=ep.collate_fn,
                    base_seed=ep.base_seed, native_seed=ep.native_seed, epoch=ep.epoch,
                    num_workers=self.num_workers, worker_init_fn=self.worker_init_fn,
                    snapshot=ep.snapshot, resume=ep.resume, ds_resume=ep.ds_resume)

    def start_epoch(self, ep, base_seed):
        self.ep = ep
        if not self.num_workers:
            return None
        from ._procworkers import ProcPool

        pool = self.engine
        if pool is not None and not pool.closed and pool.error is None:
            pool.begin_epoch(self._spec(ep))  # persistent workers
        else:
            if pool is not None:
                pool.close(0.0)
            pin_device = ep.pool.pin_device if ep.pin and ep.pool is not None else -1
            self.engine = ProcPool(self.num_workers, self.mp_context, self._spec(ep), self.nslots, pin_device)
        self.engine.stage_s = ep.stage_s
        self._start_turns(ep)
        return None

    def _usable(self, w):
        return self.active[w] and w < self.engine.active_n   # active_n: num_workers="auto"

    def _all_usable(self):
        return self.engine.active_n == self.num_workers

    def _send(self, seq, indices, w):
        self.engine.submit(seq, indices, w)
        self._assigned(seq, w)

    def finish(self, seq, wid, result):
        if self.engine is not None:
            snap = self.engine.snaps.pop(seq, None)
            if snap is not None:  # the worker's place after this batch, for state.Tracker.yielded
                self.ep.snaps[seq] = (*snap, True)  # True: from a process, its own copy of the dataset
        pinned = self.engine.pinned_ptrs.pop(seq, ()) if self.engine is not None else ()
        batch = super().finish(seq, wid, result)
        if batch is not AGAIN and self.ep.pin:
            from .cuda_delivery import pin_batch

            # tensors in the page-locked slots are left alone; anything
            # pickled is copied, here, once per batch
            batch = pin_batch(batch, pinned)
        return batch

    def pin_error(self):
        return self.engine.pin_error if self.engine is not None else None

    def gil_watch(self):
        return {"enabled": False}  # processes have a GIL each

    def add_stats(self, out, workers, eng):
        super().add_stats(out, workers, eng)
        out["worker_mode"] = "process"
        if eng is not None:
            ring = eng.ring
            out["shared_memory"] = {"start_method": eng.start_method, "slots": ring.nslots,
                                    "slots_in_use": ring.slots_in_use, "slots_peak": ring.slots_peak,
                                    "slots_written": eng.slots_written,
                                    "batches_pickled": eng.unslotted}


class NativeProcessBackend(ProcessBackend):
    """A native dataset whose batches need Python (a transform tail,
    target_transform) in worker processes (worker_mode.choose_native_mode):
    each process builds whole batches, the C work inline on its one thread
    (the GIL released), then the Python part, the tail's outputs stacked
    into the batch's shared-memory slot (datasets.py _process_batch, the
    batch hook).  Batches run in parallel, k on worker k mod N; the native
    draws are keyed by (seed, epoch, index) as on threads, the tail's draws
    from torch's generator follow torch's per-worker seeds.  The consumer
    files each batch's records on the loader's dataset (_take)."""

    def __init__(self, num_workers, dataset, worker_init_fn, mp_context, nslots):
        super().__init__(num_workers, dataset, worker_init_fn, mp_context, nslots)
        self.stage_s = [0.0, 0.0]   # the workers' native and Python seconds, from their batches

    def _spec(self, ep):
        spec = super()._spec(ep)
        spec["batch_hook"] = self.dataset._process_batch   # _procworkers._make_epoch hands it the ring
        return spec

    def finish(self, seq, wid, result):
        pinned = self.engine.pinned_ptrs.pop(seq, ()) if self.engine is not None else ()
        fin = PythonBackend.finish(self, seq, wid, result)   # a worker's exception is raised here
        self.stage_s[0] += fin.native_s
        if fin.tail_s is not None:
            self.stage_s[1] += sum(fin.tail_s)
        batch = self.dataset._take(fin)
        if self.ep.pin:
            from .cuda_delivery import pin_batch

            batch = pin_batch(batch, pinned)   # copies only what is not in a page-locked slot
        return batch

    def start_epoch(self, ep, base_seed):
        self.stage_s = [0.0, 0.0]
        return super().start_epoch(ep, base_seed)

    @staticmethod
    def count(batch):
        return len(batch[1])

    def add_stats(self, out, workers, eng):
        super().add_stats(out, workers, eng)
        out["path"] = "native"
        out["stages_s"] = {"native_s": self.stage_s[0], "python_s": self.stage_s[1]}
        out.pop("pool_bytes", None)   # the loader's collation pool: unused, the workers stack into the slots
        out["skipped"] = list(self.dataset.skipped)
        out["replaced"] = list(self.dataset.replaced)
