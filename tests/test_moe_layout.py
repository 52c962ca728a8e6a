"""MoE layouts beyond Mixtral's: shared experts, leading dense layers and dense layers of their own width
(DeepSeek-MoE, Qwen1.5/2-MoE), checked against closed forms of the parameters, FLOPs and bytes they add."""

from __future__ import annotations

import pytest

from conftest import MOE, make_run
from learnedperf.errors import SpecError
from learnedperf.graph.execution import chunk_layout, compile_run
from learnedperf.graph.transformer import operator_graph
from learnedperf.measure.published import megatron_flops
from learnedperf.simulate.memory import layer_activation_bytes
from learnedperf.specs import ModelSpec, RunSpec

GEMM_KINDS = ("matmul",)
# a DeepSeek-MoE-like layout on MOE's shape: two shared experts of the expert width, one leading dense layer
# of a wider MLP (DeepSeek-MoE 16B: 2 x 1408 shared, first_k_dense_replace 1, dense intermediate 10944)
SHARED = dict(MOE, num_layers=8, ffn_hidden_size=1408, moe_shared_ffn_hidden_size=2 * 1408,
              moe_first_dense_layers=1, dense_ffn_hidden_size=10944)


def gemm_flops(g, phases=("fwd", "bwd")) -> float:
    return sum(op.flops * r for op, r in zip(g.ops, g.repeat) if op.kind in GEMM_KINDS and op.phase in phases)


def spec(**kw) -> ModelSpec:
    return ModelSpec.parse(dict(SHARED, **kw))


def test_parameters_add_the_shared_experts_and_the_dense_layers_widths():
    m, base = spec(), spec(moe_shared_ffn_hidden_size=0, moe_first_dense_layers=0, dense_ffn_hidden_size=1408)
    h, mats = m.hidden_size, 3  # SwiGLU: gate, up and down matrices
    # 7 MoE layers gain the shared MLP; the first layer is a dense MLP of 10,944 instead of a MoE layer
    moe_layer = base.layer_params(True)
    dense_layer = moe_layer - 8 * mats * h * 1408 - h * 8 + mats * h * 10944  # experts and router out, MLP in
    expected = base.num_params() + 7 * mats * h * 2816 - moe_layer + dense_layer
    assert m.num_params() == expected
    # every token runs top-2 experts and the shared MLP in a MoE layer, the whole dense layer in the first
    active = base.num_active_params() + 7 * mats * h * 2816 - (moe_layer - 6 * mats * h * 1408) + dense_layer
    assert m.num_active_params() == active
    assert m.num_moe_layers == 7


@pytest.mark.parametrize("first, freq, layers, expected", [
    (0, 1, 8, [1] * 8), (1, 1, 8, [0] + [1] * 7), (0, 2, 8, [0, 1] * 4), (1, 2, 7, [0, 0, 1, 0, 1, 0, 1]),
    (3, 1, 6, [0, 0, 0, 1, 1, 1])])
def test_moe_layers_in_counts_each_layer_once(first, freq, layers, expected):
    m = spec(num_layers=layers, moe_first_dense_layers=first, moe_layer_frequency=freq)
    assert [m.moe_layers_in(i, 1) for i in range(layers)] == expected
    assert m.moe_layers_in(0, layers) == m.num_moe_layers == sum(expected)
    assert m.moe_layers_in(2, 3) == sum(expected[2:5])


