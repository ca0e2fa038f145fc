"""fastloader works without torch: batches are numpy arrays."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.fastloader_only

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None  # any `import torch` now raises ImportError
    import numpy as np
    import fastloader
    from fastloader import DataLoader
    assert sys.modules.get("torch") is None, "fastloader replaced the torch stub"

    NW = {nw}

    class Arrays:
        def __len__(self):
            return 10
        def __getitem__(self, i):
            return (
                np.arange(6, dtype=np.float32).reshape(2, 3) + i,
                i * 3,
                i / 4,
                np.array([i, -i], dtype=np.int16),
            )

    class Ints:
        def __len__(self):
            return 7
        def __getitem__(self, i):
            return i * i

    class Dicts:
        def __len__(self):
            return 5
        def __getitem__(self, i):
            return {{"x": np.full((2,), i, dtype=np.uint8), "y": float(i)}}

    batches = list(DataLoader(Arrays(), batch_size=4, num_workers=NW))
    assert len(batches) == 3, len(batches)
    for k, b in enumerate(batches):
        idx = np.arange(4 * k, min(4 * k + 4, 10))
        assert isinstance(b, (list, tuple)) and len(b) == 4, type(b)
        a, ints, floats, small = b
        for leaf in b:
            assert isinstance(leaf, np.ndarray), type(leaf)
        assert a.dtype == np.float32 and a.shape == (len(idx), 2, 3), (a.dtype, a.shape)
        assert np.array_equal(a, np.stack([np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in idx]))
        assert ints.dtype == np.int64 and np.array_equal(ints, idx * 3), (ints.dtype, ints)
        assert floats.dtype == np.float64 and np.array_equal(floats, idx / 4), (floats.dtype, floats)
        assert small.dtype == np.int16 and np.array_equal(small, np.stack([idx, -idx], axis=1).astype(np.int16))

    ints = list(DataLoader(Ints(), batch_size=3, num_workers=NW, shuffle=False))
    assert all(isinstance(b, np.ndarray) and b.dtype == np.int64 for b in ints)
    assert np.concatenate(ints).tolist() == [i * i for i in range(7)]

    dicts = list(DataLoader(Dicts(), batch_size=5, num_workers=NW))
    assert len(dicts) == 1 and list(dicts[0]) == ["x", "y"]
    assert dicts[0]["x"].dtype == np.uint8 and dicts[0]["x"].shape == (5, 2)
    assert dicts[0]["y"].dtype == np.float64 and dicts[0]["y"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]

    assert sys.modules.get("torch") is None
    print("NO-TORCH-OK")
    """
)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_numpy_batches_without_torch(num_workers):
    spec = importlib.util.find_spec("fastloader")
    assert spec is not None and spec.origin, "fastloader is not importable"
    pkg_parent = os.path.dirname(os.path.dirname(spec.origin))
    env = dict(os.environ)
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(nw=num_workers)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "NO-TORCH-OK" in proc.stdout
