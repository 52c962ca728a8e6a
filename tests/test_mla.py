"""Multi-head latent attention (MLA, DeepSeek-V2/V3): parameters against the reports' totals, and the
FLOPs, bytes and tensor-parallel split of its projections against closed forms."""

from __future__ import annotations

import pytest

from conftest import make_run
from learnedperf.errors import InputError, SpecError
from learnedperf.graph.execution import chunk_layout, compile_run
from learnedperf.measure.published import megatron_flops
from learnedperf.measure.steps import StepConfig, plan_step
from learnedperf.specs import ModelSpec, RunSpec

# DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3): 61 layers, the first 3 dense (18,432 wide), 256 routed
# experts of 2,048 (top-8) and one shared, 128 heads of 128 + 64 rotary query/key and 128 value dimensions,
# latents of 1,536 (queries) and 512 (keys and values)
V3 = {"arch": "moe", "num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "head_dim": 192,
      "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
      "ffn_hidden_size": 2048, "dense_ffn_hidden_size": 18432, "moe_shared_ffn_hidden_size": 2048,
      "moe_first_dense_layers": 3, "num_experts": 256, "moe_top_k": 8, "vocab_size": 129280, "seq_length": 4096}
# DeepSeek-V2 (deepseek-ai/DeepSeek-V2): 60 layers, 1 dense (12,288), 160 experts of 1,536 (top-6), 2 shared
V2 = dict(V3, num_layers=60, hidden_size=5120, ffn_hidden_size=1536, dense_ffn_hidden_size=12288,
          moe_shared_ffn_hidden_size=2 * 1536, moe_first_dense_layers=1, num_experts=160, moe_top_k=6,
          vocab_size=102400)
# DeepSeek-V2-Lite: queries straight from the hidden state (q_lora_rank null), 27 layers, 16 heads
V2_LITE = dict(V2, num_layers=27, hidden_size=2048, num_attention_heads=16, q_lora_rank=0, ffn_hidden_size=1408,
               dense_ffn_hidden_size=10944, moe_shared_ffn_hidden_size=2 * 1408, num_experts=64)
# a small MLA model for the closed forms
SMALL = {"arch": "llama", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "head_dim": 96,
         "v_head_dim": 64, "kv_lora_rank": 256, "q_lora_rank": 384, "qk_rope_head_dim": 32, "ffn_hidden_size": 2816,
         "vocab_size": 32000, "seq_length": 1024}


@pytest.mark.parametrize("model, total_B, active_B", [
    # DeepSeek-V3 report (arXiv 2412.19437): 671B total, 37B activated (the 14B multi-token-prediction module
    # apart); DeepSeek-V2 report (arXiv 2405.04434): 236B and 21B; V2-Lite: 15.7B
    (V3, 671, 37), (V2, 236, 21), (V2_LITE, 15.7, None)])
def test_parameters_match_the_deepseek_reports(model, total_B, active_B):
    m = ModelSpec.parse(model)
    assert m.num_params() / 1e9 == pytest.approx(total_B, rel=0.005)
    if active_B is not None:
        # the reports round to the billion; our count includes the embedding and the LM head
        assert m.num_active_params() / 1e9 == pytest.approx(active_B, rel=0.03)


def test_projection_weights_closed_form():
    m = ModelSpec.parse(SMALL)
    h, a = 1024, 8
    q = h * 384 + 384 * a * 96  # down to the latent, up to 8 heads of 96
    kv = h * (256 + 32) + 256 * a * (96 - 32 + 64)  # latent plus the shared rotary key; keys' rest and values
    out = a * 64 * h
    assert m.attention_params == q + kv + out
    assert ModelSpec.parse(dict(SMALL, q_lora_rank=0)).attention_params == h * a * 96 + kv + out


def layer_ops(run: RunSpec) -> dict:
    eg = compile_run(run)
    return {op.name: op for blk, _ in eg.stages[0].chunks[0].forward for op in blk}


