"""``fastloader.tune`` / ``python -m fastloader tune``: the manual tuning
procedure, automated, on the user's own dataset and step.

The procedure the articles teach, in their order: batch_size first, then
num_workers (including "auto"), then prefetch_factor, device delivery and
pin_memory (on a GPU), worker_mode (when fastloader.DataLoader has it), and
persistent_workers (the epoch-start cost it saves).

Search.  Each axis is walked from a conservative start (batch_size 32,
num_workers 2, prefetch_factor 2) and stops once a step no longer pays:
a larger value is kept only if it gains at least ``stop_gain`` (5%) over
the best so far on that axis; a smaller value only if it keeps within
``tolerance`` (3%) of it.  num_workers is coarse to fine: 0, the powers of two
and the largest value first, then bisection between the fewest workers
within tolerance and the next fewer one measured.  A larger value that
measures clearly slower (a drop, not a plateau) is measured once more before
the axis stops, and finally the three best are measured once more
(``confirm``).  A configuration's rate is the fastest of its runs: other
processes only ever slow a run down.

Measurement (:func:`measure`).  Every configuration runs in a fresh process
through the benchmark harness (fastloader/_harness.py: ``run_child``, with
the process tree's memory sampled), so peak memory is per configuration.
For ``epochs`` epochs of at most ``samples`` samples each it records
samples/s and the share of time the step waits for data (both after each
epoch's first batch), the time to the first batch (loader construction +
first ``next``), the epoch-start cost (``iter()`` + first batch of the later
epochs), peak host memory (process + worker processes), and on a GPU peak
device memory (torch's allocator + fastloader's device pool).

Memory.  Before running a configuration its peak host memory is predicted by
:class:`MemoryModel`: peak = a + b x (bytes of the batches in flight) + c x
(worker processes), where bytes in flight = batch_size x bytes per sample x
(prefetch_factor x num_workers + 2) -- linear in batch_size and in
batch_size x num_workers -- fitted on the measured configurations as an
upper envelope (b >= 1, a the largest residual), so it errs on the high
side.  A configuration predicted to cross the limit (90% of the memory
available under the cgroup or physical limit, or ``memory_limit``) is never
run; it is reported with its prediction.  The same holds for device memory
on a GPU.

Recommendation (:func:`recommend`).  Among the measured configurations
within ``tolerance`` of the best samples/s, the one with the fewest workers,
then the smallest batch, then the smallest prefetch; persistent_workers=True
when it saves at least 10% of the epoch-start cost without losing throughput.
The reasons name what the larger settings would gain and cost.

This module imports only the standard library at module level (doctor uses
:func:`predict_peak_mib` without starting anything).
"""
from __future__ import annotations

import gc
import importlib
import importlib.util
import inspect
import math
import os
import statistics
import sys
import time

from . import _harness as H
from . import sysinfo

__all__ = ["tune", "Grid", "MemoryModel", "measure", "recommend", "predict_peak_mib", "available_worker_modes"]

_MiB = 1024.0 * 1024.0
IN_HAND = 2          # batches the loop holds besides the prefetch window (the current one, the previous)
LIMIT_SHARE = 0.9    # the budget is this share of the memory available
AXES = ("batch_size", "num_workers", "prefetch_factor", "persistent_workers", "delivery", "worker_mode")
DELIVERIES = {
    "cpu": "batches stay on the CPU",
    "copy": "pin_memory=False, batch.to('cuda') in the loop",
    "pinned": "pin_memory=True, batch.to('cuda', non_blocking=True) in the loop",
    "device": "DataLoader(device='cuda'): the loader copies on its own stream",
}


# ----------------------------------------------------------------------------
# configurations and the grid


def key(cfg):
    return tuple(cfg.get(a) for a in AXES)


def workers_value(cfg, auto_workers):
    """Threads (or processes) a configuration starts: "auto" starts one per usable CPU."""
    nw = cfg["num_workers"]
    return auto_workers if nw == "auto" else nw


def settings(cfg, *, short=False):
    """The DataLoader arguments of a configuration, as text."""
    nw = cfg["num_workers"]
    parts = [f"batch_size={cfg['batch_size']}", f"num_workers={nw!r}" if nw == "auto" else f"num_workers={nw}"]
    if nw != 0:
        parts.append(f"prefetch_factor={cfg['prefetch_factor']}")
        if not short or cfg["persistent_workers"]:
            parts.append(f"persistent_workers={cfg['persistent_workers']}")
    d = cfg.get("delivery") or "cpu"
    if d == "pinned":
        parts.append("pin_memory=True")
    elif d == "device":
        parts.append("device='cuda'")
    elif d == "copy" and not short:
        parts.append("pin_memory=False")
    if cfg.get("worker_mode") is not None and nw != 0:
        parts.append(f"worker_mode={cfg['worker_mode']!r}")
    return ", ".join(parts)


def _norm(cfg):
    """num_workers=0 has no prefetch window and nothing to keep alive."""
    cfg = dict(cfg)
    if cfg["num_workers"] == 0:
        cfg["prefetch_factor"] = None
        cfg["persistent_workers"] = False
        if cfg.get("worker_mode") is not None:
            cfg["worker_mode"] = cfg["_modes"][0] if cfg.get("_modes") else cfg["worker_mode"]
    cfg.pop("_modes", None)
    return cfg


def available_worker_modes():
    """fastloader.DataLoader's worker_mode values (its default first), or None
    when this build has no worker_mode argument."""
    import fastloader

    p = inspect.signature(fastloader.DataLoader).parameters.get("worker_mode")
    if p is None:
        return None
    modes = ["thread", "process"]
    if p.default in modes:
        modes.remove(p.default)
        modes.insert(0, p.default)
    return modes


