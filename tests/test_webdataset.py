"""fastloader.WebDataset: tar shards through the native pipeline (csrc/sources/shards.h).

References: fastloader.ImageFolder over the same images (pixels and labels),
the webdataset library's ShardWriter (the layout), and the real nginx on
loopback (tests/nginx_server.py) for shards over HTTP and their faults.
"""
import io
import os
import tarfile
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from fastloader import transforms as T  # noqa: E402
from fastloader.tools.pack import pack_shards  # noqa: E402

N = 60          # samples
PER_SHARD = 10  # -> 6 shards

VAL = T.Compose([T.Resize(24), T.CenterCrop(20), T.ToTensor()])
TRAIN = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()])


def _jpeg(i, size=(28, 36)):
    from PIL import Image

    rng = np.random.default_rng(i)
    arr = (rng.integers(0, 255, (size[0], size[1], 3))).astype(np.uint8)
    b = io.BytesIO()
    Image.fromarray(arr).save(b, format="JPEG", quality=90)
    return b.getvalue()


def _add(tf, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tf.addfile(ti, io.BytesIO(data))


def write_shards(d, n=N, per=PER_SHARD, label=lambda i: i, image=_jpeg, extra=None):
    """Shards of n samples, `per` each; sample i: key %06d, .jpg, .cls = label(i)."""
    os.makedirs(d, exist_ok=True)
    paths = []
    for s in range(0, n, per):
        p = os.path.join(d, f"s-{s // per:04d}.tar")
        with tarfile.open(p, "w") as tf:
            for i in range(s, min(n, s + per)):
                _add(tf, f"{i:06d}.cls", str(label(i)).encode())
                _add(tf, f"{i:06d}.jpg", image(i))
                if extra:
                    extra(tf, i)
        paths.append(p)
    return paths


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(str(tmp_path_factory.mktemp("wds")))


def _all(ds, nw, bs=8, **kw):
    dl = fastloader.DataLoader(ds, batch_size=bs, num_workers=nw, **kw)
    imgs, labs = [], []
    for x, y in dl:
        imgs.append(x)
        labs.append(y)
    return torch.cat(imgs), torch.cat(labs), dl


def test_stream_order_and_pixels_equal_imagefolder(tmp_path):
    """Unshuffled, the stream is the pack order: pixels and labels equal
    ImageFolder's over the same folder, for 0 and 2 workers."""
    from PIL import Image

    root = tmp_path / "folder"
    for i in range(24):
        c = root / f"c{i % 3}"
        c.mkdir(parents=True, exist_ok=True)
        (c / f"{i:03d}.jpg").write_bytes(_jpeg(i))
    Image.fromarray(np.full((30, 30, 3), 90, np.uint8)).save(root / "c1" / "p.png")
    pack_shards(str(root), str(tmp_path / "sh"), shard_size=8000, shuffle_seed=None, progress=False)
    ref = fastloader.ImageFolder(str(root), transform=VAL)
    urls = sorted(str(p) for p in (tmp_path / "sh").glob("*.tar"))
    assert len(urls) > 1
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False)
    assert len(ds) == len(ref) == 25   # from index.json
    ri, rl, _ = _all(ref, 0)
    for nw in (0, 2):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            xi, xl, dl = _all(ds, nw)
        assert not [m for m in w if "Pillow" in str(m.message)]   # the PNG member is decoded in C
        assert torch.equal(xl, rl) and torch.equal(xi, ri)
        st = dl.stats()["stream"]
        assert st["samples"] == 25 and st["bytes"] > 0 and st["network_wait_s"] >= 0


def test_every_sample_once_whatever_num_workers(shards):
    ds = fastloader.WebDataset(shards, transform=TRAIN, shuffle=17, seed=4)
    assert len(ds) == N
    runs = {nw: _all(ds, nw, bs=7, seed=9)[:2] for nw in (0, 1, 3)}
    imgs0, labs0 = runs[0]
    assert sorted(labs0.tolist()) == list(range(N))          # each sample exactly once
    assert labs0.tolist() != list(range(N))                   # and shuffled
    for nw in (1, 3):
        assert torch.equal(runs[nw][1], labs0) and torch.equal(runs[nw][0], imgs0)


def test_epochs_reshuffle_and_repeat_deterministically(shards):
    ds = fastloader.WebDataset(shards, transform=VAL, shuffle=20, seed=1)
    dl = fastloader.DataLoader(ds, batch_size=10, num_workers=2)
    e0 = torch.cat([y for _, y in dl])
    e1 = torch.cat([y for _, y in dl])
    assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(N))
    assert e0.tolist() != e1.tolist()
    ds2 = fastloader.WebDataset(shards, transform=VAL, shuffle=20, seed=1)
    dl2 = fastloader.DataLoader(ds2, batch_size=10, num_workers=1)
    assert torch.equal(torch.cat([y for _, y in dl2]), e0)
    ds2.set_epoch(1)
    assert torch.equal(torch.cat([y for _, y in dl2]), e1)


