"""num_workers="auto" against a sweep of fixed num_workers, on the native
training pipeline (RandomResizedCrop 224 + flip + ToTensor + Normalize,
batch 64), for a fast consumer and a slow one (a simulated model step).

For each configuration it reports images/s over the epoch after the first
batch, the consumer's data-starved fraction, and for "auto" the workers it
settled on, when it last changed its mind (seconds into the epoch) and the
most threads it ever let run.  Configurations alternate, repeated --rounds
times; medians are shown.  Pass criteria (issue 5): auto >= 95% of the best
fixed setting, settled within 5 s, never more threads than usable CPUs.

    python benchmarks/bench_autotune.py [--n 2000] [--rounds 2] [--steps 0,60] [--out FILE]
"""
import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

fastloader = C.import_fastloader()  # the installed one, else the in-tree build
from fastloader.loader import auto_worker_limit  # noqa: E402
from fastloader.tools.sample import ensure_sample  # noqa: E402


def run(ds, workers, step_s, max_batches):
    dl = fastloader.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers, seed=0)
    it = iter(dl)
    next(it)
    t0 = time.perf_counter()
    n = 0
    for i, (x, _) in enumerate(it):
        n += len(x)
        if step_s:
            time.sleep(step_s)  # a GPU step: the CPU is free, the GIL released
        if i + 2 >= max_batches:
            break
    dt = time.perf_counter() - t0
    st = dl.stats()
    del it
    out = {"ips": n / dt, "starved": st["data_starved_fraction"]}
    if workers == "auto":
        hist = st["autotune_history"]
        out.update(final=st["num_workers_auto"], settled_s=hist[-1][0], max_active=max(k for _, k in hist))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", default="0,60", help="simulated model step per batch, ms (comma list)")
    p.add_argument("--max-batches", type=int, default=30)
    p.add_argument("--out")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    root = ensure_sample(a.n)
    ds = fastloader.ImageFolder(root, transform=C.H.fastloader_transform("train"))
    limit = auto_worker_limit()
    fixed = list(range(1, limit + 1)) + ([limit * 2] if limit < 4 else [])
    configs = fixed + ["auto"]
    lines = [
        "# num_workers='auto' vs fixed num_workers (native training pipeline)", "",
        f"- machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), usable for auto: {limit}",
        f"- command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        f"- data: {len(ds)} JPEGs ({root}); batch 64; {a.max_batches} batches per run, images/s after the first;"
        f" {a.rounds} interleaved rounds, medians", ""]
    for step_ms in [int(s) for s in a.steps.split(",")]:
        res = {c: [] for c in configs}
        for r in range(a.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for c in order:
                res[c].append(run(ds, c, step_ms / 1000.0, a.max_batches))
                print(f"step {step_ms} ms, workers {c}: {res[c][-1]}", file=sys.stderr, flush=True)
        med = {c: statistics.median(x["ips"] for x in res[c]) for c in configs}
        best_fixed = max(fixed, key=lambda c: med[c])
        auto = res["auto"]
        lines += [f"## model step {step_ms} ms per batch", "",
                  "| num_workers | images/s | data-starved | settled on | last change (s) | max threads |",
                  "|---|---:|---:|---:|---:|---:|"]
        for c in configs:
            starved = statistics.median(x["starved"] for x in res[c])
            if c == "auto":
                lines.append(f"| auto | {med[c]:.0f} | {100 * starved:.0f}% | "
                             f"{'/'.join(str(x['final']) for x in auto)} | "
                             f"{max(x['settled_s'] for x in auto):.2f} | {max(x['max_active'] for x in auto)} |")
            else:
                lines.append(f"| {c} | {med[c]:.0f} | {100 * starved:.0f}% | | | {c} |")
        lines += ["", f"auto / best fixed (num_workers={best_fixed}): **{med['auto'] / med[best_fixed]:.2f}x**; "
                  f"settled within {max(x['settled_s'] for x in auto):.2f} s; "
                  f"max threads {max(x['max_active'] for x in auto)} <= usable CPUs {limit}", ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
