"""Fault injection (issue 9, item 15): what the loader does when the files under
it change, when it is signalled or forked, when it is created 500 times, when
the fd limit is low, and with odd file names.

Two kinds of dataset are driven through fastloader.DataLoader with
num_workers 0 and 2:

* native: fastloader.ImageList / ImageFolder (files read and decoded in C);
* Python: FileDataset below, a plain map-style Dataset whose __getitem__
  reads the file itself -- with Python's open() ("open"), or with
  fastloader.decode_jpeg(path) ("decode_jpeg", which reads in C).

The contract these tests hold the loader to:

* on_error="skip": every sample is either delivered or listed in
  dataset.skipped (delivered + skipped == epoch size); "replace": batches stay
  full and every bad file is listed in dataset.replaced;
* on_error="raise": the error has the type of what went wrong -- a missing
  file FileNotFoundError (errno ENOENT, .filename the path as given), a
  directory IsADirectoryError, an unreadable file PermissionError, a FIFO an
  OSError or DecodeError saying "not a regular file" -- and bytes that are not
  a valid image DecodeError; it names the sample index; the batches before it
  are delivered, and the next epoch runs once the file is fixed;
* nothing blocks (a FIFO is never opened for a blocking read) and nothing
  hangs: every test runs under a faulthandler watchdog that dumps all stacks
  and exits if a test takes longer than WATCHDOG_S, loaders have timeout=,
  and subprocesses have deadlines;
* threads and open file descriptors are flat after each test (the autouse
  `flat_threads_and_fds` fixture below, on top of conftest's
  no_leaked_workers).

What is here:

* test_native_file_fault_mid_epoch / test_python_file_fault_mid_epoch: a file
  deleted, truncated, replaced by a directory or a FIFO, or made unreadable
  after the first batch (see _run_epoch_with_fault for why that is
  deterministic), for each on_error and num_workers 0 / 2;
  test_python_dataset_blocked_on_fifo_times_out: a worker stuck in the
  dataset's own blocking open() -> timeout= fires;
* test_consumer_keeps_every_batch: 2 epochs of kept batches;
* test_500_loaders_created_and_destroyed: threads and fds flat;
* non-UTF-8 file names, long non-ASCII paths, symlinks (valid, dangling, loops);
* in subprocesses: SIGINT / SIGTERM while iterating, os.fork with a live
  loader, an epoch of 1200 files under `ulimit -n 256`;
* test_sigint_while_an_iterator_is_finalized_is_not_lost.

The one test marked xfail(strict=True) is a known bug, left open (see its
reason); strict, so a fix is noticed and the mark removed.
"""

from __future__ import annotations

import errno
import faulthandler
import gc
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import pytest

torch = pytest.importorskip("torch")

import helpers_datasets as H  # noqa: E402
import imgutil  # noqa: E402

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402

pytestmark = pytest.mark.fastloader_only

WATCHDOG_S = 120         # a test running longer is hung: dump all stacks and exit (generous for ASan)
NO_BLOCK_S = 0.5         # a next() that takes longer than this blocked on something
N = 12                   # samples per test epoch
BS = 2                   # batch size: N // BS batches
BAD = (8, 11)            # samples made bad after the first batch (batches 4 and 5)

# -- fixtures --------------------------------------------------------------------


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _task_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _thread_names() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(names)


@pytest.fixture(scope="module", autouse=True)
def _warm_torch(jpeg):
    # torch's intra-op thread pool starts at the first parallel op (making
    # the test image is one); start it now so that it is not counted as a
    # thread leaked by the first test.  The process's first fork() then
    # retires one thread of that pool for good (torch's at-fork handling,
    # seen with a bare multiprocessing Process): fork once now too, so that a
    # test that starts worker processes first in a session is not charged
    # with one thread fewer.
    torch.ones(1 << 20).add_(1).sum()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    yield


@pytest.fixture(autouse=True)
def flat_threads_and_fds():
    """Watchdog for hangs, and: threads (/proc/self/task and threading) and
    open fds are the same after the test as before it.

    faulthandler's watchdog is a thread of its own that exits shortly after
    it is cancelled, so the counts are taken without it: before it starts
    (once the previous test's one is gone) and after it is cancelled."""

    def now():
        return (_task_count(), threading.active_count(), _fd_count())

    # leftovers of an earlier test that already failed for leaking, and the
    # previous test's watchdog thread, which exits just after its cancel
    H.wait_until(lambda: not H.live_workers(), timeout=0.5)
    _settle(now)
    before = now()
    names0 = _thread_names()
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    H.RELEASE.set()
    H.wait_until(lambda: now() == before, timeout=2.5)
    after = now()
    assert after == before, (
        f"(threads in /proc/self/task, Python threads, open fds) before {before}, after {after}: "
        f"threads before {names0}, after {_thread_names()}; fds now {sorted(os.listdir('/proc/self/fd'))}")


def _settle(now, polls=3, interval=0.01, timeout=0.5):
    """Wait until now() gives the same value `polls` times in a row."""
    deadline = time.monotonic() + timeout
    last, same = now(), 0
    while same < polls and time.monotonic() < deadline:
        time.sleep(interval)
        cur = now()
        same = same + 1 if cur == last else 0
        last = cur


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return imgutil.make_jpeg("astronaut", (40, 32), quality=85)


def _tree(root, jpeg, n=N, classes=2):
    """An ImageFolder tree of n copies of `jpeg` (classes folders, sorted
    names): returns the paths in ImageFolder's sample order."""
    paths = []
    per = -(-n // classes)
    for i in range(n):
        d = os.path.join(root, f"c{i // per}")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, f"{i:04d}.jpg")
        with open(p, "wb") as f:
            f.write(jpeg)
        paths.append(p)
    return paths


