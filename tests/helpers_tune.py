"""Made-up datasets and steps for tests/test_tune.py, importable by name in
the fresh processes fastloader.tune measures in (tests/ is on sys.path)."""
import time

import numpy as np


class Samples:
    """n samples of `nbytes` bytes each; __getitem__ sleeps `load_s` (like
    waiting for storage: the GIL is released, no CPU used)."""

    def __init__(self, n, nbytes, load_s=0.0):
        self.n, self.nbytes, self.load_s = n, nbytes, load_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.load_s:
            time.sleep(self.load_s)
        return np.full(self.nbytes, i % 251, dtype=np.uint8)


def cheap():
    """Loading costs next to nothing."""
    return Samples(512, 64)


def slow_io():
    """Loading dominates: 4 ms of waiting per sample, which threads overlap."""
    return Samples(512, 64, load_s=0.004)


def big():
    """2 MiB per sample: batches in flight dominate memory."""
    return Samples(512, 2 << 20)


def step_20ms(batch):
    time.sleep(0.02)


def step_100ms(batch):
    time.sleep(0.1)