def test_ranks_are_disjoint_covering_and_equal(shards):
    got = []
    for rank in range(2):
        ds = fastloader.WebDataset(shards, transform=VAL, shuffle=5, rank=rank, world_size=2)
        _, labs, dl = _all(ds, 2, bs=4)
        got.append(labs.tolist())
        assert len(dl) == 30 // 4 + 1
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == list(range(N))


def test_uneven_shards_give_equal_batch_counts(tmp_path):
    """5 shards over 2 ranks: one rank has 3 shards, the other 2, but both
    yield the nominal N/2 samples (the short rank goes round again)."""
    urls = write_shards(str(tmp_path), n=50, per=10)
    counts = []
    for rank in range(2):
        ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, rank=rank, world_size=2, epoch_length=50)
        _, labs, dl = _all(ds, 2, bs=5, drop_last=True)
        counts.append((len(dl), len(labs)))
        st = dl.stats()["stream"]
        if len(ds.shards_for(0)) == 2:
            assert st["passes"] == 1   # 20 samples in its shards, 25 to give
            assert len(set(labs.tolist())) == 20
        else:
            assert len(set(labs.tolist())) == 25
    assert counts == [(5, 25), (5, 25)]


def test_brace_patterns_and_pipe_urls(shards):
    d = os.path.dirname(shards[0])
    ds = fastloader.WebDataset(os.path.join(d, "s-{0000..0005}.tar"), transform=VAL, shuffle=0, shardshuffle=False)
    assert ds.urls == shards
    labs = _all(ds, 1)[1]
    assert labs.tolist() == list(range(N))
    piped = fastloader.WebDataset([f"pipe:cat {p}" for p in shards], transform=VAL, shuffle=0, shardshuffle=False,
                                  epoch_length=N)
    assert torch.equal(_all(piped, 2)[1], labs)
    with pytest.raises(ValueError, match="epoch_length"):
        fastloader.WebDataset([f"pipe:cat {p}" for p in shards])


def test_reads_shards_written_by_the_webdataset_library(tmp_path):
    wds = pytest.importorskip("webdataset")
    pattern = str(tmp_path / "w-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=7) as w:
        for i in range(20):
            w.write({"__key__": f"k{i:04d}", "jpg": _jpeg(i), "cls": str(i % 4).encode()})
    urls = sorted(str(p) for p in tmp_path.glob("w-*.tar"))
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False)
    assert len(ds) == 20
    labs = _all(ds, 2, bs=6)[1]
    assert labs.tolist() == [i % 4 for i in range(20)]


def test_label_from_a_json_field_and_no_label(tmp_path):
    import json

    def extra(tf, i):
        _add(tf, f"{i:06d}.json", json.dumps({"name": f"n{i}", "label": 100 + i}).encode())

    urls = write_shards(str(tmp_path), n=12, per=6, extra=extra)
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, label="json:label")
    assert _all(ds, 1)[1].tolist() == [100 + i for i in range(12)]
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, label=None)
    assert _all(ds, 0)[1].tolist() == [-1] * 12


def test_a_sample_without_an_image_follows_on_error(tmp_path):
    def image(i):
        return b"not an image at all" if i == 7 else _jpeg(i)

    urls = write_shards(str(tmp_path / "a"), n=20, per=10, image=image)
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False)
    with pytest.raises(fastloader.DecodeError) as e:
        _all(ds, 2, bs=5)
    assert "s-0000.tar: 000007" in str(e.value) and "not a JPEG" in str(e.value)
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, on_error="skip")
    labs = _all(ds, 2, bs=5)[1].tolist()
    assert labs == [i for i in range(20) if i != 7]
    with pytest.raises(ValueError, match="replace"):
        fastloader.WebDataset(urls, on_error="replace")


def test_member_without_image_extension_names_the_key(tmp_path):
    p = tmp_path / "x.tar"
    with tarfile.open(p, "w") as tf:
        _add(tf, "a.cls", b"1")
        _add(tf, "a.jpg", _jpeg(1))
        _add(tf, "b.cls", b"2")
        _add(tf, "b.txt", b"hello")
    ds = fastloader.WebDataset([str(p)], transform=VAL, shuffle=0, epoch_length=2)
    with pytest.raises(fastloader.DecodeError, match=r"x\.tar: b: no image member .* \.cls \.txt"):
        _all(ds, 0, bs=2)


