"""Per-device memory: model states (ZeRO paper) and activations (Korthikanti et al. 2022)."""

from __future__ import annotations

import pytest

from conftest import GPT_SMALL, LLAMA_GQA, KNOWN_PARAMS, MOE, make_run, roofline
from learnedperf.graph.execution import compile_run
from learnedperf.simulate import simulate
from learnedperf.simulate.memory import (gpu_library_workspace_bytes, in_flight_microbatches, layer_activation_bytes,
                                         memory_microbatches, peak_memory, peak_memory_of)
from learnedperf.units import GiB


def model_states(mem) -> float:
    return mem.weights + mem.gradients + mem.optimizer_states


# ----------------------------------------------------------------------------- model states
def test_ddp_bf16_adam_is_18_bytes_per_param():
    # Megatron's bf16 recipe: bf16 weights (2) + fp32 gradients (4) + fp32 master, m, v (12)
    run = make_run(LLAMA_GQA, num_devices=8, dp=8)
    mem = peak_memory(compile_run(run))
    psi = run.model.num_params()
    assert mem.weights == pytest.approx(2 * psi, rel=1e-12)
    assert mem.gradients == pytest.approx(4 * psi, rel=1e-12)
    assert mem.optimizer_states == pytest.approx(12 * psi, rel=1e-12)
    assert model_states(mem) == pytest.approx(18 * psi, rel=1e-12)


def test_ddp_fp16_gradients_is_16_bytes_per_param():
    # ZeRO paper §3.1: mixed-precision Adam holds 2Ψ + 2Ψ + KΨ with K = 12, i.e. 16Ψ
    for precision in ("fp16", "bf16"):
        run = make_run(LLAMA_GQA, num_devices=8, dp=8, precision=precision, grad_reduce_precision="fp16")
        mem = peak_memory(compile_run(run))
        assert model_states(mem) == pytest.approx(16 * run.model.num_params(), rel=1e-12)


@pytest.mark.parametrize("kw", [dict(num_devices=1, global_batch_size=4),
                                dict(num_devices=4, pp=4, global_batch_size=8, pipeline_schedule="gpipe"),
                                dict(num_devices=4, pp=4, global_batch_size=8)])
def test_forward_only_holds_weights_one_layer_and_the_logits(kw):
    # nothing is saved for a backward: bf16 weights, the tensors of one layer of one micro-batch (however many
    # micro-batches and layers the schedule has), and one fp32 copy of the logits on the last stage (besides the
    # GPU libraries' workspaces)
    run = make_run(LLAMA_GQA, forward_only=True, optimizer="none", **kw)
    mem = peak_memory(compile_run(run))
    assert mem == peak_memory_of(run)  # the closed form a planner uses agrees with the compiled schedule
    assert mem.gradients == mem.optimizer_states == 0
    assert mem.activations == pytest.approx(layer_activation_bytes(run), rel=1e-12)
    training = peak_memory(compile_run(make_run(LLAMA_GQA, optimizer="none", **kw)))
    assert mem.total < training.total and mem.activations < training.activations
    m = run.model
    logits = 4.0 * run.strategy.micro_batch_size * m.seq_length * m.vocab_size
    if kw.get("pp", 1) == 1:  # (with a pipeline the peak may be another stage's)
        assert mem.weights == training.weights
        workspace = gpu_library_workspace_bytes(run.hardware.device, forward_only=True)
        assert mem.temporary == pytest.approx(logits + workspace, rel=1e-12)


def test_layernorm_model_counts_every_parameter():
    run = make_run(GPT_SMALL, num_devices=8, dp=8)
    mem = peak_memory(compile_run(run))
    assert model_states(mem) == pytest.approx(18 * run.model.num_params(), rel=1e-12)


# GPT with Ψ ≈ 7.5e9 parameters (12·l·h² + 13·l·h + (V+s)·h + 2h)
ZERO_MODEL = {"name": "gpt-7.5b", "arch": "gpt", "num_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
              "vocab_size": 59000, "seq_length": 2048}


@pytest.mark.parametrize("stage,published_GB,formula", [
    (0, 120.0, lambda psi, nd: 16 * psi),
    (1, 31.4, lambda psi, nd: 4 * psi + 12 * psi / nd),
    (2, 16.6, lambda psi, nd: 2 * psi + 14 * psi / nd),
    (3, 1.9, lambda psi, nd: 16 * psi / nd),
])
def test_zero_stages_match_zero_paper_figure_1(stage, published_GB, formula):
    # Rajbhandari et al. (SC20), Figure 1: Ψ = 7.5B, N_d = 64, K = 12
    run = make_run(ZERO_MODEL, num_devices=64, dp=64, zero_stage=stage, precision="fp16",
                   grad_reduce_precision="fp16")
    psi = run.model.num_params()
    assert psi == pytest.approx(7.5e9, rel=2e-3)
    mem = peak_memory(compile_run(run))
    assert model_states(mem) == pytest.approx(formula(psi, 64), rel=1e-9)
    assert model_states(mem) / 1e9 == pytest.approx(published_GB, rel=0.02)


