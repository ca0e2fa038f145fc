"""The one benchmark harness: ``python -m fastloader bench`` (cli_bench.py) and
benchmarks/*.py both measure with these functions.

Protocol.  Every measured configuration runs in a fresh Python process
(:func:`run_child`), so peak memory is per configuration and no loader inherits
warm caches, threads or allocator state from another.  The child loads this
file by path, calls one function of a given file with a JSON config, and
prints the result dict on one line starting with ``RESULT_PREFIX``.  The
parent runs the configurations interleaved (:func:`run_interleaved`): the
loaders of one group back to back, the order rotated per group and per round,
so slow drifts of a noisy shared machine hit every loader alike.

Timing (:func:`time_loader`).  ``first batch`` is from building the dataset +
loader (folder scan, worker start) to the first batch in hand; images/s and
the average batch time count only what comes after the first batch; consumer
wait is the time inside ``next(iterator)`` (and ``iter()``) after the first
batch over the wall time after it.  Imports happen before the timed region.

Memory.
  * ``rss_peak_mib`` -- peak resident set of the measured process (VmHWM).
    The kernel's high-water mark misses peaks released with
    madvise(MADV_DONTNEED) (glibc trims malloc arenas that way), so it can
    under-report; prefer ``peak_mib``.
  * ``peak_mib`` -- peak of RSS(main) + the private memory (USS) of every
    descendant process (torch's workers), sampled by the parent (main's VmRSS
    every 50 ms, the workers every ``mem_interval`` s), never below
    ``rss_peak_mib``.  For fastloader (threads) this is all the memory the
    loader uses.  Worker pages still shared copy-on-write with the main
    process count once, so the ~0.5 GB of torch libraries every worker maps
    is not multiplied by num_workers as a summed RSS would be.  Reading a
    worker's /proc/<pid>/smaps_rollup costs a few ms of kernel time; a lone
    process costs nothing to sample.  Sampling stops when the measured
    process prints its result: its exit (interpreter and libtorch teardown)
    faults in up to ~120 MB of library pages that are not the loader's.
  * ``peak_pss_mib`` (``run_child(..., pss=True)``) -- peak of the sum of
    PSS (proportional set size, /proc/<pid>/smaps_rollup) over the whole tree,
    the main process included, every 50 ms (a process's smaps_rollup is
    re-read when its RSS moved by > 2 MiB and every ``mem_interval`` s, its
    RSS change added in between: TreeMemSampler): each page
    shared by k processes counts 1/k in each, so the sum is the tree's
    physical memory, whether its workers are threads or processes.  Pages
    shared with processes outside the tree (system libraries) count only
    their share.  Sampling costs the parent ~3 ms of kernel time for the main
    process and ~1.5 ms per worker; ``sampler_cpu_s`` says how much.
  Both include the ~0.5 GB that ``import torch`` holds; ``base_rss_mib`` is
  the RSS just before the loader is built.

This module must stay importable on its own: the measured processes load it
by file path (CHILD_BOOT), so that the torch runs never import the fastloader
package, and benchmarks/_common.py does so too when there is no built
extension, so that the torch half of a benchmark runs without one.
Elsewhere it is ``fastloader.tools.harness``.  At module level it imports the
standard library only.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
PIPELINES = {
    "train": "RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize(ImageNet mean/std)",
    "val": "Resize(256) + CenterCrop(224) + ToTensor + Normalize(ImageNet mean/std)",
}
RESULT_PREFIX = "@@FASTLOADER-BENCH-RESULT@@ "
MODULE_NAME = "_fastloader_harness"  # the name this file has when loaded by path

# ----------------------------------------------------------------------------
# /proc readers (Linux; None where there is nothing to read)


def status_kib(field, pid="self"):
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM, ...), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_now_mib():
    v = status_kib("VmRSS")
    return None if v is None else v / 1024.0


def peak_rss_mib():
    """Peak RSS of this process in MiB (VmHWM, or ru_maxrss off Linux)."""
    v = status_kib("VmHWM")
    if v is not None:
        return v / 1024.0
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0


def usable_cpus():
    """CPUs this process may run on: its affinity mask (what the table's
    header reports; sysinfo.usable_cpus also applies the cgroup quota)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def _children(pid):
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return out


