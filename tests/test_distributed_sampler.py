"""DistributedSampler with explicit num_replicas / rank (no process group)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler

import helpers_datasets as H


def _ids(batches):
    return torch.cat([b[1] for b in batches]).tolist()


def _run(loader_cls, ds, rank, replicas, shuffle, num_workers, epoch, drop_last=False, seed=0):
    sampler = DistributedSampler(ds, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(loader_cls(ds, batch_size=3, sampler=sampler, num_workers=num_workers))


@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_match_torch_and_partition(DL, TorchDL, num_workers, shuffle):
    ds = H.KindDataset("tuple", 24)
    replicas = 3
    per_rank = []
    for rank in range(replicas):
        out = _run(DL, ds, rank, replicas, shuffle, num_workers, epoch=0)
        ref = _run(TorchDL, ds, rank, replicas, shuffle, 0, epoch=0)
        H.assert_same_batches(out, ref)
        per_rank.append(_ids(out))
    flat = [i for r in per_rank for i in r]
    assert sorted(flat) == list(range(24)), "shards do not cover the dataset exactly once"
    for a in range(replicas):
        for b in range(a + 1, replicas):
            assert not set(per_rank[a]) & set(per_rank[b]), "shards overlap"
    assert all(len(r) == 8 for r in per_rank)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_epoch_changes_order_like_torch(DL, TorchDL, num_workers):
    ds = H.KindDataset("tuple", 24)
    for rank in range(2):
        e0 = _run(DL, ds, rank, 2, True, num_workers, epoch=0, seed=17)
        e1 = _run(DL, ds, rank, 2, True, num_workers, epoch=1, seed=17)
        H.assert_same_batches(e0, _run(TorchDL, ds, rank, 2, True, 0, epoch=0, seed=17))
        H.assert_same_batches(e1, _run(TorchDL, ds, rank, 2, True, 0, epoch=1, seed=17))
        assert _ids(e0) != _ids(e1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_epoch_on_live_loader(DL, TorchDL, num_workers):
    """The usual training loop: one loader, sampler.set_epoch(e) before each epoch."""
    ds = H.KindDataset("tuple", 20)
    s_fl = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    s_t = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    extra = dict(persistent_workers=True) if num_workers else {}
    dl = DL(ds, batch_size=4, sampler=s_fl, num_workers=num_workers, **extra)
    ref = TorchDL(ds, batch_size=4, sampler=s_t)
    orders = []
    for epoch in range(3):
        s_fl.set_epoch(epoch)
        s_t.set_epoch(epoch)
        out = list(dl)
        H.assert_same_batches(out, list(ref))
        orders.append(_ids(out))
    assert orders[0] != orders[1] != orders[2]
    del dl


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_uneven_dataset(DL, TorchDL, num_workers, drop_last):
    ds = H.KindDataset("tuple", 25)
    per_rank = []
    for rank in range(3):
        out = _run(DL, ds, rank, 3, True, num_workers, epoch=2, drop_last=drop_last)
        H.assert_same_batches(out, _run(TorchDL, ds, rank, 3, True, 0, epoch=2, drop_last=drop_last))
        per_rank.append(_ids(out))
    sizes = {len(r) for r in per_rank}
    assert len(sizes) == 1  # every rank gets the same number of samples
    flat = [i for r in per_rank for i in r]
    if drop_last:
        assert len(flat) == 24 and len(set(flat)) == 24
    else:
        assert set(flat) == set(range(25)) and len(flat) == 27  # padded by repetition
