#!/usr/bin/env python
"""Soak test: many epochs with persistent workers; memory, threads and fds must stay flat.

    python scripts/soak.py --epochs 200      # the full soak (both datasets, a few minutes on 2 cores)
    python scripts/soak.py --quick           # 15 epochs, for CI or a test

Two phases, each with its own fastloader.DataLoader(persistent_workers=True,
num_workers=2, shuffle=True) over small JPEGs generated into a temporary
folder (class folders, 96-199 px, quality 85):

* native: fastloader.ImageFolder with RandomResizedCrop + RandomHorizontalFlip
  + ToTensor + Normalize (decoded and transformed in C);
* python: torchvision.datasets.ImageFolder with the same torchvision
  transforms (PIL in __getitem__, run by fastloader's worker threads).

After every epoch (and a gc.collect(); objects that exist before the first
phase are gc.freeze()d so that the collection is cheap) it reads this process's RSS (VmRSS in
/proc/self/status), its thread count (/proc/self/task) and its open fds
(/proc/self/fd), and checks that the epoch delivered every sample.  A phase
fails when RSS after the last epoch exceeds RSS after the warm-up epoch
(--warmup, default 10) by more than --rss-limit-mb (default 2 MB), when the
thread or fd count after any epoch differs from the count after the first,
or when threads or fds are not back to their pre-loader counts once the
loader is deleted.  Prints a table and a summary line; exits 1 on failure.

RSS noise: with glibc's default malloc settings the Python phase's RSS moves
up and down by whole batch buffers (0.8 MB) between epochs -- measured
between epoch 10 and 200: -0.7 to +2.4 MB with no trend -- because freed
batch-sized blocks are kept in the heap or not depending on their neighbours
(see fix_mmap_threshold).  The script therefore fixes M_MMAP_THRESHOLD at
128 KiB first (--malloc-default keeps glibc's default), so freed batches go
back to the system and RSS follows live memory.  --quick is meant to catch
gross leaks (a batch buffer per epoch is +0.8 MB per epoch here) and uses a
4 MB limit over its 10 measured epochs; the full run checks 2 MB over 190.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

# this checkout's fastloader (built in place by scripts/setup.sh), not whichever one is installed
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


# -- measurements ------------------------------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def settle(timeout: float = 3.0) -> tuple[int, int]:
    """(threads, fds) once they stop changing (worker threads exit
    asynchronously after a join returns; gc runs in between)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        gc.collect()
        cur = (threads(), fds())
        if cur == last or time.monotonic() > deadline:
            return cur
        last = cur
        time.sleep(0.05)


