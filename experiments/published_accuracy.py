"""Accuracy of the simulator on published measurements nobody here produced.

Prints the MAPE of iteration time on vTrain's 1,440 single-node Megatron runs
(overall and per parallelism kind) and of throughput on the 10 runs of
Megatron-LM SC21 Table 1. Usage::

    python experiments/published_accuracy.py [--data ../shared/data] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from learnedperf.measure.public import default_shared_data, load_sc21, load_vtrain
from learnedperf.simulate import simulate


def kind_of(run: dict) -> str:
    """Which parallelism a run combines, e.g. 'tp+pp'."""
    s = run["strategy"]
    parts = [k for k in ("tp", "pp", "dp") if s.get(k, 1) > 1]
    return "+".join(parts) or "single"


def evaluate(rows, throughput: bool = False) -> list[tuple]:
    """(id, kind, measured, predicted, abs. % error) per measured run."""
    out = []
    for r in rows:
        pred = simulate(r.run).iteration_time_s * 1e3
        meas = r.iteration_time_ms
        # throughput error: measured/predicted time ratio (throughput ∝ 1/time)
        err = abs(meas / pred - 1) if throughput else abs(pred / meas - 1)
        out.append((r.run["id"], kind_of(r.run), meas, pred, 100 * err))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_shared_data())
    ap.add_argument("--csv", type=Path, help="write per-run predictions here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    vt = evaluate(load_vtrain(args.data))
    print(f"vTrain single-node (1,440 measured runs, A100): iteration-time MAPE "
          f"{statistics.fmean(r[4] for r in vt):.1f}%")
    kinds = sorted({r[1] for r in vt})
    for k in kinds:
        errs = [r[4] for r in vt if r[1] == k]
        bias = statistics.fmean(r[3] / r[2] - 1 for r in vt if r[1] == k) * 100
        print(f"  {k:10s} n={len(errs):4d}  MAPE {statistics.fmean(errs):5.1f}%  mean bias {bias:+5.1f}%")
    sc = evaluate(load_sc21(args.data), throughput=True)
    print(f"Megatron SC21 Table 1 (10 runs, 32-3072 A100): throughput MAPE {statistics.fmean(r[4] for r in sc):.1f}%")
    for r in sc:
        print(f"  {r[0]:8s} measured {r[2]:10.1f} ms  predicted {r[3]:10.1f} ms  error {r[4]:5.1f}%")
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.csv:
        with open(args.csv, "w") as fh:
            fh.write("id,kind,measured_ms,predicted_ms,abs_pct_error\n")
            for r in vt + sc:
                fh.write(",".join(str(x) for x in r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
