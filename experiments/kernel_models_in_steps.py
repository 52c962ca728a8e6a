"""Two kernel models that fit their kernels better and whole training steps worse.

    python experiments/kernel_models_in_steps.py

1. **The tensor-core GEMMs' own inner-dimension ramp** (``CostParams.gemm_k_half_tensor``). The shipped GEMM model
   has one ramp ``k / (k + k½)`` for every dtype, fitted on NeuSight's fp32 kernels (k½ = 8). A tensor-core kernel
   steps through k in deeper tiles than a CUDA-core one, and the lent H100's and H200's forward bf16/fp16 GEMMs
   want a longer ramp: :func:`learnedperf.cost.calibrate.fit_gemm_tensor` fits k½, an efficiency and a call floor
   on each GPU's kernels and scores them on the other's, beside the same fit with k½ held at the shipped value.
2. **Row reductions' share of the element-wise bandwidth** (``CostParams.reduction_memory_share``). NeuSight's
   layer-norm and softmax kernels reach less of the data-sheet bandwidth than its element-wise ones:
   ``memory_efficiency`` is fitted on the element-wise kernels alone and the share on the reductions
   (:func:`~learnedperf.cost.calibrate.fit_reduction_share`), then both are scored on kernels none of the fits
   read, the lent GPUs' forward norm and softmax kernels over 100 µs (mean log(model / measured), shipped and
   refitted).

Then whole steps, for the shipped constants and each change (and both), two rows each: at the shipped
``gemm_efficiency_tensor``, then with it refitted on every 4th vTrain run as ``calibrate_steps.py`` fits it (the
host dispatch and the pipeline send held at the shipped values, a grid of 0.05); the simulator's MAPE on the
other vTrain runs, SC21, NeuSight's steps and the lent GPUs' steps.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: gemm_efficiency_tensor values the step fit tries for each variant
TENSOR_EFF_GRID = (0.70, 0.75, 0.80, 0.85, 0.90)
#: forward norm / softmax kernels of the lent GPUs the reduction model is scored on: over 100 µs, as the fit's
REDUCTION_CHECK_MIN_MS = 0.1


def _reduction_check(gpu: dict, params) -> str:
    """Mean log(model / measured) of the lent GPUs' forward norm / softmax kernels, per op."""
    import numpy as np

    from learnedperf.cost.calibrate import _device_groups, _groups_time_s

    out = []
    for name, rows in gpu.items():
        d = rows[rows["op"].isin(["layer_norm", "rms_norm", "softmax"]) & (rows["direction"] == "fwd")
                 & (rows["time_ms"] > REDUCTION_CHECK_MIN_MS)]
        parts = []
        for op, g in d.groupby("op", sort=True):
            groups, y = _device_groups(g)
            errs = np.log(_groups_time_s(groups, replace(params, kernel_launch_us=0.0, kernel_floor_us=0.0))) - y
            parts.append(f"{op} {np.mean(errs):+.2f} (n={len(errs)})")
        out.append(f"{name}: " + ", ".join(parts))
    return "; ".join(out)


