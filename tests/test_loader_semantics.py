"""DataLoader API compatibility with torch: signature, attributes, validation,
len / re-iteration, samplers, shuffling, ordering, rebuilds, warnings."""

from __future__ import annotations

import inspect
import os
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate, default_convert

import helpers_datasets as H

NUM_WORKERS = [0, 1, 2, 4]


def _collect(loader):
    return [b for b in loader]


# ---------------------------------------------------------------------------
# Signature, type, attributes
# ---------------------------------------------------------------------------

def test_signature_matches_torch(DL):
    ref = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    got = inspect.signature(DL.__init__).parameters
    ref_names = list(ref)
    got_names = list(got)
    # torch's parameters appear in the same order (extra keyword-only ones may follow)
    assert got_names[: len(ref_names)] == ref_names, (got_names, ref_names)
    for name, p in ref.items():
        q = got[name]
        assert q.kind == p.kind, f"{name}: kind {q.kind} != {p.kind}"
        assert q.default == p.default or (q.default is p.default), f"{name}: default {q.default!r} != {p.default!r}"
    for name in got_names[len(ref_names):]:
        q = got[name]
        assert q.kind in (q.KEYWORD_ONLY, q.VAR_KEYWORD), f"extra parameter {name} must be keyword-only"
        if q.kind == q.KEYWORD_ONLY:
            assert q.default is not q.empty, f"extra parameter {name} needs a default"


def test_defaults_positional_call(DL):
    ds = H.RangeDataset(5)
    dl = DL(ds)  # everything default
    assert dl.batch_size == 1 and dl.num_workers == 0 and dl.drop_last is False
    assert [b.tolist() for b in dl] == [[0], [1], [2], [3], [4]]
    # positional arguments in torch's order
    dl2 = DL(ds, 2, False, None, None, 0, None, False, True)
    assert dl2.batch_size == 2 and dl2.drop_last is True and len(dl2) == 2


def test_subscriptable_in_annotations_as_torch(DL):
    """torch's DataLoader is Generic: scripts write DataLoader[list[Tensor]]
    in annotations, evaluated at import time (torch's test_dataloader too)."""
    import typing

    alias = DL[list[torch.Tensor]]
    assert typing.get_origin(alias) is DL and typing.get_args(alias) == (list[torch.Tensor],)

    # a script's annotation, evaluated when the function is defined (this
    # file's `from __future__ import annotations` would defer it)
    ns = {"DataLoader": DL, "torch": torch}
    src = "def train(loader: DataLoader[tuple[torch.Tensor, torch.Tensor]]) -> int:\n    return len(loader)\n"
    exec(compile(src, "<script>", "exec", dont_inherit=True), ns)
    assert ns["train"].__annotations__["loader"] == DL[tuple[torch.Tensor, torch.Tensor]]
    assert ns["train"](DL(H.RangeDataset(4), batch_size=2)) == 2


def test_isinstance_torch_dataloader(DL):
    dl = DL(H.RangeDataset(4), batch_size=2)
    assert isinstance(dl, torch.utils.data.DataLoader)
    assert issubclass(DL, torch.utils.data.DataLoader)


ATTRS = [
    "dataset", "batch_size", "drop_last", "num_workers", "prefetch_factor", "pin_memory",
    "timeout", "worker_init_fn", "generator", "persistent_workers", "collate_fn",
    "pin_memory_device", "in_order", "multiprocessing_context",
]

ATTR_CONFIGS = [
    dict(),
    dict(batch_size=3, drop_last=True),
    dict(batch_size=None),
    dict(batch_size=4, shuffle=True, num_workers=2, prefetch_factor=3, persistent_workers=True),
    dict(batch_size=2, num_workers=1, timeout=5.0, worker_init_fn=H.record_worker_init),
    dict(batch_size=2, shuffle=True, generator="gen"),
    dict(batch_size=2, sampler="reversed"),
    dict(batch_sampler="lists"),
    dict(batch_size=5, collate_fn=H.sum_and_ids_collate),
    dict(batch_size=2, in_order=False, num_workers=2),
]


def _materialize(cfg):
    cfg = dict(cfg)
    if cfg.get("generator") == "gen":
        cfg["generator"] = torch.Generator().manual_seed(3)
    if cfg.get("sampler") == "reversed":
        cfg["sampler"] = H.ReversedSampler(10)
    if cfg.get("batch_sampler") == "lists":
        cfg["batch_sampler"] = [[0, 1], [5], [2, 3, 4]]
    return cfg


