"""fastloader.tune against an exhaustive sweep of the same grid (issue 15).

On the sample data (fastloader.ImageFolder, training pipeline), for each
simulated model step in --steps (ms per batch, time.sleep):

  1. tune: the coarse-to-fine search, timed;
  2. sweep: every configuration of the same grid, measured the same way
     (fastloader.tools.tuning.measure, one fresh process each), timed;
  3. side by side: the configuration tune recommends and the sweep's --top
     best, measured again in --rounds rounds (fresh processes, the order
     rotated each round), because a single run of each of the sweep's
     configurations on this shared machine is noisy and their maximum is
     biased upwards.

Pass criteria: the recommendation's median rate in step 3 reaches >= 95% of
the best median among the sweep's top configurations, and tune takes <= 1/4
of the sweep's time.  Also reported: the recommendation's rate in the sweep's own
single runs over the sweep's maximum.

    python benchmarks/bench_tune.py [--n 2000] [--steps 20,0] [--rounds 3] [--out FILE]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

fastloader = C.import_fastloader("tune")
from fastloader.tools import tuning  # noqa: E402
from fastloader.tools.sample import ensure_sample  # noqa: E402


def _csv(s, allow_auto=False):
    return [x if (allow_auto and x == "auto") else int(x) for x in s.split(",") if x]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--steps", default="20,0", help="simulated step per batch, ms (comma list)")
    p.add_argument("--batch-sizes", default="32,64,128,256")
    p.add_argument("--workers", default="0,1,2,auto")
    p.add_argument("--prefetch", default="2,4")
    p.add_argument("--samples", type=int, default=512, help="samples per epoch per configuration (2 epochs)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the side-by-side re-measurement")
    p.add_argument("--top", type=int, default=3, help="the sweep's best configurations measured again")
    p.add_argument("--out")
    a = p.parse_args(argv)
    root = ensure_sample(a.n)
    grid = dict(batch_sizes=_csv(a.batch_sizes), num_workers=_csv(a.workers, True),
                prefetch_factors=_csv(a.prefetch), persistent_workers=(False, True), device="cpu")
    per = dict(epochs=2, samples=a.samples, min_batches=8)
    modes = tuning.available_worker_modes()   # tune() searches worker_mode too, so the sweep covers it
    n_grid = len(tuning.Grid(grid["batch_sizes"], grid["num_workers"], grid["prefetch_factors"],
                             modes=modes).configs())
    lines = ["# fastloader.tune vs an exhaustive sweep of the same grid", ""]
    lines += C.environment_lines()
    lines += [f"- data: {root} (fastloader.ImageFolder, train pipeline); grid: batch_size {a.batch_sizes}, "
              f"num_workers {a.workers}, prefetch_factor {a.prefetch}, persistent_workers False,True, "
              f"worker_mode {','.join(modes)} (with workers) "
              f"= {n_grid} configurations; each measured in a fresh process, 2 epochs of {a.samples} samples", ""]
    summary = []

    def log_result(cfg, phase, r):
        C.log(f"  {phase}: {tuning.settings(cfg, short=True)}: {C.short_result(r)}")

    t_all = time.perf_counter()
    for step_ms in _csv(a.steps):
        C.log(f"== step {step_ms} ms: tune")
        t0 = time.perf_counter()
        tuned = tuning.tune(root, step_ms=step_ms, on_result=log_result, **grid, **per)
        t_tune = time.perf_counter() - t0
        C.log(f"== step {step_ms} ms: sweep")
        t0 = time.perf_counter()
        swept = tuning.tune(root, step_ms=step_ms, exhaustive_sweep=True, on_result=log_result, **grid, **per)
        t_sweep = time.perf_counter() - t0
        rec = tuned["recommended"]["config"]
        rates = {tuning.key(r): r["rate"] for r in swept["results"] if r.get("rate")}
        cfgs = {tuning.key(r): {k: r[k] for k in tuning.AXES} for r in swept["results"]}
        top = sorted(rates, key=rates.get, reverse=True)[:a.top]
        best_k = top[0]
        single = rates.get(tuning.key(rec), 0.0) / rates[best_k]
        # 3. side by side: the recommendation and the sweep's best few, interleaved rounds
        C.log(f"== step {step_ms} ms: side by side, {a.rounds} rounds")
        runner, _, _ = tuning.make_runner(root, step_ms=step_ms, **per)
        cands = [tuning.key(rec)] + [k for k in top if k != tuning.key(rec)]
        again = {k: [] for k in cands}
        for rnd in range(a.rounds):
            order = cands[rnd % len(cands):] + cands[:rnd % len(cands)]
            for k in order:
                r = runner(cfgs.get(k) or rec)
                again[k].append(r.get("rate"))
                C.log(f"  round {rnd + 1} {tuning.settings(cfgs.get(k) or rec, short=True)}: {C.short_result(r)}")
        med = {k: statistics.median([x for x in v if x]) for k, v in again.items() if any(v)}
        rec_k = tuning.key(rec)
        best_again = max((k for k in top if k in med), key=med.get)
        paired = med[rec_k] / med[best_again] if best_again != rec_k else 1.0
        mx = {k: max(x for x in v if x) for k, v in again.items() if any(v)}
        by_max = mx[rec_k] / max(mx[k] for k in top if k in mx)
        time_ratio = t_tune / t_sweep
        ok = paired >= 0.95 and time_ratio <= 0.25
        lines += [f"## model step {step_ms} ms per batch" if step_ms else "## no model step", ""]
        lines += ["| | configurations run | runs | wall time | recommended / best |", "|---|---:|---:|---:|---|"]
        lines.append(f"| tune | {len(tuned['results'])} | {tuned['runs']} | {t_tune:.0f} s | "
                     f"{tuning.settings(rec, short=True)} |")
        lines.append(f"| sweep | {len(swept['results'])} | {swept['runs']} | {t_sweep:.0f} s | "
                     f"best single run: {tuning.settings(cfgs[best_k], short=True)} |")
        lines += ["", f"- tune's recommendation: {tuned['recommended']['reasons'][0]}",
                  f"- measured again side by side ({a.rounds} rounds, fresh processes, order rotated each round), "
                  f"median samples/s:", ""]
        lines += ["| configuration | in the sweep | again (median) | per round |", "|---|---:|---:|---|"]
        for k in cands:
            who = ("**tune** " if k == rec_k else "") + ("sweep #%d " % (top.index(k) + 1) if k in top else "")
            lines.append(f"| {who}{tuning.settings(cfgs.get(k) or rec, short=True)} | {C.fmt(rates.get(k))} | "
                         f"{C.fmt(med.get(k))} | {', '.join(C.fmt(x) for x in again[k])} |")
        lines += ["",
                  f"- recommended / the best of the sweep's top {len(top)} measured again: **{paired:.3f}**"
                  + (" (the same configuration)" if best_again == rec_k else ""),
                  f"- the same with the fastest of the {a.rounds} rounds instead of the median: {by_max:.3f}",
                  f"- in the sweep's single runs: recommended {C.fmt(rates.get(rec_k))} / best "
                  f"{rates[best_k]:.0f} samples/s = {single:.3f}",
                  f"- tune's time / the sweep's: **{time_ratio:.2f}** ({t_tune:.0f} s / {t_sweep:.0f} s)",
                  f"- pass (>= 0.95 of the best, <= 0.25 of the time): **{'yes' if ok else 'no'}**", ""]
        summary.append((step_ms, paired, time_ratio, ok))
    lines.append(f"benchmark wall time: {time.perf_counter() - t_all:.0f} s")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0 if all(s[3] for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
