"""worker_mode="process" (and "auto", the default, for a Python dataset): torch's worker-process semantics with
batches in shared memory (fastloader/_procworkers.py, csrc/core/shmring.c).

Equality tests compare with torch.utils.data.DataLoader itself (forked
workers; torch's result does not depend on the start method, so the spawn
case is compared with it too).  Every test checks that no worker process
outlives it.
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDL
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import helpers_datasets as H

pytestmark = pytest.mark.fastloader_only

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def no_leaked_processes():
    yield
    deadline = time.monotonic() + 3.0
    while multiprocessing.active_children() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
    left = multiprocessing.active_children()
    assert not left, f"worker processes outlived their test: {left}"


def _fl():
    import fastloader

    return fastloader


# --------------------------------------------------------------------------
# datasets (module level: spawned workers import them from here)


class RandomDraws(Dataset):
    """Each sample draws from the global random, torch and NumPy generators
    and reports the worker it ran in: equal to torch's only with the same
    seeding and the same job -> worker assignment."""

    def __init__(self, n=24):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return {
            "x": torch.rand(3) + i,
            "r": random.random(),
            "np": np.random.rand(2),
            "worker": (info.id, info.num_workers, info.seed) if info is not None else None,
            "name": f"sample-{i}",
        }


class RangeIterable(IterableDataset):
    """torch's documented pattern: worker_init_fn gives each worker's copy
    its own [start, end); lengths differ per worker."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


