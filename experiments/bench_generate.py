"""Throughput of the dataset generator on this machine: simulated records per second per core.

Runs the real generator (:func:`learnedperf.data.run_generate`: sample, compile, simulate, build the
graph and the record, write Parquet shards and the manifest) on ``--n`` runs with ``--workers``
processes into a temporary directory, measured runs left out, and prints

* records per second per core, end to end (n / wall time / workers: interpreter start-up, imports and the
  manifest included) and in the shard tasks themselves (n / worker time; target >= 200 on the 2-core CI
  machine);
* where one record's time goes (sampling, simulation, graph, record), from timing the stages on the
  first 300 runs of the same seed in this process;
* the generator's path (compile, simulate, graph, record, Parquet) on the simulator benchmark's *typical
  runs* (``experiments/bench_simulator.py``: catalog models on DGX A100/H100 clusters of 8-1,024 GPUs,
  pp <= 8), for comparison with its 1,000-run figure. The generator's own distribution is wider (up to
  16,384 devices, pp up to 64, ZeRO-3/FSDP collectives per micro-batch): its runs cost the simulator more.

Usage: ``python experiments/bench_generate.py [--n 2000] [--workers 1] [--seed 0]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

from learnedperf.cost import RooflineCost
from learnedperf.data import run_generate
from learnedperf.data.graphs import build_graph, graphs_table
from learnedperf.data.records import records_table, simulated_record
from learnedperf.data.sampler import draw
from learnedperf.simulate.memory import memory_microbatches
from learnedperf.data.store import write_table_atomic
from learnedperf.graph.execution import compile_run
from learnedperf.simulate import simulate


def stage_times(seed: int, count: int) -> dict[str, float]:
    """Milliseconds per record of each stage over the first ``count`` sample indices."""
    draw(seed, 0)  # catalog and caches
    t = {"sample": 0.0, "simulate": 0.0, "graph": 0.0, "record": 0.0}
    for i in range(count):
        t0 = time.perf_counter()
        s = draw(seed, i)
        t1 = time.perf_counter()
        cost = RooflineCost(s.spec.hardware)
        pred = simulate(s.spec, cost=cost).to_prediction()
        t2 = time.perf_counter()
        g = build_graph(s.graph, cost)
        t3 = time.perf_counter()
        simulated_record(i, s.run, s.spec, pred, {"graph_shard": "", "graph_row": 0,
                                                  "graph_num_nodes": g.num_nodes, "graph_num_edges": len(g.src)})
        t4 = time.perf_counter()
        for k, dt in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            t[k] += dt
    return {k: v / count * 1e3 for k, v in t.items()}


def typical_pipeline(count: int) -> float:
    """Records per second of the generator's path (compile, simulate, graph, record, Parquet shards of 250)
    on the simulator benchmark's typical runs, sampling aside."""
    path = Path(__file__).resolve().parent / "bench_simulator.py"
    spec = importlib.util.spec_from_file_location("bench_simulator", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = mod.typical_runs(count)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        records, graphs = [], []
        for i, r in enumerate(runs):
            cost = RooflineCost(r.hardware)
            pred = simulate(r, cost=cost).to_prediction()
            g = build_graph(compile_run(r, memory_microbatches(r)), cost)
            records.append(simulated_record(i, r.to_dict(), r, pred, {
                "graph_shard": "", "graph_row": len(graphs), "graph_num_nodes": g.num_nodes,
                "graph_num_edges": len(g.src)}))
            graphs.append(g)
            if len(records) == 250 or i == len(runs) - 1:
                k = i // 250
                write_table_atomic(graphs_table([x["run_id"] for x in records], graphs),
                                   Path(tmp) / f"g{k}.parquet", compression="lz4")
                write_table_atomic(records_table(records), Path(tmp) / f"r{k}.parquet")
                records, graphs = [], []
        return count / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000, help="runs to generate (default 2000)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1: per-core figure)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-stages", dest="stages", action="store_false", help="skip the per-stage breakdown")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        manifest = run_generate(args.n, Path(tmp) / "set", seed=args.seed, workers=args.workers, progress=False,
                                measured=False)
        wall = time.perf_counter() - t0
        shards = [json.loads(line) for line in (Path(tmp) / "set" / "progress.jsonl").read_text().splitlines()]
    n = manifest["counts"]["by_source"]["simulated"]
    busy = sum(e["elapsed_s"] for e in shards)
    print(f"generate --n {args.n} --workers {args.workers} --seed {args.seed} (no measured runs): {n} records in "
          f"{wall:.1f} s wall = {n / wall / args.workers:.0f} records/s/core end to end (start-up and manifest "
          f"included)")
    print(f"  shard tasks: {busy:.1f} s of worker time for {n} records = {n / busy:.0f} records/s/core "
          f"(sample, compile, simulate, graph, record, Parquet)")
    if args.stages:
        st = stage_times(args.seed, 300)
        total = sum(st.values())
        print("per record (first 300 runs, this process): " + ", ".join(f"{k} {v:.2f} ms" for k, v in st.items())
              + f"; total {total:.2f} ms = {1e3 / total:.0f} records/s before Parquet")
        print(f"typical runs of bench_simulator.py (1,000): {typical_pipeline(1000):.0f} records/s/core "
              "(compile, simulate, graph, record, Parquet; no sampling)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
