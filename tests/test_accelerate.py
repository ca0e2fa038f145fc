"""fastloader under Hugging Face accelerate (fastloader/accelerate_hook.py):
accelerator.prepare keeps a fastloader.DataLoader a fastloader.DataLoader,
sharded exactly as accelerate shards torch's."""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate",
                                 reason="accelerate is not installed (pip install fastloader[accelerate])")

import accelerate.accelerator as acc_mod  # noqa: E402
import accelerate.data_loader as adl  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from torch.utils.data import Dataset, Sampler  # noqa: E402

import fastloader  # noqa: E402
from fastloader import accelerate_hook  # noqa: E402
from fastloader import sampling  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
from fastloader.tools.sample import make_sample  # noqa: E402
from helpers_distributed import child_env, free_port  # noqa: E402

pytestmark = pytest.mark.fastloader_only
TF = FT.Compose([FT.RandomResizedCrop(32), FT.RandomHorizontalFlip(), FT.ToTensor()])


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test gets its own Accelerator state (accelerate keeps it per process)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("acc") / "data"
    make_sample(str(root), n=24, classes=3, seed=5, progress=False, processes=1)
    return root


def _image_list(root):
    """The sample images with label = index, so a batch's labels name its samples."""
    paths = [p for p, _ in fastloader.ImageFolder(str(root), transform=TF).samples]
    return fastloader.ImageList(paths, labels=range(len(paths)), transform=TF)


