"""``python -m fastloader tune``: its options, the progress line, the table,
the recommendation, the heatmap PNG and the JSON file.  The search and the
measurements are fastloader/tools/tuning/'s."""
from __future__ import annotations

import json
import os
import sys
import time

from . import harness as H
from . import tuning as T

DESCRIPTION = """\
Search DataLoader settings for your dataset and training step, the way the tuning guides
do it by hand: batch_size first (from 32 up, while it pays), then num_workers (coarse to
fine, and "auto"), prefetch_factor, delivery to the GPU and pin_memory (on a GPU),
worker_mode (when this fastloader has it) and persistent_workers (what it saves at the
start of every epoch).  An axis stops as soon as a step gains less than --stop-gain.

Every configuration runs in a fresh process; for each it measures samples/s and the share
of time the step waits for data (after each epoch's first batch), the time to the first
batch, the epoch-start cost, peak host memory (the process and any worker processes) and,
on a GPU, peak device memory.  Memory of configurations not run yet is predicted from the
measured ones (a line in the bytes of the batches in flight, batch_size x bytes per sample
x (prefetch_factor x num_workers + 2), kept above every measured point); a configuration
predicted to cross 90% of the memory available (cgroup or physical limit), or
--memory-limit, is never run.

  --dataset DIR          an ImageFolder tree: fastloader.ImageFolder + the --pipeline transforms
  --dataset MOD:FUNC     FUNC() returns your dataset (imported in every measured process;
                         MOD may also be a path/to/file.py)
  --step MOD:FUNC        FUNC(batch) is your training step
  --step-ms N            or a simulated step of N ms per batch (time.sleep: what waiting for a
                         GPU looks like from the CPU; --step-busy: a busy loop instead)

Output: a table, the recommendation with its reasons, a heatmap PNG of samples/s over
batch_size x num_workers with the memory limit drawn (--plot), and all of it as JSON (--json).
Without --dataset, the cached sample of 2000 JPEGs is used (created on first use).
"""


def _ints(s, what, allow_auto=False):
    out = []
    for x in s.split(","):
        x = x.strip()
        if not x:
            continue
        if allow_auto and x == "auto":
            out.append("auto")
            continue
        try:
            v = int(x)
        except ValueError:
            raise SystemExit(f"fastloader tune: {what} wants comma-separated integers"
                             + (" or 'auto'" if allow_auto else "") + f", got {s!r}")
        if v < 0:
            raise SystemExit(f"fastloader tune: {what} must not be negative, got {s!r}")
        out.append(v)
    if not out:
        raise SystemExit(f"fastloader tune: {what} is empty")
    return list(dict.fromkeys(out))


