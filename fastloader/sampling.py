"""The epoch's batches of indices, as the loader's index sampler gives them,
without torch's list of every index where the sampler is torch's own.

torch's RandomSampler (without replacement) draws an epoch as one
`randperm(n)` and hands it out through `.tolist()`: a list of n Python ints
alive for the whole epoch, 40 bytes a sample (a pointer and an int object)
where the permutation takes 8 (1.2 MiB for 32,000 samples, 49 MiB for
ImageNet's 1.28 M, in the process that draws the indices, every epoch).  torch's BatchSampler
then cuts that list into batches.

torch's DistributedSampler does the same on every rank, at every epoch's
start: the whole epoch's list (n ints), a padded copy, then the rank's
slice, which stays (n / world ints, with their int objects).

`batches(index_sampler)` is `iter(index_sampler)`, except for torch's
BatchSampler over either of those samplers (neither subclassed nor their
`__iter__` replaced):
- RandomSampler without replacement: the same draws from the same
  generators at the same moments (the seed drawn from torch's global RNG at
  the first batch when the sampler has no generator; each `randperm` when
  the previous one is used up; the last, empty, one when the epoch's end is
  reached, as torch's generator function draws it), each batch cut from the
  permutation tensor: the same batches, the same generator states after
  each, 8 bytes a sample.
- DistributedSampler: its permutation (its own generator, seeded by seed +
  epoch, at the first batch as torch's), the rank's positions taken as one
  tensor (the padding cycles over the permutation, drop_last cuts it, as
  torch's lists do), each batch cut from it.  A dataset whose length no
  longer fits the sampler's total_size goes to torch's own iterator, which
  raises its error.
- Hugging Face accelerate's SeedableRandomSampler (use_seedable_sampler=True,
  which transformers' Trainer sets): its own `__iter__` step for step (the
  generator, made on the default device when it has none, seeded with
  epoch + initial_seed at the first batch; RandomSampler's draws as above;
  `set_epoch(epoch + 1)` when the epoch's indices run out).
- Hugging Face accelerate's BatchSamplerShard (what `accelerator.prepare`
  makes of such a loader on more than one process: every process runs the
  inner BatchSampler over the whole epoch and keeps its own batches) over
  either of the above: accelerate's own sharding code, run on a view of the
  shard whose inner batch sampler is cut from the tensor (`_View`; what it
  does not recognise: `_accelerate_wrapper`).  Its SkipBatchSampler
  (`skip_first_batches`, the epoch a Trainer resumes in) over any of these
  the same way.
tests/test_sampling.py checks each against its own iterator.

Runs on the consumer thread with the GIL (where the loader draws indices);
the iterator owns the epoch's permutation and drops it at its end.
"""
from __future__ import annotations

import sys
import types

try:
    import torch
    from torch.utils.data import BatchSampler as _BatchSampler
    from torch.utils.data import DistributedSampler as _DistSampler
    from torch.utils.data import RandomSampler as _RandomSampler
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None
    _BatchSampler = _DistSampler = _RandomSampler = None


def _own_method(cls, module, name="__iter__"):
    """Whether `cls.<name>` is defined by `cls` itself in `module` (torch's
    own sampler iterators, which the iterators below mirror, torch 2.x's;
    accelerate's own sharding methods), not replaced or inherited."""
    f = cls.__dict__.get(name)
    return (f is not None and getattr(f, "__module__", None) == module
            and getattr(f, "__qualname__", None) == f"{cls.__name__}.{name}")


def batching(index_sampler):
    """(inner sampler, batch_size, drop_last) when the loader's index sampler
    is torch's own BatchSampler (so batches are cut from the inner sampler's
    order and can be cut again at another size, elastic.py), else None."""
    if _BatchSampler is None or type(index_sampler) is not _BatchSampler:
        return None
    return index_sampler.sampler, int(index_sampler.batch_size), bool(index_sampler.drop_last)


