"""Leave-one-device-out accuracy of the per-operator LightGBM regressor against the roofline.

Devices: NeuSight's 5 GPUs (``shared/data/neusight_ops.parquet``, fp32 kernels) and this
project's CPUs (``datasets/measured/*/ops_cpu.parquet``: an Intel Xeon, fp32/bf16/fp16, and an AMD
EPYC, fp32/bf16). For each device, an :class:`~learnedperf.models.OpTimeRegressor` is trained on the
*other* devices of its class — GPUs on GPUs, as the shipped regressor learns accelerator kernels only
(:func:`~learnedperf.models.pipeline.fit_op_regressor`), a CPU on the other CPUs — (at most
``--rows-per-device`` rows of each, sampled with a fixed seed) and evaluated on *every* record of the
held-out device. The baseline is :class:`~learnedperf.cost.RooflineCost`
with its default (fitted) constants on the same rows.

Prints MAPE (and median APE) of operator time per held-out device and per op kind.

``--with-graph-nodes`` also trains a second regressor per held-out device on the same rows plus
the operator records of NeuSight's whole-model graph nodes (``neusight_graph_nodes.parquet``,
:func:`~learnedperf.measure.public.neusight_graph_ops`) of the *other* devices, and prints its
MAPE on the same held-out kernel records next to the first one's, and on the held-out device's own
graph-node records when it has any (``graph-nodes`` rows). ``--graph-modes`` picks the graphs:
``train`` (the default; NeuSight has training graphs of V100 only, so every held-out device but
V100 gains them) or ``train,inf`` (inference graphs, forward nodes, of all five GPUs as well).

The ``L2 unknown`` columns score the same model on the same held-out records with the L2 size taken
out of the held-out device's descriptor: how a device the catalog describes without an L2 figure
(L4, T4, MI250X, ...) is predicted. ``--param unknown_cache_share=0`` trains without the rows
that teach the trees such a device (:class:`~learnedperf.models.OpTimeRegressor`).

``--param KEY=VALUE`` (repeatable) passes other LightGBM parameters to every regressor (e.g.
``--param linear_tree=true``; values are read as JSON, else kept as text), to compare settings on
the same rows.

    python experiments/op_regressor_accuracy.py [--rows-per-device 30000] [--n-estimators 300]
                                                [--with-graph-nodes [--graph-modes train,inf]]
                                                [--param KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

from learnedperf.cost import RooflineCost
from learnedperf.graph.ops import Op
from learnedperf.measure.public import load_neusight_graph_nodes, neusight_graph_ops
from learnedperf.models import OpTimeRegressor
from learnedperf.models.dataset import device_class
from learnedperf.models.gbdt import load_op_training_data
from learnedperf.specs import HardwareSpec


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


def without_l2(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the L2 size taken out of every device descriptor."""
    strip = {d: json.dumps({k: v for k, v in json.loads(d).items() if k != "l2_cache_MiB"})
             for d in df["device"].unique()}
    return df.assign(device=df["device"].map(strip))


def ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Absolute percentage errors."""
    return np.abs(pred - true) / true * 100.0


def main() -> None:
    """Run the leave-one-device-out evaluation and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-per-device", type=int, default=30000)
    ap.add_argument("--n-estimators", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--with-graph-nodes", action="store_true",
                    help="also train with the graph-node ops of the other devices and compare")
    ap.add_argument("--graph-modes", default="train", help="graphs to use: 'train' or 'train,inf'")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                    help="another LightGBM parameter of every regressor (value read as JSON, else text)")
    args = ap.parse_args()
    params = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--param {item!r}: expected KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value

    t0 = time.perf_counter()
    # NeuSight's kernels + every ops_*.parquet of datasets/measured/* (the CPU's today), compute kinds
    # only, positive times only: the default model's training records
    df = load_op_training_data(neusight=True)
    for reason, n in df.attrs["skipped"].items():
        print(f"# left out: {reason}: {n}")
    graph = None
    if args.with_graph_nodes:
        graph, unmapped = neusight_graph_ops(load_neusight_graph_nodes(), modes=tuple(args.graph_modes.split(",")))
        print(f"# graph-node records ({args.graph_modes}): {len(graph)} from "
              f"{graph.groupby(['device_name', 'run']).ngroups} graphs; per device "
              f"{graph['device_name'].value_counts().to_dict()}; not mapped: "
              f"{int(unmapped.loc[~unmapped['reason'].str.contains('latency'), 'nodes'].sum())} nodes")
    devices = sorted(df["device_name"].unique())
    rng = np.random.default_rng(args.seed)
    train_idx = {d: np.flatnonzero(df["device_name"].to_numpy() == d) for d in devices}
    train_idx = {d: (rng.choice(ix, args.rows_per_device, replace=False) if len(ix) > args.rows_per_device else ix)
                 for d, ix in train_idx.items()}

    rows = []
    for held in devices:
        t1 = time.perf_counter()
        # the other devices of the held-out one's class: a GPU is learnt from GPUs (the shipped regressor,
        # fit_op_regressor, learns accelerator kernels only), a CPU from the other CPUs
        same = [d for d in devices if d != held and device_class(d) == device_class(held)]
        if not same:
            print(f"# held out {held}: no other {device_class(held)} device to train on", flush=True)
            continue
        tr = df.iloc[np.concatenate([train_idx[d] for d in same])]
        te = df[df["device_name"] == held]
        model = OpTimeRegressor(n_estimators=args.n_estimators, **params).fit_records(tr)
        true = te["time_ms"].to_numpy()
        e_m, e_r = ape(model.predict_records(te), true), ape(roofline_ms(te), true)
        e_u = ape(model.predict_records(without_l2(te)), true)
        e_g = None
        extra = ""
        if graph is not None:
            other = graph[graph["device_name"] != held]
            # no graphs of other devices: the same rows give the same model, no need to fit it twice
            aug = model if other.empty else OpTimeRegressor(n_estimators=args.n_estimators, **params).fit_records(
                pd.concat([tr, other[tr.columns.intersection(other.columns)]], ignore_index=True))
            e_g = ape(aug.predict_records(te), true)
            extra = f" (+{len(other)} graph-node rows of other devices)"
            own = graph[graph["device_name"] == held]
            if len(own):  # the held-out device's own graph nodes: never in training
                t_own = own["time_ms"].to_numpy()
                a, b, r = ape(model.predict_records(own), t_own), ape(aug.predict_records(own), t_own), \
                    ape(roofline_ms(own), t_own)
                rows.append((held, "graph-nodes", len(own), a, b, r, None))
        kinds = te["kind"].to_numpy()
        rows.append((held, "ALL", len(te), e_m, e_g, e_r, e_u))
        for k in sorted(set(kinds)):
            m = kinds == k
            rows.append((held, k, int(m.sum()), e_m[m], None if e_g is None else e_g[m], e_r[m], e_u[m]))
        print(f"# held out {held}: trained on {len(tr)} rows{extra}, tested on {len(te)} rows "
              f"({time.perf_counter() - t1:.1f} s)", flush=True)

    print()
    head = f"{'held-out device':<20} {'kind':<14} {'rows':>7} {'GBDT MAPE%':>11} {'GBDT med%':>10} "
    if graph is not None:
        head += f"{'+graph MAPE%':>13} {'+graph med%':>12} "
    head += f"{'roofline MAPE%':>15} {'roofline med%':>14} {'L2 unknown MAPE%':>17} {'L2 unknown med%':>16}"
    print(head)
    print("-" * len(head))
    for held, kind, n, em, eg, er, eu in rows:
        line = f"{held:<20} {kind:<14} {n:>7} {em.mean():>11.1f} {np.median(em):>10.1f} "
        if graph is not None:
            line += f"{eg.mean():>13.1f} {np.median(eg):>12.1f} " if eg is not None else f"{'-':>13} {'-':>12} "
        line += f"{er.mean():>15.1f} {np.median(er):>14.1f} "
        line += f"{eu.mean():>17.1f} {np.median(eu):>16.1f}" if eu is not None else f"{'-':>17} {'-':>16}"
        print(line)
    print(f"\n# total {time.perf_counter() - t0:.1f} s; rows per training device <= {args.rows_per_device}, "
          f"n_estimators {args.n_estimators}" + (f", other parameters {params}" if params else ""))


if __name__ == "__main__":
    main()
