"""fastloader.NativeTransform: the native call inside a custom __getitem__.

Samples equal to ImageFolder's under fastloader.DataLoader, torchvision's
pixels and torch's generator outside it, every input kind, Pillow for other
formats, errors that name the file, and the GIL released for the whole call."""
import functools
import io
import os
import pathlib
import pickle
import sys
import threading
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
from fastloader.tools.sample import make_sample  # noqa: E402

from helpers_compare import seeded_epochs  # noqa: E402
from helpers_pipelines import MEAN, STD, val_tf  # noqa: E402
from imgutil import make_jpeg  # noqa: E402

pytestmark = pytest.mark.fastloader_only


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs") / "train"
    make_sample(str(root), n=20, classes=2, seed=5, progress=False, processes=1)
    return str(root)


def _train_v2(size=64):
    # the custom-dataset pipeline, smaller
    return v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip(), v2.ToImage(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


_val_tf = functools.partial(val_tf, 72, 64, lib=T)  # torchvision's


class Custom(torch.utils.data.Dataset):
    """A user's dataset: its own file list and labels, one native call per sample."""

    def __init__(self, samples, transform, views=1):
        self.samples = samples
        self.load = fastloader.NativeTransform(transform)
        self.views = views

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        if self.views == 1:
            return self.load(path), label
        return tuple(self.load(path) for _ in range(self.views)) + (label,)


# the batches as the loader yields them (each=None: not copied)
_epochs = functools.partial(seeded_epochs, shuffle=True, batch_size=8, seed=13, generator_seed=2, each=None)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_samples_equal_imagefolders_under_the_loader(folder, num_workers):
    ref = fastloader.ImageFolder(folder, transform=_train_v2())
    ours = Custom(ref.samples, _train_v2())
    a, b = _epochs(ref, num_workers), _epochs(ours, num_workers)
    for ea, eb in zip(a, b):
        assert len(ea) == len(eb) == 3
        for (xa, ya), (xb, yb) in zip(ea, eb):
            assert xb.dtype == torch.float32 and xb.shape == xa.shape
            assert torch.equal(ya, yb)
            assert torch.equal(xa, xb)
    # the crops follow the epoch, as ImageFolder's do
    assert not torch.equal(torch.cat([x for x, _ in b[0]]), torch.cat([x for x, _ in b[1]]))


def test_second_view_of_a_sample_has_its_own_reproducible_draws(folder):
    ref = fastloader.ImageFolder(folder, transform=_train_v2())
    ours = Custom(ref.samples, _train_v2(), views=2)
    runs = {nw: _epochs(ours, nw, epochs=1)[0] for nw in (0, 2)}
    want = _epochs(ref, 0, epochs=1)[0]
    for (v1, v2_, y), (w1, w2, wy), (x, _) in zip(runs[0], runs[2], want):
        assert torch.equal(v1, x)           # the first call is ImageFolder's sample
        assert torch.equal(v1, w1) and torch.equal(v2_, w2) and torch.equal(y, wy)
    first = torch.cat([b[0] for b in runs[0]])
    second = torch.cat([b[1] for b in runs[0]])
    assert not torch.equal(first, second)


def test_unbatched_loading_keys_by_the_index_too(folder):
    ref = fastloader.ImageFolder(folder, transform=_train_v2())
    ours = Custom(ref.samples, _train_v2())
    for nw in (0, 2):
        a = list(fastloader.DataLoader(ref, batch_size=None, num_workers=nw, seed=4))
        b = list(fastloader.DataLoader(ours, batch_size=None, num_workers=nw, seed=4))
        assert len(a) == len(b) == len(ref)
        assert all(torch.equal(x, y) and int(la) == int(lb) for (x, la), (y, lb) in zip(a, b))


def test_getitems_passes_the_index_and_without_it_warns(folder):
    ref = fastloader.ImageFolder(folder, transform=_train_v2())
    load = fastloader.NativeTransform(_train_v2())

    class Batched(torch.utils.data.Dataset):
        def __init__(self, keyed):
            self.keyed = keyed

        def __len__(self):
            return len(ref.samples)

        def __getitems__(self, indices):
            if self.keyed:
                return [(load(ref.samples[i][0], index=i), ref.targets[i]) for i in indices]
            return [(load(ref.samples[i][0]), ref.targets[i]) for i in indices]

    for (xa, ya), (xb, yb) in zip(_epochs(ref, 2)[1], _epochs(Batched(True), 2)[1]):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    with pytest.warns(UserWarning, match="index="):
        _epochs(Batched(False), 0, epochs=1)


def test_outside_the_loader_pixels_equal_torchvision_for_every_input_kind(folder, tmp_path):
    load = fastloader.NativeTransform(_val_tf())
    path = tv.datasets.ImageFolder(folder).samples[3][0]
    data = open(path, "rb").read()
    with Image.open(path) as im:
        rgb = im.convert("RGB")
    want = _val_tf()(rgb)
    pixels = np.asarray(rgb)
    inputs = [path, pathlib.Path(path), data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8),
              pixels, np.asfortranarray(pixels)]
    for src in inputs:
        got = load(src)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
        assert torch.equal(got, want), type(src)
    # a grayscale array becomes RGB as Pillow's convert("RGB") does
    gray = np.asarray(rgb.convert("L"))
    assert torch.equal(load(gray), _val_tf()(Image.fromarray(gray).convert("RGB")))


