"""fastloader.tune / python -m fastloader tune: the search finds a known best
configuration on made-up datasets and steps, never runs a configuration its
memory prediction puts over the limit, and writes its table, heatmap and JSON.

Real measurements use tiny datasets (tests/helpers_tune.py) whose best is
known by construction; the search logic itself is also driven with a fake
measurement (``runner=``), which is exact and instant."""
from __future__ import annotations

import inspect
import json
import os

import pytest

import fastloader
from fastloader import __main__ as cli
from fastloader import sysinfo
from fastloader.tools import tuning

pytestmark = pytest.mark.fastloader_only

# worker_mode pinned to threads: these tests are about the other axes (the
# worker_mode axis has its own test below)
FAST = dict(prefetch_factors=[2], persistent_workers=[False], epochs=1, confirm=False, device="cpu",
            worker_modes=["thread"])


def _rec(res):
    return res["recommended"]["config"]


# ----------------------------------------------------------------------------
# real measurements, known best


def test_step_dominates_fewest_workers_win():
    """A 20 ms step and loading that costs next to nothing: every num_workers
    gives the same samples/s, so the fewest (0) is recommended, and the
    reasons say loading is hidden."""
    res = tuning.tune("helpers_tune:cheap", "helpers_tune:step_20ms", batch_sizes=[16], num_workers=[0, 1, 2],
                      samples=160, isolate=False, tolerance=0.10, stop_gain=0.10, **FAST)
    assert _rec(res)["num_workers"] == 0, res["results"]
    rates = [r["rate"] for r in res["results"]]
    assert max(rates) < 16 / 0.020 * 1.05  # the step's ceiling: 800 samples/s
    assert any("hidden" in r for r in res["recommended"]["reasons"])


def test_loading_dominates_most_workers_win():
    """4 ms of waiting per sample (GIL released, no CPU): threads overlap it,
    so the most workers (4) win; the downward walk stops at 1 worker, so 0
    is never run."""
    res = tuning.tune("helpers_tune:slow_io", batch_sizes=[8], num_workers=[0, 1, 2, 4], samples=96,
                      isolate=False, **FAST)
    by_w = {r["num_workers"]: r["rate"] for r in res["results"]}
    assert _rec(res)["num_workers"] == 4, by_w
    assert by_w[4] > 1.5 * by_w[2] > 1.5 * by_w[1]
    assert 0 not in by_w  # 1 worker already lost; fewer was not worth a run
    assert res["recommended"]["wait_pct"] > 50  # nothing to hide it behind


@pytest.mark.skipif(os.environ.get("FASTLOADER_UNDER_ASAN") == "1",
                    reason="ASan's shadow memory and quarantine change the peak RSS this test's limit is sized for")
def test_memory_cap_rules_out_the_largest_batch(monkeypatch, tmp_path):
    """2 MiB samples and a 100 ms step: bigger batches are faster, but with a
    faked 1.5 GiB limit the batch of 128 (1 GiB of batches in flight on top
    of the process) is predicted over it and never run.  Each configuration
    runs in a fresh process (the default), from "module:callable" strings."""
    monkeypatch.setattr(sysinfo, "memory_limits", lambda: (1536 << 20, 1536 << 20))
    started = []
    res = tuning.tune("helpers_tune:big", "helpers_tune:step_100ms", batch_sizes=[4, 8, 128], num_workers=[1],
                      samples=16, min_batches=4, on_start=lambda c, p: started.append(c["batch_size"]), **FAST)
    assert started == [4, 8], res["results"]
    rates = {r["batch_size"]: r["rate"] for r in res["results"]}
    assert rates[8] > 1.05 * rates[4]  # so the search wanted to go on
    (skip,) = res["skipped"]
    assert skip["config"]["batch_size"] == 128 and skip["predicted_mib"] > res["memory"]["budget_mib"]
    assert res["memory"]["budget_mib"] == pytest.approx(0.9 * 1536)
    for r in res["results"]:  # measured (process + sampled tree) and under the limit, as predicted
        assert 100 < r["peak_mib"] < res["memory"]["budget_mib"]
        assert r["sample_bytes"] == 2 << 20
    assert _rec(res)["batch_size"] == 8
    assert any(r.startswith("batch 128 was not run: predicted peak host memory")
               for r in res["recommended"]["reasons"])
    cell = next(c for c in res["cells"] if c["batch_size"] == 128)
    assert cell["over_limit"] and cell["rate"] is None
    json.dumps(res)  # the CLI writes it as it is


# ----------------------------------------------------------------------------
# the search, with a fake measurement


