"""``python -m fastloader doctor DATASET_SCRIPT`` (or ``--dataset mod:attr``):
which of fastloader's three paths a dataset should take, from a short
measured run.

    native dataset          fastloader.ImageFolder / ImageList / ArrayDataset /
                            LMDBDataset / WebDataset: no Python per sample
    native call             a custom __getitem__ that spends its time decoding
                            and transforming images (Pillow, torchvision):
                            change that line to fastloader.NativeTransform
    process workers         a __getitem__ whose own Python holds the GIL:
                            the default (worker_mode="auto") runs it there
    threads                 a __getitem__ that releases the GIL (NumPy,
                            torch, I/O): worker_mode="thread" saves memory

The measurements, in order: one sample on one thread, plain and under
cProfile (the share of its time inside Pillow / torchvision / OpenCV); how
long samples running on one thread keep another from the GIL; a
short run on worker threads (samples/s and the GIL report the loader's own
warning uses); a short run on worker processes.  Each run is bounded in
time (--seconds), so the whole check takes a few seconds.

DATASET_SCRIPT is a Python file run as a script that defines ``dataset``
(or a function ``make_dataset()`` / ``get_dataset()`` returning one);
``--dataset module:attr`` names the dataset, or a function that returns it,
in an importable module.  The script may define ``collate_fn`` and
``batch_size`` too.
"""
from __future__ import annotations

import cProfile
import importlib
import os
import pstats
import runpy
import sys
import time

__all__ = ["load_dataset", "examine", "render", "run"]

_IMAGE_LIBS = ("PIL", "torchvision", "cv2", "imageio", "simplejpeg", "turbojpeg", "skimage")
_NATIVE_TYPES = ("NativeImageDataset", "ArrayDataset", "LMDBDataset", "WebDataset")


def load_dataset(script=None, spec=None):
    """(dataset, extras: {collate_fn, batch_size}, where it came from)."""
    if (script is None) == (spec is None):
        raise ValueError("give a DATASET_SCRIPT or --dataset module:attr (one of them)")
    if script is not None:
        ns = runpy.run_path(script, run_name="__fastloader_doctor__")
        obj = ns.get("dataset")
        for name in ("make_dataset", "get_dataset"):
            if obj is None and callable(ns.get(name)):
                obj = ns[name]()
        if obj is None:
            raise ValueError(f"{script} defines neither `dataset` nor `make_dataset()` / `get_dataset()`")
        extras = {k: ns[k] for k in ("collate_fn", "batch_size") if k in ns}
        return obj, extras, script
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise ValueError(f"--dataset takes module:attr, got {spec!r}")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "__getitem__") and not hasattr(obj, "__iter__")):
        obj = obj()  # a class or a factory
    return obj, {}, spec


def _native_kind(ds):
    from .. import datasets

    for cls in type(ds).__mro__:
        if cls.__module__.startswith("fastloader") and cls.__name__ in _NATIVE_TYPES:
            return cls.__name__
    return "NativeImageDataset" if isinstance(ds, datasets.NativeImageDataset) else None


def _torchvision_folder(ds):
    try:
        from torchvision.datasets import DatasetFolder
    except Exception:  # pragma: no cover - torchvision not installed
        return False
    return isinstance(ds, DatasetFolder)


def _is_image_lib(filename):
    parts = filename.replace("\\", "/").split("/")
    return any(p in _IMAGE_LIBS for p in parts)


