"""The host's share of a training step: a per-kernel floor against a host that runs ahead of the device.

Eager frameworks issue kernels asynchronously: the host queues them and the device waits only where the
host issues more slowly than it computes. The simulator can time a block of kernels issued back to back
(a layer's forward or backward) two ways (``learnedperf/cost/params.py``):

* ``floor``: every kernel takes at least ``kernel_floor_us``, ``Σ max(t, floor)``;
* ``host``: the block takes ``max(Σ t, kernels · host_dispatch_us)`` (:func:`learnedperf.cost.host_bound_s`).

Each model's two whole-step constants (with the tensor-core GEMM efficiency) are fitted by
``experiments/calibrate_steps.py --model floor|host`` on every 4th vTrain run (jointly with the 10 SC21 runs
until 2026-11-29: the floor model's default below is that fit's; since then SC21 is held out). This prints,
for both, the simulator's MAPE and mean log(predicted / measured) on the fit's runs and on runs neither fit
saw: SC21 (the host model's), the other three quarters of vTrain, NeuSight's steps on five GPUs (all, then
per GPU), and every transformer step of this project's own data sets (``datasets/measured``: the lent H100's
and H200's, whose small steps are bound by their hosts, and the CPUs'). A step that cannot be simulated is counted, not scored.

    python experiments/host_pipeline.py [--floor EFF,FLOOR_US] [--host EFF,DISPATCH_US] [--neusight-runs]

``--neusight-runs`` also prints each NeuSight step: measured, the host model's time and its error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pair(text: str) -> tuple[float, float]:
    eff, us = (float(x) for x in text.split(","))
    return eff, us


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--floor", type=_pair, default=(0.8, 70.0),
                    help="tensor-core efficiency and kernel floor (µs) of the floor model (default 0.8,70: what "
                         "calibrate_steps.py --model floor fitted jointly with SC21 before 2026-11-29)")
    ap.add_argument("--host", type=_pair, default=None,
                    help="tensor-core efficiency and host dispatch (µs) of the host model (default: the shipped "
                         "constants, learnedperf/cost/data/params.json)")
    ap.add_argument("--neusight-runs", action="store_true",
                    help="also print each NeuSight step: measured ms, the host model's ms and the error")
    args = ap.parse_args(argv)
    import numpy as np
    import pandas as pd

    from learnedperf.cost import RooflineCost, default_params
    from learnedperf.measure.public import load_neusight_steps, load_sc21, load_vtrain
    from learnedperf.measure.records import verify_manifest
    from learnedperf.measure.steps import TRANSFORMER_ARCHS
    from learnedperf.simulate import simulate
    from learnedperf.specs import RunSpec

    if args.host is None:
        args.host = (default_params().gemm_efficiency_tensor, default_params().host_dispatch_us)
    sets: dict[str, list] = {}
    vtrain = load_vtrain()
    sets["vTrain, fit quarter"] = [(r.run, r.iteration_time_ms) for r in vtrain[::4]]
    sets["SC21 (held out)"] = [(r.run, r.iteration_time_ms) for r in load_sc21()]
    sets["vTrain, other 3/4"] = [(r.run, r.iteration_time_ms) for i, r in enumerate(vtrain) if i % 4]
    neusight = load_neusight_steps().records
    sets["NeuSight steps"] = [(json.loads(s["run"]), s["iteration_time_ms"]) for s in neusight]
    for name in sorted({s["device_name"] for s in neusight}):  # each GPU's, to see which one moved
        sets[f"  {name}"] = [(json.loads(s["run"]), s["iteration_time_ms"])
                             for s in neusight if s["device_name"] == name]
    for d in sorted(p for p in (ROOT / "datasets" / "measured").iterdir() if p.is_dir()):
        verify_manifest(d)
        files = sorted(d.glob("steps_*.parquet"))
        if not files:
            continue
        steps = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        steps = steps[steps["arch"].isin(TRANSFORMER_ARCHS)]
        sets[d.name] = [(json.loads(r), t) for r, t in zip(steps["run"], steps["iteration_time_ms"])]
    models = {"floor": replace(default_params(), gemm_efficiency_tensor=args.floor[0], kernel_launch_us=0.0,
                               kernel_floor_us=args.floor[1], host_dispatch_us=0.0),
              "host": replace(default_params(), gemm_efficiency_tensor=args.host[0], kernel_launch_us=0.0,
                              kernel_floor_us=0.0, host_dispatch_us=args.host[1])}
    print(f"floor: gemm_efficiency_tensor {args.floor[0]}, kernel_floor_us {args.floor[1]}; "
          f"host: gemm_efficiency_tensor {args.host[0]}, host_dispatch_us {args.host[1]}")
    print(f"{'runs':<24} {'n':>5}  {'floor MAPE':>10} {'bias':>6}  {'host MAPE':>9} {'bias':>6}  not simulated")
    # log(predicted / measured) of each model by run: NeuSight's runs are in two sets (all, then per GPU)
    memo: dict[str, list[float] | None] = {}

    def log_errors(run: dict, measured: float) -> list[float] | None:
        key = json.dumps(run, sort_keys=True)
        if key not in memo:
            spec = RunSpec.from_dict(run)
            try:
                memo[key] = [math.log(simulate(spec, cost=RooflineCost(spec.hardware, p)).iteration_time_s * 1e3
                                      / measured) for p in models.values()]
            except Exception:  # noqa: BLE001 - counted below, as the generator counts them
                memo[key] = None
        return memo[key]

    for name, rows in sets.items():
        out, failed = [], 0
        for run, measured in rows:
            logs = log_errors(run, measured)
            if logs is None:
                failed += 1
                continue
            out.append(logs)
        if not out:
            print(f"{name:<24} {0:>5}  (none simulated; {failed} failed)")
            continue
        a = np.asarray(out)
        mape, bias = 100 * np.mean(np.abs(np.exp(a) - 1), axis=0), a.mean(axis=0)
        print(f"{name:<24} {len(a):>5}  {mape[0]:9.1f}% {bias[0]:+6.2f}  {mape[1]:8.1f}% {bias[1]:+6.2f}  {failed}")
    if args.neusight_runs:
        print("\nNeuSight steps, host model:")
        print(f"  {'run':<64} {'measured ms':>11} {'predicted':>10} {'error':>7}")
        for run, measured in sets["NeuSight steps"]:
            logs = log_errors(run, measured)
            if logs is None:
                print(f"  {run['id']:<64} {measured:11.1f} {'failed':>10}")
                continue
            ratio = math.exp(logs[1])  # the host model's
            print(f"  {run['id']:<64} {measured:11.1f} {measured * ratio:10.1f} {100 * (ratio - 1):+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
