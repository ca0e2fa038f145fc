"""``pytest benchmarks/``: the benchmarks as a pytest suite (pytest-benchmark).

    pytest benchmarks/                                   # every benchmark, fastloader vs torch side by side
    pytest benchmarks/ --bench-quick                     # a few batches each: does every benchmark run, right batches?
    pytest benchmarks/test_bench_pipelines.py --bench-workers 0,2,4 --benchmark-json out.json
    pytest benchmarks/ --benchmark-autosave ... ; later: pytest benchmarks/ --benchmark-compare

How the figures are made (one harness, fresh processes, loaders interleaved,
the ratio summary): see _suite.py's docstring.  This file holds the options,
the cached sample data and the hooks.  It applies to benchmarks/ only: the
project's test suite is tests/ (pyproject's testpaths), which never loads it.
"""
from __future__ import annotations

import glob
import os
import sys
from collections import namedtuple

import pytest

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
# the in-tree build, whatever else is installed (the measured processes get it through PYTHONPATH)
if sys.path[:1] != [REPO]:
    sys.path.insert(0, REPO)
if BENCH_DIR not in sys.path:
    sys.path.insert(1, BENCH_DIR)

import _suite as S  # noqa: E402

SUITE = pytest.StashKey()


# ----------------------------------------------------------------------------
# options


def pytest_addoption(parser):
    g = parser.getgroup("fastloader benchmarks", "fastloader benchmarks (benchmarks/conftest.py)")
    g.addoption("--bench-quick", action="store_true",
                help="a few batches per run on a small sample, one round, in this process: checks that every "
                     "benchmark runs and that its batches are right (shape, dtype, count); the figures mean nothing")
    g.addoption("--bench-workers", metavar="LIST", default=None,
                help="comma-separated num_workers values, every loader (default 0,2; quick 2)")
    g.addoption("--bench-rounds", type=int, default=None, metavar="R",
                help="interleaved rounds per group: each a fresh process per loader (default 3; quick 1)")
    g.addoption("--bench-n", type=int, default=None, metavar="N",
                help="images in the sample folder (default 2000; quick 256)")
    g.addoption("--bench-max-batches", type=int, default=None, metavar="B",
                help="at most this many batches per run (default: each benchmark's own, often a whole epoch)")
    g.addoption("--bench-isolation", choices=["process", "inprocess"], default=None,
                help="process: each run in a fresh Python process (default; how benchmarks/ measures); "
                     "inprocess: in the pytest process (the default of --bench-quick)")
    g.addoption("--bench-timeout", type=float, default=None, metavar="S",
                help="seconds per run before it is killed (default 900; quick 300)")
    g.addoption("--bench-cache", metavar="DIR", default=None,
                help="where the sample data is made once and kept (default $FASTLOADER_CACHE, else "
                     "~/.cache/fastloader, as the scripts)")


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("benchmark"):
        raise pytest.UsageError("benchmarks/ needs pytest-benchmark: pip install pytest-benchmark "
                                "(scripts/setup.sh installs it)")
    if config.getoption("bench_cache"):
        os.environ["FASTLOADER_CACHE"] = os.path.abspath(os.path.expanduser(config.getoption("bench_cache")))
    # saved runs (--benchmark-save/--benchmark-autosave, read by --benchmark-compare) go to
    # benchmarks/.benchmarks/ (git-ignored there), not the working directory, unless told otherwise
    if config.getoption("benchmark_storage") == "file://./.benchmarks":
        config.option.benchmark_storage = "file://" + os.path.join(BENCH_DIR, ".benchmarks")
    config.stash[SUITE] = S.Suite(config)
    # torchdata 0.11's StatefulDataLoader calls a torch function that torch 2.14 deprecates
    config.addinivalue_line("filterwarnings", "ignore:'set_vital' is deprecated:UserWarning")
    # more num_workers than CPUs is a setting the benchmarks measure on purpose
    config.addinivalue_line("filterwarnings", "ignore:This DataLoader will create:UserWarning")


def _fastloader_line():
    try:
        import fastloader
    except Exception as e:  # noqa: BLE001
        return f"fastloader: cannot import the in-tree build ({type(e).__name__}: {e}); build it: pip install -e ."
    where = os.path.dirname(os.path.abspath(fastloader.__file__))
    line = f"fastloader {getattr(fastloader, '__version__', '?')} from {where}"
    if where != os.path.join(REPO, "fastloader"):
        line += f"  (NOT the in-tree build at {REPO})"
    return line


