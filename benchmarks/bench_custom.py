"""A user's own image Dataset, before and after its one-line change to the native call.

"before" is the common training script: a Dataset class that lists its files
and labels itself, opens each file with Pillow and applies
torchvision.transforms.v2 (RandomResizedCrop 224, RandomHorizontalFlip,
ToImage, ToDtype(float32, scale=True), Normalize), under torch's DataLoader
(worker processes).  "after" is the same class with its decode-and-transform
line changed to ``fastloader.NativeTransform`` (read, decode and transform in
C with the GIL released) under fastloader.DataLoader (worker threads)::

    img = self.transform(Image.open(path).convert("RGB"))     # before
    img = self.load(path)                                      # after

With --unchanged, a third column runs the "before" class under
fastloader.DataLoader (the import swap alone); with --before PATH, another
runs "after" on the fastloader checkout at PATH (built in place), for a
before/after of a change to the loader in the same run.  Each configuration runs in a
fresh process (fastloader/tools/harness.py), all interleaved over the rounds, on
the sample images (``python -m fastloader make-sample``, cached).  The figure
that matters is "after" at its best num_workers over "before" at its best.

    python benchmarks/bench_custom.py [--workers 0,1,2,4] [--rounds 2] [--unchanged] [--before PATH] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH_SIZE = 64
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


# ----------------------------------------------------------------------------
# the user's dataset (module level, so torch's worker processes can use it)


def _list_files(root):
    """What such scripts do themselves: class folders in sorted order, files in each."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for label, c in enumerate(classes):
        d = os.path.join(root, c)
        samples += [(os.path.join(d, f), label) for f in sorted(os.listdir(d))
                    if f.lower().endswith((".jpg", ".jpeg"))]
    return samples


class PillowDataset:
    """Before: Pillow + torchvision.transforms.v2 in __getitem__."""

    def __init__(self, root):
        import torch
        from torchvision.transforms import v2

        self.samples = _list_files(root)
        self.transform = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.ToImage(),
                                     v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as im:
            img = self.transform(im.convert("RGB"))
        return img, label


class NativeCallDataset(PillowDataset):
    """After: the same class, its decode-and-transform line changed."""

    def __init__(self, root):
        import fastloader

        super().__init__(root)
        self.load = fastloader.NativeTransform(self.transform)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return self.load(path), label


# impl -> (dataset class, loader)
IMPLS = {
    "torch": (PillowDataset, "torch"),
    "fastloader": (NativeCallDataset, "fastloader"),
    "unchanged": (PillowDataset, "fastloader"),
    "before": (NativeCallDataset, "fastloader"),  # on the --before checkout
}
LABELS = {
    "torch": "before: Pillow+v2, torch DataLoader",
    "fastloader": "after: NativeTransform, fastloader.DataLoader",
    "unchanged": "Pillow+v2, fastloader.DataLoader",
    "before": "after, on the --before checkout",
}


# ----------------------------------------------------------------------------
# child


def child(cfg):
    """One measured configuration (runs in a fresh process, see C.run_child)."""
    import torch

    # as torch's worker processes do; for num_workers=0 this stops the main
    # process's OpenMP pool from spinning against the loader (both loaders alike)
    torch.set_num_threads(1)
    ds_cls, loader = IMPLS[cfg["impl"]]
    import torchvision.transforms.v2  # noqa: F401  (imports outside the timed region)
    from PIL import Image  # noqa: F401

    if loader == "torch":
        from torch.utils.data import DataLoader
    else:
        DataLoader = C.import_fastloader("DataLoader", "NativeTransform").DataLoader
    w = cfg["workers"]

    def make():
        return DataLoader(ds_cls(cfg["root"]), batch_size=BATCH_SIZE, shuffle=True, num_workers=w)

    r = C.H.time_loader(make, epochs=1, max_batches=cfg["max_batches"], hold_batch=True)
    r.update(cfg)
    return r


# ----------------------------------------------------------------------------
# parent


