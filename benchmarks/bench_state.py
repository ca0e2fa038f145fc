"""What checkpointing the loader costs (fastloader/state.py).

1. DataLoader.state_dict() per call, mid-epoch with batches in flight, for
   the kinds of loader whose state differs (median of --calls calls), and
   the size of the state as JSON.
2. What a resume costs before its first batch: load_state_dict() + iter()
   + the first batch, late in an ImageNet-sized epoch (1,281,167 indices,
   batch 256: the sampler draws its indices again, no data is loaded), and
   for a shard stream (the 2,000-image sample packed into shards, train
   transform) the positions read again and dropped undecoded, against
   reading and decoding them.

    python benchmarks/bench_state.py [--calls 20000]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fastloader  # noqa: E402


class Idx(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class _It:
    def __init__(self, w, nw):
        self.i, self.step = w, nw

    def __iter__(self):
        return self

    def __next__(self):
        v = self.i
        self.i += self.step
        return v

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


class Stream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        return _It(info.id, info.num_workers) if info else _It(0, 1)


def per_call(dl, calls, warm=5):
    it = iter(dl)
    for _ in range(warm):
        next(it)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        dl.state_dict()
        times.append(time.perf_counter() - t)
    state = dl.state_dict()
    del it
    return statistics.median(times) * 1e6, len(json.dumps(state))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000)
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp()
    from fastloader.tools.harness import fastloader_transform
    from fastloader.tools.pack import pack_shards
    from fastloader.tools.sample import ensure_sample

    # the ImageNet-like 2,000-image sample (about 50 KiB per JPEG), as tar shards
    pack_shards(ensure_sample(2000, progress=False), os.path.join(tmp, "wds"), shard_size=32 << 20, progress=False)
    shards = sorted(os.path.join(tmp, "wds", f) for f in os.listdir(os.path.join(tmp, "wds")) if f.endswith(".tar"))
    tf = fastloader_transform("train")
    cases = {
        "map-style, shuffle + generator, 2 workers": lambda: fastloader.DataLoader(
            Idx(10000), batch_size=32, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0)),
        "map-style, shuffle, torch's global RNG, 2 workers": lambda: fastloader.DataLoader(
            Idx(10000), batch_size=32, shuffle=True, num_workers=2),
        "map-style, sequential, 0 workers": lambda: fastloader.DataLoader(Idx(10000), batch_size=32),
        "WebDataset, 2 workers": lambda: fastloader.DataLoader(
            fastloader.WebDataset(shards, transform=tf, shuffle=500), batch_size=64, num_workers=2, seed=0),
        "iterable, Stateful iterators, 4 workers": lambda: fastloader.DataLoader(
            Stream(), batch_size=32, num_workers=4),
    }
    print("state_dict() per call (median), state size as JSON:")
    for name, make in cases.items():
        us, size = per_call(make(), a.calls)
        print(f"  {name:52s} {us:6.2f} us   {size:6d} bytes")

    # the bookkeeping every batch pays: the sampler's draw counted, the yield recorded
    from fastloader.state import Tracker, _Pulls

    class _It:
        _st_gen = 0

    class _Ep:
        snapshot = None

    tr, m = Tracker(), 200000
    t = time.perf_counter()
    for _ in iter(range(m)):
        pass
    plain = time.perf_counter() - t
    it, ep = _It(), _Ep()
    t = time.perf_counter()
    for seq in _Pulls(iter(range(m)), tr, None):
        tr.yielded(it, ep, seq)
    print(f"per batch bookkeeping (draw counted + yield recorded): {(time.perf_counter() - t - plain) / m * 1e6:.2f} us")

    # resume late in an ImageNet-sized epoch: the sampler's indices drawn again
    n, bs, k = 1281167, 256, 4900
    def make():
        return fastloader.DataLoader(Idx(n), batch_size=bs, shuffle=True, num_workers=2,
                                     generator=torch.Generator().manual_seed(0))
    def first_batch(state=None):
        dl = make()
        t = time.perf_counter()
        if state is not None:
            dl.load_state_dict(state)
        it = iter(dl)
        next(it)
        return time.perf_counter() - t, dl, it

    _, dl, it = first_batch()
    for _ in range(k - 1):
        next(it)
    state = dl.state_dict()
    del it, dl
    fresh = statistics.median(first_batch()[0] for _ in range(5))
    resumed = statistics.median(first_batch(state)[0] for _ in range(5))
    print(f"resume at batch {k} of {-(-n // bs)} ({n} indices, batch {bs}): first batch after {resumed * 1e3:.0f} ms "
          f"(a fresh epoch: {fresh * 1e3:.0f} ms; medians of 5)")

    # a shard stream: positions dropped undecoded vs decoded
    def wds(nw=2):
        return fastloader.DataLoader(fastloader.WebDataset(shards, transform=tf, shuffle=500), batch_size=64,
                                     num_workers=nw, seed=0)
    dl = wds()
    t = time.perf_counter()
    full = sum(len(y) for _, y in dl)
    decode = time.perf_counter() - t
    dl = wds()
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    del it
    state["num_yielded"] = len(dl) - 1   # the last batch: every position before it read again and dropped
    dl = wds()
    dl.load_state_dict(state)
    t = time.perf_counter()
    last = sum(len(y) for _, y in dl)
    skipped = time.perf_counter() - t
    print(f"WebDataset ({full} samples, {len(shards)} local shards, train transform, 2 workers): a whole epoch read and decoded in {decode * 1e3:.0f} ms; "
          f"resumed at its last batch ({full - last} positions read again, dropped undecoded) in "
          f"{skipped * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
