"""The epoch's index batches without torch's index list (fastloader/sampling.py):
the same batches as torch's BatchSampler over its RandomSampler, from the
same draws at the same moments, holding the permutation as a tensor."""
import itertools
import tracemalloc

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler  # noqa: E402

import fastloader  # noqa: E402
from fastloader import sampling  # noqa: E402


def _state(gen):
    return (gen if gen is not None else torch.default_generator).get_state()


def _steps(it, gen):
    """Each batch with the generator's state right after it was drawn, and
    the state after StopIteration."""
    out = []
    for b in it:
        out.append((b, _state(gen)))
    return out, _state(gen)


def _both(make, seed_global=0, gen_seed=None):
    """(torch's steps, ours) for index samplers made by `make(gen)`, each
    from the same generator state."""
    runs = []
    for pick in (iter, sampling.batches):
        torch.manual_seed(seed_global)
        gen = None
        if gen_seed is not None:
            gen = torch.Generator()
            gen.manual_seed(gen_seed)
        bs = make(gen)
        assert sampling.compact(bs)
        runs.append(_steps(pick(bs), gen))
    return runs


@pytest.mark.parametrize("n,num_samples,batch_size,drop_last", [
    (50, None, 8, False), (50, None, 8, True), (48, None, 8, False), (48, None, 8, True),
    (5, None, 8, False), (5, None, 8, True), (1, None, 1, False),
    (10, 25, 4, False), (10, 25, 4, True), (10, 20, 5, False), (10, 30, 7, True), (10, 3, 2, False),
    (7, 7, 7, False), (100, 1, 3, True),
])
@pytest.mark.parametrize("gen_seed", [None, 5])
def test_same_batches_and_draws_as_torch(n, num_samples, batch_size, drop_last, gen_seed):
    def make(gen):
        return BatchSampler(RandomSampler(range(n), num_samples=num_samples, generator=gen), batch_size, drop_last)

    (t_steps, t_end), (f_steps, f_end) = _both(make, gen_seed=gen_seed)
    assert [b for b, _ in f_steps] == [b for b, _ in t_steps]
    assert all(type(i) is int for b, _ in f_steps for i in b)
    # the generator stands where torch's does after every batch and at the end
    # (the trailing, empty randperm drawn as torch's generator function draws it)
    for (_, ts), (_, fs) in zip(t_steps, f_steps):
        assert torch.equal(ts, fs)
    assert torch.equal(t_end, f_end)


def test_nothing_is_read_or_drawn_before_the_first_batch():
    class Counted(list):
        calls = 0

        def __len__(self):
            Counted.calls += 1
            return super().__len__()

    ds = Counted(range(20))
    torch.manual_seed(1)
    before = torch.get_rng_state()
    bs = BatchSampler(RandomSampler(ds), 4, False)
    Counted.calls = 0   # the constructor checked num_samples
    it = sampling.batches(bs)
    assert Counted.calls == 0 and torch.equal(torch.get_rng_state(), before)
    next(it)
    assert Counted.calls >= 1 and not torch.equal(torch.get_rng_state(), before)


def test_an_epoch_stopped_early_leaves_the_generator_as_torch_does():
    for pick in (iter, sampling.batches):
        gen = torch.Generator()
        gen.manual_seed(7)
        it = pick(BatchSampler(RandomSampler(range(30), num_samples=70, generator=gen), 8, False))
        got = list(itertools.islice(it, 4))   # 32 indices: the second permutation is drawn
        if pick is iter:
            want, want_state = got, gen.get_state()
        else:
            assert got == want and torch.equal(gen.get_state(), want_state)


def test_an_empty_dataset_fails_as_torchs_sampler_does():
    ds = []
    bs = BatchSampler(RandomSampler(range(3), num_samples=4), 2, False)
    bs.sampler.data_source = ds   # emptied after construction (torch checks num_samples only then)
    with pytest.raises(ZeroDivisionError):
        next(iter(bs))
    with pytest.raises(ZeroDivisionError):
        next(sampling.batches(bs))


def test_other_samplers_are_iterated_as_they_are():
    class MySampler(RandomSampler):
        pass

    class MyBatches(BatchSampler):
        pass

    plain = RandomSampler(range(10))
    for bs in (BatchSampler(MySampler(range(10)), 3, False), MyBatches(plain, 3, False),
               BatchSampler(RandomSampler(range(10), replacement=True), 3, False),
               BatchSampler(SequentialSampler(range(10)), 3, False), plain, [[0, 1], [2]]):
        assert not sampling.compact(bs)
        assert list(sampling.batches(bs)) is not None
    torch.manual_seed(3)
    want = list(BatchSampler(SequentialSampler(range(10)), 3, False))
    assert list(sampling.batches(BatchSampler(SequentialSampler(range(10)), 3, False))) == want


