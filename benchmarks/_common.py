"""Shared helpers for the fastloader benchmarks.

Every measured configuration runs in a fresh Python subprocess (the benchmark
script re-invoked with ``--_child JSON``), so peak memory is per configuration
and no loader inherits warm caches, threads or allocator state from another.
The parent runs the configurations interleaved -- fastloader and torch side by
side, alternating which goes first, for several rounds -- and reports medians,
so slow drifts of a noisy shared machine hit both loaders alike.

Memory columns:
  * ``RSS`` -- peak resident set of the benchmark's main process (VmHWM).
    Caveat: the kernel's high-water mark misses peaks released with
    madvise(MADV_DONTNEED) (glibc trims malloc arenas that way), so it can
    under-report by ~100 MB here; prefer ``total``.
  * ``total`` -- peak of RSS(main) + the private memory (USS) of every
    descendant process (torch's workers), sampled by the parent (main's VmRSS
    every 50 ms, workers every ``--mem-interval`` seconds), and never below
    ``RSS``.  For fastloader (threads) this is all the memory the loader
    uses.  Worker pages still shared copy-on-write with the main process are
    counted once, so the ~0.5 GB of torch libraries every worker maps is not
    multiplied by num_workers as a summed RSS would.  Sampling reads /proc/<pid>/smaps_rollup of each worker
    (a few ms of kernel time each); a lone process costs nothing to sample.
Both include the ~0.5 GB that ``import torch`` itself holds; ``base`` is the
main process's RSS just before the loader is built.
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PREFIX = "@@FASTLOADER-BENCH-RESULT@@ "

# ----------------------------------------------------------------------------
# imports


class FastloaderMissing(RuntimeError):
    pass


def _ensure_repo_on_path():
    """Make an in-tree fastloader importable if no installed one is."""
    if importlib.util.find_spec("fastloader") is None and REPO not in sys.path:
        sys.path.insert(0, REPO)


def import_fastloader(*names):
    """Import fastloader and check that it has ``names`` (dotted paths allowed).

    Raises FastloaderMissing with one clear, actionable message otherwise.
    """
    _ensure_repo_on_path()
    try:
        import fastloader
    except Exception as e:  # ImportError, or an error inside the package
        raise FastloaderMissing(
            f"cannot import fastloader ({type(e).__name__}: {e}).\n"
            f"  Build it first, e.g.:  cd {REPO} && .venv/bin/pip install -e .   "
            f"(or: python setup.py build_ext --inplace)") from e
    missing = []
    for name in names:
        obj = fastloader
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                missing.append("fastloader." + name)
                break
    if missing:
        raise FastloaderMissing(
            f"fastloader at {os.path.dirname(fastloader.__file__)} lacks: {', '.join(missing)}.\n"
            "  These are needed for the fastloader half of this benchmark; "
            "use --only torch to run just the torch half.")
    return fastloader


def load_sample_module():
    """Return fastloader.sample, loading it from the source tree if the package
    itself cannot be imported (for example before the C extension is built)."""
    _ensure_repo_on_path()
    try:
        from fastloader import sample
        return sample
    except Exception:
        path = os.path.join(REPO, "fastloader", "sample.py")
        spec = importlib.util.spec_from_file_location("_fastloader_sample_standalone", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod


# ----------------------------------------------------------------------------
# memory


def _status_kib(field, pid="self"):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_now_mib():
    v = _status_kib("VmRSS")
    return None if v is None else v / 1024.0


def peak_rss_mib():
    """Peak RSS of this process in MiB (VmHWM, or ru_maxrss off Linux)."""
    v = _status_kib("VmHWM")
    if v is not None:
        return v / 1024.0
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0


def _children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def _tree(pid):
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


def _uss_kib(pid):
    """Private (unshared) resident memory of a process: Private_Clean + Private_Dirty."""
    tot = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    tot = (tot or 0) + int(line.split()[1])
    except OSError:
        pass
    return tot


class TreeMemSampler:
    """Polls RSS(main) + sum of USS(descendants) of a process tree (Linux only).

    That is the memory the whole tree really holds: worker pages still shared
    copy-on-write with the main process are counted once, in the main's RSS.
    Reading a worker's smaps_rollup costs a few ms of kernel time, so sample
    sparingly; nothing beyond /proc/<pid>/status is read for a lone process.
    """

    def __init__(self, pid, worker_interval=0.5):
        self.pid = pid
        self.peak_total_kib = 0
        self.max_procs = 0
        self.worker_interval = worker_interval
        self._workers_kib = 0
        self._next_workers = 0.0
        self.ok = os.path.exists(f"/proc/{pid}/smaps_rollup")

    def sample(self):
        """Cheap main-process sample every call; workers' USS every worker_interval s."""
        if not self.ok:
            return
        main = _status_kib("VmRSS", self.pid)
        if main is None:
            return
        now = time.perf_counter()
        if now >= self._next_workers:
            self._next_workers = now + self.worker_interval
            procs = _tree(self.pid)
            self.max_procs = max(self.max_procs, len(procs))
            self._workers_kib = sum(_uss_kib(p) or 0 for p in procs[1:])
        self.peak_total_kib = max(self.peak_total_kib, main + self._workers_kib)


