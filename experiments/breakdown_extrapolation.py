"""How the simulator's extrapolated breakdown compares with simulating every micro-batch.

For sampled runs (``--seed``, indices 0..``--n``-1) whose iteration the simulator extrapolates (more micro-batches
than its second short step) and that have at most ``--max-per-stage`` micro-batches per pipeline stage, this script
simulates every micro-batch (``exact=True``) and prints, over those runs:

* the error of the extrapolated iteration time;
* how many extrapolated breakdowns add up to the extrapolated iteration time (parts: forward, backward, recompute,
  optimizer, exposed communication, pipeline bubble; within 0.1 %), and the worst ratio of their sum to it;
* the error of each part against the exact breakdown, as a share of the exact iteration time (median, p90, max).

    python experiments/breakdown_extrapolation.py [--n 400] [--seed 0] [--max-per-stage 32]
"""

from __future__ import annotations

import argparse

import numpy as np

from learnedperf.data.sampler import sample_runs
from learnedperf.simulate import simulate
from learnedperf.specs import RunSpec

PARTS = ("forward", "backward", "recompute", "optimizer", "exposed_communication", "pipeline_bubble")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-per-stage", type=int, default=32)
    args = ap.parse_args(argv)
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