@pytest.mark.parametrize("cfg", ATTR_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "defaults")
def test_attributes_match_torch(DL, TorchDL, cfg):
    ds = H.RangeDataset(10)
    cfg = _materialize(cfg)
    dl = DL(ds, **cfg)
    ref = TorchDL(ds, **cfg)
    for name in ATTRS:
        assert hasattr(dl, name), name
        a, b = getattr(dl, name), getattr(ref, name)
        if name in ("dataset", "generator", "worker_init_fn", "collate_fn"):
            assert a is b, f"{name}: {a!r} is not {b!r}"
        else:
            assert a == b and type(a) is type(b), f"{name}: {a!r} != {b!r}"
    assert type(dl.sampler) is type(ref.sampler)
    if "sampler" in cfg:
        assert dl.sampler is cfg["sampler"]
    if isinstance(ref.sampler, RandomSampler):
        assert dl.sampler.generator is ref.sampler.generator
    assert type(dl.batch_sampler) is type(ref.batch_sampler)
    if isinstance(ref.batch_sampler, BatchSampler):
        assert dl.batch_sampler.batch_size == ref.batch_sampler.batch_size
        assert dl.batch_sampler.drop_last == ref.batch_sampler.drop_last
        assert dl.batch_sampler.sampler is dl.sampler
    elif "batch_sampler" in cfg:
        assert dl.batch_sampler is cfg["batch_sampler"]
    assert len(dl) == len(ref)


def test_default_collate_fn_values(DL):
    ds = H.RangeDataset(4)
    assert DL(ds, batch_size=2).collate_fn is default_collate
    assert DL(ds, batch_size=None).collate_fn is default_convert
    assert DL(ds, batch_sampler=[[0, 1]]).collate_fn is default_collate


def test_prefetch_factor_defaults(DL):
    ds = H.RangeDataset(4)
    assert DL(ds).prefetch_factor is None
    assert DL(ds, num_workers=2).prefetch_factor == 2
    assert DL(ds, num_workers=2, prefetch_factor=5).prefetch_factor == 5


# ---------------------------------------------------------------------------
# Argument validation (same exception types as torch)
# ---------------------------------------------------------------------------

class _Iter(IterableDataset):
    def __iter__(self):
        return iter(range(4))


INVALID = [
    ("batch_sampler+batch_size", lambda: dict(batch_sampler=[[0]], batch_size=2), ValueError),
    ("batch_sampler+shuffle", lambda: dict(batch_sampler=[[0]], shuffle=True), ValueError),
    ("batch_sampler+sampler", lambda: dict(batch_sampler=[[0]], sampler=[0]), ValueError),
    ("batch_sampler+drop_last", lambda: dict(batch_sampler=[[0]], drop_last=True), ValueError),
    ("sampler+shuffle", lambda: dict(sampler=[0, 1], shuffle=True), ValueError),
    ("negative num_workers", lambda: dict(num_workers=-1), ValueError),
    ("prefetch without workers", lambda: dict(prefetch_factor=2), ValueError),
    ("negative prefetch", lambda: dict(num_workers=2, prefetch_factor=-1), ValueError),
    ("persistent without workers", lambda: dict(persistent_workers=True), ValueError),
    ("negative timeout", lambda: dict(timeout=-1), ValueError),
    ("batch_size None + drop_last", lambda: dict(batch_size=None, drop_last=True), ValueError),
]


@pytest.mark.parametrize("name,kwargs,exc", INVALID, ids=[i[0] for i in INVALID])
def test_invalid_arguments(DL, TorchDL, name, kwargs, exc):
    ds = H.RangeDataset(4)
    with pytest.raises(exc):
        TorchDL(ds, **kwargs())  # the reference agrees
    with pytest.raises(exc):
        DL(ds, **kwargs())


@pytest.mark.parametrize("kwargs", [dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0]])],
                         ids=["shuffle", "sampler", "batch_sampler"])
def test_iterable_dataset_invalid_arguments(DL, kwargs):
    with pytest.raises(ValueError):
        DL(_Iter(), **kwargs)


@pytest.mark.parametrize("attr,value", [("batch_size", 4), ("sampler", [0]), ("batch_sampler", [[0]]),
                                        ("drop_last", True), ("dataset", []), ("persistent_workers", True)])
