"""CPU time per sample of the native pipeline on the calling thread: what
one sample costs in C, free of the scheduling noise of a loader run.

    PYTHONPATH=CHECKOUT python benchmarks/bench_percall.py train|val [--sample-dir DIR] [--n 600]

Loads n samples of the sample folder with ImageFolder._native.load_batch
(batches of 60), best of 4 passes of the thread's CPU time, and prints
milliseconds per sample.  Run it alternately against two checkouts (through
PYTHONPATH) to compare builds (benchmarks/RESULTS.md, section 7b).
"""
import argparse
import os
import time

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pipeline", choices=["train", "val"])
    p.add_argument("--sample-dir", default=os.path.expanduser("~/.cache/fastloader/sample-2000"))
    p.add_argument("--n", type=int, default=600)
    a = p.parse_args()
    import fastloader
    from fastloader import transforms as T

    if a.pipeline == "train":
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    else:
        tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    nat = fastloader.ImageFolder(a.sample_dir, transform=tf)._native
    best = float("inf")
    for rep in range(4):
        t0 = time.thread_time()
        for s in range(0, a.n, 60):
            nat.load_batch(list(range(s, min(a.n, s + 60))), rep, 0)
        best = min(best, time.thread_time() - t0)
    print(f"{best / a.n * 1e3:.4f} ms per sample ({fastloader.__file__})")


if __name__ == "__main__":
    main()
