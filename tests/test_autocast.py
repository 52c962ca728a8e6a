"""torch.autocast mixed precision (``strategy.mixed_precision = "autocast"``): spec, graph, memory, features.

Closed forms: under autocast every GEMM weight is cast fp32 → bf16 once per forward (4 + 2 bytes
per element) and its gradient back (2 + 4); model states are fp32 weights and gradients plus two
fp32 Adam moments, 16 bytes per parameter with no master copy (PyTorch AMP keeps the model in
fp32), against 18 for Megatron's bf16 recipe (test_memory).
"""

from __future__ import annotations

import json

import pytest

from conftest import GPT_SMALL, LLAMA_GQA, make_run
from learnedperf.errors import SpecError
from learnedperf.graph.execution import compile_run
from learnedperf.graph.transformer import Shard, backward_of, layer_forward, optimizer_ops
from learnedperf.simulate import simulate
from learnedperf.simulate.memory import peak_memory, peak_memory_of
from learnedperf.specs import RunSpec


def _casts(ops, suffix=".weight.cast"):
    return [op for op in ops if op.name.endswith(suffix)]


def test_autocast_needs_a_low_precision():
    with pytest.raises(SpecError, match="mixed_precision"):
        make_run(GPT_SMALL, precision="fp32", mixed_precision="autocast")
    with pytest.raises(SpecError, match="mixed_precision"):
        make_run(GPT_SMALL, mixed_precision="amp")
    run = make_run(GPT_SMALL, precision="fp16", mixed_precision="autocast")
    again = RunSpec.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again.strategy.mixed_precision == "autocast" and again == run


@pytest.mark.parametrize("model", [GPT_SMALL, LLAMA_GQA])
@pytest.mark.parametrize("tp", [1, 2])
def test_weight_casts_move_six_bytes_per_gemm_weight(model, tp):
    run = make_run(model, num_devices=tp, tp=tp, mixed_precision="autocast")
    m = run.model
    h, f, hd = m.hidden_size, m.ffn_hidden_size, m.head_dim
    # GEMM weights of one layer on one TP rank, from the dimensions (Megatron column/row split)
    qkv = h * (m.num_attention_heads + 2 * m.num_kv_heads) * hd // tp
    mlp = (3 if m.activation == "swiglu" else 2) * h * f // tp
    weights = qkv + h * h // tp + mlp
    sh = Shard(b=1, s=m.seq_length, s_kv=m.seq_length, tp=tp, dtype="bf16", autocast=True)
    fwd = layer_forward(m, sh)
    casts = _casts(fwd)
    assert sum(op.bytes for op in casts) == pytest.approx(6 * weights, rel=1e-12)
    assert len(casts) == 4  # one per weight matrix: qkv, proj, fc1, fc2
    # the gradient is cast back with the same traffic, not the 2x of other memory-bound ops
    assert sum(op.bytes for op in _casts(backward_of(fwd), ".weight.cast.bwd")) == pytest.approx(6 * weights)
    # without autocast there is no cast at all
    assert not _casts(layer_forward(m, Shard(b=1, s=m.seq_length, s_kv=m.seq_length, tp=tp, dtype="bf16")), ".cast")


def test_autocast_norms_and_residual_run_in_fp32():
    m = make_run(GPT_SMALL).model
    T, h = m.seq_length, m.hidden_size
    native = {op.name: op for op in layer_forward(m, Shard(b=1, s=T, s_kv=T, dtype="bf16"))}
    auto = {op.name: op for op in layer_forward(m, Shard(b=1, s=T, s_kv=T, dtype="bf16", autocast=True))}
    for name in ("layer.attn.layernorm", "layer.mlp.residual"):
        assert auto[name].dtype == "fp32" and auto[name].bytes == pytest.approx(2 * native[name].bytes)
    # the GEMMs themselves are unchanged: same FLOPs, same bf16 operands
    assert auto["layer.mlp.fc1"] == native["layer.mlp.fc1"]
    # the QKV input comes from the fp32 norm: cast to bf16 (T·h elements, 4 + 2 bytes)
    assert auto["layer.attn.qkv.input.cast"].bytes == pytest.approx(6 * T * h)


def test_autocast_model_states_are_16_bytes_per_param():
    # fp32 weights (4) + fp32 gradients (4) + Adam m and v (8); no master copy
    run = make_run(LLAMA_GQA, num_devices=8, dp=8, mixed_precision="autocast")
    mem = peak_memory(compile_run(run))
    psi = run.model.num_params()
    assert mem.weights == pytest.approx(4 * psi, rel=1e-12)
    assert mem.gradients == pytest.approx(4 * psi, rel=1e-12)
    assert mem.optimizer_states == pytest.approx(8 * psi, rel=1e-12)
    # the closed form without compiling agrees
    assert peak_memory_of(run).total == pytest.approx(mem.total, rel=1e-12)


def test_autocast_keeps_each_layers_bf16_weight_copy_for_backward():
    # against Megatron bf16 on one device: per layer, the two norm inputs are fp32 (+2 bytes each per
    # token and hidden unit) and every GEMM saves its bf16 weight copy (2 bytes per layer weight)
    native, auto = make_run(GPT_SMALL), make_run(GPT_SMALL, mixed_precision="autocast")
    m = auto.model
    T, h = m.seq_length, m.hidden_size
    extra = m.num_layers * (2 * 2 * T * h + 2 * m.layer_params(False))
    assert peak_memory_of(auto).activations - peak_memory_of(native).activations == pytest.approx(extra, rel=1e-12)
    # full recompute saves only each layer's input, fp32 under autocast, and no weight copies
    native_f, auto_f = (make_run(GPT_SMALL, recompute="full", **kw) for kw in ({}, {"mixed_precision": "autocast"}))
    assert peak_memory_of(auto_f).activations == pytest.approx(2 * peak_memory_of(native_f).activations)


