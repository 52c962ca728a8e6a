"""Measured mixture-of-experts steps on this CPU against the simulator and the shipped checkpoint.

Times training steps of the step grid's MoE model (``moe-small``: 4 layers, hidden 256, 8 experts, top-2;
:func:`learnedperf.measure.steps.step_grid`) on this machine — dropless, and with the experts padded to a
capacity factor of 1.0, 1.5 and 2.0 (:class:`learnedperf.measure.models.MoEFeedForward`), on one process
and as DDP over two — alternating the configurations ``--rounds`` times, and prints for each the median
time beside the simulator's and both checkpoint tiers', each on the hardware block (device descriptor,
kernel curves, links) of the data set's records of the same process and thread count.

Two figures come out:

* the **absolute** error on MoE steps (the first MoE steps ever measured here: no MoE step is in any
  training set), which also carries any drift of this machine since the data set's hardware block was
  measured (the script prints the host's CPU model beside the data set's);
* the **capacity ratios** t(c) / t(1.0) of the padded configurations, where every expert runs exactly
  ceil(c·T·k/E) rows: what ``moe_capacity_factor`` predicts, against what the padded rows cost. Ratios
  cancel most of a machine's drift.

Each configuration's time is its fastest round (each round the median of the grid's repeats): on a shared
host other load only slows a round down. Dense steps of the grid that the data set holds records of are timed
in the same rounds; their ratio to the records is this machine's drift since then, and the MoE errors are also
printed with the predictions scaled by it.

``--blocks`` times the MoE layer's feed-forward block alone instead (in this process, one thread): forward
and backward of :class:`~learnedperf.measure.models.MoEFeedForward` (router, routing, experts, combine) on one
micro-batch, dropless and padded to 1.0 and 2.0, beside the dense feed-forward block of width k·ffn (the same
FLOPs as balanced routing), each its fastest of ``--rounds`` alternating rounds of ``--repeats`` calls; and
the simulator's cost of the same ops (the MoE layer's router, permutations, experts and combine, forward and
backward, on the data set's hardware block). It says how much of a step's error the routing itself carries.

    python experiments/moe_capacity.py [--dataset datasets/measured/vm-xeon-2c] [--rounds 5]
    python experiments/moe_capacity.py --blocks [--rounds 5] [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import numpy as np

from _checkpoint import add_checkpoint_argument, load_predictor


def main() -> None:
    """Measure the MoE configurations, predict them, print the table and the summaries."""
    import pandas as pd

    from learnedperf.io import load_json_file
    from learnedperf.measure.bench import host_descriptor
    from learnedperf.measure.collect import step_hardware
    from learnedperf.measure.records import run_id
    from learnedperf.measure.steps import measure_step, run_dict, step_grid
    from learnedperf.simulate import simulate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="datasets/measured/vm-xeon-2c",
                    help="CPU data set whose hardware blocks the predictions use")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds; the fastest is taken")
    add_checkpoint_argument(ap)
    ap.add_argument("--blocks", action="store_true", help="time the feed-forward blocks alone (see above)")
    ap.add_argument("--repeats", type=int, default=10, help="--blocks: calls per round")
    args = ap.parse_args()
    if args.blocks:
        blocks(args)
        return

    predictor = load_predictor(args.checkpoint, "moe_capacity")  # before minutes of measuring: a bad checkpoint stops it at once
    steps = pd.read_parquet(f"{args.dataset}/steps_cpu.parquet")
    hardware = step_hardware(steps, args.dataset)
    manifest = load_json_file(f"{args.dataset}/manifest.json")
    print(f"# this host: {host_descriptor().get('cpu_model')!r}; data set's: {manifest['host'].get('cpu_model')!r}")

    # the grid's own MoE configurations (and timing), with capacity 1.5 and DDP at 2.0 beside them
    grid = {(c.world_size, c.strategy.get("moe_capacity_factor")): c for c in step_grid()
            if c.model.get("name") == "moe-small"}
    one, two = grid[(1, None)], grid[(2, None)]
    configs = [("1 process, dropless", one),
               *[(f"1 process, capacity {c}", replace(one, strategy={**one.strategy, "moe_capacity_factor": c}))
                 for c in (1.0, 1.5, 2.0)],
               ("2 processes DDP, dropless", two),
               ("2 processes DDP, capacity 2.0", replace(two, strategy={**two.strategy, "moe_capacity_factor": 2.0}))]
    # the drift of this machine since the data set: dense steps of the grid that the data set holds a record of
    recorded = dict(zip(steps["run_id"], steps["iteration_time_ms"]))
    dense = [c for c in step_grid() if c.model.get("name") == "llama-small" and c.threads == 1
             and c.world_size in (1, 2) and set(c.strategy) <= {"grad_bucket_size_MiB"}
             and c.strategy.get("grad_bucket_size_MiB", 25.0) == 25.0]
    configs += [(f"dense twin {c.label()}", c) for c in dense]
    times: dict[str, list[float]] = {label: [] for label, _ in configs}
    for _ in range(args.rounds):
        for label, cfg in configs:
            times[label].append(measure_step(cfg, hardware[(cfg.world_size, cfg.threads)])["iteration_time_ms"])
    rows = {}
    print("| configuration | measured ms (fastest round) | simulator ms | full ms | fast ms |")
    print("|---|---:|---:|---:|---:|")
    for label, cfg in configs:
        run = run_dict(cfg, hardware[(cfg.world_size, cfg.threads)])
        # the fastest round: on a shared host other load only ever slows a round down (the median's spread is
        # printed at the end)
        measured = min(times[label])
        sim = simulate(run).iteration_time_s * 1e3
        full = predictor.predict(run, tier="full")["iteration_time_ms"]
        fast = predictor.predict(run, tier="fast")["iteration_time_ms"]
        rows[label] = {"measured": measured, "simulator": sim, "full": full, "fast": fast}
        print(f"| {label} | {measured:.1f} | {sim:.1f} | {full:.1f} | {fast:.1f} |")
    moe = [r for label, r in rows.items() if not label.startswith("dense twin")]
    for name in ("simulator", "full", "fast"):
        errs = [r[name] / r["measured"] - 1 for r in moe]
        print(f"MoE steps: {name:9s} MAPE {np.mean(np.abs(errs)) * 100:5.1f} %, mean signed error "
              f"{np.mean(errs) * 100:+5.1f} %")
    print("capacity ratios t(c) / t(1.0), 1 process:")
    base = rows["1 process, capacity 1.0"]
    for c in (1.5, 2.0):
        r = rows[f"1 process, capacity {c}"]
        print(f"  c={c}: measured {r['measured'] / base['measured']:.3f}, simulator "
              f"{r['simulator'] / base['simulator']:.3f}, full {r['full'] / base['full']:.3f}, "
              f"fast {r['fast'] / base['fast']:.3f}")
    r, b = rows["2 processes DDP, capacity 2.0"], rows["2 processes DDP, dropless"]
    print(f"  DDP c=2.0 over dropless: measured {r['measured'] / b['measured']:.3f}, simulator "
          f"{r['simulator'] / b['simulator']:.3f}, full {r['full'] / b['full']:.3f}, fast {r['fast'] / b['fast']:.3f}")
    drift = []
    for label, cfg in configs:
        if label.startswith("dense twin"):
            then = recorded[run_id(run_dict(cfg, hardware[(cfg.world_size, cfg.threads)]))]
            drift.append(rows[label]["measured"] / then)
            print(f"  {label}: measured here {rows[label]['measured']:.1f} ms, in the data set {then:.1f} ms "
                  f"(x{drift[-1]:.2f})")
    f = statistics.median(drift)
    for name in ("simulator", "full", "fast"):
        errs = [r[name] * f / r["measured"] - 1 for r in moe]
        print(f"MoE steps, predictions x{f:.2f} (this machine's drift): {name:9s} MAPE "
              f"{np.mean(np.abs(errs)) * 100:5.1f} %, mean signed error {np.mean(errs) * 100:+5.1f} %")
    spread = {label: (statistics.median(v) / min(v), max(v) / min(v)) for label, v in times.items()}
    print("rounds against the fastest (median/min, max/min): " +
          ", ".join(f"{k}: {lo:.2f}, {hi:.2f}" for k, (lo, hi) in spread.items()))


def _block_ops(run, moe: bool) -> tuple[list, list]:
    """The forward ops of ``run``'s feed-forward block (router, permutations, experts, combine for MoE) and
    their backward."""
    from learnedperf.graph.transformer import backward_of, layer_forward, shard_for
    from learnedperf.graph.ops import Group

    one = Group(1, 1)
    ops = layer_forward(run.model, shard_for(run, one, one, one), moe, "layer")
    keep = [o for o in ops if ".moe." in o.name or o.name.split(".")[1:3] in (["mlp", "fc1"], ["mlp", "act"],
                                                                              ["mlp", "fc2"])]
    return keep, backward_of(keep)


def blocks(args) -> None:
    """``--blocks``: the MoE feed-forward block against the dense one of equal FLOPs, measured and simulated."""
    import time

    import pandas as pd
    import torch

    from learnedperf.cost.roofline import RooflineCost
    from learnedperf.measure import models as M
    from learnedperf.measure.collect import step_hardware
    from learnedperf.measure.steps import run_dict, step_grid
    from learnedperf.specs import RunSpec

    torch.set_num_threads(1)
    steps = pd.read_parquet(f"{args.dataset}/steps_cpu.parquet")
    hardware = step_hardware(steps, args.dataset)[(1, 1)]
    one = next(c for c in step_grid() if c.model.get("name") == "moe-small" and c.world_size == 1
               and c.strategy.get("moe_capacity_factor") is None)
    ctx = M.ParallelContext()  # one process: no tensor or pipeline split
    cases = {}
    for label, factor in (("MoE dropless", None), ("MoE capacity 1.0", 1.0), ("MoE capacity 2.0", 2.0)):
        cfg = replace(one, strategy={} if factor is None else {"moe_capacity_factor": factor})
        run = RunSpec.from_dict(run_dict(cfg, hardware))
        torch.manual_seed(0)
        cases[label] = (M.MoEFeedForward(run.model, ctx, factor), run, True)
    moe_model = cases["MoE dropless"][1].model
    width = moe_model.moe_top_k * moe_model.ffn_hidden_size
    dense_dict = dict(run_dict(one, hardware))
    dense_dict["model"] = {k: v for k, v in dense_dict["model"].items() if k not in ("num_experts", "moe_top_k")}
    dense_dict["model"].update(arch="llama", name="dense-ffn", ffn_hidden_size=width)
    dense_run = RunSpec.from_dict(dense_dict)
    cases[f"dense, width k*ffn = {width}"] = (M.FeedForward(dense_run.model, ctx, width), dense_run, False)
    mbs = one.strategy.get("micro_batch_size", 1)
    x0 = torch.randn(mbs, moe_model.seq_length, moe_model.hidden_size)
    for mod, _, _ in cases.values():
        for p in mod.parameters():
            torch.nn.init.normal_(p, std=0.02)
    best = {label: float("inf") for label in cases}
    for _ in range(args.rounds):
        for label, (mod, _, _) in cases.items():
            calls = []
            for _ in range(args.repeats):
                x = x0.clone().requires_grad_(True)
                t0 = time.perf_counter()
                mod(x).sum().backward()
                calls.append(time.perf_counter() - t0)
                mod.zero_grad(set_to_none=True)
            best[label] = min(best[label], statistics.median(calls) * 1e3)
    cost = RooflineCost(cases["MoE dropless"][1].hardware)
    print("| feed-forward block, forward + backward | measured ms | simulator ms | simulator ops |")
    print("|---|---:|---:|---:|")
    for label, (_, run, moe) in cases.items():
        fwd, bwd = _block_ops(run, moe)
        sim = sum(cost.compute_time_s(o) for o in fwd + bwd) * 1e3
        print(f"| {label} | {best[label]:.2f} | {sim:.2f} | {len(fwd) + len(bwd)} |")


if __name__ == "__main__":
    main()
