"""Two builds of fastloader side by side: the same image pipelines and Python
datasets, each configuration in a fresh process, the two builds interleaved
round by round (so a busy machine slows both alike).

    python benchmarks/bench_before_after.py --before /path/to/old/checkout [--after .] \\
        [--workers 0,1,2,4] [--rounds 3] [--max-batches 20] [--out FILE]

Each checkout must have its extension built in place (``setup.py build_ext
--inplace``); the child processes import fastloader from it through
PYTHONPATH.  Reported: images/s (samples/s for the Python dataset) of each
build and the median of the per-round after/before ratios.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def python_child(cfg):
    """bench_python.py's numpy dataset under fastloader.DataLoader."""
    sys.path.insert(0, HERE)
    import bench_python as B

    return B.child(dict(cfg, impl="fastloader"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--before", required=True, help="checkout of the earlier build")
    p.add_argument("--after", default=C.REPO, help="checkout of the later build (default: this one)")
    p.add_argument("--sample-dir", default=None)
    p.add_argument("--workers", default="0,1,2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-batches", type=int, default=20)
    p.add_argument("--python-batches", type=int, default=30)
    p.add_argument("--out")
    a = p.parse_args(argv)
    workers = [int(w) for w in a.workers.split(",")]
    root = a.sample_dir or C.load_sample_module().ensure_sample(2000)
    builds = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    script = os.path.abspath(__file__)

    def runner(cfg):
        env = {"PYTHONPATH": builds[cfg["build"]]}
        if cfg["kind"] == "images":
            return C.H.run_child(C.H.__file__, "pipeline_child", dict(cfg, impl="fastloader"), env=env,
                                 sys_path0=HERE)
        return C.H.run_child(script, "python_child", cfg, env=env, sys_path0=HERE)

    groups = []
    for pipe in ("train", "val"):
        for w in workers:
            groups.append(((pipe, w), [(b, dict(build=b, kind="images", root=root, pipeline=pipe, workers=w,
                                                batch_size=64, epochs=1, max_batches=a.max_batches,
                                                torch_threads=1)) for b in builds]))
    for w in (0, 2):
        groups.append((("python-numpy", w), [(b, dict(build=b, kind="python", dataset="numpy", workers=w,
                                                      batches=a.python_batches)) for b in builds]))
    t0 = time.perf_counter()
    res = C.run_interleaved(groups, a.rounds, runner)
    elapsed = time.perf_counter() - t0
    rep = C.Report("fastloader before and after: the same loads on two builds")
    rep.add("\n".join(C.environment_lines()))
    rep.add(f"- before: {builds['before']}; after: {builds['after']}; {a.rounds} interleaved rounds, fresh "
            f"process per run; images: sample of 2000, batch 64, {a.max_batches} batches; python-numpy: "
            f"bench_python's numpy dataset, batch 32, {a.python_batches} batches; wall {elapsed:.0f} s")
    rep.add("")
    rows = []
    for key, _ in groups:
        b, f = res[(key, "before")], res[(key, "after")]
        rows.append([key[0], str(key[1]), C.fmt(C.median_of(b, "rate")), C.fmt(C.median_of(f, "rate")),
                     C.fmt_ratio(C.paired_ratio(f, b, "rate"))])
    rep.add(C.markdown_table(["load", "workers", "before /s", "after /s", "after/before"], rows))
    return rep.finish(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
