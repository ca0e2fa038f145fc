"""Worker lifecycle: no leaks, prompt shutdown, Ctrl-C, persistent workers, exit.

Live workers are counted by helpers_datasets.live_workers(): threads named
``fl-worker*`` in /proc/self/task for fastloader, worker processes for torch.
The autouse fixture in conftest.py additionally checks that nothing outlives
each test.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import helpers_datasets as H

HERE = os.path.dirname(os.path.abspath(__file__))


def _assert_workers_gone(timeout=2.0):
    left = H.wait_workers_gone(timeout=timeout)
    assert not left, f"{len(left)} worker(s) still alive: {sorted(left)}"


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_break_mid_epoch_then_del_iterator(DL, num_workers):
    dl = DL(H.RangeDataset(40), batch_size=2, num_workers=num_workers)
    it = iter(dl)
    got = []
    for b in it:
        got.append(b.tolist())
        if len(got) == 3:
            break
    assert got == [[0, 1], [2, 3], [4, 5]]
    assert H.wait_until(lambda: len(H.live_workers()) == num_workers), H.live_workers()
    del it
    gc.collect()
    _assert_workers_gone()
    # the loader is still usable
    assert len(list(dl)) == 20
    _assert_workers_gone()


@pytest.mark.parametrize("num_workers", [1, 2])
def test_for_loop_break_releases_workers(DL, num_workers):
    dl = DL(H.RangeDataset(40), batch_size=2, num_workers=num_workers)
    for i, _ in enumerate(dl):
        if i == 2:
            break
    gc.collect()
    _assert_workers_gone()


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_exhausted_iterator_releases_workers(DL, num_workers):
    dl = DL(H.RangeDataset(10), batch_size=3, num_workers=num_workers)
    it = iter(dl)
    assert len(list(it)) == 4
    # non-persistent workers are released when the epoch ends, even while `it` is alive
    _assert_workers_gone()
    with pytest.raises(StopIteration):
        next(it)
    del it


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_del_persistent_loader(DL, num_workers):
    dl = DL(H.RangeDataset(20), batch_size=2, num_workers=num_workers, persistent_workers=True)
    for i, _ in enumerate(dl):
        if i == 3:
            break
    assert len(list(dl)) == 10
    # persistent: the workers survive the end of the epoch
    assert len(H.live_workers()) == num_workers
    del dl
    gc.collect()
    _assert_workers_gone()


@pytest.mark.parametrize("num_workers", [1, 2])
def test_del_loader_while_iterator_alive(DL, num_workers):
    dl = DL(H.RangeDataset(20), batch_size=2, num_workers=num_workers)
    it = iter(dl)
    first = next(it).tolist()
    del dl
    gc.collect()
    rest = [b.tolist() for b in it]  # the iterator keeps working without its loader
    assert [first] + rest == [[i, i + 1] for i in range(0, 20, 2)]
    del it
    _assert_workers_gone()


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_keyboard_interrupt_while_waiting(DL, num_workers):
    ds = H.SlowDataset(8, delay=30.0, fast_prefix=2)
    dl = DL(ds, batch_size=1, num_workers=num_workers)
    it = iter(dl)
    assert next(it).view(-1).tolist() == [0]
    sent = []

    def interrupt():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(0.4, interrupt)
    got = []
    caught_in = None
    try:
        timer.start()
        try:
            for b in it:
                got.append(b.view(-1).tolist())
        except KeyboardInterrupt:
            caught = time.monotonic()
            caught_in = threading.current_thread()
    finally:
        timer.cancel()
        H.RELEASE.set()
    assert caught_in is threading.main_thread(), "KeyboardInterrupt was not raised in the main thread"
    assert sent, "timer did not fire"
    assert caught - sent[0] < 1.0, f"loop stopped {caught - sent[0]:.2f}s after SIGINT"
    assert got == [[1]]
    del it
    gc.collect()
    _assert_workers_gone()


@pytest.mark.parametrize("num_workers", [1, 2])
def test_persistent_workers_50_epochs(DL, num_workers):
    ds = H.NativeIdDataset(8)
    dl = DL(ds, batch_size=1, num_workers=num_workers, persistent_workers=True)
    live_per_epoch = []
    loaders = set()
    for epoch in range(50):
        n = 0
        for k, (idx, nid) in enumerate(dl):
            if k == 0:
                if epoch == 0:  # give freshly started workers a moment to show up
                    H.wait_until(lambda: len(H.live_workers()) == num_workers)
                live_per_epoch.append(frozenset(H.live_workers()))
            loaders.update(nid.tolist())
            n += 1
        assert n == 8
    first = live_per_epoch[0]
    assert len(first) == num_workers
    assert all(s == first for s in live_per_epoch), "worker set changed across epochs"
    # every item was loaded by one of those same workers (threads or processes)
    assert loaders <= first, (sorted(loaders), sorted(first))
    assert threading.get_native_id() not in loaders
    assert H.live_workers() == first
    del dl
    _assert_workers_gone()


@pytest.mark.parametrize("num_workers", [1, 2])
def test_non_persistent_workers_fresh_each_epoch(DL, num_workers):
    ds = H.NativeIdDataset(8)
    dl = DL(ds, batch_size=1, num_workers=num_workers)
    seen = []
    for epoch in range(5):
        loaders = set()
        it = iter(dl)
        idx, nid = next(it)
        H.wait_until(lambda: len(H.live_workers()) == num_workers)
        live = H.live_workers()
        loaders.update(nid.tolist())
        for idx, nid in it:
            loaders.update(nid.tolist())
        del it
        _assert_workers_gone()
        assert len(live) == num_workers
        assert loaders <= live and threading.get_native_id() not in loaders
        for prev in seen:
            assert not (live & prev), "a worker was reused without persistent_workers"
        seen.append(live)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_abandoned_iterator_in_reference_cycle(DL, num_workers):
    dl = DL(H.RangeDataset(40), batch_size=2, num_workers=num_workers)

    def make_cycle():
        it = iter(dl)
        next(it)
        holder = {"it": it}
        holder["self"] = holder
        return holder

    make_cycle()
    gc.collect()
    _assert_workers_gone()
    del dl


@pytest.mark.parametrize("num_workers", [1, 2])
def test_loader_in_reference_cycle(DL, num_workers):
    def make_cycle():
        dl = DL(H.RangeDataset(40), batch_size=2, num_workers=num_workers, persistent_workers=True)
        it = iter(dl)
        next(it)
        dl.me = dl
        it_holder = [it]
        it_holder.append(it_holder)

    make_cycle()
    gc.collect()
    _assert_workers_gone()


EXIT_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {here!r})
    import torch
    if os.environ.get("FL_TEST_AGAINST_TORCH") == "1":
        from torch.utils.data import DataLoader
    else:
        from fastloader import DataLoader

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            if i >= 2:
                time.sleep(30)  # busy, and not interruptible
            return i

    dl = DataLoader(Slow(), batch_size=1, num_workers={nw}, persistent_workers={persistent})
    it = iter(dl)
    assert next(it).tolist() == [0]
    assert next(it).tolist() == [1]
    time.sleep(0.2)  # workers are now inside the 30 s sleeps
    print("END", repr(time.time()), flush=True)
    """
)


