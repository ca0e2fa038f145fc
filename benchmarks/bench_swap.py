"""The import swap: ``from torch.utils.data import DataLoader`` replaced by
``from fastloader import DataLoader`` -- the same Dataset object, the same
arguments, fastloader's default settings otherwise -- on the datasets people
bring (issue 25's measurement).

Datasets (module level here or in bench_python.py / bench_recipes.py, so that
torch's worker processes can use them):

  if-classic-v1   torchvision.datasets.ImageFolder over the project's sample
                  JPEGs (fastloader.tools.sample) with torchvision's reference
                  training preset, classic policy: RandomResizedCrop(224) +
                  RandomHorizontalFlip + PILToTensor + ConvertImageDtype(float)
                  + Normalize (bench_recipes.PresetTrain, transforms v1)
  if-ta_wide-v1   the same + TrivialAugmentWide after the flip and
                  RandomErasing(p=0.1) at the end, transforms v1
  if-ta_wide-v2   the same with torchvision.transforms.v2 (ToDtype(scale=True),
                  ToPureTensor; the preset's default "pil" backend, so
                  PILToTensor rather than ToImage, as presets.py has it)
                  -- all three Python datasets: PIL decode and transforms in
                  Python, under either loader
  python          bench_python.PythonDataset: ~1 ms of pure-Python arithmetic
                  a sample (holds the GIL)
  numpy           bench_python.NumpyDataset: ~1 ms of GIL-releasing numpy work
                  a sample, 3x256x256 float32
  nlp             TokenDataset below: a synthetic sentence per index,
                  tokenised in Python (lower-case, split, word pieces hashed
                  into a 30522-id vocabulary), padded to 128, 15% masked:
                  {"input_ids", "attention_mask", "labels"} LongTensor[128]
  iterable        ShardedStream below: an IterableDataset sharding itself by
                  torch.utils.data.get_worker_info() (as torch's docs show),
                  yielding (log-spectrogram FloatTensor[99, 81], label) from a
                  synthesised 1 s waveform (numpy FFT per sample)

Every loader: batch_size 64 (all datasets), shuffle=True for the map-style
ones, num_workers in --workers; fastloader gets --fl-kwargs on top (default
none: its defaults, whatever they are in this checkout) and the worker mode it
actually used is read from loader.stats()["worker_mode"] after the run.

Protocol: the project's harness (fastloader/tools/harness.py via _common.py):
every (dataset, loader, num_workers) in a fresh process, torch and fastloader
of one (dataset, num_workers) back to back, the order rotated per round;
torch.set_num_threads(--torch-threads, default 1, both loaders) in the
measured process.  samples/s counts what comes after the first batch; a
batch is held until the next arrives, as ``for x, y in loader`` does.

Memory: the peak over the run of the summed PSS (proportional set size,
/proc/<pid>/smaps_rollup) of the loader process and every process under it
(torch's workers, fastloader's worker processes if any), sampled every 50 ms
by the parent (harness.TreeMemSampler: a process's smaps_rollup is re-read
when its RSS moved by > 2 MiB, when the tree changed, and every
--mem-interval s; in between its last PSS plus its RSS change): pages shared
by k processes count 1/k each, so threads and processes are measured alike.
Also reported: "total", RSS(main) + private memory of the descendants (the
project's other measure, harness ``peak_mib``), and what the sampling cost
the parent in CPU.  Sampling ends when the measured process prints its
result (its exit is not the loader's).

Reported: per dataset and num_workers the median samples/s of each loader,
fastloader/torch (median of per-round pairs) for speed and peak memory; each
loader at its best num_workers (best median vs best median; memory of those
two configurations); fastloader's worker mode and loader path.

    python benchmarks/bench_swap.py [--quick] [--datasets LIST] [--workers 0,1,2,4]
        [--rounds 2] [--fl-kwargs '{"worker_mode": "thread"}'] [--out FILE.json] [--md FILE.md]

--quick: 256-image sample, tiny sizes, num_workers 0,2, one round; checks
that both loaders give the same number of samples and the same batch
structure (keys, shapes, dtypes) and exits 1 if not (CI smoke).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import bench_python as BP  # noqa: E402
import bench_recipes as R  # noqa: E402

import torch  # noqa: E402  (ShardedStream subclasses torch's IterableDataset)

BATCH_SIZE = 64
SEQ_LEN = 128
VOCAB = 30522
PAD, CLS, SEP, MASK, UNK_PUNCT = 0, 101, 102, 103, 1012


# ----------------------------------------------------------------------------
# the datasets that no other script has (module level: torch's workers pickle / import them)


class TokenDataset:
    """Map-style NLP samples: a synthetic sentence per index, tokenised in
    Python into BERT-style inputs padded to SEQ_LEN, 15% of the tokens masked
    (labels -100 elsewhere).  ~0.3 ms a sample, nearly all holding the GIL."""

    SYLLABLES = ["ka", "ro", "mi", "ten", "sha", "lo", "ver", "qu", "an", "dis", "ing", "ed", "pre", "tion",
                 "ly", "mor", "ph", "el", "un", "st"]

    def __init__(self, n, seq_len=SEQ_LEN):
        import random

        self.n = n
        self.seq_len = seq_len
        rng = random.Random(0)
        self.words = ["".join(rng.choice(self.SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(5000)]

    def __len__(self):
        return self.n

    def sentence(self, i):
        import random

        rng = random.Random(i)
        words, out = self.words, []
        for _ in range(rng.randint(24, 240)):
            w = words[rng.randrange(5000)]
            r = rng.random()
            if r < 0.1:
                w = w.capitalize()
            elif r < 0.18:
                w += ",.!?;"[rng.randrange(5)]
            out.append(w)
        return " ".join(out)

    def tokenize(self, text):
        ids = [CLS]
        for raw in text.lower().split():
            w = raw.rstrip(",.!?;")
            for j in range(0, len(w), 4):  # word pieces of at most 4 characters
                piece = w[j:j + 4] if j == 0 else "##" + w[j:j + 4]
                ids.append(1000 + zlib.crc32(piece.encode()) % (VOCAB - 1000))
            if len(w) != len(raw):
                ids.append(UNK_PUNCT)
        ids = ids[:self.seq_len - 1]
        ids.append(SEP)
        return ids

    def __getitem__(self, i):
        import random

        if not 0 <= i < self.n:
            raise IndexError(i)
        ids = self.tokenize(self.sentence(i))
        k = len(ids)
        pad = self.seq_len - k
        labels = [-100] * self.seq_len
        rng = random.Random(i ^ 0x5BD1E995)
        for p in range(1, k - 1):
            if rng.random() < 0.15:
                labels[p] = ids[p]
                ids[p] = MASK
        return {"input_ids": torch.tensor(ids + [PAD] * pad, dtype=torch.long),
                "attention_mask": torch.tensor([1] * k + [0] * pad, dtype=torch.long),
                "labels": torch.tensor(labels, dtype=torch.long)}


class ShardedStream(torch.utils.data.IterableDataset):
    """An IterableDataset of ``n`` samples that splits itself between the
    workers by get_worker_info(), as torch's IterableDataset docs show; each
    sample a 1 s 16 kHz tone plus noise turned into a log spectrogram
    (99 frames x 81 bins, numpy FFT), with a label."""

    def __init__(self, n):
        super().__init__()
        self.start, self.end = 0, n

    def __iter__(self):
        worker_info = torch.utils.data.get_worker_info()
        if worker_info is None:  # single-process data loading, return the full iterator
            iter_start, iter_end = self.start, self.end
        else:  # in a worker: split the workload
            per_worker = int(math.ceil((self.end - self.start) / float(worker_info.num_workers)))
            iter_start = self.start + worker_info.id * per_worker
            iter_end = min(iter_start + per_worker, self.end)
        for i in range(iter_start, iter_end):
            yield self.sample(i)

    @staticmethod
    def sample(i):
        import numpy as np

        rng = np.random.default_rng(i)
        t = np.arange(16000, dtype=np.float32) * np.float32(1 / 16000)
        wav = np.sin(np.float32(2 * np.pi * (200 + (i % 50) * 20)) * t)
        wav += np.float32(0.1) * rng.standard_normal(16000, dtype=np.float32)
        frames = wav[:15840].reshape(99, 160) * np.hanning(160).astype(np.float32)
        spec = np.log1p(np.abs(np.fft.rfft(frames, axis=1))).astype(np.float32)
        return torch.from_numpy(spec), i % 10


# name -> (description, kind, default samples per run); kind "folder:<recipe>" | "python" | "numpy" | ...
# The sizes: ~3.5 s after the first batch at twice the single-thread rate (2 CPUs); the image
# datasets read the whole 2000-image sample folder once.
DATASETS = {
    "if-classic-v1": ("torchvision ImageFolder + reference preset classic (v1)", "folder:tv-classic-v1", 2000),
    "if-ta_wide-v1": ("torchvision ImageFolder + reference preset ta_wide + RandomErasing(0.1) (v1)",
                      "folder:tv-ta_wide-re0.1-v1", 2000),
    "if-ta_wide-v2": ("torchvision ImageFolder + reference preset ta_wide + RandomErasing(0.1) (v2)",
                      "folder:tv-ta_wide-re0.1-v2", 2000),
    "python": ("bench_python.PythonDataset: ~1 ms pure Python a sample", "python", 5760),
    "numpy": ("bench_python.NumpyDataset: ~1 ms GIL-releasing numpy a sample", "numpy", 5120),
    "nlp": ("TokenDataset: Python tokenisation into a dict of LongTensor[128]", "nlp", 32000),
    "iterable": ("ShardedStream: IterableDataset sharded by get_worker_info(), numpy FFT a sample",
                 "iterable", 25600),
}
QUICK_SAMPLES = 192  # three batches


def expected_structure(dataset, batch=BATCH_SIZE):
    """What a full batch of ``dataset`` must look like (harness ``structure``), from either loader."""
    kind = DATASETS[dataset][1]
    if kind.startswith("folder:"):
        return f"list(float32[{batch}x3x224x224], int64[{batch}])"
    if kind == "python":
        return f"list(float32[{batch}x16], int64[{batch}])"
    if kind == "numpy":
        return f"list(float32[{batch}x3x{BP.IMG_SHAPE[0]}x{BP.IMG_SHAPE[1]}], int64[{batch}])"
    if kind == "nlp":
        keys = ("input_ids", "attention_mask", "labels")
        return "{" + ", ".join(f"{k}: int64[{batch}x{SEQ_LEN}]" for k in keys) + "}"
    return f"list(float32[{batch}x99x81], int64[{batch}])"


def make_dataset(kind, samples, root=None):
    """The dataset object both loaders get."""
    if kind.startswith("folder:"):
        import torchvision.datasets

        return torchvision.datasets.ImageFolder(root, transform=R.make_transform(kind.split(":", 1)[1], 224))
    if kind == "python":
        return BP.PythonDataset(samples)
    if kind == "numpy":
        return BP.NumpyDataset(samples)
    if kind == "nlp":
        return TokenDataset(samples)
    if kind == "iterable":
        return ShardedStream(samples)
    raise ValueError(kind)


# ----------------------------------------------------------------------------
# child


def structure(obj):
    """The batch's structure as a string: keys, shapes, dtypes (what both loaders must agree on)."""
    if isinstance(obj, torch.Tensor):
        return f"{str(obj.dtype).replace('torch.', '')}[{'x'.join(map(str, obj.shape))}]"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}: {structure(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return type(obj).__name__ + "(" + ", ".join(structure(v) for v in obj) + ")"
    return type(obj).__name__


def child(cfg):
    """One measured configuration (a fresh process, see C.run_child)."""
    if cfg.get("torch_threads"):
        torch.set_num_threads(cfg["torch_threads"])
    impl, kind, w = cfg["impl"], cfg["kind"], cfg["workers"]
    # imports and the dataset outside the timed region; the same object for either loader
    ds = make_dataset(kind, cfg["samples"], cfg.get("root"))
    if impl == "torch":
        from torch.utils.data import DataLoader
        kw = {}
    else:
        from fastloader import DataLoader
        kw = dict(cfg.get("fl_kwargs") or {})
    iterable = isinstance(ds, torch.utils.data.IterableDataset)
    kw.update(batch_size=cfg["batch_size"], num_workers=w)
    if not iterable:
        kw["shuffle"] = True
    max_batches = None
    if kind.startswith("folder:"):  # the folder holds more images than one run reads
        max_batches = math.ceil(cfg["samples"] / cfg["batch_size"])
    holder = {}

    def make():
        holder["dl"] = DataLoader(ds, **kw)
        return holder["dl"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        c0 = os.times()
        # warm rate: past torch's prefetch window (num_workers x prefetch_factor 2 batches)
        r = C.H.time_loader(make, epochs=1, max_batches=max_batches, hold_batch=True,
                            on_first=lambda b: {"structure": structure(b)}, warm_batches=2 * w)
        c1 = os.times()
    # CPU of the whole tree: this process's threads, and its worker processes, which both loaders have joined
    # (and so reaped) by now, the iterator being gone; what the run cost the machine, whatever its wall time
    r["tree_cpu_s"] = sum(getattr(c1, f) - getattr(c0, f)
                          for f in ("user", "system", "children_user", "children_system"))
    r["cpu_ms_per_sample"] = r["tree_cpu_s"] / r["samples"] * 1e3 if r.get("samples") else None
    if impl == "fastloader":
        try:
            st = holder["dl"].stats()
        except Exception as e:  # noqa: BLE001 - report it, the run itself went fine
            st = {"stats_error": f"{type(e).__name__}: {e}"}
        r["fl_worker_mode"] = st.get("worker_mode")
        r["fl_path"] = st.get("path")
        r["fl_stats_error"] = st.get("stats_error")
        r["fl_attr_worker_mode"] = getattr(holder["dl"], "worker_mode", None)
    r["warnings"] = C.distinct_warnings(caught, 4, width=300)
    r["torch_threads"] = torch.get_num_threads()
    r.update(cfg)
    return r


def charged_at_end(res, datasets):
    """A paragraph on what the cgroup peaks are made of (harness
    ``cgroup_end_mib``): the page cache charged to each run, which depends on
    what other processes read before it rather than on the loader, and, at
    num_workers=0 (one process whose memory only grows over the epoch, so
    its end is its peak), each loader's own private memory at the end."""
    runs = [(k, r) for k, v in res.items() for r in v if isinstance(r.get("cgroup_end_mib"), dict)]
    if not runs:
        return "Charged at the end: no memory cgroup here, not reported."
    parts = []
    for impl in ("torch", "fastloader"):
        pc = [r["cgroup_end_mib"]["page_cache"] for k, r in runs
              if k[1] == impl and "page_cache" in r["cgroup_end_mib"]]
        if pc:
            parts.append(f"{impl} {min(pc):.1f}-{max(pc):.1f}")
    text = ("Charged at the end (cgroup memory.stat): page cache, which the peaks include and which depends on what "
            "ran before, not on the loader, MiB over all runs: " + ", ".join(parts) + ".")
    nw0 = []
    for d in datasets:
        anon = {impl: [r["cgroup_end_mib"]["anon"] for k, r in runs
                       if k == ((d, 0), impl) and "anon" in r["cgroup_end_mib"]] for impl in ("torch", "fastloader")}
        if anon["torch"] and anon["fastloader"]:
            nw0.append(f"{d} {statistics.median(anon['torch']):.1f} -> {statistics.median(anon['fastloader']):.1f}")
    if nw0:
        text += (" Private (anon) memory at the end at nw=0, where it is the peak's own part, torch -> fastloader "
                 "median MiB: " + "; ".join(nw0) + ".")
    return text


def per_sample_ms(kind, root, reps=24):
    """Single-threaded cost of one sample in this process (map-style: ds[i]; iterable: next())."""
    ds = make_dataset(kind, reps + 1, root)
    if isinstance(ds, torch.utils.data.IterableDataset):
        it = iter(ds)
        next(it)
        t = time.perf_counter()
        for _ in range(reps):
            next(it)
    else:
        n = len(ds)
        ds[0]
        t = time.perf_counter()
        for i in range(reps):
            ds[(i * 7919) % n]
    return (time.perf_counter() - t) / reps * 1e3


# ----------------------------------------------------------------------------
# parent


def _csv(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, 256-image sample, num_workers 0,2, one round; checks batch structure")
    p.add_argument("--datasets", default=None, help=f"comma-separated subset of: {','.join(DATASETS)}")
    p.add_argument("--workers", default=None, help="comma-separated num_workers (default 0,1,2,4; --quick 0,2)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2; --quick 1)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every dataset's samples per run")
    p.add_argument("--fl-kwargs", default="{}", help="JSON dict of extra fastloader.DataLoader arguments, e.g. "
                   "'{\"worker_mode\": \"process\"}' (default none: fastloader's defaults)")
    p.add_argument("--n", type=int, default=None, help="images in the sample folder (default 2000; --quick 256)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads() in every measured process, both loaders (default 1; 0: torch's "
                   "default)")
    p.add_argument("--mem-interval", type=float, default=1.0,
                   help="the tree's PSS is sampled every 50 ms; each process's smaps_rollup is re-read when its RSS "
                   "moved by > 2 MiB and at least every this many seconds (default 1; see harness.TreeMemSampler)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is killed")
    p.add_argument("--out", help="write all results as JSON to this file")
    p.add_argument("--md", help="also write the Markdown report to this file")
    a = p.parse_args(argv)

    try:
        fl_kwargs = json.loads(a.fl_kwargs)
        assert isinstance(fl_kwargs, dict)
    except (ValueError, AssertionError):
        p.error(f"--fl-kwargs wants a JSON object, got {a.fl_kwargs!r}")
    datasets = _csv(a.datasets) if a.datasets else list(DATASETS)
    for d in datasets:
        if d not in DATASETS:
            p.error(f"unknown dataset {d!r}; choose from {','.join(DATASETS)}")
    workers = [int(x) for x in _csv(a.workers or ("0,2" if a.quick else "0,1,2,4"))]
    rounds = a.rounds or (1 if a.quick else 2)
    try:
        C.import_fastloader("DataLoader")
    except C.FastloaderMissing as e:
        sys.exit(f"bench_swap: {e}")

    root = stats = None
    nfiles = 0
    if any(DATASETS[d][1].startswith("folder:") for d in datasets):
        sample = C.load_sample_module()
        root = sample.ensure_sample(a.n or (256 if a.quick else 2000))
        stats = sample.read_stats(root)
        nfiles = sum(1 for _, _, fs in os.walk(root) for f in fs if f.lower().endswith((".jpg", ".jpeg")))
    sizes = {}
    for d in datasets:
        n = QUICK_SAMPLES if a.quick else max(BATCH_SIZE,
                                              int(round(DATASETS[d][2] * a.scale / BATCH_SIZE)) * BATCH_SIZE)
        if DATASETS[d][1].startswith("folder:") and n > nfiles:
            n = nfiles
        sizes[d] = n
    cost = {} if a.quick else {d: per_sample_ms(DATASETS[d][1], root) for d in datasets}

    script = os.path.abspath(__file__)
    groups = []
    for d in datasets:
        for w in workers:
            base = dict(dataset=d, kind=DATASETS[d][1], workers=w, samples=sizes[d], batch_size=BATCH_SIZE,
                        root=root, torch_threads=a.torch_threads)
            groups.append(((d, w), [("fastloader", dict(base, impl="fastloader", fl_kwargs=fl_kwargs)),
                                    ("torch", dict(base, impl="torch"))]))
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, rounds, lambda cfg: C.run_child(
        script, cfg, mem_interval=a.mem_interval, timeout=a.timeout, pss=True))
    elapsed = time.perf_counter() - t0

    # ---- figures
    def rs(d, w, impl):
        return res.get(((d, w), impl), [])

    def med(d, w, impl, f="epoch_rate"):
        return C.median_of(rs(d, w, impl), f)

    def best(d, impl):
        c = [(med(d, w, impl), w) for w in workers if med(d, w, impl) is not None]
        return max(c) if c else (None, None)

    def mem(d, w, impl, f="peak_pss_mib"):
        return med(d, w, impl, f)

    summary, problems = {}, []
    for d in datasets:
        per = {}
        for w in workers:
            f_, t_ = rs(d, w, "fastloader"), rs(d, w, "torch")
            modes = sorted({str(r.get("fl_worker_mode")) for r in f_ if "error" not in r})
            paths = sorted({str(r.get("fl_path")) for r in f_ if "error" not in r})
            per[w] = dict(torch_rate=med(d, w, "torch"), fl_rate=med(d, w, "fastloader"),
                          rate_ratio=C.paired_ratio(f_, t_, "epoch_rate"),
                          warm_ratio=C.paired_ratio(f_, t_, "warm_rate"),
                          first_ratio=C.paired_ratio(f_, t_, "rate"),
                          torch_pss=mem(d, w, "torch"), fl_pss=mem(d, w, "fastloader"),
                          pss_ratio=C.paired_ratio(f_, t_, "peak_pss_mib"),
                          torch_cg=mem(d, w, "torch", "cgroup_peak_mib"), fl_cg=mem(d, w, "fastloader", "cgroup_peak_mib"),
                          cg_ratio=C.paired_ratio(f_, t_, "cgroup_peak_mib"),
                          torch_total=med(d, w, "torch", "peak_mib"), fl_total=med(d, w, "fastloader", "peak_mib"),
                          total_ratio=C.paired_ratio(f_, t_, "peak_mib"),
                          cpu_ratio=C.paired_ratio(f_, t_, "cpu_ms_per_sample"),
                          torch_cpu=med(d, w, "torch", "cpu_ms_per_sample"),
                          fl_cpu=med(d, w, "fastloader", "cpu_ms_per_sample"),
                          torch_ttfb=med(d, w, "torch", "ttfb_s"), fl_ttfb=med(d, w, "fastloader", "ttfb_s"),
                          fl_worker_mode=modes, fl_path=paths,
                          sampler_cpu_pct={impl: C.median_of([dict(x, pct=100 * x["sampler_cpu_s"] / x["wall_s"])
                                                              for x in rs(d, w, impl) if "error" not in x
                                                              and x.get("sampler_cpu_s") is not None], "pct")
                                           for impl in ("torch", "fastloader")})
            # correctness: the same samples and the same batch structure from both loaders
            for r_f, r_t in zip(f_, t_):
                if "error" in r_f or "error" in r_t:
                    continue
                if r_f.get("samples") != r_t.get("samples"):
                    problems.append(f"{d} nw={w}: samples fastloader {r_f.get('samples')} vs torch "
                                    f"{r_t.get('samples')}")
                if r_f.get("structure") != r_t.get("structure"):
                    problems.append(f"{d} nw={w}: batch structure fastloader {r_f.get('structure')} vs torch "
                                    f"{r_t.get('structure')}")
        (fb, fw), (tb, tw) = best(d, "fastloader"), best(d, "torch")
        summary[d] = dict(per_workers=per, fl_best=fb, fl_best_nw=fw, torch_best=tb, torch_best_nw=tw,
                          best_ratio=(fb / tb if fb and tb else None),
                          best_pss_ratio=(mem(d, fw, "fastloader") / mem(d, tw, "torch")
                                          if fw is not None and tw is not None and mem(d, fw, "fastloader")
                                          and mem(d, tw, "torch") else None),
                          best_cg_ratio=(mem(d, fw, "fastloader", "cgroup_peak_mib")
                                         / mem(d, tw, "torch", "cgroup_peak_mib")
                                         if fw is not None and tw is not None
                                         and mem(d, fw, "fastloader", "cgroup_peak_mib")
                                         and mem(d, tw, "torch", "cgroup_peak_mib") else None),
                          samples=sizes[d], cost_ms=cost.get(d),
                          structure=next((r.get("structure") for w in workers for r in rs(d, w, "torch")
                                          if r.get("structure")), None))

    # ---- report
    rep = C.Report("The import swap: torch.utils.data.DataLoader -> fastloader.DataLoader, nothing else changed")
    rep.add("\n".join(C.environment_lines()))
    if stats:
        rep.add(f"- images: {nfiles} JPEGs in {root} (fastloader.tools.sample): mean {stats['mean_width']:.0f} x "
                f"{stats['mean_height']:.0f}, {stats['mean_bytes'] / 1024:.1f} KiB")
    rep.add(f"- batch_size {BATCH_SIZE}, shuffle=True (map-style), fastloader kwargs: "
            f"{json.dumps(fl_kwargs) if fl_kwargs else 'none (its defaults)'}; torch.set_num_threads("
            f"{a.torch_threads or 'default'}) in every measured process; {rounds} interleaved round(s), each "
            f"configuration in a fresh process; benchmark wall time {elapsed:.0f} s")
    rep.add("- samples/s: the epoch's samples over the time from building the loader to its last batch (worker "
            "start included, what a training epoch sees), median over rounds; fl/torch: median of the per-round "
            "pairs; warm: the same past the first num_workers x 2 batches (torch's prefetch window: its workers "
            "all start on a batch at once, so its first batch comes late and the next ones in a burst); after "
            "1st: past the first batch only, which that burst flatters on short epochs; best: each loader's "
            "best median (epoch) over num_workers, best/best their ratio")
    rep.add(f"- memory: peak over the run of the summed PSS of the loader process and all its descendants, "
            f"sampled every 50 ms (a process's /proc/<pid>/smaps_rollup re-read when its RSS moved by > 2 MiB, when "
            f"the tree changed and every {a.mem_interval:g} s; its RSS change added in between), MiB, median over "
            "rounds; mem fl/torch: median of the per-round pairs (<1: fastloader uses less); total fl/torch: the same "
            "for RSS(main) + USS(descendants); at best: fastloader's best-nw config over torch's")
    rep.add("- peak (cgroup): each measured process in its own memory cgroup, the kernel's high-water mark of "
            "everything charged to it (its workers, shared memory included) read at the end of the run: exact, "
            "where the PSS sampler sees a 50 ms grid and misses short peaks (torch's shared-memory batches live "
            "from collation to the next step); '-' where no cgroup could be made")
    rep.add("")
    rep.add("## Summary (target: fl/torch >= 1.00x at every num_workers >= 1 and best/best; memory <= 1.00x)")
    rep.add("")
    rep.add("Each nw cell: epoch fl/torch (warm fl/torch). CPU a sample: the CPU time of the loader's whole "
            "process tree (main process and workers, user + system) over the samples delivered, fl/torch: what "
            "each loader costs the machine per sample, which the machine's noise moves far less than the rates "
            "(<1: fastloader spends less). Memory: peak (cgroup) fl/torch at each nw, then the sampled PSS's.")
    rep.add("")
    hdr = ["dataset"] + [f"nw={w}" for w in workers] + ["best/best (fl nw, torch nw)", "CPU a sample at nw",
                                                        "peak (cgroup) at nw", "PSS at nw", "peak at best",
                                                        "fl worker mode"]
    rows = []
    for d in datasets:
        s = summary[d]
        row = [d]
        for w in workers:
            pw = s["per_workers"][w]
            row.append(f"{C.fmt_ratio(pw['rate_ratio'])} ({C.fmt_ratio(pw['warm_ratio'])})")
        row.append(f"{C.fmt_ratio(s['best_ratio'])} ({s['fl_best_nw']}, {s['torch_best_nw']})")
        row.append(", ".join(C.fmt(s["per_workers"][w]["cpu_ratio"], ".2f") for w in workers))
        row.append(", ".join(C.fmt(s["per_workers"][w]["cg_ratio"], ".2f") for w in workers))
        row.append(", ".join(C.fmt(s["per_workers"][w]["pss_ratio"], ".2f") for w in workers))
        row.append(C.fmt_ratio(s["best_cg_ratio"] if s["best_cg_ratio"] is not None else s["best_pss_ratio"]))
        row.append(", ".join(f"{w}:{'/'.join(s['per_workers'][w]['fl_worker_mode'])}" for w in workers))
        rows.append(row)
    rep.add(C.markdown_table(hdr, rows))
    rep.add("")
    for d in datasets:
        s = summary[d]
        cost_s = f", {s['cost_ms']:.2f} ms a sample single-threaded" if s["cost_ms"] else ""
        rep.add(f"## {d}: {DATASETS[d][0]}")
        rep.add("")
        rep.add(f"{s['samples']} samples per run{cost_s}; batch: `{s['structure']}`")
        rep.add("")
        rows = []
        for w in workers:
            pw = s["per_workers"][w]

            def rate(impl):
                v = med(d, w, impl)
                if v is None:
                    return "ERROR"
                lo, hi = C.spread(rs(d, w, impl), "epoch_rate")
                return f"{v:.0f}" + (f" ({lo:.0f}-{hi:.0f})" if rounds > 1 else "")

            rows.append([str(w), rate("torch"), rate("fastloader"), C.fmt_ratio(pw["rate_ratio"]),
                         C.fmt_ratio(pw["warm_ratio"]), C.fmt_ratio(pw["first_ratio"]),
                         C.fmt(pw["torch_cpu"], ".3f"), C.fmt(pw["fl_cpu"], ".3f"), C.fmt_ratio(pw["cpu_ratio"]),
                         C.fmt(pw["torch_cg"]), C.fmt(pw["fl_cg"]), C.fmt_ratio(pw["cg_ratio"]),
                         C.fmt(pw["torch_pss"]), C.fmt(pw["fl_pss"]), C.fmt_ratio(pw["pss_ratio"]),
                         C.fmt_ratio(pw["total_ratio"]), C.fmt(pw["torch_ttfb"], ".2f"), C.fmt(pw["fl_ttfb"], ".2f"),
                         "/".join(pw["fl_worker_mode"]) + " " + "/".join(pw["fl_path"])])
        rows.append(["best", f"{C.fmt(s['torch_best'])} (nw {s['torch_best_nw']})",
                     f"{C.fmt(s['fl_best'])} (nw {s['fl_best_nw']})", C.fmt_ratio(s["best_ratio"]), "", "",
                     "", "", "",
                     C.fmt(mem(d, s["torch_best_nw"], "torch", "cgroup_peak_mib"))
                     if s["torch_best_nw"] is not None else "-",
                     C.fmt(mem(d, s["fl_best_nw"], "fastloader", "cgroup_peak_mib"))
                     if s["fl_best_nw"] is not None else "-",
                     C.fmt_ratio(s["best_cg_ratio"]),
                     C.fmt(mem(d, s["torch_best_nw"], "torch")) if s["torch_best_nw"] is not None else "-",
                     C.fmt(mem(d, s["fl_best_nw"], "fastloader")) if s["fl_best_nw"] is not None else "-",
                     C.fmt_ratio(s["best_pss_ratio"]), "", "", "", ""])
        rep.add(C.markdown_table(["nw", "torch samples/s", "fl samples/s", "fl/torch", "warm fl/torch",
                                  "after 1st fl/torch", "torch CPU ms a sample", "fl CPU ms a sample",
                                  "CPU fl/torch", "torch peak (cgroup)", "fl peak (cgroup)",
                                  "peak fl/torch", "torch peak PSS",
                                  "fl peak PSS", "mem fl/torch", "total fl/torch", "torch first (s)",
                                  "fl first (s)",
                                  "fl worker mode, path"], rows))
        warns = sorted({x for w in workers for r in rs(d, w, "fastloader") for x in r.get("warnings") or ()})
        for x in warns[:3]:
            rep.add(f"- fastloader warning: {x}")
        rep.add("")
    cpu = [v for d in datasets for w in workers for v in summary[d]["per_workers"][w]["sampler_cpu_pct"].values()
           if v is not None]
    if cpu:
        rep.add(f"Memory sampling cost (parent CPU over run wall time): median {statistics.median(cpu):.1f}%, "
                f"max {max(cpu):.1f}% of one CPU.")
        rep.add("")
    rep.add(charged_at_end(res, datasets))
    rep.add("")
    if problems:
        rep.add("## Correctness problems")
        rep.add("")
        rep.add("\n".join(f"- {x}" for x in problems))
        rep.add("")
    elif a.quick:
        rep.add("Correctness (quick): both loaders gave the same number of samples and the same batch structure "
                "in every configuration.")
        rep.add("")
    try:
        la = os.getloadavg()
        rep.add(f"Load average at the end: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}.")
        rep.add("")
    except OSError:
        pass
    status = rep.finish(res, a.md)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "workers": workers, "rounds": rounds, "fl_kwargs": fl_kwargs,
                       "wall_s": elapsed, "summary": {d: {**s, "per_workers": {str(w): v for w, v in
                                                                                 s["per_workers"].items()}}
                                                      for d, s in summary.items()},
                       "problems": problems,
                       "runs": [{**r, "dataset": k[0][0], "workers": k[0][1], "impl": k[1], "round": i + 1}
                                for k, v in res.items() for i, r in enumerate(v)]}, f, indent=1, default=str)
    return 1 if (status or problems) else 0


if __name__ == "__main__":
    sys.exit(main())
