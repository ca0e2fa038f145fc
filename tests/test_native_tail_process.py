"""A native dataset whose transform ends in Python (a user's own transform
after the native prefix) runs its batches in worker processes by default
(worker_mode.choose_native_mode, backends.NativeProcessBackend): each
process builds whole batches, the C part and then the tail, batches in
parallel.  The batches of a deterministic tail are the threads'; a tail's
draws from torch's generator follow torch's per-worker seeds; errors,
on_error records, the Pillow fix-up, resume and stats work as on threads;
worker_mode="thread" keeps the tail on the C threads, one batch at a time."""
import itertools
import logging
import os
import pickle
import re
import shutil
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
from torchvision import transforms as T  # noqa: E402

import fastloader  # noqa: E402
from fastloader.worker_mode import choose_native_mode  # noqa: E402
from helpers_formats import make_class_folder, varied_image  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
pytestmark = pytest.mark.filterwarnings("ignore:fastloader. part of the transform runs in Python:UserWarning")


class Affine:
    """A user's own deterministic tensor transform."""

    def __call__(self, t):
        return t * 2 - 1


class Draw:
    """A user's own random transform: three draws from torch's generator
    (the image's values ignored, so torch's loader can make the same)."""

    def __call__(self, t):
        return torch.rand(3)


class Pid:
    def __call__(self, t):
        return torch.tensor([float(os.getpid())], dtype=torch.float64)


class FailOnCall:
    """Raises on its n-th call in a process."""

    def __init__(self, n):
        self.n, self.calls = n, itertools.count()

    def __call__(self, t):
        if next(self.calls) == self.n:
            raise ZeroDivisionError("tail failed")
        return t


class Slow:
    def __call__(self, t):
        time.sleep(0.003)   # a known cost per sample, in the tail's calls
        return t


def _tf(*tail):
    return T.Compose([T.Resize((20, 24)), T.ToTensor(), T.Normalize(MEAN, STD), *tail])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_class_folder(tmp_path_factory.mktemp("tailproc") / "train")   # 21 JPEGs, 3 classes


