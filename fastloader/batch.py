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
labels, the default labels_getter, a float32 CHW batch) and timm's
``timm.data.Mixup`` (modes 'batch', 'pair', 'elem', label smoothing,
cutmix_minmax, read again on every batch, so a training loop that turns
``mixup_enabled`` off keeps working) run in C (csrc/image/mix.c) with the
GIL released, drawn from the counter RNG keyed by (seed, epoch, batch
number): the same batches for any num_workers, the distributions the
library's.  Anything else is called as ``batch_transform(images, labels)``
(or ``batch_transform(batch)`` when the batch is not a pair) in the loop's
thread, with torch's semantics; a timm Mixup that stays in Python says why
(a PerformanceWarning, and ``BatchStage.description``).

The collate_fn spelling (``collate_fn=lambda b: mixup_cutmix(*default_collate(b))``)
still works, but a custom collate_fn takes a native dataset off its native
batch path; ``batch_transform`` keeps it there.
"""
from __future__ import annotations

import math
import numbers
import sys
import warnings
from typing import Any

_MIXUP, _CUTMIX = 0, 1   # csrc/image/mix.h FL_MIX_*
_TIMM_MODES = {"batch": 0, "pair": 1, "elem": 2}   # csrc/image/mix.h FL_TIMM_MODE_*
# what timm 1.0's Mixup.__init__ sets on the instance (multi_label since 1.0.x)
_TIMM_ATTRS = frozenset(("mixup_alpha", "cutmix_alpha", "cutmix_minmax", "mix_prob", "switch_prob",
                         "label_smoothing", "num_classes", "multi_label", "mode", "correct_lam", "mixup_enabled"))
# what its __call__ runs: timm.data.mixup's own, unless someone patched them
_TIMM_METHODS = ("__call__", "_mix_batch", "_mix_pair", "_mix_elem", "_params_per_batch", "_params_per_elem")
_TIMM_FUNCS = ("one_hot", "mixup_target", "rand_bbox", "rand_bbox_minmax", "cutmix_bbox_and_lam")


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


def _timm_kind(t: Any) -> str | None:
    """'mixup' for a timm.data.Mixup itself, 'fast_collate' for a
    FastCollateMixup (or a subclass), 'subclass' for another subclass of
    Mixup; None for anything else (timm is never imported here)."""
    mod = sys.modules.get("timm.data.mixup")
    if mod is None:
        return None
    mixup, fast = getattr(mod, "Mixup", None), getattr(mod, "FastCollateMixup", None)
    if mixup is None or not isinstance(t, mixup):
        return None
    if type(t) is mixup:
        return "mixup"
    return "fast_collate" if fast is not None and isinstance(t, fast) else "subclass"


def _number(v: Any) -> float | None:
    """v as a float when it is a plain int or float (or a numpy one), else None."""
    if isinstance(v, (int, float)):
        return float(v)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, (np.integer, np.floating)):
        return float(v)
    return None


def _numpy_major() -> int:
    """numpy's major version (timm imports numpy, so it is loaded here)."""
    global _NUMPY_MAJOR
    if _NUMPY_MAJOR is None:
        import numpy

        _NUMPY_MAJOR = int(numpy.__version__.split(".")[0])
    return _NUMPY_MAJOR


_NUMPY_MAJOR: int | None = None


