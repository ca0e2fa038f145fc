"""fastloader inside Hugging Face accelerate: the train pipeline through
``accelerator.prepare`` against the bare fastloader loop (issue 14).

Three loaders over the same ImageFolder (the project's sample images), train
pipeline at 224 (RandomResizedCrop + flip + ToTensor + Normalize), batch 64,
shuffle, three epochs per run (--epochs); each configuration runs in a fresh
process (fastloader/tools/harness.py), interleaved over rounds, one process
(accelerate on the CPU):

- ``bare``: ``for x, y in fastloader.DataLoader(...)``;
- ``accelerate``: the same loader after ``Accelerator(cpu=True).prepare``
  (fastloader's accelerate hook keeps it fastloader's, inside accelerate's
  DataLoaderShard);
- ``accelerate-unhooked``: the same, with fastloader's hook undone in the
  process, i.e. what accelerate did before it: torch's DataLoader, with worker
  processes, over the dataset's __getitem__.

Then, because a shared machine's load swings more between processes than
the loop costs, the two fastloader loops once more in one process over one
dataset, epochs alternating (--pairs): the median of the pairs' ratios.

    python benchmarks/bench_frameworks.py [--sample-dir DIR] [--n 2000] [--workers 2] [--epochs 3] [--rounds 3]
        [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH = 64
IMPLS = ("bare", "accelerate", "accelerate-unhooked")


def child(cfg):
    import torch

    torch.set_num_threads(1)
    fl = C.import_fastloader("DataLoader", "ImageFolder")
    impl, w = cfg["impl"], cfg["workers"]
    if impl != "bare":
        import accelerate.data_loader as adl
        from accelerate import Accelerator

        if impl == "accelerate-unhooked":   # accelerate as it is without fastloader's hook
            for mod in [m for n, m in list(sys.modules.items()) if n == "accelerate" or n.startswith("accelerate.")]:
                for name in ("prepare_data_loader", "skip_first_batches"):
                    f = getattr(mod, name, None)
                    if getattr(f, "_fastloader_wrapped", False):
                        setattr(mod, name, f.__wrapped__)
            assert not getattr(adl.prepare_data_loader, "_fastloader_wrapped", False)
    tf = C.H.fastloader_transform("train")
    if impl == "paired":
        return _paired(fl, Accelerator, tf, cfg)

    def make():
        ds = fl.ImageFolder(cfg["root"], transform=tf)
        dl = fl.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=w)
        if impl == "bare":
            return dl
        prepared = Accelerator(cpu=True).prepare(dl)
        assert isinstance(prepared, fl.DataLoader) == (impl == "accelerate")
        return prepared

    def cpu_s():   # this process and its joined children (torch's worker processes)
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    cpu0 = cpu_s()
    r = C.H.time_loader(make, epochs=cfg["epochs"], hold_batch=True)
    r["cpu_ms_per_img"] = (cpu_s() - cpu0) * 1000.0 / max(1, r["samples"])
    r.update(cfg)
    return r


def _paired(fl, Accelerator, tf, cfg):
    """Both loops in one process over one dataset, epochs alternating (the
    order swapped each pair): each pair's ratio compares two epochs a few
    seconds apart, so the load of a shared machine hits both alike."""
    ds = fl.ImageFolder(cfg["root"], transform=tf)
    bare = fl.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=cfg["workers"])
    prepared = Accelerator(cpu=True).prepare(fl.DataLoader(ds, batch_size=BATCH, shuffle=True,
                                                           num_workers=cfg["workers"]))
    assert isinstance(prepared, fl.DataLoader)

    def epoch(loader):
        t0, n = time.perf_counter(), 0
        for x, _ in loader:
            n += len(x)
        return n / (time.perf_counter() - t0)

    epoch(bare), epoch(prepared)   # warm the page cache and the buffer pools
    ratios = []
    for i in range(cfg["pairs"]):
        if i % 2:
            a = epoch(prepared)
            b = epoch(bare)
        else:
            b = epoch(bare)
            a = epoch(prepared)
        ratios.append(a / b)
    return {"ratios": ratios, **cfg}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--sample-dir", default=None, help="the image folder (default: make-sample's cached 2000)")
    p.add_argument("--n", type=int, default=2000, help="images in the sample folder made when none is given")
    p.add_argument("--workers", default="2", help="comma-separated num_workers list")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", type=int, default=10, help="alternating epoch pairs of the in-process comparison")
    p.add_argument("--out", help="also write the Markdown report to this file")
    a = p.parse_args(argv)
    workers = [int(x) for x in a.workers.split(",")]
    root = a.sample_dir or C.load_sample_module().ensure_sample(a.n)
    C.import_fastloader("DataLoader")
    try:
        import accelerate
    except ImportError:
        sys.exit("bench_frameworks: accelerate is not installed (pip install fastloader[accelerate])")
    script = os.path.abspath(__file__)
    groups = [(("train", w), [(impl, dict(impl=impl, workers=w, root=root, epochs=a.epochs)) for impl in IMPLS])
              for w in workers]
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg))
    paired = {w: C.run_child(script, dict(impl="paired", workers=w, root=root, pairs=a.pairs)) for w in workers}
    elapsed = time.perf_counter() - t0
    rep = C.Report("fastloader through accelerate's prepare vs the bare fastloader loop")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- accelerate {accelerate.__version__}, one process on the CPU; train pipeline at 224, batch {BATCH}, "
            f"shuffle, {a.epochs} epoch(s) per run, {a.rounds} interleaved round(s), fresh process per run")
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("")
    rep.add(C.comparison_table(res, "train", workers, list(IMPLS), {k: k for k in IMPLS}, "img"))
    rep.add("")
    lines = ["- ratios are medians of per-round ratios"]
    for w in workers:
        bare, acc, unhooked = (res[(("train", w), impl)] for impl in IMPLS)
        lines.append(f"- num_workers={w}: accelerate / bare = {C.fmt_ratio(C.H.paired_ratio(acc, bare, 'rate'))}; "
                     f"accelerate-unhooked / bare = {C.fmt_ratio(C.H.paired_ratio(unhooked, bare, 'rate'))}; "
                     "CPU time per image (all threads and worker processes, build to last batch): " + ", ".join(
                         f"{impl} {C.fmt(C.median_of(rs, 'cpu_ms_per_img'), '.2f')} ms"
                         for impl, rs in zip(IMPLS, (bare, acc, unhooked))))
    for w, r in paired.items():
        if "error" in r:
            res[(("paired", w), "paired")] = [r]
            continue
        q = statistics.quantiles(r["ratios"], n=4)
        lines.append(f"- num_workers={w}, both loops in one process, {len(r['ratios'])} alternating epoch pairs: "
                     f"accelerate / bare = {C.fmt_ratio(statistics.median(r['ratios']))} median "
                     f"(quartiles {q[0]:.2f}-{q[2]:.2f})")
    rep.add("\n".join(lines))
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
