"""The epoch's batches of indices, as the loader's index sampler gives them,
without torch's list of every index where the sampler is torch's own.

torch's RandomSampler (without replacement) draws an epoch as one
`randperm(n)` and hands it out through `.tolist()`: a list of n Python ints
alive for the whole epoch, ~36 bytes a sample beside the 8 of the
permutation (1.1 MiB for 32,000 samples, 44 MiB for ImageNet's 1.28 M, in
the process that draws the indices, every epoch).  torch's BatchSampler
then cuts that list into batches.

`batches(index_sampler)` is `iter(index_sampler)`, except for exactly that
pair -- torch's BatchSampler over torch's RandomSampler without
replacement, neither subclassed nor their `__iter__` replaced -- where it
makes the same draws from the same generators at the same moments (the
seed drawn from torch's global RNG at the first batch when the sampler has
no generator; each `randperm` when the previous one is used up; the last,
empty, one when the epoch's end is reached, as torch's generator function
draws it) and cuts each batch from the permutation tensor: the same batches,
the same generator states after each, 8 bytes a sample.  tests/
test_sampling.py checks both against torch's own iterators.

Runs on the consumer thread with the GIL (where the loader draws indices);
the iterator owns the epoch's permutation and drops it at its end.
"""
from __future__ import annotations

try:
    import torch
    from torch.utils.data import BatchSampler as _BatchSampler
    from torch.utils.data import RandomSampler as _RandomSampler
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None
    _BatchSampler = _RandomSampler = None

# the __iter__ implementations random_batches mirrors (torch 2.x's)
_TORCH_ITERS = {"BatchSampler.__iter__", "RandomSampler.__iter__"}


def _torch_own_iter(cls):
    """Whether `cls.__iter__` is the one torch.utils.data.sampler defines."""
    f = cls.__dict__.get("__iter__")
    return (f is not None and getattr(f, "__module__", None) == "torch.utils.data.sampler"
            and getattr(f, "__qualname__", None) in _TORCH_ITERS)


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


def compact(index_sampler):
    """True when `batches` cuts `index_sampler`'s batches from a permutation
    tensor (torch's BatchSampler over torch's RandomSampler without
    replacement, both exactly torch's)."""
    if _BatchSampler is None or type(index_sampler) is not _BatchSampler:
        return False
    inner = index_sampler.sampler
    return (type(inner) is _RandomSampler and inner.replacement is False
            and _torch_own_iter(_BatchSampler) and _torch_own_iter(_RandomSampler))


def batches(index_sampler):
    """The epoch's iterator of index batches (lists of ints): what
    `iter(index_sampler)` yields, drawn as it draws."""
    if compact(index_sampler):
        return random_batches(index_sampler)
    return iter(index_sampler)


def random_batches(index_sampler):
    """iter(index_sampler) for torch's BatchSampler over a RandomSampler
    without replacement, step for step (a generator: nothing is read or
    drawn before the first batch is asked for, as torch's)."""
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
            take = perm[pos:pos + batch_size - len(batch)].tolist()
            pos += len(take)
            if batch:
                batch += take
            else:
                batch = take
            if len(batch) == batch_size:
                yield batch
                batch = []
    if batch and not drop_last:
        yield batch


def _perms(sampler, n, gen):
    """RandomSampler.__iter__'s permutations, each drawn when asked for; the
    last cut to num_samples % n (empty when n divides it, drawn all the
    same)."""
    for _ in range(sampler.num_samples // n):
        yield torch.randperm(n, generator=gen)
    yield torch.randperm(n, generator=gen)[:sampler.num_samples % n]