class Indices(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _batches(loader):
    return [b.tolist() if torch.is_tensor(b) else b for b in loader]


def _state_after(loader, k):
    """The first k batches of a fresh epoch of `loader` and its state_dict()
    then, the epoch's iterator dropped."""
    it = iter(loader)
    seen = [next(it).tolist() for _ in range(k)]
    return seen, loader.state_dict()


def test_accelerate_names_are_wrapped_once():
    """The hook wrapped accelerate.data_loader's functions and every name
    accelerate imported them under, once; install() again changes nothing,
    and after accelerate was imported it rebinds the names too."""
    assert adl.prepare_data_loader._fastloader_wrapped
    assert acc_mod.prepare_data_loader is adl.prepare_data_loader
    assert accelerate.skip_first_batches is adl.skip_first_batches is acc_mod.skip_first_batches
    assert not any(isinstance(f, accelerate_hook._ImportHook) for f in sys.meta_path)
    wrapped = adl.prepare_data_loader, adl.skip_first_batches
    fastloader.accelerate_hook.install()
    assert (adl.prepare_data_loader, adl.skip_first_batches) == wrapped
    # accelerate imported first, fastloader second: install() patches at once
    originals = [f.__wrapped__ for f in wrapped]
    try:
        for mod in (adl, acc_mod, accelerate):
            for f, o in zip(wrapped, originals):
                if getattr(mod, f.__name__, None) is f:
                    setattr(mod, f.__name__, o)
        assert acc_mod.prepare_data_loader is originals[0]
        accelerate_hook.install()
        assert acc_mod.prepare_data_loader is adl.prepare_data_loader is not originals[0]
        assert adl.prepare_data_loader.__wrapped__ is originals[0]
        assert accelerate.skip_first_batches is adl.skip_first_batches is not originals[1]
    finally:
        accelerate_hook.install()   # wrapped again whatever happened above


def test_import_fastloader_leaves_accelerate_alone_then_hooks_it():
    """import fastloader imports no accelerate; importing accelerate later
    goes through the one-shot hook, which then leaves sys.meta_path."""
    code = textwrap.dedent("""
        import sys
        import fastloader
        assert "accelerate" not in sys.modules
        from accelerate import Accelerator
        import accelerate, accelerate.accelerator as a, accelerate.data_loader as d
        assert d.prepare_data_loader._fastloader_wrapped and a.prepare_data_loader is d.prepare_data_loader
        assert accelerate.skip_first_batches is d.skip_first_batches
        assert not any(type(f).__name__ == "_ImportHook" for f in sys.meta_path)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(fastloader.__file__))))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_prepare_keeps_the_native_pipeline(images):
    """accelerator.prepare returns accelerate's DataLoaderShard around a
    fastloader.DataLoader: isinstance holds, batches come from the native
    path and equal the bare loader's, seed= and num_workers are kept."""
    ds = _image_list(images)
    bare = fastloader.DataLoader(ds, batch_size=5, num_workers=2, seed=7)
    ref = [(x, y) for x, y in bare]
    dl = fastloader.DataLoader(ds, batch_size=5, num_workers=2, seed=7)
    acc = Accelerator(cpu=True)
    model, prepared = acc.prepare(torch.nn.Linear(2, 2), dl)
    assert isinstance(prepared, adl.DataLoaderShard) and isinstance(prepared, fastloader.DataLoader)
    inner = prepared.base_dataloader
    assert type(inner) is fastloader.DataLoader and inner is not dl
    assert (inner.num_workers, inner.seed, len(prepared)) == (2, 7, len(bare))
    got = list(prepared)
    assert len(got) == len(ref)
    for (x, y), (rx, ry) in zip(got, ref):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    assert inner.stats()["path"] == "native"


@pytest.mark.parametrize("split_batches,even_batches,drop_last", [
    (False, True, False), (False, False, False), (True, True, False), (False, True, True), (True, False, True)])
def test_sharding_equals_accelerates_own(split_batches, even_batches, drop_last):
    """For each process of 2, the batches of a prepared fastloader loader
    are those accelerate gives for torch's loader: the same shard, padding
    (even_batches) and batch split (split_batches)."""
    ds = Indices(21)
    for rank in range(2):
        kw = dict(num_processes=2, process_index=rank, split_batches=split_batches, even_batches=even_batches)
        ref = adl.prepare_data_loader(torch.utils.data.DataLoader(ds, batch_size=4, drop_last=drop_last), **kw)
        got = adl.prepare_data_loader(fastloader.DataLoader(ds, batch_size=4, drop_last=drop_last,
                                                            num_workers=2), **kw)
        assert type(got.base_dataloader) is fastloader.DataLoader
        assert type(got.batch_sampler) is adl.BatchSamplerShard
        assert _batches(got) == _batches(ref) and len(got) == len(ref)


@pytest.mark.parametrize("seedable", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffled_sharding_equals_accelerates_own_without_the_index_list(num_workers, seedable):
    """shuffle=True on 2 processes: every rank draws the whole epoch's order
    and keeps its own batches.  A prepared fastloader loader gives accelerate's
    batches over two epochs, its BatchSamplerShard's batches cut from the
    permutation tensor (sampling.batches), not from torch's list of every
    index; with use_seedable_sampler=True (transformers' Trainer) too."""
    ds = Indices(50)
    for rank in range(2):
        runs = []
        for make in (torch.utils.data.DataLoader, lambda *a, **k: fastloader.DataLoader(*a, num_workers=num_workers,
                                                                                          **k)):
            torch.manual_seed(0)
            prepared = adl.prepare_data_loader(make(ds, batch_size=4, shuffle=True), num_processes=2,
                                               process_index=rank, use_seedable_sampler=seedable)
            runs.append(_batches(prepared) + _batches(prepared))
        assert sampling.compact(prepared.batch_sampler)
        assert sampling.seedable(prepared.batch_sampler.batch_sampler.sampler) is seedable
        assert runs[1] == runs[0] and runs[0] != sorted(runs[0])


@pytest.mark.parametrize("sampler", ["shuffle", "distributed", "seedable"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_shuffled_shard_resumes_mid_epoch_in_a_later_epoch(sampler, num_workers):
    """prepared.state_dict() mid-epoch (accelerate's, taken before its
    one-batch look-ahead, from the fastloader loader inside), loaded into a
    loader prepared afresh: the rest of the epoch is the uninterrupted run's,
    in the first epoch and in a later one, where the sampler's generator (or
    the DistributedSampler's epoch) has moved on.  The state must reach the
    sampler under accelerate's BatchSamplerShard (state.py `_under`); before
    it did, a resume in the second epoch redrew the order: samples repeated
    and others skipped, silently.  accelerate's SeedableRandomSampler
    (use_seedable_sampler=True) reseeds from its epoch at every epoch's
    start: its epoch and seed are what the state keeps (before, a resume
    in the second epoch failed on the generator it had made itself)."""
    ds = Indices(60)

    def make():
        torch.manual_seed(0)
        kw = (dict(sampler=torch.utils.data.DistributedSampler(ds, num_replicas=1, rank=0, seed=3))
              if sampler == "distributed" else dict(shuffle=True))
        return adl.prepare_data_loader(fastloader.DataLoader(ds, batch_size=4, num_workers=num_workers, **kw),
                                       num_processes=2, process_index=0, use_seedable_sampler=sampler == "seedable")

    full = make()
    ref = [_batches(full) for _ in range(4)]
    assert ref[0] != ref[1]
    for epoch in (0, 1, 2):
        loader = make()
        for _ in range(epoch):
            _batches(loader)
        seen, state = _state_after(loader, 3)
        again = make()
        again.load_state_dict(state)
        assert seen + _batches(again) == ref[epoch], epoch
        if sampler == "shuffle":   # the generator goes on from there (accelerate restarts its own epoch count)
            assert _batches(again) == ref[epoch + 1]
        else:   # the epoch is accelerate's count, restarted at 0: set as transformers' Trainer sets it
            again.set_epoch(epoch + 1)
            assert _batches(again) == ref[epoch + 1]


def test_split_batches_refuses_what_accelerate_refuses():
    with pytest.raises(ValueError, match="round multiple"):
        adl.prepare_data_loader(fastloader.DataLoader(Indices(8), batch_size=3), num_processes=2,
                                process_index=0, split_batches=True)


class RecordingSampler(Sampler):
    def __init__(self, n):
        self.n, self.epochs = n, []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        e = self.epochs[-1] if self.epochs else 0
        return iter([(i + e) % self.n for i in range(self.n)])

    def __len__(self):
        return self.n


def test_set_epoch_reaches_the_sampler():
    """accelerate calls set_epoch(iteration) at each epoch, and the user's
    prepared.set_epoch(e), on the sampler the fastloader loader draws from."""
    sampler = RecordingSampler(8)
    prepared = adl.prepare_data_loader(fastloader.DataLoader(Indices(8), batch_size=2, sampler=sampler,
                                                             num_workers=2), num_processes=2, process_index=1)
    first = _batches(prepared)
    second = _batches(prepared)
    assert sampler.epochs == [0, 1]
    assert first == [[2, 3], [6, 7]] and second == [[3, 4], [7, 0]]
    prepared.set_epoch(5)
    assert sampler.epochs[-1] == 5 and _batches(prepared)[0] == [7, 0]


def test_dispatch_batches_is_honoured(images):
    """dispatch_batches=True: a DataLoaderDispatcher whose loader is
    fastloader's, the same batches as the bare loader (one process)."""
    ds = _image_list(images)
    ref = list(fastloader.DataLoader(ds, batch_size=6, num_workers=2, seed=3))
    prepared = adl.prepare_data_loader(fastloader.DataLoader(ds, batch_size=6, num_workers=2, seed=3),
                                       torch.device("cpu"), put_on_device=True, dispatch_batches=True)
    assert isinstance(prepared, adl.DataLoaderDispatcher)
    assert type(prepared.base_dataloader) is fastloader.DataLoader
    got = list(prepared)
    assert len(got) == len(ref) and all(torch.equal(a[0], b[0]) for a, b in zip(got, ref))


def test_skip_first_batches_stays_fastloader(images):
    ds = _image_list(images)
    acc = Accelerator(cpu=True)
    prepared = acc.prepare(fastloader.DataLoader(ds, batch_size=4, num_workers=2, seed=1))
    ref = [y.tolist() for _, y in prepared]
    skipped = acc.skip_first_batches(prepared, 2)
    assert type(skipped.base_dataloader) is fastloader.DataLoader and skipped.base_dataloader.seed == 1
    assert [y.tolist() for _, y in skipped] == ref[2:]
    bare = adl.skip_first_batches(fastloader.DataLoader(ds, batch_size=4), 5)
    assert type(bare) is fastloader.DataLoader and [y.tolist() for _, y in bare] == ref[5:]


def test_hf_image_dataset_is_sharded_natively(images):
    """A fastloader.HFImageDataset (an Arrow image column) through
    prepare_data_loader: accelerate's shard, fastloader's native path, the
    same pixels as the unprepared loader's batches for those indices."""
    hfds = pytest.importorskip("datasets", reason="datasets is not installed (pip install fastloader[datasets])")
    paths = [p for p, _ in fastloader.ImageFolder(str(images), transform=TF).samples]
    hf = hfds.Dataset.from_dict({"image": [open(p, "rb").read() for p in paths], "label": list(range(len(paths)))},
                                features=hfds.Features({"image": hfds.Image(), "label": hfds.Value("int64")}))
    ds = fastloader.HFImageDataset(hf, image_column="image", label_column="label", transform=TF)
    ref = {int(i): x for xs, ys in fastloader.DataLoader(ds, batch_size=4, seed=2) for x, i in zip(xs, ys)}
    prepared = adl.prepare_data_loader(fastloader.DataLoader(ds, batch_size=4, num_workers=2, seed=2),
                                       num_processes=2, process_index=1)
    got = [(x, y) for x, y in prepared]
    assert prepared.base_dataloader.stats()["path"] == "native"
    assert [y.tolist() for _, y in got] == [[4, 5, 6, 7], [12, 13, 14, 15], [20, 21, 22, 23]]
    assert all(torch.equal(x[k], ref[int(y[k])]) for x, y in got for k in range(len(y)))


@pytest.fixture(scope="module")
def shards(images, tmp_path_factory):
    from fastloader.tools.pack import pack_shards

    out = tmp_path_factory.mktemp("acc-shards")
    pack_shards(str(images), str(out), shard_size=4000, shuffle_seed=None, progress=False)
    urls = sorted(str(p) for p in out.glob("*.tar"))
    assert len(urls) >= 2
    return urls


def test_webdataset_keeps_its_own_rank_share(shards):
    """A WebDataset already deals its shards out by rank: accelerate's
    IterableDatasetShard is not put on top of it, so each process reads
    its own stream natively and the two cover the data once."""
    seen = []
    for rank in range(2):
        ds = fastloader.WebDataset(shards, transform=TF, rank=rank, world_size=2, shuffle=0)
        prepared = adl.prepare_data_loader(fastloader.DataLoader(ds, batch_size=4, num_workers=2),
                                           num_processes=2, process_index=rank)
        assert prepared.base_dataloader.dataset is ds
        labels = [y for _, y in prepared]
        assert prepared.base_dataloader.stats()["path"] == "native"
        seen.append(torch.cat(labels))
    assert len(seen[0]) == len(seen[1]) == 12


def test_webdataset_refuses_dispatch_and_a_wrong_rank(shards):
    ds = fastloader.WebDataset(shards, transform=TF, rank=0, world_size=2)
    with pytest.raises(ValueError, match="dispatch_batches=False"):
        adl.prepare_data_loader(fastloader.DataLoader(ds, batch_size=4), torch.device("cpu"), num_processes=2,
                                process_index=0, put_on_device=True, dispatch_batches=True)
    with pytest.raises(ValueError, match="built for rank 0 of 2, but accelerate runs process 1 of 2"):
        adl.prepare_data_loader(fastloader.DataLoader(ds, batch_size=4), num_processes=2, process_index=1)


def test_a_structure_it_does_not_know_is_left_with_one_warning():
    """What the swap cannot recognise stays as accelerate made it, and one
    warning says torch's loader is in use and what to do."""
    made = []

    def fake_prepare(dataloader, device=None, num_processes=None, process_index=None, split_batches=False,
                     put_on_device=False, use_stateful_dataloader=False):
        class Wrapper:   # no base_dataloader
            pass
        made.append(Wrapper())
        return made[-1]

    wrapped = accelerate_hook._wrap_prepare(fake_prepare)
    accelerate_hook._warned.clear()
    with pytest.warns(fastloader.PerformanceWarning, match="not from fastloader.s workers"):
        assert wrapped(fastloader.DataLoader(Indices(4))) is made[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped(fastloader.DataLoader(Indices(4)))     # once only
        plain = torch.utils.data.DataLoader(Indices(4))
        assert wrapped(plain) is made[-1]              # torch loaders are not touched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_is_fastloaders_copy(images):
    """On a CUDA accelerator the fastloader loader delivers to the device
    itself (device=), and accelerate's per-batch move is off."""
    acc = Accelerator()
    prepared = acc.prepare(fastloader.DataLoader(_image_list(images), batch_size=4, num_workers=2))
    assert prepared.device is None and prepared.base_dataloader.device == acc.device
    x, y = next(iter(prepared))
    assert x.device == acc.device and prepared.base_dataloader.stats()["device"]


SCRIPT = textwrap.dedent("""
    import sys, torch
    import fastloader
    from fastloader import transforms as FT
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader

    root, out = sys.argv[1], sys.argv[2]
    acc = Accelerator(cpu=True)
    tf = FT.Compose([FT.RandomResizedCrop(32), FT.RandomHorizontalFlip(), FT.ToTensor()])
    paths = [p for p, _ in fastloader.ImageFolder(root, transform=tf).samples]
    ds = fastloader.ImageList(paths, labels=range(len(paths)), transform=tf)
    model = torch.nn.Linear(3 * 32 * 32, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = fastloader.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, seed=7)
    model, opt, train = acc.prepare(model, opt, train)
    res = {"fastloader": isinstance(train, fastloader.DataLoader), "len": len(train), "epochs": []}
    for epoch in range(2):
        xs, ys = [], []
        for x, y in train:
            acc.backward(model(x.flatten(1)).sum())
            opt.step()
            opt.zero_grad()
            xs.append(x)
            ys.append(y)
        res["epochs"].append((torch.cat(xs), torch.cat(ys), len(xs)))
    # evaluation: 22 samples do not split evenly; gather_for_metrics drops the padding
    ev = acc.prepare(fastloader.DataLoader(torch.utils.data.Subset(ds, range(22)), batch_size=4, num_workers=2))
    res["eval"] = torch.cat([acc.gather_for_metrics(y) for _, y in ev]).tolist()
    # dispatch_batches: process 0 loads, every process gets its slice
    d = prepare_data_loader(fastloader.DataLoader(ds, batch_size=4, num_workers=2, seed=7), acc.device,
                            put_on_device=True, dispatch_batches=True)
    res["dispatch"] = (type(d.base_dataloader).__name__, d.base_dataloader.num_workers, [y.tolist() for _, y in d])
    torch.save(res, f"{out}/rank{acc.process_index}.pt")
    acc.wait_for_everyone()
    acc.end_training()
""")


def test_two_processes_with_gloo(images, tmp_path):
    """Two CPU processes (gloo) through accelerator.prepare: each trains on
    fastloader batches, the shards are disjoint and cover the data with equal
    batch counts, each sample's augmentation equals a single-process load
    with the same seed and epoch, gather_for_metrics returns each evaluation
    sample once, and dispatch_batches loads on process 0 only."""
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = child_env(MASTER_PORT=port, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, str(script), str(images), str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0])
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    ref = _image_list(images)
    for r in ranks:
        assert r["fastloader"] and r["len"] == 3
    for epoch in range(2):
        (x0, y0, n0), (x1, y1, n1) = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert n0 == n1 == 3
        assert not set(y0.tolist()) & set(y1.tolist())
        assert sorted(y0.tolist() + y1.tolist()) == list(range(24))
        for x, y in ((x0, y0), (x1, y1)):
            want, _ = ref.load_batch(y.tolist(), epoch=epoch, seed=7)
            assert torch.equal(x, want)
    assert ranks[0]["epochs"][0][1].tolist() != ranks[0]["epochs"][1][1].tolist()   # reshuffled
    for r in ranks:
        assert sorted(r["eval"]) == list(range(22))
    (t0, w0, d0), (t1, w1, d1) = ranks[0]["dispatch"], ranks[1]["dispatch"]
    assert t0 == t1 == "DataLoader" and (w0, w1) == (2, 0)
    assert sorted(sum(d0, []) + sum(d1, [])) == list(range(24))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_seedable_sampler_resumes_between_and_within_epochs(num_workers):
    """accelerate's SeedableRandomSampler under a fastloader loader of its
    own (no prepare): it moves its epoch on when an epoch's order runs out.
    A state taken after an epoch's StopIteration, or mid-epoch, loaded into
    a loader built afresh (its sampler at epoch 0, with another data_seed),
    goes on as the uninterrupted run, the epochs after it included."""
    ds = Indices(30)

    def make(seed=5):
        sampler = adl.SeedableRandomSampler(ds, data_seed=seed)
        return fastloader.DataLoader(ds, batch_sampler=torch.utils.data.BatchSampler(sampler, 4, False),
                                     num_workers=num_workers)

    full = make()
    ref = [_batches(full) for _ in range(4)]
    assert len({str(r) for r in ref}) == 4
    for epoch in (0, 1):
        loader = make()
        for _ in range(epoch + 1):
            _batches(loader)
        state = loader.state_dict()
        assert state["finished"]
        again = make(seed=99)
        again.load_state_dict(state)
        assert [_batches(again) for _ in range(2)] == ref[epoch + 1:epoch + 3], epoch

        loader = make()
        for _ in range(epoch):
            _batches(loader)
        seen, state = _state_after(loader, 2)
        again = make(seed=99)
        again.load_state_dict(state)
        assert seen + _batches(again) == ref[epoch], epoch
        assert _batches(again) == ref[epoch + 1], epoch


def test_trainers_resume_path_with_a_seedable_sampler(tmp_path):
    """What transformers' Trainer does with use_seedable_sampler=True:
    set_epoch at every epoch, accelerator.save_state mid-epoch; in a fresh
    run prepare, load_state (which puts the pickled SeedableRandomSampler
    back), set_epoch and skip_first_batches.  The rest of the epoch and the
    next one are those of the uninterrupted run, as with torch's loader."""
    from accelerate.utils import DataLoaderConfiguration

    def make(loader_cls):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
        torch.manual_seed(0)
        kw = dict(num_workers=2) if loader_cls is fastloader.DataLoader else {}
        return acc, acc.prepare(loader_cls(Indices(40), batch_size=4, shuffle=True, **kw))

    runs = {}
    for loader_cls in (torch.utils.data.DataLoader, fastloader.DataLoader):
        acc, dl = make(loader_cls)
        ref = []
        for e in range(3):
            dl.set_epoch(e)
            ref.append(_batches(dl))
        acc, dl = make(loader_cls)
        assert sampling.seedable(dl.batch_sampler.sampler)
        dl.set_epoch(0)
        _batches(dl)
        dl.set_epoch(1)
        it = iter(dl)
        seen = [next(it).tolist() for _ in range(3)]
        acc.save_state(str(tmp_path / loader_cls.__module__))
        del it
        acc, dl = make(loader_cls)
        acc.load_state(str(tmp_path / loader_cls.__module__))
        dl.set_epoch(1)
        skipped = acc.skip_first_batches(dl, 3)
        if loader_cls is fastloader.DataLoader:   # the skipped epoch's order cut from the tensor too
            assert sampling.compact(skipped.base_dataloader.batch_sampler)
        rest = _batches(skipped)
        dl.set_epoch(2)
        assert seen + rest == ref[1] and _batches(dl) == ref[2], loader_cls
        runs[loader_cls] = ref
    assert runs[fastloader.DataLoader] == runs[torch.utils.data.DataLoader]


@pytest.mark.parametrize("seedable", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_skipped_epoch_resumes_from_its_state(seedable, num_workers):
    """skip_first_batches around a prepared shuffled loader (the epoch a
    Trainer resumes in, its order cut from the tensor under accelerate's
    SkipBatchSampler and shard): its state_dict() mid-way, loaded into the
    same construction afresh, into one with a smaller skip or into one with
    none, gives the rest of the uninterrupted epoch (the state counts the
    skipped batches); one that skips past the saved place is refused."""
    def make():
        torch.manual_seed(0)
        return adl.prepare_data_loader(fastloader.DataLoader(Indices(60), batch_size=4, shuffle=True,
                                                             num_workers=num_workers),
                                       num_processes=2, process_index=0, use_seedable_sampler=seedable)

    full = make()
    ref = [_batches(full) for _ in range(2)]

    def skipped(skip=3):
        loader = make()
        _batches(loader)
        if not skip:
            loader.set_epoch(1)
            return loader
        sk = adl.skip_first_batches(loader, skip)
        sk.set_epoch(1)
        assert sampling.compact(sk.base_dataloader.batch_sampler)
        return sk

    sk = skipped()
    seen, state = _state_after(sk, 2)
    assert seen == ref[1][3:5]
    for skip in (3, 1, 0, 5):
        again = skipped(skip)
        again.load_state_dict(state)
        assert seen + _batches(again) == ref[1][3:], skip
    again = skipped(6)
    again.load_state_dict(state)
    with pytest.raises(ValueError, match=r"2 batches into an epoch that skipped 3 .* this loader skips 6"):
        _batches(again)


def test_a_seedable_subclass_resumes_by_its_epoch():
    """A subclass of accelerate's SeedableRandomSampler that keeps its
    `__iter__` is iterated as it is (not cut), and its state is still its
    epoch and seed: a resume in its second epoch, built afresh, is exact."""
    class Mine(adl.SeedableRandomSampler):
        pass

    ds = Indices(30)

    def make():
        return fastloader.DataLoader(ds, batch_sampler=torch.utils.data.BatchSampler(Mine(ds, data_seed=5), 4, False))

    full = make()
    ref = [_batches(full) for _ in range(3)]
    assert not sampling.compact(full.batch_sampler) and sampling.seedable_order(full.batch_sampler.sampler)
    loader = make()
    _batches(loader)
    seen, state = _state_after(loader, 2)
    assert state["sampler"]["seedable"] == [1, 5] and state["sampler"]["rngs"] == []
    again = make()
    again.load_state_dict(state)
    assert seen + _batches(again) == ref[1] and _batches(again) == ref[2]


def test_a_seedable_state_and_loader_must_match():
    """A state without the seedable sampler's epoch (another sampler's, or
    one fastloader saved before it kept that epoch) is refused by a loader
    over that sampler, and a state with it by a loader without it: neither
    could put the order back in place."""
    ds = Indices(30)

    def make(seedable):
        sampler = adl.SeedableRandomSampler(ds, data_seed=5) if seedable else torch.utils.data.RandomSampler(ds)
        return fastloader.DataLoader(ds, batch_sampler=torch.utils.data.BatchSampler(sampler, 4, False))

    for seedable in (True, False):
        loader = make(seedable)
        state = _state_after(loader, 1)[1]
        again = make(not seedable)
        again.load_state_dict(state)
        with pytest.raises(ValueError, match="SeedableRandomSampler"):
            _batches(again)
    loader = make(True)
    state = _state_after(loader, 1)[1]
    del state["sampler"]["seedable"]   # as a fastloader that kept only the generator saved it
    again = make(True)
    again.load_state_dict(state)
    with pytest.raises(ValueError, match="does not hold that epoch"):
        _batches(again)