def process_tree(pid):
    """pid and all its descendants, pid first."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


def uss_kib(pid):
    """Private (unshared) resident memory of a process: Private_Clean + Private_Dirty."""
    tot = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    tot = (tot or 0) + int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tot


def rollup_kib(pid):
    """(Pss, USS) of a process from one read of /proc/<pid>/smaps_rollup, kB, or (None, None)."""
    pss = uss = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                    uss = (uss or 0) + int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pss, uss


class TreeMemSampler:
    """Polls RSS(main) + sum of USS(descendants) of a process tree (Linux only).

    The main process's VmRSS on every :meth:`sample` call; the descendants'
    smaps_rollup at most every ``worker_interval`` seconds (it costs a few ms
    of kernel time each).

    With ``pss``: ``peak_pss_kib``, the peak over the calls of the summed Pss
    of the whole tree, main included.  Reading every smaps_rollup on every
    call would cost ~3 ms for a torch process and ~1.5 ms per worker (10-20%
    of a CPU for five processes every 50 ms, taken from the loader measured),
    so each call reads every process's VmRSS (cheap) and re-reads a process's
    smaps_rollup only when its VmRSS moved by more than ``PSS_REREAD_KIB``
    since its last read, when a process of the tree started or ended, or
    ``worker_interval`` s passed; in between its Pss
    (and USS) is the last one read plus its VmRSS change since (memory a
    process allocates or frees is private: it moves all three alike).
    ``full_reads``: the smaps_rollup reads; ``cpu_s``: this thread's CPU time
    spent sampling.
    """

    PSS_REREAD_KIB = 2 * 1024

    def __init__(self, pid, worker_interval=0.5, pss=False):
        self.pid = pid
        self.peak_total_kib = 0
        self.peak_pss_kib = 0
        self.pss = pss
        self.samples = 0
        self.full_reads = 0
        self._cache = {}  # pid -> (VmRSS, Pss, USS at the last read, when)
        self.cpu_s = 0.0
        self.worker_interval = worker_interval
        self._workers_kib = 0
        self._next_workers = 0.0
        self.ok = os.path.exists(f"/proc/{pid}/status")

    def sample(self):
        if not self.ok:
            return
        c0 = time.thread_time()
        main = status_kib("VmRSS", self.pid)
        if main is None:
            return
        now = time.perf_counter()
        if self.pss:
            tree = process_tree(self.pid)
            # a process started or ended: the pages it shares changed their
            # sharers everywhere in the tree (a fork halves the parent's Pss)
            changed = set(tree) != set(self._cache)
            tot_pss, workers_uss, cache = 0, 0, {}
            for i, p in enumerate(tree):
                rss = main if i == 0 else status_kib("VmRSS", p)
                if rss is None:
                    continue  # gone
                c = self._cache.get(p)
                if (changed or c is None or abs(rss - c[0]) > self.PSS_REREAD_KIB
                        or now - c[3] >= self.worker_interval):
                    pss, uss = rollup_kib(p)
                    if pss is None:
                        continue
                    self.full_reads += 1
                    c = (rss, pss, uss or 0, now)
                cache[p] = c
                delta = rss - c[0]
                tot_pss += c[1] + delta
                if i:
                    workers_uss += c[2] + delta
            self._cache = cache
            self._workers_kib = workers_uss
            self.peak_pss_kib = max(self.peak_pss_kib, tot_pss)
            self.samples += 1
        elif now >= self._next_workers:
            self._next_workers = now + self.worker_interval
            self._workers_kib = sum(uss_kib(p) or 0 for p in process_tree(self.pid)[1:])
        self.peak_total_kib = max(self.peak_total_kib, main + self._workers_kib)
        self.cpu_s += time.thread_time() - c0


# ----------------------------------------------------------------------------
# the image pipelines: torch DataLoader + torchvision vs fastloader, same transforms


def torch_transform(pipeline):
    import torchvision.transforms as T

    if pipeline == "train":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])


def fastloader_transform(pipeline):
    from fastloader import transforms as FT

    if pipeline == "train":
        return FT.Compose([FT.RandomResizedCrop(224), FT.RandomHorizontalFlip(), FT.ToTensor(),
                           FT.Normalize(MEAN, STD)])
    return FT.Compose([FT.Resize(256), FT.CenterCrop(224), FT.ToTensor(), FT.Normalize(MEAN, STD)])


def torch_pipeline(root, pipeline, workers, batch_size):
    import torch.utils.data
    import torchvision

    ds = torchvision.datasets.ImageFolder(root, transform=torch_transform(pipeline))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers, shuffle=True)


def fastloader_pipeline(root, pipeline, workers, batch_size):
    import fastloader

    ds = fastloader.ImageFolder(root, transform=fastloader_transform(pipeline))
    return fastloader.DataLoader(ds, batch_size=batch_size, num_workers=workers, shuffle=True)


# ----------------------------------------------------------------------------
# child side: the timed loop


def busy(seconds):
    """A CPU-bound stand-in for a model step."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def time_loader(make_loader, *, epochs=1, max_batches=None, step_s=0.0, step_busy=False, hold_batch=False,
                on_first=None, warm_batches=0):
    """Build a loader with ``make_loader()`` and iterate it ``epochs`` times
    (at most ``max_batches`` per epoch), sleeping (or, with ``step_busy``,
    spinning) ``step_s`` after every batch.  Returns the measurements; see the
    module docstring for the rules.  Batches are ``(x, ...)`` or ``x``.

    ``hold_batch``: keep each batch alive until the next one has arrived, as
    ``for x, y in loader:`` does, instead of dropping it before the step.  It
    adds up to one batch to the peak memory (benchmarks/ measure that way,
    ``python -m fastloader bench`` the other).

    A dict batch (``{"input_ids": ..., ...}``) counts the samples of its first
    value.  ``on_first(batch)`` -> dict: called on the first batch, outside
    the timed region's rate (it is before the rate's start), its dict merged
    into the result (e.g. the batch's structure).

    Besides ``rate`` (after the first batch), two rates that do not depend on
    how a loader spreads its start-up: ``epoch_rate``, all samples over the
    time from building the loader to the last batch (what one epoch of
    training sees, worker start included), and ``warm_rate``, the samples
    after the first ``warm_batches`` batches of the first epoch over the time
    after that batch.  A loader whose workers all start on a batch at once
    (torch's, num_workers batches in flight from the start) delivers its first
    batch late and the next few in a burst, which flatters ``rate`` on a short
    epoch; skipping the prefetch window (num_workers x prefetch_factor
    batches) measures both loaders past their start."""
    import gc

    step = busy if step_busy else time.sleep
    gc.collect()
    base = rss_now_mib()

    perf = time.perf_counter
    t0 = perf()
    loader = make_loader()
    setup_s = perf() - t0
    t_first = None
    n_first = 0
    wait = 0.0
    wait_first = 0.0
    samples = batches = 0
    shape = dtype = None
    it = held = None
    first_info = None
    t_warm = None
    n_warm = 0
    for ep in range(epochs):
        tw = perf()
        it = iter(loader)  # starting workers is loader time too
        wait += perf() - tw
        i = 0
        while True:
            tw = perf()
            try:
                batch = next(it)
            except StopIteration:
                wait += perf() - tw
                break
            now = perf()
            wait += now - tw
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            if isinstance(x, dict) and x:
                x = next(iter(x.values()))
            n = len(x)
            if t_first is None:
                shape = "x".join(str(s) for s in getattr(x, "shape", ()))
                dtype = str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")
                if on_first is not None:
                    first_info = on_first(batch)
                now = perf()
                t_first, n_first, wait_first = now, n, wait
            samples += n
            batches += 1
            i += 1
            if ep == 0 and i == max(1, warm_batches):
                t_warm, n_warm = perf(), samples
            if hold_batch:
                held = batch  # the previous one goes only now
            del batch, x
            if step_s:
                step(step_s)
            if max_batches and i >= max_batches:
                break
        held = None
        if ep < epochs - 1:
            del it
            it = None
    t_end = perf()
    del it, loader
    after = samples - n_first
    dt = (t_end - t_first) if t_first is not None else 0.0
    return {**(first_info or {}),
        "total_s": t_end - t0,
        "setup_s": setup_s,
        "ttfb_s": (t_first - t0) if t_first is not None else None,
        "batch_ms": (dt / (batches - 1) * 1000.0) if batches > 1 else None,
        "rate": (after / dt) if after and dt > 0 else None,
        "epoch_rate": (samples / (t_end - t0)) if samples else None,
        "warm_rate": ((samples - n_warm) / (t_end - t_warm))
                     if t_warm is not None and samples > n_warm and t_end > t_warm else None,
        "warm_batches": warm_batches,
        "wait_pct": ((wait - wait_first) / dt * 100.0) if dt > 0 else None,
        "samples": samples,
        "batches": batches,
        "shape": shape,
        "dtype": dtype,
        "base_rss_mib": base,
        "rss_peak_mib": peak_rss_mib(),
    }


