"""Byte sizes as the command line takes them ("256MB", "1GiB", "500kB"):
``pack --shard-size``, ``tune --memory-limit``, ``doctor --sample-bytes``
and ``pack_shards(shard_size=...)`` all parse with :func:`parse_size`."""
from __future__ import annotations

import re

__all__ = ["parse_size"]

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text) -> int:
    """Bytes from "256MB" (10**6), "256MiB" or "256M" (2**20), "500kB",
    "1.5GB" or a plain number of bytes; units are case-insensitive.
    Raises ValueError for anything else or a size below 1 byte."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", str(text))
        unit = m.group(2).lower() if m else None
        if unit not in _SIZE_UNITS:
            raise ValueError(f"not a size: {text!r} (examples: 256MB, 1GiB, 500kB, 1048576)")
        value = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if value < 1:
        raise ValueError(f"size must be at least 1 byte, got {text!r}")
    return value