@pytest.fixture(scope="module")
def bad_folder(folder, tmp_path_factory):
    """The folder plus a corrupt JPEG and a BMP (decoded through Pillow)."""
    root = tmp_path_factory.mktemp("tailbad") / "train"
    shutil.copytree(folder, root)
    (root / "cat" / "cat_03b.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"not a jpeg" * 20)
    varied_image(30).save(root / "dog" / "dog_02b.bmp")
    return str(root)


def _equal(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def _load(ds, **kw):
    kw.setdefault("batch_size", 4)
    dl = fastloader.DataLoader(ds, **kw)
    return list(dl), dl


# ---------------------------------------------------------------------------
# where it runs, and why


def test_a_tail_runs_in_worker_processes_by_default_and_says_why_once(folder, caplog):
    ds = fastloader.ImageFolder(folder, transform=_tf(Pid()))
    dl = fastloader.DataLoader(ds, batch_size=3, num_workers=2)
    with caplog.at_level(logging.INFO, logger="fastloader"):
        for _ in range(2):
            pids = [int(x) for x, _ in dl for x in x[:, 0].tolist()]
    # batch k on worker k mod 2, each another process than this one
    by_batch = [pids[k * 3] for k in range(7)]
    assert os.getpid() not in pids and len(set(by_batch)) == 2
    assert by_batch[0::2] == [by_batch[0]] * 4 and by_batch[1::2] == [by_batch[1]] * 3
    st = dl.stats()
    assert (st["worker_mode"], st["path"]) == ("process", "native")
    assert "ImageFolder's transform ends in Python (" in st["worker_mode_why"]
    assert "Pid" in st["worker_mode_why"] and "worker_mode='thread'" in st["worker_mode_why"]
    said = [r.getMessage() for r in caplog.records if "worker processes" in r.getMessage()]
    assert said == ["fastloader: 2 worker processes: " + st["worker_mode_why"]]   # two epochs, said once


def test_what_each_mode_chooses(folder):
    def mode(tf, target=None, **kw):
        ds = fastloader.ImageFolder(folder, transform=tf, target_transform=target)
        return choose_native_mode(fastloader.DataLoader(ds, num_workers=2, **kw))

    assert mode(_tf(Affine()))[0] == "process"
    m, why = mode(_tf(Affine()), worker_mode="thread")
    assert m == "thread" and "one batch at a time in batch order" in why
    # a label mapping alone stays on threads by default; asked for, processes
    assert mode(_tf(), target=abs)[0] == "thread" and "target_transform" in mode(_tf(), target=abs)[1]
    assert mode(_tf(), target=abs, worker_mode="process")[0] == "process"
    # no Python per sample: threads, whatever is asked
    m, why = mode(_tf(), worker_mode="process")
    assert m == "thread" and why.startswith("worker_mode='process' does not apply")


def test_process_asked_for_a_dataset_with_no_python_warns_once_and_stays_on_threads(folder):
    ds = fastloader.ImageFolder(folder, transform=_tf())
    dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2, worker_mode="process")
    with pytest.warns(UserWarning, match="worker_mode='process' does not apply: ImageFolder's batches are made "
                                         "in C without the GIL"):
        list(dl)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(dl)
    assert dl.stats()["worker_mode"] == "thread"


# ---------------------------------------------------------------------------
# the batches


@pytest.mark.parametrize("num_workers", [1, 3])
def test_a_deterministic_tail_gives_the_threads_batches(folder, num_workers):
    ds = fastloader.ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(),
                                                             T.ToTensor(), Affine()]),
                                target_transform=lambda y: y + 10)
    kw = dict(shuffle=True, seed=7, generator=torch.Generator().manual_seed(3))
    got, dl = _load(ds, num_workers=num_workers, **kw)
    kw["generator"] = torch.Generator().manual_seed(3)
    ref, _ = _load(ds, num_workers=2, worker_mode="thread", **kw)
    _equal(got, ref)
    assert dl.stats()["worker_mode"] == "process" and len(got) == len(dl) == 6
    assert sorted(int(y) for _, b in got for y in b) == sorted(t + 10 for t in ds.targets)


def test_a_random_tail_draws_as_in_torchs_worker_processes(folder):
    """The tail's draws from torch's generator: torch's per-worker seeds
    (base seed + worker id, the base seed drawn from the loader's generator)
    and torch's round robin, so a tail that only draws gives torch's
    DataLoader's numbers for a dataset that draws the same per sample."""
    ds = fastloader.ImageFolder(folder, transform=_tf(Draw()))

    class Ref(torch.utils.data.Dataset):
        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            return torch.rand(3), ds.targets[i]

    kw = dict(batch_size=4, shuffle=True, num_workers=2)
    got = list(fastloader.DataLoader(ds, generator=torch.Generator().manual_seed(5), **kw))
    ref = list(torch.utils.data.DataLoader(Ref(), generator=torch.Generator().manual_seed(5), **kw))
    _equal(got, ref)
    # and not num_workers=0's draws, which threads give (tests/test_native_post.py)
    torch.manual_seed(0)
    threads = list(fastloader.DataLoader(ds, generator=torch.Generator().manual_seed(5), worker_mode="thread", **kw))
    assert not torch.equal(torch.cat([x for x, _ in got]), torch.cat([x for x, _ in threads]))


# ---------------------------------------------------------------------------
# errors and on_error