def test_frozen_attributes(DL, attr, value):
    dl = DL(H.RangeDataset(4), batch_size=2)
    with pytest.raises(ValueError):
        setattr(dl, attr, value)


@pytest.mark.fastloader_only
def test_multiprocessing_context_ignored_with_a_warning_in_thread_mode(DL):
    ds = H.RangeDataset(10)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        dl = DL(ds, batch_size=3, num_workers=2, multiprocessing_context="spawn", worker_mode="thread")
        out = _collect(dl)
    mentions = [w for w in rec if "thread" in str(w.message).lower()]
    assert len(mentions) == 1, [str(w.message) for w in rec]
    assert issubclass(mentions[0].category, UserWarning)
    assert [b.tolist() for b in out] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.skipif(bool(os.environ.get("FASTLOADER_UNDER_TSAN")),
                    reason="the TSan pass runs Python datasets on threads (scripts/test-tsan.sh)")
def test_multiprocessing_context_honoured_by_default_for_a_python_dataset(DL):
    ds = H.RangeDataset(10)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        dl = DL(ds, batch_size=3, num_workers=2, multiprocessing_context="spawn")
        out = _collect(dl)
    assert [str(w.message) for w in rec if "multiprocessing_context" in str(w.message)] == []
    assert [b.tolist() for b in out] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    if not H.AGAINST_TORCH:
        assert dl.stats()["shared_memory"]["start_method"] == "spawn"


# ---------------------------------------------------------------------------
# len, re-iteration, several iterators, rebuilds
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kw,expected_len", [
    (dict(batch_size=3), 4),
    (dict(batch_size=3, drop_last=True), 3),
    (dict(batch_size=None), 10),
    (dict(batch_size=10), 1),
    (dict(batch_size=11, drop_last=True), 0),
    (dict(batch_sampler=[[0], [1, 2], [3, 4, 5, 6]]), 3),
    (dict(batch_size=4, sampler=H.EveryOtherSampler(10)), 2),
])
def test_len_equals_batches_yielded(DL, num_workers, kw, expected_len):
    dl = DL(H.RangeDataset(10), num_workers=num_workers, **kw)
    assert len(dl) == expected_len
    assert len(_collect(dl)) == expected_len


@pytest.mark.parametrize("num_workers", [0, 2])
def test_len_iterable_dataset(DL, TorchDL, num_workers):
    ds = H.ShardedIterable(23)
    for kw in (dict(batch_size=5), dict(batch_size=5, drop_last=True), dict(batch_size=None)):
        dl = DL(ds, num_workers=num_workers, **kw)
        assert len(dl) == len(TorchDL(ds, **kw))
    dl = DL(ds, batch_size=5, num_workers=num_workers)
    assert len(dl) == 5
    if num_workers == 0:
        assert len(_collect(dl)) == 5


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_reiteration_same_output(DL, TorchDL, num_workers):
    ds = H.KindDataset("dict", 13)
    dl = DL(ds, batch_size=4, num_workers=num_workers)
    ref = _collect(TorchDL(ds, batch_size=4))
    for _ in range(3):
        H.assert_same_batches(_collect(dl), ref)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_several_iterators_alive(DL, num_workers):
    ds = H.RangeDataset(12)
    dl = DL(ds, batch_size=2, num_workers=num_workers)
    it1, it2 = iter(dl), iter(dl)
    assert it1 is not it2
    got1, got2 = [], []
    got1.append(next(it1).tolist())
    got2.extend(b.tolist() for b in [next(it2), next(it2)])
    it3 = iter(dl)
    got3 = [b.tolist() for b in it3]
    got1.extend(b.tolist() for b in it1)
    got2.extend(b.tolist() for b in it2)
    expected = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert got1 == expected and got2 == expected and got3 == expected


