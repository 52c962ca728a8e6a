"""Re-measure a random sample of committed records and compare with what was stored.

For each sampled operator record the same case (op, shape, params, dtype) is timed again
with :func:`learnedperf.measure.ops.profile_op` and the same thread count; for each sampled
step record the same configuration is run again with
:func:`learnedperf.measure.steps.measure_step` on the hardware stored in its run. The script
prints, per kind of record, the share whose new median falls inside the stored
[p10, p90] spread, the share within ±20 % of the stored median, and the median ratio.

Usage: ``python experiments/reproduce_measurements.py DATASET_DIR [--ops N] [--steps N] [--seed S]``
(run it on the machine that made the records, with nothing else running).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _summary(name: str, pairs: list[tuple[float, float, float, float]]) -> None:
    """pairs: (stored median, stored p10, stored p90, new median)."""
    if not pairs:
        return
    inside = sum(lo <= new <= hi for _med, lo, hi, new in pairs) / len(pairs)
    near = sum(abs(new / med - 1) <= 0.2 for med, _lo, _hi, new in pairs) / len(pairs)
    ratio = statistics.median(new / med for med, _lo, _hi, new in pairs)
    print(f"{name}: {len(pairs)} re-measured; new median inside stored [p10, p90]: {inside:.0%}; "
          f"within ±20 % of stored median: {near:.0%}; median new/stored {ratio:.3f}")


def main(argv: list[str]) -> int:
    import pandas as pd

    from learnedperf.measure.ops import OpCase, profile_op
    from learnedperf.measure.bench import other_machine
    from learnedperf.measure.records import verify_manifest
    from learnedperf.measure.steps import STRATEGY_DEFAULTS, StepConfig, measure_step

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--ops", type=int, default=60, help="operator records to re-measure")
    ap.add_argument("--steps", type=int, default=8, help="step records to re-measure")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    manifest = verify_manifest(args.dataset)
    other = other_machine(manifest)
    if other:
        # another CPU cannot reproduce these timings, and may not run every case (fp16 without a fast kernel)
        print(f"error: {args.dataset} was measured on another machine ({other}); run this where it was measured",
              file=sys.stderr)
        return 2

    ops = pd.concat([pd.read_parquet(f) for f in sorted(args.dataset.glob("ops_*.parquet"))
                     if "collectives" not in f.name], ignore_index=True)
    sample = ops.sample(min(args.ops, len(ops)), random_state=args.seed)
    pairs = []
    for rec in sample.to_dict("records"):
        case = OpCase(rec["op"], rec["kind"], tuple(json.loads(rec["shape"])), json.loads(rec["params"]), rec["dtype"])
        new = profile_op(case, threads=int(rec["threads"]), descriptor=json.loads(rec["device"]))
        again = next(r for r in new if r["direction"] == rec["direction"])
        pairs.append((rec["time_ms"], rec["time_p10_ms"], rec["time_p90_ms"], again["time_ms"]))
    _summary("operator records", pairs)

    steps = pd.concat([pd.read_parquet(f) for f in sorted(args.dataset.glob("steps_*.parquet"))], ignore_index=True)
    sample = steps.sample(min(args.steps, len(steps)), random_state=args.seed)
    pairs = []
    for rec in sample.to_dict("records"):
        run = json.loads(rec["run"])
        hw = dict(run["hardware"])
        # the run records every strategy field; a step config takes the keys measure_step understands
        strategy = {k: v for k, v in run["strategy"].items() if k in STRATEGY_DEFAULTS}
        if strategy.get("fsdp"):
            strategy.pop("zero_stage", None)
        config = StepConfig(run["model"], int(rec["world_size"]), strategy, warmup=int(rec["warmup"]),
                            repeats=int(rec["repeats"]), threads=int(rec["threads"]))
        again = measure_step(config, hw)
        pairs.append((rec["iteration_time_ms"], rec["iteration_p10_ms"], rec["iteration_p90_ms"],
                      again["iteration_time_ms"]))
        print(f"  {rec['strategy_kind']:<6} world={rec['world_size']} {rec['model_name']:<14} stored "
              f"{rec['iteration_time_ms']:8.1f} ms [{rec['iteration_p10_ms']:.1f}, {rec['iteration_p90_ms']:.1f}]"
              f"  again {again['iteration_time_ms']:8.1f} ms", flush=True)
    _summary("step records", pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
