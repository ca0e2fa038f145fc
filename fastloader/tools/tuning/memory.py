"""The memory model: what a configuration's peak memory will be before it runs.

Before running a configuration its peak host memory is predicted by
:class:`MemoryModel`: peak = a + b x (bytes of the batches in flight) + c x
(worker processes), where bytes in flight = batch_size x bytes per sample x
(prefetch_factor x num_workers + 2) -- linear in batch_size and in
batch_size x num_workers -- fitted on the measured configurations as an
upper envelope (b >= 1, a the largest residual), so it errs on the high
side.  A configuration predicted to cross the limit (90% of the memory
available under the cgroup or physical limit, or ``memory_limit``;
:func:`host_budget_mib`) is never run; it is reported with its prediction.
The same holds for device memory on a GPU.  :func:`predict_peak_mib` is the
slope-1 line doctor uses for given settings, without measuring anything.
"""
from __future__ import annotations

import statistics

from ... import sysinfo
from .grid import workers_value

MiB = 1024.0 * 1024.0


IN_HAND = 2          # batches the loop holds besides the prefetch window (the current one, the previous)


LIMIT_SHARE = 0.9    # the budget is this share of the memory available



def inflight_batches(num_workers, prefetch_factor):
    """Batches alive at once: the prefetch window plus the ones the loop holds."""
    return (prefetch_factor * num_workers if num_workers else 1) + IN_HAND


def predict_peak_mib(base_mib, sample_bytes, batch_size, num_workers, prefetch_factor=2, process_workers=False,
                     per_process_mib=None):
    """The simplest prediction (slope 1): base + the batches in flight [+ one
    base per worker process].  doctor uses it for the user's settings."""
    nw = num_workers
    peak = base_mib + batch_size * sample_bytes * inflight_batches(nw, prefetch_factor or 0) / MiB
    if process_workers and nw:
        peak += nw * (per_process_mib if per_process_mib is not None else base_mib)
    return peak


class MemoryModel:
    """Predicts peak host (and device) memory of configurations not run yet.

    host peak  = a + b * inflight_mib + c * worker processes
    device peak = ad + bd * batch_mib * (batches held on the device)
    fitted on the measured configurations as an upper envelope: the slope
    from least squares but at least 1 (batches in flight cost at least
    their bytes), the intercept the largest residual, so every measured point
    lies on or under the line.  Before any measurement it predicts nothing.
    """

    def __init__(self, auto_workers):
        self.auto_workers = auto_workers
        self.sample_mib = None
        self.base_mib = None
        self.host = []    # (cfg, peak MiB)
        self.dev = []

    def _nw(self, cfg):
        return workers_value(cfg, self.auto_workers)

    def inflight_mib(self, cfg):
        return cfg["batch_size"] * self.sample_mib * inflight_batches(self._nw(cfg), cfg["prefetch_factor"] or 0)

    def _procs(self, cfg):
        return self._nw(cfg) if cfg.get("worker_mode") == "process" else 0

    def _dev_x(self, cfg):
        held = inflight_batches(self._nw(cfg), cfg["prefetch_factor"] or 0) if cfg.get("delivery") == "device" \
            else IN_HAND
        return cfg["batch_size"] * self.sample_mib * held

    def add(self, cfg, res):
        if "error" in res:
            return
        if res.get("sample_bytes"):
            self.sample_mib = max(self.sample_mib or 0.0, res["sample_bytes"] / MiB)
        if res.get("base_rss_mib"):
            self.base_mib = res["base_rss_mib"]
        if res.get("peak_mib"):
            self.host.append((cfg, res["peak_mib"]))
        if res.get("device_peak_mib") is not None:
            self.dev.append((cfg, res["device_peak_mib"]))

    @staticmethod
    def _envelope(xs, ys):
        b = 1.0
        if len(xs) >= 2 and max(xs) - min(xs) > 1e-9:
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            b = max(1.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
        a = max(y - b * x for x, y in zip(xs, ys))
        return a, b

    def fit(self):
        """{"a", "b", "c"} of the host line (None before the first point)."""
        if self.sample_mib is None:
            return None
        if not self.host:  # measured in-process: no per-configuration peak; the slope-1 line from the base
            return {"a": self.base_mib, "b": 1.0, "c": self.base_mib} if self.base_mib else None
        thr = [(self.inflight_mib(c), y) for c, y in self.host if not self._procs(c)] or \
              [(self.inflight_mib(c), y) for c, y in self.host]
        a, b = self._envelope([x for x, _ in thr], [y for _, y in thr])
        procs = [(c, y) for c, y in self.host if self._procs(c)]
        if procs:
            c_ = max(0.0, max((y - a - b * self.inflight_mib(c)) / self._procs(c) for c, y in procs))
        else:  # a spawned worker holds about what the main process held before the loader
            c_ = self.base_mib or 0.0
        return {"a": a, "b": b, "c": c_}

    def predict(self, cfg):
        """Predicted peak host MiB, or None when nothing is known yet."""
        f = self.fit()
        if f is None:
            return None
        return f["a"] + f["b"] * self.inflight_mib(cfg) + f["c"] * self._procs(cfg)

    def predict_device(self, cfg):
        if self.sample_mib is None or not self.dev or cfg.get("delivery") in (None, "cpu"):
            return None
        a, b = self._envelope([self._dev_x(c) for c, _ in self.dev], [y for _, y in self.dev])
        return a + b * self._dev_x(cfg)


def host_budget_mib(memory_limit=None):
    """(budget MiB, description): LIMIT_SHARE of the memory available now
    (under the cgroup limit, or physical), or ``memory_limit`` bytes if lower."""
    avail, total = sysinfo.memory_limits()
    cands = []
    if avail:
        cands.append((LIMIT_SHARE * avail / MiB,
                      f"{LIMIT_SHARE:.0%} of the {avail / MiB / 1024:.1f} GiB available"
                      + (f" (limit {total / MiB / 1024:.1f} GiB)" if total else "")))
    if memory_limit:
        cands.append((memory_limit / MiB, f"--memory-limit {memory_limit / MiB / 1024:.2f} GiB"))
    if not cands:
        return None, "unknown"
    return min(cands)
