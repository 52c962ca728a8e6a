"""Zero bubble H1 against 1F1B on sampled runs, and how exactly the simulator extrapolates it.

For every run the sampler draws as ZB-H1 (seeds ``--seeds``, indices 0..``--n``-1, runs that fit in memory)
with at most ``--max-per-stage`` micro-batches per pipeline stage, this script

* simulates every micro-batch (``exact=True``) and compares the time extrapolated from ``p`` and ``2p``
  micro-batches, and from ``2p`` and ``4p`` (what :func:`learnedperf.simulate.simulate` uses for ZB-H1),
  with it;
* simulates the same run under 1F1B and prints the ratio of the two iteration times, with the ratio of the
  fast tier's closed-form times (:func:`learnedperf.features.run.analytic_time`) beside it.

``--measure DATASET`` also times, on this machine's CPU, every ZB-H1 step of the step grid
(:func:`learnedperf.measure.steps.step_grid`: pipelines of 2 and 4 processes over gloo, whose ``W`` passes
compute the linear layers' deferred weight gradients) beside its 1F1B twin, alternating the two ``--rounds``
times, on the hardware block of the data set's records of the same process count; and prints the measured
ratio beside the simulator's and the shipped checkpoint's full and fast tiers' on the same runs.

    python experiments/zero_bubble.py [--n 800] [--seeds 0,1] [--max-per-stage 64]
                                      [--measure datasets/measured/vm-xeon-2c [--rounds 2]]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from learnedperf.cost import RooflineCost
from learnedperf.data.sampler import draw
from learnedperf.features.run import RunContext, analytic_time
from learnedperf.simulate.simulator import _simulate_once, simulate
from learnedperf.specs import RunSpec

from _checkpoint import load_predictor


def extrapolated_s(spec: RunSpec, cost: RooflineCost, m1: int, m2: int) -> float:
    """The iteration time extrapolated along the line through ``m1`` and ``m2`` micro-batches."""
    m = spec.num_microbatches
    if m <= m2:
        return _simulate_once(spec, cost, m)[0]
    t2 = _simulate_once(spec, cost, m2)[0]
    t1 = _simulate_once(spec, cost, m1)[0]
    return t2 + (t2 - t1) * (m - m2) / (m2 - m1)


def main() -> None:
    """Print the extrapolation errors and the ZB-H1 / 1F1B time ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=800)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--max-per-stage", type=int, default=64)
    ap.add_argument("--measure", metavar="DATASET", help="also time the grid's ZB-H1 steps and their 1F1B twins")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    errors: dict[str, list[float]] = {"p, 2p": [], "2p, 4p": []}
    sim_ratio, fast_ratio = [], []
    for seed in (int(x) for x in args.seeds.split(",")):
        for i in range(args.n):
            sample = draw(seed, i)
            spec, s = sample.spec, sample.spec.strategy
            if s.pipeline_schedule != "zb-h1" or spec.num_microbatches > args.max_per_stage * s.pp:
                continue
            cost = RooflineCost(spec.hardware)
            exact = simulate(spec, exact=True).iteration_time_s
            for (label, (m1, m2)) in zip(errors, ((s.pp, 2 * s.pp), (2 * s.pp, 4 * s.pp))):
                errors[label].append(abs(extrapolated_s(spec, cost, m1, m2) / exact - 1.0))
            run = json.loads(json.dumps(sample.run))
            run["strategy"]["pipeline_schedule"] = "1f1b"
            ref = RunSpec.from_dict(run)
            sim_ratio.append(simulate(spec).iteration_time_s / simulate(ref).iteration_time_s)
            ctx = RunContext(spec.model, spec.hardware)
            fast_ratio.append(analytic_time(spec, ctx).total_s / analytic_time(ref, ctx).total_s)
    n = len(sim_ratio)
    print(f"# {n} ZB-H1 runs of {args.n} draws of seeds {args.seeds} with <= {args.max_per_stage} "
          f"micro-batches a stage ({time.perf_counter() - t0:.0f} s)")
    print("| extrapolated from | max error | 95th percentile | runs within 0.1 % |")
    print("|---|---|---|---|")
    for label, e in errors.items():
        a = np.array(e)
        print(f"| {label} | {a.max() * 100:.2f} % | {np.percentile(a, 95) * 100:.3f} % | "
              f"{int((a <= 1e-3).sum())} of {n} |")
    print()
    print("| ZB-H1 / 1F1B time | min | median | max |")
    print("|---|---|---|---|")
    for label, r in (("simulator", sim_ratio), ("fast tier's closed form", fast_ratio)):
        a = np.array(r)
        print(f"| {label} | {a.min():.3f} | {np.median(a):.3f} | {a.max():.3f} |")
    if args.measure:
        print()
        measure_twins(args.measure, args.rounds)