def add_arguments(p):
    p.add_argument("--dataset", default=None, metavar="DIR|MOD:FUNC",
                   help="an image folder, or MOD:FUNC returning your dataset (default: the cached 2000-JPEG sample)")
    p.add_argument("--pipeline", choices=sorted(H.PIPELINES), default="train",
                   help="transforms for an image folder (default %(default)s)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--step", default=None, metavar="MOD:FUNC", help="your training step, called with each batch")
    g.add_argument("--step-ms", type=float, default=0.0, help="simulated step per batch, in ms (default 0: none)")
    p.add_argument("--step-busy", action="store_true", help="simulate the step with a busy loop, not time.sleep")
    p.add_argument("--batch-sizes", default="32,64,128,256,512", help="default %(default)s")
    p.add_argument("--workers", default=None, help="num_workers values, 'auto' allowed (default: 0..usable CPUs,auto)")
    p.add_argument("--prefetch", default="2,4", help="prefetch_factor values (default %(default)s)")
    p.add_argument("--persistent", choices=["both", "on", "off"], default="both",
                   help="persistent_workers values to try (default %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: delivery to the GPU (pageable copy, pin_memory, device='cuda') is an axis when CUDA "
                        "is usable; cpu: batches stay on the host (default %(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per configuration (default %(default)s; 2 or more "
                   "measures the epoch-start cost)")
    p.add_argument("--samples", type=int, default=1024,
                   help="samples per epoch per configuration (at least --min-batches batches; default %(default)s)")
    p.add_argument("--min-batches", type=int, default=8, help="default %(default)s")
    p.add_argument("--epoch-seconds", type=float, default=20.0, help="time cap per epoch (default %(default)s)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="host memory cap, e.g. 8GiB (default: 90%% of the memory available)")
    p.add_argument("--stop-gain", type=float, default=5.0, help="percent a step must gain to go on (default 5)")
    p.add_argument("--tolerance", type=float, default=3.0,
                   help="recommend the cheapest configuration within this percent of the best (default 3)")
    p.add_argument("--no-confirm", action="store_true", help="do not measure the contenders a second time")
    p.add_argument("--exhaustive", action="store_true", help="measure every configuration of the grid instead")
    p.add_argument("--in-process", action="store_true",
                   help="measure in this process (faster; no per-configuration peak memory)")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch.set_num_threads() in the measured processes (default 0: leave as it is)")
    p.add_argument("--plot", default="fastloader-tune.png", help="heatmap PNG (default ./%(default)s); '' to skip")
    p.add_argument("--json", dest="json_out", default="fastloader-tune.json", metavar="PATH",
                   help="results as JSON (default ./%(default)s); '' to skip")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration (default %(default)s)")


# ----------------------------------------------------------------------------
# text


def _mib(v, pred=False):
    if v is None:
        return "-"
    s = f"{v / 1024:.1f} GiB" if v >= 10240 else f"{v:.0f} MiB"
    return ("~" + s) if pred else s


def build_table(res):
    rec = res["recommended"]
    rk = T.key(rec["config"]) if rec else None
    best = rec["best"]["rate"] if rec else None
    gpu = res["device"] == "cuda"
    modes = res["grid"].get("worker_mode")
    headers = ["", "phase", "batch", "workers", "prefetch", "persistent"]
    align = ["l", "l", "r", "r", "r", "l"]
    if gpu:
        headers.append("delivery")
        align.append("l")
    if modes:
        headers.append("worker_mode")
        align.append("l")
    headers += ["samples/s", "of best", "first batch", "epoch start", "wait", "peak host"]
    align += ["r"] * 6
    if gpu:
        headers.append("peak device")
        align.append("r")
    rows = []
    for r in res["results"]:
        mark = "*" if rk is not None and T.key(r) == rk else ""
        nw = r["num_workers"]
        row = [mark, r["phase"], str(r["batch_size"]), str(nw), "-" if nw == 0 else str(r["prefetch_factor"]),
               "-" if nw == 0 else str(r["persistent_workers"])]
        if gpu:
            row.append(r["delivery"])
        if modes:
            row.append("-" if nw == 0 else str(r["worker_mode"]))
        if "error" in r:
            row += ["ERROR", "-", "-", "-", "-", "-"] + (["-"] if gpu else [])
        else:
            rate = r.get("rate")
            n = r.get("runs", 1)
            row += [H.fmt(rate, ".0f") + (f" ({n}x)" if n > 1 else ""),
                    H.fmt(100 * rate / best if rate and best else None, ".0f", "%"),
                    H.fmt(r.get("ttfb_s"), ".2f", " s"), H.fmt((r.get("epoch_start_s") or 0) * 1000
                                                              if r.get("epoch_start_s") is not None else None,
                                                              ".0f", " ms"),
                    H.fmt(r.get("wait_pct"), ".0f", "%"), _mib(r.get("peak_mib")) if not res["isolate"] or
                    r.get("peak_mib") else "-"]
            if gpu:
                row.append(_mib(r.get("device_peak_mib")))
        rows.append(row)
    return H.markdown_table(headers, rows, align)


def header_lines(res):
    g = res["grid"]
    axes = [f"batch_size {','.join(map(str, g['batch_size']))}", f"num_workers {','.join(map(str, g['num_workers']))}",
            f"prefetch_factor {','.join(map(str, g['prefetch_factor']))}",
            f"persistent_workers {','.join(map(str, g['persistent_workers']))}"]
    if res["device"] == "cuda":
        axes.append(f"delivery {','.join(g['delivery'])}")
    if g.get("worker_mode"):
        axes.append(f"worker_mode {','.join(g['worker_mode'])}")
    pc = res["per_config"]
    mem = res["memory"]
    sb = mem.get("sample_bytes")
    lines = [
        f"fastloader tune: {res['dataset']}" + (f", {res['dataset_len']} samples" if res.get("dataset_len") else ""),
        f"step: {res['step']}",
        f"machine: {res['usable_cpus']} usable CPUs (num_workers='auto' starts {res['auto_workers']}); "
        f"memory limit {_mib(mem['budget_mib'])} ({mem['budget']})"
        + (f"; device memory limit {_mib(mem['device_budget_mib'])}" if mem.get("device_budget_mib") else ""),
        "axes: " + "; ".join(axes),
        ("each configuration in a fresh process: " if res["isolate"] else "in this process: ")
        + f"{pc['epochs']} epoch(s) of up to {pc['samples']} samples (at least {pc['min_batches']} batches)"
        + (f"; {sb / 1024:.0f} KiB per sample" if sb else ""),
        (f"exhaustive sweep: all {res['grid_size']} configurations" if res["exhaustive"] else
         f"search: {len(res['results'])} of the grid's {res['grid_size']} configurations measured ({res['runs']} runs; "
         f"an axis stops when a step gains < {100 * res['stop_gain']:.0f}%)"),
    ]
    return lines


def recommendation_lines(res):
    rec = res["recommended"]
    if rec is None:
        return ["No configuration could be measured (see the errors above)."]
    c = rec["config"]
    kw = T.loader_kwargs(c)
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    out = ["Recommendation: " + T.settings(c, short=True)]
    out += [f"  - {r}" for r in rec["reasons"]]
    out.append(f"  DataLoader(dataset, {args})")
    return out


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# heatmap (Pillow, like bench's plot)

_VIRIDIS = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]


