"""A Hugging Face `datasets` image dataset: fastloader's native reader vs the usual recipe.

The sample folder (``python -m fastloader make-sample DIR --n 2000``) is
turned once into a `datasets` Arrow table -- an Image column with the JPEG
bytes embedded and a ClassLabel column, ``save_to_disk`` (cached under
--work-dir) -- and read three ways, side by side in one run:

  hf-torch   the usual recipe: load_from_disk(...).with_transform(fn), fn
             applying torchvision's transforms to each PIL image
             (image.convert("RGB"), as the transformers examples do), torch's
             DataLoader with a collate_fn stacking pixel_values and labels
  hf         fastloader.HFImageDataset(load_from_disk(...), transform=...)
             with fastloader.DataLoader (the Arrow buffers read in place)
  folder     fastloader.ImageFolder over the same JPEG files

all with batch_size=64, shuffle=True and the same pipeline (--pipeline,
default train), for each num_workers of --workers.  Every configuration runs
in a fresh process, interleaved over --rounds (fastloader/tools/harness.py).  The
page cache is warmed first (the Arrow files and the folder read once).

Reported: images/s after the first batch and time to first batch (building
the dataset and the loader included) per loader and num_workers; the ratio
of hf to hf-torch at each one's best num_workers (the target is >= 3x); and
hf vs folder at the same num_workers, paired per round (the target: within
10%).  On a shared machine the processes' speeds drift more than that, so
the two sources are also compared in one process (--ab-reps passes over the
same 256 samples on the calling thread, alternating, best of each).

    python benchmarks/bench_hf.py [--sample-dir DIR] [--workers 0,2]
        [--pipeline train|val] [--max-batches N (15)] [--rounds R (3)] [--work-dir DIR]
        [--rebuild] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH_SIZE = 64
DEFAULT_SAMPLE = os.path.join(os.path.expanduser("~"), ".cache", "fastloader", "sample-2000")
LOADERS = {
    "hf-torch": "load_from_disk + with_transform(torchvision on PIL images) + torch DataLoader",
    "hf": "fastloader.HFImageDataset(load_from_disk(...)) + fastloader.DataLoader",
    "folder": "fastloader.ImageFolder over the JPEG files + fastloader.DataLoader",
}


def _newest_mtime(root):
    newest = os.path.getmtime(root)
    for d, _, files in os.walk(root):
        newest = max([newest, os.path.getmtime(d)] + [os.path.getmtime(os.path.join(d, f)) for f in files])
    return newest


def _prepare(sample_dir, work_dir, rebuild):
    """The sample folder as a saved `datasets` table (images embedded):
    (path, seconds to build it or None when the cached copy was used)."""
    import datasets

    out = os.path.join(work_dir, os.path.basename(os.path.normpath(sample_dir)) + ".hf")
    stamp = os.path.join(out, "state.json")
    if os.path.exists(stamp) and not rebuild and os.path.getmtime(stamp) >= _newest_mtime(sample_dir):
        return out, None
    t0 = time.perf_counter()
    classes = sorted(e.name for e in os.scandir(sample_dir) if e.is_dir())
    paths, labels = [], []
    for k, c in enumerate(classes):  # ImageFolder's order
        for root, _, files in sorted(os.walk(os.path.join(sample_dir, c))):
            for f in sorted(files):
                paths.append(os.path.join(root, f))
                labels.append(k)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    ds = datasets.Dataset.from_dict({"image": paths, "label": labels}, features=features)
    ds.save_to_disk(out)  # embeds the files' bytes in the Arrow table
    return out, time.perf_counter() - t0


def _warm(path):
    n = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            with open(os.path.join(d, f), "rb") as fh:
                while True:
                    b = fh.read(1 << 20)
                    if not b:
                        break
                    n += len(b)
    return n


# ----------------------------------------------------------------------------
# child: one configuration in a fresh process


def _torch_recipe(path, pipeline, workers, seed):
    import datasets
    import torch

    tf = C.H.torch_transform(pipeline)

    def apply(batch):
        return {"pixel_values": [tf(im.convert("RGB")) for im in batch["image"]], "label": batch["label"]}

    def collate(examples):
        return torch.stack([e["pixel_values"] for e in examples]), torch.tensor([e["label"] for e in examples])

    ds = datasets.load_from_disk(path).with_transform(apply)
    return torch.utils.data.DataLoader(ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=workers,
                                       collate_fn=collate, generator=torch.Generator().manual_seed(seed))


def _ab(cfg) -> dict:
    """hf and folder in one process, on the calling thread, alternating, the
    best of `reps` passes over the same 256 samples each: the per-sample cost
    of the two sources without the machine's drift between processes."""
    import datasets
    import random

    import fastloader

    tf = C.H.fastloader_transform(cfg["pipeline"])
    dsets = {"hf": fastloader.HFImageDataset(datasets.load_from_disk(cfg["hf_path"]), transform=tf),
             "folder": fastloader.ImageFolder(cfg["folder_path"], transform=tf)}
    idx = random.Random(cfg["seed"]).sample(range(len(dsets["hf"])), 256)
    best = {"hf": float("inf"), "folder": float("inf")}
    for r in range(cfg["reps"]):
        for name in (("hf", "folder") if r % 2 == 0 else ("folder", "hf")):
            t0 = time.perf_counter()
            for k in range(0, len(idx), BATCH_SIZE):
                dsets[name].load_batch(idx[k:k + BATCH_SIZE], 0, cfg["seed"])
            best[name] = min(best[name], time.perf_counter() - t0)
    return {"hf_rate": len(idx) / best["hf"], "folder_rate": len(idx) / best["folder"],
            "ratio": best["folder"] / best["hf"]}


