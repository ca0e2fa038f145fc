"""The coarse-to-fine search over the axes, and its log (:class:`Run`: what
was measured, what was skipped and why).

Each axis is walked from a conservative start (batch_size 32,
num_workers 2, prefetch_factor 2) and stops once a step no longer pays:
a larger value is kept only if it gains at least ``stop_gain`` (5%) over
the best so far on that axis; a smaller value only if it keeps within
``tolerance`` (3%) of it.  num_workers is coarse to fine: 0, the powers of two
and the largest value first, then bisection between the fewest workers
within tolerance and the next fewer one measured.  A larger value that
measures clearly slower (a drop, not a plateau) is measured once more before
the axis stops, and finally the three best are measured once more
(``confirm``).  A configuration's rate is the fastest of its runs: other
processes only ever slow a run down.  Before a configuration runs, the
memory model (memory.py) may rule it out.
"""
from __future__ import annotations

from .grid import coarse_workers, config_cost, key
from .memory import LIMIT_SHARE
from .report import recommend

class Run:
    """The measured configurations, the skipped ones, and the search's log."""

    def __init__(self, grid, runner, model, budget_mib, *, stop_gain, tolerance, on_result=None, on_start=None):
        self.grid = grid
        self.runner = runner
        self.model = model
        self.budget = budget_mib
        self.stop_gain = stop_gain
        self.tol = tolerance
        self.on_result = on_result
        self.on_start = on_start
        self.runs = {}       # key -> [result, ...]
        self.cfgs = {}       # key -> cfg
        self.phase = {}      # key -> phase of its first measurement
        self.skipped = {}    # key -> {"config", "reason", ...}
        self.order = []
        self.dev_budget = None
        self.n_runs = 0
        self.dataset_len = None

    def rate(self, cfg):
        """The fastest of the configuration's runs: other processes on the
        machine only ever slow a run down, so the fastest run is the best
        estimate of what the configuration can do."""
        rs = [r["rate"] for r in self.runs.get(key(cfg), []) if "error" not in r and r.get("rate")]
        return max(rs) if rs else None

    def _predict(self, cfg):
        """None if it may run, else the skip record."""
        if self.dataset_len and cfg["batch_size"] * 4 > self.dataset_len:
            return {"reason": f"an epoch of {self.dataset_len} samples is shorter than 4 batches of "
                              f"{cfg['batch_size']}"}
        pred = self.model.predict(cfg)
        if pred is not None and self.budget is not None and pred > self.budget:
            return {"reason": f"predicted peak host memory {pred:.0f} MiB > limit {self.budget:.0f} MiB",
                    "predicted_mib": pred}
        pd = self.model.predict_device(cfg)
        if pd is not None and self.dev_budget is not None and pd > self.dev_budget:
            return {"reason": f"predicted peak device memory {pd:.0f} MiB > limit {self.dev_budget:.0f} MiB",
                    "predicted_device_mib": pd}
        return None

    def run(self, cfg, phase, *, again=False):
        """Measure ``cfg`` (once; ``again`` measures it once more); returns
        its rate, or None when it was skipped or failed."""
        k = key(cfg)
        if k in self.runs and not again:
            return self.rate(cfg)
        if k in self.skipped:
            return None
        if k not in self.runs:
            skip = self._predict(cfg)
            if skip is not None:
                self.skipped[k] = dict(skip, config=cfg, phase=phase)
                return None
        if self.on_start is not None:
            self.on_start(cfg, phase)
        res = self.runner(cfg)
        self.n_runs += 1
        self.runs.setdefault(k, []).append(res)
        self.cfgs[k] = cfg
        self.phase.setdefault(k, phase)
        self.order.append((k, phase))
        self.model.add(cfg, res)
        if "error" not in res:
            if res.get("dataset_len"):
                self.dataset_len = res["dataset_len"]
            if res.get("device_total_mib"):
                self.dev_budget = LIMIT_SHARE * res["device_total_mib"]
        if self.on_result is not None:
            self.on_result(cfg, phase, res)
        return self.rate(cfg)

    # -- axis walks ---------------------------------------------------------------
    def walk_up(self, cfgs, phase, best=None):
        """Measure cfgs in order while each gains >= stop_gain over the best so
        far (starting from ``best``); stop at the first that does not pay (or
        cannot run).  Returns the best rate seen."""
        for c in cfgs:
            r = self.run(c, phase)
            if r is None:
                break
            if best is not None and r < best * (1 - self.stop_gain):
                # more of something measured clearly slower: more likely a busy moment on the
                # machine than the setting; measure it once more before giving up the axis
                r = self.run(c, phase, again=True)
            if best is not None and r < best * (1 + self.stop_gain):
                break
            best = r if best is None else max(best, r)
        return best

    def walk_down(self, cfgs, phase, best):
        """Measure cfgs (cheaper first) while each keeps within tolerance of best."""
        for c in cfgs:
            r = self.run(c, phase)
            if r is None or best is None or r < best * (1 - self.tol):
                break

    def pick(self, cfgs, cost):
        """The cheapest measured config within tolerance of the best rate among cfgs."""
        rated = [(c, self.rate(c)) for c in cfgs if self.rate(c)]
        if not rated:
            return None
        top = max(r for _, r in rated)
        return min((c for c, r in rated if r >= top * (1 - self.tol)), key=cost)


