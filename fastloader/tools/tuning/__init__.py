"""``fastloader.tune`` / ``python -m fastloader tune``: the manual tuning
procedure, automated, on the user's own dataset and step.

The procedure the articles teach, in their order: batch_size first, then
num_workers (including "auto"), then prefetch_factor, device delivery and
pin_memory (on a GPU), worker_mode (when fastloader.DataLoader has it), and
persistent_workers (the epoch-start cost it saves).

The parts, one responsibility each:
  grid.py     the configurations: axes, Grid, a configuration's key, text and cost
  search.py   the coarse-to-fine walk over the axes (Run: what was measured or skipped)
  measure.py  one configuration measured, in a fresh process through the harness
  memory.py   the memory model that keeps configurations over the limit from running
  report.py   the recommendation and its reasons; the heatmap's cells
This module is the entry: :func:`tune` ties them together, :func:`make_runner`
says where one configuration is measured.  It re-exports what the CLI
(cli_tune.py), doctor and the tests use.

The package imports only the standard library at module level (doctor uses
memory.predict_peak_mib without starting anything).
"""
from __future__ import annotations

import os
import sys
import time

from ... import sysinfo
from .. import harness as H
from . import measure, search
from .grid import AXES, DELIVERIES, Grid, available_worker_modes, coarse_workers, key, settings, workers_value
from .measure import as_target, loader_kwargs
from .memory import IN_HAND, LIMIT_SHARE, MemoryModel, MiB, host_budget_mib, inflight_batches, predict_peak_mib
from .report import heatmap_cells, recommend
from .search import Run, exhaustive

__all__ = ["tune", "make_runner", "default_workers", "Grid", "MemoryModel", "recommend", "predict_peak_mib",
           "inflight_batches", "available_worker_modes", "AXES", "DELIVERIES", "IN_HAND", "LIMIT_SHARE",
           "as_target", "coarse_workers", "heatmap_cells", "host_budget_mib", "key", "loader_kwargs", "settings",
           "workers_value"]

def _name(obj):
    if isinstance(obj, (str, os.PathLike)):
        return os.fspath(obj)
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


def _default_batch_sizes():
    return [32, 64, 128, 256, 512]


def default_workers(auto_workers):
    return list(range(0, max(1, auto_workers) + 1)) + ["auto"]


def make_runner(dataset=None, step=None, *, step_ms=0.0, step_busy=False, pipeline="train", epochs=2, samples=1024,
                min_batches=8, epoch_s=20.0, torch_threads=None, isolate=True, timeout=600.0):
    """(runner, dataset description, step description): ``runner(cfg)``
    measures one configuration (see :func:`tune` for the arguments), in a
    fresh process through the harness unless ``isolate`` is False."""
    import fastloader

    if dataset is None:
        from ..sample import ensure_sample

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
        payload.update(call="fastloader.tools.tuning.measure:measure", sys_path=[pkg_root] + sys_path)

        def runner(cfg):
            return H.run_child(H.__file__, "module_child", dict(payload, config=cfg), timeout=timeout,
                               mem_interval=0.25)
    else:
        def runner(cfg):
            t = time.perf_counter()
            try:
                res = measure.measure(dict(payload, config=cfg))
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
    from ...cuda_delivery import cuda_available

    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    deliveries = ["copy", "pinned", "device"] if device == "cuda" else ["cpu"]
    modes = worker_modes if worker_modes is not None else available_worker_modes()
    grid = Grid(batch_sizes or _default_batch_sizes(),
                num_workers if num_workers is not None else default_workers(auto_workers),
                prefetch_factors, persistent_workers, deliveries, modes)
    budget, budget_desc = host_budget_mib(memory_limit)
    model = MemoryModel(auto_workers)

    run = Run(grid, runner, model, budget, stop_gain=stop_gain, tolerance=tolerance,
               on_result=on_result, on_start=on_start)
    if exhaustive_sweep:
        exhaustive(run, grid)
    else:
        search.search(run, grid, auto_workers, confirm=confirm)
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
                   "sample_bytes": model.sample_mib * MiB if model.sample_mib else None,
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
