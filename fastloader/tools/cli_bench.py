"""``python -m fastloader bench``: fastloader vs torch DataLoader, per num_workers.

The numbers people collect by hand when tuning ``num_workers``, for both
loaders side by side on the same folder of JPEGs, plus a PNG plot of
images/s against num_workers.  This is the command-line front end: the
pipelines, the timed loop, the fresh process per configuration and the memory
sampling are fastloader/tools/harness.py's, shared with benchmarks/.
"""
from __future__ import annotations

import json
import os
import sys
import time

from . import harness as H

PIPELINES = H.PIPELINES
LABELS = {"fastloader": "fastloader", "torch": "torch"}
COLORS = {"fastloader": (31, 119, 180), "torch": (255, 127, 14)}

DESCRIPTION = """\
Time fastloader.DataLoader + fastloader.ImageFolder against torch.utils.data.DataLoader +
torchvision.datasets.ImageFolder (+ torchvision transforms) on the same folder of JPEGs,
for each num_workers in --workers, and print the table you would otherwise collect by hand:

  num_workers | loader | total time | avg batch time after warm-up | images/s
              | time to first batch | peak RSS | consumer wait %

Every configuration runs in a fresh Python process (so peak memory is per configuration),
fastloader and torch alternating; each measured process calls torch.set_num_threads(1)
(like torch's own worker processes) so that torch's intra-op thread pool does not compete
with the loader.

  total time       from building the dataset + loader (folder scan, worker start) to the end
  avg batch time   wall time per batch after the first one (includes --step-ms)
  images/s         images after the first batch / time after the first batch
  first batch      from building the dataset + loader to the first batch in hand
  peak RSS         peak resident memory of the process (VmHWM), plus the private memory of
                   torch's worker processes (sampled every 0.25 s); fastloader's workers are
                   threads of the process, so its number is all of its memory
  consumer wait %  time the training loop spends inside next(iterator) / wall time, after the
                   first batch: ~100% = the loop is starved for data, ~0% = loading is hidden

--step-ms N simulates a model step of N ms per batch with time.sleep(), which releases the GIL
and leaves the CPU free -- what an asynchronous GPU step looks like from the CPU -- so you can
see from which num_workers on loading stops mattering (wait % near 0, images/s near
batch_size / step).  --step-busy spins the CPU instead (a CPU-bound step on the same cores).

Without DIR, a cached ImageNet-like sample of 2000 JPEGs is used (fastloader.tools.sample,
created on first use in about 15 s).
"""


def _parse_workers(s):
    try:
        ws = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise SystemExit(f"fastloader bench: --workers wants comma-separated integers, got {s!r}")
    if not ws or any(w < 0 for w in ws):
        raise SystemExit(f"fastloader bench: --workers wants non-negative integers, got {s!r}")
    return list(dict.fromkeys(ws))


def _count_images(root):
    n = 0
    for _, _, files in os.walk(root):
        n += sum(1 for f in files if f.lower().endswith((".jpg", ".jpeg", ".png")))
    return n


def build_table(results, workers, impls):
    headers = ["num_workers", "loader", "total time", "avg batch (after 1st)", "images/s", "first batch",
               "peak RSS", "consumer wait"]
    align = ["r", "l", "r", "r", "r", "r", "r", "r"]
    rows = []
    for w in workers:
        for impl in impls:
            r = results.get((w, impl))
            if r is None:
                continue
            if "error" in r:
                rows.append([str(w), LABELS[impl], "ERROR", "-", "-", "-", "-", "-"])
                continue
            rows.append([str(w), LABELS[impl], H.fmt(r["total_s"], ".2f", " s"),
                         H.fmt(r["batch_ms"], ".1f", " ms"), H.fmt(r["rate"], ".0f"),
                         H.fmt(r["ttfb_s"], ".2f", " s"), H.fmt(r.get("peak_mib"), ".0f", " MiB"),
                         H.fmt(r["wait_pct"], ".0f", "%")])
    return H.markdown_table(headers, rows, align)


