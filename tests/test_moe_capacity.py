"""Expert capacity (``moe_capacity_factor``): the busiest expert's rows set a MoE layer's pace. Checked against
closed forms: Megatron-Core's capacity ceil(tokens·k/E · factor) per expert, all-to-all volumes and saved
activations scaled by the factor, the model FLOPs (MFU's numerator) not."""

from __future__ import annotations

import math

import pytest

from conftest import MOE, make_run
from learnedperf.errors import SpecError
from learnedperf.features.run import RunContext, layer_cost
from learnedperf.graph.execution import compile_run
from learnedperf.simulate import simulate
from learnedperf.simulate.memory import layer_activation_bytes
from learnedperf.specs import RunSpec

MOE16 = dict(MOE, num_experts=16, moe_top_k=4)
DENSE = {"name": "dense", "arch": "llama", "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16,
         "num_kv_heads": 4, "ffn_hidden_size": 5632, "vocab_size": 32000, "seq_length": 2048}


def _forward_ops(run: RunSpec) -> dict:
    eg = compile_run(run, 1)
    return {op.name: op for blk, _ in eg.stages[0].chunks[0].forward for op in blk if op.name.startswith("moe_layer")}


@pytest.mark.parametrize("factor", [1.25, 2.0, 0.5])
def test_expert_gemms_take_the_capacity_rows(factor):
    # 16 experts over ep 4: 4 local experts; a rank routes T·k = 2·2048·4 token copies
    base = make_run(MOE16, num_devices=4, ep=4, micro_batch_size=2, global_batch_size=8)
    capped = make_run(MOE16, num_devices=4, ep=4, micro_batch_size=2, global_batch_size=8,
                      moe_capacity_factor=factor)
    routed, local = 2 * 2048 * 4, 16 // 4
    rows = math.ceil(routed * factor / local)  # Megatron-Core's get_capacity per expert
    a, b = _forward_ops(base), _forward_ops(capped)
    for name in ("moe_layer.mlp.fc1", "moe_layer.mlp.fc2", "moe_layer.mlp.act"):
        assert b[name].flops / a[name].flops == pytest.approx(rows / (routed // local), rel=1e-12)
    # the router and the combine's weighted sum work on the rank's own tokens: unchanged
    for name in ("moe_layer.moe.router", "moe_layer.moe.weighted_sum"):
        assert b[name].flops == a[name].flops and b[name].bytes == a[name].bytes


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_alltoall_volumes_scale_by_the_factor(dispatcher):
    kw = dict(num_devices=16, ep=16, micro_batch_size=2, global_batch_size=32, moe_dispatcher=dispatcher)
    a = _forward_ops(make_run(MOE16, **kw))
    b = _forward_ops(make_run(MOE16, moe_capacity_factor=1.5, **kw))
    moved = [n for n in a if ".moe.dispatch" in n or ".moe.combine" in n]
    assert len(moved) == (2 if dispatcher == "alltoall" else 4)
    for name in moved:
        assert b[name].bytes == pytest.approx(1.5 * a[name].bytes, rel=1e-12)


def test_a_factor_of_one_is_balanced_routing():
    kw = dict(num_devices=4, ep=4, micro_batch_size=2, global_batch_size=8)
    plain, one = make_run(MOE16, **kw), make_run(MOE16, moe_capacity_factor=1.0, **kw)
    assert _forward_ops(plain) == _forward_ops(one)
    assert simulate(plain).iteration_time_s == simulate(one).iteration_time_s
    # unset, the key stays out of the run format (runs written before it existed hash as they did)
    assert "moe_capacity_factor" not in plain.to_dict()["strategy"]
    assert one.to_dict()["strategy"]["moe_capacity_factor"] == 1.0
    assert RunSpec.from_dict(one.to_dict()) == one


def test_saved_activations_grow_with_the_expert_rows():
    kw = dict(num_devices=2, tp=2, micro_batch_size=2, global_batch_size=2)
    a = layer_activation_bytes(make_run(MOE, **kw))
    b = layer_activation_bytes(make_run(MOE, moe_capacity_factor=1.5, **kw))
    # per expert row: the SwiGLU input (gate and up, 2 bf16 values a column) and the FC2 input, sharded over tp,
    # and the FC1 input (the permuted row, whole on each tp rank); every layer of MOE is a MoE layer
    T, f, k, e, tp, h = 2 * 2048, MOE["ffn_hidden_size"], MOE["moe_top_k"], 2, 2, MOE["hidden_size"]
    assert b - a == pytest.approx(0.5 * T * k * (f * (2 * e + e) / tp + h * e), rel=1e-12)


def test_iteration_slower_model_flops_unchanged():
    kw = dict(num_devices=8, ep=8, micro_batch_size=1, global_batch_size=16)
    results = [simulate(make_run(MOE16, moe_capacity_factor=c, **kw)) for c in (None, 1.25, 2.0)]
    times = [r.iteration_time_s for r in results]
    assert times[0] < times[1] < times[2]
    # padded rows are not model FLOPs: achieved model FLOP/s fall as the time grows
    assert results[1].model_flops == results[0].model_flops == results[2].model_flops
    mfu = [r.to_prediction()["mfu"] for r in results]
    assert mfu[2] == pytest.approx(mfu[0] * times[0] / times[2], rel=1e-9)


def test_analytic_layer_costs_are_cached_per_factor():
    # one context serves a planner's strategies: a cached layer cost must not answer for another factor
    kw = dict(num_devices=4, ep=4, micro_batch_size=2, global_batch_size=8)
    plain, capped = make_run(MOE16, **kw), make_run(MOE16, moe_capacity_factor=2.0, **kw)
    ctx = RunContext(plain.model, plain.hardware)
    moe_plain = layer_cost(plain, ctx)[3]
    moe_capped = layer_cost(capped, ctx)[3]
    assert moe_capped > 1.5 * moe_plain
    assert layer_cost(capped, RunContext(capped.model, capped.hardware))[3] == moe_capped


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), 2000.0, "big"])
def test_bad_factors_are_refused_by_name(value):
    with pytest.raises(SpecError) as err:
        make_run(MOE16, num_devices=1, moe_capacity_factor=value)
    assert err.value.field == "strategy.moe_capacity_factor"


def test_a_dense_model_has_no_capacity():
    with pytest.raises(SpecError) as err:
        make_run(DENSE, num_devices=1, moe_capacity_factor=1.25)
    assert err.value.field == "strategy.moe_capacity_factor" and "no experts" in str(err.value)
