"""Default collation a sample at a time (collate.RowWriter, _C.batch_buffer):
each sample's large arrays and tensors are copied into their row of the
batch buffer (a process worker's shared-memory slot, a worker thread's
pooled buffer, fresh memory at num_workers=0) as the sample comes, so a
worker never holds a batch of samples beside the batch.

What is checked: the batches equal torch's DataLoader's (types, dtypes,
shapes, values) for nested samples, NumPy arrays, a last partial batch of an
IterableDataset; a sample that does not match the first one's shape or
dtype gets torch's own collation (its error message, its type promotion);
the sample's own tensor is released before the next sample is loaded (under
torch it lives until the batch is collated); the collated batch is the
buffer the rows were written to (no second copy); _C.batch_buffer's
contract."""
import gc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from fastloader import _C  # noqa: E402
from fastloader.collate import RowWriter, collate_into, fast_default_collate  # noqa: E402

pytestmark = pytest.mark.fastloader_only

# (num_workers, worker_mode): the three places collation runs
MODES = [(0, "auto"), (2, "thread"), (2, "process")]
MODE_IDS = ["main-thread", "threads", "processes"]


class Nested(torch.utils.data.Dataset):
    """Samples mixing row-written fields (>= 64 KiB) with small tensors,
    NumPy arrays, Python numbers and strings, in dicts, tuples and lists."""

    def __init__(self, n=21):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, 96, 96, generator=g)                        # 110,592 bytes: a row
        rows = np.random.default_rng(i).standard_normal((10, 2000)).astype(np.float32)  # 80,000 bytes: a row
        view = torch.arange(3 * 64 * 64, dtype=torch.int32).reshape(3, 64, 64)[:, ::2, 1::2] + i  # strided
        return {"img": img, "feat": rows, "pair": (view, torch.tensor([i, -i])), "label": i,
                "name": f"s{i}", "more": [torch.full((256, 64), float(i)), 0.5 * i]}


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n=10):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(wid, self.n, nw):
            yield torch.full((128, 160), float(i)), i


class Reshaped(torch.utils.data.Dataset):
    """Sample `odd` differs from the rest: another shape or another dtype."""

    def __init__(self, odd, how):
        self.odd, self.how = odd, how

    def __len__(self):
        return 8

    def __getitem__(self, i):
        t = torch.full((64, 64, 8), float(i))
        if i == self.odd:
            t = t[:16] if self.how == "shape" else t.double()
        return t, i


class Tracked(torch.utils.data.Dataset):
    """Each sample says whether the previous sample's tensor (in this
    process: a worker process or the loader's) is still alive when this one
    is loaded; sample 0 of a batch reports the previous batch's last."""

    def __init__(self, n=24):
        self.n = n
        self.prev = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        gc.collect()
        alive = self.prev is not None and self.prev() is not None
        t = torch.full((3, 96, 96), float(i))
        self.prev = weakref.ref(t)
        return t, int(alive)


class Overwriting(torch.utils.data.Dataset):
    """Returns one tensor, overwritten in place for every sample."""

    def __init__(self):
        self.buf = torch.zeros(128, 128)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        self.buf.fill_(float(i))
        return self.buf


def _same(a, b, where="batch"):
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{k}]")
    else:
        assert a == b, where


def _batches(loader):
    return [b for b in loader]


@pytest.mark.parametrize("nw,mode", MODES, ids=MODE_IDS)
def test_nested_samples_equal_torch(nw, mode):
    ds = Nested()
    want = _batches(torch.utils.data.DataLoader(ds, batch_size=4))
    got = _batches(fastloader.DataLoader(ds, batch_size=4, num_workers=nw, worker_mode=mode))
    assert len(got) == len(want) == 6   # the last one partial (21 = 5 * 4 + 1)
    for k, (g, w) in enumerate(zip(got, want)):
        _same(g, w, f"batch {k}")


@pytest.mark.parametrize("nw,mode", MODES, ids=MODE_IDS)
def test_iterable_last_partial_batch_equals_torch(nw, mode):
    ds = Stream(10)
    want = _batches(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=nw))
    got = _batches(fastloader.DataLoader(ds, batch_size=4, num_workers=nw, worker_mode=mode))
    assert [len(b[1]) for b in got] == [len(b[1]) for b in want]
    for k, (g, w) in enumerate(zip(got, want)):
        _same(g, w, f"batch {k}")