def dist_like(sampler):
    """(num_replicas, rank) of a sampler that shards by rank (torch's
    DistributedSampler or a subclass, torchdata's StatefulDistributedSampler),
    else None."""
    w, r = getattr(sampler, "num_replicas", None), getattr(sampler, "rank", None)
    if isinstance(w, int) and isinstance(r, int):
        return (w, r)
    return None


def _kind(index_sampler):
    """"random", "seedable" or "dist" where `batches` cuts `index_sampler`'s
    batches from a tensor (torch's own BatchSampler over torch's own
    RandomSampler without replacement, accelerate's SeedableRandomSampler, or
    torch's DistributedSampler), else None."""
    if (_BatchSampler is None or type(index_sampler) is not _BatchSampler
            or not _own_method(_BatchSampler, "torch.utils.data.sampler")):
        return None
    inner = index_sampler.sampler
    if (type(inner) is _RandomSampler and inner.replacement is False
            and _own_method(_RandomSampler, "torch.utils.data.sampler")):
        return "random"
    if seedable(inner) and inner.replacement is False:
        return "seedable"
    if type(inner) is _DistSampler and _own_method(_DistSampler, "torch.utils.data.distributed"):
        return "dist"
    return None


def plain_dist(sampler):
    """`sampler` if it is a torch DistributedSampler ordered by torch's own
    __iter__ (so its order is elastic.py's deal), else None."""
    if _DistSampler is None or not isinstance(sampler, _DistSampler):
        return None
    if type(sampler).__iter__ is not _DistSampler.__iter__:
        return None
    if callable(getattr(sampler, "state_dict", None)):
        return None   # a Stateful sampler keeps its own place
    return sampler


_ACCELERATE = "accelerate.data_loader"


def seedable(sampler):
    """True for accelerate's own SeedableRandomSampler, which `batches` cuts
    from a tensor: not a subclass, its `__iter__` accelerate's (the order a
    function of `initial_seed + epoch`, drawn by RandomSampler's own
    `__iter__`, its direct base), accelerate 1.x's attributes.  Recognised
    by name: accelerate is never imported here."""
    cls = type(sampler)
    return (cls.__name__ == "SeedableRandomSampler" and _RandomSampler is not None
            and cls.__bases__ == (_RandomSampler,) and seedable_order(sampler)
            and _own_method(_RandomSampler, "torch.utils.data.sampler"))


def seedable_order(sampler):
    """True for any sampler ordered by accelerate's SeedableRandomSampler's
    own `__iter__` (the class or a subclass that keeps it): its order is a
    function of `initial_seed + epoch`, which state.py keeps instead of its
    generator's state."""
    for cls in type(sampler).__mro__:
        if cls.__name__ == "SeedableRandomSampler" and cls.__module__ == _ACCELERATE:
            return (_own_method(cls, _ACCELERATE) and type(sampler).__iter__ is cls.__dict__["__iter__"]
                    and hasattr(sampler, "initial_seed") and hasattr(sampler, "epoch"))
    return False


def _accelerate_version():
    """accelerate's (major, minor), read from the module already imported
    (a SeedableRandomSampler exists, so accelerate is); (0, 0) if unknown."""
    try:
        return tuple(int(p) for p in sys.modules["accelerate"].__version__.split(".")[:2])
    except (KeyError, AttributeError, ValueError):
        return (0, 0)


def _seedable_generator():
    """The generator SeedableRandomSampler.__iter__ makes when it has none:
    on torch's default device from accelerate 1.5, on the CPU before."""
    if _accelerate_version() >= (1, 5):
        return torch.Generator(device=torch.get_default_device())
    return torch.Generator()


def accelerate_skip(index_sampler):
    """The batches accelerate's SkipBatchSampler (skip_first_batches) drops
    at the epoch's start when `index_sampler` is one (its own `__iter__`),
    else 0: state.py keeps it, so a state saved in a skipped epoch resumes
    at the same place in a loader with another skip, or none."""
    cls = type(index_sampler)
    if cls.__name__ == "SkipBatchSampler" and cls.__module__ == _ACCELERATE and _own_method(cls, _ACCELERATE):
        return int(index_sampler.skip_batches)
    return 0

