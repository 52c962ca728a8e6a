"""Conditional coverage of the in-domain 90 % interval: one pair per device class, or per device where it can.

    python experiments/interval_groups.py --data DIR [--method gnn_residual] [--gnn KEY=VALUE ...] [--folds 5]
        [--save FILE.json]
    python experiments/interval_groups.py --load FILE.json

Fits ``method`` on the data set as ``learnedperf train --folds K`` does (the network of each fold predicts the
measured runs it left out), then scores two Mondrian groupings of those out-of-fold residuals by calibrating on
the other folds and covering each fold in turn (every run covered by quantiles it did not set):

* **class**: one pair per device class (CPU / accelerator), the calibration before 2026-12-02;
* **device, then class**: a device type with ``min_group_size`` calibration runs or more on one device (or on
  several) has its own pair for such runs, the others their class's
  (:func:`learnedperf.models.dataset.device_group`): the shipped calibration.

It prints coverage and mean width ``upper / lower`` overall, per origin of the measured runs and per device type
(a target of 0.90 in each, not only overall), and by predicted step time. Calibrated on K − 1 folds, a group
needs ``ceil(min_group_size · (K − 1) / K)`` runs for its own pair, so that a device with its own pair in the
calibration of all K folds (a checkpoint's) has one here too. The fit takes what ``learnedperf train`` takes (13
minutes on the shipped data set with the flags of the README's checkpoint); ``--save`` writes the out-of-fold
residuals and ``--load`` scores them again without fitting.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict

import numpy as np


def cross_calibrated(r, fold, groups, coverage: float, min_group_size: int):
    """``(covered, width)`` per run: each fold covered by the quantiles of the other folds' residuals."""
    from learnedperf.models.intervals import ConformalInterval

    covered = np.zeros(len(r), dtype=bool)
    width = np.zeros(len(r))
    for k in sorted(set(fold.tolist())):
        tr, te = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        ci = ConformalInterval(coverage, min_group_size).fit(np.ones(len(tr)), np.exp(r[tr]), [groups[i] for i in tr])
        for i in te:
            lo, hi = ci.bounds(groups[i])
            covered[i] = lo <= r[i] <= hi
            width[i] = np.exp(hi - lo)
    return covered, width


def fit_residuals(args: argparse.Namespace):
    """Fit ``args.method`` as ``learnedperf train --folds K`` does; its out-of-fold log ratios and what they need
    (JSON-compatible), or None after an error message."""
    from learnedperf.errors import LearnedPerfError
    from learnedperf.models.iteration import check_gnn_params, fold_index, parse_gnn_params
    from learnedperf.models.pipeline import fit_model

    try:
        gnn = parse_gnn_params(args.gnn)
        check_gnn_params(gnn)  # before the data is read
        model, _ = fit_model(args.data, args.method, gnn_params=gnn, folds=args.folds, seed=args.seed)
    except LearnedPerfError as exc:
        print(f"interval_groups.py: {exc}", file=sys.stderr)
        return None
    # the runs the interval was calibrated on (every measured run when cross-fitted) and their predictions
    rec = model.calibration_records_.reset_index(drop=True)
    pred = model.calibration_pred_ms_
    fold = fold_index(rec, args.folds, args.seed) if args.folds >= 2 else np.arange(len(pred)) % 5
    return {"method": args.method, "coverage": model.interval_.coverage,
            "min_group_size": model.interval_.min_group_size, "pred_ms": pred.tolist(),
            "log_ratio": np.log(rec["iteration_time_ms"].to_numpy(dtype=float) / pred).tolist(),
            "fold": [int(x) for x in fold], "device_type": rec["device_type"].astype(str).tolist(),
            "num_devices": [int(x) for x in rec["num_devices"]],
            "origin": rec["origin"].astype(str).tolist(), "run_id": rec["run_id"].astype(str).tolist()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="data set directory (learnedperf generate --out)")
    ap.add_argument("--save", help="write the out-of-fold residuals here (JSON)")
    ap.add_argument("--load", help="score the residuals --save wrote instead of fitting")
    ap.add_argument("--method", default="gnn_residual")
    ap.add_argument("--gnn", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from learnedperf.models.dataset import device_class, device_group

    if args.load:
        try:
            with open(args.load) as f:
                saved = json.load(f)
            missing = {"method", "coverage", "min_group_size", "pred_ms", "log_ratio", "fold", "device_type",
                       "num_devices", "origin"} - set(saved)
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            missing = None
            print(f"interval_groups.py: cannot read {args.load}: {exc}", file=sys.stderr)
        if missing is None or missing:
            if missing:
                print(f"interval_groups.py: {args.load} is not a --save file (no {sorted(missing)})", file=sys.stderr)
            return 1
    elif args.data:
        saved = fit_residuals(args)
        if saved is None:
            return 1
        if args.save:
            with open(args.save, "w") as f:
                json.dump(saved, f)
    else:
        ap.error("give --data DIR or --load FILE")
    pred, r, fold = (np.asarray(saved[k], dtype=float) for k in ("pred_ms", "log_ratio", "fold"))
    types, k = saved["device_type"], len(set(saved["fold"]))
    least = math.ceil(saved["min_group_size"] * (k - 1) / k)
    schemes = {"class": [(device_class(t),) for t in types],
               "device, then class": [device_group(t, n) for t, n in zip(types, saved["num_devices"])]}
    print(f"{saved['method']}: {len(r)} measured runs, out-of-fold residuals, {k} folds (target "
          f"{saved['coverage']:.2f}; a group needs {saved['min_group_size']} calibration runs, {least} of K - 1 folds)")
    bands = np.digitize(pred, [30.0, 100.0, 300.0])
    band_names = ["< 30 ms", "30-100 ms", "100-300 ms", ">= 300 ms"]
    results = {name: cross_calibrated(r, fold, g, saved["coverage"], least) for name, g in schemes.items()}
    keys = {"origin": saved["origin"], "device type": types, "predicted time": [band_names[b] for b in bands]}
    header = f"  {'group':<34} {'n':>5}" + "".join(f" | {name:>22}" for name in results)
    print(header)
    print(f"  {'':<34} {'':>5}" + "".join(f" | {'coverage':>10} {'width':>11}" for _ in results))

    def line(label: str, sel) -> None:
        cells = "".join(f" | {c[sel].mean():10.3f} {w[sel].mean():11.3f}" for c, w in results.values())
        print(f"  {label:<34} {int(sel.sum()):>5}{cells}")

    line("all", np.ones(len(r), dtype=bool))
    for title, values in keys.items():
        print(f"by {title}")
        by = defaultdict(list)
        for i, v in enumerate(values):
            by[v].append(i)
        for v in sorted(by, key=lambda key: (band_names.index(key) if key in band_names else 0, key)):
            sel = np.zeros(len(r), dtype=bool)
            sel[by[v]] = True
            line(v, sel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
