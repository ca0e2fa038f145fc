"""Elastic resume (fastloader/elastic.py, fastloader/state.py): a state saved
on one topology -- world size, rank, num_workers, worker_mode, batch_size --
resumes on another, every sample of the epoch delivered once over the run,
each with the pixels of the uninterrupted run.

The ranks here are simulated in one process (torch's DistributedSampler
takes num_replicas and rank without a process group); the torchrun tests in
test_elastic_torchrun.py run the same on real gloo ranks.  References: torch's
DistributedSampler for the order of each epoch's first deal, and an
uninterrupted run for each sample's tensor.
"""
import collections
import io
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import Dataset, DistributedSampler  # noqa: E402

import fastloader  # noqa: E402
from fastloader import elastic as E  # noqa: E402
from helpers_elastic import (N, TRAIN, Keyed, make, make_wds, reference, samples, uninterrupted,  # noqa: E402
                             wds_labels, wds_reference, wds_samples, write_images, write_wds)

pytestmark = pytest.mark.fastloader_only


# -- the deal, as pure functions ---------------------------------------------------------------

def test_compress_round_trips():
    rng = np.random.default_rng(0)
    for t in range(3000):
        a = rng.integers(-5, 30, rng.integers(0, 20))
        if t % 3 == 0:
            a = np.sort(a)
        if t % 5 == 0:
            a = np.arange(rng.integers(0, 9), rng.integers(10, 40), rng.integers(1, 4))
        r = E.compress(a)
        assert np.array_equal(E.ranges_array(r), a), (a, r)
    r = E.compress(np.arange(0, 1_000_000, 3))
    assert len(r) == 1 and range(*r[0]) == range(0, 1_000_000, 3)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_first_deal_is_distributed_samplers_order(shuffle, drop_last):
    for n in (1, 2, 5, 17, 40, 101):
        for W in (1, 2, 3, 4, 7):
            if drop_last and n < W:
                continue
            for r in range(W):
                s = DistributedSampler(range(n), num_replicas=W, rank=r, shuffle=shuffle, seed=3,
                                       drop_last=drop_last)
                s.set_epoch(5)
                d = E.first_deal(s)
                pos = E.share_positions(d["source"], W, r, drop_last, n)
                assert E.epoch_perm(n, shuffle, 3, 5)[pos].tolist() == list(s), (n, W, r)


def _delivered(source, W, ms, n, drop_last):
    """The real (non-padding) perm positions ranks at places `ms` received."""
    L = E.ranges_len(source)
    src = E.ranges_array(source)
    got = []
    for r in range(W):
        coords = np.arange(r, r + ms[r] * W, W)
        got += src[coords[coords < L]].tolist()
    return got


def test_remaining_deals_every_position_once():
    """Random deals, ranks at random places (not in lockstep), chained over
    several topologies: the positions received at each deal's places plus
    the last deal's shares are every perm position exactly once (drop_last:
    at most once, and only the cut tail is missing)."""
    rng = np.random.default_rng(1)
    for t in range(400):
        n = int(rng.integers(1, 80))
        drop = bool(t % 4 == 3)
        W = int(rng.integers(1, min(n, 6) + 1))
        source = [[0, n, 1]]
        seen = []
        for hop in range(int(rng.integers(1, 4))):
            share = len(E.share_positions(source, W, 0, drop, n))
            ms = rng.integers(0, share + 1, W)
            seen += _delivered(source, W, ms, n, drop)
            source = E.remaining({"source": source, "world": W}, dict(enumerate(ms)))
            W = int(rng.integers(1, 7))
        shares = [E.share_positions(source, W, r, drop, n) for r in range(W)]
        assert len({len(s) for s in shares}) == 1   # DDP: every rank the same number of samples
        L = E.ranges_len(source)
        last = _delivered(source, W, [len(s) for s in shares], n, drop)
        c = collections.Counter(seen + last)
        assert max(c.values(), default=1) == 1, (t, c)
        if not drop:
            assert sorted(c) == list(range(n)), t
            pad = sum(len(s) for s in shares) - L   # padding copies: perm's head
            assert sorted(np.concatenate(shares).tolist()) == sorted(E.ranges_array(source).tolist()
                                                                      + [i % n for i in range(pad)])


