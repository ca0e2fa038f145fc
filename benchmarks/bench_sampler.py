"""What the epoch's index order costs the process that draws it
(fastloader/sampling.py), torch's DataLoader against fastloader's.

torch's RandomSampler hands an epoch out through randperm(n).tolist() and
its DistributedSampler builds the whole epoch's list on every rank; both
keep Python ints for the epoch.  fastloader cuts the same batches from the
permutation tensor.  Each configuration runs one epoch of an ImageNet-sized
index space (1,281,167 samples, batch 256, num_workers=0; the dataset
returns its index, so the loop is the sampler and the collation) in a fresh
process with its own memory cgroup:

- peak: the cgroup's high-water mark (the whole process, torch's import
  included, ~285 MiB here), MiB; fl - torch: the difference, per round;
- after: RssAnon at the end of the epoch over the same process before the
  loader was imported (what stays resident), MiB;
- epoch: seconds from building the loader to its last batch;
- same batches: a digest of every batch's indices, equal between the loaders
  (torch's global RNG seeded alike; the generator seeded alike).

accel8: the loader as Hugging Face accelerate prepares it for 8 processes
(its BatchSamplerShard over the loader's batch sampler), seen from process
3: every process draws the whole epoch's order and keeps every 8th batch, so
torch's list of every index is on every rank; accelerate is imported by
both loaders' processes.  accel8s: the same with use_seedable_sampler=True
(accelerate's SeedableRandomSampler, which transformers' Trainer sets);
accel8r: accel8s through skip_first_batches (a Trainer's resumed epoch: the
first 40% of the process's batches drawn and dropped).

    python benchmarks/bench_sampler.py [--rounds 2] [--n 1281167] [--md FILE]
"""
import argparse
import hashlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from _children import Indices  # noqa: E402

SAMPLERS = {
    "random": "shuffle=True (RandomSampler, torch's global RNG)",
    "random-gen": "shuffle=True, generator= (RandomSampler with its generator)",
    "dist8": "sampler=DistributedSampler(world 8, rank 3, shuffle)",
    "accel8": "accelerate prepare_data_loader(shuffle=True; 8 processes, index 3)",
    "accel8s": "accelerate prepare_data_loader(shuffle=True, use_seedable_sampler=True; 8 processes, index 3)",
    "accel8r": "accelerate skip_first_batches(40% of the batches) of the accel8s loader (a resumed epoch)",
}


def child(cfg):
    """One epoch of one loader (a fresh process, see C.run_child)."""
    import torch

    torch.set_num_threads(1)
    n, kind = cfg["n"], cfg["sampler"]
    ds = Indices(n)
    a0 = C.H.status_kib("RssAnon")
    if cfg["impl"] == "torch":
        from torch.utils.data import DataLoader
    else:
        from fastloader import DataLoader
    torch.manual_seed(0)
    kw = dict(batch_size=cfg["batch_size"], num_workers=0)
    if kind == "random":
        kw["shuffle"] = True
    elif kind == "random-gen":
        kw.update(shuffle=True, generator=torch.Generator().manual_seed(0))
    elif kind == "dist8":
        from torch.utils.data import DistributedSampler

        kw["sampler"] = DistributedSampler(ds, num_replicas=8, rank=3, seed=0)
    elif kind.startswith("accel8"):
        kw["shuffle"] = True
    else:
        raise ValueError(kind)
    digest = hashlib.blake2b(digest_size=16)
    batches = samples = 0
    t = time.perf_counter()
    loader = DataLoader(ds, **kw)
    if kind.startswith("accel8"):   # what accelerator.prepare does on 8 processes, seen from the 4th
        from accelerate.data_loader import prepare_data_loader, skip_first_batches

        loader = prepare_data_loader(loader, num_processes=8, process_index=3, use_seedable_sampler=kind != "accel8")
        if kind == "accel8r":
            loader = skip_first_batches(loader, len(loader) * 2 // 5)
    for b in loader:
        digest.update(b.numpy().tobytes())
        batches += 1
        samples += len(b)
    epoch_s = time.perf_counter() - t
    return dict(epoch_s=epoch_s, batches=batches, samples=samples, digest=digest.hexdigest(),
                anon_after_mib=(C.H.status_kib("RssAnon") - a0) / 1024.0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--n", type=int, default=1281167, help="samples in the epoch (default: ImageNet's train set)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--samplers", default=",".join(SAMPLERS), help=f"comma-separated subset of: {','.join(SAMPLERS)}")
    p.add_argument("--md", help="also write the Markdown report to this file")
    a = p.parse_args(argv)
    kinds = [k for k in a.samplers.split(",") if k]
    for k in kinds:
        if k not in SAMPLERS:
            p.error(f"unknown sampler {k!r}")
    me = os.path.abspath(__file__)
    groups = [(k, [(impl, dict(impl=impl, sampler=k, n=a.n, batch_size=a.batch_size))
                   for impl in ("torch", "fastloader")]) for k in kinds]
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(me, cfg, mem_interval=0))
    lines = [f"# The epoch's index order: {a.n} samples, batch {a.batch_size}, num_workers=0, "
             f"{a.rounds} round(s)", "", *C.environment_lines(), ""]
    rows, problems = [], []
    for k in kinds:
        t, f = res[(k, "torch")], res[(k, "fastloader")]
        bad = [r["error"] for r in t + f if "error" in r]
        if bad:
            problems.append(f"{k}: {bad[0]}")
            continue
        digests = {r["digest"] for r in t + f}
        if len(digests) != 1 or len({r["samples"] for r in t + f}) != 1:
            problems.append(f"{k}: the loaders gave different batches")

        def med(rs, key):
            vals = [r.get(key) for r in rs if r.get(key) is not None]
            return statistics.median(vals) if vals else None

        diffs = [rf.get("cgroup_peak_mib") - rt.get("cgroup_peak_mib") for rt, rf in zip(t, f)
                 if rf.get("cgroup_peak_mib") is not None and rt.get("cgroup_peak_mib") is not None]
        rows.append([SAMPLERS[k], C.H.fmt(med(t, "cgroup_peak_mib"), ".1f"), C.H.fmt(med(f, "cgroup_peak_mib"), ".1f"),
                     ", ".join(f"{d:+.1f}" for d in diffs) or "-",
                     C.H.fmt(med(t, "anon_after_mib"), ".1f"), C.H.fmt(med(f, "anon_after_mib"), ".1f"),
                     C.H.fmt(med(t, "epoch_s"), ".2f"), C.H.fmt(med(f, "epoch_s"), ".2f"),
                     "yes" if len(digests) == 1 else "NO"])
    lines.append(C.H.markdown_table(["sampler", "torch peak MiB", "fl peak MiB", "fl - torch, per round",
                                     "torch after MiB", "fl after MiB", "torch epoch s", "fl epoch s",
                                     "same batches"], rows))
    lines += ["", "peak: the measured process's memory cgroup high-water mark (torch's import included); after: "
              "RssAnon at the end of the epoch over the process before the loader's import; medians over rounds."]
    if problems:
        lines += ["", "PROBLEMS:", *(f"- {x}" for x in problems)]
    report = "\n".join(lines)
    print(report)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(report + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
