"""What each batch costs the training loop's own process: torch's worker
processes vs fastloader's worker_mode="process", on bench_python.py's
pure-Python dataset (batch_size 32, 2 workers, 200 batches).

The CPU time of the main process (RUSAGE_SELF: the loop, receiving and
unpickling batches, torch's fd passing; not the workers) per batch after the
first.  This is what bounds a loader once enough cores keep its workers
busy: the main process cannot hand out more than 1 / (that time) batches a
second.

    PYTHONPATH=. python benchmarks/bench_main_cpu.py [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import bench_python as BP  # noqa: E402

BATCHES = 200


def child(cfg):
    import resource
    import time

    import torch

    torch.set_num_threads(1)
    ds = BP.PythonDataset(BATCHES * BP.BATCH_SIZE)
    if cfg["impl"] == "torch":
        import torch.utils.data

        dl = torch.utils.data.DataLoader(ds, batch_size=BP.BATCH_SIZE, shuffle=True, num_workers=2)
    else:
        fl = C.import_fastloader("DataLoader")
        dl = fl.DataLoader(ds, batch_size=BP.BATCH_SIZE, shuffle=True, num_workers=2, worker_mode="process")
    it = iter(dl)
    next(it)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n = 0
    for _ in it:
        n += 1
    el = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"rate": n * BP.BATCH_SIZE / el, "main_ms_per_batch": 1000.0 * cpu / n}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args(argv)
    script = os.path.abspath(__file__)
    groups = [(("python", 2), [(i, dict(impl=i)) for i in ("torch", "process")])]
    res = C.run_interleaved(groups, a.rounds, lambda cfg: C.run_child(script, cfg, mem_interval=0))
    rep = C.Report("Main-process CPU per batch: torch's workers vs worker_mode='process'")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- bench_python's pure-Python dataset, batch_size {BP.BATCH_SIZE}, 2 workers, {BATCHES} batches, "
            f"{a.rounds} interleaved round(s), each run in a fresh process")
    rep.add("")
    rows = []
    for i in ("torch", "process"):
        rs = res[(("python", 2), i)]
        rows.append([i, C.fmt(C.median_of(rs, "rate")), f"{C.median_of(rs, 'main_ms_per_batch'):.3f}"])
    rep.add(C.markdown_table(["loader", "samples/s", "main-process CPU ms per batch"], rows))
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
