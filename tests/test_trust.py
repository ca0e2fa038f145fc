"""Issue 9: error types, limits before allocation, misuse, bounded records,
one replace rule and per-call randomness outside the loader.

Each test here failed before its fix (the issue's item number is in the
test's docstring)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch

import fastloader
from fastloader import transforms as T

import helpers_datasets as H
import imgutil

pytestmark = pytest.mark.fastloader_only

VAL = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()])
TRAIN = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()])


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("good")
    paths = []
    for i, name in enumerate(["astronaut", "chelsea", "coffee", "rocket"] * 2):
        p = d / f"{i}.jpg"
        p.write_bytes(imgutil.make_jpeg(name, (64 + 8 * i, 48 + 4 * i)))
        paths.append(str(p))
    return paths


def _one_bad(good, bad_path, *, on_error="raise", transform=VAL):
    paths = list(good[:4]) + [str(bad_path)] + list(good[4:])
    return fastloader.ImageList(paths, list(range(len(paths))), transform=transform, on_error=on_error), 4


def _run(ds, num_workers, **kw):
    dl = fastloader.DataLoader(ds, batch_size=2, num_workers=num_workers, timeout=30 if num_workers else 0, **kw)
    return [b for b in dl]


# -- item 8: the right exception type, with errno, filename and the sample ---------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_missing_file_raises_file_not_found(good, tmp_path, num_workers):
    """Item 8: a missing file is FileNotFoundError (errno, filename), not DecodeError."""
    missing = tmp_path / "gone.jpg"
    ds, idx = _one_bad(good, missing)
    with pytest.raises(FileNotFoundError) as info:
        _run(ds, num_workers)
    e = info.value
    assert e.errno == errno.ENOENT
    assert e.filename == str(missing)
    assert f"sample index {idx}" in str(e) and "batch 2" in str(e)


def test_dangling_symlink_raises_file_not_found(good, tmp_path):
    link = tmp_path / "dangling.jpg"
    os.symlink(tmp_path / "nowhere.jpg", link)
    ds, _ = _one_bad(good, link)
    with pytest.raises(FileNotFoundError) as info:
        _run(ds, 2)
    assert info.value.filename == str(link)


def test_directory_raises_is_a_directory(good, tmp_path):
    d = tmp_path / "dir.jpg"
    d.mkdir()
    ds, _ = _one_bad(good, d)
    with pytest.raises(IsADirectoryError) as info:
        _run(ds, 0)
    assert info.value.errno == errno.EISDIR and info.value.filename == str(d)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_raises_permission_error(good, tmp_path):
    p = tmp_path / "secret.jpg"
    p.write_bytes(open(good[0], "rb").read())
    p.chmod(0)
    ds, _ = _one_bad(good, p)
    with pytest.raises(PermissionError):
        _run(ds, 2)


def test_out_of_range_index_raises_index_error(good):
    """Item 8: a sampler index outside the dataset is IndexError, and never skipped."""
    ds = fastloader.ImageList(good, transform=VAL, on_error="skip")
    dl = fastloader.DataLoader(ds, batch_size=None, sampler=[0, 1, len(good) + 5], num_workers=0)
    with pytest.raises(IndexError, match="out of range"):
        list(dl)
    with pytest.raises(IndexError):
        ds[len(good)]


def test_decode_error_keeps_its_type_and_note(good, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    ds, idx = _one_bad(good, bad)
    with pytest.raises(fastloader.DecodeError, match=rf"bad\.jpg.*sample index {idx}"):
        _run(ds, 2)


def test_translator_covers_every_code():
    """One translator: each core error code becomes its documented type."""
    C = fastloader._C
    cases = {C.ERR_DECODE: fastloader.DecodeError, C.ERR_LIMIT: fastloader.DecodeError,
             C.ERR_NOMEM: MemoryError, C.ERR_INDEX: IndexError, C.ERR_INVALID: ValueError,
             C.ERR_RUNTIME: RuntimeError, C.ERR_IO: OSError, C.ERR_EXPORT: BufferError}
    for code, typ in cases.items():
        e = C._error(code, 0, "why", None, " [here]")
        assert type(e) is typ and str(e) == "why [here]", (code, e)
    e = C._error(C.ERR_IO, errno.ENOENT, "ignored", "/x.jpg", " [sample index 1]")
    assert type(e) is FileNotFoundError and e.errno == errno.ENOENT and e.filename == "/x.jpg"
    assert type(C._error(C.ERR_IO, errno.EACCES, "", "/x")) is PermissionError
    assert type(C._error(99, 0, "?")) is SystemError


def test_decode_jpeg_missing_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        fastloader.decode_jpeg(str(tmp_path / "nope.jpg"))
    with pytest.raises(IsADirectoryError):
        fastloader.decode_jpeg(str(tmp_path))


# -- item 5: a FIFO is refused by its type, without blocking ---------------------------------------

@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_fifo_is_refused_without_blocking(good, tmp_path, on_error):
    """Item 5: open() on a FIFO used to block the worker forever."""
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    ds, idx = _one_bad(good, fifo, on_error=on_error)
    if on_error == "raise":
        with pytest.raises(OSError, match="a FIFO, not a regular file"):
            _run(ds, 2)
    else:
        batches = _run(ds, 2)
        assert sum(len(b[1]) for b in batches) == len(good)
        assert [p for p, _ in ds.skipped] == [str(fifo)]


def test_decode_jpeg_refuses_a_fifo_without_blocking(tmp_path):
    """decode_jpeg reads paths through the same source layer as the workers."""
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="pipe.jpg: a FIFO, not a regular file"):
        fastloader.decode_jpeg(str(fifo))


# -- item 2: limits before any image-sized allocation; one sample's OOM is that sample's -------------

_RLIMIT_SCRIPT = textwrap.dedent(r"""
    import resource, sys
    import fastloader
    from fastloader import transforms as T
    paths, max_pixels = sys.argv[1:-1], int(sys.argv[-1])
    # address space: what is mapped now + 1.5 GiB; the claimed image needs ~12 GiB
    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 29), vm + (3 << 29)))
    ds = fastloader.ImageList(paths, transform=T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()]),
                              on_error="skip", max_pixels=max_pixels)
    n = sum(len(b[1]) for b in fastloader.DataLoader(ds, batch_size=2, num_workers=1, timeout=60))
    print(n, len(ds.skipped), ds.skipped[0][1] if ds.skipped else "")