def test_truncated_shard_raises_or_is_skipped(tmp_path):
    urls = write_shards(str(tmp_path), n=30, per=10)
    data = open(urls[1], "rb").read()
    with open(urls[1], "wb") as f:
        f.write(data[: len(data) // 2 + 100])
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, epoch_length=30)
    with pytest.raises(ValueError) as e:
        _all(ds, 2, bs=5)
    assert "s-0001.tar" in str(e.value)
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, epoch_length=30,
                               on_shard_error="skip")
    with pytest.warns(UserWarning, match="skipped the rest of shard .*s-0001.tar"):
        labs, dl = _all(ds, 2, bs=5)[1:]
    labs = labs.tolist()
    assert len(labs) == 30                      # the nominal length, by going round again
    assert set(range(0, 10)) <= set(labs) and set(range(20, 30)) <= set(labs)
    assert ds.skipped_shards and "s-0001.tar" in ds.skipped_shards[0][0]
    assert dl.stats()["stream"]["shards_skipped"] >= 1


def test_missing_shard_names_it(tmp_path):
    urls = write_shards(str(tmp_path), n=10, per=10) + [str(tmp_path / "nope.tar")]
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, epoch_length=20)
    with pytest.raises(FileNotFoundError, match="nope.tar"):
        _all(ds, 1, bs=5)


def test_break_and_iterate_again(shards):
    ds = fastloader.WebDataset(shards, transform=VAL, shuffle=10, ring=16)
    dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2)
    for _ in range(3):
        it = iter(dl)
        next(it)
        del it
    assert sorted(torch.cat([y for _, y in dl]).tolist()) == list(range(N))


def test_refuses_what_a_stream_cannot_do(shards):
    ds = fastloader.WebDataset(shards, transform=VAL)
    with pytest.raises(TypeError, match="stream"):
        ds[0]
    with pytest.raises(ValueError, match="collate_fn"):
        iter(fastloader.DataLoader(ds, batch_size=4, collate_fn=lambda b: b))
    with pytest.raises(ValueError, match="ranks"):
        fastloader.WebDataset(shards[:1], rank=0, world_size=2, epoch_length=10)


def test_torch_dataloader_iterates_it_in_process(shards):
    ds = fastloader.WebDataset(shards, transform=VAL, shuffle=0, shardshuffle=False)
    labs = [int(y) for _, y in torch.utils.data.DataLoader(ds, batch_size=None)]
    assert labs == list(range(N))


# -- over HTTP, against the real nginx ------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    return write_shards(str(tmp_path_factory.mktemp("served")), n=40, per=10)


def _put(nginx, paths, prefix):
    names = []
    for p in paths:
        name = f"{prefix}/{os.path.basename(p)}"
        nginx.put(name, open(p, "rb").read())
        names.append(name)
    return names


def test_http_equals_local(nginx, served):
    names = _put(nginx, served, "eq")
    local = fastloader.WebDataset(served, transform=TRAIN, shuffle=8, seed=2)
    remote = fastloader.WebDataset([nginx.url(n) for n in names], transform=TRAIN, shuffle=8, seed=2,
                                   epoch_length=40)
    a = _all(local, 2, bs=5, seed=1)
    b = _all(remote, 2, bs=5, seed=1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert b[2].stats()["stream"]["bytes"] == sum(os.path.getsize(p) for p in served)


def test_http_404_names_the_url(nginx, served):
    names = _put(nginx, served[:1], "n404")
    urls = [nginx.url(names[0]), nginx.url("n404/missing.tar")]
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, epoch_length=20)
    with pytest.raises(OSError, match=r"missing\.tar.*404"):
        _all(ds, 1, bs=5)


def test_http_500_is_retried_then_fails(nginx):
    ds = fastloader.WebDataset([nginx.url("fault/500/x.tar")], transform=VAL, epoch_length=4, retries=2,
                               backoff=0.01)
    with pytest.raises(OSError, match="500"):
        _all(ds, 1, bs=2)
    # nginx logs a request after its last byte, so the client can see the third
    # 500 before its line is written: wait for it, then ask for exactly three
    reqs = nginx.wait_requests(lambda r: sum("fault/500/x.tar" in q["uri"] for q in r) >= 3)
    assert sum(1 for r in reqs if "fault/500/x.tar" in r["uri"]) == 3


def test_http_reset_mid_shard_resumes_with_range(nginx, fault_proxy, served):
    names = _put(nginx, served[:2], "reset")
    fault_proxy.plan("reset", 3000)
    urls = [fault_proxy.url(n) for n in names]
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, epoch_length=20, backoff=0.01)
    labs, dl = _all(ds, 2, bs=5)[1:]
    assert labs.tolist() == list(range(20))
    assert any(r and r.startswith("bytes=") for r in fault_proxy.ranges())
    assert dl.stats()["stream"]["retries"] >= 1


