"""The fast tier's per-shard cache of layer costs (:func:`learnedperf.features.run.layer_cost`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import LLAMA_GQA, MOE, make_run
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


@pytest.mark.parametrize("model,key", [(MOE, "moe_grouped_gemm"), (LLAMA_GQA, "fused_elementwise")])
def test_layer_costs_are_cached_per_kernel_layout(model, key):
    # runs of one (model, hardware) that differ only in how their kernels are launched (experts one at a time
    # cost the host a launch each, with the shipped host_dispatch_us; eager chains move more bytes and issue more
    # kernels) must not share an entry: each run's costs through a context shared with the other are those of a
    # context of its own
    plain = make_run(model, precision="bf16")
    other = make_run(model, precision="bf16", **{key: False})
    shared = RunContext(plain.model, plain.hardware)
    first, second = layer_cost(plain, shared), layer_cost(other, shared)
    assert second == layer_cost(other, RunContext(other.model, other.hardware))
    assert first == layer_cost(plain, RunContext(plain.model, plain.hardware))
    assert first != second
