"""worker_mode="auto" (the default) and the thread-mode guarantees a
dataset written for torch relies on: where the workers run, why, said once;
in thread mode each worker thread loads from its own copy of the dataset
and batches go to workers in torch's round robin."""
from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, Dataset, IterableDataset, Subset

import fastloader as fl
from fastloader.worker_mode import choose_worker_mode
from helpers_formats import make_class_folder


class Squares(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.tensor([i * i])


def _mode(dl):
    list(dl)
    st = dl.stats()
    return st["worker_mode"], st.get("worker_mode_why", "")


def test_a_python_dataset_runs_in_worker_processes_by_default_and_says_why_once(caplog):
    dl = fl.DataLoader(Squares(), batch_size=4, num_workers=2)
    with caplog.at_level(logging.INFO, logger="fastloader"):
        assert sorted(int(x) for b in dl for x in b) == [i * i for i in range(32)]
        list(dl)
    mode, why = dl.stats()["worker_mode"], dl.stats()["worker_mode_why"]
    assert mode == "process"
    assert "Squares is a Python dataset" in why and "worker_mode='thread'" in why
    said = [r.getMessage() for r in caplog.records if "worker processes" in r.getMessage()]
    assert said == ["fastloader: 2 worker processes: " + why]   # two epochs, said once


def test_the_workers_are_other_processes_with_torchs_worker_info():
    class Where(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return torch.tensor([os.getpid(), info.id])

    rows = torch.cat(list(fl.DataLoader(Where(), batch_size=2, num_workers=2)))
    assert os.getpid() not in rows[:, 0].tolist()
    # torch's round robin: batch k on worker k mod 2
    assert rows[:, 1].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]


def test_fastloader_datasets_stay_on_threads(tmp_path):
    root = make_class_folder(tmp_path)
    folder = fl.ImageFolder(root, transform=fl.transforms.Compose([fl.transforms.Resize((16, 16)),
                                                                    fl.transforms.ToTensor()]))

    def collate(batch):  # off the native batch path: the Python backend runs it
        return torch.stack([x for x, _ in batch]), torch.tensor([y for _, y in batch])

    for ds in (folder, Subset(folder, [0, 2, 4]), ConcatDataset([folder, folder]),
               fl.ArrayDataset(np.arange(40, dtype=np.int64).reshape(20, 2))):
        kw = {"collate_fn": collate} if ds is not None and not isinstance(ds, fl.ArrayDataset) else {}
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fl.PerformanceWarning)  # the custom collate_fn's warning
            mode, why = _mode(fl.DataLoader(ds, batch_size=2, num_workers=2, **kw))
        assert mode == "thread", (type(ds).__name__, why)
    assert "fastloader's own datasets" in why


def test_a_subclass_with_its_own_getitem_is_a_python_dataset_again(tmp_path):
    class Mine(fl.ImageFolder):
        def __getitem__(self, i):
            return super().__getitem__(i)

    ds = Mine(make_class_folder(tmp_path),
              transform=fl.transforms.Compose([fl.transforms.Resize((8, 8)), fl.transforms.ToTensor()]))
    dl = fl.DataLoader(ds, batch_size=2, num_workers=2)
    assert choose_worker_mode(dl)[0] == "process"


def test_explicit_modes_are_kept():
    for mode in ("thread", "process"):
        m, why = choose_worker_mode(fl.DataLoader(Squares(), num_workers=2, worker_mode=mode))
        assert m == mode and why == f"worker_mode={mode!r} was asked for"


# -- thread mode: a copy of the dataset per worker thread -------------------------

class LazyHandle(Dataset):
    """The everyday pattern: a handle opened on first use and kept on self
    (an h5py file, an LMDB environment, a socket)."""

    def __init__(self, n=24):
        self.n = n
        self.handle = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.handle is None:
            self.handle = (threading.get_ident(), object())
        assert self.handle[0] == threading.get_ident(), "another worker's handle"
        return torch.tensor([i, torch.utils.data.get_worker_info().id, id(self.handle[1]) % 1000003])


def test_a_lazily_opened_handle_is_each_worker_threads_own():
    ds = LazyHandle()
    rows = torch.cat(list(fl.DataLoader(ds, batch_size=3, num_workers=2, worker_mode="thread")))
    assert rows[:, 0].tolist() == list(range(24))
    by_worker = {}
    for _, wid, h in rows.tolist():
        by_worker.setdefault(wid, set()).add(h)
    assert sorted(by_worker) == [0, 1] and all(len(h) == 1 for h in by_worker.values())
    assert by_worker[0] != by_worker[1]
    assert ds.handle is None   # the loader's own object was not touched


class WorkerTag(Dataset):
    def __init__(self):
        self.worker_id = None

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([i, self.worker_id])


