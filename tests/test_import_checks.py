"""Import-time checks of the C extension (and what its loading depends on:
no exported function is resolved at load time).

module.c creates one JPEG decompressor when fastloader._C is imported: a
libjpeg at run time that does not match the headers of the build refuses
that (JERR_BAD_LIB_VERSION or a struct-size error), and the import must fail
then, with a message naming both, instead of at the first image of an epoch.
A preloaded stand-in (tests/fakejpeg/bad_version.c) plays the mismatching
library.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _repo_env():
    """This process's environment with the checkout first on PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def _run_fresh(code, timeout):
    """Run `code` in a fresh interpreter importing this checkout; assert it
    exits 0 having printed exactly "ok"."""
    r = subprocess.run([sys.executable, "-c", code], env=_repo_env(), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_mismatched_libjpeg_fails_the_import_clearly(tmp_path):
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not shutil.which(cc):
        cc = "cc"
    shim = str(tmp_path / "libbadjpeg.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", shim, os.path.join(HERE, "fakejpeg", "bad_version.c")],
                   check=True)
    env = _repo_env()
    # after any sanitizer runtimes already preloaded (they must come first)
    env["LD_PRELOAD"] = " ".join(p for p in [os.environ.get("LD_PRELOAD", ""), shim] if p)
    proc = subprocess.run([sys.executable, "-c", "import fastloader._C"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr, proc.stderr[-2000:]
    assert "does not match the libjpeg-turbo" in proc.stderr and "JPEG_LIB_VERSION" in proc.stderr, \
        proc.stderr[-2000:]
    # and without the stand-in the same import works
    env.pop("LD_PRELOAD")
    if os.environ.get("LD_PRELOAD"):
        env["LD_PRELOAD"] = os.environ["LD_PRELOAD"]
    ok = subprocess.run([sys.executable, "-c", "import fastloader._C"], env=env, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_no_exported_function_is_an_ifunc():
    """Every function compiled with target_clones (the AVX2/FMA clones picked
    at load time) is static: an exported one is a GLOBAL IFUNC that other
    units reach through the GOT, and under ThreadSanitizer the loader then
    jumped to an unrelocated address while importing the module (CI's TSan
    pass died that way when fl_gblur_kernel1d was one)."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    import fastloader._C as C

    out = subprocess.run([readelf, "-sW", C.__file__], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    ifuncs = [r for r in rows if len(r) >= 8 and r[3] == "IFUNC"]
    assert ifuncs, "no target_clones functions found: the check would pass vacuously"
    exported = sorted({r[7] for r in ifuncs if r[4] != "LOCAL"})
    assert not exported, f"exported IFUNC symbols (make them static, behind a plain wrapper): {exported}"


def test_libcurl_is_loaded_by_the_first_http_stream_only():
    """stream.c loads libcurl with dlopen when a process first reads over
    http(s): importing fastloader maps neither libcurl nor the TLS /
    Kerberos / LDAP libraries it links (~0.6 MiB of relocated data in
    every training process, when it was linked)."""
    code = (
        "import socket\n"
        "from fastloader import _C\n"
        "maps = lambda: open('/proc/self/maps').read()\n"
        "assert 'libcurl' not in maps() and 'libgnutls' not in maps(), 'mapped at import'\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "try:\n"
        "    _C._stream_read(f'http://127.0.0.1:{port}/x', retries=0, backoff_ms=1, stall_timeout_ms=2000)\n"
        "except OSError as e:\n"
        "    assert 'refused' in str(e).lower() or 'connect' in str(e).lower(), e\n"
        "else:\n"
        "    raise AssertionError('a closed port was read')\n"
        "assert 'libcurl' in maps(), 'not loaded by the stream'\n"
        "print('ok')\n")
    _run_fresh(code, timeout=60)


def test_import_swap_loads_only_the_loader():
    """`import fastloader` (the import swap) leaves the datasets and
    transforms unimported until a script names one (~0.5 MiB of code
    objects a Python dataset never runs: peak memory at num_workers=0 is
    otherwise the package's own), and a CPU loader over a Python dataset
    iterates without them, without numpy.random (NumPy imports it on the
    first `np.random.X`: another 0.5 MiB), without cuda_delivery.py, and
    without what only workers, num_workers="auto" or a resume run
    (worker_mode.py, autotune.py, elastic.py); a native dataset named
    afterwards still takes the native path."""
    code = (
        "import sys\n"
        "import fastloader\n"
        "lazy = ['fastloader.' + m for m in ('transforms', 'datasets', 'arrays', 'lmdb_dataset', 'hf_datasets',\n"
        "                                   'webdataset')]\n"
        "lazy += ['numpy.random', 'fastloader.cuda_delivery']\n"
        "lazy += ['fastloader.' + m for m in ('worker_mode', 'autotune', 'elastic')]\n"
        "assert not [m for m in lazy if m in sys.modules], [m for m in lazy if m in sys.modules]\n"
        "class Squares:\n"
        "    def __len__(self): return 10\n"
        "    def __getitem__(self, i): return i * i\n"
        "got = [b.tolist() for b in fastloader.DataLoader(Squares(), batch_size=4)]\n"
        "assert got == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]], got\n"
        "got = sorted(sum((b.tolist() for b in fastloader.DataLoader(Squares(), batch_size=4, shuffle=True)), []))\n"
        "assert got == [i * i for i in range(10)], got\n"
        "assert not [m for m in lazy if m in sys.modules], [m for m in lazy if m in sys.modules]\n"
        "assert fastloader.transforms is sys.modules['fastloader.transforms']\n"
        "import numpy as np\n"
        "T = fastloader.transforms\n"
        "imgs = np.random.default_rng(0).integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)\n"
        "ds = fastloader.ArrayDataset(imgs, np.arange(6), transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))\n"
        "dl = fastloader.DataLoader(ds, batch_size=3, num_workers=1)\n"
        "assert [tuple(x.shape) for x, _ in dl] == [(3, 3, 8, 8)] * 2\n"
        "assert dl.stats()['path'] == 'native', dl.stats()['path']\n"
        "assert set(dir(fastloader)) >= {'ImageFolder', 'WebDataset', 'resume_state', 'tune'}\n"
        "try:\n"
        "    fastloader.NoSuchThing\n"
        "except AttributeError as e:\n"
        "    assert 'NoSuchThing' in str(e)\n"
        "print('ok')\n")
    _run_fresh(code, timeout=120)
