"""What `DataLoader.stats()` reports, and the GIL-bound detection built on
the same counters.

Everything here reads counters the iterator and the engine keep anyway
(cheap, safe from any thread): it never waits for a worker and never takes
an engine lock for long.
"""
from __future__ import annotations

import sys
import time
import warnings

from . import sysinfo

__all__ = ["PerformanceWarning", "worker_stats", "iterator_stats", "GilMonitor"]


class PerformanceWarning(UserWarning):
    """Loading is slower than it could be, and the message says why and what to do."""


def worker_stats(eng):
    """Per-worker counters of `eng`, or [] when there is none or it was closed
    meanwhile (safe from any thread)."""
    if eng is None or eng.closed:
        return []
    try:
        return eng.worker_stats()
    except RuntimeError:  # closed between the check and the call
        return []


def iterator_stats(it):
    """A snapshot of iterator `it`'s epoch (see DataLoader.stats)."""
    wall = max(time.perf_counter() - it._t_start, 1e-9)
    nw = it._num_workers
    out = {
        "epoch": it._ep.epoch,
        "num_workers": nw,
        "batches": it._num_yielded,
        "samples": it._samples,
        "elapsed_s": wall,
        "consumer_wait_s": it._wait_s,
        # the wait for the first batch holds the workers' start-up (processes
        # fork or spawn then): steady-state starvation is the rest
        "first_batch_wait_s": it._wait_s if it._first_wait_s is None else it._first_wait_s,
        "data_starved_fraction": min(1.0, it._wait_s / wall),
        "batches_per_s": it._num_yielded / wall,
        "samples_per_s": it._samples / wall,
        "queue_depth": max(0, it._send - it._done) if nw else 0,
        "prefetch_window": it._window if nw else 0,
        "batch_bytes": it._batch_bytes,
        "max_memory": it._max_memory,
        "native": it._backend.native,
        # how batches are made: "native" (C workers, no Python per sample),
        # "batch" (one call per batch of the dataset's batch hook, e.g.
        # ArrayDataset's gather in C) or "python" (__getitem__ + collate_fn)
        "path": "native" if it._backend.native else ("batch" if it._ep.batch_hook is not None else "python"),
    }
    pipeline = getattr(it._ep.dataset, "pipeline_description", None)
    if pipeline is not None:
        out["pipeline"] = pipeline
    copier = it._copier
    if copier is not None:
        out["device"] = str(copier.device)
        out["h2d_enqueue_s"] = it._h2d_s          # consumer time spent enqueueing copies
        out["h2d_copies_in_flight"] = copier.inflight()
        out["h2d_bytes"] = copier.bytes            # since the loader's first epoch
        out["h2d_gpu_s"] = copier.copy_gpu_s       # the finished copies' time on the GPU
        pool = copier.pool_stats()
        out["device_pool_bytes"] = pool["device_bytes"]
        out["device_pool_buffers"] = pool["buffers"]
    tuner = it._tuner
    if tuner is not None:
        out["num_workers_auto"] = tuner.active
        out["autotune_history"] = list(tuner.history)  # (seconds into the epoch, workers)
    # The consumer may close the engine and set it to None at any moment
    # (stats() is called from other threads too): read it once.
    eng = it._backend.engine
    workers = worker_stats(eng)
    out["workers"] = workers
    if workers:
        out["worker_busy_fraction"] = [min(1.0, w["busy_s"] / wall) for w in workers]
    it._backend.add_stats(out, workers, eng)
    if getattr(it, "_mode_why", None):
        out["worker_mode_why"] = it._mode_why
    if workers and not it._backend.native and it._gil is not None:
        out["gil"] = it._gil.report(it._wait_s, eng)
    return out


