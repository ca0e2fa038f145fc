"""GPU delivery measurements (issue 4), for a machine with a CUDA device.

1. Host-to-device bandwidth: fastloader's copy path (pinned batch ->
   device on the loader's stream) against a raw pinned tensor.to(device,
   non_blocking=True) of the same size, timed with CUDA events.
2. End-to-end images/s delivered to the device by the native training
   pipeline, with a trivial consumer and with a simulated model step (a fixed
   amount of GPU work per batch: matmuls sized to take --step-ms), and the
   fraction of wall time the consumer waited for data.

    python benchmarks/bench_gpu.py [--n 2000] [--workers 4] [--step-ms 20] [--batches 60]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

fastloader = C.import_fastloader()  # the installed one, else the in-tree build
from fastloader.cuda_delivery import DeviceCopier  # noqa: E402
from fastloader.tools.sample import ensure_sample  # noqa: E402


def bandwidth(nbytes, reps=20):
    """(raw, ours) bytes/s, each as (GPU-timed, wall-clock).

    raw: torch's pinned tensor.to(device, non_blocking=True) (one
    cudaMemcpyAsync on the current stream) timed with events around the loop.
    ours: the loader's copier (own stream, pooled device buffer, events,
    DLPack import, result dropped at once as a training loop would), GPU time
    from the per-copy events, wall from enqueue to the last copy's end."""
    dev = torch.device("cuda")
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    for _ in range(3):
        host.to(dev, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for _ in range(reps):
        host.to(dev, non_blocking=True)
    end.record()
    torch.cuda.synchronize()
    raw = (nbytes * reps / (start.elapsed_time(end) / 1e3), nbytes * reps / (time.perf_counter() - t))
    cp = DeviceCopier(dev)
    for _ in range(3):
        cp.to_device(host)
    cp.synchronize()
    torch.cuda.synchronize()
    gpu0 = cp.copy_gpu_s
    t = time.perf_counter()
    for _ in range(reps):
        cp.to_device(host)
    cp.synchronize()
    wall = time.perf_counter() - t
    ours = (nbytes * reps / (cp.copy_gpu_s - gpu0), nbytes * reps / wall)
    st = cp.pool_stats()
    cp.close()
    return raw, ours, st


def gpu_step(ms):
    """A matmul loop calibrated to take about `ms` on this GPU."""
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    per = (time.perf_counter() - t) / 10
    n = max(1, round(ms / 1000 / per))

    def step(x):
        y = a
        for _ in range(n):
            y = y @ a
        return y.sum() + x.float().mean()
    return step


def run(ds, workers, step, batches, convert_on_device=False):
    dl = fastloader.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers, device="cuda", seed=0,
                               convert_on_device=convert_on_device)
    it = iter(dl)
    x, _ = next(it)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    wait = 0.0
    n = 0
    for i in range(batches):
        t = time.perf_counter()
        try:
            x, _ = next(it)
        except StopIteration:
            break
        wait += time.perf_counter() - t
        n += len(x)
        if step:
            step(x)
        else:
            x.sum()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    st = dl.stats()
    return n / dt, wait / dt, st


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--batches", type=int, default=60)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing to measure", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, fastloader {fastloader.build_info()}")
    size = 64 * 3 * 224 * 224 * 4
    raw, ours, st = bandwidth(size)
    print(f"H2D {size >> 20} MiB batches: raw pinned copy {raw[0] / 1e9:.1f} GB/s (GPU) {raw[1] / 1e9:.1f} GB/s "
          f"(wall); fastloader copier {ours[0] / 1e9:.1f} GB/s (GPU) {ours[1] / 1e9:.1f} GB/s (wall); "
          f"ratio {ours[0] / raw[0]:.2f} (GPU) {ours[1] / raw[1]:.2f} (wall); pool {st}")
    ds = fastloader.ImageFolder(ensure_sample(a.n, progress=False), transform=C.H.fastloader_transform("train"))
    step = gpu_step(a.step_ms)
    for label, st, conv in (("trivial consumer", None, False), (f"{a.step_ms:.0f} ms GPU step", step, False),
                            ("trivial consumer, uint8 on the wire", None, True),
                            (f"{a.step_ms:.0f} ms GPU step, uint8 on the wire", step, True)):
        ips, waitf, stats = run(ds, a.workers, st, a.batches, conv)
        print(f"{label}: {ips:.0f} images/s delivered to the device, consumer waiting {100 * waitf:.0f}% "
              f"(num_workers={a.workers}); h2d {stats['h2d_bytes'] / max(stats['h2d_gpu_s'], 1e-9) / 1e9:.1f} GB/s "
              f"on the GPU, enqueue {1e3 * stats['h2d_enqueue_s'] / max(stats['batches'], 1):.2f} ms/batch, "
              f"device pool {stats['device_pool_bytes'] >> 20} MiB in {stats['device_pool_buffers']} buffers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
