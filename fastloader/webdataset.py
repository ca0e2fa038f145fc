"""fastloader.WebDataset: tar shards in the WebDataset layout, read, decoded
and transformed by the native pipeline (csrc/sources/shards.h, csrc/sources/tar.h,
csrc/sources/stream.h).

One rank reads one ordered stream of samples per epoch: its share of the
shards (the list shuffled by (seed, epoch), the same on every rank, then
dealt out rank by rank), through a deterministic shuffle buffer.  Position p
of that stream is batch p // batch_size, slot p % batch_size, whatever
num_workers is, and no sample is read twice in an epoch.  Every rank yields
the same nominal number of samples (`epoch_length // world_size`), so
DistributedDataParallel never waits on a rank whose shards ran out: a rank
with fewer samples goes round its shards again, one with more stops early.
"""
from __future__ import annotations

import collections.abc
import json
import os
import re
import tarfile
import urllib.parse
import urllib.request
import warnings

import numpy as np

from . import _C
from .datasets import NativeImageDataset

try:
    from torch.utils.data import IterableDataset as _Iterable
except ImportError:  # pragma: no cover
    _Iterable = object

_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_urls(urls):
    """A list of shard URLs from a str (brace patterns as the webdataset
    library: "train-{000000..000146}.tar", "{a,b}.tar"; several patterns
    separated by "::") or a list of str."""
    if isinstance(urls, (str, os.PathLike)):
        out = []
        for part in os.fspath(urls).split("::"):
            out.extend(_expand_braces(part))
        return out
    out = [os.fspath(u) for u in urls]
    if not out:
        raise ValueError("WebDataset needs at least one shard")
    return out


def _expand_braces(s):
    m = _BRACE.search(s)
    if not m:
        return [s]
    head, body, tail = s[:m.start()], m.group(1), s[m.end():]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        lo, hi = r.group(1), r.group(2)
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        if int(hi) < int(lo):
            raise ValueError(f"bad brace range {{{body}}} in {s!r}: the end is before the start")
        items = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        items = body.split(",")
    out = []
    for it in items:
        out.extend(_expand_braces(head + it + tail))
    return out


def _is_remote(url):
    return url.startswith(("http://", "https://"))


def _counts_from_index(urls, timeout=10.0):
    """Samples per shard from an index.json next to the shards (what
    `python -m fastloader pack shards` writes), or None."""
    first = urls[0]
    if first.startswith("pipe:"):
        return None
    if _is_remote(first):
        base = first.rsplit("/", 1)[0] + "/index.json"
        try:
            with urllib.request.urlopen(base, timeout=timeout) as f:
                index = json.load(f)
        except Exception:
            return None
    else:
        path = first[7:] if first.startswith("file://") else first
        p = os.path.join(os.path.dirname(path), "index.json")
        if not os.path.exists(p):
            return None
        with open(p) as f:
            index = json.load(f)
    table = dict(zip(index.get("shards", []), index.get("counts", [])))
    counts = []
    for u in urls:
        name = urllib.parse.urlparse(u).path.rsplit("/", 1)[-1] if _is_remote(u) else os.path.basename(u)
        if name not in table:
            return None
        counts.append(int(table[name]))
    return counts


def _count_local(url):
    """Samples in a local shard, from its member names (headers only)."""
    keys, last = 0, None
    path = url[7:] if url.startswith("file://") else url
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            if not m.isfile():
                continue
            key = _wds_key(m.name)
            if key is not None and key != last:
                keys += 1
                last = key
    return keys


_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def _wds_key(name):
    """The sample key of a member name by webdataset's rule (csrc/sources/tar.h), or
    None for a member it drops."""
    base = name.rsplit("/", 1)[-1]
    first = name.split("/", 1)[0]
    if ("/" not in name and name.startswith("__") and name.endswith("__")) or (
            "/" in name and first.startswith("__") and first.endswith("__")):
        return None
    m = _KEY.match(name)
    return m.group(1) if m and base else None


class _StreamNames(collections.abc.Sequence):
    """What messages call position i of the stream (the C side adds the
    shard and the key); a Sequence, so nothing lists its (epoch-length
    many) entries."""

    def __init__(self, n):
        self._n = n

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if not 0 <= i < self._n:
            raise IndexError(i)
        return (f"shard stream position {i}", -1)

    def __iter__(self):
        return (self[i] for i in range(self._n))