def split_range(worker_id):
    info = get_worker_info()
    ds = info.dataset
    total = ds.end - ds.start
    per = -(-total // info.num_workers)
    ds.start = ds.start + worker_id * per
    ds.end = min(ds.start + per, ds.end)


class Failing(Dataset):
    def __init__(self, bad, exc):
        self.bad, self.exc = bad, exc

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc
        return i


class NeedsTwoArgs(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


class SlowAfter(Dataset):
    """Fast for the first `fast` samples, then sleeps 30 s: the workers
    running these are terminated by the loader, so they must not wait on a
    shared multiprocessing object (a killed waiter leaves its Condition
    unusable for everyone else)."""

    def __init__(self, n=8, fast=2):
        self.n, self.fast = n, fast

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.fast:
            time.sleep(30.0)
        return i


class PurePython(Dataset):
    """Holds the GIL: a Python loop per sample (~1 ms)."""

    def __len__(self):
        return 320

    def __getitem__(self, i):
        s = 0
        for k in range(40000):
            s += k * i
        return i


class Sleepy(Dataset):
    """Releases the GIL (sleeps) for every sample."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.002)
        return i


class Images(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return np.full((3, 8, 8), i, dtype=np.float32), i


class Slow(Dataset):
    """Small arrays, `delay` seconds of sleep each."""

    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return np.full((3, 8, 8), i, dtype=np.float32), i


class DieInCollate(Images):
    """Its collate_fn stacks the batch into the worker's shared-memory slot
    (fastloader's default collation, as a user's collate_fn may call it) and
    then kills the worker process."""

    @staticmethod
    def collate(batch):
        from fastloader.collate import fast_default_collate

        out = fast_default_collate(batch)
        os.kill(os.getpid(), signal.SIGKILL)
        return out


def numpy_collate(batch):
    return np.stack([b[0] for b in batch]), np.array([b[1] for b in batch])


# --------------------------------------------------------------------------
# helpers


def _run(loader_cls, ds, *, seed=0, epochs=1, **kw):
    g = torch.Generator()
    g.manual_seed(seed)
    dl = loader_cls(ds, generator=g, **kw)
    out = [list(dl) for _ in range(epochs)]
    del dl
    return out


# --------------------------------------------------------------------------
# equality with torch


@pytest.mark.parametrize("num_workers,persistent", [(2, False), (3, True)])
def test_same_batches_and_draws_as_torch_fork(num_workers, persistent):
    fl = _fl()
    kw = dict(batch_size=3, shuffle=True, num_workers=num_workers, persistent_workers=persistent)
    epochs = 2 if persistent else 1
    want = _run(TorchDL, RandomDraws(), epochs=epochs, **kw)
    got = _run(fl.DataLoader, RandomDraws(), epochs=epochs, worker_mode="process", **kw)
    H.assert_same(got, want)
    # the workers really ran in processes, each seeded base_seed + id
    seeds = {w[2] - w[0] for ep in got for b in ep for w in zip(*[t.tolist() for t in b["worker"]])}
    assert len(seeds) == 1


def test_same_batches_as_torch_spawn():
    fl = _fl()
    kw = dict(batch_size=4, shuffle=True, num_workers=2)
    want = _run(TorchDL, RandomDraws(16), **kw)  # torch's seeding does not depend on the start method
    got = _run(fl.DataLoader, RandomDraws(16), worker_mode="process", multiprocessing_context="spawn", **kw)
    H.assert_same(got, want)


def test_iterable_sharding_and_worker_init_fn_as_torch():
    fl = _fl()
    kw = dict(batch_size=4, num_workers=3, worker_init_fn=split_range)
    want = _run(TorchDL, RangeIterable(0, 23), **kw)
    got = _run(fl.DataLoader, RangeIterable(0, 23), worker_mode="process", **kw)
    H.assert_same(got, want)
    assert sorted(x for b in got[0] for x in b.tolist()) == list(range(23))


def test_persistent_workers_keep_their_processes():
    fl = _fl()
    dl = fl.DataLoader(RandomDraws(8), batch_size=2, num_workers=2, worker_mode="process", persistent_workers=True)
    pids = []
    for _ in range(3):
        it = iter(dl)
        assert len(list(it)) == 4
        pids.append(tuple(it._backend.engine.pids()))
    assert pids[0] == pids[1] == pids[2]
    del dl, it


# --------------------------------------------------------------------------
# batches in shared memory


def test_arrays_come_from_the_shared_memory_ring():
    fl = _fl()
    dl = fl.DataLoader(Images(), batch_size=8, num_workers=2, worker_mode="process")
    it = iter(dl)
    x, y = next(it)
    ring = it._backend.engine.ring
    lo, hi = ring.slot_address(0), ring.slot_address(ring.nslots - 1) + ring.slot_bytes
    assert lo <= x.data_ptr() < hi and lo <= y.data_ptr() < hi
    assert x.shape == (8, 3, 8, 8) and x[5, 0, 0, 0].item() == 5.0 and y.tolist() == list(range(8))
    # the worker's mapping is an anonymous memfd: no file to leak
    pid = it._backend.engine.pids()[0]
    with open(f"/proc/{pid}/maps") as f:
        assert "memfd:fastloader-batches" in f.read()
    rest = list(it)
    assert dl.stats()["shared_memory"]["slots_peak"] >= 2
    del it, dl, x, y, rest


def test_custom_collate_numpy_and_batches_kept_beyond_the_ring():
    fl = _fl()
    dl = fl.DataLoader(Images(), batch_size=2, num_workers=2, worker_mode="process", collate_fn=numpy_collate)
    kept = list(dl)  # 20 batches alive at once: more than the ring's slots, so some are pickled
    assert len(kept) == 20 and dl.stats()["shared_memory"]["batches_pickled"] > 0
    for k, (x, y) in enumerate(kept):
        assert isinstance(x, np.ndarray) and x.dtype == np.float32
        assert y.tolist() == [2 * k, 2 * k + 1] and float(x[1].mean()) == 2 * k + 1


def test_non_array_batches_are_pickled():
    fl = _fl()
    got = list(fl.DataLoader(["a", "b", "c", "d", "e"], batch_size=2, num_workers=2, worker_mode="process"))
    assert got == [["a", "b"], ["c", "d"], ["e"]]


# --------------------------------------------------------------------------
# errors


def test_exception_keeps_its_type_with_a_note_naming_index_and_worker():
    fl = _fl()
    dl = fl.DataLoader(Failing(5, KeyError("nope")), batch_size=2, num_workers=2, worker_mode="process")
    it = iter(dl)
    assert next(it).tolist() == [0, 1]
    assert next(it).tolist() == [2, 3]
    with pytest.raises(KeyError) as ei:
        next(it)
    notes = "\n".join(ei.value.__notes__)
    assert "sample index 5" in notes and "worker 0" in notes and "worker process 0 (pid" in notes
    assert "raise self.exc" in notes  # the worker's traceback travels as a note
    assert next(it).tolist() == [6, 7]  # as with torch, the loader goes on
    del it


def test_exception_that_cannot_be_pickled_as_is():
    fl = _fl()
    dl = fl.DataLoader(Failing(0, NeedsTwoArgs(1, 2)), batch_size=2, num_workers=1, worker_mode="process")
    with pytest.raises(RuntimeError, match="NeedsTwoArgs: 1/2") as ei:
        next(iter(dl))
    assert "sample index 0" in "\n".join(ei.value.__notes__)


def test_worker_init_fn_error_is_raised_at_the_first_batch():
    fl = _fl()

    dl = fl.DataLoader(list(range(4)), batch_size=2, num_workers=1, worker_mode="process",
                       worker_init_fn=_failing_init)
    with pytest.raises(ValueError, match="init failed") as ei:
        next(iter(dl))
    assert "worker_init_fn(0)" in "\n".join(ei.value.__notes__)


def _failing_init(worker_id):
    raise ValueError("init failed")


def test_killed_worker_is_reported_within_a_second():
    fl = _fl()
    dl = fl.DataLoader(SlowAfter(8, fast=1), batch_size=1, num_workers=2, worker_mode="process")
    it = iter(dl)
    assert next(it).tolist() == [0]
    victim = it._backend.engine.pids()[1]
    threading.Timer(0.2, os.kill, (victim, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"worker process 1 \(pid {victim}\) exited unexpectedly.*SIGKILL") as e:
        next(it)
    # torch's own first sentence, which scripts (and torch's test_segfault) match
    assert str(e.value).startswith(f"DataLoader worker (pid {victim}) is killed by signal: Killed. ")
    assert time.monotonic() - t0 < 1.2
    with pytest.raises(RuntimeError, match="exited unexpectedly"):  # it stays broken
        next(it)
    del it


def test_timeout_names_the_batch():
    fl = _fl()
    dl = fl.DataLoader(SlowAfter(4, fast=0), batch_size=1, num_workers=1, worker_mode="process", timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 0.3 seconds waiting for batch 0"):
        next(iter(dl))
    assert time.monotonic() - t0 < 2.0


def test_ctrl_c_while_waiting():
    fl = _fl()
    dl = fl.DataLoader(SlowAfter(8, fast=2), batch_size=1, num_workers=2, worker_mode="process")
    it = iter(dl)
    assert next(it).tolist() == [0]
    sent = []
    timer = threading.Timer(0.3, lambda: (sent.append(time.monotonic()), os.kill(os.getpid(), signal.SIGINT)))
    got = []
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for b in it:
                got.append(b.tolist())
        caught = time.monotonic()
    finally:
        timer.cancel()
    assert got == [[1]] and caught - sent[0] < 1.0
    t0 = time.monotonic()
    del it
    gc.collect()
    assert time.monotonic() - t0 < 2.5  # the busy workers are stopped, not waited for


# a parent whose 2 worker processes are busy in a 30 s sample; then `then`
LIVE_WORKERS = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {here!r})
    import fastloader
    from test_process_workers import SlowAfter

    dl = fastloader.DataLoader(SlowAfter(64, fast=4), batch_size=1, num_workers=2, worker_mode="process",
                               persistent_workers=True)
    it = iter(dl)
    next(it)
    print("PIDS", *it._backend.engine.pids(), flush=True)
    time.sleep(0.3)  # the workers are now inside a 30 s sample
    """
)


def _run_live_workers(then):
    """Run LIVE_WORKERS and the line `then`; returns (the process, when it
    ended, its workers' pids)."""
    import fastloader

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(fastloader.__file__)))
    proc = subprocess.run([sys.executable, "-c", LIVE_WORKERS.format(here=HERE) + then + "\n"], capture_output=True,
                          text=True, timeout=120, env=env)
    done = time.time()
    pids = [int(p) for line in proc.stdout.splitlines() if line.startswith("PIDS") for p in line.split()[1:]]
    return proc, done, pids


