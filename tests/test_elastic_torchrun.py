"""Elastic resume on real ranks: torchrun processes on gloo, started and
stopped by the tests.  A job checkpoints mid-epoch and comes back on another
number of ranks (4 -> 2 from one rank's state, 4 -> 3 from every rank's,
1 -> 4), and a job with a rank SIGKILLed mid-epoch restarts on fewer ranks;
for a native ImageFolder and a Python map-style dataset in thread and process
workers, and WebDataset tar shards (4 -> 2, 4 -> 3, 1 -> 4).  Each time the epoch's samples are delivered exactly once over the
whole run (plus DistributedSampler's padding copies, which are perm's head),
each with the uninterrupted run's tensor, and the next epoch is the
uninterrupted run's on the new topology.  The in-process twin of these
tests, with more cases, is test_elastic.py."""
import collections
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from fastloader import elastic as E  # noqa: E402
from helpers_distributed import child_env, free_port  # noqa: E402
from helpers_elastic import (N, SAMPLER_SEED, make_wds, reference, uninterrupted, wds_reference,  # noqa: E402
                             wds_samples, write_images, write_wds)

pytestmark = [pytest.mark.fastloader_only,
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="torch.distributed with gloo is not available")]

KINDS = {"native": ("native", "thread"), "thread": ("python", "thread"), "process": ("python", "process")}

JOB = textwrap.dedent("""
    import os, signal, sys, torch, torch.distributed as dist
    from helpers_elastic import make, make_wds, samples, wds_samples
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    what, out, paths, arg = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
    shards = sys.argv[5].split(",") if len(sys.argv) > 5 else []
    KINDS = {"native": ("native", "thread"), "thread": ("python", "thread"), "process": ("python", "process")}
    if shards:
        KINDS["wds"] = ("wds", "thread")
    def build(kind, mode):
        if kind == "wds":   # rank and world size from the process group
            return make_wds(shards, W, rank)
        return make(kind, paths, W, rank, mode=mode)
    def take(batch, kind):
        return wds_samples(batch) if kind == "wds" else samples(batch, kind)
    if what == "save":        # every kind: K batches a rank, then each rank's state and all of them
        for name, (kind, mode) in KINDS.items():
            s, dl = build(kind, mode)
            if s is not None:
                s.set_epoch(0)
            it = iter(dl)
            got = [take(next(it), kind) for _ in range(int(arg))]
            state = dl.state_dict()
            every = [None] * W
            dist.all_gather_object(every, state)
            torch.save({"got": got, "state": state, "all": every}, f"{out}/{name}_{rank}.pt")
            del it, dl
    elif what == "resume":    # load rank 0's state ("one") or every rank's ("all"), then 2 epochs
        src, which = arg.split(":")
        for name, (kind, mode) in KINDS.items():
            if not os.path.exists(f"{src}/{name}_0.pt"):
                continue
            ck = torch.load(f"{src}/{name}_0.pt")
            s, dl = build(kind, mode)
            dl.load_state_dict(ck["loader"] if "loader" in ck else ck["state"] if which == "one" else ck["all"])
            eps = []
            for e in range(2):
                if s is not None:
                    s.set_epoch(e)
                eps.append([take(b, kind) for b in dl])
            torch.save(eps, f"{out}/{name}_{rank}.pt")
    elif what == "train":     # a checkpoint after every step, rank 1 SIGKILLed after step K's
        s, dl = make("native", paths, W, rank)
        s.set_epoch(0)
        log = []
        for step, b in enumerate(dl):
            log.append(samples(b, "native"))
            torch.save(log, f"{out}/seen_{rank}.tmp")
            os.replace(f"{out}/seen_{rank}.tmp", f"{out}/seen_{rank}.pt")
            dist.barrier()        # the step's all-reduce: the ranks are in lockstep
            if rank == 0:
                torch.save({"loader": dl.state_dict(), "step": step}, f"{out}/native_0.tmp")
                os.replace(f"{out}/native_0.tmp", f"{out}/native_0.pt")
            dist.barrier()
            if step == int(arg) and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)   # workers busy, batches prefetched
""")


def _torchrun(tmp_path, nproc, *args, check=True):
    script = tmp_path / "job.py"
    if not script.exists():
        script.write_text(JOB)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(script), *map(str, args)]
    proc = subprocess.run(cmd, env=child_env(os.path.dirname(__file__)), capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("elastic_run"))


@pytest.fixture(scope="module")
def refs(paths):
    return {name: reference(kind, paths) for name, (kind, _) in KINDS.items()}


def _check(before, after, ref, pads):
    """before: what each old rank received; after: per new rank, per epoch,
    batches.  Each index once over the epoch (plus `pads` copies of perm's
    head), each the uninterrupted run's tensor."""
    flat = [s for rank in before for b in rank for s in b] + [s for rank in after for b in rank[0] for s in b]
    c = collections.Counter(i for i, _ in flat)
    assert sorted(c) == list(range(N))
    extra = sorted(i for i, k in c.items() for _ in range(k - 1))
    assert extra == sorted(E.epoch_perm(N, True, SAMPLER_SEED, 0)[:pads].tolist()), extra
    for i, t in flat:
        assert torch.equal(t, ref[i]), i


