"""The machinery of the pytest benchmark suite (``pytest benchmarks/``).

One harness.  Every configuration is measured by the code the standalone
scripts and ``python -m fastloader bench`` use: a ``child(cfg)``-style
function (fastloader/tools/harness.py's ``pipeline_child``, a script's
``child``, or _children.py's for what no script measures) that times the
loader with ``harness.time_loader``, run in a fresh process by
``harness.run_child`` (the protocol of benchmarks/: peak memory per
configuration, no loader inheriting another's warm caches, threads or
allocator).  Nothing here times a loader itself.

pytest-benchmark does the bookkeeping: rounds, statistics, the tables,
``--benchmark-json``, ``--benchmark-save``/``--benchmark-compare``.  Its timer
for these tests (the ``timer=`` option of its ``benchmark`` marker) is
:func:`harness_clock`, a clock that moves only by what the harness measured
inside the measured process -- by default the seconds per sample after the
first batch, so pytest-benchmark's "OPS" is samples/s.  Timing the call to
``run_child`` itself would time starting Python and importing torch (2-5 s)
along with the loader.

Side by side.  The tests of one *group* -- one test function with the same
parameters but the ``loader`` -- are measured together when the first of them
runs: the loaders back to back, ``--bench-rounds`` rounds, the order rotated
per round (``harness.run_interleaved``, as the scripts do), so the drift of a
shared machine hits every loader alike; each test then hands its loader's
rounds to pytest-benchmark and checks its batches.  The terminal summary
shows, per group, the median over rounds of the paired ratios against the
group's baseline (torch's DataLoader, unless the test names another).

Quick mode (``--bench-quick``): a small sample and a few batches per run, one
round, every configuration run inside the pytest process (the same child
functions, no fresh interpreter), checking only that each runs and that its
batches are right (shape, dtype, count).  Its figures mean nothing.
"""
from __future__ import annotations

import copy
import importlib.util
import inspect
import math
import os
import statistics
import sys
import time
import traceback
from collections import namedtuple

import pytest

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

import _common as C  # noqa: E402

H = C.H
HARNESS = os.path.abspath(H.__file__)
CHILDREN = os.path.join(BENCH_DIR, "_children.py")


def script(name):
    """The path of a file in benchmarks/ (a script whose child function a test runs)."""
    return os.path.join(BENCH_DIR, name)


# One measured configuration: func(cfg) of the file target.
Child = namedtuple("Child", "target func cfg")

# ----------------------------------------------------------------------------
# pytest-benchmark's timer


_clock = [0.0]


def harness_clock():
    """pytest-benchmark's timer in this suite: the seconds that the harness
    measured inside the measured process, added up (see the module docstring)."""
    return _clock[0]


# ----------------------------------------------------------------------------
# loaders and what they need

# loader -> the module it needs (the peers: a test of a loader whose module is
# missing is skipped, and its group runs without it)
REQUIRES = {
    "torchdata": "torchdata.stateful_dataloader",
    "torchdata-same": "torchdata.stateful_dataloader",
    "webdataset": "webdataset",
}


def missing_module(mod):
    """``mod`` if it cannot be imported here (not installed), else None."""
    try:
        return None if importlib.util.find_spec(mod) is not None else mod
    except (ImportError, ValueError):
        return mod


def missing(loader):
    """The module the loader ``loader`` needs that is not installed, or None."""
    mod = REQUIRES.get(loader)
    return missing_module(mod) if mod else None


def loaders(*names):
    """The ``loader`` parameters of a test: a peer whose package is missing is skipped."""
    out = []
    for n in names:
        m = missing(n)
        out.append(pytest.param(n, id=n, marks=pytest.mark.skipif(m is not None, reason=f"{m} is not installed")))
    return out


def n_batches(count, batch_size, max_batches=None, epochs=1, drop_last=False):
    per = count // batch_size if drop_last else math.ceil(count / batch_size)
    if max_batches:
        per = min(per, max_batches)
    return per * epochs


