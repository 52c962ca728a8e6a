"""A host that runs ahead across blocks against the simulator's per-block host bound, on vTrain's runs.

The simulator bounds each block of kernels issued back to back (a layer's forward or backward, the embedding,
the head) by ``max(Σ kernel times, kernels × host_dispatch_us)`` (:func:`learnedperf.cost.host_bound_s`): a
host-bound block cannot spend the lead that a device-bound block before it gave the host. This script compares
that bound with a fluid two-stage pipeline over a rank's whole sequence: every micro-batch's forward and backward
blocks in order, the host clock advancing by kernels × dispatch, the device by the block's kernels and its
tensor-parallel collectives (α-β time of the cost model), each block ending at the later of the two; the
optimizer step is added to both. Both are refitted on the same grid of tensor-core GEMM efficiency and dispatch
(every 4th run) and scored on vTrain's 720 runs without pipeline parallelism (no pipeline bubble or p2p waits to
model), with the mean log(predicted / measured) per (tp, micro-batch). The data-parallel gradient all-reduce is
left out of both.

    python experiments/host_timeline.py
"""

from __future__ import annotations

import collections
import math
from dataclasses import replace

from learnedperf.cost import RooflineCost, default_params
from learnedperf.graph.execution import compile_run
from learnedperf.measure.public import load_vtrain
from learnedperf.simulate.simulator import _block_cost
from learnedperf.specs import RunSpec

EFFICIENCIES = (0.7, 0.75, 0.8, 0.85)
DISPATCH_US = (60, 65, 70, 75, 80, 85, 90)


def blocks(eg, cost) -> tuple[list, list]:
    """Forward and backward blocks of the first chunk: (kernel seconds, kernels, collective seconds, repeats), the
    kernels and collectives as the simulator costs a block (:func:`learnedperf.simulate.simulator._block_cost`)."""
    chunk = eg.stages[0].chunks[0]
    intra, inter = cost.link_bandwidth_Bps("intra"), cost.link_bandwidth_Bps("inter")
    out = []
    for part in (chunk.forward, chunk.backward):
        seq = []
        for ops, rep in part:
            dev, kernels, _phases, comms = _block_cost(ops, cost, False)
            comm_s = sum(lat + b_intra / intra + (b_inter / inter if b_inter else 0.0)
                         for _hidden, lat, b_intra, b_inter in comms)
            seq.append((dev, kernels, comm_s, rep))
        out.append(seq)
    return out[0], out[1]


def ratios(runs, eff: float, dispatch_us: float, model: str) -> list[float]:
    """predicted / measured of every run under ``model`` ("block" or "timeline")."""
    p = replace(default_params(), gemm_efficiency_tensor=eff, host_dispatch_us=dispatch_us)
    h = dispatch_us * 1e-6
    out = []
    for spec, measured_ms in runs:
        cost = RooflineCost(spec.hardware, p)
        eg = compile_run(spec)
        fwd, bwd = blocks(eg, cost)
        opt = sum(cost.compute_time_s(o) for o in eg.stages[0].optimizer)
        if model == "block":
            t = eg.num_microbatches * sum((max(d, n * h) + c) * r for seq in (fwd, bwd) for d, n, c, r in seq)
        else:
            host = device = 0.0
            for _ in range(eg.num_microbatches):
                for seq in (fwd, bwd):
                    for d, n, c, r in seq:
                        host += n * h * r
                        device = max(device + (d + c) * r, host)
            t = device
        out.append((t + opt) * 1e3 / measured_ms)
    return out


def mape(r: list[float]) -> float:
    """Mean absolute percentage error of predicted / measured ratios."""
    return 100.0 * sum(abs(x - 1.0) for x in r) / len(r)


def main() -> int:
    """Fit both models on every 4th run and print their MAPE and bias per (tp, micro-batch)."""
    runs = [(RunSpec.from_dict(r.run), r.iteration_time_ms) for r in load_vtrain()]
    runs = [x for x in runs if x[0].strategy.pp == 1]
    fit = runs[::4]
    print(f"vTrain runs without pipeline parallelism: {len(runs)}; fitted on every 4th ({len(fit)})")
    for model in ("block", "timeline"):
        best = min((mape(ratios(fit, e, h, model)), e, h) for e in EFFICIENCIES for h in DISPATCH_US)
        r = ratios(runs, best[1], best[2], model)
        by = collections.defaultdict(list)
        for (spec, _), x in zip(runs, r):
            by[(spec.strategy.tp, spec.strategy.micro_batch_size)].append(math.log(x))
        print(f"{model:<9} efficiency {best[1]:g}, dispatch {best[2]} us: fit {best[0]:.2f} %, all {mape(r):.2f} %")
        print("  mean log(predicted/measured) by tp, micro-batch: "
              + " ".join(f"tp{k[0]},mb{k[1]} {sum(v) / len(v):+.3f}" for k, v in sorted(by.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
