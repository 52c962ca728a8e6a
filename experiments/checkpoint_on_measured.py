"""How a checkpoint predicts measured training steps of a data set it did not train on.

    python experiments/checkpoint_on_measured.py DATASET_DIR [--checkpoint DIR]

``DATASET_DIR`` is a data set written by ``learnedperf measure`` (``steps_*.parquet`` with a
manifest), for instance one measured on a machine after the checkpoint was trained. Every step
is predicted from the run its record stores (the measured device descriptor, kernel curves and
links included, as a user describing a new machine would give them) by the checkpoint's full
tier, its fast tier and the simulator alone (on the learned operator costs the full tier uses),
and the script prints, per tier: the MAPE, the mean of log(predicted / measured) (the bias),
the coverage of the 90 % interval, and the same split by process count and by strategy kind.

It first says which of the data set's devices the checkpoint's measured training runs covered
(``manifest.json``, ``interval.domain.devices``): only steps on the other devices are out of
sample, and the figures are printed for those alone when there are both.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from _checkpoint import add_checkpoint_argument, load_predictor, tiers_of

def _line(name: str, rows: list[tuple[float, float, float, float]]) -> str:
    """``rows``: (measured, predicted, lower, upper) ms."""
    ape = [abs(p / m - 1) for m, p, _lo, _hi in rows]
    bias = sum(math.log(p / m) for m, p, _lo, _hi in rows) / len(rows)
    text = (f"  {name:<28} n={len(rows):>4}  MAPE {100 * sum(ape) / len(ape):6.1f} %  "
            f"mean log(pred/meas) {bias:+.3f}")
    if not any(math.isnan(lo) for _m, _p, lo, _hi in rows):
        text += f"  90 % interval covers {sum(lo <= m <= hi for m, _p, lo, hi in rows) / len(rows):.2f}"
    return text


def main(argv: list[str]) -> int:
    import pandas as pd

    from learnedperf.measure.records import verify_manifest

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", type=Path)
    add_checkpoint_argument(ap)
    args = ap.parse_args(argv)
    verify_manifest(args.dataset)
    files = sorted(args.dataset.glob("steps_*.parquet"))
    if not files:
        print(f"error: {args.dataset}: no steps_*.parquet", file=sys.stderr)
        return 2
    steps = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    predictor = load_predictor(args.checkpoint, "checkpoint_on_measured")
    has_fast = "fast" in tiers_of(predictor, "checkpoint_on_measured")
    manifest = predictor.checkpoint.manifest
    seen = set((manifest.get("interval", {}).get("domain") or {}).get("devices", []))
    runs = [json.loads(r) for r in steps["run"]]
    names = [r["hardware"]["device"]["name"] for r in runs]
    in_domain = sorted({n for n in names if n in seen})
    print(f"{args.dataset}: {len(runs)} measured steps on {sorted(set(names))}")
    print(f"checkpoint {predictor.checkpoint.path.name} ({manifest.get('method')}): its measured training runs covered "
          f"{in_domain or 'none of these devices'}")
    keep = [i for i, n in enumerate(names) if n not in seen] if in_domain and len(in_domain) < len(set(names)) \
        else list(range(len(runs)))
    if len(keep) < len(runs):
        print(f"scoring the {len(keep)} steps on devices the checkpoint did not train on")

    full = predictor.predict_many([runs[i] for i in keep], tier="full", errors="return")
    fast = predictor.predict_many([runs[i] for i in keep], tier="fast", errors="return") if has_fast else \
        [{} for _ in keep]
    # a step the run format cannot express (the grid's MLP steps: no transformer) fails in both tiers alike
    failed = defaultdict(int)
    for p in full:
        if "error" in p:
            failed[p["error"][:90]] += 1
    if failed:
        print(f"not predicted ({sum(failed.values())} steps): "
              + "; ".join(f"{k}... ({v})" for k, v in sorted(failed.items())))
    ok = [j for j, p in enumerate(full) if "error" not in p and "error" not in fast[j]]
    keep, full, fast = [keep[j] for j in ok], [full[j] for j in ok], [fast[j] for j in ok]
    measured = [float(steps["iteration_time_ms"].iloc[i]) for i in keep]
    tiers = {
        "full tier": [(m, p["iteration_time_ms"], *p["interval_ms"]) for m, p in zip(measured, full)],
        **({"fast tier": [(m, p["iteration_time_ms"], *p["interval_ms"]) for m, p in zip(measured, fast)]}
           if has_fast else {}),
        # the simulator on the same costs, no learned correction and so no interval
        "simulator": [(m, p["simulator_iteration_time_ms"], math.nan, math.nan) for m, p in zip(measured, full)],
    }
    novelty = defaultdict(int)
    for p in full:
        novelty[", ".join(p["novelty"]) or "in domain"] += 1
    print("novelty classes of the full tier's predictions: "
          + "; ".join(f"{k} {v}" for k, v in sorted(novelty.items())))
    world = [int(steps["world_size"].iloc[i]) for i in keep]
    kind = [str(steps["strategy_kind"].iloc[i]) for i in keep]
    for tier, rows in tiers.items():
        print(f"{tier}:")
        print(_line("all", rows))
        for label, key in (("processes", world), ("strategy", kind)):
            groups = defaultdict(list)
            for k, row in zip(key, rows):
                groups[k].append(row)
            for k in sorted(groups):
                print(_line(f"{label} {k}", groups[k]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
