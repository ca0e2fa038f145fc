"""CUDA loaded at run time (csrc/cuda/cuda.c, csrc/binding/py_cuda.c).

The CPU tests run everywhere: with no CUDA library at all, with a CUDA
runtime but no driver (a build box), or on a GPU machine; each one skips,
with its reason, where its situation does not apply.  Tests marked ``gpu``
need a CUDA device and skip cleanly without one.

libcudart is loaded once per process, so anything that depends on the
search order (FASTLOADER_CUDART, search_paths, the nvidia-* wheels) runs in
a fresh subprocess.  Those subprocesses block ``import torch`` so that torch
does not load its own libcudart first (which we would then share).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from fastloader import _C

pytestmark = pytest.mark.fastloader_only

FORMATTED = re.compile(r"\S.* failed \(cudaError\w+: .+\)")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(_C.__file__)))


def run_py(code, env=None, timeout=120):
    """Run `code` in a fresh interpreter that imports this fastloader, with
    torch blocked; return the JSON object it prints last."""
    full_env = dict(os.environ)
    full_env.pop("FASTLOADER_CUDART", None)
    full_env["PYTHONPATH"] = PKG_ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    script = 'import sys\nsys.modules["torch"] = None\n' + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", script], env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def info():
    return _C.cuda_info()


@pytest.fixture(scope="module")
def gpu(info):
    """A usable device index; skips the test on machines without one."""
    if info["devices"] == 0:
        pytest.skip(f"needs a CUDA device: {info['error']}")
    return 0


@pytest.fixture(scope="module")
def no_gpu(info):
    """Skips on machines with a usable device (tests of the error paths)."""
    if info["devices"] > 0:
        pytest.skip("a CUDA device is present")
    return info


# ---- cuda_info ------------------------------------------------------------

def test_info_shape(info):
    assert set(info) == {"found", "library", "runtime_version", "driver_version", "devices",
                         "error"}
    assert isinstance(info["found"], bool)
    assert isinstance(info["devices"], int) and info["devices"] >= 0
    if info["found"]:
        lib = info["library"]
        assert os.path.isabs(lib) and os.path.isfile(lib), lib
        assert os.path.basename(lib).startswith("libcudart.so"), lib
        assert os.path.realpath(lib) == lib  # canonical, no "torch/lib/../.."
        assert info["runtime_version"] >= 11000
        assert info["driver_version"] >= 0
    else:
        assert info["library"] is None and info["runtime_version"] is None
        assert info["devices"] == 0
        assert info["error"].startswith("no CUDA runtime library found (tried: ")
    if info["devices"] > 0:
        assert info["error"] is None
    else:
        assert isinstance(info["error"], str) and info["error"]


def test_info_is_stable(info):
    """Loading happens once: later calls agree with the first one."""
    again = _C.cuda_info(search_paths=["/nonexistent/libcudart.so"])
    assert again == info


def test_search_paths_type():
    with pytest.raises(TypeError, match="iterable of paths"):
        _C.cuda_info(search_paths="/usr/local/cuda/lib64/libcudart.so")
    with pytest.raises(TypeError):
        _C.cuda_info(search_paths=[1])
    with pytest.raises(TypeError):
        _C.cuda_require(0, search_paths=5)


def test_no_driver(no_gpu):
    """A CUDA runtime but no NVIDIA driver (this project's build machines)."""
    info = no_gpu
    if not info["found"]:
        pytest.skip("no CUDA runtime library on this machine")
    if info["driver_version"] != 0:
        pytest.skip(f"an NVIDIA driver is installed ({info['driver_version']})")
    wheel_or_toolkit = ("/nvidia/cu13/lib/", "/nvidia/cuda_runtime/lib/", "/cuda")
    assert any(s in info["library"] for s in wheel_or_toolkit), info["library"]
    assert info["runtime_version"] >= 12000
    assert info["devices"] == 0
    assert "cudaErrorInsufficientDriver" in info["error"], info["error"]
    assert info["error"].startswith("cudaGetDeviceCount failed (cudaErrorInsufficientDriver: ")
    assert FORMATTED.fullmatch(info["error"])


# ---- cuda_require ---------------------------------------------------------

def test_require_bad_index():
    with pytest.raises(ValueError, match=">= 0"):
        _C.cuda_require(-1)


def test_require_without_gpu(no_gpu):
    info = no_gpu
    with pytest.raises(RuntimeError) as exc:
        _C.cuda_require(0)
    msg = str(exc.value)
    if not info["found"]:
        assert msg.startswith("no CUDA runtime library found (tried: "), msg
        assert "FASTLOADER_CUDART" in msg
    elif "cudaErrorInsufficientDriver" in info["error"]:
        assert msg.startswith(
            "CUDA driver missing or too old (cudaErrorInsufficientDriver: CUDA driver version is "
            "insufficient for CUDA runtime version)"), msg
        assert info["library"] in msg
    else:
        assert msg.startswith(("no CUDA device", "CUDA driver missing", "CUDA is not usable")), msg


def test_helpers_format_errors_without_gpu(no_gpu):
    """With no usable device every CUDA failure reads "what failed (name: string)"."""
    for call in (lambda: _C._cuda_pinned_roundtrip(b"abc"),
                 lambda: _C._cuda_pinned_roundtrip(b"abc", register=True),
                 lambda: _C._cuda_device_roundtrip(b"abc", two_streams=True)):
        with pytest.raises(RuntimeError) as exc:
            call()
        msg = str(exc.value)
        if no_gpu["found"]:
            assert FORMATTED.fullmatch(msg), msg
        else:
            assert msg.startswith("no CUDA runtime library found"), msg


def test_helpers_reject_empty():
    with pytest.raises(ValueError):
        _C._cuda_pinned_roundtrip(b"")
    with pytest.raises(ValueError):
        _C._cuda_device_roundtrip(b"")


# ---- the search order (fresh processes) -----------------------------------

def test_env_override_missing():
    """FASTLOADER_CUDART wins over every other place, even when it is wrong."""
    out = run_py("""
        import json
        from fastloader import _C
        info = _C.cuda_info()
        try:
            _C.cuda_require(0)
            req = None
        except RuntimeError as e:
            req = str(e)
        try:
            _C._cuda_device_roundtrip(b"x")
            helper = None
        except RuntimeError as e:
            helper = str(e)
        print(json.dumps({"info": info, "require": req, "helper": helper}))
    """, env={"FASTLOADER_CUDART": "/nonexistent/libcudart.so"})
    info = out["info"]
    assert info["found"] is False and info["library"] is None and info["devices"] == 0
    assert info["runtime_version"] is None and info["driver_version"] is None
    err = info["error"]
    assert err.startswith("no CUDA runtime library found (tried: "
                          "FASTLOADER_CUDART=/nonexistent/libcudart.so"), err
    assert "No such file" in err  # the loader's reason, for an explicit choice
    assert "/usr/local/cuda" not in err  # nothing else was tried
    assert out["require"].startswith("no CUDA runtime library found (tried: "), out["require"]
    assert out["helper"].startswith("no CUDA runtime library found"), out["helper"]


def test_env_override_found(info):
    if not info["found"]:
        pytest.skip("no CUDA runtime library on this machine")
    out = run_py("""
        import json
        from fastloader import _C
        print(json.dumps(_C.cuda_info()))
    """, env={"FASTLOADER_CUDART": info["library"]})
    assert out["found"] is True
    assert out["library"] == info["library"]
    assert out["runtime_version"] == info["runtime_version"]


def test_search_paths_come_before_wheels_and_system(info, tmp_path):
    if not info["found"]:
        pytest.skip("no CUDA runtime library on this machine")
    copy = tmp_path / "libcudart.so.13"
    shutil.copyfile(info["library"], copy)
    out = run_py(f"""
        import json
        from fastloader import _C
        print(json.dumps(_C.cuda_info(search_paths=["/nonexistent/libcudart.so", {str(copy)!r}])))
    """)
    assert out["found"] is True
    assert out["library"] == os.path.realpath(copy)


def test_wheel_found_on_sys_path():
    """The nvidia-* wheels that torch installs are found through sys.path."""
    out = run_py("""
        import glob, json, os, sys
        found = []
        for entry in sys.path:
            for sub in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib"):
                libs = sorted(glob.glob(os.path.join(entry or ".", sub, "libcudart.so*")),
                              reverse=True)
                found += [os.path.realpath(p) for p in libs]
        from fastloader import _C
        print(json.dumps({"wheels": found, "info": _C.cuda_info()}))
    """, env={"CUDA_HOME": ""})
    if not out["wheels"]:
        pytest.skip("no nvidia-cuda-runtime wheel installed")
    assert out["info"]["found"] is True
    assert out["info"]["library"] == out["wheels"][0]


def test_concurrent_first_load():
    """The one-time load is thread-safe: racing first calls agree."""
    out = run_py("""
        import json, threading
        from fastloader import _C
        results = [None] * 8
        barrier = threading.Barrier(8)
        def probe(i):
            barrier.wait()
            results[i] = _C.cuda_info()
        threads = [threading.Thread(target=probe, args=(i,)) for i in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(json.dumps(results))
    """)
    assert all(r == out[0] for r in out), out


# ---- GPU ------------------------------------------------------------------

def _pattern(n, seed=0):
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.mark.gpu
def test_require_present_device(gpu, info):
    _C.cuda_require(gpu)
    n = info["devices"]
    _C.cuda_require(n - 1)
    with pytest.raises(RuntimeError, match=f"CUDA device {n + 2} requested but only {n} present"):
        _C.cuda_require(n + 2)


@pytest.mark.gpu
@pytest.mark.parametrize("register", [False, True], ids=["hostalloc", "hostregister"])
@pytest.mark.parametrize("n", [1, 4097, 8 << 20])
def test_pinned_roundtrip(gpu, register, n):
    data = _pattern(n, seed=n)
    assert _C._cuda_pinned_roundtrip(data, device=gpu, register=register) == data


@pytest.mark.gpu
@pytest.mark.parametrize("register", [False, True], ids=["hostalloc", "hostregister"])
@pytest.mark.parametrize("n", [1, 3, 4097, 1 << 20])
def test_h2d_d2h_one_stream(gpu, register, n):
    """H2D then D2H on one non-blocking stream, an event, a synchronize."""
    data = _pattern(n, seed=n + 1)
    assert _C._cuda_device_roundtrip(data, device=gpu, register=register) == data


@pytest.mark.gpu
def test_stream_wait_event(gpu):
    """D2H on a second stream that waits on the H2D stream's event.

    The device buffer starts as the complement of the data and the copy is
    large (64 MiB: milliseconds of PCIe traffic), so a D2H that did not wait
    for the H2D would return wrong bytes.
    """
    data = _pattern(64 << 20, seed=7)
    for _ in range(3):
        assert _C._cuda_device_roundtrip(data, device=gpu, two_streams=True) == data


@pytest.mark.gpu
def test_roundtrips_do_not_leak(gpu):
    """Every buffer, stream and event is released: device memory stays flat."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    data = _pattern(16 << 20, seed=3)
    _C._cuda_device_roundtrip(data, device=gpu, two_streams=True)
    free0, _ = torch.cuda.mem_get_info(gpu)
    for _ in range(20):
        _C._cuda_device_roundtrip(data, device=gpu, two_streams=True)
        _C._cuda_pinned_roundtrip(data, device=gpu)
    free1, _ = torch.cuda.mem_get_info(gpu)
    assert abs(free1 - free0) < (8 << 20), (free0, free1)


@pytest.mark.gpu
def test_other_device_keeps_current_device(info):
    """Helpers with a device argument restore the thread's current device."""
    if info["devices"] < 2:
        pytest.skip("needs two CUDA devices")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    data = _pattern(1 << 20, seed=11)
    torch.cuda.set_device(0)
    assert _C._cuda_device_roundtrip(data, device=1, two_streams=True) == data
    assert torch.cuda.current_device() == 0