def summarize(results, workers, impls, batch_size, step_ms):
    lines = []
    best = {}
    for impl in impls:
        ok = [(w, results[(w, impl)]["rate"]) for w in workers
              if (w, impl) in results and "error" not in results[(w, impl)] and results[(w, impl)].get("rate")]
        if not ok:
            continue
        top = max(r for _, r in ok)
        # the fewest workers within 5% of the best rate: more only costs memory and CPU
        w_ok = min(w for w, r in ok if r >= 0.95 * top)
        best[impl] = (w_ok, dict(ok)[w_ok])
        msg = f"{LABELS[impl]}: fewest workers within 5% of its best rate: num_workers={w_ok} ({dict(ok)[w_ok]:.0f} images/s)"
        if step_ms:
            fed = [w for w in workers if (w, impl) in results and "error" not in results[(w, impl)]
                   and (results[(w, impl)].get("wait_pct") or 100) < 10]
            msg += (f"; with a {step_ms:g} ms step the loop waits < 10% for data from num_workers={min(fed)} on"
                    if fed else f"; with a {step_ms:g} ms step it still waits >= 10% for data at every num_workers tried")
        lines.append(msg)
    if "fastloader" in best and "torch" in best:
        lines.append(f"fastloader / torch images/s at those settings: {best['fastloader'][1] / best['torch'][1]:.2f}x")
    if step_ms:
        lines.append(f"ceiling set by the simulated step: batch_size / step = {batch_size / (step_ms / 1000.0):.0f} images/s")
    return lines


# ----------------------------------------------------------------------------
# plot (Pillow only)


def _nice_step(span, target=5):
    import math

    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def font(size):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: fixed-size bitmap font
        return ImageFont.load_default()


