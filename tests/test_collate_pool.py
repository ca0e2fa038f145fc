"""Python datasets collate straight into pooled batch buffers (_C.BatchPool,
csrc/binding/py_buffer.c): same batches as torch's default_collate, buffers reused
once the consumer drops a batch and never while it lives, batches that
outlive their loader, and with pin_memory page-locked buffers that
pin_batch does not copy again.

The pinning test runs in a child process against the stand-in CUDA runtime
(tests/fakecuda/fake_cudart.c, loaded through FASTLOADER_CUDART; a process
loads its CUDA runtime once), with torch's CUDA half stubbed as
tests/fakecuda/scenarios.py does: the fake's cudaHostAlloc counter says
which buffers were page-locked, and a stub of Tensor.pin_memory records
every tensor the worker still copies.
"""
import collections
import functools
import gc
import json
import os
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import helpers_datasets as H  # noqa: E402
from helpers_fakecuda import build_fake_cudart, run_on_fake_cudart  # noqa: E402

import fastloader  # noqa: E402
from fastloader import _C  # noqa: E402
from fastloader.collate import collate_into, fast_default_collate  # noqa: E402

# the pool is the one worker threads stack into (worker processes stack into
# their shared-memory slot, tests/test_process_workers.py)
_DL = functools.partial(fastloader.DataLoader, worker_mode="thread")

pytestmark = pytest.mark.fastloader_only
HERE = os.path.dirname(os.path.abspath(__file__))

Pair = collections.namedtuple("Pair", "a b")


class Nested(torch.utils.data.Dataset):
    """Arrays and tensors of several dtypes in dicts, tuples and a namedtuple."""

    def __init__(self, n=22, seed=0):
        self.n = n
        self.seed = seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(self.seed * 1000 + i)
        img = rng.integers(0, 256, size=(3, 8, 8), dtype=np.uint8)
        return {
            "img": img,
            "img_t": torch.from_numpy(img[:, ::2, 1::3]),       # a strided view
            "feat": (rng.standard_normal((5,)).astype(np.float32), torch.full((2, 2), i, dtype=torch.int64)),
            "pair": Pair(np.asfortranarray(rng.standard_normal((3, 4))), torch.tensor([i % 2 == 0])),
            "half": torch.arange(4, dtype=torch.float16) + i,
            "label": i,
        }


def _loader(ds, **kw):
    return _DL(ds, batch_size=4, **kw)


@pytest.fixture(autouse=True)
def _small_columns_pooled(monkeypatch):
    """These tests follow the pool's buffers with a few bytes a column: a
    tensor column under collate.SMALL_COLUMN otherwise goes to a plain
    torch.stack (test_small_tensor_columns_skip_an_unpinned_pool)."""
    monkeypatch.setattr(fastloader.collate, "SMALL_COLUMN", 0)


# ---- the batches ------------------------------------------------------------------

@pytest.mark.parametrize("kind", H.SAMPLE_KINDS)
def test_pooled_collate_equals_default_collate(kind):
    pool = _C.BatchPool()
    for n in (4, 4, 2):  # a reused size, then a smaller last batch
        samples = [H.make_sample(kind, i) for i in range(n)]
        got, _ = collate_into(pool, fast_default_collate, samples)
        H.assert_same(got, torch.utils.data.default_collate(samples))


def test_array_kinds_are_stacked_into_the_pool():
    for kind in ("t_f32", "t_u8", "t_bf16", "np_f64", "np_strided", "np_transposed", "nested"):
        pool = _C.BatchPool()
        collate_into(pool, fast_default_collate, [H.make_sample(kind, i) for i in range(3)])
        assert pool.stats()["pooled"] >= 1, kind


