"""The fast tier against the full tier and the measurements, on every measured run at hand.

The fast tier (the surrogate, ~10 µs a run) is distilled from the full tier (simulator + GNN, ~10 ms),
so a fast answer is off by the full tier's error and by the surrogate's disagreement with it. The
checkpoint's manifest gives that disagreement on held-out distilled runs (``surrogate_fidelity``); this
script measures it, and both tiers' error, on the runs users actually measured:

* vTrain's 1,440 Megatron-DeepSpeed runs on one A100 node, NeuSight's single-GPU fp32 runs and this
  project's CPU steps (``datasets/measured``): the default checkpoint was trained on all of them, so
  their tier-vs-measured figures are **in-sample**; what they test is whether the fast tier follows
  the full tier on the hardware and habits the full tier learnt from;
* the published rows of ``../shared/data/published`` (SC21: 32-3072 A100s), which no checkpoint
  trained on.

Prints, per source and split into pipeline-parallel runs and the rest: MAPE of fast vs measured,
full vs measured, and fast vs full (nothing is compared to a target here).

Usage::

    python experiments/fast_tier.py [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import numpy as np

from _checkpoint import add_checkpoint_argument, load_predictor, require_fast_tier


def sources() -> dict[str, list[tuple[dict, float]]]:
    """(run, measured ms) of every source, transformer runs only (what the tiers answer)."""
    import pandas as pd

    from learnedperf.data.generate import PUBLIC_STEPS, TRANSFORMER_ARCHS, _step_files, repo_measured_dir
    from learnedperf.measure.public import default_shared_data
    from learnedperf.measure.published import load_published

    out: dict[str, list[tuple[dict, float]]] = {}
    for origin, (_file, loader) in PUBLIC_STEPS.items():
        out[f"{origin} (in-sample)"] = [(json.loads(s["run"]), s["iteration_time_ms"]) for s in loader()]
    for f, origin in _step_files([str(repo_measured_dir())]):
        rows = pd.read_parquet(f).to_dict("records")
        out.setdefault(f"{origin.rsplit('/', 1)[-1]} (in-sample)", []).extend(
            (json.loads(r["run"]), r["iteration_time_ms"]) for r in rows if r.get("arch") in TRANSFORMER_ARCHS)
    for table in sorted((default_shared_data() / "published").glob("*.csv")):
        out[f"{table.stem} (held out)"] = [(m.run, m.iteration_time_ms) for m in load_published(table).runs]
    return out


def main(argv=None) -> int:
    """Predict every run with both tiers and print the three comparisons."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_argument(ap)
    args = ap.parse_args(argv)
    from learnedperf.errors import LearnedPerfError

    predictor = load_predictor(args.checkpoint, "fast_tier")
    require_fast_tier(predictor, "fast_tier")
    fid = predictor.checkpoint.manifest.get("surrogate_fidelity") or {}
    near = fid.get("near") or {}
    print(f"checkpoint {predictor.source}: held-out distilled runs, fast vs full MAPE "
          f"{fid.get('holdout_mape')} % on sampled runs ({fid.get('n_labelled')} labelled), "
          f"{near.get('holdout_mape', 'n/a')} % on runs near the measured ones ({near.get('n_labelled', 0)})\n")
    print(f"{'source':34s} {'runs':>11s} {'n':>5s} {'fast':>7s} {'full':>7s} {'fast/full':>9s}  (MAPE %)")
    for name, runs in sources().items():
        groups: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        failed = 0
        for run, measured in runs:
            try:
                fast = predictor.predict(run, tier="fast")["iteration_time_ms"]
                full = predictor.predict(run, tier="full")["iteration_time_ms"]
            except LearnedPerfError:
                failed += 1
                continue
            kind = "pipeline" if run["strategy"].get("pp", 1) > 1 else "no pipeline"
            for g in ("all", kind):
                groups[g].append((measured, fast, full))
        for g in ("all", "pipeline", "no pipeline"):
            if not groups[g]:
                continue
            a = np.array(groups[g])
            fast_e, full_e = (100 * np.mean(np.abs(a[:, k] / a[:, 0] - 1)) for k in (1, 2))
            ff = 100 * np.mean(np.abs(a[:, 1] / a[:, 2] - 1))
            print(f"{name if g == 'all' else '':34s} {g:>11s} {len(a):5d} {fast_e:7.1f} {full_e:7.1f} {ff:9.1f}")
        if failed:
            print(f"{'':34s} {failed} runs neither tier could answer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
