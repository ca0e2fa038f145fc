"""Checkpoint and resume: DataLoader.state_dict() / load_state_dict()
(fastloader/state.py).

References: the same loader run without interruption (whose order is torch's
DataLoader's for the same generator), torchdata's StatefulDataLoader for
what a resume point means, and for the native datasets the uninterrupted
run's tensors, bit for bit, whatever num_workers either side used.
"""
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import (BatchSampler, Dataset, IterableDataset, RandomSampler,  # noqa: E402
                              SubsetRandomSampler, get_worker_info)

import fastloader  # noqa: E402
from helpers_compare import assert_same_epochs, collect_epochs, take_batches  # noqa: E402
from helpers_distributed import child_env, torchrun  # noqa: E402
from helpers_pipelines import train_tf  # noqa: E402

pytestmark = pytest.mark.fastloader_only

N = 23   # samples of the index datasets: batches of 4 end with a partial one


class Idx(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


def _roundtrip(state, how):
    if how == "json":
        return json.loads(json.dumps(state))
    b = io.BytesIO()
    torch.save(state, b)
    b.seek(0)
    return torch.load(b, weights_only=True)


def _tolist(batch):
    if isinstance(batch, (list, tuple)):
        return [_tolist(b) for b in batch]
    return batch.tolist()


def _epochs(dl, n):  # as lists: the index datasets' runs compare with ==
    return collect_epochs(dl, n, _tolist)


def _interrupt(dl, epochs_before, k):
    """Run `epochs_before` whole epochs and k batches of the next (k past its
    end: its StopIteration too); returns (those k batches, state, torch RNG)."""
    for _ in range(epochs_before):
        for _ in dl:
            pass
    it = iter(dl)  # alive while the state is read: batches still in flight
    got = take_batches(it, k, _tolist)
    return got, dl.state_dict(), torch.get_rng_state()


def _check_resume(make, nw, nw_after, epochs=3, points=None, how="json"):
    """For every resume point: the batches before it, then a new loader
    (num_workers=nw_after) given the state, equal the uninterrupted run."""
    torch.manual_seed(11)
    ref = _epochs(make(nw), epochs)
    L = len(ref[0])
    points = points or [(e, k) for e in range(2) for k in (0, 1, L // 2, L - 1, L, L + 1)]
    for e, k in points:
        torch.manual_seed(11)
        got, state, rng = _interrupt(make(nw), e, k)
        state = _roundtrip(state, how)
        torch.manual_seed(12345)            # another process...
        dl = make(nw_after)
        dl.load_state_dict(state)
        torch.set_rng_state(rng)            # ...that restores the training loop's RNG, as a checkpoint does
        if k > L:   # saved after the epoch's StopIteration: the next iteration is the next epoch
            out = ref[:e] + [got] + _epochs(dl, epochs - e - 1)
        else:
            rest = _epochs(dl, epochs - e)
            out = ref[:e] + [got + rest[0]] + rest[1:]
        assert out == ref, f"resumed at epoch {e} batch {k} (num_workers {nw} -> {nw_after})"
    return ref


SAMPLERS = {
    "shuffle+generator": lambda: dict(shuffle=True, generator=torch.Generator().manual_seed(5)),
    "shuffle, torch's global RNG": lambda: dict(shuffle=True),
    "sequential": lambda: dict(shuffle=False),
    "replacement": lambda: dict(sampler=RandomSampler(Idx(), replacement=True, num_samples=41,
                                                      generator=torch.Generator().manual_seed(6))),
    "subset, global RNG": lambda: dict(sampler=SubsetRandomSampler(list(range(3, N)))),
}


@pytest.mark.parametrize("kind", list(SAMPLERS))
@pytest.mark.parametrize("nw", [0, 2])
def test_map_style_resume_points(kind, nw):
    """Resumed at the first batch, the middle, the last, after the epoch's
    StopIteration and in the next epoch, with the other num_workers: the
    run goes on as if never stopped, for the following epochs too."""
    def make(n):
        return fastloader.DataLoader(Idx(), batch_size=4, num_workers=n, **SAMPLERS[kind]())

    ref = _check_resume(make, nw, 2 - nw, how="json" if nw else "torch")
    if kind == "shuffle+generator":   # and that order is torch's own DataLoader's
        tdl = torch.utils.data.DataLoader(Idx(), batch_size=4, **SAMPLERS[kind]())
        assert _epochs(tdl, 3) == ref


def test_batch_sampler_and_persistent_workers():
    def make(n):
        bs = BatchSampler(RandomSampler(Idx(), generator=torch.Generator().manual_seed(8)), 5, drop_last=True)
        return fastloader.DataLoader(Idx(), batch_sampler=bs, num_workers=n, persistent_workers=n > 0,
                                     generator=torch.Generator().manual_seed(9))

    _check_resume(make, 2, 3, points=[(0, 2), (1, 0), (0, 5), (1, 4)])


def test_distributed_sampler_epoch_comes_back():
    """DistributedSampler: the saved epoch's set_epoch value comes back with
    the state (the resumed script need not call set_epoch before it)."""
    from torch.utils.data import DistributedSampler

    def make(n, rank=1):
        return fastloader.DataLoader(Idx(), batch_size=3, num_workers=n, sampler=DistributedSampler(
            Idx(), num_replicas=2, rank=rank, shuffle=True, seed=4))

    dl = make(2)
    dl.sampler.set_epoch(0)
    _epochs(dl, 1)
    dl.sampler.set_epoch(1)
    ref = _epochs(dl, 1)[0]
    it = iter(dl)
    got = [next(it).tolist() for _ in range(2)]
    state = _roundtrip(dl.state_dict(), "json")
    del it
    dl2 = make(0)
    dl2.load_state_dict(state)
    assert got + _epochs(dl2, 1)[0] == ref


def test_side_by_side_with_torchdata():
    """Where torchdata's StatefulDataLoader resumes exactly, it and
    fastloader resume to the same batches: a resume point means the same in
    both.  (Its StatefulDistributedSampler, saved before an epoch's first
    batch or after its StopIteration, restarts with an empty epoch; an
    uninterrupted run, and fastloader, give the whole epoch.)"""
    td = pytest.importorskip("torchdata.stateful_dataloader")
    from torchdata.stateful_dataloader.sampler import BatchSampler as TDBatch
    from torchdata.stateful_dataloader.sampler import RandomSampler as TDRandom
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    kinds = {
        "sequential": lambda: dict(batch_size=3),
        "torchdata's stateful batch sampler": lambda: dict(
            batch_sampler=TDBatch(TDRandom(Idx(), generator=torch.Generator().manual_seed(4)), 3, False)),
        "StatefulDistributedSampler": lambda: dict(
            batch_size=3, sampler=StatefulDistributedSampler(Idx(), num_replicas=2, rank=1, shuffle=True, seed=1)),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torchdata's set_vital deprecation
        for name, kw in kinds.items():
            refs = {cls: _epochs(cls(Idx(), **kw()), 3) for cls in (fastloader.DataLoader, td.StatefulDataLoader)}
            L = len(refs[fastloader.DataLoader][0])
            agreed = 0
            for e in range(2):
                for k in (0, 1, L // 2, L, L + 1):
                    outs = {}
                    for cls in refs:
                        got, state, _ = _interrupt(cls(Idx(), **kw()), e, k)
                        dl = cls(Idx(), **kw())
                        dl.load_state_dict(state)
                        if k > L:
                            outs[cls] = refs[cls][:e] + [got] + _epochs(dl, 2 - e)
                        else:
                            rest = _epochs(dl, 3 - e)
                            outs[cls] = refs[cls][:e] + [got + rest[0]] + rest[1:]
                    assert outs[fastloader.DataLoader] == refs[fastloader.DataLoader], (name, e, k)
                    if outs[td.StatefulDataLoader] == refs[td.StatefulDataLoader]:
                        assert outs[fastloader.DataLoader] == outs[td.StatefulDataLoader], (name, e, k)
                        agreed += 1
            assert agreed >= 6, name


# -- native datasets: bit for bit ---------------------------------------------------------

@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("imgs")
    paths = []
    for i in range(22):
        rng = np.random.default_rng(i)
        p = d / f"{i:03d}.jpg"
        Image.fromarray(rng.integers(0, 255, (14 + i % 5, 18, 3)).astype(np.uint8)).save(p, quality=85)
        paths.append(str(p))
    (d / "003.jpg").write_bytes(b"not a JPEG")   # on_error: the same substitute after a resume
    return paths


TRAIN = train_tf(8, norm=None)


@pytest.mark.parametrize("on_error", ["replace", "skip"])
def test_native_bit_identical_any_num_workers(images, on_error):
    """ImageList with random crops and flips, interrupted at batch k with 0,
    1, 2 or 4 workers (batches prefetched but not received are not
    consumed) and resumed with another num_workers: bit-identical to the
    uninterrupted run, the same substitutes for the bad file included."""
    ds = fastloader.ImageList(images, labels=list(range(len(images))), transform=TRAIN, on_error=on_error)

    def make(n):
        return fastloader.DataLoader(ds, batch_size=4, shuffle=True, num_workers=n,
                                     generator=torch.Generator().manual_seed(3))

    ref = collect_epochs(make(0), 2)
    for nw, nw_after, e, k in [(0, 2, 0, 2), (1, 4, 0, 5), (2, 0, 1, 1), (4, 1, 0, 3), (2, 2, 0, 4)]:
        dl = make(nw)
        for _ in range(e):
            for _ in dl:
                pass
        it = iter(dl)
        got = take_batches(it, k)
        if nw:
            assert it._send > k   # more batches were in flight than the loop received
        state = _roundtrip(dl.state_dict(), "torch")
        assert state["num_yielded"] == k
        del it
        dl2 = make(nw_after)
        dl2.load_state_dict(state)
        rest = collect_epochs(dl2, 2 - e)
        assert_same_epochs(ref[:e] + [got + rest[0]] + rest[1:], ref, where=(nw, nw_after, e, k))


@pytest.mark.parametrize("kind", ["lmdb", "array"])
def test_other_native_sources(images, tmp_path, kind):
    """LMDBDataset and ArrayDataset with a transform (image rows through the
    native pipeline) resume bit for bit too, across a change of num_workers."""
    if kind == "lmdb":
        import shutil

        from fastloader.tools.pack_lmdb import pack_lmdb

        root = tmp_path / "folder"
        for i, p in enumerate(images):
            if not p.endswith("003.jpg"):
                (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
                shutil.copy(p, root / f"c{i % 2}" / os.path.basename(p))
        pack_lmdb(str(root), str(tmp_path / "d.lmdb"))
        ds = fastloader.LMDBDataset(str(tmp_path / "d.lmdb"), transform=TRAIN)
    else:
        rng = np.random.default_rng(0)
        ds = fastloader.ArrayDataset(rng.integers(0, 255, (21, 12, 10, 3), dtype=np.uint8),
                                     np.arange(21), transform=TRAIN)

    def make(n):
        return fastloader.DataLoader(ds, batch_size=4, shuffle=True, num_workers=n, seed=3,
                                     generator=torch.Generator().manual_seed(3))

    ref = collect_epochs(make(2), 2)
    dl = make(2)
    it = iter(dl)
    got = take_batches(it, 3)
    state = _roundtrip(dl.state_dict(), "json")
    del it
    dl2 = make(0)
    dl2.load_state_dict(state)
    rest = collect_epochs(dl2, 2)
    assert_same_epochs([got + rest[0]] + rest[1:], ref)


def test_native_persistent_auto_and_seed(images):
    ds = fastloader.ImageList(images, labels=list(range(len(images))), transform=TRAIN, on_error="replace")

    def make(n):
        return fastloader.DataLoader(ds, batch_size=3, shuffle=True, num_workers=n, persistent_workers=True,
                                     seed=42, generator=torch.Generator().manual_seed(1))

    ref = collect_epochs(make(2), 3)
    for e, k in [(0, 4), (1, 0), (1, 8)]:   # (1, 8): after epoch 1's StopIteration
        dl = make(2)
        for _ in range(e):
            for _ in dl:
                pass
        it = iter(dl)
        got = take_batches(it, k)
        state = _roundtrip(dl.state_dict(), "json")
        dl2 = make("auto")
        dl2.load_state_dict(state)
        rest = collect_epochs(dl2, 3 - e)
        assert_same_epochs(ref[:e] + [got + rest[0]] + rest[1:], ref, where=(e, k))
    other = fastloader.DataLoader(ds, batch_size=3, seed=7)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="seed=42"):
        iter(other)


def test_webdataset_resume_skips_without_decoding(tmp_path):
    """A shard stream resumed at batch k: the reader reads the first k*B
    positions again but drops them (the stream's sample counter shows only
    the rest was produced), and the batches equal the uninterrupted run's,
    whatever num_workers either side used; the next epoch too."""
    from test_webdataset import write_shards

    shards = write_shards(str(tmp_path), n=50, per=10)

    def make(n):
        ds = fastloader.WebDataset(shards, transform=TRAIN, shuffle=9, seed=2)
        return fastloader.DataLoader(ds, batch_size=6, num_workers=n, seed=4)

    ref = collect_epochs(make(0), 2)
    assert len(ref[0]) == 9
    for nw, nw_after, k in [(0, 2, 3), (2, 0, 8), (2, 1, 9), (1, 3, 10)]:   # 9: all received, 10: finished
        dl = make(nw)
        it = iter(dl)
        got = take_batches(it, k)
        state = _roundtrip(dl.state_dict(), "json")
        del it
        dl2 = make(nw_after)
        dl2.load_state_dict(state)
        first = collect_epochs(dl2, 1)
        if k < 9:
            assert dl2.stats()["stream"]["samples"] == 50 - 6 * k
        rest = first + collect_epochs(dl2, 1)
        out = [got + rest[0]] + rest[1:] if k <= 9 else [got] + rest[:1]
        assert_same_epochs(out, ref, where=(nw, nw_after, k))

    # fields= (other members, collected by stream position) stay with their samples
    from test_webdataset import _add

    shards = write_shards(str(tmp_path / "f"), n=30, per=10,
                          extra=lambda tf, i: _add(tf, f"{i:06d}.txt", str(i).encode()))

    def labels_and_fields(dl):
        return [(y.tolist(), [int(t) for t in f["txt"]]) for _, y, f in dl]

    def make_f(n):
        return fastloader.DataLoader(fastloader.WebDataset(shards, transform=TRAIN, shuffle=7, fields=("txt",)),
                                     batch_size=4, num_workers=n)

    ref = labels_and_fields(make_f(0))
    dl = make_f(2)
    it = iter(dl)
    got = [(y.tolist(), [int(t) for t in f["txt"]]) for _, (_, y, f) in zip(range(3), it)]
    state = dl.state_dict()
    del it
    dl2 = make_f(0)
    dl2.load_state_dict(state)
    out = got + labels_and_fields(dl2)
    assert out == ref and all(a == b for a, b in out)


# -- Python datasets: iterable (per worker) and Stateful ----------------------------------

class _Counter:
    def __init__(self, lo, hi, step):
        self.i, self.hi, self.step = lo, hi, step

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.hi:
            raise StopIteration
        v = self.i
        self.i += self.step
        return v


class _StatefulCounter(_Counter):
    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


class Stream(IterableDataset):
    """Worker w yields w, w+nw, ... below 40 - 7w (workers end at different times)."""

    def __init__(self, stateful):
        self.stateful = stateful

    def __iter__(self):
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info else (0, 1)
        return (_StatefulCounter if self.stateful else _Counter)(w, 40 - 7 * w, nw)


@pytest.mark.parametrize("stateful", [True, False])
@pytest.mark.parametrize("nw,mode", [(0, "thread"), (3, "thread"), (3, "process")])
def test_iterable_per_worker(stateful, nw, mode):
    """Each worker's iterator is put back where the loop's last batch from it
    left it (its state_dict, or, without one, its delivered samples drawn
    again with a warning), and the workers take turns as before; at every
    point, including after a worker ran dry.  In worker processes the
    iterators live in the workers: their states travel back with the
    batches, and the saved ones go to the new workers."""
    def make(n):
        return fastloader.DataLoader(Stream(stateful), batch_size=3, num_workers=n, worker_mode=mode)

    ref = _epochs(make(nw), 2)
    for k in range(len(ref[0]) + 2):
        got, state, _ = _interrupt(make(nw), 0, k)
        dl = make(nw)
        dl.load_state_dict(_roundtrip(state, "json"))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            rest = _epochs(dl, 2 if k <= len(ref[0]) else 1)
        out = [got + rest[0]] + rest[1:] if k <= len(ref[0]) else [got] + rest
        assert out == ref, k
        drawn_again = any("draws the samples" in str(x.message) for x in w)
        assert drawn_again == (not stateful and 0 < k <= len(ref[0]))
    if nw:
        with pytest.raises(ValueError, match="num_workers=3"):
            dl = make(2)
            dl.load_state_dict(_interrupt(make(3), 0, 2)[1])
            iter(dl)


class Curriculum(Dataset):
    """A Stateful map-style dataset: sample i is (i, how many samples were read before)."""

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return N

    def __getitem__(self, i):
        self.reads += 1
        return torch.tensor([i, self.reads])

    def state_dict(self):
        return {"reads": self.reads}

    def load_state_dict(self, s):
        self.reads = s["reads"]


@pytest.mark.parametrize("nw", [0, 1])
def test_stateful_map_dataset(nw):
    """The dataset's own state comes back as it was after the last batch
    received (not after the batches prefetched since)."""
    def make(n):
        return fastloader.DataLoader(Curriculum(), batch_size=4, num_workers=n, shuffle=True,
                                     generator=torch.Generator().manual_seed(2))

    _check_resume(make, nw, nw, epochs=2, points=[(0, 0), (0, 2), (0, 6), (1, 3)])


@pytest.mark.parametrize("persistent", [False, True])
def test_stateful_map_dataset_in_worker_processes(persistent):
    """worker_mode="process": each worker process reads its own copy of the
    dataset, so each copy's state is saved ("dataset_workers") and given
    back to the same worker on resume, while the loader's own copy stays as
    it was: later epochs' fresh workers start from it, as in the run that
    never stopped (persistent workers keep theirs)."""
    def make(n):
        return fastloader.DataLoader(Curriculum(), batch_size=2, num_workers=n, shuffle=True,
                                     generator=torch.Generator().manual_seed(2), worker_mode="process",
                                     persistent_workers=persistent)

    ref = _check_resume(make, 2, 2, epochs=3, points=[(0, 0), (0, 3), (0, 11), (0, 12), (1, 5)])
    # the per-worker counts are in the batches: worker 0 read 1, 2, ... and so did worker 1
    assert [b[0][1] for b in ref[0][:4]] == [1, 1, 3, 3], ref[0][:4]
    _, state, _ = _interrupt(make(2), 0, 5)
    assert [w for w, _ in state["dataset_workers"]] == [0, 1]
    assert state["dataset_workers"] == [[0, {"reads": 6}], [1, {"reads": 4}]]


class _BadState(Curriculum):
    def state_dict(self):
        raise KeyError("no state today")


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_dataset_state_dict_that_raises_is_raised_by_state_dict(mode):
    """A map-style dataset's state_dict() that raises in the worker is not
    lost: the loader's state_dict() raises it (it used to be dropped)."""
    dl = fastloader.DataLoader(_BadState(), batch_size=2, num_workers=1, worker_mode=mode)
    it = iter(dl)
    next(it)
    with pytest.raises(KeyError, match="no state today"):
        dl.state_dict()
    del it


# -- the state itself ----------------------------------------------------------------------

def _plain(x):
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    if isinstance(x, list):
        return all(_plain(v) for v in x)
    return x is None or isinstance(x, (bool, int, float, str))


def test_state_is_small_plain_and_safe_from_another_thread():
    dl = fastloader.DataLoader(Idx(), batch_size=2, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(0))
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(dl.state_dict()["num_yielded"])

    t = threading.Thread(target=watch)
    t.start()
    try:
        got = 0
        for _ in dl:
            got += 1
            assert dl.state_dict()["num_yielded"] == got
    finally:
        stop.set()
        t.join()
    assert seen == sorted(seen) and 0 <= seen[0] and seen[-1] <= got
    state = dl.state_dict()
    assert state["finished"] and _plain(state) and len(json.dumps(state)) < 16_000
    # refused: what cannot mean the same position
    # (another batch_size is fine for a finished epoch, or for any place in
    # a sampler's order: tests/test_elastic.py; a missing generator is not)
    dl2 = fastloader.DataLoader(Idx(), batch_size=3)
    dl2.load_state_dict(state)
    with pytest.raises(ValueError, match="loader generator is None"):
        iter(dl2)
    with pytest.raises(ValueError, match="in_order"):
        fastloader.DataLoader(Idx(), batch_size=2, num_workers=1, in_order=False).state_dict()
    with pytest.raises(ValueError, match="format"):
        dl2.load_state_dict({"num_yielded": 3})
    dl2.load_state_dict({})   # as torchdata: nothing to load


# -- processes: torchrun with 2 ranks, and SIGKILL ------------------------------------------

def _env():
    return child_env(os.path.dirname(__file__))


RANKS = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    import fastloader
    from fastloader import transforms as T
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    paths, shards, out = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3]
    tf = T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor()])
    def loaders():
        ds = fastloader.ImageList(paths, labels=list(range(len(paths))), transform=tf)
        sampler = torch.utils.data.DistributedSampler(ds, shuffle=True, seed=3)
        wds = fastloader.WebDataset(shards, transform=tf, shuffle=5, seed=1)
        return (sampler, fastloader.DataLoader(ds, batch_size=3, sampler=sampler, num_workers=2, seed=7),
                None, fastloader.DataLoader(wds, batch_size=3, num_workers=2, seed=7))
    def epoch(sampler, dl, e):
        if sampler is not None:
            sampler.set_epoch(e)
        return [(x.clone(), y.clone()) for x, y in dl]
    labels = {}
    for kind in (0, 1):
        s, dl = loaders()[2 * kind: 2 * kind + 2]
        ref = [epoch(s, dl, e) for e in range(2)]
        s, dl = loaders()[2 * kind: 2 * kind + 2]
        if s is not None:
            s.set_epoch(0)
        it = iter(dl)
        got = [tuple(t.clone() for t in next(it)) for _ in range(2)]
        torch.save(dl.state_dict(), os.path.join(out, f"state{rank}_{kind}.pt"))   # each rank its own
        del it, dl
        s, dl = loaders()[2 * kind: 2 * kind + 2]
        dl.load_state_dict(torch.load(os.path.join(out, f"state{rank}_{kind}.pt")))
        res = [got + epoch(s, dl, 0), epoch(s, dl, 1)]
        assert len(res[0]) == len(ref[0]) and all(
            torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for r, q in zip(res, ref) for a, b in zip(r, q)), kind
        labels[kind] = [torch.cat([y for _, y in r]).tolist() for r in res]
    torch.save(labels, os.path.join(out, f"labels{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
""")


def test_torchrun_two_ranks(images, tmp_path):
    """Each rank saves and restores its own state (DistributedSampler with
    set_epoch over an ImageList, and a WebDataset dealt out by rank): each
    resumed rank equals its uninterrupted run bit for bit, and the ranks'
    union is still disjoint and covering, epoch after epoch."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from test_webdataset import write_shards

    good = [p for p in images if not p.endswith("003.jpg")][:20]
    shards = write_shards(str(tmp_path / "wds"), n=24, per=6)
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    torchrun(script, ",".join(good), ",".join(shards), tmp_path, timeout=300, path=[os.path.dirname(__file__)])
    labels = [torch.load(tmp_path / f"labels{r}.pt") for r in range(2)]
    for kind, n in ((0, 20), (1, 24)):
        for e in range(2):
            a, b = labels[0][kind][e], labels[1][kind][e]
            assert not set(a) & set(b) and sorted(a + b) == list(range(n)), (kind, e)


KILLED = textwrap.dedent("""
    import os, sys, torch
    import fastloader
    from fastloader import transforms as T
    paths, out, mode = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    tf = T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor()])
    def make():
        ds = fastloader.ImageList(paths, labels=list(range(len(paths))), transform=tf, on_error="replace")
        return fastloader.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2,
                                     generator=torch.Generator().manual_seed(5))
    def record(x, y):
        return (x.clone(), y.clone())
    if mode == "train":   # save the loader's state beside each step, until killed
        dl = make()
        for e in range(2):
            for step, (x, y) in enumerate(dl):
                torch.save({"loader": dl.state_dict(), "seen": record(x, y)}, out + ".tmp")
                os.replace(out + ".tmp", out)
                if e == 0 and step == 3:
                    print("saved", flush=True)
                    sys.stdin.read()   # the parent kills us here, batches in flight
    else:                  # restart from the last checkpoint; also the uninterrupted reference
        ckpt = torch.load(out)
        dl = make()
        dl.load_state_dict(ckpt["loader"])
        resumed = [record(x, y) for x, y in dl] + [record(x, y) for x, y in dl]
        ref = make()
        ref = [record(x, y) for x, y in ref] + [record(x, y) for x, y in ref]
        torch.save({"resumed": resumed, "ref": ref, "last": ckpt["seen"]}, out + ".result")
""")


def test_sigkill_mid_epoch_then_restart(images, tmp_path):
    """A training process killed with SIGKILL mid-epoch (workers busy,
    batches prefetched), restarted from its last saved state, continues
    exactly: the restarted run's batches are the uninterrupted run's from
    the batch after the last one saved."""
    script = tmp_path / "train.py"
    script.write_text(KILLED)
    ckpt = str(tmp_path / "ckpt.pt")
    paths = ",".join(images)
    child = subprocess.Popen([sys.executable, str(script), paths, ckpt, "train"], env=_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "saved"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    proc = subprocess.run([sys.executable, str(script), paths, ckpt, "resume"], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = torch.load(ckpt + ".result")
    ref, resumed, last = r["ref"], r["resumed"], r["last"]
    assert torch.equal(ref[3][0], last[0]) and torch.equal(ref[3][1], last[1])   # the state is after batch 3
    assert_same_epochs([resumed], [ref[4:]])