def _tf():
    # Deterministic (no random crop) and uint8, so batches can be compared
    return FT.Compose([FT.Resize((16, 16)), FT.PILToTensor()])


def _native(kind, root, paths, **kw):
    if kind == "ImageFolder":
        ds = fastloader.ImageFolder(root, transform=_tf(), **kw)
        assert [s[0] for s in ds.samples] == paths
        return ds
    # distinct labels: the label tells which sample a slot holds
    return fastloader.ImageList(paths, list(range(len(paths))), transform=_tf(), **kw)


class FileDataset(torch.utils.data.Dataset):
    """A Python map-style dataset that reads files in __getitem__."""

    def __init__(self, paths, reader="open"):
        self.paths = list(paths)
        self.reader = reader

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        if self.reader == "open":
            with open(self.paths[i], "rb") as f:
                img = fastloader.decode_jpeg(f.read())
        else:
            img = fastloader.decode_jpeg(self.paths[i])
        return torch.from_numpy(img).permute(2, 0, 1), i


# -- faults ----------------------------------------------------------------------


def _delete(p):
    os.unlink(p)


def _truncate(p):
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) // 2)


def _directory(p):
    os.unlink(p)
    os.mkdir(p)


def _fifo(p):
    os.unlink(p)
    os.mkfifo(p)


def _unreadable(p):
    os.chmod(p, 0)


def _dangling(p):
    os.unlink(p)
    os.symlink(p + ".gone", p)


def _loop(p):
    os.unlink(p)
    os.symlink(os.path.basename(p), p)


FAULTS = {"deleted": _delete, "truncated": _truncate, "directory": _directory, "fifo": _fifo,
          "unreadable": _unreadable, "dangling": _dangling, "loop": _loop}


def _restore(p, jpeg):
    if os.path.isdir(p) and not os.path.islink(p):
        os.rmdir(p)
    elif os.path.lexists(p):
        os.unlink(p)
    with open(p, "wb") as f:
        f.write(jpeg)


