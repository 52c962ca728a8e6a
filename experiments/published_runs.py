"""The shipped checkpoint on published training runs: any table in the published-runs layout.

Reads one or more CSV tables in the layout of ``shared/data/published/*.csv``
(:data:`learnedperf.measure.published.PUBLISHED_COLUMNS`; by default every table there, which is
Megatron-LM SC21 Table 1, 32-3072 A100s, held out of all training), and prints per run the measured
iteration time (as the row states it or implies it), the simulator's and the checkpoint's prediction
(full tier) with its 90 % interval, and the fast tier's; then the iteration-time MAPE, the signed bias
(mean log predicted/measured) and the interval coverage, overall and per framework, device and scale, and
Kendall τ over the strategies of one (model, device, GPU count, batch) where a table holds three or more.
Rows the loader could not use are listed with their reason, and the values it filled in are counted.
A checkpoint trained without a surrogate (``learnedperf train --surrogate-runs 0``) is scored on its full
tier alone, and the fast tier's columns say so.

    python experiments/published_runs.py [TABLE.csv ...] [--checkpoint DIR] [--out per_run.csv] [--strict]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from learnedperf.errors import LearnedPerfError
from learnedperf.measure.public import default_shared_data
from learnedperf.measure.published import load_published

from _checkpoint import add_checkpoint_argument, load_predictor


def scale_bucket(n: int) -> str:
    """A scale class of a GPU count: the issue's multi-node range is 64-512."""
    return "1-8" if n <= 8 else "9-63" if n < 64 else "64-512" if n <= 512 else ">512"


def summarise(label: str, rows: list[dict], width: int = 30) -> str:
    """One line: count, MAPE of the simulator / full tier / fast tier, signed bias, coverage of both tiers;
    ``label`` padded to ``width`` characters (never cut: two frameworks that share a prefix stay apart)."""
    def mape(key):
        return np.mean([abs(r[key] / r["measured_ms"] - 1) for r in rows]) * 100

    bias = np.mean([math.log(r["full_ms"] / r["measured_ms"]) for r in rows])
    inside = sum(r["lo_ms"] <= r["measured_ms"] <= r["hi_ms"] for r in rows)
    if all(r["fast_ms"] is None for r in rows):
        fast, fast_cov = "fast  none (no surrogate)", "fast none"
    else:
        inside_fast = sum(r["fast_lo_ms"] <= r["measured_ms"] <= r["fast_hi_ms"] for r in rows)
        fast, fast_cov = f"fast {mape('fast_ms'):5.1f} %", f"fast {inside_fast}/{len(rows)}"
    return (f"{label:{width}s} n={len(rows):4d}  MAPE simulator {mape('simulator_ms'):5.1f} %  "
            f"full {mape('full_ms'):5.1f} %  {fast}  bias {bias:+.3f}  "
            f"coverage full {inside}/{len(rows)}, {fast_cov}")


