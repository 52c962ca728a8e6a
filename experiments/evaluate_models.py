"""Held-out evaluation of every iteration-time method: tables and plots (PNG).

Either evaluates a data set (as ``learnedperf evaluate`` does) or re-plots a saved report:

    python experiments/evaluate_models.py --data DIR [--gnn pretrain_epochs=10 ...] [--report-out R.json]
    python experiments/evaluate_models.py --report R.json [R2.json ...] [--report-out MERGED.json]

Several reports (methods, or the same methods on disjoint splits, evaluated in parallel processes) are merged into one.

Prints the MAPE / Kendall τ / top-1 regret / coverage tables (Markdown) and writes to
``--figures`` (default ``experiments/figures``):

* ``eval_scatter.png`` — predicted vs measured iteration time, one panel per split, the
  simulator and the best learned method;
* ``eval_error_cdf.png`` — CDF of the absolute percentage error per method, pooled over the
  unseen splits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _plots(report: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from learnedperf.models.pipeline import choose_method

    out_dir.mkdir(parents=True, exist_ok=True)
    preds = report["predictions"]
    best, _means, _why = choose_method(report)
    splits = [s for s, e in report["splits"].items() if "methods" in e]
    shown = ["simulator"] + ([best] if best != "simulator" else [])
    cols = min(4, len(splits))
    rows = (len(splits) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.8 * rows), squeeze=False)
    for ax, split in zip(axes.flat, splits):
        for method, color in zip(shown, ("tab:gray", "tab:blue")):
            pts = [(p["measured_ms"], p["predicted_ms"]) for p in preds if p["split"] == split and p["method"] == method]
            if not pts:
                continue
            m, q = np.asarray(pts).T
            mape = report["splits"][split]["methods"][method]["mape"]
            ax.scatter(m, q, s=4, alpha=0.5, color=color, label=f"{method} ({mape:.1f} %)")
        lo = min(p["measured_ms"] for p in preds if p["split"] == split)
        hi = max(p["measured_ms"] for p in preds if p["split"] == split)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{split} ({report['splits'][split]['test_measured']} runs)", fontsize=9)
        ax.set_xlabel("measured ms", fontsize=8)
        ax.set_ylabel("predicted ms", fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(splits):]:
        ax.axis("off")
    fig.suptitle("Held-out measured runs: predicted vs measured iteration time (MAPE in the legend)", fontsize=10)
    fig.tight_layout()
    scatter = out_dir / "eval_scatter.png"
    fig.savefig(scatter, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    unseen = [s for s in splits if s.startswith("unseen")]
    for method in report["methods"]:
        err = np.asarray([abs(p["predicted_ms"] / p["measured_ms"] - 1) * 100 for p in preds
                          if p["method"] == method and p["split"] in unseen])
        if len(err) == 0:
            continue
        err.sort()
        ax.plot(err, np.arange(1, len(err) + 1) / len(err), label=f"{method} (median {np.median(err):.1f} %)")
    ax.set_xscale("log")
    ax.set_xlabel("absolute percentage error of iteration time (%)")
    ax.set_ylabel("share of held-out measured runs")
    ax.set_title("Error CDF over the unseen-* splits", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    cdf = out_dir / "eval_error_cdf.png"
    fig.savefig(cdf, dpi=110)
    plt.close(fig)
    return [scatter, cdf]


def main() -> int:
    """Evaluate (or load a report), print the tables, write the plots."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="data set directory to evaluate (learnedperf generate)")
    src.add_argument("--report", nargs="+", help="saved report(s) (learnedperf evaluate --out), merged")
    ap.add_argument("--gnn", action="append", default=[], metavar="KEY=VALUE", help="GNN hyperparameters")
    ap.add_argument("--limit-simulated", type=int)
    ap.add_argument("--report-out", help="save the (evaluated or merged) report here")
    ap.add_argument("--figures", default=str(ROOT / "experiments" / "figures"))
    args = ap.parse_args()

    from learnedperf.models.evaluate import format_table, merge_reports
    from learnedperf.models.pipeline import choose_method, run_evaluation

    if args.report:
        report = merge_reports([json.loads(Path(r).read_text()) for r in args.report])
    else:
        gnn = {k: json.loads(v) for k, _, v in (item.partition("=") for item in args.gnn)}
        report = run_evaluation(args.data, gnn_params=gnn, limit_simulated=args.limit_simulated,
                                log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.report_out:
        Path(args.report_out).write_text(json.dumps(report, indent=1))
    for metric, title in (("mape", "MAPE of iteration time (%)"), ("kendall_tau", "Kendall tau over strategies"),
                          ("top1_regret", "top-1 regret"), ("coverage", "90 % interval coverage")):
        print(f"\n{title}\n\n{format_table(report, metric)}")
    best, means, why = choose_method(report)
    print(f"\nmean MAPE over the unseen criteria (device splits averaged first): {means}; best: {best} ({why})")
    for path in _plots(report, Path(args.figures)):
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
