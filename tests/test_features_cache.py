"""The fast tier's per-shard cache of layer costs (:func:`learnedperf.features.run.layer_cost`)."""

from __future__ import annotations

from conftest import MOE, make_run
from learnedperf.features.run import RunContext, layer_cost


def test_layer_costs_are_cached_per_kernel_layout():
    # runs of one (model, hardware) that differ only in how their kernels are launched (experts one at a time
    # cost the host a launch each, with the shipped host_dispatch_us) must not share an entry: each run's costs
    # through a context shared with the other are those of a context of its own
    grouped = make_run(MOE, precision="bf16")
    loop = make_run(MOE, precision="bf16", moe_grouped_gemm=False)
    shared = RunContext(grouped.model, grouped.hardware)
    first, second = layer_cost(grouped, shared), layer_cost(loop, shared)
    assert second == layer_cost(loop, RunContext(loop.model, loop.hardware))
    assert first == layer_cost(grouped, RunContext(grouped.model, grouped.hardware))
    assert first != second