@pytest.mark.parametrize("num_workers,persistent", [(2, False), (4, True)])
def test_process_exits_with_live_iterator(num_workers, persistent):
    script = EXIT_SCRIPT.format(here=HERE, nw=num_workers, persistent=persistent)
    env = dict(os.environ)
    if not H.AGAINST_TORCH:
        import importlib.util

        spec = importlib.util.find_spec("fastloader")
        assert spec is not None and spec.origin, "fastloader is not importable"
        pkg_parent = os.path.dirname(os.path.dirname(spec.origin))
        env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    done = time.time()
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
    end_lines = [l for l in proc.stdout.splitlines() if l.startswith("END ")]
    assert end_lines, proc.stdout
    exit_time = done - float(end_lines[-1].split()[1])
    assert exit_time < 5.0, f"process took {exit_time:.1f}s to exit after the end of the script"
    assert "Fatal Python error" not in proc.stderr, proc.stderr


def test_backend_close_without_a_timeout_uses_the_kinds_policy():
    # Both engines take close(timeout=None) (None: no limit); which limit a
    # plain close() gets is the backend's choice: a native worker runs C,
    # where only a read of a hung network file system may never return.
    from fastloader.backends import NativeBackend, PythonBackend

    class Engine:
        closed = False

        def close(self, timeout=None):
            self.timeout = timeout
            return True

    for backend, default in ((NativeBackend(2, None), 10.0), (PythonBackend(2, None, None), None)):
        for given, expected in ((None, default), (0.5, 0.5)):
            backend.engine = eng = Engine()
            backend.close(given)
            assert eng.timeout == expected and backend.engine is None