def write_plot(path, results, workers, impls, *, title, subtitle="", ceiling=None):
    """Line plot of images/s against num_workers, one line per loader; returns path."""
    from PIL import Image, ImageDraw

    W, H = 900, 560
    left, right, top, bottom = 90, 30, 100, 70
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    f_title, f_text, f_small = font(20), font(15), font(13)

    series = {}
    for impl in impls:
        pts = [(w, results[(w, impl)]["rate"]) for w in workers
               if (w, impl) in results and "error" not in results[(w, impl)] and results[(w, impl)].get("rate")]
        if pts:
            series[impl] = sorted(pts)
    ymax = max([r for pts in series.values() for _, r in pts] + ([ceiling] if ceiling else []) + [1.0])
    ystep = _nice_step(ymax * 1.1)
    ytop = ystep * (int(ymax * 1.1 / ystep) + 1)
    xs = sorted(set(workers))
    xmin, xmax = xs[0], xs[-1]
    pw, ph = W - left - right, H - top - bottom

    def X(w):
        if xmax == xmin:
            return left + pw / 2
        return left + 20 + (w - xmin) / (xmax - xmin) * (pw - 40)

    def Y(v):
        return top + ph - v / ytop * ph

    d.text((left, 18), title, fill="black", font=f_title)
    if subtitle:
        d.text((left, 46), subtitle, fill=(90, 90, 90), font=f_small)
    # grid + y ticks
    v = 0.0
    while v <= ytop + 1e-9:
        y = Y(v)
        d.line([(left, y), (left + pw, y)], fill=(225, 225, 225))
        lab = f"{v:.0f}" if ystep >= 1 else f"{v:g}"
        tw = d.textbbox((0, 0), lab, font=f_small)[2]
        d.text((left - 8 - tw, y - 8), lab, fill="black", font=f_small)
        v += ystep
    # x ticks
    for w in xs:
        x = X(w)
        d.line([(x, top + ph), (x, top + ph + 6)], fill="black")
        tw = d.textbbox((0, 0), str(w), font=f_small)[2]
        d.text((x - tw / 2, top + ph + 9), str(w), fill="black", font=f_small)
    # axes
    d.line([(left, top), (left, top + ph)], fill="black", width=2)
    d.line([(left, top + ph), (left + pw, top + ph)], fill="black", width=2)
    lab = "num_workers"
    tw = d.textbbox((0, 0), lab, font=f_text)[2]
    d.text((left + pw / 2 - tw / 2, H - 32), lab, fill="black", font=f_text)
    ylab = Image.new("RGBA", (160, 24), (255, 255, 255, 0))
    ImageDraw.Draw(ylab).text((0, 2), "images / s", fill="black", font=f_text)
    ylab = ylab.rotate(90, expand=True)
    img.paste(ylab, (12, top + ph // 2 - 80), ylab)
    # ceiling from the simulated step
    legend = []
    if ceiling:
        y = Y(ceiling)
        x = left
        while x < left + pw:
            d.line([(x, y), (min(x + 8, left + pw), y)], fill=(120, 120, 120), width=2)
            x += 14
        legend.append(("step-limited ceiling", (120, 120, 120), True))
    # lines
    for impl, pts in series.items():
        col = COLORS[impl]
        xy = [(X(w), Y(r)) for w, r in pts]
        if len(xy) > 1:
            d.line(xy, fill=col, width=3)
        for (x, y), (_, r) in zip(xy, pts):
            d.ellipse([x - 5, y - 5, x + 5, y + 5], fill=col, outline="white")
            lab = f"{r:.0f}"
            tw = d.textbbox((0, 0), lab, font=f_small)[2]
            d.rectangle([x - tw / 2 - 2, y - 22, x + tw / 2 + 2, y - 7], fill="white")
            d.text((x - tw / 2, y - 22), lab, fill=col, font=f_small)
        legend.insert(len(legend) - (1 if ceiling else 0), (LABELS[impl], col, False))
    # legend: one row between the subtitle and the plot, so it never hides a point
    x = left
    y = top - 16
    for t, col, dashed in legend:
        if dashed:
            d.line([(x, y), (x + 10, y)], fill=col, width=2)
            d.line([(x + 18, y), (x + 28, y)], fill=col, width=2)
        else:
            d.line([(x, y), (x + 28, y)], fill=col, width=3)
            d.ellipse([x + 10, y - 4, x + 18, y + 4], fill=col)
        d.text((x + 36, y - 9), t, fill="black", font=f_text)
        x += 36 + d.textbbox((0, 0), t, font=f_text)[2] + 28
    d.rectangle([0, 0, W - 1, H - 1], outline=(200, 200, 200))
    d_ = os.path.dirname(os.path.abspath(path))
    os.makedirs(d_, exist_ok=True)
    img.save(path, format="PNG")
    return path


# ----------------------------------------------------------------------------
# command


def add_arguments(p):
    p.add_argument("dir", nargs="?", metavar="DIR",
                   help="ImageFolder-style tree (DIR/<class>/*.jpg); default: a cached sample of 2000 JPEGs")
    p.add_argument("--workers", default=None, help="comma-separated num_workers values (default 0,1,2,4; "
                   "--quick: 0,1,2)")
    p.add_argument("--batch-size", type=int, default=64, help="default %(default)s")
    p.add_argument("--pipeline", choices=sorted(PIPELINES), default="train", help="default %(default)s")
    p.add_argument("--compare", choices=["torch", "none"], default=None,
                   help="also run torch.utils.data.DataLoader + torchvision (default: torch if torchvision "
                   "is installed)")
    p.add_argument("--epochs", type=int, default=1, help="default %(default)s")
    p.add_argument("--max-batches", type=int, default=None,
                   help="stop each epoch after N batches (default: the whole epoch; --quick: 5)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated model step per batch, in ms (time.sleep: releases the GIL and the CPU, "
                   "like waiting for a GPU); default 0")
    p.add_argument("--step-busy", action="store_true",
                   help="simulate the step with a busy loop on the CPU instead of time.sleep")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads() in every measured process (default 1; 0 = torch's default)")
    p.add_argument("--plot", default="fastloader-bench.png",
                   help="PNG of images/s vs num_workers (default ./%(default)s); '' to skip")
    p.add_argument("--json", dest="json_out", default=None, metavar="PATH", help="also write the raw results here")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration (default %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="a rough look in well under a minute: --workers 0,1,2 and --max-batches 5 unless given")


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(a) -> int:
    import importlib.util

    workers = _parse_workers(a.workers or ("0,1,2" if a.quick else "0,1,2,4"))
    max_batches = a.max_batches if a.max_batches is not None else (5 if a.quick else None)
    if a.batch_size < 1 or a.epochs < 1 or (max_batches is not None and max_batches < 1):
        raise SystemExit("fastloader bench: --batch-size, --epochs and --max-batches must be positive")
    compare = a.compare
    if compare is None:
        compare = "torch" if importlib.util.find_spec("torchvision") is not None else "none"
        if compare == "none":
            _log("fastloader bench: torchvision is not installed; running fastloader only (pip install torchvision "
                 "to compare)")
    elif compare == "torch" and importlib.util.find_spec("torchvision") is None:
        raise SystemExit("fastloader bench: --compare torch needs torchvision (pip install torchvision), "
                         "or use --compare none")
    impls = ["fastloader"] + (["torch"] if compare == "torch" else [])

    stats = None
    if a.dir:
        root = os.path.abspath(a.dir)
        if not os.path.isdir(root):
            raise SystemExit(f"fastloader bench: {root} is not a folder")
        from .sample import read_stats

        stats = read_stats(root)
    else:
        from .sample import ensure_sample, read_stats

        root = ensure_sample(2000)
        stats = read_stats(root)
    nimg = stats["n"] if stats else _count_images(root)
    if nimg == 0:
        raise SystemExit(f"fastloader bench: no images under {root} (expected DIR/<class>/*.jpg)")

    cpus = H.usable_cpus()
    step_desc = (f"{a.step_ms:g} ms per batch ({'busy loop on the CPU' if a.step_busy else 'time.sleep: GIL and CPU free'})"
                 if a.step_ms else "none (--step-ms 0: the loop only fetches batches)")
    per_epoch = f"at most {max_batches} batches" if max_batches else "all batches"
    header = [
        f"fastloader bench: {a.pipeline} pipeline, {PIPELINES[a.pipeline]}",
        f"data: {nimg} images in {root}" + (
            f" (mean {stats['mean_width']:.0f} x {stats['mean_height']:.0f} px, {stats['mean_bytes'] / 1024:.0f} KiB)"
            if stats else ""),
        f"batch_size {a.batch_size}, shuffle=True, {a.epochs} epoch(s), {per_epoch} per epoch; simulated model step: "
        + step_desc,
        "each configuration in a fresh process, " + ("fastloader and torch alternating; " if len(impls) > 1 else "")
        + (f"torch.set_num_threads({a.torch_threads}) in every measured process" if a.torch_threads else
           "torch's default intra-op threads") + f"; usable CPUs: {cpus}",
    ]
    if a.quick:
        header.append("--quick: few batches per configuration, expect noisy numbers; drop --quick for real ones")
    _log(f"fastloader bench: {len(workers) * len(impls)} configurations on {nimg} images in {root}")

    groups = [(w, [(impl, dict(impl=impl, root=root, pipeline=a.pipeline, workers=w, batch_size=a.batch_size,
                                epochs=a.epochs, max_batches=max_batches, step_ms=a.step_ms, step_busy=a.step_busy,
                                torch_threads=a.torch_threads)) for impl in impls]) for w in workers]

    def before(s):
        print(f"[{s['done']}/{s['total']}] {LABELS[s['impl']]:<10} num_workers={s['key']} ...", end="",
              file=sys.stderr, flush=True)

    def after(s, r):
        if "error" in r:
            msg = f" ERROR: {r['error']}"
        else:
            msg = (f" {H.fmt(r['rate'], '.0f')} images/s, first batch {H.fmt(r['ttfb_s'], '.2f')} s, "
                   f"peak {H.fmt(r.get('peak_mib'), '.0f')} MiB, wait {H.fmt(r['wait_pct'], '.0f')}%")
        print(f"{msg} ({r['wall_s']:.1f} s)", file=sys.stderr, flush=True)

    t_all = time.perf_counter()
    # one round, fastloader and torch alternating which goes first; the parent samples the
    # memory of the measured process and its workers every 0.25 s
    runs = H.run_interleaved(groups, 1, lambda cfg: H.run_child(H.__file__, "pipeline_child", cfg,
                                                                 timeout=a.timeout, mem_interval=0.25),
                             before=before, after=after)
    results = {k: v[0] for k, v in runs.items()}
    elapsed = time.perf_counter() - t_all

    out = list(header)
    out.append("")
    out.append(build_table(results, workers, impls))
    out.append("")
    out.append("avg batch = wall time per batch after the first (includes the step); images/s after the first batch; "
               "first batch includes the folder scan and worker start; peak RSS includes torch's worker processes' "
               "private memory; consumer wait = time inside next(it) / wall time after the first batch "
               "(~100%: starved for data, ~0%: loading is hidden).")
    out.extend(summarize(results, workers, impls, a.batch_size, a.step_ms))
    errors = [(k, r) for k, r in results.items() if "error" in r]
    for (w, impl), r in errors:
        out.append(f"ERROR {LABELS[impl]} num_workers={w}: {r['error']}")
        if r.get("stderr"):
            out.append("    " + r["stderr"].replace("\n", "\n    "))
    if a.plot:
        sub = (f"{a.pipeline} pipeline, batch {a.batch_size}, {nimg} images, "
               f"step {a.step_ms:g} ms, {cpus} usable CPUs, torch.set_num_threads({a.torch_threads})")
        ceiling = a.batch_size / (a.step_ms / 1000.0) if a.step_ms else None
        try:
            path = write_plot(a.plot, results, workers, impls, title="images/s vs num_workers",
                              subtitle=sub, ceiling=ceiling)
            out.append(f"plot: {os.path.abspath(path)}")
        except Exception as e:  # the table is the main output; never lose it to the plot
            out.append(f"plot not written: {type(e).__name__}: {e}")
    out.append(f"benchmark wall time: {elapsed:.0f} s")
    print("\n".join(out))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"root": root, "images": nimg, "pipeline": a.pipeline, "batch_size": a.batch_size,
                       "epochs": a.epochs, "max_batches": max_batches, "step_ms": a.step_ms,
                       "step_busy": a.step_busy, "torch_threads": a.torch_threads, "usable_cpus": cpus,
                       "results": [dict(r, num_workers=w, loader=impl) for (w, impl), r in results.items()]},
                      f, indent=1)
    return 1 if errors else 0