def pipeline_child(cfg) -> dict:
    """One image-pipeline configuration: ``cfg`` has impl ("torch" or
    "fastloader"), root, pipeline ("train"/"val"), workers, batch_size, epochs,
    and optionally max_batches, step_ms, step_busy, hold_batch (see
    :func:`time_loader`), torch_threads (0/None: torch's default; 1 is what
    torch's own worker processes use)."""
    import torch

    if cfg.get("torch_threads"):
        # like torch's own worker processes; for num_workers=0 this stops the main process's
        # OpenMP pool from spinning against the loader on a small, shared machine
        torch.set_num_threads(cfg["torch_threads"])
    # imports outside the timed region: 'first batch' must not include importing libraries
    if cfg["impl"] == "torch":
        import torch.utils.data  # noqa: F401
        import torchvision.datasets  # noqa: F401
        import torchvision.transforms  # noqa: F401
        make = torch_pipeline
    else:
        import fastloader  # noqa: F401
        from fastloader import transforms  # noqa: F401
        make = fastloader_pipeline
    r = time_loader(lambda: make(cfg["root"], cfg["pipeline"], cfg["workers"], cfg["batch_size"]),
                    epochs=cfg["epochs"], max_batches=cfg.get("max_batches"),
                    step_s=(cfg.get("step_ms") or 0) / 1000.0, step_busy=bool(cfg.get("step_busy")),
                    hold_batch=bool(cfg.get("hold_batch")))
    r["torch_threads"] = torch.get_num_threads()
    return r


