"""Batches equal torch's DataLoader: same structure, types, dtypes, shapes, values."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import helpers_datasets as H

NUM_WORKERS = [0, 1, 2, 4]


def _collect(loader):
    return [b for b in loader]


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize("kind", H.SAMPLE_KINDS)
def test_default_collate_matches_torch(DL, TorchDL, kind, num_workers):
    ds = H.KindDataset(kind, 22)  # 5 full batches of 4 and a partial one
    out = _collect(DL(ds, batch_size=4, num_workers=num_workers))
    ref = _collect(TorchDL(ds, batch_size=4))
    H.assert_same_batches(out, ref)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", H.SAMPLE_KINDS)
def test_no_auto_batching_matches_torch(DL, TorchDL, kind, num_workers):
    ds = H.KindDataset(kind, 7)
    out = _collect(DL(ds, batch_size=None, num_workers=num_workers))
    ref = _collect(TorchDL(ds, batch_size=None))
    H.assert_same_batches(out, ref)


def test_reference_dtypes_sanity(TorchDL):
    """Pins down what torch produces, so a wrong reference cannot hide a bug."""
    b = next(iter(TorchDL(H.KindDataset("nested", 4), batch_size=4)))
    assert b["img"].dtype == torch.uint8 and b["img"].shape == (4, 2, 2)
    assert b["meta"]["id"].dtype == torch.int64
    assert b["meta"]["path"] == ["/data/0.jpg", "/data/1.jpg", "/data/2.jpg", "/data/3.jpg"]
    assert b["meta"]["flags"][0].dtype == torch.bool
    assert b["meta"]["flags"][1].dtype == torch.float64
    assert isinstance(b["pair"], list) and b["pair"][0].dtype == torch.float64  # tuple -> list
    assert type(b["pair"][1]) is H.Point and b["pair"][1].y.dtype == torch.int32
    assert b["bf"].dtype == torch.bfloat16
    t = next(iter(TorchDL(H.KindDataset("np_transposed", 2), batch_size=2)))
    assert t.shape == (2, 6, 4) and t.dtype == torch.float32
    assert torch.equal(t[1], torch.from_numpy(np.ascontiguousarray(H.make_sample("np_transposed", 1))))


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_custom_collate_fn(DL, TorchDL, num_workers):
    ds = H.EpochDataset(10)
    out = _collect(DL(ds, batch_size=3, num_workers=num_workers, collate_fn=H.sum_and_ids_collate))
    ref = _collect(TorchDL(ds, batch_size=3, collate_fn=H.sum_and_ids_collate))
    H.assert_same_batches(out, ref)
    assert [b["ids"] for b in out] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_identity_collate_fn_returns_raw_samples(DL, TorchDL, num_workers):
    ds = H.KindDataset("np_f64", 5)
    out = _collect(DL(ds, batch_size=2, num_workers=num_workers, collate_fn=list))
    ref = _collect(TorchDL(ds, batch_size=2, collate_fn=list))
    H.assert_same_batches(out, ref)
    assert isinstance(out[0][0], np.ndarray)


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize("batch_size", [4, None])
def test_getitems_dataset(DL, TorchDL, num_workers, batch_size):
    ds = H.GetItemsDataset(21)
    out = _collect(DL(ds, batch_size=batch_size, num_workers=num_workers))
    ref = _collect(TorchDL(ds, batch_size=batch_size))
    H.assert_same_batches(out, ref)
    if batch_size is None:
        assert out[3][1] == "single"  # no auto-batching: __getitem__
    else:
        # __getitems__ used (strings inside a tuple sample collate to a tuple, as in torch)
        assert list(out[0][1]) == ["many4"] * 4 and list(out[-1][1]) == ["many1"]


# ---------------------------------------------------------------------------
# IterableDataset
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize("kw", [dict(batch_size=4), dict(batch_size=4, drop_last=True), dict(batch_size=None)],
                         ids=["bs4", "bs4-drop", "nobatch"])
def test_sharded_iterable_matches_torch(DL, TorchDL, num_workers, kw):
    ds = H.ShardedIterable(23)
    out = _collect(DL(ds, num_workers=num_workers, **kw))
    ref = _collect(TorchDL(ds, num_workers=num_workers, **kw))
    H.assert_same_batches(out, ref)
    if not kw.get("drop_last"):
        if kw["batch_size"] is None:
            seen = [b["i"] for b in out]
        else:
            seen = torch.cat([b["i"] for b in out]).tolist()
        assert sorted(seen) == list(range(23))  # every item exactly once


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_contiguous_sharded_iterable_matches_torch(DL, TorchDL, num_workers):
    ds = H.ContiguousShardIterable(3, 26)
    out = _collect(DL(ds, batch_size=3, num_workers=num_workers))
    ref = _collect(TorchDL(ds, batch_size=3, num_workers=num_workers))
    H.assert_same_batches(out, ref)
    seen = torch.cat(out)[:, 0].tolist()
    assert sorted(seen) == [float(i) for i in range(3, 26)]


@pytest.mark.parametrize("num_workers", [2, 4])
def test_iterable_with_idle_workers(DL, TorchDL, num_workers):
    ds = H.ShardedIterable(1)  # only worker 0 has data
    out = _collect(DL(ds, batch_size=2, num_workers=num_workers))
    ref = _collect(TorchDL(ds, batch_size=2, num_workers=num_workers))
    H.assert_same_batches(out, ref)
    assert len(out) == 1


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_unsharded_iterable_duplicates_like_torch(DL, TorchDL, num_workers):
    ds = H.UnshardedIterable(10)
    out = _collect(DL(ds, batch_size=4, num_workers=num_workers))
    ref = _collect(TorchDL(ds, batch_size=4, num_workers=num_workers))
    H.assert_same_batches(out, ref)
    total = sum(len(b[1]) for b in out)
    assert total == 10 * max(1, num_workers)


# ---------------------------------------------------------------------------
# Output buffers: batches stay intact after the epoch (DLPack ownership)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_kept_batches_stay_intact(DL, TorchDL, num_workers):
    ds = H.EpochDataset(24)
    ds.epoch = 0
    ref0 = [H.clone_batch(b) for b in TorchDL(ds, batch_size=5)]
    ds.epoch = 1
    ref1 = [H.clone_batch(b) for b in TorchDL(ds, batch_size=5)]
    ds.epoch = 0

    dl = DL(ds, batch_size=5, num_workers=num_workers)
    kept0 = []
    for b in dl:
        for leaf in H.iter_leaves(b):
            if isinstance(leaf, torch.Tensor):
                assert leaf.device.type == "cpu"
        assert isinstance(b["x"], torch.Tensor) and isinstance(b["y"], torch.Tensor)
        kept0.append(b)
    H.assert_same_batches(kept0, ref0)  # after the epoch ended

    ds.epoch = 1  # the next epoch produces different values into any reused memory
    kept1 = []
    it = iter(dl)
    kept1.append(next(it))
    gc.collect()
    H.assert_same_batches(kept0, ref0)  # after starting the next epoch
    kept1.extend(it)
    del it
    gc.collect()
    H.assert_same_batches(kept0, ref0)
    H.assert_same_batches(kept1, ref1)
    # batches are independent: writing into one does not affect the others
    kept0[0]["x"].fill_(-1)
    H.assert_same_batches(kept0[1:], ref0[1:])
    H.assert_same_batches(kept1, ref1)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.float32, torch.float64, torch.complex64])
def test_stack_of_permuted_and_reversed_views_equals_torch(dtype):
    """Samples whose innermost dimension is strided (PILToTensor's CHW view
    of an HWC image, kept by ConvertImageDtype and Normalize; a flipped view;
    a column slice) stack to what torch.stack gives, whatever the item size
    (the typed row loop for 1/2/4/8 bytes, the generic walk otherwise)."""
    from fastloader import _C

    g = torch.Generator().manual_seed(0)
    base = [(torch.rand(5, 7, 3, generator=g) * 100).to(dtype) for _ in range(4)]
    cases = [
        [b.permute(2, 0, 1) for b in base],            # HWC -> CHW view
        [b.transpose(0, 1) for b in base],             # a compact run of 3 items, strided rows
        [b[:, ::2, 1] for b in base],                  # 2-D, innermost stride 6 items
        [b.permute(2, 0, 1)[:, :, 2] for b in base],   # 2-D of a permuted view
    ]
    for items in cases:
        assert not items[0].is_contiguous()
        buf = _C.stack(items)
        got = torch.from_dlpack(buf)
        if got.dtype != dtype:
            got = got.view(dtype)
        want = torch.stack(items)
        assert got.shape == want.shape and torch.equal(got.reshape(want.shape), want)
    if dtype is not torch.complex64:  # NumPy views may run backwards: a negative innermost stride
        arrs = [b.numpy()[:, ::-1, :].transpose(2, 0, 1) for b in base]
        got = np.from_dlpack(_C.stack(arrs))
        assert np.array_equal(got.view(arrs[0].dtype).reshape(4, 3, 5, 7), np.stack(arrs))