class FifoUnblocker:
    """Frees readers blocked in open() on FIFOs: after `after` s it keeps
    opening each FIFO for writing (non-blocking, which succeeds only while a
    reader waits) and closes it at once, so the reader's open() returns and
    its read sees end-of-file.  The loader refuses a FIFO without opening it
    for reading; should that regress, a test would then fail (the read takes
    longer than NO_BLOCK_S) instead of hanging."""

    def __init__(self, paths, after=NO_BLOCK_S + 0.3):
        self.paths = [p for p in paths]
        self.after = after
        self.stop = threading.Event()
        self.freed = 0
        self.thread = threading.Thread(target=self._run, name="fifo-unblocker", daemon=True)

    def _run(self):
        if self.stop.wait(self.after):
            return
        while not self.stop.is_set():
            for p in self.paths:
                try:
                    fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:  # ENXIO: no reader waiting; ENOENT: restored meanwhile
                    continue
                os.close(fd)
                self.freed += 1
            self.stop.wait(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        return False


def _raised(fn):
    """Call fn(); return the exception it raised, or None.

    The traceback is dropped: its frames include the loader iterator's
    __next__, so keeping it (as pytest.raises' ExceptionInfo does, for as long
    as pytest keeps a failed test's report) keeps the iterator and its worker
    threads alive past the end of the test."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e.with_traceback(None)
    return None


def _where(e) -> str:
    return " ".join([str(e), *getattr(e, "__notes__", ())])


def _run_epoch_with_fault(dl, paths, fault):
    """Take the first batch, make samples BAD bad, then run the rest of the
    epoch.  Returns (batches, error or None, slowest next() in seconds).

    Why this is deterministic: shuffle=False, batch_size=BS and, with
    workers, prefetch_factor=1 x 2 workers = a window of 2 batches.  When the
    first batch arrives only jobs 0 and 1 have been submitted (the next one is
    submitted inside the following next()), so no worker has touched samples
    BAD (batches 4 and 5) yet: the fault hits those samples mid-epoch exactly
    as if the files changed under a running epoch.  (A file that changes while
    a worker is reading it cannot be timed deterministically and is not
    covered here.)
    """
    it = iter(dl)
    batches = [next(it)]
    for i in BAD:
        FAULTS[fault](paths[i])
    err = None
    slowest = 0.0
    bad_paths = [paths[i] for i in BAD] if fault == "fifo" else []
    with FifoUnblocker(bad_paths):
        try:
            while True:
                t0 = time.monotonic()
                try:
                    b = next(it)
                except StopIteration:
                    break
                finally:
                    slowest = max(slowest, time.monotonic() - t0)
                batches.append(b)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            err = e.with_traceback(None)  # see _raised
        finally:
            del it
            gc.collect()
    return batches, err, slowest


def _labels(batches):
    return [int(x) for b in batches for x in b[1]]


def _dl(ds, nw, **kw):
    extra = dict(prefetch_factor=1, timeout=10) if nw else {}
    extra.update(kw)
    return fastloader.DataLoader(ds, batch_size=BS, shuffle=False, num_workers=nw, **extra)


def _skip_if_root(fault):
    if fault == "unreadable" and os.geteuid() == 0:
        pytest.skip("chmod 000 does not stop root (CAP_DAC_OVERRIDE): the file stays readable, so there "
                    "is no PermissionError to test when the suite runs as root")


def _check_raised(err, fault, path, index):
    """The error for `fault` on `path` has the right type and names the sample."""
    assert err is not None, f"{fault}: no error raised"
    if fault in ("deleted", "dangling"):
        assert isinstance(err, FileNotFoundError), f"{type(err).__name__}: {err}"
        assert err.errno == errno.ENOENT
        assert err.filename == path
    elif fault == "directory":
        assert isinstance(err, IsADirectoryError), f"{type(err).__name__}: {err}"
        assert err.errno == errno.EISDIR
        assert err.filename == path
    elif fault == "unreadable":
        assert isinstance(err, PermissionError), f"{type(err).__name__}: {err}"
        assert err.filename == path
    elif fault == "loop":
        assert isinstance(err, OSError) and err.errno == errno.ELOOP, f"{type(err).__name__}: {err}"
        assert err.filename == path
    elif fault == "fifo":
        assert isinstance(err, (OSError, fastloader.DecodeError)), f"{type(err).__name__}: {err}"
        assert "not a regular file" in str(err), str(err)
        assert path in str(err) or getattr(err, "filename", None) == path, str(err)
    elif fault == "truncated":
        assert isinstance(err, fastloader.DecodeError) and isinstance(err, ValueError), f"{type(err).__name__}"
        assert "Premature end of JPEG file" in str(err), str(err)
    assert f"sample index {index}" in _where(err), _where(err)


# -- native datasets: faults during an epoch ---------------------------------------


def _native_cases():
    cases = []
    for fault in ("deleted", "truncated", "directory", "unreadable", "fifo"):
        # ImageFolder reads through the same C path as ImageList: both kinds for the
        # common faults, ImageList only for the slow (FIFO) and root-skipped ones
        kinds = ("ImageList",) if fault in ("fifo", "unreadable") else ("ImageList", "ImageFolder")
        for kind in kinds:
            for on_error in ("raise", "skip", "replace"):
                for nw in (0, 2):
                    cases.append(pytest.param(fault, kind, on_error, nw, id=f"{fault}-{kind}-{on_error}-w{nw}"))
    return cases


@pytest.mark.parametrize("fault,kind,on_error,nw", _native_cases())
def test_native_file_fault_mid_epoch(tmp_path, jpeg, fault, kind, on_error, nw):
    _skip_if_root(fault)
    root = str(tmp_path / "train")
    paths = _tree(root, jpeg)
    ds = _native(kind, root, paths, on_error=on_error)
    dl = _dl(ds, nw)
    ref_labels = [int(t) for t in ds.targets]
    batches, err, slowest = _run_epoch_with_fault(dl, paths, fault)
    assert slowest < NO_BLOCK_S, f"a next() took {slowest:.2f}s: the loader blocked on the {fault} file"
    bad = [paths[i] for i in BAD]
    if on_error == "raise":
        # batches 0..3 arrive, then sample BAD[0]'s error at batch 4
        assert len(batches) == BAD[0] // BS, f"{len(batches)} batches before the error"
        _check_raised(err, fault, bad[0], BAD[0])
        # the loader is usable again once the file is fixed
        for p in bad:
            _restore(p, jpeg)
        assert _labels(list(dl)) == ref_labels
        return
    assert err is None, f"on_error={on_error!r} raised {type(err).__name__}: {err}"
    assert len(batches) == N // BS
    delivered = _labels(batches)
    if on_error == "skip":
        assert len(delivered) + len(ds.skipped) == N
        assert [s[0] for s in ds.skipped] == bad
        assert delivered == [t for i, t in enumerate(ref_labels) if i not in BAD]
    else:
        assert all(len(b[1]) == BS for b in batches), [len(b[1]) for b in batches]
        assert len(delivered) == N
        assert [r[0] for r in ds.replaced] == bad
        for bad_path, alt, reason in ds.replaced:
            assert alt not in bad and alt in paths, (bad_path, alt)
            assert reason
            if kind == "ImageList":  # labels are sample indices: the slot holds the replacement
                assert delivered[paths.index(bad_path)] == paths.index(alt)
    # the next epoch (the files are still bad) copes in the same way
    with FifoUnblocker(bad if fault == "fifo" else [], after=0.0):
        again = list(dl)
    # each bad file is listed once, however many epochs meet it (issue 9 item 10)
    if on_error == "skip":
        assert _labels(again) == delivered
        assert [s[0] for s in ds.skipped] == bad
    else:  # the replacements may differ by epoch
        assert [len(b[1]) for b in again] == [BS] * (N // BS)
        assert [r[0] for r in ds.replaced] == bad


@pytest.mark.parametrize("nw", [0, 2])
def test_native_error_type_before_iterating(tmp_path, jpeg, nw):
    """The same errors when the file is already missing when the epoch starts."""
    root = str(tmp_path / "train")
    paths = _tree(root, jpeg)
    ds = _native("ImageFolder", root, paths)
    os.unlink(paths[3])
    err = _raised(lambda: list(_dl(ds, nw)))
    _check_raised(err, "deleted", paths[3], 3)


# -- Python datasets: faults during an epoch ----------------------------------------


def _python_cases():
    cases = []
    for reader in ("open", "decode_jpeg"):
        for fault in ("deleted", "truncated", "directory", "unreadable", "fifo"):
            for nw in (0, 2):
                cases.append(pytest.param(reader, fault, nw, id=f"{reader}-{fault}-w{nw}"))
    return cases


@pytest.mark.parametrize("reader,fault,nw", _python_cases())
def test_python_file_fault_mid_epoch(tmp_path, jpeg, reader, fault, nw):
    _skip_if_root(fault)
    if fault == "fifo" and reader == "open":
        pytest.skip("Python's own open() of a FIFO blocks in the dataset's code; "
                    "test_python_dataset_blocked_on_fifo_times_out covers what the loader does then")
    paths = _tree(str(tmp_path / "train"), jpeg)
    ds = FileDataset(paths, reader)
    dl = _dl(ds, nw)
    batches, err, slowest = _run_epoch_with_fault(dl, paths, fault)
    assert slowest < NO_BLOCK_S, f"a next() took {slowest:.2f}s: blocked on the {fault} file"
    assert len(batches) == BAD[0] // BS
    if fault == "truncated":  # decoded from bytes: the message cannot name the file
        assert isinstance(err, fastloader.DecodeError), f"{type(err).__name__}: {err}"
        assert "Premature end of JPEG file" in str(err)
        assert f"sample index {BAD[0]}" in _where(err)
    else:
        _check_raised(err, fault, paths[BAD[0]], BAD[0])
    for p in (paths[i] for i in BAD):
        _restore(p, jpeg)
    assert _labels(list(dl)) == list(range(N))


def test_python_dataset_blocked_on_fifo_times_out(tmp_path, jpeg):
    """A worker stuck in the dataset's own blocking open() of a FIFO: timeout=
    raises RuntimeError naming the batch, on time, and the loader shuts down
    once the worker is freed."""
    paths = _tree(str(tmp_path / "train"), jpeg)
    dl = _dl(FileDataset(paths, "open"), 2, timeout=0.5)
    it = iter(dl)
    next(it)
    for i in BAD:
        _fifo(paths[i])
    with FifoUnblocker([paths[i] for i in BAD], after=2.0):
        got = 1
        while True:
            t0 = time.monotonic()
            err = _raised(lambda: next(it))
            waited = time.monotonic() - t0
            if err is not None:
                break
            got += 1
        del it
        gc.collect()
    assert isinstance(err, RuntimeError), repr(err)
    assert "timed out" in str(err) and "batch 4" in str(err), str(err)
    assert got == BAD[0] // BS
    assert 0.4 < waited < 1.9, f"timeout=0.5 raised after {waited:.2f}s"


# -- a consumer that keeps every batch -------------------------------------------


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_consumer_keeps_every_batch(tmp_path, jpeg, native):
    """Two epochs, every batch kept: completes, every kept batch keeps its
    values (equal to a num_workers=0 run: no buffer is reused while a tensor
    uses it), the loader holds no batch once the consumer drops them, and for
    the native dataset the batch pool holds what is kept plus at most the
    prefetch window and its 8 idle buffers (and only the idle ones after)."""
    n, bs = 48, 4
    paths = _tree(str(tmp_path / "train"), jpeg, n=n)
    if native:
        tf = FT.Compose([FT.RandomResizedCrop(32), FT.RandomHorizontalFlip(), FT.ToTensor()])
        ds = fastloader.ImageList(paths, list(range(n)), transform=tf)
    else:
        ds = FileDataset(paths, "open")

    def loader(nw):
        return fastloader.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=nw, seed=5,
                                     generator=torch.Generator().manual_seed(3), timeout=10,
                                     **({"prefetch_factor": 2} if nw else {}))

    ref = [H.clone_batch(b) for b in _two_epochs(loader(0))]
    kept = _two_epochs(loader(2))
    assert len(kept) == 2 * n // bs
    H.assert_same_batches(kept, ref)
    images_bytes = sum(b[0].element_size() * b[0].nelement() for b in kept)
    batch_bytes = kept[0][0].element_size() * kept[0][0].nelement()
    if native:
        pool = ds._native
        assert pool.pool_bytes_out >= images_bytes
        window = 2 * 2
        assert pool.pool_bytes <= images_bytes + (window + 8) * batch_bytes, (pool.pool_bytes, images_bytes)
    refs = [weakref.ref(b[0]) for b in kept]
    del kept
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive == 0, f"{alive} batches still referenced after the consumer dropped them"
    if native:
        assert pool.pool_bytes_out == 0
        assert pool.pool_bytes <= 8 * batch_bytes


def _two_epochs(dl):
    out = []
    for _ in range(2):
        for b in dl:
            out.append(b)
    return out


# -- 500 loaders ---------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_500_loaders_created_and_destroyed(tmp_path, jpeg, native):
    paths = _tree(str(tmp_path / "train"), jpeg, n=8)
    ds = _native("ImageList", None, paths) if native else FileDataset(paths, "open")
    # one loader first: lazily created state (pools, torch's patch) is not a leak
    next(iter(fastloader.DataLoader(ds, batch_size=2, num_workers=2)))
    gc.collect()
    H.wait_until(lambda: not H.live_workers(), 2.0)
    before = (_task_count(), threading.active_count(), _fd_count())
    # a leak of one thread or fd per loader shows after any number: the Python
    # dataset's loaders fork two worker processes each (a minute for 1000 forks
    # of the suite's large process), so 100 of them; the native ones start threads
    n = 500 if native else 100
    for i in range(n):
        dl = fastloader.DataLoader(ds, batch_size=2, num_workers=2, shuffle=bool(i % 2))
        b = next(iter(dl))
        assert len(b[1]) == 2
    del dl, b
    gc.collect()
    H.wait_until(lambda: (_task_count(), threading.active_count(), _fd_count()) == before, 2.5)
    after = (_task_count(), threading.active_count(), _fd_count())
    assert after == before, f"(threads, Python threads, fds) before {before}, after {n} loaders {after}"
    assert not H.live_workers()


# -- file names and symlinks -------------------------------------------------------


def _odd_tree(tmp_path, jpeg):
    """A tree whose class folder and file names are not valid UTF-8."""
    root = os.fsencode(str(tmp_path / "train"))
    names = []
    for cls in (b"c\xff", b"plain"):
        os.makedirs(os.path.join(root, cls))
        for f in (b"a\xfe\xfd.jpg", b"b-\xe9t\xe9.jpg"):  # latin-1 bytes: invalid UTF-8
            p = os.path.join(root, cls, f)
            with open(p, "wb") as fh:
                fh.write(jpeg)
            names.append(p)
    return os.fsdecode(root), [os.fsdecode(p) for p in sorted(names)]


@pytest.mark.parametrize("nw", [0, 2])
def test_non_utf8_names_load(tmp_path, jpeg, nw):
    root, paths = _odd_tree(tmp_path, jpeg)
    folder = fastloader.ImageFolder(root, transform=_tf())
    assert [s[0] for s in folder.samples] == paths
    assert folder.classes == ["c\udcff", "plain"]
    images, labels = next(iter(fastloader.DataLoader(folder, batch_size=4, num_workers=nw)))
    assert labels.tolist() == [0, 0, 1, 1] and images.shape == (4, 3, 16, 16)
    ref = images[0]
    # str (surrogateescape) and bytes paths, native and Python datasets
    for ds in (fastloader.ImageList(paths, transform=_tf()),
               fastloader.ImageList([os.fsencode(p) for p in paths], transform=_tf()),
               FileDataset(paths, "open"), FileDataset(paths, "decode_jpeg")):
        x, _ = next(iter(fastloader.DataLoader(ds, batch_size=4, num_workers=nw)))
        assert x.shape[0] == 4
        if isinstance(ds, fastloader.ImageList):
            assert torch.equal(x, ref.expand_as(x))


@pytest.mark.parametrize("nw", [0, 2])
def test_non_utf8_name_missing_raises_file_not_found(tmp_path, jpeg, nw):
    _, paths = _odd_tree(tmp_path, jpeg)
    ds = fastloader.ImageList(paths, transform=_tf())
    os.unlink(paths[2])
    err = _raised(lambda: list(fastloader.DataLoader(ds, batch_size=1, num_workers=nw)))
    _check_raised(err, "deleted", paths[2], 2)


@pytest.mark.parametrize("nw", [0, 2])
def test_non_utf8_name_bad_file_is_skipped(tmp_path, jpeg, nw):
    _, paths = _odd_tree(tmp_path, jpeg)
    ds = fastloader.ImageList(paths, list(range(4)), transform=_tf(), on_error="skip")
    _truncate(paths[1])
    out = []
    err = _raised(lambda: out.extend(fastloader.DataLoader(ds, batch_size=2, num_workers=nw)))
    assert err is None, repr(err)
    assert _labels(out) == [0, 2, 3]
    assert [s[0] for s in ds.skipped] == [paths[1]]


@pytest.mark.parametrize("pad", [0, 1], ids=["even", "odd"])
def test_long_non_ascii_path_keeps_the_reason(tmp_path, jpeg, pad):
    """A ~500-byte path of two-byte characters: the error still says why
    (two lengths one byte apart, so one of them would cut a character)."""
    d = tmp_path / ("x" * pad + "é" * 110) / ("é" * 110)
    d.mkdir(parents=True)
    good = str(d / "ok.jpg")
    bad = str(d / "bad.jpg")
    for p in (good, bad):
        with open(p, "wb") as f:
            f.write(jpeg)
    _truncate(bad)
    ds = fastloader.ImageList([good, bad], transform=_tf())
    err = _raised(lambda: list(fastloader.DataLoader(ds, batch_size=2)))
    assert isinstance(err, fastloader.DecodeError), repr(err)
    assert "Premature end of JPEG file" in str(err)
    assert bad in str(err) or getattr(err, "filename", None) == bad, str(err)
    os.unlink(bad)
    err = _raised(lambda: list(fastloader.DataLoader(ds, batch_size=2)))
    _check_raised(err, "deleted", bad, 1)


@pytest.mark.parametrize("nw", [0, 2])
def test_symlinks_to_files_and_folders_load(tmp_path, jpeg, nw):
    real = str(tmp_path / "real")
    paths = _tree(real, jpeg, n=4, classes=1)
    root = tmp_path / "train"
    (root / "a").mkdir(parents=True)
    os.symlink(paths[0], root / "a" / "0.jpg")                    # a file symlink
    os.symlink(os.path.relpath(paths[1], root / "a"), root / "a" / "1.jpg")  # relative
    os.symlink(os.path.dirname(paths[0]), root / "b")             # a class folder symlink
    ds = fastloader.ImageFolder(str(root), transform=_tf())
    assert len(ds) == 2 + 4 and ds.targets == [0, 0, 1, 1, 1, 1]
    images, labels = next(iter(fastloader.DataLoader(ds, batch_size=6, num_workers=nw)))
    assert labels.tolist() == ds.targets
    assert torch.equal(images, images[:1].expand_as(images))


def _symlink_cases():
    out = []
    for fault in ("dangling", "loop"):
        for on_error in ("raise", "skip"):
            for nw in (0, 2):
                out.append(pytest.param(fault, on_error, nw, id=f"{fault}-{on_error}-w{nw}"))
    return out


@pytest.mark.parametrize("fault,on_error,nw", _symlink_cases())
def test_bad_symlinks_native(tmp_path, jpeg, fault, on_error, nw):
    """A dangling symlink is a missing file (FileNotFoundError); a symlink
    loop is OSError(ELOOP); with "skip" both are skipped."""
    paths = _tree(str(tmp_path / "train"), jpeg, n=4)
    ds = fastloader.ImageList(paths, list(range(4)), transform=_tf(), on_error=on_error)
    FAULTS[fault](paths[2])
    dl = fastloader.DataLoader(ds, batch_size=1, num_workers=nw)
    if on_error == "skip":
        assert _labels(list(dl)) == [0, 1, 3]
        assert [s[0] for s in ds.skipped] == [paths[2]]
        return
    _check_raised(_raised(lambda: list(dl)), fault, paths[2], 2)


@pytest.mark.parametrize("reader", ["open", "decode_jpeg"])
def test_bad_symlinks_python(tmp_path, jpeg, reader):
    paths = _tree(str(tmp_path / "train"), jpeg, n=4)
    _dangling(paths[1])
    _loop(paths[2])
    ds = FileDataset(paths, reader)
    err = _raised(lambda: list(fastloader.DataLoader(ds, batch_size=1, num_workers=2)))
    _check_raised(err, "dangling", paths[1], 1)
    err = _raised(lambda: list(fastloader.DataLoader(torch.utils.data.Subset(ds, [0, 2]), batch_size=1,
                                                     num_workers=2)))
    assert isinstance(err, OSError) and err.errno == errno.ELOOP and err.filename == paths[2], repr(err)


# -- subprocesses: signals, fork, fd limit -----------------------------------------


def _env():
    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(fastloader.__file__)))
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONFAULTHANDLER"] = "1"
    return env


# Shared by the scripts below: both dataset kinds over the files in argv.
PRELUDE = textwrap.dedent(
    """
    import gc, json, os, signal, sys, time
    import torch
    import fastloader
    from fastloader import transforms as FT

    class FileDataset(torch.utils.data.Dataset):
        def __init__(self, paths):
            self.paths = paths
        def __len__(self):
            return len(self.paths)
        def __getitem__(self, i):
            with open(self.paths[i], "rb") as f:
                img = fastloader.decode_jpeg(f.read())
            return torch.from_numpy(img).permute(2, 0, 1), i

    def make(kind, paths):
        if kind == "native":
            tf = FT.Compose([FT.Resize((16, 16)), FT.PILToTensor()])
            return fastloader.ImageList(paths, list(range(len(paths))), transform=tf)
        return FileDataset(paths)
    """
)

# One interpreter imports torch and fastloader once, then forks a child per
# scenario before any loader exists (so each child starts as a fresh process
# would, without paying the imports again).  A child runs its loop until
# signalled and leaves like a script does: an uncaught exception reaches the
# top level, so the interpreter prints the traceback, runs atexit (where
# fastloader stops live iterators) and exits -- by SIGINT itself after a
# KeyboardInterrupt.  The parent reports every child's pid and its exit.
SIGNAL_SCRIPT = PRELUDE + textwrap.dedent(
    """
    listfile, outdir, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    paths = open(listfile).read().split("\\n")

    def say(*words):  # one write(2) per line: lines from several processes never mix
        os.write(1, (" ".join(map(str, words)) + "\\n").encode())

    def scenario(i, kind, nw, how):
        if how == "term-exit":  # what training scripts do to stop cleanly on SIGTERM
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
        dl = fastloader.DataLoader(make(kind, paths), batch_size=2, num_workers=nw)
        n = 0
        while True:  # epochs until signalled
            for images, labels in dl:
                n += 1
                if n == 1:
                    say("FIRST", i, os.getpid())

    signal.alarm(90)  # safety net: nothing here outlives a test run that went wrong
    kids = {}
    for i, (kind, nw, how) in enumerate(cases):
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)
            fd = os.open(os.path.join(outdir, f"stderr-{i}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            os.close(fd)
            scenario(i, kind, nw, how)
            os._exit(3)  # not reached: the loop only ends by an exception
        kids[pid] = i
        say("PID", i, pid)
    while kids:
        pid, status = os.wait()
        say("EXIT", kids.pop(pid), os.waitstatus_to_exitcode(status), repr(time.monotonic()))
    """
)

# int: SIGINT -> KeyboardInterrupt traceback, death by SIGINT; term: SIGTERM's
# default action; term-exit: a SIGTERM handler that calls sys.exit(143), as
# training scripts do to stop cleanly (the loop must unwind through the loader)
SIGNAL_CASES = [
    ("native", 2, "int"), ("python", 2, "int"), ("native", 0, "int"),
    ("native", 2, "term"), ("python", 2, "term-exit"),
]
# Exiting after the signal takes ~1 s of CPU (interpreter and torch teardown);
# all the children exit at about the same time on a loaded 2-core machine, so
# allow more than that: a hang shows as the 60 s deadline.
EXIT_S = 15.0


def _write_list(tmp_path, paths):
    lf = tmp_path / "paths.txt"
    lf.write_text("\n".join(paths))
    return str(lf)


@pytest.fixture(scope="module")
def signal_runs(tmp_path_factory, jpeg):
    """Runs every SIGNAL_CASES scenario at once (SIGNAL_SCRIPT): each child
    prints FIRST after its first batch, gets its signal as soon as that line
    arrives, and must then exit by itself.  Returns, per case: rc (exit code,
    negative for a signal), first, hung, exit_s (signal to exit), stderr."""
    tmp = tmp_path_factory.mktemp("signals")
    listfile = _write_list(tmp, _tree(str(tmp / "train"), jpeg, n=32))
    sig = {"int": signal.SIGINT, "term": signal.SIGTERM, "term-exit": signal.SIGTERM}
    # its own process group, so that whatever happens everything it forked can be killed at once
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_SCRIPT, listfile, str(tmp), json.dumps(SIGNAL_CASES)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), start_new_session=True)
    runs = [dict(pid=None, first=False, sent=None, rc=None, exit_s=None) for _ in SIGNAL_CASES]
    deadline = time.monotonic() + 60
    buf = b""
    try:
        while time.monotonic() < deadline and any(r["rc"] is None for r in runs):
            if not select.select([proc.stdout], [], [], 0.1)[0]:
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                word, i, *rest = line.decode().split()
                r = runs[int(i)]
                if word == "PID":
                    r["pid"] = int(rest[0])
                elif word == "FIRST" and r["sent"] is None:
                    r["first"] = True
                    r["sent"] = time.monotonic()
                    os.kill(int(rest[0]), sig[SIGNAL_CASES[int(i)][2]])
                elif word == "EXIT":
                    r["rc"] = int(rest[0])
                    if r["sent"] is not None:  # CLOCK_MONOTONIC is the same clock in every process
                        r["exit_s"] = float(rest[1]) - r["sent"]
    finally:
        for r in runs:
            r["hung"] = r["rc"] is None
        if any(r["hung"] for r in runs):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    out = {}
    for i, case in enumerate(SIGNAL_CASES):
        r = runs[i]
        path = tmp / f"stderr-{i}.txt"
        out[case] = dict(rc=r["rc"], first=r["first"], hung=r["hung"], exit_s=r["exit_s"],
                         stderr=(path.read_text(errors="replace") if path.exists() else "")
                         + err.decode(errors="replace"))
    return out


@pytest.mark.parametrize("kind,nw,how", SIGNAL_CASES, ids=[f"{k}-w{n}-{h}" for k, n, h in SIGNAL_CASES])
def test_signal_while_iterating(signal_runs, kind, nw, how):
    r = signal_runs[(kind, nw, how)]
    assert r["first"], f"no first batch: rc={r['rc']}\n{r['stderr']}"
    assert not r["hung"], f"still running at the 60 s deadline:\n{r['stderr']}"
    assert r["exit_s"] < EXIT_S, f"took {r['exit_s']:.1f}s to exit after the signal"
    assert "Fatal Python error" not in r["stderr"], r["stderr"]
    if how == "int":
        # Python re-raises an uncaught KeyboardInterrupt as death by SIGINT
        assert r["rc"] == -signal.SIGINT, (r["rc"], r["stderr"])
        assert "Traceback" in r["stderr"] and "KeyboardInterrupt" in r["stderr"], r["stderr"]
    elif how == "term":
        assert r["rc"] == -signal.SIGTERM, (r["rc"], r["stderr"])
    else:
        assert r["rc"] == 143, (r["rc"], r["stderr"])
        assert "Traceback" not in r["stderr"], r["stderr"]


XF_SIGINT_IN_DEL = (
    "found by this suite: _Iter.__del__ runs Python code (_shutdown), so a Ctrl-C that arrives while an "
    "iterator is finalized -- at every epoch boundary of a `for epoch: for batch in loader:` loop -- "
    "raises KeyboardInterrupt inside __del__, where Python reports it as 'Exception ignored in: "
    "<function _Iter.__del__>' and drops it: the loop goes on (measured without any hook: 39 of ~2400 "
    "SIGINTs sent every 3 ms were swallowed in 8 s of 1-epoch loops with num_workers=2)")


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=XF_SIGINT_IN_DEL)
def test_sigint_while_an_iterator_is_finalized_is_not_lost(tmp_path, jpeg, native, nw):
    """SIGINT delivered while a finished iterator is being destroyed still
    reaches the loop as KeyboardInterrupt.

    To hit that window deterministically, a profile hook raises SIGINT at the
    first call into fastloader's Python code made while `del it` runs (if the
    destruction runs no Python at all, the signal is raised right after it:
    then there is no window, and the test passes)."""
    paths = _tree(str(tmp_path / "train"), jpeg, n=4)
    ds = _native("ImageList", None, paths) if native else FileDataset(paths, "open")
    it = iter(fastloader.DataLoader(ds, batch_size=2, num_workers=nw))
    assert len(list(it)) == 2
    pkg = os.path.dirname(os.path.abspath(fastloader.__file__))
    fired = []

    def hook(frame, event, arg):
        if event == "call" and not fired and frame.f_code.co_filename.startswith(pkg):
            fired.append(frame.f_code.co_name)
            signal.raise_signal(signal.SIGINT)

    unraisable = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__} in {u.object!r}")
    interrupted = False
    try:
        try:
            sys.setprofile(hook)
            try:
                del it
            finally:
                sys.setprofile(None)
            if not fired:
                signal.raise_signal(signal.SIGINT)
            for _ in range(1000):  # a pending KeyboardInterrupt is raised here at the latest
                pass
        except KeyboardInterrupt:
            interrupted = True
    finally:
        sys.unraisablehook = old_hook
    gc.collect()
    assert interrupted, f"SIGINT raised in {fired} during `del it` was lost: {unraisable}"


# For each dataset kind, in a process of its own (forked from a clean
# interpreter, so that the two kinds run at the same time and neither child
# inherits the other kind's iterator): an iterator with 2 workers gives 3
# batches, then children are forked from that process.  Each child reports
# through its exit status; a hang ends by SIGALRM.
FORK_SCRIPT = PRELUDE + textwrap.dedent(
    """
    listfile = sys.argv[1]
    paths = open(listfile).read().split("\\n")

    def same(a, b):
        return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                        for x, y in zip(a, b))

    def child(fn, deadline_s):
        pid = os.fork()
        if pid == 0:
            signal.alarm(deadline_s)  # default action: killed by SIGALRM (-14)
            try:
                code = fn()
            except BaseException as e:
                print("child raised", repr(e), flush=True)
                code = 1
            os._exit(code)
        return pid

    def run(kind):
        ds = make(kind, paths)
        ref = list(fastloader.DataLoader(ds, batch_size=2, num_workers=0))
        box = {"it": iter(fastloader.DataLoader(ds, batch_size=2, num_workers=2))}
        got = [next(box["it"]) for _ in range(3)]

        def new_loaders():
            # the same dataset object and a fresh one, each with a new loader
            for d in (ds, make(kind, paths)):
                if not same(list(fastloader.DataLoader(d, batch_size=2, num_workers=2)), ref):
                    return 3
            return 0

        def carried():  # 0: RuntimeError naming fork, 4: another RuntimeError, 5: hung, 6: no error
            class Hung(Exception):
                pass
            def on_alarm(signum, frame):
                raise Hung()
            signal.signal(signal.SIGALRM, on_alarm)
            signal.alarm(6)
            try:
                for _ in box["it"]:
                    pass
            except RuntimeError as e:
                print("carried iterator:", repr(e), flush=True)
                return 0 if "fork" in str(e).lower() else 4
            except Hung:
                return 5
            return 6

        def drop_iterator():
            del box["it"]
            gc.collect()
            return 0

        kids = {"new_loader": child(new_loaders, 20), "carried_iterator": child(carried, 20),
                "drop_iterator": child(drop_iterator, 2)}
        pid = os.fork()
        if pid == 0:  # a child that leaves through the interpreter's normal exit (atexit)
            signal.alarm(6)
            sys.exit(0)
        kids["normal_exit"] = pid
        got += list(box["it"])  # the parent's epoch goes on
        res = {"parent_ok": same(got, ref)}
        for check, pid in kids.items():
            res[check] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        # one write(2) of under PIPE_BUF bytes: the two runners share the pipe,
        # and print() may split a line between writes
        os.write(1, ("RESULTS %s %s" % (kind, json.dumps(res)) + chr(10)).encode())

    runners = []
    for kind in ("native", "python"):
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)
            run(kind)  # the normal_exit child leaves run() by SystemExit, to the interpreter's exit
            os._exit(0)
        runners.append(pid)
    for pid in runners:
        os.waitpid(pid, 0)
    """
)


@pytest.fixture(scope="module")
def fork_results(tmp_path_factory, jpeg):
    if os.environ.get("FASTLOADER_UNDER_ASAN") == "1":
        # Seen with gdb in a hung child: its new worker threads wait forever on
        # libasan's primary-allocator mutex for one size class, which a parent
        # worker held (inside malloc, called by libjpeg) at the instant of the
        # fork.  GCC 12's libasan takes no locks around fork, so a fork while
        # threads allocate can leave any of its allocator locks held in the
        # child; glibc's malloc (the release build) does take them.  These
        # scenarios run in the release pass.
        pytest.skip("libasan (GCC 12) does not lock its allocator around fork(): a child forked while "
                    "worker threads allocate can deadlock inside malloc")
    tmp = tmp_path_factory.mktemp("fork")
    listfile = _write_list(tmp, _tree(str(tmp / "train"), jpeg, n=16))
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT, listfile], capture_output=True, text=True,
                          timeout=90, env=_env())
    res = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULTS "):
            _, kind, data = line.split(" ", 2)
            res[kind] = json.loads(data)
    assert proc.returncode == 0 and len(res) == 2, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    res["log"] = proc.stdout + proc.stderr
    return res


@pytest.mark.parametrize("kind", ["native", "python"])
def test_fork_child_uses_a_new_loader_parent_unaffected(fork_results, kind):
    """os.fork after 3 batches of a 2-worker loader: the child runs full
    epochs with new loaders (over the same dataset object and over a fresh
    one) and exits 0; the parent's epoch continues and gives every batch."""
    r = fork_results[kind]
    assert r["parent_ok"], fork_results["log"]
    assert r["new_loader"] == 0, f"child status {r['new_loader']}\n{fork_results['log']}"