def profile_samples(ds, indices):
    """(ms per sample plain, CPU ms per sample, share of the time spent
    inside image libraries under cProfile)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in indices:
        ds[i]
    n = max(1, len(indices))
    wall = (time.perf_counter() - t0) / n
    cpu = (time.thread_time() - c0) / n
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in indices:
        ds[i]
    prof.disable()
    total = time.perf_counter() - t0
    st = pstats.Stats(prof).stats
    image = 0.0
    for func, (_cc, _nc, _tt, ct, callers) in st.items():
        # the time of each call into an image library from outside it
        if _is_image_lib(func[0]) and not any(_is_image_lib(c[0]) for c in callers):
            image += ct
    return 1000.0 * wall, 1000.0 * cpu, min(1.0, image / total) if total > 0 else 0.0


def _probe_ms(stop, limit_s):
    """Median extra latency (ms) of a 1 ms sleep on this thread, repeated
    until stop() or limit_s: waking up needs the GIL, so a thread that holds
    it delays each wake-up by up to a switch interval (5 ms)."""
    lat = []
    t_end = time.perf_counter() + limit_s
    while not stop() and time.perf_counter() < t_end:
        t = time.perf_counter()
        time.sleep(0.001)
        lat.append(time.perf_counter() - t - 0.001)
    lat.sort()
    return 1000.0 * lat[len(lat) // 2] if lat else 0.0


def gil_hold_ms(ds, indices, limit_s=0.5):
    """How long the dataset's __getitem__, run on another thread, keeps this
    thread from the GIL: the median extra wake-up latency of a sleeping
    thread while it runs, less the same without it (the machine's own
    scheduling delay).  ~ the switch interval (5 ms) for pure Python, ~0 for
    work that releases the GIL."""
    import threading

    base = _probe_ms(lambda: False, 0.05)
    done = threading.Event()

    def work():
        try:
            for i in indices:
                ds[i]
                if done.is_set():
                    break
        finally:
            done.set()

    th = threading.Thread(target=work, name="fastloader-doctor-probe", daemon=True)
    th.start()
    busy = _probe_ms(done.is_set, limit_s)
    done.set()
    th.join()
    return max(0.0, busy - base)


def _timed_run(ds, mode, num_workers, batch_size, collate_fn, seconds, n_samples):
    """Load up to `seconds` (after the first batch) on `mode` workers:
    (samples/s after the first batch, the loader's stats)."""
    import warnings

    from ..loader import DataLoader
    from ..stats import PerformanceWarning

    from ..sysinfo import system_idle_s

    kw = {} if collate_fn is None else {"collate_fn": collate_fn}
    idle0, t0 = system_idle_s(), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceWarning)
        dl = DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=num_workers, worker_mode=mode, **kw)
        it = iter(dl)
        try:
            t_first = None
            n = 0
            gil = None
            for b in it:
                now = time.perf_counter()
                if t_first is None:
                    t_first = now
                    continue
                n += _batch_len(b)
                if gil is None and now - t_first > min(0.3, seconds / 2) and mode == "thread":
                    gil = it.stats().get("gil")
                if now - t_first >= seconds or n >= n_samples:
                    break
            elapsed = time.perf_counter() - t_first if t_first is not None else 0.0
            if gil is None:
                gil = it.stats().get("gil")
        finally:
            it._shutdown()  # the workers go now, also when the dataset raised
    idle1, t1 = system_idle_s(), time.perf_counter()
    idle = (idle1 - idle0) / (t1 - t0) if idle0 is not None and idle1 is not None and t1 > t0 else None
    return (n / elapsed if elapsed > 0 and n else None), gil, idle


def _batch_len(b):
    from ..collate import batch_len

    return batch_len(b)


def _gil_bound(rep):
    return bool(rep and rep["worker_busy_fraction"] > 0.8 and rep["python_cpu_cores"] < 1.3
                and rep["gil_reacquire_ms"] > 300.0 * sys.getswitchinterval())


def examine(ds, *, batch_size=32, collate_fn=None, num_workers=None, seconds=1.5, profile_n=None):
    """Measure `ds` and say which path it should take.  Returns a dict with
    the measurements and `path` in native_dataset / native_call /
    process_workers / threads."""
    from ..sysinfo import usable_cpus

    cpus = usable_cpus()
    nw = num_workers or max(2, min(cpus, 4))
    out = {"dataset": type(ds).__name__, "usable_cpus": cpus, "num_workers": nw, "batch_size": batch_size}
    native = _native_kind(ds)
    if native:
        out.update(path="native_dataset", native=native,
                   why=f"{native} is one of fastloader's native datasets: its workers read, decode and transform "
                       "in C without the GIL. Keep worker threads (the default).")
        return out
    if _torchvision_folder(ds):
        out.update(path="native_dataset", native=None,
                   why="a torchvision ImageFolder/DatasetFolder: fastloader.ImageFolder(root, transform=...) reads "
                       "the same folder with the same transforms natively, with no Python per sample.")
        return out
    try:
        n = len(ds)
    except TypeError:
        n = None
    hold = None
    if n is not None:
        k = profile_n or max(1, min(n, 8))
        ms, cpu_ms, image_share = profile_samples(ds, range(k))
        out.update(sample_ms=ms, sample_cpu_ms=cpu_ms, image_share=image_share)
        hold = gil_hold_ms(ds, range(min(n, 10**6)))
        out["gil_hold_ms"] = hold
    else:
        image_share = 0.0
    budget = max(64, int(4 * nw * batch_size))
    limit = budget if n is None else n
    rate_t, gil, idle_t = _timed_run(ds, "thread", nw, batch_size, collate_fn, seconds, limit)
    out.update(thread_samples_per_s=rate_t, gil=gil)
    rate_p = None
    idle_p = None
    if cpus >= 2:
        rate_p, _, idle_p = _timed_run(ds, "process", nw, batch_size, collate_fn, seconds, limit)
    out["process_samples_per_s"] = rate_p
    # CPUs of the machine left idle during the runs: near 0, other programs
    # took what the workers could have used, and the rates say little
    out["idle_cpus"] = min(v for v in (idle_t, idle_p) if v is not None) if (idle_t, idle_p) != (None, None) else None
    busy_machine = out["idle_cpus"] is not None and out["idle_cpus"] < 0.3
    speedup = rate_p / rate_t if rate_p and rate_t else None
    out["process_speedup"] = speedup
    # the probe when there is one (it does not depend on how busy the
    # machine is), else the loader's own report
    bound = hold > 300.0 * sys.getswitchinterval() if hold is not None else _gil_bound(gil)
    out["gil_bound"] = bool(bound)
    if image_share >= 0.4:
        out["path"] = "native_call"
        out["why"] = (f"{100 * image_share:.0f}% of a sample's time is spent in image decoding and transforms "
                      "(Pillow, torchvision), holding the GIL: build fastloader.NativeTransform(your transform) once "
                      "and call it on the path (or bytes) in __getitem__; the rest of your Python stays."
                      + (f" Until then, worker processes are {speedup:.2f}x threads here." if speedup else ""))
    elif bound:
        out["path"] = "process_workers"
        out["why"] = ("the dataset's own Python holds the GIL, so worker threads run it one at a time"
                      + (f": while it ran, another thread waited {hold:.1f} ms for the GIL each time it woke"
                         if hold is not None else "")
                      + (f"; worker processes loaded {speedup:.2f}x as fast here" if speedup and speedup >= 1 else "")
                      + (". Other programs kept this machine's CPUs busy during the runs, so the rates above "
                         "understate what processes gain" if busy_machine else "")
                      + ". Keep the default, worker_mode='auto', which runs it in worker processes (or pass "
                         "worker_mode='process').")
    else:
        out["path"] = "threads"
        out["why"] = ("the dataset releases the GIL while it works (NumPy, torch, I/O), so worker threads run in "
                      "parallel" + (f" (processes: {speedup:.2f}x threads)" if speedup else "")
                      + ". worker_mode='thread' runs it on threads (each on its own shallow copy of the dataset), "
                      "in less memory than the default's worker processes.")
    return out