def gil_remedy(dataset):
    """The one remedy for GIL-bound worker threads that applies to this
    dataset (they run only with worker_mode='thread', asked for)."""
    cls = type(dataset)
    if cls.__module__.startswith("torchvision.datasets") and cls.__name__ in ("ImageFolder", "DatasetFolder"):
        return (f"Remedy: fastloader.ImageFolder takes the same arguments as torchvision's {cls.__name__} and "
                "decodes and transforms in C, without the GIL.")
    return ("Remedy: worker_mode='process' (or the default, 'auto', which runs a Python dataset in worker "
            "processes), each with a GIL of its own.")


class GilMonitor:
    """Every WINDOW_S of loading a Python dataset, compare the window's
    counters.  The direct signal is how long the consumer takes to re-acquire
    the GIL after each (<= 50 ms) wait: about the interpreter's switch
    interval (5 ms) when worker threads run pure Python non-stop, about zero
    when their work releases the GIL (NumPy, torch, I/O, sleeping) --
    whatever else the machine is doing.  Warn when that holds while the
    consumer starves, the workers are busy in Python and they get < 1.3 cores
    of CPU."""

    WINDOW_S = 0.3
    SKIP_S = 0.1

    def __init__(self, t_start, stats0, *, enabled=True, skip_s=None, window_s=None, busy_min=0.8):
        """`skip_s` of start-up is ignored, then windows of `window_s`.
        enabled=False: nothing to watch (worker processes).  `busy_min`: the
        share of time the workers must spend in the dataset (below it the
        loop, not the loading, is what waits)."""
        self.t_start = t_start
        self.stats0 = stats0    # the engine's worker_stats() at the epoch's start
        self.enabled = enabled
        self.checked = not enabled  # decided (warned, or nothing to watch)
        self.skip_s = self.SKIP_S if skip_s is None else skip_s
        self.window_s = self.WINDOW_S if window_s is None else window_s
        self._snap = None
        self.busy_min = busy_min

    @staticmethod
    def snapshot(wait_s, eng, idle=True):
        return (time.perf_counter(), wait_s, eng.worker_stats(), sysinfo.system_idle_s() if idle else None,
                eng.consumer_gil_wait())

    def report(self, wait_s, eng, since=None, idle=True):
        """How the workers spent their time since `since` (a snapshot) or the
        start of the epoch; None when the engine is gone."""
        if not self.enabled or eng is None or eng.closed:
            return None
        try:
            t1, wait1, now, idle1, (g1, n1) = self.snapshot(wait_s, eng, idle)
        except RuntimeError:  # closed by the consumer meanwhile
            return None
        if since is None:
            since = (self.t_start, 0.0, self.stats0 or [dict.fromkeys(now[0], 0)] * len(now), None, (0.0, 0))
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

    def maybe_warn(self, wait_s, eng, loader, num_workers):
        """Called after each batch; warns once per loader when the workers
        are held back by the GIL."""
        if not self.enabled:
            self.checked = True
            return
        now = time.perf_counter()
        if self._snap is None:
            if now - self.t_start >= self.skip_s:  # skip start-up
                self._snap = self.snapshot(wait_s, eng)
            return
        if now - self._snap[0] < self.window_s:
            return
        if loader is None or loader._fl_gil_warned or num_workers < 2 or sysinfo.usable_cpus() < 2:
            self.checked = True
            return
        rep = self.report(wait_s, eng, since=self._snap)
        self._snap = self.snapshot(wait_s, eng)
        if (rep is not None and rep["consumer_wait_fraction"] > 0.5 and rep["worker_busy_fraction"] > self.busy_min
                and rep["python_cpu_cores"] < 1.3
                and rep["gil_reacquire_ms"] > 300.0 * sys.getswitchinterval()):
            loader._fl_gil_warned = True
            self.checked = True
            warnings.warn(
                f"fastloader: the dataset's Python code holds the GIL, so its {num_workers} worker threads "
                f"run it one at a time ({rep['python_cpu_cores']:.2f} CPU cores busy; taking the GIL took "
                f"{rep['gil_reacquire_ms']:.1f} ms; the training loop waited "
                f"{100 * rep['consumer_wait_fraction']:.0f}% of the time). {gil_remedy(loader.dataset)}",
                PerformanceWarning, stacklevel=5)