def lightning_style_rebuild(dl, sampler=None):
    """Mimics lightning.fabric.utilities.data._get_dataloader_init_args_and_kwargs."""
    attrs = {k: v for k, v in vars(dl).items() if not k.startswith("_")}
    attrs["multiprocessing_context"] = dl.multiprocessing_context
    params = dict(inspect.signature(dl.__init__).parameters)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        params.update(inspect.signature(torch.utils.data.DataLoader.__init__).parameters)
        params.pop("self", None)
    non_defaults = {n for n, p in params.items() if n in attrs and p.default is not attrs[n]}
    non_defaults.add("dataset")
    kwargs = {k: v for k, v in attrs.items() if k in non_defaults}
    if isinstance(kwargs["dataset"], IterableDataset):
        kwargs["batch_sampler"] = None
        kwargs["sampler"] = None
    elif dl.batch_sampler is not None and type(dl.batch_sampler) is not BatchSampler:
        kwargs.update(batch_sampler=dl.batch_sampler, sampler=None, shuffle=False, batch_size=1, drop_last=False)
    else:
        kwargs.update(sampler=sampler if sampler is not None else dl.sampler, shuffle=False, batch_sampler=None)
    return type(dl)(**kwargs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_lightning_style_rebuild(DL, TorchDL, num_workers):
    ds = H.EpochDataset(14)
    extra = dict(persistent_workers=True, prefetch_factor=3) if num_workers else {}
    dl = DL(ds, batch_size=4, drop_last=True, num_workers=num_workers,
            collate_fn=H.sum_and_ids_collate, **extra)
    new = lightning_style_rebuild(dl)
    assert type(new) is type(dl)
    for name in ("batch_size", "drop_last", "num_workers", "collate_fn", "prefetch_factor", "persistent_workers"):
        assert getattr(new, name) == getattr(dl, name), name
    ref = _collect(TorchDL(ds, batch_size=4, drop_last=True, collate_fn=H.sum_and_ids_collate))
    H.assert_same_batches(_collect(new), ref)
    H.assert_same_batches(_collect(dl), ref)
    # the rebuild Lightning does for DDP: inject a DistributedSampler
    dsamp = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False)
    new2 = lightning_style_rebuild(dl, sampler=dsamp)
    assert new2.sampler is dsamp
    ref2 = _collect(TorchDL(ds, batch_size=4, drop_last=True, collate_fn=H.sum_and_ids_collate,
                            sampler=DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False)))
    H.assert_same_batches(_collect(new2), ref2)
    del dl, new, new2  # persistent workers must go with their loaders


def test_lightning_style_rebuild_custom_batch_sampler_and_iterable(DL):
    ds = H.RangeDataset(6)
    dl = DL(ds, batch_sampler=[[5, 4], [0]])
    new = lightning_style_rebuild(dl)
    assert [b.tolist() for b in new] == [[5, 4], [0]]
    it = DL(H.ShardedIterable(5), batch_size=2)
    new_it = lightning_style_rebuild(it)
    assert [b["i"].tolist() for b in new_it] == [[0, 1], [2, 3], [4]]


# ---------------------------------------------------------------------------
# Sampling order: shuffle + generator, samplers, drop_last, no auto-batching
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize("seed", [0, 1234])
def test_shuffle_with_generator_matches_torch(DL, TorchDL, num_workers, seed):
    ds = H.KindDataset("tuple", 23)
    dl = DL(ds, batch_size=4, shuffle=True, num_workers=num_workers,
            generator=torch.Generator().manual_seed(seed))
    ref = TorchDL(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed))
    epochs = []
    for _ in range(3):  # epoch order depends on the generator state carried across epochs
        out = _collect(dl)
        exp = _collect(ref)
        H.assert_same_batches(out, exp)
        epochs.append(torch.cat([b[1] for b in out]).tolist())
    assert sorted(epochs[0]) == list(range(23))
    assert epochs[0] != epochs[1]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_shuffle_with_generator_persistent_matches_torch(DL, TorchDL, num_workers):
    # torch draws the worker base seed from `generator` only when the (persistent)
    # iterator is created, not on later epochs: the order must match anyway.
    ds = H.RangeDataset(17)
    kw = dict(batch_size=3, shuffle=True, num_workers=num_workers, persistent_workers=True)
    dl = DL(ds, generator=torch.Generator().manual_seed(7), **kw)
    ref = TorchDL(ds, generator=torch.Generator().manual_seed(7), **kw)
    for _ in range(3):
        H.assert_same_batches(_collect(dl), _collect(ref))
    del dl, ref


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_shuffle_without_generator_is_permutation(DL, num_workers):
    dl = DL(H.RangeDataset(30), batch_size=7, shuffle=True, num_workers=num_workers)
    seen = torch.cat(_collect(dl)).tolist()
    assert sorted(seen) == list(range(30))


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize("case", ["reversed", "every_other", "list", "batch_sampler", "batch_sampler_random",
                                  "drop_last", "no_drop_last", "batch_none", "batch_none_shuffle"])