def _tag(wid):
    torch.utils.data.get_worker_info().dataset.worker_id = wid


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_worker_init_fn_state_and_round_robin_as_torch(mode):
    """What worker_init_fn sets on get_worker_info().dataset is that worker's
    (torch's test_ind_worker_queue pattern), and batch k is loaded by worker
    k mod num_workers."""
    ds = WorkerTag()
    got = [b[:, 1].tolist() for b in fl.DataLoader(ds, batch_size=2, num_workers=3, worker_mode=mode,
                                                    worker_init_fn=_tag)]
    ref = [b[:, 1].tolist() for b in torch.utils.data.DataLoader(ds, batch_size=2, num_workers=3,
                                                                 worker_init_fn=_tag)]
    assert got == ref == [[k % 3] * 2 for k in range(8)]
    assert ds.worker_id is None


class Start(Dataset):
    def __init__(self):
        self.start = 0

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([self.start + i])


@pytest.mark.parametrize("persistent", [False, True])
def test_the_loops_changes_reach_workers_only_when_they_start(persistent):
    """torch's semantics: workers copy the dataset when they start, so a
    change the training loop makes between epochs reaches new workers (each
    epoch) but not persistent ones (torch's test_dataset_not_reset)."""
    ds = Start()
    dl = fl.DataLoader(ds, batch_size=4, num_workers=2, worker_mode="thread", persistent_workers=persistent)
    firsts = []
    for epoch in range(3):
        firsts.append(int(next(iter(dl))[0]) if not persistent else int(list(dl)[0][0]))
        ds.start = 10 * (epoch + 1)
    assert firsts == ([0, 0, 0] if persistent else [0, 10, 20])


class Uncopyable(Squares):
    def __copy__(self):
        raise TypeError("holds a live connection")


def test_a_dataset_that_refuses_copying_is_shared_and_the_loader_says_so():
    with pytest.warns(UserWarning, match=r"Uncopyable cannot be copied \(TypeError: holds a live connection\), so "
                                         r"its 2 worker threads share the one object.*worker_mode='process'"):
        out = list(fl.DataLoader(Uncopyable(), batch_size=4, num_workers=2, worker_mode="thread"))
    assert sorted(int(x) for b in out for x in b) == [i * i for i in range(32)]


class Counted(IterableDataset):
    def __init__(self):
        self.opened = 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        self.opened += 1
        for i in range(info.id, 12, info.num_workers):
            yield torch.tensor([i, self.opened])


def test_an_iterable_dataset_iterates_its_own_copy_per_worker_thread():
    ds = Counted()
    rows = torch.cat(list(fl.DataLoader(ds, batch_size=2, num_workers=3, worker_mode="thread")))
    assert sorted(rows[:, 0].tolist()) == list(range(12))
    assert set(rows[:, 1].tolist()) == {1}   # each copy opened once, not 1, 2, 3 on one shared object
    assert ds.opened == 0


class SlowFirst(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 0:
            import time

            time.sleep(1.0)
        return torch.tensor([i])


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_in_order_false_lets_fast_workers_run_past_a_slow_one(mode):
    """torch's in_order=False: batches come as they are ready, and a worker
    stuck on a slow sample does not collect the batches the others could
    load (torch's TestOutOfOrderDataLoader)."""
    got = [int(b) for b in fl.DataLoader(SlowFirst(), batch_size=1, num_workers=2, in_order=False,
                                         worker_mode=mode)]
    assert sorted(got) == list(range(12))
    assert got.index(0) >= 9, got   # at most the one batch queued behind it waits with it
    ordered = [int(b) for b in fl.DataLoader(SlowFirst(), batch_size=1, num_workers=2, worker_mode=mode)]
    assert ordered == list(range(12))


class InitByMethod(Dataset):
    """torch's test_ind_worker_queue pattern: worker_init_fn is a method of
    the dataset, which sets the worker id on self."""

    def __init__(self):
        self.worker_id = None

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([i, self.worker_id])

    def init(self, wid):
        self.worker_id = wid


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_worker_init_method_of_the_dataset_acts_on_the_workers_copy(mode):
    ds = InitByMethod()
    rows = torch.cat(list(fl.DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=ds.init,
                                        worker_mode=mode)))
    assert rows[:, 1].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert ds.worker_id is None


def test_batches_of_nested_tensors_are_counted():
    from fastloader.collate import batch_len

    nt = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    assert batch_len(nt) == 2 and batch_len([nt, torch.zeros(2)]) == 2 and batch_len({"x": nt}) == 2
    got = list(fl.DataLoader(list(range(6)), batch_size=3, num_workers=2, worker_mode="thread",
                             collate_fn=lambda b: torch.nested.nested_tensor([torch.zeros(i + 1) for i in b])))
    assert [t.size(0) for t in got] == [3, 3]