def per_sample_s(r):
    """The default measure: seconds per sample after the first batch (1 / rate)."""
    rate = r.get("rate")
    return 1.0 / rate if rate else None


def field_s(name):
    """A measure that is a field of the result, in seconds."""
    def get(r):
        return r.get(name)

    get.__name__ = name
    return get


# ----------------------------------------------------------------------------
# the session's state


class Suite:
    """Options and the measured groups of one pytest session."""

    def __init__(self, config):
        opt = config.getoption
        self.quick = bool(opt("bench_quick"))
        self.rounds = opt("bench_rounds") or (1 if self.quick else 3)
        self.isolation = opt("bench_isolation") or ("inprocess" if self.quick else "process")
        # quick: one num_workers value, the one with worker threads / processes (the main-thread path
        # of num_workers=0 is the test suite's); --bench-workers 0,2 --bench-quick runs both
        self.workers = _int_list(opt("bench_workers") or ("2" if self.quick else "0,2"), "--bench-workers")
        self.n = opt("bench_n") or (256 if self.quick else 2000)
        self.max_batches_opt = opt("bench_max_batches")
        self.timeout = opt("bench_timeout") or (300.0 if self.quick else 900.0)
        self.mem_interval = 0.5
        self.groups = {}        # group key -> Group, in the order they ran

    def max_batches(self, full):
        """Batches per run: a few in quick mode, else --bench-max-batches or
        the benchmark's own default ``full`` (None: whole epochs)."""
        if self.quick:
            return 2
        return self.max_batches_opt or full

    # ---- running one configuration

    def execute(self, child):
        if self.isolation == "process":
            env = {"PYTHONPATH": os.pathsep.join([REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(
                os.pathsep) if p])}
            return H.run_child(child.target, child.func, child.cfg, timeout=self.timeout,
                               mem_interval=self.mem_interval, sys_path0=BENCH_DIR, env=env)
        return _run_here(child)