# accelerate's batch samplers that wrap another one (`self.batch_sampler`),
# by name, with their methods that iterate: each only iterates
# `self.batch_sampler`, reads its `batch_size` and the wrapper's own settings
# (accelerate 1.0-1.16 read); `_View` relies on exactly that
_WRAPPERS = {
    "BatchSamplerShard": ("__iter__", "_iter_with_split", "_iter_with_no_split"),
    "SkipBatchSampler": ("__iter__",),
}


def _accelerate_wrapper(index_sampler):
    """True for accelerate's own BatchSamplerShard or SkipBatchSampler (not
    a subclass, their iterating methods accelerate's, none replaced on the
    instance) over a batch sampler whose batches `batches` cuts from a
    tensor (a shard: torch's BatchSampler as `_kind` recognises it).  The
    shard is what `prepare_data_loader` makes of a loader with shuffle=True
    or a DistributedSampler on more than one process, every process running
    the inner BatchSampler over the whole epoch and keeping its own batches
    (SeedableRandomSampler's too, with use_seedable_sampler=True); the skip
    is what `skip_first_batches` puts around it.  Not recognised, so
    iterated as it is, with torch's list: a DataLoaderDispatcher (no
    shard).  Recognised by name: accelerate is never imported here."""
    cls = type(index_sampler)
    methods = _WRAPPERS.get(cls.__name__)
    if methods is None or cls.__module__ != _ACCELERATE:
        return False
    own = vars(index_sampler)
    if not all(_own_method(cls, _ACCELERATE, m) and m not in own for m in methods):
        return False
    inner = own.get("batch_sampler")
    return _kind(inner) is not None if cls.__name__ == "BatchSamplerShard" else compact(inner)