def compile_timm_mixup(t: Any) -> tuple[dict | None, str]:
    """(spec, "") for a timm.data.Mixup whose current settings run natively
    (csrc/binding/py_mix.c _timm_mix_batch), else (None, why it stays in
    Python).  Cheap: the loader calls it on every batch, since a training
    loop may change the object (timm's train.py turns mixup_enabled off)."""
    mod = sys.modules["timm.data.mixup"]
    extra = sorted(set(vars(t)) - _TIMM_ATTRS)
    if extra:
        return None, f"the object has attributes timm's Mixup does not set ({', '.join(extra)}): a patched method?"
    for name in _TIMM_METHODS:
        f = getattr(mod.Mixup, name, None)
        if getattr(f, "__module__", None) != mod.__name__ or getattr(f, "__qualname__", None) != f"Mixup.{name}":
            return None, f"timm.data.mixup.Mixup.{name} is not timm's own"
    for name in _TIMM_FUNCS:
        f = getattr(mod, name, None)
        if getattr(f, "__module__", None) != mod.__name__ or getattr(f, "__qualname__", None) != name:
            return None, f"timm.data.mixup.{name} is not timm's own"
    try:
        if getattr(t, "multi_label", False):
            return None, "multi_label=True (dense multi-label targets)"
        mode = t.mode
        if not isinstance(mode, str) or mode not in _TIMM_MODES:
            return None, f"mode={mode!r} (native: 'batch', 'pair', 'elem')"
        nc = t.num_classes
        if isinstance(nc, bool) or not isinstance(nc, numbers.Integral) or not 0 < int(nc) < 2 ** 31:
            return None, f"num_classes={nc!r} (native: an int >= 1)"
        alphas = [_number(t.mixup_alpha), _number(t.cutmix_alpha)]
        if any(a is None or not abs(a) < 1e6 for a in alphas):
            return None, f"mixup_alpha={t.mixup_alpha!r}, cutmix_alpha={t.cutmix_alpha!r} (native: finite numbers)"
        probs = [_number(t.mix_prob), _number(t.switch_prob)]
        if any(p is None for p in probs):
            return None, f"prob={t.mix_prob!r}, switch_prob={t.switch_prob!r} (native: numbers)"
        # smoothing / num_classes is float64 arithmetic only for a Python int or float (np.float64 is one)
        smoothing = t.label_smoothing
        if not isinstance(smoothing, (int, float)) or not math.isfinite(smoothing):
            return None, f"label_smoothing={smoothing!r} (native: a finite Python float)"
        minmax = t.cutmix_minmax
        if minmax is not None:
            # int(img_h * minmax[0]) is float64 arithmetic only for Python numbers
            try:
                lo, hi = minmax
            except (TypeError, ValueError):
                return None, f"cutmix_minmax={minmax!r} (native: None or (min, max))"
            if not all(isinstance(v, (int, float)) for v in (lo, hi)) or not 0.0 <= lo < hi <= 1.0:
                return None, f"cutmix_minmax={minmax!r} (native: Python numbers with 0 <= min < max <= 1)"
            minmax = (float(lo), float(hi))
        enabled = bool(t.mixup_enabled)
    except AttributeError as e:
        return None, f"an attribute of timm's Mixup is missing ({e})"
    if enabled and not (alphas[0] > 0.0 or alphas[1] > 0.0):
        return None, "neither mixup_alpha nor cutmix_alpha is > 0 (timm asserts when it mixes)"
    if mode != "batch" and minmax is None and _numpy_major() < 2:
        return None, "numpy < 2 computes the per-element CutMix box from timm's float32 lam in float64"
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_default_dtype() != torch.float32:
        return None, f"torch's default dtype is {torch.get_default_dtype()} (timm's targets take it; native: float32)"
    return dict(kind="timm", mixup_alpha=alphas[0], cutmix_alpha=alphas[1], cutmix_minmax=minmax, prob=probs[0],
                switch_prob=probs[1], mode=_TIMM_MODES[mode], correct_lam=bool(t.correct_lam), enabled=enabled,
                label_smoothing=float(smoothing), num_classes=int(nc)), ""


def compile_batch_transform(t: Any) -> dict | None:
    """The native spec (csrc/binding/py_mix.c) for a batch transform, or
    None when it runs in Python.  A timm Mixup's spec has kind="timm"."""
    if t is None:
        return None
    if _timm_kind(t) == "mixup":
        return compile_timm_mixup(t)[0]
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


_FAST_COLLATE_MSG = (
    "timm's FastCollateMixup is a collate_fn: it collates a list of uint8 samples itself, so it cannot take the "
    "finished (images, labels) batch batch_transform= gets. Pass timm.data.Mixup (the same arguments) as "
    "batch_transform= to mix the float batch natively, or FastCollateMixup as collate_fn= (it then runs in "
    "Python and takes a native dataset off its native batch path)")