def coarse_workers(ws):
    """0, the powers of two and the largest of ``ws`` (numbers only)."""
    top = max(ws)
    return [w for w in ws if w == 0 or w == top or (w & (w - 1)) == 0]


class Grid:
    """The values of every axis; :meth:`configs` is the exhaustive sweep."""

    def __init__(self, batch_sizes, workers, prefetch_factors=(2, 4), persistent=(False, True),
                 deliveries=("cpu",), modes=None):
        self.batch_sizes = sorted(dict.fromkeys(int(b) for b in batch_sizes))
        if not self.batch_sizes or self.batch_sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive integers, got {batch_sizes!r}")
        ws = list(dict.fromkeys(workers))
        bad = [w for w in ws if not (w == "auto" or (isinstance(w, int) and not isinstance(w, bool) and w >= 0))]
        if bad or not ws:
            raise ValueError(f"num_workers values must be integers >= 0 or 'auto', got {workers!r}")
        self.numeric = sorted(w for w in ws if w != "auto")
        self.auto = "auto" in ws
        self.prefetch = sorted(dict.fromkeys(int(p) for p in prefetch_factors))
        if not self.prefetch or self.prefetch[0] < 1:
            raise ValueError(f"prefetch factors must be integers >= 1, got {prefetch_factors!r}")
        self.persistent = list(dict.fromkeys(bool(p) for p in persistent)) or [False]
        self.deliveries = list(deliveries)
        self.modes = list(modes) if modes else [None]

    @property
    def workers(self):
        return self.numeric + (["auto"] if self.auto else [])

    def base(self):
        """Where the search starts: the articles' num_workers=2, prefetch 2,
        persistent_workers off, the most common delivery."""
        if self.numeric:
            w0 = min(self.numeric, key=lambda w: (abs(w - 2), w))
        else:
            w0 = "auto"
        pf0 = 2 if 2 in self.prefetch else self.prefetch[0]
        d0 = "pinned" if "pinned" in self.deliveries else self.deliveries[0]
        return dict(num_workers=w0, prefetch_factor=pf0, persistent_workers=self.persistent[0] if False not in
                    self.persistent else False, delivery=d0, worker_mode=self.modes[0])

    def make(self, base, **kw):
        cfg = dict(base, **kw)
        cfg["_modes"] = self.modes
        return _norm(cfg)

    def configs(self):
        out, seen = [], set()
        for bs in self.batch_sizes:
            for w in self.workers:
                for pf in self.prefetch:
                    for p in self.persistent:
                        for d in self.deliveries:
                            for m in self.modes:
                                c = self.make({}, batch_size=bs, num_workers=w, prefetch_factor=pf,
                                              persistent_workers=p, delivery=d, worker_mode=m)
                                if key(c) not in seen:
                                    seen.add(key(c))
                                    out.append(c)
        return out

    def as_dict(self):
        return {"batch_size": self.batch_sizes, "num_workers": self.workers, "prefetch_factor": self.prefetch,
                "persistent_workers": self.persistent, "delivery": self.deliveries,
                "worker_mode": self.modes if self.modes != [None] else None}


# ----------------------------------------------------------------------------
# memory


def inflight_batches(num_workers, prefetch_factor):
    """Batches alive at once: the prefetch window plus the ones the loop holds."""
    return (prefetch_factor * num_workers if num_workers else 1) + IN_HAND


def predict_peak_mib(base_mib, sample_bytes, batch_size, num_workers, prefetch_factor=2, process_workers=False,
                     per_process_mib=None):
    """The simplest prediction (slope 1): base + the batches in flight [+ one
    base per worker process].  doctor uses it for the user's settings."""
    nw = num_workers
    peak = base_mib + batch_size * sample_bytes * inflight_batches(nw, prefetch_factor or 0) / _MiB
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
            self.sample_mib = max(self.sample_mib or 0.0, res["sample_bytes"] / _MiB)
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
        cands.append((LIMIT_SHARE * avail / _MiB,
                      f"{LIMIT_SHARE:.0%} of the {avail / _MiB / 1024:.1f} GiB available"
                      + (f" (limit {total / _MiB / 1024:.1f} GiB)" if total else "")))
    if memory_limit:
        cands.append((memory_limit / _MiB, f"--memory-limit {memory_limit / _MiB / 1024:.2f} GiB"))
    if not cands:
        return None, "unknown"
    return min(cands)


# ----------------------------------------------------------------------------
# the measured side (runs in the child process, or here with isolate=False)


def _import_target(target):
    """'pkg.mod:attr.sub' or '/path/file.py:attr' -> the object."""
    if callable(target):
        return target
    mod, sep, attr = str(target).partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"expected MODULE:CALLABLE (e.g. mypkg.data:make_train), got {target!r}")
    if mod.endswith(".py") and os.path.isfile(mod):
        name = "_fastloader_tune_" + os.path.splitext(os.path.basename(mod))[0]
        m = sys.modules.get(name)
        if m is None:
            spec = importlib.util.spec_from_file_location(name, mod)
            m = importlib.util.module_from_spec(spec)
            sys.modules[name] = m
            spec.loader.exec_module(m)
    else:
        m = importlib.import_module(mod)
    obj = m
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def as_target(obj):
    """A callable -> 'module:qualname' (or 'file.py:qualname' for __main__),
    so a fresh process can import it; strings pass through."""
    if isinstance(obj, (str, os.PathLike)):
        return os.fspath(obj)
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not mod or not qual or "<" in qual:
        raise ValueError(f"{obj!r} cannot be imported by name in a fresh process; give a module-level "
                         "function, a 'module:callable' string, or isolate=False")
    if mod == "__main__":
        path = getattr(sys.modules["__main__"], "__file__", None)
        if not path:
            raise ValueError(f"{obj!r} is defined in __main__ without a file; use isolate=False")
        return f"{os.path.abspath(path)}:{qual}"
    return f"{mod}:{qual}"