def test_small_tensor_columns_skip_an_unpinned_pool(monkeypatch):
    """A tensor column under SMALL_COLUMN bytes is stacked by torch.stack
    (checking each item for the pool costs more than the pool saves there);
    at or over it, into the pool; NumPy columns always go to the pool. The
    batch equals torch's either way. (A page-locked pool takes small
    columns too, or pin_batch would copy them again:
    test_pin_memory_stacks_into_page_locked_buffers_once runs in a child
    process, with the real SMALL_COLUMN and tensors of a few bytes.)"""
    monkeypatch.setattr(fastloader.collate, "SMALL_COLUMN", 4096)
    samples = [(torch.full((255,), i, dtype=torch.float32), torch.full((256,), i, dtype=torch.float32),
                np.full((4,), i, np.float32)) for i in range(4)]  # 4080, 4096 and 64 bytes a batch
    pool = _C.BatchPool()
    got, _ = collate_into(pool, fast_default_collate, samples)
    H.assert_same(got, torch.utils.data.default_collate(samples))
    assert sorted(c["nbytes"] for c in pool.stats()["classes"]) == [64, 4096]


# Nested's batch of 4 stacks seven arrays, of seven sizes (the label is a
# Python int: torch.tensor, not a stack)
FULL_SIZES = {4 * 3 * 8 * 8, 4 * 3 * 4 * 3, 4 * 5 * 4, 4 * 4 * 8, 4 * 12 * 8, 4 * 1, 4 * 4 * 2}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_batches_equal_torch(num_workers):
    dl = _loader(Nested(24), num_workers=num_workers)
    out = list(dl)
    H.assert_same_batches(out, list(torch.utils.data.DataLoader(Nested(24), batch_size=4)))
    st = dl._fl_pool.stats()
    assert st["pooled"] == 6 * 7 and st["fresh"] == 0, st
    assert {c["nbytes"] for c in st["classes"]} == FULL_SIZES


# ---- reuse and lifetimes -------------------------------------------------------------

def test_buffer_reused_once_dropped():
    pool = _C.BatchPool()
    samples = [np.full((16, 16), i, np.float32) for i in range(8)]
    first = torch.from_dlpack(_C.stack(samples, pool=pool))
    ptr = first.data_ptr()
    second = torch.from_dlpack(_C.stack(samples, pool=pool))
    assert second.data_ptr() != ptr  # the first is alive: not reused
    del first
    third = torch.from_dlpack(_C.stack([s + 1 for s in samples], pool=pool))
    assert third.data_ptr() == ptr
    assert torch.equal(third, torch.from_numpy(np.stack(samples) + 1))
    assert torch.equal(second, torch.from_numpy(np.stack(samples)))
    assert pool.stats()["classes"] == [{"nbytes": 8 * 16 * 16 * 4, "buffers": 2, "buffers_out": 2}]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_reuses_buffers_of_dropped_batches(num_workers):
    dl = _DL(Nested(200), batch_size=4, num_workers=num_workers, drop_last=True)
    ptrs = []
    for b in dl:
        ptrs.append(b["img"].data_ptr())
    del b
    # 50 batches: at most the prefetch window plus the two the loop holds
    # (the current batch and, while next() runs, the previous) are alive
    assert len(set(ptrs)) <= (2 * num_workers if num_workers else 0) + 3, len(set(ptrs))
    img_class = next(c for c in dl._fl_pool.stats()["classes"] if c["nbytes"] == 4 * 3 * 8 * 8)
    assert img_class["buffers"] == len(set(ptrs)) and img_class["buffers_out"] == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_kept_batches_are_distinct_and_intact(num_workers):
    dl = _DL(Nested(40), batch_size=4, num_workers=num_workers, persistent_workers=num_workers > 0)
    ref = list(torch.utils.data.DataLoader(Nested(40), batch_size=4))
    kept = list(dl)
    kept += list(dl)  # a second epoch: no buffer of the first may be reused
    assert len({b["img"].data_ptr() for b in kept}) == 20
    H.assert_same_batches(kept, ref + ref)
    img_class = next(c for c in dl._fl_pool.stats()["classes"] if c["nbytes"] == 4 * 3 * 8 * 8)
    assert img_class["buffers_out"] == 20
    del kept
    gc.collect()
    img_class = next(c for c in dl._fl_pool.stats()["classes"] if c["nbytes"] == 4 * 3 * 8 * 8)
    assert img_class == {"nbytes": 4 * 3 * 8 * 8, "buffers": 8, "buffers_out": 0}  # 8 idle kept, 12 freed


