"""Measured configurations that no benchmark script has: the peers
(torchdata's StatefulDataLoader), checkpoint/resume, GPU delivery.

Each function is one configuration, run by the pytest suite in a fresh process
(harness.run_child) or, in quick mode, in the pytest process; like the
scripts' ``child`` functions, it times the loader with harness.time_loader and
returns its dict.  Nothing here imports fastloader at module level, so that
torch's and torchdata's measured processes never load it.
"""
from __future__ import annotations

import copy
import os
import pickle
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

# ----------------------------------------------------------------------------
# torchdata's StatefulDataLoader: torch's drop-in DataLoader with state_dict()


def _stateful_dataloader():
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader


def torchdata_pipeline(cfg):
    """harness.pipeline_child's torch side (torchvision ImageFolder + transforms) under StatefulDataLoader."""
    import torch

    if cfg.get("torch_threads"):
        torch.set_num_threads(cfg["torch_threads"])
    import torchvision.datasets  # noqa: F401  (imports outside the timed region)
    import torchvision.transforms  # noqa: F401

    DL = _stateful_dataloader()
    H = C.H

    def make():
        ds = torchvision.datasets.ImageFolder(cfg["root"], transform=H.torch_transform(cfg["pipeline"]))
        return DL(ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"], shuffle=True)

    r = H.time_loader(make, epochs=cfg.get("epochs", 1), max_batches=cfg.get("max_batches"),
                      hold_batch=bool(cfg.get("hold_batch")))
    r["torch_threads"] = torch.get_num_threads()
    return r


def torchdata_python(cfg):
    """bench_python.py's datasets (as bench_procworkers.child runs them) under StatefulDataLoader."""
    import torch

    torch.set_num_threads(1)
    import bench_python as BP

    DL = _stateful_dataloader()
    ds = BP.DATASETS[cfg["dataset"]](cfg["batches"] * BP.BATCH_SIZE)
    r = C.H.time_loader(lambda: DL(ds, batch_size=BP.BATCH_SIZE, shuffle=True, num_workers=cfg["workers"]),
                        epochs=1, hold_batch=True)
    r.update(cfg)
    return r


# ----------------------------------------------------------------------------
# checkpoint and resume (bench_state.py's measurements, fastloader against torchdata)


class Indices:
    """A map-style dataset of its indices: no data is loaded, so a resume's cost is the loader's alone."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _loader_class(impl):
    if impl == "torchdata":
        return _stateful_dataloader()
    return C.import_fastloader("DataLoader", "DataLoader.state_dict").DataLoader


def _make(impl, cfg, state=None):
    import torch

    DL = _loader_class(impl)
    dl = DL(Indices(cfg["n"]), batch_size=cfg["batch_size"], shuffle=True, num_workers=cfg["workers"],
            generator=torch.Generator().manual_seed(0))
    if state is not None:
        dl.load_state_dict(copy.deepcopy(state))
    return dl


def state_dict_child(cfg):
    """DataLoader.state_dict() per call, mid-epoch with batches in flight: the median of cfg["calls"]
    calls (``call_s``), and the state's size pickled."""
    import torch

    torch.set_num_threads(1)
    dl = _make(cfg["impl"], cfg)
    it = iter(dl)
    for _ in range(5):
        next(it)
    times = []
    perf = time.perf_counter
    for _ in range(cfg["calls"]):
        t = perf()
        dl.state_dict()
        times.append(perf() - t)
    state = dl.state_dict()
    del it, dl
    return {"call_s": statistics.median(times), "state_bytes": len(pickle.dumps(state)), "calls": cfg["calls"]}


def resume_child(cfg):
    """What a resume late in an epoch costs before its first batch: the state taken after cfg["k"]
    batches; then, timed by harness.time_loader, building a loader + load_state_dict() + the first
    batch (``ttfb_s``), against the same for a fresh epoch (``fresh_s``); medians of cfg["reps"].
    ``resume_ok``: the resumed loader's first batch is the one the original gave next."""
    import torch

    torch.set_num_threads(1)
    impl = cfg["impl"]
    dl = _make(impl, cfg)
    it = iter(dl)
    for _ in range(cfg["k"]):
        next(it)
    state = copy.deepcopy(dl.state_dict())
    expected = next(it)
    del it, dl
    H = C.H
    fresh = [H.time_loader(lambda: _make(impl, cfg), max_batches=1)["ttfb_s"] for _ in range(cfg["reps"])]
    runs = [H.time_loader(lambda: _make(impl, cfg, state), max_batches=2) for _ in range(cfg["reps"])]
    runs.sort(key=lambda r: r["ttfb_s"])
    r = dict(runs[len(runs) // 2])
    r["fresh_s"] = statistics.median(fresh)
    it = iter(_make(impl, cfg, state))
    got = next(it)
    del it
    r["resume_ok"] = bool(torch.equal(torch.as_tensor(got), torch.as_tensor(expected)))
    r.update({k: cfg[k] for k in ("n", "batch_size", "k", "workers")})
    return r


def elastic_child(cfg):
    """A resume on another number of ranks (fastloader's elastic resume) against one on the same
    ranks, for an ImageNet-sized index space: cfg["world"] ranks of torch's DistributedSampler take
    cfg["k"] batches each (rank cfg["rank"]'s state, the ranks in lockstep), then rank cfg["rank"] of
    cfg["world_to"] builds its loader, loads the state and takes its first batch (``ttfb_s``, timed by
    harness.time_loader, median of cfg["reps"]); ``state_bytes`` is the state as JSON. ``resume_ok``:
    that batch is the one a brute-force deal of the samples no rank received gives (the epoch's
    permutation as DistributedSampler draws it, the received prefix cut off, dealt to the new ranks)."""
    import json

    import torch
    from torch.utils.data import DistributedSampler

    torch.set_num_threads(1)
    impl, n, bs, k = cfg["impl"], cfg["n"], cfg["batch_size"], cfg["k"]
    W0, W1, r = cfg["world"], cfg["world_to"] if impl.endswith("elastic") else cfg["world"], cfg["rank"]
    DL = _loader_class(impl.split("-")[0])
    ds = Indices(n)

    def make(world, state=None):
        s = DistributedSampler(ds, num_replicas=world, rank=r, shuffle=True, seed=0)
        dl = DL(ds, batch_size=bs, sampler=s, num_workers=cfg["workers"])
        if state is not None:
            dl.load_state_dict(copy.deepcopy(state))
        return dl

    dl = make(W0)
    it = iter(dl)
    for _ in range(k):
        next(it)
    state = copy.deepcopy(dl.state_dict())
    del it, dl
    runs = [C.H.time_loader(lambda: make(W1, state), max_batches=2) for _ in range(cfg["reps"])]
    runs.sort(key=lambda q: q["ttfb_s"])
    out = dict(runs[len(runs) // 2])
    it = iter(make(W1, state))
    got = torch.as_tensor(next(it)).tolist()
    del it
    perm = list(DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0))
    if W1 == W0:
        want = list(DistributedSampler(ds, num_replicas=W0, rank=r, shuffle=True, seed=0))[k * bs:(k + 1) * bs]
    else:
        rest = perm[k * bs * W0:]
        rest += perm[:-len(rest) % W1]            # DistributedSampler's padding: the epoch's head
        want = rest[r::W1][:bs]
    out["resume_ok"] = got == want
    out["state_bytes"] = len(json.dumps(state)) if impl.startswith("fastloader") else len(pickle.dumps(state))
    out.update({q: cfg[q] for q in ("n", "batch_size", "k", "workers", "world", "world_to", "rank")})
    return out


def _fake_imagenet_shards(d, n, per):
    """A shard set of n samples in shards of `per` (the last short) under d, for an index space of
    ImageNet's size without its bytes: two real tars (a full and the short one, sample k's label k,
    an 8x8 JPEG each), every shard name a symlink to one of them, and their counts in index.json.
    Returns the shard paths."""
    import io
    import json
    import tarfile

    from PIL import Image

    def tar(path, count):
        jpg = io.BytesIO()
        Image.new("RGB", (8, 8), (120, 30, 200)).save(jpg, format="JPEG")
        with tarfile.open(path, "w") as tf:
            for k in range(count):
                for ext, data in (("cls", str(k).encode()), ("jpg", jpg.getvalue())):
                    ti = tarfile.TarInfo(f"{k:06d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))

    os.makedirs(d, exist_ok=True)
    counts = [per] * (n // per) + ([n % per] if n % per else [])
    tar(os.path.join(d, "full.bin"), per)
    if n % per:
        tar(os.path.join(d, "short.bin"), n % per)
    names = [f"s-{i:05d}.tar" for i in range(len(counts))]
    for name, c in zip(names, counts):
        os.symlink("full.bin" if c == per else "short.bin", os.path.join(d, name))
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump({"shards": names, "counts": counts}, f)
    return [os.path.join(d, name) for name in names]


def stream_elastic_child(cfg):
    """elastic_child for tar shards (fastloader.WebDataset): cfg["world"] ranks take cfg["k"] batches
    each (the ranks in lockstep: rank cfg["rank"]'s state), then rank cfg["rank"] of cfg["world_to"]
    (elastic) or of cfg["world"] (same: its stream read again up to the state's position, the samples
    dropped undecoded) loads the state and takes its first batch (``ttfb_s``, median of cfg["reps"]).
    The index space is cfg["n"] samples in shards of cfg["per"] (_fake_imagenet_shards).
    ``resume_ok``: the batch's samples are the ones the plan deals this rank (fl_shards_order over the
    plan's keep masks), and the first 2,000 samples the rank reads were received by no old rank."""
    import json
    import shutil
    import tempfile

    import torch
    import torchvision.transforms as T

    torch.set_num_threads(1)
    fl = C.import_fastloader("DataLoader", "WebDataset")
    from fastloader import elastic as El

    impl, n, bs, k, r = cfg["impl"], cfg["n"], cfg["batch_size"], cfg["k"], cfg["rank"]
    W0, W1 = cfg["world"], cfg["world_to"] if impl.endswith("elastic") else cfg["world"]
    tf = T.Compose([T.RandomResizedCrop(8), T.ToTensor()])
    d = tempfile.mkdtemp(prefix="fl-elastic-wds-")
    try:
        shards = _fake_imagenet_shards(d, n, cfg["per"])

        def make(world, rank, state=None, batch_size=bs):
            ds = fl.WebDataset(shards, transform=tf, shuffle=1000, seed=0, rank=rank, world_size=world)
            dl = fl.DataLoader(ds, batch_size=batch_size, num_workers=cfg["workers"], seed=0)
            if state is not None:
                dl.load_state_dict(copy.deepcopy(state))
            return dl

        dl = make(W0, r)
        it = iter(dl)
        for _ in range(k):
            next(it)
        state = copy.deepcopy(dl.state_dict())
        del it, dl
        t0 = time.perf_counter()
        dl = make(W1, r)
        plan = El.stream_plan(dl.dataset, state, bs)
        plan_s = time.perf_counter() - t0
        runs = [C.H.time_loader(lambda: make(W1, r, state), max_batches=2) for _ in range(cfg["reps"])]
        runs.sort(key=lambda q: q["ttfb_s"])
        out = dict(runs[len(runs) // 2])
        it = iter(make(W1, r, state))
        got = torch.as_tensor(next(it)[1]).tolist()
        del it
        ok = True
        if plan is not None:
            ids, keep, nominal, _ = plan
            ds = dl.dataset
            counts = [ds._shard_counts()[g] for g in ids]
            _, want = El._C_order(counts, keep, ds.shuffle, ds.seed, 0, nominal, bs)
            ok = got == [int(v) for v in want]
            # what no old rank received: every old rank's stream, positions below k*bs, as (shard, sample)
            seen = set()
            for q in range(W0):
                dq = make(W0, q).dataset
                qids = [int(g) for g in dq._shard_perm(0)[q::W0]]
                sh, ks = El._C_order([dq._shard_counts()[g] for g in qids], [None] * len(qids), dq.shuffle,
                                     dq.seed, 0, len(dq), k * bs)
                seen.update((qids[a], int(b)) for a, b in zip(sh, ks))
            sh, ks = El._C_order(counts, keep, ds.shuffle, ds.seed, 0, nominal, 2000)
            ok = ok and not any((ids[a], int(b)) in seen for a, b in zip(sh, ks))
            out["share"] = int(nominal)
        out["resume_ok"] = bool(ok)
        out["plan_s"] = plan_s
        out["state_bytes"] = len(json.dumps(state))
        out.update({q: cfg[q] for q in ("n", "per", "batch_size", "k", "workers", "world", "world_to", "rank")})
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def stream_resume_child(cfg):
    """A shard stream (fastloader.WebDataset, train transform) resumed at its last batch -- every position
    before it read again and dropped undecoded -- against reading and decoding the whole epoch
    (bench_state.py's last measurement): ``total_s`` from building the loader to the end of the epoch."""
    import torch

    torch.set_num_threads(1)
    fl = C.import_fastloader("DataLoader", "WebDataset")
    tf = C.H.fastloader_transform("train")

    def wds():
        return fl.DataLoader(fl.WebDataset(cfg["shards"], transform=tf, shuffle=500), batch_size=cfg["batch_size"],
                             num_workers=cfg["workers"], seed=0)

    if cfg["variant"] == "epoch":
        return C.H.time_loader(wds, hold_batch=True)
    dl = wds()
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    del it
    state["num_yielded"] = len(dl) - 1  # the last batch: everything before it read again and dropped
    last = len(dl)

    def make():
        d = wds()
        d.load_state_dict(copy.deepcopy(state))
        return d

    r = C.H.time_loader(make, hold_batch=True)
    r["epoch_batches"] = last
    return r


# ----------------------------------------------------------------------------
# GPU delivery (bench_gpu.py's measurements, with torch's pinned-memory loader beside fastloader's)


def gpu_h2d_child(cfg):
    """Host-to-device copies of one 64x3x224x224 float32 batch, GPU-timed with CUDA events
    (bench_gpu.bandwidth): torch's pinned tensor.to(device, non_blocking=True) or fastloader's copier.
    ``copy_s``: seconds per copy."""
    import bench_gpu as BG

    nbytes = 64 * 3 * 224 * 224 * 4
    raw, ours, _ = BG.bandwidth(nbytes, reps=cfg["reps"])
    gpu_bps = raw[0] if cfg["impl"] == "torch" else ours[0]
    wall_bps = raw[1] if cfg["impl"] == "torch" else ours[1]
    return {"copy_s": nbytes / gpu_bps, "gbps_gpu": gpu_bps / 1e9, "gbps_wall": wall_bps / 1e9, "bytes": nbytes,
            "shape": "64x3x224x224", "dtype": "float32"}


class _OnDevice:
    """Iterates a loader and hands out each batch once it is on the device and ready: torch's batches
    copied with .to(device, non_blocking=True) from pinned memory; fastloader's (device=) as they come.
    The current stream is synchronised per batch, for both alike."""

    def __init__(self, dl, copy_to=None):
        self.dl = dl
        self.copy_to = copy_to

    def __len__(self):
        return len(self.dl)

    def __iter__(self):
        import torch

        for x, y in self.dl:
            if self.copy_to is not None:
                x = x.to(self.copy_to, non_blocking=True)
                y = y.to(self.copy_to, non_blocking=True)
            x.sum()  # a trivial consumer: the batch is used on the device
            torch.cuda.current_stream().synchronize()
            yield x, y


def gpu_delivery_child(cfg):
    """Images/s delivered to the device by the train pipeline (harness.time_loader over _OnDevice),
    a simulated asynchronous model step of cfg["step_ms"] per batch (harness: time.sleep, as from the
    CPU an asynchronous GPU step looks): torch (torchvision ImageFolder + DataLoader(pin_memory=True)),
    fastloader (DataLoader(device="cuda")), fastloader-uint8 (convert_on_device=True)."""
    import torch

    torch.set_num_threads(1)
    H = C.H
    impl, w = cfg["impl"], cfg["workers"]
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)  # the CUDA context outside the timed region
    if impl == "torch":
        import torchvision.datasets

        def make():
            ds = torchvision.datasets.ImageFolder(cfg["root"], transform=H.torch_transform("train"))
            return _OnDevice(torch.utils.data.DataLoader(ds, batch_size=cfg["batch_size"], shuffle=True,
                                                         num_workers=w, pin_memory=True), copy_to=dev)
    else:
        fl = C.import_fastloader("DataLoader", "ImageFolder")

        def make():
            ds = fl.ImageFolder(cfg["root"], transform=H.fastloader_transform("train"))
            return _OnDevice(fl.DataLoader(ds, batch_size=cfg["batch_size"], shuffle=True, num_workers=w,
                                           device="cuda", seed=0, convert_on_device=impl == "fastloader-uint8"))
    r = H.time_loader(make, max_batches=cfg.get("max_batches"), step_s=cfg["step_ms"] / 1000.0, hold_batch=True)
    r.update(cfg)
    return r
