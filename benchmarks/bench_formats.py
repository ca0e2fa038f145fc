"""PNG and WebP: fastloader's C decoders against Pillow and torchvision.io,
and through the textbook train pipeline against torch's DataLoader (issue 23).

The images are the sample's photographs (fastloader.tools.sample, ``--n``
of them, the first ones of the cached folder), converted once (cached under
--work-dir) to PNG (Pillow's default compression), lossy WebP (quality 80)
and lossless WebP, in the same class folders.

1. Decode only: every file's bytes held in memory, two threads
   (ThreadPoolExecutor(2)) decoding them to RGB uint8 for ``--decode-s``
   seconds, with
     fastloader   fastloader.decode_image(data)            (GIL released)
     pillow       np.asarray(Image.open(BytesIO(data)).convert("RGB"))
     torchvision  torchvision.io.decode_image(tensor, mode=RGB)  (where it reads the format)
2. The train pipeline (RandomResizedCrop(224), flip, ToTensor, Normalize;
   batch 64, shuffled) over each folder:
     torch        torchvision.datasets.ImageFolder + torch.utils.data.DataLoader
     fastloader   fastloader.ImageFolder + fastloader.DataLoader
   at each --workers; plus the WebP files as tar shards:
     webdataset   webdataset.WebDataset(...).decode("pil") + torch's DataLoader
     fastloader   fastloader.WebDataset(shards)
   Reported: each one's images/s after the first batch and their ratio at
   each num_workers and at each one's best.

Every configuration runs in a fresh process, the implementations of a row
back to back with the order rotated per round (fastloader/tools/harness.py).

    python benchmarks/bench_formats.py [--quick] [--n 1000] [--workers 0,1,2,4] [--rounds 2]
        [--parts decode,pipeline,shards] [--formats png,webp] [--out FILE] [--md FILE]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

from bench_shards import BATCH, SHUFFLE  # noqa: E402  (the same loader settings as the shard benchmark)

FORMATS = {  # name: (extension, Pillow save arguments)
    "png": ("png", {}),
    "webp": ("webp", {"quality": 80}),
    "webp-lossless": ("webp", {"lossless": True}),
}
PIPELINE_FORMATS = ("png", "webp")


def prepare(sample_dir, work_dir, n):
    """The first n sample images as each format, in class folders: {format: root}."""
    from PIL import Image

    srcs = sorted(f for f in glob.glob(os.path.join(sample_dir, "*", "*"))
                  if f.lower().endswith((".jpg", ".jpeg")))[:n]
    if not srcs:
        raise SystemExit(f"bench_formats: no JPEGs in {sample_dir}/<class>/")
    roots = {}
    tag = os.path.basename(os.path.normpath(sample_dir))
    for name, (ext, kw) in FORMATS.items():
        root = os.path.join(work_dir, f"{name}-{n}-of-{tag}")
        roots[name] = root
        done = os.path.join(root, ".done")
        if os.path.exists(done):
            continue
        t0 = time.perf_counter()
        for src in srcs:
            cls = os.path.basename(os.path.dirname(src))
            os.makedirs(os.path.join(root, cls), exist_ok=True)
            dst = os.path.join(root, cls, os.path.splitext(os.path.basename(src))[0] + "." + ext)
            with Image.open(src) as im:
                im.convert("RGB").save(dst, **kw)
        os.makedirs(root, exist_ok=True)
        open(done, "w").close()
        C.log(f"made {root}: {len(srcs)} files in {time.perf_counter() - t0:.1f} s")
    return roots


def shards_of(root, work_dir):
    """The folder packed as tar shards (fastloader's pack_shards), made once: the shard paths."""
    out = root.rstrip("/") + ".shards"
    if not glob.glob(os.path.join(out, "*.tar")):
        from fastloader.tools.pack import pack_shards

        pack_shards(root, out, shard_size=8 << 20)
    return sorted(glob.glob(os.path.join(out, "*.tar")))


# ----------------------------------------------------------------------------
# children (each in a fresh process)


def _decoder(kind):
    import io

    import numpy as np

    if kind == "fastloader":
        fl = C.import_fastloader("decode_image")
        return lambda b: fl.decode_image(b)
    if kind == "pillow":
        from PIL import Image

        def pil(b):
            with Image.open(io.BytesIO(b)) as im:
                return np.asarray(im.convert("RGB"))
        return pil
    import torch
    import torchvision.io as tio

    return lambda b: tio.decode_image(torch.frombuffer(bytearray(b), dtype=torch.uint8), mode=tio.ImageReadMode.RGB)


def decode_child(cfg):
    from concurrent.futures import ThreadPoolExecutor

    import torch

    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(cfg["root"], "*", "*")))
    data = [open(f, "rb").read() for f in files]
    dec = _decoder(cfg["impl"])
    try:
        dec(data[0])
    except Exception as e:  # noqa: BLE001 - a decoder that lacks the format is reported, not fatal
        return {"error": f"{type(e).__name__}: {e}"}
    threads = cfg["threads"]

    def work(k):
        n, i = 0, k
        end = time.perf_counter() + cfg["seconds"]
        while time.perf_counter() < end:
            dec(data[i % len(data)])
            i += threads
            n += 1
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        counts = list(ex.map(work, range(threads)))
    dt = time.perf_counter() - t0
    mp = sum(len(d) for d in data) / len(data)
    return {"rate": sum(counts) / dt, "images": sum(counts), "seconds": dt, "mean_kib": mp / 1024}


