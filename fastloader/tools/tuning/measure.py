"""One configuration measured: :func:`measure` runs in a fresh process
(through the harness, fastloader/tools/harness.py: ``run_child`` with the
process tree's memory sampled), or in this one with ``isolate=False``.

For ``epochs`` epochs of at most ``samples`` samples each it records
samples/s and the share of time the step waits for data (both after each
epoch's first batch), the time to the first batch (loader construction +
first ``next``), the epoch-start cost (``iter()`` + first batch of the later
epochs), peak host memory (process + worker processes, measured by the
parent), and on a GPU peak device memory (torch's allocator + fastloader's
device pool).  The dataset and the step reach the fresh process by name
(:func:`as_target`: "module:callable" or "file.py:callable").
"""
from __future__ import annotations

import gc
import importlib
import importlib.util
import math
import os
import statistics
import sys
import time

from .. import harness as H
from .memory import MiB, inflight_batches

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

        return fastloader.ImageFolder(spec["root"], transform=H.fastloader_transform(spec.get("pipeline", "train")))
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
        from fastloader.cuda_delivery import map_tensors

        dev, nb_ = torch.device("cuda"), delivery == "pinned"
        move = lambda b: map_tensors(lambda x: x.to(dev, non_blocking=nb_), b)  # noqa: E731
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
        out["device_peak_mib"] = (torch.cuda.max_memory_reserved() + dev_pool) / MiB
        out["device_total_mib"] = torch.cuda.get_device_properties(0).total_memory / MiB
    del loader
    gc.collect()
    return out
