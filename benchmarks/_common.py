"""What the benchmark scripts share beyond the harness.

The harness itself -- the pipelines, the timed loop, one fresh process per
configuration, the /proc memory readers, interleaved rounds and their
statistics, table formatting -- is fastloader/tools/harness.py, the same code
``python -m fastloader bench`` runs; its docstring says how time and memory are
measured.  It is imported as ``fastloader.tools.harness``, except where that
would import fastloader: in a measured process (so torch's never import it)
and without a built extension (so the torch half, ``--only torch``, still
runs); see ``_harness`` below.

This file adds what only the scripts need: importing an in-tree fastloader
with a clear message, the Markdown report with the machine's description, and
the side-by-side table of a loader comparison over several rounds.
"""
from __future__ import annotations

import datetime
import importlib.util
import os
import platform
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ensure_repo_on_path():
    """Make an in-tree fastloader importable if no installed one is."""
    if importlib.util.find_spec("fastloader") is None and REPO not in sys.path:
        sys.path.insert(0, REPO)


def _load_alone(relpath, name):
    """The module at REPO/relpath loaded from its file alone, without the
    package (which needs the built extension)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, relpath))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _harness():
    # a measured process has the harness already, loaded from its file by
    # harness.CHILD_BOOT without the package: reuse it, so that importing this
    # file there does not import fastloader into torch's measured processes
    mod = sys.modules.get("_fastloader_harness")  # harness.MODULE_NAME
    if mod is not None:
        return mod
    _ensure_repo_on_path()
    try:
        from fastloader.tools import harness
    except ImportError:
        # no built extension, so no `import fastloader`; the harness needs only
        # the standard library, so load its file alone, as CHILD_BOOT does
        harness = _load_alone(os.path.join("fastloader", "tools", "harness.py"), "_fastloader_harness")
    return harness


H = _harness()
rss_now_mib = H.rss_now_mib
median_of, spread, paired_ratio = H.median_of, H.spread, H.paired_ratio
fmt, fmt_ratio, markdown_table = H.fmt, H.fmt_ratio, H.markdown_table


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# running the measured processes


def run_child(script, config, *, mem_interval=0.5, timeout=600, env=None, pss=False):
    """Run ``child(config)`` of the benchmark ``script`` in a fresh process
    (with the script's folder first on sys.path, as ``python script`` has it;
    ``env``: variables to set there, e.g. PYTHONPATH of another checkout;
    ``pss``: also the tree's summed PSS, see harness.run_child)."""
    return H.run_child(script, "child", config, timeout=timeout, mem_interval=mem_interval,
                       sys_path0=os.path.dirname(os.path.abspath(script)), env=env, pss=pss)


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
    if res.get("peak_mib") is not None:
        parts.append(f"total {res['peak_mib']:.0f}M")
    return ", ".join(parts)


def compile_fastloader():
    """Byte-compile the fastloader package the measured processes import
    (its .py files to __pycache__, only those whose .pyc is missing or
    stale), once, before they start.

    A regular ``pip install`` does this at install time, and torch and
    torchvision come that way; an editable install (scripts/setup.sh) does
    not, and with PYTHONDONTWRITEBYTECODE set, as on the machines these
    figures come from, Python never writes the .pyc itself: every measured
    process would compile fastloader's ~9,000 lines again (about 50 ms and,
    from the compiler's freed arenas, 4 MiB more heap in each process that
    imports it), a cost the installed package does not have.  A .pyc that
    cannot be written is reported, not hidden."""
    import compileall
    import importlib.util

    _ensure_repo_on_path()
    spec = importlib.util.find_spec("fastloader")
    if spec is None or not spec.origin:
        return
    pkg = os.path.dirname(spec.origin)
    if not compileall.compile_dir(pkg, quiet=1):
        log(f"warning: could not byte-compile {pkg}: fastloader's processes compile it at import")


def run_interleaved(groups, rounds, runner, *, log=log):
    """H.run_interleaved with one progress line per run on stderr (fastloader
    byte-compiled first: compile_fastloader)."""
    compile_fastloader()

    def after(s, res):
        log(f"[{s['done']}/{s['total']} {s['elapsed']:6.1f}s] round {s['round']} {s['key']} {s['impl']}: "
            + short_result(res))

    return H.run_interleaved(groups, rounds, runner, after=after if log else None)


# ----------------------------------------------------------------------------
# imports


class FastloaderMissing(RuntimeError):
    pass


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
    """Return fastloader.tools.sample, loading it from the source tree if the package
    itself cannot be imported (for example before the C extension is built)."""
    _ensure_repo_on_path()
    try:
        from fastloader.tools import sample
        return sample
    except Exception:
        return _load_alone(os.path.join("fastloader", "tools", "sample.py"), "_fastloader_sample_standalone")


# ----------------------------------------------------------------------------
# report


def comparison_table(res, group, workers, impls, labels, unit):
    """The per-num_workers table of a loader comparison: for each loader the
    median ``unit``/s (min-max over rounds), first batch and RSS/total memory,
    and with two loaders the median paired fastloader/torch ratios.
    ``res[((group, w), impl)]`` is the list of results of one configuration."""
    headers = ["workers"]
    for impl in impls:
        lab = labels[impl]
        headers += [f"{lab} {unit}/s", f"{lab} first (s)", f"{lab} RSS/total (MiB)"]
    if len(impls) == 2:
        headers += [f"ratio {unit}/s", "ratio first", "ratio total mem"]
    rows = []
    for w in workers:
        row = [str(w)]
        for impl in impls:
            rs = res[((group, w), impl)]
            if all("error" in r for r in rs):
                row += ["ERROR", "-", "-"]
                continue
            lo, hi = spread(rs, "rate")
            rate = fmt(median_of(rs, "rate")) + (f" ({lo:.0f}-{hi:.0f})" if len(rs) > 1 and lo is not None else "")
            row += [rate, fmt(median_of(rs, "ttfb_s"), ".2f"),
                    f"{fmt(median_of(rs, 'rss_peak_mib'))} / {fmt(median_of(rs, 'peak_mib'))}"]
        if len(impls) == 2:
            f_, t_ = res[((group, w), "fastloader")], res[((group, w), "torch")]
            row += [fmt_ratio(paired_ratio(f_, t_, "rate")), fmt_ratio(paired_ratio(f_, t_, "ttfb_s")),
                    fmt_ratio(paired_ratio(f_, t_, "peak_mib"))]
        rows.append(row)
    return markdown_table(headers, rows)


def distinct_warnings(caught, limit, width=None):
    """The first `limit` distinct warnings of a warnings.catch_warnings(record=True)
    list, each as "Category: message" on one line (cut to `width` characters)."""
    seen = []
    for w in caught or ():
        s = f"{w.category.__name__}: {' '.join(str(w.message).split())}"
        if width:
            s = s[:width]
        if s not in seen:
            seen.append(s)
    return seen[:limit]


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
    lines.append(f"- machine: {H.usable_cpus()} CPUs ({cpu}), {platform.system()} {platform.release()}")
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

    def finish(self, res, path):
        """Add an "Errors" section for the failed runs in ``res`` (the first
        10), print the report, write it to ``path`` if given; returns the exit
        status (1 if any run failed)."""
        errors = [(k, r) for k, v in res.items() for r in v if "error" in r]
        if errors:
            self.add("## Errors")
            self.add("")
            for (key, impl), r in errors[:10]:
                detail = r["error"] + ("\n" + r["stderr"] if r.get("stderr") else "")
                self.add(f"- {key} {impl}:\n```\n{detail}\n```")
        print(self.text())
        self.write(path)
        return 1 if errors else 0

    def text(self):
        return "\n".join(self.parts).rstrip() + "\n"

    def write(self, path):
        if path:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            with open(path, "w") as f:
                f.write(self.text())
