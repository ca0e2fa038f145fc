"""torch 2.14 behaviours fastloader.DataLoader keeps (issue 25): WorkerInfo
as torch's frozen dataclass, the IterableDataset length warning, the
too-many-workers warning, get_worker_info() and worker_init_fn under spawn
and forkserver, and the hint when a worker's arguments cannot be pickled.
Where torch's own loader can show the behaviour, the test runs both and
compares."""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import warnings

import pytest
import torch
from torch.utils.data import DataLoader as TorchDL
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torch.utils.data._utils.worker import WorkerInfo as TorchWorkerInfo

import helpers_datasets as H

pytestmark = pytest.mark.fastloader_only

import fastloader  # noqa: E402
from fastloader import DataLoader as FL  # noqa: E402

EXCESS = r"This DataLoader will create \d+ worker (processes|threads) in total\..*excessive worker creation " \
         r"might get DataLoader running slow or even freeze"


def _cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _caught(fn):
    """(fn's result or exception, the warnings it gave)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - compared by the caller
            out = e
    return out, w


# --------------------------------------------------------------------------
# datasets (module level: spawned workers import them from here)


class InfoProbe(Dataset):
    """Each sample: the worker's WorkerInfo, as seen on the loading thread
    and on a thread the sample starts (torch's info is process-wide)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        seen = {}
        t = threading.Thread(target=lambda: seen.update(torch=get_worker_info(), ours=fastloader.get_worker_info()))
        t.start()
        t.join()
        info = get_worker_info()
        return {"i": i, "info": info, "ours": fastloader.get_worker_info(),
                "thread_torch": seen["torch"], "thread_ours": seen["ours"]}


def _keep(batch):
    return batch  # no collation: the WorkerInfo objects come back as they are


class ValueFromInit(Dataset):
    """torch's TestWorkerInfoDataset without its barrier: `value` exists only
    in a worker's copy, set by check_info_and_set_value."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.tensor(self.value)


def check_info_and_set_value(worker_id):
    """torch's _test_worker_info_init_fn, in the worker process."""
    info = get_worker_info()
    assert info is not None and info is fastloader.get_worker_info()
    assert isinstance(info, TorchWorkerInfo)
    assert worker_id == info.id < info.num_workers
    assert info.seed == torch.initial_seed()
    assert info.worker_method == "multiprocessing" and info.rng is None
    ds = info.dataset
    assert isinstance(ds, ValueFromInit) and not hasattr(ds, "value")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.id = 3999
    for k in ("id", "num_workers", "seed", "dataset"):
        assert f"{k}=" in repr(info)
    ds.value = [worker_id, os.getpid()]


class Locked(Dataset):
    def __init__(self):
        self.lock = threading.Lock()  # cannot be pickled

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


class Longer(IterableDataset):
    """Says it has `n` samples, yields `real`."""

    def __init__(self, n, real):
        self.n, self.real = n, real

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.real))


# --------------------------------------------------------------------------
# 1. WorkerInfo