def pytest_report_header(config):
    suite = config.stash.get(SUITE, None)
    if suite is None:
        return None
    mode = ("quick mode (--bench-quick): a few batches per run, figures mean nothing" if suite.quick
            else f"{suite.rounds} interleaved round(s) per group")
    return [
        f"fastloader benchmarks: {mode}; num_workers {','.join(map(str, suite.workers))}; sample of {suite.n} "
        f"images; each run {'in a fresh process' if suite.isolation == 'process' else 'in this process'}",
        "  " + _fastloader_line(),
        "  pytest-benchmark's time per round = what the harness measured inside the run (default: seconds per "
        "sample after the first batch, so OPS = samples/s); ratios: see the summary at the end",
    ]


# ----------------------------------------------------------------------------
# parametrisation, order, the timer


def pytest_generate_tests(metafunc):
    if "workers" in metafunc.fixturenames and not any(
            m.args and "workers" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize")):
        ws = metafunc.config.stash[SUITE].workers
        metafunc.parametrize("workers", ws, ids=[f"nw{w}" for w in ws])


def _ours(item):
    return str(item.path).startswith(BENCH_DIR + os.sep)


def pytest_collection_modifyitems(session, config, items):
    keep, dropped = [], []
    for it in items:
        excl = getattr(getattr(it, "module", None), "EXCLUDE", None) if _ours(it) else None
        cs = getattr(it, "callspec", None)
        if excl is not None and cs is not None and excl(dict(cs.params)):
            dropped.append(it)
        else:
            keep.append(it)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    # the tests of one group next to each other (they are measured together), groups in their first order
    first = {}
    for i, it in enumerate(keep):
        if _ours(it):
            first.setdefault(S.group_key(it), i)
    order = {id(it): (first[S.group_key(it)] if _ours(it) else i, i) for i, it in enumerate(keep)}
    keep.sort(key=lambda it: order[id(it)])
    for it in keep:
        if _ours(it):
            # pytest-benchmark's timer for these tests: the harness's measurement (see _suite.py)
            it.add_marker(pytest.mark.benchmark(timer=S.harness_clock, warmup=False, disable_gc=False))
    items[:] = keep


# ----------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def suite(pytestconfig):
    return pytestconfig.stash[SUITE]


@pytest.fixture
def bench(suite, request, benchmark):
    """Measure this test's loader side by side with its group: ``bench.run(config, expect=...)``."""
    return S.Bench(suite, request, benchmark)


def _fastloader():
    try:
        return S.C.import_fastloader("DataLoader", "ImageFolder")
    except S.C.FastloaderMissing as e:
        pytest.exit(f"benchmarks: {e}", returncode=4)


Sample = namedtuple("Sample", "root count stats")


def cache_dir():
    """The folder the sample data is kept in, as fastloader.tools.sample's (and the scripts') cache."""
    return os.path.dirname(S.C.load_sample_module().default_sample_dir())


def _newest_mtime(root):
    import bench_sources as BS

    return BS._newest_mtime(root)


def _warm(path):
    import bench_sources as BS

    return BS._warm(path)


@pytest.fixture(scope="session")
def sample(suite):
    """The project's sample images (fastloader.tools.sample, --bench-n JPEGs), made once and cached."""
    _fastloader()
    mod = S.C.load_sample_module()
    root = mod.ensure_sample(suite.n, progress=False)
    count = sum(1 for d, _, fs in os.walk(root) for f in fs if f.lower().endswith((".jpg", ".jpeg")))
    _warm(root)
    return Sample(root, count, mod.read_stats(root))


@pytest.fixture(scope="session")
def work_dir():
    """Converted copies of the sample (LMDB, shards, a `datasets` table), kept like bench_sources.py's."""
    d = os.path.join(cache_dir(), "bench-sources")
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def lmdb_path(sample, work_dir):
    import bench_sources as BS

    path, _ = BS._prepare_lmdb(sample.root, work_dir, False)
    _warm(path)
    return path


Shards = namedtuple("Shards", "dir files")


@pytest.fixture(scope="session")
def shards(suite, sample, work_dir):
    """The sample packed into tar shards (python -m fastloader pack shards): 20 MB each as
    bench_shards.py packs them, 4 MB in quick mode so that its few images still make several."""
    from fastloader.tools.pack import pack_shards

    size = 4_000_000 if suite.quick else 20_000_000
    out = os.path.join(work_dir, f"{os.path.basename(os.path.normpath(sample.root))}.shards-{size // 10**6}MB")
    index = os.path.join(out, "index.json")
    if not (os.path.exists(index) and os.path.getmtime(index) >= _newest_mtime(sample.root)):
        pack_shards(sample.root, out, shard_size=size, progress=False, overwrite=True)
    _warm(out)
    return Shards(out, sorted(glob.glob(os.path.join(out, "*.tar"))))


@pytest.fixture(scope="session")
def shard_server(shards, tmp_path_factory):
    """nginx on loopback serving the shards (tests/nginx_server.py, as bench_shards.py)."""
    mod = S.H._load_by_path("_fl_nginx_server", os.path.join(REPO, "tests", "nginx_server.py"))
    if not mod.nginx_available():
        pytest.skip("nginx is not installed (scripts/setup.sh installs it)")
    server = mod.NginxServer(shards.dir, str(tmp_path_factory.mktemp("nginx")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


Arrays = namedtuple("Arrays", "dir tokens images")


@pytest.fixture(scope="session")
def arrays(suite):
    """bench_arrays.py's .npy files (tokens: int64 rows + labels; images: uint8 HWC + labels), made once;
    in quick mode a tenth of the rows."""
    import numpy as np

    import bench_arrays as BA

    tokens, images = BA.TOKENS, BA.IMAGES
    if suite.quick:
        tokens, images = (tokens[0] // 10,) + tokens[1:], (images[0] // 10,) + images[1:]
    d = os.path.join(cache_dir(), f"bench-arrays-{tokens[0]}x{tokens[1]}-{images[0]}")
    marker = os.path.join(d, ".complete")
    if not os.path.exists(marker):
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng(0)  # as bench_arrays.make_data
        todo = {
            "tokens.npy": lambda: rng.integers(0, 50_000, size=tokens, dtype=np.int64),
            "token_labels.npy": lambda: rng.integers(0, 10, size=tokens[0], dtype=np.int64),
            "images.npy": lambda: rng.integers(0, 256, size=images, dtype=np.uint8),
            "image_labels.npy": lambda: rng.integers(0, 100, size=images[0], dtype=np.int64),
        }
        for name, make in todo.items():
            np.save(os.path.join(d, name), make())
        open(marker, "w").close()
    _warm(d)
    return Arrays(d, tokens, images)


@pytest.fixture(scope="session")
def hf_table(sample, work_dir):
    """The sample as a saved Hugging Face `datasets` table (images embedded), made once as bench_hf.py does."""
    if S.missing_module("datasets"):
        pytest.skip("datasets is not installed")
    import datasets

    import bench_hf as BH

    datasets.disable_progress_bars()
    path, _ = BH._prepare(sample.root, work_dir, False)
    _warm(path)
    return path


# ----------------------------------------------------------------------------
# the summary: ratios from this run


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    suite = config.stash.get(SUITE, None)
    if suite is None or not suite.groups:
        return
    tr = terminalreporter
    tr.ensure_newline()
    tr.section("fastloader benchmarks: ratios measured side by side in this run", sep="=", bold=True)
    where = "in fresh processes" if suite.isolation == "process" else "in the pytest process"
    if suite.quick:
        tr.write_line(f"QUICK MODE: a few batches per run, {where}: these figures check that the benchmarks run, "
                      "they measure nothing.")
    else:
        tr.write_line(f"each figure: {suite.rounds} round(s), the loaders of a row back to back {where}, the order "
                      "rotated per round (fastloader/tools/harness.py).")
    for table in S.summary_tables(suite):
        tr.write_line("")
        for line in table.splitlines():
            tr.write_line(line)


def pytest_benchmark_update_json(config, benchmarks, output_json):
    suite = config.stash.get(SUITE, None)
    if suite is None:
        return
    output_json["fastloader"] = {
        "mode": "quick" if suite.quick else "full", "rounds": suite.rounds, "isolation": suite.isolation,
        "workers": suite.workers, "sample_images": suite.n,
        "measure": "pytest-benchmark's times are what the harness measured inside each run: by default seconds "
                   "per sample after the first batch (ops = samples/s); see each benchmark's extra_info",
        "groups": [g.as_json() for g in suite.groups.values()],
    }