def test_shared_experts_are_a_tensor_parallel_mlp_over_the_local_tokens():
    run = make_run(SHARED, num_devices=4, tp=2, dp=2, micro_batch_size=2, global_batch_size=4)
    eg = compile_run(run)
    ops = {op.name: op for blk, _ in eg.stages[0].chunks[0].forward for op in blk}
    T, h = 2 * SHARED["seq_length"], SHARED["hidden_size"]
    assert ops["moe_layer.moe.shared.fc1"].shape == (1, T, 2 * 2816 // 2, h)
    assert ops["moe_layer.moe.shared.fc2"].shape == (1, T, h, 2816 // 2)
    assert ops["layer.mlp.fc1"].shape == (1, T, 2 * 10944 // 2, h)  # the dense layer's own width


def test_model_flops_add_six_flops_per_shared_and_dense_parameter_per_token():
    with_shared = operator_graph(spec())
    plain = operator_graph(spec(moe_shared_ffn_hidden_size=0, dense_ffn_hidden_size=1408))
    h, s = SHARED["hidden_size"], SHARED["seq_length"]
    # forward 2 FLOPs per weight per token, backward 4: 7 shared MLPs of 2,816 and one MLP 10,944 - 1,408 wider
    extra = 6 * s * 3 * h * (7 * 2816 + (10944 - 1408))
    assert gemm_flops(with_shared) - gemm_flops(plain) == pytest.approx(extra, rel=1e-12)


def test_chunks_hold_every_parameter_and_experts_alone_are_split_over_ep():
    m = ModelSpec.parse(SHARED)
    whole = chunk_layout(make_run(SHARED, num_devices=1))
    assert sum(c.dense_params + c.expert_params for c in whole) == pytest.approx(m.num_params(), rel=1e-12)
    run = make_run(SHARED, num_devices=8, pp=2, dp=4, ep=4, global_batch_size=8)
    layout = chunk_layout(run)
    assert [(c.num_dense, c.num_moe) for c in layout] == [(1, 3), (0, 4)]
    mats, h = 3, SHARED["hidden_size"]
    # each ep rank keeps 8 / 4 routed experts; shared experts stay with the replicated (dense) parameters
    assert layout[1].expert_params == 4 * 2 * mats * h * 1408
    router_and_shared = h * 8 + mats * h * 2816
    attn_norms = m.layer_params(True) - 8 * mats * h * 1408 - router_and_shared
    head = SHARED["vocab_size"] * h + h  # the last stage's untied LM head and final norm
    assert layout[1].dense_params == pytest.approx(4 * (attn_norms + router_and_shared) + head, rel=1e-12)


def test_activation_width_is_top_k_experts_plus_shared_ones():
    # a token of an all-MoE model passes through k experts and the shared MLP: the activations it saves are
    # those of a dense SwiGLU layer of that total width, plus the routing's: the k permuted copies the experts'
    # FC1 reads and the k expert outputs the combine weights multiply (bf16 rows of h), the router's fp32 softmax
    moe = dict(SHARED, moe_first_dense_layers=0, dense_ffn_hidden_size=1408)
    dense = {k: v for k, v in moe.items() if k not in ("num_experts", "moe_top_k", "moe_shared_ffn_hidden_size",
                                                       "moe_first_dense_layers", "dense_ffn_hidden_size")}
    dense.update(arch="llama", ffn_hidden_size=2 * 1408 + 2816)
    kw = dict(num_devices=1, micro_batch_size=2, global_batch_size=2)
    T, k, h, E = 2 * moe["seq_length"], moe["moe_top_k"], moe["hidden_size"], moe["num_experts"]
    routing = 2 * T * k * h * 2 + T * E * 4
    assert layer_activation_bytes(make_run(moe, **kw)) == layer_activation_bytes(make_run(dense, **kw)) + routing


def test_megatron_flops_count_top_k_and_shared_widths():
    moe = spec(moe_first_dense_layers=0, dense_ffn_hidden_size=1408)
    dense = ModelSpec.parse({"arch": "llama", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
                             "num_kv_heads": 4, "ffn_hidden_size": 2 * 1408 + 2816, "vocab_size": 32000,
                             "seq_length": 2048})
    assert megatron_flops(moe, 16, False) == megatron_flops(dense, 16, False)
    # one leading dense layer of 10,944 in place of a MoE layer's 5,632
    mixed = spec(dense_ffn_hidden_size=10944)
    delta = (4 - 1) * 2 * 3 * 2048 * (10944 - 2 * 1408 - 2816) * 2048 * 16  # fwd + bwd, recompute not counted
    assert megatron_flops(mixed, 16, False) - megatron_flops(moe, 16, False) == pytest.approx(delta, rel=1e-12)


def test_layout_fields_serialise_only_when_set():
    plain = ModelSpec.parse(MOE).to_dict()
    for key in ("moe_shared_ffn_hidden_size", "moe_first_dense_layers", "dense_ffn_hidden_size"):
        assert key not in plain
    m = ModelSpec.parse(SHARED)
    assert ModelSpec.parse(m.to_dict()) == m
    assert m.to_dict()["moe_shared_ffn_hidden_size"] == 2816
    run = make_run(SHARED, num_devices=1)
    assert RunSpec.from_dict(run.to_dict()) == run
    assert "dense_ffn_hidden_size" not in make_run(MOE, num_devices=1).to_dict()["model"]


@pytest.mark.parametrize("model, field", [
    (dict(MOE, arch="llama", num_experts=1, moe_top_k=1, moe_shared_ffn_hidden_size=1024), "model.moe_shared_ffn_hidden_size"),
    (dict(MOE, arch="llama", num_experts=1, moe_top_k=1, moe_first_dense_layers=1), "model.moe_first_dense_layers"),
    (dict(MOE, arch="llama", num_experts=1, moe_top_k=1, dense_ffn_hidden_size=1024), "model.dense_ffn_hidden_size"),
    (dict(MOE, moe_first_dense_layers=4), "model.moe_first_dense_layers"),
    (dict(MOE, moe_first_dense_layers=2, moe_layer_frequency=3), "model.moe_first_dense_layers"),
    (dict(MOE, moe_shared_ffn_hidden_size=-1), "model.moe_shared_ffn_hidden_size")])
def test_impossible_layouts_name_the_field(model, field):
    with pytest.raises(SpecError) as err:
        make_run(model, num_devices=1)
    assert err.value.field == field


def test_tensor_parallelism_must_divide_every_mlp_width():
    with pytest.raises(SpecError, match="moe_shared_ffn_hidden_size=1000") as err:
        make_run(dict(SHARED, moe_shared_ffn_hidden_size=1000), num_devices=16, tp=16)
    assert err.value.field == "strategy.tp"


# the text_config of meta-llama/Llama-4-Scout-17B-16E's config.json (the keys that shape the model)
LLAMA4_SCOUT_TEXT = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                     "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                     "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 16, "num_experts_per_tok": 1,
                     "interleave_moe_layer_step": 1, "vocab_size": 202048, "max_position_embeddings": 10485760,
                     "attention_chunk_size": 8192, "hidden_act": "silu", "tie_word_embeddings": False}
LLAMA4_SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                "text_config": LLAMA4_SCOUT_TEXT}
# Llama-4-Maverick-17B-128E: 128 experts in every other layer, dense MLPs of 16,384 between them
LLAMA4_MAVERICK = dict(LLAMA4_SCOUT, text_config=dict(LLAMA4_SCOUT_TEXT, num_local_experts=128,
                                                      interleave_moe_layer_step=2, max_position_embeddings=1048576))


@pytest.mark.parametrize("config, total_B, active_B, moe_layers", [
    (LLAMA4_SCOUT, 109, 17, 48), (LLAMA4_MAVERICK, 400, 17, 24)])
def test_llama4_configs_count_the_reported_parameters(config, total_B, active_B, moe_layers):
    # Meta's model cards: Scout 17B active of 109B, Maverick 17B active of 400B, both with their vision encoder,
    # which the run format leaves out (hence the 2 % tolerance)
    m = ModelSpec.from_hf_config(config, 8192)
    assert m.num_params() / 1e9 == pytest.approx(total_B, rel=0.02)
    assert m.num_active_params() / 1e9 == pytest.approx(active_B, rel=0.02)
    assert m.num_moe_layers == moe_layers
    assert m.moe_shared_ffn_hidden_size == m.ffn_hidden_size == 8192
    # a text-only config (Llama4ForCausalLM) reads the same
    text = {k: v for k, v in config["text_config"].items() if k != "model_type"}
    alone = ModelSpec.from_hf_config(dict(text, architectures=["Llama4ForCausalLM"]), 8192)
    assert alone.model_copy(update={"name": m.name}) == m


@pytest.mark.parametrize("text, seq, field", [
    ({}, None, "attention_chunk_size"),  # 10M positions: chunked attention is not modelled
    ({"moe_layers": [0, 2]}, 4096, "moe_layers"),
    ({"num_local_experts": None}, 4096, "num_local_experts")])
def test_llama4_config_errors_name_the_key_under_text_config(text, seq, field):
    config = dict(LLAMA4_SCOUT, text_config={k: v for k, v in dict(LLAMA4_SCOUT_TEXT, **text).items()
                                             if v is not None})
    with pytest.raises(SpecError) as err:
        ModelSpec.from_hf_config(config, seq)
    assert err.value.field == f"model.hf_config.text_config.{field}"
    with pytest.raises(SpecError) as err:
        ModelSpec.from_hf_config({"model_type": "llama4"}, 4096)
    assert err.value.field == "model.hf_config.text_config"
