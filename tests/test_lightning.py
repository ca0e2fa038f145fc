"""fastloader under Lightning: Trainer.fit on one CPU device and with DDP on
two CPU processes (gloo), where Lightning rebuilds the loader with a
DistributedSampler from its arguments."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning", reason="lightning is not installed (pip install fastloader[lightning])")

import lightning.pytorch as pl  # noqa: E402
from lightning.fabric.utilities.data import _replace_dunder_methods  # noqa: E402
from lightning.pytorch.utilities.data import _update_dataloader  # noqa: E402
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402
from torch.utils.data import DistributedSampler, Sampler  # noqa: E402

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
from fastloader.tools.sample import make_sample  # noqa: E402

pytestmark = pytest.mark.fastloader_only
TF = FT.Compose([FT.RandomResizedCrop(32), FT.RandomHorizontalFlip(), FT.ToTensor()])


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("pl") / "data"
    make_sample(str(root), n=24, classes=3, seed=5, progress=False, processes=1)
    return root


def _image_list(root):
    """The sample images with label = index, so a batch's labels name its samples."""
    paths = [p for p, _ in fastloader.ImageFolder(str(root), transform=TF).samples]
    return fastloader.ImageList(paths, labels=range(len(paths)), transform=TF)


@pytest.mark.parametrize("made_in_hook", [False, True])
def test_rebuilt_with_a_distributed_sampler_keeps_fastloaders_arguments(images, made_in_hook):
    """What Lightning does under DDP: rebuild the loader from its arguments
    (saved by its __init__ hook when the loader is made in a *_dataloader
    hook, else read back from its attributes) with a DistributedSampler.
    The rebuilt loader is fastloader's with seed=, max_memory=,
    num_workers and the rest as given."""
    ds = _image_list(images)
    kw = dict(batch_size=4, shuffle=True, num_workers="auto", seed=7, max_memory=1 << 30, convert_on_device=True)
    if made_in_hook:
        with _replace_dunder_methods(TorchDataLoader, "dataset"):
            dl = fastloader.DataLoader(ds, **kw)
    else:
        dl = fastloader.DataLoader(ds, **kw)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=0)
    new = _update_dataloader(dl, sampler)
    assert type(new) is fastloader.DataLoader and new is not dl
    assert (new.seed, new._fl_seed, new.max_memory, new._fl_max_memory) == (7, 7, 1 << 30, 1 << 30)
    assert new.convert_on_device and new._fl_convert_on_device
    assert (new.num_workers, new.batch_size, new.sampler) == (dl.num_workers, 4, sampler)
    # "auto" itself (the controller) survives only through the saved arguments;
    # read back from the attributes it is the count it resolved to
    assert new._fl_auto == made_in_hook
    ys = [y for _, y in new]
    assert torch.cat(ys).tolist() == list(sampler) and len(ys) == 3


class Recorder(pl.LightningModule):
    """Trains a linear layer on the batches and keeps what it saw."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3 * 32 * 32, 2)
        self.seen = []   # per epoch: [(images, labels)]

    def on_train_epoch_start(self):
        self.seen.append([])

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen[-1].append((x.clone(), y.clone()))
        return self.layer(x.flatten(1)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class EpochSampler(Sampler):
    """Sequential, rotated by the epoch set_epoch last gave."""

    def __init__(self, n):
        self.n, self.epochs = n, []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        e = self.epochs[-1] if self.epochs else 0
        return iter([(i + 5 * e) % self.n for i in range(self.n)])

    def __len__(self):
        return self.n


def test_fit_on_one_cpu_device(images, tmp_path):
    """Lightning uses the loader as given (fastloader's), calls set_epoch on
    its sampler each epoch, and the module trains on the native pipeline's
    batches, equal to a direct load with the same seed and epoch."""
    ds = _image_list(images)
    sampler = EpochSampler(len(ds))
    dl = fastloader.DataLoader(ds, batch_size=5, sampler=sampler, num_workers=2, seed=7)
    model = Recorder()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(model, train_dataloaders=dl)
    assert trainer.train_dataloader is dl
    assert sampler.epochs[:2] == [0, 1]
    assert dl.stats()["path"] == "native"
    assert len(model.seen) == 2 and all(len(e) == 5 for e in model.seen)
    for epoch, batches in enumerate(model.seen):
        labels = torch.cat([y for _, y in batches]).tolist()
        assert labels == [(i + 5 * epoch) % 24 for i in range(24)]
        for x, y in batches:
            want, _ = ds.load_batch(y.tolist(), epoch=epoch, seed=7)
            assert torch.equal(x, want)


SCRIPT = textwrap.dedent("""
    import sys, torch, warnings
    import lightning.pytorch as pl
    import fastloader
    from fastloader import transforms as FT

    class Recorder(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3 * 32 * 32, 2)
            self.seen = []

        def on_train_epoch_start(self):
            self.seen.append([])

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen[-1].append((x.clone(), y.clone()))
            return self.layer(x.flatten(1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    warnings.filterwarnings("ignore")
    root, out = sys.argv[1], sys.argv[2]
    tf = FT.Compose([FT.RandomResizedCrop(32), FT.RandomHorizontalFlip(), FT.ToTensor()])
    paths = [p for p, _ in fastloader.ImageFolder(root, transform=tf).samples]
    ds = fastloader.ImageList(paths, labels=range(len(paths)), transform=tf)
    dl = fastloader.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, seed=7)
    model = Recorder()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=out)
    trainer.fit(model, train_dataloaders=dl)
    used = trainer.train_dataloader
    torch.save({"type": type(used).__name__, "seed": used.seed, "sampler": type(used.sampler).__name__,
                "rebuilt": used is not dl, "path": used.stats()["path"],
                "seen": [(torch.cat([x for x, _ in e]), torch.cat([y for _, y in e]), len(e)) for e in model.seen]},
               f"{out}/rank{trainer.global_rank}.pt")
""")


def test_fit_with_ddp_on_two_cpu_processes(images, tmp_path):
    """Trainer(strategy="ddp", devices=2, accelerator="cpu") launches a second
    process and rebuilds the loader with a DistributedSampler: it stays
    fastloader's (seed= kept), the ranks' shares are disjoint and cover the
    data with equal batch counts, each epoch's order is the sampler's after
    set_epoch(epoch), and every sample's augmentation equals a
    single-process load with the same seed and epoch."""
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(fastloader.__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([pkg_parent, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script), str(images), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=180, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    ref = _image_list(images)
    for r in ranks:
        assert (r["type"], r["seed"], r["sampler"], r["rebuilt"], r["path"]) == (
            "DataLoader", 7, "DistributedSampler", True, "native")
    for epoch in range(2):
        (x0, y0, n0), (x1, y1, n1) = ranks[0]["seen"][epoch], ranks[1]["seen"][epoch]
        assert n0 == n1 == 3
        assert not set(y0.tolist()) & set(y1.tolist())
        assert sorted(y0.tolist() + y1.tolist()) == list(range(24))
        for rank, (x, y) in enumerate(((x0, y0), (x1, y1))):
            sampler = DistributedSampler(range(24), num_replicas=2, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            assert y.tolist() == list(sampler)
            want, _ = ref.load_batch(y.tolist(), epoch=epoch, seed=7)
            assert torch.equal(x, want)
