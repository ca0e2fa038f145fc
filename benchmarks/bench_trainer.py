"""fastloader under transformers' Trainer, image classification the way
transformers' own example sets it up, against the Trainer as it is.

- ``torch``: the Trainer unchanged: its loader is torch's DataLoader over
  torchvision's ImageFolder with torchvision's train transforms
  (RandomResizedCrop 224, flip, ToTensor, Normalize), and a collator that
  stacks the samples into ``{"pixel_values", "labels"}`` (the example's
  collate_fn), ``dataloader_num_workers`` worker processes;
- ``swap``: the one assignment ``transformers.trainer.DataLoader =
  fastloader.DataLoader`` and nothing else (the same torchvision dataset and
  collator: fastloader's Python path, worker processes);
- ``fastloader``: the assignment, ``fastloader.ImageFolder`` with the same
  transforms from fastloader.transforms, and
  ``fastloader.DictCollate("pixel_values", "labels")`` as the Trainer's
  data_collator (the native batch path, threads).

The model is a linear probe on each image's mean colour (its step costs
~1 ms), so the Trainer's steps are paced by loading: images/s is the
images trained on over the wall time of ``trainer.train()`` (loader start,
the Trainer's own per-step work and its accelerate wrapping included); CPU
ms per image counts this process and its worker processes.  Each run is a
fresh process (fastloader/tools/harness.py), the loaders interleaved over
rounds; the ratio is the median of the per-round ratios.

    python benchmarks/bench_trainer.py [--sample-dir DIR] [--n 2000] [--workers 2] [--epochs 2] [--rounds 3]
        [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BATCH = 64
IMPLS = ("torch", "swap", "fastloader")


def _collate_dict(samples):
    """transformers' image-classification example's collate_fn."""
    import torch

    return {"pixel_values": torch.stack([x for x, _ in samples]), "labels": torch.tensor([y for _, y in samples])}


def child(cfg):
    import tempfile

    import torch
    import transformers
    import transformers.trainer as trainer_mod
    from torch import nn

    torch.set_num_threads(1)

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(3, 10)

        def forward(self, pixel_values, labels):
            return {"loss": nn.functional.cross_entropy(self.head(pixel_values.mean((2, 3))), labels)}

    if cfg["impl"] == "fastloader":
        fl = C.import_fastloader("DataLoader", "ImageFolder", "DictCollate")
        trainer_mod.DataLoader = fl.DataLoader
        ds = fl.ImageFolder(cfg["root"], transform=C.H.fastloader_transform("train"))
        collator = fl.DictCollate("pixel_values", "labels")
    else:
        import torchvision

        if cfg["impl"] == "swap":
            trainer_mod.DataLoader = C.import_fastloader("DataLoader").DataLoader
        ds = torchvision.datasets.ImageFolder(cfg["root"], transform=C.H.torch_transform("train"))
        collator = _collate_dict
    out = tempfile.mkdtemp(prefix="bench_trainer_")
    args = transformers.TrainingArguments(out, per_device_train_batch_size=BATCH, num_train_epochs=cfg["epochs"],
                                          save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                                          logging_steps=10 ** 6, dataloader_num_workers=cfg["workers"], seed=0)
    trainer = transformers.Trainer(model=Probe(), args=args, train_dataset=ds, data_collator=collator)

    def cpu_s():
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    cpu0, t0 = cpu_s(), time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    images = len(ds) * cfg["epochs"]
    r = dict(rate=images / wall, wall_s=wall, images=images, cpu_ms_per_img=(cpu_s() - cpu0) * 1000.0 / images)
    if cfg["impl"] != "torch":
        base = trainer.get_train_dataloader().base_dataloader   # a loader as the Trainer builds it
        next(iter(base))
        r["path"] = base.stats()["path"]
    r.update(cfg)
    return r


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--sample-dir", default=None, help="the image folder (default: make-sample's cached 2000)")
    p.add_argument("--n", type=int, default=2000, help="images in the sample folder made when none is given")
    p.add_argument("--workers", default="2", help="comma-separated dataloader_num_workers list")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="also write the Markdown report to this file")
    a = p.parse_args(argv)
    workers = [int(x) for x in a.workers.split(",")]
    root = a.sample_dir or C.load_sample_module().ensure_sample(a.n)
    C.import_fastloader("DataLoader")
    try:
        import transformers
    except ImportError:
        sys.exit("bench_trainer: transformers is not installed")
    script = os.path.abspath(__file__)
    groups = [(("train", w), [(impl, dict(impl=impl, workers=w, root=root, epochs=a.epochs)) for impl in IMPLS])
              for w in workers]
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg))
    elapsed = time.perf_counter() - t0
    rep = C.Report("transformers' Trainer: fastloader (one assignment, ImageFolder + DictCollate) vs as it is")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- transformers {transformers.__version__}; train pipeline at 224, batch {BATCH}, {a.epochs} epoch(s) "
            f"per run, a linear probe as the model, {a.rounds} interleaved round(s), fresh process per run")
    rep.add(f"- benchmark wall time {elapsed:.0f} s")
    rep.add("")
    headers = ["dataloader_num_workers"]
    for impl in IMPLS:
        headers += [f"{impl} img/s", f"{impl} CPU ms/img", f"{impl} peak MiB"]
    headers += ["swap / torch img/s", "fastloader / torch img/s", "fastloader path"]
    rows = []
    for w in workers:
        row = [str(w)]
        for impl in IMPLS:
            rs = res[(("train", w), impl)]
            if all("error" in r for r in rs):
                row += ["ERROR", "-", "-"]
                continue
            lo, hi = C.spread(rs, "rate")
            row += [f"{C.fmt(C.median_of(rs, 'rate'))} ({lo:.0f}-{hi:.0f})",
                    C.fmt(C.median_of(rs, "cpu_ms_per_img"), ".2f"), C.fmt(C.median_of(rs, "peak_mib"))]
        t_, s_, f_ = (res[(("train", w), impl)] for impl in IMPLS)
        paths = sorted({r.get("path", "?") for r in f_ if "error" not in r})
        row += [C.fmt_ratio(C.H.paired_ratio(s_, t_, "rate")), C.fmt_ratio(C.H.paired_ratio(f_, t_, "rate")),
                ",".join(paths) or "-"]
        rows.append(row)
    rep.add(C.markdown_table(headers, rows))
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
