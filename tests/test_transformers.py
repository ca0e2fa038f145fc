"""fastloader under Hugging Face transformers' Trainer: the Trainer builds
its loaders with the `DataLoader` name of transformers.trainer, so one
assignment (docs/frameworks.md) makes it build fastloader's.  The Trainer's
own defaults then run through accelerate (use_seedable_sampler=True,
skip_first_batches on a resume): the same batches as with torch's loader, a
checkpoint resumed mid-epoch gives the uninterrupted run's rest, and the
epoch's order is cut from the permutation tensor (fastloader/sampling.py)."""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate", reason="accelerate is not installed (pip install fastloader[accelerate])")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import transformers.trainer as trainer_mod  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from torch import nn  # noqa: E402

import fastloader  # noqa: E402
from fastloader import sampling  # noqa: E402

pytestmark = pytest.mark.fastloader_only


@pytest.fixture(autouse=True)
def fresh_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


class Rows(torch.utils.data.Dataset):
    """Dict samples, as a tokenized dataset gives them (the Trainer's default
    collator stacks them)."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        return {"x": torch.tensor([float(i)]), "labels": torch.tensor(i)}


class Logged(nn.Module):
    """A model that records the labels of every batch it is trained on."""

    def __init__(self, log):
        super().__init__()
        self.w = nn.Linear(1, 1)
        self.log = log

    def forward(self, x, labels):
        self.log.append(labels.tolist())
        return {"loss": self.w(x).pow(2).mean()}


def _train(out, loader_cls, monkeypatch, max_steps=-1, resume=None, num_workers=0):
    """The labels of every step of a Trainer run (3 epochs of 12 steps, a
    checkpoint every 5 steps) and the Trainer."""
    monkeypatch.setattr(trainer_mod, "DataLoader", loader_cls)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    log = []
    args = transformers.TrainingArguments(str(out), per_device_train_batch_size=4, num_train_epochs=3,
                                          max_steps=max_steps, save_strategy="steps", save_steps=5,
                                          logging_steps=1000, report_to=[], seed=7, use_cpu=True,
                                          dataloader_num_workers=num_workers, disable_tqdm=True)
    trainer = transformers.Trainer(model=Logged(log), args=args, train_dataset=Rows())
    trainer.train(resume_from_checkpoint=resume)
    return log, trainer


def test_the_trainer_gets_the_batches_torch_gives(tmp_path, monkeypatch):
    want, _ = _train(tmp_path / "torch", torch.utils.data.DataLoader, monkeypatch)
    got, trainer = _train(tmp_path / "fl", fastloader.DataLoader, monkeypatch, num_workers=2)
    assert got == want and len(got) == 36
    assert sorted(sum(got[:12], [])) == list(range(48)) and got[:12] != got[12:24]
    prepared = trainer.get_train_dataloader()
    assert type(prepared.base_dataloader) is fastloader.DataLoader
    assert sampling.seedable(prepared.base_dataloader.batch_sampler.sampler)
    assert sampling.compact(prepared.base_dataloader.batch_sampler)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_checkpoint_resumed_mid_epoch_goes_on_as_the_uninterrupted_run(tmp_path, monkeypatch, num_workers):
    """A run stopped at step 17 (epoch 1 is steps 13-24) and resumed from its
    step-15 checkpoint: the Trainer skips the epoch's first 3 batches
    (skip_first_batches) and trains on exactly the uninterrupted run's
    remaining 21 batches."""
    full, _ = _train(tmp_path / "full", fastloader.DataLoader, monkeypatch, num_workers=num_workers)
    _train(tmp_path / "cut", fastloader.DataLoader, monkeypatch, max_steps=17, num_workers=num_workers)
    assert os.path.isdir(tmp_path / "cut" / "checkpoint-15")
    rest, _ = _train(tmp_path / "cut", fastloader.DataLoader, monkeypatch,
                     resume=str(tmp_path / "cut" / "checkpoint-15"), num_workers=num_workers)
    assert rest == full[15:]


class LoggedConv(nn.Module):
    """An image model called as the Trainer calls one (pixel_values=,
    labels=) that records each batch's labels and pixel sum."""

    def __init__(self, log):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 4)
        self.log = log

    def forward(self, pixel_values, labels):
        self.log.append((labels.tolist(), round(float(pixel_values.double().sum()), 3)))
        logits = self.head(self.conv(pixel_values).mean((2, 3)))
        return {"loss": nn.functional.cross_entropy(logits, labels)}


def test_an_image_folder_trains_on_the_native_path(tmp_path, monkeypatch):
    """fastloader.ImageFolder as the Trainer's train_dataset and
    DictCollate("pixel_values", "labels") as its data_collator: the Trainer
    wraps it in RemoveColumnsCollator and hands it to the loader, which
    stays on the native batch path (no PerformanceWarning) and trains on the
    batches torch's loader gives over the same dataset."""
    import warnings

    from fastloader import transforms as FT
    from fastloader.tools.sample import make_sample

    root = tmp_path / "data"
    make_sample(str(root), n=32, classes=4, progress=False, processes=1)
    ds = fastloader.ImageFolder(str(root), transform=FT.Compose([FT.Resize(36), FT.CenterCrop(32), FT.ToTensor(),
                                                                  FT.Normalize([0.5] * 3, [0.25] * 3)]))
    runs = {}
    for loader_cls in (torch.utils.data.DataLoader, fastloader.DataLoader):
        monkeypatch.setattr(trainer_mod, "DataLoader", loader_cls)
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        log = []
        args = transformers.TrainingArguments(str(tmp_path / loader_cls.__module__), per_device_train_batch_size=8,
                                              num_train_epochs=2, save_strategy="no", report_to=[], seed=3,
                                              use_cpu=True, disable_tqdm=True, logging_steps=1000,
                                              dataloader_num_workers=2 if loader_cls is fastloader.DataLoader else 0)
        trainer = transformers.Trainer(model=LoggedConv(log), args=args, train_dataset=ds,
                                       data_collator=fastloader.DictCollate("pixel_values", "labels"))
        with warnings.catch_warnings():
            warnings.simplefilter("error", fastloader.PerformanceWarning)
            trainer.train()
        runs[loader_cls] = log
        if loader_cls is fastloader.DataLoader:
            base = trainer.get_train_dataloader().base_dataloader
            assert type(base) is fastloader.DataLoader and type(base.collate_fn).__name__ == "RemoveColumnsCollator"
            list(base)
            assert base.stats()["path"] == "native"
    assert len(runs[fastloader.DataLoader]) == 8
    assert runs[fastloader.DataLoader] == runs[torch.utils.data.DataLoader]