def test_lockstep_state_is_a_few_ranges():
    """A lockstep resume of an epoch's first deal is one range, so the state
    stays small for any dataset size."""
    d = {"source": [[0, 1_281_167, 1]], "world": 32}
    rest = E.remaining(d, {r: 1000 for r in range(32)})
    assert rest == [[32_000, 1_281_167, 1]]
    rest2 = E.remaining({"source": rest, "world": 24}, {r: 700 for r in range(24)})
    assert rest2 == [[32_000 + 16_800, 1_281_167, 1]]


# -- loaders over simulated ranks ----------------------------------------------------------------

@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("elastic"))


def _make(kind, paths, W, r, **kw):
    return make(kind, paths, W, r, **kw)


_samples, _reference, _uninterrupted = samples, reference, uninterrupted


def _run_ranks(kind, paths, W, ks, **kw):
    """Ranks 0..W-1 of epoch 0, rank r stopped after ks[r] batches:
    (samples each received, each rank's state)."""
    got, states = [], []
    for r in range(W):
        s, dl = _make(kind, paths, W, r, **kw)
        s.set_epoch(0)
        it = iter(dl)
        mine = []
        for _ in range(ks[r]):
            mine += _samples(next(it), kind)
        states.append(dl.state_dict())
        del it
        got.append(mine)
    return got, states


def _resume_ranks(kind, paths, W, state, epochs=2, **kw):
    """Ranks 0..W-1 after loading `state` (one state, or a list): per rank,
    per epoch, the batches as [(index, tensor)] lists."""
    out = []
    for r in range(W):
        s, dl = _make(kind, paths, W, r, **kw)
        dl.load_state_dict(state)
        eps = []
        for e in range(epochs):
            s.set_epoch(e)
            eps.append([_samples(b, kind) for b in dl])
        out.append(eps)
    return out


def _check_once(before, after, ref, perm_head=()):
    """Each index of the epoch once over before + after (plus the padding
    copies `perm_head`), each with the uninterrupted run's tensor."""
    flat = [s for rank in before for s in rank] + [s for rank in after for b in rank[0] for s in b]
    c = collections.Counter(i for i, _ in flat)
    assert sorted(c) == list(range(N))
    extra = sorted(i for i, k in c.items() for _ in range(k - 1))
    assert extra == sorted(perm_head), (extra, perm_head)
    for i, t in flat:
        assert torch.equal(t, ref[i]), i


def _same_batches(a, b):
    assert [[i for i, _ in x] for x in a] == [[i for i, _ in x] for x in b]
    for x, y in zip(a, b):
        for (_, s), (_, t) in zip(x, y):
            assert torch.equal(s, t)


