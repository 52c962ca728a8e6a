"""Leave-one-device-out accuracy of the per-operator LightGBM regressor against the roofline.

Devices: NeuSight's 5 GPUs (``shared/data/neusight_ops.parquet``, fp32 kernels) and this
project's CPU (``datasets/measured/vm-xeon-2c/ops_cpu.parquet``, fp32/bf16/fp16). For each
device, an :class:`~learnedperf.models.OpTimeRegressor` is trained on the *other* devices
(at most ``--rows-per-device`` rows of each, sampled with a fixed seed) and evaluated on
*every* record of the held-out device. The baseline is :class:`~learnedperf.cost.RooflineCost`
with its default (fitted) constants on the same rows.

Prints MAPE (and median APE) of operator time per held-out device and per op kind.

    python experiments/op_regressor_accuracy.py [--rows-per-device 30000] [--n-estimators 300]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from learnedperf.cost import RooflineCost
from learnedperf.graph.ops import Op
from learnedperf.measure.public import load_neusight_ops
from learnedperf.models import OpTimeRegressor
from learnedperf.specs import HardwareSpec

ROOT = Path(__file__).resolve().parents[1]
CPU_OPS = ROOT / "datasets" / "measured" / "vm-xeon-2c" / "ops_cpu.parquet"


def roofline_ms(df: pd.DataFrame) -> np.ndarray:
    """RooflineCost (default constants) time in ms of every record of one device."""
    dev = json.loads(df["device"].iloc[0])
    cost = RooflineCost(HardwareSpec.parse({"device": dev, "num_devices": 1, "devices_per_node": 1}))
    shapes = {s: tuple(json.loads(s)) for s in df["shape"].unique()}
    causal = {p: bool(json.loads(p).get("causal")) if p else False for p in df["params"].unique()}
    out = np.empty(len(df))
    for i, (kind, direction, flops, nbytes, dtype, shape, params) in enumerate(zip(
            df["kind"], df["direction"], df["flops"], df["bytes"], df["dtype"], df["shape"], df["params"])):
        op = Op("op", kind, direction, float(flops), float(nbytes), dtype, shapes[shape], causal=causal[params])
        out[i] = cost.compute_time_s(op) * 1e3
    return out


def ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Absolute percentage errors."""
    return np.abs(pred - true) / true * 100.0


def main() -> None:
    """Run the leave-one-device-out evaluation and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-per-device", type=int, default=30000)
    ap.add_argument("--n-estimators", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = time.perf_counter()
    frames = [load_neusight_ops()]
    if CPU_OPS.exists():
        frames.append(pd.read_parquet(CPU_OPS))
    df = pd.concat(frames, ignore_index=True)
    df = df[(df["time_ms"] > 0) & df["kind"].notna()].reset_index(drop=True)
    devices = sorted(df["device_name"].unique())
    rng = np.random.default_rng(args.seed)
    train_idx = {d: np.flatnonzero(df["device_name"].to_numpy() == d) for d in devices}
    train_idx = {d: (rng.choice(ix, args.rows_per_device, replace=False) if len(ix) > args.rows_per_device else ix)
                 for d, ix in train_idx.items()}

    rows = []
    for held in devices:
        t1 = time.perf_counter()
        tr = df.iloc[np.concatenate([train_idx[d] for d in devices if d != held])]
        te = df[df["device_name"] == held]
        model = OpTimeRegressor(n_estimators=args.n_estimators).fit_records(tr)
        pred = model.predict_records(te)
        roof = roofline_ms(te)
        true = te["time_ms"].to_numpy()
        e_m, e_r = ape(pred, true), ape(roof, true)
        kinds = te["kind"].to_numpy()
        rows.append((held, "ALL", len(te), e_m.mean(), np.median(e_m), e_r.mean(), np.median(e_r)))
        for k in sorted(set(kinds)):
            m = kinds == k
            rows.append((held, k, int(m.sum()), e_m[m].mean(), np.median(e_m[m]), e_r[m].mean(), np.median(e_r[m])))
        print(f"# held out {held}: trained on {len(tr)} rows, tested on {len(te)} rows "
              f"({time.perf_counter() - t1:.1f} s)", flush=True)

    print()
    head = f"{'held-out device':<20} {'kind':<14} {'rows':>7} {'GBDT MAPE%':>11} {'GBDT med%':>10} " \
           f"{'roofline MAPE%':>15} {'roofline med%':>14}"
    print(head)
    print("-" * len(head))
    for held, kind, n, mm, md, rm, rd in rows:
        print(f"{held:<20} {kind:<14} {n:>7} {mm:>11.1f} {md:>10.1f} {rm:>15.1f} {rd:>14.1f}")
    print(f"\n# total {time.perf_counter() - t0:.1f} s; rows per training device <= {args.rows_per_device}, "
          f"n_estimators {args.n_estimators}")


if __name__ == "__main__":
    main()
