"""Collecting a loader's batches epoch by epoch, and comparing two such
runs batch for batch: for the tests that check one dataset or loader
against another (a format against ImageFolder, a resumed run against an
uninterrupted one)."""
import torch

import fastloader


def pair_clone(batch):
    """An (images, labels) batch copied out of the loader's buffers."""
    x, y = batch
    return x.clone(), y.clone()


def collect_epochs(dl, n, each=pair_clone):
    """The batches of `n` epochs of `dl`, each passed through `each` (None: as yielded)."""
    return [[b if each is None else each(b) for b in dl] for _ in range(n)]


def take_batches(it, k, each=pair_clone):
    """Up to `k` batches from the iterator `it` (fewer where it ends), each through `each`."""
    got = []
    for _ in range(k):
        try:
            got.append(each(next(it)))
        except StopIteration:
            break
    return got


def seeded_epochs(ds, num_workers, shuffle, epochs=2, *, batch_size=5, seed=7, generator_seed=11, each=pair_clone,
                  **kw):
    """All batches of `epochs` epochs of a fastloader.DataLoader over `ds`,
    the shuffle (generator_seed) and the augmentation (seed) seeded."""
    dl = fastloader.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, seed=seed,
                               generator=torch.Generator().manual_seed(generator_seed), **kw)
    return collect_epochs(dl, epochs, each)


def assert_same_epochs(a, b, where=None):
    """Epochs of (images, labels) batches: the same counts, dtypes, shapes
    and values; `where` (a test's own context) goes in every message."""
    ctx = "" if where is None else f"{where}: "
    assert len(a) == len(b), f"{ctx}{len(a)} epochs != {len(b)}"
    for e, (ea, eb) in enumerate(zip(a, b)):
        assert len(ea) == len(eb), f"{ctx}epoch {e}: {len(ea)} batches != {len(eb)}"
        for k, ((xa, ya), (xb, yb)) in enumerate(zip(ea, eb)):
            at = f"{ctx}epoch {e} batch {k}"
            assert xa.dtype == xb.dtype and xa.shape == xb.shape, (at, xa.dtype, xb.dtype, xa.shape, xb.shape)
            assert torch.equal(ya, yb), (at, ya, yb)
            assert torch.equal(xa, xb), (at, (xa - xb).abs().max())