_ADVICE = {
    "native_dataset": "use a native dataset",
    "native_call": "use the native call in __getitem__ (fastloader.NativeTransform)",
    "process_workers": "use process workers (the default, worker_mode='auto', for a Python dataset)",
    "threads": "use worker threads (worker_mode='thread')",
}


def render(rep, source):
    def rate(v):
        return f"{v:,.0f} samples/s" if v else "n/a"

    lines = [f"fastloader doctor: dataset {rep['dataset']} from {source} ({rep['usable_cpus']} usable CPUs)"]
    if "sample_ms" in rep:
        lines.append(f"  one sample on one thread   {rep['sample_ms']:.2f} ms ({rep['sample_cpu_ms']:.2f} ms CPU); "
                     f"image decode + transforms: {100 * rep['image_share']:.0f}% of it")
        lines.append(f"  GIL held against others    {rep['gil_hold_ms']:.1f} ms per wake-up (pure Python: ~"
                     f"{1000 * sys.getswitchinterval():.0f} ms, GIL released: ~0)")
    if "thread_samples_per_s" in rep:
        g = rep.get("gil")
        gl = (f"; {g['python_cpu_cores']:.2f} CPU cores of Python, GIL taken back in {g['gil_reacquire_ms']:.1f} ms"
              if g else "")
        lines.append(f"  {rep['num_workers']} worker threads          {rate(rep['thread_samples_per_s'])}{gl}")
    if rep.get("process_samples_per_s"):
        sp = rep.get("process_speedup")
        lines.append(f"  {rep['num_workers']} worker processes        {rate(rep['process_samples_per_s'])}"
                     + (f" ({sp:.2f}x threads)" if sp else ""))
    if rep.get("idle_cpus") is not None:
        lines.append(f"  idle CPUs during the runs  {rep['idle_cpus']:.1f} of {rep['usable_cpus']}")
    lines.append("")
    lines.append(f"Recommendation: {_ADVICE[rep['path']]}")
    lines.append(f"  Why: {rep['why']}")
    if rep["path"] == "process_workers":
        lines.append(f"  fastloader.DataLoader(dataset, batch_size={rep['batch_size']}, num_workers={rep['num_workers']}, "
                     "worker_mode='process')")
    return "\n".join(lines)


def add_arguments(p):
    p.add_argument("script", nargs="?", metavar="DATASET_SCRIPT",
                   help="a Python file defining `dataset` (or make_dataset()): measure it and say which path it "
                        "should take (native dataset, native call in __getitem__, process workers)")
    p.add_argument("--dataset", metavar="MODULE:ATTR", help="the dataset (or a function returning it) to examine")
    # `doctor` already has --batch-size / --num-workers (the settings whose
    # memory it predicts); with a dataset they are the measured runs' too
    if "--batch-size" not in p._option_string_actions:
        p.add_argument("--batch-size", type=int, default=None, help="batch size of the measured runs (default 32)")
    if "--num-workers" not in p._option_string_actions:
        p.add_argument("--num-workers", type=int, default=None,
                       help="workers of the measured runs (default: CPUs, 2-4)")
    p.add_argument("--seconds", type=float, default=1.5, help="length of each measured run (default %(default)s)")


def run(args):
    """The dataset check; 0, or 2 when the dataset cannot be loaded."""
    import json

    if args.script:
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    try:
        ds, extras, source = load_dataset(args.script, args.dataset)
    except Exception as e:
        print(f"fastloader doctor: cannot load the dataset: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    bs = args.batch_size or extras.get("batch_size") or 32
    rep = examine(ds, batch_size=bs, collate_fn=extras.get("collate_fn"), num_workers=args.num_workers,
                  seconds=args.seconds)
    if getattr(args, "json", False):
        print(json.dumps(rep, indent=1, default=str))
    else:
        print(render(rep, source))
    return 0