def measure_twins(dataset: str, rounds: int) -> None:
    """Time each ZB-H1 step of the grid and its 1F1B twin here; print measured and predicted ratios."""
    import statistics

    import pandas as pd

    from learnedperf.measure.collect import step_hardware
    from learnedperf.measure.steps import measure_step, run_dict, step_grid

    steps = pd.read_parquet(f"{dataset}/steps_cpu.parquet")
    hardware = step_hardware(steps, dataset)
    grid = step_grid()
    twins = []
    for c in grid:
        if c.strategy.get("pipeline_schedule") == "zb-h1":
            ref = next(d for d in grid if d.model == c.model and d.world_size == c.world_size
                       and d.strategy == {**c.strategy, "pipeline_schedule": "1f1b"})
            twins.append((c, ref))
    predictor = load_predictor(None, "zero_bubble")
    print(f"# {len(twins)} ZB-H1 steps and their 1F1B twins, {rounds} alternating rounds, median of the rounds' "
          "medians")
    print("| step | measured 1F1B ms | measured ZB-H1 ms | measured ratio | simulator | full | fast |")
    print("|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"simulator": [], "full": [], "fast": []}
    absolute: dict[str, list[float]] = {"simulator": [], "full": [], "fast": []}  # of the ZB-H1 times
    for zb, ref in twins:
        hw = hardware[(zb.world_size, zb.threads)]
        times: dict[str, list[float]] = {"zb": [], "ref": []}
        for _ in range(rounds):
            for key, cfg in (("ref", ref), ("zb", zb)):
                times[key].append(measure_step(cfg, hw)["iteration_time_ms"])
        t_zb, t_ref = statistics.median(times["zb"]), statistics.median(times["ref"])
        ratios = {}
        runs = (run_dict(zb, hw), run_dict(ref, hw))
        sim = [simulate(r).iteration_time_s * 1e3 for r in runs]
        ratios["simulator"] = sim[0] / sim[1]
        absolute["simulator"].append(abs(sim[0] / t_zb - 1.0))
        for tier in ("full", "fast"):
            a, b = predictor.predict_many(list(runs), tier=tier)
            ratios[tier] = a["iteration_time_ms"] / b["iteration_time_ms"]
            absolute[tier].append(abs(a["iteration_time_ms"] / t_zb - 1.0))
        measured = t_zb / t_ref
        for k, r in ratios.items():
            errors[k].append(abs(r / measured - 1.0))
        print(f"| {zb.label()} | {t_ref:.1f} | {t_zb:.1f} | {measured:.3f} | {ratios['simulator']:.3f} | "
              f"{ratios['full']:.3f} | {ratios['fast']:.3f} |")
    print("mean |predicted ratio / measured ratio - 1|: " +
          ", ".join(f"{k} {np.mean(v) * 100:.1f} %" for k, v in errors.items()))
    print("MAPE of the ZB-H1 times: " + ", ".join(f"{k} {np.mean(v) * 100:.1f} %" for k, v in absolute.items()))


if __name__ == "__main__":
    main()
