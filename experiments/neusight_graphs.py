"""NeuSight's whole-model graphs: measured time against the sum of per-operator predictions.

For every NeuSight graph (``shared/data/neusight_graph_nodes.parquet``; training graphs by
default: BERT-large at batch 2 and 8, GPT-2 large at batch 1, all on a V100) the nodes are mapped
to operator records (:func:`~learnedperf.measure.public.neusight_graph_ops`) and three sums are
compared:

* **measured**: the sum of every node's ``fw_latency + bw_latency`` (ms) as NeuSight timed them,
  mapped or not; ``mapped`` is the part of it in mapped nodes (the rest: views, shape queries,
  tensor creation, each ~0.01 ms);
* **roofline**: the sum of :class:`~learnedperf.cost.RooflineCost` times (default, fitted constants)
  of the mapped records;
* **GBDT**: the sum of :class:`~learnedperf.models.OpTimeRegressor` predictions, the regressor
  trained **leave-one-device-out**: on the operator records of every *other* device
  (:func:`~learnedperf.models.gbdt.load_op_training_data`: NeuSight's kernels + this project's CPU
  records, at most ``--rows-per-device`` rows of each device), plus, with ``--with-graph-nodes``,
  the graph-node records of the other devices.

NeuSight traces one transformer block and scales it by the layer count; so does the **step**
comparison here: nodes inside the block count ``num_layer`` times, the others once, against the
measured end-to-end latency of ``neusight_step_times.csv`` (forward + backward, no optimizer step).
``measured×L`` is the node sum scaled the same way: how much of the step the nodes explain at all.

Prints one row per graph and MAPE per device and overall, then measured vs predicted milliseconds
per op kind and direction (where the error comes from) and the GEMMs' sums per device.

    python experiments/neusight_graphs.py [--modes train] [--rows-per-device 30000]
                                          [--n-estimators 300] [--with-graph-nodes]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from learnedperf.measure.public import (default_shared_data, load_neusight_graph_nodes, neusight_devices,
                                        neusight_graph_ops)
from learnedperf.models import OpTimeRegressor
from learnedperf.models.gbdt import load_op_training_data
from op_regressor_accuracy import ape, roofline_ms  # experiments/ is on sys.path when run as a script


def step_times(path) -> pd.DataFrame:
    """``neusight_step_times.csv`` keyed by (NeuSight device name, run): e2e latency (ms) and layer count."""
    st = pd.read_csv(path)
    st["device"] = st["device_dir"].str.replace("_", " ").str.strip()
    return st.rename(columns={"e2e_latency": "e2e_ms"}).set_index(["device", "run"])[["e2e_ms", "num_layer"]]


def print_table(title: str, head: str, lines) -> None:
    """Print a titled fixed-width table: a blank line, the title, the header, a rule, the lines."""
    print()
    print(title)
    print(head)
    print("-" * len(head))
    for line in lines:
        print(line)


def main() -> None:
    """Run the comparison and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="train", help="graphs: 'train', 'inf' or 'train,inf'")
    ap.add_argument("--rows-per-device", type=int, default=30000)
    ap.add_argument("--n-estimators", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--with-graph-nodes", action="store_true",
                    help="add the graph-node records of the other devices to the regressor's training rows")
    args = ap.parse_args()
    modes = tuple(args.modes.split(","))

    t0 = time.perf_counter()
    nodes = load_neusight_graph_nodes()
    nodes = nodes[nodes["mode"].isin(modes)]
    graph, unmapped = neusight_graph_ops(nodes, modes=modes)
    all_graph = graph if not args.with_graph_nodes else neusight_graph_ops(load_neusight_graph_nodes(),
                                                                           modes=("train", "inf"))[0]
    steps = step_times(default_shared_data() / "neusight_step_times.csv")
    train = load_op_training_data(neusight=True, rows_per_device=args.rows_per_device, seed=args.seed)

    graph = graph.copy()
    graph["roofline_ms"] = np.nan
    graph["gbdt_ms"] = np.nan
    for held in sorted(graph["device_name"].unique()):
        t1 = time.perf_counter()
        tr = train[train["device_name"] != held]
        if args.with_graph_nodes:
            other = all_graph[all_graph["device_name"] != held]
            tr = pd.concat([tr, other[tr.columns.intersection(other.columns)]], ignore_index=True)
        model = OpTimeRegressor(n_estimators=args.n_estimators).fit_records(tr)
        mine = graph["device_name"] == held
        graph.loc[mine, "gbdt_ms"] = model.predict_records(graph[mine])
        graph.loc[mine, "roofline_ms"] = roofline_ms(graph[mine])
        print(f"# held out {held}: trained on {len(tr)} rows of {tr['device_name'].nunique()} other devices "
              f"({time.perf_counter() - t1:.1f} s)", flush=True)

    short = {k: v["name"] for k, v in neusight_devices().items()}  # 'Tesla T4' -> 'T4'
    rows = []
    for (device, run), g in nodes.groupby(["device", "run"]):
        ops = graph[(graph["run"] == run) & (graph["device_name"] == short[device])]
        if (device, run) not in steps.index:
            raise SystemExit(f"neusight_step_times.csv has no row for {device} {run}")
        e2e, layers = steps.loc[(device, run)]
        w_nodes = np.where(g["in_layer"], layers, 1.0)
        w_ops = np.where(ops["in_layer"].astype(bool), layers, 1.0)
        measured = (g["fw_latency_ms"] + g["bw_latency_ms"]).to_numpy()
        rows.append({
            "device": short[device], "run": run, "nodes": len(g),
            "mapped_nodes": ops.groupby("node_index").ngroups,
            "measured_ms": measured.sum(), "mapped_ms": ops["time_ms"].sum(),
            "roofline_ms": ops["roofline_ms"].sum(), "gbdt_ms": ops["gbdt_ms"].sum(),
            "e2e_ms": e2e, "layers": int(layers), "measured_xL_ms": (measured * w_nodes).sum(),
            "roofline_xL_ms": (ops["roofline_ms"] * w_ops).sum(), "gbdt_xL_ms": (ops["gbdt_ms"] * w_ops).sum()})
    res = pd.DataFrame(rows)
    for col, ref in (("roofline_ms", "measured_ms"), ("gbdt_ms", "measured_ms"), ("measured_xL_ms", "e2e_ms"),
                     ("roofline_xL_ms", "e2e_ms"), ("gbdt_xL_ms", "e2e_ms")):
        res[col.replace("_ms", "_ape")] = ape(res[col].to_numpy(), res[ref].to_numpy())
    # signed error of the op-level predictions on the mapped nodes only (no coverage effect)
    res["gbdt_vs_mapped_pct"] = (res["gbdt_ms"] / res["mapped_ms"] - 1) * 100
    res["roofline_vs_mapped_pct"] = (res["roofline_ms"] / res["mapped_ms"] - 1) * 100

    print_table("one block as traced (ms; APE % against 'measured' = all nodes' fw+bw):",
                f"{'device':<16} {'run':<26} {'mapped':>9} {'measured':>9} {'mapped ms':>9} "
                f"{'roofline':>9} {'APE%':>6} {'GBDT':>9} {'APE%':>6} {'GBDT/mapped-1':>14}",
                (f"{r.device:<16} {r.run:<26} {f'{r.mapped_nodes}/{r.nodes}':>9} {r.measured_ms:>9.2f} "
                 f"{r.mapped_ms:>9.2f} {r.roofline_ms:>9.2f} {r.roofline_ape:>6.1f} {r.gbdt_ms:>9.2f} "
                 f"{r.gbdt_ape:>6.1f} {r.gbdt_vs_mapped_pct:>+13.1f}%" for r in res.itertuples()))
    print_table("whole step (block × num_layer + the rest, ms; APE % against NeuSight's measured e2e latency):",
                f"{'device':<16} {'run':<26} {'L':>3} {'e2e':>9} {'measured×L':>10} {'APE%':>6} "
                f"{'roofline×L':>10} {'APE%':>6} {'GBDT×L':>9} {'APE%':>6}",
                (f"{r.device:<16} {r.run:<26} {r.layers:>3} {r.e2e_ms:>9.1f} {r.measured_xL_ms:>10.1f} "
                 f"{r.measured_xL_ape:>6.1f} {r.roofline_xL_ms:>10.1f} {r.roofline_xL_ape:>6.1f} "
                 f"{r.gbdt_xL_ms:>9.1f} {r.gbdt_xL_ape:>6.1f}" for r in res.itertuples()))
    print_table("MAPE % per device (graphs: against the measured node sum; step: against e2e):",
                f"{'device':<16} {'graphs':>6} {'graph roofline':>15} {'graph GBDT':>11} {'step measured×L':>16} "
                f"{'step roofline':>14} {'step GBDT':>10}",
                (f"{name:<16} {len(g):>6} {g.roofline_ape.mean():>15.1f} {g.gbdt_ape.mean():>11.1f} "
                 f"{g.measured_xL_ape.mean():>16.1f} {g.roofline_xL_ape.mean():>14.1f} {g.gbdt_xL_ape.mean():>10.1f}"
                 for name, g in list(res.groupby("device")) + [("ALL", res)]))

    print()
    print("mapped records, summed over all graphs (ms), by kind and direction:")
    by = graph.groupby(["kind", "direction"])[["time_ms", "roofline_ms", "gbdt_ms"]].sum()
    by["n"] = graph.groupby(["kind", "direction"]).size()
    print(by.rename(columns={"time_ms": "measured_ms"}).round(2).to_string())
    print()
    print("mapped GEMMs (kind matmul) per device, summed over its graphs (ms), and the models' ratio to measured:")
    mm = graph[graph["kind"] == "matmul"].groupby("device_name")[["time_ms", "roofline_ms", "gbdt_ms"]].sum()
    mm["roofline/measured"] = mm["roofline_ms"] / mm["time_ms"]
    mm["GBDT/measured"] = mm["gbdt_ms"] / mm["time_ms"]
    print(mm.rename(columns={"time_ms": "measured_ms"}).round(3).to_string())
    left = unmapped.groupby("reason")[["nodes", "fw_latency_ms", "bw_latency_ms", "acc_latency_ms"]].sum()
    print()
    print("not mapped (all graphs): nodes and the latency they carry (ms):")
    print(left.round(2).to_string())
    print(f"\n# total {time.perf_counter() - t0:.1f} s; modes {args.modes}; rows per training device <= "
          f"{args.rows_per_device}, n_estimators {args.n_estimators}, graph nodes in training: "
          f"{args.with_graph_nodes}")


if __name__ == "__main__":
    main()