# ----------------------------------------------------------------------------
# child side


def child_config(argv=None):
    """Return the config dict if this process is a benchmark child, else None."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "--_child":
        return json.loads(argv[1])
    return None


def emit_result(result: dict):
    """Child: print the result where the parent will find it."""
    result.setdefault("rss_peak_mib", peak_rss_mib())
    sys.stdout.write("\n" + RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def time_loader(make_loader, *, epochs=1, max_batches=None, batch_len=None, on_batch=None):
    """Child: build a loader with ``make_loader()`` and iterate it.

    Returns a dict with
      ttfb_s      time from the start of make_loader() to the first batch
      rate        samples/s after warm-up: samples after the first batch divided
                  by the time from the first batch to the end (later epochs,
                  including any worker restarts, are counted in full)
      total_s     time from the start of make_loader() to the end
      samples, batches
    ``max_batches`` caps the batches per epoch.  ``batch_len(batch)`` gives the
    number of samples in a batch (default: len(batch[0])).
    """
    import gc

    if batch_len is None:
        def batch_len(b):
            return len(b[0]) if isinstance(b, (tuple, list)) else len(b)
    gc.collect()
    base = rss_now_mib()
    t0 = time.perf_counter()
    loader = make_loader()
    t_first = None
    n_first = 0
    samples = batches = 0
    for _ in range(epochs):
        for i, batch in enumerate(loader):
            n = batch_len(batch)
            if on_batch is not None:
                on_batch(batch)
            samples += n
            batches += 1
            if t_first is None:
                t_first = time.perf_counter()
                n_first = n
            del batch
            if max_batches is not None and i + 1 >= max_batches:
                break
    t_end = time.perf_counter()
    del loader
    after = samples - n_first
    dt = t_end - (t_first if t_first is not None else t0)
    return dict(ttfb_s=(t_first - t0) if t_first is not None else None,
                rate=(after / dt) if after and dt > 0 else None,
                total_s=t_end - t0, samples=samples, batches=batches, base_rss_mib=base)


# ----------------------------------------------------------------------------
# parent side


def run_child(script, config, *, timeout=600, mem_interval=0.5, env=None):
    """Run ``python script --_child JSON`` and return its result dict.

    On failure the dict has an ``error`` key with the tail of stderr.
    """
    cmd = [sys.executable, script, "--_child", json.dumps(config)]
    e = dict(os.environ)
    e.setdefault("PYTHONHASHSEED", "0")
    if env:
        e.update(env)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, text=True)
    import threading

    out_chunks, err_chunks = [], []
    readers = [threading.Thread(target=lambda s=s, c=c: c.append(s.read()), daemon=True)
               for s, c in ((proc.stdout, out_chunks), (proc.stderr, err_chunks))]
    for r in readers:
        r.start()
    sampler = TreeMemSampler(proc.pid, worker_interval=mem_interval or 0.5)
    killed = False
    while True:
        try:
            proc.wait(timeout=0.05 if mem_interval and mem_interval > 0 else 1.0)
            break
        except subprocess.TimeoutExpired:
            if mem_interval and mem_interval > 0:
                sampler.sample()
            if time.perf_counter() - t0 > timeout:
                proc.kill()
                proc.wait()
                killed = True
                break
    for r in readers:
        r.join()
    out, err = "".join(out_chunks), "".join(err_chunks)
    res = None
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            res = json.loads(line[len(RESULT_PREFIX):])
    if res is None:
        tail = "\n".join(err.strip().splitlines()[-15:])
        why = f"timed out after {timeout}s" if killed else f"exit status {proc.returncode}"
        res = {"error": f"{why}\n{tail}"}
    if sampler.ok and sampler.peak_total_kib and "error" not in res:
        # the sampled tree total, but never below the exactly known main-process peak
        res["total_peak_mib"] = max(sampler.peak_total_kib / 1024.0, res.get("rss_peak_mib") or 0.0)
        res["max_procs"] = sampler.max_procs
    res["wall_s"] = time.perf_counter() - t0
    return res


def run_interleaved(groups, rounds, runner, *, log=None):
    """Run every group's configurations ``rounds`` times, interleaved.

    ``groups`` is a list of (group_key, [(impl, config), ...]).  In each round
    the groups run in order and, within a group, the impls run back to back,
    with the order rotated every round (and per group) so neither loader
    systematically goes first.  ``runner(config) -> result dict``.
    Returns {(group_key, impl): [result, ...]}.
    """
    results = {}
    total = rounds * sum(len(c) for _, c in groups)
    done = 0
    t0 = time.perf_counter()
    for r in range(rounds):
        for gi, (key, configs) in enumerate(groups):
            k = (r + gi) % len(configs)
            order = configs[k:] + configs[:k]
            for impl, cfg in order:
                res = runner(cfg)
                results.setdefault((key, impl), []).append(res)
                done += 1
                if log is not None:
                    log(f"[{done}/{total} {time.perf_counter() - t0:6.1f}s] round {r + 1} {key} {impl}: "
                        + short_result(res))
    return results


def short_result(res):
    if "error" in res:
        return "ERROR " + res["error"].strip().splitlines()[-1] if res["error"].strip() else "ERROR"
    parts = []
    if res.get("rate") is not None:
        parts.append(f"{res['rate']:.0f}/s")
    if res.get("ttfb_s") is not None:
        parts.append(f"first {res['ttfb_s']:.2f}s")
    if res.get("rss_peak_mib") is not None:
        parts.append(f"rss {res['rss_peak_mib']:.0f}M")
    if res.get("total_peak_mib") is not None:
        parts.append(f"total {res['total_peak_mib']:.0f}M")
    return ", ".join(parts)


def median_of(results, field):
    vals = [r[field] for r in results if "error" not in r and r.get(field) is not None]
    return statistics.median(vals) if vals else None


def paired_ratio(a_results, b_results, field):
    """Median over rounds of a[i][field] / b[i][field] (same-round pairs)."""
    ratios = []
    for a, b in zip(a_results, b_results):
        va, vb = a.get(field), b.get(field)
        if "error" in a or "error" in b or not va or not vb:
            continue
        ratios.append(va / vb)
    return statistics.median(ratios) if ratios else None


def spread(results, field):
    """(min, max) over rounds, for showing the noise."""
    vals = [r[field] for r in results if "error" not in r and r.get(field) is not None]
    return (min(vals), max(vals)) if vals else (None, None)


# ----------------------------------------------------------------------------
# output


def fmt(v, spec=".0f", none="-"):
    if v is None:
        return none
    if isinstance(v, str):
        return v
    return format(v, spec)


def fmt_ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def markdown_table(headers, rows, align=None):
    """Return a Markdown pipe table (also readable as plain text)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    align = align or (["l"] + ["r"] * (len(headers) - 1))

    def line(cells):
        out = []
        for c, w, a in zip(cells, widths, align):
            out.append(c.rjust(w) if a == "r" else c.ljust(w))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2))
                         for w, a in zip(widths, align)) + "|"
    return "\n".join([line([str(h) for h in headers]), sep] + [line(r) for r in rows])