def module_child(cfg) -> dict:
    """A measured function that lives in an importable module (fastloader.tools.tuning.measure's
    ``measure``): ``cfg["call"]`` is "package.module:function"; ``cfg["sys_path"]``
    goes first on sys.path, so the child imports what the parent imports (the
    same fastloader, the user's own modules)."""
    import importlib

    sys.path[:0] = list(cfg.get("sys_path") or [])
    mod, _, fn = cfg["call"].partition(":")
    return getattr(importlib.import_module(mod), fn)(cfg)


def _load_by_path(name, path):
    mod = sys.modules.get(name)
    if mod is not None and os.path.abspath(getattr(mod, "__file__", "")) == os.path.abspath(path):
        return mod
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _child_main(target, func, cfg_json):
    """Entry point of a measured process (see CHILD_BOOT): run ``func(cfg)`` of
    the file ``target`` and print its result dict (or the error) for the parent."""
    try:
        if os.path.abspath(target) == os.path.abspath(__file__):
            mod = sys.modules[__name__]
        else:  # under its own name, so spawned workers can unpickle what it defines
            mod = _load_by_path(os.path.splitext(os.path.basename(target))[0], target)
        res = dict(getattr(mod, func)(json.loads(cfg_json)))
    except BaseException as e:  # report, then fail
        import traceback

        traceback.print_exc()
        res = {"error": f"{type(e).__name__}: {e}"}
    if "error" not in res:
        res.setdefault("rss_peak_mib", peak_rss_mib())
        peak = cgroup_peak_mib(os.environ.get(CGROUP_ENV))
        if peak is not None:
            res["cgroup_peak_mib"] = peak
            end = cgroup_charged_mib(os.environ.get(CGROUP_ENV))
            if end is not None:
                res["cgroup_end_mib"] = end
    sys.stdout.write("\n" + RESULT_PREFIX + json.dumps(res) + "\n")
    sys.stdout.flush()
    return 1 if "error" in res else 0


