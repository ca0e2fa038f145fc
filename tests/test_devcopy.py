"""The device copier (csrc/devpool.c, csrc/py_devcopy.c) on the CPU.

No GPU is needed: tests/fakecuda/fake_cudart.c is a stand-in CUDA runtime in
which device memory is host memory and every stream is a thread that runs
its work in order, ordered with other streams only through events.  A
missing stream wait or a buffer rewritten before its consumer finished then
shows up as wrong bytes (the `missing_wait_is_caught` scenario checks that
the fake really catches it).  The scenarios run in one child process with
FASTLOADER_CUDART pointing at the fake, since a process loads its CUDA
runtime once.  tests/test_cuda.py runs the same objects on a real GPU.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_DIR = os.path.join(HERE, "fakecuda")

SCENARIOS = ["roundtrip", "missing_wait_is_caught", "default_streams", "host_kept_until_copy_done",
             "release_ordered_after_consumer", "ready_buffer_preferred", "pool_flat_any_order",
             "outlives_copier", "versioned_capsule", "unconsumed_capsule_released", "errors", "threads",
             "many_sizes", "python_copier", "other_device_default_stream",
             "per_thread_stream_released_elsewhere", "exception_survives_capsule_free", "close_while_copy_blocks",
             "loader_end_to_end", "no_error_left_behind", "no_stray_context", "close_inside_dlpack",
             "wait_interruptible", "synchronize_interruptible", "copier_freed_with_loader",
             "pinned_free_without_gil"]


@pytest.fixture(scope="module")
def fake_results(tmp_path_factory):
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not shutil.which(cc):
        cc = "cc"
    lib = str(tmp_path_factory.mktemp("fakecuda") / "libfakecudart.so")
    flags = ["-shared", "-fPIC", "-O1", "-g", "-pthread"]
    if os.environ.get("FASTLOADER_UNDER_ASAN"):  # scripts/test-asan.sh: check the fake too
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    subprocess.run([cc, *flags, "-o", lib, os.path.join(FAKE_DIR, "fake_cudart.c")], check=True)
    env = dict(os.environ, FASTLOADER_CUDART=lib, FAKECUDA_DEVICES="2", PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, os.path.join(FAKE_DIR, "scenarios.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("FAKECUDA-RESULTS "):
            return json.loads(line.split(" ", 1)[1])
    pytest.fail(f"scenario runner died (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")


def test_every_scenario_ran(fake_results):
    assert sorted(fake_results) == sorted(SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario(fake_results, name):
    assert fake_results[name] == "ok", fake_results[name]
