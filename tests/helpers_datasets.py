"""Datasets and helpers shared by the torch-compatibility / lifecycle tests.

Everything here is defined at module level so that it can be pickled or
inherited by torch's worker *processes* when the suite runs against torch
(FL_TEST_AGAINST_TORCH=1).  fastloader's workers are threads, so for it the
same objects are simply shared.
"""

from __future__ import annotations

import collections
import gc
import math
import multiprocessing
import os
import threading
import time

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

AGAINST_TORCH = os.environ.get("FL_TEST_AGAINST_TORCH") == "1"

# Set (by the autouse fixture in conftest.py) at the end of every test, so that
# "slow" datasets stop sleeping and worker threads that are stuck in user code
# can finish.  A fork-context Event also reaches torch's forked worker
# processes (it is created before any fork happens).
RELEASE = multiprocessing.get_context("fork").Event()


def slow_wait(seconds: float) -> None:
    """Sleep for ``seconds`` unless RELEASE is set (then return at once)."""
    RELEASE.wait(seconds)


# --------------------------------------------------------------------------
# Workers: counting live fastloader worker threads and worker processes
# --------------------------------------------------------------------------

def fl_worker_tids() -> set[int]:
    """Native ids of threads of this process named ``fl-worker*``."""
    tids = set()
    try:
        entries = os.listdir("/proc/self/task")
    except OSError:  # pragma: no cover - non-Linux
        return tids
    for tid in entries:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # thread exited meanwhile
            continue
        if name.startswith("fl-worker"):
            tids.add(int(tid))
    return tids


def torch_worker_pids() -> set[int]:
    """Pids of live multiprocessing children (torch's worker processes)."""
    return {p.pid for p in multiprocessing.active_children()}


def live_workers() -> set[int]:
    """Ids of live loader workers: fastloader's worker threads, and worker
    processes (torch's, or fastloader's for a Python dataset)."""
    return fl_worker_tids() | torch_worker_pids()


