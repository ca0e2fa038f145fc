"""fastloader's native JPEG pipeline vs torchvision + torch DataLoader.

On an ImageNet-like folder of real JPEG photographs (fastloader.tools.sample,
``--n`` images, generated once and cached), this runs side by side:

  fastloader  fastloader.ImageFolder(root, transform=fastloader.transforms.Compose([...]))
              + fastloader.DataLoader(ds, batch_size=64, num_workers=k, shuffle=True)
  torch       torchvision.datasets.ImageFolder(root, transform=torchvision.transforms.Compose([...]))
              + torch.utils.data.DataLoader(ds, batch_size=64, num_workers=k, shuffle=True)

with the pipelines
  train  RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(ImageNet mean/std)
  val    Resize(256), CenterCrop(224), ToTensor(), Normalize(ImageNet mean/std)
(both give float32 batches of 64x3x224x224), plus a "decode-only ceiling": two
threads (ThreadPoolExecutor(2)) that read each file (per call, from the page
cache) and fully decode it at full size with fastloader.decode_jpeg -- and, for
reference, the same with PIL (Image.open(...).convert("RGB")).

Every configuration runs in a fresh subprocess; fastloader and torch alternate
(fastloader/tools/harness.py: the harness ``python -m fastloader bench`` uses too).
Reported: images/s after the first batch, time to first batch (including
scanning the folder and starting workers), peak memory, fastloader/torch
ratios, fastloader val@2 workers / decode ceiling, and the train
2-worker/1-worker scaling.

    python benchmarks/bench_images.py [--quick] [--n 2000] [--workers 0,1,2,4]
        [--pipeline train|val|both] [--epochs 1] [--max-batches N] [--rounds R]
        [--only both|torch|fastloader] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH_SIZE = 64
FASTLOADER_API = ("DataLoader", "ImageFolder", "decode_jpeg", "transforms.Compose", "transforms.RandomResizedCrop",
                  "transforms.RandomHorizontalFlip", "transforms.Resize", "transforms.CenterCrop",
                  "transforms.ToTensor", "transforms.Normalize")


# ----------------------------------------------------------------------------
# decode-only ceiling


def list_jpegs(root):
    out = []
    for d, _, files in os.walk(root):
        out.extend(os.path.join(d, f) for f in files if f.lower().endswith((".jpeg", ".jpg")))
    out.sort()
    return out


def decoder(kind):
    """Return f(path) -> (h, w): read the file and fully decode it."""
    if kind == "fastloader":
        fl = C.import_fastloader("decode_jpeg")

        def f(path):
            with open(path, "rb") as fh:
                data = fh.read()
            img = fl.decode_jpeg(data)
            return tuple(img.shape)
    else:
        import io

        from PIL import Image

        def f(path):
            with open(path, "rb") as fh:  # same read-per-call as above, then decode from memory
                data = fh.read()
            im = Image.open(io.BytesIO(data))
            im = im.convert("RGB")  # forces the full-size decode
            return im.size
    return f


def decode_ceiling(root, kind, threads, max_images=None):
    from concurrent.futures import ThreadPoolExecutor

    paths = list_jpegs(root)
    if max_images:
        paths = paths[:max_images]
    f = decoder(kind)
    base = C.rss_now_mib()
    warm = min(BATCH_SIZE, len(paths) // 4)
    t0 = time.perf_counter()
    t_first = None
    n = 0
    with ThreadPoolExecutor(threads) as ex:
        for _ in ex.map(f, paths):
            n += 1
            if n == warm:
                t_first = time.perf_counter()
    t_end = time.perf_counter()
    return dict(rate=(n - warm) / (t_end - t_first), ttfb_s=None, total_s=t_end - t0, samples=n,
                base_rss_mib=base)


# ----------------------------------------------------------------------------
# child


def child(cfg):
    """One measured configuration (runs in a fresh process, see C.run_child)."""
    impl = cfg["impl"]
    stand_in = cfg.get("stand_in")
    if impl in ("ceiling-fastloader", "ceiling-pil"):
        kind = "fastloader" if impl == "ceiling-fastloader" and not stand_in else "pil"
        return dict(cfg, **decode_ceiling(cfg["root"], kind, cfg["threads"], cfg.get("max_images")))
    use_torch = impl == "torch" or stand_in == "torch"
    if not use_torch:
        C.import_fastloader(*FASTLOADER_API)  # an in-tree build, or one clear message
    # hold_batch: a batch lives until the next one arrives, as in `for x, y in loader:`
    r = C.H.pipeline_child(dict(cfg, impl="torch" if use_torch else "fastloader", hold_batch=True))
    r.update(cfg)
    return r


# ----------------------------------------------------------------------------
# parent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--n", type=int, default=None, help="images in the sample folder (default 2000)")
    p.add_argument("--root", default=None, help="use/create the sample folder here (default: "
                   "fastloader.tools.sample.default_sample_dir(n)); any ImageFolder-style tree of JPEGs works "
                   "if it has no fastloader marker and --no-generate is given")
    p.add_argument("--no-generate", action="store_true", help="use --root as is, do not create a sample there")
    p.add_argument("--workers", default=None, help="comma-separated num_workers list (default 0,1,2,4)")
    p.add_argument("--pipeline", choices=["train", "val", "both"], default="both")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-batches", type=int, default=None, help="cap on batches per epoch")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians are reported (default 1)")
    p.add_argument("--quick", action="store_true",
                   help="workers 0,1,2, at most 10 batches per run, decode ceiling on 600 images (~1 min)")
    p.add_argument("--only", choices=["both", "fastloader", "torch"], default="both",
                   help="run only one side (torch needs no fastloader build)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the decode-only ceiling")
    p.add_argument("--ceiling-threads", type=int, default=2)
    p.add_argument("--mem-interval", type=float, default=0.5,
                   help="seconds between memory samples of the worker processes (0 disables)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads() in every measured process, both loaders (default 1, as in "
                   "torch's worker processes; 0 keeps torch's default)")
    p.add_argument("--out", help="also write the Markdown report to this file")
    p.add_argument("--impl-for-fastloader", choices=["fastloader", "torch"], default="fastloader",
                   help=argparse.SUPPRESS)  # debug: torch/torchvision/PIL in the fastloader slots
    a = p.parse_args(argv)

    n = a.n or 2000
    workers = [int(x) for x in (a.workers or ("0,1,2" if a.quick else "0,1,2,4")).split(",")]
    max_batches = a.max_batches or (10 if a.quick else None)
    max_ceiling = 600 if a.quick else None
    pipelines = ["train", "val"] if a.pipeline == "both" else [a.pipeline]
    impls = ["fastloader", "torch"] if a.only == "both" else [a.only]
    stand_in = a.impl_for_fastloader if a.impl_for_fastloader != "fastloader" else None
    fl_label = "fastloader" if stand_in is None else "fastloader[=torch stand-in]"

    if "fastloader" in impls and stand_in is None:
        try:
            C.import_fastloader(*FASTLOADER_API)
        except C.FastloaderMissing as e:
            sys.exit(f"bench_images: {e}")

    if a.no_generate:
        if not a.root:
            p.error("--no-generate needs --root")
        root = os.path.abspath(a.root)
        stats = None
    else:
        sample = C.load_sample_module()
        root = sample.ensure_sample(n, a.root)
        stats = sample.read_stats(root)
    nfiles = len(list_jpegs(root))

    script = os.path.abspath(__file__)
    groups = []
    for pl in pipelines:
        for w in workers:
            groups.append(((pl, w), [(impl, dict(impl=impl, pipeline=pl, workers=w, root=root, batch_size=BATCH_SIZE,
                                                 epochs=a.epochs, max_batches=max_batches, stand_in=stand_in,
                                                 torch_threads=a.torch_threads))
                                     for impl in impls]))
    ceil_impls = []
    if not a.no_ceiling:
        ceil_impls = (["ceiling-fastloader"] if "fastloader" in impls else []) + ["ceiling-pil"]
        groups.append((("decode", a.ceiling_threads),
                       [(ci, dict(impl=ci, root=root, threads=a.ceiling_threads, max_images=max_ceiling,
                                  stand_in=stand_in)) for ci in ceil_impls]))
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg, mem_interval=a.mem_interval))
    elapsed = time.perf_counter() - t0

    rep = C.Report("fastloader image pipeline vs torchvision + torch DataLoader")
    rep.add("\n".join(C.environment_lines()))
    if stats:
        rep.add(f"- data: {nfiles} JPEGs in {root} (fastloader.tools.sample, seed {stats.get('seed')}): mean "
                f"{stats['mean_width']:.0f} x {stats['mean_height']:.0f}, mean {stats['mean_bytes'] / 1024:.1f} KiB, "
                f"{stats['progressive']} progressive, {stats['grayscale']} grayscale, {stats['classes']} classes")
    else:
        rep.add(f"- data: {nfiles} JPEGs in {root}")
    per_run = f"at most {max_batches} batches" if max_batches else "all batches"
    rep.add(f"- batch_size {BATCH_SIZE}, shuffle=True, {a.epochs} epoch(s), {per_run} per epoch; "
            f"{a.rounds} interleaved round(s), each configuration in a fresh process; medians shown; "
            + (f"torch.set_num_threads({a.torch_threads}) in the measured process"
               if a.torch_threads else "torch's default intra-op threads"))
    rep.add("- images/s is measured after the first batch; 'first' = time from building the dataset + loader "
            "(folder scan, worker start) to the first batch; RSS = main-process peak (VmHWM); total = peak of "
            f"RSS(main) + private memory of worker processes (sampled every {a.mem_interval}s); "
            "ratio = median of per-round fastloader/torch ratios (>1 means fastloader is faster / uses more)")
    if stand_in:
        rep.add(f"- NOTE: --impl-for-fastloader {stand_in}: the 'fastloader' columns run torchvision + torch "
                "DataLoader and the fastloader decode ceiling runs PIL (debug stand-in); ratios only show noise")
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("")

    def med(key, impl, field):
        rs = res.get((key, impl))
        return C.median_of(rs, field) if rs else None

    labels = {"fastloader": fl_label, "torch": "torch"}
    for pl in pipelines:
        rep.add(f"## {pl}: " + ("RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize"
                                if pl == "train" else "Resize(256) + CenterCrop(224) + ToTensor + Normalize"))
        rep.add("")
        rep.add(C.comparison_table(res, pl, workers, impls, labels, "img"))
        shapes = sorted({f"{r.get('shape')} {r.get('dtype')}" for (k, _), v in res.items() if k[0] == pl
                         for r in v if "error" not in r})
        rep.add("")
        rep.add(f"(batch tensors: {', '.join(shapes)})")
        rep.add("")

    # summary ratios
    rep.add("## Summary")
    rep.add("")
    summ = []
    if ceil_impls:
        ck = ("decode", a.ceiling_threads)
        for ci in ceil_impls:
            what = "fastloader.decode_jpeg" if ci == "ceiling-fastloader" and not stand_in else "PIL"
            if ci == "ceiling-fastloader" and stand_in:
                what = "PIL (stand-in for fastloader.decode_jpeg)"
            summ.append([f"decode-only ceiling, {what}, {a.ceiling_threads} threads, full size, file read per call "
                         "(page cache)", C.fmt(med(ck, ci, "rate")) + " img/s"])
    for impl in impls:
        ceil = med(("decode", a.ceiling_threads), "ceiling-fastloader" if impl == "fastloader" else "ceiling-pil",
                   "rate") if ceil_impls else None
        if "val" in pipelines and 2 in workers and ceil:
            v2 = med(("val", 2), impl, "rate")
            cname = "its decode ceiling" if impl == "fastloader" else "the PIL decode ceiling"
            summ.append([f"{labels[impl]} val @ 2 workers / {cname}", C.fmt_ratio(v2 / ceil if v2 else None)])
        for pl in pipelines:
            if 1 in workers and 2 in workers:
                r1, r2 = med((pl, 1), impl, "rate"), med((pl, 2), impl, "rate")
                summ.append([f"{labels[impl]} {pl} 2 workers / 1 worker", C.fmt_ratio(r2 / r1 if r1 and r2 else None)])
    if len(impls) == 2:
        for pl in pipelines:
            for w in workers:
                summ.append([f"fastloader/torch img/s, {pl} @ {w} workers",
                             C.fmt_ratio(C.paired_ratio(res[((pl, w), "fastloader")], res[((pl, w), "torch")],
                                                        "rate"))])
    rep.add(C.markdown_table(["measure", "value"], summ, align=["l", "r"]))
    rep.add("")
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
