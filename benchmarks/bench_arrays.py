"""fastloader.ArrayDataset vs torch's TensorDataset over memory-mapped .npy files.

Two datasets, batch_size 256, shuffle=True, written once into a folder:

  tokens  token ids, 200,000 x 128 int64 (200 MB) + int64 labels.
          fastloader: DataLoader(ArrayDataset("tokens.npy", "labels.npy")),
          each batch's rows gathered in C with one call.
          torch: DataLoader(TensorDataset(torch.from_numpy(np.load(...,
          mmap_mode="r")), ...)): a row indexed and default_collate per sample.
  images  5,000 x 64 x 64 x 3 uint8 (61 MB) + labels, RandomResizedCrop(56)
          + RandomHorizontalFlip + ToTensor + Normalize.
          fastloader: ArrayDataset(..., transform=fastloader.transforms), the
          native pipeline on the mapped pixels.
          torch: a Dataset over the same mmap'ed arrays applying torchvision
          v2 to each CHW uint8 tensor (RandomResizedCrop(antialias=True),
          RandomHorizontalFlip, ToDtype(float32, scale=True), Normalize).

For num_workers 0 and 2, fastloader and torch side by side, each run in a
fresh process, interleaved over rounds (fastloader/tools/harness.py says how time
and memory are measured; the files are in the page cache, so this measures
the loaders, not the disk).

    python benchmarks/bench_arrays.py [--rounds 2] [--out FILE] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH_SIZE = 256
TOKENS = (200_000, 128)
IMAGES = (5_000, 64, 64, 3)
CROP = 56
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def make_data(d):
    """Write the .npy files into d (once)."""
    import numpy as np

    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    todo = {
        "tokens.npy": lambda: rng.integers(0, 50_000, size=TOKENS, dtype=np.int64),
        "token_labels.npy": lambda: rng.integers(0, 10, size=TOKENS[0], dtype=np.int64),
        "images.npy": lambda: rng.integers(0, 256, size=IMAGES, dtype=np.uint8),
        "image_labels.npy": lambda: rng.integers(0, 100, size=IMAGES[0], dtype=np.int64),
    }
    for name, make in todo.items():
        p = os.path.join(d, name)
        if not os.path.exists(p):
            np.save(p, make())


# ----------------------------------------------------------------------------
# child


class TorchImages:
    """torch's side of the images run: rows of the mmap'ed arrays through torchvision v2."""

    def __init__(self, d):
        import numpy as np
        import torch
        from torchvision.transforms import v2

        self.x = np.load(os.path.join(d, "images.npy"), mmap_mode="r")
        self.y = np.load(os.path.join(d, "image_labels.npy"), mmap_mode="r")
        self.tf = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip(),
                              v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        import torch

        img = torch.from_numpy(self.x[i].copy()).permute(2, 0, 1)
        return self.tf(img), int(self.y[i])


def child(cfg):
    import warnings

    import numpy as np
    import torch

    warnings.simplefilter("ignore")  # torch.from_numpy on a read-only map warns once
    torch.set_num_threads(1)         # as in torch's worker processes (both loaders alike)
    d, w, impl = cfg["dir"], cfg["workers"], cfg["impl"]
    if impl == "torch":
        # imports outside the timed region: 'first batch' must not include importing libraries
        import torchvision.transforms.v2  # noqa: F401
        from torch.utils.data import DataLoader, TensorDataset

        if cfg["dataset"] == "tokens":
            def make():
                arrs = [np.load(os.path.join(d, n), mmap_mode="r") for n in ("tokens.npy", "token_labels.npy")]
                ds = TensorDataset(*(torch.from_numpy(a) for a in arrs))
                return DataLoader(ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=w)
        else:
            def make():
                return DataLoader(TorchImages(d), batch_size=BATCH_SIZE, shuffle=True, num_workers=w)
    else:
        fl = C.import_fastloader("ArrayDataset")
        from fastloader import transforms as FT

        if cfg["dataset"] == "tokens":
            def make():
                ds = fl.ArrayDataset(os.path.join(d, "tokens.npy"), os.path.join(d, "token_labels.npy"))
                return fl.DataLoader(ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=w)
        else:
            def make():
                tf = FT.Compose([FT.RandomResizedCrop(CROP), FT.RandomHorizontalFlip(), FT.ToTensor(),
                                 FT.Normalize(MEAN, STD)])
                ds = fl.ArrayDataset(os.path.join(d, "images.npy"), os.path.join(d, "image_labels.npy"),
                                     transform=tf)
                return fl.DataLoader(ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=w)
    r = C.H.time_loader(make, epochs=cfg["epochs"], max_batches=cfg["max_batches"], hold_batch=True)
    r.update(cfg)
    return r


# ----------------------------------------------------------------------------
# parent

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--workers", default="0,2", help="comma-separated num_workers list (default 0,2)")
    p.add_argument("--dir", help="folder for the .npy files (default: a temporary folder, kept between runs)")
    p.add_argument("--out", help="also write the Markdown report to this file")
    p.add_argument("--mem-interval", type=float, default=0.5,
                   help="seconds between memory samples of the worker processes (0 disables)")
    a = p.parse_args(argv)
    try:
        C.import_fastloader("ArrayDataset")
    except C.FastloaderMissing as e:
        sys.exit(f"bench_arrays: {e}")
    d = a.dir or os.path.join(tempfile.gettempdir(), "fastloader-bench-arrays")
    t0 = time.perf_counter()
    make_data(d)
    C.log(f"data in {d} ({time.perf_counter() - t0:.1f}s)")
    workers = [int(x) for x in a.workers.split(",")]
    # tokens: one epoch (782 batches); images: 3 epochs (60 batches)
    runs = {"tokens": dict(epochs=1, max_batches=None), "images": dict(epochs=3, max_batches=None)}
    impls = ["fastloader", "torch"]
    script = os.path.abspath(__file__)
    groups = []
    for ds in runs:
        for w in workers:
            groups.append(((ds, w), [(impl, dict(impl=impl, dataset=ds, workers=w, dir=d, **runs[ds]))
                                     for impl in impls]))
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg, mem_interval=a.mem_interval))
    elapsed = time.perf_counter() - t0

    rep = C.Report("fastloader.ArrayDataset vs torch TensorDataset / torchvision over memory-mapped .npy files")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- batch_size {BATCH_SIZE}, shuffle=True, {a.rounds} interleaved round(s), each run in a fresh "
            "process; medians shown; ratio = median of per-round fastloader/torch ratios (>1: fastloader "
            "faster / larger); files in the page cache")
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("")
    descr = {"tokens": f"token ids {TOKENS[0]:,} x {TOKENS[1]} int64 + labels: ArrayDataset vs TensorDataset "
                       "(np.load mmap_mode='r')",
             "images": f"{IMAGES[0]:,} x {IMAGES[1]}x{IMAGES[2]}x{IMAGES[3]} uint8 + labels, "
                       f"RandomResizedCrop({CROP}) + flip + normalize: native pipeline vs torchvision v2 on "
                       "tensors"}
    labels = {"fastloader": "fastloader", "torch": "torch"}
    for ds in runs:
        rep.add(f"## {ds}: {descr[ds]}")
        rep.add("")
        rep.add(C.comparison_table(res, ds, workers, impls, labels, "samples"))
        best = {impl: max((C.median_of(res[((ds, w), impl)], "rate") or 0.0, w) for w in workers) for impl in impls}
        if best["torch"][0] > 0:
            rep.add("")
            rep.add(f"best vs best: fastloader {best['fastloader'][0]:,.0f}/s (num_workers={best['fastloader'][1]}) "
                    f"vs torch {best['torch'][0]:,.0f}/s (num_workers={best['torch'][1]}): "
                    f"{best['fastloader'][0] / best['torch'][0]:.1f}x")
        rep.add("")
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
