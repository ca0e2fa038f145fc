"""Native datasets (ImageFolder, LMDBDataset) under torchrun (2 processes,
gloo on CPU) with DistributedSampler."""
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import fastloader  # noqa: E402
from fastloader.tools.sample import make_sample  # noqa: E402
from helpers_distributed import torchrun  # noqa: E402
from helpers_pipelines import train_tf  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    import fastloader
    from fastloader import transforms as FT
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    tf = FT.Compose([FT.RandomResizedCrop(64), FT.RandomHorizontalFlip(), FT.ToTensor()])
    ds = (fastloader.LMDBDataset if kind == "lmdb" else fastloader.ImageFolder)(root, transform=tf)
    sampler = torch.utils.data.DistributedSampler(ds, shuffle=True, seed=3)
    dl = fastloader.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, seed=7)
    result = {}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        idx = list(sampler)
        batches = [x for x, _ in dl]
        result[epoch] = (idx, torch.cat(batches), len(batches))
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("kind", ["folder", "lmdb"])
def test_two_ranks_shard_and_augment_like_one_process(tmp_path, kind):
    root = tmp_path / "data"
    make_sample(str(root), n=30, classes=3, seed=5, progress=False, processes=1)
    data = root
    if kind == "lmdb":  # the same images packed: each rank reads the one LMDB file
        from fastloader.tools.pack_lmdb import pack_lmdb

        data = tmp_path / "data.lmdb"
        pack_lmdb(root, data)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    torchrun(script, data, tmp_path, kind, timeout=240)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    tf = train_tf(64, norm=None)  # the script's
    ds = fastloader.ImageFolder(str(root), transform=tf)
    for epoch in range(2):
        i0, x0, n0 = ranks[0][epoch]
        i1, x1, n1 = ranks[1][epoch]
        assert not set(i0) & set(i1) or len(ds) % 2  # DistributedSampler pads only odd sizes
        assert set(i0) | set(i1) == set(range(len(ds)))
        assert n0 == n1 == 4  # 15 samples per rank in batches of 4: equal batch counts
        # each sample's augmentation equals a single-process ImageFolder load
        # with the same seed and epoch (for the LMDB too)
        for idx, x in ((i0, x0), (i1, x1)):
            ref, _ = ds.load_batch(idx, epoch=epoch, seed=7)
            assert torch.equal(x, ref)
    # epochs differ
    assert not torch.equal(ranks[0][0][1], ranks[0][1][1])
