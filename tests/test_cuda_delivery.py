"""device="cuda" and pin_memory=True with a GPU (skipped, with the reason,
where there is none) and the clear errors when CUDA is missing."""
import gc

import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from fastloader import transforms as FT  # noqa: E402
from fastloader.tools.sample import make_sample  # noqa: E402

HAVE_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device (torch.cuda.is_available() is False)")


class Arange(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((3, 8), float(i)), i


@pytest.mark.skipif(HAVE_GPU, reason="checks the error raised without a GPU")
def test_device_cuda_without_gpu_says_what_is_missing():
    with pytest.raises(RuntimeError) as ei:
        fastloader.DataLoader(Arange(), batch_size=4, device="cuda")
    msg = str(ei.value)
    assert any(word in msg for word in ("driver", "no CUDA device", "no CUDA runtime", "CUDA support")), msg


def test_cpu_and_bad_devices():
    dl = fastloader.DataLoader(Arange(), batch_size=4, device="cpu")
    x, y = next(iter(dl))
    assert x.device.type == "cpu"
    with pytest.raises(ValueError, match="CUDA devices only"):
        fastloader.DataLoader(Arange(), batch_size=4, device="meta")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu") / "d"
    make_sample(str(root), n=64, classes=2, progress=False, processes=1)
    return str(root)


def _native(folder):
    return fastloader.ImageFolder(folder, transform=FT.Compose([
        FT.Resize(72), FT.CenterCrop(64), FT.ToTensor(), FT.Normalize([0.5] * 3, [0.25] * 3)]))


@gpu
@pytest.mark.parametrize("num_workers", [0, 2])
def test_native_batches_on_device_equal_cpu_path(folder, num_workers):
    ds = _native(folder)
    cpu = list(fastloader.DataLoader(ds, batch_size=16, num_workers=num_workers))
    dev = list(fastloader.DataLoader(ds, batch_size=16, num_workers=num_workers, device="cuda"))
    for (xc, yc), (xd, yd) in zip(cpu, dev):
        assert xd.device.type == "cuda" and yd.device.type == "cuda"
        assert torch.equal(xc, xd.cpu()) and torch.equal(yc, yd.cpu())


@gpu
@pytest.mark.parametrize("num_workers", [0, 2])
def test_python_batches_on_device_equal_cpu_path(num_workers):
    cpu = list(fastloader.DataLoader(Arange(), batch_size=4, num_workers=num_workers))
    dev = list(fastloader.DataLoader(Arange(), batch_size=4, num_workers=num_workers, device="cuda:0"))
    for (xc, yc), (xd, yd) in zip(cpu, dev):
        assert xd.device == torch.device("cuda", 0)
        assert torch.equal(xc, xd.cpu()) and torch.equal(yc, yd.cpu())


@gpu
def test_pin_memory_gives_pinned_batches(folder):
    x, _ = next(iter(fastloader.DataLoader(_native(folder), batch_size=8, num_workers=2, pin_memory=True)))
    assert x.is_pinned()
    x, _ = next(iter(fastloader.DataLoader(Arange(), batch_size=8, num_workers=2, pin_memory=True)))
    assert x.is_pinned()


@gpu
def test_memory_flat_over_20_epochs(folder):
    ds = _native(folder)
    dl = fastloader.DataLoader(ds, batch_size=16, num_workers=2, device="cuda", persistent_workers=True)
    seen = []
    for epoch in range(20):
        for x, y in dl:
            x.sum().item()
        st = dl.stats()
        del x, y
        gc.collect()
        torch.cuda.synchronize()
        seen.append((st["device_pool_bytes"], st["device_pool_buffers"], torch.cuda.memory_allocated(),
                     ds._native.pool_bytes))
    assert seen[-1][:2] == seen[2][:2], seen       # our device pool: same buffers
    assert seen[-1][2] <= seen[2][2] + (1 << 20)   # torch's allocator: nothing growing
    assert seen[-1][3] <= seen[2][3]               # host pool


@gpu
def test_tensors_deleted_in_any_order_return_buffers(folder):
    ds = _native(folder)
    dl = fastloader.DataLoader(ds, batch_size=8, num_workers=2, pin_memory=True)
    kept = [b for b in dl]
    out_before = ds._native.pool_bytes_out
    assert out_before > 0
    for i in (3, 0, 7, 1, 5, 2, 6, 4):
        kept[i] = None
    gc.collect()
    assert ds._native.pool_bytes_out == 0


@gpu
def test_device_tensors_deleted_in_any_order_return_device_buffers(folder):
    dl = fastloader.DataLoader(_native(folder), batch_size=8, num_workers=2, device="cuda")
    kept = [b for b in dl]
    copier = dl._fl_copier
    copier.synchronize()
    st = copier.pool_stats()
    assert st["buffers"] - st["idle"] >= 2 * len(kept)  # images and labels are out
    for i in (3, 0, 7, 1, 5, 2, 6, 4):
        kept[i] = None
    gc.collect()
    st = copier.pool_stats()
    assert st["idle"] == st["buffers"], st


@gpu
def test_device_copier_roundtrip_and_dlpack_metadata():
    from fastloader import _C
    c = _C.DeviceCopier(0)
    host = torch.arange(3 * 5 * 7, dtype=torch.float32).reshape(3, 5, 7).pin_memory()
    d = c.copy(host)
    assert d.__dlpack_device__() == (2, 0) and d.shape == (3, 5, 7) and d.nbytes == host.nbytes
    x = torch.from_dlpack(d)
    assert x.device == torch.device("cuda", 0) and x.dtype == torch.float32 and x.shape == host.shape
    assert torch.equal(x.cpu(), host)
    d.wait()
    assert d.copy_done() and not d.holds_host and d.copy_ms() >= 0.0


@gpu
def test_release_is_ordered_after_the_consumer_stream():
    """One device buffer: batch B's copy must not overwrite A while work
    queued on the consumer's stream before A was released still reads it."""
    from fastloader import _C
    c = _C.DeviceCopier(0, max_buffers=1)
    a = torch.full((1 << 20,), 7, dtype=torch.uint8).pin_memory()
    b = torch.full((1 << 20,), 9, dtype=torch.uint8).pin_memory()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xa = torch.from_dlpack(c.copy(a))
        ptr = xa.data_ptr()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on s before reading A
        ya = xa.clone()
        del xa  # released while s still has the sleep and the clone queued
        xb = torch.from_dlpack(c.copy(b))
        assert xb.data_ptr() == ptr  # the single buffer was reused ...
        assert c.stats()["reused_waiting"] == 1
    torch.cuda.synchronize()
    assert torch.all(ya == 7).item()  # ... only after the clone had read A
    assert torch.all(xb == 9).item()


@gpu
def test_consumer_on_a_non_default_stream(folder):
    ds = _native(folder)
    ref = [x for x, _ in fastloader.DataLoader(ds, batch_size=16, num_workers=2)]
    s = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(s):
        for x, _ in fastloader.DataLoader(ds, batch_size=16, num_workers=2, device="cuda"):
            got.append((x * 2).sum(dim=(1, 2, 3)))  # work queued on s, after our copy
    torch.cuda.synchronize()
    for r, g in zip(ref, got):
        assert torch.allclose((r * 2).sum(dim=(1, 2, 3)), g.cpu(), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("tf", [
    lambda: FT.Compose([FT.RandomResizedCrop(48), FT.RandomHorizontalFlip(), FT.ToTensor(),
                        FT.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]),
    lambda: FT.Compose([FT.Resize(40), FT.CenterCrop(32), FT.PILToTensor(), FT.ToDtype(torch.bfloat16, scale=True)]),
    lambda: FT.Compose([FT.Resize(40), FT.CenterCrop(32), FT.ToImage(), FT.ToDtype(torch.float32, scale=True),
                        FT.Normalize([0.5], [0.25])]),
])
def test_uint8_wire_plus_convert_equals_the_float_pipeline(folder, tf):
    # the conversion that convert_on_device runs on the GPU, checked here on the CPU
    ds = fastloader.ImageFolder(folder, transform=tf())
    wire, convert = ds._wire_variant()
    assert wire is not None and wire._spec["dtype"] == "uint8"
    ref, yr = ds.load_batch(range(16), epoch=1, seed=3)
    u8, yu = wire.load_batch(range(16), epoch=1, seed=3)
    assert u8.dtype == torch.uint8 and torch.equal(yr, yu)
    out = convert(u8)
    assert out.dtype == ref.dtype
    assert torch.equal(out, ref)


@gpu
def test_convert_on_device_equals_cpu_path(folder):
    ds = _native(folder)
    cpu = list(fastloader.DataLoader(ds, batch_size=16, num_workers=2))
    dev = list(fastloader.DataLoader(ds, batch_size=16, num_workers=2, device="cuda", convert_on_device=True))
    for (xc, yc), (xd, yd) in zip(cpu, dev):
        assert xd.device.type == "cuda" and xd.dtype == xc.dtype
        assert torch.equal(xc, xd.cpu()) and torch.equal(yc, yd.cpu())
