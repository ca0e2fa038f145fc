"""max_memory: the prefetch window fits the budget; a consumer that keeps
batches past it is told so."""
import time
import warnings

import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
from fastloader.loader import resolve_max_memory  # noqa: E402
from fastloader.tools.sample import make_sample  # noqa: E402


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("mem") / "d"
    make_sample(str(root), n=96, classes=2, progress=False, processes=1)
    return fastloader.ImageFolder(str(root), transform=FT.Compose([FT.RandomResizedCrop(64), FT.ToTensor()]))


BATCH_BYTES = 8 * 3 * 64 * 64 * 4


def test_budget_limits_the_prefetch_window(ds):
    dl = fastloader.DataLoader(ds, batch_size=8, num_workers=2, max_memory=int(2.5 * BATCH_BYTES))
    depths = []
    for _ in dl:
        depths.append(dl.stats()["queue_depth"])
    st = dl.stats()
    assert st["batch_bytes"] == BATCH_BYTES + 8 * 8  # images + int64 labels
    assert st["prefetch_window"] == 2
    assert max(depths[1:]) <= 2  # after the first batch the window is cut to what fits
    assert st["samples"] == 96


def test_no_budget_keeps_prefetch_factor_times_workers(ds):
    dl = fastloader.DataLoader(ds, batch_size=8, num_workers=2)
    for _ in dl:
        pass
    assert dl.stats()["prefetch_window"] == 4


def test_consumer_keeping_batches_past_the_budget_is_warned_once(ds):
    dl = fastloader.DataLoader(ds, batch_size=8, num_workers=2, max_memory=3 * BATCH_BYTES)
    kept = []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for b in dl:
            kept.append(b)
            time.sleep(0.1)  # let the once-a-second check run during the epoch
    msgs = [str(w.message) for w in rec if issubclass(w.category, fastloader.PerformanceWarning)]
    assert len(msgs) == 1 and "keeping batches alive" in msgs[0]
    assert sum(len(y) for _, y in kept) == 96  # nothing was lost or overwritten
    first = kept[0][0].clone()
    assert torch.equal(kept[0][0], first)


def test_resolve_max_memory():
    assert resolve_max_memory(None) is None
    assert resolve_max_memory(1 << 20) == 1 << 20
    assert resolve_max_memory("auto") > 0
    for bad in (0, -5, "lots", 1.5, True):
        with pytest.raises(ValueError):
            resolve_max_memory(bad)


def test_memory_pressure_shrinks_the_window_to_one_batch(ds, monkeypatch):
    """When the machine (or cgroup) has under 5% of its memory left, the
    loader prefetches one batch instead of prefetch_factor x workers, warns
    once, and still delivers every sample."""
    from fastloader import sysinfo
    monkeypatch.setattr(sysinfo, "memory_limits", lambda: (3 << 20, 100 << 20))  # 3% left
    dl = fastloader.DataLoader(ds, batch_size=8, num_workers=2)
    depths = []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        n = 0
        for _, y in dl:
            depths.append(dl.stats()["queue_depth"])
            n += len(y)
    msgs = [str(w.message) for w in rec if issubclass(w.category, fastloader.PerformanceWarning)]
    assert len(msgs) == 1 and "short of memory" in msgs[0], msgs
    assert dl.stats()["prefetch_window"] == 1
    # batches queued before the first check drain; after that one at a time
    assert max(depths[3:]) <= 1, depths
    assert n == 96


def test_memory_pressure_threshold(monkeypatch):
    from fastloader import sysinfo
    for avail, total, expect in [(4, 100, True), (6, 100, False), (None, 100, False), (1, None, False)]:
        monkeypatch.setattr(sysinfo, "memory_limits", lambda a=avail, t=total: (a, t))
        assert sysinfo.memory_pressure() is expect, (avail, total)