def _make_dataset(spec):
    if spec["kind"] == "folder":
        import fastloader
        from fastloader._harness import fastloader_transform

        return fastloader.ImageFolder(spec["root"], transform=fastloader_transform(spec.get("pipeline", "train")))
    return _import_target(spec["target"])()


def _make_step(spec):
    if not spec:
        return None
    if spec["kind"] == "sim":
        secs = spec["ms"] / 1000.0
        if not secs:
            return None
        if spec.get("busy"):
            return lambda batch: H.busy(secs)
        return lambda batch: time.sleep(secs)
    return _import_target(spec["target"])


def _is_iterable(ds):
    try:
        from torch.utils.data import IterableDataset
    except ImportError:  # pragma: no cover
        return False
    return isinstance(ds, IterableDataset)


def loader_kwargs(cfg, iterable=False):
    kw = dict(batch_size=cfg["batch_size"], num_workers=cfg["num_workers"], shuffle=not iterable)
    if cfg["num_workers"] != 0:
        kw["prefetch_factor"] = cfg["prefetch_factor"]
        kw["persistent_workers"] = bool(cfg["persistent_workers"])
    d = cfg.get("delivery") or "cpu"
    if d == "pinned":
        kw["pin_memory"] = True
    elif d == "device":
        kw["device"] = "cuda"
    if cfg.get("worker_mode") is not None:
        kw["worker_mode"] = cfg["worker_mode"]
    return kw


def measure(p):
    """Measure one configuration; ``p`` has config, dataset, step, epochs,
    samples (per epoch), min_batches, epoch_s (time cap per epoch) and
    torch_threads.  Returns the measurements (see the module docstring)."""
    import fastloader
    from fastloader.collate import batch_len, batch_nbytes

    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if p.get("torch_threads") and torch is not None:
        torch.set_num_threads(int(p["torch_threads"]))
    cfg = p["config"]
    perf = time.perf_counter
    t = perf()
    ds = _make_dataset(p["dataset"])
    dataset_s = perf() - t
    step = _make_step(p.get("step"))
    delivery = cfg.get("delivery") or "cpu"
    gpu = torch is not None and delivery != "cpu" and torch.cuda.is_available()
    if delivery != "cpu" and not gpu:
        raise RuntimeError(f"delivery {delivery!r} needs a CUDA device")
    move = None
    if delivery in ("copy", "pinned"):
        from fastloader.cuda_delivery import _map_tensors

        dev, nb_ = torch.device("cuda"), delivery == "pinned"
        move = lambda b: _map_tensors(lambda x: x.to(dev, non_blocking=nb_), b)  # noqa: E731
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    try:
        n_ds = len(ds)
    except TypeError:
        n_ds = None

    gc.collect()
    base = H.rss_now_mib()
    t0 = perf()
    loader = fastloader.DataLoader(ds, **loader_kwargs(cfg, _is_iterable(ds)))
    try:
        per_epoch = len(loader)
    except TypeError:
        per_epoch = None
    nw = cfg["num_workers"]
    if nw == "auto":
        nw = loader.num_workers
    window = inflight_batches(nw, cfg["prefetch_factor"] or 0)
    nb = max(int(p.get("min_batches", 8)), math.ceil(p.get("samples", 1024) / cfg["batch_size"]), 2 * window)
    if per_epoch:
        nb = min(nb, per_epoch)
    epoch_s = p.get("epoch_s") or float("inf")
    ttfb = first_n = first_bytes = shape = None
    starts, autos = [], []
    steady_t = steady_wait = 0.0
    steady_n = batches = 0
    dev_pool = 0
    for ep in range(int(p.get("epochs", 2))):
        ts = perf()
        it = iter(loader)
        i, t_first = 0, None
        while i < nb:
            tw = perf()
            try:
                batch = next(it)
            except StopIteration:
                break
            if move is not None:
                batch = move(batch)
            now = perf()
            if t_first is None:
                t_first = now
                if ep == 0:
                    ttfb = now - t0
                    first_n = batch_len(batch)
                    x = batch[0] if isinstance(batch, (tuple, list)) else batch
                    shape = "x".join(str(s) for s in getattr(x, "shape", ()))
                    first_bytes = batch_nbytes(batch)
                else:
                    starts.append(now - ts)
            else:
                steady_wait += now - tw
                steady_n += batch_len(batch)
            if step is not None:
                step(batch)
            del batch
            i += 1
            if i >= 3 and perf() - ts > epoch_s:
                break
        if gpu:
            torch.cuda.synchronize()
        if t_first is not None:
            steady_t += perf() - t_first
        batches += i
        st = loader.stats()
        dev_pool = max(dev_pool, st.get("device_pool_bytes") or 0)
        if "num_workers_auto" in st:
            autos.append(st["num_workers_auto"])
        del it
    out = {
        "rate": steady_n / steady_t if steady_n and steady_t > 0 else None,
        "wait_pct": 100.0 * steady_wait / steady_t if steady_t > 0 else None,
        "ttfb_s": ttfb,
        "epoch_start_s": statistics.median(starts) if starts else None,
        "dataset_s": dataset_s,
        "dataset_len": n_ds,
        "batches": batches,
        "batches_per_epoch": nb,
        "sample_bytes": (first_bytes / first_n) if first_n else None,
        "shape": shape,
        "base_rss_mib": base,
        "num_workers_started": loader.num_workers,
        "auto_settled": autos[-1] if autos else None,
    }
    if gpu:
        out["device_peak_mib"] = (torch.cuda.max_memory_reserved() + dev_pool) / _MiB
        out["device_total_mib"] = torch.cuda.get_device_properties(0).total_memory / _MiB
    del loader
    gc.collect()
    return out


