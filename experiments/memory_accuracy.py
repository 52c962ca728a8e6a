"""Peak memory of measured training steps against the memory model.

``learnedperf measure`` records each GPU step's peak as the CUDA caching allocator's
``max_memory_allocated`` (``peak_memory_MiB``): every tensor the step made, at the moment there were most of
them, without the CUDA context or the allocator's unused reserve. The memory model
(:func:`learnedperf.simulate.memory.peak_memory_of`) says the same quantity, so the two compare directly.
For every step of the data sets given (default: every ``datasets/measured/*`` with CUDA steps) the script
prints the MAPE and the mean log(predicted / measured), over all steps, over those of at least 1 GiB and over
the smaller ones, and per phase of the predicted peak (the forward/backward or the optimizer step); with
``--per-run``, each step.

The residual of the steps whose predicted peak is the optimizer step's, without the GPU libraries' workspaces
the model adds (:func:`learnedperf.simulate.memory.gpu_library_workspace_bytes`), is printed too: there every
other term is a closed form of the parameter count, so what is left is the process's fixed allocations, and
its smallest value checks the workspaces. CPU steps are skipped: their peak is the process's resident memory (the
interpreter and libraries included), which the model does not describe.

    python experiments/memory_accuracy.py [DATASET_DIR ...] [--per-run]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GiB = 2 ** 30
MiB = 2 ** 20


def _line(label: str, rows: list[dict]) -> str:
    """Count, MAPE and mean log(predicted / measured) of ``rows``."""
    if not rows:
        return f"  {label:<34s} n=   0"
    ape = statistics.fmean(abs(r["pred"] / r["meas"] - 1) for r in rows) * 100
    bias = statistics.fmean(math.log(r["pred"] / r["meas"]) for r in rows)
    worst = max(rows, key=lambda r: abs(math.log(r["pred"] / r["meas"])))
    return (f"  {label:<34s} n={len(rows):4d}  MAPE {ape:5.1f} %  mean log(pred/meas) {bias:+.3f}  "
            f"worst {worst['pred'] / worst['meas'] - 1:+.1%} ({worst['label']})")


def steps_of(directory: Path) -> list[dict]:
    """One row per CUDA step of a data set: its label, measured and predicted peak (bytes), the phase and the GPU
    libraries' workspaces the prediction holds."""
    import pandas as pd

    from learnedperf.measure.records import verify_manifest
    from learnedperf.simulate.memory import gpu_library_workspace_bytes, peak_memory_of
    from learnedperf.specs import RunSpec

    verify_manifest(directory)
    rows = []
    for f in sorted(directory.glob("steps_cuda*.parquet")):
        for rec in pd.read_parquet(f).to_dict("records"):
            if rec.get("peak_memory_MiB") is None or not rec["peak_memory_MiB"] > 0:
                continue
            spec = RunSpec.from_dict(json.loads(rec["run"]))
            mem = peak_memory_of(spec)
            s = spec.strategy
            label = (f"{rec['model_name']} mb {s.micro_batch_size}/{s.global_batch_size} {s.precision}"
                     + (f" recompute {s.recompute}" if s.recompute != "none" else ""))
            rows.append({"data": directory.name, "label": label, "meas": rec["peak_memory_MiB"] * MiB,
                         "pred": mem.total, "phase": mem.phase,
                         "workspace": gpu_library_workspace_bytes(spec.hardware.device, s.forward_only)})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; exit 2 when no data set has CUDA steps."""
    from learnedperf.errors import LearnedPerfError

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("datasets", nargs="*", type=Path)
    ap.add_argument("--per-run", action="store_true", help="print every step")
    args = ap.parse_args(argv)
    dirs = args.datasets or sorted(d for d in (REPO / "datasets" / "measured").iterdir()
                                   if any(d.glob("steps_cuda*.parquet")))
    try:
        rows = [r for d in dirs for r in steps_of(d)]
    except LearnedPerfError as exc:
        print(f"memory_accuracy: error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("memory_accuracy: no CUDA step with a measured peak in " + ", ".join(map(str, dirs)), file=sys.stderr)
        return 2
    if args.per_run:
        print(f"{'data set':<12s} {'step':<48s} {'measured GiB':>12s} {'model GiB':>10s} {'error':>7s}  peak at")
        for r in rows:
            print(f"{r['data']:<12s} {r['label']:<48s} {r['meas'] / GiB:12.3f} {r['pred'] / GiB:10.3f} "
                  f"{r['pred'] / r['meas'] - 1:+7.1%}  {r['phase']}")
    distinct = {(r["label"], round(r["meas"])) for r in rows}
    print(f"peak memory of {len(rows)} measured GPU steps ({len(distinct)} distinct step and peak pairs) against "
          "the memory model")
    print(_line("all", rows))
    print(_line("measured >= 1 GiB", [r for r in rows if r["meas"] >= GiB]))
    print(_line("measured < 1 GiB", [r for r in rows if r["meas"] < GiB]))
    for phase in ("forward_backward", "optimizer_step"):
        print(_line(f"peak at {phase.replace('_', ' ')}", [r for r in rows if r["phase"] == phase]))
    for d in sorted({r["data"] for r in rows}):
        print(_line(d, [r for r in rows if r["data"] == d]))
    step = [r for r in rows if r["phase"] == "optimizer_step"]
    if step:
        left = [(r["meas"] - (r["pred"] - r["workspace"])) / MiB for r in step]
        spaces = sorted({round(r["workspace"] / MiB, 2) for r in step})
        print(f"steps whose peak is the optimizer step's: measured minus the model without the GPU libraries' "
              f"workspaces, min {min(left):.1f} / median {statistics.median(left):.1f} / max {max(left):.1f} MiB "
              f"(n={len(step)}; the model's workspaces: {', '.join(f'{w:g}' for w in spaces)} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
