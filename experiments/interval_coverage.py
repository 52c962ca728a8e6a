"""Coverage of the 90 % interval on novel runs: in-domain calibration vs novelty-aware, leave one split out.

    python experiments/interval_coverage.py --report REPORT.json [--methods gnn_residual,simulator]

``REPORT.json`` is a report of ``learnedperf evaluate --out`` (it holds every test-side
prediction with the interval of the split's model). For each held-out split and method it prints:

* **in-domain**: the coverage of the interval as the report has it — calibrated, like every
  interval before the training domain existed, on held-back runs of the model's own domain;
* **novelty-aware**: the interval a checkpoint with novelty classes gives the same runs: the
  split's novelty class (``unseen_device:*`` → ``unseen_device``, ...) widens the in-domain pair
  of each run to the conformal quantiles of leave-domain-out residuals — calibrated **leaving
  this split out** (for ``unseen_device:Xeon`` only the other ``unseen_device`` splits count; a
  class with no other split pools every other ``unseen_*`` split, and the table says so). Leaving
  the split out is what makes the figure honest: a shipped checkpoint has never seen the
  residuals of the next novel device, family or scale either;
* the mean width ``upper / lower`` of both intervals;
* for a novelty class with several splits (the held-out devices), the mean over its splits, each
  weighing the same whatever its runs: the coverage the class's interval promises a new device, which
  is one more draw like the held-out ones — one device's own coverage can fall short of it.

The strategy and sharding splits both reproduce the ``unseen_strategy`` class (a combination of
parallel techniques no measured training run had), so each is calibrated on the other. Splits
whose runs are in-domain (``random``) keep their interval.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def split_rows(report: dict, split: str, method: str):
    """``(predicted, measured, lower, upper)`` arrays (ms) of the test side of ``split`` for ``method``."""
    rows = [(p["predicted_ms"], p["measured_ms"], p["lower_ms"], p["upper_ms"]) for p in report["predictions"]
            if p["split"] == split and p["method"] == method]
    return np.asarray(rows, dtype=float).reshape(-1, 4).T


def novelty_aware(report: dict, split: str, method: str, coverage: float) -> tuple[dict, str]:
    """Coverage and mean width of the novelty-aware interval on ``split`` (novelty quantiles calibrated
    without ``split``), and where its quantiles came from."""
    from learnedperf.models.evaluate import novelty_residuals
    from learnedperf.models.intervals import conformal_log_bounds, novelty_of_split

    p, t, lo, hi = split_rows(report, split, method)
    cls = novelty_of_split(split)
    source = "- (in-domain runs: interval unchanged)"
    log_lo, log_hi = np.log(lo / p), np.log(hi / p)
    if cls is not None:
        log_ratios, calibrated_on = novelty_residuals(report, method, leave_out=(split,))
        if cls in log_ratios:
            q = conformal_log_bounds(log_ratios[cls], coverage)
            # never narrower than the run's own in-domain pair (ConformalInterval.bounds does the same)
            log_lo, log_hi = np.minimum(log_lo, q["log_lower"]), np.maximum(log_hi, q["log_upper"])
            used = calibrated_on[cls]
            names = ", ".join(f"{s} ({n})" for s, n in used["splits"].items())
            source = (f"FALLBACK, no other {cls} split: pooled {names}" if used["fallback"] else names)
        else:
            source = "NONE: no other unseen split in the report (interval unchanged)"
    new_lo, new_hi = p * np.exp(log_lo), p * np.exp(log_hi)
    return {"coverage": float(np.mean((new_lo <= t) & (t <= new_hi))), "width": float(np.mean(new_hi / new_lo))}, \
        source


def table(report: dict, methods: list[str], coverage: float) -> str:
    """The Markdown table of every unseen split × method (see the module docstring)."""
    from learnedperf.models.intervals import IN_DOMAIN, novelty_of_split

    lines = ["| method | split | runs | novelty class | coverage in-domain | coverage novelty-aware | "
             "width hi/lo in-domain | width hi/lo novelty-aware | novelty quantiles calibrated on (runs) |",
             "|---|---|---:|---|---:|---:|---:|---:|---|"]
    splits = [s for s, e in report["splits"].items() if s.startswith("unseen_") and "methods" in e]
    for method in methods:
        per_class: dict[str, list[tuple[float, float, float, float]]] = {}
        for split in splits:
            p, t, lo, hi = split_rows(report, split, method)
            if len(p) == 0:
                continue
            new, source = novelty_aware(report, split, method, coverage)
            old_cov, old_width = float(np.mean((lo <= t) & (t <= hi))), float(np.mean(hi / lo))
            cls = novelty_of_split(split) or IN_DOMAIN
            per_class.setdefault(cls, []).append((old_cov, new["coverage"], old_width, new["width"]))
            lines.append(f"| {method} | {split} | {len(p)} | {cls} | {old_cov:.2f} | "
                         f"{new['coverage']:.2f} | {old_width:.2f} | {new['width']:.2f} | {source} |")
        # what a class's interval promises: a new device (family, ...) is one more draw like the held-out
        # splits, so its coverage is the mean over splits, each weighing the same whatever its runs
        for cls, rows in per_class.items():
            if len(rows) > 1:
                m = np.mean(rows, axis=0)
                lines.append(f"| {method} | mean over its {len(rows)} splits | | {cls} | {m[0]:.2f} | {m[1]:.2f} | "
                             f"{m[2]:.2f} | {m[3]:.2f} | each split weighs the same |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the coverage table of a saved evaluation report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", metavar="REPORT.json", help="report of 'learnedperf evaluate --out'")
    ap.add_argument("--methods", metavar="LIST", help="comma-separated methods (default: every method of the report)")
    ap.add_argument("--coverage", type=float, default=0.9, help="interval coverage target (default 0.9, as evaluated)")
    args = ap.parse_args(argv)
    if not args.report:
        ap.error("--report REPORT.json is required: a report written by 'learnedperf evaluate --out'")
    sys.path.insert(0, str(ROOT))
    from learnedperf.errors import InputError
    from learnedperf.io import load_json_file
    from learnedperf.models.pipeline import choose_method

    try:
        report = load_json_file(args.report)
        if not report.get("predictions"):
            raise InputError(f"{args.report}: the report has no predictions "
                             "(write it with 'learnedperf evaluate --out')")
        methods = args.methods.split(",") if args.methods else list(report["methods"])
        unknown = [m for m in methods if m not in report["methods"]]
        if unknown:
            raise InputError(f"method(s) {unknown} are not in the report ({', '.join(report['methods'])})")
        chosen, _, _ = choose_method(report)
        print(f"90 % interval on held-out runs of {args.report}; target coverage {args.coverage:.2f}; "
              f"'learnedperf train --method auto' ships {chosen}\n")
        print(table(report, methods, args.coverage))
    except InputError as exc:
        print(f"interval_coverage: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