def test_sampling_matches_torch(DL, TorchDL, num_workers, case):
    ds = H.KindDataset("nested", 11)

    def kw():
        if case == "reversed":
            return dict(batch_size=3, sampler=H.ReversedSampler(11))
        if case == "every_other":
            return dict(batch_size=2, sampler=H.EveryOtherSampler(11))
        if case == "list":
            return dict(batch_size=4, sampler=[3, 3, 10, 0, 7])
        if case == "batch_sampler":
            return dict(batch_sampler=[[4, 2, 9], [0], [10, 1], [5, 5, 5, 5]])
        if case == "batch_sampler_random":
            return dict(batch_sampler=BatchSampler(RandomSampler(ds, generator=torch.Generator().manual_seed(5)),
                                                   batch_size=3, drop_last=False))
        if case == "drop_last":
            return dict(batch_size=4, drop_last=True)
        if case == "no_drop_last":
            return dict(batch_size=4, drop_last=False)
        if case == "batch_none":
            return dict(batch_size=None)
        if case == "batch_none_shuffle":
            return dict(batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(9))
        raise AssertionError(case)

    out = _collect(DL(ds, num_workers=num_workers, **kw()))
    ref = _collect(TorchDL(ds, **kw()))
    H.assert_same_batches(out, ref)


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_in_order_true_keeps_sampler_order(DL, num_workers):
    ds = H.DelayedDataset(24)
    dl = DL(ds, batch_size=2, num_workers=num_workers, in_order=True, sampler=H.ReversedSampler(24))
    out = torch.cat([b[:, 0] for b in dl]).tolist()
    assert out == list(range(23, -1, -1))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_in_order_false_yields_everything(DL, num_workers):
    ds = H.DelayedDataset(24)
    dl = DL(ds, batch_size=2, num_workers=num_workers, in_order=False)
    out = torch.cat([b[:, 0] for b in dl]).tolist()
    assert sorted(out) == list(range(24))


# ---------------------------------------------------------------------------
# Warnings: pin_memory without CUDA, GIL-bound datasets
# ---------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_without_cuda_warns_once(DL, TorchDL, num_workers):
    ds = H.KindDataset("dict", 10)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        dl = DL(ds, batch_size=3, num_workers=num_workers, pin_memory=True)
        out = _collect(dl)
    pin = [w for w in rec if "pin" in str(w.message).lower()]
    assert len(pin) == 1, [str(w.message) for w in rec]
    assert issubclass(pin[0].category, UserWarning)
    H.assert_same_batches(out, _collect(TorchDL(ds, batch_size=3)))
    assert all(not t.is_pinned() for b in out for t in H.iter_leaves(b) if isinstance(t, torch.Tensor))


def _perf_warnings(fl, rec):
    return [w for w in rec if issubclass(w.category, fl.PerformanceWarning)]


@pytest.mark.fastloader_only
def test_gil_bound_dataset_warns_once(DL, fl):
    assert issubclass(fl.PerformanceWarning, UserWarning)
    ds = H.PythonCpuDataset(800)  # ~2 ms of pure Python per item: ~1.6 s of GIL-bound work
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = _collect(DL(ds, batch_size=10, num_workers=2, worker_mode="thread"))
    assert len(out) == 80
    perf = _perf_warnings(fl, rec)
    assert len(perf) == 1, [str(w.message) for w in perf]
    msg = str(perf[0].message)
    assert "GIL" in msg
    # the one remedy for this dataset, not one it cannot use
    assert msg.endswith("Remedy: worker_mode='process' (or the default, 'auto', which runs a Python dataset in "
                        "worker processes), each with a GIL of its own."), msg
    assert "ImageFolder" not in msg


def test_the_gil_remedy_for_torchvisions_folder_is_fastloaders(fl, tmp_path):
    torchvision = pytest.importorskip("torchvision")
    from fastloader.stats import gil_remedy
    from helpers_formats import make_class_folder

    folder = torchvision.datasets.ImageFolder(make_class_folder(tmp_path))
    assert gil_remedy(folder).startswith("Remedy: fastloader.ImageFolder takes the same arguments as "
                                         "torchvision's ImageFolder")


@pytest.mark.fastloader_only
def test_sleeping_dataset_does_not_warn(DL, fl):
    ds = H.SleepyDataset(500, delay=0.004)  # ~1 s of sleeping (GIL released) on 2 workers
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = _collect(DL(ds, batch_size=10, num_workers=2, worker_mode="thread"))
    assert torch.cat(out).tolist() == list(range(500))
    assert _perf_warnings(fl, rec) == []
