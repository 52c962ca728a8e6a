"""A collective call's fixed time (``collective_base_us``): does it belong in the cost model?

NCCL's tuner models a collective's latency as a base per algorithm plus a latency per hop; the shipped
model has the per-step term alone (``alpha_intra_us``, :func:`learnedperf.cost.calibrate.fit_nvlink_allreduce`,
every row of vTrain's A100 all-reduce tables weighted alike). This script fits the three-term form
(:func:`~learnedperf.cost.calibrate.fit_nvlink_allreduce_base`, rows weighted by 1/size) and the two-term
form under the same weighting, and prints, for the shipped constants and both fits:

* the tables: mean |log error| (weighted by 1/size and by row), and the signed mean log(model/measured)
  per group size and message-size band;
* whole steps: the simulator's MAPE and bias (mean log predicted/measured) on vTrain's 1,440 runs, by
  tensor-parallel size, and on SC21's 10 (the host model's other constants as shipped).

    python experiments/allreduce_base.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

BANDS_MB = ((1, 4), (4, 16), (16, 64), (64, 256), (256, 1025))


def main(argv=None) -> int:
    """Fit both forms, print the tables' and the steps' errors of each."""
    from learnedperf.cost import RooflineCost, default_params
    from learnedperf.cost.calibrate import allreduce_tables, fit_nvlink_allreduce_base, ring_allreduce_s
    from learnedperf.measure.public import default_shared_data, load_sc21, load_vtrain
    from learnedperf.simulate import simulate
    from learnedperf.specs import RunSpec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_shared_data())
    args = ap.parse_args(argv)

    shipped = default_params()
    two = fit_nvlink_allreduce_base(args.data, base_grid_us=[0.0])
    three = fit_nvlink_allreduce_base(args.data)
    forms = {
        "shipped": (0.0, shipped.alpha_intra_us, shipped.link_efficiency_intra),
        "two terms, 1/S": (0.0, two["alpha_us"], two["eff"]),
        "with base, 1/S": (three["base_us"], three["alpha_us"], three["eff"]),
    }
    S, t, n, link = allreduce_tables(args.data)
    w = (1.0 / S) / np.sum(1.0 / S)
    print("vTrain's A100 NCCL all-reduce tables, 2-8 GPUs, 1 MB - 1 GB")
    for name, (base, alpha, eff) in forms.items():
        err = np.log(ring_allreduce_s(S, n, link, eff, alpha, base)) - np.log(t)
        print(f"  {name:<15} base {base:4.1f} µs, alpha {alpha:5.2f} µs, eff {eff:.2f}: mean |log err| "
              f"{np.sum(w * np.abs(err)):.3f} weighted by 1/size, {np.mean(np.abs(err)):.3f} by row")
        for gpus in (2, 4, 8):
            cells = []
            for lo, hi in BANDS_MB:
                m = (n == gpus) & (S >= lo * 2**20) & (S < hi * 2**20)
                cells.append(f"{lo}-{hi if hi < 1025 else 1024} MB {np.mean(err[m]):+.3f}")
            print(f"    {gpus} GPUs: " + ", ".join(cells))

    params = {name: replace(shipped, collective_base_us=base, alpha_intra_us=alpha, link_efficiency_intra=eff)
              for name, (base, alpha, eff) in forms.items()}
    sets = {"vTrain": [(r.run, r.iteration_time_ms) for r in load_vtrain()],
            "SC21": [(r.run, r.iteration_time_ms) for r in load_sc21()]}
    print("\nwhole steps, simulator: MAPE (bias = mean log predicted/measured)")
    print(f"  {'runs':<16} {'n':>5}  " + "  ".join(f"{name:>22}" for name in forms))
    for set_name, rows in sets.items():
        by_group: dict[str, list] = defaultdict(list)
        for run, measured in rows:
            spec = RunSpec.from_dict(run)
            logs = [math.log(simulate(spec, cost=RooflineCost(spec.hardware, p)).iteration_time_s * 1e3 / measured)
                    for p in params.values()]
            by_group[set_name].append(logs)
            if set_name == "vTrain":
                by_group[f"  tp {spec.strategy.tp}"].append(logs)
        for group, logs in sorted(by_group.items(), key=lambda kv: (kv[0].startswith(" "), kv[0])):
            a = np.asarray(logs)
            mape, bias = 100 * np.mean(np.abs(np.exp(a) - 1), axis=0), a.mean(axis=0)
            print(f"  {group:<16} {len(a):>5}  " + "  ".join(f"{m:13.2f}% ({b:+.3f})" for m, b in zip(mape, bias)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