def test_worker_info_is_torchs_frozen_dataclass_in_threads():
    rows = [r for b in FL(InfoProbe(), batch_size=2, num_workers=2, collate_fn=_keep, worker_mode="thread",
                          generator=torch.Generator().manual_seed(3)) for r in b]
    assert [r["i"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        info = r["info"]
        assert info is r["ours"]
        assert isinstance(info, TorchWorkerInfo) and isinstance(info, fastloader.WorkerInfo)
        assert info.rng is None and info.worker_method == "thread"
        assert info.dataset is not None and info.epoch == 0 and info.seed == info.base_seed + info.id
        # torch's fields first, in torch's order, then fastloader's; the repr shows them all
        names = [f.name for f in dataclasses.fields(info)]
        assert names == ["id", "num_workers", "seed", "dataset", "rng", "worker_method", "epoch", "base_seed"]
        assert repr(info).startswith(f"WorkerInfo(id={info.id}, num_workers=2, seed={info.seed}, dataset=")
        assert "rng=None, worker_method='thread', epoch=0, base_seed=" in repr(info)
        # refused as torch refuses it: the same exception for a field, and for a new name
        torch_info = TorchWorkerInfo(id=0, num_workers=1, seed=0, dataset=None)
        for name in ("id", "seed", "epoch"):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(info, name, 1)
        with pytest.raises(Exception) as theirs:
            torch_info.a = 3
        with pytest.raises(type(theirs.value)):
            info.a = 3
        # a thread the sample starts is no worker thread (threads share one process)
        assert r["thread_torch"] is None and r["thread_ours"] is None


def test_worker_info_is_new_each_epoch_and_sample_rng_moved():
    """fastloader's epoch field changes by replacing the object (it is
    frozen); the per-sample generator is sample_rng(index), rng is torch's
    attribute (None)."""
    seen = []

    class Probe(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            info = fastloader.get_worker_info()
            seen.append((info, info.sample_rng(i).random(), fastloader.sample_rng(i).random()))
            return i

    dl = FL(Probe(), batch_size=2, num_workers=1, persistent_workers=True, worker_mode="thread")
    list(dl)
    list(dl)
    (a, ra, fa), _, (b, rb, fb), _ = seen
    assert (a.epoch, b.epoch) == (0, 1) and a is not b and a.id == b.id and a.seed == b.seed
    assert ra == fa and rb == fb and ra != rb
    assert a.rng is None and not callable(a.rng)


def test_worker_info_in_processes_matches_torchs():
    """A worker process's info: worker_method "multiprocessing" and seen
    from every thread of the process, torch's get_worker_info() included,
    as in torch's worker processes."""
    kw = dict(batch_size=2, num_workers=2, collate_fn=_keep, multiprocessing_context="fork")
    theirs = [r for b in TorchDL(InfoProbe(), **kw) for r in b]
    ours = [r for b in FL(InfoProbe(), worker_mode="process", **kw) for r in b]
    for want, got in zip(theirs, ours, strict=True):
        assert type(want["info"]) is TorchWorkerInfo and isinstance(got["info"], TorchWorkerInfo)
        for k in ("id", "num_workers", "rng", "worker_method"):
            assert getattr(got["info"], k) == getattr(want["info"], k), k
        assert got["info"].worker_method == "multiprocessing"
        assert want["thread_torch"] is not None and got["thread_torch"] is not None
        assert got["thread_torch"].id == got["thread_ours"].id == got["info"].id


# --------------------------------------------------------------------------
# 2. an IterableDataset longer than its __len__


@pytest.mark.parametrize("num_workers,batch_size,mode", [
    (0, None, "thread"), (0, 1, "thread"), (0, 2, "thread"),
    (2, None, "thread"), (2, 2, "thread"), (2, None, "process")])
def test_iterable_longer_than_its_len_warns_as_torch(num_workers, batch_size, mode):
    def run(cls, **kw):
        ds = Longer(3, 6)
        dl = cls(ds, batch_size=batch_size, num_workers=num_workers, **kw)
        assert len(dl) == (3 if batch_size in (None, 1) else 2)
        out, w = _caught(lambda: list(dl))
        msgs = [(str(x.message).replace(repr(ds), "DS"), x.category, x.filename, x.lineno)
                for x in w if "Length of IterableDataset" in str(x.message)]
        return len(out), msgs

    n, want = run(TorchDL)
    got_n, got = run(FL, worker_mode=mode)
    assert got_n == n
    assert got == want  # same text, same category, each at the same next() (the caller's line)
    if batch_size == 2:   # as torch: batches are counted against len(dataset)
        assert want == [] if num_workers == 0 else len(want) == 3
    else:
        assert len(want) == n - 3 and want[0][0].startswith(
            "Length of IterableDataset DS was reported to be 3(when accessing len(dataloader)), but 4 samples")
    assert all(m[1] is UserWarning for m in want)


def test_iterable_without_len_called_gives_no_length_warning():
    _, w = _caught(lambda: list(FL(Longer(3, 6), batch_size=None, num_workers=2)))
    assert not [x for x in w if "Length of IterableDataset" in str(x.message)]


# --------------------------------------------------------------------------
# 3. more workers than CPUs


@pytest.mark.parametrize("mode,persistent", [("thread", False), ("process", False), ("thread", True)])
def test_excess_workers_warn_where_torch_does(mode, persistent):
    """At construction and as each iterator with workers starts (persistent
    workers: once), naming threads or processes."""
    n = _cpus() + 1

    def run(cls, **kw):
        def go():
            dl = cls(list(range(4)), batch_size=2, num_workers=n, persistent_workers=persistent, **kw)
            return [b.tolist() for b in dl] + [b.tolist() for b in dl]
        out, w = _caught(go)
        return out, [str(x.message) for x in w if re.search(EXCESS, str(x.message))]

    want_out, want = run(TorchDL)
    got_out, got = run(FL, worker_mode=mode)
    assert got_out == want_out
    assert len(got) == len(want) == (2 if persistent else 3)
    kind = "processes" if mode == "process" else "threads"
    assert got == [m.replace("worker processes", f"worker {kind}") for m in want]


def test_excess_workers_no_warning_with_auto_or_enough_cpus():
    for nw in ("auto", min(2, _cpus())):
        _, w = _caught(lambda: list(FL(list(range(4)), batch_size=2, num_workers=nw)))
        assert not [x for x in w if re.search(EXCESS, str(x.message))], nw


def test_excess_workers_follow_where_the_iterator_runs():
    """The wording follows where the next iterator's workers run: a native
    dataset's are C threads whatever worker_mode says; a Python dataset's
    are threads when asked for, processes by default (worker_mode="auto")."""
    dl = FL(list(range(4)), batch_size=2, num_workers=_cpus() + 1, worker_mode="thread")
    _, w = _caught(dl.check_worker_number_rationality)
    assert [str(x.message).split(" in total")[0][-14:] for x in w] == ["worker threads"]
    dl.worker_mode = "auto"
    _, w = _caught(dl.check_worker_number_rationality)
    assert [str(x.message).split(" in total")[0][-16:] for x in w] == ["worker processes"]

    from fastloader.datasets import NativeImageDataset

    class FakeNative(NativeImageDataset):
        def __init__(self):
            pass

        def __len__(self):
            return 4

    _, w = _caught(lambda: FL(FakeNative(), batch_size=2, num_workers=_cpus() + 1, worker_mode="process"))
    assert [str(x.message).split(" in total")[0][-14:] for x in w if re.search(EXCESS, str(x.message))] == \
        ["worker threads"]


# --------------------------------------------------------------------------
# 4. get_worker_info() and worker_init_fn under spawn and forkserver


@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
def test_get_worker_info_and_worker_init_fn_in_spawned_workers(ctx):
    """torch's test_get_worker_info / worker_init_fn checks, with process
    workers started by `ctx`: the function is pickled and run in each
    worker, which sees its own copy of the dataset, its id and its seed."""
    ds = ValueFromInit()
    dl = FL(ds, batch_size=2, num_workers=2, worker_init_fn=check_info_and_set_value, worker_mode="process",
            multiprocessing_context=ctx)
    it = iter(dl)
    data = torch.cat(list(it)).tolist()
    pids = [w["pid"] for w in dl.stats()["workers"]]
    assert len(data) == 6 and {wid for wid, _ in data} == {0, 1}
    for wid, pid in data:
        assert pid == pids[wid] != os.getpid()
    assert get_worker_info() is None and fastloader.get_worker_info() is None
    assert not hasattr(ds, "value")  # the loader's dataset never ran worker_init_fn
    assert dl.stats()["shared_memory"]["start_method"] == ctx


# --------------------------------------------------------------------------
# 5. arguments a spawned worker cannot get


def _lambda_init():
    return lambda wid: None


@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
@pytest.mark.parametrize("what", ["dataset", "worker_init_fn"])
def test_unpicklable_worker_arguments_give_torchs_hint(ctx, what):
    def run(cls, **kw):
        ds, init = (Locked(), None) if what == "dataset" else (H.RangeDataset(4), _lambda_init())
        dl = cls(ds, batch_size=2, num_workers=2, worker_init_fn=init, multiprocessing_context=ctx, **kw)
        err, w = _caught(lambda: iter(dl))
        return err, [str(x.message) for x in w if "pickle" in str(x.message)]

    want_err, want = run(TorchDL)
    got_err, got = run(FL, worker_mode="process")
    assert isinstance(want_err, (TypeError, AttributeError)) or type(want_err).__name__ == "PicklingError"
    assert type(got_err) is type(want_err)
    assert got == want and len(got) == 1
    assert got[0].startswith("Got pickle error when attempting to start a worker Process. This might be because "
                             "the worker Process arguments are not picklable.")
