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
