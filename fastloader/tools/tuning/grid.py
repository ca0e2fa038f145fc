"""The configurations the tuner chooses among: the axes, :class:`Grid` (the
values of each axis, the start of the search, the exhaustive sweep), a
configuration's key and DataLoader arguments as text, and
:func:`config_cost`, the order "cheaper" means to the search and to the
recommendation (fewer workers, then smaller batches, then less prefetch)."""
from __future__ import annotations

import inspect

AXES = ("batch_size", "num_workers", "prefetch_factor", "persistent_workers", "delivery", "worker_mode")


DELIVERIES = {
    "cpu": "batches stay on the CPU",
    "copy": "pin_memory=False, batch.to('cuda') in the loop",
    "pinned": "pin_memory=True, batch.to('cuda', non_blocking=True) in the loop",
    "device": "DataLoader(device='cuda'): the loader copies on its own stream",
}



def key(cfg):
    return tuple(cfg.get(a) for a in AXES)


def workers_value(cfg, auto_workers):
    """Threads (or processes) a configuration starts: "auto" starts one per usable CPU."""
    nw = cfg["num_workers"]
    return auto_workers if nw == "auto" else nw


def settings(cfg, *, short=False):
    """The DataLoader arguments of a configuration, as text."""
    nw = cfg["num_workers"]
    parts = [f"batch_size={cfg['batch_size']}", f"num_workers={nw!r}" if nw == "auto" else f"num_workers={nw}"]
    if nw != 0:
        parts.append(f"prefetch_factor={cfg['prefetch_factor']}")
        if not short or cfg["persistent_workers"]:
            parts.append(f"persistent_workers={cfg['persistent_workers']}")
    d = cfg.get("delivery") or "cpu"
    if d == "pinned":
        parts.append("pin_memory=True")
    elif d == "device":
        parts.append("device='cuda'")
    elif d == "copy" and not short:
        parts.append("pin_memory=False")
    if cfg.get("worker_mode") is not None and nw != 0:
        parts.append(f"worker_mode={cfg['worker_mode']!r}")
    return ", ".join(parts)


def _norm(cfg):
    """num_workers=0 has no prefetch window and nothing to keep alive."""
    cfg = dict(cfg)
    if cfg["num_workers"] == 0:
        cfg["prefetch_factor"] = None
        cfg["persistent_workers"] = False
        if cfg.get("worker_mode") is not None:
            cfg["worker_mode"] = cfg["_modes"][0] if cfg.get("_modes") else cfg["worker_mode"]
    cfg.pop("_modes", None)
    return cfg


def available_worker_modes():
    """fastloader.DataLoader's worker_mode values (its default first), or None
    when this build has no worker_mode argument."""
    import fastloader

    p = inspect.signature(fastloader.DataLoader).parameters.get("worker_mode")
    if p is None:
        return None
    modes = ["thread", "process"]
    if p.default in modes:
        modes.remove(p.default)
        modes.insert(0, p.default)
    return modes


def coarse_workers(ws):
    """0, the powers of two and the largest of ``ws`` (numbers only)."""
    top = max(ws)
    return [w for w in ws if w == 0 or w == top or (w & (w - 1)) == 0]


class Grid:
    """The values of every axis; :meth:`configs` is the exhaustive sweep."""

    def __init__(self, batch_sizes, workers, prefetch_factors=(2, 4), persistent=(False, True),
                 deliveries=("cpu",), modes=None):
        self.batch_sizes = sorted(dict.fromkeys(int(b) for b in batch_sizes))
        if not self.batch_sizes or self.batch_sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive integers, got {batch_sizes!r}")
        ws = list(dict.fromkeys(workers))
        bad = [w for w in ws if not (w == "auto" or (isinstance(w, int) and not isinstance(w, bool) and w >= 0))]
        if bad or not ws:
            raise ValueError(f"num_workers values must be integers >= 0 or 'auto', got {workers!r}")
        self.numeric = sorted(w for w in ws if w != "auto")
        self.auto = "auto" in ws
        self.prefetch = sorted(dict.fromkeys(int(p) for p in prefetch_factors))
        if not self.prefetch or self.prefetch[0] < 1:
            raise ValueError(f"prefetch factors must be integers >= 1, got {prefetch_factors!r}")
        self.persistent = list(dict.fromkeys(bool(p) for p in persistent)) or [False]
        self.deliveries = list(deliveries)
        self.modes = list(modes) if modes else [None]

    @property
    def workers(self):
        return self.numeric + (["auto"] if self.auto else [])

    def base(self):
        """Where the search starts: the articles' num_workers=2, prefetch 2,
        persistent_workers off, the most common delivery."""
        if self.numeric:
            w0 = min(self.numeric, key=lambda w: (abs(w - 2), w))
        else:
            w0 = "auto"
        pf0 = 2 if 2 in self.prefetch else self.prefetch[0]
        d0 = "pinned" if "pinned" in self.deliveries else self.deliveries[0]
        return dict(num_workers=w0, prefetch_factor=pf0, persistent_workers=self.persistent[0] if False not in
                    self.persistent else False, delivery=d0, worker_mode=self.modes[0])

    def make(self, base, **kw):
        cfg = dict(base, **kw)
        cfg["_modes"] = self.modes
        return _norm(cfg)

    def configs(self):
        out, seen = [], set()
        for bs in self.batch_sizes:
            for w in self.workers:
                for pf in self.prefetch:
                    for p in self.persistent:
                        for d in self.deliveries:
                            for m in self.modes:
                                c = self.make({}, batch_size=bs, num_workers=w, prefetch_factor=pf,
                                              persistent_workers=p, delivery=d, worker_mode=m)
                                if key(c) not in seen:
                                    seen.add(key(c))
                                    out.append(c)
        return out

    def as_dict(self):
        return {"batch_size": self.batch_sizes, "num_workers": self.workers, "prefetch_factor": self.prefetch,
                "persistent_workers": self.persistent, "delivery": self.deliveries,
                "worker_mode": self.modes if self.modes != [None] else None}


def config_cost(auto_workers, grid):
    """A sort key, cheaper first, that search.py and report.py share: fewer
    workers, a number before "auto", smaller batch, less prefetch, the
    default worker_mode, delivery in the order cpu, device, pinned, copy, persistent_workers off."""
    dr = {d: i for i, d in enumerate(["cpu", "device", "pinned", "copy"])}
    mr = {m: i for i, m in enumerate(grid.modes)}

    def cost(c):
        return (workers_value(c, auto_workers), c["num_workers"] == "auto", c["batch_size"], c["prefetch_factor"] or 0,
                mr.get(c.get("worker_mode"), 0), dr.get(c.get("delivery"), 9), bool(c["persistent_workers"]))
    return cost