def _next_epoch(after, kind, paths, W):
    want = uninterrupted(kind, paths, W, 1)
    for r in range(W):
        assert [[i for i, _ in b] for b in after[r][1]] == [[i for i, _ in b] for b in want[r]]
        assert all(torch.equal(s, t) for b, c in zip(after[r][1], want[r]) for (_, s), (_, t) in zip(b, c))


def test_four_ranks_resume_on_two_and_on_three(tmp_path, paths, refs):
    """4 ranks take 2 batches of 3 each (24 of 40); rank 0's state alone
    resumes on 2 ranks (8 each), every rank's state on 3 (6 each, 2 copies).
    WebDataset shards too: the 16 samples no rank received, dealt again
    (on 3 ranks: 5 each, one left out, as an epoch's remainder is)."""
    save = tmp_path / "save"
    save.mkdir()
    shards = ",".join(write_wds(tmp_path / "wds"))
    wref = wds_reference(shards.split(","))
    _torchrun(tmp_path, 4, "save", save, ",".join(paths), 2, shards)
    wds_before = [s for r in range(4) for b in torch.load(save / f"wds_{r}.pt")["got"] for s in b]
    assert len({lab for lab, _ in wds_before}) == 24
    before = {name: [torch.load(save / f"{name}_{r}.pt")["got"] for r in range(4)] for name in KINDS}
    for W2, which, pads in ((2, "one", 0), (3, "all", 2)):
        out = tmp_path / f"on{W2}"
        out.mkdir()
        _torchrun(tmp_path, W2, "resume", out, ",".join(paths), f"{save}:{which}", shards)
        wds = [torch.load(out / f"wds_{r}.pt") for r in range(W2)]
        rest = [s for r in wds for b in r[0] for s in b]
        labels = [lab for lab, _ in rest + wds_before]
        assert len(rest) == 16 // W2 * W2 and len(set(labels)) == len(labels)
        for lab, x in rest + wds_before:   # each sample's tensor: the uninterrupted run's
            assert torch.equal(x, wref[lab]), lab
        for r in range(W2):   # the next epoch: the new topology's own, pixels too
            _, dl = make_wds(shards.split(","), W2, r)
            list(dl)
            want = [wds_samples(b) for b in dl]
            assert [[lab for lab, _ in b] for b in wds[r][1]] == [[lab for lab, _ in b] for b in want]
            assert all(torch.equal(x, y) for b, c in zip(wds[r][1], want) for (_, x), (_, y) in zip(b, c))
        for name, (kind, _) in KINDS.items():
            after = [torch.load(out / f"{name}_{r}.pt") for r in range(W2)]
            _check(before[name], after, refs[name], pads)
            _next_epoch(after, kind, paths, W2)


def test_one_rank_resumes_on_four(tmp_path, paths, refs):
    """torchrun with one process (DistributedSampler of 1) after 5 batches;
    resumed on 4: the 25 left dealt 7 a rank (3 copies).  WebDataset shards:
    the 25 left, 6 a rank (one left out, an epoch's remainder), each with
    the uninterrupted run's pixels."""
    save = tmp_path / "save"
    save.mkdir()
    shards = ",".join(write_wds(tmp_path / "wds"))
    wref = wds_reference(shards.split(","))
    _torchrun(tmp_path, 1, "save", save, ",".join(paths), 5, shards)
    out = tmp_path / "on4"
    out.mkdir()
    _torchrun(tmp_path, 4, "resume", out, ",".join(paths), f"{save}:one", shards)
    wds_before = [s for b in torch.load(save / "wds_0.pt")["got"] for s in b]
    rest = [s for r in range(4) for b in torch.load(out / f"wds_{r}.pt")[0] for s in b]
    labels = [lab for lab, _ in wds_before + rest]
    assert len(wds_before) == 15 and len(rest) == 24 and len(set(labels)) == len(labels)
    assert all(torch.equal(x, wref[lab]) for lab, x in wds_before + rest)
    for name, (kind, _) in KINDS.items():
        before = [torch.load(save / f"{name}_0.pt")["got"]]
        after = [torch.load(out / f"{name}_{r}.pt") for r in range(4)]
        _check(before, after, refs[name], 3)
        _next_epoch(after, kind, paths, 4)


def test_rank_killed_mid_epoch_restarts_on_fewer_ranks(tmp_path, paths, refs):
    """4 ranks checkpoint after every step; rank 1 is SIGKILLed after step
    1's checkpoint (torchrun then stops the job); the job restarts on 2
    ranks from the last checkpoint: with what the ranks had received up to
    it, every sample once, nothing lost, nothing repeated."""
    run = tmp_path / "run"
    run.mkdir()
    proc = _torchrun(tmp_path, 4, "train", run, ",".join(paths), 1, check=False)
    assert proc.returncode != 0 and "SIGKILL" in proc.stderr, proc.stderr[-3000:]
    ck = torch.load(run / "native_0.pt")
    assert ck["step"] == 1
    before = [torch.load(run / f"seen_{r}.pt")[:2] for r in range(4)]   # steps 0 and 1: up to the checkpoint
    assert all(len(b) == 2 for b in before)
    out = tmp_path / "on2"
    out.mkdir()
    _torchrun(tmp_path, 2, "resume", out, ",".join(paths), f"{run}:one")
    after = [torch.load(out / f"native_{r}.pt") for r in range(2)]
    _check(before, after, refs["native"], 0)
    _next_epoch(after, "native", paths, 2)