def test_fsdp_counts_as_zero_3():
    a = peak_memory(compile_run(make_run(LLAMA_GQA, num_devices=8, dp=8, fsdp=True)))
    b = peak_memory(compile_run(make_run(LLAMA_GQA, num_devices=8, dp=8, zero_stage=3)))
    assert model_states(a) == pytest.approx(model_states(b), rel=1e-12)


@pytest.mark.parametrize("zero, ep", [(1, 2), (1, 8), (2, 4), (3, 4), (1, 1)])
def test_zero_with_expert_parallelism_shards_every_parameter_once_over_dp(zero, ep):
    # each expert lives on one rank of ep and its states are sharded over the dp·cp/ep ranks that hold it
    # (Megatron-Core's expert-data-parallel group), so the dp ranks of one model replica hold every
    # parameter's sharded state exactly once: per rank, K·Ψ/dp for each sharded kind, the ZeRO paper's
    # formulas with Ψ the whole model, experts included (Ψ_expert/ep per rank, sharded over dp/ep)
    dp = 8
    run = make_run(MOE, num_devices=dp, dp=dp, ep=ep, zero_stage=zero)
    psi = run.model.num_params()
    mem = peak_memory(compile_run(run))
    assert mem == peak_memory_of(run)
    assert mem.optimizer_states == pytest.approx(12 * psi / dp, rel=1e-12)
    if zero >= 2:
        assert mem.gradients == pytest.approx(4 * psi / dp, rel=1e-12)
    if zero >= 3:
        assert mem.weights == pytest.approx(2 * psi / dp, rel=1e-12)


# ----------------------------------------------------------------------------- activations
# Korthikanti et al. 2022, Table 2 (per layer, 16-bit activations, GPT layer with 4h FFN, GELU, dropout,
# attention scores materialised); s: sequence, b: micro-batch, h: hidden, a: heads, t: tensor parallel
S, B, H, A = 2048, 2, 2048, 16
KORTH_MODEL = {"name": "gpt-korth", "arch": "gpt", "num_layers": 8, "hidden_size": H, "num_attention_heads": A,
               "vocab_size": 51200, "seq_length": S}


def act(t: int = 1, **strategy) -> float:
    run = make_run(KORTH_MODEL, num_devices=t, tp=t, micro_batch_size=B, flash_attention=False, precision="bf16",
                   **strategy)
    return layer_activation_bytes(run)


def test_activations_no_parallelism():
    assert act() == pytest.approx(S * B * H * (34 + 5 * A * S / H), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activations_tensor_parallel(t):
    assert act(t) == pytest.approx(S * B * H * (10 + 24 / t + 5 * A * S / (H * t)), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activations_tensor_and_sequence_parallel(t):
    assert act(t, sequence_parallel=True) == pytest.approx(S * B * H / t * (34 + 5 * A * S / H), rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_activations_selective_recompute(t):
    assert act(t, recompute="selective") == pytest.approx(S * B * H * (10 + 24 / t), rel=1e-12)
    assert act(t, recompute="selective", sequence_parallel=True) == pytest.approx(34 * S * B * H / t, rel=1e-12)


def test_an_eval_mode_forward_keeps_no_dropout_tensors():
    """A forward-only step runs in eval mode: Korthikanti's terms without the two residual dropout masks (1 byte
    each, sbh) and the attention dropout's mask and output (3·a·s²·b): 32·sbh + 2·a·s²·b, the softmax output
    read by the PV product itself."""
    assert act(forward_only=True, optimizer="none") == pytest.approx(S * B * H * (32 + 2 * A * S / H), rel=1e-12)


def test_activations_full_recompute():
    assert act(recompute="full") == pytest.approx(2 * S * B * H, rel=1e-12)
    assert act(4, recompute="full") == pytest.approx(2 * S * B * H, rel=1e-12)


def test_flash_attention_drops_the_quadratic_term():
    run = make_run(KORTH_MODEL, num_devices=1, micro_batch_size=B, flash_attention=True)
    per_layer = layer_activation_bytes(run)
    # 34·sbh plus an O(s) softmax statistic; no 5·a·s²·b term
    assert 34 * S * B * H <= per_layer < 34 * S * B * H * 1.01


@pytest.mark.parametrize("tp", [1, 2])
def test_moe_layer_keeps_its_routed_rows(tp):
    # Megatron-Core's MoE layer, bf16, flash attention, every layer a MoE layer: besides a dense layer's tensors
    # (the FFN ones over the k expert rows a token passes through, sharded over tp) it keeps the permuted rows
    # its experts' FC1 reads and the expert outputs the combine weights multiply (T·k·h each, whole on every tp
    # rank: the dispatcher gathers the tokens over tp) and the router's fp32 softmax (T·E)
    b = 2
    run = make_run(MOE, num_devices=tp, tp=tp, micro_batch_size=b, global_batch_size=b, precision="bf16")
    h, k, E, f = MOE["hidden_size"], MOE["moe_top_k"], MOE["num_experts"], MOE["ffn_hidden_size"]
    a, hd = MOE["num_attention_heads"], MOE["hidden_size"] // MOE["num_attention_heads"]
    kv = MOE["num_kv_heads"] * hd
    T, e = b * MOE["seq_length"], 2
    dense_part = (8 * T * h  # two norm inputs, the QKV input and the router's (= norm output), bf16
                  + (T * (h + kv + kv + h) * e  # Q, K, V, the projection's input
                     + T * k * f * e * 2 + T * k * f * e  # SwiGLU input (gate and up), FC2 input
                     + 4 * a * b * MOE["seq_length"]) / tp)  # flash attention's fp32 log-sum-exp
    routing = 2 * T * k * h * e + 4 * T * E
    assert layer_activation_bytes(run) == pytest.approx(dense_part + routing, rel=1e-12)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (2, 8), (8, 16)])
def test_1f1b_first_stage_holds_p_microbatches(p, m):
    run = make_run(KORTH_MODEL, num_devices=p, pp=p, micro_batch_size=B, global_batch_size=B * m,
                   flash_attention=False)
    eg = compile_run(run)
    assert in_flight_microbatches(eg.stages[0].schedule) == p
    mem = peak_memory(eg)
    assert mem.stage == 0
    L = KORTH_MODEL["num_layers"]
    # Korthikanti §4.2.3: p micro-batches of L/p layers, i.e. one micro-batch through the whole model
    assert mem.activations == pytest.approx(L * S * B * H * (34 + 5 * A * S / H), rel=1e-12)


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2)])
def test_interleaved_first_stage_activation_factor(p, v):
    m = 2 * p
    run = make_run(KORTH_MODEL, num_devices=p, pp=p, micro_batch_size=B, global_batch_size=B * m,
                   flash_attention=False, pipeline_schedule="interleaved", virtual_pipeline_stages=v)
    mem = peak_memory(compile_run(run))
    assert mem.stage == 0
    L = KORTH_MODEL["num_layers"]
    # Korthikanti §4.2.3: the interleaved schedule multiplies the first stage's activations by 1 + (p-1)/(p·v)
    expected = L * S * B * H * (34 + 5 * A * S / H) * (1 + (p - 1) / (p * v))
    assert mem.activations == pytest.approx(expected, rel=1e-12)