def test_autocast_optimizer_has_no_low_precision_copy():
    (auto,) = optimizer_ops(1e6, "adam", "fp32")
    (native,) = optimizer_ops(1e6, "adam", "bf16")
    assert native.bytes - auto.bytes == pytest.approx(2e6)  # the bf16 weight copy Megatron writes back
    run = make_run(GPT_SMALL, mixed_precision="autocast")
    (op,) = compile_run(run).stages[0].optimizer
    assert op.bytes == pytest.approx(auto.bytes / 1e6 * run.model.num_params())


def test_autocast_step_is_slower_and_reduces_fp32_gradients():
    native = make_run(GPT_SMALL, num_devices=8, dp=8)
    auto = make_run(GPT_SMALL, num_devices=8, dp=8, mixed_precision="autocast")
    assert auto.strategy.reduce_precision == "fp32" and auto.strategy.weight_precision == "fp32"
    assert simulate(auto).iteration_time_s > simulate(native).iteration_time_s
    with pytest.raises(SpecError):
        make_run(GPT_SMALL, precision="fp8", mixed_precision="autocast")


@pytest.mark.parametrize("m", [1, 4])
def test_autocast_forward_casts_cost_the_host_no_dispatch(m):
    # a host that takes 1 s a dispatch binds every block (test_simulator's closed form). torch.autocast casts a
    # GEMM's inputs inside the GEMM's own call, so a forward cast costs the host nothing; its gradient is an
    # autograd node of its own (ToCopyBackward0) and costs a dispatch like every other backward kernel. A
    # micro-batch therefore takes (its ops - its forward casts) seconds, the optimizer step as before
    from dataclasses import replace

    from conftest import KNOWN_PARAMS, roofline
    from learnedperf.graph.transformer import operator_graph

    run = make_run(LLAMA_GQA, global_batch_size=m, mixed_precision="autocast")
    g = operator_graph(run.model, 1, "bf16", run.strategy.flash_attention, "adam", autocast=True)
    step = [(op, r) for op, r in zip(g.ops, g.repeat) if op.phase in ("fwd", "bwd")]
    casts = sum(r for op, r in step if op.phase == "fwd" and op.name.endswith(".cast"))
    grads = sum(r for op, r in step if op.phase == "bwd" and op.name.endswith(".cast.bwd"))
    assert casts > 0 and grads == casts  # each forward cast has its gradient's reverse cast
    plain = roofline(run, KNOWN_PARAMS)
    opt = sum(plain.compute_time_s(op) * r for op, r in zip(g.ops, g.repeat) if op.phase == "opt")
    host = roofline(run, replace(KNOWN_PARAMS, host_dispatch_us=1e6))
    t = simulate(run, cost=host, exact=True).iteration_time_s
    assert t == pytest.approx(m * (sum(r for _op, r in step) - casts) + opt, rel=1e-9)


def test_autocast_is_a_feature_of_both_schemas():
    from learnedperf.features.graph import GLOBAL_FEATURE_SCHEMA, global_feature_vector
    from learnedperf.features.run import RUN_FEATURE_SCHEMA, RunContext, run_features

    run = make_run(GPT_SMALL, mixed_precision="autocast")
    res = simulate(run)
    g = global_feature_vector(run, res.iteration_time_s * 1e3, res.to_prediction()["breakdown_ms"])
    assert g[GLOBAL_FEATURE_SCHEMA.names.index("autocast")] == 1.0
    x, _ = run_features(run, RunContext(run.model, run.hardware), 1.0)
    assert x[RUN_FEATURE_SCHEMA.names.index("autocast")] == 1.0
    x0, _ = run_features(make_run(GPT_SMALL), RunContext(run.model, run.hardware), 1.0)
    assert x0[RUN_FEATURE_SCHEMA.names.index("autocast")] == 0.0


def test_measured_bf16_steps_say_autocast():
    """The project's measure code runs bf16 steps under torch.autocast, and its records say so."""
    from pathlib import Path

    import pandas as pd

    from learnedperf.measure.steps import StepConfig, run_dict

    hw = {"device": "A100-SXM4-80GB", "num_devices": 1}
    model = {"name": "gpt-test", "arch": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
             "vocab_size": 512, "seq_length": 32}
    bf16 = run_dict(StepConfig(model, 1, {"precision": "bf16"}), hw)
    assert bf16["strategy"]["mixed_precision"] == "autocast"
    assert RunSpec.from_dict(bf16).strategy.autocast
    assert "mixed_precision" not in run_dict(StepConfig(model, 1, {}), hw)["strategy"]
    for path in Path(__file__).resolve().parents[1].glob("datasets/measured/*/steps*.parquet"):
        for text in pd.read_parquet(path, columns=["run"])["run"]:
            s = json.loads(text)["strategy"]
            assert (s.get("mixed_precision") == "autocast") == (s["precision"] == "bf16"), path


def test_sampler_draws_autocast_only_for_bf16_and_fp16():
    from learnedperf.data.sampler import sample_runs

    seen = {"autocast": 0, "master_weights": 0}
    for _i, run in sample_runs(200, seed=3):
        s = run["strategy"]
        mode = s.get("mixed_precision", "master_weights")
        if mode == "autocast":
            assert s["precision"] in ("bf16", "fp16")
        if s["precision"] in ("bf16", "fp16"):
            seen[mode] += 1
    # both kinds of bf16/fp16 run are in the simulated data the models learn from
    assert seen["autocast"] > 0 and seen["master_weights"] > seen["autocast"]