class _Cut:
    """Stands for the wrapped batch sampler inside `_View`: iterating it is
    `batches(inner)` (the same batches, drawn at the same moments), every
    other attribute is the inner one's, read when asked for (its batch_size
    too, as torch's iterator reads it)."""

    __slots__ = ("_inner",)

    def __init__(self, inner):
        self._inner = inner

    def __iter__(self):
        return batches(self._inner)

    def __len__(self):
        return len(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _View:
    """accelerate's BatchSamplerShard or SkipBatchSampler with the batch
    sampler it wraps cut from a tensor: accelerate's own methods run on this
    view (bound to it), and every attribute but `batch_sampler` is the
    wrapper's, read and written there when the code reads or writes it, as
    on the wrapper itself."""

    __slots__ = ("_shard", "batch_sampler")

    def __init__(self, shard):
        object.__setattr__(self, "_shard", shard)
        object.__setattr__(self, "batch_sampler", _Cut(shard.batch_sampler))

    def __getattr__(self, name):
        f = getattr(type(self._shard), name, None)
        if isinstance(f, types.FunctionType):
            return types.MethodType(f, self)
        return getattr(self._shard, name)

    def __setattr__(self, name, value):
        setattr(self._shard, name, value)


def compact(index_sampler):
    """True when `batches` cuts `index_sampler`'s batches from a tensor."""
    return _kind(index_sampler) is not None or _accelerate_wrapper(index_sampler)


def batches(index_sampler):
    """The epoch's iterator of index batches (lists of ints): what
    `iter(index_sampler)` yields, drawn as it draws."""
    kind = _kind(index_sampler)
    if kind == "random":
        return random_batches(index_sampler)
    if kind == "seedable":
        return seedable_batches(index_sampler)
    if kind == "dist":
        return dist_batches(index_sampler)
    if _accelerate_wrapper(index_sampler):
        # accelerate's own sharding (or skipping) code, the batch sampler it wraps cut from a tensor
        return type(index_sampler).__iter__(_View(index_sampler))
    return iter(index_sampler)


def random_batches(index_sampler, at_end=None):
    """iter(index_sampler) for torch's BatchSampler over a RandomSampler
    without replacement, step for step (a generator: nothing is read or
    drawn before the first batch is asked for, as torch's).  `at_end()` is
    called where the sampler's own iterator would run out: after its last
    index is taken, before a last partial batch is handed out."""
    sampler = index_sampler.sampler
    drop_last, batch_size = index_sampler.drop_last, index_sampler.batch_size
    n = len(sampler.data_source)
    gen = sampler.generator
    if gen is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        gen = torch.Generator()
        gen.manual_seed(seed)
    batch = []
    for perm in _perms(sampler, n, gen):
        pos, m = 0, len(perm)
        while pos < m:
            if not batch and not drop_last:
                batch_size = index_sampler.batch_size   # torch's islice reads it at every batch
            take = perm[pos:pos + batch_size - len(batch)].tolist()
            pos += len(take)
            if batch:
                batch += take
            else:
                batch = take
            if len(batch) == batch_size:
                yield batch
                batch = []
    if at_end is not None:
        at_end()
    if batch and not drop_last:
        yield batch


def seedable_batches(index_sampler):
    """iter(index_sampler) for torch's BatchSampler over accelerate's
    SeedableRandomSampler, its `__iter__` step for step: at the first batch
    the generator (made as accelerate's version makes it, seeded with
    initial_seed, when there is none) is seeded with epoch + initial_seed,
    RandomSampler's batches follow, and the epoch moves on by one when they
    run out."""
    sampler = index_sampler.sampler
    if sampler.generator is None:
        sampler.generator = _seedable_generator()
        sampler.generator.manual_seed(sampler.initial_seed)
    sampler.generator.manual_seed(sampler.epoch + sampler.initial_seed)
    yield from random_batches(index_sampler, lambda: sampler.set_epoch(sampler.epoch + 1))


def _perms(sampler, n, gen):
    """RandomSampler.__iter__'s permutations, each drawn when asked for; the
    last cut to num_samples % n (empty when n divides it, drawn all the
    same)."""
    for _ in range(sampler.num_samples // n):
        yield torch.randperm(n, generator=gen)
    yield torch.randperm(n, generator=gen)[:sampler.num_samples % n]


def dist_batches(index_sampler):
    """iter(index_sampler) for torch's BatchSampler over its
    DistributedSampler: the rank's share of the epoch as one int64 tensor
    (made at the first batch, as torch's list), cut into batches."""
    sampler = index_sampler.sampler
    drop_last, batch_size = index_sampler.drop_last, index_sampler.batch_size
    n = len(sampler.dataset)
    total, world, rank = sampler.total_size, sampler.num_replicas, sampler.rank
    if not ((n >= total) if sampler.drop_last else (0 < n <= total)):
        # the dataset's length changed since the sampler counted it: torch's
        # own iterator (an AssertionError, or a ZeroDivisionError when empty)
        yield from iter(index_sampler)
        return
    # rank r of W takes G[r::W] of G = the permutation padded by cycling over
    # it (cut to total_size with drop_last): G[j] = perm[j % n]
    take = torch.arange(rank, max(rank, total), world, dtype=torch.int64)   # range()'s: empty past the end
    if not sampler.drop_last:
        take %= n
    if sampler.shuffle:
        g = torch.Generator()
        g.manual_seed(sampler.seed + sampler.epoch)
        take = torch.randperm(n, generator=g)[take]
    m = len(take)
    if drop_last:   # torch's zip of batch_size references: the size read once
        for i in range(0, m - m % batch_size, batch_size):
            yield take[i:i + batch_size].tolist()
        return
    i = 0
    while i < m:
        batch_size = index_sampler.batch_size   # torch's islice reads it at every batch
        yield take[i:i + batch_size].tolist()
        i += batch_size
