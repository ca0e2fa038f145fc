"""Tar shards (WebDataset layout): fastloader.WebDataset, from local disk and
over loopback HTTP (the real nginx), against the webdataset library + torch's
DataLoader + torchvision, and fastloader.ImageFolder over the same images.

The images are the project's sample folder (``python -m fastloader
make-sample``), packed with ``python -m fastloader pack shards`` (shuffled at
pack time, 20 MB shards).  Every loader runs the train pipeline
(RandomResizedCrop(224) + flip + ToTensor + Normalize) with a 1000-sample
shuffle buffer where it streams, batch 64, one epoch; each configuration runs
in a fresh process (fastloader/tools/harness.py), interleaved over rounds.

    python benchmarks/bench_shards.py [--sample-dir DIR] [--workers 0,2] [--rounds 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH = 64
SHUFFLE = 1000


def _webdataset_loader(urls, workers, image_keys="jpg;jpeg;png"):
    import torch
    import webdataset as wds

    tf = C.H.torch_transform("train")
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(SHUFFLE).decode("pil")
          .to_tuple(image_keys, "cls").map_tuple(tf, int))
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers)


def child(cfg):
    import torch

    torch.set_num_threads(1)
    impl, w = cfg["impl"], cfg["workers"]
    if impl == "webdataset":
        import webdataset  # noqa: F401  (imports outside the timed region)
        import torchvision  # noqa: F401

        def make():
            return _webdataset_loader(cfg["urls"], w)
    else:
        fl = C.import_fastloader("DataLoader", "WebDataset", "ImageFolder")
        tf = C.H.fastloader_transform("train")

        def make():
            if impl == "fastloader-folder":
                ds = fl.ImageFolder(cfg["root"], transform=tf)
                return fl.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=w)
            ds = fl.WebDataset(cfg["urls"], transform=tf, shuffle=SHUFFLE, epoch_length=cfg["n"])
            return fl.DataLoader(ds, batch_size=BATCH, num_workers=w)
    r = C.H.time_loader(make, epochs=1, hold_batch=True)
    r.update({k: v for k, v in cfg.items() if k != "urls"})
    return r


def ab_child(cfg):
    """HTTP vs local in one process: the two loaders alternate epochs, and
    the best epoch of each counts (drift and other load hit both alike)."""
    import time

    import torch

    torch.set_num_threads(1)
    fl = C.import_fastloader("DataLoader", "WebDataset")
    tf = C.H.fastloader_transform("train")
    loaders = {k: fl.DataLoader(fl.WebDataset(cfg[k], transform=tf, shuffle=SHUFFLE, epoch_length=cfg["n"]),
                                batch_size=BATCH, num_workers=cfg["workers"]) for k in ("local", "http")}
    best = {k: 0.0 for k in loaders}
    for _ in range(cfg["pairs"]):
        for k, dl in loaders.items():
            t0, n = time.perf_counter(), 0
            for x, _y in dl:
                n += len(x)
            best[k] = max(best[k], n / (time.perf_counter() - t0))
    return {"local": best["local"], "http": best["http"], "ratio": best["http"] / best["local"]}


def _nginx(root, workdir):
    path = os.path.join(C.REPO, "tests", "nginx_server.py")
    spec = importlib.util.spec_from_file_location("_fl_nginx_server", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not mod.nginx_available():
        sys.exit("bench_shards: nginx is not installed (scripts/setup.sh installs it)")
    server = mod.NginxServer(root, workdir)
    server.start()
    return server


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--sample-dir", default=None, help="the image folder (default: make-sample's cached 2000)")
    p.add_argument("--n", type=int, default=2000, help="images in the sample folder made when none is given")
    p.add_argument("--workers", default="0,2", help="comma-separated num_workers list")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ab-pairs", type=int, default=5,
                   help="epochs of each in the same-process HTTP/local A/B (0: skip it)")
    p.add_argument("--out", help="also write the Markdown report to this file")
    a = p.parse_args(argv)
    workers = [int(x) for x in a.workers.split(",")]
    root = a.sample_dir or C.load_sample_module().ensure_sample(a.n)
    C.import_fastloader("WebDataset")
    from fastloader.datasets import find_classes, make_dataset
    from fastloader.tools.pack import pack_shards

    n = len(make_dataset(root, find_classes(root)[1]))   # the sample's size, as ImageFolder counts it
    tmp = tempfile.mkdtemp(prefix="fl-bench-shards-")
    shard_dir = os.path.join(tmp, "shards")
    pack_shards(root, shard_dir, shard_size=20 * 10**6, progress=False)
    local = sorted(glob.glob(os.path.join(shard_dir, "*.tar")))
    server = _nginx(shard_dir, os.path.join(tmp, "nginx"))
    try:
        remote = [server.url(os.path.basename(u)) for u in local]
        script = os.path.abspath(__file__)
        impls = {"fastloader-local": local, "fastloader-http": remote, "fastloader-folder": None,
                 "webdataset": local}
        groups = []
        for w in workers:
            cfgs = [(impl, dict(impl=impl, workers=w, urls=urls, root=root, n=n)) for impl, urls in impls.items()]
            groups.append((("train", w), cfgs))
        t0 = time.perf_counter()
        res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg))
        ab = {}
        for w in workers if a.ab_pairs else []:
            ab[w] = C.H.run_child(script, "ab_child", dict(local=local, http=remote, n=n, workers=w,
                                                           pairs=a.ab_pairs),
                                  sys_path0=os.path.dirname(script))
            C.log(f"A/B num_workers={w}: {ab[w]}")
        elapsed = time.perf_counter() - t0
    finally:
        server.stop()
    rep = C.Report("Tar shards: fastloader.WebDataset (local, HTTP) vs webdataset + torch DataLoader")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- {n} sample images in {len(local)} shards of ~20 MB (pack shards, shuffled at pack time); train "
            f"pipeline at 224, batch {BATCH}, shuffle buffer {SHUFFLE}, one epoch per run, {a.rounds} interleaved "
            f"round(s), fresh process per run; HTTP = nginx on loopback; webdataset reads local files with "
            f"torch's worker processes splitting the shards")
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("")
    labels = {k: k for k in impls}
    rep.add(C.comparison_table(res, "train", workers, list(impls), labels, "samples"))
    rep.add("")
    wds = {w: res[(("train", w), "webdataset")] for w in workers}
    w_best = max(workers, key=lambda w: C.median_of(wds[w], "rate") or 0)
    lines = [f"- webdataset + torch is fastest at num_workers={w_best}: {C.fmt(C.median_of(wds[w_best], 'rate'))} "
             "images/s; ratios below are medians of per-round ratios"]
    for w in workers:
        loc, http = res[(("train", w), "fastloader-local")], res[(("train", w), "fastloader-http")]
        folder = res[(("train", w), "fastloader-folder")]
        lines.append(f"- num_workers={w}: fastloader local / webdataset+torch(best) = "
                     f"{C.fmt_ratio(C.H.paired_ratio(loc, wds[w_best], 'rate'))}; "
                     f"HTTP / local = {C.fmt_ratio(C.H.paired_ratio(http, loc, 'rate'))}; "
                     f"shards / ImageFolder = {C.fmt_ratio(C.H.paired_ratio(loc, folder, 'rate'))}")
    for w, r in ab.items():
        if "ratio" in r:
            lines.append(f"- same-process A/B, num_workers={w}, best of {a.ab_pairs} alternating epochs each: "
                         f"HTTP {r['http']:.0f} vs local {r['local']:.0f} images/s = {r['ratio']:.3f}x")
    rep.add("\n".join(lines))
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