class WebDataset(NativeImageDataset, _Iterable):
    """Tar shards in the WebDataset layout, through the native pipeline.

    Args:
        urls: shard paths or URLs: local paths, "file://", "http(s)://"
            (libcurl, in a reader thread; presigned object-store URLs are
            plain GETs), "pipe:COMMAND" (a command that writes the shard to
            stdout); a str may hold brace patterns ("train-{000..146}.tar").
        transform, target_transform, layout, dct_scaling, max_pixels: as
            fastloader.ImageFolder.
        epoch_length: samples per epoch over all ranks.  Default: the sum of
            index.json's counts next to the shards (written by `python -m
            fastloader pack shards`), or, for local shards, counted from the
            tar headers.  Each rank yields epoch_length // world_size.
        shuffle: the shuffle buffer, in samples (0: stream order).
        shardshuffle: shuffle the shard list by (seed, epoch) (the same
            order on every rank) before dealing it out.
        seed: the shuffle seed; must be the same on every rank.
        label: the member holding the label: "cls" (ASCII decimal, default),
            "json:FIELD" (an integer field of the .json member), or None (-1).
        image_exts: image members, in order of preference.
        on_error: per sample (a member that is not an image, a corrupt
            image): "raise" or "skip" ("replace" would take another
            position's sample, so it is refused).
        on_shard_error: a shard that cannot be read (after retries) or is
            cut short: "raise" (the batch that reaches it raises, naming the
            shard URL and member) or "skip" (keep what was read, go on;
            listed in `skipped_shards` with a warning).
        rank, world_size: default torch.distributed's when initialised,
            else 0 and 1.
        retries, backoff, stall_timeout: HTTP faults (csrc/sources/stream.h):
            retries in a row, first back-off and stall limit in seconds.
        ca_file: PEM certificates to verify https servers with (a private
            object store's CA) instead of the system's.
        fields: other members to hand through as bytes, by extension (e.g.
            ("txt", "json")): batches are then (images, labels, fields),
            fields a dict ext -> list of bytes (None where a sample lacks
            the member), in batch order.
        ring: samples produced ahead of the workers at most (memory bound).
    """

    _fl_stream = True

    def __init__(self, urls, transform=None, target_transform=None, *, epoch_length=None, shuffle=1000,
                 shardshuffle=True, seed=0, label="cls", image_exts=("jpg", "jpeg", "png", "webp"),
                 on_error="raise", on_shard_error="raise", rank=None, world_size=None, retries=5, backoff=0.2,
                 stall_timeout=30.0, ca_file=None, ring=512, fields=(), layout="CHW", dct_scaling=False,
                 max_pixels=0):
        self.urls = expand_urls(urls)
        if on_error not in ("raise", "skip"):
            raise ValueError(f"WebDataset: on_error must be 'raise' or 'skip', got {on_error!r} (a stream has no "
                             "other sample to take the place of a bad one)")
        if on_shard_error not in ("raise", "skip"):
            raise ValueError(f"WebDataset: on_shard_error must be 'raise' or 'skip', got {on_shard_error!r}")
        if rank is None or world_size is None:
            r, w = 0, 1
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    r, w = dist.get_rank(), dist.get_world_size()
            except ImportError:  # pragma: no cover
                pass
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        self.rank, self.world_size = int(rank), int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"WebDataset: rank {rank} is not in [0, {world_size})")
        if len(self.urls) < self.world_size:
            raise ValueError(f"WebDataset: {len(self.urls)} shard(s) for {self.world_size} ranks: every rank needs "
                             "at least one shard")
        self._counts = None
        if epoch_length is None:
            counts = _counts_from_index(self.urls)
            if counts is None:
                if any(_is_remote(u) or u.startswith("pipe:") for u in self.urls):
                    raise ValueError("WebDataset: give epoch_length= (samples per epoch over all ranks): there is "
                                     "no index.json next to the shards to count them")
                counts = [_count_local(u) for u in self.urls]
            epoch_length = sum(counts)
            self._counts = counts
        self.epoch_length = int(epoch_length)
        nominal = self.epoch_length // self.world_size
        if nominal < 1:
            raise ValueError(f"WebDataset: an epoch of {self.epoch_length} samples over {self.world_size} ranks "
                             "gives none per rank")
        self.shuffle = int(shuffle)
        self.shardshuffle = bool(shardshuffle)
        self.seed = int(seed)
        label_ext, label_field = "", ""
        if label is not None:
            if label.startswith("json:"):
                label_ext, label_field = "json", label[5:]
            else:
                label_ext = label
        self.label = label
        self.fields = tuple(fields)
        self._fl_batch_size = None
        self.skipped_shards = []
        self._set_epoch = None
        self._stream_epoch = None
        self._stream_order = None   # the epoch the current stream's shard order and shuffle follow
        self._epoch_len = nominal   # this epoch's positions (a re-dealt epoch's own, fastloader/elastic.py)
        self._skipped_at_begin = 0
        source = _C.shard_source(
            nominal, shuffle=self.shuffle, ring=int(ring), seed=self.seed,
            skip_bad_shards=on_shard_error == "skip", image_exts=tuple(image_exts), label_ext=label_ext,
            label_field=label_field, retries=int(retries), backoff_ms=int(backoff * 1000),
            stall_timeout_ms=int(stall_timeout * 1000), ca_file=None if ca_file is None else os.fspath(ca_file),
            extra_exts=self.fields, capacity=max(self.epoch_length, nominal))
        self._nominal = nominal
        # position names up to the source's capacity: a re-dealt epoch
        # (elastic.py) may be longer than the nominal length
        super().__init__(_StreamNames(max(self.epoch_length, nominal)), transform, target_transform, layout=layout, on_error=on_error,
                         dct_scaling=dct_scaling, max_pixels=max_pixels, source=source, labels_in_source=True)

    # -- the stream --------------------------------------------------------------
    def set_epoch(self, epoch):
        """Use `epoch` for the shard order and shuffle of the next iteration
        (as DistributedSampler.set_epoch); by default the loader's count of
        epochs."""
        self._set_epoch = int(epoch)

    def shards_for(self, epoch):
        """The shards this rank reads in `epoch`, in order."""
        return [self.urls[i] for i in self._shard_perm(epoch)[self.rank::self.world_size]]

    def _shard_perm(self, epoch):
        """The epoch's shard order (indices into urls), the same on every rank."""
        if not self.shardshuffle:
            return np.arange(len(self.urls))
        return np.random.default_rng([self.seed, int(epoch), 0x5AD]).permutation(len(self.urls))

    def _names_digest(self):
        """elastic.shard_names_digest of the shard list (once: state_dict() stays cheap)."""
        if getattr(self, "_digest", None) is None:
            from .elastic import shard_names_digest

            self._digest = shard_names_digest(self.urls)
        return self._digest

    def _shard_counts(self):
        """Samples per shard (in urls' order): index.json's, or counted from
        local tar headers; for an elastic resume (fastloader/elastic.py)."""
        if self._counts is None:
            counts = _counts_from_index(self.urls)
            if counts is None:
                if any(_is_remote(u) or u.startswith("pipe:") for u in self.urls):
                    raise ValueError("WebDataset: resuming on another topology needs each shard's sample count, "
                                     "and there is no index.json next to the shards (`python -m fastloader pack "
                                     "shards` writes one); resume on the topology the state was saved on")
                counts = [_count_local(u) for u in self.urls]
            self._counts = counts
        return self._counts

    def _begin_epoch(self, epoch, batch_size=None, skip=0, order=None, deal=None):
        """Start the rank's stream for the loader's epoch `epoch` (the epoch
        its batch jobs carry; the loader calls this before the epoch's
        first batch; batch k holds positions [k*batch_size, (k+1)*batch_size)).
        The shard order and shuffle follow `order`, else set_epoch's value
        when it was called, else `epoch`.  skip > 0 (a resume,
        fastloader/state.py): positions below it are read but dropped,
        never decoded (csrc/sources/shards.h).  deal = (ids, keep, nominal)
        (an elastic resume, fastloader/elastic.py stream_plan): read only
        the shards urls[ids], deliver only the samples whose bit is set in each shard's
        keep mask, and stop after `nominal` positions; nominal 0 ends the
        rank's epoch before it starts."""
        self._stream_epoch = int(epoch)
        self._fl_batch_size = batch_size
        if order is None:
            order = self._set_epoch if self._set_epoch is not None else self._stream_epoch
        self._stream_order = int(order)
        self._skipped_at_begin = len(self.skipped_shards)
        if deal is None:
            self._epoch_len = len(self)
            ids = [int(g) for g in self._shard_perm(order)[self.rank::self.world_size]]
            # counts known (index.json, or the tars counted when epoch_length was not given): the reader
            # checks each shard it reads to its end against them, as a re-dealt epoch's (elastic.py
            # works out from them what every rank received)
            keep = None if self._counts is None else [(None, 0, int(self._counts[g])) for g in ids]
            _C.shards_begin(self._source, self._stream_epoch, [self.urls[g] for g in ids], int(skip), keep=keep,
                            ids=ids)
            return
        # an elastic resume: this rank's share of the samples no rank received
        ids, keep, nominal = deal
        self._epoch_len = nominal
        if nominal == 0 or not ids:
            _C.shards_cancel(self._source)   # nothing left for this rank this epoch: no position is asked for
            return
        _C.shards_begin(self._source, self._stream_epoch, [self.urls[g] for g in ids], 0, keep=keep,
                        nominal=nominal, ids=ids)

    def _end_stream(self):
        """Stop the reader (the loader's iterator ended or was dropped)."""
        _C.shards_cancel(self._source)

    def stream_stats(self):
        """Counters of the shard reader: bytes, wait_s (time blocked on the
        disk / network / pipe), retries, samples, shards, shards_skipped,
        passes."""
        return _C.shards_stats(self._source)

    def _take(self, fin):
        batch = super()._take(fin)
        for url, reason in _C.shards_take_skipped(self._source):
            self.skipped_shards.append((url, reason))
            warnings.warn(f"fastloader: skipped the rest of shard {url}: {reason}", UserWarning, stacklevel=3)
        return batch

    def _build(self, result, epoch, seed, seq, worker, native_s, collate_targets=True):
        fin = super()._build(result, epoch, seed, seq, worker, native_s, collate_targets)
        if not self.fields:
            return fin
        if seq is None or not self._fl_batch_size:  # pragma: no cover - the loader and __iter__ always say
            raise RuntimeError("fastloader: WebDataset fields need the batch's place in the stream (this is a bug)")
        b = self._fl_batch_size
        positions = range(seq * b, min(self._epoch_len, (seq + 1) * b))
        kept = _C.shards_take_fields(self._source, list(positions))
        dropped = {index for kind, index, _ in fin.notes if kind == "skipped"}
        out = {ext: [] for ext in self.fields}
        for pos, vals in zip(positions, kept):
            if pos in dropped:
                continue
            if vals is None:  # pragma: no cover - every delivered sample kept its fields
                raise RuntimeError(f"fastloader: the fields of shard stream position {pos} were not kept")
            for ext, v in zip(self.fields, vals):
                out[ext].append(v)
        images, labels = fin.batch
        fin.batch = (images, labels, out)
        return fin

    def _error(self, code, errnum, msg, index, where):
        return _C._error(code, errnum, msg, None, f" [shard stream position {index}{where}]")

    def __len__(self):
        return self._nominal

    def __getitem__(self, index):
        raise TypeError("WebDataset is a stream: iterate over it (or over a DataLoader), it has no random access")

    def __iter__(self):
        """Samples (image, label) of this rank's stream, on the calling thread
        (for torch's own DataLoader; fastloader.DataLoader builds whole
        batches in its worker threads instead).  Under torch's worker
        processes, each worker reads its own share of the rank's shards."""
        try:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
        except ImportError:  # pragma: no cover
            info = None
        if info is not None and info.num_workers > 1:
            raise TypeError("WebDataset under torch's DataLoader with num_workers > 1 would read the stream once per "
                            "worker process; use fastloader.DataLoader (worker threads share one stream)")
        self._begin_epoch(self._set_epoch if self._set_epoch is not None else 0, 32)
        n = len(self)
        try:
            for start in range(0, n, 32):
                idx = list(range(start, min(n, start + 32)))
                batch = self.load_batch(idx, self._stream_epoch, self.seed, seq=start // 32)
                for i in range(len(batch[1])):
                    if self.fields:
                        yield batch[0][i], batch[1][i], {k: v[i] for k, v in batch[2].items()}
                    else:
                        yield batch[0][i], batch[1][i]
        finally:
            self._end_stream()