def test_a_replaced_iter_is_respected(monkeypatch):
    bs = BatchSampler(RandomSampler(range(10)), 3, False)
    assert sampling.compact(bs)
    monkeypatch.setattr(RandomSampler, "__iter__", lambda self: iter(range(len(self.data_source))))
    assert not sampling.compact(bs)
    assert list(sampling.batches(bs)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def _heap_peaks(make):
    """{iter, sampling.batches: the Python heap's peak over an epoch of the
    index sampler `make()` gives, made afresh for each}."""
    peaks = {}
    for pick in (iter, sampling.batches):
        it = pick(make())
        tracemalloc.start()
        try:
            for _ in it:
                pass
            peaks[pick] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return peaks


def test_the_epoch_holds_no_list_of_every_index():
    """torch's RandomSampler keeps n Python ints for the epoch (~36 bytes a
    sample); ours keeps the permutation tensor (outside Python's heap) and
    one batch of ints."""
    n = 100_000
    peaks = _heap_peaks(lambda: BatchSampler(RandomSampler(range(n), generator=torch.Generator().manual_seed(0)),
                                             64, False))
    assert peaks[iter] > n * 28
    assert peaks[sampling.batches] < 64 * 1024


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_shuffles_as_torch_over_epochs(num_workers):
    """fastloader's DataLoader with shuffle=True: torch's batches, epoch after
    epoch, with a generator and with torch's global RNG (and the global RNG
    left where torch's loader leaves it)."""
    ds = list(range(37))
    for with_gen in (True, False):
        got = {}
        for name, cls in (("torch", torch.utils.data.DataLoader), ("fl", fastloader.DataLoader)):
            torch.manual_seed(11)
            gen = None
            if with_gen:
                gen = torch.Generator()
                gen.manual_seed(4)
            kw = dict(num_workers=num_workers)
            if name == "fl" and num_workers:
                kw["worker_mode"] = "thread"
            dl = cls(ds, batch_size=5, shuffle=True, generator=gen, **kw)
            got[name] = ([[b.tolist() for b in dl] for _ in range(3)], torch.get_rng_state())
        assert got["fl"][0] == got["torch"][0]
        assert torch.equal(got["fl"][1], got["torch"][1])


# ---- torch's DistributedSampler ------------------------------------------------------

from torch.utils.data import DistributedSampler  # noqa: E402


@pytest.mark.parametrize("n", [1, 5, 16, 33])
@pytest.mark.parametrize("world", [1, 3, 8, 40])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_distributed_batches_as_torchs(n, world, drop_last, shuffle):
    """Every rank's batches, as torch's BatchSampler over its DistributedSampler
    gives them (padding cycled over the permutation, drop_last's cut, both
    batch drop_lasts), for a later epoch too."""
    for rank in sorted({0, world // 2, world - 1}):
        for batch_size, batch_drop in ((1, False), (3, False), (3, True), (64, False)):
            s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=3,
                                   drop_last=drop_last)
            for epoch in (0, 5):
                s.set_epoch(epoch)
                bs = BatchSampler(s, batch_size, batch_drop)
                assert sampling.compact(bs)
                got = list(sampling.batches(bs))
                assert got == list(bs), (rank, batch_size, batch_drop, epoch)
                assert all(type(i) is int for b in got for i in b)


def test_distributed_sampler_whose_dataset_changed_fails_as_torchs():
    """A dataset that shrank or grew after the sampler counted it: torch's
    own iterator runs, and raises its own error."""
    data = list(range(10))
    s = DistributedSampler(data, num_replicas=3, rank=1, drop_last=True)
    bs = BatchSampler(s, 2, False)
    data[:] = data[:4]
    with pytest.raises(AssertionError, match="does not match total_size"):
        list(bs)
    with pytest.raises(AssertionError, match="does not match total_size"):
        list(sampling.batches(bs))


def test_distributed_epoch_holds_no_list_of_every_index():
    n = 100_000
    peaks = _heap_peaks(lambda: BatchSampler(DistributedSampler(range(n), num_replicas=2, rank=1), 64, False))
    assert peaks[iter] > n * 28
    assert peaks[sampling.batches] < 64 * 1024


@pytest.mark.parametrize("make", [
    lambda: RandomSampler(range(40), generator=torch.Generator().manual_seed(2)),
    lambda: DistributedSampler(range(40), num_replicas=2, rank=1, seed=2),
])
def test_a_batch_size_changed_mid_epoch_is_read_as_torch_reads_it(make):
    """torch's BatchSampler (drop_last=False) reads batch_size at every batch:
    a schedule that changes it mid-epoch gets the same batches."""
    runs = []
    for pick in (iter, sampling.batches):
        bs = BatchSampler(make(), 3, False)
        out = []
        for b in pick(bs):
            out.append(b)
            bs.batch_size = 3 + len(out)
        runs.append(out)
    assert runs[1] == runs[0] and len({len(b) for b in runs[0]}) > 2


# accelerate's BatchSamplerShard: what accelerator.prepare makes of a shuffled
# loader on more than one process.  Every rank runs the inner BatchSampler over
# the whole epoch and keeps its own batches, so under torch every rank holds
# the epoch's list of every index.

def _shard(n, bs, procs, idx, split, even, drop, gen, inner="random"):
    adl = pytest.importorskip("accelerate.data_loader")
    g = torch.Generator().manual_seed(3) if gen else None
    if inner == "random":
        sampler = RandomSampler(range(n), generator=g)
    elif inner == "random-more":   # num_samples past n: two permutations and a part of a third
        sampler = RandomSampler(range(n), num_samples=2 * n + 3, generator=g)
    elif inner == "seedable":   # use_seedable_sampler=True (transformers' Trainer)
        sampler = adl.SeedableRandomSampler(range(n), generator=g, data_seed=11)
    else:
        sampler = DistributedSampler(range(n), num_replicas=2, rank=1, seed=5, drop_last=drop)
    return adl.BatchSamplerShard(BatchSampler(sampler, bs, drop), procs, idx, split, even), g


def _shard_epochs(make, pick, epochs=1):
    """The batches `pick` (iter or sampling.batches) gives from the shard
    make() builds, over `epochs` epochs, and the generator's and torch's global
    RNG's states after them (torch's global RNG seeded alike before)."""
    torch.manual_seed(7)
    shard, g = make()
    out = []
    for e in range(epochs):
        inner = shard.batch_sampler
        while not hasattr(inner, "sampler"):   # a skip around a shard
            inner = inner.batch_sampler
        inner = inner.sampler
        if hasattr(inner, "set_epoch") and not sampling.seedable(inner):
            inner.set_epoch(e)   # a seedable sampler moves its own epoch on, at its order's end
        out.append((list(pick(shard)), getattr(inner, "epoch", None)))
    return out, (g.get_state().clone() if g is not None else None), torch.get_rng_state().clone()


@pytest.mark.parametrize("split,even,drop", list(itertools.product((False, True), repeat=3)))
@pytest.mark.parametrize("inner,gen", [("random", True), ("random", False), ("random-more", True), ("dist", False),
                                       ("seedable", False), ("seedable", True)])
def test_accelerate_shard_is_accelerates_own_iteration(split, even, drop, inner, gen):
    """The same batches on every process over two epochs, the padding of
    even_batches and the cut of split_batches included, and the generator and
    torch's global RNG left where accelerate's own iteration leaves them."""
    cases = 0
    for n, bs, procs in itertools.product((1, 5, 17, 100), (1, 4, 8), (1, 2, 3)):
        if split and bs % procs:
            continue
        for idx in range(procs):
            def make():
                shard, g = _shard(n, bs, procs, idx, split, even, drop, gen, inner)
                assert sampling.compact(shard)
                return shard, g
            want, got = _shard_epochs(make, iter, 2), _shard_epochs(make, sampling.batches, 2)
            assert got[0] == want[0], (n, bs, procs, idx)
            assert inner != "seedable" or [e for _, e in got[0]] == [1, 2]
            if gen:
                assert torch.equal(got[1], want[1]), (n, bs, procs, idx)
            assert torch.equal(got[2], want[2]), (n, bs, procs, idx)
            cases += 1
    assert cases == (28 if split else 72)   # every (n, batch size, processes, index) accelerate accepts


@pytest.mark.parametrize("skip", [0, 1, 3, 40])
@pytest.mark.parametrize("procs,inner,gen", [(1, "random", False), (2, "random", True), (3, "seedable", False),
                                             (2, "dist", False)])
def test_accelerate_skip_is_accelerates_own_iteration(skip, procs, inner, gen):
    """skip_first_batches' SkipBatchSampler (the epoch a Trainer resumes in)
    around the shard (around torch's BatchSampler on one process): the same
    batches over two epochs, the skipped ones drawn and dropped, and the
    generators where accelerate's own iteration leaves them."""
    adl = pytest.importorskip("accelerate.data_loader")
    for n, bs, drop in itertools.product((5, 17, 100), (1, 4), (False, True)):
        for idx in range(procs):
            def make():
                shard, g = _shard(n, bs, procs, idx, False, True, drop, gen, inner)
                sk = adl.SkipBatchSampler(shard if procs > 1 else shard.batch_sampler, skip)
                assert sampling.compact(sk)
                return sk, g
            want, got = _shard_epochs(make, iter, 2), _shard_epochs(make, sampling.batches, 2)
            assert got[0] == want[0], (n, bs, idx)
            if gen:
                assert torch.equal(got[1], want[1])
            assert torch.equal(got[2], want[2])
    assert skip < 40 or [b for b, _ in want[0]] == [[], []]
    if inner == "seedable":   # its own epoch count, moved on at each epoch's end under the skip and the shard
        assert [e for _, e in want[0]] == [1, 2]


def test_accelerate_shard_reads_its_settings_when_accelerate_does():
    """The shard's own attributes are read (and written) on the shard as
    accelerate's code reaches them: one changed mid-epoch changes the rest of
    the epoch as under accelerate's own iteration."""
    runs = []
    for pick in (iter, sampling.batches):
        shard, _ = _shard(40, 2, 2, 0, False, True, False, True)
        out = []
        for b in pick(shard):
            out.append(b)
            shard.process_index = 1
        runs.append(out)
    assert runs[1] == runs[0]


def test_accelerate_shard_holds_no_list_of_every_index():
    n = 100_000
    peaks = _heap_peaks(lambda: _shard(n, 64, 4, 1, False, True, False, True)[0])
    assert peaks[iter] > n * 28
    assert peaks[sampling.batches] < 64 * 1024


def test_accelerate_shards_it_does_not_recognise_are_iterated_as_they_are(monkeypatch):
    """A subclass of the shard, one whose iterating method is replaced on the
    instance, one over a sampler that is not cut from a tensor (replacement,
    a subclass of accelerate's SeedableRandomSampler, a SequentialSampler):
    never cut from a tensor, their batches their own."""
    adl = pytest.importorskip("accelerate.data_loader")

    class Mine(adl.BatchSamplerShard):
        pass

    def rnd(**kw):
        return RandomSampler(range(10), generator=torch.Generator().manual_seed(1), **kw)

    def patched():
        shard = adl.BatchSamplerShard(BatchSampler(rnd(), 3, False), 2, 0)
        shard._iter_with_no_split = lambda: iter([[0, 1, 2]])
        return shard

    makes = [lambda: Mine(BatchSampler(rnd(), 3, False), 2, 0), patched,
             lambda: adl.BatchSamplerShard(BatchSampler(rnd(replacement=True), 3, False), 2, 1),
             lambda: adl.BatchSamplerShard(BatchSampler(SequentialSampler(range(10)), 3, False), 2, 1)]
    class MySeedable(adl.SeedableRandomSampler):
        pass

    makes.append(lambda: adl.BatchSamplerShard(BatchSampler(MySeedable(range(10), data_seed=2), 3, False), 2, 1))

    class MySkip(adl.SkipBatchSampler):
        pass

    makes.append(lambda: MySkip(adl.BatchSamplerShard(BatchSampler(rnd(), 3, False), 2, 0), 1))
    makes.append(lambda: adl.SkipBatchSampler(BatchSampler(SequentialSampler(range(10)), 3, False), 1))

    def cut(*a):
        raise AssertionError("cut from a tensor")

    want = []
    for make in makes:
        torch.manual_seed(0)
        want.append(list(make()))
    monkeypatch.setattr(sampling, "random_batches", cut)
    monkeypatch.setattr(sampling, "dist_batches", cut)
    for make, w in zip(makes, want):
        shard = make()
        assert not sampling.compact(shard)
        torch.manual_seed(0)
        assert list(sampling.batches(shard)) == w
    assert want[1] == [[0, 1, 2]] and want[3] == [[3, 4, 5], [9, 0, 1]]


# accelerate's SeedableRandomSampler (use_seedable_sampler=True, which
# transformers' Trainer sets): its order is a function of initial_seed + epoch,
# drawn by RandomSampler's own iterator, and its epoch moves on by one when the
# order runs out.

def _seedable_run(make, pick, epochs, stop=None, set_epoch=False):
    """The batches `pick` gives over `epochs` epochs of the batch sampler
    make() builds (torch's global RNG seeded alike before), each epoch's
    sampler epoch after it, the generator's state at the end, torch's global
    RNG's; the epoch `stop` is left after its first two batches."""
    torch.manual_seed(9)
    bs = make()
    out = []
    for e in range(epochs):
        if set_epoch:   # as accelerate's DataLoaderShard does at every epoch's start
            bs.sampler.set_epoch(10 * e)
        it = pick(bs)
        # the sampler's epoch after each batch: it moves on when the indices
        # run out, before a last partial batch is handed out
        got = [(b, bs.sampler.epoch) for b in (itertools.islice(it, 2) if e == stop else it)]
        out.append((got, bs.sampler.epoch))
    return out, bs.sampler.generator.get_state().clone(), torch.get_rng_state().clone()


@pytest.mark.parametrize("gen,data_seed,set_epoch", [(False, None, False), (True, None, False), (False, 4, True),
                                                     (True, 4, True)])
def test_seedable_sampler_is_accelerates_own_iteration(gen, data_seed, set_epoch):
    """The same batches over three epochs (the second stopped early, so its
    epoch does not move on), the sampler's epoch after each, and the
    generator (made by the iterator when there is none) and torch's global
    RNG where accelerate's own iteration leaves them."""
    adl = pytest.importorskip("accelerate.data_loader")
    cases = 0
    for n, num_samples, b, drop in itertools.product((1, 7, 48), (None, 50), (1, 8), (False, True)):
        def make():
            g = torch.Generator().manual_seed(3) if gen else None
            bs = BatchSampler(adl.SeedableRandomSampler(range(n), num_samples=num_samples, generator=g,
                                                        data_seed=data_seed), b, drop)
            assert sampling.compact(bs)
            return bs

        want = _seedable_run(make, iter, 3, stop=1, set_epoch=set_epoch)
        got = _seedable_run(make, sampling.batches, 3, stop=1, set_epoch=set_epoch)
        assert got[0] == want[0], (n, num_samples, b, drop)
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        cases += 1
    assert cases == 24
    # the premise: the order moves with the epoch, which the early stop holds back
    assert want[0][0][0] != want[0][2][0]
    assert [e for _, e in want[0]] == ([1, 10, 21] if set_epoch else [1, 1, 2])


def test_seedable_sampler_holds_no_list_of_every_index():
    adl = pytest.importorskip("accelerate.data_loader")
    n = 100_000
    peaks = _heap_peaks(lambda: BatchSampler(adl.SeedableRandomSampler(range(n), data_seed=1), 64, False))
    assert peaks[iter] > n * 28
    assert peaks[sampling.batches] < 64 * 1024


def test_a_seedable_subclass_or_replacement_is_iterated_as_it_is(monkeypatch):
    adl = pytest.importorskip("accelerate.data_loader")

    class Mine(adl.SeedableRandomSampler):
        pass

    for sampler in (Mine(range(10), data_seed=1), adl.SeedableRandomSampler(range(10), replacement=True,
                                                                             data_seed=1)):
        assert not sampling.compact(BatchSampler(sampler, 3, False))
    bs = BatchSampler(adl.SeedableRandomSampler(range(10), data_seed=1), 3, False)
    assert sampling.compact(bs)
    monkeypatch.setattr(adl.SeedableRandomSampler, "__iter__", lambda self: iter(range(10)))
    assert not sampling.compact(bs)
    assert list(sampling.batches(bs))[0] == [0, 1, 2]


def test_a_seedable_generator_is_made_as_accelerates_version_makes_it(monkeypatch):
    """accelerate 1.0-1.4 make the missing generator on the CPU, 1.5 on
    torch's default device."""
    acc = pytest.importorskip("accelerate")
    made = []
    monkeypatch.setattr(torch, "get_default_device", lambda: made.append(1) or torch.device("cpu"))
    for version, default_device in (("1.4.0", False), ("1.5.0", True), ("1.16.0", True)):
        monkeypatch.setattr(acc, "__version__", version)
        made.clear()
        assert sampling._seedable_generator().device.type == "cpu"
        assert bool(made) is default_device, version
