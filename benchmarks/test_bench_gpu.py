"""GPU delivery (bench_gpu.py's measurements): skipped without a CUDA device.

test_h2d       one 64x3x224x224 float32 batch host -> device, GPU-timed with CUDA
               events: torch's pinned tensor.to(device, non_blocking=True) vs
               fastloader's copier (its own stream, pooled device buffers)
test_delivery  images/s delivered to the device by the train pipeline, each batch
               used on the device and its stream synchronised, with a simulated
               asynchronous model step of 0 or 20 ms per batch:
                 torch              torchvision ImageFolder + DataLoader(pin_memory=True) + .to(device)
                 fastloader         fastloader.DataLoader(device="cuda")
                 fastloader-uint8   the same with convert_on_device=True (uint8 on the wire)
"""
import pytest

import _suite as S

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here", allow_module_level=True)

BATCH = 64


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader"))
def test_h2d(bench, loader):
    """Host-to-device copy of one batch, us"""
    reps = 5 if bench.quick else 20

    def config(ld):
        return S.Child(S.CHILDREN, "gpu_h2d_child", dict(impl=ld, reps=reps))

    bench.run(config, unit="us", measure=S.field_s("copy_s"), expect=dict(dtype="float32"))


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader", "fastloader-uint8"))
@pytest.mark.parametrize("step_ms", [0, 20])
def test_delivery(bench, sample, step_ms, workers, loader):
    """The train pipeline delivered to the GPU, img/s"""
    mb = bench.max_batches(None)

    def config(ld):
        return S.Child(S.CHILDREN, "gpu_delivery_child", dict(impl=ld, root=sample.root, workers=workers,
                                                              batch_size=BATCH, step_ms=step_ms, max_batches=mb))

    bench.run(config, expect=dict(shape=f"{BATCH}x3x224x224", dtype="float32",
                                  batches=S.n_batches(sample.count, BATCH, mb)))