def wait_until(cond, timeout: float = 2.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        gc.collect()
        time.sleep(interval)


def wait_workers_gone(baseline: set[int] | None = None, timeout: float = 2.0) -> set[int]:
    """Poll (with gc) until no worker outside ``baseline`` is alive; return leftovers."""
    baseline = baseline or set()
    wait_until(lambda: not (live_workers() - baseline), timeout)
    return live_workers() - baseline


# --------------------------------------------------------------------------
# Structural equality
# --------------------------------------------------------------------------

def assert_same(a, b, path: str = "batch") -> None:
    """Recursive equality: same types, keys, lengths, dtypes, shapes, values."""
    assert type(a) is type(b), f"{path}: type {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.device.type == b.device.type, f"{path}: device {a.device} != {b.device}"
        assert torch.equal(a, b), f"{path}: values differ\n{a}\n!=\n{b}"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
        assert np.array_equal(a, b), f"{path}: values differ\n{a}\n!=\n{b}"
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a == b, f"{path}: {a!r} != {b!r}"
    elif isinstance(a, collections.abc.Mapping):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: len {len(a)} != {len(b)}"
        if hasattr(a, "_fields"):
            assert a._fields == b._fields, f"{path}: fields {a._fields} != {b._fields}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), f"{path}: nan != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_same_batches(out, ref) -> None:
    assert len(out) == len(ref), f"got {len(out)} batches, expected {len(ref)}"
    for i, (a, b) in enumerate(zip(out, ref)):
        assert_same(a, b, f"batch[{i}]")


def iter_leaves(x):
    """Yield every non-container leaf of a (nested) batch."""
    if isinstance(x, collections.abc.Mapping):
        for v in x.values():
            yield from iter_leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from iter_leaves(v)
    else:
        yield x


def clone_batch(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: clone_batch(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[clone_batch(v) for v in x])
    if isinstance(x, (list, tuple)):
        return type(x)(clone_batch(v) for v in x)
    return x


# --------------------------------------------------------------------------
# Sample kinds for the collate-equality tests
# --------------------------------------------------------------------------

Point = collections.namedtuple("Point", ["x", "y"])


def _base(i: int) -> np.ndarray:
    return np.arange(24, dtype=np.float32).reshape(4, 6) + 100 * i


def make_sample(kind: str, i: int):
    if kind == "t_f32":
        return torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 + i
    if kind == "t_i64":
        return torch.arange(5, dtype=torch.int64) - 3 * i
    if kind == "t_u8":
        return (torch.arange(12, dtype=torch.int64).reshape(3, 4) * 7 + i).to(torch.uint8)
    if kind == "t_bool":
        return (torch.arange(7) + i) % 3 == 0
    if kind == "t_f16":
        return (torch.arange(4, dtype=torch.float32) / 8 + i).to(torch.float16)
    if kind == "t_bf16":
        return (torch.arange(4, dtype=torch.float32) / 4 + i).to(torch.bfloat16)
    if kind == "t_scalar":
        return torch.tensor(i * 1.5)
    if kind == "np_f64":
        return np.linspace(0, 1, 5, dtype=np.float64) + i
    if kind == "np_f32":
        return np.arange(6, dtype=np.float32).reshape(3, 2) / 3 + i
    if kind == "np_i32":
        return np.arange(4, dtype=np.int32) * -i
    if kind == "np_u8":
        return (np.arange(16, dtype=np.int64).reshape(4, 4) * 13 + i).astype(np.uint8)
    if kind == "np_bool":
        return (np.arange(5) + i) % 2 == 0
    if kind == "np_strided":  # non-contiguous view (column stride)
        v = _base(i)[:, ::2]
        assert not v.flags.c_contiguous
        return v
    if kind == "np_transposed":  # non-contiguous view (Fortran order)
        v = _base(i).T
        assert not v.flags.c_contiguous
        return v
    if kind == "np_scalars":
        return (np.float32(i / 4), np.int16(i), np.float64(-i))
    if kind == "py_int":
        return i * 3 - 7
    if kind == "py_float":
        return i / 8 - 1.0
    if kind == "py_bool":
        return i % 3 == 0
    if kind == "str":
        return f"sample-{i}"
    if kind == "tuple":
        return (torch.full((2,), float(i)), i, f"t{i}")
    if kind == "list":
        return [i, float(i) / 2, torch.tensor([i, -i])]
    if kind == "dict":
        return {"x": torch.arange(3, dtype=torch.float32) + i, "label": i % 4, "name": f"n{i}"}
    if kind == "namedtuple":
        return Point(x=np.arange(3, dtype=np.int64) + i, y=float(i))
    if kind == "nested":
        return {
            "img": (torch.arange(4, dtype=torch.uint8) + i).reshape(2, 2),
            "meta": {"id": i, "path": f"/data/{i}.jpg", "flags": [i % 2 == 0, float(i)]},
            "pair": (np.arange(2, dtype=np.float64) * i, Point(x=i, y=torch.tensor(i, dtype=torch.int32))),
            "bf": torch.tensor([i, i + 1], dtype=torch.bfloat16),
        }
    raise ValueError(kind)


SAMPLE_KINDS = [
    "t_f32", "t_i64", "t_u8", "t_bool", "t_f16", "t_bf16", "t_scalar",
    "np_f64", "np_f32", "np_i32", "np_u8", "np_bool", "np_strided", "np_transposed",
    "np_scalars", "py_int", "py_float", "py_bool", "str", "tuple", "list", "dict",
    "namedtuple", "nested",
]


class KindDataset(Dataset):
    def __init__(self, kind: str, n: int = 22):
        self.kind = kind
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return make_sample(self.kind, i)


class RangeDataset(Dataset):
    """Item i -> i (python int); cheap and order-revealing."""

    def __init__(self, n: int = 20):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class EpochDataset(Dataset):
    """float32 tensor whose values depend on index and on a live ``epoch`` attribute."""

    def __init__(self, n: int = 24):
        self.n = n
        self.epoch = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        base = 1000.0 * self.epoch + 10.0 * i
        return {
            "x": torch.arange(16, dtype=torch.float32).reshape(4, 4) + base,
            "y": np.full((3,), base, dtype=np.float64),
            "i": i,
        }


class GetItemsDataset(Dataset):
    """Has ``__getitems__``; its output differs from ``__getitem__`` to prove which ran."""

    def __init__(self, n: int = 21):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return (torch.tensor([i]), "single")

    def __getitems__(self, indices):
        return [(torch.tensor([i * 10]), f"many{len(indices)}") for i in indices]


class DelayedDataset(Dataset):
    """Items take index-dependent time, so workers finish out of order."""

    def __init__(self, n: int = 24):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.015 if i % 3 == 0 else 0.0)
        return torch.tensor([i, i * i])


class ReversedSampler(Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


class EveryOtherSampler(Sampler):
    """A sampler that is *not* the length of the dataset (and repeats index 0)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        yield 0
        yield from range(1, self.n, 2)
        yield 0

    def __len__(self):
        return len(range(1, self.n, 2)) + 2


def sum_and_ids_collate(samples):
    """A custom collate_fn returning a non-default structure."""
    xs = [s["x"] for s in samples]
    return {"sum": torch.stack(xs).sum(0), "ids": [s["i"] for s in samples], "count": len(samples)}


# --------------------------------------------------------------------------
# Iterable datasets
# --------------------------------------------------------------------------

class ShardedIterable(IterableDataset):
    """Shards itself by worker info: worker w yields items i with i % n == w."""

    def __init__(self, n: int = 23):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(wid, self.n, nw):
            yield {"i": i, "x": torch.tensor([i, -i], dtype=torch.int32)}


class ContiguousShardIterable(IterableDataset):
    """Shards in contiguous blocks (like the torch docs example); uneven sizes."""

    def __init__(self, start: int = 3, end: int = 26):
        self.start = start
        self.end = end

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            lo, hi = self.start, self.end
        else:
            per = int(math.ceil((self.end - self.start) / info.num_workers))
            lo = self.start + info.id * per
            hi = min(lo + per, self.end)
        for i in range(lo, hi):
            yield np.array([i, i + 0.5])


class UnshardedIterable(IterableDataset):
    """Does not look at worker info: torch yields it once per worker."""

    def __init__(self, n: int = 10):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield (torch.tensor(float(i)), i)


# --------------------------------------------------------------------------
# Error datasets
# --------------------------------------------------------------------------

class CustomLoadError(Exception):
    pass


class TwoArgError(Exception):
    """Cannot be rebuilt from a single message string (torch loses its type)."""

    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


def load_sample_or_explode(ds, i):
    """Distinctive name: the tests look for it in the formatted traceback."""
    if ds.fail and i == ds.fail_index:
        if ds.exc == "custom":
            raise CustomLoadError("corrupt record")
        if ds.exc == "key":
            raise KeyError("missing-key")
        if ds.exc == "two_arg":
            raise TwoArgError(42, "bad header")
        raise ValueError("bad value")
    return torch.tensor([i], dtype=torch.int64)


class FailingDataset(Dataset):
    def __init__(self, n: int = 16, fail_index: int = 7, exc: str = "custom"):
        self.n = n
        self.fail_index = fail_index
        self.exc = exc
        self.fail = True

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return load_sample_or_explode(self, i)


class SlowDataset(Dataset):
    """Every item at index >= fast_prefix sleeps ``delay`` s (released by RELEASE)."""

    def __init__(self, n: int = 8, delay: float = 3.0, fast_prefix: int = 0):
        self.n = n
        self.delay = delay
        self.fast_prefix = fast_prefix

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.fast_prefix:
            slow_wait(self.delay)
        return torch.tensor([i])


# --------------------------------------------------------------------------
# Worker-identity datasets
# --------------------------------------------------------------------------

class NativeIdDataset(Dataset):
    """Returns (index, native id of the thread/process that loaded it)."""

    def __init__(self, n: int = 8):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return (i, threading.get_native_id())


class TorchWorkerInfoDataset(Dataset):
    def __init__(self, n: int = 40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        if info is None:
            return {"i": i, "has_info": False, "id": -1, "num_workers": -1, "seed": -1, "same_ds": False}
        return {
            "i": i,
            "has_info": True,
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "same_ds": info.dataset is self,
        }


# worker_init_fn bookkeeping: per thread (or per process) list of worker ids seen
INIT_CALLS: dict[int, list[int]] = {}
INIT_LOCK = threading.Lock()


def record_worker_init(worker_id):
    with INIT_LOCK:
        # native id: unlike get_ident(), it also differs between forked processes
        INIT_CALLS.setdefault(threading.get_native_id(), []).append(worker_id)


class InitRecordDataset(Dataset):
    """Returns index, worker id, thread ident and the worker_init_fn calls seen in this thread."""

    def __init__(self, n: int = 40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        ident = threading.get_native_id()
        with INIT_LOCK:
            calls = list(INIT_CALLS.get(ident, []))
        return {
            "i": i,
            "wid": info.id if info is not None else -1,
            "ident": ident,
            "ncalls": len(calls),
            "first_call": calls[0] if calls else -1,
        }


# --------------------------------------------------------------------------
# CPU-bound vs sleeping datasets (GIL detection)
# --------------------------------------------------------------------------

def burn_python(iterations: int) -> int:
    acc = 0
    for k in range(iterations):
        acc = (acc + k * k) % 1000003
    return acc


class PythonCpuDataset(Dataset):
    def __init__(self, n: int = 300, iterations: int = 50000):  # ~2 ms of pure Python
        self.n = n
        self.iterations = iterations

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return burn_python(self.iterations) + i


class SleepyDataset(Dataset):
    def __init__(self, n: int = 300, delay: float = 0.002):
        self.n = n
        self.delay = delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return i
