"""Elastic resume: a DistributedSampler's epoch as one global sequence dealt
to ranks, so that a state saved on one topology resumes on another.

The epoch's sequence.  torch's DistributedSampler (its own __iter__) orders
an epoch as `perm` = randperm(n) seeded by seed + epoch (arange(n) without
shuffle): a function of (seed, epoch) alone.  Rank r of W takes G[r::W] of
G = perm padded with perm's head to a multiple of W (drop_last: cut to one).

A *deal* is that with a source: an ordered list S of positions into perm
(range(n) for an epoch's first deal), dealt to W ranks as
G = S + [0, 1, 2, ...] (perm positions, cycled over n) padded to a multiple
of W, or S cut to one with drop_last; rank r takes G[r::W].  For S = range(n)
that is exactly DistributedSampler's order.

A rank's place in a deal is the number of samples it has received, m_r: it
has received G[r + j*W] for j < m_r.  A resume on any topology takes the
positions of S no rank has received, R = S minus {S[r + j*W] : j < m_r,
r + j*W < len(S)} (padding entries are copies: receiving one delivers
nothing of its own), in S's order, and deals R to the new ranks.  So every
position of the epoch's first deal is received exactly once over the whole
run, plus padding copies and minus drop_last's cut, as DistributedSampler
documents them.  A deal resumed on the topology it was dealt to, all ranks
at the same place, continues as the uninterrupted deal would, padding
included (R's padding is perm's head, as the original's).

With one rank's state the ranks are taken to be at the same place (DDP's
lockstep: every rank has received the same number of batches when a step's
checkpoint is written); resume_state() merges the states of all ranks for
the exact set.

Positions travel as lists of [start, stop, step] ranges (a whole epoch is
one range; a lockstep resume keeps the source's ranges), so a state stays a
few hundred bytes for any dataset size.

All functions run on the consumer thread with the GIL; they return new
objects and raise ValueError for a state that cannot be dealt.
"""
from __future__ import annotations

import copy
import math
import warnings

import numpy as np

from .sampling import batching, dist_like, plain_dist

try:
    import torch
except ImportError:  # pragma: no cover - exercised by tests/test_no_torch.py
    torch = None


# -- positions as ranges -------------------------------------------------------------------

def ranges_len(rs):
    """Number of positions in a list of [start, stop, step] ranges."""
    return sum(len(range(*r)) for r in rs)


def ranges_array(rs):
    """The positions of `rs` as an int64 array."""
    if not rs:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(*r, dtype=np.int64) for r in rs])


def ranges_tail(rs, k):
    """The positions of `rs` from the k-th on, as ranges (nothing materialised)."""
    out = []
    for r in rs:
        rg = range(*r)
        if k >= len(rg):
            k -= len(rg)
            continue
        rg = rg[k:]
        k = 0
        out.append([rg.start, rg.stop, rg.step])
    return out


def compress(a):
    """The int array `a` as [start, stop, step] ranges: cut greedily from
    the left into runs of constant, non-zero step (a repeated position is a
    range of its own)."""
    a = np.asarray(a, dtype=np.int64)
    n = len(a)
    out = []
    if n == 0:
        return out
    d = np.diff(a)
    change = np.flatnonzero(d[1:] != d[:-1]) + 1   # d[p] != d[p - 1]
    i = 0
    while i < n:
        if i == n - 1 or d[i] == 0:
            out.append([int(a[i]), int(a[i]) + 1, 1])
            i += 1
            continue
        k = np.searchsorted(change, i, side="right")
        j = int(change[k]) if k < len(change) else n - 1   # a[i..j] steps by d[i]
        step = int(d[i])
        out.append([int(a[i]), int(a[j]) + step, step])
        i = j + 1
    return out


# -- torch's DistributedSampler ----------------------------------------------------------------

def first_deal(dist):
    """The record of an epoch's first deal for DistributedSampler `dist`."""
    n = len(dist.dataset)
    return {"n": n, "shuffle": bool(dist.shuffle), "seed": int(dist.seed), "drop_last": bool(dist.drop_last),
            "epoch": int(dist.epoch), "world": int(dist.num_replicas), "rank": int(dist.rank),
            "source": [[0, n, 1]], "share": int(dist.num_samples)}


