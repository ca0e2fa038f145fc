"""Where data really lives: the sample images from an LMDB, from tar shards
(local and over HTTP from a real nginx on loopback), from memory-mapped arrays
and from a Hugging Face `datasets` table, each side by side with the torch way
of reading the same data.  The converted copies are made once from the sample
and kept (under the cache, as bench_sources.py / bench_hf.py keep them); the
page cache is warmed first, so these compare loaders, not disks.

test_storage  (bench_sources.py's child) the train pipeline over the same images:
    torch              torchvision ImageFolder + torch DataLoader over the JPEG files
    fastloader         fastloader.ImageFolder over the JPEG files
    fastloader-lmdb    fastloader.LMDBDataset over one LMDB file (pack_lmdb)
test_shards  (bench_shards.py's child) tar shards, train pipeline, shuffle buffer 1000, one epoch:
    webdataset         the webdataset library + torch DataLoader (local files): the baseline
    fastloader         fastloader.WebDataset over the local shards
    fastloader-http    the same shards over HTTP (nginx on loopback)
test_arrays  (bench_arrays.py's child) memory-mapped .npy files, batch 256:
    tokens  int64 token rows: torch's TensorDataset vs fastloader.ArrayDataset
    images  uint8 64x64 images, RandomResizedCrop(56) + flip + normalize: torchvision v2 per sample vs
            ArrayDataset's native pipeline
test_formats  (bench_formats.py's folders; the harness's pipeline_child) the sample's images as PNG
    and as lossy WebP, train pipeline:
    torch              torchvision ImageFolder (Pillow) + torch DataLoader
    fastloader         fastloader.ImageFolder (libspng / libwebp in C)
test_hf  (bench_hf.py's child) a `datasets` table with the JPEG bytes embedded, train pipeline:
    torch              load_from_disk(...).with_transform(torchvision on PIL images) + torch DataLoader
    fastloader         fastloader.HFImageDataset(load_from_disk(...)) + fastloader.DataLoader
    fastloader-folder  fastloader.ImageFolder over the same JPEG files
"""
import pytest

import _suite as S

BATCH = 64


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader", "fastloader-lmdb"))
def test_storage(bench, sample, lmdb_path, workers, loader):
    """The same images as JPEG files and as an LMDB, img/s"""
    mb = bench.max_batches(None)

    def config(ld):
        if ld == "torch":
            return S.Child(S.HARNESS, "pipeline_child", dict(impl="torch", root=sample.root, pipeline="train",
                                                             workers=workers, batch_size=BATCH, epochs=1,
                                                             max_batches=mb, torch_threads=1, hold_batch=True))
        src, path = ("lmdb", lmdb_path) if ld == "fastloader-lmdb" else ("folder", sample.root)
        return S.Child(S.script("bench_sources.py"), "child",
                       dict(source=src, path=path, pipeline="train", workers=workers, batch_size=BATCH, seed=0,
                            max_batches=mb))

    bench.run(config, expect=dict(shape=f"{BATCH}x3x224x224", dtype="float32",
                                  batches=S.n_batches(sample.count, BATCH, mb)))


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader"))
@pytest.mark.parametrize("fmt", ["png", "webp"])
def test_formats(bench, sample, workers, loader, fmt):
    """PNG and WebP image folders: torchvision + Pillow vs fastloader's C decoders, img/s"""
    import os

    import bench_formats as BF

    work = os.path.join(os.environ.get("FASTLOADER_CACHE") or os.path.expanduser("~/.cache/fastloader"), "formats")
    os.makedirs(work, exist_ok=True)
    root = BF.prepare(sample.root, work, sample.count)[fmt]
    mb = bench.max_batches(None)

    def config(ld):
        return S.Child(S.HARNESS, "pipeline_child", dict(impl=ld, root=root, pipeline="train", workers=workers,
                                                         batch_size=BATCH, epochs=1, max_batches=mb,
                                                         torch_threads=1, hold_batch=True))

    bench.run(config, expect=dict(shape=f"{BATCH}x3x224x224", dtype="float32",
                                  batches=S.n_batches(sample.count, BATCH, mb)))


@pytest.mark.parametrize("loader", S.loaders("webdataset", "fastloader", "fastloader-http"))
def test_shards(bench, sample, shards, shard_server, workers, loader):
    """Tar shards: the webdataset library + torch DataLoader vs fastloader.WebDataset, local and over HTTP, img/s"""
    urls = {"webdataset": shards.files, "fastloader": shards.files,
            "fastloader-http": [shard_server.url(f.rsplit("/", 1)[-1]) for f in shards.files]}
    impl = {"webdataset": "webdataset", "fastloader": "fastloader-local", "fastloader-http": "fastloader-http"}

    def config(ld):
        return S.Child(S.script("bench_shards.py"), "child",
                       dict(impl=impl[ld], workers=workers, urls=urls[ld], root=sample.root, n=sample.count))

    # one epoch of a stream: the count is of samples (each worker's last batch may be partial)
    bench.run(config, baseline="webdataset", expect=dict(shape=f"{BATCH}x3x224x224", dtype="float32",
                                                         samples=sample.count))


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader"))
@pytest.mark.parametrize("dataset", ["tokens", "images"])
def test_arrays(bench, arrays, dataset, workers, loader):
    """Memory-mapped .npy arrays: TensorDataset / torchvision v2 vs fastloader.ArrayDataset, samples/s"""
    import bench_arrays as BA

    bs = BA.BATCH_SIZE
    rows = arrays.tokens[0] if dataset == "tokens" else arrays.images[0]
    # bench_arrays.py: tokens one epoch, images three
    epochs = 1 if bench.quick or dataset == "tokens" else 3
    mb = bench.max_batches(None)
    cfg = dict(dataset=dataset, workers=workers, dir=arrays.dir, epochs=epochs, max_batches=mb)

    def config(ld):
        return S.Child(S.script("bench_arrays.py"), "child", dict(cfg, impl=ld))

    shape, dtype = ((f"{bs}x{arrays.tokens[1]}", "int64") if dataset == "tokens"
                    else (f"{bs}x3x{BA.CROP}x{BA.CROP}", "float32"))
    bench.run(config, unit="samples/s",
              expect=dict(shape=shape, dtype=dtype, batches=S.n_batches(rows, bs, mb, epochs=epochs)))


@pytest.mark.parametrize("loader", S.loaders("torch", "fastloader", "fastloader-folder"))
def test_hf(bench, sample, hf_table, workers, loader):
    """A Hugging Face image table: with_transform + torch DataLoader vs fastloader.HFImageDataset, img/s"""
    mb = bench.max_batches(15)
    name = {"torch": "hf-torch", "fastloader": "hf", "fastloader-folder": "folder"}

    def config(ld):
        return S.Child(S.script("bench_hf.py"), "child",
                       dict(loader=name[ld], path=sample.root if ld == "fastloader-folder" else hf_table,
                            pipeline="train", workers=workers, seed=0, max_batches=mb))

    bench.run(config, expect=dict(shape=f"{BATCH}x3x224x224", dtype="float32",
                                  batches=S.n_batches(sample.count, BATCH, mb)))