@pytest.mark.filterwarnings("ignore:fastloader. .*is not a JPEG:UserWarning")
def test_a_bad_file_raises_at_its_batch_naming_file_index_and_worker(bad_folder):
    ds = fastloader.ImageFolder(bad_folder, transform=_tf(Affine()))
    bad = [os.path.basename(p) for p, _ in ds.samples].index("cat_03b.jpg")
    it = iter(fastloader.DataLoader(ds, batch_size=4, num_workers=2))
    for _ in range(bad // 4):
        next(it)
    with pytest.raises(fastloader.DecodeError) as ei:
        next(it)
    notes = " ".join(getattr(ei.value, "__notes__", []))
    assert "cat_03b.jpg" in str(ei.value) and f"sample index {bad}" in str(ei.value)
    assert f"batch {bad // 4}" in notes and f"worker process {(bad // 4) % 2}" in notes, notes
    x, y = next(it)   # the loader goes on with the next batch
    assert len(y) == 4
    del it


@pytest.mark.parametrize("on_error", ["skip", "replace"])
def test_on_error_records_and_pillow_reach_the_loaders_dataset(bad_folder, on_error):
    def run(**kw):
        ds = fastloader.ImageFolder(bad_folder, transform=_tf(Affine()), on_error=on_error)
        with pytest.warns(UserWarning, match="dog_02b.bmp is not a JPEG"):
            out, dl = _load(ds, num_workers=2, seed=3, **kw)
        return ds, out, dl

    ds, got, dl = run()
    ref_ds, ref, _ = run(worker_mode="thread")
    _equal(got, ref)
    assert dl.stats()["worker_mode"] == "process"
    names = [os.path.basename(e[0]) for e in (ds.skipped if on_error == "skip" else ds.replaced)]
    assert names == ["cat_03b.jpg"]
    assert (ds.skipped, ds.replaced) == (ref_ds.skipped, ref_ds.replaced)
    assert dl.stats()["skipped" if on_error == "skip" else "replaced"] == (ds.skipped or ds.replaced)
    assert sum(len(y) for _, y in got) == len(ds) - (on_error == "skip")


def test_an_exception_in_the_tail_reaches_the_consumer_at_its_batch(folder):
    ds = fastloader.ImageFolder(folder, transform=_tf(FailOnCall(10)))   # sample 10 in the one process: batch 2
    it = iter(fastloader.DataLoader(ds, batch_size=4, num_workers=1))
    next(it)
    next(it)
    with pytest.raises(ZeroDivisionError, match="tail failed") as ei:
        next(it)
    notes = " ".join(getattr(ei.value, "__notes__", []))
    assert "Python part" in notes and "batch 2" in notes and "worker process 0" in notes, notes
    x, y = next(it)
    assert len(y) == 4
    del it


def test_an_exception_in_target_transform_names_its_batch(folder):
    ds = fastloader.ImageFolder(folder, transform=_tf(Affine()), target_transform=lambda y: {0: 0, 1: 1}[y])
    first_two = ds.targets.index(2)
    it = iter(fastloader.DataLoader(ds, batch_size=4, num_workers=2))
    for _ in range(first_two // 4):
        next(it)
    with pytest.raises(KeyError) as ei:
        next(it)
    notes = " ".join(getattr(ei.value, "__notes__", []))
    assert "target_transform" in notes and f"batch {first_two // 4}" in notes and "worker process" in notes, notes
    del it


# ---------------------------------------------------------------------------
# the warning: the real cost and the one remedy for this loader


def _tail_warning(ds, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _load(ds, **kw)
    msgs = [str(w.message) for w in caught if "runs in Python" in str(w.message)]
    assert len(msgs) == 1, msgs
    return msgs[0]


def test_the_tail_warning_in_processes_names_the_cost_per_worker_and_the_c_remedy(folder):
    msg = _tail_warning(fastloader.ImageFolder(folder, transform=_tf(Slow())), num_workers=2)
    m = re.search(r"Measured per sample: ([\d.]+) ms in its calls and ([\d.]+) ms stacking their outputs into the "
                  r"batch, against ([\d.]+) ms for the native part", msg)
    calls, stack, native = map(float, m.groups())
    assert 3.0 <= calls < 30.0 and stack < 1.0, msg
    assert "in each of the 2 worker processes after the native part, whole batches in parallel" in msg
    cost = float(re.search(r"a sample takes a worker ([\d.]+) ms", msg).group(1))
    assert abs(cost - (calls + stack + native)) < 0.002, msg
    rate = int(re.search(r"about ([\d,]+) samples/s with 2 processes", msg).group(1).replace(",", ""))
    assert abs(rate - 2e3 / cost) <= 1.0, msg
    # the remedy left: C; not processes (in use), nor the GIL (not held across workers)
    assert "Remedy: a transform that compiles to C" in msg and "worker_mode=" not in msg and "GIL" not in msg


def test_the_tail_warning_with_num_workers_0_names_workers_as_the_remedy(folder):
    msg = _tail_warning(fastloader.ImageFolder(folder, transform=_tf(Slow())), num_workers=0)
    assert "With num_workers=0 it runs on the training loop's thread" in msg
    assert "Remedy: num_workers > 0, which by default (worker_mode='auto') runs it in worker processes" in msg


# ---------------------------------------------------------------------------
# resume, persistent workers, stats, other sources


def test_resume_mid_epoch_gives_the_rest_of_the_uninterrupted_epoch(folder):
    ds = fastloader.ImageFolder(folder, transform=T.Compose([T.RandomResizedCrop(16), T.ToTensor(), Affine()]))

    def loader():
        return fastloader.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, seed=1,
                                     generator=torch.Generator().manual_seed(9))

    whole = list(loader())
    dl = loader()
    it = iter(dl)
    head = [next(it) for _ in range(2)]
    state = dl.state_dict()
    del it
    dl2 = loader()
    dl2.load_state_dict(state)
    _equal(head + list(dl2), whole)
    assert dl2.stats()["worker_mode"] == "process"


def test_persistent_workers_keep_their_processes_across_epochs(folder):
    ds = fastloader.ImageFolder(folder, transform=_tf(Pid()))
    dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    epochs = [{int(x[0, 0]) for x, _ in dl} for _ in range(2)]
    assert epochs[0] == epochs[1] and len(epochs[0]) == 2


def test_stats_and_batch_transform(folder):
    ds = fastloader.ImageFolder(folder, transform=_tf(Slow()))
    dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2, batch_transform=lambda x, y: (x + 1, y))
    got = list(dl)
    ref = list(fastloader.DataLoader(ds, batch_size=4, num_workers=2, worker_mode="thread"))
    for (x, y), (rx, ry) in zip(got, ref):
        assert torch.equal(x, rx + 1) and torch.equal(y, ry)
    st = dl.stats()
    assert st["native"] is False and st["path"] == "native" and st["samples"] == len(ds) == 21
    assert st["stages_s"]["python_s"] >= 21 * 0.003 and st["stages_s"]["native_s"] > 0
    assert st["shared_memory"]["slots_written"] >= 1 and st["skipped"] == [] and st["replaced"] == []


def test_an_lmdb_opens_its_own_environment_in_each_worker_process(folder, tmp_path):
    from fastloader.tools.pack_lmdb import pack_lmdb

    pack_lmdb(folder, str(tmp_path / "train.lmdb"))
    ds = fastloader.LMDBDataset(str(tmp_path / "train.lmdb"), transform=_tf(Affine()))
    got, dl = _load(ds, num_workers=2, shuffle=True, seed=2, generator=torch.Generator().manual_seed(1))
    ref, _ = _load(fastloader.ImageFolder(folder, transform=_tf(Affine())), num_workers=0, shuffle=True, seed=2,
                   generator=torch.Generator().manual_seed(1))
    _equal(got, ref)
    assert dl.stats()["worker_mode"] == "process"


def test_pickled_for_spawn_a_dataset_opens_its_source_again(folder, tmp_path):
    from fastloader.tools.pack_lmdb import pack_lmdb

    pack_lmdb(folder, str(tmp_path / "train.lmdb"))
    for ds in (fastloader.ImageFolder(folder, transform=_tf(Affine()), target_transform=abs),
               fastloader.LMDBDataset(str(tmp_path / "train.lmdb"), transform=_tf(Affine()))):
        # what a spawned worker gets: the batch hook, bound to the dataset
        # (a spawn run took 17 s here, so the suite checks the pickle only)
        copy = pickle.loads(pickle.dumps(ds._process_batch)).__self__
        assert type(copy) is type(ds) and copy._source is not ds._source and copy._native is not ds._native
        x, y = copy.load_batch([0, 5, 20], 1, 4)
        rx, ry = ds.load_batch([0, 5, 20], 1, 4)
        assert torch.equal(x, rx) and torch.equal(y, ry) and copy.samples == ds.samples



def test_a_shard_stream_keeps_its_tail_on_threads_and_says_why(folder, tmp_path):
    from fastloader.tools.pack import pack_shards

    pack_shards(folder, str(tmp_path / "sh"), shuffle_seed=None, progress=False)
    urls = sorted(str(p) for p in (tmp_path / "sh").glob("*.tar"))
    ds = fastloader.WebDataset(urls, transform=_tf(Affine()), shuffle=0, shardshuffle=False)
    assert choose_native_mode(fastloader.DataLoader(ds, batch_size=4, num_workers=2))[0] == "thread"
    dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2, worker_mode="process")
    with pytest.warns(UserWarning, match="worker_mode='process' does not apply: WebDataset reads its shard stream "
                                         "on a reader thread of this process") as rec:
        got = list(dl)
    tail = [str(w.message) for w in rec if "runs in Python" in str(w.message)]
    assert len(tail) == 1 and "one batch at a time" in tail[0] and "Remedy: a transform that compiles to C" in tail[0]
    ref, _ = _load(fastloader.ImageFolder(folder, transform=_tf(Affine())), num_workers=0)
    _equal(got, ref)
    assert dl.stats()["worker_mode"] == "thread"


