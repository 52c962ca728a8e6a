"""What the cost model's kernel floor does to the simulator, by model size, tensor parallelism and GPU.

``kernel_floor_us`` (``learnedperf/cost/data/params.json``) is the shortest time a kernel occupies the stream in
a training step: the framework's per-operator host dispatch, which small kernels cannot hide. It is applied per
kernel, ``max(t, floor)``, as if the host never ran ahead of the GPU. Until 2026-11-28 it was fitted by
``experiments/calibrate_steps.py`` (70 µs); the shipped constants now time the host as running ahead instead
(``host_dispatch_us``, ``experiments/host_pipeline.py``) with the floor at 0, and the floors given here are added
on top of that. This script prints, for the shipped constants
and for each ``--floor-us`` given, the simulator's iteration time against the measured one:

* vTrain's 1,440 single-node A100 runs, median predicted / measured per (TP, hidden size): small models on
  many ranks are dominated by the floor;
* SC21's 10 runs on 32-3072 A100s (held out of the learned models), per run;
* and, with nothing measured, how much the floor adds to a few 64-GPU runs on A100 and H100 nodes
  (``x`` = time with the floor / time without): a per-kernel floor fitted on A100 steps weighs more on a
  GPU whose kernels are shorter.

    python experiments/kernel_floor.py [--floor-us 0,40,70]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import replace


def main(argv=None) -> int:
    """Simulate the measured runs with each floor and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--floor-us", default="0,40", help="other kernel floors to compare with the shipped one (µs)")
    args = ap.parse_args(argv)
    try:
        extra = [float(x) for x in args.floor_us.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--floor-us {args.floor_us!r}: expected comma-separated numbers")
    if any(f < 0 for f in extra):
        ap.error("--floor-us: expected numbers >= 0")

    from learnedperf.cost import RooflineCost, default_params
    from learnedperf.errors import LearnedPerfError
    from learnedperf.measure.public import load_sc21, load_vtrain
    from learnedperf.simulate import simulate
    from learnedperf.specs import RunSpec

    base = default_params()
    floors = [base.kernel_floor_us] + [f for f in extra if f != base.kernel_floor_us]
    try:
        vtrain = [(RunSpec.from_dict(r.run), r.iteration_time_ms) for r in load_vtrain()]
        sc21 = [(RunSpec.from_dict(r.run), r.iteration_time_ms) for r in load_sc21()]
    except LearnedPerfError as exc:
        print(f"kernel_floor: error: {exc}", file=sys.stderr)
        return 1

    def sim_ms(spec, floor: float) -> float:
        return simulate(spec, cost=RooflineCost(spec.hardware, replace(base, kernel_floor_us=floor))).iteration_time_s * 1e3

    label = " ".join(f"{f:>6.0f} us" for f in floors)
    print(f"kernel floors compared (the shipped one first): {label}")
    print("\nvTrain, 1,440 runs on one node of A100s: median simulated / measured per (tp, hidden size)")
    groups: dict = defaultdict(list)
    for spec, ms in vtrain:
        groups[(spec.strategy.tp, spec.model.hidden_size)].append((spec, ms))
    print(f"{'tp':>3} {'hidden':>6} {'runs':>5}  " + " ".join(f"{f:>9.0f}" for f in floors))
    mape = {f: [] for f in floors}
    for (tp, h), runs in sorted(groups.items()):
        cells = []
        for f in floors:
            ratios = [sim_ms(spec, f) / ms for spec, ms in runs]
            mape[f] += [abs(r - 1) for r in ratios]
            cells.append(f"{statistics.median(ratios):>9.2f}")
        print(f"{tp:>3} {h:>6} {len(runs):>5}  " + " ".join(cells))
    print("MAPE %         " + " ".join(f"{100 * statistics.fmean(mape[f]):>9.1f}" for f in floors))

    print("\nSC21, simulated / measured per run")
    print(f"{'GPUs':>5} {'tp':>3} {'pp':>3} {'hidden':>6}  " + " ".join(f"{f:>9.0f}" for f in floors))
    mape = {f: [] for f in floors}
    for spec, ms in sc21:
        s = spec.strategy
        cells = []
        for f in floors:
            r = sim_ms(spec, f) / ms
            mape[f].append(abs(r - 1))
            cells.append(f"{r:>9.2f}")
        print(f"{spec.hardware.num_devices:>5} {s.tp:>3} {s.pp:>3} {spec.model.hidden_size:>6}  " + " ".join(cells))
    print("MAPE %                   " + " ".join(f"{100 * statistics.fmean(mape[f]):>9.1f}" for f in floors))

    print("\nNothing measured: simulated time with each floor / without one, 64 GPUs, bf16, selective recompute, "
          "sequence parallel, micro-batch 1, global batch 512")
    print(f"{'cluster':<10} {'model':<12} {'tp':>3} {'pp':>3}  " + " ".join(f"{f:>9.0f}" for f in floors))
    for cluster in ("selene", "dgx-h100"):
        for model, tp, pp in (("gpt3-13b", 8, 1), ("gpt3-13b", 4, 4), ("gpt3-13b", 1, 8), ("llama-2-70b", 8, 1),
                              ("llama-2-70b", 4, 4)):
            spec = RunSpec.from_dict({"model": model, "hardware": {"cluster": cluster, "num_devices": 64},
                                      "strategy": {"tp": tp, "pp": pp, "dp": 64 // tp // pp, "micro_batch_size": 1,
                                                   "global_batch_size": 512, "precision": "bf16",
                                                   "recompute": "selective", "sequence_parallel": tp > 1}})
            none = sim_ms(spec, 0.0)
            print(f"{cluster:<10} {model:<12} {tp:>3} {pp:>3}  " + " ".join(f"{sim_ms(spec, f) / none:>9.2f}"
                                                                             for f in floors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