# ----------------------------------------------------------------------------
# the search


class _Run:
    """The measured configurations, the skipped ones, and the search's log."""

    def __init__(self, grid, runner, model, budget_mib, *, stop_gain, tolerance, on_result=None, on_start=None):
        self.grid = grid
        self.runner = runner
        self.model = model
        self.budget = budget_mib
        self.stop_gain = stop_gain
        self.tol = tolerance
        self.on_result = on_result
        self.on_start = on_start
        self.runs = {}       # key -> [result, ...]
        self.cfgs = {}       # key -> cfg
        self.phase = {}      # key -> phase of its first measurement
        self.skipped = {}    # key -> {"config", "reason", ...}
        self.order = []
        self.dev_budget = None
        self.n_runs = 0
        self.dataset_len = None

    def rate(self, cfg):
        """The fastest of the configuration's runs: other processes on the
        machine only ever slow a run down, so the fastest run is the best
        estimate of what the configuration can do."""
        rs = [r["rate"] for r in self.runs.get(key(cfg), []) if "error" not in r and r.get("rate")]
        return max(rs) if rs else None

    def _predict(self, cfg):
        """None if it may run, else the skip record."""
        if self.dataset_len and cfg["batch_size"] * 4 > self.dataset_len:
            return {"reason": f"an epoch of {self.dataset_len} samples is shorter than 4 batches of "
                              f"{cfg['batch_size']}"}
        pred = self.model.predict(cfg)
        if pred is not None and self.budget is not None and pred > self.budget:
            return {"reason": f"predicted peak host memory {pred:.0f} MiB > limit {self.budget:.0f} MiB",
                    "predicted_mib": pred}
        pd = self.model.predict_device(cfg)
        if pd is not None and self.dev_budget is not None and pd > self.dev_budget:
            return {"reason": f"predicted peak device memory {pd:.0f} MiB > limit {self.dev_budget:.0f} MiB",
                    "predicted_device_mib": pd}
        return None

    def run(self, cfg, phase, *, again=False):
        """Measure ``cfg`` (once; ``again`` measures it once more); returns
        its rate, or None when it was skipped or failed."""
        k = key(cfg)
        if k in self.runs and not again:
            return self.rate(cfg)
        if k in self.skipped:
            return None
        if k not in self.runs:
            skip = self._predict(cfg)
            if skip is not None:
                self.skipped[k] = dict(skip, config=cfg, phase=phase)
                return None
        if self.on_start is not None:
            self.on_start(cfg, phase)
        res = self.runner(cfg)
        self.n_runs += 1
        self.runs.setdefault(k, []).append(res)
        self.cfgs[k] = cfg
        self.phase.setdefault(k, phase)
        self.order.append((k, phase))
        self.model.add(cfg, res)
        if "error" not in res:
            if res.get("dataset_len"):
                self.dataset_len = res["dataset_len"]
            if res.get("device_total_mib"):
                self.dev_budget = LIMIT_SHARE * res["device_total_mib"]
        if self.on_result is not None:
            self.on_result(cfg, phase, res)
        return self.rate(cfg)

    # -- axis walks ---------------------------------------------------------------
    def walk_up(self, cfgs, phase, best=None):
        """Measure cfgs in order while each gains >= stop_gain over the best so
        far (starting from ``best``); stop at the first that does not pay (or
        cannot run).  Returns the best rate seen."""
        for c in cfgs:
            r = self.run(c, phase)
            if r is None:
                break
            if best is not None and r < best * (1 - self.stop_gain):
                # more of something measured clearly slower: more likely a busy moment on the
                # machine than the setting; measure it once more before giving up the axis
                r = self.run(c, phase, again=True)
            if best is not None and r < best * (1 + self.stop_gain):
                break
            best = r if best is None else max(best, r)
        return best

    def walk_down(self, cfgs, phase, best):
        """Measure cfgs (cheaper first) while each keeps within tolerance of best."""
        for c in cfgs:
            r = self.run(c, phase)
            if r is None or best is None or r < best * (1 - self.tol):
                break

    def pick(self, cfgs, cost):
        """The cheapest measured config within tolerance of the best rate among cfgs."""
        rated = [(c, self.rate(c)) for c in cfgs if self.rate(c)]
        if not rated:
            return None
        top = max(r for _, r in rated)
        return min((c for c, r in rated if r >= top * (1 - self.tol)), key=cost)


def _cost(auto_workers, grid):
    dr = {d: i for i, d in enumerate(["cpu", "device", "pinned", "copy"])}
    mr = {m: i for i, m in enumerate(grid.modes)}

    def cost(c):
        return (workers_value(c, auto_workers), c["num_workers"] == "auto", c["batch_size"], c["prefetch_factor"] or 0,
                mr.get(c.get("worker_mode"), 0), dr.get(c.get("delivery"), 9), bool(c["persistent_workers"]))
    return cost


