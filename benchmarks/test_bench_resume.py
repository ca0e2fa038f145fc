"""What checkpointing the loader costs (bench_state.py's measurements), fastloader
against torchdata's StatefulDataLoader (torch's DataLoader has no state_dict()).

test_state_dict  DataLoader.state_dict() per call, mid-epoch with batches in
                 flight (map-style, shuffle with a seeded generator, batch 32):
                 the median of 20,000 calls per run
test_resume      a resume late in an ImageNet-sized epoch (1,281,167 indices,
                 batch 256, the state taken after 4,900 batches; no data is
                 loaded, so this is the loader's own cost): from building the
                 loader + load_state_dict() to the first batch; also checks that
                 the first batch after the resume is the one the original run
                 gave next
test_elastic_resume  the same index space under torch's DistributedSampler: 32
                 ranks take 100 batches of 256 each, then rank 5's state is
                 loaded by rank 5 of a 24-rank job (fastloader-elastic: the
                 samples no rank received dealt again) or of the same 32
                 (fastloader-same, torchdata-same): building the loader +
                 load_state_dict() to the first batch, checked against a
                 brute-force deal; the state's size
test_stream_resume  fastloader.WebDataset over the sample's shards (train
                 transform): resumed at the last batch (every position before it
                 read again and dropped undecoded) vs reading the whole epoch
"""
import pytest

import _suite as S


@pytest.mark.parametrize("loader", S.loaders("torchdata", "fastloader"))
def test_state_dict(bench, workers, loader):
    """state_dict() per call mid-epoch, us"""
    calls = 50 if bench.quick else 20000

    def config(ld):
        return S.Child(S.CHILDREN, "state_dict_child", dict(impl=ld, n=10000, batch_size=32, workers=workers,
                                                            calls=calls))

    bench.run(config, baseline="torchdata", unit="us", measure=S.field_s("call_s"),
              expect=dict(check=lambda r: None if r.get("state_bytes") else "an empty state"))


@pytest.mark.parametrize("loader", S.loaders("torchdata", "fastloader"))
def test_resume(bench, workers, loader):
    """load_state_dict() late in an epoch, to the first batch, ms"""
    if bench.quick:
        cfg = dict(n=20000, batch_size=256, k=60, reps=1)
    else:
        cfg = dict(n=1281167, batch_size=256, k=4900, reps=5)

    def config(ld):
        return S.Child(S.CHILDREN, "resume_child", dict(cfg, impl=ld, workers=workers))

    def check(r):
        return None if r.get("resume_ok") else "the first batch after the resume is not the one the run gave next"

    bench.run(config, baseline="torchdata", unit="ms", measure=S.field_s("ttfb_s"),
              expect=dict(shape=str(cfg["batch_size"]), dtype="int64", batches=2, check=check))


@pytest.mark.parametrize("loader", S.loaders("torchdata-same", "fastloader-same", "fastloader-elastic"))
def test_elastic_resume(bench, workers, loader):
    """A DistributedSampler state resumed on 24 ranks (elastic) or on the 32 it came from, ms to the first batch"""
    if bench.quick:
        cfg = dict(n=20000, batch_size=64, k=5, reps=1, world=8, world_to=6, rank=5)
    else:
        cfg = dict(n=1281167, batch_size=256, k=100, reps=5, world=32, world_to=24, rank=5)

    def config(ld):
        return S.Child(S.CHILDREN, "elastic_child", dict(cfg, impl=ld, workers=workers))

    def check(r):
        if not r.get("resume_ok"):
            return "the first batch after the resume is not the brute-force deal's"
        if loader.startswith("fastloader") and not 0 < r.get("state_bytes", 0) < 10_000:
            return f"the state is {r.get('state_bytes')} bytes as JSON (issue 22's bound: under 10 KB)"
        return None

    bench.run(config, baseline="torchdata-same", unit="ms", measure=S.field_s("ttfb_s"),
              expect=dict(shape=str(cfg["batch_size"]), dtype="int64", batches=2, check=check))


@pytest.mark.parametrize("loader", S.loaders("fastloader-same", "fastloader-elastic"))
def test_stream_elastic_resume(bench, workers, loader):
    """A WebDataset state resumed on 24 ranks (elastic: a re-deal) or on the 32 it came from, ms to the first batch"""
    if bench.quick:
        cfg = dict(n=20000, per=100, batch_size=64, k=5, reps=1, world=8, world_to=6, rank=5)
    else:
        cfg = dict(n=1281167, per=1000, batch_size=256, k=100, reps=5, world=32, world_to=24, rank=5)

    def config(ld):
        return S.Child(S.CHILDREN, "stream_elastic_child", dict(cfg, impl=ld, workers=workers))

    def check(r):
        if not r.get("resume_ok"):
            return "the first batch after the resume is not the plan's, or holds a sample an old rank received"
        if not 0 < r.get("state_bytes", 0) < 10_000:
            return f"the state is {r.get('state_bytes')} bytes as JSON (issue 22's bound: under 10 KB)"
        return None

    bench.run(config, baseline="fastloader-same", unit="ms", measure=S.field_s("ttfb_s"),
              expect=dict(shape=f"{cfg['batch_size']}x3x8x8", dtype="float32", batches=2, check=check))


@pytest.mark.parametrize("loader", S.loaders("fastloader-epoch", "fastloader-resume"))
def test_stream_resume(bench, sample, shards, workers, loader):
    """A shard stream resumed at its last batch vs the whole epoch, ms to the end of the epoch"""
    def config(ld):
        return S.Child(S.CHILDREN, "stream_resume_child",
                       dict(variant=ld.split("-")[1], shards=shards.files, batch_size=64, workers=workers))

    if loader == "fastloader-epoch":
        expect = dict(samples=sample.count, shape="64x3x224x224")
    else:   # the one batch after the resume is the epoch's last: short unless 64 divides the sample
        expect = dict(batches=1, shape=f"{sample.count % 64 or 64}x3x224x224")
    bench.run(config, baseline="fastloader-epoch", unit="ms", measure=S.field_s("total_s"),
              expect=dict(expect, dtype="float32"))