def _fake_runner(auto_workers, *, mode_speed=None):
    """250 samples/s per worker up to 4 workers (0 workers: 0.9 of one);
    a 20 ms step per batch; 1 MiB samples; persistent workers start 20 ms
    faster; prefetch_factor 4 is 1% slower."""
    def run(cfg):
        nw = auto_workers if cfg["num_workers"] == "auto" else cfg["num_workers"]
        load = 250.0 * min(max(nw, 0.9), 4)
        if mode_speed:
            load *= mode_speed.get(cfg["worker_mode"], 1.0)
        rate = min(load, cfg["batch_size"] / 0.020) * (0.99 if cfg["prefetch_factor"] == 4 else 1.0)
        inflight = tuning.inflight_batches(nw, cfg["prefetch_factor"] or 0)
        return {"rate": rate, "wait_pct": 100.0 if load < cfg["batch_size"] / 0.020 else 1.0, "ttfb_s": 0.1,
                "epoch_start_s": 0.03 if cfg["persistent_workers"] else 0.05,
                "peak_mib": 500 + cfg["batch_size"] * inflight, "sample_bytes": 1 << 20, "base_rss_mib": 480,
                "dataset_len": 100000, "wall_s": 0.0}
    return run


def _fake_tune(**kw):
    from fastloader.loader import auto_worker_limit

    args = dict(batch_sizes=[16, 32, 64, 128, 256], num_workers=list(range(9)) + ["auto"], device="cpu",
                isolate=False, runner=_fake_runner(auto_worker_limit()), memory_limit=64 << 30,
                worker_modes=["thread"])
    args.update(kw)
    return tuning.tune("made.up:dataset", **args)


def test_search_matches_the_exhaustive_sweep_with_a_fraction_of_the_runs():
    fast = _fake_tune()
    full = _fake_tune(exhaustive_sweep=True)
    # 4 workers reach the loading limit; batch 32 is the smallest the 20 ms step does not cap below it
    assert _rec(fast) == _rec(full) == dict(_rec(full), batch_size=32, num_workers=4, prefetch_factor=2,
                                            persistent_workers=True)
    assert full["runs"] == full["grid_size"] == len(tuning.Grid([16, 32, 64, 128, 256], list(range(9)) + ["auto"])
                                                    .configs())
    assert fast["runs"] <= full["runs"] / 4, [(r["phase"], r["batch_size"], r["num_workers"]) for r in fast["results"]]
    phases = [r["phase"] for r in fast["results"]]
    assert phases[0] == "batch_size" and "num_workers (fine)" in phases and "persistent_workers" in phases
    assert "confirm" not in phases  # a re-run of a measured configuration is not a new row
    assert fast["run_to_run_variation"] == 0.0 and full["run_to_run_variation"] is None  # the fake is exact
    reasons = fast["recommended"]["reasons"]
    assert reasons[0].startswith("batch_size=32, num_workers=4, prefetch_factor=2, persistent_workers=True")
    assert any(r.startswith("persistent_workers=True saves 20 ms per epoch start") for r in reasons), reasons
    assert any(r.startswith("batch 64 gains 0% for") for r in reasons), reasons
    assert any(r.startswith("num_workers 5 gains 0% for 1 more worker") or r.startswith("num_workers 8 gains 0%")
               for r in reasons), reasons


def test_memory_model_is_an_upper_envelope_with_slope_at_least_one():
    m = tuning.MemoryModel(auto_workers=2)
    base = dict(num_workers=1, prefetch_factor=2, persistent_workers=False, delivery="cpu", worker_mode=None)
    assert m.predict(dict(base, batch_size=4)) is None  # nothing known yet
    # measured growth slower than the bytes in flight: the slope stays 1 (never below what they cost)
    for bs, peak in ((4, 600.0), (8, 610.0), (16, 640.0)):
        m.add(dict(base, batch_size=bs), {"peak_mib": peak, "sample_bytes": 1 << 20, "base_rss_mib": 550})
    f = m.fit()
    assert f["b"] == 1.0
    for bs, peak in ((4, 600.0), (8, 610.0), (16, 640.0)):
        assert m.predict(dict(base, batch_size=bs)) >= peak - 1e-9
    # bytes in flight at 64 x 1 MiB x (2 x 1 + 2) = 256 MiB over the intercept
    assert m.predict(dict(base, batch_size=64)) == pytest.approx(f["a"] + 256)
    assert m.predict(dict(base, batch_size=64, num_workers=3)) == pytest.approx(f["a"] + 64 * 8)
    # faster growth: the fitted slope
    m2 = tuning.MemoryModel(auto_workers=2)
    for bs, peak in ((4, 516.0), (8, 548.0)):  # 2 MiB per MiB in flight
        m2.add(dict(base, batch_size=bs), {"peak_mib": peak, "sample_bytes": 1 << 20, "base_rss_mib": 480})
    assert m2.fit()["b"] == pytest.approx(2.0)
    assert m2.predict(dict(base, batch_size=16)) == pytest.approx(612.0)


