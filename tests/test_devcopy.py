"""The device copier (csrc/cuda/devpool.c, csrc/binding/py_devcopy.c) on the CPU.

No GPU is needed: tests/fakecuda/fake_cudart.c is a stand-in CUDA runtime in
which device memory is host memory and every stream is a thread that runs
its work in order, ordered with other streams only through events.  A
missing stream wait or a buffer rewritten before its consumer finished then
shows up as wrong bytes (the `missing_wait_is_caught` scenario checks that
the fake really catches it).  The scenarios run in one child process with
FASTLOADER_CUDART pointing at the fake, since a process loads its CUDA
runtime once.  tests/test_cuda.py runs the same objects on a real GPU.
"""
import os

import pytest

from helpers_fakecuda import FAKE_DIR, build_fake_cudart, run_on_fake_cudart


SCENARIOS = ["roundtrip", "missing_wait_is_caught", "default_streams", "host_kept_until_copy_done",
             "release_ordered_after_consumer", "ready_buffer_preferred", "pool_flat_any_order",
             "outlives_copier", "versioned_capsule", "unconsumed_capsule_released", "errors", "threads",
             "many_sizes", "python_copier", "other_device_default_stream",
             "per_thread_stream_released_elsewhere", "exception_survives_capsule_free", "close_while_copy_blocks",
             "loader_end_to_end", "no_error_left_behind", "no_stray_context", "close_inside_dlpack",
             "wait_interruptible", "synchronize_interruptible", "copier_freed_with_loader",
             "pinned_free_without_gil", "webdataset_on_device"]


@pytest.fixture(scope="module")
def fake_results(tmp_path_factory):
    lib = build_fake_cudart(tmp_path_factory)
    return run_on_fake_cudart(lib, [os.path.join(FAKE_DIR, "scenarios.py")], devices=2,
                              marker="FAKECUDA-RESULTS", timeout=300)


def test_every_scenario_ran(fake_results):
    assert sorted(fake_results) == sorted(SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario(fake_results, name):
    assert fake_results[name] == "ok", fake_results[name]