def child(cfg):
    import torch

    torch.set_num_threads(1)
    impl, w = cfg["impl"], cfg["workers"]
    if cfg["part"] == "decode":
        return decode_child(cfg)
    if cfg["part"] == "pipeline":
        return C.H.pipeline_child(dict(cfg, impl="torch" if impl == "torch" else "fastloader", pipeline="train",
                                       batch_size=BATCH, epochs=1, torch_threads=1))
    if impl == "webdataset":
        import torchvision  # noqa: F401
        import webdataset  # noqa: F401

        from bench_shards import _webdataset_loader  # the shard benchmark's baseline, on WebP members

        def make():
            return _webdataset_loader(cfg["urls"], w, image_keys="webp;png;jpg")
    else:
        fl = C.import_fastloader("DataLoader", "WebDataset")
        tf = C.H.fastloader_transform("train")

        def make():
            ds = fl.WebDataset(cfg["urls"], transform=tf, shuffle=SHUFFLE, epoch_length=cfg["n"])
            return fl.DataLoader(ds, batch_size=BATCH, num_workers=w)
    r = C.H.time_loader(make, epochs=1, max_batches=cfg.get("max_batches"))
    r.update({k: v for k, v in cfg.items() if k != "urls"})
    return r


# ----------------------------------------------------------------------------
# report