def main(argv=None) -> int:
    """Load the tables, predict every usable run, print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="*", type=Path,
                    help="published-runs CSV files (default: every *.csv of ../shared/data/published)")
    add_checkpoint_argument(ap)
    ap.add_argument("--out", type=Path, help="write one line per predicted run here (CSV)")
    ap.add_argument("--strict", action="store_true", help="stop at the first row that cannot become a run")
    args = ap.parse_args(argv)
    tables = args.tables or sorted((default_shared_data() / "published").glob("*.csv"))
    if not tables:
        print("published_runs: no tables given and none in ../shared/data/published", file=sys.stderr)
        return 1
    predictor = load_predictor(args.checkpoint, "published_runs")
    try:
        loaded = [(t, load_published(t, strict=args.strict)) for t in tables]
    except LearnedPerfError as exc:
        print(f"published_runs: error: {exc}", file=sys.stderr)
        return 1
    rows = []
    has_fast = predictor.checkpoint.surrogate is not None
    if not has_fast:
        print(f"published_runs: checkpoint {predictor.source} has no surrogate: the fast tier is not scored")
    print(f"{'run':34s} {'framework':22s} {'GPUs':>5s} {'measured':>10s} {'simulator':>10s} {'checkpoint':>10s}"
          f"  {'interval (ms)':>22s} {'fast':>10s}")
    for table, got in loaded:
        for m in got.runs:
            try:
                full = predictor.predict(m.run, tier="full")
                fast = predictor.predict(m.run, tier="fast") if has_fast else \
                    {"iteration_time_ms": None, "interval_ms": (None, None)}
            except LearnedPerfError as exc:  # a run the loader accepted but a tier refuses: say so, keep going
                got.skipped.append((f"line {m.row}", f"prediction failed: {exc}"))
                continue
            meta = m.run["meta"]
            r = {"table": table.name, "id": m.run["id"], "framework": meta["framework"] or "unstated",
                 "device": m.run["hardware"].get("cluster") or m.run["hardware"].get("device"),
                 "num_gpus": m.run["hardware"]["num_devices"], "target_from": meta["target_from"],
                 "measured_ms": m.iteration_time_ms, "simulator_ms": full["simulator_iteration_time_ms"],
                 "full_ms": full["iteration_time_ms"], "lo_ms": full["interval_ms"][0], "hi_ms": full["interval_ms"][1],
                 "fast_ms": fast["iteration_time_ms"], "fast_lo_ms": fast["interval_ms"][0],
                 "fast_hi_ms": fast["interval_ms"][1], "assumed": "; ".join(meta["assumed"]),
                 "group": json.dumps([m.run["model"], m.run["hardware"], m.run["strategy"]["global_batch_size"]],
                                     sort_keys=True)}
            rows.append(r)
            print(f"{r['id'][-34:]:34s} {r['framework'][:22]:22s} {r['num_gpus']:5d} {r['measured_ms']:10.0f} "
                  f"{r['simulator_ms']:10.0f} {r['full_ms']:10.0f}  [{r['lo_ms']:9.0f}, {r['hi_ms']:9.0f}] "
                  + (f"{r['fast_ms']:10.0f}" if has_fast else f"{'-':>10s}"))
    for table, got in loaded:
        print(f"\n{table}: {len(got.runs)} runs, {len(got.skipped)} rows skipped")
        for where, why in got.skipped:
            print(f"  skipped {where}: {why}")
        for what, n in sorted(got.assumptions.items()):
            print(f"  filled in ({n} rows): {what}")
        for where, text in got.warnings:
            print(f"  warning {where}: {text}")
    if not rows:
        print("no run could be predicted", file=sys.stderr)
        return 1
    print(f"\nsource: checkpoint {predictor.source}; bias = mean log(full tier / measured)")
    lines = [("all", rows)]
    for key, name in (("framework", "framework"), ("device", "device"), ("num_gpus", "GPUs"),
                      ("target_from", "time from")):
        groups = defaultdict(list)
        for r in rows:
            groups[scale_bucket(r[key]) if key == "num_gpus" else r[key]].append(r)
        if len(groups) > 1:
            lines += [(f"  {name} {g}", groups[g]) for g in sorted(groups, key=str)]
    width = max(30, *(len(label) for label, _ in lines))
    for label, members in lines:
        print(summarise(label, members, width))
    # order: Kendall τ between predicted and measured times over the strategies of one (model, device,
    # GPU count, global batch) — the planner's question — where a table holds three or more of them
    taus = []
    groups = defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
    for members in groups.values():
        if len(members) >= 3:
            tau = kendalltau([r["measured_ms"] for r in members], [r["full_ms"] for r in members]).statistic
            taus.append((tau, len(members)))
    defined = [t for t, _ in taus if np.isfinite(t)]  # τ is undefined where every measured or predicted time ties
    if taus:
        mean = f"mean {np.mean(defined):.2f}" if defined else "undefined"
        print(f"Kendall tau over the strategies of {len(taus)} (model, device, GPUs, batch) groups of 3 or more: "
              f"{mean} (full tier; {len(taus) - len(defined)} group(s) whose times all tie have none)")
    else:
        print("Kendall tau: no (model, device, GPUs, batch) group has 3 or more strategies")
    if args.out:
        with open(args.out, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