def _fake_pin_child():
    """Runs in a child on the stand-in CUDA runtime (tests/fakecuda); prints
    FAKECUDA-TAIL {json}."""
    import json
    import pathlib
    import tempfile

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    copied = []   # what is still pinned with a copy (torch's pin_memory, stubbed)
    torch.Tensor.pin_memory = lambda self, *a, **k: copied.append(list(self.shape)) or self.clone()
    torch.Tensor.is_pinned = lambda self, *a, **k: False
    ds = fastloader.ImageFolder(make_class_folder(pathlib.Path(tempfile.mkdtemp()) / "train"), transform=_tf(Affine()))
    dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True)
    it = iter(dl)
    got = [next(it)]
    ring = it._backend.engine.ring
    got += list(it)
    ref = list(fastloader.DataLoader(ds, batch_size=4, num_workers=0))
    out = {"mode": dl.stats()["worker_mode"], "pinned_slots": [ring.pinned_bytes(s) for s in range(ring.nslots)],
           "batch_bytes": 4 * 3 * 20 * 24 * 4, "copied": copied,
           "same": len(got) == len(ref) and all(torch.equal(a, c) and torch.equal(b, d)
                                                for (a, b), (c, d) in zip(got, ref))}
    print("FAKECUDA-TAIL " + json.dumps(out), flush=True)


def test_pin_memory_page_locks_the_slots_the_tail_stacks_into(tmp_path_factory):
    from helpers_fakecuda import run_test_function

    r = run_test_function(tmp_path_factory, "test_native_tail_process", "_fake_pin_child", marker="FAKECUDA-TAIL")
    assert r["mode"] == "process" and r["same"], r
    assert all(b >= r["batch_bytes"] for b in r["pinned_slots"]), r
    assert r["copied"] == [], r   # images and labels live in locked slots: nothing pinned twice