@pytest.mark.parametrize("nw,mode", MODES, ids=MODE_IDS)
def test_another_shape_mid_batch_gets_torchs_error(nw, mode):
    ds = Reshaped(odd=5, how="shape")
    with pytest.raises(RuntimeError) as want:
        _batches(torch.utils.data.DataLoader(ds, batch_size=8))
    with pytest.raises(RuntimeError) as got:
        _batches(fastloader.DataLoader(ds, batch_size=8, num_workers=nw, worker_mode=mode))
    assert "stack expects each tensor to be equal size" in str(want.value)
    assert str(want.value) in str(got.value)


@pytest.mark.parametrize("nw,mode", MODES, ids=MODE_IDS)
def test_another_dtype_mid_batch_collates_as_torch(nw, mode):
    ds = Reshaped(odd=3, how="dtype")
    want = _batches(torch.utils.data.DataLoader(ds, batch_size=8))
    got = _batches(fastloader.DataLoader(ds, batch_size=8, num_workers=nw, worker_mode=mode))
    assert want[0][0].dtype == torch.float64   # torch's stack promotes
    for g, w in zip(got, want):
        _same(g, w)


@pytest.mark.parametrize("nw,mode", MODES, ids=MODE_IDS)
def test_each_sample_released_before_the_next_is_loaded(nw, mode):
    ds = Tracked()
    flags = torch.cat([y for _, y in fastloader.DataLoader(ds, batch_size=6, num_workers=nw, worker_mode=mode)])
    assert flags.tolist() == [0] * len(ds)
    # torch's collation holds every sample of the batch until it stacks them
    flags = torch.cat([y for _, y in torch.utils.data.DataLoader(ds, batch_size=6)])
    assert flags.reshape(4, 6)[:, 1:].eq(1).all()


# one worker thread: two would overwrite the shared buffer under each other
@pytest.mark.parametrize("nw,mode", [(0, "auto"), (1, "thread"), (2, "process")], ids=MODE_IDS)
def test_a_buffer_overwritten_in_place_keeps_each_samples_values(nw, mode):
    """The documented difference (docs/migrating.md): values are taken when
    each sample is returned; torch's stack at the end repeats the last."""
    got = _batches(fastloader.DataLoader(Overwriting(), batch_size=4, num_workers=nw, worker_mode=mode))
    assert [b[:, 0, 0].tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    want = _batches(torch.utils.data.DataLoader(Overwriting(), batch_size=4))
    assert [b[:, 0, 0].tolist() for b in want] == [[3, 3, 3, 3], [7, 7, 7, 7]]


def test_process_batches_travel_in_their_slots():
    dl = fastloader.DataLoader(Nested(64), batch_size=8, num_workers=2, worker_mode="process")
    n = sum(1 for _ in dl)
    shm = dl.stats()["shared_memory"]
    assert n == 8
    assert shm["batches_pickled"] == 0 and 1 <= shm["slots_written"] <= shm["slots"], shm


def test_the_batch_is_the_row_buffer():
    pool = _C.BatchPool()
    samples = [(torch.full((3, 96, 96), float(i)), i) for i in range(5)]
    w = RowWriter(pool, 5)
    data = [w.take(s) for s in samples]
    assert all(type(x) is torch.Tensor for x, _ in data)
    assert len(w.buffers) == 1
    batch, _ = collate_into(pool, fast_default_collate, data)
    batch_rows, _ = collate_into(pool, fast_default_collate, data, w)
    assert batch_rows[0].data_ptr() == w.buffers[0].ptr          # no stack: the rows' buffer
    assert batch[0].data_ptr() != w.buffers[0].ptr               # without the writer: a stack
    _same(batch_rows, batch)
    _same(batch_rows, torch.utils.data.default_collate(samples))


def test_small_fields_and_other_types_are_left_to_collation():
    class Sub(torch.Tensor):
        pass

    w = RowWriter(_C.BatchPool(), 3)
    s = (torch.zeros(8), torch.zeros(4096).as_subclass(Sub), np.zeros(10, dtype=object), "x")
    out = w.take(s)
    assert all(a is b for a, b in zip(out, s))
    assert w.buffers == [] and w.off   # nothing to write: the next samples are not looked at


def test_batch_buffer_contract():
    b = _C.batch_buffer(1000)
    assert b.nbytes == 1000 and b.shape == (1000,) and not b.pinned
    pool = _C.BatchPool()
    pb = _C.batch_buffer(4096, pool=pool)
    assert pb.nbytes == 4096
    ptr = pb.ptr
    del pb
    gc.collect()
    again = _C.batch_buffer(4096, pool=pool)
    assert again.ptr == ptr          # the pool's buffer, given back when dropped and lent again
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        _C.batch_buffer(-1)
    with pytest.raises(TypeError, match=r"batch_buffer\(\): pool must be a BatchPool, a ShmRing or None"):
        _C.batch_buffer(8, pool=object())
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        _C.batch_buffer(8, size=3)