def epoch_perm(n, shuffle, seed, epoch):
    """perm for the epoch: what DistributedSampler.__iter__ shuffles."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    g = torch.Generator()
    g.manual_seed(int(seed) + int(epoch))
    return torch.randperm(n, generator=g).numpy()


def share_positions(source, world, rank, drop_last, n):
    """The perm positions rank `rank` of `world` takes in the deal of
    `source` (padding entries are perm positions 0, 1, ... cycled over n)."""
    L = ranges_len(source)
    total = (L // world) * world if drop_last else math.ceil(L / world) * world
    coords = np.arange(rank, total, world, dtype=np.int64)
    if len(coords) == 0:
        return coords
    src = ranges_array(source)
    real = coords < L
    out = np.empty(len(coords), np.int64)
    out[real] = src[coords[real]]
    out[~real] = (coords[~real] - L) % n
    return out


def remaining(deal, ranks):
    """R: the positions of `deal`'s source that no rank has received, as
    ranges.  `ranks`: {rank: samples received} for every rank of the deal."""
    src, W = deal["source"], deal["world"]
    L = ranges_len(src)
    ms = [int(ranks[r]) for r in range(W)]
    lo, hi = min(ms), max(ms)
    if lo == hi:
        return ranges_tail(src, min(lo * W, L))
    a = ranges_array(src)
    mid = np.arange(lo * W, min(hi * W, L), dtype=np.int64)
    keep = mid[(mid // W) >= np.asarray(ms, np.int64)[mid % W]]
    return compress(a[keep]) + ranges_tail(src, min(hi * W, L))


# -- the resume plan --------------------------------------------------------------------------

class Batches:
    """A resumed epoch's batch sampler iterator: lists of `batch_size`
    indices cut from `it` (any iterator of ints), the last one short unless
    drop_last -- torch's BatchSampler's batches."""

    __slots__ = ("_it", "_b", "_drop")

    def __init__(self, it, batch_size, drop_last):
        self._it, self._b, self._drop = it, batch_size, drop_last

    def __iter__(self):
        return self

    def __next__(self):
        batch = []
        for v in self._it:
            batch.append(int(v))
            if len(batch) == self._b:
                return batch
        if batch and not self._drop:
            return batch
        raise StopIteration


def _refuse(msg):
    raise ValueError("fastloader: " + msg)


def plan(state, loader, index_sampler):
    """How a mid-epoch state resumes in this loader's sampler: None (the
    state's own replay: nothing about the deal changed, or no
    DistributedSampler is involved) or (indices of this rank's share of the
    remaining samples, the new deal's record).  Raises ValueError for a state
    that cannot mean a place in this loader's sampler."""
    el = state.get("elastic")
    b = batching(index_sampler)
    inner = b[0] if b is not None else index_sampler
    dist = plain_dist(inner)
    saved_like = (state.get("sampler") or {}).get("dist")
    now_like = dist_like(inner)
    if el is None:
        sampler_state = state.get("sampler") or {}
        if dist is not None and "dist" in sampler_state and saved_like is not None \
                and tuple(saved_like) == now_like:
            return None   # saved on this topology without a deal record (batch_size=None): replay it
        if dist is not None and "dist" not in sampler_state:
            return None   # a state from before deals were recorded: replay it, as it was saved
        if dist is not None and saved_like is not None:
            _refuse(f"the state was saved as rank {saved_like[1]} of {saved_like[0]} by a DistributedSampler whose "
                    "batches were not cut by torch's BatchSampler (batch_size=None or a batch_sampler), so its "
                    f"deal was not recorded; this loader is rank {now_like[1]} of {now_like[0]}. Resume on the "
                    "saved topology, or load with batch_size= to resume on another")
        if dist is not None:
            _refuse("the state was saved by a loader whose sampler was not a DistributedSampler; this loader's is "
                    "one, and a rank's share cannot be cut from another sampler's order. Save with "
                    "DistributedSampler (num_replicas=1, rank=0 on one process) to resume on any number of ranks")
        if saved_like is not None and now_like is not None and tuple(saved_like) != now_like:
            _refuse(f"the state was saved as rank {saved_like[1]} of {saved_like[0]} by a {type(inner).__name__} that "
                    f"keeps its own order or state; this loader is rank {now_like[1]} of {now_like[0]}. Only torch's "
                    "DistributedSampler itself is re-dealt to another number of ranks: resume on the saved topology, "
                    "or use torch.utils.data.DistributedSampler")
        return None
    if dist is None:
        what = type(inner).__name__ if inner is not None else "None"
        _refuse(f"the state was saved by rank {el['rank']} of {el['world']} with torch's DistributedSampler, and "
                f"this loader's sampler is {what}: give it DistributedSampler(dataset, num_replicas=..., rank=..., "
                f"shuffle={el['shuffle']}, seed={el['seed']}, drop_last={el['drop_last']}) (num_replicas=1, rank=0 "
                "for one process), so that its share of the epoch's remaining samples can be dealt to it")
    for key, now in (("n", len(dist.dataset)), ("shuffle", bool(dist.shuffle)), ("seed", int(dist.seed)),
                     ("drop_last", bool(dist.drop_last))):
        if el[key] != now:
            name = "len(dataset)" if key == "n" else key
            _refuse(f"the state's DistributedSampler had {name}={el[key]!r}, this loader's has {now!r}: the epoch's "
                    "order would differ; build the sampler as the saved one was")
    if b is None:
        _refuse("the state's DistributedSampler is dealt again to this loader's ranks, which needs batches cut by "
                f"torch's BatchSampler; this loader's batch sampler is {type(index_sampler).__name__}")
    _, B, drop = b
    ranks = {int(r): int(m) for r, m in el.get("ranks") or []}
    same = (not ranks and el["world"] == dist.num_replicas and el["rank"] == dist.rank
            and el["source"] == [[0, el["n"], 1]] and state.get("batch_size") == B and not state.get("skip"))
    if same:
        return None   # the uninterrupted deal: replay its batches as any state does
    if not ranks:
        ranks = {r: int(el["consumed"]) for r in range(el["world"])}   # lockstep (DDP)
    elif sorted(ranks) != list(range(el["world"])):
        _refuse(f"the merged state holds ranks {sorted(ranks)} of a {el['world']}-rank deal; it needs every rank's "
                "state (or one rank's, for ranks in lockstep)")
    rest = remaining(el, ranks)
    W, r = int(dist.num_replicas), int(dist.rank)
    pos = share_positions(rest, W, r, el["drop_last"], el["n"])
    perm = epoch_perm(el["n"], el["shuffle"], el["seed"], el["epoch"])
    deal = {"n": el["n"], "shuffle": el["shuffle"], "seed": el["seed"], "drop_last": el["drop_last"],
            "epoch": el["epoch"], "world": W, "rank": r, "source": rest, "share": int(len(pos))}
    return perm[pos], deal


def merge(states):
    """One state from the states of all ranks of a job (resume_state)."""
    states = list(states)
    if not states:
        raise ValueError("fastloader.resume_state: no states given")
    for i, s in enumerate(states):
        if not isinstance(s, dict) or s.get("format") != "fastloader.DataLoader":
            raise ValueError(f"fastloader.resume_state: states[{i}] is not a fastloader.DataLoader state "
                             f"({type(s).__name__})")
    if len(states) == 1:
        return copy.deepcopy(states[0])
    streams = [(s.get("stream") or {}) for s in states]
    if all(st.get("world") is not None for st in streams):
        return _merge_streams(states, streams)
    if any(st.get("world") is not None for st in streams):
        i = next(i for i, st in enumerate(streams) if st.get("world") is None)
        raise ValueError(f"fastloader.resume_state: states[{i}] is not a WebDataset state like states"
                         f"[{next(i for i, st in enumerate(streams) if st.get('world') is not None)}]: pass the "
                         "states of one loader's ranks")
    els = [s.get("elastic") for s in states]
    if any(e is None for e in els):
        i = next(i for i, e in enumerate(els) if e is None)
        raise ValueError(f"fastloader.resume_state: states[{i}] was not saved with torch's DistributedSampler (or "
                         "before its epoch began); only DistributedSampler states are merged across ranks")
    epochs = {(s["epoch"], s["finished"]) for s in states}
    if len({s["epoch"] for s in states}) > 1:
        raise ValueError(f"fastloader.resume_state: the states are of different epochs {sorted(epochs)}; save "
                         "them at the same step")
    ref = _one_job(els, ("n", "shuffle", "seed", "drop_last", "epoch", "world", "source"), "")
    if all(s["finished"] for s in states):
        return copy.deepcopy(states[0])
    seeds = {s["base_seed"] for s in states}
    if len(seeds) > 1:
        warnings.warn("fastloader.resume_state: the ranks' epochs had different base seeds, so a sample dealt to "
                      "another rank is augmented with the resumed rank's seed, not the one it would have had; give "
                      "every rank the same seed= (or the same generator) for augmentations that replay exactly",
                      UserWarning, stacklevel=3)
    ranks = []
    for s, e in zip(states, els):
        m = e["share"] if s["finished"] else e["consumed"]
        ranks.append([e["rank"], int(m)])
    base = next(s for s in states if not s["finished"])
    out = copy.deepcopy(base)
    out["elastic"]["ranks"] = sorted(ranks)
    return out


def array_batches(a, batch_size, drop_last):
    """Batches (lists of ints) cut from the int array `a`, the last one
    short unless drop_last: torch's BatchSampler's cut of a sampler's order."""
    n = len(a)
    stop = n - n % batch_size if drop_last else n
    for i in range(0, stop, batch_size):
        yield a[i:i + batch_size].tolist()


def _one_job(records, keys, what):
    """records[0], after checking that the records (each rank's deal) agree
    on `keys` and hold every rank of the deal once; ValueError naming the
    one that does not belong."""
    ref = records[0]
    for i, rec in enumerate(records):
        for k in keys:
            if rec.get(k) != ref.get(k):
                raise ValueError(f"fastloader.resume_state: states[{i}] has {what}{k}={rec.get(k)!r} where "
                                 f"states[0] has {ref.get(k)!r}: they are not the ranks of one job's epoch")
    got = sorted(rec["rank"] for rec in records)
    if got != list(range(ref["world"])):
        raise ValueError(f"fastloader.resume_state: the states are of ranks {got}, the job had {ref['world']} "
                         f"ranks (0..{ref['world'] - 1}); pass every rank's state once, or one rank's alone")
    return ref


def _merge_streams(states, streams):
    """resume_state for WebDataset states: every rank's place in the deal."""
    ref = streams[0]
    if len({s["epoch"] for s in states}) > 1:
        raise ValueError("fastloader.resume_state: the WebDataset states are of different epochs; save them at the "
                         "same step")
    _one_job(streams, ("order", "world", "history", "seed", "shuffle", "epoch_length", "shards", "shardshuffle",
                       "names"), "stream ")
    if all(s["finished"] for s in states):
        return copy.deepcopy(states[0])
    places = [0] * ref["world"]
    for st in streams:
        places[st["rank"]] = int(st["consumed"])
    out = copy.deepcopy(next(s for s in states if not s["finished"]))
    out["stream"]["places"] = places
    out["stream"]["skipped"] = sum(int(st.get("skipped") or 0) for st in streams)
    return out


def resume_state(states):
    """One loader state from the states of every rank of a job (a list, as
    torch.distributed.all_gather_object collects them), for a job on any
    number of ranks to load: each new rank's loader deals itself its share of
    the samples no old rank received.  One rank's state alone (a list of one,
    or the dict) means every rank stood where it stood: DDP's lockstep.
    Raises ValueError naming the state that does not belong."""
    if isinstance(states, dict):
        return copy.deepcopy(states)
    return merge(states)


# -- tar shards (fastloader.WebDataset) ---------------------------------------------------------
#
# A rank's stream (csrc/sources/shards.h) reads its shards in order through
# a shuffle buffer keyed by (seed, epoch, position); which sample of which
# shard each position gets is a function of the shards' sample counts, and
# _C.shards_order computes it without reading a byte (the reader and it
# share the schedule).  A stream deal is, per rank, a list of pieces -- a
# shard and the samples of it the rank keeps (all, or a mask) -- and the
# rank's nominal length.  An epoch's first deal is the dataset's own (the
# shard list shuffled by (seed, order), dealt rank by rank, every rank
# epoch_length // world_size positions).  After ranks received P_r
# positions, the samples of the epoch no rank received are, in the epoch's
# shard order (each shard's samples in tar order), cut into W' equal
# chunks, one per new rank: the new deal.  A state holds the history of
# (world size, places) of the epoch's deals, so every deal is computed
# again from the dataset; its size does not grow with the dataset.

class StreamDeal:
    """Per rank of `world`: pieces [(shard index into ds.urls, bool mask
    over its samples or None: all)] in reading order, and nominal lengths."""

    __slots__ = ("world", "pieces", "nominal")

    def __init__(self, world, pieces, nominal):
        self.world, self.pieces, self.nominal = world, pieces, nominal


def _keep_arg(mask, count=None):
    """A keep entry of _C.shards_begin / shards_order (csrc/sources/shards.h):
    None (every sample) or (mask bytes or None, nbits[, the samples the
    shard must hold, checked by the reader])."""
    bits = None if mask is None else np.packbits(mask.astype(np.uint8), bitorder="little").tobytes()
    if count is not None:
        return (bits, 0 if mask is None else int(len(mask)), int(count))
    return None if mask is None else (bits, int(len(mask)))


def shard_names_digest(urls):
    """A short digest of the shards' file names in order (not their
    directories or hosts, so a moved dataset still matches)."""
    import hashlib
    import os
    import urllib.parse

    names = [os.path.basename(urllib.parse.urlparse(u).path) if "://" in u else os.path.basename(u) for u in urls]
    return hashlib.sha1("\n".join(names).encode()).hexdigest()[:16]


def stream_first_deal(ds, order, world):
    perm = ds._shard_perm(order)
    nominal = ds.epoch_length // world
    return StreamDeal(world, [[(int(g), None) for g in perm[r::world]] for r in range(world)], [nominal] * world)


def _offsets(counts):
    """Where each shard's samples start in the flat numbering of all the
    epoch's samples (shard g's sample k is offs[g] + k); offs[-1]: the total."""
    return np.r_[0, np.cumsum(np.asarray(counts, np.int64))]


def stream_delivered(ds, deal, places, epoch, counts, offs):
    """A bool array over the flat numbering (_offsets): the samples some
    rank received, rank r of `deal` having received the first places[r]
    positions of its stream."""
    got = np.zeros(int(offs[-1]), bool)
    for r, P in enumerate(places):
        P = min(int(P), deal.nominal[r])
        if P <= 0:
            continue
        pcs = deal.pieces[r]
        sh, k = _C_order([counts[g] for g, _ in pcs], [_keep_arg(m) for _, m in pcs], ds.shuffle, ds.seed, epoch,
                         deal.nominal[r], P)
        gs = np.asarray([g for g, _ in pcs], np.int64)[sh]
        got[offs[gs] + k] = True
    return got


def _C_order(counts, keep, shuffle, seed, epoch, nominal, npos):
    from . import _C

    sh, k = _C.shards_order(list(counts), list(keep), int(shuffle), int(seed), int(epoch), int(nominal), int(npos))
    return np.frombuffer(sh, np.int32), np.frombuffer(k, np.int64)


def stream_next_deal(ds, deal, places, epoch, counts, order, world, budget):
    """The deal of the samples of `deal` no rank received (at `places`) to
    `world` ranks, and the positions left of the epoch's length after it
    (`budget`: before; an epoch never has more than epoch_length positions
    over all its deals, as the uninterrupted one)."""
    offs = _offsets(counts)
    total = int(offs[-1])
    got = stream_delivered(ds, deal, places, epoch, counts, offs)
    budget -= sum(min(int(P), n) for P, n in zip(places, deal.nominal))
    avail = np.zeros(total, bool)   # the samples this deal dealt
    for pcs in deal.pieces:
        for g, m in pcs:
            if m is None:
                avail[offs[g]:offs[g + 1]] = True
            else:
                avail[offs[g]:offs[g + 1]] |= m
    avail &= ~got
    # the flat numbers in the epoch's shard order, each shard's samples in tar order
    perm = np.asarray(ds._shard_perm(order), np.int64)
    lens = np.asarray(counts, np.int64)[perm]
    seq = np.repeat(offs[perm] - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(int(lens.sum()))
    sel = seq[avail[seq]]
    fg = np.repeat(np.arange(len(counts), dtype=np.int64), np.asarray(counts, np.int64))[sel]
    fk = sel - offs[fg]
    nominal = min(len(fg), max(budget, 0)) // world
    pieces = []
    for r in range(world):
        cg, ck = fg[r * nominal:(r + 1) * nominal], fk[r * nominal:(r + 1) * nominal]
        mine = []
        if len(cg):
            cut = np.flatnonzero(np.diff(cg)) + 1
            for a, b in zip(np.r_[0, cut], np.r_[cut, len(cg)]):
                g = int(cg[a])
                if b - a == counts[g]:
                    mine.append((g, None))   # the whole shard
                    continue
                m = np.zeros(counts[g], bool)
                m[ck[a:b]] = True
                mine.append((g, m))
        pieces.append(mine)
    return StreamDeal(world, pieces, [nominal] * world), budget


def stream_plan(ds, state, batch_size):
    """A mid-epoch WebDataset state in a loader of this dataset: None (the
    rank's stream goes on from its position, as saved) or (shard ids, keep,
    nominal, history) of this rank's share of the samples no rank received,
    with the history the new deal's states carry."""
    st = state.get("stream") or {}
    W, rank = st.get("world"), st.get("rank")
    if W is None:
        return None   # a state from before streams recorded their deal: positions only
    hist = [list(h) for h in st.get("history") or []]
    places = st.get("places")
    same = (not hist and places is None and W == ds.world_size and rank == ds.rank
            and state.get("batch_size") == batch_size)
    if same:
        return None
    if st.get("skipped"):
        _refuse(f"the state's epoch skipped {st['skipped']} unreadable shard(s) (on_shard_error='skip'), so which "
                "samples its ranks received cannot be worked out from the shards' counts; resume it on the "
                f"topology it was saved on ({W} ranks, batch_size={state.get('batch_size')})")
    if ds.seed != st.get("seed", ds.seed) or ds.shuffle != st.get("shuffle", ds.shuffle) \
            or ds.epoch_length != st.get("epoch_length", ds.epoch_length) or len(ds.urls) != st.get("shards") \
            or ds.shardshuffle != st.get("shardshuffle", ds.shardshuffle):
        _refuse("the state's WebDataset had another seed, shuffle, shardshuffle, epoch_length or number of shards; "
                "build the dataset as the saved one was")
    if st.get("names") is not None and st["names"] != ds._names_digest():
        _refuse("the state's WebDataset listed other shards, or the same ones in another order (their file names "
                "differ); give the shard list as the saved job did, in the same order")
    counts = ds._shard_counts()
    epoch, order = int(state["epoch"]), int(st["order"])
    consumed = int(st["consumed"])
    if places is None:
        places = [consumed] * W   # lockstep (DDP)
    deal = stream_first_deal(ds, order, hist[0][0] if hist else W)
    budget = sum(deal.nominal)   # the uninterrupted epoch's positions over all its ranks
    for w_next, (w, pl) in zip([h[0] for h in hist[1:]] + [W], hist):
        deal, budget = stream_next_deal(ds, deal, pl, epoch, counts, order, w_next, budget)
    new, _ = stream_next_deal(ds, deal, places, epoch, counts, order, ds.world_size, budget)
    pcs = new.pieces[ds.rank]
    ids = [int(g) for g, _ in pcs]
    keep = [_keep_arg(m, counts[g]) for g, m in pcs]   # the reader checks each shard's count
    return ids, keep, new.nominal[ds.rank], hist + [[W, [int(p) for p in places]]]