def child(cfg) -> dict:
    import datasets  # noqa: F401  (imports outside the timed region)
    import torch

    torch.set_num_threads(1)
    H = C.H
    if cfg.get("ab"):
        return _ab(cfg)
    loader, path, w, seed = cfg["loader"], cfg["path"], cfg["workers"], cfg["seed"]
    if loader == "hf-torch":
        import torchvision  # noqa: F401

        return H.time_loader(lambda: _torch_recipe(path, cfg["pipeline"], w, seed), epochs=1,
                             max_batches=cfg.get("max_batches"), hold_batch=True)
    import fastloader

    def make():
        tf = H.fastloader_transform(cfg["pipeline"])
        if loader == "hf":
            ds = fastloader.HFImageDataset(datasets.load_from_disk(path), transform=tf)
        else:
            ds = fastloader.ImageFolder(path, transform=tf)
        return fastloader.DataLoader(ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=w, seed=seed,
                                     generator=torch.Generator().manual_seed(seed))

    return H.time_loader(make, epochs=1, max_batches=cfg.get("max_batches"), hold_batch=True)


# ----------------------------------------------------------------------------
# parent


def _best(res, loader, workers):
    """(num_workers, median images/s) of the loader's fastest num_workers."""
    rates = [(C.median_of(res[(w, loader)], "rate"), w) for w in workers]
    rates = [(r, w) for r, w in rates if r is not None]
    if not rates:
        return None, None
    r, w = max(rates)
    return w, r


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--sample-dir", default=DEFAULT_SAMPLE,
                   help="an ImageFolder (python -m fastloader make-sample DIR --n 2000); default %(default)s")
    p.add_argument("--workers", default="0,2", help="comma-separated num_workers list (default %(default)s)")
    p.add_argument("--pipeline", choices=["train", "val"], default="train")
    p.add_argument("--max-batches", type=int, default=15,
                   help="cap on batches per configuration (default %(default)s: the run takes a few minutes; "
                        "0 for whole epochs)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ab-reps", type=int, default=10, help="passes of the same-process hf/folder A/B")
    p.add_argument("--work-dir", default=None,
                   help="where the saved dataset is kept (default: ~/.cache/fastloader/bench-sources)")
    p.add_argument("--rebuild", action="store_true", help="build the saved dataset again")
    p.add_argument("--mem-interval", type=float, default=0.5)
    p.add_argument("--out", help="also write the Markdown report to this file")
    a = p.parse_args(argv)

    sample = os.path.abspath(os.path.expanduser(a.sample_dir))
    if not os.path.isdir(sample):
        sys.exit(f"bench_hf: no sample folder at {sample}; make one with: "
                 f"python -m fastloader make-sample {sample} --n 2000")
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        sys.exit("bench_hf: needs the `datasets` package: pip install 'fastloader[datasets]'")
    C.import_fastloader("DataLoader", "ImageFolder", "HFImageDataset")
    workers = [int(w) for w in a.workers.split(",")]
    work = os.path.abspath(os.path.expanduser(a.work_dir or os.path.join("~", ".cache", "fastloader",
                                                                          "bench-sources")))
    os.makedirs(work, exist_ok=True)
    hf_path, built_s = _prepare(sample, work, a.rebuild)
    hf_bytes, folder_bytes = _warm(hf_path), _warm(sample)
    C.log(f"hf: {hf_path} ({hf_bytes / 2**20:.1f} MiB"
          + (f", built in {built_s:.1f} s" if built_s is not None else "")
          + f"); folder: {folder_bytes / 2**20:.1f} MiB")

    script = os.path.abspath(__file__)
    paths = {"hf-torch": hf_path, "hf": hf_path, "folder": sample}
    groups = [(w, [(name, dict(loader=name, path=paths[name], pipeline=a.pipeline, workers=w, seed=a.seed,
                               max_batches=a.max_batches)) for name in LOADERS]) for w in workers]
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg, mem_interval=a.mem_interval))
    ab = C.run_child(script, dict(ab=True, hf_path=hf_path, folder_path=sample, pipeline=a.pipeline, seed=a.seed,
                                  reps=a.ab_reps), mem_interval=0)
    C.log("same-process A/B: " + (ab["error"].strip().splitlines()[-1] if "error" in ab else
                                  f"hf {ab['hf_rate']:.0f}/s, folder {ab['folder_rate']:.0f}/s"))

    rep = C.Report("Hugging Face datasets: HFImageDataset vs with_transform + torch DataLoader vs ImageFolder")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- datasets {datasets.__version__}; sample: {sample} ({folder_bytes / 2**20:.1f} MiB of JPEGs), saved "
            f"with save_to_disk at {hf_path} ({hf_bytes / 2**20:.1f} MiB, images embedded)")
    rep.add(f"- pipeline {a.pipeline}: {C.H.PIPELINES[a.pipeline]}; batch {BATCH_SIZE}, shuffle, {a.rounds} "
            "round(s), " + (f"at most {a.max_batches} batches per run" if a.max_batches else "one epoch per run")
            + "; warm page cache")
    for name, what in LOADERS.items():
        rep.add(f"- {name}: {what}")
    rep.add("")
    headers = ["loader", "workers", "images/s (min-max)", "first batch (s)", "peak RSS (MiB)", "hf vs folder"]
    rows = []
    F = C.fmt
    for w in workers:
        for name in LOADERS:
            rs = res[(w, name)]
            if all("error" in r for r in rs):
                rows.append([name, str(w), "ERROR", "-", "-", "-"])
                continue
            lo, hi = C.spread(rs, "rate")
            rate = F(C.median_of(rs, "rate")) + (f" ({lo:.0f}-{hi:.0f})" if len(rs) > 1 and lo is not None else "")
            vs = C.fmt_ratio(C.paired_ratio(rs, res[(w, "folder")], "rate")) if name == "hf" else "-"
            rows.append([name, str(w), rate, F(C.median_of(rs, "ttfb_s"), ".2f"), F(C.median_of(rs, "rss_peak_mib")),
                         vs])
    rep.add(C.markdown_table(headers, rows))
    rep.add("")
    tw, tr = _best(res, "hf-torch", workers)
    fw, fr = _best(res, "hf", workers)
    if tr and fr:
        rep.add(f"At each one's best num_workers: hf {fr:.0f} images/s (num_workers={fw}) vs hf-torch {tr:.0f} "
                f"images/s (num_workers={tw}): **{fr / tr:.2f}x** (target >= 3x).")
    if "error" not in ab:
        rep.add(f"Same process, calling thread, hf and folder alternating, best of {a.ab_reps} passes over the same "
                f"256 samples: hf {ab['hf_rate']:.0f} images/s vs folder {ab['folder_rate']:.0f} images/s: "
                f"**{ab['ratio']:.3f}x** (the per-sample cost of the two sources, without the drift between "
                "processes that the table above has on a shared machine; target: within 10%).")
    else:
        res[("ab", "hf vs folder")] = [ab]
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
