"""Which run features move the learned correction? The checkpoint's GNN correction on published runs, attributed.

For each run of a published-runs table (default: every table in ``shared/data/published``, which is
Megatron-LM SC21 Table 1, held out of all training), the full tier's correction of the simulator,
``c = log(full tier / simulator)``, and for each global feature of the GNN
(:data:`learnedperf.features.GLOBAL_FEATURE_SCHEMA`) the part of ``c`` that goes when that feature alone is set
to the mean of the GNN's training set: ``c - c(feature at its training mean)``. The ``--top`` largest per run
are printed, then each feature's mean part over the runs. This is an occlusion attribution: it says which
inputs the network reads for a run, not a decomposition (the network is not additive, so the parts need not
sum to ``c``). A checkpoint without a GNN (``simulator``, ``formula``) has no correction to attribute.

    python experiments/correction_attribution.py [TABLE.csv ...] [--checkpoint DIR] [--top 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from learnedperf.errors import LearnedPerfError
from learnedperf.measure.public import default_shared_data
from learnedperf.measure.published import load_published

from _checkpoint import add_checkpoint_argument, load_predictor


def attribution(predictor, run: dict) -> tuple[float, dict[str, float]]:
    """``(c, {feature: part})`` of one run (see the module docstring)."""
    from learnedperf.features import GLOBAL_FEATURE_SCHEMA
    from learnedperf.graph.execution import compile_run
    from learnedperf.simulate.memory import memory_microbatches
    from learnedperf.specs import RunSpec

    spec = RunSpec.from_dict(run)
    pred, _result = predictor.predict_with_result(spec)
    base = pred["simulator_iteration_time_ms"]
    breakdown = {k: v / pred["breakdown_scale"] for k, v in pred["breakdown_ms"].items()}
    sample = predictor.gnn_sample(spec, compile_run(spec, memory_microbatches(spec)), base, breakdown)
    gnn = predictor.checkpoint.gnn
    c = float(gnn.predict_log([sample])[0] - np.log(base))
    names = GLOBAL_FEATURE_SCHEMA.names
    occluded = []
    for j in range(len(names)):
        g = sample.global_x.copy()
        g[j] = gnn.global_mean_[j]
        occluded.append(dataclasses.replace(sample, global_x=g))
    parts = c - (gnn.predict_log(occluded) - np.log(base))
    return c, dict(zip(names, (float(v) for v in parts)))


def main(argv=None) -> int:
    """Attribute the correction of every usable run of the tables; print the largest parts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="*", type=Path, help="published-runs CSV tables (default: shared/data/published)")
    add_checkpoint_argument(ap)
    ap.add_argument("--top", type=int, default=5, help="features printed per run (default 5)")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error("--top must be >= 1")
    predictor = load_predictor(args.checkpoint, "correction_attribution")
    if predictor.checkpoint.gnn is None:
        print(f"correction_attribution: error: checkpoint {predictor.source} has no GNN (method "
              f"{predictor.checkpoint.method!r}): no correction to attribute", file=sys.stderr)
        return 1
    tables = args.tables or sorted((default_shared_data() / "published").glob("*.csv"))
    if not tables:
        print("correction_attribution: no tables given and none in ../shared/data/published", file=sys.stderr)
        return 1
    print(f"checkpoint {predictor.source}; c = log(full tier / simulator); part = c - c(feature at its training "
          "mean)")
    totals: dict[str, list[float]] = {}
    for table in tables:
        try:
            loaded = load_published(table)
        except LearnedPerfError as exc:
            print(f"correction_attribution: error: {table}: {exc}", file=sys.stderr)
            return 1
        for label, reason in loaded.skipped:
            print(f"  skipped {label}: {reason}")
        for m in loaded.runs:
            run, s = m.run, m.run["strategy"]
            c, parts = attribution(predictor, run)
            for k, v in parts.items():
                totals.setdefault(k, []).append(v)
            top = sorted(parts.items(), key=lambda kv: -abs(kv[1]))[:args.top]
            print(f"  {str(run.get('id')):34s} {run['hardware']['num_devices']:5d} GPUs tp{s.get('tp', 1)} "
                  f"pp{s.get('pp', 1)}: c {c:+.3f} | " + ", ".join(f"{k} {v:+.3f}" for k, v in top))
    if totals:
        mean = sorted(((k, float(np.mean(v))) for k, v in totals.items()), key=lambda kv: -abs(kv[1]))
        print("mean part over the runs: " + ", ".join(f"{k} {v:+.3f}" for k, v in mean[:args.top]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
