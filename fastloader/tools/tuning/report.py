"""The recommendation and its reasons, from what the search measured.

Among the measured configurations within ``tolerance`` of the best
samples/s, :func:`recommend` takes the one with the fewest workers, then the
smallest batch, then the smallest prefetch; persistent_workers=True when it
saves at least 10% of the epoch-start cost without losing throughput.  The
reasons name what the larger settings would gain and cost.
:func:`heatmap_cells` is the same results laid out over batch_size x
num_workers for the CLI's heatmap.
"""
from __future__ import annotations

from .grid import config_cost, key, settings

def _pct(a, b):
    return 100.0 * (a / b - 1.0)


def recommend(run, auto_workers):
    """{"config", "rate", "best", "reasons", ...} from what was measured, or None."""
    cost = config_cost(auto_workers, run.grid)
    rated = {k: run.rate(c) for k, c in run.cfgs.items() if run.rate(c)}
    if not rated:
        return None
    best_k = max(rated, key=rated.get)
    top = rated[best_k]
    # choose without looking at persistent_workers; it is decided by its own measurement below
    pool = [run.cfgs[k] for k, r in rated.items() if r >= top * (1 - run.tol)]
    chosen = dict(min(pool, key=cost))
    rec = dict(chosen)
    rate = rated[key(rec)]
    reasons = []

    def res_of(c):
        rs = [r for r in run.runs.get(key(c), []) if "error" not in r]
        return rs[-1] if rs else {}

    def peak(c):
        vals = [r.get("peak_mib") for r in run.runs.get(key(c), []) if r.get("peak_mib")]
        return max(vals) if vals else None

    # persistent_workers: compare the epoch-start cost of the two variants measured
    # (at the recommended settings if both were run there, else where the search ran both)
    persist_note = None
    if rec["num_workers"] != 0:
        pairs = []
        for k, c in run.cfgs.items():
            on = dict(c, persistent_workers=True)
            if c["num_workers"] != 0 and not c["persistent_workers"] and key(on) in rated and k in rated:
                pairs.append((c, run.cfgs[key(on)]))
        pairs.sort(key=lambda p: key(p[0]) != key(dict(rec, persistent_workers=False)))
        if pairs:
            off, on = pairs[0]
            s_on, s_off = res_of(on).get("epoch_start_s"), res_of(off).get("epoch_start_s")
            if s_on is not None and s_off is not None:
                saved = s_off - s_on
                epoch = (run.dataset_len / rate) if (run.dataset_len and rate) else None
                here = key(off) == key(dict(rec, persistent_workers=False))
                # an epoch start includes loading its first batch, which varies run to run: a saving counts
                # from 10% of it (starting threads takes well under a millisecond; worker processes seconds)
                enough = saved >= max(0.002, 0.1 * s_off)
                slower = here and rated[key(on)] < top * (1 - run.tol)
                worth = enough and not slower
                rec = dict(rec, persistent_workers=worth)
                if key(rec) in rated:
                    rate = rated[key(rec)]
                share = f", {100 * saved / epoch:.2g}% of a {epoch:.1f} s epoch" if epoch and saved > 0 else ""
                where = "" if here else f" (measured at {settings(off, short=True)})"
                persist_note = (f"persistent_workers=True {'saves' if saved >= 0 else 'costs'} "
                                f"{abs(saved) * 1000:.0f} ms per epoch start ({s_off * 1000:.0f} -> "
                                f"{s_on * 1000:.0f} ms{share}){where}"
                                + ("" if worth else
                                   f", but its run was {-_pct(rated[key(on)], rated[key(off)]):.0f}% slower"
                                   if enough else ": not worth keeping the workers between epochs"))
    head = settings(rec, short=True)
    best_cfg = run.cfgs[best_k]
    measured_k = key(rec) if key(rec) in rated else key(chosen)
    if measured_k == best_k or rated[measured_k] >= top:
        reasons.append(f"{head}: the best measured, {rate:.0f} samples/s")
    else:
        reasons.append(f"{head}: {100 * rate / top:.0f}% of the best measured ({rate:.0f} vs {top:.0f} "
                       f"samples/s with {settings(best_cfg, short=True)})")
    # what the next larger settings would gain, and at what cost: from a pair of measured
    # configurations that differ only there (at the recommended settings when measured there)
    mc = run.cfgs[measured_k]
    mine = peak(mc)

    def pair(axis, v):
        out = []
        for k, c in run.cfgs.items():
            if c[axis] == mc[axis] and k in rated:
                o = key(run.grid.make(c, **{axis: v}))
                if o in rated and o != k:
                    out.append((c, run.cfgs[o]))
        out.sort(key=lambda p: key(p[0]) != measured_k)
        return out[0] if out else None

    numeric = mc["num_workers"] != "auto"
    for axis, bigger in (("batch_size", [b for b in run.grid.batch_sizes if b > mc["batch_size"]]),
                         ("num_workers", [w for w in run.grid.numeric if numeric and w > mc["num_workers"]]),
                         ("prefetch_factor", [p for p in run.grid.prefetch if mc["num_workers"] != 0
                                              and p > (mc["prefetch_factor"] or 0)])):
        for v in bigger:
            pr = pair(axis, v)
            if pr is not None:
                a_, b_ = pr
                g = _pct(rated[key(b_)], rated[key(a_)])
                if axis == "num_workers":
                    extra = v - mc["num_workers"]
                    what = f"{extra} more worker{'s' if extra > 1 else ''}"
                    if peak(a_) and peak(b_):
                        what += f" and {peak(b_) - peak(a_):+.0f} MiB"
                else:
                    what = f"{peak(b_) / peak(a_):.1f}x the memory" if (peak(a_) and peak(b_)) else "more memory"
                where = "" if key(a_) == measured_k else f" (measured at {settings(a_, short=True)})"
                name = "batch" if axis == "batch_size" else axis
                reasons.append(f"{name} {v} {'gains' if g >= 0 else 'loses'} {abs(g):.0f}% for {what}{where}")
                break
            sk = [s_ for s_ in run.skipped.values() if s_["config"][axis] == v
                  and (axis != "batch_size" or "predicted" in s_["reason"])]
            if sk:
                name = "batch" if axis == "batch_size" else axis
                reasons.append(f"{name} {v} was not run: {sk[0]['reason']}")
                break
    if numeric:
        a = run.grid.make(mc, num_workers="auto")
        if key(a) in rated:
            settled = res_of(a).get("auto_settled")
            reasons.append(f"num_workers='auto' reached {100 * rated[key(a)] / rate:.0f}% of this"
                           + (f" (settled on {settled} of {auto_workers} threads)" if settled else ""))
    if persist_note:
        reasons.append(persist_note)
    r = res_of(mc)
    w = r.get("wait_pct")
    if w is not None:
        if w >= 20:
            verdict = ("loading is the bottleneck: more CPUs, a lighter pipeline or pre-resized data would "
                       "speed training up" if rec["num_workers"] != 0 or not run.grid.numeric else
                       "loading is the bottleneck")
        elif w <= 5:
            verdict = "loading is hidden behind the step"
        else:
            verdict = "loading is mostly hidden"
        reasons.append(f"the step waits for data {w:.0f}% of the time: {verdict}")
    if run.skipped:
        mem = [s for s in run.skipped.values() if "predicted" in s["reason"]]
        if mem:
            reasons.append(f"{len(mem)} configuration(s) not run because their predicted memory crosses the limit")
    return {"config": rec, "rate": rate, "best": {"config": best_cfg, "rate": top},
            "fraction_of_best": rate / top, "reasons": reasons, "peak_mib": mine,
            "wait_pct": w, "ttfb_s": r.get("ttfb_s"), "epoch_start_s": r.get("epoch_start_s")}


def heatmap_cells(run, grid, ref):
    """One cell per (batch_size, num_workers): the best rate measured there
    (over the other axes), its peak memory or else the predicted one for
    ``ref``'s other settings, and whether that crosses the budget."""
    cells = []
    for bs in grid.batch_sizes:
        for w in grid.workers:
            c = grid.make(ref, batch_size=bs, num_workers=w)
            here = [cc for cc in run.cfgs.values() if cc["batch_size"] == bs and cc["num_workers"] == w]
            rates = [run.rate(cc) for cc in here if run.rate(cc)]
            peaks = [r.get("peak_mib") for cc in here for r in run.runs[key(cc)] if r.get("peak_mib")]
            pred = run.model.predict(c)
            mem = max(peaks) if peaks else pred
            skipped = [s["reason"] for s in run.skipped.values()
                       if s["config"]["batch_size"] == bs and s["config"]["num_workers"] == w]
            cells.append({"batch_size": bs, "num_workers": w, "rate": max(rates) if rates else None,
                          "peak_mib": max(peaks) if peaks else None, "predicted_mib": pred,
                          "over_limit": bool(run.budget and mem and mem > run.budget),
                          "skipped": skipped[0] if skipped else None})
    return cells
