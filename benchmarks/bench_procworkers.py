"""worker_mode "thread" / "process" / "auto" vs torch.utils.data.DataLoader.

Throughput, on bench_python.py's two datasets (batch_size 32, ~1 ms a sample):

  python  pure-Python work that holds the GIL: threads run it one at a time,
          processes in parallel
  numpy   work that releases the GIL: threads overlap it

for num_workers 0, 1, 2, 4 (worker modes only with workers), each run in a
fresh process, every configuration of a num_workers side by side and the
order rotated per round.  The summary compares each loader at its own best
num_workers: process mode vs torch, and auto vs the better of thread and
process mode.

Memory, on a dataset holding 1M Python strings (num_workers=4, a whole
shuffled epoch, batch_size 1000): peak total memory (main RSS + the private
memory of the worker processes) of torch's workers, process mode and threads.
Forked workers touch the strings' reference counts and so copy the pages they
read (copy-on-write), in both torch's workers and ours.

    PYTHONPATH=. python benchmarks/bench_procworkers.py [--quick] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import bench_python as BP  # noqa: E402

IMPLS = ["torch", "thread", "process", "auto"]
LABELS = {"torch": "torch", "thread": "fl thread", "process": "fl process", "auto": "fl auto"}
N_STRINGS = 1_000_000
MEM_BATCH = 1000


class StringsDataset:
    """1M Python strings in a list; a sample is a few numbers about one."""

    def __init__(self, n=N_STRINGS):
        self.items = [f"sample-{i:07d}-{(i * 2654435761) % 1000003:07d}-payload" for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        s = self.items[i]
        return len(s), ord(s[-9]), i


def _loader(impl):
    if impl == "torch":
        import torch.utils.data

        return torch.utils.data.DataLoader, {}
    fl = C.import_fastloader("DataLoader")
    return fl.DataLoader, {"worker_mode": impl}


def _bare(ds, n):
    """The dataset alone: __getitem__ for `n` samples in this thread, no
    loader, no collate.  Its rate times the usable CPUs is the most any
    loader can reach on this machine (the CPU ceiling)."""
    bs = BP.BATCH_SIZE
    held = [ds[i] for i in range(bs)]  # warm-up, as time_loader skips the first batch
    t = time.perf_counter()
    for i in range(bs, n, bs):
        # a batch's samples live until the next batch, as in a loader (freeing
        # each 768 KiB array at once would have malloc return it to the kernel
        # and fault it in again, every sample)
        held = [ds[j] for j in range(i, min(i + bs, n))]
    el = time.perf_counter() - t
    del held
    return {"rate": (n - bs) / el}


def child(cfg):
    """One measured configuration (a fresh process, see C.run_child)."""
    import warnings

    import torch

    torch.set_num_threads(1)
    if cfg["impl"] == "bare":
        r = _bare(BP.DATASETS[cfg["dataset"]](cfg["batches"] * BP.BATCH_SIZE), cfg["batches"] * BP.BATCH_SIZE)
        r.update(cfg)
        return r
    Loader, extra = _loader(cfg["impl"])
    w = cfg["workers"]
    if cfg["dataset"] == "strings":
        ds = StringsDataset()
        bs = MEM_BATCH
        n_batches = None
    else:
        bs = BP.BATCH_SIZE
        ds = BP.DATASETS[cfg["dataset"]](cfg["batches"] * bs)
        n_batches = None
    if not w:
        extra = {}

    def make():
        return Loader(ds, batch_size=bs, shuffle=True, num_workers=w, **extra)

    import gc
    import resource

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = C.H.time_loader(make, epochs=1, hold_batch=True, max_batches=n_batches)
    gc.collect()  # the workers are reaped: their CPU time is in RUSAGE_CHILDREN
    ru = [resource.getrusage(k) for k in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    r["cpu_s"] = sum(u.ru_utime + u.ru_stime for u in ru)  # the whole run, loader and workers
    r["moved"] = any("worker_mode='auto'" in str(x.message) for x in caught)
    r.update(cfg)
    return r


def _best(res, d, impl, workers):
    """(best median rate over num_workers, that num_workers)."""
    best = (None, None)
    for w in workers:
        rs = res.get(((d, w), impl))
        if not rs:
            continue
        v = C.median_of(rs, "rate")
        if v is not None and (best[0] is None or v > best[0]):
            best = (v, w)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="one round, fewer batches, no memory run")
    p.add_argument("--out", help="also write the Markdown report to this file")
    p.add_argument("--workers", default="0,1,2,4", help="comma-separated num_workers list (default 0,1,2,4)")
    p.add_argument("--datasets", default="python,numpy", help="throughput datasets: python,numpy")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --quick 1)")
    p.add_argument("--batches", type=int, default=None,
                   help="batches per throughput run (default 200, about 2-7 s: the steady state; --quick 30)")
    p.add_argument("--no-memory", action="store_true", help="skip the 1M-strings memory comparison")
    p.add_argument("--mem-rounds", type=int, default=1, help="rounds of the memory comparison (default 1)")
    a = p.parse_args(argv)
    try:
        C.import_fastloader("DataLoader")
    except C.FastloaderMissing as e:
        sys.exit(f"bench_procworkers: {e}")
    workers = [int(x) for x in a.workers.split(",")]
    rounds = a.rounds or (1 if a.quick else 3)
    batches = a.batches or (30 if a.quick else 200)
    datasets = [d for d in a.datasets.split(",") if d]
    script = os.path.abspath(__file__)

    groups = []
    for d in datasets:
        for w in workers:
            impls = IMPLS if w else ["torch", "thread", "bare"]
            groups.append(((d, w), [(i, dict(impl=i, dataset=d, workers=w, batches=batches)) for i in impls]))
    mem_groups = [] if (a.quick or a.no_memory) else [
        (("strings", 4), [(i, dict(impl=i, dataset="strings", workers=4)) for i in ("torch", "process", "thread")])]
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, rounds, lambda cfg: C.run_child(script, cfg, mem_interval=0.5))
    if mem_groups:
        res.update(C.run_interleaved(mem_groups, a.mem_rounds,
                                     lambda cfg: C.run_child(script, cfg, mem_interval=0.1)))
    elapsed = time.perf_counter() - t0

    rep = C.Report("worker_mode thread / process / auto vs torch.utils.data.DataLoader")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- throughput: batch_size {BP.BATCH_SIZE}, shuffle=True, {batches} batches per run, {rounds} interleaved "
            "round(s), each run in a fresh process; samples/s after the first batch, median (min-max); "
            "'total' = peak of main RSS + workers' private memory")
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("- 'bare' runs (num_workers 0 group): the dataset's __getitem__ alone in one thread, for the CPU ceiling")
    rep.add("")
    summary = []
    from fastloader import sysinfo

    ncpu = sysinfo.usable_cpus()
    for d in datasets:
        rep.add(f"## {d}")
        rep.add("")
        headers = ["workers"] + [f"{LABELS[i]} samples/s" for i in IMPLS] + ["fl process total MiB",
                                                                             "torch total MiB"]
        rows = []
        for w in workers:
            row = [str(w)]
            for i in IMPLS:
                rs = res.get(((d, w), i))
                if not rs:
                    row.append("-")
                    continue
                lo, hi = C.spread(rs, "rate")
                m = C.median_of(rs, "rate")
                row.append(C.fmt(m) + (f" ({lo:.0f}-{hi:.0f})" if len(rs) > 1 and lo is not None else ""))
            row.append(C.fmt(C.median_of(res.get(((d, w), "process"), []), "peak_mib")))
            row.append(C.fmt(C.median_of(res.get(((d, w), "torch"), []), "peak_mib")))
            rows.append(row)
        rep.add(C.markdown_table(headers, rows))
        rep.add("")
        # the same ratios per round (configurations of a round ran back to
        # back, so a busy spell of the machine hits both sides of a pair)
        paired = []
        for w in workers:
            if not w:
                continue
            r = {i: res.get(((d, w), i), []) for i in IMPLS}
            paired.append(f"{w} workers: process/torch {C.fmt_ratio(C.paired_ratio(r['process'], r['torch'], 'rate'))}, "
                          f"thread/torch {C.fmt_ratio(C.paired_ratio(r['thread'], r['torch'], 'rate'))}, "
                          f"auto/thread {C.fmt_ratio(C.paired_ratio(r['auto'], r['thread'], 'rate'))}, "
                          f"auto/process {C.fmt_ratio(C.paired_ratio(r['auto'], r['process'], 'rate'))}")
        rep.add("- paired per-round ratios (median): " + "; ".join(paired))
        rep.add("")
        best = {i: _best(res, d, i, workers) for i in IMPLS}
        moved = [r.get("moved") for w in workers for r in res.get(((d, w), "auto"), [])]
        bt = max((best["thread"][0] or 0), (best["process"][0] or 0))

        def ratio(x, y):
            return C.fmt_ratio(x / y) if x and y else "-"

        line = (f"- {d}: best of each (samples/s @ num_workers): "
                + ", ".join(f"{LABELS[i]} {C.fmt(best[i][0])} @ {best[i][1]}" for i in IMPLS)
                + f"; process/torch {ratio(best['process'][0], best['torch'][0])}"
                + f"; auto / max(thread, process) {ratio(best['auto'][0], bt)}"
                + f"; auto moved to processes in {sum(bool(m) for m in moved)} of {len(moved)} runs")
        summary.append(line)
        rep.add(line)
        bare = C.median_of(res.get(((d, 0), "bare"), []), "rate")
        if bare and best["torch"][0]:
            # no loader can beat the dataset itself on every usable CPU
            ceil = bare * ncpu
            t = best["torch"][0]
            rep.add(f"- {d}: CPU ceiling: the dataset alone runs {C.fmt(bare)} samples/s in one thread (no loader, "
                    f"no collate), so {ncpu} usable CPUs allow at most {C.fmt(ceil)}; torch's best is "
                    f"{100 * t / ceil:.0f}% of that, fl process's {100 * (best['process'][0] or 0) / ceil:.0f}%; "
                    f"1.2x torch would be {100 * 1.2 * t / ceil:.0f}%")
        rep.add("")
    if mem_groups:
        rep.add(f"## memory: {N_STRINGS:,} Python strings, num_workers=4, batch_size {MEM_BATCH}, one shuffled epoch")
        rep.add("")
        rows = []
        for i in ("torch", "process", "thread"):
            rs = res.get((("strings", 4), i), [])
            rows.append([LABELS[i], C.fmt(C.median_of(rs, "peak_mib")), C.fmt(C.median_of(rs, "rss_peak_mib")),
                         C.fmt(C.median_of(rs, "base_rss_mib")), C.fmt(C.median_of(rs, "rate"))])
        rep.add(C.markdown_table(["loader", "peak total MiB", "main RSS peak MiB", "base RSS MiB", "samples/s"],
                                 rows))
        tp = C.median_of(res.get((("strings", 4), "process"), []), "peak_mib")
        tt = C.median_of(res.get((("strings", 4), "torch"), []), "peak_mib")
        if tp and tt:
            rep.add("")
            rep.add(f"- peak total memory, process mode / torch: {C.fmt_ratio(tp / tt)}")
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
