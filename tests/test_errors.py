"""Errors raised by user code reach the consumer usefully; timeouts are bounded."""

from __future__ import annotations

import time
import traceback

import pytest
import torch

import helpers_datasets as H

NUM_WORKERS = [0, 1, 2, 4]

EXC_KINDS = [("custom", H.CustomLoadError), ("key", KeyError), ("value", ValueError)]


def _formatted(e: BaseException) -> str:
    return "".join(traceback.format_exception(e))


def _consume(dl):
    for _ in dl:
        pass


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize("exc_name,exc_type", EXC_KINDS, ids=[k for k, _ in EXC_KINDS])
def test_exception_type_and_origin(DL, num_workers, exc_name, exc_type):
    ds = H.FailingDataset(16, fail_index=7, exc=exc_name)
    dl = DL(ds, batch_size=2, num_workers=num_workers)
    with pytest.raises(exc_type) as info:
        _consume(dl)
    text = _formatted(info.value)
    # the function that raised is part of the (original) traceback
    assert "load_sample_or_explode" in text, text


@pytest.mark.fastloader_only
@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize("exc_name,exc_type", EXC_KINDS, ids=[k for k, _ in EXC_KINDS])
def test_exception_names_index_and_worker(DL, num_workers, exc_name, exc_type):
    ds = H.FailingDataset(16, fail_index=7, exc=exc_name)
    with pytest.raises(exc_type) as info:
        _consume(DL(ds, batch_size=2, num_workers=num_workers))
    text = _formatted(info.value)
    assert "index 7" in text, text
    if num_workers > 0:
        assert "worker" in text.lower(), text
    assert "load_sample_or_explode" in text, text
    # the original traceback (not just a message string) is kept
    names = [fs.name for fs in traceback.extract_tb(info.value.__traceback__)]
    assert "load_sample_or_explode" in names or "load_sample_or_explode" in text


@pytest.mark.fastloader_only
@pytest.mark.parametrize("num_workers", [0, 2])
def test_exception_object_preserved(DL, num_workers):
    """An exception that cannot be rebuilt from a string keeps its type and fields
    (torch turns it into a RuntimeError)."""
    ds = H.FailingDataset(16, fail_index=7, exc="two_arg")
    with pytest.raises(H.TwoArgError) as info:
        _consume(DL(ds, batch_size=2, num_workers=num_workers))
    assert info.value.code == 42 and info.value.detail == "bad header"
    assert "index 7" in _formatted(info.value)


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_batches_before_error_are_delivered(DL, num_workers):
    ds = H.FailingDataset(16, fail_index=7, exc="custom")
    got = []
    with pytest.raises(H.CustomLoadError):
        for b in DL(ds, batch_size=2, num_workers=num_workers):
            got.append(b.view(-1).tolist())
    assert got == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_next_epoch_runs_after_error_is_fixed(DL, num_workers):
    ds = H.FailingDataset(16, fail_index=7, exc="custom")
    dl = DL(ds, batch_size=4, num_workers=num_workers)
    with pytest.raises(H.CustomLoadError):
        _consume(dl)
    # the failed epoch's iterator is gone, and so are its workers
    left = H.wait_workers_gone(timeout=2.0)
    assert not left, f"workers of the failed epoch still alive: {sorted(left)}"
    ds.fail = False
    out = torch.cat([b.view(-1) for b in dl]).tolist()
    assert out == list(range(16))
    # and again, for good measure
    assert len(list(dl)) == 4


@pytest.mark.fastloader_only
@pytest.mark.parametrize("num_workers", [1, 2])
def test_next_epoch_after_error_persistent_workers_go_on_with_their_copy(DL, num_workers):
    """An error ends the epoch, not the persistent workers; they keep the
    copy of the dataset they started with (torch's semantics), so what the
    loop changes on its object afterwards does not reach them."""
    ds = H.FailingDataset(16, fail_index=7, exc="key")
    dl = DL(ds, batch_size=4, num_workers=num_workers, persistent_workers=True)
    with pytest.raises(KeyError):
        _consume(dl)
    ds.fail = False  # the loop's object; the workers' copies still fail
    it = iter(dl)
    assert next(it).view(-1).tolist() == [0, 1, 2, 3]
    with pytest.raises(KeyError):
        next(it)
    del it, dl
    fresh = DL(ds, batch_size=4, num_workers=num_workers)   # new workers copy the changed object
    assert torch.cat([b.view(-1) for b in fresh]).tolist() == list(range(16))


@pytest.mark.parametrize("num_workers", [1, 2])
def test_timeout_raises_promptly(DL, num_workers):
    ds = H.SlowDataset(8, delay=3.0)
    dl = DL(ds, batch_size=2, num_workers=num_workers, timeout=0.5)
    it = iter(dl)
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as info:
            next(it)
        took = time.monotonic() - t0
    finally:
        H.RELEASE.set()  # let the stuck workers go
    assert "timed out" in str(info.value).lower(), str(info.value)
    assert took < 2.0, f"timeout=0.5 took {took:.2f}s to fire"
    assert took >= 0.45, f"timeout fired too early ({took:.2f}s)"
    del it


@pytest.mark.fastloader_only
@pytest.mark.parametrize("num_workers", [1, 2])
def test_timeout_message_names_batch(DL, num_workers):
    ds = H.SlowDataset(8, delay=3.0, fast_prefix=4)  # batches 0 and 1 are fast
    dl = DL(ds, batch_size=2, num_workers=num_workers, timeout=0.5)
    it = iter(dl)
    try:
        first = [next(it).view(-1).tolist(), next(it).view(-1).tolist()]
        with pytest.raises(RuntimeError) as info:
            next(it)
    finally:
        H.RELEASE.set()
    assert first == [[0, 1], [2, 3]]
    text = _formatted(info.value)
    assert "timed out" in text.lower() and "batch 2" in text, text
    del it
