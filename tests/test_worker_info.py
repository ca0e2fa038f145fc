"""get_worker_info (torch's and fastloader's), worker_init_fn, per-index RNG."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, get_worker_info as torch_get_worker_info

import helpers_datasets as H


def _rows(loader):
    """Flatten dict batches of TorchWorkerInfoDataset / InitRecordDataset into per-item dicts."""
    rows = []
    for b in loader:
        n = len(b["i"])
        for j in range(n):
            rows.append({k: (v[j].tolist() if isinstance(v, torch.Tensor) else v[j]) for k, v in b.items()})
    return rows


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_torch_get_worker_info_inside_workers(DL, num_workers):
    ds = H.TorchWorkerInfoDataset(40)
    rows = _rows(DL(ds, batch_size=2, num_workers=num_workers))
    assert [r["i"] for r in rows] == list(range(40))
    seeds_by_id = {}
    for r in rows:
        assert r["has_info"], "get_worker_info() returned None inside a worker"
        assert 0 <= r["id"] < num_workers
        assert r["num_workers"] == num_workers
        assert isinstance(r["seed"], int)
        assert r["same_ds"], "worker_info.dataset is not the dataset being read"
        seeds_by_id.setdefault(r["id"], set()).add(r["seed"])
    # one seed per worker, distinct between workers
    assert all(len(s) == 1 for s in seeds_by_id.values()), seeds_by_id
    seeds = [next(iter(s)) for s in seeds_by_id.values()]
    assert len(set(seeds)) == len(seeds)


def test_get_worker_info_is_none_in_main_thread(DL):
    ds = H.TorchWorkerInfoDataset(6)
    rows = _rows(DL(ds, batch_size=3, num_workers=0))
    assert [r["has_info"] for r in rows] == [False] * 6
    assert torch_get_worker_info() is None
    # and still None in the main thread while workers are running
    dl = DL(ds, batch_size=3, num_workers=2)
    it = iter(dl)
    next(it)
    assert torch_get_worker_info() is None
    del it


@pytest.mark.fastloader_only
def test_fastloader_get_worker_info_none_in_main_thread(DL, fl):
    assert fl.get_worker_info() is None
    ds = H.RangeDataset(6)
    it = iter(DL(ds, batch_size=3, num_workers=2))
    next(it)
    assert fl.get_worker_info() is None
    del it

    seen = []

    class Probe(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            seen.append(fl.get_worker_info())
            return i

    list(DL(Probe(), batch_size=3, num_workers=0))
    assert seen == [None, None, None]


@pytest.mark.fastloader_only
@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_fastloader_get_worker_info_matches_torch(DL, fl, num_workers):
    records = []
    lock = threading.Lock()

    class Probe(Dataset):  # a local class: fine, nothing is pickled with threads
        def __len__(self):
            return 24

        def __getitem__(self, i):
            a = fl.get_worker_info()
            b = torch_get_worker_info()
            with lock:
                records.append((i, threading.get_ident(), a, b, self))
            return i

    ds = Probe()
    out = torch.cat(list(DL(ds, batch_size=3, num_workers=num_workers, worker_mode="thread"))).tolist()
    assert out == list(range(24))
    assert len(records) == 24
    main = threading.get_ident()
    ids_by_thread = {}
    for i, ident, a, b, me in records:
        assert ident != main
        assert a is not None and b is not None
        assert 0 <= a.id < num_workers and a.num_workers == num_workers
        assert isinstance(a.seed, int)
        # each worker thread loads from its own copy, as a worker process does
        assert a.dataset is me and type(me) is Probe and me is not ds
        assert (b.id, b.num_workers, b.seed) == (a.id, a.num_workers, a.seed)
        assert b.dataset is me
        ids_by_thread.setdefault(ident, set()).add(a.id)
    # each worker thread has one stable id, distinct from the other threads'
    assert all(len(v) == 1 for v in ids_by_thread.values())
    all_ids = [next(iter(v)) for v in ids_by_thread.values()]
    assert len(set(all_ids)) == len(all_ids)


@pytest.mark.parametrize("num_workers", [1, 2, 4])
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_init_fn_once_per_worker_in_its_thread(DL, num_workers, persistent):
    ds = H.InitRecordDataset(40)
    threads = {} if H.AGAINST_TORCH else {"worker_mode": "thread"}   # INIT_CALLS is this process's
    dl = DL(ds, batch_size=2, num_workers=num_workers, worker_init_fn=H.record_worker_init,
            persistent_workers=persistent, **threads)
    epochs = 3 if persistent else 1
    for _ in range(epochs):
        rows = _rows(dl)
        assert [r["i"] for r in rows] == list(range(40))
        ident_by_wid = {}
        for r in rows:
            # worker_init_fn ran exactly once in the thread (or process) that loads
            # this item, with that worker's id
            assert (r["ncalls"], r["first_call"]) == (1, r["wid"]), r
            assert ident_by_wid.setdefault(r["wid"], r["ident"]) == r["ident"]
        assert threading.get_native_id() not in ident_by_wid.values()
    if not H.AGAINST_TORCH:
        # all in one process: exactly one call per worker thread, ids 0..n-1
        assert len(H.INIT_CALLS) == num_workers, H.INIT_CALLS
        assert sorted(c for calls in H.INIT_CALLS.values() for c in calls) == list(range(num_workers))
        assert all(len(calls) == 1 for calls in H.INIT_CALLS.values())
        assert threading.get_native_id() not in H.INIT_CALLS
    del dl


# ---------------------------------------------------------------------------
# Reproducible per-index randomness: get_worker_info().sample_rng(index)
# ---------------------------------------------------------------------------

class RngDataset(Dataset):
    def __init__(self, fl, n=20):
        self.fl = fl
        self.n = n
        self.kinds = set()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = self.fl.get_worker_info().sample_rng(i)
        self.kinds.add(type(rng))
        return rng.random(3)


def _rng_epochs(DL, fl, num_workers, seed, epochs=2, **kw):
    ds = RngDataset(fl)
    dl = DL(ds, batch_size=4, num_workers=num_workers, generator=torch.Generator().manual_seed(seed),
            worker_mode="thread", **kw)
    out = [torch.cat(list(dl)) for _ in range(epochs)]
    assert ds.kinds == {np.random.Generator}
    return out


@pytest.mark.fastloader_only
@pytest.mark.parametrize("seed", [0, 99])
def test_rng_same_for_any_num_workers(DL, fl, seed):
    base = _rng_epochs(DL, fl, 1, seed)
    for nw in (2, 4):
        other = _rng_epochs(DL, fl, nw, seed)
        for e in range(2):
            assert torch.equal(base[e], other[e]), f"num_workers={nw} epoch {e} differs"
    e0, e1 = base
    assert e0.shape == (20, 3) and e0.dtype == torch.float64
    assert not torch.equal(e0, e1), "rng values repeat across epochs"
    assert len({tuple(r) for r in e0.tolist()}) == 20, "rng values repeat across indices"


@pytest.mark.fastloader_only
def test_rng_differs_across_seeds(DL, fl):
    a = _rng_epochs(DL, fl, 2, 1, epochs=1)[0]
    b = _rng_epochs(DL, fl, 2, 2, epochs=1)[0]
    assert not torch.equal(a, b)


@pytest.mark.fastloader_only
def test_rng_keyed_by_index_not_position(DL, fl):
    # keyed by index, not by position or worker: reordering only permutes rows
    plain = _rng_epochs(DL, fl, 2, 5, epochs=1)[0]
    ds = RngDataset(fl)
    dl = DL(ds, batch_size=4, num_workers=2, sampler=H.ReversedSampler(20),
            generator=torch.Generator().manual_seed(5), worker_mode="thread")
    rev = torch.cat(list(dl))
    assert torch.equal(rev, plain.flip(0))
