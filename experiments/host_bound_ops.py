"""Below what time does an isolated operator timing measure its host rather than its GPU?

``learnedperf measure`` times each operator over back-to-back calls, as in a training step, so a kernel
shorter than the host's launch is timed at the host's rate (``learnedperf/measure/ops.py``). Two data
sets of the same chip on different hosts tell where that stops: the lent H100 SXM5 and the lent H200
(``datasets/measured/lent-h100``, ``lent-h200``) are both GH100s with the same compute peaks, and the
H200 has the faster memory; their hosts differ (the kernel curves' fitted per-call overhead is
20-33 µs on the H100's, 34-37 µs on the H200's, ``kernel_curves`` in each manifest). Ops the GPU binds
take the same time on both, or less on the H200 where memory binds them; ops the host binds take longer
on the H200's slower host.

For every operator measured on both (same op, direction, shape, dtype and parameters), this prints the
mean and median of log(time on B / time on A), binned by the time on A, and the same below and above
``--split-ms``. A device's offsets in the operator regressor (``device_offsets_`` in
``learnedperf/models/gbdt.py``) are medians of such logs against the trees over every record of the
device, the host-bound ones included: the table says how much of them is the host.

    python experiments/host_bound_ops.py [A_DIR] [B_DIR] [--bins-ms 0,0.02,0.05,0.1,0.2,0.5,1,5] [--split-ms 0.5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = ["op", "kind", "direction", "shape", "dtype", "params"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", nargs="?", type=Path, default=ROOT / "datasets/measured/lent-h100")
    ap.add_argument("b", nargs="?", type=Path, default=ROOT / "datasets/measured/lent-h200")
    ap.add_argument("--bins-ms", default="0,0.02,0.05,0.1,0.2,0.5,1,5",
                    help="left edges of the bins of the time on A, ms (the last bin is open)")
    ap.add_argument("--split-ms", type=float, default=0.5, help="also print the ops below and at or above this time on A")
    args = ap.parse_args(argv)
    import numpy as np
    import pandas as pd

    from learnedperf.measure.records import verify_manifest

    frames = []
    for d in (args.a, args.b):
        verify_manifest(d)
        df = pd.concat([pd.read_parquet(f) for f in sorted(d.glob("ops_*.parquet"))], ignore_index=True)
        df = df[df["time_ms"] > 0]
        df["shape"], df["params"] = df["shape"].astype(str), df["params"].astype(str)
        frames.append(df[KEY + ["time_ms", "device_name"]])
    a, b = frames
    pairs = a.merge(b, on=KEY, suffixes=("_a", "_b"))
    if pairs.empty:
        print("error: no operator was measured on both", file=sys.stderr)
        return 2
    pairs["log_ratio"] = np.log(pairs["time_ms_b"] / pairs["time_ms_a"])
    edges = [float(x) for x in args.bins_ms.split(",")] + [np.inf]
    pairs["bin"] = pd.cut(pairs["time_ms_a"], edges, right=False)
    print(f"A = {args.a} ({a['device_name'].iloc[0]}), B = {args.b} ({b['device_name'].iloc[0]}): "
          f"{len(pairs)} operators measured on both")
    print("log(time on B / time on A) by the time on A")
    table = pairs.groupby(["dtype", "bin"], observed=True)["log_ratio"].agg(["count", "mean", "median"])
    print(table.round(3).to_string())
    for name, part in (("below", pairs["time_ms_a"] < args.split_ms), ("at or above", pairs["time_ms_a"] >= args.split_ms)):
        r = pairs.loc[part, "log_ratio"]
        print(f"{name} {args.split_ms} ms: n={len(r)}, mean {r.mean():+.3f}, median {r.median():+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