def search(run, grid, auto_workers, *, confirm=True):
    """The coarse-to-fine walk over the axes (see the module docstring)."""
    cost = _cost(auto_workers, grid)
    base = grid.base()
    bss = grid.batch_sizes
    # 1. batch_size at num_workers=2: up from 32 (or the smallest) while it pays; down only if
    #    that cannot run.  (The first run has no prediction: nothing is known before it.)
    start = bss.index(32) if 32 in bss else 0
    run.walk_up([grid.make(base, batch_size=b) for b in bss[start:]], "batch_size")
    if not any(run.rate(grid.make(base, batch_size=b)) for b in bss):
        for b in reversed(bss[:start]):
            if run.run(grid.make(base, batch_size=b), "batch_size"):
                break
    cur = run.pick([grid.make(base, batch_size=b) for b in bss], cost)
    if cur is None:
        return None
    # 2. num_workers at that batch size: coarse up while it pays, coarse down while it costs nothing,
    #    then bisect between the fewest within tolerance and the next fewer measured
    ws = grid.numeric
    if ws and cur["num_workers"] != "auto":
        w0 = cur["num_workers"]
        co = coarse_workers(ws)
        best = run.rate(cur)
        best = run.walk_up([grid.make(cur, num_workers=w) for w in co if w > w0], "num_workers", best)
        run.walk_down([grid.make(cur, num_workers=w) for w in reversed(co) if w < w0], "num_workers", best)
        while True:
            measured = [w for w in ws if run.rate(grid.make(cur, num_workers=w))]
            chosen = run.pick([grid.make(cur, num_workers=w) for w in measured], cost)["num_workers"]
            lower = [w for w in measured if w < chosen]
            lo = max(lower) if lower else None
            between = [w for w in ws if (lo is None or w > lo) and w < chosen
                       and key(grid.make(cur, num_workers=w)) not in run.skipped]
            if lo is None or not between:
                break
            mid = between[len(between) // 2]
            if run.run(grid.make(cur, num_workers=mid), "num_workers (fine)") is None:
                break
        cur = run.pick([grid.make(cur, num_workers=w) for w in ws], cost) or cur
    if grid.auto:
        run.run(grid.make(cur, num_workers="auto"), "num_workers=auto")
        cur = run.pick([cur, grid.make(cur, num_workers="auto")], cost) or cur
    # 3. prefetch_factor (only with workers)
    if cur["num_workers"] != 0 and len(grid.prefetch) > 1:
        pf0 = cur["prefetch_factor"]
        best = run.rate(cur)
        best = run.walk_up([grid.make(cur, prefetch_factor=p) for p in grid.prefetch if p > pf0], "prefetch_factor",
                           best)
        run.walk_down([grid.make(cur, prefetch_factor=p) for p in reversed(grid.prefetch) if p < pf0],
                      "prefetch_factor", best)
        cur = run.pick([grid.make(cur, prefetch_factor=p) for p in grid.prefetch], cost) or cur
    # 4. delivery to the GPU, worker_mode
    for axis, values in (("delivery", grid.deliveries), ("worker_mode", grid.modes)):
        if len(values) > 1 and not (axis == "worker_mode" and cur["num_workers"] == 0):
            for v in values:
                run.run(grid.make(cur, **{axis: v}), axis)
            cur = run.pick([grid.make(cur, **{axis: v}) for v in values], cost) or cur
    # 5. persistent_workers: what it saves at the start of every epoch
    if cur["num_workers"] != 0 and True in grid.persistent and False in grid.persistent:
        run.run(grid.make(cur, persistent_workers=not cur["persistent_workers"]), "persistent_workers")
    # 6. measure the contenders once more, in turn, and average: the three best measured (the
    #    recommendation among them).  Each phase ran minutes apart; on a shared machine the load
    #    drifts in between, and one unlucky run should not decide.
    if confirm:
        rec = recommend(run, auto_workers)
        if rec is not None:
            rk = key(rec["config"]) if key(rec["config"]) in run.cfgs else None
            top = sorted((c for c in run.cfgs.values() if run.rate(c) and key(c) != rk), key=lambda c: -run.rate(c))
            contenders = ([run.cfgs[rk]] if rk else []) + top[:3 - bool(rk)]
            for c in contenders:
                run.run(c, "confirm", again=True)
    return cur


def exhaustive(run, grid):
    for c in grid.configs():
        run.run(c, "sweep")


# ----------------------------------------------------------------------------
# the recommendation


def _pct(a, b):
    return 100.0 * (a / b - 1.0)


def recommend(run, auto_workers):
    """{"config", "rate", "best", "reasons", ...} from what was measured, or None."""
    cost = _cost(auto_workers, run.grid)
    rated = {k: run.rate(c) for k, c in run.cfgs.items() if run.rate(c)}
    if not rated:
        return None
    best_k = max(rated, key=rated.get)
    top = rated[best_k]
    # choose without looking at persistent_workers; it is decided by its own measurement below
    pool = [run.cfgs[k] for k, r in rated.items() if r >= top * (1 - run.tol)]
    chosen = dict(min(pool, key=cost))
    rec = dict(chosen)
    rate = rated[key(rec)]
    reasons = []

    def res_of(c):
        rs = [r for r in run.runs.get(key(c), []) if "error" not in r]
        return rs[-1] if rs else {}

    def peak(c):
        vals = [r.get("peak_mib") for r in run.runs.get(key(c), []) if r.get("peak_mib")]
        return max(vals) if vals else None

    # persistent_workers: compare the epoch-start cost of the two variants measured
    # (at the recommended settings if both were run there, else where the search ran both)
    persist_note = None
    if rec["num_workers"] != 0:
        pairs = []
        for k, c in run.cfgs.items():
            on = dict(c, persistent_workers=True)
            if c["num_workers"] != 0 and not c["persistent_workers"] and key(on) in rated and k in rated:
                pairs.append((c, run.cfgs[key(on)]))
        pairs.sort(key=lambda p: key(p[0]) != key(dict(rec, persistent_workers=False)))
        if pairs:
            off, on = pairs[0]
            s_on, s_off = res_of(on).get("epoch_start_s"), res_of(off).get("epoch_start_s")
            if s_on is not None and s_off is not None:
                saved = s_off - s_on
                epoch = (run.dataset_len / rate) if (run.dataset_len and rate) else None
                here = key(off) == key(dict(rec, persistent_workers=False))
                # an epoch start includes loading its first batch, which varies run to run: a saving counts
                # from 10% of it (starting threads takes well under a millisecond; worker processes seconds)
                enough = saved >= max(0.002, 0.1 * s_off)
                slower = here and rated[key(on)] < top * (1 - run.tol)
                worth = enough and not slower
                rec = dict(rec, persistent_workers=worth)
                if key(rec) in rated:
                    rate = rated[key(rec)]
                share = f", {100 * saved / epoch:.2g}% of a {epoch:.1f} s epoch" if epoch and saved > 0 else ""
                where = "" if here else f" (measured at {settings(off, short=True)})"
                persist_note = (f"persistent_workers=True {'saves' if saved >= 0 else 'costs'} "
                                f"{abs(saved) * 1000:.0f} ms per epoch start ({s_off * 1000:.0f} -> "
                                f"{s_on * 1000:.0f} ms{share}){where}"
                                + ("" if worth else
                                   f", but its run was {-_pct(rated[key(on)], rated[key(off)]):.0f}% slower"
                                   if enough else ": not worth keeping the workers between epochs"))
    head = settings(rec, short=True)
    best_cfg = run.cfgs[best_k]
    measured_k = key(rec) if key(rec) in rated else key(chosen)
    if measured_k == best_k or rated[measured_k] >= top:
        reasons.append(f"{head}: the best measured, {rate:.0f} samples/s")
    else:
        reasons.append(f"{head}: {100 * rate / top:.0f}% of the best measured ({rate:.0f} vs {top:.0f} "
                       f"samples/s with {settings(best_cfg, short=True)})")
    # what the next larger settings would gain, and at what cost: from a pair of measured
    # configurations that differ only there (at the recommended settings when measured there)
    mc = run.cfgs[measured_k]
    mine = peak(mc)

    def pair(axis, v):
        out = []
        for k, c in run.cfgs.items():
            if c[axis] == mc[axis] and k in rated:
                o = key(run.grid.make(c, **{axis: v}))
                if o in rated and o != k:
                    out.append((c, run.cfgs[o]))
        out.sort(key=lambda p: key(p[0]) != measured_k)
        return out[0] if out else None

    numeric = mc["num_workers"] != "auto"
    for axis, bigger in (("batch_size", [b for b in run.grid.batch_sizes if b > mc["batch_size"]]),
                         ("num_workers", [w for w in run.grid.numeric if numeric and w > mc["num_workers"]]),
                         ("prefetch_factor", [p for p in run.grid.prefetch if mc["num_workers"] != 0
                                              and p > (mc["prefetch_factor"] or 0)])):
        for v in bigger:
            pr = pair(axis, v)
            if pr is not None:
                a_, b_ = pr
                g = _pct(rated[key(b_)], rated[key(a_)])
                if axis == "num_workers":
                    extra = v - mc["num_workers"]
                    what = f"{extra} more worker{'s' if extra > 1 else ''}"
                    if peak(a_) and peak(b_):
                        what += f" and {peak(b_) - peak(a_):+.0f} MiB"
                else:
                    what = f"{peak(b_) / peak(a_):.1f}x the memory" if (peak(a_) and peak(b_)) else "more memory"
                where = "" if key(a_) == measured_k else f" (measured at {settings(a_, short=True)})"
                name = "batch" if axis == "batch_size" else axis
                reasons.append(f"{name} {v} {'gains' if g >= 0 else 'loses'} {abs(g):.0f}% for {what}{where}")
                break
            sk = [s_ for s_ in run.skipped.values() if s_["config"][axis] == v
                  and (axis != "batch_size" or "predicted" in s_["reason"])]
            if sk:
                name = "batch" if axis == "batch_size" else axis
                reasons.append(f"{name} {v} was not run: {sk[0]['reason']}")
                break
    if numeric:
        a = run.grid.make(mc, num_workers="auto")
        if key(a) in rated:
            settled = res_of(a).get("auto_settled")
            reasons.append(f"num_workers='auto' reached {100 * rated[key(a)] / rate:.0f}% of this"
                           + (f" (settled on {settled} of {auto_workers} threads)" if settled else ""))
    if persist_note:
        reasons.append(persist_note)
    r = res_of(mc)
    w = r.get("wait_pct")
    if w is not None:
        if w >= 20:
            verdict = ("loading is the bottleneck: more CPUs, a lighter pipeline or pre-resized data would "
                       "speed training up" if rec["num_workers"] != 0 or not run.grid.numeric else
                       "loading is the bottleneck")
        elif w <= 5:
            verdict = "loading is hidden behind the step"
        else:
            verdict = "loading is mostly hidden"
        reasons.append(f"the step waits for data {w:.0f}% of the time: {verdict}")
    if run.skipped:
        mem = [s for s in run.skipped.values() if "predicted" in s["reason"]]
        if mem:
            reasons.append(f"{len(mem)} configuration(s) not run because their predicted memory crosses the limit")
    return {"config": rec, "rate": rate, "best": {"config": best_cfg, "rate": top},
            "fraction_of_best": rate / top, "reasons": reasons, "peak_mib": mine,
            "wait_pct": w, "ttfb_s": r.get("ttfb_s"), "epoch_start_s": r.get("epoch_start_s")}


# ----------------------------------------------------------------------------
# the public function


def _name(obj):
    if isinstance(obj, (str, os.PathLike)):
        return os.fspath(obj)
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


def heatmap_cells(run, grid, ref):
    """One cell per (batch_size, num_workers): the best rate measured there
    (over the other axes), its peak memory or else the predicted one for
    ``ref``'s other settings, and whether that crosses the budget."""
    cells = []
    for bs in grid.batch_sizes:
        for w in grid.workers:
            c = grid.make(ref, batch_size=bs, num_workers=w)
            here = [cc for cc in run.cfgs.values() if cc["batch_size"] == bs and cc["num_workers"] == w]
            rates = [run.rate(cc) for cc in here if run.rate(cc)]
            peaks = [r.get("peak_mib") for cc in here for r in run.runs[key(cc)] if r.get("peak_mib")]
            pred = run.model.predict(c)
            mem = max(peaks) if peaks else pred
            skipped = [s["reason"] for s in run.skipped.values()
                       if s["config"]["batch_size"] == bs and s["config"]["num_workers"] == w]
            cells.append({"batch_size": bs, "num_workers": w, "rate": max(rates) if rates else None,
                          "peak_mib": max(peaks) if peaks else None, "predicted_mib": pred,
                          "over_limit": bool(run.budget and mem and mem > run.budget),
                          "skipped": skipped[0] if skipped else None})
    return cells


def _default_batch_sizes():
    return [32, 64, 128, 256, 512]


def _default_workers(auto_workers):
    return list(range(0, max(1, auto_workers) + 1)) + ["auto"]


def make_runner(dataset=None, step=None, *, step_ms=0.0, step_busy=False, pipeline="train", epochs=2, samples=1024,
                min_batches=8, epoch_s=20.0, torch_threads=None, isolate=True, timeout=600.0):
    """(runner, dataset description, step description): ``runner(cfg)``
    measures one configuration (see :func:`tune` for the arguments), in a
    fresh process through the harness unless ``isolate`` is False."""
    import fastloader

    if dataset is None:
        from .sample import ensure_sample

        dataset = ensure_sample(2000)
    if isinstance(dataset, (str, os.PathLike)) and os.path.isdir(os.fspath(dataset)):
        root = os.path.abspath(os.fspath(dataset))
        ds_spec = {"kind": "folder", "root": root, "pipeline": pipeline}
        ds_desc = f"fastloader.ImageFolder({root!r}), {pipeline} pipeline: {H.PIPELINES[pipeline]}"
    else:
        ds_spec = {"kind": "callable", "target": as_target(dataset) if isolate else dataset}
        ds_desc = f"{_name(dataset)}()"
    if step is not None:
        st_spec = {"kind": "callable", "target": as_target(step) if isolate else step}
        st_desc = f"{_name(step)}(batch)"
    elif step_ms:
        st_spec = {"kind": "sim", "ms": float(step_ms), "busy": bool(step_busy)}
        st_desc = f"simulated, {step_ms:g} ms per batch ({'busy loop' if step_busy else 'time.sleep: CPU free'})"
    else:
        st_spec, st_desc = None, "none (the loop only fetches batches)"
    payload = {"dataset": ds_spec, "step": st_spec, "epochs": epochs, "samples": samples,
               "min_batches": min_batches, "epoch_s": epoch_s, "torch_threads": torch_threads}
    if isolate:
        sys_path = [os.getcwd() if p == "" else p for p in sys.path]
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(fastloader.__file__)))
        payload.update(call="fastloader.tuning:measure", sys_path=[pkg_root] + sys_path)

        def runner(cfg):
            return H.run_child(H.__file__, "module_child", dict(payload, config=cfg), timeout=timeout,
                               mem_interval=0.25)
    else:
        def runner(cfg):
            t = time.perf_counter()
            try:
                res = measure(dict(payload, config=cfg))
            except Exception as e:  # one configuration failing does not end the search
                res = {"error": f"{type(e).__name__}: {e}"}
            res["wall_s"] = time.perf_counter() - t
            return res
    return runner, ds_desc, st_desc


