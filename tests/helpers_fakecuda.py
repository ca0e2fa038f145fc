"""Build the stand-in libcudart (tests/fakecuda/fake_cudart.c) and run a
child process against it (FASTLOADER_CUDART), collecting one JSON line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_DIR = os.path.join(HERE, "fakecuda")


def build_fake_cudart(tmp_path_factory) -> str:
    """Compile the fake runtime into a temporary folder; returns its path.
    Under scripts/test-asan.sh it is built with ASan too, so it is checked."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not shutil.which(cc):
        cc = "cc"
    lib = str(tmp_path_factory.mktemp("fakecuda") / "libfakecudart.so")
    flags = ["-shared", "-fPIC", "-O1", "-g", "-pthread"]
    if os.environ.get("FASTLOADER_UNDER_ASAN"):
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    subprocess.run([cc, *flags, "-o", lib, os.path.join(FAKE_DIR, "fake_cudart.c")], check=True)
    return lib


def run_on_fake_cudart(lib, argv, *, devices, marker, timeout, extra_path=(), cwd=None) -> dict:
    """Run `argv` (after sys.executable) with the fake runtime and `devices`
    fake GPUs; return the JSON that follows the stdout line starting with
    `marker`, or fail the test with the child's output."""
    env = dict(os.environ, FASTLOADER_CUDART=lib, FAKECUDA_DEVICES=str(devices), PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE), *extra_path] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)
    for line in proc.stdout.splitlines():
        if line.startswith(marker + " "):
            return json.loads(line.split(" ", 1)[1])
    pytest.fail(f"child died (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
