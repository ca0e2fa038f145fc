"""The batch stage alone: fastloader's native MixUp / CutMix (csrc/image/mix.c)
against the libraries' own objects on the same CPU batch (64 x 3 x 224 x 224
float32 and int64 labels, 1000 classes by default).

Rows: timm's ``Mixup`` in its three modes (MixUp only, CutMix only, and timm's
train.py defaults: mixup 0.8, cutmix 1.0, switch_prob 0.5, smoothing 0.1),
and torchvision v2's ``RandomChoice([MixUp(0.2), CutMix(1.0)])``.  Columns,
each the median of --repeats calls in milliseconds per batch:

  * ``native``: ``BatchStage(obj)((images, labels), seed, epoch, batch)``,
    what fastloader.DataLoader(batch_transform=obj) runs on its loop thread
    for each batch (the object's settings read again, the draws, the C
    mixing with the GIL released, the soft labels);
  * ``obj tN``: the object itself, ``obj(images, labels)``, with
    torch.set_num_threads(N) for each N of --threads (1: what a DataLoader
    worker process runs a collate_fn with; the machine's cores: timm's
    train.py calling mixup_fn in its loop).

A first line times one copy of the batch (torch's ``copy_``, one thread):
what reading and writing the batch's memory once costs on this machine.

Every call starts from the same batch, copied into the working tensor
first (the copy is outside the timing); the mode's random draws differ from
call to call (the batch number, numpy's generator), so CutMix's box sizes
vary as they do in training.  Ratios are obj / native (above 1: native is
faster).

Usage:
  python benchmarks/bench_mix.py [--batch 64] [--size 224] [--classes 1000] [--repeats 30] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def cases(classes):
    from timm.data import Mixup
    from torchvision.transforms import v2

    out = []
    for mode in ("batch", "pair", "elem"):
        out += [(f"timm {mode}: mixup 0.8 only", Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, mode=mode,
                                                       num_classes=classes)),
                (f"timm {mode}: cutmix 1.0 only", Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, mode=mode,
                                                        num_classes=classes)),
                (f"timm {mode}: train.py defaults", Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1,
                                                          mode=mode, num_classes=classes))]
    out.append(("torchvision v2 RandomChoice(MixUp 0.2, CutMix 1.0)",
                v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes),
                                 v2.CutMix(alpha=1.0, num_classes=classes)])))
    return out


def time_calls(fn, src, x, y, repeats):
    """Median milliseconds of fn(x, y, k) over repeats calls, x refilled from src before each."""
    times = []
    for k in range(repeats + 1):
        x.copy_(src)
        t0 = time.perf_counter()
        fn(x, y, k)
        dt = time.perf_counter() - t0
        if k:   # the first call warms caches and allocators
            times.append(dt * 1e3)
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", default="1,2", help="torch thread counts for the objects' own runs")
    a = p.parse_args(argv)

    import numpy as np
    import torch

    from fastloader.batch import BatchStage

    np.random.seed(0)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    src = torch.randn(a.batch, 3, a.size, a.size, generator=g)
    y = torch.randint(0, a.classes, (a.batch,), generator=g)
    x = torch.empty_like(src)
    threads = [int(t) for t in a.threads.split(",") if t]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"batch {a.batch} x 3 x {a.size} x {a.size} float32, {a.classes} classes; median of {a.repeats} calls, ms; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}" if load else "")
    head = f"{'case':52} {'native':>8} " + " ".join(f"{'obj t' + str(t):>8}" for t in threads) + "  " + \
        " ".join(f"{'x t' + str(t):>6}" for t in threads)
    print(head)
    torch.set_num_threads(1)
    dst = torch.empty_like(src)
    ref = time_calls(lambda xx, yy, k: dst.copy_(xx), src, x, y, a.repeats)
    print(f"{'(reference: one copy of the batch, torch copy_, t1)':52} {ref:8.2f}")
    for name, obj in cases(a.classes):
        stage = BatchStage(obj)
        assert stage.spec is not None, (name, stage.description)
        # one torch thread around the native calls too: the batch refill's
        # OpenMP threads would otherwise spin on the cores the C code runs on
        torch.set_num_threads(1)
        nat = time_calls(lambda xx, yy, k: stage((xx, yy), 7, 0, k), src, x, y, a.repeats)
        own = []
        for t in threads:
            torch.set_num_threads(t)
            own.append(time_calls(lambda xx, yy, k: obj(xx, yy), src, x, y, a.repeats))
        print(f"{name:52} {nat:8.2f} " + " ".join(f"{o:8.2f}" for o in own) + "  " +
              " ".join(f"{o / nat:6.2f}" for o in own))
    return 0


if __name__ == "__main__":
    sys.exit(main())
