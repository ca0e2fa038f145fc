"""Cost of the always-on statistics: the native training pipeline with the
per-stage clocks on (default) and off (FASTLOADER_STATS=0), each run in a
fresh process, alternating, median of --rounds.  The consumer-side counters
(two perf_counter calls per batch) are not switchable and are included in
both.

    python benchmarks/bench_stats_overhead.py [--rounds 5] [--workers 2]
"""
import argparse
import os
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time, torch, fastloader
from fastloader.tools.harness import fastloader_transform
from fastloader.tools.sample import ensure_sample
torch.set_num_threads(1)
ds = fastloader.ImageFolder(ensure_sample(2000, progress=False), transform=fastloader_transform("train"))
dl = fastloader.DataLoader(ds, batch_size=64, shuffle=True, num_workers=int(sys.argv[1]), seed=0)
it = iter(dl); next(it)
t = time.perf_counter(); n = sum(len(y) for _, y in it); dt = time.perf_counter() - t
print(n / dt)
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    res = {"on": [], "off": []}
    for r in range(a.rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            env = dict(os.environ, FASTLOADER_STATS="1" if mode == "on" else "0")
            out = subprocess.run([sys.executable, "-c", CHILD, str(a.workers)], env=env, capture_output=True,
                                 text=True, check=True)
            res[mode].append(float(out.stdout.split()[-1]))
            print(f"round {r} stats {mode}: {res[mode][-1]:.0f} img/s", file=sys.stderr, flush=True)
    on, off = statistics.median(res["on"]), statistics.median(res["off"])
    ratios = [a_ / b_ for a_, b_ in zip(res["on"], res["off"])]
    print(f"stats on: {on:.0f} img/s, stats off: {off:.0f} img/s (medians of {a.rounds}); "
          f"on/off = {on / off:.3f} (per-round ratios {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
