"""The textbook image pipelines over an image folder: what ``python -m fastloader bench``
and bench_images.py measure (harness.pipeline_child), as pytest benchmarks.

  torch       torchvision.datasets.ImageFolder(root, transform=torchvision.transforms.Compose([...]))
              + torch.utils.data.DataLoader(ds, batch_size=64, num_workers=k, shuffle=True)
  fastloader  fastloader.ImageFolder(root, transform=fastloader.transforms.Compose([...]))
              + fastloader.DataLoader(ds, batch_size=64, num_workers=k, shuffle=True)
  torchdata   torch's side under torchdata's StatefulDataLoader (when torchdata is installed)

train: RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize;
val: Resize(256) + CenterCrop(224) + ToTensor + Normalize.  One epoch of the
sample per run (--bench-max-batches caps it), torch.set_num_threads(1) in
every measured process, a batch held until the next arrives.
"""
import pytest

import _suite as S

BATCH = 64


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader", "torchdata"))
@pytest.mark.parametrize("pipeline", ["train", "val"])
def test_pipeline(bench, sample, pipeline, workers, loader):
    """ImageFolder + DataLoader, the textbook train/val pipelines, img/s"""
    mb = bench.max_batches(None)
    cfg = dict(root=sample.root, pipeline=pipeline, workers=workers, batch_size=BATCH, epochs=1, max_batches=mb,
               torch_threads=1, hold_batch=True)

    def config(ld):
        if ld == "torchdata":
            return S.Child(S.CHILDREN, "torchdata_pipeline", cfg)
        return S.Child(S.HARNESS, "pipeline_child", dict(cfg, impl=ld))

    bench.run(config, expect=dict(shape=f"{BATCH}x3x224x224", dtype="float32",
                                  batches=S.n_batches(sample.count, BATCH, mb)))