def test_http_stall_resumes(nginx, fault_proxy, served):
    names = _put(nginx, served[:1], "stall")
    fault_proxy.plan("stall", 2000)
    ds = fastloader.WebDataset([fault_proxy.url(names[0])], transform=VAL, shuffle=0, epoch_length=10,
                               stall_timeout=0.5, backoff=0.01)
    labs = _all(ds, 1, bs=5)[1]
    assert sorted(labs.tolist()) == list(range(10))
    assert any(r and r.startswith("bytes=") for r in fault_proxy.ranges())


def test_num_workers_auto_and_stats(shards):
    ds = fastloader.WebDataset(shards, transform=VAL, shuffle=9)
    _, labs, dl = _all(ds, "auto", bs=6)
    assert sorted(labs.tolist()) == list(range(N))
    st = dl.stats()
    assert st["stream"]["samples"] == N and st["stream"]["bytes_per_s"] > 0
    assert st["stages_s"]["decode_s"] > 0


TORCHRUN = """
import os, sys, torch, torch.distributed as dist
import fastloader
from fastloader import transforms as FT
dist.init_process_group("gloo")
rank = dist.get_rank()
urls, out = sys.argv[1].split(","), sys.argv[2]
ds = fastloader.WebDataset(urls, transform=FT.Compose([FT.RandomResizedCrop(16), FT.ToTensor()]), shuffle=7,
                           epoch_length=int(sys.argv[3]))
dl = fastloader.DataLoader(ds, batch_size=4, num_workers=2, drop_last=True)
res = {}
for epoch in range(2):
    labs = [y for _, y in dl]
    n = torch.tensor([len(labs)])
    dist.all_reduce(n)            # every rank reaches this with the same count, or DDP would hang
    res[epoch] = (len(labs), torch.cat(labs).tolist())
torch.save(res, os.path.join(out, f"rank{rank}.pt"))
dist.barrier()
dist.destroy_process_group()
"""


def test_torchrun_two_ranks_disjoint_covering_equal(tmp_path):
    import socket
    import subprocess
    import sys

    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    urls = write_shards(str(tmp_path / "sh"), n=48, per=8)      # 6 shards: 3 per rank
    uneven = write_shards(str(tmp_path / "un"), n=40, per=8)    # 5 shards: 3 and 2
    script = tmp_path / "run.py"
    script.write_text(TORCHRUN)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(fastloader.__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([pkg_parent, os.environ.get("PYTHONPATH", "")]))
    for name, us, n in (("even", urls, 48), ("uneven", uneven, 40)):
        out = tmp_path / name
        out.mkdir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={port}", str(script), ",".join(us), str(out), str(n)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        r = [torch.load(out / f"rank{k}.pt") for k in range(2)]
        for epoch in range(2):
            (b0, l0), (b1, l1) = r[0][epoch], r[1][epoch]
            assert b0 == b1 == n // 2 // 4                      # equal batch counts
            if name == "even":
                assert not set(l0) & set(l1)                     # disjoint
                assert sorted(l0 + l1) == list(range(n))         # covering
        assert r[0][0][1] != r[0][1][1]                          # a new order each epoch


def test_other_members_handed_through_as_bytes(tmp_path):
    import json

    def extra(tf, i):
        if i % 5:
            _add(tf, f"{i:06d}.txt", f"caption {i}".encode())
        _add(tf, f"{i:06d}.json", json.dumps({"i": i}).encode())

    def image(i):
        return b"broken" if i == 8 else _jpeg(i)

    urls = write_shards(str(tmp_path), n=20, per=10, extra=extra, image=image)
    for nw in (0, 2):
        ds = fastloader.WebDataset(urls, transform=VAL, shuffle=6, fields=("txt", "json"), on_error="skip")
        dl = fastloader.DataLoader(ds, batch_size=6, num_workers=nw)
        n = 0
        for x, y, f in dl:
            assert len(f["txt"]) == len(f["json"]) == len(y) == len(x)
            for lab, t, j in zip(y.tolist(), f["txt"], f["json"]):
                assert json.loads(j) == {"i": lab}
                assert t == (f"caption {lab}".encode() if lab % 5 else None)
            n += len(y)
        assert n == 19    # sample 8 skipped, with its fields
    # torch's own DataLoader over the stream: one sample at a time, with its fields
    ds = fastloader.WebDataset(urls, transform=VAL, shuffle=0, shardshuffle=False, fields=("txt",), on_error="skip")
    got = [(int(y), f["txt"]) for _, y, f in ds]
    assert [g[0] for g in got] == [i for i in range(20) if i != 8]
    assert got[1] == (1, b"caption 1") and got[0] == (0, None)
