"""torch's DataLoader semantics that its own test suite (test/test_dataloader.py)
checks, asserted here in fastloader's terms: which worker takes which batch
with in_order=False, for map-style and iterable datasets, in worker threads
and processes, with torch's loader run alongside as the reference; and the
thread-mode differences docs/migrating.md lists (the shared generator's
seed, nothing pickled), and where the worker pids are instead of torch's
private iterator._workers.

The datasets hold a sample back until the training loop has received
another one (a fork-context Event the loop sets), so the order asserted
is fixed by the hand-off, not by sleeps."""
from __future__ import annotations

import multiprocessing

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import helpers_datasets as H

_FORK = multiprocessing.get_context("fork")
KINDS = ["torch", "thread", "process"]


def _loader(kind, ds, **kw):
    if kind == "torch":
        return torch.utils.data.DataLoader(ds, multiprocessing_context=_FORK, **kw)
    if H.AGAINST_TORCH:
        pytest.skip("fastloader's worker modes (FL_TEST_AGAINST_TORCH=1)")
    import fastloader

    if kind == "process":
        kw["multiprocessing_context"] = _FORK
    return fastloader.DataLoader(ds, worker_mode=kind, **kw)


class HeldFirst(Dataset):
    """Sample 0 waits until the loop has received sample `until`."""

    def __init__(self, n=10, until=9):
        self.n, self.until = n, until
        self.go = _FORK.Event()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 0:
            assert self.go.wait(10), "sample 0 was never released"
        return torch.tensor([i, get_worker_info().id])


def _drain(dl, release_at, event):
    got = []
    for b in dl:
        i, w = b.reshape(-1).tolist()
        got.append((i, w))
        if i == release_at:
            event.set()
    return got


@pytest.mark.parametrize("kind", KINDS)
def test_out_of_order_a_stuck_worker_keeps_only_its_share_of_the_window(kind):
    """in_order=False: batch 0 stalls worker 0, which keeps batch 2 (its
    prefetch_factor=2 share); worker 1 takes every other batch as it frees
    up, and the loop gets them meanwhile."""
    ds = HeldFirst()
    dl = _loader(kind, ds, batch_size=None, num_workers=2, prefetch_factor=2, in_order=False)
    got = _drain(dl, 9, ds.go)
    assert got == [(1, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1), (0, 0), (2, 0)]


@pytest.mark.parametrize("kind", KINDS)
def test_out_of_order_share_follows_prefetch_factor(kind):
    """With prefetch_factor=3 the stuck worker holds three batches (0, 2, 4)."""
    ds = HeldFirst(n=12, until=11)
    dl = _loader(kind, ds, batch_size=None, num_workers=2, prefetch_factor=3, in_order=False)
    got = _drain(dl, 11, ds.go)
    assert [i for i, w in got if w == 0] == [0, 2, 4]
    assert [i for i, w in got[:9]] == [1, 3, 5, 6, 7, 8, 9, 10, 11]


class TwoHalves(IterableDataset):
    """Worker 0 yields 0..4, worker 1 yields 5..9; worker 1's first sample
    waits until the loop has received 4."""

    def __init__(self):
        self.go = _FORK.Event()

    def __iter__(self):
        wid = get_worker_info().id
        if wid == 1:
            assert self.go.wait(10), "worker 1 was never released"
        for i in range(5 * wid, 5 * wid + 5):
            yield torch.tensor([i, wid])


@pytest.mark.parametrize("kind", KINDS)
def test_out_of_order_iterable_a_stuck_worker_does_not_hold_the_others(kind):
    """in_order=False with an IterableDataset: worker 1 is stuck, so its
    jobs stop at its share and worker 0 yields all of its samples first."""
    ds = TwoHalves()
    dl = _loader(kind, ds, batch_size=None, num_workers=2, in_order=False)
    got = _drain(dl, 4, ds.go)
    assert got == [(i, 0) for i in range(5)] + [(i, 1) for i in range(5, 10)]


@pytest.mark.parametrize("kind", KINDS)
def test_in_order_iterable_alternates_workers(kind):
    """in_order=True: the workers take turns, whatever their speed."""
    ds = TwoHalves()
    ds.go.set()
    got = [tuple(b.reshape(-1).tolist()) for b in _loader(kind, ds, batch_size=None, num_workers=2)]
    assert got == [(i // 2 + 5 * (i % 2), i % 2) for i in range(10)]


class Seeds(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = get_worker_info()
        return info.id, info.seed, torch.initial_seed()   # plain ints: a process's seed may not fit int64


def _samples(batch):
    return batch


@pytest.mark.parametrize("kind", KINDS)
def test_worker_seed_and_torchs_initial_seed(kind):
    """Worker processes seed torch per worker, so torch.initial_seed() is
    get_worker_info().seed there; worker threads share the process's
    generator (docs/migrating.md), so it is the process's seed in each."""
    gen = torch.Generator().manual_seed(7)
    rows = [r for b in _loader(kind, Seeds(), batch_size=1, num_workers=2, generator=gen, collate_fn=_samples)
            for r in b]
    seeds = {wid: seed for wid, seed, _ in rows}
    assert len(set(seeds.values())) == 2 and seeds[1] == seeds[0] + 1   # base seed + worker id
    if kind == "thread":
        assert {s for _, _, s in rows} == {torch.initial_seed()}
    else:
        assert all(seed == initial for _, seed, initial in rows)


def test_threads_pickle_nothing():
    """worker_mode="thread": a local worker_init_fn and a spawn context are
    fine; the context is ignored with a warning, and each worker ran the
    init on its own copy of the dataset."""
    if H.AGAINST_TORCH:
        pytest.skip("fastloader's worker modes (FL_TEST_AGAINST_TORCH=1)")
    import fastloader

    class Tagged(Dataset):
        tag = None

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.tensor([self.tag])

    def init(wid):   # a local function: torch's spawn workers could not pickle it
        get_worker_info().dataset.tag = 10 + wid

    ds = Tagged()
    with pytest.warns(UserWarning, match="ignores multiprocessing_context with worker_mode='thread'"):
        dl = fastloader.DataLoader(ds, batch_size=1, num_workers=2, worker_mode="thread", worker_init_fn=init,
                                   multiprocessing_context="spawn")
    assert [int(b) for b in dl] == [10, 11, 10, 11]
    assert ds.tag is None


def test_worker_process_pids_are_in_stats():
    """torch's private iterator._workers has no counterpart; the worker
    processes' pids are in stats()["workers"]."""
    if H.AGAINST_TORCH:
        pytest.skip("fastloader's stats() (FL_TEST_AGAINST_TORCH=1)")
    import os

    import fastloader

    class Pid(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.tensor([os.getpid()])

    dl = fastloader.DataLoader(Pid(), batch_size=1, num_workers=2, worker_mode="process",
                               multiprocessing_context=_FORK)
    it = iter(dl)
    pids = [int(next(it)), int(next(it))]
    assert [w["pid"] for w in dl.stats()["workers"]] == pids
    assert os.getpid() not in pids
    del it