def test_outside_the_loader_draws_from_torchs_generator(folder):
    load = fastloader.NativeTransform(_train_v2())
    path = tv.datasets.ImageFolder(folder).samples[0][0]
    torch.manual_seed(3)
    a = [load(path) for _ in range(6)]
    after = torch.rand(1)
    torch.manual_seed(3)
    b = [load(path) for _ in range(6)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(after, torch.rand(1))          # the same number of draws each time
    assert any(not torch.equal(a[0], x) for x in a[1:])  # each call draws anew
    torch.manual_seed(3)
    for _ in range(6):
        torch.randint(0, 2**62, ())                   # one draw per call
    assert torch.equal(after, torch.rand(1))


@pytest.mark.parametrize("fmt,pillow", [("png", False), ("webp", False), ("bmp", True)])
def test_png_webp_decode_natively_and_bmp_through_pillow_with_one_warning(folder, tmp_path, fmt, pillow):
    load = fastloader.NativeTransform(_val_tf())
    path = tv.datasets.ImageFolder(folder).samples[1][0]
    with Image.open(path) as im:
        rgb = im.convert("RGB")
    f = tmp_path / f"x.{fmt}"
    rgb.save(f, **({"lossless": True} if fmt == "webp" else {}))
    with Image.open(f) as im:
        want = _val_tf()(im.convert("RGB"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert torch.equal(load(str(f)), want)
        assert torch.equal(load(f.read_bytes()), want)
    assert [("Pillow" in str(m.message)) for m in w] == ([True] if pillow else []), [str(m.message) for m in w]


def test_errors_name_the_path(folder, tmp_path):
    load = fastloader.NativeTransform(_val_tf())
    good = open(tv.datasets.ImageFolder(folder).samples[0][0], "rb").read()
    trunc = tmp_path / "truncated.jpg"
    trunc.write_bytes(good[: len(good) // 3])
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(b"\x00not an image at all" * 50)
    badpng = tmp_path / "bad.png"
    badpng.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    for p in (trunc, junk, badpng):
        with pytest.raises(fastloader.DecodeError, match=str(p)):
            load(str(p))
    with pytest.raises(FileNotFoundError) as ei:
        load(str(tmp_path / "missing.jpg"))
    assert ei.value.filename == str(tmp_path / "missing.jpg")
    with pytest.raises(IsADirectoryError):
        load(tmp_path)
    with pytest.raises(fastloader.DecodeError, match="<bytes>"):
        load(good[:200])
    with pytest.raises(TypeError, match="uint8"):
        load(np.zeros((8, 8, 3), np.float32))
    with pytest.raises(ValueError, match="C 1 or 3"):
        load(np.zeros((8, 8, 4), np.uint8))
    with pytest.raises(TypeError, match="path"):
        load(12)
    # under the loader: the same exception, with a note naming the sample
    samples = [(str(trunc), 0)] * 4
    with pytest.raises(fastloader.DecodeError, match="truncated.jpg") as ei:
        list(fastloader.DataLoader(Custom(samples, _val_tf()), batch_size=2, num_workers=2))
    assert "sample index" in " ".join(getattr(ei.value, "__notes__", [])) + str(ei.value)


def test_python_tail_and_fixed_size(folder):
    # an unsupported tail runs in Python on the output, as ImageFolder's does
    tf = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Lambda(lambda x: x.flip(0))])
    load = fastloader.NativeTransform(tf)
    assert "Lambda" in repr(load)
    path = tv.datasets.ImageFolder(folder).samples[2][0]
    with Image.open(path) as im:
        assert torch.equal(load(path), tf(im.convert("RGB")))
    with pytest.raises(ValueError, match="fixed output size"):
        fastloader.NativeTransform(T.Compose([T.Resize(64), T.ToTensor()]))


def test_pickles_for_spawned_workers(folder):
    load = fastloader.NativeTransform(_val_tf(), layout="HWC")
    again = pickle.loads(pickle.dumps(load))
    path = tv.datasets.ImageFolder(folder).samples[0][0]
    assert again.layout == "HWC" and again(path).shape == (64, 64, 3)
    assert torch.equal(again(path), load(path))


def test_the_call_runs_without_the_gil_from_start_to_end():
    """A watcher thread that holds the GIL (a 100 s switch interval: nobody
    takes it from a running thread) can only start once the main thread
    released it inside the call, and then sees the main thread's CPU clock
    advance by a good part of a call's CPU cost while it still holds the GIL:
    the read + decode + render ran without it."""
    big = make_jpeg("astronaut", (2048, 2048), quality=95)
    load = fastloader.NativeTransform(FT.Compose([FT.Resize((256, 256)), FT.ToTensor()]))
    call = load._call.call   # the C call alone: the wrapper's torch.randint may release the GIL too
    call(big, 0, 0, 0)
    costs = []
    for _ in range(3):
        c0 = time.thread_time()
        call(big, 0, 0, 0)
        costs.append(time.thread_time() - c0)
    # the watcher sees the call from the moment it is scheduled to the call's
    # end (the call cannot take the GIL back from it); on a loaded 2-core
    # machine it may be scheduled a few ms late, so ask for 30% of a call
    need = 0.3 * min(costs)
    main_clock = time.pthread_getcpuclockid(threading.get_ident())
    go = threading.Event()
    seen = {}

    def watcher():
        go.wait()
        c0 = time.clock_gettime(main_clock)
        end = time.perf_counter() + 5.0
        while time.clock_gettime(main_clock) - c0 < need and time.perf_counter() < end:
            pass
        seen["advanced"] = time.clock_gettime(main_clock) - c0

    old = sys.getswitchinterval()
    # set before the watcher exists: a thread already waiting for the GIL
    # under the old interval would force a switch when that one ran out
    sys.setswitchinterval(100.0)
    t = threading.Thread(target=watcher)
    try:
        t.start()
        go.set()
        out = call(big, 0, 0, 0)
    finally:
        sys.setswitchinterval(old)
        t.join()
    assert out is not None
    assert seen["advanced"] >= need, (seen, costs)


def test_without_torch_returns_numpy_arrays(tmp_path):
    import subprocess
    import textwrap

    path = tmp_path / "a.jpg"
    path.write_bytes(make_jpeg("chelsea", (120, 90)))
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None
        import numpy as np
        import fastloader
        from fastloader import transforms as FT
        load = fastloader.NativeTransform(FT.Compose([FT.Resize((32, 48)), FT.ToImage()]))
        a = load({str(path)!r})
        assert isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.shape == (3, 32, 48), (type(a), a.shape)
        assert np.array_equal(a, load(open({str(path)!r}, "rb").read()))
        print("ok")
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_in_worker_processes_samples_equal_imagefolders(folder, context):
    """worker_mode="process": the native call inside a worker process keys
    its draws by (seed, epoch, index) as in threads, so a custom dataset's
    batches are ImageFolder's under fastloader's loader (spawn pickles the
    callable into the workers)."""
    ref = fastloader.ImageFolder(folder, transform=_train_v2())
    ours = Custom(ref.samples, _train_v2())
    kw = dict(batch_size=8, shuffle=True, num_workers=2, seed=13)
    want = [list(fastloader.DataLoader(ref, generator=torch.Generator().manual_seed(2), **kw))]
    dl = fastloader.DataLoader(ours, generator=torch.Generator().manual_seed(2), worker_mode="process",
                               multiprocessing_context=context, **kw)
    got = [list(dl)]
    assert dl.stats()["worker_mode"] == "process"
    assert len(got[0]) == len(want[0]) == 3
    for (xa, ya), (xb, yb) in zip(want[0], got[0]):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
