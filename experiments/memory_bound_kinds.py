"""Share of DRAM bandwidth memory-bound kernels reach, by kind: fitted on NeuSight, checked on the lent GPUs.

A row-wise reduction (layer norm, RMS norm, softmax) reads its row, reduces it, and reads or writes it again:
it may reach less of the bandwidth than a streaming element-wise kernel. The shipped cost model has one share
for every memory-bound kind (``memory_efficiency``, fitted by ``learnedperf.cost.calibrate`` on NeuSight's
element-wise, ``ln`` and ``softmax`` kernels pooled). This script fits one share per kind family on the same
NeuSight kernels (fp32, forward, five GPUs from the P4 to the A100; :func:`~learnedperf.cost.calibrate.fit_memory_bound`
on each subset): element-wise, norm (``ln``), softmax. For kernels of at least ``--min-ms`` (default 0.2 ms:
longer than the host's dispatch, so the device's time) it prints the median achieved share of the data-sheet
bandwidth per source, device and kind, and the mean absolute log error of the memory term
``bytes / (bandwidth · share)`` with the shipped one share and with the per-kind shares. The NeuSight rows are
the fit's own data; the lent H100's and H200's (``datasets/measured/lent-*``, bf16, fp16 and fp32, forward and
backward: a GPU generation the fit never saw) are the check. Cross-entropy counts as element-wise.

    python experiments/memory_bound_kinds.py [--min-ms 0.2]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from learnedperf.cost import default_params
from learnedperf.cost.calibrate import _BINARY, _UNARY, _devices, fit_memory_bound
from learnedperf.measure.public import default_shared_data

ROOT = Path(__file__).resolve().parents[1]
LENT = ("lent-h100", "lent-h200")
#: NeuSight's op names → learnedperf kinds
NEUSIGHT_KIND = {"ln": "layernorm", "softmax": "softmax"}
#: learnedperf kinds → the family whose share they take, and each family's NeuSight op names
FAMILY = {"layernorm": "norm", "rmsnorm": "norm", "softmax": "softmax"}
FAMILY_OPS = {"elementwise": (_BINARY | _UNARY) - {"ln", "softmax"}, "norm": {"ln"}, "softmax": {"softmax"}}


def neusight_rows(min_ms: float) -> pd.DataFrame:
    """NeuSight's memory-bound kernels: device, kind, bytes (the calibration's accounting), bandwidth, time."""
    devs = _devices()
    ops = pd.read_parquet(default_shared_data() / "neusight_ops.parquet")
    d = ops[ops.op.isin(_BINARY | _UNARY) & ops.device.isin(list(devs)) & (ops.latency_ms >= min_ms)]
    tensors = np.where(d.op.isin(list(_BINARY)), 3.0, 2.0)
    return pd.DataFrame({
        "source": "NeuSight (fit)",
        "device": d.device.str.replace("NVIDIA ", "").str.replace("Tesla ", "").to_numpy(),
        "kind": d.op.map(lambda o: NEUSIGHT_KIND.get(o, "elementwise")).to_numpy(),
        "bytes": (d.B.to_numpy(float) * d.H.to_numpy(float) * tensors * 4.0),
        "bandwidth_Bps": d.device.map(lambda n: devs[n]["memory_bandwidth_GBps"] * 1e9).to_numpy(float),
        "time_s": d.latency_ms.to_numpy(float) * 1e-3})


def lent_rows(min_ms: float) -> pd.DataFrame:
    """The lent GPUs' memory-bound operator records (their own byte counts and data-sheet bandwidth)."""
    frames = []
    for name in LENT:
        path = ROOT / "datasets" / "measured" / name / "ops_cuda.parquet"
        if not path.exists():
            continue
        d = pd.read_parquet(path)
        d = d[d.kind.isin(["elementwise", "layernorm", "rmsnorm", "softmax", "cross_entropy"])
              & (d.time_ms >= min_ms)]
        bw = d.device.map(lambda s: json.loads(s)["memory_bandwidth_GBps"] * 1e9)
        frames.append(pd.DataFrame({"source": "lent GPU (check)", "device": d.device_name.to_numpy(),
                                    "kind": d.kind.to_numpy(), "bytes": d.bytes.to_numpy(float),
                                    "bandwidth_Bps": bw.to_numpy(float), "time_s": d.time_ms.to_numpy(float) * 1e-3}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def main(argv=None) -> int:
    """Print the per-kind table and the two models' errors."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-ms", type=float, default=0.2, help="shortest kernel counted (ms, default 0.2)")
    args = ap.parse_args(argv)
    p = default_params()
    ops = pd.read_parquet(default_shared_data() / "neusight_ops.parquet")
    share = {fam: fit_memory_bound(ops, names)["eff"] for fam, names in FAMILY_OPS.items()}
    rows = pd.concat([neusight_rows(args.min_ms), lent_rows(args.min_ms)], ignore_index=True)
    rows["share"] = rows.bytes / rows.time_s / rows.bandwidth_Bps
    one = np.abs(np.log(p.memory_efficiency / rows.share))
    kind_eff = rows.kind.map(lambda k: share[FAMILY.get(k, "elementwise")])
    rows["err_one"], rows["err_kind"] = one, np.abs(np.log(kind_eff / rows.share))
    print(f"one share (shipped memory_efficiency): {p.memory_efficiency:g}; per-kind shares fitted on NeuSight: "
          + ", ".join(f"{fam} {v:g}" for fam, v in share.items()) + f"; kernels of at least {args.min_ms:g} ms\n")
    head = f"{'source':<18} {'device':<18} {'kind':<14} {'kernels':>7} {'median share':>12} " \
           f"{'|log err| one share':>19} {'per kind':>9}"
    print(head)
    print("-" * len(head))
    for (src, dev, kind), g in rows.groupby(["source", "device", "kind"], sort=True):
        print(f"{src:<18} {dev:<18} {kind:<14} {len(g):>7} {g.share.median():>12.2f} "
              f"{g.err_one.mean():>19.3f} {g.err_kind.mean():>9.3f}")
    print()
    for (src, kind), g in rows.groupby(["source", "kind"], sort=True):
        print(f"{src:<18} {'all':<18} {kind:<14} {len(g):>7} {g.share.median():>12.2f} "
              f"{g.err_one.mean():>19.3f} {g.err_kind.mean():>9.3f}")
    for src, g in rows.groupby("source", sort=True):
        print(f"{src:<18} {'all':<18} {'all':<14} {len(g):>7} {g.share.median():>12.2f} "
              f"{g.err_one.mean():>19.3f} {g.err_kind.mean():>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