def report(res, a, roots, elapsed):
    H = C.H
    lines = ["# PNG and WebP: decoders and the train pipeline (benchmarks/bench_formats.py)", ""]
    lines += [x for x in C.environment_lines() if not x.startswith("- command:")]
    lines += [f"- command: `{' '.join(['benchmarks/bench_formats.py'] + sys.argv[1:])}`",
              f"- images: the first {a.n} of the sample folder, as {', '.join(FORMATS)}; "
              f"benchmark wall time {elapsed:.0f} s", ""]
    if "decode" in a.parts:
        lines += ["## Decode only: two threads, bytes in memory, to RGB uint8", ""]
        rows = []
        for fmt_ in FORMATS:
            rs = {impl: res.get((("decode", fmt_), impl), []) for impl in ("fastloader", "pillow", "torchvision")}
            cells = []
            for impl, r in rs.items():
                med = H.median_of(r, "rate")
                err = next((x["error"] for x in r if "error" in x), None)
                cells.append(H.fmt(med) if med else ("n/a: " + err[:60] if err else "-"))
            kib = H.median_of(rs["fastloader"], "mean_kib")
            rows.append([fmt_, H.fmt(kib, ".1f")] + cells +
                        [H.fmt_ratio(H.paired_ratio(rs["fastloader"], rs["pillow"], "rate")),
                         H.fmt_ratio(H.paired_ratio(rs["fastloader"], rs["torchvision"], "rate"))])
        lines.append(H.markdown_table(["format", "mean KiB", "fastloader img/s", "Pillow img/s",
                                       "torchvision.io img/s", "fl/Pillow", "fl/torchvision"], rows))
        lines.append("")
    for part, impls in (("pipeline", ("torch", "fastloader")), ("shards", ("webdataset", "fastloader"))):
        if part not in a.parts:
            continue
        title = ("## Train pipeline over an image folder: torchvision ImageFolder + torch's DataLoader vs "
                 "fastloader.ImageFolder" if part == "pipeline" else
                 "## Train pipeline over WebP tar shards: webdataset + torch's DataLoader vs fastloader.WebDataset")
        lines += [title, "", "images/s over the epoch (from building the loader to its last batch, worker "
                  "start included; after the first batch in parentheses), median over rounds; fl/baseline: median "
                  "of per-round pairs; best: each one's best num_workers by epoch rate", ""]
        rows = []
        fmts = a.formats.split(",") if part == "pipeline" else ("webp",)
        for fmt_ in fmts:
            best = {}
            for w in a.workers:
                b, f = (res.get(((part, fmt_, w), i), []) for i in impls)
                mb, mf = H.median_of(b, "epoch_rate"), H.median_of(f, "epoch_rate")
                for i, m in zip(impls, (mb, mf)):
                    if m and m > best.get(i, (0, None))[0]:
                        best[i] = (m, w)
                rows.append([fmt_, str(w), f"{H.fmt(mb)} ({H.fmt(H.median_of(b, 'rate'))})",
                             f"{H.fmt(mf)} ({H.fmt(H.median_of(f, 'rate'))})",
                             f"{H.fmt_ratio(H.paired_ratio(f, b, 'epoch_rate'))} "
                             f"({H.fmt_ratio(H.paired_ratio(f, b, 'rate'))})"])
            if len(best) == 2:
                rows.append([fmt_, f"best ({best[impls[1]][1]} vs {best[impls[0]][1]})", H.fmt(best[impls[0]][0]),
                             H.fmt(best[impls[1]][0]), H.fmt_ratio(best[impls[1]][0] / best[impls[0]][0])])
        lines.append(H.markdown_table(["format", "num_workers", f"{impls[0]} img/s", "fastloader img/s",
                                       f"fastloader/{impls[0]}"], rows))
        lines.append("")
    try:
        lines.append(f"Load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    except OSError:
        pass
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="64 images, 1 s decodes, num_workers 0,2, one round")
    p.add_argument("--n", type=int, default=None, help="images per format (default 1000; --quick 64)")
    p.add_argument("--workers", default=None, help="num_workers list (default 0,1,2,4; --quick 0,2)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2; --quick 1)")
    p.add_argument("--decode-s", type=float, default=None, help="seconds per decode run (default 4)")
    p.add_argument("--parts", default="decode,pipeline,shards")
    p.add_argument("--formats", default=",".join(PIPELINE_FORMATS), help="the folder pipelines' formats")
    p.add_argument("--work-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "fastloader", "formats"))
    p.add_argument("--out", default=None, help="all results as JSON")
    p.add_argument("--md", default=None, help="also write the Markdown report here")
    a = p.parse_args(argv)
    a.n = a.n or (64 if a.quick else 1000)
    a.workers = [int(x) for x in (a.workers or ("0,2" if a.quick else "0,1,2,4")).split(",")]
    a.rounds = a.rounds or (1 if a.quick else 2)
    a.decode_s = a.decode_s or (1.0 if a.quick else 4.0)
    a.parts = a.parts.split(",")
    sample = C.load_sample_module()
    # the 2000-image sample the other benchmarks use (its first n images), or a small one for --quick
    sample_dir = sample.ensure_sample(256 if a.quick else 2000)
    os.makedirs(a.work_dir, exist_ok=True)
    roots = prepare(sample_dir, a.work_dir, a.n)
    groups = []
    if "decode" in a.parts:
        for f, root in roots.items():
            groups.append((("decode", f), [(i, dict(part="decode", impl=i, root=root, threads=2, seconds=a.decode_s,
                                                    workers=2))
                                          for i in ("fastloader", "pillow", "torchvision")]))
    if "pipeline" in a.parts:
        for f in a.formats.split(","):
            for w in a.workers:
                groups.append((("pipeline", f, w), [(i, dict(part="pipeline", impl=i, root=roots[f], workers=w))
                                                   for i in ("torch", "fastloader")]))
    if "shards" in a.parts:
        urls = shards_of(roots["webp"], a.work_dir)
        for w in a.workers:
            groups.append((("shards", "webp", w), [(i, dict(part="shards", impl=i, urls=urls, n=a.n, workers=w))
                                                  for i in ("webdataset", "fastloader")]))
    script = os.path.abspath(__file__)
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg))
    text = report(res, a, roots, time.perf_counter() - t0)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({f"{k[0]}|{k[1]}": v for k, v in res.items()}, f, indent=1, default=str)
    bad = [k for k, v in res.items() if any("error" in r for r in v) and k[1] != "torchvision"]
    if bad:
        print("errors in:", bad, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
