"""The fast tier's per-shard cache of layer costs (:func:`learnedperf.features.run.layer_cost`)."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import MOE, make_run
from learnedperf.features.run import RunContext, layer_cost
from learnedperf.graph.ops import Group
from learnedperf.graph.transformer import SHARD_STRATEGY_KEYS, shard_for


def test_the_cache_key_names_every_strategy_attribute_a_shard_is_built_from():
    # the cache keys on SHARD_STRATEGY_KEYS: shard_for must read those and no other (a strategy that logs reads)
    run = make_run(MOE, precision="bf16", mixed_precision="autocast", moe_capacity_factor=1.25)
    read = []

    class Logged:
        def __getattr__(self, name):
            read.append(name)
            return getattr(run.strategy, name)

    shard = shard_for(SimpleNamespace(strategy=Logged(), model=run.model), Group(1, 1), Group(1, 1), Group(1, 1))
    assert set(read) == set(SHARD_STRATEGY_KEYS)
    assert shard == shard_for(run, Group(1, 1), Group(1, 1), Group(1, 1))


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