def main() -> int:
    import numpy as np
    import pandas as pd

    from learnedperf.cost import RooflineCost, default_params
    from learnedperf.cost.calibrate import (_ELEMENTWISE, fit_gemm_tensor, fit_memory_bound, fit_reduction_share,
                                            gemm_tensor_error, model_shaped)
    from learnedperf.measure.public import load_neusight_steps, load_sc21, load_vtrain
    from learnedperf.measure.steps import TRANSFORMER_ARCHS
    from learnedperf.simulate import simulate
    from learnedperf.specs import RunSpec

    shipped = default_params()
    files = sorted((ROOT / "datasets" / "measured").glob("*/ops_cuda.parquet"))
    gpu = {p.parent.name: pd.read_parquet(p) for p in files}
    if len(gpu) < 2:
        raise SystemExit("kernel_models_in_steps: needs two GPUs' operator records "
                         "(datasets/measured/*/ops_cuda.parquet)")

    print("1. tensor-core GEMM ramp: fitted on one GPU's forward bf16/fp16 GEMMs, scored on the other's")
    print(f"   {'fitted on':<12} {'k½':>5} {'eff':>5} {'floor µs':>8} {'own':>6} {'other':>6}   "
          f"| k½ held at {shipped.gemm_k_half:g}: {'eff':>5} {'own':>6} {'other':>6}")
    for name, rows in gpu.items():
        others = pd.concat([r for n, r in gpu.items() if n != name], ignore_index=True)
        line = f"   {name:<12}"
        for fit in (fit_gemm_tensor(rows, shipped), fit_gemm_tensor(rows, shipped, k_half_grid=[shipped.gemm_k_half])):
            other = gemm_tensor_error(others, fit["k_half"], fit["eff"], fit["floor_us"], shipped)
            line += (f" {fit['k_half']:5g} {fit['eff']:5.2f} {fit['floor_us']:8g} {fit['_mean_abs_log_error']:6.3f}"
                     f" {other:6.3f}   |")
        print(line.rstrip(" |"))
    every = fit_gemm_tensor(pd.concat(list(gpu.values()), ignore_index=True), shipped)
    print(f"   every GPU: k½ {every['k_half']:g}, eff {every['eff']:.2f}, mean |log err| "
          f"{every['_mean_abs_log_error']:.3f} over {every['_kernels']} kernels")

    print("\n2. row reductions: NeuSight's transformer-shaped kernels, then the lent GPUs' (not fitted on)")
    ops = model_shaped(pd.read_parquet(ROOT.parent / "shared" / "data" / "neusight_ops.parquet"))
    ew = fit_memory_bound(ops, _ELEMENTWISE)
    red = fit_reduction_share(ops, ew["eff"])
    print(f"   shipped: memory_efficiency {shipped.memory_efficiency:g} on every memory-bound kernel")
    print(f"   element-wise kernels alone: {ew['eff']:.2f} (mean |log err| {ew['_mean_abs_log_error']:.3f}); "
          f"layer norm and softmax at a share {red['share']:.2f} of it (mean |log err| "
          f"{red['_mean_abs_log_error']:.3f})")
    reduction = replace(shipped, memory_efficiency=float(ew["eff"]), reduction_memory_share=float(red["share"]))
    print(f"   lent kernels, mean log(model / measured), shipped: {_reduction_check(gpu, shipped)}")
    print(f"   lent kernels, mean log(model / measured), refitted: {_reduction_check(gpu, reduction)}")

    variants = {"shipped": shipped,
                f"tensor k½ {every['k_half']:g}": replace(shipped, gemm_k_half_tensor=every["k_half"]),
                "reduction share": reduction,
                "both": replace(reduction, gemm_k_half_tensor=every["k_half"])}
    vtrain = load_vtrain()
    fit_set = [(r.run, r.iteration_time_ms) for r in vtrain[::4]]
    sets = {"vTrain, other 3/4": [(r.run, r.iteration_time_ms) for i, r in enumerate(vtrain) if i % 4],
            "SC21": [(r.run, r.iteration_time_ms) for r in load_sc21()],
            "NeuSight steps": [(json.loads(s["run"]), s["iteration_time_ms"]) for s in load_neusight_steps().records]}
    for d in sorted(gpu):
        steps = pd.read_parquet(ROOT / "datasets" / "measured" / d / "steps_cuda.parquet")
        steps = steps[steps["arch"].isin(TRANSFORMER_ARCHS)]
        sets[d] = [(json.loads(r), t) for r, t in zip(steps["run"], steps["iteration_time_ms"])]

    def mape(rows, params) -> float:
        errs = []
        for run, measured in rows:
            spec = RunSpec.from_dict(run)
            errs.append(abs(simulate(spec, cost=RooflineCost(spec.hardware, params)).iteration_time_s * 1e3
                            / measured - 1))
        return 100 * float(np.mean(errs))

    print(f"\n3. whole steps (simulator MAPE %), at the shipped gemm_efficiency_tensor and refitted on every 4th "
          f"vTrain run (the other whole-step constants held)")
    print(f"   {'variant':<18} {'eff':>5} {'fit 1/4':>8} " + " ".join(f"{n:>17}" for n in sets))
    for label, params in variants.items():
        fits = {e: mape(fit_set, replace(params, gemm_efficiency_tensor=e)) for e in TENSOR_EFF_GRID}
        eff0 = shipped.gemm_efficiency_tensor
        best = min(fits, key=fits.get)
        # the shipped efficiency's row, then the refitted one's (one row where they agree)
        rows_of = {eff0: fits[eff0] if eff0 in fits else mape(fit_set, params), best: fits[best]}
        for eff, fit_mape in rows_of.items():
            p = replace(params, gemm_efficiency_tensor=eff)
            print(f"   {label:<18} {eff:5.2f} {fit_mape:8.2f} "
                  + " ".join(f"{mape(rows, p):17.2f}" for rows in sets.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