class BatchStage:
    """One loader's batch transform: native when compile_batch_transform
    recognises it, else the callable itself.  `description` says which;
    `native_batches` / `python_batches` count the batches each way."""

    def __init__(self, transform: Any) -> None:
        if not callable(transform):
            raise TypeError(f"batch_transform must be callable, got {type(transform).__name__}")
        kind = _timm_kind(transform)
        if kind == "fast_collate":
            raise TypeError(_FAST_COLLATE_MSG)
        self.transform = transform
        self._timm = kind is not None
        self._timm_own = kind == "mixup"
        self.native_batches = self.python_batches = 0
        self._warned: set[str] = set()
        if kind == "mixup":
            self.spec, why = compile_timm_mixup(transform)
        elif kind == "subclass":
            self.spec, why = None, f"{type(transform).__qualname__} is a subclass of timm's Mixup"
        else:
            self.spec, why = compile_batch_transform(transform), ""
        self._describe(why)
        if self._timm and why:
            self._python_reason(why)

    def _describe(self, why: str) -> None:
        self.description = ("native (C): " if self.spec else "python (loop thread): ") + repr(self.transform).replace(
            "\n", " ") + (f" [{why}]" if why else "")

    def _python_reason(self, why: str) -> None:
        """A timm Mixup runs in Python: said once per reason."""
        self._describe(why)
        if why in self._warned:
            return
        self._warned.add(why)
        from .stats import PerformanceWarning

        warnings.warn(f"fastloader: timm's Mixup runs in Python on each batch, not natively: {why} "
                      "(docs/recipes.md, 'The batch stage')", PerformanceWarning, stacklevel=4)

    def check_loader(self, loader: Any) -> None:
        """Warn at construction when a timm Mixup will meet a batch of odd
        size (timm asserts an even batch): an odd batch_size, or a last
        partial batch of odd size without drop_last."""
        if not self._timm:
            return
        bs = getattr(loader, "batch_size", None)
        if not bs:
            return
        if bs % 2:
            why = f"batch_size={bs} is odd"
        elif loader.drop_last:
            return
        else:
            try:
                rest = len(loader.sampler) % bs
            except TypeError:   # an iterable dataset or sampler without a length
                return
            if rest % 2 == 0:
                return
            why = f"without drop_last the last batch of each epoch has {rest} samples"
        warnings.warn(f"fastloader: timm's Mixup needs an even batch size and raises on an odd one: {why}. Pass "
                      "drop_last=True (timm's train.py does) and an even batch_size.", UserWarning, stacklevel=3)

    def __call__(self, batch: Any, seed: int, epoch: int, seq: int) -> Any:
        pair = isinstance(batch, (tuple, list)) and len(batch) == 2
        if self._timm and pair:
            return self._timm_call(batch, seed, epoch, seq)
        if self.spec is not None and pair and self._native_ok(batch):
            from . import _C
            import torch

            images, labels = batch
            soft, _params = _C._mix_batch(images.numpy(), labels.numpy(), self.spec, seed & ((1 << 64) - 1),
                                          epoch, seq, self.spec["num_classes"])
            self.native_batches += 1
            return (images, torch.from_numpy(soft))
        self.python_batches += 1
        if pair:
            return self.transform(*batch)
        return self.transform(batch)

    def _timm_call(self, batch: Any, seed: int, epoch: int, seq: int) -> Any:
        """timm's Mixup on (images, labels): natively when its settings and
        the batch allow, else as timm calls it, `x, target = mixup_fn(x, target)`."""
        images, labels = batch
        if not self._timm_own:   # a subclass: its own __call__, as it is
            self.python_batches += 1
            return self.transform(images, labels)
        n = len(images) if hasattr(images, "__len__") else None
        if n is not None and n % 2:   # timm's __call__ asserts this first
            raise AssertionError(
                f"timm's Mixup needs an even batch size ('Batch size should be even when using this'): batch {seq} "
                f"of epoch {epoch} has {n} samples. Pass drop_last=True (timm's train.py does) so that a last "
                "partial batch of odd size is dropped, and an even batch_size.")
        spec, why = compile_timm_mixup(self.transform)
        if spec is not None and not self._timm_batch_ok(batch):
            spec, why = None, self._batch_why(batch)
        self.spec = spec
        if spec is None:
            self._python_reason(why)
            self.python_batches += 1
            return self.transform(images, labels)
        if self.description.startswith("python"):
            self._describe("")
        from . import _C
        import torch

        soft, _params = _C._timm_mix_batch(images.numpy(), labels.numpy(), spec, seed & ((1 << 64) - 1), epoch, seq)
        self.native_batches += 1
        return images, torch.from_numpy(soft)

    @staticmethod
    def _batch_why(batch: Any) -> str:
        images, labels = batch
        desc = [f"{type(v).__name__} {getattr(v, 'dtype', '')} {tuple(getattr(v, 'shape', ()))} "
                f"on {getattr(getattr(v, 'device', None), 'type', '?')}" for v in (images, labels)]
        return (f"the batch is ({desc[0]}, {desc[1]}); native: a contiguous float32 N x C x H x W CPU tensor "
                "with N, C, H, W > 0 and int64 labels (N,) on the CPU")

    @classmethod
    def _timm_batch_ok(cls, batch: Any) -> bool:
        images, labels = batch
        return (cls._native_ok(batch) and images.numel() > 0 and labels.shape[0] == images.shape[0]
                and not images.requires_grad)

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