def environment_lines():
    """A few Markdown bullet lines describing the machine and versions."""
    lines = []
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count()
    lines.append(f"- machine: {ncpu} CPUs ({cpu}), {platform.system()} {platform.release()}")
    try:
        la = os.getloadavg()
        lines.append(f"- load average at start: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    except OSError:
        pass
    vers = [f"python {platform.python_version()}"]
    for mod in ("torch", "torchvision", "numpy", "PIL"):
        try:
            m = __import__(mod)
            vers.append(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception:
            pass
    try:
        _ensure_repo_on_path()
        import fastloader

        vers.append(f"fastloader {getattr(fastloader, '__version__', '?')} ({os.path.dirname(fastloader.__file__)})")
    except Exception:
        vers.append("fastloader (not importable)")
    lines.append("- versions: " + ", ".join(vers))
    lines.append(f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    lines.append("- command: `" + " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]) + "`")
    return lines


class Report:
    """Collects Markdown text; echoes it to stdout and optionally writes --out."""

    def __init__(self, title):
        self.parts = [f"# {title}", ""]

    def add(self, text=""):
        self.parts.append(text)

    def text(self):
        return "\n".join(self.parts).rstrip() + "\n"

    def write(self, path):
        if path:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            with open(path, "w") as f:
                f.write(self.text())


def log(msg):
    print(msg, file=sys.stderr, flush=True)