def _color(t):
    t = min(max(t, 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    f = t - i
    a, b = _VIRIDIS[i], _VIRIDIS[i + 1]
    return tuple(int(round(a[j] + (b[j] - a[j]) * f)) for j in range(3))


def write_heatmap(path, res, *, title="samples/s over batch_size x num_workers", subtitle=""):
    """The heatmap PNG of res["cells"]; returns path."""
    from PIL import Image, ImageDraw

    from .cli_bench import font

    cells = res["cells"]
    bss = res["grid"]["batch_size"]
    ws = res["grid"]["num_workers"]
    cw, ch = 112, 58
    left, top, right, bottom = 110, 118, 150, 70
    W = max(left + cw * len(ws) + right, 720)
    Hh = top + ch * len(bss) + bottom
    img = Image.new("RGB", (W, Hh), "white")
    d = ImageDraw.Draw(img)
    f_title, f_text, f_small, f_big = font(20), font(15), font(12), font(17)
    d.text((left, 14), title, fill="black", font=f_title)
    if subtitle:
        lines = []
        for para in subtitle.split("\n"):
            cur = ""
            for word in para.split(" "):
                if cur and d.textbbox((0, 0), cur + " " + word, font=f_small)[2] > W - left - 20:
                    lines.append(cur)
                    cur = word
                else:
                    cur = (cur + " " + word) if cur else word
            lines.append(cur)
        for i, line in enumerate(lines[:4]):
            d.text((left, 40 + 15 * i), line, fill=(90, 90, 90), font=f_small)
    rates = [c["rate"] for c in cells if c["rate"]]
    lo, hi = (min(rates), max(rates)) if rates else (0.0, 1.0)
    span = (hi - lo) or 1.0
    by = {(c["batch_size"], c["num_workers"]): c for c in cells}
    rec = res["recommended"]["config"] if res["recommended"] else None

    def box(i, j):
        x0, y0 = left + j * cw, top + i * ch
        return x0, y0, x0 + cw, y0 + ch

    for i, bs in enumerate(bss):
        for j, w in enumerate(ws):
            c = by[(bs, w)]
            x0, y0, x1, y1 = box(i, j)
            if c["rate"]:
                t = (c["rate"] - lo) / span
                fill = _color(t)
                fg = "black" if t > 0.55 else "white"
                d.rectangle([x0, y0, x1, y1], fill=fill, outline="white")
                lab = f"{c['rate']:.0f}"
                tw = d.textbbox((0, 0), lab, font=f_big)[2]
                d.text(((x0 + x1 - tw) / 2, y0 + 9), lab, fill=fg, font=f_big)
                sub = _mib(c["peak_mib"]) if c["peak_mib"] else ""
            else:
                fill = (252, 228, 228) if c["over_limit"] else (240, 240, 240)
                d.rectangle([x0, y0, x1, y1], fill=fill, outline="white")
                fg = (150, 60, 60) if c["over_limit"] else (130, 130, 130)
                if c["over_limit"]:
                    for k in range(-ch, cw, 12):
                        d.line([(x0 + max(k, 0), y0 + max(-k, 0)), (x0 + min(k + ch, cw), y0 + min(ch, cw - k))],
                               fill=(240, 190, 190))
                lab = "not run" if c["over_limit"] or c["skipped"] else "-"
                tw = d.textbbox((0, 0), lab, font=f_text)[2]
                d.text(((x0 + x1 - tw) / 2, y0 + 10), lab, fill=fg, font=f_text)
                sub = _mib(c["predicted_mib"], pred=True) if c["predicted_mib"] else ""
            if sub:
                tw = d.textbbox((0, 0), sub, font=f_small)[2]
                d.text(((x0 + x1 - tw) / 2, y0 + 34), sub, fill=fg, font=f_small)
            if rec is not None and bs == rec["batch_size"] and w == rec["num_workers"]:
                d.rectangle([x0 + 1, y0 + 1, x1 - 1, y1 - 1], outline="black", width=4)
    # the memory limit: a red line between cells under and over it
    red = (214, 39, 40)
    over = {(i, j) for i, bs in enumerate(bss) for j, w in enumerate(ws) if by[(bs, w)]["over_limit"]}
    for (i, j) in over:
        x0, y0, x1, y1 = box(i, j)
        if (i - 1, j) not in over:
            d.line([(x0, y0), (x1, y0)], fill=red, width=4)
        if (i + 1, j) not in over:
            d.line([(x0, y1), (x1, y1)], fill=red, width=4)
        if (i, j - 1) not in over:
            d.line([(x0, y0), (x0, y1)], fill=red, width=4)
        if (i, j + 1) not in over:
            d.line([(x1, y0), (x1, y1)], fill=red, width=4)
    # axes
    for j, w in enumerate(ws):
        x0, _, x1, _ = box(0, j)
        lab = str(w)
        tw = d.textbbox((0, 0), lab, font=f_text)[2]
        d.text(((x0 + x1 - tw) / 2, top + ch * len(bss) + 8), lab, fill="black", font=f_text)
    lab = "num_workers"
    tw = d.textbbox((0, 0), lab, font=f_text)[2]
    d.text((left + cw * len(ws) / 2 - tw / 2, top + ch * len(bss) + 32), lab, fill="black", font=f_text)
    for i, bs in enumerate(bss):
        _, y0, _, y1 = box(i, 0)
        lab = str(bs)
        tw = d.textbbox((0, 0), lab, font=f_text)[2]
        d.text((left - 10 - tw, (y0 + y1) / 2 - 8), lab, fill="black", font=f_text)
    ylab = Image.new("RGBA", (160, 24), (255, 255, 255, 0))
    ImageDraw.Draw(ylab).text((0, 2), "batch_size", fill="black", font=f_text)
    ylab = ylab.rotate(90, expand=True)
    img.paste(ylab, (14, top + ch * len(bss) // 2 - 80), ylab)
    # colour scale and legend
    xs = left + cw * len(ws) + 30
    bar_h = min(ch * len(bss), 200)
    for k in range(bar_h):
        d.line([(xs, top + k), (xs + 18, top + k)], fill=_color(1 - k / max(bar_h - 1, 1)))
    d.text((xs + 24, top - 6), f"{hi:.0f}", fill="black", font=f_small)
    d.text((xs + 24, top + bar_h - 8), f"{lo:.0f}", fill="black", font=f_small)
    d.text((xs - 4, top - 24), "samples/s", fill="black", font=f_small)
    ly = top + bar_h + 16
    d.rectangle([xs, ly, xs + 18, ly + 14], outline="black", width=3)
    d.text((xs + 24, ly), "recommended", fill="black", font=f_small)
    d.line([(xs, ly + 30), (xs + 18, ly + 30)], fill=red, width=4)
    d.text((xs + 24, ly + 23), "memory limit", fill="black", font=f_small)
    d.text((xs + 24, ly + 37), _mib(res["memory"]["budget_mib"]) + ("" if over else ","), fill="black", font=f_small)
    if not over:
        d.text((xs + 24, ly + 51), "not reached", fill="black", font=f_small)
    d.rectangle([0, 0, W - 1, Hh - 1], outline=(200, 200, 200))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    img.save(path, format="PNG")
    return path


# ----------------------------------------------------------------------------
# command


def search_estimate(grid):
    """Roughly how many runs the search makes (for the progress line)."""
    start = grid.batch_sizes.index(32) if 32 in grid.batch_sizes else 0
    n = min(3, len(grid.batch_sizes) - start)
    if grid.numeric:
        n += min(3, len(T.coarse_workers(grid.numeric)) - 1)
    n += int(grid.auto) + min(1, len(grid.prefetch) - 1) + len(grid.deliveries) - 1 + len(grid.modes) - 1
    n += int(len(grid.persistent) > 1) + 2
    return n


def run(a) -> int:
    from .sizes import parse_size
    from .progress import Progress

    if a.epochs < 1 or a.samples < 1 or a.min_batches < 1:
        raise SystemExit("fastloader tune: --epochs, --samples and --min-batches must be positive")
    bss = _ints(a.batch_sizes, "--batch-sizes")
    if 0 in bss:
        raise SystemExit("fastloader tune: --batch-sizes must be positive")
    workers = _ints(a.workers, "--workers", allow_auto=True) if a.workers else None
    pfs = _ints(a.prefetch, "--prefetch")
    if 0 in pfs:
        raise SystemExit("fastloader tune: --prefetch values must be >= 1")
    persistent = {"both": (False, True), "on": (True,), "off": (False,)}[a.persistent]
    try:
        limit = parse_size(a.memory_limit) if a.memory_limit else None
    except ValueError as e:
        raise SystemExit(f"fastloader tune: --memory-limit: {e}")
    dataset = a.dataset
    if dataset is not None and not os.path.isdir(dataset) and ":" not in dataset:
        raise SystemExit(f"fastloader tune: --dataset {dataset!r} is neither a folder nor MODULE:CALLABLE")

    tty = sys.stderr.isatty()
    bar = Progress(0, "fastloader tune", unit="runs")

    def on_start(cfg, phase):
        if bar.enabled:
            bar.desc = f"fastloader tune [{phase}: {T.settings(cfg, short=True)}]"
            bar.update(0)

    def on_result(cfg, phase, r):
        if "error" in r:
            msg = f"ERROR {r['error']}"
        else:
            msg = (f"{H.fmt(r.get('rate'), '.0f')} samples/s, wait {H.fmt(r.get('wait_pct'), '.0f')}%, "
                   f"peak {_mib(r.get('peak_mib'))} ({r.get('wall_s', 0):.1f} s)")
        bar.total = max(bar.total, bar.done + 2)
        bar.desc = f"fastloader tune [{phase}: {T.settings(cfg, short=True)} -> {msg}]"
        bar.update(1)
        if not tty:
            _log(f"[{bar.done}] {phase}: {T.settings(cfg, short=True)}: {msg}")

    # the total is an estimate (the search stops axes early); set once the grid is known
    from fastloader.loader import auto_worker_limit

    grid = T.Grid(bss, workers if workers is not None else T.default_workers(auto_worker_limit()), pfs, persistent)
    bar.total = len(grid.configs()) if a.exhaustive else search_estimate(grid)
    _log(f"fastloader tune: {'all' if a.exhaustive else 'a coarse-to-fine search over'} {len(grid.configs())} "
         "configurations" + (", each in a fresh process" if not a.in_process else ", in this process"))
    t0 = time.perf_counter()
    try:
        res = T.tune(dataset, a.step, step_ms=a.step_ms, step_busy=a.step_busy, batch_sizes=bss, num_workers=workers,
                     prefetch_factors=pfs, persistent_workers=persistent, device=a.device, pipeline=a.pipeline,
                     epochs=a.epochs, samples=a.samples, min_batches=a.min_batches, epoch_s=a.epoch_seconds,
                     memory_limit=limit, stop_gain=a.stop_gain / 100.0, tolerance=a.tolerance / 100.0,
                     confirm=not a.no_confirm, exhaustive_sweep=a.exhaustive, isolate=not a.in_process,
                     timeout=a.timeout, torch_threads=a.torch_threads or None, on_start=on_start, on_result=on_result)
    except ValueError as e:
        bar.close()
        raise SystemExit(f"fastloader tune: {e}")
    bar.total = bar.done
    bar.close()
    out = header_lines(res) + ["", build_table(res), ""]
    out.append("* recommended; samples/s and wait after each epoch's first batch (wait = share of the time the step "
               "waits for data); first batch = loader construction to the first batch; epoch start = iter() to the "
               "first batch of a later epoch; peak host = the process and any worker processes; (2x) = the fastest "
               "of two runs (other processes only slow a run down).")
    for s in res["skipped"]:
        out.append(f"not run: {T.settings(s['config'], short=True)}: {s['reason']}")
    errors = [r for r in res["results"] if "error" in r]
    for r in errors:
        out.append(f"ERROR {T.settings(r, short=True)}: {r['error']}")
        if r.get("stderr"):
            out.append("    " + r["stderr"].replace("\n", "\n    "))
    over = [r for r in res["results"] if r.get("over_limit")]
    for r in over:
        out.append(f"warning: {T.settings(r, short=True)} measured {_mib(r['peak_mib'])}, over the limit: the "
                   "prediction was too low")
    var = res.get("run_to_run_variation")
    if var is not None and var > 0.10:
        out.append(f"warning: the same configuration measured up to {100 * var:.0f}% apart from run to run: the "
                   "machine is busy, and differences smaller than that are noise (rates shown are the fastest run)")
    out.append("")
    out += recommendation_lines(res)
    if a.plot:
        sub = (f"{res['dataset']}\nstep: {res['step']}; {res['usable_cpus']} usable CPUs; "
               f"the other settings as recommended; memory limit {_mib(res['memory']['budget_mib'])}")
        try:
            out.append(f"heatmap: {os.path.abspath(write_heatmap(a.plot, res, subtitle=sub))}")
        except Exception as e:  # the table is the main output; never lose it to the plot
            out.append(f"heatmap not written: {type(e).__name__}: {e}")
    if a.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(a.json_out)), exist_ok=True)
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        out.append(f"json: {os.path.abspath(a.json_out)}")
    out.append(f"tune wall time: {time.perf_counter() - t0:.0f} s")
    print("\n".join(out))
    return 1 if res["recommended"] is None else 0
