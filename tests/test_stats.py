"""DataLoader.stats() against known work: a slow dataset starves the consumer,
a slow consumer does not wait."""
import time

import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from helpers_datasets import SleepyDataset as Sleepy  # noqa: E402  (tests/ is on sys.path via conftest)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_slow_dataset_is_reported_as_data_starved(num_workers):
    dl = fastloader.DataLoader(Sleepy(24, 0.01), batch_size=4, num_workers=num_workers)
    t0 = time.perf_counter()
    n = sum(len(b) for b in dl)
    wall = time.perf_counter() - t0
    st = dl.stats()
    assert n == 24 and st["samples"] == 24 and st["batches"] == 6
    # a consumer that does nothing waits for most of the loop: ~1.0 with no
    # workers, ~0.8 with two here (their batches come in pairs), 0.49 seen
    # under ASan on a busy box, where the consumer's own share of each
    # batch (taking it from the worker) grows; a fed consumer is near 0
    assert st["data_starved_fraction"] > 0.3
    # 24 sleeps of 10 ms spread over the workers: the wait is at least the
    # serial share and at most the wall time of the loop
    assert 0.24 / max(1, num_workers) * 0.8 < st["consumer_wait_s"] <= wall + 0.05
    if num_workers:
        # the workers' busy time is the known work: 24 x 10 ms, within +50%
        # (sleep overshoot, collation) and never less
        busy = sum(w["busy_s"] for w in st["workers"])
        assert 0.24 <= busy <= 0.36, busy


def test_slow_consumer_is_not_data_starved():
    # 20 ms batches, a 50 ms consumer: a loader that did not prefetch would
    # make it wait ~20 ms for each of the 9 batches after the first (~25 % of
    # the loop); one that prefetches makes it wait for none of them.  The
    # bound sits far from both, so that one scheduling hiccup of a busy box
    # (35 ms seen under ASan) does not fail it and starvation still does.
    dl = fastloader.DataLoader(Sleepy(40, 0.005), batch_size=4, num_workers=2)
    for _ in dl:
        time.sleep(0.05)
    st = dl.stats()
    assert st["batches"] == 10
    # the first batch waits for the workers to start (worker processes for
    # this Python dataset: a fork, slow under ASan)
    assert 0 < st["first_batch_wait_s"] <= st["consumer_wait_s"]
    assert (st["consumer_wait_s"] - st["first_batch_wait_s"]) / st["elapsed_s"] < 0.12
    assert st["elapsed_s"] >= 0.5


def test_native_stats_has_stage_times_and_bytes(tmp_path):
    from fastloader import transforms as FT
    from fastloader.tools.sample import make_sample

    make_sample(str(tmp_path / "d"), n=16, classes=2, progress=False, processes=1)
    ds = fastloader.ImageFolder(str(tmp_path / "d"), transform=FT.Compose([FT.RandomResizedCrop(32), FT.ToTensor()]))
    dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2)
    it = iter(dl)
    next(it)
    live = dl.stats()
    assert live["batches"] == 1 and live["native"]
    for _ in it:
        pass
    st = dl.stats()
    assert st["samples"] == 16
    assert st["bytes_read"] == sum((tmp_path / "d" / c / f).stat().st_size
                                   for c in ds.classes for f in __import__("os").listdir(tmp_path / "d" / c))
    assert all(v > 0 for v in st["stages_s"].values())
    assert st["skipped"] == [] and st["replaced"] == []


def test_stats_of_an_epoch_interrupted_by_ctrl_c_are_kept():
    import _thread
    import threading

    dl = fastloader.DataLoader(Sleepy(40, 0.01), batch_size=2, num_workers=2)
    list(dl)
    it = iter(dl)
    for _ in range(3):
        next(it)
    threading.Timer(0.05, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        for _ in it:
            time.sleep(0.02)
    st = dl.stats()
    assert st["epoch"] == 1 and 3 <= st["batches"] < 20
    del it
    assert dl.stats()["epoch"] == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_python_dataset_stages_against_known_work(num_workers):
    """stages_s splits a Python dataset's time into the dataset itself, the
    collate_fn and pinning: 24 x 10 ms of __getitem__, 6 x 20 ms of collate."""
    from torch.utils.data import default_collate

    def slow_collate(batch):
        time.sleep(0.02)
        return default_collate(batch)

    dl = fastloader.DataLoader(Sleepy(24, 0.01), batch_size=4, num_workers=num_workers, collate_fn=slow_collate)
    assert sum(len(b) for b in dl) == 24
    st = dl.stats()["stages_s"]
    assert set(st) == {"dataset_s", "collate_s", "pin_s"}
    assert 0.24 <= st["dataset_s"] <= 0.36, st
    assert 0.12 <= st["collate_s"] <= 0.18, st
    assert st["pin_s"] < 0.01, st  # no pinning asked for


@pytest.mark.parametrize("kind", ["native", "python"])
def test_stats_hammered_from_another_thread(kind, tmp_path):
    """stats() is a snapshot safe from any thread: read it in a loop on a
    second thread while two workers fill their counters, for two epochs.
    Under scripts/test-tsan.sh any counter read without synchronisation is
    a report, which fails the run; here the snapshots must be whole and the
    per-worker counters must only grow within an epoch."""
    import threading

    n = 16
    if kind == "native":
        from fastloader import transforms as FT
        from fastloader.tools.sample import make_sample

        make_sample(str(tmp_path / "d"), n=n, classes=2, progress=False, processes=1)
        ds = fastloader.ImageFolder(str(tmp_path / "d"),
                                    transform=FT.Compose([FT.RandomResizedCrop(16), FT.ToTensor()]))
    else:
        ds = Sleepy(n, 0.001)
    dl = fastloader.DataLoader(ds, batch_size=2, num_workers=2)
    stop = threading.Event()
    snapshots, errors = [], []

    def poll():
        while not stop.is_set():
            try:
                snapshots.append(dl.stats())
            except Exception as e:  # re-raised on the test's thread
                errors.append(e)
                return
            time.sleep(0)  # let the consumer take the GIL between reads

    t = threading.Thread(target=poll)
    t.start()
    try:
        got = [sum(len(b[0]) if kind == "native" else len(b) for b in dl) for _ in range(2)]
    finally:
        stop.set()
        t.join()
    if errors:
        raise errors[0]
    assert got == [n, n]
    live = [s for s in snapshots if s.get("workers")]
    assert live, "no snapshot was taken while the workers ran"
    last = {}
    for s in live:
        for i, w in enumerate(s["workers"]):
            key = (s["epoch"], i)
            prev = last.get(key)
            if prev is not None:
                assert w["jobs"] >= prev["jobs"] and w["busy_s"] >= prev["busy_s"]
                if kind == "native":
                    assert w["samples"] >= prev["samples"] and w["bytes_read"] >= prev["bytes_read"]
            last[key] = w
    final = dl.stats()
    assert final["samples"] == n and final["batches"] == n // 2