def test_gpipe_holds_all_microbatches():
    p, m = 4, 8
    run = make_run(KORTH_MODEL, num_devices=p, pp=p, micro_batch_size=B, global_batch_size=B * m,
                   flash_attention=False, pipeline_schedule="gpipe")
    mem = peak_memory(compile_run(run))
    L = KORTH_MODEL["num_layers"]
    assert mem.activations == pytest.approx(m * L / p * S * B * H * (34 + 5 * A * S / H), rel=1e-12)


# ----------------------------------------------------------------------------- fits in memory
GPT3_175B = {"name": "gpt3-175b-inline", "arch": "gpt", "num_layers": 96, "hidden_size": 12288,
             "num_attention_heads": 96, "vocab_size": 51200, "seq_length": 2048}


def test_gpt3_175b_does_not_fit_on_8_a100_80gb():
    run = make_run(GPT3_175B, num_devices=8, tp=8, dp=1)
    r = simulate(run, cost=roofline(run, KNOWN_PARAMS))
    pred = r.to_prediction()
    assert pred["fits_in_memory"] is False
    psi = run.model.num_params()
    assert psi == pytest.approx(175e9, rel=0.01)
    # ~18 bytes per parameter over 8 devices: ~390 GB each, far above 80 GiB
    assert model_states(r.memory) == pytest.approx(18 * psi / 8, rel=0.01)
    assert model_states(r.memory) > 80 * GiB
    assert pred["peak_memory_GiB"] > 80


def test_small_model_fits():
    run = make_run(GPT_SMALL, num_devices=8, dp=8, micro_batch_size=4, global_batch_size=32)
    pred = simulate(run, cost=roofline(run, KNOWN_PARAMS)).to_prediction()
    assert pred["fits_in_memory"] is True
    assert 0 < pred["peak_memory_GiB"] < 80


# ----------------------------------------------------------------------------- without compiling
def test_peak_memory_of_equals_the_compiled_schedules_on_sampled_runs():
    # two derivations of the same bytes: in-flight units counted along the compiled schedules,
    # against the closed form of peak_in_flight; every strategy kind the sampler draws (OOM kept)
    from learnedperf.data.sampler import sample_runs
    from learnedperf.specs import RunSpec

    kinds = set()
    for _i, raw in sample_runs(150, seed=11, keep_oom=True):
        run = RunSpec.from_dict(raw)
        kinds.add(run.strategy.pipeline_schedule if run.strategy.pp > 1 else "none")
        compiled = peak_memory(compile_run(run, memory_microbatches(run)))
        fast = peak_memory_of(run)
        assert fast.to_GiB() == pytest.approx(compiled.to_GiB(), rel=1e-12), raw
        assert fast.stage == compiled.stage
    assert kinds == {"none", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "interleaved-zb"}