@pytest.mark.parametrize("num_workers", [0, 2])
def test_last_smaller_batch(num_workers):
    dl = _DL(Nested(22), batch_size=4, num_workers=num_workers, persistent_workers=num_workers > 0)
    for _ in range(2):
        out = list(dl)
        assert [len(b["label"]) for b in out] == [4] * 5 + [2]
        H.assert_same_batches(out, list(torch.utils.data.DataLoader(Nested(22), batch_size=4)))
    st = dl._fl_pool.stats()
    # The batch of 2 has seven more sizes but one (its images, 384 bytes)
    # equals a full batch's (pair.a) and the table holds eight: one new
    # class (its first new size, img_t), five stacks allocated outside.
    assert [c["nbytes"] for c in st["classes"]][7:] == [2 * 3 * 4 * 3]
    assert {c["nbytes"] for c in st["classes"][:7]} == FULL_SIZES
    assert st["pooled"] == 2 * (5 * 7 + 2) and st["fresh"] == 2 * 5, st


def test_batches_outlive_the_loader():
    dl = _loader(Nested(12), num_workers=2)
    it = iter(dl)
    first = next(it)
    rest = list(it)
    del it, dl
    gc.collect()
    ref = list(torch.utils.data.DataLoader(Nested(12), batch_size=4))
    H.assert_same_batches([first] + rest, ref)
    first["img"].fill_(7)  # still writable memory of its own
    H.assert_same_batches(rest, ref[1:])
    pool = _C.BatchPool()
    t = torch.from_dlpack(_C.stack([np.ones(3, np.int32)] * 2, pool=pool))
    del pool  # the buffer keeps its size class alive (ASan checks the free)
    gc.collect()
    assert t.tolist() == [[1, 1, 1], [1, 1, 1]]
    del t


def test_size_classes_and_idle_buffers_are_bounded():
    pool = _C.BatchPool(max_sizes=2, max_idle=2)
    arrays = {n: [np.arange(n, dtype=np.uint8)] * 4 for n in (10, 20, 30)}
    held = [torch.from_dlpack(_C.stack(arrays[n], pool=pool)) for n in (10, 20, 30)]
    st = pool.stats()
    assert [c["nbytes"] for c in st["classes"]] == [40, 80] and st["pooled"] == 2 and st["fresh"] == 1
    assert torch.equal(held[2], torch.arange(30, dtype=torch.uint8).expand(4, 30))  # the fresh one is right too
    del held
    held = [torch.from_dlpack(_C.stack(arrays[10], pool=pool)) for _ in range(5)]
    assert pool.stats()["classes"][0]["buffers"] == 5
    del held
    assert pool.stats()["classes"][0] == {"nbytes": 40, "buffers": 2, "buffers_out": 0}
    assert pool.bytes == 2 * 40 + 80 and pool.bytes_out == 0 and pool.pin_device == -1 and pool.pin_error is None
    with pytest.raises(ValueError):
        _C.BatchPool(max_sizes=-1)
    with pytest.raises(TypeError, match="BatchPool"):
        _C.stack(arrays[10], pool=object())


def test_collate_target_is_per_call_and_per_thread():
    pool = _C.BatchPool()
    samples = [np.zeros(4, np.float32)] * 2

    def failing(batch):
        fast_default_collate(batch)
        raise ValueError("boom")

    with pytest.raises(ValueError):
        collate_into(pool, failing, samples)
    assert pool.stats()["pooled"] == 1
    fast_default_collate(samples)  # outside collate_into: a fresh buffer, as before
    assert pool.stats()["pooled"] == 1

    def other_thread(batch):
        t = threading.Thread(target=fast_default_collate, args=(batch,))
        t.start()
        t.join()
        return fast_default_collate(batch)

    collate_into(pool, other_thread, samples)
    assert pool.stats()["pooled"] == 2  # this thread's stack only