def tune(dataset=None, step=None, *, step_ms=0.0, step_busy=False, batch_sizes=None, num_workers=None,
         prefetch_factors=(2, 4), persistent_workers=(False, True), device="auto", worker_modes=None,
         pipeline="train", epochs=2, samples=1024, min_batches=8, epoch_s=20.0, memory_limit=None,
         stop_gain=0.05, tolerance=0.03, confirm=True, exhaustive_sweep=False, isolate=True, timeout=600.0,
         torch_threads=None, on_start=None, on_result=None, runner=None):
    """Search DataLoader settings for ``dataset`` and ``step``; returns a dict
    (``recommended``, ``results``, ``skipped``, ``grid``, ``memory``, ...).

    dataset: an image folder (fastloader.ImageFolder with the ``pipeline``
        transforms), a "module:callable" string or a module-level callable that
        returns the dataset (called in each measured process), or None for the
        cached 2000-image sample.
    step: "module:callable" or a callable taking a batch (your training step);
        or ``step_ms`` > 0: a simulated step of that many ms per batch
        (time.sleep, like waiting for a GPU; ``step_busy``: a busy loop).
    batch_sizes, num_workers ("auto" allowed), prefetch_factors,
    persistent_workers: the values of each axis (defaults: 32..512; 0..usable
        CPUs and "auto"; 2, 4; False, True).
    device: "auto" (deliveries to the GPU are an axis when CUDA is usable),
        "cpu" (batches stay on the host) or "cuda".
    worker_modes: worker_mode values (default: both, when DataLoader has the
        argument).
    epochs, samples, min_batches, epoch_s: each measurement runs ``epochs``
        epochs of max(min_batches, samples / batch_size, 2 x window) batches,
        at most ``epoch_s`` seconds each.
    memory_limit: bytes; the host budget is the lower of this and 90% of the
        memory available now.
    stop_gain, tolerance: an axis goes on while a step gains >= stop_gain; the
        recommendation is the cheapest within tolerance of the best.
    exhaustive_sweep: run every configuration of the grid instead (what the
        search is measured against).
    isolate: one fresh process per configuration (default); False measures in
        this process (faster; no per-configuration peak memory).
    on_start(cfg, phase), on_result(cfg, phase, result): progress callbacks.
    runner: test hook, ``runner(cfg) -> result dict`` replaces the measurement.
    """
    from fastloader.loader import auto_worker_limit

    t_start = time.perf_counter()
    auto_workers = auto_worker_limit()
    made, ds_desc, st_desc = make_runner(dataset, step, step_ms=step_ms, step_busy=step_busy, pipeline=pipeline,
                                         epochs=epochs, samples=samples, min_batches=min_batches, epoch_s=epoch_s,
                                         torch_threads=torch_threads, isolate=isolate, timeout=timeout)
    runner = runner or made
    # the axes
    from .cuda_delivery import cuda_available

    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    deliveries = ["copy", "pinned", "device"] if device == "cuda" else ["cpu"]
    modes = worker_modes if worker_modes is not None else available_worker_modes()
    grid = Grid(batch_sizes or _default_batch_sizes(),
                num_workers if num_workers is not None else _default_workers(auto_workers),
                prefetch_factors, persistent_workers, deliveries, modes)
    budget, budget_desc = host_budget_mib(memory_limit)
    model = MemoryModel(auto_workers)

    run = _Run(grid, runner, model, budget, stop_gain=stop_gain, tolerance=tolerance,
               on_result=on_result, on_start=on_start)
    if exhaustive_sweep:
        exhaustive(run, grid)
    else:
        search(run, grid, auto_workers, confirm=confirm)
    rec = recommend(run, auto_workers)
    results = []
    seen = set()
    for k, phase in run.order:
        if k in seen:
            continue
        seen.add(k)
        rs = run.runs[k]
        ok = [r for r in rs if "error" not in r]
        row = dict(run.cfgs[k])
        row["phase"] = run.phase[k]
        row["runs"] = len(rs)
        if ok:
            last = dict(ok[-1])
            last["rate"] = run.rate(run.cfgs[k])
            last["rates"] = [r.get("rate") for r in ok]
            last["peak_mib"] = max((r.get("peak_mib") or 0) for r in ok) or None
            row.update({f: last.get(f) for f in ("rate", "rates", "wait_pct", "ttfb_s", "epoch_start_s",
                                                  "peak_mib", "device_peak_mib", "sample_bytes", "batches",
                                                  "auto_settled", "num_workers_started", "wall_s")})
            row["over_limit"] = bool(budget and row["peak_mib"] and row["peak_mib"] > budget)
        else:
            row["error"] = rs[-1].get("error")
            row["stderr"] = rs[-1].get("stderr")
        results.append(row)
    fit = model.fit()
    # run-to-run variation of the configurations measured more than once: what a difference
    # between two configurations must exceed before it means anything on this machine now
    spreads = [(max(v) - min(v)) / max(v) for v in
               ([r["rate"] for r in rs if "error" not in r and r.get("rate")] for rs in run.runs.values())
               if len(v) > 1]
    return {
        "dataset": ds_desc, "step": st_desc, "device": device, "usable_cpus": sysinfo.usable_cpus(),
        "auto_workers": auto_workers, "grid": grid.as_dict(), "grid_size": len(grid.configs()),
        "exhaustive": bool(exhaustive_sweep), "isolate": bool(isolate),
        "per_config": {"epochs": epochs, "samples": samples, "min_batches": min_batches, "epoch_s": epoch_s},
        "stop_gain": stop_gain, "tolerance": tolerance,
        "memory": {"budget_mib": budget, "budget": budget_desc, "model": fit,
                   "sample_bytes": model.sample_mib * _MiB if model.sample_mib else None,
                   "device_budget_mib": run.dev_budget},
        "dataset_len": run.dataset_len,
        "results": results,
        "skipped": [dict(s, config=s["config"]) for s in run.skipped.values()],
        "runs": run.n_runs,
        "run_to_run_variation": max(spreads) if spreads else None,
        "recommended": rec,
        "cells": heatmap_cells(run, grid, rec["config"] if rec else
                               grid.make(grid.base(), batch_size=grid.batch_sizes[0])),
        "elapsed_s": time.perf_counter() - t_start,
    }
