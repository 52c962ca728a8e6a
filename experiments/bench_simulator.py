"""Speed of the simulator on this machine.

1. The largest SC21 run (1T parameters, 3072 A100s, tp=8, pp=64, 512 micro-batches per pipeline):
   wall time of one simulation (target < 1 s).
2. 1,000 typical runs (catalog GPT/Llama/MoE models on DGX A100/H100 clusters of 8-1024 GPUs, valid
   tp/pp/dp/micro-batch/recompute combinations drawn with a fixed seed): total wall time (target < 30 s).

Usage: ``python experiments/bench_simulator.py``
"""

from __future__ import annotations

import random
import sys
import time

from learnedperf.errors import SpecError
from learnedperf.measure.public import load_sc21
from learnedperf.simulate import simulate
from learnedperf.specs import RunSpec

MODELS = ["gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b",
          "llama3-70b", "mixtral-8x7b", "bert-large"]
CLUSTERS = ["dgx-a100", "dgx-h100"]


def typical_runs(n: int, seed: int = 0) -> list[RunSpec]:
    """``n`` valid runs drawn deterministically."""
    rng = random.Random(seed)
    out: list[RunSpec] = []
    while len(out) < n:
        devices = rng.choice([8, 16, 64, 256, 1024])
        tp = rng.choice([1, 2, 4, 8])
        pp = rng.choice([1, 2, 4, 8])
        if tp * pp > devices:
            continue
        dp = devices // (tp * pp)
        mbs = rng.choice([1, 2, 4])
        strategy = {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": mbs,
                    "global_batch_size": mbs * dp * rng.choice([1, 4, 8, 16, 32]),
                    "recompute": rng.choice(["none", "selective", "full"]),
                    "sequence_parallel": tp > 1 and rng.random() < 0.5,
                    "zero_stage": rng.choice([0, 1, 2, 3])}
        model = rng.choice(MODELS)
        if model.startswith("mixtral") and rng.random() < 0.5 and dp % 8 == 0:
            strategy["ep"] = 8
        try:
            out.append(RunSpec.from_dict({"model": model, "hardware": {"cluster": rng.choice(CLUSTERS),
                                                                       "num_devices": devices},
                                          "strategy": strategy}))
        except SpecError:
            continue
    return out


def main() -> int:
    big = [r for r in load_sc21() if r.run["hardware"]["num_devices"] == 3072][0]
    spec = RunSpec.from_dict(big.run)
    simulate(spec)  # warm caches (catalog, parameters)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        res = simulate(spec)
        times.append(time.perf_counter() - t0)
    print(f"SC21 1T run (3072 GPUs, pp=64, {spec.num_microbatches} micro-batches): {min(times) * 1e3:.0f} ms "
          f"per simulation (best of 3), {res.num_events} events, extrapolated={res.extrapolated}")
    t0 = time.perf_counter()
    runs = typical_runs(1000)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in runs:
        simulate(r)
    dt = time.perf_counter() - t0
    print(f"1,000 typical runs: {dt:.1f} s ({1000 / dt:.0f} runs/s; validation of the specs took "
          f"{t_build:.1f} s more)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