def test_parent_killed_leaves_no_processes_and_no_shared_memory():
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    proc, _, pids = _run_live_workers("os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(pids) == 2

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 2.0
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(alive(p) for p in pids), "worker processes outlived their killed parent"
    if os.path.isdir("/dev/shm"):
        assert not {n for n in set(os.listdir("/dev/shm")) - shm_before if "fastloader" in n}


def test_interpreter_exit_with_a_live_iterator_does_not_hang():
    proc, done, pids = _run_live_workers('print("END", time.time(), flush=True)')
    assert proc.returncode == 0, proc.stderr
    end = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("END")]
    assert end and done - end[0] < 3.0, f"exit took {done - end[0]:.1f} s"
    assert len(pids) == 2 and not [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert "Traceback" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------
# worker_mode="auto" (the default): processes for a Python dataset


def test_auto_runs_a_python_dataset_in_processes_from_the_first_batch():
    fl = _fl()
    dl = fl.DataLoader(PurePython(), batch_size=16, num_workers=2, persistent_workers=True)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            first = [x for b in dl for x in b.tolist()]
            second = [x for b in dl for x in b.tolist()]
    finally:
        dl._iterator = None  # a failed check must not leave the persistent workers behind
    assert first == second == list(range(320))
    assert not [x for x in w if "GIL" in str(x.message)]   # processes: nothing to warn about
    st = dl.stats()
    assert st["worker_mode"] == "process" and "Python dataset" in st["worker_mode_why"]
    del dl


def test_thread_mode_is_kept_when_asked_for():
    fl = _fl()
    dl = fl.DataLoader(Sleepy(), batch_size=8, num_workers=2, worker_mode="thread")
    got = [x for b in dl for x in b.tolist()]
    assert got == list(range(256))
    assert dl.stats()["worker_mode"] == "thread"
    assert not multiprocessing.active_children()


# --------------------------------------------------------------------------
# arguments


def test_worker_mode_is_checked_and_multiprocessing_context_honoured():
    fl = _fl()
    with pytest.raises(ValueError, match="worker_mode"):
        fl.DataLoader([1], worker_mode="processes")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fl.DataLoader([1], num_workers=1, multiprocessing_context="fork", worker_mode="process")
    assert not [x for x in w if "multiprocessing_context" in str(x.message)]
    with pytest.warns(UserWarning, match="ignores multiprocessing_context"):
        fl.DataLoader([1], num_workers=1, multiprocessing_context="fork", worker_mode="thread")


def test_shm_ring_contract():
    from fastloader import _C

    ring = _C.ShmRing(2, 1 << 20)
    a, b = ring.acquire(), ring.acquire()
    assert (a, b, ring.acquire()) == (0, 1, -1)
    worker = _C.ShmRing.attach(ring.fd, 2, 1 << 20)
    assert not worker.owner and worker.acquire() == -1
    worker.begin(1)
    buf = _C.stack([np.arange(4, dtype=np.int64)] * 3, pool=worker)  # default collation into the slot
    assert buf.ptr == worker.slot_address(1)
    assert worker.alloc(1 << 20) == -1 and worker.alloc(8) == 128  # 96 bytes used, next 64-byte boundary
    view = ring.buffer(1, 0, 96)
    ring.release(1)
    assert ring.slots_in_use == 2  # the view still holds slot 1
    assert torch.from_dlpack(view).view(torch.int64).view(3, 4)[2].tolist() == [0, 1, 2, 3]
    del view
    assert ring.slots_in_use == 1 and ring.acquire() == 1
    with pytest.raises(ValueError):
        ring.buffer(0, (1 << 20) - 8, 16)
    del ring, worker, buf


def test_shm_ring_workers_claim_slots_when_they_collate():
    """A worker takes the lowest free slot at its batch's first allocation
    (not when the job is sent), the owner adopts it from the result, frees
    it at the last reference, and reclaims what a dead worker took."""
    from fastloader import _C

    ring = _C.ShmRing(3, 1 << 16)
    w0 = _C.ShmRing.attach(ring.fd, 3, 1 << 16)
    w1 = _C.ShmRing.attach(ring.fd, 3, 1 << 16)
    w0.claim(0)
    assert w0.slot == -1 and ring.claim_of(0) == 0  # nothing laid out yet: nothing taken
    buf = _C.stack([np.full(4, 7, dtype=np.int32)] * 2, pool=w0)
    assert w0.slot == 0 and ring.claim_of(0) == 1 and buf.ptr == w0.slot_address(0)
    w1.claim(1)
    assert w1.alloc(8) == 0 and w1.slot == 1 and ring.claim_of(1) == 2
    assert ring.acquire() == 2  # the owner skips the workers' slots
    assert not ring.adopt(1, 0)  # worker 0 does not hold slot 1: refused, left alone
    assert ring.claim_of(1) == 2 and ring.slots_in_use == 1
    assert ring.adopt(0, 0) and ring.claim_of(0) == -1 and ring.slots_in_use == 2
    view = ring.buffer(0, 0, 32)
    assert torch.from_dlpack(view).view(torch.int32).tolist() == [7] * 8
    ring.release(0)
    assert ring.claim_of(0) == -1  # the view still holds it
    del view
    assert ring.claim_of(0) == 0 and ring.slots_in_use == 1
    w0.claim(0)
    assert w0.alloc(8) == 0 and w0.slot == 0  # the lowest free one again
    # every slot taken: the next batch gets none and its allocations fail
    w1.claim(1)
    assert w1.alloc(8) == -1 and w1.slot == -1
    # worker 1 dies holding slot 1: the owner frees it, and only it
    assert ring.reclaim(1) == 1 and ring.claim_of(1) == 0 and ring.claim_of(0) == 1
    with pytest.raises(ValueError):
        w0.claim(-1)
    del ring, w0, w1, buf


def test_no_slot_is_held_while_a_job_waits_or_runs_getitem():
    """Slots (whose pages stay resident once written) are taken when a
    batch is collated, not when its job is sent: while the prefetch window's
    jobs wait in the queues and run __getitem__, no slot is held, as torch's
    per-batch shared memory does not exist before collation either."""
    fl = _fl()
    dl = fl.DataLoader(Slow(8, 0.4), batch_size=2, num_workers=2, worker_mode="process")
    it = iter(dl)
    time.sleep(0.2)  # 4 jobs sent, each worker inside its first __getitem__
    ring = it._backend.engine.ring
    assert len(it._backend.engine.jobs) == 4
    assert ring.slots_in_use == 0 and [ring.claim_of(i) for i in range(ring.nslots)] == [0] * ring.nslots
    x, _ = next(it)
    assert ring.slot_address(0) <= x.data_ptr() < ring.slot_address(0) + ring.slot_bytes
    rest = [b[0].clone() for b in it]
    assert len(rest) == 3
    # x, the batch the comprehension holds until the next arrives, and one
    # collating in each worker: at most 4 slots written (taking them at
    # submit, the window's 4 jobs and the 2 held made 6)
    assert dl.stats()["shared_memory"]["slots_written"] <= 4
    del it, dl, x, ring


def test_a_worker_killed_while_collating_gives_its_slot_back():
    """A worker that dies after its batch took a slot never hands it over:
    the loader frees it when it reaps the worker."""
    fl = _fl()
    ds = DieInCollate()
    dl = fl.DataLoader(ds, batch_size=2, num_workers=1, worker_mode="process", collate_fn=ds.collate)
    it = iter(dl)
    ring = it._backend.engine.ring
    with pytest.raises(RuntimeError, match="exited unexpectedly|killed by signal"):
        next(it)
    assert [ring.claim_of(i) for i in range(ring.nslots)] == [0] * ring.nslots
    del it, dl, ring


def test_a_forked_child_never_frees_the_loaders_slots():
    """A process forked from the loader inherits its ring (the shared file
    and a copy of the owner's bookkeeping): the child's copies of the views
    dying must not mark the loader's slots free in the shared claim table,
    or a worker would overwrite a batch the loop still holds."""
    from fastloader import _C

    ring = _C.ShmRing(2, 1 << 16)
    slot = ring.acquire()
    view = ring.buffer(slot, 0, 64)
    ring.release(slot)  # the view holds it now
    pid = os.fork()
    if pid == 0:  # the child: drop its copy of the view, try to take and free slots
        code = 0
        try:
            del view
            gc.collect()
            if ring.acquire() != -1 or ring.reclaim(0) != 0 or ring.adopt(1, 0):
                code = 3
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert ring.claim_of(slot) == -1 and ring.slots_in_use == 1  # still the loader's
    del view
    assert ring.claim_of(slot) == 0
    del ring


def test_shm_ring_errors_get_the_types_of_their_errno(tmp_path):
    """The ring's failures go through the one translator: an OS failure is
    the OSError subclass of its errno (it used to be a bare OSError, and
    every other failure a ValueError)."""
    import errno

    from fastloader import _C

    path = tmp_path / "ring"
    path.write_bytes(bytes(1 << 16))  # room for the claim table and a slot
    fd = os.open(path, os.O_RDONLY)  # read-only: cannot be mapped shared for writing
    try:
        with pytest.raises(PermissionError, match="mmap of the shared-memory batch ring") as e:
            _C.ShmRing.attach(fd, 1, 64)
        assert e.value.errno == errno.EACCES
    finally:
        os.close(fd)
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(OSError, match="duplicating the shared-memory ring's descriptor") as e:
        _C.ShmRing.attach(r, 1, 64)  # a closed descriptor
    assert e.value.errno == errno.EBADF
    with pytest.raises(ValueError, match="nslots"):
        _C.ShmRing(0, 64)


# --------------------------------------------------------------------------
# pin_memory, against the stand-in CUDA runtime (tests/fakecuda)


def _fake_pin_child():
    """Runs in a child process with FASTLOADER_CUDART = the fake runtime;
    prints FAKECUDA-PROC {json}."""
    import json

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    copied = []  # what is still pinned with a copy (torch's pin_memory, stubbed)
    torch.Tensor.pin_memory = lambda self, *a, **k: copied.append(list(self.shape)) or self.clone()
    torch.Tensor.is_pinned = lambda self, *a, **k: False
    fl = _fl()
    out = {}
    dl = fl.DataLoader(Images(), batch_size=8, num_workers=2, worker_mode="process", pin_memory=True)
    it = iter(dl)
    got = [next(it)]
    ring = it._backend.engine.ring
    got += list(it)
    out["pinned_slots"] = [ring.pinned_bytes(s) for s in range(ring.nslots)]
    out["batch_bytes"] = 8 * 3 * 8 * 8 * 4 + 8 * 8
    out["copied"] = copied[:]
    out["values_ok"] = all(float(x[j, 0, 0, 0]) == 8 * k + j and y.tolist() == list(range(8 * k, 8 * k + 8))
                           for k, (x, y) in enumerate(got) for j in range(8))
    del it, dl, got
    copied.clear()
    # batches kept beyond the ring are pickled: only those are pinned with a copy
    kept = list(fl.DataLoader(Images(), batch_size=2, num_workers=2, worker_mode="process", pin_memory=True))
    out["kept_copied"] = len(copied)
    out["kept_ok"] = [y.tolist() for _, y in kept] == [[2 * k, 2 * k + 1] for k in range(20)]
    print("FAKECUDA-PROC " + json.dumps(out), flush=True)


def test_pin_memory_page_locks_the_slots_once(tmp_path_factory):
    from helpers_fakecuda import run_test_function

    r = run_test_function(tmp_path_factory, "test_process_workers", "_fake_pin_child", marker="FAKECUDA-PROC")
    assert r["values_ok"] and r["kept_ok"], r
    # every slot locked, sized from the first batch (a quarter more, whole pages)
    assert all(b >= r["batch_bytes"] for b in r["pinned_slots"]), r
    assert r["copied"] == [], r  # nothing pinned twice: every tensor lives in a locked slot
    assert r["kept_copied"] > 0, r  # the pickled ones are copied


def test_more_worker_processes_than_cpus_warns_as_torch_does():
    """torch's check_worker_number_rationality warning, once per iterator
    (as torch gives it), naming the workers: processes or threads
    (tests/test_torch_parity.py has the rest)."""
    fl = _fl()
    n = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) + 1
    for mode, kind in (("process", "processes"), ("thread", "threads")):
        dl = fl.DataLoader(list(range(4)), batch_size=2, num_workers=n, worker_mode=mode)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert [b.tolist() for b in dl] == [[0, 1], [2, 3]]
        got = [str(x.message) for x in w if "This DataLoader will create" in str(x.message)]
        assert got and all(f"will create {n} worker {kind} in total" in m for m in got), (mode, got)
        assert len(got) == 1, (mode, got)


def test_native_dataset_in_process_mode_gives_no_process_warning(tmp_path):
    """A native dataset ignores worker_mode="process" (its workers are C
    threads), so torch's warning speaks of worker threads, not processes."""
    fl = _fl()
    from fastloader.tools.sample import make_sample

    make_sample(str(tmp_path / "train"), n=4, classes=2, seed=1, progress=False, processes=1)
    n = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) + 1
    ds = fl.ImageFolder(str(tmp_path / "train"), transform=fl.transforms.Compose(
        [fl.transforms.Resize((8, 8)), fl.transforms.PILToTensor()]))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert sum(len(y) for _, y in fl.DataLoader(ds, batch_size=2, num_workers=n, worker_mode="process")) == 4
    got = [str(x.message) for x in w if "This DataLoader will create" in str(x.message)]
    assert len(got) == 2 and all("worker threads in total" in m for m in got), got  # construction, iterator