""")


@pytest.mark.skipif(os.environ.get("FASTLOADER_UNDER_ASAN") == "1", reason="ASan reserves address space")
@pytest.mark.parametrize("max_pixels,reason", [(0, "out of memory"), (-1, "above the limit")])
def test_huge_header_under_an_address_space_limit(good, tmp_path, max_pixels, reason):
    """Item 2: a 600-byte file claiming 65500x65500.  With the pixel limit it
    is refused right after the header; with no limit, the failed allocation
    is that sample's error (skipped), not a fatal batch error."""
    small = imgutil.make_jpeg("astronaut", (16, 16), quality=30)
    bomb = tmp_path / "bomb.jpg"
    bomb.write_bytes(imgutil.with_dimensions(small, 65500, 65500))
    assert bomb.stat().st_size < 1000
    mp = 0 if max_pixels == -1 else 1 << 62
    r = subprocess.run([sys.executable, "-c", _RLIMIT_SCRIPT, *good[:3], str(bomb), mp.__str__()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    n, nskipped, why = r.stdout.split(" ", 2)
    assert (int(n), int(nskipped)) == (3, 1), r.stdout
    assert reason in why, why


# -- item 3: prefetch_factor=0 --------------------------------------------------------------------

@pytest.mark.parametrize("dataset", ["python", "native"])
def test_prefetch_factor_zero_is_refused(good, dataset):
    ds = H.RangeDataset(8) if dataset == "python" else fastloader.ImageList(good, transform=VAL)
    with pytest.raises(ValueError, match="prefetch_factor"):
        fastloader.DataLoader(ds, batch_size=1, num_workers=2, prefetch_factor=0)


# -- item 4: stats() from another thread -------------------------------------------------------------

@pytest.mark.parametrize("persistent", [False, True])
def test_stats_from_another_thread_never_raises(persistent):
    ds = H.RangeDataset(64)
    dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent)
    errors, stop = [], threading.Event()

    def poll():
        # a call every 0.2 ms, thousands an epoch; a loop without the pause keeps
        # this thread running, and every worker fork under ASan waits up to 2 s
        # for the process's threads to be still (scripts/test-asan.sh)
        while not stop.wait(0.0002):
            try:
                dl.stats()
            except Exception as e:  # noqa: BLE001 - any exception is the failure
                errors.append(e)
                return

    t = threading.Thread(target=poll)
    t.start()
    try:
        for _ in range(15):
            for _ in dl:
                pass
    finally:
        stop.set()
        t.join()
    assert not errors, errors


# -- item 6: misuse gets a clear RuntimeError ---------------------------------------------------------

def test_iterator_shared_by_two_threads_is_refused():
    H.RELEASE.clear()

    class Blocking(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            H.RELEASE.wait(10)
            return i

    ds = Blocking()
    it = iter(fastloader.DataLoader(ds, batch_size=2, num_workers=1))
    got = []
    t = threading.Thread(target=lambda: got.append(next(it)))
    t.start()
    try:
        assert H.wait_until(lambda: it._next_lock.locked(), timeout=5)
        with pytest.raises(RuntimeError, match="another thread"):
            next(it)
    finally:
        H.RELEASE.set()
        t.join(10)
    assert len(got) == 1
    del it


_FORK_SCRIPT = textwrap.dedent(r"""
    import os, sys, fastloader, torch
    class DS(torch.utils.data.Dataset):
        def __len__(self): return 16
        def __getitem__(self, i): return i
    dl = fastloader.DataLoader(DS(), batch_size=2, num_workers=2, persistent_workers=PERSISTENT)
    it = iter(dl)
    first = [next(it).tolist() for _ in range(2)]
    pid = os.fork()
    if pid == 0:
        try:
            next(it)
            print("child: no error", flush=True); os._exit(3)
        except RuntimeError as e:
            assert "forked" in str(e), e
        # the child can still load with a new iterator of the same loader
        out = [b.tolist() for b in dl]
        assert sum(out, []) == list(range(16)), out
        sys.exit(0)   # normal interpreter exit: must not hang on the parent's workers
    rest = [b.tolist() for b in it]
    _, status = os.waitpid(pid, 0)
    assert sum(first + rest, []) == list(range(16))
    print("exit", os.waitstatus_to_exitcode(status))
""")


@pytest.mark.parametrize("persistent", [False, True])
def test_iterator_used_in_forked_child_raises_and_child_exits(persistent):
    """Item 6: an iterator carried into a forked child used to hang."""
    code = _FORK_SCRIPT.replace("PERSISTENT", str(persistent))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("exit 0"), r.stdout + r.stderr[-2000:]


# -- item 10: skipped / replaced bounded --------------------------------------------------------------

def test_skipped_and_replaced_lists_stay_bounded(good, tmp_path):
    bad = tmp_path / "trunc.jpg"
    bad.write_bytes(open(good[0], "rb").read()[:300])
    for on_error, attr in [("skip", "skipped"), ("replace", "replaced")]:
        ds, _ = _one_bad(good, bad, on_error=on_error)
        dl = fastloader.DataLoader(ds, batch_size=3, num_workers=2, shuffle=True, seed=1)
        for _ in range(6):
            for _ in dl:
                pass
        assert len(getattr(ds, attr)) == 1, getattr(ds, attr)
        assert getattr(ds, attr)[0][0] == str(bad)


# -- item 12: one replace rule --------------------------------------------------------------------------

def test_replace_uses_one_rule_for_jpeg_and_pillow_files(good, tmp_path):
    """Item 12: a bad non-JPEG file (Pillow fix-up) is replaced by the same
    substitute a bad JPEG at the same index gets."""
    bad_jpeg = tmp_path / "bad.jpg"
    bad_jpeg.write_bytes(b"\xff\xd8\xff\xe0\x00\x10garbage")
    bad_png = tmp_path / "bad.png"   # the native PNG decoder's error
    bad_png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    bad_bmp = tmp_path / "bad.bmp"   # a format left to Pillow, which fails on it
    bad_bmp.write_bytes(b"BM" + b"\x00" * 40)
    chosen = []
    for bad in (bad_jpeg, bad_png, bad_bmp):
        ds, idx = _one_bad(good, bad, on_error="replace")
        with pytest.warns(UserWarning) if bad is bad_bmp else _nullcontext():
            out = _run(ds, 0, seed=5)
        assert sum(len(b[1]) for b in out) == len(ds)
        assert len(ds.replaced) == 1
        chosen.append(ds.replaced[0][1])
        cands = ds._native.replacement_candidates(idx, 0, 5)
        assert ds.replaced[0][1] == ds.samples[cands[0]][0]
    assert chosen[0] == chosen[1] == chosen[2]


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# -- item 11: __getitem__ outside fastloader's loader is random per call --------------------------------

def test_getitem_outside_the_loader_is_random_per_call(good):
    ds = fastloader.ImageList(good, transform=TRAIN)
    draws = [ds[0][0] for _ in range(6)]
    assert any(not torch.equal(draws[0], d) for d in draws[1:])
    torch.manual_seed(123)
    a = ds[1][0]
    torch.manual_seed(123)
    assert torch.equal(a, ds[1][0])


def test_getitem_under_torch_dataloader_differs_between_epochs(good):
    ds = fastloader.ImageList(good, transform=TRAIN)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=0)
    e0 = torch.cat([b[0] for b in dl])
    e1 = torch.cat([b[0] for b in dl])
    assert not torch.equal(e0, e1)


def test_getitem_inside_fastloader_matches_the_native_path(good):
    """With a custom collate_fn fastloader calls __getitem__ per sample; it
    then uses the loader's (seed, epoch), so pixels equal the native path."""
    ds = fastloader.ImageList(good, transform=TRAIN)
    native = [b[0] for b in fastloader.DataLoader(ds, batch_size=4, num_workers=2, seed=9)]
    collate = lambda s: torch.utils.data.default_collate(s)  # noqa: E731 - not the default: Python path
    for nw in (0, 2):
        py = [b[0] for b in fastloader.DataLoader(ds, batch_size=4, num_workers=nw, seed=9, collate_fn=collate)]
        for a, b in zip(native, py):
            assert torch.equal(a, b)
    # and outside, the context is gone again
    assert fastloader.loader.epoch_context() is None
