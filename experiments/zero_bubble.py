"""Zero-bubble schedules (ZB-H1, ZB-V, interleaved zero bubble) against their twins on sampled runs, and how exactly
the simulator extrapolates them.

For every run the sampler draws with a zero-bubble schedule (seeds ``--seeds``, indices 0..``--n``-1, runs that fit
in memory) with at most ``--max-per-stage`` micro-batches per pipeline stage, this script

* simulates every micro-batch (``exact=True``) and compares it with the time extrapolated along the line through two
  shorter steps: for ZB-H1 and interleaved zero bubble from ``p`` and ``2p`` micro-batches, and from ``2p`` and
  ``4p`` (what :func:`learnedperf.simulate.simulate` uses); for ZB-V from ``max(2p, 8)`` and ``max(4p, 16)``, and
  from ``4p`` and ``8p`` (what it uses);
* simulates the same run under its twin — 1F1B for ZB-H1, Megatron's interleaving of the same chunks per rank for
  ZB-V and interleaved zero bubble — and prints the ratio of the two iteration times, with the ratio of the fast
  tier's closed-form times (:func:`learnedperf.features.run.analytic_time`) beside it.

``--measure DATASET`` also times, on this machine's CPU, every step of the step grid
(:func:`learnedperf.measure.steps.step_grid`: pipelines of 2 and 4 processes over gloo, whose ``W`` passes
compute the linear layers' deferred weight gradients) whose schedule is in ``--schedules``, beside its twin (1F1B for
ZB-H1; interleaving of the same chunks for ZB-V and interleaved zero bubble), alternating the two ``--rounds``
times, on the hardware block of the data set's records of the same process count; and prints the measured ratio
beside the simulator's and the shipped checkpoint's full and fast tiers' on the same runs.

    python experiments/zero_bubble.py [--n 800] [--seeds 0,1] [--max-per-stage 64] [--measure
        datasets/measured/vm-xeon-2c [--rounds 2] [--schedules zb-h1,zb-v,interleaved-zb]]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from learnedperf.cost import RooflineCost
from learnedperf.data.sampler import draw
from learnedperf.features.run import RunContext, analytic_time
from learnedperf.simulate.simulator import _simulate_once, simulate
from learnedperf.specs import RunSpec

from _checkpoint import load_predictor

#: schedule → (its twin's strategy keys, the extrapolation pairs compared: label → (m1, m2) from pp)
SCHEDULES = {
    "zb-h1": ({"pipeline_schedule": "1f1b"},
              {"p, 2p": lambda p: (p, 2 * p), "2p, 4p": lambda p: (2 * p, 4 * p)}),
    "zb-v": ({"pipeline_schedule": "interleaved"},
             {"max(2p, 8), max(4p, 16)": lambda p: (max(2 * p, 8), max(4 * p, 16)),
              "4p, 8p": lambda p: (4 * p, 8 * p)}),
    "interleaved-zb": ({"pipeline_schedule": "interleaved"},
                       {"p, 2p": lambda p: (p, 2 * p), "2p, 4p": lambda p: (2 * p, 4 * p)}),
}
TWIN_NAME = {"zb-h1": "1F1B", "zb-v": "interleaved", "interleaved-zb": "interleaved"}


def extrapolated_s(spec: RunSpec, cost: RooflineCost, m1: int, m2: int) -> float:
    """The iteration time extrapolated along the line through ``m1`` and ``m2`` micro-batches."""
    m = spec.num_microbatches
    if m <= m2:
        return _simulate_once(spec, cost, m)[0]
    t2 = _simulate_once(spec, cost, m2)[0]
    t1 = _simulate_once(spec, cost, m1)[0]
    return t2 + (t2 - t1) * (m - m2) / (m2 - m1)


def main() -> None:
    """Print the extrapolation errors and the time ratios to the twins, per zero-bubble schedule."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=800)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--max-per-stage", type=int, default=64)
    ap.add_argument("--measure", metavar="DATASET", help="also time the grid's zero-bubble steps and their twins")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--schedules", default="zb-h1,zb-v,interleaved-zb",
                    help="the zero-bubble schedules to time with --measure")
    args = ap.parse_args()
    t0 = time.perf_counter()
    errors = {k: {label: [] for label in pairs} for k, (_twin, pairs) in SCHEDULES.items()}
    sim_ratio: dict[str, list[float]] = {k: [] for k in SCHEDULES}
    fast_ratio: dict[str, list[float]] = {k: [] for k in SCHEDULES}
    for seed in (int(x) for x in args.seeds.split(",")):
        for i in range(args.n):
            sample = draw(seed, i)
            spec, s = sample.spec, sample.spec.strategy
            if s.pipeline_schedule not in SCHEDULES or spec.num_microbatches > args.max_per_stage * s.pp:
                continue
            twin, pairs = SCHEDULES[s.pipeline_schedule]
            cost = RooflineCost(spec.hardware)
            exact = simulate(spec, exact=True).iteration_time_s
            for label, pair in pairs.items():
                errors[s.pipeline_schedule][label].append(abs(extrapolated_s(spec, cost, *pair(s.pp)) / exact - 1.0))
            run = json.loads(json.dumps(sample.run))
            run["strategy"].update(twin)
            ref = RunSpec.from_dict(run)
            sim_ratio[s.pipeline_schedule].append(simulate(spec).iteration_time_s / simulate(ref).iteration_time_s)
            ctx = RunContext(spec.model, spec.hardware)
            fast_ratio[s.pipeline_schedule].append(analytic_time(spec, ctx).total_s / analytic_time(ref, ctx).total_s)
    print(f"# zero-bubble runs of {args.n} draws of seeds {args.seeds} with <= {args.max_per_stage} "
          f"micro-batches a stage ({time.perf_counter() - t0:.0f} s)")
    for sched in SCHEDULES:
        n = len(sim_ratio[sched])
        if not n:
            print(f"\nno {sched} run drawn")
            continue
        print(f"\n{n} {sched} runs\n")
        print("| extrapolated from | max error | 95th percentile | runs within 0.1 % |")
        print("|---|---|---|---|")
        for label, e in errors[sched].items():
            a = np.array(e)
            print(f"| {label} | {a.max() * 100:.2f} % | {np.percentile(a, 95) * 100:.3f} % | "
                  f"{int((a <= 1e-3).sum())} of {n} |")
        print()
        print(f"| {sched} / {TWIN_NAME[sched]} time | min | median | max |")
        print("|---|---|---|---|")
        for label, r in (("simulator", sim_ratio[sched]), ("fast tier's closed form", fast_ratio[sched])):
            a = np.array(r)
            print(f"| {label} | {a.min():.3f} | {np.median(a):.3f} | {a.max():.3f} |")
    if args.measure:
        print()
        measure_twins(args.measure, args.rounds, args.schedules.split(","))