def fix_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """mallopt(M_MMAP_THRESHOLD, nbytes): blocks of nbytes and more always get
    their own mmap and go back to the system when freed.  glibc's default
    raises that threshold the first time such a block is freed, after which
    batch-sized buffers come from the heap, and whether a freed one is given
    back depends on what lies above it: RSS then moves up and down by whole
    batches (0.8 MB here) from one epoch to the next, which hides a leak or
    fakes one.  False where there is no glibc."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, nbytes))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


# -- data --------------------------------------------------------------------------


def make_images(root: str, n: int, classes: int, seed: int) -> None:
    """n small JPEGs in `classes` class folders: smooth random colour fields
    (a few pixels upscaled) plus noise, 96-199 px on each side."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        d = os.path.join(root, f"class{i % classes:02d}")
        os.makedirs(d, exist_ok=True)
        w, h = (int(v) for v in rng.integers(96, 200, size=2))
        small = Image.fromarray(rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8), "RGB")
        img = np.asarray(small.resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
        img = np.clip(img + rng.integers(-12, 13, size=img.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img, "RGB").save(os.path.join(d, f"img{i:05d}.jpg"), quality=85)


def make_dataset(kind: str, root: str, size: int):
    if kind == "native":
        import fastloader
        from fastloader import transforms as FT

        tf = FT.Compose([FT.RandomResizedCrop(size), FT.RandomHorizontalFlip(), FT.ToTensor(),
                         FT.Normalize(MEAN, STD)])
        return fastloader.ImageFolder(root, transform=tf)
    import torchvision
    from torchvision import transforms as T

    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    return torchvision.datasets.ImageFolder(root, transform=tf)


# -- one phase ---------------------------------------------------------------------


def soak(kind: str, root: str, args, show) -> dict:
    import fastloader

    gc.collect()
    base_threads, base_fds = settle()
    ds = make_dataset(kind, root, args.size)
    dl = fastloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                               persistent_workers=True, seed=args.seed, timeout=60)
    n = len(ds)
    rows = []
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        samples = 0
        check = 0.0
        for images, labels in dl:
            samples += len(labels)
            check += float(images[:, :, 0, 0].sum())  # touch every batch
        secs = time.perf_counter() - t0
        if samples != n or not np.isfinite(check):
            raise RuntimeError(f"{kind} epoch {epoch}: {samples} samples of {n} (checksum {check})")
        gc.collect()
        st = dl.stats()
        row = dict(epoch=epoch, secs=secs, samples=samples, rss=rss_mb(), threads=threads(), fds=fds(),
                   pool=st.get("pool_bytes", 0) / 2**20 if kind == "native" else None)
        rows.append(row)
        show(kind, row, rows)
    del dl, ds
    end_threads, end_fds = settle()
    return dict(rows=rows, base_threads=base_threads, base_fds=base_fds, end_threads=end_threads,
                end_fds=end_fds)


def verdict(kind: str, res: dict, args) -> tuple[bool, str]:
    rows = res["rows"]
    w = rows[min(args.warmup, len(rows)) - 1]
    last = rows[-1]
    growth = last["rss"] - w["rss"]
    peak = max(r["rss"] for r in rows[w["epoch"] - 1:]) - w["rss"]
    threads_set = sorted({r["threads"] for r in rows})
    fds_set = sorted({r["fds"] for r in rows})
    problems = []
    if growth > args.rss_limit_mb:
        problems.append(f"RSS grew {growth:+.2f} MB after epoch {w['epoch']} (limit {args.rss_limit_mb} MB)")
    if len(threads_set) > 1:
        problems.append(f"thread count not flat: {threads_set}")
    if len(fds_set) > 1:
        problems.append(f"fd count not flat: {fds_set}")
    if res["end_threads"] != res["base_threads"]:
        problems.append(f"threads {res['base_threads']} before the loader, {res['end_threads']} after deleting it")
    if res["end_fds"] != res["base_fds"]:
        problems.append(f"fds {res['base_fds']} before the loader, {res['end_fds']} after deleting it")
    secs = sum(r["secs"] for r in rows)
    post = rows[w["epoch"] - 1:]
    trend = 100 * float(np.polyfit([r["epoch"] for r in post], [r["rss"] for r in post], 1)[0]) if len(post) > 2 else 0.0
    text = (f"{kind}: {len(rows)} epochs in {secs:.1f} s; RSS {w['rss']:.1f} MB after epoch {w['epoch']} -> "
            f"{last['rss']:.1f} MB after epoch {last['epoch']} ({growth:+.2f} MB, peak {peak:+.2f} MB, "
            f"trend {trend:+.2f} MB/100 epochs, limit {args.rss_limit_mb} MB); threads {'/'.join(map(str, threads_set))} "
            f"({res['base_threads']} before the loader, {res['end_threads']} after it); "
            f"fds {'/'.join(map(str, fds_set))} ({res['base_fds']} before, {res['end_fds']} after)")
    if problems:
        text += " -- FAIL: " + "; ".join(problems)
    return not problems, text


# -- main --------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--quick", action="store_true",
                    help="15 epochs, warm-up 5, 128 images, RSS limit 4 MB (for CI; see below)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="epochs before the RSS baseline (default 10; 5 with --quick)")
    ap.add_argument("--rss-limit-mb", type=float, default=None, help="default 2 (4 with --quick)")
    ap.add_argument("--images", type=int, default=None, help="JPEGs to generate (default 256; 128 with --quick)")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--size", type=int, default=64, help="RandomResizedCrop output size")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("native", "python"), default=None, help="run one phase")
    ap.add_argument("--data", default=None, help="use (and keep) this folder for the images")
    ap.add_argument("--malloc-default", action="store_true",
                    help="keep glibc's dynamic mmap threshold (see fix_mmap_threshold)")
    ap.add_argument("--every", type=int, default=None, help="print every Nth epoch (default: about 20 rows)")
    args = ap.parse_args(argv)
    if args.quick:
        args.epochs = 15
    if args.images is None:
        args.images = 128 if args.quick else 256
    if args.rss_limit_mb is None:
        args.rss_limit_mb = 4.0 if args.quick else 2.0
    if args.warmup is None:
        args.warmup = 5 if args.quick else 10
    if args.epochs <= args.warmup:
        ap.error(f"--epochs ({args.epochs}) must be more than --warmup ({args.warmup})")
    every = args.every or max(1, args.epochs // 20)

    fixed = False if args.malloc_default else fix_mmap_threshold()

    import torch
    import torchvision  # noqa: F401  (imported before gc.freeze below)

    import fastloader

    torch.set_num_threads(1)  # no intra-op pool threads coming and going
    warnings.filterwarnings("ignore", category=fastloader.PerformanceWarning)  # the GIL advice, once per loader

    tmp = None
    root = args.data
    if root is None:
        tmp = tempfile.mkdtemp(prefix="fastloader-soak-")
        root = os.path.join(tmp, "train")
    if not os.path.isdir(root) or not os.listdir(root):
        make_images(root, args.images, args.classes, args.seed)
    print(f"soak: fastloader {getattr(fastloader, '__version__', '?')} ({os.path.dirname(fastloader.__file__)}), "
          f"torch {torch.__version__}, "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.images} JPEGs in {root}; "
          f"batch {args.batch_size}, num_workers={args.workers}, persistent_workers=True, "
          f"RandomResizedCrop({args.size}) + flip + ToTensor + Normalize; {args.epochs} epochs, "
          f"RSS baseline after epoch {args.warmup}; malloc: "
          f"{'M_MMAP_THRESHOLD fixed at 128 KiB' if fixed else 'default'}", flush=True)
    print(f"{'phase':<7} {'epoch':>5} {'s/epoch':>8} {'samples':>7} {'RSS MB':>8} {'dRSS MB':>8} "
          f"{'threads':>7} {'fds':>4} {'pool MB':>7}", flush=True)

    def show(kind, row, rows):
        e = row["epoch"]
        if not (e <= 3 or e % every == 0 or e == args.warmup or e == args.epochs):
            return
        d = f"{row['rss'] - rows[args.warmup - 1]['rss']:+8.2f}" if e >= args.warmup else f"{'':>8}"
        pool = f"{row['pool']:7.2f}" if row["pool"] is not None else f"{'-':>7}"
        print(f"{kind:<7} {e:>5} {row['secs']:8.3f} {row['samples']:>7} {row['rss']:8.1f} {d} "
              f"{row['threads']:>7} {row['fds']:>4} {pool}", flush=True)

    # the gc.collect() after each epoch would walk torch's and torchvision's
    # objects (0.5 s here); move what exists now out of the collector's sight
    gc.collect()
    gc.freeze()
    ok = True
    lines = []
    t0 = time.perf_counter()
    try:
        for kind in ("native", "python"):
            if args.only and kind != args.only:
                continue
            res = soak(kind, root, args, show)
            good, text = verdict(kind, res, args)
            ok &= good
            lines.append(text)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    for text in lines:
        print(text)
    print(f"soak: {'PASS' if ok else 'FAIL'} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
