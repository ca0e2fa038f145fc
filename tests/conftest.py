"""Shared fixtures for the fastloader torch-compatibility / lifecycle suite.

FL_TEST_AGAINST_TORCH=1 runs the suite with ``torch.utils.data.DataLoader`` as
the module under test (to validate the tests themselves); tests of
fastloader-only features skip in that mode.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import helpers_datasets as H  # noqa: E402
from nginx_server import fault_proxy, nginx  # noqa: E402,F401  (fixtures: the real nginx, a fault proxy)

AGAINST_TORCH = H.AGAINST_TORCH

# A suite started as a background job of a non-interactive shell (`cmd &`
# inside `( ... )`, say) inherits SIGINT ignored, and Python then installs no
# KeyboardInterrupt handler: every Ctrl-C test would fail with "KeyboardInterrupt
# was not raised" for a reason that is the launcher's, not the loader's.
# Give this process what an interactive start gives it (its children then
# start with SIGINT at its default, as exec resets a handled signal).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fastloader_only: tests a fastloader feature torch does not have (skipped with FL_TEST_AGAINST_TORCH=1)"
    )
    # torch warns when num_workers exceeds the CPU count (this box has 2 CPUs).
    config.addinivalue_line("filterwarnings", "ignore:This DataLoader will create:UserWarning")


if AGAINST_TORCH:
    # torch joins each worker process for up to MP_STATUS_CHECK_INTERVAL (5 s)
    # when an iterator is shut down from the garbage collector or after a worker
    # error; that only slows the reference run down, so shorten it.
    import torch.utils.data._utils as _torch_data_utils

    _torch_data_utils.MP_STATUS_CHECK_INTERVAL = 0.5


def pytest_collection_modifyitems(config, items):
    if not AGAINST_TORCH:
        return
    skip = pytest.mark.skip(reason="fastloader-only feature (FL_TEST_AGAINST_TORCH=1)")
    for item in items:
        if item.get_closest_marker("fastloader_only") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fl():
    """The fastloader module (skips the test when running against torch)."""
    if AGAINST_TORCH:
        pytest.skip("fastloader-only feature (FL_TEST_AGAINST_TORCH=1)")
    import fastloader

    return fastloader


@pytest.fixture(scope="session")
def DL():
    """The DataLoader class under test."""
    if AGAINST_TORCH:
        from torch.utils.data import DataLoader

        return DataLoader
    import fastloader

    return fastloader.DataLoader


@pytest.fixture(scope="session")
def TorchDL():
    """torch's own DataLoader, the reference."""
    from torch.utils.data import DataLoader

    return DataLoader


@pytest.fixture(autouse=True)
def no_leaked_workers():
    """No fastloader worker thread (or torch worker process) outlives its test."""
    H.RELEASE.clear()
    H.INIT_CALLS.clear()
    # Ignore leftovers of an earlier test that already failed for leaking.
    H.wait_until(lambda: not H.live_workers(), timeout=0.5)
    before = H.live_workers()
    yield
    H.RELEASE.set()  # unblock datasets that sleep on RELEASE
    leaked = H.wait_workers_gone(before, timeout=2.5)
    assert not leaked, (
        f"{len(leaked)} loader worker(s) outlived their loader: ids {sorted(leaked)}"
    )