def search(run, grid, auto_workers, *, confirm=True):
    """The coarse-to-fine walk over the axes (see the module docstring)."""
    cost = config_cost(auto_workers, grid)
    base = grid.base()
    bss = grid.batch_sizes
    # 1. batch_size at num_workers=2: up from 32 (or the smallest) while it pays; down only if
    #    that cannot run.  (The first run has no prediction: nothing is known before it.)
    start = bss.index(32) if 32 in bss else 0
    run.walk_up([grid.make(base, batch_size=b) for b in bss[start:]], "batch_size")
    if not any(run.rate(grid.make(base, batch_size=b)) for b in bss):
        for b in reversed(bss[:start]):
            if run.run(grid.make(base, batch_size=b), "batch_size"):
                break
    cur = run.pick([grid.make(base, batch_size=b) for b in bss], cost)
    if cur is None:
        return None
    # 2. num_workers at that batch size: coarse up while it pays, coarse down while it costs nothing,
    #    then bisect between the fewest within tolerance and the next fewer measured
    ws = grid.numeric
    if ws and cur["num_workers"] != "auto":
        w0 = cur["num_workers"]
        co = coarse_workers(ws)
        best = run.rate(cur)
        best = run.walk_up([grid.make(cur, num_workers=w) for w in co if w > w0], "num_workers", best)
        run.walk_down([grid.make(cur, num_workers=w) for w in reversed(co) if w < w0], "num_workers", best)
        while True:
            measured = [w for w in ws if run.rate(grid.make(cur, num_workers=w))]
            chosen = run.pick([grid.make(cur, num_workers=w) for w in measured], cost)["num_workers"]
            lower = [w for w in measured if w < chosen]
            lo = max(lower) if lower else None
            between = [w for w in ws if (lo is None or w > lo) and w < chosen
                       and key(grid.make(cur, num_workers=w)) not in run.skipped]
            if lo is None or not between:
                break
            mid = between[len(between) // 2]
            if run.run(grid.make(cur, num_workers=mid), "num_workers (fine)") is None:
                break
        cur = run.pick([grid.make(cur, num_workers=w) for w in ws], cost) or cur
    if grid.auto:
        run.run(grid.make(cur, num_workers="auto"), "num_workers=auto")
        cur = run.pick([cur, grid.make(cur, num_workers="auto")], cost) or cur
    # 3. prefetch_factor (only with workers)
    if cur["num_workers"] != 0 and len(grid.prefetch) > 1:
        pf0 = cur["prefetch_factor"]
        best = run.rate(cur)
        best = run.walk_up([grid.make(cur, prefetch_factor=p) for p in grid.prefetch if p > pf0], "prefetch_factor",
                           best)
        run.walk_down([grid.make(cur, prefetch_factor=p) for p in reversed(grid.prefetch) if p < pf0],
                      "prefetch_factor", best)
        cur = run.pick([grid.make(cur, prefetch_factor=p) for p in grid.prefetch], cost) or cur
    # 4. delivery to the GPU, worker_mode
    for axis, values in (("delivery", grid.deliveries), ("worker_mode", grid.modes)):
        if len(values) > 1 and not (axis == "worker_mode" and cur["num_workers"] == 0):
            for v in values:
                run.run(grid.make(cur, **{axis: v}), axis)
            cur = run.pick([grid.make(cur, **{axis: v}) for v in values], cost) or cur
    # 5. persistent_workers: what it saves at the start of every epoch
    if cur["num_workers"] != 0 and True in grid.persistent and False in grid.persistent:
        run.run(grid.make(cur, persistent_workers=not cur["persistent_workers"]), "persistent_workers")
    # 6. measure the contenders once more, in turn, and average: the three best measured (the
    #    recommendation among them).  Each phase ran minutes apart; on a shared machine the load
    #    drifts in between, and one unlucky run should not decide.
    if confirm:
        rec = recommend(run, auto_workers)
        if rec is not None:
            rk = key(rec["config"]) if key(rec["config"]) in run.cfgs else None
            top = sorted((c for c in run.cfgs.values() if run.rate(c) and key(c) != rk), key=lambda c: -run.rate(c))
            contenders = ([run.cfgs[rk]] if rk else []) + top[:3 - bool(rk)]
            for c in contenders:
                run.run(c, "confirm", again=True)
    return cur


def exhaustive(run, grid):
    """Every configuration of the grid (what the search is measured against)."""
    for c in grid.configs():
        run.run(c, "sweep")
