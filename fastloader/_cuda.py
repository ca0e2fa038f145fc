"""Run-time discovery of the CUDA runtime library (never needed to build or import)."""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

_CANDIDATES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")


def _search_paths():
    paths = []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    paths += glob.glob(os.path.join(home, "lib64", "libcudart.so*"))
    for base in sys.path:  # the nvidia-cuda-runtime wheels that torch installs
        paths += glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
        paths += glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcudart.so*"))
    return paths + list(_CANDIDATES)


def _err_name(lib, rc):
    fn = lib.cudaGetErrorName
    fn.restype = ctypes.c_char_p
    return (fn(rc) or b"?").decode()


def _err_string(lib, rc):
    fn = lib.cudaGetErrorString
    fn.restype = ctypes.c_char_p
    return (fn(rc) or b"?").decode()


def probe() -> dict:
    """Say whether a CUDA runtime can be loaded, its version and the device count.

    Returns {"found": bool, "library": path or None, "runtime_version": int or None,
    "devices": int, "error": str or None}.  Never raises.
    """
    info = {"found": False, "library": None, "runtime_version": None, "devices": 0, "error": None}
    for cand in _search_paths():
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            info["error"] = str(e)
            continue
        info["found"] = True
        info["library"] = cand
        info["error"] = None
        v = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
            info["runtime_version"] = v.value
        n = ctypes.c_int(0)
        rc = lib.cudaGetDeviceCount(ctypes.byref(n))
        if rc == 0:
            info["devices"] = n.value
        else:
            info["error"] = f"cudaGetDeviceCount failed ({_err_name(lib, rc)}: {_err_string(lib, rc)})"
        break
    return info
