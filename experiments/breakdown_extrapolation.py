"""How the simulator's extrapolated breakdown compares with simulating every micro-batch.

For sampled runs (``--seed``, indices 0..``--n``-1) whose iteration the simulator extrapolates (more micro-batches
than its second short step) and that have at most ``--max-per-stage`` micro-batches per pipeline stage, this script
simulates every micro-batch (``exact=True``) and prints, over those runs:

* the error of the extrapolated iteration time;
* how many extrapolated breakdowns add up to the extrapolated iteration time (parts: forward, backward, recompute,
  optimizer, exposed communication, pipeline bubble; within 0.1 %), and the worst ratio of their sum to it;
* the error of each part against the exact breakdown, as a share of the exact iteration time (median, p90, max).

``--compare-pairs`` prints instead, over the sampled pipelines (pp > 1, no zero-bubble schedule) of more than 4p
micro-batches, the error of the time extrapolated from p and 2p micro-batches (the simulator's pair until
2026-11-27) and from 2p and 4p (its pair since), with the time each took.

    python experiments/breakdown_extrapolation.py [--n 400] [--seed 0] [--max-per-stage 32] [--compare-pairs]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from learnedperf.cost import RooflineCost
from learnedperf.data.sampler import sample_runs
from learnedperf.simulate import simulate
from learnedperf.simulate.simulator import simulate_line
from learnedperf.specs import RunSpec

PARTS = ("forward", "backward", "recompute", "optimizer", "exposed_communication", "pipeline_bubble")


def compare_pairs(args) -> int:
    """Time errors of the lines from (p, 2p) and from (2p, 4p) on the same pipelines."""
    pairs = {"p, 2p": (1, 2), "2p, 4p": (2, 4)}
    errs = {k: [] for k in pairs}
    spent = dict.fromkeys(pairs, 0.0)
    for _i, run in sample_runs(args.n, args.seed):
        spec = RunSpec.from_dict(run)
        p, m = spec.strategy.pp, spec.num_microbatches
        if p == 1 or spec.strategy.zero_bubble or m <= 4 * p or m > args.max_per_stage * p:
            continue
        exact = simulate(spec, exact=True).iteration_time_s
        for k, (a, b) in pairs.items():
            t0 = time.perf_counter()
            t = simulate_line(spec, RooflineCost(spec.hardware), a * p, b * p)[0]
            spent[k] += time.perf_counter() - t0
            errs[k].append(abs(t / exact - 1))
    for k, v in errs.items():
        e = 100 * np.array(v)
        print(f"from {k}: {len(e)} pipelines, time error median {np.median(e):.3f} %, p90 {np.percentile(e, 90):.3f} %, "
              f"max {e.max():.2f} %; {(e > 1).sum()} more than 1 % off; {spent[k]:.1f} s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-per-stage", type=int, default=32)
    ap.add_argument("--compare-pairs", action="store_true", help="compare the lines from (p, 2p) and (2p, 4p)")
    args = ap.parse_args(argv)
    if args.compare_pairs:
        return compare_pairs(args)
    sums, errs, time_errs = [], {p: [] for p in PARTS}, []
    for _i, run in sample_runs(args.n, args.seed):
        spec = RunSpec.from_dict(run)
        s = spec.strategy
        fast = simulate(spec)
        if not fast.extrapolated or spec.num_microbatches > args.max_per_stage * s.pp:
            continue
        exact = simulate(spec, exact=True)
        total = fast.iteration_time_s
        time_errs.append(abs(total / exact.iteration_time_s - 1))
        sums.append(sum(fast.breakdown_s[p] for p in PARTS) / total)
        for p in PARTS:
            errs[p].append(abs(fast.breakdown_s[p] - exact.breakdown_s[p]) / exact.iteration_time_s)
    sums = np.array(sums)
    ok = np.abs(sums - 1) <= 1e-3
    print(f"{len(sums)} extrapolated runs: breakdown adds up to the time in {ok.sum()} "
          f"(sum/time from {sums.min():.3f} to {sums.max():.3f})")
    e = 100 * np.array(time_errs)
    print(f"  iteration time error, %: median {np.median(e):.3f}  p90 {np.percentile(e, 90):.3f}  max {e.max():.2f}")
    for p in PARTS:
        e = 100 * np.array(errs[p])
        print(f"  {p:<22} error, % of the iteration: median {np.median(e):.2f}  p90 {np.percentile(e, 90):.2f}  "
              f"max {e.max():.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