def _int_list(s, what):
    try:
        vals = [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise pytest.UsageError(f"{what} wants comma-separated integers, got {s!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise pytest.UsageError(f"{what} wants non-negative integers, got {s!r}")
    return list(dict.fromkeys(vals))


_MEMORY_FIELDS = ("rss_peak_mib", "peak_mib", "base_rss_mib", "rss_file_mib", "rss_anon_mib")


def _run_here(child):
    """Quick mode: child.func(child.cfg) in this process (memory figures dropped:
    they would be pytest's)."""
    t0 = time.perf_counter()
    try:
        if os.path.abspath(child.target) == HARNESS:
            mod = H
        else:
            mod = H._load_by_path(os.path.splitext(os.path.basename(child.target))[0], child.target)
        res = dict(getattr(mod, child.func)(copy.deepcopy(child.cfg)))
    except Exception as e:  # noqa: BLE001 - reported as the run's error, as run_child does
        res = {"error": f"{type(e).__name__}: {e}",
               "stderr": "\n".join(traceback.format_exc().strip().splitlines()[-15:])}
    for k in _MEMORY_FIELDS:
        res.pop(k, None)
    res["wall_s"] = time.perf_counter() - t0
    return res


# ----------------------------------------------------------------------------
# groups: the loaders of one configuration, measured side by side


def group_key(item):
    params = getattr(item, "callspec", None)
    params = dict(params.params) if params else {}
    params.pop("loader", None)
    return (item.nodeid.split("[")[0], tuple(sorted((k, repr(v)) for k, v in params.items())))


def item_loader(item):
    cs = getattr(item, "callspec", None)
    return cs.params.get("loader") if cs else None


class Group:
    def __init__(self, item, loaders, *, baseline, unit, measure, suite):
        self.family = item.nodeid.split("[")[0]
        fn = getattr(item, "function", None)
        doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
        self.title = doc[0].strip() if doc else self.family
        cs = getattr(item, "callspec", None)
        params = {k: v for k, v in (cs.params.items() if cs else ()) if k != "loader"}
        # in the order of the test function's arguments
        try:
            names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = []
        self.params = {k: params[k] for k in sorted(params, key=lambda k: names.index(k) if k in names else 99)}
        self.loaders = loaders
        self.baseline = baseline
        self.unit = unit
        self.measure = measure
        self.rounds = suite.rounds
        self.quick = suite.quick
        self.isolation = suite.isolation
        self.results = {}
        self.wall_s = 0.0
        self.family_loaders = list(loaders)
        self.known_failure = None

    @property
    def label(self):
        """The pytest-benchmark group: the test and its parameters but the loader."""
        name = self.family.split("::")[-1]
        ps = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{name}[{ps}]" if ps else name

    def run(self, config, suite, adapt=None):
        t0 = time.perf_counter()
        children = [(ld, config(ld)) for ld in self.loaders]

        def runner(child):
            r = suite.execute(child)
            return adapt(r) if adapt else r

        def after(step, r):  # one line per run on stderr (shown with -s, and for a failed test)
            sec = self.seconds(r)
            parts = ([] if sec is None else [f"{self._in_unit(sec):.4g} {self.unit}"]) + [C.short_result(r)]
            print(f"[{step['done']}/{step['total']} {step['elapsed']:6.1f}s] {self.label} {step['impl']}: "
                  + "; ".join(p for p in parts if p), file=sys.stderr, flush=True)

        res = H.run_interleaved([(self.label, children)], self.rounds, runner, after=after)
        self.results = {ld: res[(self.label, ld)] for ld in self.loaders}
        self.wall_s = time.perf_counter() - t0

    # ---- figures

    def seconds(self, r):
        if "error" in r:
            return None
        try:
            v = self.measure(r)
        except Exception:  # noqa: BLE001
            return None
        return v if v and v > 0 else None

    def _in_unit(self, sec):
        return 1.0 / sec if self.unit.endswith("/s") else sec * {"ms": 1e3, "us": 1e6}.get(self.unit, 1.0)

    def value(self, loader):
        """The loader's median figure in the group's unit (a rate for 'x/s' units)."""
        secs = [s for s in (self.seconds(r) for r in self.results.get(loader, ())) if s]
        return statistics.median(self._in_unit(s) for s in secs) if secs else None

    def speedup(self, loader):
        """Median over rounds of baseline seconds / loader seconds (>1: the loader is faster)."""
        if loader == self.baseline or self.baseline not in self.results:
            return None
        out = []
        for a, b in zip(self.results.get(loader, ()), self.results[self.baseline]):
            sa, sb = self.seconds(a), self.seconds(b)
            if sa and sb:
                out.append(sb / sa)
        return statistics.median(out) if out else None

    def ratio(self, loader, field):
        """Median over rounds of loader[field] / baseline[field] (first batch, memory: <1 is less)."""
        if loader == self.baseline or self.baseline not in self.results:
            return None
        r = H.paired_ratio(self.results.get(loader, []), self.results[self.baseline], field)
        return r

    def ok(self, loader):
        rs = self.results.get(loader, ())
        return bool(rs) and not any("error" in r for r in rs)

    def status(self, loader):
        """'ok', 'xfail' (every failure a known limitation) or 'FAILED'."""
        errs = [r for r in self.results.get(loader, ()) if "error" in r]
        if not errs:
            return "ok"
        kf = self.known_failure
        return "xfail" if kf and all(kf(loader, r) for r in errs) else "FAILED"

    def extra_info(self, loader):
        rs = self.results.get(loader, [])
        good = [r for r in rs if "error" not in r]

        def med(f):
            return H.median_of(good, f)

        info = {"loader": loader, "baseline": self.baseline, "group": self.label, "mode": "quick" if self.quick
                else "full", "isolation": self.isolation, "rounds": len(rs), "unit": self.unit,
                "value": self.value(loader), "speedup_vs_baseline": self.speedup(loader)}
        for f in ("rate", "ttfb_s", "batch_ms", "wait_pct", "peak_mib", "rss_peak_mib", "samples", "batches",
                  "state_bytes", "plan_s", "share"):
            v = med(f)
            if v is not None:
                info[f] = v
        for f in ("shape", "dtype"):
            vals = sorted({str(r.get(f)) for r in good if r.get(f) is not None})
            if vals:
                info[f] = vals[0] if len(vals) == 1 else vals
        for f in ("ttfb_s", "peak_mib"):
            v = self.ratio(loader, f)
            if v is not None:
                info[f"{f}_vs_baseline"] = v
        info["per_round"] = [{k: r.get(k) for k in ("rate", "ttfb_s", "peak_mib", "wall_s", "error") if k in r}
                             for r in rs]
        return info

    def as_json(self):
        return {"test": self.family, "title": self.title, "params": {k: _jsonable(v) for k, v in self.params.items()},
                "baseline": self.baseline, "unit": self.unit, "rounds": self.rounds, "wall_s": self.wall_s,
                "loaders": {ld: {"value": self.value(ld), "ok": self.ok(ld), "speedup_vs_baseline": self.speedup(ld),
                                 "ttfb_vs_baseline": self.ratio(ld, "ttfb_s"),
                                 "peak_mem_vs_baseline": self.ratio(ld, "peak_mib")}
                            for ld in self.loaders}}


def _jsonable(v):
    return v if isinstance(v, (int, float, str, bool)) or v is None else repr(v)


# ----------------------------------------------------------------------------
# the fixture's object


class Bench:
    """What a benchmark test calls: ``bench.run(config, expect=...)``."""

    def __init__(self, suite, request, benchmark):
        self.suite = suite
        self.request = request
        self.benchmark = benchmark

    @property
    def quick(self):
        return self.suite.quick

    def max_batches(self, full=None):
        return self.suite.max_batches(full)

    def run(self, config, *, expect=None, baseline="torch", unit="img/s", measure=per_sample_s, adapt=None,
            known_failure=None):
        """Measure this test's loader side by side with the rest of its group.

        config(loader) -> Child: the measured configuration of each loader of
        the group.  expect: what every run's batches must be -- shape (str,
        "64x3x224x224"), dtype (str), batches (int), samples (int), check
        (result -> message or None).  baseline: the loader the ratios are
        against.  unit: how the summary shows each loader's figure ("img/s",
        "samples/s": a rate; "ms", "us", "s": a time).  measure(result) ->
        seconds: what pytest-benchmark records per round (default: seconds per
        sample after the first batch).  adapt(result) -> result: applied to
        every run's result.  known_failure(loader, result) -> reason or None:
        a failure that is a known limitation (xfail), not a broken benchmark."""
        item = self.request.node
        loader = item_loader(item)
        key = group_key(item)
        suite = self.suite
        g = suite.groups.get(key)
        if g is None:
            names = []
            for it in self.request.session.items:
                if group_key(it) == key:
                    ld = item_loader(it)
                    if ld is not None and ld not in names and missing(ld) is None:
                        names.append(ld)
            if loader not in names:
                names.append(loader)
            g = Group(item, names, baseline=baseline, unit=unit, measure=measure, suite=suite)
            g.known_failure = known_failure
            fam = []  # the loaders of the whole test, in their parametrisation order (the summary's columns)
            for it in self.request.session.items:
                if group_key(it)[0] == key[0] and item_loader(it) not in fam:
                    fam.append(item_loader(it))
            g.family_loaders = fam
            suite.groups[key] = g
            g.run(config, suite, adapt)
        results = g.results[loader]
        bm = self.benchmark
        bm.group = g.label
        bm.extra_info.update(g.extra_info(loader))
        state = {"checked": False, "i": 0}

        def one_round():
            if not state["checked"]:
                state["checked"] = True
                try:
                    _check(loader, results, expect or {}, known_failure, g)
                except BaseException:
                    bm.has_error = True  # left out of pytest-benchmark's tables and JSON
                    raise
            r = results[state["i"]]
            state["i"] += 1
            _clock[0] += g.seconds(r)
            return r

        bm.pedantic(one_round, rounds=len(results), iterations=1, warmup_rounds=0)


def _check(loader, results, expect, known_failure, g):
    for i, r in enumerate(results, 1):
        if "error" in r:
            reason = known_failure(loader, r) if known_failure else None
            if reason:
                pytest.xfail(reason)
            detail = r["error"].strip() + (("\n" + r["stderr"]) if r.get("stderr") else "")
            pytest.fail(f"{loader} failed (round {i} of {len(results)}): {detail}", pytrace=False)
        problems = []
        for field in ("shape", "dtype", "batches", "samples"):
            if field in expect and expect[field] is not None and r.get(field) != expect[field]:
                problems.append(f"{field} {r.get(field)!r}, expected {expect[field]!r}")
        if expect.get("check"):
            msg = expect["check"](r)
            if msg:
                problems.append(msg)
        if g.seconds(r) is None:
            problems.append(f"no measurement ({getattr(g.measure, '__name__', 'measure')} of {r!r:.300})")
        if problems:
            pytest.fail(f"{loader}, round {i}: " + "; ".join(problems), pytrace=False)


# ----------------------------------------------------------------------------
# the terminal summary


def summary_tables(suite):
    """Markdown tables, one per benchmark test: each loader's median figure and
    its ratio to the group's baseline, per parameter set."""
    fams = {}
    for g in suite.groups.values():
        fams.setdefault(g.family, []).append(g)
    out = []
    for fam, groups in fams.items():
        present = {ld for g in groups for ld in g.loaders}
        loaders_ = [ld for ld in groups[0].family_loaders if ld in present]
        loaders_ += [ld for g in groups for ld in g.loaders if ld not in loaders_]
        base = groups[0].baseline
        others = [ld for ld in loaders_ if ld != base]
        fl = next((ld for ld in others if ld == "fastloader"), others[0] if others else None)
        pnames = list(groups[0].params)
        unit = groups[0].unit
        headers = pnames + [f"{ld} {unit}" for ld in loaders_] + [f"{ld}/{base}" for ld in others]
        # (the time to the first batch, where the figure is not itself a time)
        show_first = fl is not None and unit.endswith("/s") and any(g.ratio(fl, "ttfb_s") for g in groups)
        show_mem = fl is not None and any(g.ratio(fl, "peak_mib") for g in groups)
        if show_first:
            headers.append(f"{fl}/{base} first batch")
        if show_mem:
            headers.append(f"{fl}/{base} peak mem")
        rows = []
        for g in groups:
            row = [str(g.params[p]) for p in pnames]
            for ld in loaders_:
                if ld not in g.results:
                    row.append("-")
                elif not g.ok(ld):
                    row.append(g.status(ld))
                else:
                    v = g.value(ld)
                    row.append(H.fmt(v, ".0f" if unit.endswith("/s") or v is None or v >= 100 else ".3g"))
            row += [H.fmt_ratio(g.speedup(ld)) for ld in others]
            if show_first:
                row.append(H.fmt_ratio(g.ratio(fl, "ttfb_s")))
            if show_mem:
                row.append(H.fmt_ratio(g.ratio(fl, "peak_mib")))
            rows.append(row)
        extra = " / ".join(n for n, on in (("first batch", show_first), ("peak mem", show_mem)) if on)
        what = (f"{unit}: median over rounds" + (" (after the first batch)" if unit.endswith("/s") else "")
                + f"; X/{base}: median of the per-round ratios, >1 = X is faster"
                + (f"; {extra}: {fl}'s over {base}'s, <1 = less" if extra else ""))
        out.append(f"{fam}: {groups[0].title}\n({what})\n\n"
                   + H.markdown_table(headers, rows, align=["l"] * len(pnames) + ["r"] * (len(headers) - len(pnames))))
    return out
