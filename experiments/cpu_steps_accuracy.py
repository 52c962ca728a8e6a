"""How well the simulator predicts the project's own measured CPU training steps.

1. The device's roofline constants are fit on its **operator** records only
   (``ops*.parquet``, :func:`learnedperf.cost.calibrate.fit_device_params`): per-op overhead,
   streaming-bandwidth efficiency, GEMM and attention efficiencies relative to the peaks the
   micro-benchmarks measured.
2. Every measured transformer **step** (``steps*.parquet``) is simulated on the device
   descriptor and links recorded in its run (with its kernel curves, at their isolated rate), with
   those constants.
3. The whole-step constants of a measured device (per-op floor, the shares of the kernel
   curves' rate and of the measured bandwidth kept in a step) are then refit on this data set's
   **single-process** steps only, and every step is simulated again: the multi-process steps are
   held out of both fits.
4. The script prints the MAPE and mean bias per strategy kind, single-process and
   multi-process apart, per precision (fp32, bf16 under torch.autocast), and the worst runs, for
   both sets of constants and for the shipped constants (whose measured-device constants
   ``experiments/calibrate_steps.py --measured`` fits on every CPU data set's single-process steps).

Usage: ``python experiments/cpu_steps_accuracy.py [DATASET_DIR ...]`` (default: every
directory under ``datasets/measured/`` that has both kinds of record).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: whole-step constants refit on single-process steps, and their grids
STEP_GRIDS = {
    "kernel_floor_us": [0.0, 10, 20, 30, 40, 50, 60, 80, 100, 120, 150, 200, 250, 300, 400, 500, 600, 800],
    "curve_memory_efficiency": [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2],
    "curve_efficiency": [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 1.0, 1.1, 1.2],
}


def evaluate(directory: Path) -> list[dict]:
    """Per step record of ``directory``: strategy kind, world size, measured and predicted ms."""
    import pandas as pd

    from learnedperf.cost import RooflineCost
    from learnedperf.cost.calibrate import fit_device_params
    from learnedperf.measure.records import verify_manifest
    from learnedperf.measure.steps import TRANSFORMER_ARCHS
    from learnedperf.simulate import simulate
    from learnedperf.simulate.calibrate import steps_mape
    from learnedperf.specs import RunSpec

    verify_manifest(directory)
    ops = pd.concat([pd.read_parquet(f) for f in sorted(directory.glob("ops*.parquet"))], ignore_index=True)
    steps = pd.concat([pd.read_parquet(f) for f in sorted(directory.glob("steps*.parquet"))], ignore_index=True)
    compute = ops[(ops.world_size == 1) & (ops.direction != "comm")]
    out = []
    # one fit per device descriptor of the operator records (normally one: the single-process device)
    fits = {}
    for dev, group in compute.groupby("device"):
        params, report = fit_device_params(group.to_dict("records"))
        fits[dev] = params
        print(f"{directory.name}: fit on {report['records']} operator records of {report['device']}: "
              f"mean |log err| {report['mean_abs_log_error']:.3f}; "
              + ", ".join(f"{k}={getattr(params, k):g}" for k in report["fitted"]))
        print("  operator MAPE after the fit: " + ", ".join(f"{k} {v * 100:.0f}%"
                                                           for k, v in report["mape_by_kind"].items()))
    if len(fits) != 1:
        raise SystemExit(f"{directory}: expected the operator records of one device, found {len(fits)}")
    # the steps' runs carry kernel curves (the op records' descriptor does not), so their memory-bound ops
    # run at curve_memory_efficiency of the measured bandwidth: the share the operator fit found for it;
    # their GEMMs on the curves at the isolated rate (curve_efficiency 1)
    op_params = next(iter(fits.values()))
    op_params = replace(op_params, curve_memory_efficiency=op_params.memory_efficiency, curve_efficiency=1.0)
    runs = [(RunSpec.from_dict(json.loads(rec["run"])), rec) for rec in steps.to_dict("records")
            if rec["arch"] in TRANSFORMER_ARCHS]

    def predict(params, subset):
        return [simulate(spec, cost=RooflineCost(spec.hardware, params)).iteration_time_s * 1e3
                for spec, _rec in subset]

    def mape(params, subset) -> float:
        return steps_mape([(spec, float(rec["iteration_time_ms"])) for spec, rec in subset], params) / 100

    # whole-step constants, as for GPUs (experiments/calibrate_steps.py): isolated operators run with hot
    # caches and without the framework's per-op work in a real step, so the per-op floor and the
    # efficiencies are refit on the single-process steps; multi-process steps stay held out
    single = [x for x in runs if int(x[1]["world_size"]) == 1]
    step_params = op_params
    best = mape(step_params, single)
    for _ in range(2):
        for name, grid in STEP_GRIDS.items():
            for value in grid:
                trial = replace(step_params, **{name: float(value)})
                val = mape(trial, single)
                if val < best:
                    step_params, best = trial, val
    print(f"  whole-step constants fit on the {len(single)} single-process steps: "
          + ", ".join(f"{k}={getattr(step_params, k):g}" for k in STEP_GRIDS) + f" (fit MAPE {best:.1%})")
    from learnedperf.cost.params import default_params

    for label, params in (("shipped constants", default_params()), ("operator fit only", op_params),
                          ("with whole-step fit", step_params)):
        for p, (spec, rec) in zip(predict(params, runs), runs):
            prec = spec.strategy.precision + (" autocast" if spec.strategy.autocast else "")
            out.append({"fit": label, "kind": rec["strategy_kind"], "world": int(rec["world_size"]), "precision": prec,
                        "model": rec["model_name"], "measured_ms": float(rec["iteration_time_ms"]),
                        "predicted_ms": p, "id": rec["run_id"]})
    return out


def report(rows: list[dict]) -> None:
    """Print MAPE and bias per (single/multi-process, strategy kind)."""
    def line(name: str, sub: list[dict]) -> str:
        errs = [r["predicted_ms"] / r["measured_ms"] - 1 for r in sub]
        mape = sum(abs(e) for e in errs) / len(errs) * 100
        bias = sum(errs) / len(errs) * 100
        return f"  {name:<14} n={len(sub):>4}  MAPE {mape:6.1f}%  mean bias {bias:+6.1f}%"

    for label, pick in (("single process", lambda r: r["world"] == 1), ("multi-process", lambda r: r["world"] > 1)):
        sub = [r for r in rows if pick(r)]
        if not sub:
            continue
        print(f"{label}: " + line("all", sub).strip())
        for kind in sorted({r["kind"] for r in sub}):
            print(line(kind, [r for r in sub if r["kind"] == kind]))
    print("by precision: " + "; ".join(line(p, [r for r in rows if r["precision"] == p]).strip()
                                       for p in sorted({r["precision"] for r in rows})))
    worst = sorted(rows, key=lambda r: -abs(r["predicted_ms"] / r["measured_ms"] - 1))[:5]
    print("worst runs:")
    for r in worst:
        print(f"  {r['kind']:<8} world={r['world']} {r['model']:<16} measured {r['measured_ms']:8.1f} ms  "
              f"predicted {r['predicted_ms']:8.1f} ms  ({r['predicted_ms'] / r['measured_ms'] - 1:+.0%})")


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    missing = [a for a in argv if not Path(a).is_dir()]
    if missing:
        print(f"not a data set directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    dirs = [Path(a) for a in argv] or sorted(
        p for p in (ROOT / "datasets" / "measured").glob("*")
        if any(p.glob("ops*.parquet")) and any(p.glob("steps*.parquet")))
    if not dirs:
        print("no measured data set with operator and step records under datasets/measured/")
        return 1
    for d in dirs:
        rows = evaluate(d)
        for label in ("shipped constants", "operator fit only", "with whole-step fit"):
            sub = [r for r in rows if r["fit"] == label]
            print(f"{d.name}, {label}: {len(sub)} transformer steps simulated")
            report(sub)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