def test_worker_mode_is_an_axis_only_when_the_dataloader_has_it(monkeypatch):
    from fastloader.loader import auto_worker_limit

    assert "worker_mode" not in inspect.signature(fastloader.DataLoader).parameters or \
        tuning.available_worker_modes() is not None
    if "worker_mode" not in inspect.signature(fastloader.DataLoader).parameters:
        assert tuning.available_worker_modes() is None
        res = _fake_tune(batch_sizes=[32], num_workers=[1, 2])
        assert res["grid"]["worker_mode"] is None and all(r["worker_mode"] is None for r in res["results"])

    class WithModes(fastloader.DataLoader):
        def __init__(self, dataset, *a, worker_mode="process", **kw):
            super().__init__(dataset, *a, **kw)

    monkeypatch.setattr(fastloader, "DataLoader", WithModes)
    assert tuning.available_worker_modes() == ["process", "thread"]  # its default first
    res = _fake_tune(batch_sizes=[32], num_workers=[1, 2, 4], worker_modes=None,
                     runner=_fake_runner(auto_worker_limit(), mode_speed={"thread": 1.0, "process": 0.8}))
    assert res["grid"]["worker_mode"] == ["process", "thread"]
    # the walk up to it ran the default (process); the worker_mode phase adds thread
    phases = [r["phase"] for r in res["results"]]
    i = phases.index("worker_mode")
    assert res["results"][i]["worker_mode"] == "thread"
    assert all(r["worker_mode"] == "process" for r in res["results"][:i])
    assert _rec(res)["worker_mode"] == "thread" and _rec(res)["num_workers"] == 4
    assert "worker_mode='thread'" in res["recommended"]["reasons"][0]


def test_targets_and_specs():
    from helpers_tune import cheap

    assert tuning.as_target(cheap) == "helpers_tune:cheap"
    assert tuning.as_target("a.b:c") == "a.b:c"
    with pytest.raises(ValueError, match="fresh process"):
        tuning.as_target(lambda: None)
    with pytest.raises(ValueError, match="MODULE:CALLABLE"):
        tuning.measure._import_target("no_colon")
    assert tuning.measure._import_target("helpers_tune:cheap") is cheap
    g = tuning.Grid([64, 32], [0, 2, "auto"], (2, 4), (False, True))
    cfgs = g.configs()
    # num_workers=0 has no prefetch window and nothing persistent: one configuration per batch size
    assert sum(1 for c in cfgs if c["num_workers"] == 0) == 2
    assert len(cfgs) == 2 + 2 * 2 * 2 * 2
    kw = tuning.loader_kwargs(g.make(g.base(), batch_size=32))
    assert kw == {"batch_size": 32, "num_workers": 2, "shuffle": True, "prefetch_factor": 2,
                  "persistent_workers": False}
    assert tuning.loader_kwargs(g.make(g.base(), batch_size=32, num_workers=0)) == \
        {"batch_size": 32, "num_workers": 0, "shuffle": True}
    with pytest.raises(ValueError):
        tuning.Grid([32], [-1])


# ----------------------------------------------------------------------------
# the command


def test_cli_tune_writes_table_heatmap_and_json(tmp_path, capsys):
    from PIL import Image

    png, js = tmp_path / "heat.png", tmp_path / "tune.json"
    rc = cli.main(["tune", "--dataset", "helpers_tune:cheap", "--step-ms", "5", "--batch-sizes", "16,32",
                   "--workers", "0,1,auto", "--prefetch", "2", "--persistent", "off", "--epochs", "1",
                   "--samples", "64", "--no-confirm", "--in-process", "--plot", str(png), "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "| phase " in out and "samples/s" in out and "Recommendation: batch_size=" in out
    assert "DataLoader(dataset, batch_size=" in out
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 200
    res = json.loads(js.read_text())
    assert res["recommended"]["config"]["batch_size"] in (16, 32)
    assert len(res["cells"]) == 2 * 3
    assert {r["phase"] for r in res["results"]} >= {"batch_size", "num_workers=auto"}


def test_cli_tune_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit, match="neither a folder nor MODULE:CALLABLE"):
        cli.main(["tune", "--dataset", "not-a-folder-or-target", "--in-process"])
    with pytest.raises(SystemExit, match="--workers"):
        cli.main(["tune", "--workers", "1,x", "--in-process"])
    with pytest.raises(SystemExit, match="memory-limit"):
        cli.main(["tune", "--memory-limit", "lots", "--in-process"])


def test_public_name():
    assert fastloader.tune is tuning.tune
