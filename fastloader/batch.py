"""The batch stage: MixUp / CutMix on whole batches, natively.

``fastloader.DataLoader(..., batch_transform=mixup_cutmix)`` applies
``mixup_cutmix`` to every batch before it is yielded (and before the copy
to the GPU), the way torchvision's references/classification/train.py
applies it in its collate_fn::

    mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=1000),
                                    v2.CutMix(alpha=1.0, num_classes=1000)])
    loader = fastloader.DataLoader(dataset, batch_size=64, shuffle=True,
                                   batch_transform=mixup_cutmix)
    for images, soft_labels in loader: ...

torchvision v2 ``MixUp``, ``CutMix`` and ``RandomChoice`` of them (index
labels, the default labels_getter, a float32 CHW batch) run in C
(csrc/image/mix.c) with the GIL released, drawn from the counter RNG keyed by
(seed, epoch, batch number): the same batches for any num_workers, the
distributions torchvision's.  Anything else is called as
``batch_transform(images, labels)`` (or ``batch_transform(batch)`` when the
batch is not a pair) in the loop's thread, with torch's semantics.

The collate_fn spelling (``collate_fn=lambda b: mixup_cutmix(*default_collate(b))``)
still works, but a custom collate_fn takes a native dataset off its native
batch path; ``batch_transform`` keeps it there.
"""
from __future__ import annotations

from typing import Any

_MIXUP, _CUTMIX = 0, 1   # csrc/image/mix.h FL_MIX_*


def _one(t: Any) -> tuple[int, float, int] | None:
    """(kind, alpha, num_classes) for a torchvision v2 MixUp / CutMix with
    the default labels getter, else None."""
    mod = type(t).__module__
    name = type(t).__name__
    if not mod.startswith("torchvision.transforms.v2") or name not in ("MixUp", "CutMix"):
        return None
    getter = getattr(t, "_labels_getter", None)
    if getattr(getter, "__name__", "") != "_find_labels_default_heuristic" or t.num_classes is None:
        return None
    return (_MIXUP if name == "MixUp" else _CUTMIX, float(t.alpha), int(t.num_classes))


def compile_batch_transform(t: Any) -> dict | None:
    """The native spec (csrc/binding/py_mix.c) for a batch transform, or
    None when it runs in Python."""
    if t is None:
        return None
    one = _one(t)
    if one is not None:
        return dict(kinds=[one[0]], alphas=[one[1]], p=[1.0], num_classes=one[2])
    if type(t).__module__.startswith("torchvision.transforms.v2") and type(t).__name__ == "RandomChoice":
        parts = [_one(x) for x in t.transforms]
        if not parts or len(parts) > 4 or any(p is None for p in parts):
            return None
        if len({p[2] for p in parts}) != 1:
            return None
        return dict(kinds=[p[0] for p in parts], alphas=[p[1] for p in parts], p=[float(w) for w in t.p],
                    num_classes=parts[0][2])
    return None


class BatchStage:
    """One loader's batch transform: native when compile_batch_transform
    recognises it, else the callable itself."""

    def __init__(self, transform: Any) -> None:
        if not callable(transform):
            raise TypeError(f"batch_transform must be callable, got {type(transform).__name__}")
        self.transform = transform
        self.spec = compile_batch_transform(transform)
        self.description = ("native (C): " if self.spec else "python (loop thread): ") + repr(transform).replace(
            "\n", " ")

    def __call__(self, batch: Any, seed: int, epoch: int, seq: int) -> Any:
        pair = isinstance(batch, (tuple, list)) and len(batch) == 2
        if self.spec is not None and pair and self._native_ok(batch):
            from . import _C
            import torch

            images, labels = batch
            soft, _params = _C._mix_batch(images.numpy(), labels.numpy(), self.spec, seed & ((1 << 64) - 1),
                                          epoch, seq, self.spec["num_classes"])
            return (images, torch.from_numpy(soft))
        if pair:
            return self.transform(*batch)
        return self.transform(batch)

    @staticmethod
    def _native_ok(batch: Any) -> bool:
        images, labels = batch
        try:
            import torch
        except ImportError:  # pragma: no cover
            return False
        return (isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor) and images.device.type == "cpu"
                and images.dtype == torch.float32 and images.ndim == 4 and images.is_contiguous()
                and labels.dtype == torch.int64 and labels.ndim == 1 and labels.device.type == "cpu")