def test_stats_report_the_pool():
    dl = _loader(Nested(8), num_workers=2)
    batches = list(dl)
    assert dl.stats()["pool_bytes"] == dl._fl_pool.bytes > 0
    del batches


# ---- pinning, against the stand-in CUDA runtime -----------------------------------------

def _fake_child():
    """Runs in the child process (FASTLOADER_CUDART = the fake runtime).
    Prints one line: FAKECUDA-COLLATE {json of checks}."""
    import ctypes

    lib = ctypes.CDLL(os.environ["FASTLOADER_CUDART"])
    lib.fakecuda_counter.restype = ctypes.c_long
    HOST_ALLOCS = 4  # counter index (tests/fakecuda/scenarios.py)
    host_allocs = lambda: lib.fakecuda_counter(HOST_ALLOCS)  # noqa: E731

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    copied = []  # what pin_batch still copies (torch's pin_memory, stubbed as a copy)
    torch.Tensor.pin_memory = lambda self, *a, **k: copied.append((tuple(self.shape), self.dtype)) or self.clone()
    torch.Tensor.is_pinned = lambda self, *a, **k: False
    out = {}

    # the pool itself: page-locked buffers, reused without a new cudaHostAlloc
    pool = _C.BatchPool(pin_device=0, max_sizes=1)
    a0 = host_allocs()
    buf = _C.stack([np.ones((2, 3), np.float32)] * 4, pool=pool)
    out["direct_pinned"] = buf.pinned
    ptr = buf.ptr
    del buf
    buf = _C.stack([np.zeros((2, 3), np.float32)] * 4, pool=pool)
    out["direct_reused"] = buf.ptr == ptr
    out["direct_host_allocs"] = host_allocs() - a0
    out["beyond_max_sizes_pinned"] = _C.stack([np.ones(5, np.float32)] * 4, pool=pool).pinned
    out["pin_error"] = pool.pin_error
    del buf, pool

    # a batch stacked partly into the pool, partly outside (max_sizes=1):
    # pin_batch copies only what is not in a page-locked pool buffer
    from fastloader.cuda_delivery import pin_batch
    copied.clear()
    pool = _C.BatchPool(pin_device=0, max_sizes=1)
    batch, target = collate_into(pool, fast_default_collate, [{"a": np.ones((2, 3)), "b": np.ones(5)}] * 4)
    pinned = pin_batch(batch, target.pinned_ptrs())
    out["partial_copied"] = [list(s) for s, _ in copied]
    out["partial_kept"] = pinned["a"] is batch["a"]
    del batch, target, pinned, pool

    for nw in (0, 2):
        copied.clear()
        a0 = host_allocs()
        dl = _DL(Nested(24), batch_size=4, num_workers=nw, pin_memory=True)
        got = list(dl)
        st = dl._fl_pool.stats()
        H.assert_same_batches(got, list(torch.utils.data.DataLoader(Nested(24), batch_size=4)))
        out[f"nw{nw}_pin_device"] = dl._fl_pool.pin_device
        # one cudaHostAlloc per pool buffer, none for anything else
        out[f"nw{nw}_host_allocs_match"] = host_allocs() - a0 == sum(c["buffers"] for c in st["classes"]) > 0
        # pin_batch copied only what was not stacked: the labels (Python ints)
        out[f"nw{nw}_copied"] = sorted({f"{s}:{d}" for s, d in copied})
        out[f"nw{nw}_copies"] = len(copied)
        del got, dl

    # a user's collate_fn: its own tensors are still pinned by pin_batch
    copied.clear()
    dl = _DL(Nested(8), batch_size=4, pin_memory=True,
                               collate_fn=lambda b: torch.stack([torch.from_numpy(s["img"]) for s in b]))
    got = list(dl)
    out["user_collate_copies"] = len(copied)
    out["user_collate_ok"] = torch.equal(got[1][0], torch.from_numpy(Nested(8)[4]["img"]))
    print("FAKECUDA-COLLATE " + json.dumps(out), flush=True)


