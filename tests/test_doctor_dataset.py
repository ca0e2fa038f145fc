"""python -m fastloader doctor DATASET_SCRIPT / --dataset mod:attr: the
path it recommends for each kind of dataset, from a short measured run."""
from __future__ import annotations

import io
import json
import multiprocessing
import os
import textwrap
import time
from contextlib import redirect_stdout

import numpy as np
import pytest

pytestmark = pytest.mark.fastloader_only


class PurePython:
    """Holds the GIL: a Python loop per sample."""

    def __len__(self):
        return 100000

    def __getitem__(self, i):
        s = 0
        for k in range(15000):
            s += k ^ i
        return s


class Sleepy:
    """Releases the GIL (I/O-like waits)."""

    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(0.001)
        return i


def make_sleepy():
    return Sleepy()


@pytest.fixture(autouse=True)
def no_leaked_processes():
    yield
    deadline = time.monotonic() + 3.0
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not multiprocessing.active_children()


def _doctor(*argv):
    from fastloader.__main__ import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["doctor", *argv])
    return rc, buf.getvalue()


def test_gil_bound_dataset_is_sent_to_process_workers():
    rc, out = _doctor("--dataset", f"{__name__}:PurePython", "--seconds", "0.6", "--batch-size", "8", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["path"] == "process_workers", rep
    assert rep["gil_bound"] and rep["thread_samples_per_s"] and rep["process_samples_per_s"]


def test_gil_releasing_dataset_keeps_threads(tmp_path):
    script = tmp_path / "ds.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_doctor_dataset import make_sleepy
        batch_size = 8
        """) + "def make_dataset():\n    return make_sleepy()\n")
    rc, out = _doctor(str(script), "--seconds", "0.5")
    assert rc == 0
    assert "Recommendation: use worker threads (worker_mode='thread')" in out, out
    assert "worker threads" in out and "samples/s" in out


def test_image_decoding_dataset_is_sent_to_the_native_call(tmp_path):
    from PIL import Image

    paths = []
    for i in range(4):
        p = tmp_path / f"{i}.jpg"
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(p, quality=90)
        paths.append(str(p))
    script = tmp_path / "pil_ds.py"
    script.write_text(textwrap.dedent(f"""
        from PIL import Image
        import numpy as np

        class Photos:
            paths = {paths!r}
            def __len__(self):
                return 64
            def __getitem__(self, i):
                img = Image.open(self.paths[i % 4]).convert("RGB").resize((224, 224), Image.BILINEAR)
                return np.asarray(img).mean()

        dataset = Photos()
        """))
    rc, out = _doctor(str(script), "--seconds", "0.4", "--json")
    rep = json.loads(out)
    assert rep["path"] == "native_call" and rep["image_share"] >= 0.4, rep
    assert "NativeTransform" in rep["why"]


def test_native_dataset_needs_no_run(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((10, 3), dtype=np.float32))
    script = tmp_path / "arr.py"
    script.write_text(f"import fastloader\ndataset = fastloader.ArrayDataset({str(tmp_path / 'x.npy')!r})\n")
    rc, out = _doctor(str(script))
    assert rc == 0 and "Recommendation: use a native dataset" in out, out


def test_bad_dataset_argument_is_reported(tmp_path):
    script = tmp_path / "empty.py"
    script.write_text("x = 1\n")
    rc, _ = _doctor(str(script))
    assert rc == 2
