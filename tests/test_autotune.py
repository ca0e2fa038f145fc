"""num_workers="auto": the thread budget and the controller's decisions."""
import os
import shutil
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import fastloader  # noqa: E402
from helpers_datasets import SleepyDataset as Sleepy  # noqa: E402  (tests/ is on sys.path via conftest)
from fastloader.loader import auto_worker_limit  # noqa: E402


def test_auto_never_exceeds_usable_cpus():
    dl = fastloader.DataLoader(Sleepy(8, 0), batch_size=2, num_workers="auto")
    assert dl.num_workers == auto_worker_limit() <= len(os.sched_getaffinity(0))
    assert [int(b[0]) for b in dl] == [0, 2, 4, 6]


def test_auto_rejects_other_strings():
    with pytest.raises(ValueError, match="auto"):
        fastloader.DataLoader(Sleepy(4, 0), num_workers="many")


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset not installed")
def test_auto_under_taskset_one_cpu_is_one_worker():
    code = ("import fastloader, torch\n"
            "dl = fastloader.DataLoader(torch.arange(10), batch_size=5, num_workers='auto')\n"
            "print(dl.num_workers, sum(len(b) for b in dl))\n")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(fastloader.__file__)))
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=pkg), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "10"]


def test_local_world_size_shares_the_cpus(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert auto_worker_limit() == 1


@pytest.mark.skipif(auto_worker_limit() < 2, reason="needs 2 usable CPUs")
def test_starved_consumer_keeps_every_worker():
    # each worker delivers a batch every 80 ms; the consumer takes none: it waits
    dl = fastloader.DataLoader(Sleepy(160, 0.01), batch_size=8, num_workers="auto")
    for _ in dl:
        pass
    st = dl.stats()
    assert [n for _, n in st["autotune_history"]] == [dl.num_workers]
    assert st["num_workers_auto"] == dl.num_workers


@pytest.mark.skipif(auto_worker_limit() < 2, reason="needs 2 usable CPUs")
def test_slow_consumer_keeps_one_worker():
    # a 100 ms "model step" per batch; one worker needs ~10 ms per batch.  30
    # batches (3 s): a 15-batch epoch could end before the tuner's decision
    # under a loaded CI machine (seen once in a full-suite run)
    dl = fastloader.DataLoader(Sleepy(120, 0.001), batch_size=4, num_workers="auto")
    for _ in dl:
        time.sleep(0.1)
    st = dl.stats()
    assert st["num_workers_auto"] == 1
    hist = st["autotune_history"]
    assert hist[0][1] == dl.num_workers and hist[-1][1] == 1
    assert hist[-1][0] < 5.0  # settled within 5 s
    # past the first batch (the workers' start-up) the loop never waits
    assert (st["consumer_wait_s"] - st["first_batch_wait_s"]) / st["elapsed_s"] < 0.05


# -- the controller alone, fed with made-up counters --------------------------------------------------

from fastloader.autotune import AutoTuner  # noqa: E402


def _drive(tuner, windows, wait_frac, busy_per_worker):
    """Feed `windows` windows in which the consumer waited wait_frac of the
    time and each active worker was busy busy_per_worker of it."""
    t, wait, busy = tuner._snap[0] if tuner._snap else 0.0, 0.0, [0.0] * tuner.max_workers
    if tuner._snap is None:
        tuner.observe(t, wait, busy)
    else:
        wait, busy = tuner._snap[1], list(tuner._snap[2])
    for _ in range(windows):
        t += tuner.WINDOW_S
        wait += wait_frac * tuner.WINDOW_S
        busy = [b + (busy_per_worker * tuner.WINDOW_S if i < tuner.active else 0.0) for i, b in enumerate(busy)]
        n = tuner.observe(t, wait, busy)
        if n is not None:
            tuner.applied(t, n)
    return tuner.active


def test_controller_parks_idle_workers_one_at_a_time():
    tuner = AutoTuner(4, 0.0)
    # the consumer never waits and workers are mostly idle: park down to 1
    assert _drive(tuner, 3, 0.0, 0.2) == 3        # three calm windows before the first park
    assert _drive(tuner, 30, 0.0, 0.2) == 1
    assert [n for _, n in tuner.history] == [4, 3, 2, 1]


def test_controller_keeps_workers_that_carry_the_load():
    tuner = AutoTuner(4, 0.0)
    # calm consumer, but 4 workers each 90% busy: 3 could not carry it
    assert _drive(tuner, 20, 0.0, 0.9) == 4


def test_controller_adds_a_worker_when_the_consumer_starves():
    tuner = AutoTuner(4, 0.0, active=1)
    assert _drive(tuner, 1, 0.1, 1.0) == 1        # one hungry window is not enough
    assert _drive(tuner, 1, 0.1, 1.0) == 2        # two in a row
    assert _drive(tuner, 1, 0.5, 1.0) == 3        # starving: at once
    assert _drive(tuner, 10, 0.5, 1.0) == 4       # never past max_workers


def test_controller_decides_at_most_once_per_window():
    tuner = AutoTuner(2, 0.0)
    assert tuner.due(0.0)
    tuner.observe(0.0, 0.0, [0.0, 0.0])
    assert not tuner.due(tuner.WINDOW_S / 2)
    assert tuner.observe(tuner.WINDOW_S / 2, 10.0, [0.0, 0.0]) is None