@pytest.fixture(scope="module")
def fake_results(tmp_path_factory):
    lib = build_fake_cudart(tmp_path_factory)
    return run_on_fake_cudart(lib, ["-c", "import test_collate_pool as t; t._fake_child()"], devices=1,
                              marker="FAKECUDA-COLLATE", timeout=120, extra_path=[HERE],
                              cwd=os.path.dirname(HERE))


def test_pinned_pool_buffers(fake_results):
    r = fake_results
    assert r["direct_pinned"] is True and r["direct_reused"] is True and r["direct_host_allocs"] == 1, r
    assert r["beyond_max_sizes_pinned"] is False and r["pin_error"] is None, r
    assert r["partial_copied"] == [[4, 5]] and r["partial_kept"] is True, r


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_stacks_into_page_locked_buffers_once(fake_results, num_workers):
    r = fake_results
    assert r[f"nw{num_workers}_pin_device"] == 0
    assert r[f"nw{num_workers}_host_allocs_match"] is True
    # six batches: only the int64 labels were copied again
    assert r[f"nw{num_workers}_copied"] == ["(4,):torch.int64"], r
    assert r[f"nw{num_workers}_copies"] == 6, r


def test_pin_memory_still_pins_a_user_collate_fns_tensors(fake_results):
    assert fake_results["user_collate_copies"] == 2 and fake_results["user_collate_ok"] is True, fake_results


# ---- glibc's mmap threshold (csrc/core/pool.c settle_mmap_threshold) ------------------------

_THRESHOLD_CHILD = r"""
import ctypes, json
import numpy as np
from fastloader import _C

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


libc.mallinfo2.restype = MallInfo2


def mmapped(nbytes):
    # is a new block of nbytes served by an mmap of its own (glibc's hblks)?
    # The block is kept: freeing it would itself raise the threshold.
    before = libc.mallinfo2().hblks
    libc.malloc(nbytes)
    return libc.mallinfo2().hblks > before

out = {"before": mmapped(4 << 20)}
pool = _C.BatchPool()
batch = _C.stack([np.zeros((1 << 20,), np.uint8)] * 8, pool=pool)  # an 8 MiB pooled buffer, kept
out["after"] = mmapped(4 << 20)
out["above"] = mmapped(16 << 20)
print(json.dumps(out))
"""


@pytest.mark.skipif(os.environ.get("FASTLOADER_UNDER_ASAN") == "1", reason="ASan's allocator replaces glibc's")
def test_a_pooled_buffer_raises_glibcs_mmap_threshold_as_a_freed_batch_would():
    """After its imports a fresh process mmaps a 4 MiB malloc (glibc's
    threshold is then about 1 MiB).  Without the pool, the first freed 8 MiB
    batch would raise the threshold to 8 MiB, so that a NumPy __getitem__'s
    large temporaries come from the heap; a pooled batch is never freed, so
    the pool does it when it allocates the buffer.  Blocks above the batch
    size stay mmapped, as they would."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _THRESHOLD_CHILD], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"before": True, "after": False, "above": True}


def test_loaders_pool_their_collation_without_pinning():
    ds = [np.full(4, i, np.float32) for i in range(64)]
    dl = _DL(ds, batch_size=16, num_workers=2)
    batches = list(dl)
    assert dl._fl_pool.stats()["classes"] == [{"nbytes": 16 * 4 * 4, "buffers": 4, "buffers_out": 4}]
    assert len({b.data_ptr() for b in batches}) == 4  # alive: each in its own buffer
    assert torch.equal(torch.cat(batches), torch.arange(64, dtype=torch.float32).repeat_interleave(4).view(64, 4))
    del batches
    assert dl._fl_pool.stats()["classes"][0]["buffers_out"] == 0
