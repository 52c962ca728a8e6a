"""Where the simulator misses vTrain's pipelined runs: its bias by pipeline depth, micro-batches and layers.

    python experiments/vtrain_pipeline_bias.py

vTrain's 1,440 measured Megatron-DeepSpeed runs on one A100 node (``shared/data/vtrain``) are simulated with the
shipped constants; the table gives the mean log(predicted / measured) (negative: the simulator is fast) and the
MAPE of each group: by pipeline depth and tensor-parallel size, then for the pipelined runs by the number of
micro-batches each pipeline runs (``global batch / (micro batch · dp)``) and by the layers each stage holds.
A miss that grows with the micro-batches and shrinks with the layers per stage is a cost paid per micro-batch
and stage that the simulator does not charge (a transfer or a scheduling step between stages), not one per layer.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict


def main() -> int:
    from learnedperf.cost import RooflineCost, default_params
    from learnedperf.measure.public import load_vtrain
    from learnedperf.simulate import simulate
    from learnedperf.specs import RunSpec

    params = default_params()
    rows = []
    for r in load_vtrain():
        spec = RunSpec.from_dict(r.run)
        s = spec.strategy
        sim_ms = simulate(spec, cost=RooflineCost(spec.hardware, params)).iteration_time_s * 1e3
        rows.append({"tp": s.tp, "pp": s.pp, "m": s.global_batch_size // (s.micro_batch_size * s.dp),
                     "layers_per_stage": spec.model.num_layers // s.pp, "log": math.log(sim_ms / r.iteration_time_ms)})

    def table(title: str, key, subset) -> None:
        groups: dict = defaultdict(list)
        for row in subset:
            groups[key(row)].append(row["log"])
        print(f"\n{title}")
        print(f"  {'group':<26} {'n':>5} {'mean log':>9} {'MAPE %':>7}")
        for k in sorted(groups):
            logs = groups[k]
            mape = 100 * sum(abs(math.exp(v) - 1) for v in logs) / len(logs)
            print(f"  {str(k):<26} {len(logs):>5} {sum(logs) / len(logs):+9.3f} {mape:7.1f}")

    print(f"vTrain, {len(rows)} runs, simulator with the shipped constants")
    table("by pipeline depth", lambda r: f"pp {r['pp']}", rows)
    table("by pipeline depth and tensor-parallel size", lambda r: f"pp {r['pp']}, tp {r['tp']}", rows)
    piped = [r for r in rows if r["pp"] > 1]
    table("pipelined runs, by micro-batches per pipeline", lambda r: f"pp {r['pp']}, {r['m']:>2} micro-batches", piped)
    table("pipelined runs, by layers per stage", lambda r: f"pp {r['pp']}, {r['layers_per_stage']:>2} layers/stage",
          piped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
