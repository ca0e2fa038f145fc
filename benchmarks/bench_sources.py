"""The same images from different storage: ImageFolder vs LMDB vs tar shards.

One ImageNet-like sample folder (``python -m fastloader make-sample DIR``) is
converted once into each storage format (cached under --work-dir), and the
same fastloader pipeline reads each of them, side by side in one run:

  folder  fastloader.ImageFolder(sample_dir, transform)
  lmdb    fastloader.LMDBDataset(work_dir/<name>.lmdb, transform)   (pack_lmdb)
  shards  fastloader.WebDataset(work_dir/<name>.shards/*.tar, transform, shuffle=1000)   (pack shards)

each with fastloader.DataLoader(ds, batch_size=64, shuffle=True,
num_workers=k) (shuffle=False for the stream, which shuffles itself).
With --tiny N the images are N tiny 32x32 JPEGs instead (made once), where
opening and reading each file costs more than decoding it.  Every configuration runs in a fresh process and the sources
alternate (fastloader/tools/harness.py).  Reported per source and num_workers:
images/s after the first batch, time to first batch (building the dataset
and the loader included), peak RSS and the process's resident file-backed
and anonymous memory at the end (an LMDB's pages read through its memory map
count in RSS as file-backed, reclaimable page cache; a folder's file reads
do not), the read and decode seconds of stats(), and how long each
conversion took.

The page cache is warmed for every source before the first run (each file
read once), so the numbers compare warm reads; a cold cache is a property of
the disk, not of the loader.

A source is one entry of SOURCES: prepare(sample_dir, work_dir, repack) ->
(path, seconds or None) and dataset(path, transform) -> a dataset.  To add
one (tar shards, arrays), add an entry.

    python benchmarks/bench_sources.py [--sample-dir DIR] [--sources folder,lmdb]
        [--workers 0,2] [--pipeline train|val] [--max-batches N] [--rounds R]
        [--work-dir DIR] [--repack] [--out FILE]
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


# ----------------------------------------------------------------------------
# sources: how to make each storage format from the sample folder, how to open it


def _prepare_folder(sample_dir, work_dir, repack):
    return sample_dir, None


def _dataset_folder(path, transform):
    import fastloader

    return fastloader.ImageFolder(path, transform=transform)


def _prepare_lmdb(sample_dir, work_dir, repack):
    from fastloader.tools.pack_lmdb import pack_lmdb

    out = os.path.join(work_dir, os.path.basename(os.path.normpath(sample_dir)) + ".lmdb")
    if os.path.exists(out) and not repack and os.path.getmtime(out) >= _newest_mtime(sample_dir):
        return out, None
    st = pack_lmdb(sample_dir, out, overwrite=True)
    return out, st["seconds"]


def _dataset_lmdb(path, transform):
    import fastloader

    return fastloader.LMDBDataset(path, transform=transform)


def _prepare_shards(sample_dir, work_dir, repack):
    from fastloader.tools.pack import pack_shards

    out = os.path.join(work_dir, os.path.basename(os.path.normpath(sample_dir)) + ".shards")
    index = os.path.join(out, "index.json")
    if os.path.exists(index) and not repack and os.path.getmtime(index) >= _newest_mtime(sample_dir):
        return out, None
    st = pack_shards(sample_dir, out, shard_size=64 << 20, progress=False, overwrite=True)
    return out, st["seconds"]


def _dataset_shards(path, transform):
    import glob

    import fastloader

    return fastloader.WebDataset(sorted(glob.glob(os.path.join(path, "*.tar"))), transform=transform, shuffle=1000)


SOURCES = {
    "folder": {"prepare": _prepare_folder, "dataset": _dataset_folder, "what": "ImageFolder over the JPEG files"},
    "lmdb": {"prepare": _prepare_lmdb, "dataset": _dataset_lmdb,
             "what": "LMDBDataset over one LMDB file (pack_lmdb), values read in place"},
    "shards": {"prepare": _prepare_shards, "dataset": _dataset_shards, "stream": True,
               "what": "WebDataset over 64 MiB tar shards (pack shards, shuffled at pack time), shuffle buffer 1000"},
}


def _make_tiny(work_dir, n, classes=10):
    """A folder of n tiny JPEGs (32x32, ~1 KiB each), made once: the case
    where opening and reading each file costs more than decoding it."""
    import numpy as np
    from PIL import Image

    root = os.path.join(work_dir, f"tiny-{n}")
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return root
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (64, 64, 3)).astype(np.uint8)
    for i in range(n):
        d = os.path.join(root, f"c{i % classes:02d}")
        if i < classes:
            os.makedirs(d, exist_ok=True)
        y, x = (i * 7) % 32, (i * 13) % 32
        Image.fromarray(base[y:y + 32, x:x + 32]).save(os.path.join(d, f"{i:07d}.jpg"), quality=85)
    open(marker, "w").close()
    return root


def _newest_mtime(root):
    newest = os.path.getmtime(root)
    for d, _, files in os.walk(root):
        newest = max([newest, os.path.getmtime(d)] + [os.path.getmtime(os.path.join(d, f)) for f in files])
    return newest


def _warm(path):
    """Read every file under path (or the file) once: a warm page cache."""
    paths = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                n += len(b)
    return n


# ----------------------------------------------------------------------------
# child: one configuration in a fresh process


def child(cfg) -> dict:
    import torch

    import fastloader  # noqa: F401  (imports outside the timed region)
    from fastloader import transforms  # noqa: F401

    torch.set_num_threads(1)
    H = C.H
    src = SOURCES[cfg["source"]]
    holder = {}

    if cfg["pipeline"] == "tiny":
        from fastloader import transforms as FT

        tf = FT.Compose([FT.Resize((32, 32)), FT.ToTensor()])
    else:
        tf = H.fastloader_transform(cfg["pipeline"])

    def make():
        ds = src["dataset"](cfg["path"], tf)
        # a stream shuffles itself (shard order + buffer); the sampler does for the others
        dl = fastloader.DataLoader(ds, batch_size=cfg["batch_size"], shuffle=not src.get("stream"),
                                   num_workers=cfg["workers"], seed=cfg["seed"],
                                   generator=torch.Generator().manual_seed(cfg["seed"]))
        holder["dl"] = dl
        return dl

    r = H.time_loader(make, epochs=1, max_batches=cfg.get("max_batches"), hold_batch=True)
    st = holder["dl"].stats()
    stages = st.get("stages_s", {})
    r["read_s"] = stages.get("read_s")
    r["decode_s"] = stages.get("decode_s")
    r["bytes_read"] = st.get("bytes_read")
    for field, key in (("RssFile", "rss_file_mib"), ("RssAnon", "rss_anon_mib")):
        v = H.status_kib(field)
        r[key] = None if v is None else v / 1024.0
    return r


# ----------------------------------------------------------------------------
# parent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--sample-dir", default=DEFAULT_SAMPLE,
                   help="an ImageFolder (python -m fastloader make-sample DIR --n 2000); default %(default)s")
    p.add_argument("--sources", default=",".join(SOURCES), help="comma-separated, of: " + ", ".join(SOURCES))
    p.add_argument("--workers", default="0,2", help="comma-separated num_workers list (default %(default)s)")
    p.add_argument("--pipeline", choices=["train", "val"], default="train")
    p.add_argument("--tiny", type=int, default=0, metavar="N",
                   help="instead of --sample-dir, a folder of N tiny (32x32) JPEGs made once under --work-dir, "
                        "read with Resize((32, 32)): the small-file case")
    p.add_argument("--max-batches", type=int, default=None, help="cap on batches per configuration")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians are reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None,
                   help="where converted copies are kept (default: ~/.cache/fastloader/bench-sources)")
    p.add_argument("--repack", action="store_true", help="convert again even if a copy is up to date")
    p.add_argument("--mem-interval", type=float, default=0.5)
    p.add_argument("--out", help="also write the Markdown report to this file")
    a = p.parse_args(argv)

    work = os.path.abspath(os.path.expanduser(a.work_dir or os.path.join("~", ".cache", "fastloader",
                                                                          "bench-sources")))
    os.makedirs(work, exist_ok=True)
    if a.tiny:
        t0 = time.perf_counter()
        a.sample_dir = _make_tiny(work, a.tiny)
        a.pipeline = "tiny"
        C.log(f"tiny folder: {a.sample_dir} ({time.perf_counter() - t0:.1f} s)")
    sample = os.path.abspath(os.path.expanduser(a.sample_dir))
    if not os.path.isdir(sample):
        sys.exit(f"bench_sources: no sample folder at {sample}; make one with: "
                 f"python -m fastloader make-sample {sample} --n 2000")
    names = [s for s in a.sources.split(",") if s]
    unknown = [s for s in names if s not in SOURCES]
    if unknown:
        sys.exit(f"bench_sources: unknown sources {unknown}; known: {list(SOURCES)}")
    workers = [int(w) for w in a.workers.split(",")]
    C.import_fastloader("DataLoader", "ImageFolder", "LMDBDataset", "WebDataset")

    paths, prep_s, sizes = {}, {}, {}
    for s in names:
        path, secs = SOURCES[s]["prepare"](sample, work, a.repack)
        paths[s], prep_s[s] = path, secs
        t0 = time.perf_counter()
        sizes[s] = _warm(path)
        C.log(f"{s}: {path} ({sizes[s] / 2**20:.1f} MiB"
              + (f", converted in {secs:.1f} s" if secs is not None else "")
              + f", warmed in {time.perf_counter() - t0:.1f} s)")

    script = os.path.abspath(__file__)
    groups = [(w, [(s, dict(source=s, path=paths[s], pipeline=a.pipeline, workers=w, batch_size=BATCH_SIZE,
                            seed=a.seed, max_batches=a.max_batches)) for s in names]) for w in workers]
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg, mem_interval=a.mem_interval))

    rep = C.Report("Storage formats: the same images as ImageFolder, LMDB and tar shards")
    rep.add("\n".join(C.environment_lines()))
    what = "Resize((32, 32)) + ToTensor" if a.pipeline == "tiny" else C.H.PIPELINES[a.pipeline]
    rep.add(f"- sample: {sample}; pipeline {a.pipeline}: {what}; batch {BATCH_SIZE}, "
            f"shuffle, {a.rounds} round(s), " + (f"at most {a.max_batches} batches per run" if a.max_batches
                                                 else "one epoch per run") + "; warm page cache")
    for s in names:
        rep.add(f"- {s}: {SOURCES[s]['what']}: {paths[s]}, {sizes[s] / 2**20:.1f} MiB"
                + (f", converted in {prep_s[s]:.1f} s" if prep_s[s] is not None else ""))
    rep.add("")
    headers = ["source", "workers", "images/s", "first batch (s)", "peak RSS (MiB)", "RSS file/anon at end (MiB)",
               "read s", "decode s", f"images/s vs {names[0]}"]
    rows = []
    F = C.fmt
    for w in workers:
        base = res[(w, names[0])]
        for s in names:
            rs = res[(w, s)]
            if all("error" in r for r in rs):
                rows.append([s, str(w), "ERROR"] + ["-"] * (len(headers) - 3))
                continue
            ratio = C.paired_ratio(rs, base, "rate") if s != names[0] else None
            rows.append([s, str(w), F(C.median_of(rs, "rate")), F(C.median_of(rs, "ttfb_s"), ".2f"),
                         F(C.median_of(rs, "rss_peak_mib")),
                         f"{F(C.median_of(rs, 'rss_file_mib'))} / {F(C.median_of(rs, 'rss_anon_mib'))}",
                         F(C.median_of(rs, "read_s"), ".3f"), F(C.median_of(rs, "decode_s"), ".2f"),
                         C.fmt_ratio(ratio) if ratio is not None else "-"])
    rep.add(C.markdown_table(headers, rows))
    rep.add("")
    rep.add("read s / decode s: stats()['stages_s'] summed over workers (num_workers=0 reports none). "
            "RSS file: pages of files mapped into the process (an LMDB's map, shared libraries); RSS anon: "
            "the process's own memory.")
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
