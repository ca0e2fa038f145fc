"""The import swap on Python datasets: the same Dataset under torch's DataLoader
and under fastloader's (``from fastloader import DataLoader``), nothing else changed.

test_python_dataset -- bench_python.py's two map-style datasets, about 1 ms of
  work per sample, batch 32 (run by bench_procworkers.py's child):
    numpy   GIL-releasing numpy work on a 256x256x3 float32 array per sample
    python  pure-Python arithmetic (holds the GIL)
  loaders: torch, fastloader (its default, worker_mode="auto": it starts on
  threads and moves to processes when the GIL holds them back),
  fastloader-thread and fastloader-process (worker_mode forced; neither at
  num_workers=0, where they are fastloader), and torchdata's
  StatefulDataLoader when installed.

test_custom_dataset -- bench_custom.py's user Dataset: Pillow +
  torchvision.transforms.v2 in __getitem__ (RandomResizedCrop 224, flip,
  ToImage, ToDtype, Normalize):
    torch              under torch's DataLoader
    fastloader         the same class under fastloader.DataLoader (the import swap alone)
    fastloader-native  its decode-and-transform line changed to fastloader.NativeTransform
"""
import pytest

import _suite as S

IMPL = {"torch": "torch", "fastloader": "auto", "fastloader-thread": "thread", "fastloader-process": "process"}


def EXCLUDE(params):
    """Deselected: forced worker modes at num_workers=0 (the loader then runs in the main thread: fastloader's run)."""
    return params.get("loader") in ("fastloader-thread", "fastloader-process") and params.get("workers") == 0


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader", "fastloader-thread", "fastloader-process",
                                             "torchdata"))
@pytest.mark.parametrize("dataset", ["numpy", "python"])
def test_python_dataset(bench, suite, dataset, workers, loader):
    """A Python Dataset (~1 ms a sample) under each DataLoader, samples/s"""
    import bench_python as BP

    batches = 3 if suite.quick else (suite.max_batches_opt or 60)
    cfg = dict(dataset=dataset, workers=workers, batches=batches)

    def config(ld):
        if ld == "torchdata":
            return S.Child(S.CHILDREN, "torchdata_python", cfg)
        return S.Child(S.script("bench_procworkers.py"), "child", dict(cfg, impl=IMPL[ld]))

    shape = f"{BP.BATCH_SIZE}x3x{BP.IMG_SHAPE[0]}x{BP.IMG_SHAPE[1]}" if dataset == "numpy" else f"{BP.BATCH_SIZE}x16"
    bench.run(config, unit="samples/s", expect=dict(shape=shape, dtype="float32", batches=batches))


CUSTOM = {"torch": "torch", "fastloader": "unchanged", "fastloader-native": "fastloader"}


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader", "fastloader-native"))
def test_custom_dataset(bench, sample, workers, loader):
    """A user's Pillow + torchvision v2 Dataset: torch, the import swap, the NativeTransform line, img/s"""
    import bench_custom as BC

    mb = bench.max_batches(16)

    def config(ld):
        return S.Child(S.script("bench_custom.py"), "child",
                       dict(impl=CUSTOM[ld], workers=workers, root=sample.root, max_batches=mb))

    bench.run(config, expect=dict(shape=f"{BC.BATCH_SIZE}x3x224x224", dtype="float32",
                                  batches=S.n_batches(sample.count, BC.BATCH_SIZE, mb)))