def _best(res, impl, workers):
    """(median samples/s, num_workers) of impl's best num_workers."""
    rates = [(C.median_of(res[(("custom", w), impl)], "rate") or 0.0, w) for w in workers]
    return max(rates)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--n", type=int, default=2000, help="images in the sample folder (default 2000)")
    p.add_argument("--root", default=None, help="use/create the sample folder here (default: the cache)")
    p.add_argument("--workers", default="0,1,2,4", help="comma-separated num_workers list")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; medians are reported")
    p.add_argument("--max-batches", type=int, default=16, help="batches of 64 per run")
    p.add_argument("--unchanged", action="store_true",
                   help="also run the Pillow dataset under fastloader.DataLoader (the import swap alone)")
    p.add_argument("--before", help="also run the native call on the fastloader checkout at this path")
    p.add_argument("--mem-interval", type=float, default=0.5,
                   help="seconds between memory samples of the worker processes (0 disables)")
    p.add_argument("--out", help="also write the Markdown report to this file")
    a = p.parse_args(argv)
    try:
        C.import_fastloader("DataLoader", "NativeTransform")
    except C.FastloaderMissing as e:
        sys.exit(f"bench_custom: {e}")

    workers = [int(x) for x in a.workers.split(",")]
    impls = ["torch", "fastloader"] + (["unchanged"] if a.unchanged else []) + (["before"] if a.before else [])
    sample = C.load_sample_module()
    root = sample.ensure_sample(a.n, a.root)
    script = os.path.abspath(__file__)
    groups = [(("custom", w), [(impl, dict(impl=impl, workers=w, root=root, max_batches=a.max_batches))
                               for impl in impls]) for w in workers]
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(
        script, cfg, mem_interval=a.mem_interval, env={"PYTHONPATH": a.before} if cfg["impl"] == "before" else None))
    elapsed = time.perf_counter() - t0

    rep = C.Report("A custom Dataset: Pillow + torchvision v2 vs the native call (fastloader.NativeTransform)")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- {len(_list_files(root))} sample JPEGs in {root}; batch_size {BATCH_SIZE}, shuffle=True, "
            f"{a.max_batches} batches per run, {a.rounds} interleaved round(s), each run in a fresh process; "
            "medians shown (min-max over rounds); samples/s after the first batch")
    rep.add("- transform: v2 RandomResizedCrop(224), RandomHorizontalFlip, ToImage, ToDtype(float32, scale=True), "
            "Normalize; " + " | ".join(f"{impl} = {LABELS[impl]}" for impl in impls))
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("")
    headers = ["workers"] + [f"{impl} samples/s" for impl in impls] + ["fastloader / torch (paired)"]
    rows = []
    for w in workers:
        row = [str(w)]
        for impl in impls:
            rs = res[(("custom", w), impl)]
            lo, hi = C.spread(rs, "rate")
            rate = C.fmt(C.median_of(rs, "rate"))
            row.append(rate + (f" ({lo:.0f}-{hi:.0f})" if len(rs) > 1 and lo is not None else ""))
        row.append(C.fmt_ratio(C.paired_ratio(res[(("custom", w), "fastloader")], res[(("custom", w), "torch")],
                                              "rate")))
        rows.append(row)
    rep.add(C.markdown_table(headers, rows))
    rep.add("")
    (tb, tw), (fb, fw) = _best(res, "torch", workers), _best(res, "fastloader", workers)
    line = (f"**Best against best: fastloader + NativeTransform {fb:.0f} samples/s (num_workers={fw}) / "
            f"torch + Pillow {tb:.0f} samples/s (num_workers={tw}) = {fb / tb:.2f}x**" if tb else "(no torch rate)")
    if "unchanged" in impls and tb:
        ub, uw = _best(res, "unchanged", workers)
        line += f"; the import swap alone: {ub:.0f} samples/s (num_workers={uw}) = {ub / tb:.2f}x"
    if "before" in impls:
        bb, bw = _best(res, "before", workers)
        line += (f"; the native call on {a.before}: {bb:.0f} samples/s (num_workers={bw}), this checkout / that "
                 f"one {fb / bb:.2f}x" if bb else "")
    rep.add(line)
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