# argv: sys.path[0] ('' keeps python -c's), this file, target file, function, JSON config
CHILD_BOOT = (
    "import importlib.util, sys\n"
    "if sys.argv[1]: sys.path[0] = sys.argv[1]\n"
    f"spec = importlib.util.spec_from_file_location({MODULE_NAME!r}, sys.argv[2])\n"
    "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)\n"
    "sys.exit(m._child_main(sys.argv[3], sys.argv[4], sys.argv[5]))\n"
)


# ----------------------------------------------------------------------------
# the exact peak: a memory cgroup per measured process

CGROUP_ENV = "FASTLOADER_BENCH_CGROUP"  # the measured process's own cgroup directory
_cgroup_seq = [0]


def _cgroup_parent():
    """A directory where this process may create memory cgroups, and the
    name of the peak file in them (v1: memory.max_usage_in_bytes, v2:
    memory.peak), or (None, None)."""
    v1 = "/sys/fs/cgroup/memory"
    if os.path.isfile(os.path.join(v1, "memory.max_usage_in_bytes")) and os.access(v1, os.W_OK):
        return v1, "memory.max_usage_in_bytes"
    try:
        with open("/proc/self/cgroup") as f:
            own = next((line.split("::", 1)[1].strip() for line in f if line.startswith("0::")), None)
    except OSError:
        own = None
    if own is not None:
        d = "/sys/fs/cgroup" + own.rstrip("/")
        if os.path.isfile(os.path.join(d, "memory.peak")) and os.access(d, os.W_OK):
            return d, "memory.peak"
    return None, None


def cgroup_new():
    """A fresh memory cgroup for one measured process (its path), or None
    where none can be made (no cgroup file system, not allowed)."""
    parent, peak = _cgroup_parent()
    if parent is None:
        return None
    _cgroup_seq[0] += 1
    d = os.path.join(parent, f"fastloader-bench-{os.getpid()}-{_cgroup_seq[0]}")
    try:
        os.mkdir(d)
    except OSError:
        return None
    if not os.path.isfile(os.path.join(d, peak)):
        cgroup_remove(d)
        return None
    return d


def cgroup_remove(d):
    """Remove an emptied cgroup (best effort: a process still in it keeps it)."""
    try:
        os.rmdir(d)
    except OSError:
        pass


def cgroup_peak_mib(d):
    """The kernel's high-water mark of the memory charged to cgroup `d`
    (MiB), or None.  Every page the measured process and its workers
    fault in counts, shared memory included (torch's per-batch segments and
    fastloader's ring alike), at the instant of the peak: no sampling
    interval can miss a short peak.  Page-cache pages another process
    brought in first (libraries, the dataset's files) are charged to that
    process, not here."""
    if not d:
        return None
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        try:
            with open(os.path.join(d, name)) as f:
                return int(f.read().strip()) / (1 << 20)
        except (OSError, ValueError):
            continue
    return None