def measure_twins(dataset: str, rounds: int, schedules: list[str]) -> None:
    """Time each zero-bubble step of the grid and its twin here; print measured and predicted ratios."""
    import statistics

    import pandas as pd

    from learnedperf.measure.collect import step_hardware
    from learnedperf.measure.steps import measure_step, run_dict, step_grid

    steps = pd.read_parquet(f"{dataset}/steps_cpu.parquet")
    hardware = step_hardware(steps, dataset)
    grid = step_grid()
    twins = []
    for c in grid:
        sched = c.strategy.get("pipeline_schedule")
        if sched in schedules and sched in SCHEDULES:
            # the twin: the same step and chunks per rank under the schedule without the split backward
            twins.append((c, dataclasses.replace(c, strategy={**c.strategy, **SCHEDULES[sched][0]})))
    predictor = load_predictor(None, "zero_bubble")
    print(f"# {len(twins)} zero-bubble steps and their twins, {rounds} alternating rounds, median of the "
          "rounds' medians")
    print("| step | measured twin ms | measured zero-bubble ms | measured ratio | simulator | full | fast |")
    print("|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"simulator": [], "full": [], "fast": []}
    absolute: dict[str, list[float]] = {"simulator": [], "full": [], "fast": []}  # of the zero-bubble times
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
    print("MAPE of the zero-bubble times: " + ", ".join(f"{k} {np.mean(v) * 100:.1f} %" for k, v in absolute.items()))


if __name__ == "__main__":
    main()
