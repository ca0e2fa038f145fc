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


def run_test_function(tmp_path_factory, module, function, *, marker, devices=1, timeout=120) -> dict:
    """Build the fake runtime and run tests/`module`.`function`() in a child
    on it (tests/ importable, from the checkout's root); its JSON as above."""
    lib = build_fake_cudart(tmp_path_factory)
    return run_on_fake_cudart(lib, ["-c", f"import {module} as t; t.{function}()"], devices=devices, marker=marker,
                              timeout=timeout, extra_path=[HERE], cwd=os.path.dirname(HERE))


# A child comparing device="cuda" (uint8 on the wire, normalized on the
# device) with the CPU path, num_workers 0 and 2, over a dataset made by
# DATASET from sys.argv[1]; prints MARKER {nw: [5 batches each, then one
# bool per batch: equal]}.
_DEVICE_VS_CPU = """
import json, sys, torch
sys.path.insert(0, sys.argv[2])
IMPORTS
import scenarios, fastloader
from fastloader import transforms as FT
scenarios.stub_torch_cuda(scenarios.new_stream())
tf = FT.Compose([FT.RandomResizedCrop(32), FT.RandomHorizontalFlip(), FT.ToTensor(), FT.Normalize([0.5] * 3, [0.25] * 3)])
ds = DATASET
out = {}
for nw in (0, 2):
    dev = list(fastloader.DataLoader(ds, batch_size=5, num_workers=nw, device="cuda", seed=5))
    cpu = list(fastloader.DataLoader(ds, batch_size=5, num_workers=nw, seed=5))
    out[nw] = [len(dev) == len(cpu) == 5] + [torch.equal(a, c) and torch.equal(b, d)
                                              for (a, b), (c, d) in zip(dev, cpu)]
print("MARKER " + json.dumps(out), flush=True)
"""


def device_vs_cpu(tmp_path, tmp_path_factory, data, dataset, *, marker, imports=""):
    """Run the _DEVICE_VS_CPU child on the fake runtime (1 device) with the
    dataset expression `dataset` (of sys.argv[1] = `data` and tf) after
    `imports`; returns its JSON."""
    lib = build_fake_cudart(tmp_path_factory)
    script = tmp_path / "child.py"
    script.write_text(_DEVICE_VS_CPU.replace("IMPORTS", imports).replace("DATASET", dataset)
                      .replace("MARKER", marker))
    return run_on_fake_cudart(lib, [str(script), data, FAKE_DIR], devices=1, marker=marker, timeout=120)
