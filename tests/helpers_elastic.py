"""The loaders of the elastic-resume tests (test_elastic.py, in one process,
and test_elastic_torchrun.py's ranks): one dataset of N images or N keyed
Python samples, a DistributedSampler of (world, rank), and each batch as
[(sample index, sample tensor)]."""
import os

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

import fastloader
from helpers_pipelines import train_tf

N = 40
TRAIN = train_tf(8, norm=None)
SAMPLER_SEED = 11


class Keyed(Dataset):
    """A Python map-style dataset: (index, a draw from sample_rng(index))."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor([i, int(fastloader.sample_rng(i).integers(1 << 30))])


def write_images(d):
    """N small JPEGs under folder `d` in an ImageFolder layout of N classes,
    one image each (class i: folder i, so ImageFolder's label is the
    index): their paths."""
    from PIL import Image

    out = []
    for i in range(N):
        rng = np.random.default_rng(i)
        (d / f"{i:03d}").mkdir(exist_ok=True)
        p = d / f"{i:03d}" / "img.jpg"
        Image.fromarray(rng.integers(0, 255, (12 + i % 5, 16, 3)).astype(np.uint8)).save(p, quality=85)
        out.append(str(p))
    return out


def make(kind, paths, W, r, B=3, nw=2, mode="thread", shuffle=True, drop_last=False):
    """(sampler, loader) for rank r of W: kind "native" (ImageFolder over
    the paths' root, C workers) or "python" (Keyed, worker_mode=mode)."""
    if kind == "native":
        ds = fastloader.ImageFolder(os.path.dirname(os.path.dirname(paths[0])), transform=TRAIN)
        assert ds.targets == list(range(N))
    else:
        ds = Keyed()
    s = DistributedSampler(ds, num_replicas=W, rank=r, shuffle=shuffle, seed=SAMPLER_SEED, drop_last=drop_last)
    dl = fastloader.DataLoader(ds, batch_size=B, sampler=s, num_workers=nw, seed=7,
                               generator=torch.Generator().manual_seed(4),
                               worker_mode=mode if kind != "native" else "auto")
    return s, dl


def samples(batch, kind):
    """[(index, sample tensor)] of a batch."""
    if kind == "native":
        x, y = batch
        return [(int(i), t.clone()) for i, t in zip(y, x)]
    return [(int(row[0]), row.clone()) for row in batch]


def reference(kind, paths, epoch=0):
    """index -> the uninterrupted run's sample at `epoch` (the same on any
    topology: augmentation is keyed by (seed, epoch, index))."""
    s, dl = make(kind, paths, 1, 0, nw=0)
    out = {}
    for e in range(epoch + 1):
        s.set_epoch(e)
        for b in dl:
            if e == epoch:
                out.update(samples(b, kind))
    return out


def uninterrupted(kind, paths, W, epoch, **kw):
    """Per rank, epoch `epoch`'s batches of an uninterrupted run on W ranks."""
    out = []
    for r in range(W):
        s, dl = make(kind, paths, W, r, **kw)
        for e in range(epoch + 1):
            s.set_epoch(e)
            eps = [samples(b, kind) for b in dl]
        out.append(eps)
    return out


def write_wds(d):
    """N samples in tar shards of 7 (the last short), key i -> label i: their paths."""
    from test_webdataset import write_shards

    return write_shards(str(d), n=N, per=7)


def make_wds(shards, W, r, B=3, nw=2, fields=()):
    """(None, loader) over rank r of W's stream of those shards (the same
    loader seed on every rank, so a sample's augmentation is the same on
    any rank)."""
    ds = fastloader.WebDataset(shards, transform=TRAIN, shuffle=10, seed=3, rank=r, world_size=W, fields=fields)
    return None, fastloader.DataLoader(ds, batch_size=B, num_workers=nw, seed=7)


def wds_labels(batch):
    return batch[1].tolist()


def wds_samples(batch):
    """[(label = the sample's number, sample tensor)] of a WebDataset batch."""
    return [(int(y), x.clone()) for x, y in zip(batch[0], batch[1])]


def wds_reference(shards, epoch=0):
    """label -> the sample's tensor in epoch `epoch` of an uninterrupted run
    on one rank (every sample once; the same on any topology: a shard
    sample's augmentation is keyed by (seed, epoch, shard, place in it))."""
    _, dl = make_wds(shards, 1, 0, nw=0)
    out = {}
    for e in range(epoch + 1):
        for b in dl:
            if e == epoch:
                out.update(wds_samples(b))
    return out