@pytest.mark.parametrize("tp", [1, 2])
def test_forward_gemms_run_two_flops_per_weight_and_the_down_projections_whole(tp):
    run = make_run(SMALL, num_devices=tp, tp=tp, micro_batch_size=2, global_batch_size=2)
    ops = layer_ops(run)
    T, m = 2 * 1024, run.model
    gemms = sum(op.flops for name, op in ops.items() if name.startswith("layer.attn.") and op.kind == "matmul")
    down = 1024 * 384 + 1024 * (256 + 32)  # duplicated on every tensor-parallel rank
    assert gemms == pytest.approx(2 * T * ((m.attention_params - down) / tp + down), rel=1e-12)
    # scores over 96 query/key dimensions, context over 64 value dimensions, for each local head
    core = ops["layer.attn.core"]
    assert core.flops == pytest.approx(2 * 2 * (8 // tp) * 1024 * 1024 * (96 + 64), rel=1e-12)
    assert core.shape[-1] == (96 + 64) // 2


def test_tensor_parallel_ranks_keep_the_down_projections_whole():
    m = ModelSpec.parse(SMALL)
    one = chunk_layout(make_run(SMALL, num_devices=1))[0]
    two = chunk_layout(make_run(SMALL, num_devices=2, tp=2))[0]
    kept = 1024 * 384 + 384 + 1024 * (256 + 32) + 256  # down projections and their norms
    assert m.tp_replicated_layer_params == kept
    assert one.layer_params == m.layer_params()
    assert two.layer_params == pytest.approx((m.layer_params() - kept) / 2 + kept, rel=1e-12)


def test_megatron_flops_of_latent_attention():
    m = ModelSpec.parse(SMALL)
    s, a, l, h, V, f = 1024, 8, 4, 1024, 32000, 2816
    per_token_layer = 2 * m.attention_params + 2 * s * a * (96 + 64) + 2 * 3 * h * f
    expected = 3 * (l * per_token_layer + 2 * h * V) * s * 4
    assert megatron_flops(m, 4, False) == pytest.approx(expected, rel=1e-12)


def test_an_mla_run_predicts_on_both_tiers():
    from learnedperf.predict import Predictor

    run = {"model": V2_LITE, "hardware": {"cluster": "dgx-h100", "num_devices": 16},
           "strategy": {"ep": 8, "micro_batch_size": 1, "global_batch_size": 64, "zero_stage": 1}}
    p = Predictor.load()
    fast, full = p.predict(run), p.predict(run, tier="full")
    for out in (fast, full):
        assert out["iteration_time_ms"] > 0 and out["interval_ms"][0] <= out["iteration_time_ms"]
    # the two tiers agree as the checkpoint's fidelity check says they do on its domain (90 % within ±11 %)
    assert fast["iteration_time_ms"] == pytest.approx(full["iteration_time_ms"], rel=0.25)
    assert full["peak_memory_GiB"] == fast["peak_memory_GiB"]


def test_serialised_only_when_set():
    plain = ModelSpec.parse(dict(SMALL, kv_lora_rank=0, q_lora_rank=0, qk_rope_head_dim=0, v_head_dim=96))
    for key in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim"):
        assert key not in plain.to_dict()
    m = ModelSpec.parse(SMALL)
    assert ModelSpec.parse(m.to_dict()) == m and m.to_dict()["v_head_dim"] == 64


@pytest.mark.parametrize("model, field", [
    (dict(SMALL, kv_lora_rank=0), "model.q_lora_rank"),
    (dict(SMALL, kv_lora_rank=0, q_lora_rank=0, qk_rope_head_dim=0), "model.v_head_dim"),
    (dict(SMALL, num_kv_heads=4), "model.num_kv_heads"),
    (dict(SMALL, qk_rope_head_dim=96), "model.qk_rope_head_dim")])
def test_impossible_latent_attention_names_the_field(model, field):
    with pytest.raises(SpecError) as err:
        make_run(model, num_devices=1)
    assert err.value.field == field


def test_measured_steps_refuse_latent_attention():
    with pytest.raises(InputError, match=r"^model\.kv_lora_rank: measured steps do not build latent attention"):
        plan_step(StepConfig(dict(SMALL)))


# config.json of deepseek-ai/DeepSeek-V3 (the keys that shape the model)
HF_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
         "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
         "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
         "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "q_lora_rank": 1536,
         "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
         "vocab_size": 129280, "max_position_embeddings": 163840, "hidden_act": "silu", "tie_word_embeddings": False,
         "num_nextn_predict_layers": 1, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc"}
# deepseek-ai/DeepSeek-V2-Lite: no query latent (q_lora_rank null)
HF_V2_LITE = dict(HF_V3, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", hidden_size=2048,
                  intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
                  num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6,
                  first_k_dense_replace=1, q_lora_rank=None, vocab_size=102400, n_group=1, topk_group=1,
                  topk_method="greedy")


@pytest.mark.parametrize("config, catalog", [(HF_V3, "deepseek-v3"), (HF_V2_LITE, "deepseek-v2-lite")])
def test_huggingface_configs_read_as_the_catalog_entries(config, catalog):
    from learnedperf.catalog import get_model

    def arch(m: ModelSpec) -> dict:
        return {k: v for k, v in m.model_dump().items() if k not in ("name", "seq_length")}

    from_hf = ModelSpec.from_hf_config(config, 4096)
    assert arch(from_hf) == arch(ModelSpec.parse(get_model(catalog)))
    # recognised from the class name alone, too
    bare = {k: v for k, v in config.items() if k != "model_type"}
    assert arch(ModelSpec.from_hf_config(bare, 4096)) == arch(from_hf)


def test_a_latent_attention_config_without_its_ranks_names_the_missing_key():
    config = {k: v for k, v in HF_V3.items() if k != "qk_rope_head_dim"}
    with pytest.raises(SpecError) as err:
        ModelSpec.from_hf_config(config, 4096)
    assert err.value.field == "model.hf_config.qk_rope_head_dim"


def test_published_rows_of_deepseek_v2_and_v3_take_the_catalog_architecture(tmp_path):
    import csv

    from learnedperf.measure.published import PUBLISHED_COLUMNS, load_published

    rows = [{"row_id": "r1", "model": "DeepSeek-V3", "num_layers": "61", "hidden_size": "7168", "num_heads": "128",
             "gpu_type": "H800", "interconnect": "8x 400Gb/s InfiniBand", "pp": "16", "ep": "64", "num_gpus": "2048", "seq_len": "4096",
             "micro_batch_size": "1", "global_batch_size_seqs": "15360", "precision": "fp8",
             "iteration_time_s": "30"},
            # a name of the family without "experts" in the row: a MoE still, not a dense Llama
            {"row_id": "r2", "model": "DeepSeek-Coder-V2-Lite", "num_layers": "27", "hidden_size": "2048",
             "num_heads": "16", "gpu_type": "H100 SXM5 80GB", "num_gpus": "8",
             "seq_len": "4096", "micro_batch_size": "1", "global_batch_size_seqs": "8", "precision": "bf16",
             "iteration_time_s": "1"}]
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=PUBLISHED_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    got = load_published(path)
    assert not got.skipped, got.skipped
    v3, lite = (RunSpec.from_dict(r.run).model for r in got.runs)
    assert (v3.kv_lora_rank, v3.q_lora_rank, v3.num_experts, v3.moe_first_dense_layers) == (512, 1536, 256, 3)
    assert (lite.kv_lora_rank, lite.q_lora_rank, lite.num_experts, lite.num_attention_heads) == (512, 0, 64, 16)


def test_latent_attention_without_rotary_dimensions_has_no_rotary_kernel():
    # a rotary part of 0 dimensions is no kernel at all (a 0-element op would still cost a launch)
    run = make_run(dict(SMALL, qk_rope_head_dim=0, position_embedding="learned"), num_devices=1)
    assert "layer.attn.rope" not in layer_ops(run)
    assert "layer.attn.rope" in layer_ops(make_run(SMALL, num_devices=1))
