"""fp32 GEMM efficiency by power class: one constant for every GPU against one per class of power supply.

Until 2026-11-28 the shipped ``gemm_efficiency_fp32`` (0.59) was one constant fitted on NeuSight's fp32
linear/bmm kernels on five GPUs (``learnedperf.cost.calibrate``). Fitted one device at a time, the five disagree: the 250 W cards
(A100, V100, P100 PCIe) reach 0.65-0.86 of their data-sheet peak, the two cards powered by the PCIe slot
alone (T4 70 W, P4 75 W: the slot's 75 W limit, their data sheets' ``tdp_W``) 0.41-0.42, since they cannot
hold the boost clock their peak is quoted at. One constant for all five sits between, too slow for the
large cards and too fast for the small ones.

Since 2026-11-29 every fit here also fits the share of the efficiency a GEMM with a dimension that is not a
multiple of 16 bytes keeps (``gemm_unaligned_share``, ``learnedperf.cost.params.gemm_aligned``). Since the
fourth change of that day every fit reads only the transformer-shaped part of NeuSight's grid
(``learnedperf.cost.calibrate.MODEL_SHAPED_SPLIT``): section 0 shows that the share's premise came from mixing
the two parts. This prints, without changing the shipped constants:

0. the premise of that share: each GPU's median share of its fp32 peak on kernels of over 10 GFLOP, aligned
   or not, over both parts of the grid and within each (within a part alignment moves the medians little;
   the transformer-shaped part is the faster one on every GPU);

1. the fit per device, per class (slot-powered: ``tdp_W`` <= 75) and over all five;
2. leave one device out: each device's kernels costed with the constant fitted on the *other* devices,
   of its class or of all (mean |log error| of the kernels over 100 µs, the calibration's loss);
3. devices none of the fits saw: the fp32 GEMMs timed on the lent H100 and H200
   (``datasets/measured/lent-h1*``, their operator records), costed with each constant on their data
   sheets' peaks;
4. whole steps: the simulator's MAPE and mean log(predicted / measured) on NeuSight's 34 runs per device
   and on the lent GPUs' fp32 steps, with the constant of all five against each device's class constant
   fitted without that device's kernels.

    python experiments/gemm_fp32_power.py
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOT_POWER_W = 75.0  # PCI Express CEM specification: a x16 slot supplies at most 75 W without a cable


def main(argv=None) -> int:
    import numpy as np
    import pandas as pd

    from learnedperf.catalog import get_device
    from learnedperf.cost import RooflineCost, default_params
    from learnedperf.cost import calibrate as cal
    from learnedperf.graph.ops import Op
    from learnedperf.measure.public import default_shared_data, load_neusight_ops, load_neusight_steps
    from learnedperf.simulate import simulate
    from learnedperf.specs import HardwareSpec, RunSpec

    data = default_shared_data()
    # the transformer-shaped part of NeuSight's grid, which the shipped constants are fit on
    # (learnedperf.cost.calibrate.MODEL_SHAPED_SPLIT; section 0 shows why)
    ops = cal.model_shaped(pd.read_parquet(data / "neusight_ops.parquet"))
    devs = cal._devices()  # NeuSight's reported name -> catalog entry
    slot = {name for name, d in devs.items() if (d.get("tdp_W") or math.inf) <= SLOT_POWER_W}
    mem = cal.fit_memory_bound(ops)["eff"]

    def fit(names):
        return cal.fit_gemm_fp32(ops[ops.device.isin(list(names))], mem, 0.0)

    def loss(names, f):
        log_error, n = cal.gemm_fp32_error(ops[ops.device.isin(list(names))], mem)
        return log_error(f["eff"], f["k_half"], 0.0, f["unaligned"]), n

    print(f"slot-powered (tdp_W <= {SLOT_POWER_W:.0f} W): {sorted(slot)}")
    print("\n0. median share of the data-sheet fp32 peak of the linear+bmm kernels over 10 GFLOP, every dimension a "
          "multiple of 16 bytes or not (kernels), in both parts of NeuSight's grid and in each")
    records = load_neusight_ops(data, ops=("linear", "bmm"))
    for split in (None, "train_dims", "test_dims"):
        print(f"   {split or 'both parts'}:")
        for name, (al, n_al, un, n_un) in cal.gemm_fp32_alignment_shares(records, split=split).items():
            print(f"     {name:<22} aligned {al:.3f} ({n_al}), not {un:.3f} ({n_un})")
    print("\n1. fp32 GEMM efficiency fitted on NeuSight's transformer-shaped linear+bmm kernels over 100 us (eff, "
          "k_half, the share an unaligned GEMM keeps, loss)")
    every = fit(devs)
    for name in devs:
        f = fit([name])
        print(f"   {name:<24} {f['eff']:.2f} {f['k_half']:>5.0f} {f['unaligned']:.2f}  {f['_mean_abs_log_error']:.3f}")
    fits = {"all five": every, "slot-powered": fit(slot), "other": fit(set(devs) - slot)}
    for label, f in fits.items():
        print(f"   {label:<24} {f['eff']:.2f} {f['k_half']:>5.0f} {f['unaligned']:.2f}  {f['_mean_abs_log_error']:.3f}")

    print("\n2. leave one device out: mean |log error| of its kernels (kernels)")
    print(f"   {'held out':<24} {'one constant':>13} {'its class':>10}")
    held = {}
    for name in devs:
        others = set(devs) - {name}
        same = (slot if name in slot else set(devs) - slot) - {name}
        f_all, f_cls = fit(others), fit(same)
        held[name] = (f_all, f_cls)
        (l_all, n), (l_cls, _) = loss([name], f_all), loss([name], f_cls)
        print(f"   {name:<24} {l_all:13.3f} {l_cls:10.3f}  ({n}; class fit on {sorted(same)})")

    print("\n3. devices no fit saw: the lent GPUs' fp32 GEMMs (flops > 1e9), mean |log error| and the median "
          "achieved share of the data-sheet peak")
    for host in ("lent-h100", "lent-h200"):
        d = pd.read_parquet(ROOT / "datasets" / "measured" / host / "ops_cuda.parquet")
        d = d[(d["kind"] == "matmul") & (d["dtype"] == "fp32") & (d["flops"] > 1e9)]
        # the data sheet's descriptor: a measured curve would replace the GEMM model being judged
        dev = {k: v for k, v in json.loads(d["device"].iloc[0]).items() if k not in ("kernel_curves", "optimizer_step")}
        hw = HardwareSpec.parse({"device": dev, "num_devices": 1, "devices_per_node": 1})
        ops_ = [Op("gemm", "matmul", "fwd", float(f), float(b), "fp32", tuple(json.loads(s)))
                for f, b, s in zip(d["flops"], d["bytes"], d["shape"])]
        y = np.log(d["time_ms"].to_numpy(float) * 1e-3)
        share = np.median(d["flops"].to_numpy(float) / (d["time_ms"].to_numpy(float) * 1e-3)
                          / (dev["peak_tflops"]["fp32"] * 1e12))
        out = []
        for label in ("all five", "other"):
            f = fits[label]
            params = replace(default_params(), gemm_efficiency_fp32=f["eff"], gemm_k_half=f["k_half"],
                             gemm_unaligned_share=f["unaligned"], memory_efficiency=mem, kernel_launch_us=0.0,
                             kernel_floor_us=0.0)
            cost = RooflineCost(hw, params)
            t = np.array([cost.compute_time_s(op) for op in ops_])
            out.append(f"{label} {np.mean(np.abs(np.log(t) - y)):.3f}")
        print(f"   {host}: {len(d)} GEMMs, median share {share:.2f}; " + ", ".join(out))

    print("\n4. whole steps, simulated: MAPE % and mean log(predicted / measured)")
    steps = [(json.loads(s["run"]), s["iteration_time_ms"]) for s in load_neusight_steps(data).records]
    for host in ("lent-h100", "lent-h200"):
        st = pd.read_parquet(ROOT / "datasets" / "measured" / host / "steps_cuda.parquet")
        for r, t in zip(st["run"], st["iteration_time_ms"]):
            run = json.loads(r)
            if run["strategy"].get("precision") == "fp32":
                steps.append((run, t))
    by_name = {d["name"]: n for n, d in devs.items()}
    rows = []
    for run, measured in steps:
        spec = RunSpec.from_dict(run)
        name = spec.hardware.device.name
        base = default_params()
        if name in by_name:  # a NeuSight device: the constants fitted without its own kernels
            f_all, f_cls = held[by_name[name]]
        else:  # a device no fit saw: the fits on all five NeuSight GPUs
            f_all = fits["all five"]
            f_cls = fits["slot-powered"] if (get_device(name).get("tdp_W") or math.inf) <= SLOT_POWER_W \
                else fits["other"]
        logs = []
        for f in (f_all, f_cls):
            # the fitted efficiency itself, not derated again for a slot-powered card
            p = replace(base, gemm_efficiency_fp32=f["eff"], gemm_k_half=f["k_half"],
                        gemm_unaligned_share=f["unaligned"], slot_power_compute_share=1.0)
            logs.append(math.log(simulate(spec, cost=RooflineCost(spec.hardware, p)).iteration_time_s * 1e3
                                 / measured))
        rows.append((name, *logs))
    df = pd.DataFrame(rows, columns=["device", "one", "cls"])
    print(f"   {'device':<20} {'n':>3}  {'one constant':>18}  {'its class':>18}")

    def line(label, g):
        m = [100 * np.mean(np.abs(np.exp(g[c]) - 1)) for c in ("one", "cls")]
        print(f"   {label:<20} {len(g):>3}  {m[0]:9.1f}% {g['one'].mean():+7.2f}  {m[1]:9.1f}% {g['cls'].mean():+7.2f}")

    for name, g in df.groupby("device", sort=True):
        line(name, g)
    line("all", df)
    return 0


if __name__ == "__main__":
    sys.exit(main())