@pytest.mark.parametrize("kind", ["native", "python"])
def test_fork_child_using_the_parents_iterator_raises(fork_results, kind):
    """Child status: 0 = RuntimeError mentioning fork, 4 = another
    RuntimeError, 5 = hung for 2 s, 6 = no error at all."""
    assert fork_results[kind]["carried_iterator"] == 0, fork_results["log"]


@pytest.mark.parametrize("check", ["drop_iterator", "normal_exit"])
@pytest.mark.parametrize("kind", ["native", "python"])
def test_fork_child_with_inherited_iterator_exits(fork_results, kind, check):
    """A child that drops the inherited iterator, or exits through atexit
    with it alive, exits 0 at once (-14: killed by its 6 s SIGALRM: a bare `import torch` child alone takes 1.1 s to exit on a loaded 2-core machine)."""
    assert fork_results[kind][check] == 0, fork_results["log"]


ULIMIT_SCRIPT = PRELUDE + textwrap.dedent(
    """
    import resource
    root, n = sys.argv[1], int(sys.argv[2])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    def fds():
        return len(os.listdir("/proc/self/fd"))
    tf = FT.Compose([FT.Resize((16, 16)), FT.PILToTensor()])
    folder = fastloader.ImageFolder(root, transform=tf)
    paths = [s[0] for s in folder.samples]
    out = {"limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "fds_start": fds()}
    for name, ds in (("native", folder), ("python", make("python", paths))):
        for nw in (2,):
            seen, peak = 0, 0
            for images, labels in fastloader.DataLoader(ds, batch_size=64, num_workers=nw, shuffle=True):
                seen += len(labels)
                peak = max(peak, fds())
            out[f"{name}-w{nw}"] = {"samples": seen, "peak_fds": peak}
    out["fds_end"] = fds()
    print("RESULTS", json.dumps(out), flush=True)
    """
)


def test_epoch_of_1200_files_under_ulimit_256(tmp_path, jpeg):
    n = 1200
    root = str(tmp_path / "train")
    _tree(root, jpeg, n=n, classes=4)
    proc = subprocess.run([sys.executable, "-c", ULIMIT_SCRIPT, root, str(n)], capture_output=True, text=True,
                          timeout=120, env=_env())
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    r = json.loads(lines[-1][len("RESULTS "):])
    assert r["limit"] == 256
    for key in ("native-w2", "python-w2"):
        assert r[key]["samples"] == n, r
        assert r[key]["peak_fds"] < 256, r
    assert r["fds_end"] <= r["fds_start"] + 2, r
