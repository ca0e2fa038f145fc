"""fastloader.DataLoader vs torch.utils.data.DataLoader on Python datasets.

Two map-style datasets, each about 1 ms of work per sample:

  numpy   work that releases the GIL: a few vectorised numpy ops on a
          256x256x3 float32 array (768 KiB) per sample; returns a 3x256x256
          float32 tensor and an int label.  Threads can overlap this.
  python  pure-Python arithmetic (holds the GIL); returns a 16-float tensor and
          an int label.  Threads cannot overlap this; processes can.

For num_workers in 0, 1, 2, 4 (batch_size 32) each configuration runs in a fresh
subprocess, fastloader and torch side by side, for several interleaved rounds;
the tables show medians and the median of the per-round fastloader/torch
ratios.  See fastloader/tools/harness.py for how time and memory are measured.

    python benchmarks/bench_python.py [--quick] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH_SIZE = 32
IMG_SHAPE = (256, 256, 3)
PY_ITERS = 8200  # pure-Python loop iterations per sample (~1 ms on a ~3 GHz core)


# ----------------------------------------------------------------------------
# datasets (defined at module level so torch's worker processes can use them)


class NumpyDataset:
    """~1 ms of GIL-releasing numpy work per sample on a 768 KiB array."""

    def __init__(self, n):
        import numpy as np

        self.n = n
        rng = np.random.default_rng(0)
        self.base = rng.random(IMG_SHAPE, dtype=np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np
        import torch

        if not 0 <= i < self.n:
            raise IndexError(i)
        x = self.base * np.float32(0.5 + (i % 97) / 97.0)   # new 768 KiB array
        x += np.float32((i % 13) / 13.0)
        np.sqrt(x, out=x)
        np.multiply(x, x[::-1], out=x)                       # flip-and-blend
        y = np.ascontiguousarray(x.transpose(2, 0, 1))       # HWC -> CHW
        t = y[:, :, :-2] + y[:, :, 1:-1]                     # 3x3 box blur
        t += y[:, :, 2:]
        y[:, :, 1:-1] = t
        t = y[:, :-2, :] + y[:, 1:-1, :]
        t += y[:, 2:, :]
        y[:, 1:-1, :] = t
        flat = y.reshape(3, -1)                              # per-channel standardise
        mean = flat.mean(axis=1, dtype=np.float32).reshape(3, 1, 1)
        std = flat.std(axis=1, dtype=np.float32).reshape(3, 1, 1) + np.float32(1e-6)
        y -= mean
        y /= std
        np.clip(y, -3.0, 3.0, out=y)
        return torch.from_numpy(y), i % 10


class PythonDataset:
    """~1 ms of pure-Python arithmetic per sample (holds the GIL)."""

    def __init__(self, n, iters=PY_ITERS):
        self.n = n
        self.iters = iters

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        if not 0 <= i < self.n:
            raise IndexError(i)
        acc = i + 1
        s = 0.0
        for k in range(self.iters):
            acc = (acc * 1103515245 + 12345) & 0x7FFFFFFF
            s += (acc >> 8) * 1e-9 - k * 1e-12
        out = [((acc >> j) & 255) / 255.0 + s * 1e-6 for j in range(16)]
        return torch.tensor(out, dtype=torch.float32), i % 10


DATASETS = {"numpy": NumpyDataset, "python": PythonDataset}


# ----------------------------------------------------------------------------
# child


def _loader_class(impl, stand_in):
    if impl == "torch" or stand_in == "torch":
        import torch.utils.data

        return torch.utils.data.DataLoader
    fl = C.import_fastloader("DataLoader")
    return fl.DataLoader


def child(cfg):
    """One measured configuration (runs in a fresh process, see C.run_child)."""
    import torch

    # as in torch's worker processes; for num_workers=0 this stops the main process's OpenMP
    # pool from spinning against the loader on a small, shared machine (both loaders alike)
    torch.set_num_threads(1)
    Loader = _loader_class(cfg["impl"], cfg.get("stand_in"))
    n = cfg["batches"] * BATCH_SIZE
    ds = DATASETS[cfg["dataset"]](n)
    w = cfg["workers"]

    def make():
        return Loader(ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=w)

    r = C.H.time_loader(make, epochs=1, hold_batch=True)  # a batch lives until the next one arrives
    r.update(cfg)
    return r


def per_sample_ms(dataset, reps=40):
    """Single-threaded cost of one sample, measured in this process."""
    ds = DATASETS[dataset](reps)
    ds[0]
    t = time.perf_counter()
    for i in range(reps):
        ds[i]
    return (time.perf_counter() - t) / reps * 1e3


# ----------------------------------------------------------------------------
# parent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="one round of fewer batches (< 1 min)")
    p.add_argument("--out", help="also write the Markdown report to this file")
    p.add_argument("--workers", default=None, help="comma-separated num_workers list (default 0,1,2,4)")
    p.add_argument("--datasets", default="numpy,python", help="comma-separated subset of: numpy,python")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --quick 1)")
    p.add_argument("--batches", type=int, default=None, help="batches per run (default 60; --quick 30)")
    p.add_argument("--only", choices=["both", "fastloader", "torch"], default="both")
    p.add_argument("--mem-interval", type=float, default=0.5,
                   help="seconds between memory samples of the worker processes (0 disables)")
    p.add_argument("--impl-for-fastloader", choices=["fastloader", "torch"], default="fastloader",
                   help=argparse.SUPPRESS)  # debug: run torch in the fastloader slot
    a = p.parse_args(argv)

    workers = [int(x) for x in (a.workers or "0,1,2,4").split(",")]
    rounds = a.rounds or (1 if a.quick else 3)
    batches = a.batches or (30 if a.quick else 60)
    datasets = [d for d in a.datasets.split(",") if d]
    for d in datasets:
        if d not in DATASETS:
            p.error(f"unknown dataset {d!r}")
    impls = ["fastloader", "torch"] if a.only == "both" else [a.only]
    stand_in = a.impl_for_fastloader if a.impl_for_fastloader != "fastloader" else None
    fl_label = "fastloader" if stand_in is None else "fastloader[=torch stand-in]"

    if "fastloader" in impls and stand_in is None:
        try:
            C.import_fastloader("DataLoader")
        except C.FastloaderMissing as e:
            sys.exit(f"bench_python: {e}")

    script = os.path.abspath(__file__)
    cost = {d: per_sample_ms(d) for d in datasets}
    groups = []
    for d in datasets:
        for w in workers:
            cfgs = [(impl, dict(impl=impl, dataset=d, workers=w, batches=batches, stand_in=stand_in))
                    for impl in impls]
            groups.append(((d, w), cfgs))
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, rounds, lambda cfg: C.run_child(script, cfg, mem_interval=a.mem_interval))
    elapsed = time.perf_counter() - t0

    rep = C.Report("fastloader.DataLoader vs torch.utils.data.DataLoader: Python datasets")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- batch_size {BATCH_SIZE}, shuffle=True, {batches} batches ({batches * BATCH_SIZE} samples) per run, "
            f"{rounds} interleaved round(s), each run in a fresh process; medians shown; "
            f"ratio = median of per-round fastloader/torch ratios (>1: fastloader faster / larger)")
    rep.add(f"- samples/s is measured after the first batch; 'first' is the time from constructing the loader "
            f"to the first batch; RSS = main-process peak (VmHWM); total = peak of "
            f"RSS(main) + private memory of worker processes (sampled every {a.mem_interval}s); base = RSS before the loader was built (mostly `import torch`)")
    rep.add("- per-sample cost, single thread in the parent: "
            + ", ".join(f"{d} {cost[d]:.2f} ms" for d in datasets))
    if stand_in:
        rep.add(f"- NOTE: --impl-for-fastloader {stand_in}: the 'fastloader' column is torch.utils.data.DataLoader "
                "(debug stand-in), so ratios only show the noise level")
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("")

    descr = {"numpy": "GIL-releasing numpy work (256x256x3 float32 per sample)",
             "python": "pure-Python work (holds the GIL)"}
    for d in datasets:
        rep.add(f"## {d}: {descr[d]}")
        rep.add("")
        labels = {"fastloader": fl_label, "torch": "torch"}
        rep.add(C.comparison_table(res, d, workers, impls, labels, "samples"))
        base = C.median_of([r for k, v in res.items() if k[0][0] == d for r in v], "base_rss_mib")
        rep.add("")
        rep.add(f"(base RSS before building the loader: {C.fmt(base)} MiB; samples/s shows median (min-max))")
        rep.add("")
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