@pytest.mark.parametrize("kind", ["native", "python"])
def test_four_ranks_to_two_and_to_three(kind, paths):
    """4 ranks stopped after 2 batches of 3 (24 of 40 samples): one rank's
    state resumes on 2 ranks (8 each, no padding), all four states merged
    resume on 3 (6 each: 2 padding copies, perm's first two), every sample
    with the uninterrupted run's tensor; the next epoch is what an
    uninterrupted run on the new topology gives."""
    ref = _reference(kind, paths)
    before, states = _run_ranks(kind, paths, 4, [2] * 4)
    perm = E.epoch_perm(N, True, 11, 0)
    for W2, state, head in ((2, states[3], ()), (3, fastloader.resume_state(states), perm[:2].tolist())):
        after = _resume_ranks(kind, paths, W2, state)
        _check_once(before, after, ref, head)
        assert {len(sum(rank[0], [])) for rank in after} == {16 // W2 + (16 % W2 > 0)}
        nxt = _uninterrupted(kind, paths, W2, 1)
        for r in range(W2):
            _same_batches(after[r][1], nxt[r])


def test_one_rank_to_four_and_ranks_not_in_lockstep(paths):
    """1 -> 4 (DistributedSampler with num_replicas=1 on one process), and
    4 ranks stopped at different places (merged exactly) -> 4 again at
    another batch size."""
    kind = "native"
    ref = _reference(kind, paths)
    before, states = _run_ranks(kind, paths, 1, [5])
    after = _resume_ranks(kind, paths, 4, states[0], epochs=1)
    _check_once(before, after, ref, E.epoch_perm(N, True, 11, 0)[:3].tolist())   # 25 left: 7 each
    before, states = _run_ranks(kind, paths, 4, [1, 3, 0, 2])
    after = _resume_ranks(kind, paths, 4, fastloader.resume_state(states), epochs=1, B=2)
    left = N - 3 * 6
    pad = -left % 4
    _check_once(before, after, ref, E.epoch_perm(N, True, 11, 0)[:pad].tolist())


def test_resume_of_a_resumed_epoch(paths):
    """4 -> 3 -> checkpoint again mid-way -> 2: the re-dealt epoch's state
    carries its deal, and the chain still delivers each sample once."""
    kind = "python"
    ref = _reference(kind, paths)
    before, states = _run_ranks(kind, paths, 4, [2] * 4)      # 24 received, 16 left
    merged = fastloader.resume_state(states)
    mid, states3 = [], []
    for r in range(3):                                       # 6 each on 3 ranks; stop after 1 batch
        s, dl = _make(kind, paths, 3, r)
        dl.load_state_dict(merged)
        s.set_epoch(0)
        it = iter(dl)
        mid.append(_samples(next(it), kind))
        states3.append(dl.state_dict())
        del it
    assert states3[0]["elastic"]["world"] == 3 and states3[0]["elastic"]["consumed"] == 3
    after = _resume_ranks(kind, paths, 2, fastloader.resume_state(states3), epochs=1)
    perm = E.epoch_perm(N, True, 11, 0)
    # the 3-rank deal padded with perm[0], perm[1]; 3 x 3 of its 18 received; 9 left -> 2 x 5, one more copy
    got = before + mid
    flat = [s for rank in got for s in rank] + [s for r in after for b in r[0] for s in b]
    c = collections.Counter(i for i, _ in flat)
    assert sorted(c) == list(range(N))
    extra = sorted(i for i, k in c.items() for _ in range(k - 1))
    assert len(extra) == sum(c.values()) - N and set(extra) <= set(perm[:2].tolist())
    for i, t in flat:
        assert torch.equal(t, ref[i])


@pytest.mark.parametrize("kind", ["native", "python"])
def test_same_topology_is_the_uninterrupted_run(kind, paths):
    """Nothing about the deal changes: the rank's batches are its
    uninterrupted run's; the batch size changes: its samples are, in order,
    padding included."""
    unint = _uninterrupted(kind, paths, 3, 0)
    for B in (3, 2):
        for r in range(3):
            _, states = _run_ranks(kind, paths, 3, [2] * 3)
            s, dl = _make(kind, paths, 3, r, B=B)
            dl.load_state_dict(states[r])
            s.set_epoch(0)
            rest = [_samples(b, kind) for b in dl]
            if B == 3:
                _same_batches(rest, unint[r][2:])
            else:
                _same_batches([sum(rest, [])], [sum(unint[r][2:], [])])
                assert [len(b) for b in rest] == [2, 2, 2, 2]   # 14 a rank, 6 received


# -- one rank: num_workers, worker_mode, batch_size ------------------------------------------------

def _one(kind, paths, B, nw, mode, gen=4):
    ds = fastloader.ImageList(paths, labels=list(range(N)), transform=TRAIN) if kind == "native" else Keyed()
    return fastloader.DataLoader(ds, batch_size=B, shuffle=True, num_workers=nw, seed=7,
                                 generator=torch.Generator().manual_seed(gen),
                                 worker_mode=mode if kind != "native" else "auto")


@pytest.mark.parametrize("kind,before,after", [
    ("native", (4, 2, "thread"), (3, 4, "thread")),
    ("python", (4, 2, "thread"), (2, 4, "process")),
    ("python", (5, 2, "process"), (3, 0, "thread")),
])
def test_one_rank_other_workers_mode_and_batch_size(kind, paths, before, after):
    """A RandomSampler's order cut again: after 3 batches at one
    (batch_size, num_workers, worker_mode), the resumed loader at another
    yields the uninterrupted run's samples from there on, in order, cut at
    its own batch size, then the next epoch as the uninterrupted run."""
    B0, nw0, m0 = before
    B1, nw1, m1 = after
    dl = _one(kind, paths, B0, 0, "thread")
    ref = []
    for _ in range(2):
        ref.append(sum((_samples(b, kind) for b in dl), []))
    dl = _one(kind, paths, B0, nw0, m0)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    del it
    dl = _one(kind, paths, B1, nw1, m1)
    dl.load_state_dict(state)
    rest = [_samples(b, kind) for b in dl]
    assert {len(b) for b in rest[:-1]} == {B1}
    _same_batches([sum(rest, [])], [ref[0][3 * B0:]])
    # and a state of the resumed epoch, then the next epoch
    dl2 = _one(kind, paths, B1, nw1, m1)
    dl2.load_state_dict(state)
    it = iter(dl2)
    next(it)
    st2 = dl2.state_dict()
    del it
    assert st2["skip"] == 3 * B0 and st2["num_yielded"] == 1
    dl3 = _one(kind, paths, B0, nw0, m0)
    dl3.load_state_dict(st2)
    rest2 = sum((_samples(b, kind) for b in dl3), [])
    _same_batches([rest2], [ref[0][3 * B0 + B1:]])
    _same_batches([sum((_samples(b, kind) for b in dl3), [])], [ref[1]])


# -- what cannot be dealt again is refused -------------------------------------------------------

class StatefulDs(Dataset):
    def __init__(self):
        self.reads = 0

    def __len__(self):
        return N

    def __getitem__(self, i):
        self.reads += 1
        return i

    def state_dict(self):
        return {"reads": self.reads}

    def load_state_dict(self, st):
        self.reads = st["reads"]


def _state_after(dl, k):
    it = iter(dl)
    for _ in range(k):
        next(it)
    st = dl.state_dict()
    del it
    return st


def test_refusals_say_why(paths):
    ds = Keyed()
    dist = lambda W, r, **kw: DistributedSampler(ds, num_replicas=W, rank=r, seed=11, **kw)  # noqa: E731
    st = _state_after(fastloader.DataLoader(ds, batch_size=3, sampler=dist(4, 0)), 2)
    # a DistributedSampler state into a loader without one
    dl = fastloader.DataLoader(ds, batch_size=3, shuffle=True)
    dl.load_state_dict(st)
    with pytest.raises(ValueError, match="DistributedSampler.*num_replicas=1, rank=0"):
        iter(dl)
    # ... or with another seed / shuffle / drop_last
    for kw, what in (({"seed": 12}, "seed=11"), ({"shuffle": False}, "shuffle"), ({"drop_last": True}, "drop_last")):
        s = DistributedSampler(ds, num_replicas=2, rank=0, **dict({"seed": 11}, **kw))
        dl = fastloader.DataLoader(ds, batch_size=3, sampler=s)
        dl.load_state_dict(st)
        with pytest.raises(ValueError, match=what):
            iter(dl)
    # another sampler's state into a DistributedSampler loader
    st2 = _state_after(fastloader.DataLoader(ds, batch_size=3, shuffle=True,
                                             generator=torch.Generator().manual_seed(1)), 2)
    dl = fastloader.DataLoader(ds, batch_size=3, sampler=dist(2, 0), generator=torch.Generator().manual_seed(1))
    dl.load_state_dict(st2)
    with pytest.raises(ValueError, match="not a DistributedSampler"):
        iter(dl)
    # a dataset's own per-worker states: the same worker processes only
    st3 = _state_after(fastloader.DataLoader(StatefulDs(), batch_size=3, num_workers=2, worker_mode="process"), 2)
    for nw, mode in ((3, "process"), (2, "thread")):
        dl = fastloader.DataLoader(StatefulDs(), batch_size=3, num_workers=nw, worker_mode=mode)
        dl.load_state_dict(st3)
        with pytest.raises(ValueError, match="not dealt again"):
            iter(dl)
    st4 = _state_after(fastloader.DataLoader(StatefulDs(), batch_size=3, num_workers=2, worker_mode="thread"), 2)
    dl = fastloader.DataLoader(StatefulDs(), batch_size=3, num_workers=2, worker_mode="process")
    dl.load_state_dict(st4)
    with pytest.raises(ValueError, match="worker_mode='thread'"):
        iter(dl)
    # merging: every rank once, of one epoch's deal
    sts = [_state_after(fastloader.DataLoader(ds, batch_size=3, sampler=dist(3, r)), 1) for r in range(3)]
    with pytest.raises(ValueError, match="ranks \\[0, 2\\]"):
        fastloader.resume_state([sts[0], sts[2]])
    with pytest.raises(ValueError, match="not saved with torch's DistributedSampler"):
        fastloader.resume_state([sts[0], st2])
    with pytest.raises(ValueError, match="world"):
        fastloader.resume_state([sts[0], st])


def test_state_size_and_list_loading():
    """A DistributedSampler state is small plain types (JSON), and
    load_state_dict takes the list of every rank's states as resume_state's
    merge of them."""
    import json

    ds = Keyed()
    def states(gen):
        return [_state_after(fastloader.DataLoader(ds, batch_size=3, sampler=DistributedSampler(
            ds, num_replicas=4, rank=r, seed=11), generator=torch.Generator().manual_seed(0) if gen else None), 2)
            for r in range(4)]

    with pytest.warns(UserWarning, match="different base seeds"):   # torch's global RNG: one seed a rank
        fastloader.resume_state(states(False))
    assert all(len(json.dumps(s)) < 2000 for s in states(False))
    sts = states(True)   # with a torch generator's 5 KB state
    assert all(len(json.dumps(s)) < 10_000 for s in sts), [len(json.dumps(s)) for s in sts]
    out = []
    for how in ("list", "merged"):
        s = DistributedSampler(ds, num_replicas=3, rank=1, seed=11)
        dl = fastloader.DataLoader(ds, batch_size=3, sampler=s, generator=torch.Generator().manual_seed(0))
        dl.load_state_dict(sts if how == "list" else fastloader.resume_state(sts))
        out.append([b[:, 0].tolist() for b in dl])
    assert out[0] == out[1] and sum(len(b) for b in out[0]) == 6


# -- tar shards --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_wds(tmp_path_factory.mktemp("elastic_wds"))


def _shard_first(url):
    return int(url.rsplit("-", 1)[1][:4]) * 7   # write_shards: shard s holds samples 7s..


@pytest.mark.parametrize("shuffle", [0, 5, 30, 200])
def test_stream_order_is_the_readers(shards, shuffle):
    """_C.shards_order, which reads nothing, gives the sample of each
    position that the reader publishes, for every rank of 1, 2, 3 and 6
    (6: one shard a rank, and the rank of the short one goes round it again)."""
    from fastloader import _C

    for W in (1, 2, 3, 6):
        for r in range(W):
            ds = fastloader.WebDataset(shards, transform=TRAIN, shuffle=shuffle, seed=3, rank=r, world_size=W)
            got = torch.cat([y for _, y in fastloader.DataLoader(ds, batch_size=4, num_workers=2)]).tolist()
            urls = ds.shards_for(0)
            counts = [ds._shard_counts()[ds.urls.index(u)] for u in urls]
            sh, k = _C.shards_order(counts, [None] * len(urls), shuffle, 3, 0, len(ds), len(ds))
            first = [_shard_first(u) for u in urls]
            want = [first[a] + b for a, b in zip(np.frombuffer(sh, np.int32), np.frombuffer(k, np.int64))]
            assert got == want, (W, r)


def _wds_run(shards, W, ks, B=3):
    got, states = [], []
    for r in range(W):
        _, dl = make_wds(shards, W, r, B=B)
        it = iter(dl)
        mine = []
        for _ in range(ks[r]):
            mine += wds_labels(next(it))
        states.append(dl.state_dict())
        del it
        got.append(mine)
    return got, states


def _wds_resume(shards, W, state, B=3, epochs=1, fields=()):
    out = []
    for r in range(W):
        _, dl = make_wds(shards, W, r, B=B, fields=fields)
        dl.load_state_dict(state)
        eps = []
        for _ in range(epochs):
            eps.append([b for b in dl])
        out.append(eps)
    return out


def _once(labels):
    c = collections.Counter(labels)
    assert sorted(c) == list(range(N)) and max(c.values()) == 1, c


def test_stream_resumes_on_other_world_sizes(shards):
    """4 ranks (5 shards of 7 and one of 5 for 40 samples; nominal 10 a rank,
    so ranks with 2 shards stop early and ranks with 1 go round it again),
    stopped after 2 batches of 3: resumed on 2 ranks from rank 0's state,
    on 3 from every rank's, on 1, at another batch size: the samples no
    rank received, each once, dealt in equal shares; the next epoch is the
    new topology's own.  Each sample has the pixels it has on any topology
    (its augmentation keyed by its shard and its place in it)."""
    ref = wds_reference(shards)
    before, states = _wds_run(shards, 4, [2] * 4)
    seen = sum(before, [])
    assert len(seen) == 24 and len(set(seen)) == 24
    for W2, state, B in ((2, states[0], 3), (3, fastloader.resume_state(states), 3), (1, states[1], 5),
                         (4, states[2], 2)):
        after = _wds_resume(shards, W2, state, B=B, epochs=2)
        rest = [lab for r in after for b in r[0] for lab in wds_labels(b)]
        # the epoch's 40 samples less the 24 received, cut into W2 equal shares (the remainder left out)
        assert len(rest) == (N - 24) // W2 * W2, (W2, len(rest))
        assert not set(rest) & set(seen) and len(set(rest)) == len(rest)
        if (N - 24) % W2 == 0:
            _once(seen + rest)
        shares = [sum(len(b[1]) for b in r[0]) for r in after]
        assert len(set(shares)) == 1   # DDP: every rank the same number of samples
        for lab, x in (s for r in after for b in r[0] for s in wds_samples(b)):
            assert torch.equal(x, ref[lab]), lab
        for r in range(W2):   # the next epoch: as an uninterrupted run on W2 ranks
            _, dl = make_wds(shards, W2, r, B=B)
            list(dl)
            assert [wds_labels(b) for b in after[r][1]] == [wds_labels(b) for b in dl]


def test_stream_resume_chain_fields_and_the_readers_masks(shards):
    """4 -> 3 -> (checkpoint again) -> 2: the second state carries the first
    deal in its history; fields stay with their samples; and the resumed
    ranks read exactly what _C.shards_order says the kept samples give."""
    from fastloader import elastic as El

    before, states = _wds_run(shards, 4, [1, 1, 1, 1])      # 12 received
    merged = fastloader.resume_state(states)
    mid, states3 = [], []
    for r in range(3):
        _, dl = make_wds(shards, 3, r)
        dl.load_state_dict(merged)
        it = iter(dl)
        mid += wds_labels(next(it))
        states3.append(dl.state_dict())
        del it
    assert states3[0]["stream"]["history"] == [[4, [3, 3, 3, 3]]] and states3[0]["stream"]["world"] == 3
    last = fastloader.resume_state(states3)
    for r in range(2):   # the reader with keep masks == the order computed from them
        _, dl = make_wds(shards, 2, r, fields=("cls",))
        ds = dl.dataset
        ids, keep, nominal, _ = El.stream_plan(ds, last, 3)
        urls = [ds.urls[g] for g in ids]
        counts = [ds._shard_counts()[g] for g in ids]
        sh, k = El._C_order(counts, keep, ds.shuffle, ds.seed, 0, nominal, nominal)
        want = [_shard_first(urls[a]) + b for a, b in zip(sh, k)]
        dl.load_state_dict(last)
        batches = list(dl)
        assert sum((wds_labels(b) for b in batches), []) == want
        assert all([int(v) for v in b[2]["cls"]] == wds_labels(b) for b in batches)   # fields with their samples
    after = _wds_resume(shards, 2, last)
    rest = [lab for r in after for b in r[0] for lab in wds_labels(b)]
    total = sum(before, []) + mid + rest
    assert len(set(total)) == len(total) and len(total) == 12 + 9 + (N - 21) // 2 * 2


def test_stream_refusals(shards, tmp_path):
    _, states = _wds_run(shards, 2, [1, 1])
    bad = dict(states[0], stream=dict(states[0]["stream"], skipped=1))
    _, dl = make_wds(shards, 3, 0)
    dl.load_state_dict(bad)
    with pytest.raises(ValueError, match="skipped 1 unreadable shard"):
        iter(dl)
    ds = fastloader.WebDataset(shards, transform=TRAIN, shuffle=10, seed=4, rank=0, world_size=3)
    dl = fastloader.DataLoader(ds, batch_size=3, seed=7)
    dl.load_state_dict(states[0])
    with pytest.raises(ValueError, match="another seed"):
        iter(dl)
    piped = [f"pipe:cat {u}" for u in shards]   # no index.json to count a piped shard's samples
    ds = fastloader.WebDataset(piped, transform=TRAIN, shuffle=10, seed=3, rank=0, world_size=3, epoch_length=N)
    dl = fastloader.DataLoader(ds, batch_size=3, seed=7)
    dl.load_state_dict(states[0])
    with pytest.raises(ValueError, match="index.json"):
        iter(dl)
    with pytest.raises(ValueError, match="ranks \\[1, 1\\]"):
        fastloader.resume_state([states[1], states[1]])


def test_stream_redeal_checks_the_counts_it_dealt_by(tmp_path):
    """An index.json whose counts no longer match its shards (a shard
    rewritten after the index was): the re-dealt epoch would miss or repeat
    samples, so the rank that reads such a shard to its end raises, naming
    it and both counts."""
    import json
    import tarfile

    from test_webdataset import write_shards

    paths = write_shards(str(tmp_path / "wds"), n=N, per=7)
    with open(tmp_path / "wds" / "index.json", "w") as f:
        json.dump({"shards": [os.path.basename(p) for p in paths], "counts": [7] * (N // 7) + [N % 7]}, f)
    _, states = _wds_run(paths, 4, [1] * 4)
    for p in paths[:-1]:   # drop each full shard's last sample (2 members)
        with tarfile.open(p) as tf:
            members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
        with tarfile.open(p, "w") as tf:
            for m, data in members[:-2]:
                tf.addfile(m, io.BytesIO(data))
    errors = []
    for r in range(2):
        _, dl = make_wds(paths, 2, r)
        dl.load_state_dict(states[0])
        try:
            list(dl)
        except OSError as e:
            errors.append(str(e))
    assert errors and all(re.search(r"s-\d{4}\.tar holds 6 samples, but the counts .* say 7", m) for m in errors), \
        errors


def test_distributed_sampler_without_batch_sampler_and_old_states(paths):
    """batch_size=None (the sampler's indices one sample at a time) records
    no deal: the state still resumes on its own topology, and is refused on
    another with the reason; a state saved before deals were recorded (no
    "elastic", no sampler "dist") resumes as it was saved."""
    ds = Keyed()

    def loader(W, r, bs=None):
        s = DistributedSampler(ds, num_replicas=W, rank=r, seed=11)
        return fastloader.DataLoader(ds, batch_size=bs, sampler=s, generator=torch.Generator().manual_seed(4))

    want = [t.tolist() for t in loader(4, 1)]
    st = _state_after(loader(4, 1), 3)
    dl = loader(4, 1)
    dl.load_state_dict(st)
    assert [t.tolist() for t in dl] == want[3:]
    dl = loader(2, 1)
    dl.load_state_dict(st)
    with pytest.raises(ValueError, match="batch_size=None or a batch_sampler"):
        iter(dl)
    old = _state_after(loader(4, 1, bs=3), 2)
    old = dict(old, sampler={k: v for k, v in old["sampler"].items() if k != "dist"})
    old.pop("elastic")
    dl = loader(4, 1, bs=3)
    dl.load_state_dict(old)
    assert [b.tolist() for b in dl] == [b.tolist() for b in loader(4, 1, bs=3)][2:]


def test_a_refused_state_stays_refused(shards):
    """A plan that cannot be made raises at iter(), and the state stays
    loaded: iter() again raises again, never an epoch from its start."""
    _, states = _wds_run(shards, 2, [1, 1])
    bad = dict(states[0], stream=dict(states[0]["stream"], skipped=1))
    _, dl = make_wds(shards, 3, 0)
    dl.load_state_dict(bad)
    for _ in range(2):
        with pytest.raises(ValueError, match="skipped 1 unreadable shard"):
            iter(dl)


def test_stream_refuses_another_shard_list_or_shardshuffle(shards):
    _, states = _wds_run(shards, 2, [1, 1])
    for urls, kw, what in ((list(reversed(shards)), {}, "listed other shards"),
                           (shards, {"shardshuffle": False}, "shardshuffle")):
        ds = fastloader.WebDataset(urls, transform=TRAIN, shuffle=10, seed=3, rank=0, world_size=3, **kw)
        dl = fastloader.DataLoader(ds, batch_size=3, seed=7)
        dl.load_state_dict(states[0])
        with pytest.raises(ValueError, match=what):
            iter(dl)
    with pytest.raises(ValueError, match="not a WebDataset state"):
        fastloader.resume_state([states[0], dict(states[1], stream={})])


def test_stream_redeal_never_gives_more_than_the_uninterrupted_epoch(shards):
    """3 ranks of an epoch of 40 yield 13 each: 39 positions. After 3
    samples each, one rank takes what is left: 30, not the 31 unreceived."""
    _, states = _wds_run(shards, 3, [1] * 3)
    after = _wds_resume(shards, 1, fastloader.resume_state(states))
    assert sum(len(b[1]) for b in after[0][0]) == 39 - 9


def test_stream_epoch_checks_index_json_counts(tmp_path):
    """Counts known at construction (index.json): every epoch's reader checks
    the shards it reads to their end against them, so a stale index.json
    fails the first epoch, before any state can be dealt by wrong counts."""
    import json

    from test_webdataset import write_shards

    paths = write_shards(str(tmp_path / "wds"), n=20, per=5)
    with open(tmp_path / "wds" / "index.json", "w") as f:
        json.dump({"shards": [os.path.basename(p) for p in paths], "counts": [5, 5, 6, 5]}, f)
    ds = fastloader.WebDataset(paths, transform=TRAIN, shuffle=1, shardshuffle=False)
    with pytest.raises(OSError, match=r"s-0002\.tar holds 5 samples, but the counts .* say 6"):
        list(fastloader.DataLoader(ds, batch_size=4))


def test_keep_entries_are_checked():
    from fastloader import _C

    with pytest.raises(TypeError, match="keep\\[0\\] must be None or a tuple"):
        _C.shards_order([3], [[b"\x07", 3]], 1, 0, 0, 3, 3)
    with pytest.raises(ValueError, match="bits in a mask"):
        _C.shards_order([3], [(b"\x07", 1 << 62)], 1, 0, 0, 3, 3)
    with pytest.raises(ValueError, match="a count of"):
        _C.shards_order([3], [(None, 0, -5)], 1, 0, 0, 3, 3)
    sh, k = _C.shards_order([3, 2], [(b"\x05", 3), (None, 0, 2)], 1, 0, 0, 4, 4)
    assert list(np.frombuffer(k, np.int64)) == [0, 2, 0, 1] and list(np.frombuffer(sh, np.int32)) == [0, 0, 1, 1]
