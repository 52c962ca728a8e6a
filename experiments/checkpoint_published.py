"""The shipped checkpoint on Megatron-LM SC21 Table 1 (32-3072 A100s, multi-node): held out of all training.

Prints, per row, the measured iteration time (derived from the published TFLOP/s), the simulator's and the
checkpoint's prediction (full tier) and its 90 % interval, and the fast tier's; then the MAPE of each and the
interval coverage of both tiers.

    python experiments/checkpoint_published.py [--checkpoint DIR]
"""

from __future__ import annotations

import argparse

import numpy as np

from learnedperf.measure.public import load_sc21
from learnedperf.predict import Predictor


def main() -> None:
    """Predict every SC21 row with the checkpoint and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="checkpoint directory (default checkpoints/default)")
    args = ap.parse_args()
    predictor = Predictor.load(args.checkpoint)
    e_sim, e_ck, e_fast, inside, inside_fast = [], [], [], 0, 0
    print(f"{'row':8s} {'GPUs':>5s} {'measured':>9s} {'simulator':>9s} {'checkpoint':>10s}  {'interval (ms)':>16s}"
          f" {'fast':>7s}")
    rows = load_sc21()
    for r in rows:
        pred = predictor.predict(r.run, tier="full")
        fast = predictor.predict(r.run, tier="fast")
        t, lo, hi = r.iteration_time_ms, *pred["interval_ms"]
        e_sim.append(abs(pred["simulator_iteration_time_ms"] / t - 1) * 100)
        e_ck.append(abs(pred["iteration_time_ms"] / t - 1) * 100)
        e_fast.append(abs(fast["iteration_time_ms"] / t - 1) * 100)
        inside += lo <= t <= hi
        inside_fast += fast["interval_ms"][0] <= t <= fast["interval_ms"][1]
        print(f"{r.run['id']:8s} {r.run['hardware']['num_devices']:5d} {t:9.0f} "
              f"{pred['simulator_iteration_time_ms']:9.0f} {pred['iteration_time_ms']:10.0f}  [{lo:.0f}, {hi:.0f}]"
              f" {fast['iteration_time_ms']:7.0f}")
    print(f"SC21 iteration-time MAPE: simulator {np.mean(e_sim):.1f} %, checkpoint ({predictor.source}) full tier "
          f"{np.mean(e_ck):.1f} %, fast tier {np.mean(e_fast):.1f} %; 90 % interval coverage full {inside}/{len(rows)},"
          f" fast {inside_fast}/{len(rows)}")


if __name__ == "__main__":
    main()