# memory.stat's names for the three kinds of charge, cgroup v1 then v2
_CHARGE_KEYS = {"anon": ("rss", "anon"), "page_cache": ("cache", "file"), "shmem": ("shmem", "shmem")}


def cgroup_charged_mib(d):
    """What cgroup `d` holds now, by kind (MiB): ``anon`` (the processes'
    private memory), ``page_cache`` (file pages charged here: a page is
    charged to the cgroup of the process that brought it into the cache, so
    this part varies from run to run with what other processes did before,
    not with what the measured code does), ``shmem`` (shared memory and
    tmpfs, which both versions also count inside page_cache).  None where the cgroup
    has no readable memory.stat.  Read at the end of the measurement, it
    says how much of the peak the page cache may explain."""
    if not d:
        return None
    try:
        with open(os.path.join(d, "memory.stat")) as f:
            stat = {p[0]: int(p[1]) for p in map(str.split, f) if len(p) == 2}
    except (OSError, ValueError):
        return None
    out = {}
    for kind, names in _CHARGE_KEYS.items():
        v = next((stat[n] for n in names if n in stat), None)
        if v is not None:
            out[kind] = v / (1 << 20)
    return out or None


# ----------------------------------------------------------------------------
# parent side


def run_child(target, func, cfg, *, timeout=600.0, mem_interval=0.5, sys_path0="", env=None, pss=False):
    """Run ``func(cfg)`` of the file ``target`` in a fresh process and return its
    result dict, with ``peak_mib`` (tree memory, sampled every ``mem_interval``
    s; 0 disables sampling) and ``wall_s`` added.  On failure the dict is
    ``{"error": ..., "stderr": <tail>, "wall_s": ...}``.  ``sys_path0`` is the
    child's ``sys.path[0]`` (a benchmark script passes its folder, as if it
    were run as ``python script``).  ``pss``: also ``peak_pss_mib``, the
    peak summed PSS of the whole tree every 50 ms (each process's smaps_rollup
    re-read when its RSS moved, at least every ``mem_interval`` s: see
    TreeMemSampler), ``mem_samples``, ``mem_full_reads`` and ``sampler_cpu_s``.
    Where a memory cgroup can be made (root, cgroup v1 or a delegated v2
    subtree), the child runs in its own and reports ``cgroup_peak_mib``, the
    kernel's exact high-water mark of the tree (cgroup_peak_mib), read
    before it prints its result."""
    cmd = [sys.executable, "-c", CHILD_BOOT, sys_path0 or "", os.path.abspath(__file__), os.path.abspath(target),
           func, json.dumps(cfg)]
    e = dict(os.environ)
    e.setdefault("PYTHONHASHSEED", "0")
    if env:
        e.update(env)
    cg = cgroup_new()
    enter = None
    if cg is not None:
        e[CGROUP_ENV] = cg

        def enter(path=os.path.join(cg, "cgroup.procs")):  # in the child, before exec: "0" is itself
            with open(path, "w") as f:
                f.write("0")
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, text=True,
                                preexec_fn=enter)
    except Exception:
        if cg is not None:
            cgroup_remove(cg)
        raise
    chunks = {"out": [], "err": []}
    # the measurement ends when the child prints its result: what the process
    # does after (interpreter and libtorch teardown fault in up to ~120 MB of
    # library pages at exit) is not the loader's and stays out of the peaks
    finished = threading.Event()

    def read_out(s):
        for line in s:
            chunks["out"].append(line)
            if line.startswith(RESULT_PREFIX):
                finished.set()

    readers = [threading.Thread(target=read_out, args=(proc.stdout,), daemon=True),
               threading.Thread(target=lambda s=proc.stderr: chunks["err"].append(s.read()), daemon=True)]
    for r in readers:
        r.start()
    sampling = bool(mem_interval and mem_interval > 0)
    sampler = TreeMemSampler(proc.pid, worker_interval=mem_interval if sampling else 0.5, pss=pss)
    killed = False
    while True:
        try:
            proc.wait(timeout=0.05 if sampling else 1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        if sampling and not finished.is_set():
            sampler.sample()
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            proc.wait()
            killed = True
            break
    for r in readers:
        r.join()
    if cg is not None:
        cgroup_remove(cg)
    out, err = "".join(chunks["out"]), "".join(chunks["err"])
    res = None
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            res = json.loads(line[len(RESULT_PREFIX):])
    if res is None or "error" in res:
        tail = "\n".join(err.strip().splitlines()[-15:])
        why = f"timed out after {timeout:.0f} s" if killed else f"exit status {proc.returncode}"
        res = {"error": (res or {}).get("error") or why, "stderr": tail}
    elif sampling:
        # the sampled tree total, but never below the exactly known main-process peak
        res["peak_mib"] = max(sampler.peak_total_kib / 1024.0, res.get("rss_peak_mib") or 0.0)
        if pss:
            res["peak_pss_mib"] = sampler.peak_pss_kib / 1024.0 if sampler.samples else None
            res["mem_samples"] = sampler.samples
            res["mem_full_reads"] = sampler.full_reads
            res["sampler_cpu_s"] = sampler.cpu_s
    res["wall_s"] = time.perf_counter() - t0
    return res


def run_interleaved(groups, rounds, runner, *, before=None, after=None):
    """Run every group's configurations ``rounds`` times, interleaved.

    ``groups`` is a list of (group_key, [(impl, config), ...]).  In each round
    the groups run in order and, within a group, the impls run back to back,
    the order rotated per round and per group (two loaders alternate which
    goes first).  ``runner(config) -> result dict``; ``before(step)`` and
    ``after(step, result)`` are called around each run, ``step`` a dict with
    done (1-based), total, round (1-based), key, impl and elapsed (s).
    Returns {(group_key, impl): [result per round]}.
    """
    results = {}
    total = rounds * sum(len(c) for _, c in groups)
    done = 0
    t0 = time.perf_counter()
    for rnd in range(rounds):
        for gi, (key, configs) in enumerate(groups):
            k = (rnd + gi) % len(configs)
            for impl, cfg in configs[k:] + configs[:k]:
                done += 1
                step = dict(done=done, total=total, round=rnd + 1, key=key, impl=impl)
                if before is not None:
                    before(dict(step, elapsed=time.perf_counter() - t0))
                res = runner(cfg)
                results.setdefault((key, impl), []).append(res)
                if after is not None:
                    after(dict(step, elapsed=time.perf_counter() - t0), res)
    return results


def _ok_values(results, field):
    return [r[field] for r in results if "error" not in r and r.get(field) is not None]


def median_of(results, field):
    vals = _ok_values(results, field)
    return statistics.median(vals) if vals else None


def spread(results, field):
    """(min, max) over rounds, for showing the noise."""
    vals = _ok_values(results, field)
    return (min(vals), max(vals)) if vals else (None, None)


def paired_ratio(a_results, b_results, field):
    """Median over rounds of a[i][field] / b[i][field] (same-round pairs)."""
    ratios = []
    for a, b in zip(a_results, b_results):
        va, vb = a.get(field), b.get(field)
        if "error" in a or "error" in b or not va or not vb:
            continue
        ratios.append(va / vb)
    return statistics.median(ratios) if ratios else None


# ----------------------------------------------------------------------------
# output


def fmt(v, spec=".0f", unit="", none="-"):
    if v is None:
        return none
    if isinstance(v, str):
        return v
    return format(v, spec) + unit


def fmt_ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def markdown_table(headers, rows, align=None):
    """A Markdown pipe table (also readable as plain text); align: "l"/"r" per
    column (default: first left, the rest right)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    align = align or (["l"] + ["r"] * (len(headers) - 1))

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2)) for w, a in zip(widths, align)) + "|"
    return "\n".join([line([str(h) for h in headers]), sep] + [line(r) for r in rows])
