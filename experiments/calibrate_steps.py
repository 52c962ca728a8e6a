"""Fit the whole-step constants of the cost model on vTrain's measured iterations.

Two constants cannot be fit on single kernels: the large-GEMM tensor-core
efficiency (NeuSight's kernels are fp32 without tensor cores) and the per-kernel
overhead a training step pays between queued kernels (isolated-kernel timings
include a synchronisation floor). They are fit here, on a deterministic quarter
of vTrain's 1,440 runs (every 4th row), by grid search on the MAPE of the
simulated iteration time, and stored with provenance in
``learnedperf/cost/data/params.json``. Usage::

    python experiments/calibrate_steps.py [--data ../shared/data] [--dry-run]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from learnedperf.cost import RooflineCost, default_params
from learnedperf.cost.params import write_params
from learnedperf.measure.public import default_shared_data, load_vtrain
from learnedperf.simulate import simulate
from learnedperf.specs import RunSpec


def mape(runs, params) -> float:
    """MAPE (%) of simulated vs measured iteration time with ``params``."""
    errs = []
    for spec, meas in runs:
        t = simulate(spec, cost=RooflineCost(spec.hardware, params)).iteration_time_s * 1e3
        errs.append(abs(t / meas - 1))
    return 100 * statistics.fmean(errs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_shared_data())
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    rows = load_vtrain(args.data)[::4]
    runs = [(RunSpec.from_dict(r.run), r.iteration_time_ms) for r in rows]
    base = default_params()
    grid_eff = [0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9]
    grid_launch = [0.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 20.0]
    best = None
    for eff, launch in itertools.product(grid_eff, grid_launch):
        p = replace(base, gemm_efficiency_tensor=eff, kernel_launch_us=launch)
        err = mape(runs, p)
        if best is None or err < best[0]:
            best = (err, eff, launch)
    err, eff, launch = best
    print(f"gemm_efficiency_tensor={eff} kernel_launch_us={launch}: vTrain fit-subset MAPE {err:.2f}% "
          f"({len(runs)} runs)")
    if not args.dry_run:
        how = (f"fit by experiments/calibrate_steps.py on every 4th vTrain run ({len(runs)} of 1,440; "
               f"grid search, fit-subset MAPE {err:.2f}%)")
        write_params({"gemm_efficiency_tensor": (eff, how), "kernel_launch_us": (launch, how)})
        print("stored in learnedperf/cost/data/params.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
